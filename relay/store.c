/* SPDX-License-Identifier: Apache-2.0 */
/*
 * All SQL of the relay on SQLite, against the tables of schema/common/0001_outbox.sql and
 * 0002_outbox_watermark.sql (outbox and relay_lease). A database setting that names PostgreSQL
 * opens a store whose every operation is handed to store_pg.c instead (one line at the top of
 * each function).
 *
 * Lease and fencing: relay_lease holds one row per lease name with the owner, a fencing token
 * and an expiry in wall-clock ms. Taking an expired lease (or a missing one) bumps the fence in
 * a BEGIN IMMEDIATE transaction, so two relays racing for it serialise on SQLite's write lock
 * and exactly one wins. Every write the holder makes afterwards (renewals, marks) carries
 * `owner = ? AND fence = ? AND expires_at > now` in its WHERE clause: a holder that was paused
 * past its expiry and resumed finds zero rows to change and learns it was fenced, instead of
 * marking rows a successor is now responsible for.
 *
 * Publish progress is a watermark, relay_lease.published_seq: every row with seq <= it was
 * delivered, every row above it is pending. Reads are a rowid range scan after a cursor and
 * run in autocommit (a WAL snapshot per batch), so a long Kafka outage never holds a write
 * lock. A mark is one UPDATE of the lease row that renews the lease and advances the watermark
 * (never backwards) under the fencing check, whatever the number of rows it covers. Retention
 * deletes published rows past their age in bounded batches from the low end of seq.
 *
 * Dead letters (schema/common/0003_outbox_dead.sql): a row Kafka refuses for good is copied
 * into outbox_dead inside the very mark transaction whose watermark passes it, after the
 * fencing check, so a stored watermark never passes a row that is neither delivered nor set
 * aside. The copy keeps the payload: retention deletes the outbox row as any published one.
 */
#include "relay_store.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_db.h"
#include "oq_log.h"
#include "oq_pg.h"
#include "oq_util.h"
#include "store_pg.h"

struct oq__relay_store {
    sqlite3 *db;
    oq_stmt_cache_t *cache;
    oq__relay_pg_t *pg; /* PostgreSQL instead of db: every operation goes to store_pg.c */
};

/* How long a relay transaction waits for the write lock beyond the busy handler. */
#define OQ__RELAY_BEGIN_TIMEOUT_MS 2000

static const char sql_data_version[] = "PRAGMA data_version";

static const char sql_lease_get[] =
    "SELECT owner, fence, expires_at, published_seq FROM relay_lease WHERE name = ?1";
static const char sql_lease_insert[] =
    "INSERT INTO relay_lease(name, owner, fence, expires_at) VALUES (?1, ?2, 1, ?3)";
static const char sql_lease_take[] =
    "UPDATE relay_lease SET owner = ?2, fence = fence + 1, expires_at = ?3 "
    "WHERE name = ?1 AND fence = ?4";
static const char sql_lease_renew[] =
    "UPDATE relay_lease SET expires_at = ?5 "
    "WHERE name = ?1 AND owner = ?2 AND fence = ?3 AND expires_at > ?4";
static const char sql_lease_release[] =
    "UPDATE relay_lease SET expires_at = 0 WHERE name = ?1 AND owner = ?2 AND fence = ?3";

static const char sql_read[] =
    "SELECT seq, created_at, message_id, topic, key, payload FROM outbox "
    "WHERE seq > ?1 ORDER BY seq LIMIT ?2";

/* Mark = renew + advance the watermark, under the fencing check, in one statement. */
static const char sql_mark[] =
    "UPDATE relay_lease SET published_seq = max(published_seq, ?6), published_at = ?4, "
    "expires_at = ?5 WHERE name = ?1 AND owner = ?2 AND fence = ?3 AND expires_at > ?4";

/* The highest watermark of any lease row: rows at or below it were delivered. */
#define OQ__WATERMARK "(SELECT COALESCE(max(published_seq), 0) FROM relay_lease)"

