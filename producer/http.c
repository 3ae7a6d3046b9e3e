/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http.c: the producer's HTTP API on libmicrohttpd (Debian's libmicrohttpd 0.9.75).
 * (About 1,200 lines, over the usual 800: routes, connection limits and bearer tokens share the
 * request context; the token file's parser is common/tokens.c, shared with the consumer.)
 *
 * Design. libmicrohttpd runs a pool of epoll threads: at least --threads (2), and one per 120
 * connections of the limits (9 for the default 1,000 + 8), because a thread that finds 128
 * requests ready at once stalls them until the idle timeout (common/oq_mhd.h,
 * OQ_MHD_CONNS_PER_THREAD). Those threads must never block on a commit, so a POST is handled as:
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
 * missing_idempotency_key, invalid_idempotency_key, bad_request, invalid_callback_url,
 * webhook_secret_missing, unauthorized, forbidden,
 * tenant_mismatch, payload_too_large, idempotency_conflict, not_found, method_not_allowed,
 * unavailable, internal (a task's decision also unsupported_media_type, not_awaiting_approval,
 * not_in_review, not_retryable, review_moved); with a tool catalogue (--tools) also unknown_tool
 * and bad_args (whose error object adds "pointer", the JSON pointer of the first violation inside
 * args, and "keyword"), checked on the epoll thread before the job is queued: nothing is written.
 *
 * Long poll. A GET of a call with ?wait= whose call is not terminal suspends its connection
 * the same way and arms a call waiter (waiters.c) with the deadline: the writer's
 * notification after the commit that makes the call terminal, the waiters' timer thread at
 * the deadline, or oq_http_stop resumes it, and the handler answers what it then reads. So a
 * waiting client costs no thread; the call is read again after the waiter is armed, so a
 * result committed in between is not missed. An answer that waited says how long in a
 * Server-Timing header ("wait;dur=<ms>"): that time is the pipeline's (relay, Kafka, consumer,
 * tool), the rest of the latency the API's own, which is how onceq-bench mcp tells the
 * gateway's cost apart from the pipeline's.
 * A submit with ?wait= (POST /v1/tool-calls?wait=) does both in one request: once its job
 * completes (the call is durable), a call that is not terminal goes to wait_call with the
 * deadline counted from the request's arrival (submit_phase), and the answer is read after the
 * wake-up (submit_waited); a one-thread agent saves its second request.
 *
 * MCP. POST /mcp (producer/mcp.c: JSON-RPC, sessions, CallToolResult) reads its body as a
 * submit does; a tools/call queues the submit job mcp.c prepared (the same job and writer as
 * POST /v1/tool-calls), then waits as a long poll does (wait_call) up to --mcp-wait from the
 * request's start, and answers the call as it then reads. Bearer tokens apply as on /v1/.
 *
 * Connection limits. libmicrohttpd's own limits stop polling the listening socket when a
 * worker is full, so new clients wait unseen in the kernel's backlog, and they do not say
 * which limit was hit. Instead an accept policy callback refuses a connection over the global
 * limit or over the per-address limit at once (the client sees the connection closed, not a
 * hang), counts it by reason and logs at most one line per second. The counts are kept in the
 * connection notifications (started / closed, which libmicrohttpd always pairs), so a
 * connection that fails inside libmicrohttpd after the policy said yes is never leaked; as a
 * consequence the policy can let through at most one connection per pool thread over a
 * limit. libmicrohttpd's own cap is set past ours (global limit times the pool size), only as
 * a backstop. An idle timeout (10 s by default) closes connections whose request is
 * incomplete, so a flood of half requests holds its slots for seconds, not minutes. The
 * policy, the counts, a request deadline against clients that trickle (which the idle timeout
 * never catches), eviction of the oldest slow request and the probe slots for /healthz and
 * /readyz live in the connection guard of common/mhd.c, shared with the relay and consumer
 * listeners.
 *
 * Authentication (optional). A token file maps bearer tokens to tenants; only SHA-256
 * digests of the tokens are held in memory, and a presented token's digest is compared with
 * every entry in constant time (CRYPTO_memcmp, no early exit). With tokens on, the tenant of
 * a request is the token's: a different tenant in the body or the query is 403
 * tenant_mismatch, and a call of another tenant is 404, exactly as a call that does not exist.
 * The token sets are swapped under a read-write lock on reload (SIGHUP); a reload that fails
 * keeps the old set. /metrics and /stats have their own access rule (loopback, open, or
 * their own tokens); /healthz and /readyz are always open.
 *
 * Readiness. /healthz says the process serves HTTP. /readyz says a submit can succeed: the
 * prober of common/ready.c (the relay's and the consumer's) runs two checks of this file once
 * a second, off the epoll threads: "database", calls.db opens read-write and takes the write
 * lock (BEGIN IMMEDIATE, then ROLLBACK, bounded by a 1 s busy wait; PostgreSQL: the server
 * takes writes), and "kafka", the results ingest's brokers answer ("off" without an ingest).
 * A submit whose commit failed makes the producer unready at once (the prober is woken) until
 * a later commit succeeds or 10 s pass.
 *
 * Shutdown (oq_http_stop): quiesce (stop accepting), wake every long poll (answered with the
 * call as it stands: libmicrohttpd must not be stopped with a connection suspended), wait for
 * requests in progress (bounded), then stop the daemon.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "oq_catalog.h"
#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_mcp.h"
#include "oq_tasks.h"
#include "oq_mhd.h"
#include "oq_pg.h"
#include "oq_metrics.h"
#include "oq_producer.h"
#include "oq_ready.h"
#include "oq_json.h"
#include "oq_tokens.h"
#include "oq_waiters.h"

#define READY_PERIOD_MS 1000 /* the probes' own bounds (common/ready.c probes once a second) */
#define COMMIT_FAIL_WINDOW_US 10000000
#define DEFAULT_MAX_CONNS 1000
#define DEFAULT_MAX_CONNS_PER_IP 256
#define DEFAULT_IDLE_TIMEOUT_MS 10000
#define DEFAULT_REQUEST_TIMEOUT_MS 30000
#define DEFAULT_PROBE_SLOTS 8
#define REVIEW_ID_MAX 64 /* {task_id} of .../resolve: a longer one is not that route */

/* libmicrohttpd's own messages. */
static const oq_mhd_log_ctx_t mhd_log_ctx = {"http", OQ_LOG_DEBUG};

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
    oq_waiters_t *waiters; /**< the producer's: GET ...?wait= */
    atomic_int stopping;   /**< oq_http_stop began: no new waits */
    oq_metric_t *m_waiting;

    /* connection limits, request deadline, eviction, probe slots (common/mhd.c) */
    unsigned max_conns, max_conns_per_ip; /**< per ip: 0 = no limit */
    oq_mhd_guard_t *guard;
    oq_metric_t *m_conns, *m_refused_global, *m_refused_ip;

    /* authentication */
    pthread_rwlock_t tok_lock;
    oq_token_table_t *tokens;         /**< NULL: authentication off */
    oq_token_table_t *metrics_tokens; /**< for OQ_HTTP_METRICS_TOKEN */
    char *token_file, *metrics_token_file;
    oq_http_metrics_access_t metrics_access;
    oq_metric_t *m_auth_fail;

    /* readiness: common/ready.c's prober runs the checks below (ready_lock guards
     * commit_error; the probe connections belong to the prober thread) */
    oq_ready_t *ready;
    pthread_mutex_t ready_lock;
    char commit_error[192];
    atomic_llong last_commit_ok_us, last_commit_fail_us;
    sqlite3 *probe_sqlite;
    PGconn *probe_pg;
    int busy_streak;

    /* tool catalogue (borrowed), or NULL: no check, GET /v1/tools is 404 */
    const oq_catalog_t *catalog;
    char *tools_json; /**< the GET /v1/tools body, rendered once at start */

    oq_mcp_t *mcp; /**< POST /mcp (mcp.c) */

    oq_webhooks_t *webhooks; /**< borrowed, or NULL: callbacks are refused */
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
    int refused;                      /**< the producer was shutting down: the job was not queued */
    int authed;                       /**< tokens are on and the request carried a valid one */
    int n_key;                        /**< Idempotency-Key headers received */
    char tenant[OQ_MAX_NAME_LEN + 1]; /**< the token's tenant when authed */
    oq_waiter_t waiter;               /**< GET ...?wait=: armed while suspended */
    int waited;                       /**< the waiter was armed once */
    int64_t wait_from_us;             /**< when it was armed */
    int64_t waited_us;                /**< how long the request waited for the call to settle */
    int is_mcp;                       /**< POST /mcp */
    int mcp_phase;                    /**< 0 submitting, 1 waiting for the call to settle */
    int64_t mcp_deadline_us;          /**< when a tools/call stops waiting */
    char mcp_call_id[OQ_CALL_ID_LEN + 1]; /**< the call a tools/call waits for */
    oq_mcp_call_t *mcp;                   /**< a tools/call under way */
    int is_task;                          /**< POST /v1/tasks */
    oq_task_job_t *task_job;              /**< its job, queued while suspended */
    unsigned roles;                       /**< the token's roles when authed (oq_tokens.h) */
    char review_id[REVIEW_ID_MAX + 1];    /**< POST /v1/tasks/{id}/resolve: the task */
    int is_review;                        /**< that POST */
    oq_task_review_job_t *review_job;     /**< its job, queued while suspended */

    /* POST /v1/tool-calls?wait= */
    int64_t submit_wait_ms;     /**< 0: answer at the commit */
    int64_t submit_deadline_us; /**< when the wait ends (from the request's arrival) */
    int submit_phase;           /**< 1: the submit committed, waiting for the call */
    int submit_replayed;        /**< the submit was a replay (Idempotent-Replayed) */
    char submit_call_id[OQ_CALL_ID_LEN + 1];
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

