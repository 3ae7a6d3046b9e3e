/*
 * submit.c: the producer object, submit preparation and the group-commit writer.
 *
 * Design. A durable commit (fsync of the WAL) costs 0.2-0.6 ms here, so a transaction per
 * submit tops out near 3,500/s. Instead, every submitter (blocking API caller or suspended
 * HTTP connection) hands a prepared job to ONE writer thread through a mutex-protected queue.
 * The writer takes everything queued (up to max_batch), runs each job's decision and inserts
 * inside one BEGIN IMMEDIATE transaction, commits once, and only then completes the jobs: no
 * submit is acknowledged before its batch is durable, and there is one fsync per batch. Batch
 * size follows the offered concurrency by itself: while a commit runs, the next batch queues.
 *
 * Commit delay. Closed-loop clients (HTTP keep-alive connections, threads calling the blocking
 * API) come back right after their answer; without care they split into two groups that
 * alternate (one commits while the other queues), so every submit waits two fsyncs. After a
 * batch of more than one submit, the writer therefore keeps gathering while submits keep
 * arriving (gaps under 200 us), for at most the duration of the previous commit (capped at
 * 3 ms) or until max_batch: both groups share one fsync. A lone submitter never waits.
 *
 * Everything that does not need the database is done before queueing, on the submitter's
 * thread (oq_submit_job_new): validation, RFC 8785 canonical args, the fingerprint, a fresh
 * call id and message id, and the encoded envelope of attempt 1. The writer only executes
 * prepared statements.
 *
 * Failure: when a job fails with a database error inside a batch, the batch is rolled back
 * and every job of it is re-run alone in its own transaction, so one bad item cannot fail its
 * neighbours; when the commit itself fails, every job of the batch reports the error and
 * nothing of it is durable (retrying with the same key is safe).
 *
 * Results batches (oq_producer_apply_results, used by ingest.c) are jobs in the same queue:
 * they are applied in the same transaction as the submits around them, on the same
 * connection, so the process has one writer on calls.db and results cost no extra fsync.
 *
 * Checkpoints: SQLite's auto-checkpoint would copy ~1000 WAL frames into the database and fsync
 * it inside every ~45th commit, stalling that batch. The writer connection has a WAL hook
 * instead (wal_hook): a background thread on its own connection runs PASSIVE checkpoints, and
 * the writer finishes each pass with a small checkpoint of its own after acknowledging its
 * batch, so that SQLite can restart the WAL (a pass alone never catches up with the writer).
 *
 * Reads (get, stats) use a small pool of separate connections: WAL readers never wait for the
 * writer.
 */
#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oq_envelope.h"
#include "oq_log.h"
#include "producer_int.h"

typedef struct rconn {
    pthread_mutex_t mu;
    sqlite3 *db;
    oq_stmt_cache_t *cache;
} rconn_t;

struct oq_producer {
    char *path;
    int64_t key_ttl_ms;
    int max_batch;
    int commit_delay_us;
    sqlite3 *wdb;
    oq_stmt_cache_t *wcache;
    pthread_t writer;
    int writer_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    oq_submit_job_t *head, *tail;
    size_t qlen;
    int stopping;
    rconn_t *reads;
    int nreads;
    atomic_uint rr;
    oq_metrics_t *metrics;
    oq_metric_t *m_new, *m_replay, *m_conflict, *m_reset, *m_failed;
    oq_metric_t *m_batch, *m_commit, *m_wait, *m_queue, *m_batches, *m_wcpu;
    /* background checkpointer (see the file comment) */
    int ckpt_pages;
    sqlite3 *cdb;
    pthread_t ckpt;
    int ckpt_started;
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    int ckpt_wanted, ckpt_stop, ckpt_busy, ckpt_pass_done; /* under cmu */
    int wal_last, ckpt_next, finish_due;                    /* writer thread only */
    oq_metric_t *m_ckpt, *m_ckpt_fin;
};

/* --- small helpers ---------------------------------------------------------------------------*/

const char *oq_submit_outcome_name(oq_submit_outcome_t o)
{
    switch (o) {
    case OQ_SUBMIT_NEW:
        return "new";
    case OQ_SUBMIT_REPLAY:
        return "replay";
    case OQ_SUBMIT_CONFLICT:
        return "conflict";
    case OQ_SUBMIT_RETRY_RESET:
        return "retry_reset";
    }
    return "?";
}

void oq_call_clear(oq_call_t *c)
{
    if (!c) return;
    free(c->tenant);
    free(c->idem_key);
    free(c->tool);
    free(c->args);
    free(c->result);
    free(c->error);
    free(c->effect_id);
    free(c->client_id);
    memset(c, 0, sizeof *c);
}

int oq_call_state_terminal(const char *s)
{
    return s && (strcmp(s, "succeeded") == 0 || strcmp(s, "failed") == 0 ||
                 strcmp(s, "needs_review") == 0);
}

static json_t *json_text_or_null(const char *text)
{
    if (!text) return json_null();
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    return v ? v : json_string(text);
}

