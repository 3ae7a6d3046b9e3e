/*
 * The consumer store: every SQL statement against effects.db lives in this file.
 *
 * Correctness rests on three database facts, not on Kafka:
 *  1. The inbox primary key (message_id) makes a redelivered message a no-op: the upsert
 *     returns `seen`, and anything but 1 means "already handled", so nothing else is written.
 *  2. Executions move only through conditional UPDATEs whose WHERE names the expected state
 *     (and, once STARTED, the fencing token and owner); sqlite3_changes() decides who won.
 *     Every claim and every recovery bumps `fence`, so a worker that was paused past its lease
 *     finds its fenced UPDATE matching zero rows and writes nothing (audit 'lease_lost').
 *  3. effects.call_id is UNIQUE: even if (1) and (2) were bypassed, a second effect cannot be
 *     stored; a conflict there is treated as "already done" and the existing effect wins.
 * Each state change appends an audit row in the same transaction, in id order, so an auditor
 * can replay every execution's history; the one exception is the inline first run of a fast
 * tool (oq_cstore_finish_new), whose planned -> started -> outcome path happens inside one
 * transaction and is ONE row (event = outcome, detail "inline: planned, started, try 1 ...").
 * Wide tables are rowid tables with a narrow UNIQUE index on the random call_id (see the
 * schema): fewer scattered page writes per call than b-trees keyed by call_id. Result events (tool_result envelopes) go to the
 * shared outbox table with oq_outbox_append() in the same transaction as the terminal state.
 *
 * Statements are prepared once per connection through the oq_stmt_cache (keyed by the SQL
 * literal's address) and always reset after use, so no read snapshot is left open.
 */
#include "oq_cstore.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_log.h"
#include "oq_util.h"

struct oq_cstore {
    sqlite3 *db;
    oq_stmt_cache_t *cache;
    char worker[128];
};

static const char *const oq__xstate_names[OQ_X__COUNT] = {
    "PLANNED", "STARTED", "COMMITTED", "FAILED_RETRYABLE", "FAILED_FINAL", "UNKNOWN",
    "SAFE_RETRY", "NEEDS_REVIEW"};

const char *oq_xstate_name(int s)
{
    return (s >= 0 && s < OQ_X__COUNT) ? oq__xstate_names[s] : "?";
}

int oq_xstate_parse(const char *name)
{
    for (int i = 0; name && i < OQ_X__COUNT; i++)
        if (strcmp(name, oq__xstate_names[i]) == 0) return i;
    return -1;
}

int oq_xstate_terminal(int s)
{
    return s == OQ_X_COMMITTED || s == OQ_X_FAILED_FINAL || s == OQ_X_NEEDS_REVIEW;
}

void oq_exec_clear(oq_exec_t *x)
{
    if (!x) return;
    free(x->tenant);
    free(x->idem_key);
    free(x->tool);
    free(x->args);
    free(x->lease_owner);
    free(x->result);
    free(x->error);
    free(x->effect_id);
    memset(x, 0, sizeof(*x));
}

void oq_effect_id_for(const char *call_id, char out[OQ_CALL_ID_LEN + 1])
{
    const char *hex = (call_id && strncmp(call_id, "c_", 2) == 0) ? call_id + 2 : call_id;
    /* "e_" + at most OQ_CALL_ID_LEN - 2 characters of the id (its 16 hex digits) */
    snprintf(out, OQ_CALL_ID_LEN + 1, "e_%.*s", OQ_CALL_ID_LEN - 2, hex ? hex : "");
}

/* --- connection ------------------------------------------------------------------------------ */

int oq_cstore_open(const char *path, const oq_db_opts_t *opts, const char *worker_id,
                   oq_cstore_t **out, oq_error_t *err)
{
    int rc;
    oq_cstore_t *s = calloc(1, sizeof(*s));
    *out = NULL;
    if (!s) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    snprintf(s->worker, sizeof(s->worker), "%s", worker_id ? worker_id : "worker");
    if ((rc = oq_db_open(path, opts, &s->db, err)) != 0) goto fail;
    if ((rc = oq_db_migrate(s->db, oq_migrations_consumer, err)) != 0) goto fail;
    /* A poll batch touches several random-keyed b-trees (call ids): keep them cached rather
     * than spilling to the WAL mid-transaction and reading pages back. */
    if ((rc = oq_db_exec(s->db, "PRAGMA cache_size = -32768", err)) != 0) goto fail;
    if (!(s->cache = oq_stmt_cache_new(s->db))) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto fail;
    }
    *out = s;
    return 0;
fail:
    oq_cstore_close(s);
    return rc;
}

void oq_cstore_close(oq_cstore_t *s)
{
    if (!s) return;
    oq_stmt_cache_destroy(s->cache);
    if (s->db) sqlite3_close_v2(s->db);
    free(s);
}

sqlite3 *oq_cstore_db(oq_cstore_t *s) { return s->db; }
const char *oq_cstore_worker(const oq_cstore_t *s) { return s->worker; }

int oq_cstore_begin(oq_cstore_t *s, oq_error_t *err)
{
    return oq_db_begin_immediate(s->db, 30000, err);
}
int oq_cstore_commit(oq_cstore_t *s, oq_error_t *err) { return oq_db_commit(s->db, err); }
void oq_cstore_rollback(oq_cstore_t *s) { oq_db_rollback(s->db); }

/* --- small helpers --------------------------------------------------------------------------- */

static sqlite3_stmt *oq__st(oq_cstore_t *s, const char *sql, oq_error_t *err)
{
    return oq_stmt_get(s->cache, sql, err);
}

/* Steps a statement that returns no row; resets it. */
static int oq__done(oq_cstore_t *s, sqlite3_stmt *st, const char *what, oq_error_t *err)
{
    int rc = sqlite3_step(st);
    int ret = (rc == SQLITE_DONE || rc == SQLITE_ROW) ? 0 : oq_db_error(s->db, rc, err, what);
    sqlite3_reset(st);
    return ret;
}

static char *oq__coldup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

static void oq__colcpy(sqlite3_stmt *st, int i, char *out, size_t cap)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    snprintf(out, cap, "%s", t ? (const char *)t : "");
}

