/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer store: every SQL statement against effects.db lives in this file, behind the
 * row operations of consumer_store.h. It decides nothing; consumer/execution.c holds the rules.
 *
 * What the rules rely on from here:
 *  1. The inbox primary key (message_id): a redelivered message hits it, its `seen` counter is
 *     bumped and the caller learns the new count, so it can skip the message (it writes only an
 *     audit 'duplicate_skipped' row). The upsert is INSERT ... ON CONFLICT DO NOTHING, then, on a
 *     conflict only, UPDATE + SELECT (no RETURNING: it costs a temp b-tree per call).
 *  2. Executions change only through conditional UPDATEs whose WHERE names the state and fence
 *     the caller read (and the lease owner, for a run's outcome); sqlite3_changes() tells the
 *     caller whether its view still held. Every claim and every loss of a lease moves the
 *     fence, so a worker paused past its lease matches zero rows and writes nothing.
 *  3. effects.call_id is UNIQUE: a second effect of a call cannot be stored; the insert reports
 *     "not inserted" and the existing effect wins.
 * Wide tables are rowid tables with a narrow UNIQUE index on the random call_id (see the
 * schema): fewer scattered page writes per call than b-trees keyed by call_id. Result events go
 * to the shared outbox table through oq_outbox_append(), in the caller's transaction.
 *
 * Statements are prepared once per connection through the oq_stmt_cache (keyed by the SQL
 * literal's address) and always reset after use, so no read snapshot is left open.
 */
#include "consumer_store.h"

#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_pg.h"
#include "store_pg.h"

struct oq__consumer_store {
    oq__consumer_pg_t *pg; /* PostgreSQL instead of db: every operation goes to store_pg.c */
    sqlite3 *db;
    oq_stmt_cache_t *cache;
    char worker[128];
    int64_t clock_anchor; /* oq__consumer_store_now() = clock_anchor + oq_boot_ms() */
};

static const char *const xstate_names[OQ_X__COUNT] = {
    "PLANNED", "STARTED",     "COMMITTED",  "FAILED_RETRYABLE", "FAILED_FINAL",
    "UNKNOWN", "RECONCILING", "SAFE_RETRY", "NEEDS_REVIEW"};

const char *oq__xstate_name(int state)
{
    return (state >= 0 && state < OQ_X__COUNT) ? xstate_names[state] : "?";
}

int oq__xstate_parse(const char *name)
{
    for (int i = 0; name && i < OQ_X__COUNT; i++)
        if (strcmp(name, xstate_names[i]) == 0) return i;
    return -1;
}

void oq__exec_row_clear(oq__exec_row_t *x)
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

/* --- connection ------------------------------------------------------------------------------ */

/*
 * The lease clock's anchor for this boot of the host (schema/consumer/0005_lease_clock.sql):
 * read, or written by the first process of the boot. Without a boot id (no /proc) each
 * process computes its own, from the same rule.
 */
/* This boot's stored anchor into s->clock_anchor: 1 found, 0 none, or a negative OQ_E* code. */
static int clock_anchor_read(oq__consumer_store_t *s, const char *boot, oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(s->db, "SELECT anchor_ms FROM clock_anchor WHERE boot_id = ?1", -1,
                                &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, boot, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) s->clock_anchor = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : oq_db_error(s->db, rc, err, "anchor");
}

static int clock_anchor_load(oq__consumer_store_t *s, oq_error_t *err)
{
    char boot[40];
    int have_boot = oq_boot_id(boot) == 0, rc;
    sqlite3_stmt *st = NULL;
    int64_t boot_ms = oq_boot_ms(), wall = oq_now_ms(), last = 0;
    /* the common case, without a write lock: a process of this boot wrote it already */
    if (have_boot && (rc = clock_anchor_read(s, boot, err)) != 0) return rc < 0 ? rc : 0;
    if ((rc = oq_db_begin_immediate(s->db, 30000, err))) {
        /* a read-only copy (review list, inspect): a local anchor by the same rule is enough */
        if (sqlite3_db_readonly(s->db, "main") != 1) return rc;
        s->clock_anchor = wall - boot_ms;
        return 0;
    }
    if (have_boot) {
        rc = sqlite3_prepare_v2(s->db, "SELECT anchor_ms FROM clock_anchor WHERE boot_id = ?1", -1,
                                &st, NULL);
        if (rc != SQLITE_OK) goto db_fail;
        sqlite3_bind_text(st, 1, boot, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            s->clock_anchor = sqlite3_column_int64(st, 0);
            sqlite3_finalize(st);
            oq_db_rollback(s->db);
            return 0;
        }
        sqlite3_finalize(st);
        st = NULL;
        if (rc != SQLITE_DONE) goto db_fail;
    }
    rc = sqlite3_prepare_v2(s->db, "SELECT ifnull(max(updated_at), 0) FROM executions", -1, &st,
                            NULL);
    if (rc != SQLITE_OK) goto db_fail;
    if ((rc = sqlite3_step(st)) != SQLITE_ROW) goto db_fail;
    last = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    st = NULL;
    s->clock_anchor = wall - boot_ms;
    if (last + 1 - boot_ms > s->clock_anchor) s->clock_anchor = last + 1 - boot_ms;
    if (have_boot) {
        rc = sqlite3_prepare_v2(s->db,
                                "INSERT INTO clock_anchor (boot_id, anchor_ms, created_at) "
                                "VALUES (?1, ?2, ?3)",
                                -1, &st, NULL);
        if (rc != SQLITE_OK) goto db_fail;
        sqlite3_bind_text(st, 1, boot, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, s->clock_anchor);
        sqlite3_bind_int64(st, 3, wall);
        if ((rc = sqlite3_step(st)) != SQLITE_DONE) goto db_fail;
        sqlite3_finalize(st);
        st = NULL;
        /* the anchors of earlier boots are read by nobody any more */
        rc = sqlite3_prepare_v2(s->db, "DELETE FROM clock_anchor WHERE boot_id <> ?1", -1, &st,
                                NULL);
        if (rc != SQLITE_OK) goto db_fail;
        sqlite3_bind_text(st, 1, boot, -1, SQLITE_STATIC);
        if ((rc = sqlite3_step(st)) != SQLITE_DONE) goto db_fail;
        sqlite3_finalize(st);
        st = NULL;
    }
    return oq_db_commit(s->db, err);
db_fail:
    rc = oq_db_error(s->db, rc, err, "lease clock anchor");
    sqlite3_finalize(st);
    oq_db_rollback(s->db);
    return rc;
}

int64_t oq__consumer_store_now(const oq__consumer_store_t *s)
{
    return s->clock_anchor + oq_boot_ms();
}

int oq__consumer_store_open(const char *path, const oq_db_opts_t *opts, const char *worker_id,
                            oq__consumer_store_t **out, oq_error_t *err)
{
    int rc;
    oq__consumer_store_t *s = calloc(1, sizeof(*s));
    *out = NULL;
    if (!s) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    snprintf(s->worker, sizeof(s->worker), "%s", worker_id ? worker_id : "worker");
    if (oq_backend_of(path) == OQ_BACKEND_POSTGRES) {
        /* the server's clock, carried by this host's boot clock (store_pg.c) */
        int64_t server_ms = 0;
        if ((rc = oq__consumer_pg_open(path, s->worker, 1, &s->pg, &server_ms, err)) != 0)
            goto fail;
        s->clock_anchor = server_ms - oq_boot_ms();
        *out = s;
        return 0;
    }
    if ((rc = oq_db_open(path, opts, &s->db, err)) != 0) goto fail;
    if ((rc = oq_db_migrate(s->db, oq_migrations_consumer, err)) != 0) goto fail;
    if ((rc = clock_anchor_load(s, err)) != 0) goto fail;
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
    oq__consumer_store_close(s);
    return rc;
}

void oq__consumer_store_attach(oq__consumer_store_t *s, oq_ckpt_t *ck)
{
    if (s && s->db) oq_ckpt_attach(ck, s->db);
}

void oq__consumer_store_close(oq__consumer_store_t *s)
{
    if (!s) return;
    oq__consumer_pg_close(s->pg);
    oq_stmt_cache_destroy(s->cache);
    if (s->db) sqlite3_close_v2(s->db);
    free(s);
}

int oq__consumer_store_export(const char *setting, const char *sqlite_path, oq_error_t *err)
{
    oq_db_opts_t o = {.synchronous = "OFF"};
    if (oq_backend_of(setting) != OQ_BACKEND_POSTGRES)
        return oq_error_set(err, OQ_EINVAL, 0, "export: not a PostgreSQL database setting");
    oq__consumer_pg_t *src = NULL;
    oq__consumer_store_t *dst = NULL;
    int64_t server_ms = 0;
    /* read only: the source is not migrated (a newer schema is refused) */
    int rc = oq__consumer_pg_open(setting, "export", 0, &src, &server_ms, err);
    if (!rc) rc = oq__consumer_store_open(sqlite_path, &o, "export", &dst, err);
    if (!rc) rc = oq__consumer_pg_export(src, dst->db, err);
    oq__consumer_pg_close(src);
    oq__consumer_store_close(dst);
    return rc;
}

sqlite3 *oq__consumer_store_db(oq__consumer_store_t *s)
{
    return s->db;
}

struct pg_conn *oq__consumer_store_pgconn(oq__consumer_store_t *s)
{
    return s->pg ? oq__consumer_pg_conn(s->pg) : NULL;
}

const char *oq__consumer_store_worker(const oq__consumer_store_t *s)
{
    return s->worker;
}

int oq__consumer_store_begin(oq__consumer_store_t *s, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_begin(s->pg, err);
    return oq_db_begin_immediate(s->db, 30000, err);
}

int oq__consumer_store_begin_batch(oq__consumer_store_t *s, const char *const *call_ids,
                                   const char *const *message_ids, int n, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_begin_batch(s->pg, call_ids, message_ids, n, err);
    return oq__consumer_store_begin(s, err);
}

void oq__consumer_store_counts(const oq__consumer_store_t *s, int64_t *statements,
                               int64_t *round_trips)
{
    *statements = *round_trips = 0;
    if (s->pg) oq__consumer_pg_counts(s->pg, statements, round_trips);
}

int oq__consumer_store_commit(oq__consumer_store_t *s, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_commit(s->pg, err);
    return oq_db_commit(s->db, err);
}

void oq__consumer_store_rollback(oq__consumer_store_t *s)
{
    if (s->pg) {
        oq__consumer_pg_rollback(s->pg);
        return;
    }
    oq_db_rollback(s->db);
}

/* --- small helpers --------------------------------------------------------------------------- */

static sqlite3_stmt *stmt(oq__consumer_store_t *s, const char *sql, oq_error_t *err)
{
    return oq_stmt_get(s->cache, sql, err);
}

/* The code to return when stmt() failed (it filled err when given one). */
static int stmt_error(oq_error_t *err)
{
    return err ? err->code : OQ_EDB;
}

/* Steps a statement that returns no row; clears its bindings and resets it. */
static int step_done(oq__consumer_store_t *s, sqlite3_stmt *st, const char *what, oq_error_t *err)
{
    int rc = sqlite3_step(st);
    int ret = (rc == SQLITE_DONE || rc == SQLITE_ROW) ? 0 : oq_db_error(s->db, rc, err, what);
    sqlite3_clear_bindings(st);
    sqlite3_reset(st);
    return ret;
}

static char *col_dup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

static void col_copy(sqlite3_stmt *st, int i, char *out, size_t cap)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    snprintf(out, cap, "%s", t ? (const char *)t : "");
}

static void bind_text(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

/* A time column: 0 binds NULL. */
static void bind_time(sqlite3_stmt *st, int i, int64_t v)
{
    if (v)
        sqlite3_bind_int64(st, i, v);
    else
        sqlite3_bind_null(st, i);
}

static void bind_state(sqlite3_stmt *st, int i, int state)
{
    sqlite3_bind_text(st, i, oq__xstate_name(state), -1, SQLITE_STATIC);
}

/* --- executions ------------------------------------------------------------------------------ */

/* Columns of executions in the order read_exec() reads them. */
#define EXEC_COLS                                                                                  \
    "call_id, tenant, idem_key, fingerprint, tool, args, state, attempt, tries, lease_owner, "     \
    "lease_until, fence, result, error, effect_id, next_attempt_at, message_id, started_at, "      \
    "unknown_at, lookups, updated_at"

static void read_exec(sqlite3_stmt *st, oq__exec_row_t *x)
{
    oq__exec_row_clear(x);
    col_copy(st, 0, x->call_id, sizeof(x->call_id));
    x->tenant = col_dup(st, 1);
    x->idem_key = col_dup(st, 2);
    col_copy(st, 3, x->fingerprint, sizeof(x->fingerprint));
    x->tool = col_dup(st, 4);
    x->args = col_dup(st, 5);
    x->state = oq__xstate_parse((const char *)sqlite3_column_text(st, 6));
    x->attempt = sqlite3_column_int64(st, 7);
    x->tries = sqlite3_column_int64(st, 8);
    x->lease_owner = col_dup(st, 9);
    x->lease_until = sqlite3_column_int64(st, 10);
    x->fence = sqlite3_column_int64(st, 11);
    x->result = col_dup(st, 12);
    x->error = col_dup(st, 13);
    x->effect_id = col_dup(st, 14);
    x->next_attempt_at = sqlite3_column_int64(st, 15);
    col_copy(st, 16, x->message_id, sizeof(x->message_id));
    x->started_at = sqlite3_column_int64(st, 17);
    x->unknown_at = sqlite3_column_int64(st, 18);
    x->lookups = sqlite3_column_int64(st, 19);
    x->updated_at = sqlite3_column_int64(st, 20);
}

int oq__consumer_store_exec_get(oq__consumer_store_t *s, const char *call_id, oq__exec_row_t *out,
                                oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_exec_get(s->pg, call_id, out, err);
    static const char sql[] = "SELECT " EXEC_COLS " FROM executions WHERE call_id = ?1";
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        read_exec(st, out);
        rc = 0;
    } else if (rc == SQLITE_DONE) {
        rc = oq_error_set(err, OQ_ENOTFOUND, 0, "no execution %s", call_id);
    } else {
        rc = oq_db_error(s->db, rc, err, "execution select");
    }
    sqlite3_reset(st);
    return rc;
}

int oq__consumer_store_exec_insert(oq__consumer_store_t *s, const oq__exec_row_t *x, int64_t now,
                                   oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_exec_insert(s->pg, x, now, err);
    static const char sql[] =
        "INSERT INTO executions(call_id, tenant, idem_key, fingerprint, tool, args, state, "
        "attempt, tries, fence, lease_owner, lease_until, result, error, effect_id, "
        "next_attempt_at, message_id, created_at, updated_at, started_at, unknown_at, lookups) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, "
        "?18, ?19, ?20, ?21)";
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, x->call_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, x->tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, x->idem_key, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, x->fingerprint, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, x->tool, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, x->args, -1, SQLITE_STATIC);
    bind_state(st, 7, x->state);
    sqlite3_bind_int64(st, 8, x->attempt);
    sqlite3_bind_int64(st, 9, x->tries);
    sqlite3_bind_int64(st, 10, x->fence);
    bind_text(st, 11, x->lease_owner);
    bind_time(st, 12, x->lease_until);
    bind_text(st, 13, x->result);
    bind_text(st, 14, x->error);
    bind_text(st, 15, x->effect_id);
    bind_time(st, 16, x->next_attempt_at);
    sqlite3_bind_text(st, 17, x->message_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 18, now);
    bind_time(st, 19, x->started_at);
    bind_time(st, 20, x->unknown_at);
    sqlite3_bind_int64(st, 21, x->lookups);
    return step_done(s, st, "execution insert", err);
}