/* \p xname, \p xvalue: one more header (WWW-Authenticate of a 401, Allow of a 405), or NULL.
 * Every reply of the API: oq_mhd_reply, with a 503's Retry-After, counted by class. */
static enum MHD_Result send_text(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                 char *text, size_t len, const char *ctype, const char *location,
                                 int replayed, int close, const char *xname, const char *xvalue)
{
    const oq_mhd_header_t hdrs[] = {{MHD_HTTP_HEADER_LOCATION, location},
                                    {"Idempotent-Replayed", replayed ? "true" : NULL},
                                    {xname ? xname : "", xname ? xvalue : NULL},
                                    {NULL, NULL}};
    enum MHD_Result ret = oq_mhd_reply(c, status, ctype, text, len, MHD_RESPMEM_MUST_FREE,
                                       OQ_MHD_RETRY_503 | (close ? OQ_MHD_CLOSE : 0), hdrs);
    count_status(h, status);
    return ret;
}

static enum MHD_Result send_json(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                 json_t *body, const char *location, int replayed)
{
    char *text = oq_json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) return MHD_NO;
    return send_text(h, c, status, text, strlen(text), "application/json", location, replayed, 0,
                     NULL, NULL);
}

static enum MHD_Result send_error_hdr(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                      const char *code, const char *msg, int close,
                                      const char *xname, const char *xvalue)
{
    const oq_mhd_header_t hdrs[] = {{xname ? xname : "", xname ? xvalue : NULL}, {NULL, NULL}};
    enum MHD_Result ret =
        oq_mhd_error(c, status, code, msg, OQ_MHD_RETRY_503 | (close ? OQ_MHD_CLOSE : 0), hdrs);
    count_status(h, status);
    return ret;
}

static enum MHD_Result send_error_ex(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                     const char *code, const char *msg, int close)
{
    return send_error_hdr(h, c, status, code, msg, close, NULL, NULL);
}

static enum MHD_Result send_error(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                  const char *code, const char *msg)
{
    return send_error_ex(h, c, status, code, msg, 0);
}

/* 400 bad_args: the error object also carries the violation's pointer (into args) and keyword. */
static enum MHD_Result send_bad_args(oq_http_t *h, struct MHD_Connection *c, const char *tool,
                                     const oq_jschema_violation_t *v)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "args do not match the input_schema of tool %s: at \"%s\": %s", tool,
             v->pointer, v->reason);
    json_t *b = json_pack("{s:{s:s,s:s,s:s,s:s}}", "error", "code", "bad_args", "message", msg,
                          "pointer", v->pointer, "keyword", v->keyword);
    char *text = b ? oq_json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    if (!text) return MHD_NO;
    return send_text(h, c, 400, text, strlen(text), "application/json", NULL, 0, 0, NULL, NULL);
}

/* 405 with the Allow header that RFC 9110 (15.5.6) requires: the methods the path serves. */
static enum MHD_Result method_not_allowed(oq_http_t *h, struct MHD_Connection *c, const char *allow)
{
    char msg[64];
    snprintf(msg, sizeof msg, "use %s", allow);
    return send_error_hdr(h, c, 405, "method_not_allowed", msg, 0, MHD_HTTP_HEADER_ALLOW, allow);
}

/* \p timing: a Server-Timing value, or NULL. */
static enum MHD_Result send_call(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                 const oq_call_t *call, int replayed, const char *timing)
{
    char *text = NULL;
    size_t len = 0;
    if (oq_call_render(call, &text, &len) != 0) return MHD_NO;
    char loc[64];
    snprintf(loc, sizeof loc, "/v1/tool-calls/%s", call->call_id);
    return send_text(h, c, status, text, len, "application/json", status == 202 ? loc : NULL,
                     replayed, 0, timing ? "Server-Timing" : NULL, timing);
}

/* --- tokens ----------------------------------------------------------------------------------*/

typedef enum { AUTH_OK = 0, AUTH_MISSING, AUTH_INVALID } auth_result_t;

/* Check "Authorization: Bearer <token>" against \p which (h->tokens or h->metrics_tokens);
 * \p tenant (may be NULL) receives the token's tenant, \p roles (may be NULL) its roles.
 * \p n_auth: Authorization headers seen. */
static auth_result_t check_bearer(oq_http_t *h, struct MHD_Connection *c, int n_auth,
                                  oq_token_table_t *const *which, char tenant[OQ_MAX_NAME_LEN + 1],
                                  unsigned *roles)
{
    const char *v = NULL;
    size_t vlen = 0;
    if (n_auth == 0) return AUTH_MISSING;
    if (n_auth > 1 ||
        MHD_lookup_connection_value_n(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION,
                                      strlen(MHD_HTTP_HEADER_AUTHORIZATION), &v, &vlen) != MHD_YES)
        return AUTH_INVALID;
    const char *tok;
    size_t n;
    if (oq_tokens_bearer(v, vlen, &tok, &n) != 0) return AUTH_INVALID;
    auth_result_t r = AUTH_INVALID;
    pthread_rwlock_rdlock(&h->tok_lock);
    long i = oq_tokens_find(*which, tok, n);
    if (i >= 0) {
        if (tenant) memcpy(tenant, (*which)->v[i].tenant, OQ_MAX_NAME_LEN + 1);
        if (roles) *roles = (*which)->v[i].roles;
        r = AUTH_OK;
    }
    pthread_rwlock_unlock(&h->tok_lock);
    return r;
}

static enum MHD_Result send_unauthorized(oq_http_t *h, struct MHD_Connection *c, auth_result_t why,
                                         int close)
{
    oq_counter_add(h->m_auth_fail, 1);
    if (why == AUTH_MISSING)
        return send_error_hdr(h, c, 401, "unauthorized",
                              "this endpoint needs an Authorization: Bearer token", close,
                              MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"onceq\"");
    return send_error_hdr(h, c, 401, "unauthorized", "the bearer token is not valid", close,
                          MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                          "Bearer realm=\"onceq\", error=\"invalid_token\"");
}

int oq_http_reload(oq_http_t *h, oq_error_t *err)
{
    oq_token_table_t *t = NULL, *mt = NULL;
    int ret;
    if (!h->token_file && !h->metrics_token_file) return 0;
    if (h->token_file && (ret = oq_tokens_load(h->token_file, 1, &t, err))) return ret;
    if (h->metrics_token_file && (ret = oq_tokens_load(h->metrics_token_file, 0, &mt, err))) {
        oq_tokens_free(t);
        return ret;
    }
    pthread_rwlock_wrlock(&h->tok_lock);
    oq_token_table_t *old = h->tokens, *mold = h->metrics_tokens;
    if (h->token_file) h->tokens = t;
    if (h->metrics_token_file) h->metrics_tokens = mt;
    pthread_rwlock_unlock(&h->tok_lock);
    if (h->token_file) oq_tokens_free(old);
    if (h->metrics_token_file) oq_tokens_free(mold);
    OQ_LOG_INFO("http", "tokens loaded: api=%zu (%s) metrics=%zu (%s)", t ? t->n : 0,
                h->token_file ? h->token_file : "off", mt ? mt->n : 0,
                h->metrics_token_file ? h->metrics_token_file : "off");
    return 0;
}

/* --- readiness -------------------------------------------------------------------------------*/