static json_t *time_json(int64_t ms)
{
    char buf[32];
    oq_time_format(ms, buf);
    return json_string(buf);
}

json_t *oq_call_to_json(const oq_call_t *c)
{
    char url[64];
    snprintf(url, sizeof url, "/v1/tool-calls/%s", c->call_id);
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "call_id", json_string(c->call_id));
    json_object_set_new(o, "tenant", json_string(c->tenant ? c->tenant : OQ_DEFAULT_TENANT));
    json_object_set_new(o, "idem_key", json_string(c->idem_key ? c->idem_key : ""));
    json_object_set_new(o, "fingerprint", json_string(c->fingerprint));
    json_object_set_new(o, "tool", json_string(c->tool ? c->tool : ""));
    json_object_set_new(o, "args", json_text_or_null(c->args));
    json_object_set_new(o, "status", json_string(c->state));
    json_object_set_new(o, "attempt", json_integer(c->attempt));
    json_object_set_new(o, "result", json_text_or_null(c->result));
    json_object_set_new(o, "error", json_text_or_null(c->error));
    json_object_set_new(o, "effect_id", c->effect_id ? json_string(c->effect_id) : json_null());
    json_object_set_new(o, "client_id", c->client_id ? json_string(c->client_id) : json_null());
    json_object_set_new(o, "seq", c->has_seq ? json_integer(c->seq) : json_null());
    json_object_set_new(o, "created_at", time_json(c->created_at));
    json_object_set_new(o, "updated_at", time_json(c->updated_at));
    json_object_set_new(o, "expires_at", time_json(c->expires_at));
    json_object_set_new(o, "query_url", json_string(url));
    return o;
}

int oq__valid_key(const char *s, size_t max)
{
    if (!s) return 0;
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char ch = (unsigned char)s[n];
        if (ch < 0x20 || ch > 0x7e || n >= max) return 0;
    }
    return n > 0;
}

int oq__valid_tool(const char *s)
{
    if (!s) return 0;
    size_t n = 0;
    for (; s[n]; n++) {
        char ch = s[n];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '.' || ch == ':' || ch == '-';
        if (!ok || n >= OQ_MAX_NAME_LEN) return 0;
    }
    return n > 0;
}

/* --- rendering -------------------------------------------------------------------------------*/

/* A sticky-error front end to the shared canonical writer (common/json.c, oq_jcs_put_*): the
 * first failure (out of memory; a string that is not UTF-8, which parsing already refused)
 * makes every later put a no-op and is reported once by sb_done(). Strings are escaped as
 * RFC 8785 does, so what is written for printable ASCII is also its canonical form. */
typedef struct sbuf {
    oq_jcs_buf_t b;
    int rc;
} sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (!b->rc) b->rc = oq_jcs_put_raw(&b->b, s, n, NULL);
}

