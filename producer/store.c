/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store.c: every SQL statement of the producer (calls, result_inbox, redrive schedule, audit,
 * retention, stats), as the row operations of producer_store.h, so that a second backend
 * (PostgreSQL) can be written beside this file. The outbox rows themselves go through common/db.c
 * (oq_outbox_append, oq_outbox_republish, oq_outbox_purge_published, oq_outbox_count), shared
 * with the consumer.
 *
 * No rules here: this file does not know what a replay or a stale result is, nor about the
 * writer's queue or its jobs. It runs the statement it is asked for on plain structs and
 * reports what the database did (a key that exists, a call id that is taken, a message id
 * already claimed), and producer/decide.c decides.
 *
 * Transactions: write operations run inside the caller's open write transaction (the group
 * commit writer's, or a service's own in oq_producer_submit_in_tx) and commit nothing, so a
 * decision's read and its writes are atomic. Purge owns its short transactions itself (a
 * bounded batch each, so the writer's wait for the lock is bounded too); the counts read one
 * snapshot in a read transaction.
 *
 * Dead letters (outbox_dead) are written by the relay; the producer reads the unhandled ones,
 * marks them handled and purges them. Their envelope fields are read with SQLite's JSON
 * functions, so a payload Kafka found too large is never copied into the process.
 *
 * Statements come from the store's oq_stmt_cache_t when it has one (the writer, the readers)
 * and are prepared per call otherwise (the in-transaction API on a caller's connection).
 */
#include "producer_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_envelope.h"

#define CALL_COLS                                                                                  \
    "call_id,tenant,idem_key,fingerprint,tool,args,state,result,error,attempt,effect_id,"          \
    "client_id,seq,created_at,updated_at,expires_at,callback_url"

static const char SQL_GET_BY_KEY[] =
    "SELECT " CALL_COLS " FROM calls WHERE tenant=?1 AND idem_key=?2";
static const char SQL_GET_BY_ID[] = "SELECT " CALL_COLS " FROM calls WHERE call_id=?1";
static const char SQL_INSERT_CALL[] =
    "INSERT INTO calls(call_id,tenant,idem_key,fingerprint,tool,args,state,attempt,client_id,"
    "seq,created_at,updated_at,expires_at,message_id,callback_url) "
    "VALUES(?1,?2,?3,?4,?5,?6,'pending',1,?7,?8,?9,?9,?10,?11,?12) "
    "ON CONFLICT(tenant,idem_key) DO NOTHING";
static const char SQL_RESET_CALL[] =
    "UPDATE calls SET state='pending',attempt=?2,result=NULL,error=NULL,updated_at=?3,"
    "expires_at=?4,message_id=?5,redrive_count=0,next_redrive_at=NULL "
    "WHERE call_id=?1 AND state='failed' AND attempt=?2-1";
static const char SQL_DELETE_CALL[] = "DELETE FROM calls WHERE call_id=?1";
static const char SQL_DELETE_AUDIT[] = "DELETE FROM audit WHERE call_id=?1";
static const char SQL_DELETE_INBOX[] = "DELETE FROM result_inbox WHERE call_id=?1";
static const char SQL_DELETE_DELIVERIES[] = "DELETE FROM webhook_deliveries WHERE call_id=?1";
static const char SQL_AUDIT_ADD[] =
    "INSERT INTO audit(ts,call_id,event,detail) VALUES(?1,?2,?3,?4)";
static const char SQL_AUDIT_LIST[] =
    "SELECT ts,event,detail FROM audit WHERE call_id=?1 ORDER BY id";
static const char SQL_INBOX_INSERT[] =
    "INSERT OR IGNORE INTO result_inbox(message_id,call_id,status,outcome,received_at) "
    "VALUES(?1,?2,?3,?4,?5)";
static const char SQL_GET_STATE[] =
    "SELECT state,attempt,callback_url IS NOT NULL FROM calls WHERE call_id=?1";
static const char SQL_SET_RESULT[] =
    "UPDATE calls SET state=?2,result=?3,error=?4,effect_id=COALESCE(?5,effect_id),"
    "updated_at=?6,next_redrive_at=CASE WHEN ?7 THEN NULL ELSE next_redrive_at END,"
    "expires_at=COALESCE(?8,expires_at) WHERE call_id=?1";
#define REDRIVE_COLS                                                                               \
    "call_id,tenant,idem_key,fingerprint,tool,args,state,attempt,message_id,redrive_count,"        \
    "created_at,updated_at,next_redrive_at"
/* Both read a partial index of schema/producer/0003_redrive.sql; their WHERE repeats the
 * index's own condition word for word, which is how SQLite knows it may use it. */
static const char SQL_REDRIVE_AGAIN[] =
    "SELECT " REDRIVE_COLS " FROM calls WHERE next_redrive_at IS NOT NULL AND next_redrive_at<=?1 "
    "ORDER BY next_redrive_at LIMIT ?2";
static const char SQL_REDRIVE_UNHEARD[] =
    "SELECT " REDRIVE_COLS " FROM calls WHERE next_redrive_at IS NULL AND "
    "(state = 'pending' OR state = 'running') AND updated_at<=?1 ORDER BY updated_at LIMIT ?2";
static const char SQL_REDRIVE_MARK[] =
    "UPDATE calls SET redrive_count=?2,next_redrive_at=?3,message_id=COALESCE(?4,message_id) "
    "WHERE call_id=?1";

/* Dead letters: the envelope's kind and attempt through SQLite's JSON functions (guarded by
 * json_valid, so a payload that is not JSON reads as NULL instead of failing the statement). */
static const char SQL_DEAD_LIST[] =
    "SELECT seq,message_id,topic,key,"
    "CASE WHEN json_valid(payload) THEN json_extract(payload,'$.kind') END,"
    "CASE WHEN json_valid(payload) THEN json_extract(payload,'$.attempt') END,"
    "reason,detail FROM outbox_dead WHERE handled_at IS NULL ORDER BY seq LIMIT ?1";
static const char SQL_DEAD_HANDLED[] = "UPDATE outbox_dead SET handled_at=?2 WHERE seq=?1";
static const char SQL_DEAD_ANY[] =
    "SELECT EXISTS(SELECT 1 FROM outbox_dead WHERE handled_at IS NULL)";

/* --- statement helpers ---------------------------------------------------------------------- */

static sqlite3_stmt *st_get(oq__producer_store_t *s, const char *sql, oq_error_t *err)
{
    if (s->cache) return oq_stmt_get(s->cache, sql, err);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) {
        oq_db_error(s->db, rc, err, "prepare");
        return NULL;
    }
    return st;
}

static void st_done(oq__producer_store_t *s, sqlite3_stmt *st)
{
    if (!st) return;
    if (s->cache) {
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
    } else {
        sqlite3_finalize(st);
    }
}

static int st_failed(oq_error_t *err)
{
    return err && err->code ? err->code : OQ_EDB;
}

static void bind_text(sqlite3_stmt *st, int i, const char *s)
{
    if (s)
        sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

/** Run a statement expecting no rows. */
static int st_exec(oq__producer_store_t *s, sqlite3_stmt *st, oq_error_t *err, const char *what)
{
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) return oq_db_error(s->db, rc, err, what);
    return 0;
}

/** A statement with one text parameter (an id) and no rows. */
static int exec_id(oq__producer_store_t *s, const char *sql, const char *id, oq_error_t *err,
                   const char *what)
{
    sqlite3_stmt *st = st_get(s, sql, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, id);
    int ret = st_exec(s, st, err, what);
    st_done(s, st);
    return ret;
}

/** A time column: 0 means NULL. */
static void bind_time(sqlite3_stmt *st, int i, int64_t t)
{
    if (t)
        sqlite3_bind_int64(st, i, t);
    else
        sqlite3_bind_null(st, i);
}

static char *col_strdup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

static void col_copy(sqlite3_stmt *st, int i, char *out, size_t n)
{
    const char *t = (const char *)sqlite3_column_text(st, i);
    snprintf(out, n, "%s", t ? t : "");
}

