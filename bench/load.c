/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An HTTP load generator for the producer, used by the end-to-end tests (tests/tools/
 * oq_e2e_load) and `onceq-bench e2e`, which runs it on the same cores as the pipeline it
 * measures: so it must be cheap.
 *
 * Why a hand-written client next to libcurl (which `onceq call` and the health checks use,
 * through oq_httpc): CPU per request. Measured on the e2e load (20,000 calls at 6,000/s over
 * 128 keep-alive connections against one producer on the same host, the two clients
 * alternating, in two sessions): libcurl's multi interface driven by the same kind of epoll
 * loop (curl_multi_socket_action) spent 40-51 us of CPU per call (0.52-0.68 s user per
 * 20,000 calls), this client 19-31 us (0.10-0.17 s user): about 2x. Per request libcurl
 * re-adds an easy handle, checks the reused connection with an extra poll() and re-arms the
 * socket with three epoll_ctl calls; on a 2-core host that is CPU taken from the pipeline
 * under test (this client is already ~12 % of one core in `onceq-bench e2e`).
 *
 * So this is the one hand-written HTTP client of the tree, and it is a tool, not product: a
 * minimal HTTP/1.1 client: keep-alive, requests with Content-Length, responses with
 * Content-Length (what libmicrohttpd sends for buffered bodies; `Connection: close` is
 * honoured); anything else closes the connection and counts as a transport error. A
 * keep-alive connection that the server closes while idle is dropped at once and reopened by
 * its next request. IPv4 literal addresses only ("localhost" is 127.0.0.1).
 *
 * Engine: a small event loop. At most two threads (one when there are fewer than
 * OQ__LOAD_CONNS_PER_THREAD connections), each owning connections j with j % threads == its
 * index, non-blocking sockets on one edge-triggered epoll per thread, and every connection a
 * state machine: wait until its next call is due -> connect if needed -> send -> read the
 * response -> the duplicate and conflict probes when asked -> next call. The only timers are
 * the epoll_wait timeout, computed from the earliest due time / backoff end / I/O deadline of
 * the thread's connections (a linear scan: at most 128 connections per thread). Responses are
 * parsed in place; call_id and the error code are found by a scan of the top-level object
 * (the producer answers compact JSON), falling back to jansson for bodies with escapes.
 *
 * Call i (= first + k; with hot_key every call is call first) gets the key "<prefix>-<i>" and a
 * tool chosen by a deterministic hash
 * of i over the mix weights, and call k always goes to connection k % conns, in order, so two
 * runs with the same options submit the same bodies: a re-run after a crash is a replay, never
 * a conflict. A request that fails at the transport level (connect/send/read error, or 30 s
 * without progress), or gets 429/5xx, is resent with the same key and body after an
 * exponential backoff (20 ms doubling, capped at 1 s), reconnecting when needed, until
 * retry_ms has passed since its first try: that is the client side of "effectively once",
 * and it is what makes a kill -9 of the producer mid-run safe. Open-loop pacing: with a rate,
 * call k is due at start + k/rate (rounded up to the millisecond of the epoll timeout) on its
 * connection, so the offered load does not shrink when the server slows down (within the
 * connection count); with rate 0 a connection sends its next call as soon as it is free.
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
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "oq_load.h"
#include "oq_util.h"

#define OQ__LOAD_MAX_THREADS 2
#define OQ__LOAD_CONNS_PER_THREAD 8             /* fewer connections than this: one thread */
#define OQ__LOAD_IO_TIMEOUT_US (30 * 1000000LL) /* connect, and no progress on send/read */
#define OQ__LOAD_BUF 65536                      /* largest response head + body, plus NUL */
#define OQ__EV_TIMER 0x80000000u                /* drive(): woken by the connection's timer */

/* --- HTTP response head ---------------------------------------------------------------------*/

/* Case-insensitive "close" within [p, end). */
static int has_close(const char *p, const char *end)
{
    for (; end - p >= 5; p++)
        if (strncasecmp(p, "close", 5) == 0) return 1;
    return 0;
}

