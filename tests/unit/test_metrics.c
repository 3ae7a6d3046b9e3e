/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Metrics: exact Prometheus 0.0.4 text for counters, labelled gauges and histograms; exact
 * sums under concurrent updates from 4 threads; the HTTP endpoint fetched with a plain socket
 * on 127.0.0.1 (port 0, so the kernel picks a free one).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_log.h"
#include "oq_metrics.h"

static char *render(oq_metrics_t *m)
{
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(oq_metrics_render(m, &text, &len), 0);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    return text;
}

static void test_counter_text(void **state)
{
    (void)state;
    oq_metrics_t *m = oq_metrics_new();
    oq_metric_t *c = oq_metrics_counter(m, "onceq_submits_total", "Calls submitted.", NULL);
    assert_non_null(c);
    char *t = render(m);
    assert_string_equal(t, "# HELP onceq_submits_total Calls submitted.\n"
                           "# TYPE onceq_submits_total counter\n"
                           "onceq_submits_total 0\n");
    free(t);
    oq_counter_add(c, 41);
    oq_counter_add(c, 1);
    oq_counter_add(NULL, 5); /* NULL metric is a no-op */
    assert_true(oq_metric_value(c) == 42.0);
    /* 2^53 + 1 must print exactly, without exponent */
    oq_counter_add(c, 9007199254740993ULL - 42);
    t = render(m);
    assert_string_equal(t, "# HELP onceq_submits_total Calls submitted.\n"
                           "# TYPE onceq_submits_total counter\n"
                           "onceq_submits_total 9007199254740993\n");
    free(t);
    /* same name+labels returns the same metric; another type under that name is refused */
    assert_ptr_equal(oq_metrics_counter(m, "onceq_submits_total", "x", NULL), c);
    assert_null(oq_metrics_gauge(m, "onceq_submits_total", "x", NULL));
    assert_null(oq_metrics_counter(m, "bad name", "x", NULL));
    assert_null(oq_metrics_counter(m, "9starts_with_digit", "x", NULL));
    oq_metrics_destroy(m);
    oq_metrics_destroy(NULL);
}

static void test_labelled_gauges_text(void **state)
{
    (void)state;
    oq_metrics_t *m = oq_metrics_new();
    oq_metric_t *p = oq_metrics_gauge(m, "onceq_calls", "Calls by state.", "state=\"pending\"");
    oq_metric_t *up = oq_metrics_gauge(m, "onceq_up", "1 when running.\nSecond \\ line.", NULL);
    oq_metric_t *r = oq_metrics_gauge(m, "onceq_calls", "Calls by state.", "state=\"running\"");
    assert_non_null(p);
    assert_non_null(r);
    assert_ptr_not_equal(p, r);
    oq_gauge_set(p, 3);
    oq_gauge_set(r, -2.5);
    oq_gauge_add(r, 0.25);
    oq_gauge_set(up, 1e300);
    char *t = render(m);
    assert_string_equal(t, "# HELP onceq_calls Calls by state.\n"
                           "# TYPE onceq_calls gauge\n"
                           "onceq_calls{state=\"pending\"} 3\n"
                           "onceq_calls{state=\"running\"} -2.25\n"
                           "# HELP onceq_up 1 when running.\\nSecond \\\\ line.\n"
                           "# TYPE onceq_up gauge\n"
                           "onceq_up 1e+300\n");
    free(t);
    oq_gauge_set(up, 0.1);
    oq_gauge_set(p, INFINITY);
    oq_gauge_set(r, NAN);
    t = render(m);
    assert_non_null(strstr(t, "onceq_up 0.1\n"));
    assert_non_null(strstr(t, "onceq_calls{state=\"pending\"} +Inf\n"));
    assert_non_null(strstr(t, "onceq_calls{state=\"running\"} NaN\n"));
    free(t);
    assert_true(oq_metric_value(up) == 0.1);
    oq_metrics_destroy(m);
}

