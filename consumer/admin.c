/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admin.c: the consumer's admin listener (routes in admin.h).
 *
 * One libmicrohttpd daemon with its own polling thread, so requests are handled one at a time
 * and never on the worker's threads. Reads go through the review API (consumer/review.c),
 * which opens its own short-lived connection per request; the stats come from a callback into
 * the worker (its counters, and its own stats connection under a lock). A POST body is read
 * into a per-connection buffer up to 64 KiB (more: 413) and parsed strictly (oq_json_parse:
 * duplicate members, bad UTF-8 and unknown members are refused with 400).
 *
 * Who may read and resolve reviews (and read /stats). With a token file (the producer's
 * format, read by common/tokens.c) a request needs a bearer token whose line carries the
 * `operator` role: none or an unknown one is 401, a tenant's token without the role 403.
 * Without one the listener must be on loopback (oq__admin_check_listen refuses anything else
 * before the consumer starts), and a browser on that host is the remaining way in: a loopback
 * listener answers only requests whose Host names a loopback address (a DNS-rebinding page
 * names its own host), any request with an Origin that is not http:// + its Host is 403, and
 * the resolve POST needs Content-Type: application/json (415 otherwise), which a page cannot
 * send cross-origin without a preflight that this listener never grants. /metrics, /healthz
 * and /readyz stay open.
 */
#include "admin.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "oq_consumer.h"
#include "oq_buf.h"
#include "oq_json.h"
#include "oq_log.h"
#include "oq_mhd.h"
#include "oq_ready.h"
#include "oq_tokens.h"

#define MAX_BODY (64 * 1024)
#define COMP "admin"

/* libmicrohttpd's own messages. */
static const oq_mhd_log_ctx_t mhd_log_ctx = {COMP, OQ_LOG_WARN};

struct oq__admin {
    struct MHD_Daemon *d;
    oq_metrics_t *m;
    char *db;
    oq__admin_stats_fn stats;
    void *ctx;
    int port;
    int loopback;             /**< bound to a loopback address: Host must name one */
    oq_token_table_t *tokens; /**< NULL: no token file (then loopback only) */
    oq_mhd_guard_t *guard;    /**< slots, request deadline, probe slots (common/mhd.c) */
    struct oq_ready *_Atomic ready;
};

void oq__admin_set_ready(oq__admin_t *a, struct oq_ready *r)
{
    if (a) atomic_store(&a->ready, r);
}

/* Per connection: the request body read so far. */
typedef struct {
    oq_buf_t b;
    int too_big;
} body_t;

/* The admin API's JSON: keys sorted, a newline at the end (oq_mhd_reply_json). */
#define ADMIN_JSON (OQ_MHD_JSON_SORTED | OQ_MHD_JSON_NEWLINE)

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, char *text, size_t len,
                                 enum MHD_ResponseMemoryMode mode, const char *ctype)
{
    return oq_mhd_reply(c, status, ctype, text, len, mode, 0, NULL);
}

/* Sends \p v (a new reference, consumed). */
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *v)
{
    return oq_mhd_reply_json(c, status, v, ADMIN_JSON, NULL);
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *code,
                                  const char *msg)
{
    return oq_mhd_error(c, status, code, msg ? msg : "", ADMIN_JSON, NULL);
}

/* --- who may use the review API (see the top of the file) ------------------------------------*/

typedef struct {
    int auth, host;
} hdr_count_t;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    hdr_count_t *n = cls;
    (void)kind, (void)value;
    if (strcasecmp(key, MHD_HTTP_HEADER_AUTHORIZATION) == 0) n->auth++;
    if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) n->host++;
    return MHD_YES;
}

/* The Host, Origin and token checks of the review API and /stats; MHD_YES with \p *sent
 * set when a refusal was queued. */