/* Looks at the oldest ?2 rows only (bounded work per call, however many young published rows
 * there are) and deletes those published and created before ?1. created_at follows seq up to
 * clock steps: a row out of order waits for a later round. */
static const char sql_cleanup[] =
    "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE seq <= " OQ__WATERMARK
    " ORDER BY seq LIMIT ?2) AND created_at < ?1";

static const char sql_pending_count[] = "SELECT count(*) FROM outbox WHERE seq > " OQ__WATERMARK;
static const char sql_pending_oldest[] =
    "SELECT created_at FROM outbox WHERE seq > " OQ__WATERMARK " ORDER BY seq LIMIT 1";

static const char sql_check_tables[] =
    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('outbox', "
    "'relay_lease')";
static const char sql_check_watermark[] = "SELECT published_seq FROM relay_lease LIMIT 0";
static const char sql_check_dead[] = "SELECT handled_at FROM outbox_dead LIMIT 0";

/* A dead letter: the outbox row copied with its reason. OR IGNORE: a row already set aside
 * (by an earlier holder whose mark committed) keeps its first record. */
static const char sql_dead_insert[] =
    "INSERT OR IGNORE INTO outbox_dead(seq, message_id, topic, key, payload, created_at, reason, "
    "detail, dead_at) SELECT seq, message_id, topic, key, payload, created_at, ?2, ?3, ?4 "
    "FROM outbox WHERE seq = ?1";

/* --- open / close -------------------------------------------------------------------------- */

int oq__relay_store_open(const char *path, const char *synchronous, oq__relay_store_t **out,
                         oq_error_t *err)
{
    oq__relay_store_t *s = calloc(1, sizeof(*s));
    sqlite3_stmt *st = NULL;
    int rc;
    *out = NULL;
    if (!s) return oq_error_set(err, OQ_ENOMEM, 0, "relay store: out of memory");
    if (oq_backend_of(path) == OQ_BACKEND_POSTGRES) {
        if ((rc = oq__relay_pg_open(path, &s->pg, err)) != 0) {
            free(s);
            return rc;
        }
        *out = s;
        return 0;
    }
    oq_db_opts_t o = {.synchronous = synchronous, .busy_timeout_ms = 5000};
    rc = oq_db_open(path, &o, &s->db, err);
    if (rc != 0) goto fail;
    rc = sqlite3_prepare_v2(s->db, sql_check_tables, -1, &st, NULL);
    if (rc != SQLITE_OK) {
        rc = oq_db_error(s->db, rc, err, "relay store: check tables");
        goto fail;
    }
    rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
        rc = oq_db_error(s->db, rc, err, "relay store: check tables");
        goto fail;
    }
    if (sqlite3_column_int(st, 0) != 2) {
        rc = oq_error_set(err, OQ_EDB, 0,
                          "database %s has no outbox/relay_lease tables (not migrated yet?)", path);
        goto fail;
    }
    sqlite3_finalize(st);
    st = NULL;
    /* Columns and tables of later migrations: a statement naming them must prepare. */
    static const struct {
        const char *sql, *missing;
    } later[] = {{sql_check_watermark, "relay_lease.published_seq"},
                 {sql_check_dead, "an outbox_dead table"}};
    for (size_t i = 0; i < sizeof later / sizeof later[0]; i++) {
        if (sqlite3_prepare_v2(s->db, later[i].sql, -1, &st, NULL) != SQLITE_OK) {
            rc = oq_error_set(err, OQ_EDB, 0,
                              "database %s has no %s (schema older than this relay: start the "
                              "producer or consumer of this version once to migrate)",
                              path, later[i].missing);
            goto fail;
        }
        sqlite3_finalize(st);
        st = NULL;
    }
    /* The relay reads every row once: memory-mapped reads avoid a pread copy per page. */
    sqlite3_exec(s->db, "PRAGMA mmap_size=268435456", NULL, NULL, NULL);
    sqlite3_exec(s->db, "PRAGMA cache_size=-32768", NULL, NULL, NULL);
    s->cache = oq_stmt_cache_new(s->db);
    if (!s->cache) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "relay store: out of memory");
        goto fail;
    }
    *out = s;
    return 0;