static void oq__bind_text_or_null(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

static int oq__audit(oq_cstore_t *s, const char *call_id, const char *event, int64_t attempt,
                     int64_t fence, const char *detail, int64_t now, oq_error_t *err)
{
    static const char sql[] = "INSERT INTO audit(ts, call_id, event, attempt, fence, worker, "
                              "detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_int64(st, 1, now);
    oq__bind_text_or_null(st, 2, call_id);
    sqlite3_bind_text(st, 3, event, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, attempt);
    sqlite3_bind_int64(st, 5, fence);
    sqlite3_bind_text(st, 6, s->worker, -1, SQLITE_STATIC);
    oq__bind_text_or_null(st, 7, detail);
    return oq__done(s, st, "audit insert", err);
}

/* Columns of executions in the order oq__exec_row() reads them. */
#define OQ__EXEC_COLS                                                                              \
    "call_id, tenant, idem_key, fingerprint, tool, args, state, attempt, tries, lease_owner, "     \
    "lease_until, fence, result, error, effect_id, next_attempt_at"

static void oq__exec_row(sqlite3_stmt *st, oq_exec_t *x)
{
    oq_exec_clear(x);
    oq__colcpy(st, 0, x->call_id, sizeof(x->call_id));
    x->tenant = oq__coldup(st, 1);
    x->idem_key = oq__coldup(st, 2);
    oq__colcpy(st, 3, x->fingerprint, sizeof(x->fingerprint));
    x->tool = oq__coldup(st, 4);
    x->args = oq__coldup(st, 5);
    x->state = oq_xstate_parse((const char *)sqlite3_column_text(st, 6));
    x->attempt = sqlite3_column_int64(st, 7);
    x->tries = sqlite3_column_int64(st, 8);
    x->lease_owner = oq__coldup(st, 9);
    x->lease_until = sqlite3_column_int64(st, 10);
    x->fence = sqlite3_column_int64(st, 11);
    x->result = oq__coldup(st, 12);
    x->error = oq__coldup(st, 13);
    x->effect_id = oq__coldup(st, 14);
    x->next_attempt_at = sqlite3_column_int64(st, 15);
}

int oq_cstore_exec_get(oq_cstore_t *s, const char *call_id, oq_exec_t *out, oq_error_t *err)
{
    static const char sql[] = "SELECT " OQ__EXEC_COLS " FROM executions WHERE call_id = ?1";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        oq__exec_row(st, out);
        rc = 0;
    } else if (rc == SQLITE_DONE) {
        rc = oq_error_set(err, OQ_ENOTFOUND, 0, "no execution %s", call_id);
    } else {
        rc = oq_db_error(s->db, rc, err, "execution select");
    }
    sqlite3_reset(st);
    return rc;
}

/* Encodes a JSON value compactly; NULL on failure. */
static char *oq__dump(const json_t *v)
{
    return v ? json_dumps(v, JSON_COMPACT) : NULL;
}

static char *oq__error_json(const char *code, const char *message, int retryable)
{
    json_t *e = json_pack("{s:s, s:s, s:b}", "code", code ? code : "tool_failed", "message",
                          message ? message : "", "retryable", retryable ? 1 : 0);
    char *t = oq__dump(e);
    json_decref(e);
    return t;
}

/*
 * Appends the tool_result event for \p x to the outbox: status succeeded (result, effect_id),
 * failed or needs_review (error). Text arguments are JSON; NULL means null.
 */
static int oq__emit_result_obj(oq_cstore_t *s, const oq_exec_t *x, const char *status,
                               const json_t *result_obj, const char *result_json,
                               const char *error_json, const char *effect_id, int64_t now,
                               oq_error_t *err);

static int oq__emit_result(oq_cstore_t *s, const oq_exec_t *x, const char *status,
                           const char *result_json, const char *error_json,
                           const char *effect_id, int64_t now, oq_error_t *err)
{
    return oq__emit_result_obj(s, x, status, NULL, result_json, error_json, effect_id, now, err);
}

/* As oq__emit_result(), with the result given as an object (borrowed) when \p result_obj is
 * not NULL: saves re-parsing the text just produced. */
static int oq__emit_result_obj(oq_cstore_t *s, const oq_exec_t *x, const char *status,
                               const json_t *result_obj, const char *result_json,
                               const char *error_json, const char *effect_id, int64_t now,
                               oq_error_t *err)
{
    oq_envelope_t e;
    char *payload = NULL;
    size_t len = 0;
    int rc;
    memset(&e, 0, sizeof(e));
    e.v = OQ_ENVELOPE_VERSION;
    e.kind = OQ_KIND_TOOL_RESULT;
    oq_id_uuid(e.message_id);
    snprintf(e.call_id, sizeof(e.call_id), "%s", x->call_id);
    snprintf(e.fingerprint, sizeof(e.fingerprint), "%s", x->fingerprint);
    e.tenant = x->tenant;
    e.idem_key = x->idem_key;
    e.tool = x->tool;
    e.attempt = x->attempt > 0 ? x->attempt : 1;
    e.created_at = now;
    e.status = (char *)status;
    e.effect_id = (char *)effect_id;
    if (result_obj)
        e.result = json_incref((json_t *)result_obj);
    else if (result_json)
        e.result = json_loads(result_json, 0, NULL);
    if (error_json) e.error = json_loads(error_json, 0, NULL);
    if (e.result && !json_is_object(e.result)) {
        json_decref(e.result);
        e.result = NULL;
    }
    rc = oq_envelope_encode(&e, &payload, &len, err);
    json_decref(e.result);
    json_decref(e.error);
    if (rc) return rc;
    oq_outbox_row_t row = {.message_id = e.message_id,
                           .topic = OQ_TOPIC_RESULTS,
                           .key = x->call_id,
                           .payload = payload,
                           .payload_len = len,
                           .created_at = now};
    rc = oq_outbox_append(s->db, s->cache, &row, err);
    free(payload);
    return rc;
}

/* Re-emits the result of a terminal execution. */
static int oq__reemit(oq_cstore_t *s, const oq_exec_t *x, int64_t now, oq_error_t *err)
{
    switch (x->state) {
    case OQ_X_COMMITTED:
        return oq__emit_result(s, x, "succeeded", x->result ? x->result : "{}", NULL,
                               x->effect_id, now, err);
    case OQ_X_FAILED_FINAL:
        return oq__emit_result(s, x, "failed", NULL, x->error, NULL, now, err);
    case OQ_X_NEEDS_REVIEW:
        return oq__emit_result(s, x, "needs_review", NULL, x->error, NULL, now, err);
    default:
        return 0;
    }
}

/* --- intake ---------------------------------------------------------------------------------- */

/* Inbox insert: *seen = 1 for a new message id; for a redelivery the row's counter is
 * bumped and *seen is its new value (> 1). (No RETURNING: it costs a temp b-tree per call.) */
static int oq__inbox_upsert(oq_cstore_t *s, const char *message_id, const char *call_id,
                            const oq_msg_src_t *src, const char *outcome, int64_t now,
                            int64_t *seen, oq_error_t *err)
{
    static const char sql[] =
        "INSERT INTO inbox(message_id, call_id, topic, partition, offset, received_at, outcome)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT(message_id) DO NOTHING";
    static const char sql_dup[] =
        "UPDATE inbox SET seen = seen + 1 WHERE message_id = ?1";
    static const char sql_seen[] = "SELECT seen FROM inbox WHERE message_id = ?1";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, message_id, -1, SQLITE_STATIC);
    oq__bind_text_or_null(st, 2, call_id);
    sqlite3_bind_text(st, 3, src->topic ? src->topic : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, src->partition);
    sqlite3_bind_int64(st, 5, src->offset);
    sqlite3_bind_int64(st, 6, now);
    sqlite3_bind_text(st, 7, outcome, -1, SQLITE_STATIC);
    int rc = oq__done(s, st, "inbox insert", err);
    sqlite3_clear_bindings(st);
    if (rc) return rc;
    if (sqlite3_changes(s->db) == 1) {
        *seen = 1;
        return 0;
    }
    if (!(st = oq__st(s, sql_dup, err))) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, message_id, -1, SQLITE_STATIC);
    if ((rc = oq__done(s, st, "inbox redelivery", err))) return rc;
    if (!(st = oq__st(s, sql_seen, err))) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, message_id, -1, SQLITE_STATIC);
    *seen = 2;
    if (sqlite3_step(st) == SQLITE_ROW) *seen = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return 0;
}