static void sb_str(sbuf_t *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_qstr(sbuf_t *b, const char *s)
{
    if (!b->rc) b->rc = oq_jcs_put_string(&b->b, s, NULL);
}

/* NUL-terminates and hands the text over; on an earlier failure frees it. @returns 0 or the
 * first error. */
static int sb_done(sbuf_t *b, char **out, size_t *len)
{
    return oq_jcs_buf_finish(&b->b, b->rc, out, len, NULL);
}

static void sb_kv_str(sbuf_t *b, const char *k, const char *v)
{
    sb_str(b, k);
    if (v)
        sb_qstr(b, v);
    else
        sb_put(b, "null", 4);
}

static void sb_kv_raw(sbuf_t *b, const char *k, const char *json)
{
    sb_str(b, k);
    sb_str(b, json ? json : "null");
}

static void sb_kv_time(sbuf_t *b, const char *k, int64_t ms)
{
    char t[32];
    oq_time_format(ms, t);
    sb_str(b, k);
    sb_put(b, "\"", 1);
    sb_str(b, t);
    sb_put(b, "\"", 1);
}

int oq_call_render(const oq_call_t *c, char **out, size_t *out_len)
{
    sbuf_t b = {0};
    char num[48];
    sb_kv_str(&b, "{\"call_id\":", c->call_id);
    sb_kv_str(&b, ",\"tenant\":", c->tenant ? c->tenant : OQ_DEFAULT_TENANT);
    sb_kv_str(&b, ",\"idem_key\":", c->idem_key ? c->idem_key : "");
    sb_kv_str(&b, ",\"fingerprint\":", c->fingerprint);
    sb_kv_str(&b, ",\"tool\":", c->tool ? c->tool : "");
    sb_kv_raw(&b, ",\"args\":", c->args); /* canonical JSON text */
    sb_kv_str(&b, ",\"status\":", c->state);
    snprintf(num, sizeof num, ",\"attempt\":%lld", (long long)c->attempt);
    sb_str(&b, num);
    sb_kv_raw(&b, ",\"result\":", c->result); /* JSON text written by the ingest */
    sb_kv_raw(&b, ",\"error\":", c->error);
    sb_kv_str(&b, ",\"effect_id\":", c->effect_id);
    sb_kv_str(&b, ",\"client_id\":", c->client_id);
    if (c->has_seq) {
        snprintf(num, sizeof num, ",\"seq\":%lld", (long long)c->seq);
        sb_str(&b, num);
    } else {
        sb_str(&b, ",\"seq\":null");
    }
    sb_kv_time(&b, ",\"created_at\":", c->created_at);
    sb_kv_time(&b, ",\"updated_at\":", c->updated_at);
    sb_kv_time(&b, ",\"expires_at\":", c->expires_at);
    sb_str(&b, ",\"query_url\":\"/v1/tool-calls/");
    sb_str(&b, c->call_id);
    sb_str(&b, "\"}");
    return sb_done(&b, out, out_len) ? OQ_ENOMEM : 0;
}

/**
 * The call fingerprint from the already canonical args: RFC 8785 orders the members as
 * "args" < "tenant" < "tool", and tenant and tool are printable ASCII, whose canonical string
 * form only escapes '"' and '\\'. Equal to oq_fingerprint() (tests/unit/test_producer.c checks
 * it) without canonicalising args a second time.
 */
static int fingerprint_canon(const char *tenant, const char *tool, const char *args,
                             size_t args_len, char out[OQ_FINGERPRINT_LEN + 1], oq_error_t *err)
{
    sbuf_t b = {0};
    sb_str(&b, "{\"args\":");
    sb_put(&b, args, args_len);
    sb_str(&b, ",\"tenant\":");
    sb_qstr(&b, tenant);
    sb_str(&b, ",\"tool\":");
    sb_qstr(&b, tool);
    sb_put(&b, "}", 1);
    char *text = NULL;
    size_t len = 0;
    if (sb_done(&b, &text, &len)) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    int ok = EVP_Digest(text, len, md, &mdlen, EVP_sha256(), NULL);
    free(text);
    if (!ok || mdlen != 32) return oq_error_set(err, OQ_ECRYPTO, 0, "SHA-256 failed");
    oq_hex(md, mdlen, out);
    return 0;
}

int oq__fingerprint_canon(const char *tenant, const char *tool, const char *args, size_t args_len,
                          char out[OQ_FINGERPRINT_LEN + 1], oq_error_t *err)
{
    return fingerprint_canon(tenant, tool, args, args_len, out, err);
}

/* --- call ids --------------------------------------------------------------------------------*/

/**
 * A call id ("c_" + 16 hex, as oq_id_call) whose first 42 bits are the wall clock in ms and
 * whose last 22 bits are random. calls.call_id is a B-tree index: a random id dirties a random
 * leaf page per submit (a 4 KiB WAL frame written and fsynced by every group commit, and
 * another page write at the checkpoint), while time-ordered ids all land on the right-most
 * leaf. The random tail keeps ids of one millisecond apart; the rare collision (two ids in
 * one ms with the same 22 bits, in this or another process) is caught by the primary key at
 * insert time and the writer draws a new id (oq__job_new_call_id).
 */
static void call_id_new(char out[OQ_CALL_ID_LEN + 1])
{
    unsigned char r[3];
    oq_random_bytes_buffered(r, sizeof r);
    uint64_t ms = (uint64_t)oq_now_ms() & ((1ULL << 42) - 1);
    uint64_t v = (ms << 22) | (((uint64_t)r[0] << 16 | (uint64_t)r[1] << 8 | r[2]) & 0x3fffff);
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (56 - 8 * i));
    out[0] = 'c';
    out[1] = '_';
    oq_hex(b, sizeof b, out + 2);
}

/* --- jobs ------------------------------------------------------------------------------------*/

static int encode_first(oq_submit_job_t *job, oq_error_t *err);

void oq_submit_job_destroy(oq_submit_job_t *job)
{
    if (!job) return;
    free(job->tenant);
    free(job->idem_key);
    free(job->tool);
    free(job->args);
    free(job->client_id);
    free(job->payload);
    oq_call_clear(&job->call);
    free(job);
}

int oq_submit_job_new(const oq_submit_req_t *req, oq_submit_job_t **out, oq_error_t *err)
{
    const char *tenant = req->tenant && *req->tenant ? req->tenant : OQ_DEFAULT_TENANT;
    if (!oq__valid_key(req->idem_key, OQ_MAX_KEY_LEN))
        return oq_error_set(err, OQ_EINVAL, 0, "idempotency key must be 1-%d printable ASCII bytes",
                            OQ_MAX_KEY_LEN);
    if (!oq__valid_key(tenant, OQ_MAX_NAME_LEN))
        return oq_error_set(err, OQ_EINVAL, 0, "tenant must be 1-%d printable ASCII bytes",
                            OQ_MAX_NAME_LEN);
    if (!oq__valid_tool(req->tool))
        return oq_error_set(err, OQ_EINVAL, 0, "tool must be 1-%d bytes of [A-Za-z0-9_.:-]",
                            OQ_MAX_NAME_LEN);
    if (!req->args || !json_is_object(req->args))
        return oq_error_set(err, OQ_EINVAL, 0, "args must be a JSON object");
    if (req->client_id && !oq__valid_key(req->client_id, OQ_MAX_NAME_LEN))
        return oq_error_set(err, OQ_EINVAL, 0, "client_id must be 1-%d printable ASCII bytes",
                            OQ_MAX_NAME_LEN);

    int ret = 0;
    oq_submit_job_t *job = calloc(1, sizeof *job);
    if (!job) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    job->tenant = strdup(tenant);
    job->idem_key = strdup(req->idem_key);
    job->tool = strdup(req->tool);
    job->client_id = req->client_id ? strdup(req->client_id) : NULL;
    if (!job->tenant || !job->idem_key || !job->tool || (req->client_id && !job->client_id)) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    job->seq = req->seq;
    job->has_seq = req->has_seq;
    if ((ret = oq_jcs_canonicalize(req->args, &job->args, &job->args_len, err))) goto out;
    if ((ret = fingerprint_canon(job->tenant, job->tool, job->args, job->args_len, job->fingerprint,
                                 err)))
        goto out;
    call_id_new(job->call_id);
    oq_id_uuid(job->message_id);
    job->created_at = oq_now_ms();
    ret = encode_first(job, err);
out:
    if (ret) {
        oq_submit_job_destroy(job);
        return ret;
    }
    *out = job;
    return 0;
}

