/*
 * An HTTP load generator for the producer, used by the end-to-end tests (tests/tools/
 * oq_e2e_load) and `onceq bench e2e`. libcurl is not a dependency, so this is a minimal
 * HTTP/1.1 client on plain blocking sockets: one thread per connection, keep-alive, requests
 * with Content-Length, responses with Content-Length (what libmicrohttpd sends for buffered
 * bodies); anything else closes the connection and counts as an error.
 *
 * Call i gets the key "<prefix>-<i>" and a tool chosen by a deterministic hash of i over the
 * mix weights, so two runs with the same options submit the same bodies: a re-run after a
 * crash is a replay, never a conflict. A request that fails at the transport level, or gets
 * 429/5xx, is retried with the same key and body (exponential backoff, capped) until retry_ms:
 * that is the client side of "effectively once", and it is what makes a kill -9 of the
 * producer mid-run safe. Open-loop pacing: with a rate, call i is due at start + i/rate on its
 * connection, so the offered load does not shrink when the server slows down (within the
 * connection count).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "oq_chaos.h"
#include "oq_util.h"

typedef struct {
    int fd;
    char buf[65536];
    size_t len; /* bytes buffered */
} oq__conn_t;

typedef struct oq__load_shared {
    const oq_load_opts_t *o;
    int64_t t0_us;
    pthread_mutex_t mu;
    oq_load_result_t r;
    double *lat; /* one slot per call (ms) */
    int total_weight;
    int mix[OQ_LOAD__NTOOLS];
} oq__load_shared_t;

typedef struct {
    oq__load_shared_t *s;
    int idx;
} oq__load_thread_t;

static int oq__connect(const char *host, int port, int timeout_ms)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, strcmp(host, "localhost") == 0 ? "127.0.0.1" : host, &a.sin_addr) != 1) {
        close(fd);
        return -1;
    }
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int oq__send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/*
 * Read one response from \p c. Returns 0 with \p status and a malloc()ed \p body, or -1
 * (connection unusable). \p keep is cleared when the server asked to close.
 */
static int oq__read_response(oq__conn_t *c, int *status, char **body, int *keep)
{
    *body = NULL;
    *keep = 1;
    char *hend = NULL;
    for (;;) {
        if (c->len > 0) {
            c->buf[c->len] = '\0';
            hend = strstr(c->buf, "\r\n\r\n");
            if (hend) break;
        }
        if (c->len >= sizeof c->buf - 1) return -1;
        ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c->len += (size_t)r;
    }
    size_t hlen = (size_t)(hend - c->buf) + 4;
    if (sscanf(c->buf, "HTTP/1.%*d %d", status) != 1) return -1;
    long clen = -1;
    for (char *line = strstr(c->buf, "\r\n"); line && line < hend; line = strstr(line + 2, "\r\n")) {
        char *h = line + 2;
        if (strncasecmp(h, "Content-Length:", 15) == 0) clen = strtol(h + 15, NULL, 10);
        else if (strncasecmp(h, "Connection:", 11) == 0 && strcasestr(h, "close") &&
                 strcasestr(h, "close") < strstr(h, "\r\n"))
            *keep = 0;
        else if (strncasecmp(h, "Transfer-Encoding:", 18) == 0)
            return -1; /* chunked: not supported here */
    }
    if (clen < 0) clen = 0;
    if ((size_t)clen > sizeof c->buf - hlen - 1) return -1;
    while (c->len < hlen + (size_t)clen) {
        ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c->len += (size_t)r;
    }
    *body = malloc((size_t)clen + 1);
    if (!*body) return -1;
    memcpy(*body, c->buf + hlen, (size_t)clen);
    (*body)[clen] = '\0';
    size_t used = hlen + (size_t)clen;
    memmove(c->buf, c->buf + used, c->len - used);
    c->len -= used;
    return 0;
}

static void oq__conn_close(oq__conn_t *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->len = 0;
}