/*
 * Parse a response head: \p buf starts with the status line, \p hend points at the "\r\n\r\n"
 * that ends the head, and the buffer is NUL-terminated somewhere after it. Returns 0 with
 * \p status, \p clen (0 when absent) and \p keep (0 for `Connection: close`), or -1 (not an
 * HTTP/1.x status line, or chunked).
 */
static int parse_head(const char *buf, const char *hend, int *status, long *clen, int *keep)
{
    *keep = 1;
    *clen = -1;
    if (hend - buf < 8 || strncmp(buf, "HTTP/1.", 7) != 0) return -1;
    const char *p = buf + 7;
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9')
        p++;
    char *e = NULL;
    long st = strtol(p, &e, 10);
    if (e == p || e > hend) return -1;
    *status = (int)st;
    const char *line = memmem(buf, (size_t)(hend - buf) + 2, "\r\n", 2);
    while (line && line < hend) {
        const char *h = line + 2;
        const char *eol = memmem(h, (size_t)(hend + 2 - h), "\r\n", 2);
        if (!eol) break;
        if (strncasecmp(h, "Content-Length:", 15) == 0)
            *clen = strtol(h + 15, NULL, 10);
        else if (strncasecmp(h, "Connection:", 11) == 0 && has_close(h + 11, eol))
            *keep = 0;
        else if (strncasecmp(h, "Transfer-Encoding:", 18) == 0)
            return -1; /* chunked: not supported here */
        line = eol;
    }
    if (*clen < 0) *clen = 0;
    return 0;
}

/* --- JSON answers, without a tree -----------------------------------------------------------*/

static const char *js_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* \p p at '"': past the closing quote, or NULL. */
static const char *js_str(const char *p)
{
    for (p++; *p; p++) {
        if (*p == '\\') {
            if (!p[1]) return NULL;
            p++;
        } else if (*p == '"') {
            return p + 1;
        } else if ((unsigned char)*p < 0x20) {
            return NULL;
        }
    }
    return NULL;
}

/* \p p at a value: past it, or NULL. Nesting is counted, not checked bracket by bracket. */
static const char *js_value(const char *p)
{
    if (*p == '"') return js_str(p);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (*p) {
            if (*p == '"') {
                p = js_str(p);
                if (!p) return NULL;
                continue;
            }
            if (*p == '{' || *p == '[')
                depth++;
            else if ((*p == '}' || *p == ']') && --depth == 0)
                return p + 1;
            p++;
        }
        return NULL;
    }
    const char *q = p;
    while (*q && *q != ',' && *q != '}' && *q != ']' && *q != ' ' && *q != '\t' && *q != '\n' &&
           *q != '\r')
        q++;
    return q > p ? q : NULL;
}

/*
 * Member \p key of the object at \p p ('{'): 1 with \p val at its value (the last one wins, as
 * in jansson), 0 when absent, -1 when malformed. \p end is set past the object.
 */
static int js_member(const char *p, const char *key, const char **val, const char **end)
{
    size_t klen = strlen(key);
    int found = 0;
    if (*p != '{') return -1;
    p = js_ws(p + 1);
    if (*p == '}') {
        *end = p + 1;
        return 0;
    }
    for (;;) {
        if (*p != '"') return -1;
        const char *k = p + 1;
        const char *q = js_str(p);
        if (!q) return -1;
        int match = (size_t)(q - 1 - k) == klen && memcmp(k, key, klen) == 0;
        p = js_ws(q);
        if (*p != ':') return -1;
        p = js_ws(p + 1);
        if (match) {
            *val = p;
            found = 1;
        }
        p = js_value(p);
        if (!p) return -1;
        p = js_ws(p);
        if (*p == ',') {
            p = js_ws(p + 1);
            continue;
        }
        if (*p != '}') return -1;
        *end = p + 1;
        return found;
    }
}

/*
 * The string at \p path (one or two member names) of the JSON object \p body into \p out
 * (at most n-1 bytes). Returns 0, or -1 (absent, not a string, too long, not an object).
 * Bodies with a backslash anywhere go through jansson so escapes decode exactly.
 */