/* New execution row: PLANNED (due now), or directly STARTED by this worker when \p lease_ms >
 * 0 (the caller runs the tool in this same transaction, so nobody can observe PLANNED). */
static int oq__plan_insert(oq_cstore_t *s, const oq_envelope_t *env, int64_t now,
                           int64_t lease_ms, oq_error_t *err)
{
    static const char sql[] =
        "INSERT INTO executions(call_id, tenant, idem_key, fingerprint, tool, args, state, "
        "attempt, tries, fence, lease_owner, lease_until, next_attempt_at, message_id, "
        "created_at, updated_at) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?10, ?7, ?11, ?11, ?12, ?13, ?14, ?9, ?8, ?8)";
    char *args = oq__dump(env->args);
    if (!args) return oq_error_set(err, OQ_ENOMEM, 0, "args encode");
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) {
        free(args);
        return err ? err->code : OQ_EDB;
    }
    int start = lease_ms > 0;
    sqlite3_bind_text(st, 1, env->call_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, env->tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, env->idem_key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, env->fingerprint, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, env->tool, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, args, -1, free);
    sqlite3_bind_int64(st, 7, env->attempt);
    sqlite3_bind_int64(st, 8, now);
    sqlite3_bind_text(st, 9, env->message_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 10, start ? "STARTED" : "PLANNED", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 11, start ? 1 : 0);
    if (start) {
        sqlite3_bind_text(st, 12, s->worker, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 13, now + lease_ms);
        sqlite3_bind_null(st, 14);
    } else {
        sqlite3_bind_null(st, 12);
        sqlite3_bind_null(st, 13);
        sqlite3_bind_int64(st, 14, now);
    }
    int rc = oq__done(s, st, "execution insert", err);
    sqlite3_clear_bindings(st);
    return rc;
}

static int oq__plan_again(oq_cstore_t *s, const oq_envelope_t *env, int64_t now, int *changed,
                          oq_error_t *err)
{
    static const char sql[] =
        "UPDATE executions SET state = 'PLANNED', attempt = ?2, tries = 0, result = NULL, "
        "error = NULL, effect_id = NULL, lease_owner = NULL, lease_until = NULL, "
        "next_attempt_at = ?3, message_id = ?4, updated_at = ?3 "
        "WHERE call_id = ?1 AND state = 'FAILED_FINAL' AND attempt < ?2";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, env->call_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, env->attempt);
    sqlite3_bind_int64(st, 3, now);
    sqlite3_bind_text(st, 4, env->message_id, -1, SQLITE_STATIC);
    int rc = oq__done(s, st, "execution re-plan", err);
    *changed = rc == 0 ? sqlite3_changes(s->db) : 0;
    return rc;
}

/*
 * Intake of one tool_call: the inbox row and the planning decision. \p defer (fast path of
 * oq_cstore_intake_fast) writes nothing for a NEW call beyond the inbox row and sets *is_new:
 * the caller runs the tool and oq_cstore_finish_new() inserts the execution in its outcome
 * state. Otherwise a new call is inserted PLANNED, or STARTED when \p started && lease_ms > 0.
 */
static int oq__intake(oq_cstore_t *s, const oq_envelope_t *env, const oq_msg_src_t *src,
                      int64_t now, int64_t lease_ms, oq_exec_t *started, int defer,
                      int *is_new, int *outcome, oq_error_t *err);

int oq_cstore_intake(oq_cstore_t *s, const oq_envelope_t *env, const oq_msg_src_t *src,
                     int64_t now, int *outcome, oq_error_t *err)
{
    return oq__intake(s, env, src, now, 0, NULL, 0, NULL, outcome, err);
}

int oq_cstore_intake_start(oq_cstore_t *s, const oq_envelope_t *env, const oq_msg_src_t *src,
                           int64_t now, int64_t lease_ms, oq_exec_t *started, int *outcome,
                           oq_error_t *err)
{
    return oq__intake(s, env, src, now, lease_ms, started, 0, NULL, outcome, err);
}

int oq_cstore_intake_fast(oq_cstore_t *s, const oq_envelope_t *env, const oq_msg_src_t *src,
                          int64_t now, int *is_new, int *outcome, oq_error_t *err)
{
    *is_new = 0;
    return oq__intake(s, env, src, now, 0, NULL, 1, is_new, outcome, err);
}

static int oq__intake(oq_cstore_t *s, const oq_envelope_t *env, const oq_msg_src_t *src,
                      int64_t now, int64_t lease_ms, oq_exec_t *started, int defer,
                      int *is_new, int *outcome, oq_error_t *err)
{
    oq_exec_t x;
    int rc, have = 0, decision;
    const char *outcome_s;
    int64_t seen = 0;
    memset(&x, 0, sizeof(x));

    rc = oq_cstore_exec_get(s, env->call_id, &x, err);
    if (rc == 0)
        have = 1;
    else if (rc != OQ_ENOTFOUND)
        return rc;

    if (!have) {
        decision = OQ_IN_PLANNED;
    } else if (strcmp(x.fingerprint, env->fingerprint) != 0) {
        *outcome = OQ_IN_MISMATCH;
        rc = 0;
        goto out;
    } else if (x.state == OQ_X_FAILED_FINAL && env->attempt > x.attempt) {
        decision = OQ_IN_PLANNED;
    } else if (env->attempt < x.attempt) {
        decision = OQ_IN_STALE;
    } else if (oq_xstate_terminal(x.state)) {
        decision = OQ_IN_DONE;
    } else {
        decision = OQ_IN_IN_PROGRESS;
    }
    outcome_s = decision == OQ_IN_PLANNED  ? "planned"
                : decision == OQ_IN_STALE  ? "stale"
                : decision == OQ_IN_DONE   ? "done"
                                           : "in_progress";

    if ((rc = oq__inbox_upsert(s, env->message_id, env->call_id, src, outcome_s, now, &seen,
                               err)) != 0)
        goto out;
    if (seen > 1) {
        *outcome = OQ_IN_DUPLICATE;
        rc = oq__audit(s, env->call_id, "duplicate_skipped", env->attempt, have ? x.fence : 0,
                       "redelivered message_id", now, err);
        goto out;
    }
    *outcome = decision;
    switch (decision) {
    case OQ_IN_PLANNED:
        if (!have && defer) {
            /* the caller runs the tool now and oq_cstore_finish_new() writes the row */
            *is_new = 1;
            goto out;
        }
        if (!have) {
            rc = oq__plan_insert(s, env, now, started ? lease_ms : 0, err);
        } else {
            int changed = 0;
            rc = oq__plan_again(s, env, now, &changed, err);
            if (rc == 0 && !changed) rc = oq_error_set(err, OQ_ESTATE, 0, "re-plan lost a race");
        }
        if (rc == 0) {
            char detail[64];
            snprintf(detail, sizeof(detail), have ? "new attempt %" PRId64 : "attempt %" PRId64,
                     env->attempt);
            rc = oq__audit(s, env->call_id, "planned", env->attempt, have ? x.fence : 0, detail,
                           now, err);
        }
        if (rc == 0 && !have && started && lease_ms > 0) {
            /* PLANNED -> STARTED in the same transaction: the row was inserted STARTED */
            rc = oq__audit(s, env->call_id, "started", env->attempt, 1, "try 1", now, err);
            if (rc == 0) {
                oq_exec_clear(started);
                snprintf(started->call_id, sizeof(started->call_id), "%s", env->call_id);
                snprintf(started->fingerprint, sizeof(started->fingerprint), "%s",
                         env->fingerprint);
                started->tenant = strdup(env->tenant);
                started->idem_key = strdup(env->idem_key);
                started->tool = strdup(env->tool);
                started->lease_owner = strdup(s->worker);
                started->state = OQ_X_STARTED;
                started->attempt = env->attempt;
                started->tries = 1;
                started->fence = 1;
                started->lease_until = now + lease_ms;
                if (!started->tenant || !started->idem_key || !started->tool ||
                    !started->lease_owner)
                    rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            }
        }
        break;
    case OQ_IN_DONE:
        rc = oq__audit(s, env->call_id, "duplicate_skipped", env->attempt, x.fence,
                       "call already terminal: result re-emitted", now, err);
        if (rc == 0) rc = oq__reemit(s, &x, now, err);
        break;
    case OQ_IN_STALE:
        rc = oq__audit(s, env->call_id, "duplicate_skipped", env->attempt, x.fence,
                       "stale attempt", now, err);
        break;
    default:
        rc = oq__audit(s, env->call_id, "duplicate_skipped", env->attempt, x.fence,
                       "call in progress", now, err);
        break;
    }
out:
    oq_exec_clear(&x);
    return rc;
}

