/*
 * store.c: every SQL statement of the producer (calls, outbox append, result_inbox, audit,
 * stats, purge), so that a second backend (PostgreSQL) can be written beside this file.
 *
 * Nothing here opens or commits a transaction on behalf of the submit path: the caller (the
 * group-commit writer, or a service using oq_producer_submit_in_tx) owns the transaction. The
 * submit decision reads the (tenant, idem_key) row inside that write transaction, so two
 * submits of one key in one batch see each other (the second is a replay), and no other
 * writer can interleave (BEGIN IMMEDIATE). Reads (get, stats, audit) run on any connection.
 * Purge owns its short transactions itself: a bounded batch each, so the writer's lock wait is
 * bounded too.
 *
 * Applying a tool_result is on the ingest hot path, so it does the least per message: a narrow
 * read of the call (state, attempt) decides the outcome, then one INSERT OR IGNORE into
 * result_inbox records the message with that final outcome. A message_id already there stops
 * everything (duplicate: nothing else is written); the read before the insert is safe because
 * both run in the caller's write transaction. Only then is the call updated and the audit row
 * written, its JSON detail composed directly (strings escaped as jansson escapes them).
 *
 * Statements come from an oq_stmt_cache_t when the caller has one (the writer, the readers)
 * and are prepared per call otherwise (the in-transaction API on a caller's connection).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "oq_envelope.h"
#include "oq_log.h"
#include "producer_int.h"

#define CALL_COLS                                                                                  \
    "call_id,tenant,idem_key,fingerprint,tool,args,state,result,error,attempt,effect_id,"          \
    "client_id,seq,created_at,updated_at,expires_at"

static const char SQL_GET_BY_KEY[] =
    "SELECT " CALL_COLS " FROM calls WHERE tenant=?1 AND idem_key=?2";
static const char SQL_GET_BY_ID[] = "SELECT " CALL_COLS " FROM calls WHERE call_id=?1";
static const char SQL_INSERT_CALL[] =
    "INSERT INTO calls(call_id,tenant,idem_key,fingerprint,tool,args,state,attempt,client_id,"
    "seq,created_at,updated_at,expires_at) VALUES(?1,?2,?3,?4,?5,?6,'pending',1,?7,?8,?9,?9,?10) "
    "ON CONFLICT(tenant,idem_key) DO NOTHING";
static const char SQL_RESET_CALL[] =
    "UPDATE calls SET state='pending',attempt=attempt+1,result=NULL,error=NULL,updated_at=?2,"
    "expires_at=?3 WHERE call_id=?1 AND state='failed'";
static const char SQL_DELETE_CALL[] = "DELETE FROM calls WHERE call_id=?1";
static const char SQL_DELETE_AUDIT[] = "DELETE FROM audit WHERE call_id=?1";
static const char SQL_DELETE_INBOX[] = "DELETE FROM result_inbox WHERE call_id=?1";
static const char SQL_AUDIT[] = "INSERT INTO audit(ts,call_id,event,detail) VALUES(?1,?2,?3,?4)";
static const char SQL_INBOX_INSERT[] =
    "INSERT OR IGNORE INTO result_inbox(message_id,call_id,status,outcome,received_at) "
    "VALUES(?1,?2,?3,?4,?5)";
static const char SQL_RESULT_TARGET[] = "SELECT state,attempt FROM calls WHERE call_id=?1";
static const char SQL_APPLY_RESULT[] =
    "UPDATE calls SET state=?2,result=?3,error=?4,effect_id=COALESCE(?5,effect_id),"
    "updated_at=?6 WHERE call_id=?1";

/* --- statement helpers ---------------------------------------------------------------------- */

static sqlite3_stmt *st_get(sqlite3 *db, oq_stmt_cache_t *cache, const char *sql, oq_error_t *err)
{
    if (cache) return oq_stmt_get(cache, sql, err);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) {
        oq_db_error(db, rc, err, "prepare");
        return NULL;
    }
    return st;
}

static void st_done(oq_stmt_cache_t *cache, sqlite3_stmt *st)
{
    if (!st) return;
    if (cache) {
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
    } else {
        sqlite3_finalize(st);
    }
}