static int json_str_at(const char *body, const char *k1, const char *k2, char *out, size_t n)
{
    if (strchr(body, '\\')) {
        json_error_t je;
        json_t *v = json_loads(body, 0, &je);
        json_t *x = v ? json_object_get(v, k1) : NULL;
        if (k2) x = json_object_get(x, k2);
        const char *sv = json_string_value(x);
        int ok = sv && strlen(sv) < n;
        if (ok) memcpy(out, sv, strlen(sv) + 1);
        json_decref(v);
        return ok ? 0 : -1;
    }
    const char *p = js_ws(body), *v = NULL, *end = NULL;
    if (js_member(p, k1, &v, &end) != 1 || *js_ws(end) != '\0') return -1;
    if (k2 && js_member(v, k2, &v, &end) != 1) return -1;
    if (*v != '"') return -1;
    const char *q = js_str(v);
    if (!q) return -1;
    size_t len = (size_t)(q - 1 - (v + 1));
    if (len >= n) return -1;
    memcpy(out, v + 1, len);
    out[len] = '\0';
    return 0;
}

static int call_id_of(const char *body, char out[64])
{
    return json_str_at(body, "call_id", NULL, out, 64);
}

static int is_conflict(const char *body)
{
    char code[32];
    return json_str_at(body, "error", "code", code, sizeof code) == 0 &&
           strcmp(code, "idempotency_conflict") == 0;
}

/* --- calls: keys, tools, bodies -------------------------------------------------------------*/

typedef struct load_shared {
    const oq_load_opts_t *o;
    int64_t t0_us;
    struct sockaddr_in addr;
    int addr_ok; /* 0: host is not an IPv4 address, every connect fails (and is retried) */
    pthread_mutex_t mu;
    oq_load_result_t r;
    double *lat; /* one slot per call (ms) */
    int total_weight;
    int mix[OQ_LOAD__NTOOLS];
} load_shared_t;