/* --- dead letters ---------------------------------------------------------------------------- */

int oq_cstore_dlq_add(oq_cstore_t *s, const char *message_id, const char *call_id,
                      const oq_msg_src_t *src, const void *key, size_t key_len,
                      const void *payload, size_t len, const char *reason, int64_t now,
                      int *dup, oq_error_t *err)
{
    static const char sql[] =
        "INSERT INTO dlq(message_id, topic, partition, offset, msg_key, payload, reason, "
        "created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
    int64_t seen = 0;
    int rc = oq__inbox_upsert(s, message_id, call_id, src, "dlq", now, &seen, err);
    *dup = 0;
    if (rc) return rc;
    if (seen > 1) {
        *dup = 1;
        return 0;
    }
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, message_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, src->topic ? src->topic : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, src->partition);
    sqlite3_bind_int64(st, 4, src->offset);
    if (key)
        sqlite3_bind_blob64(st, 5, key, key_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 5);
    if (payload)
        sqlite3_bind_blob64(st, 6, payload, len, SQLITE_STATIC);
    else
        sqlite3_bind_zeroblob(st, 6, 0);
    sqlite3_bind_text(st, 7, reason, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 8, now);
    rc = oq__done(s, st, "dlq insert", err);
    sqlite3_clear_bindings(st);
    if (rc) return rc;
    return oq__audit(s, call_id, "dlq", 0, 0, reason, now, err);
}

int oq_cstore_dlq_pending(oq_cstore_t *s, int limit,
                          void (*cb)(const oq_dlq_row_t *row, void *opaque), void *opaque,
                          oq_error_t *err)
{
    static const char sql[] = "SELECT id, message_id, reason, msg_key, payload FROM dlq "
                              "WHERE published_at IS NULL ORDER BY id LIMIT ?1";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_int(st, 1, limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        oq_dlq_row_t r;
        r.id = sqlite3_column_int64(st, 0);
        r.message_id = (const char *)sqlite3_column_text(st, 1);
        r.reason = (const char *)sqlite3_column_text(st, 2);
        r.key = sqlite3_column_blob(st, 3);
        r.key_len = (size_t)sqlite3_column_bytes(st, 3);
        r.payload = sqlite3_column_blob(st, 4);
        r.len = (size_t)sqlite3_column_bytes(st, 4);
        cb(&r, opaque);
    }
    rc = (rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "dlq select");
    sqlite3_reset(st);
    return rc;
}

int oq_cstore_dlq_mark(oq_cstore_t *s, int64_t id, int64_t now, oq_error_t *err)
{
    static const char sql[] = "UPDATE dlq SET published_at = ?2 WHERE id = ?1";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, now);
    return oq__done(s, st, "dlq mark", err);
}

/* --- leases ---------------------------------------------------------------------------------- */

int oq_cstore_claim(oq_cstore_t *s, const char *call_id, int64_t lease_ms, int64_t now,
                    oq_exec_t *out, oq_error_t *err)
{
    static const char sql[] =
        "UPDATE executions SET state = 'STARTED', fence = fence + 1, tries = tries + 1, "
        "lease_owner = ?2, lease_until = ?3, next_attempt_at = NULL, updated_at = ?4 "
        "WHERE call_id = ?1 AND (state = 'PLANNED' OR state = 'FAILED_RETRYABLE' OR "
        "state = 'SAFE_RETRY') AND next_attempt_at <= ?4";
    oq_exec_t x;
    int rc;
    memset(&x, 0, sizeof(x));
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, s->worker, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, now + lease_ms);
    sqlite3_bind_int64(st, 4, now);
    rc = oq__done(s, st, "claim", err);
    if (rc) return rc;
    /* rowcount decides: 0 means not due, or another worker holds it */
    if (sqlite3_changes(s->db) != 1)
        return oq_error_set(err, OQ_ESTATE, 0, "%s is not due or taken", call_id);
    /* read back inside the same write transaction: nobody can change it in between */
    if ((rc = oq_cstore_exec_get(s, call_id, &x, err))) return rc;
    char detail[48];
    snprintf(detail, sizeof(detail), "try %" PRId64, x.tries);
    rc = oq__audit(s, call_id, "started", x.attempt, x.fence, detail, now, err);
    if (rc == 0 && out) {
        oq_exec_clear(out);
        *out = x;
    } else {
        oq_exec_clear(&x);
    }
    return rc;
}

int oq_cstore_renew(oq_cstore_t *s, const char *call_id, int64_t fence, int64_t lease_until,
                    oq_error_t *err)
{
    static const char sql[] = "UPDATE executions SET lease_until = ?3 WHERE call_id = ?1 AND "
                              "state = 'STARTED' AND fence = ?2 AND lease_owner = ?4";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, fence);
    sqlite3_bind_int64(st, 3, lease_until);
    sqlite3_bind_text(st, 4, s->worker, -1, SQLITE_STATIC);
    int rc = oq__done(s, st, "lease renew", err);
    if (rc == 0 && sqlite3_changes(s->db) == 0)
        rc = oq_error_set(err, OQ_EFENCED, 0, "lease on %s (fence %" PRId64 ") lost", call_id,
                          fence);
    return rc;
}

