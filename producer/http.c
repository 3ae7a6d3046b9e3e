/*
 * http.c: the producer's HTTP API on libmicrohttpd (Debian's libmicrohttpd 0.9.75).
 *
 * Design. libmicrohttpd runs a pool of epoll threads (at least 2: one epoll thread stalls at
 * 128+ connections). Those threads must never block on a commit, so a POST is handled as:
 * accumulate the body (bounded by max_body: 413 as soon as Content-Length or the received
 * bytes exceed it), then on the final call parse it strictly (oq_json_parse: UTF-8, duplicate
 * keys, depth), validate, canonicalise and fingerprint it (oq_submit_job_new) on the epoll
 * thread, suspend the connection (MHD_suspend_connection) and queue the job for the producer's
 * group-commit writer. The writer's completion callback only resumes the connection; the
 * response is built on the epoll thread when libmicrohttpd calls the handler again. A
 * suspended connection is never timed out or freed by libmicrohttpd, so the job outlives no
 * one: the request context is freed in the completion notification after the response.
 *
 * GETs read through the producer's read-connection pool (WAL readers: no waiting on the
 * writer). Error bodies are {"error":{"code":...,"message":...}} with stable codes:
 * missing_idempotency_key, invalid_idempotency_key, bad_request, payload_too_large,
 * idempotency_conflict, not_found, method_not_allowed, unavailable, internal.
 *
 * Shutdown (oq_http_stop): quiesce (stop accepting), wait for requests in progress (bounded),
 * then stop the daemon.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_producer.h"

struct oq_http {
    struct MHD_Daemon *d;
    oq_producer_t *p;
    oq_ingest_t *ingest;
    int64_t max_body;
    size_t max_depth;
    int port;
    atomic_int inflight;
    oq_metrics_t *metrics;
    oq_metric_t *m_2xx, *m_4xx, *m_5xx;
};

enum { RS_NEW = 0, RS_READING, RS_WAITING, RS_DONE };

typedef struct req_ctx {
    oq_http_t *h;
    struct MHD_Connection *conn;
    int state;
    int is_submit;
    int too_big;
    char *body;
    size_t len, cap;
    oq_submit_job_t *job;
    int refused; /**< the producer was shutting down: the job was not queued */
} req_ctx_t;

/* --- responses -------------------------------------------------------------------------------*/

static void count_status(oq_http_t *h, unsigned status)
{
    if (status < 300)
        oq_counter_add(h->m_2xx, 1);
    else if (status < 500)
        oq_counter_add(h->m_4xx, 1);
    else
        oq_counter_add(h->m_5xx, 1);
}

static enum MHD_Result send_text(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                 char *text, size_t len, const char *ctype, const char *location,
                                 int replayed, int close)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (location) MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, location);
    if (replayed) MHD_add_response_header(r, "Idempotent-Replayed", "true");
    if (status == 503) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (close) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    count_status(h, status);
    return ret;
}

static enum MHD_Result send_json(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                 json_t *body, const char *location, int replayed)
{
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) return MHD_NO;
    return send_text(h, c, status, text, strlen(text), "application/json", location, replayed, 0);
}

static enum MHD_Result send_error_ex(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                     const char *code, const char *msg, int close)
{
    json_t *b = json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", msg ? msg : code);
    char *text = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    if (!text) return MHD_NO;
    return send_text(h, c, status, text, strlen(text), "application/json", NULL, 0, close);
}

static enum MHD_Result send_error(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                  const char *code, const char *msg)
{
    return send_error_ex(h, c, status, code, msg, 0);
}

static enum MHD_Result send_call(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                 const oq_call_t *call, int replayed)
{
    char *text = NULL;
    size_t len = 0;
    if (oq_call_render(call, &text, &len) != 0) return MHD_NO;
    char loc[64];
    snprintf(loc, sizeof loc, "/v1/tool-calls/%s", call->call_id);
    return send_text(h, c, status, text, len, "application/json", status == 202 ? loc : NULL,
                     replayed, 0);
}

/* --- POST /v1/tool-calls ---------------------------------------------------------------------*/

static void job_done(oq_submit_job_t *job, void *opaque)
{
    req_ctx_t *ctx = opaque;
    (void)job;
    ctx->state = RS_DONE;
    MHD_resume_connection(ctx->conn);
}

/** Strip one pair of surrounding double quotes (the draft's sf-string form). */
static const char *unquote_key(const char *k, char buf[OQ_MAX_KEY_LEN + 3])
{
    size_t n = strlen(k);
    if (n >= 2 && n <= OQ_MAX_KEY_LEN + 2 && k[0] == '"' && k[n - 1] == '"') {
        memcpy(buf, k + 1, n - 2);
        buf[n - 2] = '\0';
        return buf;
    }
    return k;
}