int oq__consumer_store_exec_update(oq__consumer_store_t *s, const oq__exec_update_t *u,
                                   int *updated, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_exec_update(s->pg, u, updated, err);
    static const char sql[] =
        "UPDATE executions SET state = ?5, attempt = ?6, tries = ?7, fence = ?8, "
        "lease_owner = ?9, lease_until = ?10, result = ?11, error = ?12, effect_id = ?13, "
        "next_attempt_at = ?14, message_id = coalesce(?15, message_id), updated_at = ?16, "
        "started_at = ?17, unknown_at = ?18, lookups = ?19 "
        "WHERE call_id = ?1 AND state = ?2 AND fence = ?3 AND (?4 IS NULL OR lease_owner = ?4)";
    *updated = 0;
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, u->call_id, -1, SQLITE_STATIC);
    bind_state(st, 2, u->from_state);
    sqlite3_bind_int64(st, 3, u->from_fence);
    bind_text(st, 4, u->from_owner);
    bind_state(st, 5, u->state);
    sqlite3_bind_int64(st, 6, u->attempt);
    sqlite3_bind_int64(st, 7, u->tries);
    sqlite3_bind_int64(st, 8, u->fence);
    bind_text(st, 9, u->lease_owner);
    bind_time(st, 10, u->lease_until);
    bind_text(st, 11, u->result);
    bind_text(st, 12, u->error);
    bind_text(st, 13, u->effect_id);
    bind_time(st, 14, u->next_attempt_at);
    bind_text(st, 15, u->message_id);
    sqlite3_bind_int64(st, 16, u->now);
    bind_time(st, 17, u->started_at);
    bind_time(st, 18, u->unknown_at);
    sqlite3_bind_int64(st, 19, u->lookups);
    int rc = step_done(s, st, "execution update", err);
    *updated = rc == 0 && sqlite3_changes(s->db) == 1;
    return rc;
}