int oq_cstore_release(oq_cstore_t *s, const char *call_id, int64_t fence, oq_error_t *err)
{
    return oq_cstore_renew(s, call_id, fence, 0, err);
}

int64_t oq_retry_backoff_ms(const oq_retry_policy_t *p, int64_t tries)
{
    int64_t base = p->base_ms > 0 ? p->base_ms : 200;
    int64_t cap = p->max_ms > 0 ? p->max_ms : 30000;
    int64_t d = base;
    for (int64_t i = 1; i < tries && d < cap; i++) d *= 2;
    if (d > cap) d = cap;
    uint32_t r;
    oq_random_bytes(&r, sizeof(r));
    /* jitter in [0.5, 1.5) spreads retries of calls that failed together */
    return d / 2 + (int64_t)((double)d * ((double)r / 4294967296.0));
}

/* --- finish ---------------------------------------------------------------------------------- */

/* Fenced transition out of STARTED. *ok = 1 when this worker still held the execution. */
static int oq__fenced_set(oq_cstore_t *s, const oq_exec_t *x, const char *state,
                          const char *result, const char *error, const char *effect_id,
                          int64_t next_at, int64_t tries_delta, int64_t now, int *ok,
                          oq_error_t *err)
{
    static const char sql[] =
        "UPDATE executions SET state = ?4, result = ?5, error = ?6, effect_id = ?7, "
        "next_attempt_at = ?8, tries = tries + ?9, lease_owner = NULL, lease_until = NULL, "
        "fence = fence + (?4 = 'SAFE_RETRY'), updated_at = ?10 "
        "WHERE call_id = ?1 AND state = 'STARTED' AND fence = ?2 AND lease_owner = ?3";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, x->call_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, x->fence);
    sqlite3_bind_text(st, 3, s->worker, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, state, -1, SQLITE_STATIC);
    oq__bind_text_or_null(st, 5, result);
    oq__bind_text_or_null(st, 6, error);
    oq__bind_text_or_null(st, 7, effect_id);
    if (next_at > 0)
        sqlite3_bind_int64(st, 8, next_at);
    else
        sqlite3_bind_null(st, 8);
    sqlite3_bind_int64(st, 9, tries_delta);
    sqlite3_bind_int64(st, 10, now);
    int rc = oq__done(s, st, "execution finish", err);
    sqlite3_clear_bindings(st);
    *ok = rc == 0 && sqlite3_changes(s->db) == 1;
    return rc;
}

/* Effect insert; *inserted = 0 when the call already has one (the UNIQUE gate). */
static int oq__effect_insert(oq_cstore_t *s, const oq_exec_t *x, const char *effect_id,
                             const oq_tool_out_t *o, const char *detail, int64_t now,
                             int *inserted, oq_error_t *err)
{
    static const char sql[] =
        "INSERT INTO effects(effect_id, call_id, tool, amount, recipient, detail, attempt, "
        "fence, worker, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) "
        "ON CONFLICT DO NOTHING";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, effect_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, x->call_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, x->tool ? x->tool : "", -1, SQLITE_STATIC);
    if (o->amount)
        sqlite3_bind_int64(st, 4, o->amount);
    else
        sqlite3_bind_null(st, 4);
    oq__bind_text_or_null(st, 5, o->recipient[0] ? o->recipient : NULL);
    oq__bind_text_or_null(st, 6, detail);
    sqlite3_bind_int64(st, 7, x->attempt);
    sqlite3_bind_int64(st, 8, x->fence);
    sqlite3_bind_text(st, 9, s->worker, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 10, now);
    int rc = oq__done(s, st, "effect insert", err);
    sqlite3_clear_bindings(st);
    *inserted = rc == 0 && sqlite3_changes(s->db) == 1;
    return rc;
}

/* The existing effect of a call: *found, and its id/detail (malloc()ed). */
static int oq__effect_get(oq_cstore_t *s, const char *call_id, int *found, char **effect_id,
                          char **detail, oq_error_t *err)
{
    static const char sql[] = "SELECT effect_id, detail FROM effects WHERE call_id = ?1";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    *found = 0;
    if (rc == SQLITE_ROW) {
        *found = 1;
        if (effect_id) *effect_id = oq__coldup(st, 0);
        if (detail) *detail = oq__coldup(st, 1);
        rc = 0;
    } else {
        rc = (rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "effect select");
    }
    sqlite3_reset(st);
    return rc;
}

static int oq__set_result(oq_cstore_t *s, const char *call_id, const char *result,
                          const char *effect_id, oq_error_t *err)
{
    static const char sql[] =
        "UPDATE executions SET result = ?2, effect_id = ?3 WHERE call_id = ?1";
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    oq__bind_text_or_null(st, 2, result);
    oq__bind_text_or_null(st, 3, effect_id);
    int rc = oq__done(s, st, "execution result", err);
    sqlite3_clear_bindings(st);
    return rc;
}