static void bind_text(sqlite3_stmt *st, int i, const char *s)
{
    if (s)
        sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

/** Run a statement expecting no rows. */
static int st_exec(sqlite3 *db, sqlite3_stmt *st, oq_error_t *err, const char *what)
{
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) return oq_db_error(db, rc, err, what);
    return 0;
}

static char *col_strdup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

static int read_call(sqlite3_stmt *st, oq_call_t *c)
{
    memset(c, 0, sizeof *c);
    const char *id = (const char *)sqlite3_column_text(st, 0);
    snprintf(c->call_id, sizeof c->call_id, "%s", id ? id : "");
    c->tenant = col_strdup(st, 1);
    c->idem_key = col_strdup(st, 2);
    const char *fp = (const char *)sqlite3_column_text(st, 3);
    snprintf(c->fingerprint, sizeof c->fingerprint, "%s", fp ? fp : "");
    c->tool = col_strdup(st, 4);
    c->args = col_strdup(st, 5);
    const char *state = (const char *)sqlite3_column_text(st, 6);
    snprintf(c->state, sizeof c->state, "%s", state ? state : "");
    c->result = col_strdup(st, 7);
    c->error = col_strdup(st, 8);
    c->attempt = sqlite3_column_int64(st, 9);
    c->effect_id = col_strdup(st, 10);
    c->client_id = col_strdup(st, 11);
    c->has_seq = sqlite3_column_type(st, 12) != SQLITE_NULL;
    c->seq = sqlite3_column_int64(st, 12);
    c->created_at = sqlite3_column_int64(st, 13);
    c->updated_at = sqlite3_column_int64(st, 14);
    c->expires_at = sqlite3_column_int64(st, 15);
    if (!c->tenant || !c->idem_key || !c->tool || !c->args) {
        oq_call_clear(c);
        return OQ_ENOMEM;
    }
    return 0;
}

/* --- reads ---------------------------------------------------------------------------------- */

int oq__store_get(sqlite3 *db, oq_stmt_cache_t *cache, const char *call_id, oq_call_t *out,
                  oq_error_t *err)
{
    sqlite3_stmt *st = st_get(db, cache, SQL_GET_BY_ID, err);
    if (!st) return err ? err->code : OQ_EDB;
    bind_text(st, 1, call_id);
    int rc = sqlite3_step(st), ret;
    if (rc == SQLITE_ROW)
        ret = read_call(st, out);
    else if (rc == SQLITE_DONE)
        ret = oq_error_set(err, OQ_ENOTFOUND, 0, "no call %s", call_id);
    else
        ret = oq_db_error(db, rc, err, "get call");
    st_done(cache, st);
    return ret;
}

int oq__store_get_by_key(sqlite3 *db, oq_stmt_cache_t *cache, const char *tenant,
                         const char *idem_key, oq_call_t *out, oq_error_t *err)
{
    sqlite3_stmt *st = st_get(db, cache, SQL_GET_BY_KEY, err);
    if (!st) return err ? err->code : OQ_EDB;
    bind_text(st, 1, tenant && *tenant ? tenant : OQ_DEFAULT_TENANT);
    bind_text(st, 2, idem_key);
    int rc = sqlite3_step(st), ret;
    if (rc == SQLITE_ROW)
        ret = read_call(st, out);
    else if (rc == SQLITE_DONE)
        ret = oq_error_set(err, OQ_ENOTFOUND, 0, "no call for key");
    else
        ret = oq_db_error(db, rc, err, "get call by key");
    st_done(cache, st);
    return ret;
}

int oq_store_get(sqlite3 *db, const char *call_id, oq_call_t *out, oq_error_t *err)
{
    return oq__store_get(db, NULL, call_id, out, err);
}

int oq_store_get_by_key(sqlite3 *db, const char *tenant, const char *idem_key, oq_call_t *out,
                        oq_error_t *err)
{
    return oq__store_get_by_key(db, NULL, tenant, idem_key, out, err);
}

static int count_query(sqlite3 *db, const char *sql, int64_t *out, oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(db, rc, err, "prepare stats");
    rc = sqlite3_step(st);
    int ret = 0;
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(st, 0);
    else
        ret = oq_db_error(db, rc, err, "stats");
    sqlite3_finalize(st);
    return ret;
}