fail:
    sqlite3_finalize(st);
    oq__relay_store_close(s);
    return rc;
}

void oq__relay_store_attach(oq__relay_store_t *s, oq_ckpt_t *ck)
{
    if (s && s->db) oq_ckpt_attach(ck, s->db);
}

void oq__relay_store_close(oq__relay_store_t *s)
{
    if (!s) return;
    oq__relay_pg_close(s->pg);
    oq_stmt_cache_destroy(s->cache);
    if (s->db) sqlite3_close_v2(s->db);
    free(s);
}

static sqlite3_stmt *get(oq__relay_store_t *s, const char *sql, oq_error_t *err)
{
    return oq_stmt_get(s->cache, sql, err);
}

/* Returns the OQ_E* code recorded by a failed get(). */
static int prep_fail(oq_error_t *err)
{
    return (err && err->code) ? err->code : OQ_EDB;
}

int oq__relay_store_notify_fd(oq__relay_store_t *s)
{
    return s->pg ? oq__relay_pg_notify_fd(s->pg) : -1;
}

int oq__relay_store_data_version(oq__relay_store_t *s, int64_t *out, oq_error_t *err)
{
    if (s->pg) return oq__relay_pg_data_version(s->pg, out, err);
    sqlite3_stmt *st = get(s, sql_data_version, err);
    if (!st) return prep_fail(err);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *out = sqlite3_column_int64(st, 0);
        rc = 0;
    } else {
        rc = oq_db_error(s->db, rc, err, "relay: data_version");
    }
    sqlite3_reset(st);
    return rc;
}

/* Binds ?1..?5 of the statements that renew a held lease (sql_lease_renew, sql_mark): name,
 * owner, fence, now, new expiry. */
/* ?1 name, ?2 owner, ?3 expires_at: a new lease row or a take-over. */
static void bind_claim(sqlite3_stmt *st, const char *name, const char *owner, int64_t expires_at)
{
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, expires_at);
}

static void bind_lease(sqlite3_stmt *st, const char *name, const char *owner, int64_t fence,
                       int64_t now_ms, int64_t lease_ms)
{
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, fence);
    sqlite3_bind_int64(st, 4, now_ms);
    sqlite3_bind_int64(st, 5, now_ms + lease_ms);
}

/* --- lease --------------------------------------------------------------------------------- */

