/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mhd.c: what the onceq servers on libmicrohttpd share (oq_mhd.h): the logger, the replies
 * (every response of the servers is queued by oq_mhd_reply, every error body written by
 * oq_mhd_error), the URL unescaper that never lets a %00 truncate a path or a query value, and
 * the connection guard (limits, request deadline, eviction, probe slots; its design is in
 * oq_mhd.h).
 *
 * The guard's table is a list in the order of each entry's `since` (accept, or the end of its
 * previous request: an entry moves to the tail when a request completes), so the oldest
 * incomplete request is the first incomplete entry from the head. One thread per guard scans
 * the list four times a second for requests past their deadline; the table holds at most
 * max_conns + probe_slots entries (plus those closing), so a scan is a few microseconds.
 */
#include "oq_mhd.h"

#include <microhttpd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "oq_json.h"
#include "oq_util.h"

void oq_mhd_log(void *cls, const char *fmt, va_list ap)
{
    const oq_mhd_log_ctx_t *c = cls;
    if (!c || c->level < oq_log_threshold) return;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    oq_log_write(c->level, c->component, NULL, "libmicrohttpd: %s", buf);
}

enum MHD_Result oq_mhd_reply(struct MHD_Connection *c, unsigned status, const char *ctype,
                             void *body, size_t len, enum MHD_ResponseMemoryMode mode,
                             unsigned flags, const oq_mhd_header_t *hdrs)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    for (const oq_mhd_header_t *h = hdrs; h && h->name; h++)
        if (h->value) MHD_add_response_header(r, h->name, h->value);
    if ((flags & OQ_MHD_RETRY_503) && status == MHD_HTTP_SERVICE_UNAVAILABLE)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (flags & OQ_MHD_CLOSE) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result oq_mhd_reply_json(struct MHD_Connection *c, unsigned status, json_t *v,
                                  unsigned flags, const oq_mhd_header_t *hdrs)
{
    size_t jf = JSON_COMPACT | ((flags & OQ_MHD_JSON_SORTED) ? JSON_SORT_KEYS : 0);
    char *t = v ? oq_json_dumps(v, jf) : NULL;
    json_decref(v);
    if (!t) return MHD_NO;
    size_t n = strlen(t);
    if (flags & OQ_MHD_JSON_NEWLINE) {
        char *nl = realloc(t, n + 2);
        if (!nl) {
            free(t);
            return MHD_NO;
        }
        t = nl;
        t[n++] = '\n';
        t[n] = '\0';
    }
    return oq_mhd_reply(c, status, "application/json", t, n, MHD_RESPMEM_MUST_FREE, flags, hdrs);
}

enum MHD_Result oq_mhd_error(struct MHD_Connection *c, unsigned status, const char *code,
                             const char *msg, unsigned flags, const oq_mhd_header_t *hdrs)
{
    return oq_mhd_reply_json(
        c, status, json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", msg ? msg : code),
        flags, hdrs);
}

size_t oq_mhd_unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls, (void)c;
    size_t n = MHD_http_unescape(s);
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\0') s[i] = 0x7f;
    return n;
}

/* --- header values cut at a NUL ----------------------------------------------------------------*/

typedef struct hv {
    const char *k, *v;
    size_t vlen;
} hv_t;

typedef struct hv_list {
    hv_t *a; /* first `local`, on the heap past 32 headers */
    size_t n, cap;
    int cut; /* a value whose reported length passes a NUL */
    hv_t local[32];
} hv_list_t;

static enum MHD_Result hv_collect(void *cls, enum MHD_ValueKind kind, const char *key,
                                  size_t key_size, const char *value, size_t value_size)
{
    hv_list_t *l = cls;
    (void)kind, (void)key_size;
    if (!key || !value) return MHD_YES;
    if (strlen(value) != value_size) l->cut = 1;
    if (l->n == l->cap) {
        size_t ncap = 2 * l->cap;
        hv_t *na = malloc(ncap * sizeof *na);
        if (!na) return MHD_NO;
        memcpy(na, l->a, l->n * sizeof *na);
        if (l->a != l->local) free(l->a);
        l->a = na;
        l->cap = ncap;
    }
    l->a[l->n++] = (hv_t){key, value, value_size};
    return MHD_YES;
}

static int hv_cmp(const void *x, const void *y)
{
    const hv_t *a = x, *b = y;
    return a->k < b->k ? -1 : a->k > b->k;
}