/* One probe of calls.db on the prober's own connection. \p db is opened (again) as needed. */
static void probe_db(oq_http_t *h, sqlite3 **db, int *busy_streak, char *out, size_t cap)
{
    oq_error_t err = {0};
    if (!*db) {
        oq_db_opts_t o = {NULL, READY_PERIOD_MS, 0};
        if (oq_db_open(oq_producer_path(h->p), &o, db, &err) != 0) {
            snprintf(out, cap, "cannot open: %.160s", err.msg);
            *db = NULL;
            return;
        }
    }
    if (sqlite3_db_readonly(*db, "main") == 1) {
        snprintf(out, cap, "read-only: the database file cannot be written");
        sqlite3_close_v2(*db); /* reopen next time: the file may become writable */
        *db = NULL;
        return;
    }
    int rc = oq_db_begin_immediate(*db, READY_PERIOD_MS, &err);
    if (rc == OQ_EBUSY) {
        /* another writer held the lock for the whole second: once is load, twice is a fault */
        if (++*busy_streak >= 2)
            snprintf(out, cap, "locked: the write lock was not free for %d s", *busy_streak);
        else
            snprintf(out, cap, "ok");
        return;
    }
    *busy_streak = 0;
    if (rc != 0) {
        snprintf(out, cap, "cannot take the write lock: %.160s", err.msg);
        sqlite3_close_v2(*db);
        *db = NULL;
        return;
    }
    oq_db_rollback(*db);
    snprintf(out, cap, "ok");
}

/* The same probe on PostgreSQL: the server answers on the prober's own connection and takes
 * writes (not a standby in recovery). A lost connection is opened again at the next probe. */
static void probe_pg(oq_http_t *h, PGconn **c, char *out, size_t cap)
{
    oq_error_t err = {0};
    if (*c && PQstatus(*c) == CONNECTION_BAD) {
        PQfinish(*c);
        *c = NULL;
    }
    if (!*c && oq_pg_connect(oq_producer_path(h->p), c, &err) != 0) {
        snprintf(out, cap, "cannot connect: %.160s", err.msg);
        return;
    }
    PGresult *r = NULL;
    if (oq_pg_query(*c, "SELECT pg_is_in_recovery()", 0, NULL, &r, &err) != 0) {
        snprintf(out, cap, "no answer: %.160s", err.msg);
        return;
    }
    int standby = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    snprintf(out, cap, standby ? "read-only: the server is a standby" : "ok");
}

/* The "database" check (on common/ready.c's prober thread): calls.db (or the PostgreSQL server)
 * takes writes, and no submit's commit failed in the last COMMIT_FAIL_WINDOW_US (unless a
 * later one succeeded). */
static int check_database(void *arg, char *out, size_t cap)
{
    oq_http_t *h = arg;
    if (oq_backend_of(oq_producer_path(h->p)) == OQ_BACKEND_POSTGRES)
        probe_pg(h, &h->probe_pg, out, cap);
    else
        probe_db(h, &h->probe_sqlite, &h->busy_streak, out, cap);
    if (strcmp(out, "ok") != 0) return OQ_EDB; /* the probe's finding is the more precise */
    int64_t now = oq_mono_us();
    int64_t fail = atomic_load(&h->last_commit_fail_us), ok = atomic_load(&h->last_commit_ok_us);
    if (fail <= ok || now - fail >= COMMIT_FAIL_WINDOW_US) return 0;
    pthread_mutex_lock(&h->ready_lock);
    snprintf(out, cap, "the last commit failed: %s", h->commit_error);
    pthread_mutex_unlock(&h->ready_lock);
    return OQ_EDB;
}

/* The "kafka" check: the results ingest's brokers answer ("off" without an ingest). */
static int check_kafka(void *arg, char *out, size_t cap)
{
    oq_http_t *h = arg;
    oq_error_t err = {0};
    if (!h->ingest) {
        snprintf(out, cap, "off");
        return 0;
    }
    if (oq_ingest_probe(h->ingest, READY_PERIOD_MS, &err) == 0) {
        snprintf(out, cap, "ok");
        return 0;
    }
    snprintf(out, cap, "unreachable: %.160s", err.msg);
    return OQ_EKAFKA;
}

/* Submits report their commit's outcome: a failed commit makes the producer unready until a
 * later one succeeds or COMMIT_FAIL_WINDOW_US pass (traffic may have stopped by then). */
static void note_commit(oq_http_t *h, int ok, const char *msg)
{
    int64_t now = oq_mono_us();
    if (ok) {
        atomic_store(&h->last_commit_ok_us, now);
        return;
    }
    pthread_mutex_lock(&h->ready_lock);
    snprintf(h->commit_error, sizeof h->commit_error, "%.180s", msg ? msg : "");
    pthread_mutex_unlock(&h->ready_lock);
    atomic_store(&h->last_commit_fail_us, now);
    oq_ready_probe_now(h->ready); /* unready now, not at the next probe */
}