static int read_call(sqlite3_stmt *st, oq_call_t *c)
{
    memset(c, 0, sizeof *c);
    col_copy(st, 0, c->call_id, sizeof c->call_id);
    c->tenant = col_strdup(st, 1);
    c->idem_key = col_strdup(st, 2);
    col_copy(st, 3, c->fingerprint, sizeof c->fingerprint);
    c->tool = col_strdup(st, 4);
    c->args = col_strdup(st, 5);
    col_copy(st, 6, c->state, sizeof c->state);
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
    c->callback_url = col_strdup(st, 16);
    if (!c->tenant || !c->idem_key || !c->tool || !c->args) {
        oq_call_clear(c);
        return OQ_ENOMEM;
    }
    return 0;
}

static int append_outbox(oq__producer_store_t *s, const char *message_id, const char *call_id,
                         const char *payload, size_t payload_len, int64_t now_ms, oq_error_t *err)
{
    oq_outbox_row_t row = {message_id, OQ_TOPIC_CALLS, call_id, payload, payload_len, now_ms};
    return oq_outbox_append(s->db, s->cache, &row, err);
}

/* --- calls ---------------------------------------------------------------------------------- */

int oq__producer_store_in_tx(oq__producer_store_t *s)
{
    if (s->pg) return oq__producer_pg_in_tx(s);
    return !sqlite3_get_autocommit(s->db);
}

int oq__producer_store_begin(oq__producer_store_t *s, int wait_ms, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_begin(s, err);
    return oq_db_begin_immediate(s->db, wait_ms, err);
}

int oq__producer_store_commit(oq__producer_store_t *s, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_commit(s, err);
    return oq_db_commit(s->db, err);
}

void oq__producer_store_rollback(oq__producer_store_t *s)
{
    if (s->pg) {
        oq__producer_pg_rollback(s);
        return;
    }
    oq_db_rollback(s->db);
}

int oq__producer_store_insert_calls(oq__producer_store_t *s, const oq__producer_new_call_t *rows,
                                    int n, oq_error_t *err)
{
    return s->pg ? oq__producer_pg_insert_calls(s, rows, n, err) : 0;
}

int oq__producer_store_results_ahead(oq__producer_store_t *s, const oq_envelope_t *envs, int n,
                                     oq_error_t *err)
{
    if (!s->pg) return 0;
    oq__producer_pg_task_forget(); /* the task links read for the last batch */
    return oq__producer_pg_results_ahead(s, envs, n, err);
}

int oq__producer_store_results_done(oq__producer_store_t *s, oq_error_t *err)
{
    return s->pg ? oq__producer_pg_results_done(s, err) : 0;
}

int oq__producer_store_insert_call(oq__producer_store_t *s, const oq__producer_new_call_t *c,
                                   oq__producer_insert_t *result, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_insert_call(s, c, result, err);
    sqlite3_stmt *st = st_get(s, SQL_INSERT_CALL, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, c->call_id);
    bind_text(st, 2, c->tenant);
    bind_text(st, 3, c->idem_key);
    bind_text(st, 4, c->fingerprint);
    bind_text(st, 5, c->tool);
    sqlite3_bind_text(st, 6, c->args, (int)c->args_len, SQLITE_STATIC);
    bind_text(st, 7, c->client_id);
    if (c->has_seq)
        sqlite3_bind_int64(st, 8, c->seq);
    else
        sqlite3_bind_null(st, 8);
    sqlite3_bind_int64(st, 9, c->created_at);
    sqlite3_bind_int64(st, 10, c->expires_at);
    bind_text(st, 11, c->message_id);
    bind_text(st, 12, c->callback_url);
    int rc = sqlite3_step(st);
    int ret = 0;
    if (rc == SQLITE_CONSTRAINT_PRIMARYKEY) {
        /* The key was free (ON CONFLICT covers it), so only call_id can clash. The statement
         * aborted alone; the transaction is intact. */
        *result = OQ__INSERT_ID_TAKEN;
    } else if (rc != SQLITE_DONE) {
        ret = oq_db_error(s->db, rc, err, "insert call");
    } else {
        *result = sqlite3_changes(s->db) ? OQ__INSERT_NEW : OQ__INSERT_KEY_EXISTS;
    }
    st_done(s, st);
    if (ret || *result != OQ__INSERT_NEW) return ret;
    return append_outbox(s, c->message_id, c->call_id, c->payload, c->payload_len, c->created_at,
                         err);
}

/* \p call_id names the call in the not-found message; NULL: looked up by key. */
static int get_one(oq__producer_store_t *s, sqlite3_stmt *st, const char *call_id, oq_call_t *out,
                   oq_error_t *err, const char *what)
{
    int rc = sqlite3_step(st), ret;
    if (rc == SQLITE_ROW)
        ret = read_call(st, out);
    else if (rc == SQLITE_DONE && call_id)
        ret = oq_error_set(err, OQ_ENOTFOUND, 0, "no call %s", call_id);
    else if (rc == SQLITE_DONE)
        ret = oq_error_set(err, OQ_ENOTFOUND, 0, "no call for key");
    else
        ret = oq_db_error(s->db, rc, err, what);
    st_done(s, st);
    return ret;
}

int oq__producer_store_get(oq__producer_store_t *s, const char *call_id, oq_call_t *out,
                           oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_get(s, call_id, out, err);
    sqlite3_stmt *st = st_get(s, SQL_GET_BY_ID, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, call_id);
    return get_one(s, st, call_id, out, err, "get call");
}

int oq__producer_store_get_by_key(oq__producer_store_t *s, const char *tenant, const char *idem_key,
                                  oq_call_t *out, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_get_by_key(s, tenant, idem_key, out, err);
    sqlite3_stmt *st = st_get(s, SQL_GET_BY_KEY, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, tenant && *tenant ? tenant : OQ_DEFAULT_TENANT);
    bind_text(st, 2, idem_key);
    return get_one(s, st, NULL, out, err, "get call by key");
}

int oq__producer_store_reset_call(oq__producer_store_t *s, const oq__producer_attempt_t *a,
                                  oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_reset_call(s, a, err);
    sqlite3_stmt *st = st_get(s, SQL_RESET_CALL, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, a->call_id);
    sqlite3_bind_int64(st, 2, a->attempt);
    sqlite3_bind_int64(st, 3, a->updated_at);
    sqlite3_bind_int64(st, 4, a->expires_at);
    bind_text(st, 5, a->message_id);
    int ret = st_exec(s, st, err, "reset call");
    st_done(s, st);
    if (ret) return ret;
    if (sqlite3_changes(s->db) != 1)
        return oq_error_set(err, OQ_ESTATE, 0, "call %s is not failed at attempt %lld", a->call_id,
                            (long long)(a->attempt - 1));
    return append_outbox(s, a->message_id, a->call_id, a->payload, a->payload_len, a->updated_at,
                         err);
}

int oq__producer_store_delete_call(oq__producer_store_t *s, const char *call_id, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_delete_call(s, call_id, err);
    int ret;
    if ((ret = exec_id(s, SQL_DELETE_AUDIT, call_id, err, "delete audit")) ||
        (ret = exec_id(s, SQL_DELETE_INBOX, call_id, err, "delete result_inbox")) ||
        (ret = exec_id(s, SQL_DELETE_DELIVERIES, call_id, err, "delete webhook deliveries")))
        return ret;
    return exec_id(s, SQL_DELETE_CALL, call_id, err, "delete call");
}

/* --- results -------------------------------------------------------------------------------- */

int oq__producer_store_get_state(oq__producer_store_t *s, const char *call_id,
                                 oq__producer_call_state_t *out, int *found, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_get_state(s, call_id, out, found, err);
    sqlite3_stmt *st = st_get(s, SQL_GET_STATE, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, call_id);
    int rc = sqlite3_step(st), ret = 0;
    *found = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW) {
        col_copy(st, 0, out->state, sizeof out->state);
        out->attempt = sqlite3_column_int64(st, 1);
        out->has_callback = sqlite3_column_int(st, 2);
    } else if (rc != SQLITE_DONE) {
        ret = oq_db_error(s->db, rc, err, "get call state");
    }
    st_done(s, st);
    return ret;
}