static enum MHD_Result guard(oq__admin_t *a, struct MHD_Connection *c, int *sent)
{
    hdr_count_t n = {0, 0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &n);
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ORIGIN);
    *sent = 1;
    if (n.host > 1) return send_error(c, MHD_HTTP_BAD_REQUEST, "bad_request", "two Host headers");
    if (a->loopback && host && !oq_mhd_host_is_loopback(host))
        return send_error(c, MHD_HTTP_FORBIDDEN, "forbidden",
                          "this listener is on loopback: the Host header must name a loopback "
                          "address");
    if (origin) {
        /* a browser's Origin is scheme://host[:port]: it must be this very listener */
        if (!host || strncasecmp(origin, "http://", 7) != 0 || strcasecmp(origin + 7, host) != 0)
            return send_error(c, MHD_HTTP_FORBIDDEN, "forbidden",
                              "cross-origin requests are refused (the Origin is not this "
                              "listener)");
    }
    if (a->tokens) {
        const char *v = NULL, *tok = NULL;
        size_t vlen = 0, tlen = 0;
        const char *why = NULL;
        long i = -1;
        if (n.auth == 0)
            why = "the review API needs an Authorization: Bearer token with the operator role";
        else if (n.auth > 1 ||
                 MHD_lookup_connection_value_n(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION,
                                               strlen(MHD_HTTP_HEADER_AUTHORIZATION), &v,
                                               &vlen) != MHD_YES ||
                 oq_tokens_bearer(v, vlen, &tok, &tlen) != 0 ||
                 (i = oq_tokens_find(a->tokens, tok, tlen)) < 0)
            why = "the bearer token is not valid";
        if (why) {
            const oq_mhd_header_t www[] = {{MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                            n.auth
                                                ? "Bearer realm=\"onceq\", error=\"invalid_token\""
                                                : "Bearer realm=\"onceq\""},
                                           {NULL, NULL}};
            return oq_mhd_error(c, MHD_HTTP_UNAUTHORIZED, "unauthorized", why, 0, www);
        }
        if (!(a->tokens->v[i].roles & OQ_TOKEN_ROLE_OPERATOR))
            return send_error(c, MHD_HTTP_FORBIDDEN, "forbidden",
                              "this token has no operator role (TOKEN TENANT operator in the "
                              "token file)");
    }
    *sent = 0;
    return MHD_YES;
}

/* The resolve POST carries JSON, said so: a form or text/plain POST (what a page can send
 * without a preflight) is refused. */
static int content_type_json(struct MHD_Connection *c)
{
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!ct) return 0;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    size_t n = strcspn(ct, ";");
    while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
        n--;
    return n == 16 && strncasecmp(ct, "application/json", 16) == 0;
}

int oq__admin_check_listen(const char *listen, const char *token_file, oq_error_t *err)
{
    char host[64];
    int port;
    if (!listen) return 0;
    int rc = oq_parse_listen(listen, host, &port, err);
    if (rc) return rc;
    if (token_file || strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0) return 0;
    return oq_error_set(err, OQ_EINVAL, 0,
                        "--metrics-listen %s is not a loopback address: the review API on it "
                        "needs --token-file (an operator token); for /metrics alone use "
                        "--metrics-only-listen",
                        listen);
}

/* The error of a review call as HTTP. */
static enum MHD_Result send_rc(struct MHD_Connection *c, int rc, const oq_error_t *err)
{
    switch (rc) {
    case OQ_EINVAL:
        return send_error(c, MHD_HTTP_BAD_REQUEST, "bad_request", err->msg);
    case OQ_ENOTFOUND:
        return send_error(c, MHD_HTTP_NOT_FOUND, "not_found", err->msg);
    case OQ_ESTATE:
        return send_error(c, MHD_HTTP_CONFLICT, "not_in_review", err->msg);
    case OQ_EFENCED:
        return send_error(c, MHD_HTTP_CONFLICT, "review_moved", err->msg);
    default:
        return send_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal", err->msg);
    }
}