int oq_mhd_headers_intact(struct MHD_Connection *c, const char *method)
{
    hv_list_t l;
    l.a = l.local;
    l.n = 0;
    l.cap = sizeof l.local / sizeof l.local[0];
    l.cut = 0;
    int ok = 1;
    if (MHD_get_connection_values_n(c, MHD_HEADER_KIND, hv_collect, &l) < 0) ok = 0;
    if (l.cut) ok = 0;
    const union MHD_ConnectionInfo *hi =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    size_t hsize = hi ? hi->header_size : 0;
    /* The in-place scan below relies on how libmicrohttpd 0.9.x keeps the header block (parsed
     * in place in one read buffer, as checked on Debian's 0.9.75); another series keeps only the
     * reported lengths above, so a future layout can never make this read outside its buffer. */
#if MHD_VERSION >= 0x00097000 && MHD_VERSION < 0x00098000
    const int in_place = 1;
#else
    const int in_place = 0;
#endif
    if (ok && in_place && hsize && method && l.n) {
        /* The header block as libmicrohttpd parsed it in place: from the method to the blank
         * line, each ':' and line end overwritten with NULs. Between the end of a value and the
         * next name (or the block's end) only NULs remain, unless the value held a NUL that cut
         * it, or a folded line was moved out of the block: either way, refused. */
        const char *lo = method, *hi_end = method + hsize;
        size_t m = 0;
        for (size_t i = 0; i < l.n; i++)
            if (l.a[i].k > lo && l.a[i].k < hi_end && l.a[i].v > l.a[i].k &&
                l.a[i].v + l.a[i].vlen <= hi_end)
                l.a[m++] = l.a[i];
        qsort(l.a, m, sizeof *l.a, hv_cmp);
        for (size_t i = 0; ok && i < m; i++) {
            const char *from = l.a[i].v + l.a[i].vlen;
            const char *to = i + 1 < m ? l.a[i + 1].k : hi_end;
            for (const char *p = from; p < to; p++)
                if (*p != '\0') {
                    ok = 0;
                    break;
                }
        }
    }
    if (l.a != l.local) free(l.a);
    return ok;
}

/* --- loopback --------------------------------------------------------------------------------*/

int oq_mhd_host_is_loopback(const char *h)
{
    if (!h) return 0;
    size_t n = strlen(h);
    const char *colon = h[0] == '[' ? strchr(h, ']') : strrchr(h, ':');
    if (h[0] == '[') {
        if (!colon) return 0;
        if (colon[1] != '\0' && colon[1] != ':') return 0;
        return colon - h == 4 && strncmp(h, "[::1", 4) == 0;
    }
    if (colon) n = (size_t)(colon - h);
    if (n == 9 && strncasecmp(h, "localhost", 9) == 0) return 1;
    if (n < 9 || n > 15 || strncmp(h, "127.", 4) != 0) return 0;
    for (size_t i = 4; i < n; i++)
        if (!((h[i] >= '0' && h[i] <= '9') || h[i] == '.')) return 0;
    return 1;
}

/* --- the connection guard ---------------------------------------------------------------------*/

#define GUARD_SCAN_MS 250

typedef struct guard_ip {
    unsigned char addr[16];
    size_t len; /* 4 (IPv4, also v4-mapped IPv6), 16 (IPv6) or 0 (other families) */
    unsigned n;
} guard_ip_t;

typedef struct guard_conn {
    struct guard_conn *prev, *next;
    int fd;
    guard_ip_t *ip;   /* NULL when addresses are not counted */
    int64_t since_us; /* accept, or the end of the previous request */
    int incomplete;   /* a request is being received (line, headers or body) */
    int probe;        /* holds a probe slot */
    int closing;      /* shut down by the guard; libmicrohttpd has not closed it yet */
} guard_conn_t;

struct oq_mhd_guard {
    oq_mhd_guard_opts_t o;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    int th_started, stop;
    guard_conn_t *head, *tail;
    unsigned conns;          /* every entry */
    unsigned normal, probes; /* entries not closing, by kind */
    void *ip_tree;
    int64_t refuse_logged_us, closed_logged_us;
    uint64_t refused_unlogged, closed_unlogged[3];
    oq_metric_t *m_closed[3]; /* request_timeout, evicted, probe_only */
};

enum { CLOSED_TIMEOUT = 0, CLOSED_EVICTED, CLOSED_PROBE_ONLY };
static const char *const closed_reasons[3] = {"request_timeout", "evicted", "probe_only"};