int oq__producer_store_claim_result(oq__producer_store_t *s, const oq__producer_inbox_row_t *r,
                                    int *claimed, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_claim_result(s, r, claimed, err);
    sqlite3_stmt *st = st_get(s, SQL_INBOX_INSERT, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, r->message_id);
    bind_text(st, 2, r->call_id);
    bind_text(st, 3, r->status);
    bind_text(st, 4, r->outcome);
    sqlite3_bind_int64(st, 5, r->received_at);
    int ret = st_exec(s, st, err, "insert result_inbox");
    st_done(s, st);
    if (!ret) *claimed = sqlite3_changes(s->db) != 0;
    return ret;
}

int oq__producer_store_set_result(oq__producer_store_t *s, const oq__producer_result_t *r,
                                  oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_set_result(s, r, err);
    sqlite3_stmt *st = st_get(s, SQL_SET_RESULT, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, r->call_id);
    bind_text(st, 2, r->state);
    bind_text(st, 3, r->result);
    bind_text(st, 4, r->error);
    bind_text(st, 5, r->effect_id);
    sqlite3_bind_int64(st, 6, r->updated_at);
    sqlite3_bind_int(st, 7, r->settled != 0);
    bind_time(st, 8, r->expires_at);
    int ret = st_exec(s, st, err, "apply result");
    st_done(s, st);
    return ret;
}

/* --- redrive -------------------------------------------------------------------------------- */

void oq__producer_redrive_row_clear(oq__producer_redrive_row_t *r)
{
    if (!r) return;
    free(r->tenant);
    free(r->idem_key);
    free(r->tool);
    free(r->args);
    memset(r, 0, sizeof *r);
}

/* Appends the rows \p sql selects (?1 = \p t, ?2 = room left) to \p rows. */
static int redrive_select(oq__producer_store_t *s, const char *sql, int64_t t, int cap,
                          oq__producer_redrive_row_t *rows, int *n, oq_error_t *err)
{
    int rc = SQLITE_DONE, ret = 0;
    if (*n >= cap) return 0;
    sqlite3_stmt *st = st_get(s, sql, err);
    if (!st) return st_failed(err);
    sqlite3_bind_int64(st, 1, t);
    sqlite3_bind_int(st, 2, cap - *n);
    while (*n < cap && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        oq__producer_redrive_row_t *r = &rows[*n];
        memset(r, 0, sizeof *r);
        col_copy(st, 0, r->call_id, sizeof r->call_id);
        r->tenant = col_strdup(st, 1);
        r->idem_key = col_strdup(st, 2);
        col_copy(st, 3, r->fingerprint, sizeof r->fingerprint);
        r->tool = col_strdup(st, 4);
        r->args = col_strdup(st, 5);
        col_copy(st, 6, r->state, sizeof r->state);
        r->attempt = sqlite3_column_int64(st, 7);
        col_copy(st, 8, r->message_id, sizeof r->message_id);
        r->redrive_count = sqlite3_column_int64(st, 9);
        r->created_at = sqlite3_column_int64(st, 10);
        r->updated_at = sqlite3_column_int64(st, 11);
        r->next_redrive_at = sqlite3_column_int64(st, 12);
        (*n)++;
        if (!r->tenant || !r->idem_key || !r->tool || !r->args) {
            ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            break;
        }
    }
    if (ret == 0 && *n < cap && rc != SQLITE_DONE) ret = oq_db_error(s->db, rc, err, "redrive due");
    st_done(s, st);
    return ret;
}

int oq__producer_store_redrive_due(oq__producer_store_t *s, int64_t now, int64_t unchanged_since,
                                   int cap, oq__producer_redrive_row_t *rows, int *n,
                                   oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_redrive_due(s, now, unchanged_since, cap, rows, n, err);
    *n = 0;
    int ret = redrive_select(s, SQL_REDRIVE_AGAIN, now, cap, rows, n, err);
    if (ret == 0) ret = redrive_select(s, SQL_REDRIVE_UNHEARD, unchanged_since, cap, rows, n, err);
    if (ret) {
        for (int i = 0; i < *n; i++)
            oq__producer_redrive_row_clear(&rows[i]);
        *n = 0;
    }
    return ret;
}

int oq__producer_store_redrive_mark(oq__producer_store_t *s, const oq__producer_redrive_mark_t *m,
                                    oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_redrive_mark(s, m, err);
    sqlite3_stmt *st = st_get(s, SQL_REDRIVE_MARK, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, m->call_id);
    sqlite3_bind_int64(st, 2, m->redrive_count);
    bind_time(st, 3, m->next_redrive_at);
    bind_text(st, 4, m->message_id);
    int ret = st_exec(s, st, err, "redrive mark");
    st_done(s, st);
    return ret;
}

int oq__producer_store_republish(oq__producer_store_t *s, const char *message_id,
                                 const char *call_id, const char *payload, size_t payload_len,
                                 int64_t now, oq_outbox_republish_t *what, oq_error_t *err)
{
    if (s->pg)
        return oq__producer_pg_republish(s, message_id, call_id, payload, payload_len, now, what,
                                         err);
    oq_outbox_row_t row = {message_id, OQ_TOPIC_CALLS, call_id, payload, payload_len, now};
    return oq_outbox_republish(s->db, s->cache, &row, what, err);
}

/* --- webhook deliveries ---------------------------------------------------------------------- */

#define DELIVERY_COLS                                                                              \
    "delivery_id,call_id,attempt,tenant,url,body,state,tries,next_at,last_status,last_error,"      \
    "created_at,updated_at"
static const char SQL_DELIVERY_ADD[] =
    "INSERT INTO webhook_deliveries(delivery_id,call_id,attempt,tenant,url,body,state,tries,"
    "next_at,created_at,updated_at) VALUES(?1,?2,?3,?4,?5,?6,'pending',0,?7,?8,?8) "
    "ON CONFLICT(call_id,attempt) DO NOTHING";
/* Reads the partial index webhook_due: its WHERE repeats the index's condition. */
static const char SQL_DELIVERY_DUE[] =
    "SELECT " DELIVERY_COLS " FROM webhook_deliveries WHERE state = 'pending' AND next_at<=?1 "
    "ORDER BY next_at LIMIT ?2";
static const char SQL_DELIVERY_MARK[] =
    "UPDATE webhook_deliveries SET state=?2,tries=?3,next_at=?4,last_status=?5,last_error=?6,"
    "updated_at=?7 WHERE delivery_id=?1 AND state='pending'";

void oq__producer_delivery_clear(oq__producer_delivery_t *d)
{
    if (!d) return;
    free(d->tenant);
    free(d->url);
    free(d->body);
    free(d->last_error);
    memset(d, 0, sizeof *d);
}

static int read_delivery(sqlite3_stmt *st, oq__producer_delivery_t *d)
{
    memset(d, 0, sizeof *d);
    col_copy(st, 0, d->delivery_id, sizeof d->delivery_id);
    col_copy(st, 1, d->call_id, sizeof d->call_id);
    d->attempt = sqlite3_column_int64(st, 2);
    d->tenant = col_strdup(st, 3);
    d->url = col_strdup(st, 4);
    d->body = col_strdup(st, 5);
    col_copy(st, 6, d->state, sizeof d->state);
    d->tries = sqlite3_column_int64(st, 7);
    d->next_at = sqlite3_column_int64(st, 8);
    d->last_status = sqlite3_column_type(st, 9) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 9);
    d->last_error = col_strdup(st, 10);
    d->created_at = sqlite3_column_int64(st, 11);
    d->updated_at = sqlite3_column_int64(st, 12);
    if (!d->tenant || !d->url || !d->body) {
        oq__producer_delivery_clear(d);
        return OQ_ENOMEM;
    }
    return 0;
}

int oq__producer_store_delivery_add(oq__producer_store_t *s, const oq__producer_delivery_t *d,
                                    oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_delivery_add(s, d, err);
    sqlite3_stmt *st = st_get(s, SQL_DELIVERY_ADD, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, d->delivery_id);
    bind_text(st, 2, d->call_id);
    sqlite3_bind_int64(st, 3, d->attempt);
    bind_text(st, 4, d->tenant);
    bind_text(st, 5, d->url);
    bind_text(st, 6, d->body);
    sqlite3_bind_int64(st, 7, d->next_at);
    sqlite3_bind_int64(st, 8, d->created_at);
    int ret = st_exec(s, st, err, "insert webhook delivery");
    st_done(s, st);
    return ret;
}