int oq_store_stats(sqlite3 *db, json_t **out, oq_error_t *err)
{
    static const char *const states[] = {"pending", "running", "succeeded", "failed",
                                         "needs_review"};
    int ret = 0;
    json_t *o = json_object(), *by = json_object();
    sqlite3_stmt *st = NULL;
    if (!o || !by) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    /* A read transaction so that the numbers are one snapshot. */
    int rc = sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        ret = oq_db_error(db, rc, err, "begin");
        goto out;
    }
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        json_object_set_new(by, states[i], json_integer(0));
    /* Only rows that left 'pending' are in an index (calls_settled, see
     * schema/producer/0002_calls_hot_path.sql): pending = all - the others. */
    int64_t total = 0, settled = 0;
    if ((ret = count_query(db, "SELECT count(*) FROM calls", &total, err))) goto out_tx;
    rc = sqlite3_prepare_v2(
        db, "SELECT state,count(*) FROM calls WHERE state<>'pending' GROUP BY state", -1, &st,
        NULL);
    if (rc != SQLITE_OK) {
        ret = oq_db_error(db, rc, err, "prepare stats");
        goto out_tx;
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t n = sqlite3_column_int64(st, 1);
        json_object_set_new(by, (const char *)sqlite3_column_text(st, 0), json_integer(n));
        settled += n;
    }
    if (rc != SQLITE_DONE) {
        ret = oq_db_error(db, rc, err, "stats");
        goto out_tx;
    }
    json_object_set_new(by, "pending", json_integer(total - settled));
    int64_t effects = 0, outbox_pending = 0, outbox_total = 0, inbox = 0, oldest = 0;
    if ((ret = count_query(
             db, "SELECT count(DISTINCT effect_id) FROM calls WHERE effect_id IS NOT NULL",
             &effects, err)) ||
        (ret = count_query(db, "SELECT count(*) FROM outbox_unpublished", &outbox_pending,
                           err)) ||
        (ret = count_query(db, "SELECT count(*) FROM outbox", &outbox_total, err)) ||
        (ret = count_query(db, "SELECT count(*) FROM result_inbox", &inbox, err)) ||
        (ret =
             count_query(db, "SELECT COALESCE(min(created_at),0) FROM calls WHERE state='pending'",
                         &oldest, err)))
        goto out_tx;
    json_object_set_new(o, "calls", json_integer(total));
    json_object_set_new(o, "effects", json_integer(effects));
    json_object_set(o, "by_status", by);
    json_object_set_new(o, "outbox_pending", json_integer(outbox_pending));
    json_object_set_new(o, "outbox_rows", json_integer(outbox_total));
    json_object_set_new(o, "result_inbox", json_integer(inbox));
    json_object_set_new(o, "oldest_pending_age_ms",
                        json_integer(oldest ? oq_now_ms() - oldest : 0));
out_tx:
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
out:
    sqlite3_finalize(st);
    json_decref(by);
    if (ret) {
        json_decref(o);
        return ret;
    }
    *out = o;
    return 0;
}

int oq_store_audit(sqlite3 *db, const char *call_id, oq_audit_row_t **rows, size_t *n,
                   oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    oq_audit_row_t *v = NULL;
    size_t cnt = 0, cap = 0;
    int ret = 0;
    int rc = sqlite3_prepare_v2(
        db, "SELECT ts,event,detail FROM audit WHERE call_id=?1 ORDER BY id", -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(db, rc, err, "prepare audit");
    bind_text(st, 1, call_id);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (cnt == cap) {
            size_t ncap = cap ? cap * 2 : 8;
            oq_audit_row_t *nv = realloc(v, ncap * sizeof *nv);
            if (!nv) {
                ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
                goto out;
            }
            v = nv;
            cap = ncap;
        }
        v[cnt].ts = sqlite3_column_int64(st, 0);
        v[cnt].event = col_strdup(st, 1);
        v[cnt].detail = col_strdup(st, 2);
        cnt++;
    }
    if (rc != SQLITE_DONE) ret = oq_db_error(db, rc, err, "audit");
out:
    sqlite3_finalize(st);
    if (ret) {
        oq_audit_free(v, cnt);
        return ret;
    }
    *rows = v;
    *n = cnt;
    return 0;
}

