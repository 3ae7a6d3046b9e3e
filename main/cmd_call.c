/*
 * `onceq call`: the well-behaved client. Submits one call over HTTP with ONE Idempotency-Key,
 * retries what may succeed later (connect errors, timeouts, 429, 503, other 5xx) with
 * exponential backoff and full jitter under a retry budget, never changes the key (so a retry
 * after a lost response is a replay, not a second call), then polls GET /v1/tool-calls/{id}
 * until the call is terminal, printing each state change on stderr and the final call JSON on
 * stdout.
 *
 * The HTTP client is deliberately tiny (loopback / plain http only): one request per
 * connection (Connection: close), a deadline on connect, send and receive, the response read
 * to EOF. Exit codes: 0 succeeded, 1 failed / needs_review / gave up, 2 bad usage or 400,
 * 5 idempotency conflict (422).
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cmds.h"
#include "oq_json.h"
#include "oq_log.h"
#include "oq_util.h"

static const oq_setting_t call_settings[] = {
    {"url", OQ_SET_STRING, "http://127.0.0.1:8081", 8, 512, NULL, "producer base URL"},
    {"key", OQ_SET_STRING, NULL, 0, 255, NULL, "idempotency key (required; never changed)"},
    {"tool", OQ_SET_STRING, NULL, 0, 128, NULL, "tool name (required)"},
    {"args", OQ_SET_STRING, "{}", 0, 0, NULL, "tool arguments, a JSON object"},
    {"tenant", OQ_SET_STRING, NULL, 0, 128, NULL, "tenant (default: the server's default)"},
    {"request-timeout", OQ_SET_DURATION, "5s", 10, 600000, NULL, "deadline of one HTTP request"},
    {"retry-budget", OQ_SET_INT, "8", 0, 1000, NULL, "retries allowed for the submit"},
    {"backoff", OQ_SET_DURATION, "100ms", 1, 60000, NULL, "first backoff (doubles, full jitter)"},
    {"max-backoff", OQ_SET_DURATION, "5s", 1, 600000, NULL, "backoff cap"},
    {"poll-interval", OQ_SET_DURATION, "200ms", 10, 60000, NULL, "status polling period"},
    {"timeout", OQ_SET_DURATION, "60s", 100, 86400000, NULL,
     "give up waiting for a terminal state after this long"},
    {"wait", OQ_SET_BOOL, "true", 0, 0, NULL, "poll until terminal (--no-wait: submit only)"},
};

static const char call_usage[] =
    "usage: onceq call --url http://127.0.0.1:8081 --key K --tool T --args JSON [--tenant X]\n"
    "Exit codes: 0 succeeded (or accepted with --no-wait), 1 failed/needs_review/gave up,\n"
    "            2 bad usage or 400, 5 idempotency conflict.";

typedef struct http_resp {
    int status; /* 0: transport error or timeout */
    char *body;
    char err[128];
} http_resp_t;

static int parse_url(const char *url, char host[256], char port[8], char path[512])
{
    if (strncmp(url, "http://", 7) != 0) return -1;
    const char *h = url + 7, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    if (hl == 0 || hl >= 256) return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *colon = strrchr(host, ':');
    if (colon) {
        *colon = '\0';
        snprintf(port, 8, "%s", colon + 1);
    } else {
        snprintf(port, 8, "80");
    }
    snprintf(path, 512, "%s", slash ? slash : "");
    size_t pl = strlen(path);
    if (pl && path[pl - 1] == '/') path[pl - 1] = '\0';
    return 0;
}

static int wait_fd(int fd, short ev, int64_t deadline_us)
{
    int64_t left = (deadline_us - oq_mono_us()) / 1000;
    if (left <= 0) return 0;
    struct pollfd p = {fd, ev, 0};
    int r;
    do {
        r = poll(&p, 1, (int)left);
    } while (r < 0 && errno == EINTR);
    return r > 0;
}