int oq_cstore_finish(oq_cstore_t *s, const oq_exec_t *x, int rc_tool, const oq_tool_out_t *o,
                     const oq_retry_policy_t *p, int64_t now, int *state_out, int *effect_new,
                     oq_error_t *err)
{
    char eid[OQ_CALL_ID_LEN + 1];
    char detail[160];
    char *result = NULL, *error = NULL, *old_eid = NULL, *old_detail = NULL;
    int rc = 0, ok = 0, state = OQ_X_STARTED;
    if (effect_new) *effect_new = 0;

    if (rc_tool == OQ_TOOL_OK) {
        result = o->result ? oq__dump(o->result) : strdup("{}");
        if (!result) return oq_error_set(err, OQ_ENOMEM, 0, "result encode");
        oq_effect_id_for(x->call_id, eid);
        state = OQ_X_COMMITTED;
        rc = oq__fenced_set(s, x, "COMMITTED", result, NULL, o->has_effect ? eid : NULL, 0, 0,
                            now, &ok, err);
        if (rc || !ok) goto fenced;
        const char *final_result = result;
        const char *final_eid = o->has_effect ? eid : NULL;
        snprintf(detail, sizeof(detail), "try %" PRId64, x->tries);
        if (o->has_effect) {
            int inserted = 0;
            rc = oq__effect_insert(s, x, eid, o, result, now, &inserted, err);
            if (rc) goto out;
            if (effect_new) *effect_new = inserted;
            if (!inserted) {
                /* The last gate: the call already has an effect; it stands, ours is dropped. */
                int found = 0;
                if ((rc = oq__effect_get(s, x->call_id, &found, &old_eid, &old_detail, err)))
                    goto out;
                if (found) {
                    final_result = old_detail ? old_detail : "{}";
                    final_eid = old_eid;
                    if ((rc = oq__set_result(s, x->call_id, final_result, final_eid, err)))
                        goto out;
                }
                snprintf(detail, sizeof(detail), "try %" PRId64 ": effect already present",
                         x->tries);
                OQ_LOGC_WARN("consumer", x->call_id, "effect already present: unique gate held");
            }
        }
        if ((rc = oq__audit(s, x->call_id, "committed", x->attempt, x->fence, detail, now, err)))
            goto out;
        rc = oq__emit_result_obj(s, x, "succeeded",
                                 final_result == result && json_is_object(o->result) ? o->result
                                                                                    : NULL,
                                 final_result, NULL, final_eid, now, err);
        goto out;
    }

    if (rc_tool == OQ_TOOL_ABANDONED) {
        /* Stopped before doing anything: hand the execution back, due now. */
        state = OQ_X_SAFE_RETRY;
        rc = oq__fenced_set(s, x, "SAFE_RETRY", NULL, NULL, NULL, now, -1, now, &ok, err);
        if (rc || !ok) goto fenced;
        if ((rc = oq__audit(s, x->call_id, "unknown", x->attempt, x->fence, "abandoned at stop",
                            now, err)))
            goto out;
        rc = oq__audit(s, x->call_id, "safe_retry", x->attempt, x->fence + 1,
                       "abandoned at stop: nothing done", now, err);
        goto out;
    }

    /* failure */
    {
        const char *code = o->code[0] ? o->code
                           : rc_tool == OQ_TOOL_BADARGS ? "bad_args"
                                                        : "tool_failed";
        int retry = rc_tool == OQ_TOOL_FAIL && o->retryable && x->tries < p->max_attempts;
        error = oq__error_json(code, o->message, rc_tool == OQ_TOOL_FAIL && o->retryable);
        if (!error) {
            rc = oq_error_set(err, OQ_ENOMEM, 0, "error encode");
            goto out;
        }
        if (retry) {
            int64_t wait = oq_retry_backoff_ms(p, x->tries);
            state = OQ_X_FAILED_RETRYABLE;
            rc = oq__fenced_set(s, x, "FAILED_RETRYABLE", NULL, error, NULL, now + wait, 0, now,
                                &ok, err);
            if (rc || !ok) goto fenced;
            snprintf(detail, sizeof(detail), "try %" PRId64 "/%d: %.60s; retry in %" PRId64 " ms",
                     x->tries, p->max_attempts, o->message, wait);
            rc = oq__audit(s, x->call_id, "failed_retryable", x->attempt, x->fence, detail, now,
                           err);
            goto out;
        }
        state = OQ_X_FAILED_FINAL;
        rc = oq__fenced_set(s, x, "FAILED_FINAL", NULL, error, NULL, 0, 0, now, &ok, err);
        if (rc || !ok) goto fenced;
        snprintf(detail, sizeof(detail), "try %" PRId64 ": %s: %.100s", x->tries, code,
                 o->message);
        if ((rc = oq__audit(s, x->call_id, "failed_final", x->attempt, x->fence, detail, now,
                            err)))
            goto out;
        rc = oq__emit_result(s, x, "failed", NULL, error, NULL, now, err);
        goto out;
    }

fenced:
    if (rc == 0 && !ok) {
        /* Another worker (or recovery) moved the execution on: refuse every write. */
        OQ_LOGC_WARN("consumer", x->call_id, "lease lost (fence %" PRId64 "): writes refused",
                     x->fence);
        rc = oq__audit(s, x->call_id, "lease_lost", x->attempt, x->fence,
                       "stale worker: fence changed, writes refused", now, err);
        if (rc == 0) rc = oq_error_set(err, OQ_EFENCED, 0, "lease on %s lost", x->call_id);
        state = -1;
    }
out:
    if (state_out) *state_out = state;
    free(result);
    free(error);
    free(old_eid);
    free(old_detail);
    return rc;
}

/* New execution row written directly in the outcome state of its first, inline run. */
static int oq__exec_insert_final(oq_cstore_t *s, const oq_envelope_t *env, const char *state,
                                 const char *result, const char *error, const char *effect_id,
                                 int64_t tries, int64_t fence, int64_t next_at, int64_t now,
                                 oq_error_t *err)
{
    static const char sql[] =
        "INSERT INTO executions(call_id, tenant, idem_key, fingerprint, tool, args, state, "
        "attempt, tries, fence, result, error, effect_id, next_attempt_at, message_id, "
        "created_at, updated_at) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?16)";
    char *args = oq__dump(env->args);
    if (!args) return oq_error_set(err, OQ_ENOMEM, 0, "args encode");
    sqlite3_stmt *st = oq__st(s, sql, err);
    if (!st) {
        free(args);
        return err ? err->code : OQ_EDB;
    }
    sqlite3_bind_text(st, 1, env->call_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, env->tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, env->idem_key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, env->fingerprint, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, env->tool, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, args, -1, free);
    sqlite3_bind_text(st, 7, state, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 8, env->attempt);
    sqlite3_bind_int64(st, 9, tries);
    sqlite3_bind_int64(st, 10, fence);
    oq__bind_text_or_null(st, 11, result);
    oq__bind_text_or_null(st, 12, error);
    oq__bind_text_or_null(st, 13, effect_id);
    if (next_at > 0)
        sqlite3_bind_int64(st, 14, next_at);
    else
        sqlite3_bind_null(st, 14);
    sqlite3_bind_text(st, 15, env->message_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 16, now);
    int rc = oq__done(s, st, "execution insert", err);
    sqlite3_clear_bindings(st);
    return rc;
}