/**
 * The envelope of attempt 1 into job->payload, rendered straight from the canonical args text:
 * the same bytes as oq_envelope_encode() (RFC 8785: members in code-point order, and tenant,
 * idem_key and tool are printable ASCII, whose canonical string form only escapes '"' and
 * '\\'), without building, validating and re-canonicalising a jansson tree on every submit.
 * tests/unit/test_producer.c compares the two.
 */
static int encode_first(oq_submit_job_t *job, oq_error_t *err)
{
    sbuf_t b = {0};
    char num[32];
    sb_str(&b, "{\"args\":");
    sb_put(&b, job->args, job->args_len);
    sb_str(&b, ",\"attempt\":1,\"call_id\":\"");
    sb_str(&b, job->call_id);
    snprintf(num, sizeof num, "\",\"created_at\":%lld", (long long)job->created_at);
    sb_str(&b, num);
    sb_str(&b, ",\"fingerprint\":\"");
    sb_str(&b, job->fingerprint);
    sb_str(&b, "\",\"idem_key\":");
    sb_qstr(&b, job->idem_key);
    sb_str(&b, ",\"kind\":\"tool_call\",\"message_id\":\"");
    sb_str(&b, job->message_id);
    sb_str(&b, "\",\"tenant\":");
    sb_qstr(&b, job->tenant);
    sb_str(&b, ",\"tool\":");
    sb_qstr(&b, job->tool);
    sb_str(&b, ",\"v\":1}");
    char *payload = NULL;
    size_t len = 0;
    if (sb_done(&b, &payload, &len)) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    free(job->payload);
    job->payload = payload;
    job->payload_len = len;
    return 0;
}

int oq__job_new_call_id(oq_submit_job_t *job, oq_error_t *err)
{
    call_id_new(job->call_id);
    oq_id_uuid(job->message_id);
    return encode_first(job, err);
}

void oq__job_finish_new(oq_submit_job_t *job)
{
    if (!job->call_from_job) return;
    oq_call_t *c = &job->call;
    memcpy(c->call_id, job->call_id, sizeof c->call_id);
    memcpy(c->fingerprint, job->fingerprint, sizeof c->fingerprint);
    snprintf(c->state, sizeof c->state, "pending");
    c->attempt = 1;
    c->tenant = job->tenant;
    c->idem_key = job->idem_key;
    c->tool = job->tool;
    c->args = job->args;
    c->client_id = job->client_id;
    c->seq = job->seq;
    c->has_seq = job->has_seq;
    job->tenant = job->idem_key = job->tool = job->args = job->client_id = NULL;
    job->call_from_job = 0;
}

int oq_submit_job_result(const oq_submit_job_t *job, oq_submit_outcome_t *outcome,
                         const oq_call_t **call, oq_error_t *err)
{
    if (outcome) *outcome = job->outcome;
    if (call) *call = &job->call;
    if (err) *err = job->err;
    return job->rc;
}

/* --- writer ----------------------------------------------------------------------------------*/

static int is_db_error(int rc)
{
    return rc == OQ_EDB || rc == OQ_EBUSY || rc == OQ_ENOMEM || rc == OQ_EIO;
}

static void count_outcome(oq_producer_t *p, oq_submit_job_t *j)
{
    if (j->rc == 0 || j->rc == OQ_ECONFLICT) {
        switch (j->outcome) {
        case OQ_SUBMIT_NEW:
            oq_counter_add(p->m_new, 1);
            break;
        case OQ_SUBMIT_REPLAY:
            oq_counter_add(p->m_replay, 1);
            break;
        case OQ_SUBMIT_CONFLICT:
            oq_counter_add(p->m_conflict, 1);
            break;
        case OQ_SUBMIT_RETRY_RESET:
            oq_counter_add(p->m_reset, 1);
            break;
        }
    } else {
        oq_counter_add(p->m_failed, 1);
    }
}