int oq__consumer_store_exec_set_result(oq__consumer_store_t *s, const char *call_id,
                                       const char *result, const char *effect_id, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_exec_set_result(s->pg, call_id, result, effect_id, err);
    static const char sql[] =
        "UPDATE executions SET result = ?2, effect_id = ?3 WHERE call_id = ?1";
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    bind_text(st, 2, result);
    bind_text(st, 3, effect_id);
    return step_done(s, st, "execution result", err);
}

int oq__consumer_store_lease_renew(oq__consumer_store_t *s, const char *call_id, int64_t fence,
                                   int64_t lease_until, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_lease_renew(s->pg, call_id, fence, lease_until, err);
    static const char sql[] = "UPDATE executions SET lease_until = ?3 WHERE call_id = ?1 AND "
                              "(state = 'STARTED' OR state = 'RECONCILING') AND fence = ?2 AND "
                              "lease_owner = ?4";
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, fence);
    sqlite3_bind_int64(st, 3, lease_until);
    sqlite3_bind_text(st, 4, s->worker, -1, SQLITE_STATIC);
    int rc = step_done(s, st, "lease renew", err);
    if (rc == 0 && sqlite3_changes(s->db) == 0)
        rc = oq_error_set(err, OQ_EFENCED, 0, "lease on %s (fence %" PRId64 ") lost", call_id,
                          fence);
    return rc;
}