int oq__producer_store_delivery_due(oq__producer_store_t *s, int64_t now, int cap,
                                    oq__producer_delivery_t *rows, int *n, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_delivery_due(s, now, cap, rows, n, err);
    *n = 0;
    sqlite3_stmt *st = st_get(s, SQL_DELIVERY_DUE, err);
    if (!st) return st_failed(err);
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int(st, 2, cap);
    int rc = SQLITE_DONE, ret = 0;
    while (*n < cap && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((ret = read_delivery(st, &rows[*n]))) {
            oq_error_set(err, ret, 0, "out of memory");
            break;
        }
        (*n)++;
    }
    if (!ret && rc != SQLITE_ROW && rc != SQLITE_DONE)
        ret = oq_db_error(s->db, rc, err, "due webhook deliveries");
    st_done(s, st);
    if (ret) {
        for (int i = 0; i < *n; i++)
            oq__producer_delivery_clear(&rows[i]);
        *n = 0;
    }
    return ret;
}

int oq__producer_store_delivery_mark(oq__producer_store_t *s, const oq__producer_delivery_mark_t *m,
                                     int *changed, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_delivery_mark(s, m, changed, err);
    sqlite3_stmt *st = st_get(s, SQL_DELIVERY_MARK, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, m->delivery_id);
    bind_text(st, 2, m->state);
    sqlite3_bind_int64(st, 3, m->tries);
    bind_time(st, 4, m->next_at);
    if (m->last_status >= 0)
        sqlite3_bind_int64(st, 5, m->last_status);
    else
        sqlite3_bind_null(st, 5);
    bind_text(st, 6, m->last_error);
    sqlite3_bind_int64(st, 7, m->updated_at);
    int ret = st_exec(s, st, err, "mark webhook delivery");
    st_done(s, st);
    if (!ret && changed) *changed = sqlite3_changes(s->db) != 0;
    return ret;
}

static int delivery_select(oq__producer_store_t *s, const char *id, const char *call_id,
                           const char *state, int limit, oq__producer_delivery_t **rows, size_t *n,
                           oq_error_t *err);

int oq__producer_store_delivery_list(oq__producer_store_t *s, const char *id, const char *state,
                                     int limit, oq__producer_delivery_t **rows, size_t *n,
                                     oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_delivery_list(s, id, state, limit, rows, n, err);
    return delivery_select(s, id, NULL, state, limit, rows, n, err);
}

int oq__producer_store_delivery_of_call(oq__producer_store_t *s, const char *call_id,
                                        oq__producer_delivery_t **rows, size_t *n, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_delivery_of_call(s, call_id, rows, n, err);
    return delivery_select(s, NULL, call_id, NULL, 0, rows, n, err);
}

/* One delivery (\p id), a call's (\p call_id: the UNIQUE(call_id, attempt) index), or up to
 * \p limit in \p state. */
static int delivery_select(oq__producer_store_t *s, const char *id, const char *call_id,
                           const char *state, int limit, oq__producer_delivery_t **rows, size_t *n,
                           oq_error_t *err)
{
    *rows = NULL;
    *n = 0;
    sqlite3_stmt *st = NULL;
    const char *sql = id ? "SELECT " DELIVERY_COLS " FROM webhook_deliveries WHERE delivery_id=?1"
                      : call_id ? "SELECT " DELIVERY_COLS
                                  " FROM webhook_deliveries WHERE call_id=?1 "
                                  "ORDER BY attempt"
                                : "SELECT " DELIVERY_COLS " FROM webhook_deliveries WHERE state=?1 "
                                  "ORDER BY updated_at, delivery_id LIMIT ?2";
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(s->db, rc, err, "list webhook deliveries");
    bind_text(st, 1, id ? id : call_id ? call_id : state);
    if (!id && !call_id) sqlite3_bind_int(st, 2, limit > 0 ? limit : 100);
    int ret = 0;
    size_t cap = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            oq__producer_delivery_t *nv = realloc(*rows, ncap * sizeof *nv);
            if (!nv) {
                ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
                break;
            }
            *rows = nv;
            cap = ncap;
        }
        if ((ret = read_delivery(st, &(*rows)[*n]))) {
            oq_error_set(err, ret, 0, "out of memory");
            break;
        }
        (*n)++;
    }
    if (!ret && rc != SQLITE_DONE && rc != SQLITE_ROW)
        ret = oq_db_error(s->db, rc, err, "list webhook deliveries");
    sqlite3_finalize(st);
    if (ret) {
        for (size_t i = 0; i < *n; i++)
            oq__producer_delivery_clear(&(*rows)[i]);
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
    return ret;
}

int oq__producer_store_delivery_redrive(oq__producer_store_t *s, const char *id, int64_t now,
                                        int *changed, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_delivery_redrive(s, id, now, changed, err);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db,
                                "UPDATE webhook_deliveries SET state='pending',tries=0,next_at=?2,"
                                "updated_at=?2,created_at=?2 WHERE delivery_id=?1 AND state='dead'",
                                -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(s->db, rc, err, "redrive webhook delivery");
    bind_text(st, 1, id);
    sqlite3_bind_int64(st, 2, now);
    rc = sqlite3_step(st);
    int ret = rc == SQLITE_DONE ? 0 : oq_db_error(s->db, rc, err, "redrive webhook delivery");
    sqlite3_finalize(st);
    if (!ret) *changed = sqlite3_changes(s->db) != 0;
    return ret;
}

int oq__producer_store_delivery_counts(oq__producer_store_t *s, int64_t *pending,
                                       int64_t *oldest_created_at, int64_t *dead, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_delivery_counts(s, pending, oldest_created_at, dead, err);
    sqlite3_stmt *st = NULL;
    /* both from the partial indexes (webhook_due, webhook_dead) */
    int rc = sqlite3_prepare_v2(
        s->db,
        "SELECT (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'),"
        "(SELECT COALESCE(min(created_at),0) FROM webhook_deliveries WHERE state = 'pending'),"
        "(SELECT count(*) FROM webhook_deliveries WHERE state = 'dead')",
        -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(s->db, rc, err, "count webhook deliveries");
    rc = sqlite3_step(st);
    int ret = 0;
    if (rc == SQLITE_ROW) {
        *pending = sqlite3_column_int64(st, 0);
        *oldest_created_at = sqlite3_column_int64(st, 1);
        *dead = sqlite3_column_int64(st, 2);
    } else {
        ret = oq_db_error(s->db, rc, err, "count webhook deliveries");
    }
    sqlite3_finalize(st);
    return ret;
}

/* --- audit ---------------------------------------------------------------------------------- */

int oq__producer_store_audit_add(oq__producer_store_t *s, int64_t ts, const char *call_id,
                                 const char *event, const char *detail, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_audit_add(s, ts, call_id, event, detail, err);
    sqlite3_stmt *st = st_get(s, SQL_AUDIT_ADD, err);
    if (!st) return st_failed(err);
    sqlite3_bind_int64(st, 1, ts);
    bind_text(st, 2, call_id);
    bind_text(st, 3, event);
    bind_text(st, 4, detail);
    int ret = st_exec(s, st, err, "insert audit");
    st_done(s, st);
    return ret;
}

int oq__producer_store_audit_list(oq__producer_store_t *s, const char *call_id,
                                  oq_audit_row_t **rows, size_t *n, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_audit_list(s, call_id, rows, n, err);
    oq_audit_row_t *v = NULL;
    size_t cnt = 0, cap = 0;
    int ret = 0, rc;
    sqlite3_stmt *st = st_get(s, SQL_AUDIT_LIST, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, call_id);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (cnt == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            oq_audit_row_t *nv = realloc(v, ncap * sizeof *nv);
            if (!nv) {
                ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
                goto out;
            }
            v = nv;
            cap = ncap;
        }
        oq_audit_row_t *r = &v[cnt];
        r->ts = sqlite3_column_int64(st, 0);
        r->event = col_strdup(st, 1);
        r->detail = col_strdup(st, 2);
        cnt++;
        if (!r->event) {
            ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            goto out;
        }
    }
    if (rc != SQLITE_DONE) ret = oq_db_error(s->db, rc, err, "audit");
out:
    st_done(s, st);
    if (ret) {
        oq_audit_free(v, cnt);
        return ret;
    }
    *rows = v;
    *n = cnt;
    return 0;
}