int oq__relay_lease_acquire(oq__relay_store_t *s, const char *name, const char *owner,
                            int64_t lease_ms, int64_t now_ms, int64_t *fence, int *held,
                            char *holder, size_t holder_cap, int64_t *published_seq,
                            oq_error_t *err)
{
    if (s->pg)
        return oq__relay_pg_lease_acquire(s->pg, name, owner, lease_ms, fence, held, holder,
                                          holder_cap, published_seq, err);
    sqlite3_stmt *st;
    int rc, step;
    *held = 0;
    if (published_seq) *published_seq = 0;
    if (holder && holder_cap) holder[0] = '\0';
    rc = oq_db_begin_immediate(s->db, OQ__RELAY_BEGIN_TIMEOUT_MS, err);
    if (rc != 0) return rc;

    st = get(s, sql_lease_get, err);
    if (!st) {
        rc = prep_fail(err);
        goto out;
    }
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    step = sqlite3_step(st);
    if (step == SQLITE_DONE) {
        sqlite3_reset(st);
        st = get(s, sql_lease_insert, err);
        if (!st) {
            rc = prep_fail(err);
            goto out;
        }
        bind_claim(st, name, owner, now_ms + lease_ms);
        step = sqlite3_step(st);
        sqlite3_reset(st);
        if (step != SQLITE_DONE) {
            rc = oq_db_error(s->db, step, err, "relay lease insert");
            goto out;
        }
        *fence = 1;
        *held = 1;
        if (holder && holder_cap) snprintf(holder, holder_cap, "%s", owner);
        goto commit;
    }
    if (step != SQLITE_ROW) {
        rc = oq_db_error(s->db, step, err, "relay lease read");
        sqlite3_reset(st);
        goto out;
    }
    char cur_owner[256];
    const unsigned char *o = sqlite3_column_text(st, 0);
    snprintf(cur_owner, sizeof(cur_owner), "%s", o ? (const char *)o : "");
    int64_t cur_fence = sqlite3_column_int64(st, 1);
    int64_t cur_exp = sqlite3_column_int64(st, 2);
    if (published_seq) *published_seq = sqlite3_column_int64(st, 3);
    sqlite3_reset(st);
    if (holder && holder_cap) snprintf(holder, holder_cap, "%s", cur_owner);

    int ours = strcmp(cur_owner, owner) == 0 && cur_fence == *fence && cur_exp > now_ms;
    if (ours) {
        st = get(s, sql_lease_renew, err);
        if (!st) {
            rc = prep_fail(err);
            goto out;
        }
        bind_lease(st, name, owner, cur_fence, now_ms, lease_ms);
    } else if (cur_exp <= now_ms) {
        st = get(s, sql_lease_take, err);
        if (!st) {
            rc = prep_fail(err);
            goto out;
        }
        bind_claim(st, name, owner, now_ms + lease_ms);
        sqlite3_bind_int64(st, 4, cur_fence);
    } else {
        goto commit; /* someone else holds it: read-only transaction */
    }
    step = sqlite3_step(st);
    sqlite3_reset(st);
    if (step != SQLITE_DONE) {
        rc = oq_db_error(s->db, step, err, "relay lease update");
        goto out;
    }
    if (sqlite3_changes(s->db) == 1) {
        *fence = ours ? cur_fence : cur_fence + 1;
        *held = 1;
        if (holder && holder_cap) snprintf(holder, holder_cap, "%s", owner);
    }
commit:
    rc = oq_db_commit(s->db, err);
    if (rc != 0) *held = 0;
out:
    if (rc != 0) {
        *held = 0;
        oq_db_rollback(s->db);
    }
    return rc;
}

static int lease_renew_stmt(oq__relay_store_t *s, const char *name, const char *owner,
                            int64_t fence, int64_t lease_ms, int64_t now_ms, oq_error_t *err)
{
    sqlite3_stmt *st = get(s, sql_lease_renew, err);
    if (!st) return prep_fail(err);
    bind_lease(st, name, owner, fence, now_ms, lease_ms);
    int step = sqlite3_step(st);
    sqlite3_reset(st);
    if (step != SQLITE_DONE) return oq_db_error(s->db, step, err, "relay lease renew");
    if (sqlite3_changes(s->db) != 1)
        return oq_error_set(err, OQ_EFENCED, 0, "lease %s lost (fence %" PRId64 ")", name, fence);
    return 0;
}

int oq__relay_lease_renew(oq__relay_store_t *s, const char *name, const char *owner, int64_t fence,
                          int64_t lease_ms, int64_t now_ms, oq_error_t *err)
{
    if (s->pg) return oq__relay_pg_lease_renew(s->pg, name, owner, fence, lease_ms, err);
    /* A single UPDATE is its own transaction: no BEGIN needed. */
    return lease_renew_stmt(s, name, owner, fence, lease_ms, now_ms, err);
}

int oq__relay_lease_release(oq__relay_store_t *s, const char *name, const char *owner,
                            int64_t fence, oq_error_t *err)
{
    if (s->pg) return oq__relay_pg_lease_release(s->pg, name, owner, fence, err);
    sqlite3_stmt *st = get(s, sql_lease_release, err);
    if (!st) return prep_fail(err);
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, fence);
    int step = sqlite3_step(st);
    sqlite3_reset(st);
    if (step != SQLITE_DONE) return oq_db_error(s->db, step, err, "relay lease release");
    return 0;
}

/* --- read ---------------------------------------------------------------------------------- */