/* One request on \p c (connecting when needed). Returns 0 with status/body, or -1. */
static int oq__request(oq__conn_t *c, const char *host, int port, const char *req, size_t reqlen,
                       int *status, char **body)
{
    if (c->fd < 0) {
        c->fd = oq__connect(host, port, 30000);
        c->len = 0;
        if (c->fd < 0) return -1;
    }
    int keep = 1;
    if (oq__send_all(c->fd, req, reqlen) != 0 || oq__read_response(c, status, body, &keep) != 0) {
        oq__conn_close(c);
        return -1;
    }
    if (!keep) oq__conn_close(c);
    return 0;
}

/* Deterministic per-index choice (splitmix64), so re-runs send identical bodies. */
static uint64_t oq__mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static int oq__tool_of(const oq__load_shared_t *s, int64_t i)
{
    int w = (int)(oq__mix64((uint64_t)i) % (uint64_t)s->total_weight);
    for (int t = 0; t < OQ_LOAD__NTOOLS; t++) {
        if (w < s->mix[t]) return t;
        w -= s->mix[t];
    }
    return OQ_LOAD_CHARGE;
}

static int oq__body(const oq__load_shared_t *s, int64_t i, int tool, int variant, char *out,
                    size_t n)
{
    /* variant != 0 gives a different body for the same key (conflict probe). */
    int64_t amount = 1 + (int64_t)(oq__mix64((uint64_t)i ^ 0x5a5a) % 10000) + variant;
    switch (tool) {
    case OQ_LOAD_CHARGE:
        return snprintf(out, n, "{\"tool\":\"charge\",\"args\":{\"amount\":%lld}}",
                        (long long)amount);
    case OQ_LOAD_EMAIL:
        return snprintf(out, n,
                        "{\"tool\":\"send_email\",\"args\":{\"to\":\"u%lld@example.com\","
                        "\"subject\":\"hello %lld\"}}",
                        (long long)i, (long long)(i + variant));
    case OQ_LOAD_SLEEP:
        return snprintf(out, n, "{\"tool\":\"sleep\",\"args\":{\"ms\":%d}}",
                        s->o->sleep_ms + variant);
    case OQ_LOAD_FAIL_RETRY:
        return snprintf(out, n, "{\"tool\":\"fail\",\"args\":{\"retryable\":true%s}}",
                        variant ? ",\"x\":1" : "");
    default:
        return snprintf(out, n, "{\"tool\":\"fail\",\"args\":{\"retryable\":false%s}}",
                        variant ? ",\"x\":1" : "");
    }
}

static int oq__call_id_of(const char *body, char out[64])
{
    json_error_t je;
    json_t *v = json_loads(body, 0, &je);
    const char *cid = v ? json_string_value(json_object_get(v, "call_id")) : NULL;
    int ok = cid && strlen(cid) < 64;
    if (ok) snprintf(out, 64, "%s", cid);
    json_decref(v);
    return ok ? 0 : -1;
}

static int oq__is_conflict(const char *body)
{
    json_error_t je;
    json_t *v = json_loads(body, 0, &je);
    const char *code = v ? json_string_value(json_object_get(json_object_get(v, "error"), "code"))
                         : NULL;
    int ok = code && strcmp(code, "idempotency_conflict") == 0;
    json_decref(v);
    return ok;
}

/*
 * Submit key i with \p bodytxt until an answer that is not a transport error, 429 or 5xx, or
 * until retry_ms. Returns the final status (0 when given up) and the body in \p resp.
 */