/* --- dead letters --------------------------------------------------------------------------- */

void oq__producer_dead_free(oq__producer_dead_t *rows, size_t n)
{
    for (size_t i = 0; rows && i < n; i++) {
        free(rows[i].message_id);
        free(rows[i].topic);
        free(rows[i].key);
        free(rows[i].kind);
        free(rows[i].reason);
        free(rows[i].detail);
    }
    free(rows);
}

int oq__producer_store_dead_list(oq__producer_store_t *s, int max, oq__producer_dead_t **rows,
                                 size_t *n, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_dead_list(s, max, rows, n, err);
    oq__producer_dead_t *v = NULL;
    size_t cnt = 0;
    int ret = 0, rc = SQLITE_DONE;
    *rows = NULL;
    *n = 0;
    if (max <= 0) return 0;
    sqlite3_stmt *st = st_get(s, SQL_DEAD_LIST, err);
    if (!st) return st_failed(err);
    sqlite3_bind_int(st, 1, max);
    v = calloc((size_t)max, sizeof *v);
    if (!v) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    while (cnt < (size_t)max && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        oq__producer_dead_t *d = &v[cnt++];
        d->seq = sqlite3_column_int64(st, 0);
        d->message_id = col_strdup(st, 1);
        d->topic = col_strdup(st, 2);
        d->key = col_strdup(st, 3);
        d->kind = col_strdup(st, 4);
        d->attempt = sqlite3_column_type(st, 5) == SQLITE_INTEGER ? sqlite3_column_int64(st, 5) : 0;
        d->reason = col_strdup(st, 6);
        d->detail = col_strdup(st, 7);
        if (!d->message_id || !d->topic || !d->key || !d->reason) {
            ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            goto out;
        }
    }
    if (cnt < (size_t)max && rc != SQLITE_DONE) ret = oq_db_error(s->db, rc, err, "dead letters");
out:
    st_done(s, st);
    if (ret) {
        oq__producer_dead_free(v, cnt);
        return ret;
    }
    *rows = v;
    *n = cnt;
    return 0;
}

int oq__producer_store_dead_handled(oq__producer_store_t *s, int64_t seq, int64_t now_ms,
                                    oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_dead_handled(s, seq, now_ms, err);
    sqlite3_stmt *st = st_get(s, SQL_DEAD_HANDLED, err);
    if (!st) return st_failed(err);
    sqlite3_bind_int64(st, 1, seq);
    sqlite3_bind_int64(st, 2, now_ms);
    int ret = st_exec(s, st, err, "dead letter handled");
    st_done(s, st);
    return ret;
}

int oq__producer_store_dead_any(oq__producer_store_t *s, int *any, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_dead_any(s, any, err);
    *any = 0;
    sqlite3_stmt *st = st_get(s, SQL_DEAD_ANY, err);
    if (!st) return st_failed(err);
    int rc = sqlite3_step(st);
    int ret = 0;
    if (rc == SQLITE_ROW)
        *any = sqlite3_column_int(st, 0);
    else
        ret = oq_db_error(s->db, rc, err, "dead letters");
    st_done(s, st);
    return ret;
}

/* --- retention ------------------------------------------------------------------------------ */

static int count_query(sqlite3 *db, const char *sql, int64_t *out, oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(db, rc, err, "prepare count");
    rc = sqlite3_step(st);
    int ret = 0;
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_int64(st, 0);
    else
        ret = oq_db_error(db, rc, err, "count");
    sqlite3_finalize(st);
    return ret;
}

int oq__producer_store_purge_batch(oq__producer_store_t *s, int64_t now_ms, int64_t ttl, int batch,
                                   oq_purge_stats_t *stats, int *more, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_purge_batch(s, now_ms, ttl, batch, stats, more, err);
    sqlite3 *db = s->db;
    int ret;
    *more = 0;
    if ((ret = oq_db_begin_immediate(db, 10000, err))) return ret;
    /* Keep the ids of this batch in a temp table so the dependent deletes use indexes. */
    char sql[512];
    snprintf(sql, sizeof sql,
             "CREATE TEMP TABLE IF NOT EXISTS purge_ids(call_id TEXT PRIMARY KEY);"
             "DELETE FROM temp.purge_ids;"
             "INSERT INTO temp.purge_ids SELECT call_id FROM calls WHERE expires_at<=%lld AND "
             "(state='succeeded' OR state='failed') ORDER BY expires_at LIMIT %d;",
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
        stats->audit += sqlite3_changes(db);
        if ((ret = oq_db_exec(db,
                              "DELETE FROM result_inbox WHERE call_id IN (SELECT call_id FROM "
                              "temp.purge_ids)",
                              err)))
            goto fail;
        stats->result_inbox += sqlite3_changes(db);
        if ((ret = oq_db_exec(db,
                              "DELETE FROM webhook_deliveries WHERE call_id IN (SELECT call_id "
                              "FROM temp.purge_ids)",
                              err)))
            goto fail;
        if ((ret = oq_db_exec(db,
                              "DELETE FROM calls WHERE call_id IN (SELECT call_id FROM "
                              "temp.purge_ids)",
                              err)))
            goto fail;
        stats->calls += sqlite3_changes(db);
    }
    /* Delivered outbox rows created at or before now - ttl (the cutoff is exclusive). */
    int64_t ob = 0;
    if ((ret = oq_outbox_purge_published(db, now_ms - ttl + 1, batch, &ob, err))) goto fail;
    stats->outbox += ob;
    /* Results for calls that do not exist here (unknown_call) have no call to be purged with:
     * they go by age. */
    snprintf(sql, sizeof sql,
             "DELETE FROM result_inbox WHERE message_id IN (SELECT message_id FROM result_inbox "
             "WHERE received_at<=%lld AND call_id NOT IN (SELECT call_id FROM calls) LIMIT %d)",
             (long long)(now_ms - ttl), batch);
    if ((ret = oq_db_exec(db, sql, err))) goto fail;
    int64_t orphans = sqlite3_changes(db);
    stats->result_inbox += orphans;
    /* Dead letters the producer acted on (their calls failed), once past the key TTL. */
    snprintf(sql, sizeof sql,
             "DELETE FROM outbox_dead WHERE seq IN (SELECT seq FROM outbox_dead WHERE handled_at "
             "IS NOT NULL AND dead_at<=%lld LIMIT %d)",
             (long long)(now_ms - ttl), batch);
    if ((ret = oq_db_exec(db, sql, err))) goto fail;
    int64_t dead = sqlite3_changes(db);
    stats->dead += dead;
    if ((ret = oq_db_commit(db, err))) goto fail;
    stats->batches++;
    *more = (n >= batch) || (ob >= batch) || (orphans >= batch) || (dead >= batch);
    return 0;
fail:
    oq_db_rollback(db);
    return ret;
}

/* --- stats ---------------------------------------------------------------------------------- */