static void ip_key(const struct sockaddr *sa, guard_ip_t *k)
{
    memset(k, 0, sizeof *k);
    if (!sa) return;
    if (sa->sa_family == AF_INET) {
        memcpy(k->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        k->len = 4;
    } else if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            memcpy(k->addr, a6->s6_addr + 12, 4);
            k->len = 4;
        } else {
            memcpy(k->addr, a6->s6_addr, 16);
            k->len = 16;
        }
    }
}

int oq_mhd_client_is_loopback(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    guard_ip_t k;
    ip_key(ci ? ci->client_addr : NULL, &k);
    static const unsigned char v6_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    if (k.len == 4) return k.addr[0] == 127;
    if (k.len == 16) return memcmp(k.addr, v6_loopback, 16) == 0;
    return 0;
}

static int ip_cmp(const void *a, const void *b)
{
    const guard_ip_t *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return memcmp(x->addr, y->addr, x->len);
}

static void unlink_conn(oq_mhd_guard_t *g, guard_conn_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        g->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        g->tail = e->prev;
    e->prev = e->next = NULL;
}

static void append_conn(oq_mhd_guard_t *g, guard_conn_t *e)
{
    e->prev = g->tail;
    e->next = NULL;
    if (g->tail)
        g->tail->next = e;
    else
        g->head = e;
    g->tail = e;
}

/* Shut the connection down (libmicrohttpd then closes it as a client gone). Lock held. */
static void close_conn(oq_mhd_guard_t *g, guard_conn_t *e, int why)
{
    shutdown(e->fd, SHUT_RDWR);
    e->closing = 1;
    if (e->probe)
        g->probes--;
    else
        g->normal--;
    oq_counter_add(g->m_closed[why], 1);
    g->closed_unlogged[why]++;
}

/* The oldest request still incomplete after OQ_MHD_EVICT_AGE_MS in a normal slot. Lock held. */
static guard_conn_t *evictable(oq_mhd_guard_t *g, int64_t now)
{
    for (guard_conn_t *e = g->head; e; e = e->next) {
        if (now - e->since_us < (int64_t)OQ_MHD_EVICT_AGE_MS * 1000) return NULL; /* in order */
        if (e->incomplete && !e->closing && !e->probe) return e;
    }
    return NULL;
}

/* One line a second at most about what the guard closed. Lock held. */
static void log_closed(oq_mhd_guard_t *g, int64_t now)
{
    uint64_t *n = g->closed_unlogged;
    if (!(n[0] | n[1] | n[2]) || now - g->closed_logged_us < 1000000) return;
    OQ_LOG_WARN(g->o.component,
                "slow requests closed: request_timeout=%llu evicted=%llu probe_only=%llu open=%u "
                "request_timeout_ms=%lld max_connections=%u probe_slots=%u",
                (unsigned long long)n[0], (unsigned long long)n[1], (unsigned long long)n[2],
                g->conns, (long long)g->o.request_timeout_ms, g->o.max_conns, g->o.probe_slots);
    n[0] = n[1] = n[2] = 0;
    g->closed_logged_us = now;
}

static void log_refusal(oq_mhd_guard_t *g, const char *why, const guard_ip_t *k, int64_t now)
{
    g->refused_unlogged++;
    if (now - g->refuse_logged_us < 1000000) return;
    char a[INET6_ADDRSTRLEN] = "?";
    if (k->len == 4) inet_ntop(AF_INET, k->addr, a, sizeof a);
    if (k->len == 16) inet_ntop(AF_INET6, k->addr, a, sizeof a);
    OQ_LOG_WARN(g->o.component,
                "connection refused: %s (client %s); %llu refused since the last line; open=%u "
                "max_connections=%u max_connections_per_ip=%u",
                why, a, (unsigned long long)g->refused_unlogged, g->conns, g->o.max_conns,
                g->o.max_conns_per_ip);
    g->refused_unlogged = 0;
    g->refuse_logged_us = now;
}

enum MHD_Result oq_mhd_guard_accept(void *cls, const struct sockaddr *addr, socklen_t len)
{
    oq_mhd_guard_t *g = cls;
    (void)len;
    guard_ip_t k;
    ip_key(addr, &k);
    enum MHD_Result ok = MHD_YES;
    int64_t now = oq_mono_us();
    pthread_mutex_lock(&g->mu);
    if (g->o.max_conns_per_ip > 0) {
        guard_ip_t **found = tfind(&k, &g->ip_tree, ip_cmp);
        if (found && (*found)->n >= g->o.max_conns_per_ip) {
            oq_counter_add(g->o.m_refused_ip, 1);
            log_refusal(g, "max_connections_per_ip reached", &k, now);
            ok = MHD_NO;
        }
    }
    if (ok == MHD_YES && g->normal >= g->o.max_conns && !evictable(g, now) &&
        g->probes >= g->o.probe_slots) {
        oq_counter_add(g->o.m_refused_global, 1);
        log_refusal(g, "max_connections reached", &k, now);
        ok = MHD_NO;
    }
    pthread_mutex_unlock(&g->mu);
    return ok;
}