int oq_cstore_finish_new(oq_cstore_t *s, const oq_envelope_t *env, int rc_tool,
                         const oq_tool_out_t *o, const oq_retry_policy_t *p, int64_t now,
                         int *state_out, int *effect_new, oq_error_t *err)
{
    char eid[OQ_CALL_ID_LEN + 1];
    char detail[200];
    char *result = NULL, *error = NULL, *old_eid = NULL, *old_detail = NULL;
    int rc = 0, state = -1;
    /* the identity the result event and the effect row need, borrowed from the envelope */
    oq_exec_t x;
    memset(&x, 0, sizeof(x));
    snprintf(x.call_id, sizeof(x.call_id), "%s", env->call_id);
    snprintf(x.fingerprint, sizeof(x.fingerprint), "%s", env->fingerprint);
    x.tenant = env->tenant;
    x.idem_key = env->idem_key;
    x.tool = env->tool;
    x.attempt = env->attempt;
    x.tries = 1;
    x.fence = 1;
    if (effect_new) *effect_new = 0;

    if (rc_tool == OQ_TOOL_OK) {
        result = o->result ? oq__dump(o->result) : strdup("{}");
        if (!result) return oq_error_set(err, OQ_ENOMEM, 0, "result encode");
        oq_effect_id_for(x.call_id, eid);
        const char *final_result = result;
        const char *final_eid = o->has_effect ? eid : NULL;
        snprintf(detail, sizeof(detail), "inline: planned, started, try 1 committed");
        if (o->has_effect) {
            int inserted = 0;
            if ((rc = oq__effect_insert(s, &x, eid, o, result, now, &inserted, err))) goto out;
            if (effect_new) *effect_new = inserted;
            if (!inserted) {
                /* The last gate held (an effect without an execution row: only a damaged or
                 * hand-edited database); the existing effect stands. */
                int found = 0;
                if ((rc = oq__effect_get(s, x.call_id, &found, &old_eid, &old_detail, err)))
                    goto out;
                if (found) {
                    final_result = old_detail ? old_detail : "{}";
                    final_eid = old_eid;
                }
                snprintf(detail, sizeof(detail),
                         "inline: planned, started, try 1: effect already present");
                OQ_LOGC_WARN("consumer", x.call_id, "effect already present: unique gate held");
            }
        }
        state = OQ_X_COMMITTED;
        if ((rc = oq__exec_insert_final(s, env, "COMMITTED", final_result, NULL, final_eid, 1, 1,
                                        0, now, err)) ||
            (rc = oq__audit(s, x.call_id, "committed", x.attempt, 1, detail, now, err)))
            goto out;
        rc = oq__emit_result_obj(s, &x, "succeeded",
                                 final_result == result && json_is_object(o->result) ? o->result
                                                                                    : NULL,
                                 final_result, NULL, final_eid, now, err);
        goto out;
    }

    if (rc_tool == OQ_TOOL_ABANDONED) {
        /* Stopped before doing anything: plan it as if it had not run (due now). */
        state = OQ_X_PLANNED;
        if ((rc = oq__exec_insert_final(s, env, "PLANNED", NULL, NULL, NULL, 0, 0, now, now,
                                        err)))
            goto out;
        rc = oq__audit(s, x.call_id, "planned", x.attempt, 0, "inline run abandoned at stop",
                       now, err);
        goto out;
    }

    /* failure */
    {
        const char *code = o->code[0] ? o->code
                           : rc_tool == OQ_TOOL_BADARGS ? "bad_args"
                                                        : "tool_failed";
        int retryable = rc_tool == OQ_TOOL_FAIL && o->retryable;
        error = oq__error_json(code, o->message, retryable);
        if (!error) {
            rc = oq_error_set(err, OQ_ENOMEM, 0, "error encode");
            goto out;
        }
        if (retryable && 1 < p->max_attempts) {
            int64_t wait = oq_retry_backoff_ms(p, 1);
            state = OQ_X_FAILED_RETRYABLE;
            if ((rc = oq__exec_insert_final(s, env, "FAILED_RETRYABLE", NULL, error, NULL, 1, 1,
                                            now + wait, now, err)))
                goto out;
            snprintf(detail, sizeof(detail),
                     "inline: planned, started, try 1/%d: %.60s; retry in %" PRId64 " ms",
                     p->max_attempts, o->message, wait);
            rc = oq__audit(s, x.call_id, "failed_retryable", x.attempt, 1, detail, now, err);
            goto out;
        }
        state = OQ_X_FAILED_FINAL;
        if ((rc = oq__exec_insert_final(s, env, "FAILED_FINAL", NULL, error, NULL, 1, 1, 0, now,
                                        err)))
            goto out;
        snprintf(detail, sizeof(detail), "inline: planned, started, try 1: %s: %.100s", code,
                 o->message);
        if ((rc = oq__audit(s, x.call_id, "failed_final", x.attempt, 1, detail, now, err)))
            goto out;
        rc = oq__emit_result(s, &x, "failed", NULL, error, NULL, now, err);
    }
out:
    if (state_out) *state_out = rc ? -1 : state;
    free(result);
    free(error);
    free(old_eid);
    free(old_detail);
    return rc;
}

/* --- recovery -------------------------------------------------------------------------------- */

typedef struct {
    char call_id[OQ_CALL_ID_LEN + 1];
    int64_t fence, attempt;
} oq__idfence_t;

/* Collects up to \p cap (call_id, fence) rows from a prepared, bound statement. */
static int oq__collect(oq_cstore_t *s, sqlite3_stmt *st, oq__idfence_t *out, int cap, int *n,
                       oq_error_t *err)
{
    int rc = SQLITE_DONE;
    *n = 0;
    while (*n < cap && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        oq__colcpy(st, 0, out[*n].call_id, sizeof(out[*n].call_id));
        out[*n].fence = sqlite3_column_int64(st, 1);
        out[*n].attempt = sqlite3_column_int64(st, 2);
        (*n)++;
    }
    if (*n < cap && rc != SQLITE_DONE) rc = oq_db_error(s->db, rc, err, "recovery select");
    else rc = 0;
    sqlite3_reset(st);
    return rc;
}

int oq_cstore_recover(oq_cstore_t *s, int64_t now, int max_attempts, int limit,
                      int *n_recovered, oq_error_t *err)
{
    static const char sql_lapsed[] =
        "SELECT call_id, fence, attempt FROM executions WHERE state = 'STARTED' AND "
        "lease_until < ?1 "
        "LIMIT ?2";
    static const char sql_unknown[] =
        "UPDATE executions SET state = 'UNKNOWN', fence = fence + 1, lease_owner = NULL, "
        "lease_until = NULL, next_attempt_at = NULL, updated_at = ?3 WHERE call_id = ?1 AND "
        "state = 'STARTED' AND fence = ?2";
    static const char sql_list_unknown[] =
        "SELECT call_id, fence, attempt FROM executions WHERE state = 'UNKNOWN' LIMIT ?1";
    static const char sql_resolve[] =
        "UPDATE executions SET state = ?2, result = ?3, error = ?4, effect_id = ?5, "
        "next_attempt_at = CASE WHEN ?2 = 'SAFE_RETRY' THEN ?6 END, updated_at = ?6 "
        "WHERE call_id = ?1 AND state = 'UNKNOWN'";
    oq__idfence_t *rows = NULL;
    int n = 0, rc, done = 0;
    if (limit <= 0) limit = 100;
    if (n_recovered) *n_recovered = 0;
    rows = calloc((size_t)limit, sizeof(*rows));
    if (!rows) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");

    /* 1. STARTED with a lapsed lease -> UNKNOWN (fence + 1: the old holder is now stale). */
    sqlite3_stmt *st = oq__st(s, sql_lapsed, err);
    if (!st) {
        rc = err ? err->code : OQ_EDB;
        goto out;
    }
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int(st, 2, limit);
    if ((rc = oq__collect(s, st, rows, limit, &n, err))) goto out;
    for (int i = 0; i < n; i++) {
        if (!(st = oq__st(s, sql_unknown, err))) {
            rc = err ? err->code : OQ_EDB;
            goto out;
        }
        sqlite3_bind_text(st, 1, rows[i].call_id, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, rows[i].fence);
        sqlite3_bind_int64(st, 3, now);
        if ((rc = oq__done(s, st, "recovery unknown", err))) goto out;
        if (sqlite3_changes(s->db) != 1) continue;
        OQ_LOGC_WARN("consumer", rows[i].call_id, "lease lapsed (fence %" PRId64 "): UNKNOWN",
                     rows[i].fence);
        if ((rc = oq__audit(s, rows[i].call_id, "unknown", rows[i].attempt, rows[i].fence + 1,
                            "lease lapsed", now, err)))
            goto out;
    }

    /* 2. Reconcile every UNKNOWN row against the effects table. */
    if (!(st = oq__st(s, sql_list_unknown, err))) {
        rc = err ? err->code : OQ_EDB;
        goto out;
    }
    sqlite3_bind_int(st, 1, limit);
    if ((rc = oq__collect(s, st, rows, limit, &n, err))) goto out;
    for (int i = 0; i < n; i++) {
        oq_exec_t x;
        char *eid = NULL, *detail = NULL, *error = NULL;
        int found = 0;
        const char *state, *event;
        memset(&x, 0, sizeof(x));
        if ((rc = oq_cstore_exec_get(s, rows[i].call_id, &x, err))) goto out;
        if ((rc = oq__effect_get(s, x.call_id, &found, &eid, &detail, err))) {
            oq_exec_clear(&x);
            goto out;
        }
        if (found) {
            state = "COMMITTED";
            event = "committed";
        } else if (x.tries >= max_attempts) {
            state = "NEEDS_REVIEW";
            event = "needs_review";
            char msg[128];
            snprintf(msg, sizeof(msg), "outcome unknown after %" PRId64 " tries", x.tries);
            error = oq__error_json("needs_review", msg, 0);
        } else {
            state = "SAFE_RETRY";
            event = "safe_retry";
        }
        if (!(st = oq__st(s, sql_resolve, err))) {
            rc = err ? err->code : OQ_EDB;
        } else {
            sqlite3_bind_text(st, 1, x.call_id, -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 2, state, -1, SQLITE_STATIC);
            oq__bind_text_or_null(st, 3, found ? (detail ? detail : "{}") : NULL);
            oq__bind_text_or_null(st, 4, error);
            oq__bind_text_or_null(st, 5, found ? eid : NULL);
            sqlite3_bind_int64(st, 6, now);
            rc = oq__done(s, st, "recovery resolve", err);
            sqlite3_clear_bindings(st);
        }
        if (rc == 0 && sqlite3_changes(s->db) == 1) {
            rc = oq__audit(s, x.call_id, event, x.attempt, x.fence,
                           found ? "reconciled: effect present" : "reconciled: no effect", now,
                           err);
            if (rc == 0 && found)
                rc = oq__emit_result(s, &x, "succeeded", detail ? detail : "{}", NULL, eid, now,
                                     err);
            else if (rc == 0 && error)
                rc = oq__emit_result(s, &x, "needs_review", NULL, error, NULL, now, err);
            done++;
        }
        free(eid);
        free(detail);
        free(error);
        oq_exec_clear(&x);
        if (rc) goto out;
    }
out:
    free(rows);
    if (n_recovered) *n_recovered = done;
    return rc;
}