void oq_audit_free(oq_audit_row_t *rows, size_t n)
{
    for (size_t i = 0; rows && i < n; i++) {
        free(rows[i].event);
        free(rows[i].detail);
    }
    free(rows);
}

/* --- writes --------------------------------------------------------------------------------- */

static int audit_add(sqlite3 *db, oq_stmt_cache_t *cache, int64_t ts, const char *call_id,
                     const char *event, const char *detail, oq_error_t *err)
{
    sqlite3_stmt *st = st_get(db, cache, SQL_AUDIT, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_int64(st, 1, ts);
    bind_text(st, 2, call_id);
    bind_text(st, 3, event);
    bind_text(st, 4, detail);
    int ret = st_exec(db, st, err, "insert audit");
    st_done(cache, st);
    return ret;
}

static int exec_id(sqlite3 *db, oq_stmt_cache_t *cache, const char *sql, const char *id,
                   oq_error_t *err)
{
    sqlite3_stmt *st = st_get(db, cache, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    bind_text(st, 1, id);
    int ret = st_exec(db, st, err, "delete");
    st_done(cache, st);
    return ret;
}

/** Is the stored error JSON marked retryable? */
static int error_retryable(const char *error_json)
{
    if (!error_json) return 0;
    json_t *e = json_loads(error_json, 0, NULL);
    int r = e && json_is_true(json_object_get(e, "retryable"));
    json_decref(e);
    return r;
}

/** New outbox row for attempt \p attempt of an existing call (retry-reset path). */
static int append_attempt(sqlite3 *db, oq_stmt_cache_t *cache, const oq_call_t *c, int64_t attempt,
                          int64_t now_ms, oq_error_t *err)
{
    oq_envelope_t e;
    memset(&e, 0, sizeof e);
    json_t *args = NULL;
    char *payload = NULL;
    size_t plen = 0;
    int ret;
    if ((ret = oq_json_parse(c->args, strlen(c->args), 0, &args, err))) goto out;
    e.v = OQ_ENVELOPE_VERSION;
    e.kind = OQ_KIND_TOOL_CALL;
    oq_id_uuid(e.message_id);
    snprintf(e.call_id, sizeof e.call_id, "%s", c->call_id);
    e.tenant = c->tenant;
    e.idem_key = c->idem_key;
    snprintf(e.fingerprint, sizeof e.fingerprint, "%s", c->fingerprint);
    e.tool = c->tool;
    e.attempt = attempt;
    e.created_at = now_ms;
    e.args = args;
    if ((ret = oq_envelope_encode(&e, &payload, &plen, err))) goto out;
    oq_outbox_row_t row = {e.message_id, OQ_TOPIC_CALLS, c->call_id, payload, plen, now_ms};
    ret = oq_outbox_append(db, cache, &row, err);
out:
    free(payload);
    json_decref(args);
    return ret;
}

/**
 * Insert the job's call and its outbox row. The insert does nothing when the key exists
 * (ON CONFLICT DO NOTHING): then *exists is set and nothing is written, so the common case,
 * a new key, costs one probe of the key index instead of a SELECT and then an INSERT.
 */
static int insert_new(sqlite3 *db, oq_stmt_cache_t *cache, oq_submit_job_t *job, int64_t now_ms,
                      int64_t ttl, int *exists, oq_error_t *err)
{
    *exists = 0;
    sqlite3_stmt *st;
    int ret, tries = 0;
again:
    st = st_get(db, cache, SQL_INSERT_CALL, err);
    if (!st) return err ? err->code : OQ_EDB;
    bind_text(st, 1, job->call_id);
    bind_text(st, 2, job->tenant);
    bind_text(st, 3, job->idem_key);
    bind_text(st, 4, job->fingerprint);
    bind_text(st, 5, job->tool);
    sqlite3_bind_text(st, 6, job->args, (int)job->args_len, SQLITE_STATIC);
    bind_text(st, 7, job->client_id);
    if (job->has_seq)
        sqlite3_bind_int64(st, 8, job->seq);
    else
        sqlite3_bind_null(st, 8);
    sqlite3_bind_int64(st, 9, now_ms);
    sqlite3_bind_int64(st, 10, now_ms + ttl);
    int rc = sqlite3_step(st);
    ret = rc == SQLITE_DONE ? 0 : oq_db_error(db, rc, err, "insert call");
    st_done(cache, st);
    if (rc == SQLITE_CONSTRAINT_PRIMARYKEY && tries++ < 3) {
        /* The time-ordered call id collided (same ms, same random tail): the key itself was
         * looked up above, so only call_id can clash. The statement aborted alone; the
         * transaction is intact. */
        oq_error_clear(err);
        OQ_LOG_INFO("producer", "call id %s already taken: drawing another", job->call_id);
        if ((ret = oq__job_new_call_id(job, err))) return ret;
        goto again;
    }
    if (ret) return ret;
    if (sqlite3_changes(db) == 0) {
        *exists = 1;
        return 0;
    }
    oq_outbox_row_t row = {job->message_id, OQ_TOPIC_CALLS,   job->call_id,
                           job->payload,    job->payload_len, now_ms};
    if ((ret = oq_outbox_append(db, cache, &row, err))) return ret;
    job->outcome = OQ_SUBMIT_NEW;
    job->call_from_job = 1;
    job->call.created_at = job->call.updated_at = now_ms;
    job->call.expires_at = now_ms + ttl;
    return 0;
}

int oq__store_submit(sqlite3 *db, oq_stmt_cache_t *cache, oq_submit_job_t *job, int64_t now_ms,
                     int64_t ttl, oq_error_t *err)
{
    oq_call_clear(&job->call);
    job->call_from_job = 0;
    oq_call_t *c = &job->call;
    int exists = 0;
    int ret = insert_new(db, cache, job, now_ms, ttl, &exists, err);
    if (ret || !exists) return ret;
    ret = oq__store_get_by_key(db, cache, job->tenant, job->idem_key, c, err);
    if (ret == OQ_ENOTFOUND) /* cannot happen inside the write transaction */
        ret = oq_error_set(err, OQ_EDB, 0, "key vanished inside the transaction");
    if (ret) return ret;

    int terminal = oq_call_state_terminal(c->state);
    if (terminal && c->expires_at <= now_ms) {
        /* Past retention and finished: the key starts over as a new call (as after a purge). */
        OQ_LOGC_INFO("producer", c->call_id, "expired key reused: old call replaced");
        if ((ret = exec_id(db, cache, SQL_DELETE_AUDIT, c->call_id, err)) ||
            (ret = exec_id(db, cache, SQL_DELETE_INBOX, c->call_id, err)) ||
            (ret = exec_id(db, cache, SQL_DELETE_CALL, c->call_id, err)))
            return ret;
        oq_call_clear(c);
        if ((ret = insert_new(db, cache, job, now_ms, ttl, &exists, err))) return ret;
        return exists ? oq_error_set(err, OQ_EDB, 0, "expired call not replaced") : 0;
    }
    if (strcmp(c->fingerprint, job->fingerprint) != 0) {
        job->outcome = OQ_SUBMIT_CONFLICT;
        return oq_error_set(err, OQ_ECONFLICT, 0,
                            "idempotency key reused with a different request (call %s)",
                            c->call_id);
    }
    if (strcmp(c->state, "failed") == 0 && error_retryable(c->error)) {
        sqlite3_stmt *st = st_get(db, cache, SQL_RESET_CALL, err);
        if (!st) return err ? err->code : OQ_EDB;
        bind_text(st, 1, c->call_id);
        sqlite3_bind_int64(st, 2, now_ms);
        sqlite3_bind_int64(st, 3, now_ms + ttl);
        ret = st_exec(db, st, err, "reset call");
        st_done(cache, st);
        if (ret) return ret;
        int64_t attempt = c->attempt + 1;
        if ((ret = append_attempt(db, cache, c, attempt, now_ms, err))) return ret;
        char detail[96];
        snprintf(detail, sizeof detail, "{\"attempt\":%lld}", (long long)attempt);
        if ((ret = audit_add(db, cache, now_ms, c->call_id, "retry_reset", detail, err)))
            return ret;
        snprintf(c->state, sizeof c->state, "pending");
        c->attempt = attempt;
        free(c->result);
        free(c->error);
        c->result = c->error = NULL;
        c->updated_at = now_ms;
        c->expires_at = now_ms + ttl;
        job->outcome = OQ_SUBMIT_RETRY_RESET;
        OQ_LOGC_INFO("producer", c->call_id, "retryable failure resubmitted attempt=%lld",
                     (long long)attempt);
        return 0;
    }
    job->outcome = OQ_SUBMIT_REPLAY;
    return 0;
}

/* --- audit detail JSON --------------------------------------------------------------------- */

/* The detail of an applied result: {"from":…,"attempt":…,"message_id":…,"effect_id":…|null
 * [,"error":…]}, written without building a JSON tree; \p error_json is the error as stored in
 * calls.error. @returns malloc()ed text, or NULL (out of memory, or a string that is not
 * UTF-8: the detail is then stored as NULL, as when json_pack() refused such input). */
static char *applied_detail(const char *from, const oq_envelope_t *env, const char *error_json)
{
    oq_jcs_buf_t b = {0};
    oq_error_t e = {0};
    char *out = NULL;
    int rc = oq_jcs_put_raw(&b, "{\"from\":", 8, &e);
    if (!rc) rc = oq_jcs_put_string(&b, from, &e);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"attempt\":", 11, &e);
    if (!rc) rc = oq_jcs_put_int(&b, env->attempt, &e);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"message_id\":", 14, &e);
    if (!rc) rc = oq_jcs_put_string(&b, env->message_id, &e);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"effect_id\":", 13, &e);
    if (!rc)
        rc = env->effect_id ? oq_jcs_put_string(&b, env->effect_id, &e)
                            : oq_jcs_put_raw(&b, "null", 4, &e);
    if (!rc && error_json) {
        rc = oq_jcs_put_raw(&b, ",\"error\":", 9, &e);
        if (!rc) rc = oq_jcs_put_raw(&b, error_json, strlen(error_json), &e);
    }
    if (!rc) rc = oq_jcs_put_raw(&b, "}", 1, &e);
    return oq_jcs_buf_finish(&b, rc, &out, NULL, &e) ? NULL : out;
}