/** One request; the response is read to EOF. */
static void http_do(const char *host, const char *port, const char *method, const char *path,
                    const char *key, const char *body, int64_t timeout_ms, http_resp_t *r)
{
    memset(r, 0, sizeof *r);
    int64_t deadline = oq_mono_us() + timeout_ms * 1000;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int fd = -1;
    char *req = NULL, *buf = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai) {
        snprintf(r->err, sizeof r->err, "cannot resolve %s", host);
        goto out;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(r->err, sizeof r->err, "socket: %s", strerror(errno));
        goto out;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        snprintf(r->err, sizeof r->err, "connect: %s", strerror(errno));
        goto out;
    }
    if (!wait_fd(fd, POLLOUT, deadline)) {
        snprintf(r->err, sizeof r->err, "connect timeout");
        goto out;
    }
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
    if (soerr) {
        snprintf(r->err, sizeof r->err, "connect: %s", strerror(soerr));
        goto out;
    }
    size_t blen = body ? strlen(body) : 0;
    size_t cap = 512 + strlen(path) + (key ? strlen(key) : 0) + blen;
    req = malloc(cap);
    if (!req) goto out;
    int n = snprintf(req, cap,
                     "%s %s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n"
                     "Accept: application/json\r\n%s%s%s",
                     method, path, host, port, key ? "Idempotency-Key: " : "", key ? key : "",
                     key ? "\r\n" : "");
    if (body)
        n +=
            snprintf(req + n, cap - (size_t)n,
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", blen, body);
    else
        n += snprintf(req + n, cap - (size_t)n, "\r\n");
    for (size_t off = 0; off < (size_t)n;) {
        if (!wait_fd(fd, POLLOUT, deadline)) {
            snprintf(r->err, sizeof r->err, "send timeout");
            goto out;
        }
        ssize_t w = send(fd, req + off, (size_t)n - off, MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            snprintf(r->err, sizeof r->err, "send: %s", strerror(errno));
            goto out;
        }
        if (w > 0) off += (size_t)w;
    }
    size_t len = 0, bcap = 4096;
    buf = malloc(bcap);
    if (!buf) goto out;
    for (;;) {
        if (!wait_fd(fd, POLLIN, deadline)) {
            snprintf(r->err, sizeof r->err, "response timeout");
            goto out;
        }
        if (len + 1024 > bcap) {
            char *nb = realloc(buf, bcap * 2);
            if (!nb) goto out;
            buf = nb;
            bcap *= 2;
        }
        ssize_t got = recv(fd, buf + len, bcap - len - 1, 0);
        if (got == 0) break;
        if (got < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            snprintf(r->err, sizeof r->err, "recv: %s", strerror(errno));
            goto out;
        }
        len += (size_t)got;
    }
    buf[len] = '\0';
    int st = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &st) != 1) {
        snprintf(r->err, sizeof r->err, "bad response");
        goto out;
    }
    char *b = strstr(buf, "\r\n\r\n");
    r->body = strdup(b ? b + 4 : "");
    r->status = st;
out:
    if (ai) freeaddrinfo(ai);
    if (fd >= 0) close(fd);
    free(req);
    free(buf);
}