/** A results batch inside the open transaction. @returns 0 or a database error. */
static int apply_results(oq_producer_t *p, oq_submit_job_t *j, int64_t now)
{
    for (int k = 0; k < j->nenv; k++) {
        oq_result_outcome_t oc = 0;
        int rc = oq__store_apply_result(p->wdb, p->wcache, &j->envs[k], now, &oc, &j->err);
        if (rc == OQ_EINVAL) { /* not a tool_result with a known status: refused, not written */
            oq_error_clear(&j->err);
            oc = 0;
        } else if (rc) {
            return rc;
        }
        j->outcomes[k] = oc;
    }
    return 0;
}

/** Run \p n jobs in one transaction. @returns 0, or the batch-level error (all jobs failed). */
static int run_batch(oq_producer_t *p, oq_submit_job_t **jobs, int n, int *item_failed)
{
    oq_error_t err = {0};
    int64_t now = oq_now_ms();
    *item_failed = 0;
    int ret = oq_db_begin_immediate(p->wdb, 10000, &err);
    if (ret) goto fail;
    for (int i = 0; i < n; i++) {
        oq_submit_job_t *j = jobs[i];
        oq_error_clear(&j->err);
        if (j->envs)
            j->rc = apply_results(p, j, now);
        else
            j->rc = oq__store_submit(p->wdb, p->wcache, j, now, p->key_ttl_ms, &j->err);
        if (is_db_error(j->rc)) {
            *item_failed = 1;
            err = j->err;
            ret = j->rc;
            oq_db_rollback(p->wdb);
            goto fail;
        }
    }
    int64_t t0 = oq_mono_us();
    ret = oq_db_commit(p->wdb, &err);
    oq_histogram_observe(p->m_commit, (double)(oq_mono_us() - t0) / 1e6);
    if (ret) {
        oq_db_rollback(p->wdb);
        goto fail;
    }
    for (int i = 0; i < n; i++)
        oq__job_finish_new(jobs[i]);
    return 0;
fail:
    OQ_LOG_WARN("producer", "batch of %d failed: %s", n, err.msg);
    for (int i = 0; i < n; i++) {
        jobs[i]->rc = ret;
        jobs[i]->err = err;
        jobs[i]->call_from_job = 0;
        oq_call_clear(&jobs[i]->call);
    }
    return ret;
}

static void abs_deadline(struct timespec *ts, int64_t us_from_now)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += us_from_now / 1000000;
    ts->tv_nsec += (long)(us_from_now % 1000000) * 1000;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/** Commit delay (see the file comment). Called with p->mu held and a non-empty queue. */
static void gather(oq_producer_t *p, int last_n, int64_t last_commit_us)
{
    if (p->commit_delay_us < 0 || last_n <= 1) return;
    int64_t max_us = p->commit_delay_us > 0 ? p->commit_delay_us
                                            : (last_commit_us < 3000 ? last_commit_us : 3000);
    int64_t end = oq_mono_us() + max_us;
    while (!p->stopping && p->qlen < (size_t)p->max_batch) {
        int64_t left = end - oq_mono_us();
        if (left <= 0) break;
        size_t before = p->qlen;
        struct timespec ts;
        abs_deadline(&ts, left < 200 ? left : 200);
        while (p->qlen == before && !p->stopping &&
               pthread_cond_timedwait(&p->cv, &p->mu, &ts) == 0) {
        }
        if (p->qlen == before) break; /* nobody came within the gap: go */
    }
}

/* --- checkpointer ----------------------------------------------------------------------------*/

/**
 * WAL hook of the writer connection (it replaces SQLite's auto-checkpoint there), called after
 * each commit with the WAL's size in frames. Past ckpt_next frames it wakes the background
 * checkpointer, which copies the WAL into the database without holding up the writer. That
 * pass cannot complete the WAL, since the writer keeps appending meanwhile, and SQLite only
 * restarts the WAL from its beginning once every frame has been copied; so after a pass the
 * writer copies the few frames appended during it itself (oq__finish_checkpoint, after the
 * batch was acknowledged) and its next transaction restarts the WAL. When readers keep the WAL
 * from being copied completely, the next pass waits for ckpt_pages more frames.
 * @locality writer thread, inside COMMIT
 */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int frames)
{
    oq_producer_t *p = arg;
    (void)db;
    (void)name;
    if (frames < p->wal_last) p->ckpt_next = p->ckpt_pages; /* the WAL restarted */
    p->wal_last = frames;
    pthread_mutex_lock(&p->cmu);
    if (p->ckpt_pass_done) {
        p->ckpt_pass_done = 0;
        p->finish_due = 1;
        p->ckpt_next = frames + p->ckpt_pages;
    } else if (!p->ckpt_busy && frames >= p->ckpt_next) {
        p->ckpt_busy = 1;
        p->ckpt_wanted = 1;
        pthread_cond_signal(&p->ccv);
    }
    pthread_mutex_unlock(&p->cmu);
    return SQLITE_OK;
}