int oq__producer_store_counts(oq__producer_store_t *s, oq__counts_what_t what,
                              oq__producer_counts_t *out, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_counts(s, what, out, err);
    sqlite3 *db = s->db;
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    /* A read transaction so that the numbers are one snapshot. */
    int rc = sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
    if (rc != SQLITE_OK) return oq_db_error(db, rc, err, "begin");
    int ret;
    /* Only rows that left 'pending' are in an index (calls_settled, see
     * schema/producer/0002_calls_hot_path.sql): pending = all - the others. */
    if ((ret = count_query(db, "SELECT count(*) FROM calls", &out->calls, err))) goto out;
    rc = sqlite3_prepare_v2(
        db, "SELECT state,count(*) FROM calls WHERE state<>'pending' GROUP BY state", -1, &st,
        NULL);
    if (rc != SQLITE_OK) {
        ret = oq_db_error(db, rc, err, "prepare stats");
        goto out;
    }
    int64_t settled = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *state = (const char *)sqlite3_column_text(st, 0);
        int64_t n = sqlite3_column_int64(st, 1);
        settled += n;
        if (!state) continue;
        if (strcmp(state, "running") == 0)
            out->running = n;
        else if (strcmp(state, "succeeded") == 0)
            out->succeeded = n;
        else if (strcmp(state, "failed") == 0)
            out->failed = n;
        else if (strcmp(state, "needs_review") == 0)
            out->needs_review = n;
    }
    if (rc != SQLITE_DONE) {
        ret = oq_db_error(db, rc, err, "stats");
        goto out;
    }
    out->pending = out->calls - settled;
    /* The oldest pending call through the two partial indexes of the open calls (0003_redrive:
     * a pending call is in calls_unheard or in calls_redrive), not a scan of every call: each
     * WHERE repeats its index's condition word for word. */
    if ((what == OQ__COUNTS_ALL &&
         (ret = count_query(
              db, "SELECT count(DISTINCT effect_id) FROM calls WHERE effect_id IS NOT NULL",
              &out->effects, err))) ||
        (ret = oq_outbox_count(db, &out->outbox_pending, &out->outbox_rows, err)) ||
        (what == OQ__COUNTS_ALL &&
         (ret = count_query(db, "SELECT count(*) FROM result_inbox", &out->result_inbox, err))) ||
        (ret = count_query(db,
                           "SELECT COALESCE(min(m),0) FROM (SELECT min(created_at) AS m FROM "
                           "calls WHERE next_redrive_at IS NULL AND (state = 'pending' OR "
                           "state = 'running') AND state='pending' UNION ALL SELECT "
                           "min(created_at) FROM calls WHERE next_redrive_at IS NOT NULL AND "
                           "state='pending')",
                           &out->oldest_pending_created_at, err)))
        goto out;
out:
    sqlite3_finalize(st);
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    return ret;
}

/* --- the operators' list of calls (onceq console) --------------------------------------------- */

/*
 * Newest first by rowid: calls is a rowid table and a submit takes max(rowid) + 1, so rowid
 * order is insertion order, and paging on it needs no index of its own (a created_at index
 * would cost every submit one more b-tree). A page reads rows with rowid in [lo, hi): the
 * window is the whole table when an index answers (a settled state: calls_settled holds
 * (state, rowid)), and OQ__LIST_SCAN rows otherwise, so no filter reads the whole table.
 */
#define OQ__LIST_SCAN 200000

int oq__producer_store_list(oq__producer_store_t *s, const oq__producer_list_q_t *q,
                            oq__producer_listed_t **out, size_t *n, int64_t *next, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_list(s, q, out, n, next, err);
    char sql[512];
    int indexed = q->state && strcmp(q->state, "pending") != 0;
    snprintf(sql, sizeof sql,
             "SELECT " CALL_COLS ",rowid FROM calls WHERE rowid < ?1 AND rowid >= ?2%s%s%s%s%s "
             "ORDER BY rowid DESC LIMIT ?8",
             q->state ? (indexed ? " AND state=?3 AND state<>'pending'" : " AND state=?3") : "",
             q->tool ? " AND +tool=?4" : "", q->tenant ? " AND +tenant=?5" : "",
             q->since_ms ? " AND created_at >= ?6" : "",
             q->until_ms ? " AND created_at <= ?7" : "");
    int64_t hi = q->before, lo = q->floor > 0 ? q->floor : 0;
    if (!indexed && (!hi || hi - OQ__LIST_SCAN > lo)) {
        if (!hi) {
            sqlite3_stmt *m = NULL;
            if (sqlite3_prepare_v2(s->db, "SELECT COALESCE(max(rowid),0)+1 FROM calls", -1, &m,
                                   NULL) != SQLITE_OK)
                return oq_db_error(s->db, sqlite3_errcode(s->db), err, "list");
            hi = sqlite3_step(m) == SQLITE_ROW ? sqlite3_column_int64(m, 0) : 1;
            sqlite3_finalize(m);
        }
        if (hi - OQ__LIST_SCAN > lo) lo = hi - OQ__LIST_SCAN;
    }
    if (!hi) hi = INT64_MAX;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(s->db, rc, err, "list");
    sqlite3_bind_int64(st, 1, hi);
    sqlite3_bind_int64(st, 2, lo);
    if (q->state) bind_text(st, 3, q->state);
    if (q->tool) bind_text(st, 4, q->tool);
    if (q->tenant) bind_text(st, 5, q->tenant);
    if (q->since_ms) sqlite3_bind_int64(st, 6, q->since_ms);
    if (q->until_ms) sqlite3_bind_int64(st, 7, q->until_ms);
    sqlite3_bind_int(st, 8, q->limit);
    oq__producer_listed_t *v = calloc((size_t)q->limit, sizeof *v);
    size_t k = 0;
    int ret = 0;
    if (!v) {
        sqlite3_finalize(st);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && k < (size_t)q->limit) {
        v[k].pos = sqlite3_column_int64(st, 17);
        if ((ret = read_call(st, &v[k].call)) != 0) break;
        k++;
    }
    if (!ret && rc != SQLITE_ROW && rc != SQLITE_DONE) ret = oq_db_error(s->db, rc, err, "list");
    sqlite3_finalize(st);
    if (ret) {
        oq__producer_listed_free(v, k);
        return ret == OQ_ENOMEM ? oq_error_set(err, OQ_ENOMEM, 0, "out of memory") : ret;
    }
    /* the next page: below the last row shown, or below the window when it was not filled */
    *next = k == (size_t)q->limit ? v[k - 1].pos : (lo > (q->floor > 0 ? q->floor : 0) ? lo : 0);
    *out = v;
    *n = k;
    return 0;
}

void oq__producer_listed_free(oq__producer_listed_t *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        oq_call_clear(&v[i].call);
    free(v);
}

/* The first rowid whose call was created at or after \p t (rowids follow creation), or
 * max(rowid) + 1: a binary search of about 20 point reads. */
int oq__producer_store_pos_at(oq__producer_store_t *s, int64_t t, int64_t *pos, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_pos_at(s, t, pos, err);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        s->db, "SELECT rowid,created_at FROM calls WHERE rowid >= ?1 ORDER BY rowid LIMIT 1", -1,
        &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(s->db, rc, err, "list");
    int64_t lo = 0, hi = INT64_MAX / 2;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        sqlite3_bind_int64(st, 1, mid);
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW && sqlite3_column_int64(st, 1) < t)
            lo = sqlite3_column_int64(st, 0) + 1;
        else if (rc == SQLITE_ROW || rc == SQLITE_DONE)
            hi = mid;
        else
            break;
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return oq_db_error(s->db, rc, err, "list");
    *pos = lo;
    return 0;
}

/* The smallest tenant greater than \p after ("" = the first), through the (tenant, idem_key)
 * index; 0 with \p out "" when there is none. */
int oq__producer_store_next_tenant(oq__producer_store_t *s, const char *after,
                                   char out[OQ_MAX_NAME_LEN + 1], oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_next_tenant(s, after, out, err);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(
        s->db, "SELECT tenant FROM calls WHERE tenant > ?1 ORDER BY tenant LIMIT 1", -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(s->db, rc, err, "list");
    bind_text(st, 1, after);
    out[0] = 0;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) col_copy(st, 0, out, OQ_MAX_NAME_LEN + 1);
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return oq_db_error(s->db, rc, err, "list");
    return 0;
}

/* --- tasks ------------------------------------------------------------------------------------ */

/* Task rows (schema/producer/0006_tasks.sql); on PostgreSQL their twins in store_pg.c. */

static const char SQL_TASK_INSERT[] =
    "INSERT INTO tasks(task_id,tenant,idem_key,fingerprint,spec,status,reason,created_at,"
    "updated_at) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?8) ON CONFLICT(tenant,idem_key) DO NOTHING";
#define TASK_COLS                                                                                  \
    "task_id,tenant,idem_key,fingerprint,spec,status,reason,created_at,updated_at,review_fence"
static const char SQL_TASK_GET[] = "SELECT " TASK_COLS " FROM tasks WHERE task_id=?1";
static const char SQL_TASK_GET_KEY[] =
    "SELECT " TASK_COLS " FROM tasks WHERE tenant=?1 AND idem_key=?2";
static const char SQL_TASK_UPDATE[] =
    "UPDATE tasks SET status=?2,reason=?3,updated_at=?4,review_fence=?5 WHERE task_id=?1";