static enum MHD_Result submit_begin(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c)
{
    const char *raw = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
    if (!raw || !*raw)
        return send_error(h, c, 400, "missing_idempotency_key",
                          "the Idempotency-Key header is required");
    char kbuf[OQ_MAX_KEY_LEN + 3];
    const char *key = unquote_key(raw, kbuf);
    if (!oq_envelope_valid_key(key))
        return send_error(h, c, 400, "invalid_idempotency_key",
                          "Idempotency-Key must be 1-255 printable ASCII bytes");
    if (ctx->too_big) return send_error_ex(h, c, 413, "payload_too_large", "body too large", 1);

    oq_error_t err = {0};
    json_t *root = NULL;
    enum MHD_Result ret;
    if (oq_json_parse(ctx->body ? ctx->body : "", ctx->len, h->max_depth, &root, &err) != 0)
        return send_error(h, c, 400, "bad_request", err.msg);
    char msg[300] = "";
    const char *k;
    json_t *v;
    oq_submit_req_t req;
    memset(&req, 0, sizeof req);
    req.idem_key = key;
    if (!json_is_object(root)) {
        snprintf(msg, sizeof msg, "body must be a JSON object");
        goto bad;
    }
    json_object_foreach(root, k, v)
    {
        if (strcmp(k, "tool") == 0) {
            if (!json_is_string(v)) {
                snprintf(msg, sizeof msg, "field tool: expected string");
                goto bad;
            }
            req.tool = json_string_value(v);
        } else if (strcmp(k, "args") == 0) {
            if (!json_is_object(v)) {
                snprintf(msg, sizeof msg, "field args: expected object");
                goto bad;
            }
            req.args = v;
        } else if (strcmp(k, "tenant") == 0) {
            if (!json_is_string(v)) {
                snprintf(msg, sizeof msg, "field tenant: expected string");
                goto bad;
            }
            req.tenant = json_string_value(v);
        } else if (strcmp(k, "client_id") == 0) {
            if (!json_is_string(v)) {
                snprintf(msg, sizeof msg, "field client_id: expected string");
                goto bad;
            }
            req.client_id = json_string_value(v);
        } else if (strcmp(k, "seq") == 0) {
            if (!json_is_integer(v)) {
                snprintf(msg, sizeof msg, "field seq: expected integer");
                goto bad;
            }
            req.seq = json_integer_value(v);
            req.has_seq = 1;
        } else {
            snprintf(msg, sizeof msg, "unknown field %.64s", k);
            goto bad;
        }
    }
    if (!req.tool) {
        snprintf(msg, sizeof msg, "missing field tool");
        goto bad;
    }
    if (!req.args) {
        snprintf(msg, sizeof msg, "missing field args");
        goto bad;
    }
    if (oq_submit_job_new(&req, &ctx->job, &err) != 0) {
        snprintf(msg, sizeof msg, "%s", err.msg);
        goto bad;
    }
    json_decref(root);
    ctx->state = RS_WAITING;
    MHD_suspend_connection(c);
    if (oq_producer_submit_async(h->p, ctx->job, job_done, ctx) != 0) {
        ctx->refused = 1; /* not queued: the callback will not run */
        ctx->state = RS_DONE;
        MHD_resume_connection(c);
    }
    return MHD_YES;
bad:
    json_decref(root);
    ret = send_error(h, c, 400, "bad_request", msg);
    return ret;
}

static enum MHD_Result submit_finish(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c)
{
    oq_submit_outcome_t oc;
    const oq_call_t *call;
    oq_error_t err = {0};
    int rc = ctx->refused ? OQ_ESHUTDOWN : oq_submit_job_result(ctx->job, &oc, &call, &err);
    if (rc == OQ_ECONFLICT)
        return send_error(h, c, 422, "idempotency_conflict",
                          "this Idempotency-Key was used with a different request body");
    if (rc == OQ_EINVAL) return send_error(h, c, 400, "bad_request", err.msg);
    if (rc == OQ_ETOOBIG) return send_error(h, c, 413, "payload_too_large", err.msg);
    if (rc == OQ_ESHUTDOWN) return send_error(h, c, 503, "unavailable", "shutting down");
    if (rc == OQ_EBUSY) return send_error(h, c, 503, "unavailable", "database busy, retry");
    if (rc) {
        OQ_LOG_ERROR("http", "submit failed: %s", err.msg);
        return send_error(h, c, 503, "unavailable", "submit not durable, retry with the same key");
    }
    if (oc == OQ_SUBMIT_REPLAY)
        return send_call(h, c, oq_call_state_terminal(call->state) ? 200 : 202, call, 1);
    return send_call(h, c, 202, call, 0);
}

/* --- GET handlers ----------------------------------------------------------------------------*/