/* Reads up to \p cap rows of a prepared, bound statement into \p rows. */
static int read_execs(oq__consumer_store_t *s, sqlite3_stmt *st, oq__exec_row_t *rows, int cap,
                      int *n, const char *what, oq_error_t *err)
{
    int rc = SQLITE_DONE;
    *n = 0;
    while (*n < cap && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        memset(&rows[*n], 0, sizeof(rows[*n]));
        read_exec(st, &rows[(*n)++]);
    }
    rc = (*n == cap || rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, what);
    sqlite3_clear_bindings(st);
    sqlite3_reset(st);
    return rc;
}

int oq__consumer_store_exec_lapsed(oq__consumer_store_t *s, int64_t now, oq__exec_row_t *rows,
                                   int cap, int *n, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_exec_lapsed(s->pg, now, rows, cap, n, err);
    static const char sql[] = "SELECT " EXEC_COLS " FROM executions WHERE (state = 'STARTED' "
                              "OR state = 'RECONCILING') AND lease_until < ?1 LIMIT ?2";
    sqlite3_stmt *st = stmt(s, sql, err);
    *n = 0;
    if (!st) return stmt_error(err);
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int(st, 2, cap);
    return read_execs(s, st, rows, cap, n, "lapsed select", err);
}

int oq__consumer_store_exec_in_state(oq__consumer_store_t *s, int state, oq__exec_row_t *rows,
                                     int cap, int *n, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_exec_in_state(s->pg, state, rows, cap, n, err);
    static const char sql[] =
        "SELECT " EXEC_COLS " FROM executions WHERE state = ?1 ORDER BY updated_at LIMIT ?2";
    sqlite3_stmt *st = stmt(s, sql, err);
    *n = 0;
    if (!st) return stmt_error(err);
    bind_state(st, 1, state);
    sqlite3_bind_int(st, 2, cap);
    return read_execs(s, st, rows, cap, n, "state select", err);
}

int oq__consumer_store_exec_held_by(oq__consumer_store_t *s, const char *owner,
                                    oq__exec_row_t *rows, int cap, int *n, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_exec_held_by(s->pg, owner, rows, cap, n, err);
    static const char sql[] = "SELECT " EXEC_COLS " FROM executions WHERE (state = 'STARTED' "
                              "OR state = 'RECONCILING') AND lease_owner = ?1 LIMIT ?2";
    sqlite3_stmt *st = stmt(s, sql, err);
    *n = 0;
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, cap);
    return read_execs(s, st, rows, cap, n, "held select", err);
}

int oq__consumer_store_exec_unknown_due(oq__consumer_store_t *s, int64_t now, oq__exec_row_t *rows,
                                        int cap, int *n, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_exec_unknown_due(s->pg, now, rows, cap, n, err);
    static const char sql[] = "SELECT " EXEC_COLS " FROM executions WHERE state = 'UNKNOWN' "
                              "AND ifnull(next_attempt_at, 0) <= ?1 ORDER BY updated_at LIMIT ?2";
    sqlite3_stmt *st = stmt(s, sql, err);
    *n = 0;
    if (!st) return stmt_error(err);
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int(st, 2, cap);
    return read_execs(s, st, rows, cap, n, "unknown select", err);
}

int oq__consumer_store_unsettled(oq__consumer_store_t *s, oq__unsettled_t *out, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_unsettled(s->pg, out, err);
    static const char sql[] =
        "SELECT state, count(*), min(ifnull(unknown_at, updated_at)) FROM executions "
        "WHERE state = 'UNKNOWN' OR state = 'RECONCILING' OR state = 'NEEDS_REVIEW' "
        "GROUP BY state";
    sqlite3_stmt *st = stmt(s, sql, err);
    int rc;
    memset(out, 0, sizeof(*out));
    if (!st) return stmt_error(err);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int k = oq__xstate_parse((const char *)sqlite3_column_text(st, 0));
        int64_t count = sqlite3_column_int64(st, 1), oldest = sqlite3_column_int64(st, 2);
        if (k == OQ_X_NEEDS_REVIEW) {
            out->review = count;
            out->review_oldest = oldest;
        } else if (k == OQ_X_UNKNOWN || k == OQ_X_RECONCILING) {
            out->unknown += count;
            if (!out->unknown_oldest || oldest < out->unknown_oldest) out->unknown_oldest = oldest;
        }
    }
    rc = (rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "unsettled counts");
    sqlite3_reset(st);
    return rc;
}

int oq__consumer_store_recovery_pending(oq__consumer_store_t *s, int64_t now)
{
    if (s->pg) return oq__consumer_pg_recovery_pending(s->pg, now);
    static const char sql[] =
        "SELECT EXISTS (SELECT 1 FROM executions WHERE (state = 'STARTED' OR "
        "state = 'RECONCILING') AND lease_until < ?1) OR EXISTS (SELECT 1 FROM executions "
        "WHERE state = 'UNKNOWN' AND ifnull(next_attempt_at, 0) <= ?1)";
    sqlite3_stmt *st = stmt(s, sql, NULL);
    int v = 1;
    if (!st) return v;
    sqlite3_bind_int64(st, 1, now);
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
    sqlite3_reset(st);
    return v;
}