static void test_histogram_text(void **state)
{
    (void)state;
    oq_metrics_t *m = oq_metrics_new();
    const double b[] = {0.005, 0.1, 1, 2.5};
    oq_metric_t *h = oq_metrics_histogram(m, "onceq_commit_seconds", "Commit latency.", NULL, b, 4);
    oq_metric_t *hl = oq_metrics_histogram(m, "onceq_batch_items", "Items per batch.",
                                           "db=\"calls\"", (const double[]){1, 10}, 2);
    assert_non_null(h);
    assert_non_null(hl);
    oq_histogram_observe(h, 0.001);
    oq_histogram_observe(h, 0.005); /* le is inclusive */
    oq_histogram_observe(h, 0.5);
    oq_histogram_observe(h, 2);
    oq_histogram_observe(h, 100);
    oq_histogram_observe(hl, 7);
    oq_histogram_observe(NULL, 1);
    char *t = render(m);
    assert_string_equal(t, "# HELP onceq_commit_seconds Commit latency.\n"
                           "# TYPE onceq_commit_seconds histogram\n"
                           "onceq_commit_seconds_bucket{le=\"0.005\"} 2\n"
                           "onceq_commit_seconds_bucket{le=\"0.1\"} 2\n"
                           "onceq_commit_seconds_bucket{le=\"1\"} 3\n"
                           "onceq_commit_seconds_bucket{le=\"2.5\"} 4\n"
                           "onceq_commit_seconds_bucket{le=\"+Inf\"} 5\n"
                           "onceq_commit_seconds_sum 102.506\n"
                           "onceq_commit_seconds_count 5\n"
                           "# HELP onceq_batch_items Items per batch.\n"
                           "# TYPE onceq_batch_items histogram\n"
                           "onceq_batch_items_bucket{db=\"calls\",le=\"1\"} 0\n"
                           "onceq_batch_items_bucket{db=\"calls\",le=\"10\"} 1\n"
                           "onceq_batch_items_bucket{db=\"calls\",le=\"+Inf\"} 1\n"
                           "onceq_batch_items_sum{db=\"calls\"} 7\n"
                           "onceq_batch_items_count{db=\"calls\"} 1\n");
    free(t);
    assert_true(oq_metric_value(h) == 5.0);
    /* bounds must ascend */
    assert_null(oq_metrics_histogram(m, "onceq_bad", "x", NULL, (const double[]){2, 1}, 2));
    oq_metrics_destroy(m);
}

typedef struct {
    oq_metric_t *c, *g, *h;
} workers_t;

#define N_THREADS 4
#define N_ITERS 100000

static void *worker(void *arg)
{
    workers_t *w = arg;
    for (int i = 0; i < N_ITERS; i++) {
        oq_counter_add(w->c, 1);
        oq_gauge_add(w->g, 0.5);
        oq_histogram_observe(w->h, (double)(i % 4));
    }
    return NULL;
}

static void test_concurrent_updates(void **state)
{
    (void)state;
    oq_metrics_t *m = oq_metrics_new();
    workers_t w = {
        .c = oq_metrics_counter(m, "t_total", "t", NULL),
        .g = oq_metrics_gauge(m, "t_gauge", "t", NULL),
        .h = oq_metrics_histogram(m, "t_hist", "t", NULL, (const double[]){0, 1, 2}, 3),
    };
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, worker, &w), 0);
    /* render concurrently too: must not crash or tear */
    for (int i = 0; i < 20; i++)
        free(render(m));
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    assert_true(oq_metric_value(w.c) == (double)N_THREADS * N_ITERS);
    assert_true(oq_metric_value(w.g) == 0.5 * N_THREADS * N_ITERS);
    assert_true(oq_metric_value(w.h) == (double)N_THREADS * N_ITERS);
    char *t = render(m);
    char want[128];
    snprintf(want, sizeof(want), "t_total %d\n", N_THREADS * N_ITERS);
    assert_non_null(strstr(t, want));
    snprintf(want, sizeof(want), "t_hist_bucket{le=\"0\"} %d\n", N_THREADS * N_ITERS / 4);
    assert_non_null(strstr(t, want));
    snprintf(want, sizeof(want), "t_hist_sum %d\n", N_THREADS * (N_ITERS / 4) * 6);
    assert_non_null(strstr(t, want));
    free(t);
    oq_metrics_destroy(m);
}

static void collect(oq_metrics_t *m, void *arg)
{
    (void)m;
    int *calls = arg;
    (*calls)++;
}

static void test_collect_cb(void **state)
{
    (void)state;
    oq_metrics_t *m = oq_metrics_new();
    int calls = 0;
    oq_metrics_set_collect_cb(m, collect, &calls);
    free(render(m));
    free(render(m));
    assert_int_equal(calls, 2);
    oq_metrics_set_collect_cb(m, NULL, NULL);
    free(render(m));
    assert_int_equal(calls, 2);
    oq_metrics_destroy(m);
}