static enum MHD_Result get_readyz(oq_http_t *h, struct MHD_Connection *c)
{
    char *body = NULL;
    size_t len = 0;
    int ready = oq_ready_render(h->ready, &body, &len);
    if (ready < 0) return MHD_NO;
    return send_text(h, c, ready ? 200 : 503, body, len, "application/json", NULL, 0, 0, NULL,
                     NULL);
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
    const char *raw = NULL;
    size_t raw_len = 0;
    /* A submit's tenant is in its body (or its token): a ?tenant= that the submit would ignore
     * is refused, so a client never believes a call landed in a tenant it did not. */
    const char *qt = NULL;
    size_t qt_len = 0;
    if (MHD_lookup_connection_value_n(c, MHD_GET_ARGUMENT_KIND, "tenant", strlen("tenant"), &qt,
                                      &qt_len) == MHD_YES)
        return send_error(h, c, 400, "bad_request",
                          "a submit takes its tenant in the body, not in ?tenant=");
    /* ?wait=: answer once the call is terminal (or at the deadline), as a GET ?wait= would,
     * saving an agent the second request; malformed, it is refused before anything is written */
    const char *wait = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "wait");
    int wrc;
    if (wait && (wrc = oq_wait_parse(wait, OQ_WAIT_MAX_MS, &ctx->submit_wait_ms)) != 0)
        return send_error(h, c, 400, "bad_request",
                          wrc == OQ_ERANGE ? "query wait: at most 60s"
                                           : "query wait: a duration such as 30s, 500ms, 1m, or "
                                             "seconds (at most 60s)");
    ctx->submit_deadline_us = oq_mono_us() + ctx->submit_wait_ms * 1000;
    if (ctx->n_key == 0 ||
        MHD_lookup_connection_value_n(c, MHD_HEADER_KIND, "Idempotency-Key",
                                      strlen("Idempotency-Key"), &raw, &raw_len) != MHD_YES ||
        !raw || !*raw)
        return send_error(h, c, 400, "missing_idempotency_key",
                          "the Idempotency-Key header is required");
    if (ctx->n_key > 1)
        return send_error(h, c, 400, "invalid_idempotency_key",
                          "send exactly one Idempotency-Key header");
    /* A NUL inside the value would end the key early: refused. The guard's handler
     * (oq_mhd_headers_intact) has refused such a request already, also with libmicrohttpd
     * 0.9.75, which cuts the value itself; this is the check where the length says it. */
    if (strlen(raw) != raw_len)
        return send_error(h, c, 400, "bad_request", "Idempotency-Key contains a NUL byte");
    char kbuf[OQ_MAX_KEY_LEN + 3];
    const char *key = unquote_key(raw, kbuf);
    if (!oq_envelope_valid_key(key))
        return send_error(h, c, 400, "invalid_idempotency_key",
                          "Idempotency-Key must be 1-255 printable ASCII bytes");
    /* HTTP drops the spaces before a header value and proxies may drop those after it, so a
     * key with spaces at either end would not name one call: refused, in the quoted form too. */
    if (key[0] == ' ' || key[strlen(key) - 1] == ' ')
        return send_error(h, c, 400, "invalid_idempotency_key",
                          "Idempotency-Key must not begin or end with a space");
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
        } else if (strcmp(k, "callback_url") == 0) {
            if (!json_is_string(v)) {
                json_decref(root);
                return send_error(h, c, 400, "invalid_callback_url",
                                  "field callback_url: expected a string (an http or https URL)");
            }
            req.callback_url = json_string_value(v);
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
    if (req.tenant && !*req.tenant) {
        snprintf(msg, sizeof msg, "field tenant: must not be empty (leave it out for \"%s\")",
                 OQ_DEFAULT_TENANT);
        goto bad;
    }
    if (ctx->authed) {
        if (req.tenant && strcmp(req.tenant, ctx->tenant) != 0) {
            json_decref(root);
            return send_error(h, c, 403, "tenant_mismatch",
                              "field tenant differs from the tenant of the bearer token");
        }
        req.tenant = ctx->tenant;
    }
    /* Webhooks: the request's callback_url, else its tenant's default (callback_url= in the
     * token file); it must be a URL we send to, and its tenant must have a secret to sign
     * with. Refused here, nothing is written. */
    char tenant_url[OQ_MAX_CALLBACK_URL_LEN + 1];
    if (!req.callback_url && ctx->authed) {
        pthread_rwlock_rdlock(&h->tok_lock);
        const oq_tenant_hook_t *th = oq_tokens_hook(h->tokens, ctx->tenant);
        if (th && th->callback_url) {
            snprintf(tenant_url, sizeof tenant_url, "%s", th->callback_url);
            req.callback_url = tenant_url;
        }
        pthread_rwlock_unlock(&h->tok_lock);
    }
    if (req.callback_url) {
        if (oq_callback_url_check(req.callback_url, &err) != 0) {
            json_decref(root);
            return send_error(h, c, 400, "invalid_callback_url", err.msg);
        }
        if (!oq_webhooks_can_sign(h->webhooks, req.tenant)) {
            json_decref(root);
            return send_error(h, c, 400, "webhook_secret_missing",
                              "callback_url given, but this tenant has no webhook secret to sign "
                              "deliveries with (webhook_secret= in the token file, or the "
                              "producer's --webhook-secret-file)");
        }
    }
    if (oq_submit_job_new(&req, &ctx->job, &err) != 0) {
        snprintf(msg, sizeof msg, "%s", err.msg);
        goto bad;
    }
    if (h->catalog) { /* the catalogue's check (req.tool is valid ASCII by now), before the
                         job is queued: nothing is written */
        oq_jschema_violation_t viol;
        int crc = oq_catalog_check(h->catalog, req.tool, req.args, &viol);
        if (crc) {
            oq_submit_job_destroy(ctx->job);
            ctx->job = NULL;
            if (crc == OQ_ENOTFOUND)
                snprintf(msg, sizeof msg, "no tool named \"%s\" in the catalogue (GET /v1/tools)",
                         req.tool);
            ret = crc == OQ_ENOTFOUND ? send_error(h, c, 400, "unknown_tool", msg)
                                      : send_bad_args(h, c, req.tool, &viol);
            json_decref(root);
            return ret;
        }
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

static enum MHD_Result wait_call(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c,
                                 const char *call_id, int64_t deadline_us);
static const char *server_timing(const req_ctx_t *ctx, char buf[48]);

/* POST ?wait=, after the wait: the call as it reads now; 200 when terminal, else 202 (as a
 * replay is answered), Idempotent-Replayed as the submit decided. */
static enum MHD_Result submit_waited(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c)
{
    oq_call_t call;
    memset(&call, 0, sizeof call);
    oq_error_t err = {0};
    if (oq_producer_get(h->p, ctx->submit_call_id, &call, &err) != 0)
        return send_error(h, c, 503, "unavailable", err.msg);
    char timing[48];
    enum MHD_Result r = send_call(h, c, oq_call_state_terminal(call.state) ? 200 : 202, &call,
                                  ctx->submit_replayed, server_timing(ctx, timing));
    oq_call_clear(&call);
    return r;
}

static enum MHD_Result submit_finish(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c)
{
    if (ctx->submit_phase) return submit_waited(h, ctx, c);
    oq_submit_outcome_t oc;
    const oq_call_t *call;
    oq_error_t err = {0};
    int rc = ctx->refused ? OQ_ESHUTDOWN : oq_submit_job_result(ctx->job, &oc, &call, &err);
    /* Only a failed commit says something about readiness; a refusal of the request itself
     * (conflict, invalid, a message too large for Kafka: 422, 400, 413) does not, else any
     * client could keep the producer unready by sending such requests. */
    if (rc == 0)
        note_commit(h, 1, NULL);
    else if (rc != OQ_ECONFLICT && rc != OQ_EINVAL && rc != OQ_ETOOBIG && rc != OQ_ESHUTDOWN)
        note_commit(h, 0, err.msg);
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
    if (ctx->submit_wait_ms > 0 && !oq_call_state_terminal(call->state) &&
        !atomic_load(&h->stopping)) { /* durable now; the answer waits for the call to settle */
        ctx->submit_phase = 1;
        ctx->submit_replayed = oc == OQ_SUBMIT_REPLAY;
        snprintf(ctx->submit_call_id, sizeof ctx->submit_call_id, "%s", call->call_id);
        return wait_call(h, ctx, c, ctx->submit_call_id, ctx->submit_deadline_us);
    }
    if (oc == OQ_SUBMIT_REPLAY)
        return send_call(h, c, oq_call_state_terminal(call->state) ? 200 : 202, call, 1, NULL);
    return send_call(h, c, 202, call, 0, NULL);
}

/* --- tasks: POST /v1/tasks, GET /v1/tasks/{id}, GET /v1/tasks/by-key/{key} --------------------*/

/* The rules are producer/tasks.c's; this is the HTTP part: the key header as a submit reads it,
 * the body validated on the epoll thread (oq_task_job_new), the job queued for the writer with
 * the connection suspended, the answer built when it is resumed. Same status codes as a call:
 * 202 new or in flight, 200 replayed and finished (both replays with Idempotent-Replayed), 422
 * idempotency_conflict; 400 bad_request / bad_task / bad_reference. */

/* The writer queue refused a task job (shutting down: 503): the connection was suspended for
 * the job, so it is resumed before the answer. */
static enum MHD_Result task_queue_refused(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c)
{
    ctx->state = RS_DONE;
    MHD_resume_connection(c);
    return send_error(h, c, 503, "unavailable", "shutting down");
}

static void task_done(oq_task_job_t *job, void *opaque)
{
    req_ctx_t *ctx = opaque;
    (void)job;
    ctx->state = RS_DONE;
    MHD_resume_connection(ctx->conn);
}

static enum MHD_Result task_begin(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c)
{
    const char *raw = NULL;
    size_t raw_len = 0;
    if (ctx->n_key == 0 ||
        MHD_lookup_connection_value_n(c, MHD_HEADER_KIND, "Idempotency-Key",
                                      strlen("Idempotency-Key"), &raw, &raw_len) != MHD_YES ||
        !raw || !*raw)
        return send_error(h, c, 400, "missing_idempotency_key",
                          "the Idempotency-Key header is required");
    char kbuf[OQ_MAX_KEY_LEN + 3];
    const char *key = unquote_key(raw, kbuf);
    if (ctx->n_key > 1 || strlen(raw) != raw_len || !oq_envelope_valid_key(key) || key[0] == ' ' ||
        key[strlen(key) - 1] == ' ')
        return send_error(h, c, 400, "invalid_idempotency_key",
                          "send one Idempotency-Key header of 1-255 printable ASCII bytes, "
                          "without spaces at either end");
    if (ctx->too_big) return send_error_ex(h, c, 413, "payload_too_large", "body too large", 1);
    oq_error_t err = {0};
    json_t *root = NULL;
    if (oq_json_parse(ctx->body ? ctx->body : "", ctx->len, h->max_depth, &root, &err) != 0)
        return send_error(h, c, 400, "bad_request", err.msg);
    const char *code = "bad_request";
    int rc =
        oq_task_job_new(ctx->authed ? ctx->tenant : NULL, key, root, &ctx->task_job, &code, &err);
    json_decref(root);
    if (rc)
        return send_error(h, c, strcmp(code, "tenant_mismatch") == 0 ? 403 : 400, code, err.msg);
    ctx->state = RS_WAITING;
    MHD_suspend_connection(c);
    rc = oq_producer_task_submit_async(h->p, ctx->task_job, task_done, ctx);
    if (rc) return task_queue_refused(h, ctx, c);
    return MHD_YES;
}

static enum MHD_Result send_task(oq_http_t *h, struct MHD_Connection *c, unsigned status,
                                 const json_t *task, int replayed)
{
    char loc[64];
    snprintf(loc, sizeof loc, "/v1/tasks/%s", json_string_value(json_object_get(task, "task_id")));
    return send_json(h, c, status, json_incref((json_t *)task), status == 202 ? loc : NULL,
                     replayed);
}

static enum MHD_Result task_finish(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c)
{
    oq_task_outcome_t oc = 0;
    const json_t *task = NULL;
    oq_error_t err = {0};
    int rc = oq_task_job_result(ctx->task_job, &oc, &task, &err);
    if (rc == OQ_ECONFLICT)
        return send_error(h, c, 422, "idempotency_conflict",
                          "this Idempotency-Key was used with a different task");
    if (rc || !task) {
        OQ_LOG_ERROR("http", "task submit failed: %s", err.msg);
        return send_error(h, c, 503, "unavailable", "task not durable, retry with the same key");
    }
    note_commit(h, 1, NULL);
    const char *st = json_string_value(json_object_get(task, "status"));
    if (oc == OQ_TASK_REPLAY)
        return send_task(h, c, oq_task_status_terminal(st) ? 200 : 202, task, 1);
    return send_task(h, c, 202, task, 0);
}

static enum MHD_Result get_task(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c,
                                const char *id, const char *key)
{
    const char *tenant = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "tenant");
    if (tenant && !oq_envelope_valid_name(tenant))
        return send_error(h, c, 400, "bad_request", "query tenant: 1-128 printable ASCII bytes");
    if (ctx->authed) {
        if (tenant && strcmp(tenant, ctx->tenant) != 0)
            return send_error(h, c, 403, "tenant_mismatch",
                              "query tenant differs from the tenant of the bearer token");
        tenant = ctx->tenant;
    }
    json_t *t = NULL;
    oq_error_t err = {0};
    int rc = oq_producer_task_get(h->p, id, tenant, key, &t, &err);
    if (rc == 0 && ctx->authed &&
        strcmp(json_string_value(json_object_get(t, "tenant")), ctx->tenant) != 0) {
        json_decref(t);
        rc = OQ_ENOTFOUND;
    }
    if (rc == OQ_ENOTFOUND) return send_error(h, c, 404, "not_found", "no such task");
    if (rc) return send_error(h, c, 503, "unavailable", err.msg);
    return send_json(h, c, 200, t, NULL, 0);
}

/* --- POST /v1/tasks/{task_id}/resolve: an operator's decision on a task ----------------------*/

/* The decision is producer/tasks.c's oq__task_review, the one `onceq review resolve t_...` runs
 * (oq_store_task_review): here it is queued for the writer like a submit (the epoll thread
 * never waits on a commit) and committed in its group-commit transaction, fenced on the task's
 * review episode and audited under the task id (event task_review) with the operator's name.
 * Body {"as", "fence", "note", "by"?}: as is approve | reject (awaiting_approval) or
 * compensated | succeeded | retry-compensation (needs_review). With a token file the request
 * needs a token with the operator role (403 forbidden otherwise, checked before the body is
 * read) and may act on any tenant's task; the audit names "BY (http, token TENANT)", or the
 * token's tenant when by is absent. Without a token file by is required ("BY (http)"). The
 * body must be sent as application/json (415 otherwise), so a page of another origin cannot
 * post a decision without a CORS preflight, which this server never grants.
 * Refusals change nothing: 400 bad_request, 404 not_found, 409 not_awaiting_approval /
 * not_in_review / not_retryable / review_moved, 413, 415; 503
 * unavailable when the commit failed (nothing written: the same request may be sent again). */

/* Non-zero when the request says its body is application/json (parameters ignored): a form or
 * text/plain POST, which a web page of another origin can send without a preflight, is not. */
static int content_type_json(struct MHD_Connection *c)
{
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!ct) return 0;
    ct += strspn(ct, " \t");
    size_t n = strcspn(ct, ";");
    while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
        n--;
    return n == 16 && strncasecmp(ct, "application/json", 16) == 0;
}