int oq__consumer_store_due(oq__consumer_store_t *s, int64_t now, int limit,
                           void (*cb)(const oq__due_row_t *row, void *opaque), void *opaque,
                           oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_due(s->pg, now, limit, cb, opaque, err);
    /* (an OR chain, not IN (...): see the schema's note on the state CHECK) */
    static const char sql[] =
        "SELECT call_id, tool, args FROM executions "
        "WHERE next_attempt_at <= ?1 AND (state = 'PLANNED' OR state = 'FAILED_RETRYABLE' OR "
        "state = 'SAFE_RETRY') ORDER BY next_attempt_at LIMIT ?2";
    sqlite3_stmt *st = stmt(s, sql, err);
    int rc;
    if (!st) return stmt_error(err);
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int(st, 2, limit);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        oq__due_row_t r = {.call_id = (const char *)sqlite3_column_text(st, 0),
                           .tool = (const char *)sqlite3_column_text(st, 1),
                           .args = (const char *)sqlite3_column_text(st, 2)};
        cb(&r, opaque);
    }
    rc = rc == SQLITE_DONE ? 0 : oq_db_error(s->db, rc, err, "due select");
    sqlite3_reset(st);
    return rc;
}

int64_t oq__consumer_store_next_due(oq__consumer_store_t *s)
{
    if (s->pg) return oq__consumer_pg_next_due(s->pg);
    static const char sql[] =
        "SELECT min(next_attempt_at) FROM executions WHERE next_attempt_at IS NOT NULL";
    sqlite3_stmt *st = stmt(s, sql, NULL);
    int64_t v = INT64_MAX;
    if (!st) return v;
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
        v = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return v;
}

int oq__consumer_store_state_counts(oq__consumer_store_t *s, int64_t counts[OQ_X__COUNT],
                                    oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_state_counts(s->pg, counts, err);
    static const char sql[] = "SELECT state, count(*) FROM executions GROUP BY state";
    sqlite3_stmt *st = stmt(s, sql, err);
    int rc;
    for (int i = 0; i < OQ_X__COUNT; i++)
        counts[i] = 0;
    if (!st) return stmt_error(err);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int k = oq__xstate_parse((const char *)sqlite3_column_text(st, 0));
        if (k >= 0) counts[k] = sqlite3_column_int64(st, 1);
    }
    rc = (rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "state counts");
    sqlite3_reset(st);
    return rc;
}

/* --- inbox, effects, audit, outbox ------------------------------------------------------------ */

/* ?1..?7 of the inbox statements: message_id, call_id, topic, partition, offset, received_at,
 * outcome. */
static void bind_inbox_row(sqlite3_stmt *st, const oq__inbox_row_t *row)
{
    sqlite3_bind_text(st, 1, row->message_id, -1, SQLITE_STATIC);
    bind_text(st, 2, row->call_id);
    sqlite3_bind_text(st, 3, row->src.topic ? row->src.topic : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, row->src.partition);
    sqlite3_bind_int64(st, 5, row->src.offset);
    sqlite3_bind_int64(st, 6, row->received_at);
    sqlite3_bind_text(st, 7, row->outcome, -1, SQLITE_STATIC);
}

int oq__consumer_store_inbox_upsert(oq__consumer_store_t *s, const oq__inbox_row_t *row,
                                    int64_t *seen, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_inbox_upsert(s->pg, row, seen, err);
    static const char sql[] =
        "INSERT INTO inbox(message_id, call_id, topic, partition, offset, received_at, outcome)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT(message_id) DO NOTHING";
    static const char sql_again[] = "UPDATE inbox SET seen = seen + 1 WHERE message_id = ?1";
    static const char sql_seen[] = "SELECT seen FROM inbox WHERE message_id = ?1";
    sqlite3_stmt *st = stmt(s, sql, err);
    int rc;
    if (!st) return stmt_error(err);
    bind_inbox_row(st, row);
    if ((rc = step_done(s, st, "inbox insert", err))) return rc;
    if (sqlite3_changes(s->db) == 1) {
        *seen = 1;
        return 0;
    }
    if (!(st = stmt(s, sql_again, err))) return stmt_error(err);
    sqlite3_bind_text(st, 1, row->message_id, -1, SQLITE_STATIC);
    if ((rc = step_done(s, st, "inbox redelivery", err))) return rc;
    if (!(st = stmt(s, sql_seen, err))) return stmt_error(err);
    sqlite3_bind_text(st, 1, row->message_id, -1, SQLITE_STATIC);
    *seen = 2;
    if (sqlite3_step(st) == SQLITE_ROW) *seen = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return 0;
}

int oq__consumer_store_effect_insert(oq__consumer_store_t *s, const oq__effect_row_t *e,
                                     int *inserted, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_effect_insert(s->pg, e, inserted, err);
    static const char sql[] =
        "INSERT INTO effects(effect_id, call_id, tool, amount, recipient, detail, attempt, "
        "fence, worker, created_at, downstream_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, "
        "?10, ?11) ON CONFLICT DO NOTHING";
    *inserted = 0;
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, e->effect_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, e->call_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, e->tool ? e->tool : "", -1, SQLITE_STATIC);
    if (e->amount)
        sqlite3_bind_int64(st, 4, e->amount);
    else
        sqlite3_bind_null(st, 4);
    bind_text(st, 5, e->recipient && e->recipient[0] ? e->recipient : NULL);
    bind_text(st, 6, e->detail);
    sqlite3_bind_int64(st, 7, e->attempt);
    sqlite3_bind_int64(st, 8, e->fence);
    sqlite3_bind_text(st, 9, s->worker, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 10, e->created_at);
    bind_text(st, 11, e->downstream_id && e->downstream_id[0] ? e->downstream_id : NULL);
    int rc = step_done(s, st, "effect insert", err);
    *inserted = rc == 0 && sqlite3_changes(s->db) == 1;
    return rc;
}

int oq__consumer_store_effect_get(oq__consumer_store_t *s, const char *call_id, int *found,
                                  char **effect_id, char **detail, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_effect_get(s->pg, call_id, found, effect_id, detail, err);
    static const char sql[] = "SELECT effect_id, detail FROM effects WHERE call_id = ?1";
    sqlite3_stmt *st = stmt(s, sql, err);
    *found = 0;
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *found = 1;
        if (effect_id) *effect_id = col_dup(st, 0);
        if (detail) *detail = col_dup(st, 1);
        rc = 0;
    } else {
        rc = (rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "effect select");
    }
    sqlite3_reset(st);
    return rc;
}