static enum MHD_Result resolve(oq__admin_t *a, struct MHD_Connection *c, const char *call_id,
                               const body_t *b)
{
    oq_error_t err = {0};
    json_t *req = NULL, *out = NULL;
    if (b->too_big)
        return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "payload_too_large", "body over 64 KiB");
    if (oq_json_parse(b->b.p ? b->b.p : "", b->b.len, 8, &req, &err) != 0 || !json_is_object(req)) {
        json_decref(req);
        return send_error(c, MHD_HTTP_BAD_REQUEST, "bad_request",
                          err.msg[0] ? err.msg : "expected a JSON object");
    }
    const char *k;
    json_t *v;
    json_object_foreach(req, k, v)
    {
        int fence = strcmp(k, "fence") == 0;
        if (fence ? !json_is_integer(v) || json_integer_value(v) < 0
                  : (strcmp(k, "as") && strcmp(k, "ref") && strcmp(k, "note") && strcmp(k, "by")) ||
                        !json_is_string(v)) {
            char msg[160];
            snprintf(msg, sizeof(msg),
                     "member %.60s: expected as, ref, note, by (strings), fence (an integer >= 0)",
                     k);
            json_decref(req);
            return send_error(c, MHD_HTTP_BAD_REQUEST, "bad_request", msg);
        }
    }
    const char *by = json_string_value(json_object_get(req, "by"));
    char who[128];
    snprintf(who, sizeof(who), "%s (http)", by ? by : "operator");
    json_t *fence = json_object_get(req, "fence");
    int rc = oq_review_resolve(a->db, call_id, json_string_value(json_object_get(req, "as")),
                               json_string_value(json_object_get(req, "ref")),
                               json_string_value(json_object_get(req, "note")), who,
                               fence ? (int64_t)json_integer_value(fence) : -1, &out, &err);
    json_decref(req);
    if (rc) return send_rc(c, rc, &err);
    OQ_LOGC_INFO(COMP, call_id, "review resolved over http by %s", who);
    return send_json(c, MHD_HTTP_OK, out);
}

static enum MHD_Result route(oq__admin_t *a, struct MHD_Connection *c, const char *url,
                             const char *method, const body_t *b)
{
    static char ok[] = "ok\n";
    oq_error_t err = {0};
    if (strcmp(url, "/stats") == 0 || strncmp(url, "/v1/", 4) == 0) {
        int sent = 0;
        enum MHD_Result g = guard(a, c, &sent);
        if (sent) return g;
    }
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int post = strcmp(method, "POST") == 0;
    const char *rv = "/v1/review";
    if (strcmp(url, "/healthz") == 0 || strcmp(url, "/metrics") == 0 ||
        strcmp(url, "/stats") == 0 || strcmp(url, "/readyz") == 0 || strcmp(url, rv) == 0) {
        if (!get) return send_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", "GET");
        if (url[1] == 'h')
            return send_text(c, MHD_HTTP_OK, ok, sizeof(ok) - 1, MHD_RESPMEM_PERSISTENT,
                             "text/plain");
        if (url[1] == 'r') {
            static char starting[] = "{\"status\":\"unready\",\"worker\":\"starting\"}\n";
            struct oq_ready *r = atomic_load(&a->ready);
            if (!r) /* set once the worker is built */
                return send_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, starting, sizeof(starting) - 1,
                                 MHD_RESPMEM_PERSISTENT, "application/json");
            char *body = NULL;
            size_t blen = 0;
            int rdy = oq_ready_render(r, &body, &blen);
            if (rdy < 0) return MHD_NO;
            return send_text(c, rdy ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, body, blen,
                             MHD_RESPMEM_MUST_FREE, "application/json");
        }
        if (url[1] == 'm') {
            char *text = NULL;
            size_t len = 0;
            if (oq_metrics_render(a->m, &text, &len) != 0) return MHD_NO;
            return send_text(c, MHD_HTTP_OK, text, len, MHD_RESPMEM_MUST_FREE,
                             "text/plain; version=0.0.4; charset=utf-8");
        }
        if (url[1] == 's') {
            json_t *s = a->stats ? a->stats(a->ctx) : NULL;
            if (!s) return send_error(c, 500, "internal", "no stats");
            return send_json(c, MHD_HTTP_OK, s);
        }
        const char *l = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
        json_t *list = NULL;
        int rc = oq_review_list(a->db, l ? atoi(l) : 0, &list, &err);
        if (rc) return send_rc(c, rc, &err);
        return send_json(
            c, MHD_HTTP_OK,
            json_pack("{s:o, s:I}", "review", list, "count", (json_int_t)json_array_size(list)));
    }
    if (strncmp(url, "/v1/review/", 11) == 0) {
        char id[64];
        const char *p = url + 11, *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 0 || n >= sizeof(id)) return send_error(c, 404, "not_found", "no such path");
        memcpy(id, p, n);
        id[n] = '\0';
        if (!slash) {
            if (!get)
                return send_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", "GET");
            json_t *o = NULL;
            int rc = oq_review_show(a->db, id, &o, &err);
            if (rc) return send_rc(c, rc, &err);
            return send_json(c, MHD_HTTP_OK, o);
        }
        if (strcmp(slash, "/resolve") == 0) {
            if (!post)
                return send_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", "POST");
            if (!content_type_json(c))
                return send_error(c, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type",
                                  "send the decision as Content-Type: application/json");
            return resolve(a, c, id, b);
        }
    }
    return send_error(c, MHD_HTTP_NOT_FOUND, "not_found", "no such path");
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload_data,
                              size_t *upload_data_size, void **con_cls)
{
    oq__admin_t *a = cls;
    body_t *b = *con_cls;
    (void)version;
    if (!b) {
        if (!(b = calloc(1, sizeof(*b)))) return MHD_NO;
        *con_cls = b;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (b->too_big || b->b.len + n > MAX_BODY) {
            b->too_big = 1;
            return MHD_YES;
        }
        return oq_buf_put(&b->b, upload_data, n) ? MHD_NO : MHD_YES;
    }
    return route(a, c, url, method, b);
}