/** The writer's small checkpoint after a background pass (see wal_hook). @locality writer */
static void finish_checkpoint(oq_producer_t *p)
{
    p->finish_due = 0;
    int64_t t0 = oq_mono_us();
    int log = 0, done = 0;
    int rc = sqlite3_wal_checkpoint_v2(p->wdb, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
    oq_histogram_observe(p->m_ckpt_fin, (double)(oq_mono_us() - t0) / 1e6);
    if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_BUSY)
        OQ_LOG_WARN("producer", "checkpoint: %s", sqlite3_errmsg(p->wdb));
}

static void *ckpt_main(void *arg)
{
    oq_producer_t *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->cmu);
        while (!p->ckpt_wanted && !p->ckpt_stop)
            pthread_cond_wait(&p->ccv, &p->cmu);
        int stop = p->ckpt_stop;
        p->ckpt_wanted = 0;
        pthread_mutex_unlock(&p->cmu);
        if (stop) break;
        int64_t t0 = oq_mono_us();
        int log = 0, done = 0;
        /* PASSIVE: copies what no reader still needs, never takes the write lock, so the
         * writer keeps committing meanwhile; SQLite restarts the WAL at the writer's next
         * transaction once everything was copied. */
        int rc = sqlite3_wal_checkpoint_v2(p->cdb, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
        oq_histogram_observe(p->m_ckpt, (double)(oq_mono_us() - t0) / 1e6);
        pthread_mutex_lock(&p->cmu);
        p->ckpt_busy = 0;
        p->ckpt_pass_done = 1;
        pthread_mutex_unlock(&p->cmu);
        if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_BUSY)
            OQ_LOG_WARN("producer", "checkpoint: %s", sqlite3_errmsg(p->cdb));
        else
            OQ_LOG_DEBUG("producer", "checkpoint: wal=%d copied=%d in %lld us", log, done,
                         (long long)(oq_mono_us() - t0));
    }
    return NULL;
}

static void *writer_main(void *arg)
{
    oq_producer_t *p = arg;
    int cap = p->max_batch;
    int last_n = 0;
    int64_t last_commit_us = 0;
    oq_submit_job_t **jobs = calloc((size_t)cap, sizeof *jobs);
    if (!jobs) abort();
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->head && !p->stopping)
            pthread_cond_wait(&p->cv, &p->mu);
        if (!p->head) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        gather(p, last_n, last_commit_us);
        int n = 0;
        while (p->head && n < cap) {
            jobs[n++] = p->head;
            p->head = p->head->next;
            p->qlen--;
        }
        if (!p->head) p->tail = NULL;
        oq_gauge_set(p->m_queue, (double)p->qlen);
        pthread_mutex_unlock(&p->mu);

        int item_failed = 0;
        struct timespec c0, c1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        int64_t t_batch = oq_mono_us();
        int rc = run_batch(p, jobs, n, &item_failed);
        last_commit_us = oq_mono_us() - t_batch;
        last_n = n;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        oq_gauge_add(p->m_wcpu,
                     (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9);
        if (rc && item_failed && n > 1) {
            /* Isolate the bad item: each job alone. */
            for (int i = 0; i < n; i++) {
                int dummy;
                run_batch(p, &jobs[i], 1, &dummy);
            }
        }
        OQ_CRASH_POINT("producer.after_commit_before_reply");
        oq_counter_add(p->m_batches, 1);
        oq_histogram_observe(p->m_batch, (double)n);
        int64_t now_us = oq_mono_us();
        for (int i = 0; i < n; i++) {
            oq_submit_job_t *j = jobs[i];
            if (!j->envs) {
                count_outcome(p, j);
                oq_histogram_observe(p->m_wait, (double)(now_us - j->enq_us) / 1e6);
            }
            j->next = NULL;
            j->cb(j, j->opaque);
        }
        if (p->finish_due) finish_checkpoint(p);
    }
    free(jobs);
    return NULL;
}

int oq_producer_submit_async(oq_producer_t *p, oq_submit_job_t *job, oq_submit_done_cb cb,
                             void *opaque)
{
    job->cb = cb;
    job->opaque = opaque;
    job->next = NULL;
    job->enq_us = oq_mono_us();
    pthread_mutex_lock(&p->mu);
    if (p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return OQ_ESHUTDOWN;
    }
    if (p->tail)
        p->tail->next = job;
    else
        p->head = job;
    p->tail = job;
    p->qlen++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} waiter_t;