static enum MHD_Result get_call(oq_http_t *h, struct MHD_Connection *c, const char *id,
                                const char *key)
{
    oq_call_t call;
    memset(&call, 0, sizeof call);
    oq_error_t err = {0};
    int rc;
    if (key) {
        const char *tenant = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "tenant");
        rc = oq_producer_get_by_key(h->p, tenant, key, &call, &err);
    } else {
        rc = oq_producer_get(h->p, id, &call, &err);
    }
    if (rc == OQ_ENOTFOUND) return send_error(h, c, 404, "not_found", "no such call");
    if (rc) return send_error(h, c, 503, "unavailable", err.msg);
    enum MHD_Result r = send_call(h, c, 200, &call, 0);
    oq_call_clear(&call);
    return r;
}

static enum MHD_Result get_stats(oq_http_t *h, struct MHD_Connection *c)
{
    json_t *s = NULL;
    oq_error_t err = {0};
    if (oq_producer_stats(h->p, &s, &err) != 0)
        return send_error(h, c, 503, "unavailable", err.msg);
    if (h->ingest) {
        oq_ingest_counts_t n;
        oq_ingest_counts(h->ingest, &n);
        json_object_set_new(s, "results",
                            json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "applied", (json_int_t)n.applied,
                                      "duplicate", (json_int_t)n.duplicate, "unknown_call",
                                      (json_int_t)n.unknown_call, "stale", (json_int_t)n.stale,
                                      "ignored", (json_int_t)n.ignored, "undecodable",
                                      (json_int_t)n.undecodable));
    }
    return send_json(h, c, 200, s, NULL, 0);
}

static enum MHD_Result get_metrics(oq_http_t *h, struct MHD_Connection *c)
{
    char *text = NULL;
    size_t len = 0;
    if (!h->metrics) {
        text = strdup("");
    } else if (oq_metrics_render(h->metrics, &text, &len) != 0) {
        return send_error(h, c, 500, "internal", "metrics render failed");
    }
    if (!text) return MHD_NO;
    return send_text(h, c, 200, text, strlen(text), "text/plain; version=0.0.4", NULL, 0, 0);
}

/* --- dispatch --------------------------------------------------------------------------------*/

#define CALLS_PREFIX "/v1/tool-calls"
#define BYKEY_PREFIX "/v1/tool-calls/by-key/"

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    oq_http_t *h = cls;
    req_ctx_t *ctx = *con_cls;
    int is_post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    int is_get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, "HEAD") == 0;

    if (!ctx) {
        ctx = calloc(1, sizeof *ctx);
        if (!ctx) return MHD_NO;
        ctx->h = h;
        ctx->conn = c;
        ctx->state = RS_READING;
        ctx->is_submit = is_post && strcmp(url, CALLS_PREFIX) == 0;
        *con_cls = ctx;
        atomic_fetch_add(&h->inflight, 1);
        if (ctx->is_submit) {
            const char *cl =
                MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl && strtoll(cl, NULL, 10) > h->max_body) {
                ctx->too_big = 1;
                return send_error_ex(h, c, 413, "payload_too_large",
                                     "body exceeds the configured limit", 1);
            }
        }
        return MHD_YES;
    }

    if (ctx->is_submit) {
        if (*upload_size) {
            if (!ctx->too_big) {
                size_t n = *upload_size;
                if ((int64_t)(ctx->len + n) > h->max_body) {
                    ctx->too_big = 1;
                    free(ctx->body);
                    ctx->body = NULL;
                    ctx->len = ctx->cap = 0;
                } else {
                    if (ctx->len + n + 1 > ctx->cap) {
                        size_t ncap = ctx->cap ? ctx->cap : 1024;
                        while (ncap < ctx->len + n + 1)
                            ncap *= 2;
                        char *nb = realloc(ctx->body, ncap);
                        if (!nb) return MHD_NO;
                        ctx->body = nb;
                        ctx->cap = ncap;
                    }
                    memcpy(ctx->body + ctx->len, upload, n);
                    ctx->len += n;
                    ctx->body[ctx->len] = '\0';
                }
            }
            *upload_size = 0;
            return MHD_YES;
        }
        if (ctx->state == RS_DONE) return submit_finish(h, ctx, c);
        if (ctx->state == RS_WAITING) return MHD_YES; /* spurious call while suspended */
        return submit_begin(h, ctx, c);
    }
    if (*upload_size) { /* ignore bodies of other requests */
        *upload_size = 0;
        return MHD_YES;
    }

    if (strcmp(url, "/healthz") == 0) {
        if (!is_get) return send_error(h, c, 405, "method_not_allowed", "use GET");
        return send_text(h, c, 200, strdup("{\"status\":\"ok\"}"), 15, "application/json", NULL, 0,
                         0);
    }
    if (strcmp(url, "/stats") == 0) {
        if (!is_get) return send_error(h, c, 405, "method_not_allowed", "use GET");
        return get_stats(h, c);
    }
    if (strcmp(url, "/metrics") == 0) {
        if (!is_get) return send_error(h, c, 405, "method_not_allowed", "use GET");
        return get_metrics(h, c);
    }
    if (strcmp(url, CALLS_PREFIX) == 0)
        return send_error(h, c, 405, "method_not_allowed", "use POST");
    if (strncmp(url, BYKEY_PREFIX, strlen(BYKEY_PREFIX)) == 0) {
        const char *key = url + strlen(BYKEY_PREFIX);
        if (!is_get) return send_error(h, c, 405, "method_not_allowed", "use GET");
        if (!oq_envelope_valid_key(key))
            return send_error(h, c, 400, "invalid_idempotency_key", "bad key in path");
        return get_call(h, c, NULL, key);
    }
    if (strncmp(url, CALLS_PREFIX "/", strlen(CALLS_PREFIX) + 1) == 0) {
        const char *id = url + strlen(CALLS_PREFIX) + 1;
        if (!is_get) return send_error(h, c, 405, "method_not_allowed", "use GET");
        if (!*id || strlen(id) > OQ_CALL_ID_LEN || strchr(id, '/'))
            return send_error(h, c, 404, "not_found", "no such call");
        return get_call(h, c, id, NULL);
    }
    return send_error(h, c, 404, "not_found", "no such endpoint");
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    oq_http_t *h = cls;
    req_ctx_t *ctx = *con_cls;
    (void)c;
    (void)toe;
    if (!ctx) return;
    oq_submit_job_destroy(ctx->job);
    free(ctx->body);
    free(ctx);
    *con_cls = NULL;
    atomic_fetch_sub(&h->inflight, 1);
}