static void done(void *cls, struct MHD_Connection *c, void **con_cls,
                 enum MHD_RequestTerminationCode toe)
{
    body_t *b = *con_cls;
    (void)cls, (void)c, (void)toe;
    if (b) {
        oq_buf_free(&b->b);
        free(b);
        *con_cls = NULL;
    }
}

oq__admin_t *oq__admin_start(const char *listen, const char *token_file, oq_metrics_t *m,
                             const char *db_path, oq__admin_stats_fn stats, void *ctx,
                             oq_error_t *err)
{
    char host[64];
    int port;
    if (oq__admin_check_listen(listen, token_file, err) != 0) return NULL;
    if (oq_parse_listen(listen, host, &port, err) != 0) return NULL;
    if (strcmp(host, "localhost") == 0) snprintf(host, sizeof(host), "127.0.0.1");
    oq__admin_t *a = calloc(1, sizeof(*a));
    if (!a || !(a->db = strdup(db_path))) {
        free(a);
        oq_error_set(err, OQ_ENOMEM, 0, "admin listener: out of memory");
        return NULL;
    }
    a->loopback = strncmp(host, "127.", 4) == 0;
    if (token_file && oq_tokens_load(token_file, 1, &a->tokens, err) != 0) {
        if (err && err->code == OQ_EIO) err->code = OQ_EINVAL; /* a usage error: exit 2 */
        free(a->db);
        free(a);
        return NULL;
    }
    a->m = m;
    a->stats = stats;
    a->ctx = ctx;
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, host, &sin.sin_addr);
    oq_mhd_guard_opts_t go = {.component = COMP,
                              .max_conns = OQ_MHD_ADMIN_CONNS,
                              .probe_slots = OQ_MHD_ADMIN_PROBE_SLOTS,
                              .request_timeout_ms = OQ_MHD_ADMIN_REQUEST_TIMEOUT_MS,
                              .handler = handle,
                              .handler_cls = a,
                              .completed = done,
                              .completed_cls = a};
    if (!(a->guard = oq_mhd_guard_new(&go, m, err))) {
        oq_tokens_free(a->tokens);
        free(a->db);
        free(a);
        return NULL;
    }
    a->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG, (uint16_t)port,
        OQ_MHD_GUARD_DAEMON_ARGS(a->guard), MHD_OPTION_EXTERNAL_LOGGER, oq_mhd_log,
        (void *)&mhd_log_ctx, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin,
        MHD_OPTION_UNESCAPE_CALLBACK, oq_mhd_unescape, NULL, OQ_MHD_GUARD_OPTIONS(a->guard),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_CONNECTION_LIMIT,
        oq_mhd_guard_mhd_limit(a->guard, 1), MHD_OPTION_END);
    if (!a->d) {
        oq_error_set(err, OQ_EIO, 0, "admin listener: cannot listen on %s:%d", host, port);
        oq_mhd_guard_destroy(a->guard);
        oq_tokens_free(a->tokens);
        free(a->db);
        free(a);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(a->d, MHD_DAEMON_INFO_BIND_PORT);
    a->port = info ? (int)info->port : port;
    OQ_LOG_INFO(COMP, "serving http://%s:%d/metrics, /stats and /v1/review review_auth=%s", host,
                a->port, a->tokens ? "operator-token" : "loopback-only");
    return a;
}

int oq__admin_port(const oq__admin_t *a)
{
    return a ? a->port : -1;
}

void oq__admin_stop(oq__admin_t *a)
{
    if (!a) return;
    MHD_stop_daemon(a->d);
    oq_mhd_guard_destroy(a->guard);
    oq_tokens_free(a->tokens);
    free(a->db);
    free(a);
}