int oq__relay_store_read(oq__relay_store_t *s, int64_t after, int max_rows, int64_t max_bytes,
                         oq__relay_row_cb cb, void *ctx, int *nread, oq_error_t *err)
{
    if (s->pg) return oq__relay_pg_read(s->pg, after, max_rows, max_bytes, cb, ctx, nread, err);
    sqlite3_stmt *st = get(s, sql_read, err);
    int rc = 0, n = 0;
    int64_t bytes = 0;
    *nread = 0;
    if (!st) return prep_fail(err);
    sqlite3_bind_int64(st, 1, after);
    sqlite3_bind_int(st, 2, max_rows);
    for (;;) {
        int step = sqlite3_step(st);
        if (step == SQLITE_DONE) break;
        if (step != SQLITE_ROW) {
            rc = oq_db_error(s->db, step, err, "relay read outbox");
            break;
        }
        oq__relay_row_t row;
        row.seq = sqlite3_column_int64(st, 0);
        row.created_at = sqlite3_column_int64(st, 1);
        row.message_id = (const char *)sqlite3_column_text(st, 2);
        row.topic = (const char *)sqlite3_column_text(st, 3);
        row.key = (const char *)sqlite3_column_text(st, 4);
        row.key_len = (size_t)sqlite3_column_bytes(st, 4);
        row.payload = sqlite3_column_blob(st, 5);
        row.payload_len = (size_t)sqlite3_column_bytes(st, 5);
        if (!row.message_id || !row.topic || !row.key) {
            rc = oq_error_set(err, OQ_ENOMEM, 0, "relay read outbox: out of memory");
            break;
        }
        if (!row.payload) row.payload = "";
        if (cb(ctx, &row) != 0) break;
        n++;
        bytes += (int64_t)row.payload_len;
        if (bytes >= max_bytes) break;
    }
    sqlite3_reset(st); /* ends the read snapshot */
    *nread = n;
    return rc;
}

/* --- mark ---------------------------------------------------------------------------------- */

int oq__relay_store_mark(oq__relay_store_t *s, const char *name, const char *owner, int64_t fence,
                         int64_t lease_ms, int64_t now_ms, int64_t upto, oq_error_t *err)
{
    return oq__relay_store_mark_dead(s, name, owner, fence, lease_ms, now_ms, upto, NULL, 0, err);
}

int oq__relay_store_mark_dead(oq__relay_store_t *s, const char *name, const char *owner,
                              int64_t fence, int64_t lease_ms, int64_t now_ms, int64_t upto,
                              const oq__relay_dead_t *dead, size_t ndead, oq_error_t *err)
{
    if (s->pg)
        return oq__relay_pg_mark_dead(s->pg, name, owner, fence, lease_ms, now_ms, upto, dead,
                                      ndead, err);
    int rc = oq_db_begin_immediate(s->db, OQ__RELAY_BEGIN_TIMEOUT_MS, err);
    if (rc != 0) return rc;
    sqlite3_stmt *st = get(s, sql_mark, err);
    if (!st) {
        rc = prep_fail(err);
        goto out;
    }
    bind_lease(st, name, owner, fence, now_ms, lease_ms);
    sqlite3_bind_int64(st, 6, upto);
    int step = sqlite3_step(st);
    sqlite3_reset(st);
    if (step != SQLITE_DONE) {
        rc = oq_db_error(s->db, step, err, "relay mark");
        goto out;
    }
    if (sqlite3_changes(s->db) != 1) {
        rc = oq_error_set(err, OQ_EFENCED, 0, "lease %s lost (fence %" PRId64 "): nothing marked",
                          name, fence);
        goto out;
    }
    for (size_t i = 0; i < ndead; i++) {
        st = get(s, sql_dead_insert, err);
        if (!st) {
            rc = prep_fail(err);
            goto out;
        }
        sqlite3_bind_int64(st, 1, dead[i].seq);
        sqlite3_bind_text(st, 2, dead[i].reason, -1, SQLITE_STATIC);
        if (dead[i].detail)
            sqlite3_bind_text(st, 3, dead[i].detail, -1, SQLITE_STATIC);
        else
            sqlite3_bind_null(st, 3);
        sqlite3_bind_int64(st, 4, now_ms);
        step = sqlite3_step(st);
        sqlite3_reset(st);
        if (step != SQLITE_DONE) {
            rc = oq_db_error(s->db, step, err, "relay dead letter");
            goto out;
        }
    }
    OQ_CRASH_POINT("relay.after_mark_before_commit");
    rc = oq_db_commit(s->db, err);
out:
    if (rc != 0) oq_db_rollback(s->db);
    return rc;
}