int oq__consumer_store_effect_read(oq__consumer_store_t *s, const char *call_id, int *found,
                                   oq__effect_read_t *out, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_effect_read(s->pg, call_id, found, out, err);
    static const char sql[] = "SELECT effect_id, detail, downstream_id, created_at, worker "
                              "FROM effects WHERE call_id = ?1";
    sqlite3_stmt *st = stmt(s, sql, err);
    *found = 0;
    memset(out, 0, sizeof(*out));
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *found = 1;
        out->effect_id = col_dup(st, 0);
        out->detail = col_dup(st, 1);
        out->downstream_id = col_dup(st, 2);
        out->created_at = sqlite3_column_int64(st, 3);
        out->worker = col_dup(st, 4);
        rc = 0;
    } else {
        rc = (rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "effect select");
    }
    sqlite3_reset(st);
    return rc;
}

void oq__effect_read_clear(oq__effect_read_t *e)
{
    if (!e) return;
    free(e->effect_id);
    free(e->detail);
    free(e->downstream_id);
    free(e->worker);
    memset(e, 0, sizeof(*e));
}

int oq__consumer_store_audit_list(oq__consumer_store_t *s, const char *call_id,
                                  void (*cb)(const oq__audit_read_t *row, void *opaque),
                                  void *opaque, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_audit_list(s->pg, call_id, cb, opaque, err);
    static const char sql[] = "SELECT id, ts, event, attempt, fence, worker, detail FROM audit "
                              "WHERE call_id = ?1 ORDER BY id";
    sqlite3_stmt *st = stmt(s, sql, err);
    int rc;
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        oq__audit_read_t a = {.id = sqlite3_column_int64(st, 0),
                              .ts = sqlite3_column_int64(st, 1),
                              .event = (const char *)sqlite3_column_text(st, 2),
                              .attempt = sqlite3_column_int64(st, 3),
                              .fence = sqlite3_column_int64(st, 4),
                              .worker = (const char *)sqlite3_column_text(st, 5),
                              .detail = (const char *)sqlite3_column_text(st, 6)};
        cb(&a, opaque);
    }
    rc = (rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "audit select");
    sqlite3_reset(st);
    return rc;
}

int oq__consumer_store_unknown_story(oq__consumer_store_t *s,
                                     void (*cb)(const oq__call_event_t *row, void *opaque),
                                     void *opaque, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_unknown_story(s->pg, cb, opaque, err);
    static const char sql[] =
        "SELECT call_id, event, ts FROM audit WHERE event IN ('unknown', 'needs_review', "
        "'committed', 'failed_final') AND call_id IN (SELECT call_id FROM executions "
        "WHERE unknown_at IS NOT NULL) ORDER BY call_id, id";
    sqlite3_stmt *st = stmt(s, sql, err);
    int rc;
    if (!st) return stmt_error(err);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        oq__call_event_t e = {.call_id = (const char *)sqlite3_column_text(st, 0),
                              .event = (const char *)sqlite3_column_text(st, 1),
                              .ts = sqlite3_column_int64(st, 2)};
        cb(&e, opaque);
    }
    rc = (rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "unknown story");
    sqlite3_reset(st);
    return rc;
}