/* The detail of a result not applied: {"status":…,"attempt":…,"reason":…,"message_id":…}
 * (every string escaped: the public oq_store_apply_result() takes any message id). */
static char *ignored_detail(const oq_envelope_t *env, const char *why)
{
    oq_jcs_buf_t b = {0};
    oq_error_t e = {0};
    char *out = NULL;
    int rc = oq_jcs_put_raw(&b, "{\"status\":", 10, &e);
    if (!rc) rc = oq_jcs_put_string(&b, env->status, &e);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"attempt\":", 11, &e);
    if (!rc) rc = oq_jcs_put_int(&b, env->attempt, &e);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"reason\":", 10, &e);
    if (!rc) rc = oq_jcs_put_string(&b, why, &e);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"message_id\":", 14, &e);
    if (!rc) rc = oq_jcs_put_string(&b, env->message_id, &e);
    if (!rc) rc = oq_jcs_put_raw(&b, "}", 1, &e);
    return oq_jcs_buf_finish(&b, rc, &out, NULL, &e) ? NULL : out;
}

/* --- results -------------------------------------------------------------------------------- */

const char *oq_result_outcome_name(oq_result_outcome_t o)
{
    switch (o) {
    case OQ_RESULT_APPLIED:
        return "applied";
    case OQ_RESULT_DUPLICATE:
        return "duplicate";
    case OQ_RESULT_UNKNOWN_CALL:
        return "unknown_call";
    case OQ_RESULT_STALE:
        return "stale";
    case OQ_RESULT_IGNORED:
        return "ignored";
    }
    return "?";
}