static const char SQL_STEP_PUT[] =
    "INSERT INTO task_steps(task_id,idx,name,status,call_id,comp_call_id,comp_attempts,"
    "comp_next_at) VALUES(?1,?2,?3,?4,?5,?6,?7,?8) ON CONFLICT(task_id,idx) DO UPDATE SET "
    "status=excluded.status,call_id=excluded.call_id,comp_call_id=excluded.comp_call_id,"
    "comp_attempts=excluded.comp_attempts,comp_next_at=excluded.comp_next_at";
static const char SQL_STEPS[] =
    "SELECT s.idx,s.name,s.status,s.call_id,s.comp_call_id,s.comp_attempts,s.comp_next_at,"
    "c.state,c.result,c.error,c.attempt,k.state,k.result,k.error,k.attempt FROM task_steps s "
    "LEFT JOIN calls c ON c.call_id=s.call_id LEFT JOIN calls k ON k.call_id=s.comp_call_id "
    "WHERE s.task_id=?1 ORDER BY s.idx";
static const char SQL_TASK_LINK[] =
    "INSERT INTO task_calls(call_id,task_id,idx,role) VALUES(?1,?2,?3,?4) "
    "ON CONFLICT(call_id) DO NOTHING";
static const char SQL_TASK_OF_CALL[] = "SELECT task_id,idx,role FROM task_calls WHERE call_id=?1";
static const char SQL_TASK_DUE[] =
    "SELECT task_id,idx FROM task_steps WHERE comp_next_at IS NOT NULL AND comp_next_at<=?1 "
    "ORDER BY comp_next_at LIMIT ?2";
/* Newest first by position (rowid: tasks are inserted in creation order), a page's `next` being
 * the position of its last task; the filters are optional (NULL binds match all). A status is
 * read through tasks_status, which is (status, rowid): that status's tasks alone, in order. */
#define TASK_LIST_TAIL                                                                             \
    " AND (?2 IS NULL OR tenant=?2) AND (?3 IS NULL OR idem_key=?3) AND rowid<?4 ORDER BY "        \
    "rowid DESC LIMIT ?5"
static const char SQL_TASK_LIST[] =
    "SELECT rowid,task_id FROM tasks WHERE ?1 IS NULL" TASK_LIST_TAIL;
static const char SQL_TASK_LIST_STATUS[] =
    "SELECT rowid,task_id FROM tasks WHERE status=?1" TASK_LIST_TAIL;

void oq__task_row_clear(oq__task_row_t *t)
{
    if (!t) return;
    free(t->tenant);
    free(t->idem_key);
    free(t->spec);
    free(t->reason);
    memset(t, 0, sizeof *t);
}

void oq__task_steps_free(oq__task_step_row_t *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++) {
        free(v[i].name);
        free(v[i].result);
        free(v[i].error);
        free(v[i].comp_result);
        free(v[i].comp_error);
    }
    free(v);
}

int oq__task_store_insert(oq__producer_store_t *s, const oq__task_row_t *t, int *exists,
                          oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_task_insert(s, t, exists, err);
    sqlite3_stmt *st = st_get(s, SQL_TASK_INSERT, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, t->task_id);
    bind_text(st, 2, t->tenant);
    bind_text(st, 3, t->idem_key);
    bind_text(st, 4, t->fingerprint);
    bind_text(st, 5, t->spec);
    bind_text(st, 6, t->status);
    bind_text(st, 7, t->reason);
    sqlite3_bind_int64(st, 8, t->created_at);
    int ret = st_exec(s, st, err, "insert task");
    if (!ret) *exists = sqlite3_changes(s->db) == 0;
    st_done(s, st);
    return ret;
}

int oq__task_store_get(oq__producer_store_t *s, const char *task_id, const char *tenant,
                       const char *idem_key, oq__task_row_t *out, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_task_get(s, task_id, tenant, idem_key, out, err);
    sqlite3_stmt *st = st_get(s, task_id ? SQL_TASK_GET : SQL_TASK_GET_KEY, err);
    if (!st) return st_failed(err);
    if (task_id) {
        bind_text(st, 1, task_id);
    } else {
        bind_text(st, 1, tenant && *tenant ? tenant : OQ_DEFAULT_TENANT);
        bind_text(st, 2, idem_key);
    }
    memset(out, 0, sizeof *out);
    int rc = sqlite3_step(st), ret = 0;
    if (rc == SQLITE_ROW) {
        col_copy(st, 0, out->task_id, sizeof out->task_id);
        out->tenant = col_strdup(st, 1);
        out->idem_key = col_strdup(st, 2);
        col_copy(st, 3, out->fingerprint, sizeof out->fingerprint);
        out->spec = col_strdup(st, 4);
        col_copy(st, 5, out->status, sizeof out->status);
        out->reason = col_strdup(st, 6);
        out->created_at = sqlite3_column_int64(st, 7);
        out->updated_at = sqlite3_column_int64(st, 8);
        out->review_fence = sqlite3_column_int64(st, 9);
        if (!out->tenant || !out->idem_key || !out->spec) {
            oq__task_row_clear(out);
            ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        }
    } else if (rc == SQLITE_DONE) {
        ret = oq_error_set(err, OQ_ENOTFOUND, 0, "no such task");
    } else {
        ret = oq_db_error(s->db, rc, err, "get task");
    }
    st_done(s, st);
    return ret;
}

int oq__task_store_update(oq__producer_store_t *s, const oq__task_row_t *t, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_task_update(s, t, err);
    sqlite3_stmt *st = st_get(s, SQL_TASK_UPDATE, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, t->task_id);
    bind_text(st, 2, t->status);
    bind_text(st, 3, t->reason);
    sqlite3_bind_int64(st, 4, t->updated_at);
    sqlite3_bind_int64(st, 5, t->review_fence);
    int ret = st_exec(s, st, err, "update task");
    st_done(s, st);
    return ret;
}

int oq__task_store_step_put(oq__producer_store_t *s, const char *task_id,
                            const oq__task_step_row_t *r, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_task_step_put(s, task_id, r, err);
    sqlite3_stmt *st = st_get(s, SQL_STEP_PUT, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, task_id);
    sqlite3_bind_int(st, 2, r->idx);
    bind_text(st, 3, r->name);
    bind_text(st, 4, r->status);
    bind_text(st, 5, r->call_id[0] ? r->call_id : NULL);
    bind_text(st, 6, r->comp_call_id[0] ? r->comp_call_id : NULL);
    sqlite3_bind_int64(st, 7, r->comp_attempts);
    bind_time(st, 8, r->comp_next_at);
    int ret = st_exec(s, st, err, "put task step");
    st_done(s, st);
    return ret;
}

int oq__task_store_steps(oq__producer_store_t *s, const char *task_id, oq__task_step_row_t **v,
                         size_t *n, oq_error_t *err)
{
    *v = NULL;
    *n = 0;
    if (s->pg) return oq__producer_pg_task_steps(s, task_id, v, n, err);
    sqlite3_stmt *st = st_get(s, SQL_STEPS, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, task_id);
    size_t cap = 0;
    int rc, ret = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 8;
            oq__task_step_row_t *nv = realloc(*v, nc * sizeof *nv);
            if (!nv) {
                ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
                break;
            }
            *v = nv;
            cap = nc;
        }
        oq__task_step_row_t *r = &(*v)[(*n)++];
        memset(r, 0, sizeof *r);
        r->idx = sqlite3_column_int(st, 0);
        r->name = col_strdup(st, 1);
        col_copy(st, 2, r->status, sizeof r->status);
        col_copy(st, 3, r->call_id, sizeof r->call_id);
        col_copy(st, 4, r->comp_call_id, sizeof r->comp_call_id);
        r->comp_attempts = sqlite3_column_int64(st, 5);
        r->comp_next_at = sqlite3_column_int64(st, 6);
        col_copy(st, 7, r->call_state, sizeof r->call_state);
        r->result = col_strdup(st, 8);
        r->error = col_strdup(st, 9);
        r->call_attempt = sqlite3_column_int64(st, 10);
        col_copy(st, 11, r->comp_state, sizeof r->comp_state);
        r->comp_result = col_strdup(st, 12);
        r->comp_error = col_strdup(st, 13);
        r->comp_attempt = sqlite3_column_int64(st, 14);
        if (!r->name) {
            ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            break;
        }
    }
    if (!ret && rc != SQLITE_DONE) ret = oq_db_error(s->db, rc, err, "task steps");
    st_done(s, st);
    if (ret) {
        oq__task_steps_free(*v, *n);
        *v = NULL;
        *n = 0;
    }
    return ret;
}