int64_t oq__consumer_store_effect_count(oq__consumer_store_t *s, const char *call_id)
{
    if (s->pg) return oq__consumer_pg_effect_count(s->pg, call_id);
    static const char sql_one[] = "SELECT count(*) FROM effects WHERE call_id = ?1";
    static const char sql_all[] = "SELECT count(*) FROM effects";
    sqlite3_stmt *st = stmt(s, call_id ? sql_one : sql_all, NULL);
    int64_t v = OQ_EDB;
    if (!st) return OQ_EDB;
    if (call_id) sqlite3_bind_text(st, 1, call_id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_reset(st);
    return v;
}

int oq__consumer_store_audit_add(oq__consumer_store_t *s, const oq__audit_row_t *a, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_audit_add(s->pg, a, err);
    static const char sql[] = "INSERT INTO audit(ts, call_id, event, attempt, fence, worker, "
                              "detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_int64(st, 1, a->ts);
    bind_text(st, 2, a->call_id);
    sqlite3_bind_text(st, 3, a->event, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, a->attempt);
    sqlite3_bind_int64(st, 5, a->fence);
    sqlite3_bind_text(st, 6, s->worker, -1, SQLITE_STATIC);
    bind_text(st, 7, a->detail);
    return step_done(s, st, "audit insert", err);
}

int oq__consumer_store_outbox_append(oq__consumer_store_t *s, const oq_outbox_row_t *row,
                                     oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_outbox_append(s->pg, row, err);
    oq_error_t e = {0};
    int rc = oq_outbox_append(s->db, s->cache, row, &e);
    /* The message id is the outbox's unique key: say so in the backend's neutral words. */
    if (rc == OQ_EDB && e.cause == SQLITE_CONSTRAINT_UNIQUE)
        return oq_error_set(err, OQ_EEXIST, e.cause, "outbox append: message id %.40s exists",
                            row->message_id);
    if (rc && err) *err = e;
    return rc;
}

int oq__consumer_store_outbox_republish(oq__consumer_store_t *s, const oq_outbox_row_t *row,
                                        oq_outbox_republish_t *what, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_outbox_republish(s->pg, row, what, err);
    return oq_outbox_republish(s->db, s->cache, row, what, err);
}

int oq__consumer_store_inbox_retake(oq__consumer_store_t *s, const oq__inbox_row_t *row, int *taken,
                                    oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_inbox_retake(s->pg, row, taken, err);
    static const char sql[] = "UPDATE inbox SET call_id = ?2, topic = ?3, partition = ?4, "
                              "offset = ?5, received_at = ?6, outcome = ?7 "
                              "WHERE message_id = ?1 AND outcome = 'dlq'";
    sqlite3_stmt *st = stmt(s, sql, err);
    int rc;
    *taken = 0;
    if (!st) return stmt_error(err);
    bind_inbox_row(st, row);
    if ((rc = step_done(s, st, "inbox retake", err))) return rc;
    *taken = sqlite3_changes(s->db) == 1;
    return 0;
}

/* --- dead letters ---------------------------------------------------------------------------- */

int oq__consumer_store_dlq_insert(oq__consumer_store_t *s, const oq__dlq_row_t *r, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_dlq_insert(s->pg, r, err);
    static const char sql[] =
        "INSERT INTO dlq(message_id, topic, partition, offset, msg_key, payload, reason, "
        "created_at, code, redrive) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_text(st, 1, r->message_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, r->src.topic ? r->src.topic : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, r->src.partition);
    sqlite3_bind_int64(st, 4, r->src.offset);
    if (r->key)
        sqlite3_bind_blob64(st, 5, r->key, r->key_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 5);
    if (r->payload)
        sqlite3_bind_blob64(st, 6, r->payload, r->len, SQLITE_STATIC);
    else
        sqlite3_bind_zeroblob(st, 6, 0);
    sqlite3_bind_text(st, 7, r->reason, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 8, r->created_at);
    sqlite3_bind_text(st, 9, r->code ? r->code : "invalid_envelope", -1, SQLITE_STATIC);
    bind_text(st, 10, r->redrive);
    return step_done(s, st, "dlq insert", err);
}

int oq__consumer_store_dlq_pending(oq__consumer_store_t *s, int limit,
                                   void (*cb)(const oq__dlq_row_t *row, void *opaque), void *opaque,
                                   oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_dlq_pending(s->pg, limit, cb, opaque, err);
    static const char sql[] =
        "SELECT id, message_id, reason, msg_key, payload, code, topic, partition, offset, "
        "redrive FROM dlq WHERE published_at IS NULL ORDER BY id LIMIT ?1";
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_int(st, 1, limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        oq__dlq_row_t r;
        memset(&r, 0, sizeof(r));
        r.id = sqlite3_column_int64(st, 0);
        r.message_id = (const char *)sqlite3_column_text(st, 1);
        r.reason = (const char *)sqlite3_column_text(st, 2);
        r.key = sqlite3_column_blob(st, 3);
        r.key_len = (size_t)sqlite3_column_bytes(st, 3);
        r.payload = sqlite3_column_blob(st, 4);
        r.len = (size_t)sqlite3_column_bytes(st, 4);
        r.code = (const char *)sqlite3_column_text(st, 5);
        r.src.topic = (const char *)sqlite3_column_text(st, 6);
        r.src.partition = sqlite3_column_int(st, 7);
        r.src.offset = sqlite3_column_int64(st, 8);
        r.redrive = (const char *)sqlite3_column_text(st, 9);
        cb(&r, opaque);
    }
    rc = (rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "dlq select");
    sqlite3_reset(st);
    return rc;
}

int oq__consumer_store_dlq_mark(oq__consumer_store_t *s, int64_t id, int64_t now, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_dlq_mark(s->pg, id, now, err);
    static const char sql[] = "UPDATE dlq SET published_at = ?2 WHERE id = ?1";
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, now);
    return step_done(s, st, "dlq mark", err);
}

/* --- retention ------------------------------------------------------------------------------- */

int oq__consumer_store_purge(oq__consumer_store_t *s, int64_t before, int limit, int64_t *n_deleted,
                             oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_purge(s->pg, before, limit, n_deleted, err);
    static const char sql_inbox[] =
        "DELETE FROM inbox WHERE message_id IN (SELECT message_id FROM inbox "
        "WHERE received_at < ?1 LIMIT ?2)";
    static const char sql_dlq[] =
        "DELETE FROM dlq WHERE id IN (SELECT id FROM dlq WHERE published_at IS NOT NULL AND "
        "created_at < ?1 LIMIT ?2)";
    const char *const sqls[] = {sql_inbox, sql_dlq};
    int64_t total = 0;
    if (n_deleted) *n_deleted = 0;
    for (int i = 0; i < 2; i++) {
        sqlite3_stmt *st = stmt(s, sqls[i], err);
        if (!st) return stmt_error(err);
        sqlite3_bind_int64(st, 1, before);
        sqlite3_bind_int(st, 2, limit);
        int rc = step_done(s, st, "purge", err);
        if (rc) return rc;
        total += sqlite3_changes(s->db);
    }
    if (n_deleted) *n_deleted = total;
    return 0;
}

/* --- retention of settled executions (schema/consumer/0004_retention.sql) --------------------- */

int oq__consumer_store_purge_outbox(oq__consumer_store_t *s, int64_t before, int limit,
                                    int64_t *n_deleted, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_purge_outbox(s->pg, before, limit, n_deleted, err);
    return oq_outbox_purge_published(s->db, before, limit, n_deleted, err);
}

int oq__consumer_store_horizon(oq__consumer_store_t *s, int64_t *horizon, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_horizon(s->pg, horizon, err);
    static const char sql[] = "SELECT horizon FROM retention WHERE name = 'executions'";
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    int rc = sqlite3_step(st);
    *horizon = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    rc = (rc == SQLITE_ROW || rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "horizon");
    sqlite3_reset(st);
    return rc;
}

/* One integer from \p sql with ?1 = \p t. */
static int scalar_at(oq__consumer_store_t *s, const char *sql, int64_t t, int64_t *out,
                     oq_error_t *err)
{
    sqlite3_stmt *st = stmt(s, sql, err);
    if (!st) return stmt_error(err);
    sqlite3_bind_int64(st, 1, t);
    int rc = sqlite3_step(st);
    *out = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    rc = (rc == SQLITE_ROW || rc == SQLITE_DONE) ? 0 : oq_db_error(s->db, rc, err, "purge bound");
    sqlite3_clear_bindings(st);
    sqlite3_reset(st);
    return rc;
}