static int oq__submit(oq__load_shared_t *s, oq__conn_t *c, int64_t i, const char *bodytxt,
                      char **resp, int64_t *retries)
{
    const oq_load_opts_t *o = s->o;
    char req[2048];
    int n = snprintf(req, sizeof req,
                     "POST /v1/tool-calls HTTP/1.1\r\nHost: %s:%d\r\nIdempotency-Key: %s-%lld\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     o->host, o->port, o->key_prefix, (long long)i, strlen(bodytxt), bodytxt);
    int64_t deadline = oq_mono_us() + o->retry_ms * 1000;
    int64_t backoff = 20;
    *resp = NULL;
    for (;;) {
        int status = 0;
        char *b = NULL;
        int rc = oq__request(c, o->host, o->port, req, (size_t)n, &status, &b);
        if (rc == 0 && status != 429 && status < 500) {
            *resp = b;
            return status;
        }
        free(b);
        if (oq_mono_us() >= deadline) return 0;
        (*retries)++;
        oq_sleep_ms(backoff, NULL);
        backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
    }
}

static void *oq__load_thread(void *arg)
{
    oq__load_thread_t *t = arg;
    oq__load_shared_t *s = t->s;
    const oq_load_opts_t *o = s->o;
    oq__conn_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = -1;
    oq_load_result_t loc;
    memset(&loc, 0, sizeof loc);
    loc.first_ms = INT64_MAX;
    char body[1024];
    for (int64_t k = t->idx; k < o->calls; k += o->conns) {
        int64_t i = o->first + k;
        if (o->rate > 0) {
            int64_t due = s->t0_us + (int64_t)((double)k * 1e6 / o->rate);
            int64_t now = oq_mono_us();
            if (due > now) oq_sleep_ms((due - now + 999) / 1000, NULL);
        }
        int tool = oq__tool_of(s, i);
        oq__body(s, i, tool, 0, body, sizeof body);
        int64_t sent_ms = oq_now_ms();
        if (sent_ms < loc.first_ms) loc.first_ms = sent_ms;
        int64_t t1 = oq_mono_us();
        char *resp = NULL;
        int st = oq__submit(s, c, i, body, &resp, &loc.retries);
        s->lat[k] = (double)(oq_mono_us() - t1) / 1000.0;
        char cid[64] = "";
        if ((st == 200 || st == 202) && oq__call_id_of(resp, cid) == 0) {
            loc.accepted++;
            loc.by_tool[tool]++;
            if (o->accepted) {
                flockfile(o->accepted);
                fprintf(o->accepted, "%s\n", cid);
                funlockfile(o->accepted);
            }
        } else {
            loc.failed++;
        }
        free(resp);
        resp = NULL;
        if (cid[0] && o->dup_every > 0 && i % o->dup_every == 0) {
            char cid2[64] = "";
            int st2 = oq__submit(s, c, i, body, &resp, &loc.retries);
            if ((st2 == 200 || st2 == 202) && oq__call_id_of(resp, cid2) == 0 &&
                strcmp(cid, cid2) == 0)
                loc.replays_ok++;
            else
                loc.replays_bad++;
            free(resp);
            resp = NULL;
        }
        if (cid[0] && o->conflict_every > 0 && i % o->conflict_every == 0) {
            char other[1024];
            oq__body(s, i, tool, 1, other, sizeof other);
            int st3 = oq__submit(s, c, i, other, &resp, &loc.retries);
            if (st3 == 422 && resp && oq__is_conflict(resp))
                loc.conflicts_ok++;
            else
                loc.conflicts_bad++;
            free(resp);
            resp = NULL;
        }
        int64_t done_ms = oq_now_ms();
        if (done_ms > loc.last_ms) loc.last_ms = done_ms;
    }
    oq__conn_close(c);
    free(c);
    pthread_mutex_lock(&s->mu);
    s->r.accepted += loc.accepted;
    for (int k = 0; k < OQ_LOAD__NTOOLS; k++) s->r.by_tool[k] += loc.by_tool[k];
    s->r.replays_ok += loc.replays_ok;
    s->r.replays_bad += loc.replays_bad;
    s->r.conflicts_ok += loc.conflicts_ok;
    s->r.conflicts_bad += loc.conflicts_bad;
    s->r.retries += loc.retries;
    s->r.failed += loc.failed;
    if (loc.first_ms < s->r.first_ms) s->r.first_ms = loc.first_ms;
    if (loc.last_ms > s->r.last_ms) s->r.last_ms = loc.last_ms;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int oq__cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int oq_load_run(const oq_load_opts_t *in, oq_load_result_t *r, oq_error_t *err)
{
    oq_load_opts_t o = *in;
    memset(r, 0, sizeof *r);
    if (!o.host) o.host = "127.0.0.1";
    if (!o.key_prefix) o.key_prefix = "k";
    if (o.conns <= 0) o.conns = 8;
    if (o.conns > 256) return oq_error_set(err, OQ_EINVAL, 0, "load: at most 256 connections");
    if (o.sleep_ms <= 0) o.sleep_ms = 5;
    if (o.retry_ms <= 0) o.retry_ms = 60000;
    if (o.port <= 0 || o.port > 65535 || o.calls < 0)
        return oq_error_set(err, OQ_EINVAL, 0, "load: bad port or call count");
    oq__load_shared_t *s = calloc(1, sizeof *s);
    if (!s) return oq_error_set(err, OQ_ENOMEM, 0, "load: out of memory");
    s->o = &o;
    int any = 0;
    for (int k = 0; k < OQ_LOAD__NTOOLS; k++) any |= o.mix[k] > 0;
    static const int defmix[OQ_LOAD__NTOOLS] = {40, 30, 10, 10, 10};
    for (int k = 0; k < OQ_LOAD__NTOOLS; k++) {
        s->mix[k] = any ? (o.mix[k] > 0 ? o.mix[k] : 0) : defmix[k];
        s->total_weight += s->mix[k];
    }
    s->lat = calloc((size_t)(o.calls > 0 ? o.calls : 1), sizeof *s->lat);
    pthread_t *th = calloc((size_t)o.conns, sizeof *th);
    oq__load_thread_t *ta = calloc((size_t)o.conns, sizeof *ta);
    int rc = 0;
    if (!s->lat || !th || !ta) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "load: out of memory");
        goto out;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->r.first_ms = INT64_MAX;
    s->t0_us = oq_mono_us();
    int started = 0;
    for (int i = 0; i < o.conns; i++) {
        ta[i] = (oq__load_thread_t){s, i};
        if (pthread_create(&th[i], NULL, oq__load_thread, &ta[i]) != 0) break;
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&s->mu);
    if (started < o.conns) {
        rc = oq_error_set(err, OQ_EIO, errno, "load: could not start all threads");
        goto out;
    }
    *r = s->r;
    if (r->first_ms == INT64_MAX) r->first_ms = 0;
    r->elapsed_s = (double)(oq_mono_us() - s->t0_us) / 1e6;
    if (o.calls > 0) {
        qsort(s->lat, (size_t)o.calls, sizeof *s->lat, oq__cmp_double);
        r->p50_ms = s->lat[(size_t)((double)(o.calls - 1) * 0.50)];
        r->p99_ms = s->lat[(size_t)((double)(o.calls - 1) * 0.99)];
        r->max_ms = s->lat[o.calls - 1];
    }
out:
    free(ta);
    free(th);
    free(s->lat);
    free(s);
    return rc;
}

int oq_http_get(const char *host, int port, const char *path, int timeout_ms, int *status,
                char **body, oq_error_t *err)
{
    if (body) *body = NULL;
    oq__conn_t *c = calloc(1, sizeof *c);
    if (!c) return oq_error_set(err, OQ_ENOMEM, 0, "http: out of memory");
    c->fd = oq__connect(host, port, timeout_ms > 0 ? timeout_ms : 5000);
    if (c->fd < 0) {
        int e = errno;
        free(c);
        return oq_error_set(err, OQ_EIO, e, "connect %s:%d: %s", host, port, strerror(e));
    }
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n",
                     path, host, port);
    int keep = 0;
    char *b = NULL;
    int rc = 0;
    if (n < 0 || (size_t)n >= sizeof req || oq__send_all(c->fd, req, (size_t)n) != 0 ||
        oq__read_response(c, status, &b, &keep) != 0)
        rc = oq_error_set(err, OQ_EIO, errno, "GET %s from %s:%d failed", path, host, port);
    oq__conn_close(c);
    free(c);
    if (rc == 0 && body) *body = b;
    else free(b);
    return rc;
}
