/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics_http.c: the listener of a metrics registry (oq_metrics.h). oq_metrics_serve() runs
 * libmicrohttpd with its own polling thread bound to one address (127.0.0.1 unless the user
 * asks otherwise), behind a connection guard (common/mhd.c): GET /metrics, GET /healthz and
 * GET /readyz (from the renderer set with oq_metrics_server_set_readyz, an oq_ready_t
 * prober's in practice: this file does not know the prober, which registers its gauge in the
 * registry), 404 for anything else. Replies go through oq_mhd_reply.
 *
 * Apart from the registry (common/metrics.c) so that the registry needs nothing of
 * libmicrohttpd and the guard, which counts in the registry, is not in a circle with it.
 */
#include "oq_log.h"
#include "oq_metrics.h"
#include "oq_mhd.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct oq_metrics_server {
    struct MHD_Daemon *d;
    oq_metrics_t *m;
    int port;
    /* /readyz: set ctx before fn, unset fn before ctx (a reader takes fn, then ctx) */
    oq_readyz_fn *_Atomic readyz;
    void *_Atomic readyz_ctx;
    oq_mhd_guard_t *guard; /* slots, request deadline, probe slots (common/mhd.c) */
};

void oq_metrics_server_set_readyz(oq_metrics_server_t *s, oq_readyz_fn *fn, void *ctx)
{
    if (!s) return;
    if (fn && ctx) {
        atomic_store(&s->readyz_ctx, ctx);
        atomic_store(&s->readyz, fn);
    } else {
        atomic_store(&s->readyz, NULL);
        atomic_store(&s->readyz_ctx, NULL);
    }
}

int oq_parse_listen(const char *listen, char host[64], int *port, oq_error_t *err)
{
    if (!listen)
        return oq_error_set(err, OQ_EINVAL, 0, "listen address: expected host:port, got nothing");
    char bare[16];
    if (*listen && strspn(listen, "0123456789") == strlen(listen) && strlen(listen) <= 5) {
        snprintf(bare, sizeof(bare), ":%s", listen); /* a bare port means 127.0.0.1:PORT */
        listen = bare;
    }
    const char *colon = strrchr(listen, ':');
    if (!colon)
        return oq_error_set(err, OQ_EINVAL, 0, "listen address: expected host:port, got '%s'",
                            listen);
    size_t hl = (size_t)(colon - listen);
    if (hl >= 64)
        return oq_error_set(err, OQ_EINVAL, 0, "listen address: host too long in '%s'", listen);
    char h[64];
    memcpy(h, listen, hl);
    h[hl] = '\0';
    if (hl == 0 || strcmp(h, "localhost") == 0) strcpy(h, "127.0.0.1");
    struct in_addr a;
    if (inet_pton(AF_INET, h, &a) != 1)
        return oq_error_set(err, OQ_EINVAL, 0,
                            "listen address: '%s' is not an IPv4 address or localhost", h);
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || p < 0 || p > 65535)
        return oq_error_set(err, OQ_EINVAL, 0, "listen address: bad port in '%s'", listen);
    snprintf(host, 64, "%s", h);
    *port = (int)p;
    return 0;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, char *body, size_t len,
                             enum MHD_ResponseMemoryMode mode, const char *ctype)
{
    return oq_mhd_reply(conn, status, ctype, body, len, mode, 0, NULL);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **ctx)
{
    oq_metrics_server_t *s = cls;
    static int first_call_marker;
    if (*ctx == NULL) { /* headers only so far; answer on the next call */
        *ctx = &first_call_marker;
        return MHD_YES;
    }
    if (*upload_data_size) { /* ignore request bodies */
        *upload_data_size = 0;
        return MHD_YES;
    }
    static char not_found[] = "not found\n";
    static char not_allowed[] = "method not allowed\n";
    static char ok[] = "ok\n";
    static char ready_ok[] = "{\"status\":\"ready\"}\n";
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (strcmp(url, "/metrics") == 0 || strcmp(url, "/healthz") == 0 ||
        strcmp(url, "/readyz") == 0) {
        if (!get)
            return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, not_allowed, sizeof(not_allowed) - 1,
                         MHD_RESPMEM_PERSISTENT, "text/plain");
        if (url[1] == 'h')
            return reply(conn, MHD_HTTP_OK, ok, sizeof(ok) - 1, MHD_RESPMEM_PERSISTENT,
                         "text/plain");
        if (url[1] == 'r') {
            oq_readyz_fn *fn = atomic_load(&s->readyz);
            void *rctx = fn ? atomic_load(&s->readyz_ctx) : NULL;
            if (!fn || !rctx)
                return reply(conn, MHD_HTTP_OK, ready_ok, sizeof(ready_ok) - 1,
                             MHD_RESPMEM_PERSISTENT, "application/json");
            char *body = NULL;
            size_t blen = 0;
            int rdy = fn(rctx, &body, &blen);
            if (rdy < 0) return MHD_NO;
            return reply(conn, rdy ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, body, blen,
                         MHD_RESPMEM_MUST_FREE, "application/json");
        }
        char *text = NULL;
        size_t len = 0;
        if (oq_metrics_render(s->m, &text, &len) != 0) return MHD_NO;
        return reply(conn, MHD_HTTP_OK, text, len, MHD_RESPMEM_MUST_FREE,
                     "text/plain; version=0.0.4; charset=utf-8");
    }
    return reply(conn, MHD_HTTP_NOT_FOUND, not_found, sizeof(not_found) - 1, MHD_RESPMEM_PERSISTENT,
                 "text/plain");
}