static int valid_result_status(const char *s)
{
    return s && (strcmp(s, "running") == 0 || strcmp(s, "succeeded") == 0 ||
                 strcmp(s, "failed") == 0 || strcmp(s, "needs_review") == 0);
}

int oq_store_apply_result(sqlite3 *db, const oq_envelope_t *env, int64_t now_ms,
                          oq_result_outcome_t *outcome, oq_error_t *err)
{
    return oq__store_apply_result(db, NULL, env, now_ms, outcome, err);
}

/** The call's state and attempt, all a result decision needs; *found = 0 when there is no call.
 *  @returns 0 or a database error. */
static int read_target(sqlite3 *db, oq_stmt_cache_t *cache, const char *call_id, char *state,
                       size_t state_size, int64_t *attempt, int *found, oq_error_t *err)
{
    sqlite3_stmt *st = st_get(db, cache, SQL_RESULT_TARGET, err);
    if (!st) return err ? err->code : OQ_EDB;
    bind_text(st, 1, call_id);
    int rc = sqlite3_step(st), ret = 0;
    *found = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW) {
        const char *s = (const char *)sqlite3_column_text(st, 0);
        snprintf(state, state_size, "%s", s ? s : "");
        *attempt = sqlite3_column_int64(st, 1);
    } else if (rc != SQLITE_DONE) {
        ret = oq_db_error(db, rc, err, "get call");
    }
    st_done(cache, st);
    return ret;
}