int oq_cstore_purge(oq_cstore_t *s, int64_t before, int limit, int64_t *n_deleted,
                    oq_error_t *err)
{
    static const char sql_inbox[] =
        "DELETE FROM inbox WHERE message_id IN (SELECT message_id FROM inbox "
        "WHERE received_at < ?1 LIMIT ?2)";
    static const char sql_dlq[] =
        "DELETE FROM dlq WHERE id IN (SELECT id FROM dlq WHERE published_at IS NOT NULL AND "
        "created_at < ?1 LIMIT ?2)";
    const char *const sqls[] = {sql_inbox, sql_dlq};
    int64_t total = 0;
    for (int i = 0; i < 2; i++) {
        sqlite3_stmt *st = oq__st(s, sqls[i], err);
        if (!st) return err ? err->code : OQ_EDB;
        sqlite3_bind_int64(st, 1, before);
        sqlite3_bind_int(st, 2, limit);
        int rc = oq__done(s, st, "purge", err);
        if (rc) return rc;
        total += sqlite3_changes(s->db);
    }
    if (n_deleted) *n_deleted = total;
    return 0;
}

int oq_cstore_recover_needed(oq_cstore_t *s, int64_t now)
{
    static const char sql[] =
        "SELECT EXISTS (SELECT 1 FROM executions WHERE state = 'STARTED' AND lease_until < ?1) "
        "OR EXISTS (SELECT 1 FROM executions WHERE state = 'UNKNOWN')";
    sqlite3_stmt *st = oq__st(s, sql, NULL);
    int v = 1; /* on error, let recovery itself report it */
    if (!st) return v;
    sqlite3_bind_int64(st, 1, now);
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
    sqlite3_reset(st);
    return v;
}

/* --- scheduling and reads -------------------------------------------------------------------- */

int oq_cstore_due(oq_cstore_t *s, int64_t now, oq_due_t *out, int cap, int *n, oq_error_t *err)
{
    static const char sql[] =
        "SELECT call_id, tool, args FROM executions "
        "WHERE next_attempt_at <= ?1 AND (state = 'PLANNED' OR state = 'FAILED_RETRYABLE' OR "
        "state = 'SAFE_RETRY') ORDER BY next_attempt_at LIMIT ?2";
    sqlite3_stmt *st = oq__st(s, sql, err);
    int rc = SQLITE_DONE;
    *n = 0;
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int(st, 2, cap);
    while (*n < cap && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        oq_due_t *d = &out[*n];
        oq__colcpy(st, 0, d->call_id, sizeof(d->call_id));
        oq__colcpy(st, 1, d->tool, sizeof(d->tool));
        const char *args = (const char *)sqlite3_column_text(st, 2);
        json_t *a = args ? json_loads(args, 0, NULL) : NULL;
        d->blocks_ms = oq_tool_blocks(oq_tool_find(d->tool), a);
        json_decref(a);
        (*n)++;
    }
    rc = (*n == cap || rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "due select");
    sqlite3_reset(st);
    return rc;
}

int64_t oq_cstore_next_due(oq_cstore_t *s)
{
    static const char sql[] =
        "SELECT min(next_attempt_at) FROM executions WHERE next_attempt_at IS NOT NULL";
    sqlite3_stmt *st = oq__st(s, sql, NULL);
    int64_t v = INT64_MAX;
    if (!st) return v;
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
        v = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return v;
}

int oq_cstore_state_counts(oq_cstore_t *s, int64_t counts[OQ_X__COUNT], oq_error_t *err)
{
    static const char sql[] = "SELECT state, count(*) FROM executions GROUP BY state";
    sqlite3_stmt *st = oq__st(s, sql, err);
    int rc;
    for (int i = 0; i < OQ_X__COUNT; i++) counts[i] = 0;
    if (!st) return err ? err->code : OQ_EDB;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int k = oq_xstate_parse((const char *)sqlite3_column_text(st, 0));
        if (k >= 0) counts[k] = sqlite3_column_int64(st, 1);
    }
    rc = (rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "state counts");
    sqlite3_reset(st);
    return rc;
}

int64_t oq_cstore_effect_count(oq_cstore_t *s, const char *call_id)
{
    static const char sql_one[] = "SELECT count(*) FROM effects WHERE call_id = ?1";
    static const char sql_all[] = "SELECT count(*) FROM effects";
    sqlite3_stmt *st = oq__st(s, call_id ? sql_one : sql_all, NULL);
    int64_t v = OQ_EDB;
    if (!st) return OQ_EDB;
    if (call_id) sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return v;
}