int oq__consumer_store_purge_bounds(oq__consumer_store_t *s, int64_t before, int64_t *max_rowid,
                                    int64_t *max_audit_id, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_purge_bounds(s->pg, before, max_rowid, max_audit_id, err);
    /* Rows are appended in time order (rowid / id): the scan of a pass ends before the first
     * row written at or after \p before, so a pass never reads the recent part of the tables. */
    static const char sql_x[] =
        "SELECT ifnull((SELECT rowid FROM executions WHERE created_at >= ?1 ORDER BY rowid "
        "LIMIT 1) - 1, (SELECT ifnull(max(rowid), 0) FROM executions))";
    static const char sql_a[] =
        "SELECT ifnull((SELECT id FROM audit WHERE ts >= ?1 ORDER BY id LIMIT 1) - 1, "
        "(SELECT ifnull(max(id), 0) FROM audit))";
    int rc = scalar_at(s, sql_x, before, max_rowid, err);
    return rc ? rc : scalar_at(s, sql_a, before, max_audit_id, err);
}

int oq__consumer_store_purge_settled(oq__consumer_store_t *s, const oq__purge_batch_t *b,
                                     int64_t *last, int64_t *n_exec, int64_t *n_eff,
                                     oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_purge_settled(s->pg, b, last, n_exec, n_eff, err);
    static const char sql_horizon[] =
        "INSERT INTO retention(name, horizon) VALUES('executions', ?1) "
        "ON CONFLICT(name) DO UPDATE SET horizon = max(horizon, excluded.horizon)";
    static const char sql_pick[] =
        "INSERT INTO temp.purge_x(rid, call_id) SELECT rowid, call_id FROM executions "
        "WHERE rowid > ?1 AND rowid <= ?2 AND (state = 'COMMITTED' OR state = 'FAILED_FINAL') "
        "AND updated_at < ?3 ORDER BY rowid LIMIT ?4";
    static const char sql_count[] = "SELECT count(*), ifnull(max(rid), 0) FROM temp.purge_x";
    static const char sql_eff[] =
        "DELETE FROM effects WHERE call_id IN (SELECT call_id FROM temp.purge_x)";
    static const char sql_exec[] = "DELETE FROM executions WHERE rowid IN (SELECT rid FROM "
                                   "temp.purge_x)";
    sqlite3_stmt *st;
    int rc;
    *n_exec = *n_eff = 0;
    *last = b->after;
    if ((rc = oq_db_exec(s->db,
                         "CREATE TEMP TABLE IF NOT EXISTS purge_x(rid INTEGER PRIMARY KEY, "
                         "call_id TEXT NOT NULL); DELETE FROM temp.purge_x",
                         err)))
        return rc;
    /* the horizon first: nothing settled after it is deleted, no message older is executed */
    if (!(st = stmt(s, sql_horizon, err))) return stmt_error(err);
    sqlite3_bind_int64(st, 1, b->horizon);
    if ((rc = step_done(s, st, "purge horizon", err))) return rc;
    if (!(st = stmt(s, sql_pick, err))) return stmt_error(err);
    sqlite3_bind_int64(st, 1, b->after);
    sqlite3_bind_int64(st, 2, b->upto);
    sqlite3_bind_int64(st, 3, b->before);
    sqlite3_bind_int(st, 4, b->limit);
    if ((rc = step_done(s, st, "purge pick", err))) return rc;
    if (!(st = stmt(s, sql_count, err))) return stmt_error(err);
    if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        *n_exec = sqlite3_column_int64(st, 0);
        if (*n_exec) *last = sqlite3_column_int64(st, 1);
        rc = 0;
    } else {
        rc = oq_db_error(s->db, rc, err, "purge count");
    }
    sqlite3_reset(st);
    if (rc || *n_exec == 0) return rc;
    if (!(st = stmt(s, sql_eff, err))) return stmt_error(err);
    if ((rc = step_done(s, st, "purge effects", err))) return rc;
    *n_eff = sqlite3_changes(s->db);
    if (!(st = stmt(s, sql_exec, err))) return stmt_error(err);
    return step_done(s, st, "purge executions", err);
}

int oq__consumer_store_purge_audit(oq__consumer_store_t *s, const oq__purge_batch_t *b,
                                   int64_t *last, int64_t *n_deleted, oq_error_t *err)
{
    if (s->pg) return oq__consumer_pg_purge_audit(s->pg, b, last, n_deleted, err);
    /* Audit rows older than the cutoff whose execution is gone (or that name no call): the
     * rows of an execution that is kept (in review, or changed since) stay with it. */
    static const char sql_pick[] =
        "INSERT INTO temp.purge_a(id) SELECT id FROM audit a WHERE id > ?1 AND id <= ?2 AND "
        "ts < ?3 AND (a.call_id IS NULL OR NOT EXISTS (SELECT 1 FROM executions x WHERE "
        "x.call_id = a.call_id)) ORDER BY id LIMIT ?4";
    static const char sql_count[] = "SELECT count(*), ifnull(max(id), 0) FROM temp.purge_a";
    static const char sql_del[] = "DELETE FROM audit WHERE id IN (SELECT id FROM temp.purge_a)";
    sqlite3_stmt *st;
    int rc;
    *n_deleted = 0;
    *last = b->after;
    if ((rc = oq_db_exec(s->db,
                         "CREATE TEMP TABLE IF NOT EXISTS purge_a(id INTEGER PRIMARY KEY); "
                         "DELETE FROM temp.purge_a",
                         err)))
        return rc;
    if (!(st = stmt(s, sql_pick, err))) return stmt_error(err);
    sqlite3_bind_int64(st, 1, b->after);
    sqlite3_bind_int64(st, 2, b->upto);
    sqlite3_bind_int64(st, 3, b->before);
    sqlite3_bind_int(st, 4, b->limit);
    if ((rc = step_done(s, st, "purge audit pick", err))) return rc;
    if (!(st = stmt(s, sql_count, err))) return stmt_error(err);
    int64_t n = 0;
    if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        n = sqlite3_column_int64(st, 0);
        if (n) *last = sqlite3_column_int64(st, 1);
        rc = 0;
    } else {
        rc = oq_db_error(s->db, rc, err, "purge audit count");
    }
    sqlite3_reset(st);
    if (rc || n == 0) return rc;
    if (!(st = stmt(s, sql_del, err))) return stmt_error(err);
    if ((rc = step_done(s, st, "purge audit", err))) return rc;
    *n_deleted = sqlite3_changes(s->db);
    return 0;
}