/* Non-zero when \p url is /v1/tasks/{task_id}/resolve; \p id receives the task id. */
static int review_url(const char *url, char id[REVIEW_ID_MAX + 1])
{
    static const char pre[] = "/v1/tasks/", suf[] = "/resolve";
    size_t n = strlen(url), lp = sizeof pre - 1, ls = sizeof suf - 1;
    if (n <= lp + ls || strncmp(url, pre, lp) != 0 || strcmp(url + n - ls, suf) != 0) return 0;
    size_t idn = n - lp - ls;
    if (idn > REVIEW_ID_MAX || memchr(url + lp, '/', idn)) return 0;
    memcpy(id, url + lp, idn);
    id[idn] = '\0';
    return 1;
}

static void review_done(oq_task_review_job_t *job, void *opaque)
{
    req_ctx_t *ctx = opaque;
    (void)job;
    ctx->state = RS_DONE;
    MHD_resume_connection(ctx->conn);
}

static enum MHD_Result review_begin(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c)
{
    if (ctx->too_big) return send_error_ex(h, c, 413, "payload_too_large", "body too large", 1);
    oq_error_t err = {0};
    json_t *req = NULL;
    if (oq_json_parse(ctx->body ? ctx->body : "", ctx->len, h->max_depth, &req, &err) != 0)
        return send_error(h, c, 400, "bad_request", err.msg);
    if (!json_is_object(req)) {
        json_decref(req);
        return send_error(h, c, 400, "bad_request", "the body must be a JSON object");
    }
    const char *k;
    json_t *v;
    json_object_foreach(req, k, v)
    {
        int fence = strcmp(k, "fence") == 0;
        if (fence
                ? !json_is_integer(v) || json_integer_value(v) < 0
                : (strcmp(k, "as") && strcmp(k, "note") && strcmp(k, "by")) || !json_is_string(v)) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "member %.60s: expected as, note, by (strings) and fence (an integer >= 0)",
                     k);
            json_decref(req);
            return send_error(h, c, 400, "bad_request", msg);
        }
    }
    const char *as = json_string_value(json_object_get(req, "as"));
    const char *note = json_string_value(json_object_get(req, "note"));
    const char *by = json_string_value(json_object_get(req, "by"));
    json_t *fence = json_object_get(req, "fence");
    if (by && !*by) by = NULL;
    if (!as || !note || !*note || !fence || (!by && !ctx->authed)) {
        json_decref(req);
        return send_error(h, c, 400, "bad_request",
                          ctx->authed ? "as, fence and note are required"
                                      : "as, fence, note and by (the operator's name) are "
                                        "required");
    }
    char who[OQ_MAX_NAME_LEN + 200];
    if (ctx->authed && by)
        snprintf(who, sizeof who, "%.128s (http, token %s)", by, ctx->tenant);
    else if (ctx->authed)
        snprintf(who, sizeof who, "%s (http)", ctx->tenant);
    else
        snprintf(who, sizeof who, "%.128s (http)", by);
    int rc = oq_task_review_job_new(ctx->review_id, (int64_t)json_integer_value(fence), as, who,
                                    note, &ctx->review_job, &err);
    json_decref(req);
    if (rc == OQ_ENOTFOUND) return send_error(h, c, 404, "not_found", "no such task");
    if (rc == OQ_EINVAL) return send_error(h, c, 400, "bad_request", err.msg);
    if (rc) return send_error(h, c, 503, "unavailable", err.msg);
    ctx->state = RS_WAITING;
    MHD_suspend_connection(c);
    rc = oq_producer_task_review_async(h->p, ctx->review_job, review_done, ctx);
    if (rc) return task_queue_refused(h, ctx, c);
    return MHD_YES;
}

static enum MHD_Result review_finish(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c)
{
    const json_t *task = NULL;
    const char *code = NULL;
    oq_error_t err = {0};
    int rc = oq_task_review_job_result(ctx->review_job, &task, &code, &err);
    switch (rc) {
    case 0:
        break;
    case OQ_EINVAL:
        return send_error(h, c, 400, code ? code : "bad_request", err.msg);
    case OQ_ENOTFOUND:
        return send_error(h, c, 404, "not_found", "no such task");
    case OQ_ESTATE:
    case OQ_ECONFLICT:
        return send_error(h, c, 409, code ? code : "conflict", err.msg);
    default:
        OQ_LOG_ERROR("http", "task decision failed: %s", err.msg);
        return send_error(h, c, 503, "unavailable",
                          "the decision did not commit (nothing written): send it again");
    }
    note_commit(h, 1, NULL);
    OQ_LOG_INFO("http", "task %s resolved over http", ctx->review_id);
    return send_json(h, c, 200, json_incref((json_t *)task), NULL, 0);
}

/* --- GET handlers ----------------------------------------------------------------------------*/

/* A waiter fired (the call settled, the deadline, shutdown): answer what a read says now. */
static void wait_woken(oq_waiter_t *w, oq_wake_t why, void *opaque)
{
    req_ctx_t *ctx = opaque;
    (void)w;
    (void)why;
    ctx->waited_us += oq_mono_us() - ctx->wait_from_us;
    oq_gauge_add(ctx->h->m_waiting, -1);
    ctx->state = RS_DONE;
    MHD_resume_connection(ctx->conn);
}

/* The Server-Timing value of a request that waited for its call to settle (the pipeline's
 * time, not the front door's: a client subtracts it to see what the API itself took), or NULL
 * when it did not wait. */
static const char *server_timing(const req_ctx_t *ctx, char buf[48])
{
    if (!ctx->waited) return NULL;
    snprintf(buf, 48, "wait;dur=%.3f", (double)ctx->waited_us / 1000.0);
    return buf;
}

/* Long poll: suspend \p c until \p call_id is terminal, \p deadline_us or shutdown; the
 * handler then runs again in RS_DONE and answers the call as it reads then. */