static void waiter_done(oq_submit_job_t *job, void *opaque)
{
    (void)job;
    waiter_t *w = opaque;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void move_call(oq_call_t *dst, oq_call_t *src)
{
    *dst = *src;
    memset(src, 0, sizeof *src);
}

int oq_producer_submit(oq_producer_t *p, const oq_submit_req_t *req, oq_call_t *call,
                       oq_submit_outcome_t *outcome, oq_error_t *err)
{
    oq_submit_job_t *job = NULL;
    int ret = oq_submit_job_new(req, &job, err);
    if (ret) return ret;
    waiter_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    if ((ret = oq_producer_submit_async(p, job, waiter_done, &w))) {
        oq_submit_job_destroy(job);
        return oq_error_set(err, ret, 0, "producer is shutting down");
    }
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    ret = job->rc;
    if (err && ret) *err = job->err;
    if (outcome) *outcome = job->outcome;
    if (call) move_call(call, &job->call);
    oq_submit_job_destroy(job);
    return ret;
}

int oq_producer_apply_results(oq_producer_t *p, const oq_envelope_t *envs, int n,
                              oq_result_outcome_t *outcomes, oq_error_t *err)
{
    if (n <= 0) return 0;
    oq_submit_job_t job;
    memset(&job, 0, sizeof job);
    job.envs = envs;
    job.nenv = n;
    job.outcomes = outcomes;
    waiter_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    int ret = oq_producer_submit_async(p, &job, waiter_done, &w);
    if (ret) return oq_error_set(err, ret, 0, "producer is shutting down");
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    if (job.rc && err) *err = job.err;
    return job.rc;
}

int oq_producer_submit_in_tx(sqlite3 *db, const oq_submit_req_t *req, int64_t key_ttl_ms,
                             oq_call_t *call, oq_submit_outcome_t *outcome, oq_error_t *err)
{
    if (sqlite3_get_autocommit(db))
        return oq_error_set(err, OQ_ESTATE, 0,
                            "oq_producer_submit_in_tx needs an open transaction (BEGIN IMMEDIATE)");
    oq_submit_job_t *job = NULL;
    int ret = oq_submit_job_new(req, &job, err);
    if (ret) return ret;
    ret = oq__store_submit(db, NULL, job, oq_now_ms(),
                           key_ttl_ms > 0 ? key_ttl_ms : OQ_DEFAULT_KEY_TTL_MS, err);
    if (ret == 0) oq__job_finish_new(job);
    if (outcome) *outcome = job->outcome;
    if (call && (ret == 0 || ret == OQ_ECONFLICT)) move_call(call, &job->call);
    oq_submit_job_destroy(job);
    return ret;
}

int oq_producer_migrate(sqlite3 *db, oq_error_t *err)
{
    return oq_db_migrate(db, oq_migrations_producer, err);
}

/* --- open / close ----------------------------------------------------------------------------*/

static void register_metrics(oq_producer_t *p)
{
    oq_metrics_t *m = p->metrics;
    if (!m) return;
    const char *h = "Submits by outcome";
    p->m_new = oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"new\"");
    p->m_replay = oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"replay\"");
    p->m_conflict =
        oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"conflict\"");
    p->m_reset =
        oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"retry_reset\"");
    p->m_failed = oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"error\"");
    p->m_batches =
        oq_metrics_counter(m, "onceq_producer_batches_total", "Group-commit transactions", NULL);
    static const double bsz[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    p->m_batch = oq_metrics_histogram(m, "onceq_producer_batch_size", "Submits per group commit",
                                      NULL, bsz, sizeof bsz / sizeof bsz[0]);
    static const double lat[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                 0.01,   0.025,   0.05,   0.1,   0.5,    1};
    p->m_commit = oq_metrics_histogram(m, "onceq_producer_commit_seconds",
                                       "Duration of a group COMMIT (fsync)", NULL, lat,
                                       sizeof lat / sizeof lat[0]);
    p->m_wait =
        oq_metrics_histogram(m, "onceq_producer_submit_seconds", "Queue + batch time of a submit",
                             NULL, lat, sizeof lat / sizeof lat[0]);
    p->m_ckpt = oq_metrics_histogram(m, "onceq_producer_checkpoint_seconds",
                                     "Duration of a background WAL checkpoint pass", NULL,
                                     lat, sizeof lat / sizeof lat[0]);
    p->m_ckpt_fin = oq_metrics_histogram(m, "onceq_producer_checkpoint_finish_seconds",
                                         "Duration of the writer's checkpoint after a pass",
                                         NULL, lat, sizeof lat / sizeof lat[0]);
    p->m_queue =
        oq_metrics_gauge(m, "onceq_producer_queue_depth", "Submits waiting for the writer", NULL);
    /* a gauge only because counters take integers; it only grows */
    p->m_wcpu = oq_metrics_gauge(m, "onceq_producer_writer_cpu_seconds",
                                 "CPU time of the writer thread in batches (SQL + commit)", NULL);
}