/* --- cleanup ------------------------------------------------------------------------------- */

int oq__relay_store_cleanup(oq__relay_store_t *s, int64_t cutoff_ms, int limit, int64_t *deleted,
                            oq_error_t *err)
{
    if (s->pg) return oq__relay_pg_cleanup(s->pg, cutoff_ms, limit, deleted, err);
    int rc;
    *deleted = 0;
    rc = oq_db_begin_immediate(s->db, OQ__RELAY_BEGIN_TIMEOUT_MS, err);
    if (rc != 0) return rc;
    sqlite3_stmt *st = get(s, sql_cleanup, err);
    if (!st) {
        rc = prep_fail(err);
        goto out;
    }
    sqlite3_bind_int64(st, 1, cutoff_ms);
    sqlite3_bind_int(st, 2, limit);
    int step = sqlite3_step(st);
    sqlite3_reset(st);
    if (step != SQLITE_DONE) {
        rc = oq_db_error(s->db, step, err, "relay cleanup");
        goto out;
    }
    int64_t n = sqlite3_changes(s->db);
    OQ_CRASH_POINT("relay.cleanup_before_commit");
    rc = oq_db_commit(s->db, err);
    if (rc == 0) *deleted = n;
out:
    if (rc != 0) oq_db_rollback(s->db);
    return rc;
}

/* --- stats --------------------------------------------------------------------------------- */

static int scalar(sqlite3 *db, sqlite3_stmt *st, int64_t *out, int *found, oq_error_t *err,
                  const char *what)
{
    int step = sqlite3_step(st);
    *found = 0;
    if (step == SQLITE_ROW) {
        *out = sqlite3_column_int64(st, 0);
        *found = 1;
        step = SQLITE_DONE;
    }
    sqlite3_reset(st);
    return step == SQLITE_DONE ? 0 : oq_db_error(db, step, err, what);
}

int oq__relay_store_pending(oq__relay_store_t *s, int64_t *count, int64_t *oldest_created_at,
                            oq_error_t *err)
{
    if (s->pg) return oq__relay_pg_pending(s->pg, count, oldest_created_at, err);
    int found, rc;
    sqlite3_stmt *st = get(s, sql_pending_count, err);
    if (!st) return prep_fail(err);
    *count = 0;
    *oldest_created_at = 0;
    rc = scalar(s->db, st, count, &found, err, "relay pending count");
    if (rc != 0) return rc;
    st = get(s, sql_pending_oldest, err);
    if (!st) return prep_fail(err);
    return scalar(s->db, st, oldest_created_at, &found, err, "relay pending oldest");
}