static enum MHD_Result wait_call(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c,
                                 const char *call_id, int64_t deadline_us)
{
    ctx->state = RS_WAITING;
    MHD_suspend_connection(c);
    ctx->wait_from_us = oq_mono_us();
    if (oq_waiters_add(h->waiters, &ctx->waiter, call_id, deadline_us, wait_woken, ctx, h, NULL) !=
        0) {
        ctx->state = RS_DONE;
        MHD_resume_connection(c);
        return MHD_YES;
    }
    ctx->waited = 1;
    oq_gauge_add(h->m_waiting, 1);
    /* A result committed after the first read and before the waiter was armed woke nobody:
     * read again. A stop that began meanwhile may have woken the others already. */
    oq_call_t now;
    memset(&now, 0, sizeof now);
    int settled = oq_producer_get(h->p, call_id, &now, NULL) != 0 ||
                  oq_call_state_terminal(now.state) || atomic_load(&h->stopping);
    oq_call_clear(&now);
    if (settled && oq_waiters_cancel(h->waiters, &ctx->waiter)) {
        ctx->waited_us += oq_mono_us() - ctx->wait_from_us;
        oq_gauge_add(h->m_waiting, -1);
        ctx->state = RS_DONE;
        MHD_resume_connection(c);
    }
    return MHD_YES;
}

static enum MHD_Result get_call(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c,
                                const char *id, const char *key)
{
    oq_call_t call;
    memset(&call, 0, sizeof call);
    oq_error_t err = {0};
    int rc;
    int64_t wait_ms = 0;
    const char *wait = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "wait");
    if (wait && (rc = oq_wait_parse(wait, OQ_WAIT_MAX_MS, &wait_ms)) != 0)
        return send_error(h, c, 400, "bad_request",
                          rc == OQ_ERANGE ? "query wait: at most 60s"
                                          : "query wait: a duration such as 30s, 500ms, 1m, or "
                                            "seconds (at most 60s)");
    int64_t deadline_us = oq_mono_us() + wait_ms * 1000;
    if (key) {
        const char *tenant = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "tenant");
        if (tenant && !*tenant)
            return send_error(h, c, 400, "bad_request",
                              "query tenant must not be empty (leave it out for \"default\")");
        if (tenant && !oq_envelope_valid_name(tenant))
            return send_error(h, c, 400, "bad_request",
                              "query tenant must be printable ASCII (a %00 is refused)");
        if (ctx->authed) {
            if (tenant && strcmp(tenant, ctx->tenant) != 0)
                return send_error(h, c, 403, "tenant_mismatch",
                                  "query tenant differs from the tenant of the bearer token");
            tenant = ctx->tenant;
        }
        rc = oq_producer_get_by_key(h->p, tenant, key, &call, &err);
    } else {
        rc = oq_producer_get(h->p, id, &call, &err);
        /* another tenant's call is answered exactly as one that does not exist */
        if (rc == 0 && ctx->authed && strcmp(call.tenant ? call.tenant : "", ctx->tenant) != 0) {
            oq_call_clear(&call);
            rc = OQ_ENOTFOUND;
        }
    }
    if (rc == OQ_ENOTFOUND) return send_error(h, c, 404, "not_found", "no such call");
    if (rc) return send_error(h, c, 503, "unavailable", err.msg);
    enum MHD_Result r;
    if (wait_ms > 0 && ctx->state != RS_DONE && !oq_call_state_terminal(call.state) &&
        !atomic_load(&h->stopping)) {
        r = wait_call(h, ctx, c, call.call_id, deadline_us);
        oq_call_clear(&call);
        return r;
    }
    char timing[48];
    r = send_call(h, c, 200, &call, 0, server_timing(ctx, timing));
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
    return send_text(h, c, 200, text, strlen(text), "text/plain; version=0.0.4", NULL, 0, 0, NULL,
                     NULL);
}

/* --- /mcp (producer/mcp.c) ------------------------------------------------------------------*/

/* \p timing: a Server-Timing value, or NULL. */
static enum MHD_Result mcp_send(oq_http_t *h, struct MHD_Connection *c, oq_mcp_out_t *o,
                                const char *timing)
{
    char *body = o->body ? o->body : strdup("");
    if (!body) return MHD_NO;
    const oq_mhd_header_t hdrs[] = {{"Mcp-Session-Id", o->session[0] ? o->session : NULL},
                                    {"Server-Timing", timing},
                                    {NULL, NULL}};
    enum MHD_Result ret = oq_mhd_reply(c, o->status, o->ctype ? o->ctype : "application/json", body,
                                       strlen(body), MHD_RESPMEM_MUST_FREE, OQ_MHD_RETRY_503, hdrs);
    count_status(h, o->status);
    return ret;
}

static void mcp_in(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c, oq_mcp_in_t *in)
{
    (void)h;
    in->session = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Mcp-Session-Id");
    in->proto = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "MCP-Protocol-Version");
    in->accept = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
    in->origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    in->host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    in->tenant = ctx->authed ? ctx->tenant : NULL;
}

/* A tools/call is the submit of POST /v1/tool-calls (the same job, the same writer), then the
 * wait of GET ...?wait= (wait_call) up to --mcp-wait from the request's start. */
static enum MHD_Result mcp_post(oq_http_t *h, req_ctx_t *ctx, struct MHD_Connection *c)
{
    oq_mcp_out_t o;
    char call_id[OQ_CALL_ID_LEN + 1];
    if (ctx->state == RS_WAITING) return MHD_YES;
    if (ctx->state == RS_DONE && ctx->mcp_phase == 0) {
        ctx->mcp_phase = 1;
        if (oq_mcp_call_submitted(ctx->mcp, ctx->refused, &o, call_id) == 0)
            return mcp_send(h, c, &o, NULL);
        memcpy(ctx->mcp_call_id, call_id, sizeof ctx->mcp_call_id);
        if (!atomic_load(&h->stopping)) /* stopping: answer the call as it stands */
            return wait_call(h, ctx, c, call_id, ctx->mcp_deadline_us);
    }
    if (ctx->state == RS_DONE) {
        oq_call_t call;
        memset(&call, 0, sizeof call);
        int rc = oq_producer_get(h->p, ctx->mcp_call_id, &call, NULL);
        oq_mcp_call_answer(ctx->mcp, rc, &call, &o);
        oq_call_clear(&call);
        char timing[48];
        return mcp_send(h, c, &o, server_timing(ctx, timing));
    }
    if (ctx->too_big) return send_error_ex(h, c, 413, "payload_too_large", "body too large", 1);
    oq_mcp_in_t in;
    mcp_in(h, ctx, c, &in);
    ctx->mcp_deadline_us = oq_mono_us() + oq_mcp_wait_ms(h->mcp) * 1000;
    int r = oq_mcp_post(h->mcp, &in, ctx->body, ctx->len, h->max_depth, &ctx->mcp, &o);
    if (r == 0) return mcp_send(h, c, &o, NULL);
    if (r == 2) { /* tasks/get, tasks/result: the call is read as after a tools/call's wait */
        int wait;
        snprintf(ctx->mcp_call_id, sizeof ctx->mcp_call_id, "%s",
                 oq_mcp_call_task(ctx->mcp, &wait));
        ctx->mcp_phase = 1;
        ctx->state = RS_DONE;
        if (wait && !atomic_load(&h->stopping))
            return wait_call(h, ctx, c, ctx->mcp_call_id, ctx->mcp_deadline_us);
        return mcp_post(h, ctx, c);
    }
    ctx->state = RS_WAITING;
    MHD_suspend_connection(c);
    if (oq_producer_submit_async(h->p, oq_mcp_call_job(ctx->mcp), job_done, ctx) != 0) {
        ctx->refused = 1; /* not queued: the callback will not run */
        ctx->state = RS_DONE;
        MHD_resume_connection(c);
    }
    return MHD_YES;
}

/* --- dispatch --------------------------------------------------------------------------------*/

typedef struct hdr_count {
    int host, key, auth;
} hdr_count_t;

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value)
{
    hdr_count_t *n = cls;
    (void)kind;
    (void)value;
    if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0)
        n->host++;
    else if (strcasecmp(key, "Idempotency-Key") == 0)
        n->key++;
    else if (strcasecmp(key, MHD_HTTP_HEADER_AUTHORIZATION) == 0)
        n->auth++;
    return MHD_YES;
}