void oq_mhd_guard_notify(void *cls, struct MHD_Connection *c, void **socket_ctx,
                         enum MHD_ConnectionNotificationCode code)
{
    oq_mhd_guard_t *g = cls;
    pthread_mutex_lock(&g->mu);
    int64_t now = oq_mono_us();
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        guard_conn_t *e = calloc(1, sizeof *e);
        const union MHD_ConnectionInfo *fi =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_ctx = e;
        g->conns++;
        if (e && fi) {
            e->fd = fi->connect_fd;
            e->since_us = now;
            e->incomplete = 1;
            if (g->o.max_conns_per_ip > 0) {
                const union MHD_ConnectionInfo *ci =
                    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
                guard_ip_t k;
                ip_key(ci ? ci->client_addr : NULL, &k);
                guard_ip_t **found = tfind(&k, &g->ip_tree, ip_cmp);
                guard_ip_t *node = found ? *found : NULL;
                if (!node && (node = malloc(sizeof *node)) != NULL) {
                    *node = k;
                    if (!tsearch(node, &g->ip_tree, ip_cmp)) {
                        free(node);
                        node = NULL;
                    }
                }
                if (node) node->n++;
                e->ip = node; /* NULL when out of memory: the address is not counted */
            }
            guard_conn_t *v;
            if (g->normal < g->o.max_conns) {
                g->normal++;
            } else if ((v = evictable(g, now)) != NULL) {
                close_conn(g, v, CLOSED_EVICTED);
                g->normal++;
            } else {
                e->probe = 1;
                g->probes++;
            }
            append_conn(g, e);
        } else if (e) { /* no descriptor to shut down: counted, never closed by the guard */
            free(e);
            *socket_ctx = NULL;
        }
        log_closed(g, now);
    } else {
        guard_conn_t *e = *socket_ctx;
        g->conns--;
        if (e) {
            unlink_conn(g, e);
            if (!e->closing) {
                if (e->probe)
                    g->probes--;
                else
                    g->normal--;
            }
            if (e->ip && --e->ip->n == 0) {
                tdelete(e->ip, &g->ip_tree, ip_cmp);
                free(e->ip);
            }
            free(e);
        }
        *socket_ctx = NULL;
    }
    oq_gauge_set(g->o.m_conns, (double)g->conns);
    pthread_mutex_unlock(&g->mu);
}

static guard_conn_t *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? (guard_conn_t *)i->socket_context : NULL;
}

enum MHD_Result oq_mhd_guard_handler(void *cls, struct MHD_Connection *c, const char *url,
                                     const char *method, const char *version, const char *upload,
                                     size_t *upload_size, void **con_cls)
{
    oq_mhd_guard_t *g = cls;
    guard_conn_t *e = conn_of(c);
    if (*con_cls == NULL && !oq_mhd_headers_intact(c, method)) {
        static char cut[] = "{\"error\":{\"code\":\"bad_request\",\"message\":\"a header value "
                            "contains a NUL byte, or a header line is folded\"}}";
        if (e) {
            pthread_mutex_lock(&g->mu);
            e->incomplete = 0;
            pthread_mutex_unlock(&g->mu);
        }
        return oq_mhd_reply(c, MHD_HTTP_BAD_REQUEST, "application/json", cut, sizeof cut - 1,
                            MHD_RESPMEM_PERSISTENT, OQ_MHD_CLOSE, NULL);
    }
    if (e && e->probe && *con_cls == NULL &&
        !((strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0) &&
          (strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0))) {
        static char busy[] = "{\"error\":{\"code\":\"unavailable\",\"message\":\"all connection "
                             "slots are taken; this one serves /healthz and /readyz only\"}}";
        pthread_mutex_lock(&g->mu);
        e->incomplete = 0;
        oq_counter_add(g->m_closed[CLOSED_PROBE_ONLY], 1);
        g->closed_unlogged[CLOSED_PROBE_ONLY]++;
        pthread_mutex_unlock(&g->mu);
        return oq_mhd_reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, "application/json", busy,
                            sizeof busy - 1, MHD_RESPMEM_PERSISTENT,
                            OQ_MHD_RETRY_503 | OQ_MHD_CLOSE, NULL);
    }
    int last = *con_cls != NULL && *upload_size == 0; /* the request is all in */
    enum MHD_Result ret =
        g->o.handler(g->o.handler_cls, c, url, method, version, upload, upload_size, con_cls);
    if (e && e->incomplete &&
        (last || MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS) != NULL)) {
        pthread_mutex_lock(&g->mu);
        e->incomplete = 0; /* being answered: no deadline */
        pthread_mutex_unlock(&g->mu);
    }
    return ret;
}