static void test_parse_listen(void **state)
{
    (void)state;
    char host[64];
    int port = -1;
    oq_error_t err;
    assert_int_equal(oq_parse_listen("127.0.0.1:9100", host, &port, &err), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9100);
    assert_int_equal(oq_parse_listen("localhost:0", host, &port, &err), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 0);
    assert_int_equal(oq_parse_listen(":80", host, &port, &err), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(oq_parse_listen("0.0.0.0:8080", host, &port, &err), 0);
    assert_string_equal(host, "0.0.0.0");
    assert_int_equal(oq_parse_listen("9101", host, &port, &err), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 9101);
    assert_int_equal(oq_parse_listen("123456", host, &port, &err), OQ_EINVAL);
    assert_int_equal(oq_parse_listen("", host, &port, &err), OQ_EINVAL);
    assert_int_equal(oq_parse_listen("127.0.0.1", host, &port, &err), OQ_EINVAL);
    assert_int_equal(oq_parse_listen("127.0.0.1:", host, &port, &err), OQ_EINVAL);
    assert_int_equal(oq_parse_listen("127.0.0.1:65536", host, &port, &err), OQ_EINVAL);
    assert_int_equal(oq_parse_listen("127.0.0.1:x", host, &port, &err), OQ_EINVAL);
    assert_int_equal(oq_parse_listen("example.com:80", host, &port, &err), OQ_EINVAL);
    assert_int_equal(oq_parse_listen(NULL, host, &port, &err), OQ_EINVAL);
}

/* GET \p path from 127.0.0.1:\p port with a plain socket; returns the whole response. */
static char *http_get(int port, const char *method, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    char req[256];
    int n =
        snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                 method, path);
    assert_int_equal(write(fd, req, (size_t)n), n);
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    for (int i = 0; i < 1000; i++) {
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r <= 0) break;
        len += (size_t)r;
        if (len == cap - 1) break;
    }
    buf[len] = '\0';
    close(fd);
    return buf;
}

static void test_serve(void **state)
{
    (void)state;
    oq_metrics_t *m = oq_metrics_new();
    oq_metric_t *c = oq_metrics_counter(m, "onceq_http_test_total", "Test.", NULL);
    oq_counter_add(c, 7);
    oq_error_t err = {0};
    oq_metrics_server_t *s = oq_metrics_serve(m, "127.0.0.1:0", &err);
    assert_non_null(s);
    int port = oq_metrics_server_port(s);
    assert_true(port > 0);

    char *r = http_get(port, "GET", "/metrics");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "text/plain; version=0.0.4"));
    assert_non_null(strstr(r, "\r\n\r\n# HELP onceq_http_test_total Test.\n"
                              "# TYPE onceq_http_test_total counter\n"
                              "onceq_http_test_total 7\n"));
    free(r);
    r = http_get(port, "GET", "/healthz");
    assert_non_null(strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "\r\n\r\nok"));
    free(r);
    r = http_get(port, "GET", "/nope");
    assert_non_null(strstr(r, "HTTP/1.1 404"));
    free(r);
    r = http_get(port, "POST", "/metrics");
    assert_non_null(strstr(r, "HTTP/1.1 405"));
    free(r);

    /* the port is taken now: a second server on it fails cleanly */
    char listen[32];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    assert_null(oq_metrics_serve(m, listen, &err));
    assert_int_equal(err.code, OQ_EIO);
    assert_null(oq_metrics_serve(m, "nohost", &err));
    assert_int_equal(err.code, OQ_EINVAL);

    oq_metrics_serve_stop(s);
    oq_metrics_serve_stop(NULL);
    /* stopped: the port no longer accepts */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_not_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    close(fd);
    oq_metrics_destroy(m);
}

int main(void)
{
    oq_log_init(OQ_LOG_OFF, OQ_LOG_FMT_LOGFMT, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_text),   cmocka_unit_test(test_labelled_gauges_text),
        cmocka_unit_test(test_histogram_text), cmocka_unit_test(test_concurrent_updates),
        cmocka_unit_test(test_collect_cb),     cmocka_unit_test(test_parse_listen),
        cmocka_unit_test(test_serve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