#define CALLS_PREFIX "/v1/tool-calls"
#define BYKEY_PREFIX "/v1/tool-calls/by-key/"
#define TASKS_PREFIX "/v1/tasks"
#define TASKS_BYKEY_PREFIX "/v1/tasks/by-key/"

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
        ctx->is_mcp = is_post && strcmp(url, "/mcp") == 0;
        ctx->is_task = is_post && strcmp(url, TASKS_PREFIX) == 0;
        ctx->is_review = is_post && review_url(url, ctx->review_id);
        ctx->is_submit = is_post && (strcmp(url, CALLS_PREFIX) == 0 || ctx->is_mcp ||
                                     ctx->is_task || ctx->is_review);
        *con_cls = ctx;
        atomic_fetch_add(&h->inflight, 1);
        /* a POST answered before its body was read closes the connection */
        int close = is_post;
        hdr_count_t n = {0, 0, 0};
        MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &n);
        ctx->n_key = n.key;
        if (strcmp(version, MHD_HTTP_VERSION_1_1) == 0 && n.host != 1)
            return send_error_ex(h, c, 400, "bad_request",
                                 n.host ? "more than one Host header"
                                        : "an HTTP/1.1 request needs a Host header",
                                 close);
        if (h->token_file && (strncmp(url, "/v1/", 4) == 0 || strcmp(url, "/mcp") == 0)) {
            auth_result_t a = check_bearer(h, c, n.auth, &h->tokens, ctx->tenant, &ctx->roles);
            if (a != AUTH_OK) return send_unauthorized(h, c, a, close);
            ctx->authed = 1;
        }
        if (ctx->is_review && h->token_file && !(ctx->roles & OQ_TOKEN_ROLE_OPERATOR))
            return send_error_ex(h, c, 403, "forbidden",
                                 "deciding on a task needs a token with the operator role "
                                 "(TOKEN TENANT operator in the token file): nothing changed",
                                 close);
        if (ctx->is_review && !content_type_json(c))
            return send_error_ex(h, c, 415, "unsupported_media_type",
                                 "send the decision as Content-Type: application/json", close);
        if (strcmp(url, "/metrics") == 0 || strcmp(url, "/stats") == 0) {
            if (h->metrics_access == OQ_HTTP_METRICS_LOOPBACK && !oq_mhd_client_is_loopback(c))
                return send_error_ex(h, c, 403, "forbidden",
                                     "/metrics and /stats answer loopback clients only "
                                     "(--metrics-access)",
                                     close);
            if (h->metrics_access == OQ_HTTP_METRICS_TOKEN) {
                auth_result_t a = check_bearer(h, c, n.auth, &h->metrics_tokens, NULL, NULL);
                if (a != AUTH_OK) return send_unauthorized(h, c, a, close);
            }
        }
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
        if (ctx->is_mcp) return mcp_post(h, ctx, c);
        if (ctx->is_review) {
            if (ctx->state == RS_DONE) return review_finish(h, ctx, c);
            if (ctx->state == RS_WAITING) return MHD_YES;
            return review_begin(h, ctx, c);
        }
        if (ctx->is_task) {
            if (ctx->state == RS_DONE) return task_finish(h, ctx, c);
            if (ctx->state == RS_WAITING) return MHD_YES;
            return task_begin(h, ctx, c);
        }
        if (ctx->state == RS_DONE) return submit_finish(h, ctx, c);
        if (ctx->state == RS_WAITING) return MHD_YES; /* spurious call while suspended */
        return submit_begin(h, ctx, c);
    }
    if (*upload_size) { /* ignore bodies of other requests */
        *upload_size = 0;
        return MHD_YES;
    }
    if (ctx->state == RS_WAITING) return MHD_YES; /* a long poll, suspended */

    if (strcmp(url, "/healthz") == 0) {
        if (!is_get) return method_not_allowed(h, c, "GET, HEAD");
        return send_text(h, c, 200, strdup("{\"status\":\"ok\"}"), 15, "application/json", NULL, 0,
                         0, NULL, NULL);
    }
    if (strcmp(url, "/readyz") == 0) {
        if (!is_get) return method_not_allowed(h, c, "GET, HEAD");
        return get_readyz(h, c);
    }
    if (strcmp(url, "/stats") == 0) {
        if (!is_get) return method_not_allowed(h, c, "GET, HEAD");
        return get_stats(h, c);
    }
    if (strcmp(url, "/metrics") == 0) {
        if (!is_get) return method_not_allowed(h, c, "GET, HEAD");
        return get_metrics(h, c);
    }
    if (strcmp(url, CALLS_PREFIX) == 0) return method_not_allowed(h, c, "POST");
    if (strcmp(url, TASKS_PREFIX) == 0) return method_not_allowed(h, c, "POST");
    if (strncmp(url, TASKS_PREFIX "/", strlen(TASKS_PREFIX) + 1) == 0) {
        char rid[REVIEW_ID_MAX + 1];
        if (review_url(url, rid)) return method_not_allowed(h, c, "POST");
        if (!is_get) return method_not_allowed(h, c, "GET, HEAD");
        if (strncmp(url, TASKS_BYKEY_PREFIX, strlen(TASKS_BYKEY_PREFIX)) == 0) {
            const char *key = url + strlen(TASKS_BYKEY_PREFIX);
            if (!oq_envelope_valid_key(key))
                return send_error(h, c, 400, "invalid_idempotency_key", "bad key in path");
            return get_task(h, ctx, c, NULL, key);
        }
        const char *id = url + strlen(TASKS_PREFIX) + 1;
        if (strlen(id) != OQ_CALL_ID_LEN || strncmp(id, "t_", 2) != 0)
            return send_error(h, c, 404, "not_found", "no such task");
        return get_task(h, ctx, c, id, NULL);
    }
    if (strcmp(url, "/mcp") == 0) { /* no SSE stream of server messages: GET is 405 */
        if (strcmp(method, MHD_HTTP_METHOD_DELETE) != 0)
            return method_not_allowed(h, c, "POST, DELETE");
        oq_mcp_in_t in;
        oq_mcp_out_t o;
        mcp_in(h, ctx, c, &in);
        oq_mcp_delete(h->mcp, &in, &o);
        return mcp_send(h, c, &o, NULL);
    }
    if (strcmp(url, "/v1/tools") == 0) {
        if (!is_get) return method_not_allowed(h, c, "GET, HEAD");
        if (!h->tools_json)
            return send_error(h, c, 404, "not_found",
                              "no tool catalogue: the producer runs without --tools");
        char *t = strdup(h->tools_json);
        return t ? send_text(h, c, 200, t, strlen(t), "application/json", NULL, 0, 0, NULL, NULL)
                 : MHD_NO;
    }
    if (strncmp(url, BYKEY_PREFIX, strlen(BYKEY_PREFIX)) == 0) {
        const char *key = url + strlen(BYKEY_PREFIX);
        if (!is_get) return method_not_allowed(h, c, "GET, HEAD");
        if (!oq_envelope_valid_key(key))
            return send_error(h, c, 400, "invalid_idempotency_key", "bad key in path");
        return get_call(h, ctx, c, NULL, key);
    }
    if (strncmp(url, CALLS_PREFIX "/", strlen(CALLS_PREFIX) + 1) == 0) {
        const char *id = url + strlen(CALLS_PREFIX) + 1;
        if (!is_get) return method_not_allowed(h, c, "GET, HEAD");
        if (!oq_call_id_valid(id)) return send_error(h, c, 404, "not_found", "no such call");
        return get_call(h, ctx, c, id, NULL);
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
    /* a waiter is armed only while suspended, and libmicrohttpd ends no suspended request
     * before MHD_stop_daemon (oq_http_stop wakes them all first): this is a safety net */
    if (ctx->waited && oq_waiters_cancel(h->waiters, &ctx->waiter)) oq_gauge_add(h->m_waiting, -1);
    oq_submit_job_destroy(ctx->job);
    oq_mcp_call_free(ctx->mcp);
    oq_task_job_destroy(ctx->task_job);
    oq_task_review_job_destroy(ctx->review_job);
    free(ctx->body);
    free(ctx);
    *con_cls = NULL;
    atomic_fetch_sub(&h->inflight, 1);
}

/* Each connection is a descriptor: make room for max_conns of them (plus the database,
 * Kafka and log files) in RLIMIT_NOFILE, or lower the limit to what the process may open. */
static unsigned fit_fd_limit(unsigned max_conns)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)max_conns + 128;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need) return max_conns;
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) rl.rlim_cur = old;
    if (rl.rlim_cur >= need) return max_conns;
    unsigned fit = rl.rlim_cur > 256 ? (unsigned)(rl.rlim_cur - 128) : 128;
    OQ_LOG_WARN("http",
                "max_connections=%u needs %llu descriptors but RLIMIT_NOFILE is %llu: using %u",
                max_conns, (unsigned long long)need, (unsigned long long)rl.rlim_cur, fit);
    return fit;
}

static void http_free(oq_http_t *h)
{
    if (!h) return;
    oq_mhd_guard_destroy(h->guard);
    oq_tokens_free(h->tokens);
    oq_tokens_free(h->metrics_tokens);
    free(h->token_file);
    free(h->metrics_token_file);
    free(h->tools_json);
    oq_mcp_destroy(h->mcp);
    pthread_rwlock_destroy(&h->tok_lock);
    oq_ready_destroy(h->ready); /* joins the prober: then its connections are free */
    if (h->probe_sqlite) sqlite3_close_v2(h->probe_sqlite);
    if (h->probe_pg) PQfinish(h->probe_pg);
    pthread_mutex_destroy(&h->ready_lock);
    free(h);
}