int oq__task_store_link(oq__producer_store_t *s, const char *call_id, const char *task_id, int idx,
                        const char *role, oq_error_t *err)
{
    if (s->pg) return oq__producer_pg_task_link(s, call_id, task_id, idx, role, err);
    sqlite3_stmt *st = st_get(s, SQL_TASK_LINK, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, call_id);
    bind_text(st, 2, task_id);
    sqlite3_bind_int(st, 3, idx);
    bind_text(st, 4, role);
    int ret = st_exec(s, st, err, "link task call");
    st_done(s, st);
    return ret;
}

int oq__task_store_of_call(oq__producer_store_t *s, const char *call_id,
                           char task_id[OQ_TASK_ID_LEN + 1], int *idx, int *is_comp, int *found,
                           oq_error_t *err)
{
    *found = 0;
    if (s->pg) return oq__producer_pg_task_of_call(s, call_id, task_id, idx, is_comp, found, err);
    sqlite3_stmt *st = st_get(s, SQL_TASK_OF_CALL, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, call_id);
    int rc = sqlite3_step(st), ret = 0;
    if (rc == SQLITE_ROW) {
        col_copy(st, 0, task_id, OQ_TASK_ID_LEN + 1);
        *idx = sqlite3_column_int(st, 1);
        const char *role = (const char *)sqlite3_column_text(st, 2);
        *is_comp = role && strcmp(role, "compensate") == 0;
        *found = 1;
    } else if (rc != SQLITE_DONE) {
        ret = oq_db_error(s->db, rc, err, "task of call");
    }
    st_done(s, st);
    return ret;
}

int oq__task_store_due(oq__producer_store_t *s, int64_t now, int cap,
                       char (*task_ids)[OQ_TASK_ID_LEN + 1], int *idx, int *n, oq_error_t *err)
{
    *n = 0;
    if (s->pg) return oq__producer_pg_task_due(s, now, cap, task_ids, idx, n, err);
    sqlite3_stmt *st = st_get(s, SQL_TASK_DUE, err);
    if (!st) return st_failed(err);
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int(st, 2, cap);
    int rc, ret = 0;
    while (*n < cap && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        col_copy(st, 0, task_ids[*n], OQ_TASK_ID_LEN + 1);
        idx[*n] = sqlite3_column_int(st, 1);
        (*n)++;
    }
    if (*n < cap && rc != SQLITE_DONE) ret = oq_db_error(s->db, rc, err, "task retries due");
    st_done(s, st);
    return ret;
}

int oq__task_store_list(oq__producer_store_t *s, const oq__task_list_q_t *q, char ***ids, size_t *n,
                        int64_t *next, oq_error_t *err)
{
    *ids = NULL;
    *n = 0;
    *next = 0;
    if (s->pg) return oq__producer_pg_task_list(s, q, ids, n, next, err);
    int limit = q->limit > 0 ? q->limit : 100;
    sqlite3_stmt *st = st_get(s, q->status ? SQL_TASK_LIST_STATUS : SQL_TASK_LIST, err);
    if (!st) return st_failed(err);
    bind_text(st, 1, q->status);
    bind_text(st, 2, q->tenant);
    bind_text(st, 3, q->idem_key);
    sqlite3_bind_int64(st, 4, q->before > 0 ? q->before : INT64_MAX);
    sqlite3_bind_int(st, 5, limit + 1); /* one more: is there a next page */
    char **v = calloc((size_t)limit, sizeof *v);
    int rc = SQLITE_DONE, ret = 0;
    int64_t last = 0;
    if (!v) ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    while (!ret && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == (size_t)limit) {
            *next = last;
            rc = SQLITE_DONE;
            break;
        }
        last = sqlite3_column_int64(st, 0);
        if (!(v[(*n)++] = col_strdup(st, 1))) ret = oq_error_set(err, OQ_ENOMEM, 0, "oom");
    }
    if (!ret && rc != SQLITE_DONE) ret = oq_db_error(s->db, rc, err, "tasks");
    st_done(s, st);
    if (ret) {
        for (size_t i = 0; i < *n; i++)
            free(v[i]);
        free(v);
        *n = 0;
        *next = 0;
        return ret;
    }
    *ids = v;
    return 0;
}

const char *const oq__task_statuses[OQ_TASK_NSTATUS] = {
    "running", "succeeded",    "compensating",     "compensated",
    "failed",  "needs_review", "awaiting_approval"};

int oq__task_store_recovery(oq__producer_store_t *s, int64_t *operator_, int64_t *rerun,
                            oq_error_t *err)
{
    static const char *const q[2] = {
        /* a count over the status index, and one probe of the audit index per task */
        "SELECT count(*) FROM tasks t WHERE t.status='needs_review' OR EXISTS (SELECT 1 FROM "
        "audit a WHERE a.call_id=t.task_id AND a.event='task_review' AND "
        "json_extract(a.detail,'$.as') NOT IN ('approve','reject'))",
        "SELECT count(*) FROM (SELECT 1 FROM task_calls WHERE role='step' GROUP BY task_id, idx "
        "HAVING count(*) > 1)"};
    int64_t *out[2] = {operator_, rerun};
    *operator_ = *rerun = 0;
    if (s->pg) return oq__producer_pg_task_recovery(s, operator_, rerun, err);
    for (int i = 0; i < 2; i++) {
        sqlite3_stmt *st = st_get(s, q[i], err);
        if (!st) return st_failed(err);
        int rc = sqlite3_step(st), ret = 0;
        if (rc == SQLITE_ROW)
            *out[i] = sqlite3_column_int64(st, 0);
        else
            ret = oq_db_error(s->db, rc, err, "task recovery counts");
        st_done(s, st);
        if (ret) return ret;
    }
    return 0;
}

int oq__task_store_counts(oq__producer_store_t *s, const char *tenant, int64_t by[OQ_TASK_NSTATUS],
                          int64_t *comp_ok, int64_t *comp_review, oq_error_t *err)
{
    const char *const *st = oq__task_statuses;
    memset(by, 0, OQ_TASK_NSTATUS * sizeof *by);
    *comp_ok = *comp_review = 0;
    if (s->pg) return oq__producer_pg_task_counts(s, tenant, by, comp_ok, comp_review, err);
    /* the whole table over its status index (the metrics), or one tenant's tasks */
    sqlite3_stmt *st1 =
        st_get(s,
               tenant ? "SELECT status, count(*) FROM tasks WHERE tenant=?1 GROUP BY status"
                      : "SELECT status, count(*) FROM tasks GROUP BY status",
               err);
    if (!st1) return st_failed(err);
    if (tenant) bind_text(st1, 1, tenant);
    int rc, ret = 0;
    while ((rc = sqlite3_step(st1)) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(st1, 0);
        for (int i = 0; k && i < OQ_TASK_NSTATUS; i++)
            if (strcmp(k, st[i]) == 0) by[i] = sqlite3_column_int64(st1, 1);
    }
    if (rc != SQLITE_DONE) ret = oq_db_error(s->db, rc, err, "task counts");
    st_done(s, st1);
    if (ret) return ret;
    sqlite3_stmt *st2 =
        st_get(s,
               tenant ? "SELECT s.status, count(*) FROM task_steps s JOIN tasks t ON "
                        "t.task_id=s.task_id WHERE s.comp_call_id IS NOT NULL AND t.tenant=?1 "
                        "GROUP BY s.status"
                      : "SELECT status, count(*) FROM task_steps WHERE comp_call_id IS NOT "
                        "NULL GROUP BY status",
               err);
    if (!st2) return st_failed(err);
    if (tenant) bind_text(st2, 1, tenant);
    while ((rc = sqlite3_step(st2)) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(st2, 0);
        if (k && strcmp(k, "compensated") == 0) *comp_ok = sqlite3_column_int64(st2, 1);
        if (k && strcmp(k, "needs_review") == 0) *comp_review = sqlite3_column_int64(st2, 1);
    }
    if (rc != SQLITE_DONE) ret = oq_db_error(s->db, rc, err, "compensation counts");
    st_done(s, st2);
    return ret;
}