int oq__store_apply_result(sqlite3 *db, oq_stmt_cache_t *cache, const oq_envelope_t *env,
                           int64_t now_ms, oq_result_outcome_t *outcome, oq_error_t *err)
{
    if (env->kind != OQ_KIND_TOOL_RESULT || !valid_result_status(env->status))
        return oq_error_set(err, OQ_EINVAL, 0, "not a tool_result with a known status");
    char state[sizeof(((oq_call_t *)0)->state)] = "";
    int64_t attempt = 0;
    int found = 0;
    oq_result_outcome_t oc = OQ_RESULT_APPLIED;
    const char *why = NULL;

    /* Decide first (the write transaction makes read-then-insert atomic)... */
    int ret = read_target(db, cache, env->call_id, state, sizeof state, &attempt, &found, err);
    if (ret) return ret;
    if (!found) {
        oc = OQ_RESULT_UNKNOWN_CALL;
        why = "unknown call";
    } else if (env->attempt != attempt) {
        oc = OQ_RESULT_STALE;
        why = env->attempt < attempt ? "stale attempt" : "attempt ahead of the call";
    } else if (oq_call_state_terminal(state)) {
        oc = OQ_RESULT_IGNORED;
        why = "call already terminal";
    } else if (strcmp(env->status, "running") == 0 && strcmp(state, "running") == 0) {
        oc = OQ_RESULT_IGNORED;
        why = "already running";
    }

    /* ...then claim the message id with the final outcome: a duplicate does nothing at all. */
    sqlite3_stmt *st = st_get(db, cache, SQL_INBOX_INSERT, err);
    if (!st) return err ? err->code : OQ_EDB;
    bind_text(st, 1, env->message_id);
    bind_text(st, 2, env->call_id);
    bind_text(st, 3, env->status);
    bind_text(st, 4, oq_result_outcome_name(oc));
    sqlite3_bind_int64(st, 5, now_ms);
    ret = st_exec(db, st, err, "insert result_inbox");
    st_done(cache, st);
    if (ret) return ret;
    if (sqlite3_changes(db) == 0) {
        *outcome = OQ_RESULT_DUPLICATE;
        return 0;
    }

    if (why) {
        OQ_LOGC_WARN("producer", env->call_id,
                     "result not applied: %s (status=%s attempt=%lld message_id=%s)", why,
                     env->status, (long long)env->attempt, env->message_id);
        if (oc != OQ_RESULT_UNKNOWN_CALL) {
            char *detail = ignored_detail(env, why);
            ret = audit_add(db, cache, now_ms, env->call_id, "result_ignored", detail, err);
            free(detail);
            if (ret)
                return ret;
        }
        *outcome = oc;
        return 0;
    }

    char *result = env->result ? json_dumps(env->result, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *error = env->error ? json_dumps(env->error, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *detail = NULL;
    st = st_get(db, cache, SQL_APPLY_RESULT, err);
    if (!st) {
        ret = err ? err->code : OQ_EDB;
        goto out;
    }
    bind_text(st, 1, env->call_id);
    bind_text(st, 2, env->status);
    bind_text(st, 3, result);
    bind_text(st, 4, error);
    bind_text(st, 5, env->effect_id);
    sqlite3_bind_int64(st, 6, now_ms);
    ret = st_exec(db, st, err, "apply result");
    st_done(cache, st);
    if (ret) goto out;
    detail = applied_detail(state, env, error);
    if ((ret = audit_add(db, cache, now_ms, env->call_id, env->status, detail, err))) goto out;
    *outcome = OQ_RESULT_APPLIED;
    OQ_LOGC_DEBUG("producer", env->call_id, "result applied %s -> %s", state, env->status);
out:
    free(detail);
    free(result);
    free(error);
    return ret;
}

/* --- purge ---------------------------------------------------------------------------------- */

static int purge_batch(sqlite3 *db, int64_t now_ms, int64_t ttl, int batch, oq_purge_stats_t *s,
                       int *more, oq_error_t *err)
{
    int ret;
    *more = 0;
    if ((ret = oq_db_begin_immediate(db, 10000, err))) return ret;
    /* Keep the ids of this batch in a temp table so the dependent deletes use indexes. */
    char sql[512];
    snprintf(sql, sizeof sql,
             "CREATE TEMP TABLE IF NOT EXISTS purge_ids(call_id TEXT PRIMARY KEY);"
             "DELETE FROM temp.purge_ids;"
             "INSERT INTO temp.purge_ids SELECT call_id FROM calls WHERE expires_at<=%lld AND "
             "state IN ('succeeded','failed','needs_review') ORDER BY expires_at LIMIT %d;",
             (long long)now_ms, batch);
    if ((ret = oq_db_exec(db, sql, err))) goto fail;
    int64_t n = 0;
    if ((ret = count_query(db, "SELECT count(*) FROM temp.purge_ids", &n, err))) goto fail;
    if (n > 0) {
        if ((ret = oq_db_exec(db,
                              "DELETE FROM audit WHERE call_id IN (SELECT call_id FROM "
                              "temp.purge_ids)",
                              err)))
            goto fail;
        s->audit += sqlite3_changes(db);
        if ((ret = oq_db_exec(db,
                              "DELETE FROM result_inbox WHERE call_id IN (SELECT call_id FROM "
                              "temp.purge_ids)",
                              err)))
            goto fail;
        s->result_inbox += sqlite3_changes(db);
        if ((ret = oq_db_exec(db,
                              "DELETE FROM calls WHERE call_id IN (SELECT call_id FROM "
                              "temp.purge_ids)",
                              err)))
            goto fail;
        s->calls += sqlite3_changes(db);
    }
    /* Published rows (at or below the relay's watermark, schema/common/0002) past the key
     * TTL, among the oldest `batch` rows: bounded work however many rows are young. */
    snprintf(sql, sizeof sql,
             "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE seq <= (SELECT "
             "COALESCE(max(published_seq), 0) FROM relay_lease) ORDER BY seq LIMIT %d) "
             "AND created_at<=%lld",
             batch, (long long)(now_ms - ttl));
    if ((ret = oq_db_exec(db, sql, err))) goto fail;
    int64_t ob = sqlite3_changes(db);
    s->outbox += ob;
    /* Results for calls that do not exist here (unknown_call) have no call to be purged with:
     * they go by age. */
    snprintf(sql, sizeof sql,
             "DELETE FROM result_inbox WHERE message_id IN (SELECT message_id FROM result_inbox "
             "WHERE received_at<=%lld AND call_id NOT IN (SELECT call_id FROM calls) LIMIT %d)",
             (long long)(now_ms - ttl), batch);
    if ((ret = oq_db_exec(db, sql, err))) goto fail;
    int64_t orphans = sqlite3_changes(db);
    s->result_inbox += orphans;
    if ((ret = oq_db_commit(db, err))) goto fail;
    s->batches++;
    *more = (n >= batch) || (ob >= batch) || (orphans >= batch);
    return 0;
fail:
    oq_db_rollback(db);
    return ret;
}

int oq_store_purge(sqlite3 *db, int64_t now_ms, int64_t key_ttl_ms, int batch,
                   oq_purge_stats_t *stats, oq_error_t *err)
{
    oq_purge_stats_t local;
    memset(&local, 0, sizeof local);
    if (!stats) stats = &local;
    if (batch <= 0) batch = 500;
    if (key_ttl_ms <= 0) key_ttl_ms = OQ_DEFAULT_KEY_TTL_MS;
    int more = 1, ret = 0;
    for (int i = 0; more && i < 1000000; i++) {
        if ((ret = purge_batch(db, now_ms, key_ttl_ms, batch, stats, &more, err))) break;
    }
    return ret;
}