void oq_mhd_guard_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                            enum MHD_RequestTerminationCode toe)
{
    oq_mhd_guard_t *g = cls;
    guard_conn_t *e = conn_of(c);
    if (e) { /* the next request on this connection starts its deadline now */
        pthread_mutex_lock(&g->mu);
        e->incomplete = 1;
        e->since_us = oq_mono_us();
        unlink_conn(g, e);
        append_conn(g, e);
        pthread_mutex_unlock(&g->mu);
    }
    if (g->o.completed) g->o.completed(g->o.completed_cls, c, con_cls, toe);
}

static void *guard_main(void *arg)
{
    oq_mhd_guard_t *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        int64_t now = oq_mono_us();
        int64_t rt = g->o.request_timeout_ms * 1000;
        int64_t pt = (int64_t)OQ_MHD_PROBE_DEADLINE_MS * 1000;
        if (rt > 0 && rt < pt) pt = rt;
        for (guard_conn_t *e = g->head; e; e = e->next) {
            if (!e->incomplete || e->closing) continue;
            int64_t limit = e->probe ? pt : rt;
            if (limit > 0 && now - e->since_us > limit) close_conn(g, e, CLOSED_TIMEOUT);
        }
        log_closed(g, now);
        struct timespec ts;
        oq_mono_deadline(&ts, GUARD_SCAN_MS * 1000LL);
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

oq_mhd_guard_t *oq_mhd_guard_new(const oq_mhd_guard_opts_t *o, oq_metrics_t *metrics,
                                 oq_error_t *err)
{
    oq_mhd_guard_t *g = calloc(1, sizeof *g);
    if (!g) {
        oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        return NULL;
    }
    g->o = *o;
    if (!g->o.max_conns) g->o.max_conns = 64;
    if (!g->o.component) g->o.component = "http";
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (int i = 0; i < 3 && metrics; i++) {
        char labels[64];
        snprintf(labels, sizeof labels, "reason=\"%s\"", closed_reasons[i]);
        g->m_closed[i] = oq_metrics_counter(
            metrics, "onceq_http_requests_closed_total",
            "incomplete requests closed: past the request deadline, evicted for a new "
            "connection when every slot was taken, or not a probe in a probe slot",
            labels);
    }
    if (pthread_create(&g->th, NULL, guard_main, g) != 0) {
        oq_error_set(err, OQ_EIO, 0, "cannot start the connection guard's thread");
        oq_mhd_guard_destroy(g);
        return NULL;
    }
    g->th_started = 1;
    return g;
}

unsigned oq_mhd_guard_mhd_limit(const oq_mhd_guard_t *g, unsigned threads)
{
    /* libmicrohttpd splits its cap between the pool threads, and counts connections the guard
     * shut down until it closes them: past ours, as a backstop; but a thread must never hold
     * 128 (oq_mhd.h, OQ_MHD_CONNS_PER_THREAD) */
    unsigned t = threads ? threads : 1;
    unsigned backstop = (2 * g->o.max_conns + g->o.probe_slots) * t + t + 16;
    return backstop < t * OQ_MHD_CONNS_PER_THREAD ? backstop : t * OQ_MHD_CONNS_PER_THREAD;
}

unsigned oq_mhd_pool_room(unsigned threads)
{
    unsigned t = threads ? threads : 1;
    return t * OQ_MHD_CONNS_PER_THREAD - t - 16;
}

unsigned oq_mhd_pool_threads(unsigned conns, unsigned min_threads)
{
    unsigned t = min_threads ? min_threads : 1;
    while (t < OQ_MHD_MAX_THREADS && oq_mhd_pool_room(t) < conns)
        t++;
    return t;
}

void oq_mhd_guard_destroy(oq_mhd_guard_t *g)
{
    if (!g) return;
    if (g->th_started) {
        pthread_mutex_lock(&g->mu);
        g->stop = 1;
        pthread_cond_signal(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->th, NULL);
    }
    while (g->head) {
        guard_conn_t *e = g->head;
        unlink_conn(g, e);
        free(e);
    }
    if (g->ip_tree) tdestroy(g->ip_tree, free);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}