static void register_metrics(oq_http_t *h)
{
    oq_metrics_t *m = h->metrics;
    if (!m) return;
    const char *help = "HTTP responses by status class";
    h->m_2xx = oq_metrics_counter(m, "onceq_http_responses_total", help, "class=\"2xx\"");
    h->m_4xx = oq_metrics_counter(m, "onceq_http_responses_total", help, "class=\"4xx\"");
    h->m_5xx = oq_metrics_counter(m, "onceq_http_responses_total", help, "class=\"5xx\"");
    h->m_conns = oq_metrics_gauge(m, "onceq_http_connections", "open HTTP connections", NULL);
    help = "HTTP connections closed at accept because a limit was reached";
    h->m_refused_global = oq_metrics_counter(m, "onceq_http_connections_refused_total", help,
                                             "reason=\"max_connections\"");
    h->m_refused_ip = oq_metrics_counter(m, "onceq_http_connections_refused_total", help,
                                         "reason=\"max_connections_per_ip\"");
    h->m_auth_fail = oq_metrics_counter(m, "onceq_http_auth_failures_total",
                                        "requests refused with 401 (no or an unknown token)", NULL);
    h->m_waiting =
        oq_metrics_gauge(m, "onceq_http_waiting_requests",
                         "GET ...?wait= requests waiting for their call to settle", NULL);
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
    if (opts->metrics_access == OQ_HTTP_METRICS_TOKEN && !opts->metrics_token_file)
        return oq_error_set(err, OQ_EINVAL, 0,
                            "metrics access by token needs a metrics token file");

    oq_http_t *h = calloc(1, sizeof *h);
    if (!h) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    pthread_rwlock_init(&h->tok_lock, NULL);
    pthread_mutex_init(&h->ready_lock, NULL);
    h->p = p;
    h->waiters = oq_producer_waiters(p);
    h->ingest = opts->ingest;
    h->webhooks = opts->webhooks;
    h->max_body = opts->max_body > 0 ? opts->max_body : 1024 * 1024;
    h->max_depth = opts->max_depth > 0 ? opts->max_depth : 32;
    h->metrics = opts->metrics;
    h->max_conns =
        fit_fd_limit(opts->max_conns > 0 ? (unsigned)opts->max_conns : DEFAULT_MAX_CONNS);
    h->max_conns_per_ip = opts->max_conns_per_ip < 0    ? 0
                          : opts->max_conns_per_ip == 0 ? DEFAULT_MAX_CONNS_PER_IP
                                                        : (unsigned)opts->max_conns_per_ip;
    int idle_ms = opts->idle_timeout_ms > 0 ? opts->idle_timeout_ms : DEFAULT_IDLE_TIMEOUT_MS;
    unsigned idle_s = (unsigned)((idle_ms + 999) / 1000); /* libmicrohttpd counts seconds */
    h->metrics_access = opts->metrics_access;
    register_metrics(h);
    if ((opts->token_file && !(h->token_file = strdup(opts->token_file))) ||
        (opts->metrics_token_file && !(h->metrics_token_file = strdup(opts->metrics_token_file)))) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto fail;
    }
    if ((ret = oq_http_reload(h, err)) != 0) goto fail;
    if ((h->catalog = opts->catalog)) {
        json_t *list = oq_catalog_list(h->catalog);
        json_t *body = list ? json_pack("{s:o}", "tools", list) : NULL;
        h->tools_json = body ? oq_json_dumps(body, JSON_COMPACT) : NULL;
        json_decref(body);
        if (!h->tools_json) {
            ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            goto fail;
        }
    }

    if ((ret = oq_mcp_new(h->catalog, opts->mcp_wait_ms, &h->mcp, err)) != 0) goto fail;

    unsigned probe_slots = opts->probe_slots < 0    ? 0
                           : opts->probe_slots == 0 ? DEFAULT_PROBE_SLOTS
                                                    : (unsigned)opts->probe_slots;
    /* at least --threads, and enough that no thread holds 128 connections (oq_mhd.h) */
    unsigned threads = oq_mhd_pool_threads(h->max_conns + probe_slots,
                                           (unsigned)(opts->threads >= 2 ? opts->threads : 2));
    unsigned room = oq_mhd_pool_room(threads);
    if (h->max_conns + probe_slots > room) {
        unsigned fit = room > probe_slots + 1 ? room - probe_slots : 1;
        OQ_LOG_WARN("http", "max_connections=%u needs more than %u HTTP threads: using %u",
                    h->max_conns, threads, fit);
        h->max_conns = fit;
    }
    oq_mhd_guard_opts_t go = {
        .component = "http",
        .max_conns = h->max_conns,
        .max_conns_per_ip = h->max_conns_per_ip,
        .probe_slots = probe_slots,
        .request_timeout_ms =
            opts->request_timeout_ms > 0 ? opts->request_timeout_ms : DEFAULT_REQUEST_TIMEOUT_MS,
        .handler = handler,
        .handler_cls = h,
        .completed = completed,
        .completed_cls = h,
        .m_conns = h->m_conns,
        .m_refused_global = h->m_refused_global,
        .m_refused_ip = h->m_refused_ip,
    };
    if (!(h->guard = oq_mhd_guard_new(&go, h->metrics, err))) {
        ret = err ? err->code : OQ_EIO;
        goto fail;
    }
    /* GET /readyz: common/ready.c probes the checks above once a second (started before the
     * daemon answers its first /readyz); the gauge keeps the producer's name, onceq_http_ready */
    if (!(h->ready = oq_ready_new_gauge("http", h->metrics, "onceq_http_ready")) ||
        oq_ready_add(h->ready, "database", check_database, h) != 0 ||
        oq_ready_add(h->ready, "kafka", check_kafka, h) != 0) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto fail;
    }
    if ((ret = oq_ready_start(h->ready, err)) != 0) goto fail;
    h->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
            MHD_USE_ERROR_LOG,
        (uint16_t)port, OQ_MHD_GUARD_DAEMON_ARGS(h->guard),
        /* the logger first: libmicrohttpd warns about options parsed before it */
        MHD_OPTION_EXTERNAL_LOGGER, oq_mhd_log, (void *)&mhd_log_ctx, MHD_OPTION_SOCK_ADDR, &sa,
        MHD_OPTION_UNESCAPE_CALLBACK, oq_mhd_unescape, NULL, MHD_OPTION_THREAD_POOL_SIZE, threads,
        OQ_MHD_GUARD_OPTIONS(h->guard),
        /* past ours (see oq_mhd_guard_mhd_limit): the guard, not a worker that stopped
         * listening, decides */
        MHD_OPTION_CONNECTION_LIMIT, oq_mhd_guard_mhd_limit(h->guard, threads),
        MHD_OPTION_CONNECTION_TIMEOUT, idle_s, MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
        /* the pool is zeroed on every keep-alive request: keep it small;
         * bodies stream through the upload callback anyway */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)16384, MHD_OPTION_END);
    if (!h->d) {
        ret = oq_error_set(err, OQ_EIO, 0, "cannot listen on %s:%d", host, port);
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : port;
    static const char *const access_names[] = {"loopback", "open", "token"};
    OQ_LOG_INFO("http",
                "listening on %s:%d threads=%u max_body=%lld max_connections=%u "
                "max_connections_per_ip=%u idle_timeout_s=%u request_timeout_ms=%lld "
                "probe_slots=%u auth=%s metrics_access=%s",
                host, h->port, threads, (long long)h->max_body, h->max_conns, h->max_conns_per_ip,
                idle_s, (long long)go.request_timeout_ms, go.probe_slots,
                h->token_file ? "tokens" : "off",
                access_names[(unsigned)h->metrics_access < 3 ? h->metrics_access : 0]);
    *out = h;
    return 0;
fail:
    http_free(h);
    return ret;
}

int oq_http_port(const oq_http_t *h)
{
    return h->port;
}

void oq_http_stop(oq_http_t *h, int drain_ms)
{
    if (!h) return;
    MHD_socket ls = MHD_quiesce_daemon(h->d);
    /* long polls: answered now with the call as it stands, and no new ones */
    atomic_store(&h->stopping, 1);
    size_t woken = oq_waiters_wake_all(h->waiters, h);
    if (woken) OQ_LOG_INFO("http", "stopping: %zu waiting requests answered", woken);
    int64_t deadline = oq_mono_us() + (int64_t)drain_ms * 1000;
    while (atomic_load(&h->inflight) > 0 && oq_mono_us() < deadline)
        oq_sleep_ms(10, NULL);
    if (atomic_load(&h->inflight) > 0)
        OQ_LOG_WARN("http", "stopping with %d requests still in progress",
                    atomic_load(&h->inflight));
    MHD_stop_daemon(h->d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    http_free(h);
}