/* Deterministic per-index choice (splitmix64), so re-runs send identical bodies. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static int tool_of(const load_shared_t *s, int64_t i)
{
    int w = (int)(mix64((uint64_t)i) % (uint64_t)s->total_weight);
    for (int t = 0; t < OQ_LOAD__NTOOLS; t++) {
        if (w < s->mix[t]) return t;
        w -= s->mix[t];
    }
    return OQ_LOAD_CHARGE;
}

static int call_body(const load_shared_t *s, int64_t i, int tool, int variant, char *out, size_t n)
{
    /* variant != 0 gives a different body for the same key (conflict probe). */
    int64_t amount = 1 + (int64_t)(mix64((uint64_t)i ^ 0x5a5a) % 10000) + variant;
    switch (tool) {
    case OQ_LOAD_CHARGE:
        return snprintf(out, n, "{\"tool\":\"%s\",\"args\":{\"amount\":%lld}}",
                        s->o->charge_tool ? s->o->charge_tool : "charge", (long long)amount);
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

/* --- the event loop -------------------------------------------------------------------------*/

/* Connection states. NEXT and DONE_REQ are transient; the others wait for I/O or the timer. */
enum {
    OQ__ST_NEXT = 0,   /* start call k, or wait for its due time */
    OQ__ST_WAIT,       /* timer: call k is due */
    OQ__ST_ATTEMPT,    /* one try of the current request: connect if needed, then send */
    OQ__ST_CONNECTING, /* EPOLLOUT: connected (or failed); timer: connect timeout */
    OQ__ST_SEND,       /* EPOLLOUT: send the rest; timer: no progress */
    OQ__ST_READ,       /* EPOLLIN: read the response; timer: no progress */
    OQ__ST_FAILED,     /* the try failed: back off, or give the request up after retry_ms */
    OQ__ST_BACKOFF,    /* timer: try again */
    OQ__ST_DONE_REQ,   /* the request has its answer (or was given up): account, go on */
    OQ__ST_FINISHED    /* no more calls on this connection */
};

typedef struct lconn {
    int fd;
    uint32_t gen; /* bumped on close: events of an old socket are ignored */
    int state;    /* OQ__ST_* */
    int phase;    /* 0 first submit, 1 duplicate probe, 2 conflict probe */
    int tool;
    int64_t k;           /* call of the run this connection is on (k % conns == its index) */
    int64_t timer_us;    /* mono time the state's timer fires; INT64_MAX: none */
    int64_t t1_us;       /* first try of the call's first submit (latency) */
    int64_t deadline_us; /* retry deadline of the current request */
    int64_t backoff_ms;
    int send_waited; /* the current send had to wait for EPOLLOUT */
    size_t reqlen, sent;
    /* response being read */
    int head; /* head parsed: status, keep and need are valid */
    int status, keep;
    size_t hlen, need, scan, len;
    /* outcome of the current request */
    int ok;        /* 2xx with a call_id (phases 0, 1) / 422 idempotency_conflict (2) */
    char cid[64];  /* call_id of the first submit ("" when not accepted) */
    char rcid[64]; /* call_id of the last answer */
    char req[2048];
    char buf[OQ__LOAD_BUF];
} lconn_t;

typedef struct {
    load_shared_t *s;
    int ep;
    lconn_t *c;
    int n;      /* connections of this thread */
    int active; /* connections not FINISHED */
    int err;    /* errno of a fatal epoll error (the run is incomplete) */
    oq_load_result_t loc;
} lthread_t;

static void lclose(lconn_t *c)
{
    if (c->fd >= 0) close(c->fd); /* also leaves the epoll set */
    c->fd = -1;
    c->gen++;
    c->len = 0;
    c->buf[0] = '\0';
    c->head = 0;
    c->scan = 0;
}

/* Start a non-blocking connect. Returns 0 connected, 1 in progress, -1 failed. */
static int lconnect(lthread_t *t, lconn_t *c)
{
    if (!t->s->addr_ok) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = connect(fd, (const struct sockaddr *)&t->s->addr, sizeof t->s->addr);
    if (rc != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    c->fd = fd;
    c->gen++;
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = ((uint64_t)c->gen << 32) | (uint64_t)(c - t->c);
    if (epoll_ctl(t->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        lclose(c);
        return -1;
    }
    return rc == 0 ? 0 : 1;
}

/* A request (c->req) begins: its retry deadline and backoff start now. */
static void lrequest(const load_shared_t *s, lconn_t *c)
{
    c->deadline_us = oq_mono_us() + s->o->retry_ms * 1000;
    c->backoff_ms = 20;
    c->state = OQ__ST_ATTEMPT;
}

static void lbuild(const load_shared_t *s, lconn_t *c, int64_t i, int variant)
{
    const oq_load_opts_t *o = s->o;
    char body[1024];
    int bn = call_body(s, i, c->tool, variant, body, sizeof body);
    int n = snprintf(c->req, sizeof c->req,
                     "POST /v1/tool-calls HTTP/1.1\r\nHost: %s:%d\r\nIdempotency-Key: %s-%lld\r\n"
                     "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                     o->host, o->port, o->key_prefix, (long long)i, bn, body);
    /* oq_load_run() bounds host and prefix, so this never truncates */
    c->reqlen = n < 0 ? 0 : (size_t)n < sizeof c->req ? (size_t)n : sizeof c->req - 1;
}

/* An idle connection (no request in flight) became readable: EOF, error or stray bytes. */
static void lidle(lconn_t *c, uint32_t ev)
{
    if (c->fd < 0 || !(ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) return;
    char tmp[512];
    ssize_t r = recv(c->fd, tmp, sizeof tmp, 0);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    lclose(c); /* the next request reconnects */
}

/*
 * Look for a complete response in c->buf. Returns 1 complete, 0 need more, -1 malformed or too
 * large (the connection must be dropped).
 */
static int lparse(lconn_t *c)
{
    if (!c->head) {
        size_t from = c->scan > 3 ? c->scan - 3 : 0;
        const char *hend =
            c->len > from ? memmem(c->buf + from, c->len - from, "\r\n\r\n", 4) : NULL;
        if (!hend) {
            c->scan = c->len;
            return c->len >= sizeof c->buf - 1 ? -1 : 0;
        }
        long clen = 0;
        if (parse_head(c->buf, hend, &c->status, &clen, &c->keep) != 0) return -1;
        c->hlen = (size_t)(hend - c->buf) + 4;
        if ((size_t)clen > sizeof c->buf - c->hlen - 1) return -1;
        c->need = c->hlen + (size_t)clen;
        c->head = 1;
    }
    return c->len >= c->need ? 1 : 0;
}

/* A complete response is in c->buf: judge it, consume it. Returns 1 to retry, 0 answered. */
static int lresponse(lconn_t *c, int hup)
{
    int retry = c->status == 429 || c->status >= 500;
    char *body = c->buf + c->hlen;
    char saved = c->buf[c->need];
    c->buf[c->need] = '\0';
    c->ok = 0;
    if (!retry) {
        if (c->phase < 2)
            c->ok = (c->status == 200 || c->status == 202) && call_id_of(body, c->rcid) == 0;
        else
            c->ok = c->status == 422 && is_conflict(body);
    }
    c->buf[c->need] = saved;
    memmove(c->buf, c->buf + c->need, c->len - c->need);
    c->len -= c->need;
    c->buf[c->len] = '\0';
    c->head = 0;
    c->scan = 0;
    if (!c->keep || hup) lclose(c);
    return retry;
}

static void laccount_call(lthread_t *t, lconn_t *c)
{
    load_shared_t *s = t->s;
    const oq_load_opts_t *o = s->o;
    s->lat[c->k] = (double)(oq_mono_us() - c->t1_us) / 1000.0;
    c->cid[0] = '\0';
    if (c->ok) {
        memcpy(c->cid, c->rcid, sizeof c->cid);
        t->loc.accepted++;
        t->loc.by_tool[c->tool]++;
        if (o->accepted) {
            flockfile(o->accepted);
            fprintf(o->accepted, "%s\n", c->cid);
            funlockfile(o->accepted);
        }
    } else {
        t->loc.failed++;
    }
}

/*
 * Run connection \p c's state machine until it has to wait. \p ev: the epoll events that woke
 * it, OQ__EV_TIMER when its timer fired, 0 to (re)start it.
 */
static void drive(lthread_t *t, lconn_t *c, uint32_t ev)
{
    load_shared_t *s = t->s;
    const oq_load_opts_t *o = s->o;
    for (;;) {
        switch (c->state) {
        case OQ__ST_NEXT:
            if (c->k >= o->calls) {
                lclose(c);
                c->state = OQ__ST_FINISHED;
                c->timer_us = INT64_MAX;
                t->active--;
                return;
            }
            if (o->rate > 0) {
                int64_t due = s->t0_us + (int64_t)((double)c->k * 1e6 / o->rate);
                if (due > oq_mono_us()) {
                    c->state = OQ__ST_WAIT;
                    c->timer_us = due;
                    return;
                }
            }
            /* fall through: the call is due */
        begin_call : {
            int64_t i = o->hot_key ? o->first : o->first + c->k; /* hot: one key, one body */
            c->tool = tool_of(s, i);
            c->phase = 0;
            lbuild(s, c, i, 0);
            int64_t sent_ms = oq_now_ms();
            if (sent_ms < t->loc.first_ms) t->loc.first_ms = sent_ms;
            c->t1_us = oq_mono_us();
            lrequest(s, c);
            ev = 0;
            continue;
        }
        case OQ__ST_WAIT:
            if (ev == OQ__EV_TIMER) goto begin_call;
            lidle(c, ev);
            return;
        case OQ__ST_ATTEMPT:
            ev = 0;
            if (c->fd < 0) {
                int rc = lconnect(t, c);
                if (rc < 0) {
                    c->state = OQ__ST_FAILED;
                    continue;
                }
                if (rc > 0) {
                    c->state = OQ__ST_CONNECTING;
                    c->timer_us = oq_mono_us() + OQ__LOAD_IO_TIMEOUT_US;
                    return;
                }
            }
            c->sent = 0;
            c->send_waited = 0;
            c->state = OQ__ST_SEND;
            continue;
        case OQ__ST_CONNECTING: {
            if (ev == OQ__EV_TIMER) {
                lclose(c);
                c->state = OQ__ST_FAILED;
                continue;
            }
            if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
                lclose(c);
                c->state = OQ__ST_FAILED;
                continue;
            }
            ev = 0;
            c->sent = 0;
            c->send_waited = 0;
            c->state = OQ__ST_SEND;
            continue;
        }
        case OQ__ST_SEND: {
            if (ev == OQ__EV_TIMER) {
                lclose(c);
                c->state = OQ__ST_FAILED;
                continue;
            }
            if (c->send_waited && !(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
            int failed = 0;
            while (c->sent < c->reqlen) {
                ssize_t w = send(c->fd, c->req + c->sent, c->reqlen - c->sent, MSG_NOSIGNAL);
                if (w < 0 && errno == EINTR) continue;
                if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                if (w <= 0) {
                    failed = 1;
                    break;
                }
                c->sent += (size_t)w;
            }
            if (failed) {
                lclose(c);
                c->state = OQ__ST_FAILED;
                continue;
            }
            if (c->sent < c->reqlen) {
                c->send_waited = 1;
                c->timer_us = oq_mono_us() + OQ__LOAD_IO_TIMEOUT_US;
                return;
            }
            c->state = OQ__ST_READ;
            c->timer_us = oq_mono_us() + OQ__LOAD_IO_TIMEOUT_US;
            /* Edge-triggered: bytes that came while sending raised no new edge, so look now;
             * otherwise the answer's arrival wakes us. */
            if (c->len == 0 && !c->send_waited) return;
            ev = EPOLLIN;
            continue;
        }
        case OQ__ST_READ: {
            if (ev == OQ__EV_TIMER) {
                lclose(c);
                c->state = OQ__ST_FAILED;
                continue;
            }
            if (!(ev & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP))) return;
            int hup = (ev & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) != 0;
            int done = 0;
            for (;;) {
                int pr = lparse(c);
                if (pr != 0) {
                    done = pr;
                    break;
                }
                ssize_t r = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, 0);
                if (r < 0 && errno == EINTR) continue;
                if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
                if (r <= 0) {
                    done = -1;
                    break;
                }
                c->len += (size_t)r;
                c->buf[c->len] = '\0';
            }
            ev = 0;
            if (done == 0) {
                c->timer_us = oq_mono_us() + OQ__LOAD_IO_TIMEOUT_US;
                return;
            }
            c->timer_us = INT64_MAX;
            if (done < 0) {
                lclose(c);
                c->state = OQ__ST_FAILED;
                continue;
            }
            c->state = lresponse(c, hup) ? OQ__ST_FAILED : OQ__ST_DONE_REQ;
            continue;
        }
        case OQ__ST_FAILED: {
            int64_t now = oq_mono_us();
            if (now >= c->deadline_us) {
                c->ok = 0;
                c->state = OQ__ST_DONE_REQ;
                continue;
            }
            t->loc.retries++;
            c->state = OQ__ST_BACKOFF;
            c->timer_us = now + c->backoff_ms * 1000;
            c->backoff_ms = c->backoff_ms * 2 > 1000 ? 1000 : c->backoff_ms * 2;
            return;
        }
        case OQ__ST_BACKOFF:
            if (ev == OQ__EV_TIMER) {
                c->state = OQ__ST_ATTEMPT;
                continue;
            }
            lidle(c, ev);
            return;
        case OQ__ST_DONE_REQ: {
            int64_t i = o->first + c->k;
            c->timer_us = INT64_MAX;
            if (c->phase == 0) {
                laccount_call(t, c);
                if (c->cid[0] && o->dup_every > 0 && i % o->dup_every == 0) {
                    c->phase = 1; /* same key, same body: c->req as it is */
                    lrequest(s, c);
                    continue;
                }
            } else if (c->phase == 1) {
                if (c->ok && strcmp(c->cid, c->rcid) == 0)
                    t->loc.replays_ok++;
                else
                    t->loc.replays_bad++;
            } else {
                if (c->ok)
                    t->loc.conflicts_ok++;
                else
                    t->loc.conflicts_bad++;
            }
            if (c->phase < 2 && c->cid[0] && o->conflict_every > 0 && i % o->conflict_every == 0) {
                c->phase = 2;
                lbuild(s, c, i, 1);
                lrequest(s, c);
                continue;
            }
            int64_t done_ms = oq_now_ms();
            if (done_ms > t->loc.last_ms) t->loc.last_ms = done_ms;
            c->k += o->conns;
            c->state = OQ__ST_NEXT;
            continue;
        }
        default: /* OQ__ST_FINISHED */
            return;
        }
    }
}

static void *load_thread(void *arg)
{
    lthread_t *t = arg;
    load_shared_t *s = t->s;
    for (int j = 0; j < t->n; j++)
        drive(t, &t->c[j], 0);
    struct epoll_event evs[64];
    while (t->active > 0) {
        /* Timers first: fire what is due, find the next one. */
        int64_t now = oq_mono_us(), next = INT64_MAX;
        for (int j = 0; j < t->n; j++) {
            lconn_t *c = &t->c[j];
            if (c->timer_us <= now) {
                c->timer_us = INT64_MAX;
                drive(t, c, OQ__EV_TIMER);
            }
            if (c->timer_us < next) next = c->timer_us;
        }
        if (t->active == 0) break;
        int timeout = -1;
        if (next != INT64_MAX) {
            now = oq_mono_us();
            int64_t ms = next <= now ? 0 : (next - now + 999) / 1000; /* never wake early */
            timeout = ms > 60000 ? 60000 : (int)ms;
        }
        int n = epoll_wait(t->ep, evs, (int)(sizeof evs / sizeof evs[0]), timeout);
        if (n < 0) {
            if (errno == EINTR) continue;
            t->err = errno;
            break;
        }
        for (int e = 0; e < n; e++) {
            uint32_t idx = (uint32_t)(evs[e].data.u64 & 0xffffffffu);
            uint32_t gen = (uint32_t)(evs[e].data.u64 >> 32);
            if (idx >= (uint32_t)t->n) continue;
            lconn_t *c = &t->c[idx];
            if (c->gen != gen || c->fd < 0) continue; /* a socket closed since */
            drive(t, c, evs[e].events & ~OQ__EV_TIMER);
        }
    }
    for (int j = 0; j < t->n; j++)
        lclose(&t->c[j]);
    pthread_mutex_lock(&s->mu);
    s->r.accepted += t->loc.accepted;
    for (int k = 0; k < OQ_LOAD__NTOOLS; k++)
        s->r.by_tool[k] += t->loc.by_tool[k];
    s->r.replays_ok += t->loc.replays_ok;
    s->r.replays_bad += t->loc.replays_bad;
    s->r.conflicts_ok += t->loc.conflicts_ok;
    s->r.conflicts_bad += t->loc.conflicts_bad;
    s->r.retries += t->loc.retries;
    s->r.failed += t->loc.failed;
    if (t->loc.first_ms < s->r.first_ms) s->r.first_ms = t->loc.first_ms;
    if (t->loc.last_ms > s->r.last_ms) s->r.last_ms = t->loc.last_ms;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
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
    if (strlen(o.host) > 255 || strlen(o.key_prefix) > 255)
        return oq_error_set(err, OQ_EINVAL, 0, "load: host or key prefix too long");
    int nthreads = o.conns < OQ__LOAD_CONNS_PER_THREAD ? 1 : OQ__LOAD_MAX_THREADS;
    load_shared_t *s = calloc(1, sizeof *s);
    if (!s) return oq_error_set(err, OQ_ENOMEM, 0, "load: out of memory");
    s->o = &o;
    s->addr.sin_family = AF_INET;
    s->addr.sin_port = htons((uint16_t)o.port);
    s->addr_ok = inet_pton(AF_INET, strcmp(o.host, "localhost") == 0 ? "127.0.0.1" : o.host,
                           &s->addr.sin_addr) == 1;
    int any = 0;
    for (int k = 0; k < OQ_LOAD__NTOOLS; k++)
        any |= o.mix[k] > 0;
    static const int defmix[OQ_LOAD__NTOOLS] = {40, 30, 10, 10, 10};
    for (int k = 0; k < OQ_LOAD__NTOOLS; k++) {
        s->mix[k] = any ? (o.mix[k] > 0 ? o.mix[k] : 0) : defmix[k];
        s->total_weight += s->mix[k];
    }
    s->lat = calloc((size_t)(o.calls > 0 ? o.calls : 1), sizeof *s->lat);
    pthread_t *th = calloc((size_t)nthreads, sizeof *th);
    lthread_t *ta = calloc((size_t)nthreads, sizeof *ta);
    int rc = 0, started = 0, mu_init = 0;
    if (ta)
        for (int t = 0; t < nthreads; t++)
            ta[t].ep = -1;
    if (!s->lat || !th || !ta) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "load: out of memory");
        goto out;
    }
    for (int t = 0; t < nthreads; t++) {
        lthread_t *tt = &ta[t];
        tt->s = s;
        tt->n = o.conns / nthreads + (t < o.conns % nthreads);
        tt->loc.first_ms = INT64_MAX;
        tt->ep = epoll_create1(EPOLL_CLOEXEC);
        tt->c = calloc((size_t)tt->n, sizeof *tt->c);
        if (tt->ep < 0 || !tt->c) {
            rc = tt->ep < 0
                     ? oq_error_set(err, OQ_EIO, errno, "load: epoll_create1: %s", strerror(errno))
                     : oq_error_set(err, OQ_ENOMEM, 0, "load: out of memory");
            goto out;
        }
        for (int j = 0; j < tt->n; j++) {
            lconn_t *c = &tt->c[j];
            c->fd = -1;
            c->k = (int64_t)j * nthreads + t; /* connection j*nthreads+t: calls k % conns == it */
            c->state = OQ__ST_NEXT;
            c->timer_us = INT64_MAX;
        }
        tt->active = tt->n;
    }
    pthread_mutex_init(&s->mu, NULL);
    mu_init = 1;
    s->r.first_ms = INT64_MAX;
    s->t0_us = oq_mono_us();
    for (int t = 0; t < nthreads; t++) {
        if (pthread_create(&th[t], NULL, load_thread, &ta[t]) != 0) break;
        started++;
    }
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    if (started < nthreads) {
        rc = oq_error_set(err, OQ_EIO, errno, "load: could not start all threads");
        goto out;
    }
    for (int t = 0; t < nthreads; t++)
        if (ta[t].err) {
            rc = oq_error_set(err, OQ_EIO, ta[t].err, "load: epoll_wait: %s", strerror(ta[t].err));
            goto out;
        }
    *r = s->r;
    if (r->first_ms == INT64_MAX) r->first_ms = 0;
    r->elapsed_s = (double)(oq_mono_us() - s->t0_us) / 1e6;
    if (o.calls > 0) {
        qsort(s->lat, (size_t)o.calls, sizeof *s->lat, cmp_double);
        r->p50_ms = s->lat[(size_t)((double)(o.calls - 1) * 0.50)];
        r->p99_ms = s->lat[(size_t)((double)(o.calls - 1) * 0.99)];
        r->max_ms = s->lat[o.calls - 1];
    }
out:
    if (mu_init) pthread_mutex_destroy(&s->mu);
    if (ta)
        for (int t = 0; t < nthreads; t++) {
            if (ta[t].ep >= 0) close(ta[t].ep);
            free(ta[t].c);
        }
    free(ta);
    free(th);
    free(s->lat);
    free(s);
    return rc;
}