static int retriable_status(int st)
{
    return st == 0 || st == 429 || st >= 500;
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

int oq__cmd_call(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    json_t *args = NULL, *body = NULL, *call = NULL;
    char *body_text = NULL;
    http_resp_t r = {0};
    oq_config_t *cfg = oq_config_new(call_settings, sizeof call_settings / sizeof call_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq", call_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    const char *key = oq_config_str(cfg, "key"), *tool = oq_config_str(cfg, "tool");
    const char *a = oq_config_str(cfg, "args"), *tenant = oq_config_str(cfg, "tenant");
    char host[256], port[8], base[512];
    if (!key || !tool || parse_url(oq_config_str(cfg, "url"), host, port, base) != 0) {
        fprintf(stderr, "%s\n(--key and --tool are required; --url must be http://host:port)\n",
                call_usage);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (oq_json_parse(a, strlen(a), 0, &args, &err) != 0) {
        fprintf(stderr, "onceq call: --args: %s\n", err.msg);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    body = json_pack("{s:s,s:O}", "tool", tool, "args", args);
    if (tenant) json_object_set_new(body, "tenant", json_string(tenant));
    body_text = json_dumps(body, JSON_COMPACT);
    if (!body_text) goto out;
    int64_t rto = oq_config_int(cfg, "request-timeout");
    int budget = (int)oq_config_int(cfg, "retry-budget");
    int64_t backoff = oq_config_int(cfg, "backoff"),
            max_backoff = oq_config_int(cfg, "max-backoff");
    char path[600];
    snprintf(path, sizeof path, "%s/v1/tool-calls", base);

    /* Submit, retrying with the same key. */
    for (int attempt = 0;; attempt++) {
        free(r.body);
        http_do(host, port, "POST", path, key, body_text, rto, &r);
        if (!retriable_status(r.status)) break;
        if (attempt >= budget) {
            fprintf(stderr, "onceq call: giving up after %d retries: %s\n", attempt,
                    r.status ? "server unavailable" : r.err);
            goto out;
        }
        int64_t cap = backoff << (attempt < 20 ? attempt : 20);
        if (cap > max_backoff || cap <= 0) cap = max_backoff;
        uint32_t rnd;
        oq_random_bytes(&rnd, sizeof rnd);
        int64_t sleep_ms = (int64_t)(rnd % (uint32_t)(cap + 1)); /* full jitter */
        fprintf(stderr, "retry %d/%d in %lld ms (same key): %s\n", attempt + 1, budget,
                (long long)sleep_ms, r.status ? "HTTP error" : r.err);
        if (r.status) fprintf(stderr, "  HTTP %d %s\n", r.status, r.body ? r.body : "");
        oq_sleep_ms(sleep_ms, NULL);
    }
    if (r.status == 422) {
        fprintf(stderr, "onceq call: idempotency_conflict: %s\n", r.body);
        ret = OQ_EXIT_CONFLICT;
        goto out;
    }
    if (r.status != 200 && r.status != 202) {
        fprintf(stderr, "onceq call: HTTP %d %s\n", r.status, r.body ? r.body : "");
        ret = r.status >= 400 && r.status < 500 ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    call = json_loads(r.body, 0, NULL);
    if (!call) {
        fprintf(stderr, "onceq call: unparseable response: %s\n", r.body);
        goto out;
    }
    char id[64];
    snprintf(id, sizeof id, "%s", jstr(call, "call_id"));
    char last[32];
    snprintf(last, sizeof last, "%s", jstr(call, "status"));
    fprintf(stderr, "%s call_id=%s status=%s\n", r.status == 202 ? "accepted" : "replayed", id,
            last);

    /* Poll to a terminal state. */
    if (oq_config_int(cfg, "wait")) {
        int64_t deadline = oq_mono_us() + oq_config_int(cfg, "timeout") * 1000;
        snprintf(path, sizeof path, "%s/v1/tool-calls/%s", base, id);
        while (strcmp(last, "succeeded") != 0 && strcmp(last, "failed") != 0 &&
               strcmp(last, "needs_review") != 0) {
            if (oq_mono_us() >= deadline) {
                fprintf(stderr,
                        "onceq call: still %s after --timeout; the call goes on (query "
                        "with onceq get %s)\n",
                        last, id);
                goto print;
            }
            oq_sleep_ms(oq_config_int(cfg, "poll-interval"), NULL);
            free(r.body);
            http_do(host, port, "GET", path, NULL, NULL, rto, &r);
            if (r.status != 200) continue; /* transient: keep polling until the deadline */
            json_t *c = json_loads(r.body, 0, NULL);
            if (!c) continue;
            json_decref(call);
            call = c;
            if (strcmp(jstr(call, "status"), last) != 0) {
                snprintf(last, sizeof last, "%s", jstr(call, "status"));
                fprintf(stderr, "status=%s attempt=%lld\n", last,
                        (long long)json_integer_value(json_object_get(call, "attempt")));
            }
        }
        ret = strcmp(last, "succeeded") == 0 ? OQ_EXIT_OK : OQ_EXIT_FAIL;
    } else {
        ret = OQ_EXIT_OK;
    }
print:;
    char *text = json_dumps(call, JSON_INDENT(2));
    if (text) printf("%s\n", text);
    free(text);
out:
    free(r.body);
    free(body_text);
    json_decref(call);
    json_decref(body);
    json_decref(args);
    oq_config_destroy(cfg);
    return ret;
}