int oq__relay_store_status(sqlite3 *db, oq__relay_status_t *out, oq_error_t *err)
{
    static const char q_pub[] = "SELECT count(*) FROM outbox WHERE seq <= " OQ__WATERMARK;
    static const char q_lease[] =
        "SELECT name, owner, fence, expires_at, published_seq FROM relay_lease ORDER BY name";
    sqlite3_stmt *st = NULL;
    int rc = 0, found;
    memset(out, 0, sizeof(*out));

#define OQ__PREP(q)                                                                                \
    do {                                                                                           \
        sqlite3_finalize(st);                                                                      \
        st = NULL;                                                                                 \
        int prc_ = sqlite3_prepare_v2(db, (q), -1, &st, NULL);                                     \
        if (prc_ != SQLITE_OK) {                                                                   \
            rc = oq_db_error(db, prc_, err, "relay status");                                       \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

    OQ__PREP(sql_pending_count);
    if ((rc = scalar(db, st, &out->pending, &found, err, "relay status")) != 0) goto out;
    OQ__PREP(sql_pending_oldest);
    if ((rc = scalar(db, st, &out->oldest_pending_at, &found, err, "relay status")) != 0) goto out;
    if (!found) out->oldest_pending_at = 0;
    OQ__PREP(q_pub);
    if ((rc = scalar(db, st, &out->published, &found, err, "relay status")) != 0) goto out;
    OQ__PREP(q_lease);
    for (;;) {
        int step = sqlite3_step(st);
        if (step == SQLITE_DONE) break;
        if (step != SQLITE_ROW) {
            rc = oq_db_error(db, step, err, "relay status lease");
            goto out;
        }
        if (out->nleases >= OQ__RELAY_STATUS_LEASES) continue;
        oq__relay_lease_status_t *l = &out->leases[out->nleases++];
        const unsigned char *lname = sqlite3_column_text(st, 0);
        const unsigned char *owner = sqlite3_column_text(st, 1);
        snprintf(l->name, sizeof l->name, "%s", lname ? (const char *)lname : "?");
        snprintf(l->owner, sizeof l->owner, "%s", owner ? (const char *)owner : "?");
        l->fence = sqlite3_column_int64(st, 2);
        l->expires_at = sqlite3_column_int64(st, 3);
        l->published_seq = sqlite3_column_int64(st, 4);
    }
    /* Dead letters, when there are any (a database older than outbox_dead has none). */
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM outbox_dead", -1, &st, NULL) == SQLITE_OK)
        rc = scalar(db, st, &out->dead, &found, err, "relay status dead");
#undef OQ__PREP
out:
    sqlite3_finalize(st);
    return rc;
}

int oq__relay_store_dead_read(sqlite3 *db, int64_t seq, int limit,
                              void (*cb)(const oq__relay_dead_read_t *row, void *opaque),
                              void *opaque, oq_error_t *err)
{
    static const char sql[] =
        "SELECT seq, message_id, topic, key, payload, created_at, reason, detail, dead_at, "
        "handled_at FROM outbox_dead WHERE ?1 = 0 OR seq = ?1 ORDER BY seq LIMIT ?2";
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(db, rc, err, "outbox_dead");
    sqlite3_bind_int64(st, 1, seq);
    sqlite3_bind_int(st, 2, limit);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        oq__relay_dead_read_t r = {
            .seq = sqlite3_column_int64(st, 0),
            .message_id = (const char *)sqlite3_column_text(st, 1),
            .topic = (const char *)sqlite3_column_text(st, 2),
            .key = (const char *)sqlite3_column_text(st, 3),
            .payload = sqlite3_column_blob(st, 4),
            .len = (size_t)sqlite3_column_bytes(st, 4),
            .created_at = sqlite3_column_int64(st, 5),
            .reason = (const char *)sqlite3_column_text(st, 6),
            .detail = (const char *)sqlite3_column_text(st, 7),
            .dead_at = sqlite3_column_int64(st, 8),
            .handled_at = sqlite3_column_int64(st, 9),
        };
        cb(&r, opaque);
    }
    rc = rc == SQLITE_DONE ? 0 : oq_db_error(db, rc, err, "outbox_dead");
    sqlite3_finalize(st);
    return rc;
}

int oq__relay_store_status_of(const oq_dbh_t *h, oq__relay_status_t *out, oq_error_t *err)
{
    if (h->pg) return oq__relay_pg_status(h->pg, out, err);
    return oq__relay_store_status(h->db, out, err);
}

int oq__relay_store_dead_read_of(const oq_dbh_t *h, int64_t seq, int limit,
                                 void (*cb)(const oq__relay_dead_read_t *row, void *opaque),
                                 void *opaque, oq_error_t *err)
{
    if (h->pg) return oq__relay_pg_dead_read(h->pg, seq, limit, cb, opaque, err);
    return oq__relay_store_dead_read(h->db, seq, limit, cb, opaque, err);
}