/* The format comes from libmicrohttpd; the attribute lets clang check the vsnprintf below. */
static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    OQ_LOG_DEBUG("http", "libmicrohttpd: %s", buf);
}

int oq_http_start(oq_producer_t *p, const oq_http_opts_t *opts, oq_http_t **out, oq_error_t *err)
{
    char host[64];
    int port = 0;
    int ret = oq_parse_listen(opts->listen ? opts->listen : "127.0.0.1:8081", host, &port, err);
    if (ret) return ret;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, strcmp(host, "localhost") == 0 ? "127.0.0.1" : host, &sa.sin_addr) != 1)
        return oq_error_set(err, OQ_EINVAL, 0, "bad listen address %s", host);

    oq_http_t *h = calloc(1, sizeof *h);
    if (!h) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    h->p = p;
    h->ingest = opts->ingest;
    h->max_body = opts->max_body > 0 ? opts->max_body : 1024 * 1024;
    h->max_depth = opts->max_depth > 0 ? opts->max_depth : 32;
    h->metrics = opts->metrics;
    if (h->metrics) {
        const char *help = "HTTP responses by status class";
        h->m_2xx =
            oq_metrics_counter(h->metrics, "onceq_http_responses_total", help, "class=\"2xx\"");
        h->m_4xx =
            oq_metrics_counter(h->metrics, "onceq_http_responses_total", help, "class=\"4xx\"");
        h->m_5xx =
            oq_metrics_counter(h->metrics, "onceq_http_responses_total", help, "class=\"5xx\"");
    }
    unsigned threads = (unsigned)(opts->threads >= 2 ? opts->threads : 2);
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                                MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
                            (uint16_t)port, NULL, NULL, handler, h, MHD_OPTION_SOCK_ADDR, &sa,
                            MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_NOTIFY_COMPLETED,
                            completed, h, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                            MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
                            /* the pool is zeroed on every keep-alive request: keep it small;
                             * bodies stream through the upload callback anyway */
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)16384,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return oq_error_set(err, OQ_EIO, 0, "cannot listen on %s:%d", host, port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : port;
    OQ_LOG_INFO("http", "listening on %s:%d threads=%u max_body=%lld", host, h->port, threads,
                (long long)h->max_body);
    *out = h;
    return 0;
}

int oq_http_port(const oq_http_t *h)
{
    return h->port;
}

void oq_http_stop(oq_http_t *h, int drain_ms)
{
    if (!h) return;
    MHD_socket ls = MHD_quiesce_daemon(h->d);
    int64_t deadline = oq_mono_us() + (int64_t)drain_ms * 1000;
    while (atomic_load(&h->inflight) > 0 && oq_mono_us() < deadline)
        oq_sleep_ms(10, NULL);
    if (atomic_load(&h->inflight) > 0)
        OQ_LOG_WARN("http", "stopping with %d requests still in progress",
                    atomic_load(&h->inflight));
    MHD_stop_daemon(h->d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    free(h);
}