int oq_producer_open(const char *path, const oq_producer_opts_t *opts, oq_producer_t **out,
                     oq_error_t *err)
{
    oq_producer_opts_t o;
    memset(&o, 0, sizeof o);
    if (opts) o = *opts;
    int ret = 0;
    oq_producer_t *p = calloc(1, sizeof *p);
    if (!p) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    p->path = strdup(path);
    p->key_ttl_ms = o.key_ttl_ms > 0 ? o.key_ttl_ms : OQ_DEFAULT_KEY_TTL_MS;
    p->max_batch = o.max_batch > 0 ? o.max_batch : 256;
    p->nreads = o.read_conns > 0 ? o.read_conns : 4;
    p->metrics = o.metrics;
    p->commit_delay_us = o.commit_delay_us;
    p->ckpt_pages = o.checkpoint_pages == 0 ? 1000 : o.checkpoint_pages;
    p->ckpt_next = p->ckpt_pages;
    pthread_mutex_init(&p->cmu, NULL);
    pthread_cond_init(&p->ccv, NULL);
    if (!p->path) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    oq_db_opts_t dbo = {o.synchronous, 0, 0};
    if ((ret = oq_db_open(path, &dbo, &p->wdb, err))) goto out;
    if ((ret = oq_db_migrate(p->wdb, oq_migrations_producer, err))) goto out;
    p->wcache = oq_stmt_cache_new(p->wdb);
    p->reads = calloc((size_t)p->nreads, sizeof *p->reads);
    if (!p->wcache || !p->reads) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    for (int i = 0; i < p->nreads; i++) {
        pthread_mutex_init(&p->reads[i].mu, NULL);
        oq_db_opts_t ro = {o.synchronous, 0, 1};
        if ((ret = oq_db_open(path, &ro, &p->reads[i].db, err))) goto out;
        p->reads[i].cache = oq_stmt_cache_new(p->reads[i].db);
        if (!p->reads[i].cache) {
            ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            goto out;
        }
    }
    register_metrics(p);
    if (p->ckpt_pages > 0) {
        oq_db_opts_t co = {o.synchronous, 0, 0};
        if ((ret = oq_db_open(path, &co, &p->cdb, err))) goto out;
        sqlite3_wal_hook(p->wdb, wal_hook, p); /* also turns the in-commit checkpoint off */
        if (pthread_create(&p->ckpt, NULL, ckpt_main, p) != 0) {
            ret = oq_error_set(err, OQ_EIO, errno, "cannot start the checkpointer thread");
            goto out;
        }
        p->ckpt_started = 1;
        pthread_setname_np(p->ckpt, "oq-ckpt"); /* top -H, perf; failure harmless */
    }
    if (pthread_create(&p->writer, NULL, writer_main, p) != 0) {
        ret = oq_error_set(err, OQ_EIO, errno, "cannot start the writer thread");
        goto out;
    }
    p->writer_started = 1;
    pthread_setname_np(p->writer, "oq-writer");
out:
    if (ret) {
        oq_producer_close(p);
        return ret;
    }
    *out = p;
    return 0;
}

void oq_producer_close(oq_producer_t *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (p->writer_started) pthread_join(p->writer, NULL);
    pthread_mutex_lock(&p->cmu);
    p->ckpt_stop = 1;
    pthread_cond_signal(&p->ccv);
    pthread_mutex_unlock(&p->cmu);
    if (p->ckpt_started) pthread_join(p->ckpt, NULL);
    if (p->cdb) sqlite3_close_v2(p->cdb);
    pthread_mutex_destroy(&p->cmu);
    pthread_cond_destroy(&p->ccv);
    for (int i = 0; p->reads && i < p->nreads; i++) {
        oq_stmt_cache_destroy(p->reads[i].cache);
        if (p->reads[i].db) sqlite3_close_v2(p->reads[i].db);
        pthread_mutex_destroy(&p->reads[i].mu);
    }
    free(p->reads);
    oq_stmt_cache_destroy(p->wcache);
    if (p->wdb) sqlite3_close_v2(p->wdb);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->path);
    free(p);
}

/* --- reads -----------------------------------------------------------------------------------*/

static rconn_t *rconn_acquire(oq_producer_t *p)
{
    unsigned start = atomic_fetch_add(&p->rr, 1);
    for (int i = 0; i < p->nreads; i++) {
        rconn_t *r = &p->reads[(start + (unsigned)i) % (unsigned)p->nreads];
        if (pthread_mutex_trylock(&r->mu) == 0) return r;
    }
    rconn_t *r = &p->reads[start % (unsigned)p->nreads];
    pthread_mutex_lock(&r->mu);
    return r;
}

int oq_producer_get(oq_producer_t *p, const char *call_id, oq_call_t *out, oq_error_t *err)
{
    rconn_t *r = rconn_acquire(p);
    int ret = oq__store_get(r->db, r->cache, call_id, out, err);
    pthread_mutex_unlock(&r->mu);
    return ret;
}

int oq_producer_get_by_key(oq_producer_t *p, const char *tenant, const char *idem_key,
                           oq_call_t *out, oq_error_t *err)
{
    rconn_t *r = rconn_acquire(p);
    int ret = oq__store_get_by_key(r->db, r->cache, tenant, idem_key, out, err);
    pthread_mutex_unlock(&r->mu);
    return ret;
}

int oq_producer_stats(oq_producer_t *p, json_t **out, oq_error_t *err)
{
    rconn_t *r = rconn_acquire(p);
    int ret = oq_store_stats(r->db, out, err);
    pthread_mutex_unlock(&r->mu);
    return ret;
}

oq_metrics_t *oq_producer_metrics(oq_producer_t *p)
{
    return p->metrics;
}
const char *oq_producer_path(const oq_producer_t *p)
{
    return p->path;
}
int64_t oq_producer_key_ttl(const oq_producer_t *p)
{
    return p->key_ttl_ms;
}