/* libmicrohttpd's own messages. */
static const oq_mhd_log_ctx_t mhd_log_ctx = {"metrics", OQ_LOG_WARN};

oq_metrics_server_t *oq_metrics_serve(oq_metrics_t *m, const char *listen, oq_error_t *err)
{
    return oq_metrics_serve_readyz(m, listen, NULL, NULL, err);
}

oq_metrics_server_t *oq_metrics_serve_readyz(oq_metrics_t *m, const char *listen, oq_readyz_fn *fn,
                                             void *ctx, oq_error_t *err)
{
    char host[64];
    int port;
    if (!m) {
        oq_error_set(err, OQ_EINVAL, 0, "metrics server: no registry");
        return NULL;
    }
    if (oq_parse_listen(listen, host, &port, err) != 0) return NULL;
    oq_metrics_server_t *s = calloc(1, sizeof(*s));
    if (!s) {
        oq_error_set(err, OQ_ENOMEM, 0, "metrics server: out of memory");
        return NULL;
    }
    s->m = m;
    oq_metrics_server_set_readyz(s, fn, ctx);
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &sin.sin_addr);
    oq_mhd_guard_opts_t go = {.component = "metrics",
                              .max_conns = OQ_MHD_ADMIN_CONNS,
                              .probe_slots = OQ_MHD_ADMIN_PROBE_SLOTS,
                              .request_timeout_ms = OQ_MHD_ADMIN_REQUEST_TIMEOUT_MS,
                              .handler = handle,
                              .handler_cls = s};
    if (!(s->guard = oq_mhd_guard_new(&go, m, err))) {
        free(s);
        return NULL;
    }
    s->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG, (uint16_t)port,
        OQ_MHD_GUARD_DAEMON_ARGS(s->guard), MHD_OPTION_EXTERNAL_LOGGER, oq_mhd_log,
        (void *)&mhd_log_ctx, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin,
        OQ_MHD_GUARD_OPTIONS(s->guard), MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
        MHD_OPTION_CONNECTION_LIMIT, oq_mhd_guard_mhd_limit(s->guard, 1), MHD_OPTION_END);
    if (!s->d) {
        oq_error_set(err, OQ_EIO, 0, "metrics server: cannot listen on %s:%d", host, port);
        oq_mhd_guard_destroy(s->guard);
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? (int)info->port : port;
    OQ_LOG_INFO("metrics", "serving http://%s:%d/metrics", host, s->port);
    return s;
}

int oq_metrics_server_port(const oq_metrics_server_t *s)
{
    return s ? s->port : -1;
}

void oq_metrics_serve_stop(oq_metrics_server_t *s)
{
    if (!s) return;
    MHD_stop_daemon(s->d);
    oq_mhd_guard_destroy(s->guard);
    free(s);
}
