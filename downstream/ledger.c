/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ledger.c: every SQL statement of the test downstream (`onceq-downstream`), in one file.
 *
 * The ledger is the downstream's own record of the side effects it performed: one row per
 * payment it committed, with the idempotency key and the reference it was given, whether it
 * honoured the key for that request, and the canonical request body. It is deliberately not
 * constrained to one row per key: a service that ignores keys (the mode this test service
 * offers for negative controls) records every resend as a new payment, and the statistics
 * count those rows as duplicate side effects. Keys are honoured by the rules in server.c
 * (look the key up, then insert, inside one write transaction of the single writer thread),
 * not by a UNIQUE index, so that both behaviours share one table.
 *
 * The schema is embedded here rather than in schema/ because it belongs to a test service,
 * not to onceq's own databases; it uses the same migration mechanism (PRAGMA user_version).
 * Durability is the project's default: WAL and synchronous=FULL unless the caller lowers it.
 */
#include <stdlib.h>
#include <string.h>

#include "ledger.h"
#include "oq_downstream.h"
#include "oq_log.h"

static const char *const ledger_schema[] = {
    "CREATE TABLE payments(\n"
    "  seq        INTEGER PRIMARY KEY,\n"
    "  id         TEXT NOT NULL UNIQUE,\n"
    "  idem_key   TEXT,\n"
    "  reference  TEXT,\n"
    "  amount     INTEGER NOT NULL,\n"
    "  currency   TEXT NOT NULL,\n"
    "  request    TEXT NOT NULL,\n"
    "  honoured   INTEGER NOT NULL,\n"
    "  created_at INTEGER NOT NULL\n"
    ");\n"
    "CREATE INDEX payments_by_key ON payments(idem_key, seq) WHERE idem_key IS NOT NULL;\n"
    "CREATE INDEX payments_by_ref ON payments(reference, seq) WHERE reference IS NOT NULL;\n",
    NULL,
};

struct oq__ledger {
    sqlite3 *db;
    oq_stmt_cache_t *cache;
};

#define PAY_COLS "seq, id, idem_key, reference, amount, currency, request, honoured, created_at"

void oq__ds_payment_clear(oq__ds_payment_t *p)
{
    if (!p) return;
    free(p->idem_key);
    free(p->reference);
    free(p->request);
    memset(p, 0, sizeof *p);
}

int oq__ledger_open(const char *path, const char *synchronous, int readonly, oq__ledger_t **out,
                    oq_error_t *err)
{
    int rc;
    oq__ledger_t *l = calloc(1, sizeof *l);
    if (!l) return oq_error_set(err, OQ_ENOMEM, 0, "ledger: out of memory");
    oq_db_opts_t o = {synchronous, 0, readonly};
    if ((rc = oq_db_open(path, &o, &l->db, err)) != 0) goto out;
    if (!readonly && (rc = oq_db_migrate_sql(l->db, ledger_schema, err)) != 0) goto out;
    if (readonly) {
        /* An offline reader of a file that is not a ledger should say so, not fail later. */
        int v = oq_db_user_version(l->db);
        if (v < 1) {
            rc = oq_error_set(err, OQ_EINVAL, 0, "%s is not a downstream ledger", path);
            goto out;
        }
    }
    if (!(l->cache = oq_stmt_cache_new(l->db))) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "ledger: out of memory");
        goto out;
    }
    *out = l;
    return 0;
out:
    oq__ledger_close(l);
    return rc;
}

void oq__ledger_close(oq__ledger_t *l)
{
    if (!l) return;
    oq_stmt_cache_destroy(l->cache);
    if (l->db) sqlite3_close_v2(l->db);
    free(l);
}

int oq__ledger_begin(oq__ledger_t *l, oq_error_t *err)
{
    return oq_db_begin_immediate(l->db, 10000, err);
}

int oq__ledger_commit(oq__ledger_t *l, oq_error_t *err)
{
    return oq_db_commit(l->db, err);
}

void oq__ledger_rollback(oq__ledger_t *l)
{
    oq_db_rollback(l->db);
}

static char *col_dup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

static int read_row(sqlite3_stmt *st, oq__ds_payment_t *p)
{
    memset(p, 0, sizeof *p);
    p->seq = sqlite3_column_int64(st, 0);
    snprintf(p->id, sizeof p->id, "%s", (const char *)sqlite3_column_text(st, 1));
    p->idem_key = col_dup(st, 2);
    p->reference = col_dup(st, 3);
    p->amount = sqlite3_column_int64(st, 4);
    snprintf(p->currency, sizeof p->currency, "%s", (const char *)sqlite3_column_text(st, 5));
    p->request = col_dup(st, 6);
    p->honoured = sqlite3_column_int(st, 7);
    p->created_at = sqlite3_column_int64(st, 8);
    if (!p->request || (sqlite3_column_type(st, 2) != SQLITE_NULL && !p->idem_key) ||
        (sqlite3_column_type(st, 3) != SQLITE_NULL && !p->reference)) {
        oq__ds_payment_clear(p);
        return OQ_ENOMEM;
    }
    return 0;
}

/* Runs a prepared lookup bound to one text value: first row into out, row count into count. */
static int find_one(oq__ledger_t *l, const char *sql, const char *count_sql, const char *value,
                    oq__ds_payment_t *out, int *count, oq_error_t *err)
{
    sqlite3_stmt *st = oq_stmt_get(l->cache, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, value, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        sqlite3_reset(st);
        return OQ_ENOTFOUND;
    }
    if (rc != SQLITE_ROW) {
        rc = oq_db_error(l->db, rc, err, "ledger lookup");
        sqlite3_reset(st);
        return rc;
    }
    rc = read_row(st, out);
    sqlite3_reset(st);
    if (rc) return oq_error_set(err, rc, 0, "ledger: out of memory");
    if (count && count_sql) {
        sqlite3_stmt *cs = oq_stmt_get(l->cache, count_sql, err);
        if (!cs) {
            oq__ds_payment_clear(out);
            return err ? err->code : OQ_EDB;
        }
        sqlite3_bind_text(cs, 1, value, -1, SQLITE_STATIC);
        rc = sqlite3_step(cs);
        *count = rc == SQLITE_ROW ? sqlite3_column_int(cs, 0) : 1;
        sqlite3_reset(cs);
    }
    return 0;
}

int oq__ledger_find_by_key(oq__ledger_t *l, const char *key, oq__ds_payment_t *out, int *count,
                           oq_error_t *err)
{
    return find_one(l, "SELECT " PAY_COLS " FROM payments WHERE idem_key = ?1 ORDER BY seq LIMIT 1",
                    "SELECT count(*) FROM payments WHERE idem_key = ?1", key, out, count, err);
}

int oq__ledger_find_by_ref(oq__ledger_t *l, const char *ref, oq__ds_payment_t *out, int *count,
                           oq_error_t *err)
{
    return find_one(l,
                    "SELECT " PAY_COLS " FROM payments WHERE reference = ?1 ORDER BY seq LIMIT 1",
                    "SELECT count(*) FROM payments WHERE reference = ?1", ref, out, count, err);
}

int oq__ledger_get(oq__ledger_t *l, const char *id, oq__ds_payment_t *out, oq_error_t *err)
{
    return find_one(l, "SELECT " PAY_COLS " FROM payments WHERE id = ?1", NULL, id, out, NULL, err);
}

int oq__ledger_insert(oq__ledger_t *l, oq__ds_payment_t *p, oq_error_t *err)
{
    static const char sql[] = "INSERT INTO payments(id, idem_key, reference, amount, currency, "
                              "request, honoured, created_at) VALUES (?1,?2,?3,?4,?5,?6,?7,?8)";
    sqlite3_stmt *st = oq_stmt_get(l->cache, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, p->id, -1, SQLITE_STATIC);
    if (p->idem_key) sqlite3_bind_text(st, 2, p->idem_key, -1, SQLITE_STATIC);
    if (p->reference) sqlite3_bind_text(st, 3, p->reference, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, p->amount);
    sqlite3_bind_text(st, 5, p->currency, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, p->request ? p->request : "{}", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 7, p->honoured);
    sqlite3_bind_int64(st, 8, p->created_at);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) {
        rc = oq_db_error(l->db, rc, err, "ledger insert");
        sqlite3_reset(st);
        return rc;
    }
    sqlite3_reset(st);
    p->seq = sqlite3_last_insert_rowid(l->db);
    return 0;
}

/* Appends up to top rows of a "value, count" query to a new array under name in o. */
static int dup_list(oq__ledger_t *l, const char *sql, int top, json_t *o, const char *name,
                    const char *field, oq_error_t *err)
{
    sqlite3_stmt *st = oq_stmt_get(l->cache, sql, err);
    if (!st) return err ? err->code : OQ_EDB;
    sqlite3_bind_int(st, 1, top);
    json_t *arr = json_array();
    int rc;
    if (!arr) {
        sqlite3_reset(st);
        return oq_error_set(err, OQ_ENOMEM, 0, "ledger stats: out of memory");
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *e = json_pack("{s:s,s:I}", field, (const char *)sqlite3_column_text(st, 0),
                              "effects", (json_int_t)sqlite3_column_int64(st, 1));
        if (!e || json_array_append_new(arr, e) != 0) {
            json_decref(arr);
            sqlite3_reset(st);
            return oq_error_set(err, OQ_ENOMEM, 0, "ledger stats: out of memory");
        }
    }
    if (rc != SQLITE_DONE) {
        rc = oq_db_error(l->db, rc, err, "ledger stats");
        json_decref(arr);
        sqlite3_reset(st);
        return rc;
    }
    sqlite3_reset(st);
    json_object_set_new(o, name, arr);
    return 0;
}

int oq__ledger_stats(oq__ledger_t *l, int top, json_t **out, oq_error_t *err)
{
    /* One read transaction so the numbers are consistent with each other. */
    static const char totals_sql[] =
        "SELECT count(*),"
        " count(DISTINCT coalesce('k:' || idem_key, 'r:' || reference, 'i:' || id)),"
        " count(idem_key), count(DISTINCT idem_key),"
        " count(reference), count(DISTINCT reference),"
        " coalesce(sum(honoured), 0)"
        " FROM payments";
    static const char dupkeys_sql[] =
        "SELECT count(*), coalesce(sum(n - 1), 0) FROM"
        " (SELECT count(*) AS n FROM payments WHERE idem_key IS NOT NULL"
        "  GROUP BY idem_key HAVING n > 1)";
    static const char dupkeys_sql_refs[] =
        "SELECT count(*), coalesce(sum(n - 1), 0) FROM"
        " (SELECT count(*) AS n FROM payments WHERE reference IS NOT NULL"
        "  GROUP BY reference HAVING n > 1)";
    static const char topkeys_sql[] =
        "SELECT idem_key, count(*) AS n FROM payments WHERE idem_key IS NOT NULL"
        " GROUP BY idem_key HAVING n > 1 ORDER BY n DESC, idem_key LIMIT ?1";
    static const char toprefs_sql[] =
        "SELECT reference, count(*) AS n FROM payments WHERE reference IS NOT NULL"
        " GROUP BY reference HAVING n > 1 ORDER BY n DESC, reference LIMIT ?1";
    json_t *o = NULL;
    int rc;
    sqlite3_stmt *st;
    int64_t effects = 0, calls = 0, keyed = 0, keys = 0, refd = 0, refs = 0, honoured = 0;
    int64_t dkeys = 0, dkey_effects = 0, drefs = 0, dref_effects = 0;

    if ((rc = oq_db_exec(l->db, "BEGIN", err)) != 0) return rc;
    if (!(st = oq_stmt_get(l->cache, totals_sql, err))) {
        rc = err ? err->code : OQ_EDB;
        goto out;
    }
    if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        effects = sqlite3_column_int64(st, 0);
        calls = sqlite3_column_int64(st, 1);
        keyed = sqlite3_column_int64(st, 2);
        keys = sqlite3_column_int64(st, 3);
        refd = sqlite3_column_int64(st, 4);
        refs = sqlite3_column_int64(st, 5);
        honoured = sqlite3_column_int64(st, 6);
        rc = 0;
    } else {
        rc = oq_db_error(l->db, rc, err, "ledger stats");
    }
    sqlite3_reset(st);
    if (rc) goto out;
    for (int pass = 0; pass < 2; pass++) {
        if (!(st = oq_stmt_get(l->cache, pass ? dupkeys_sql_refs : dupkeys_sql, err))) {
            rc = err ? err->code : OQ_EDB;
            goto out;
        }
        if ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            *(pass ? &drefs : &dkeys) = sqlite3_column_int64(st, 0);
            *(pass ? &dref_effects : &dkey_effects) = sqlite3_column_int64(st, 1);
            rc = 0;
        } else {
            rc = oq_db_error(l->db, rc, err, "ledger stats");
        }
        sqlite3_reset(st);
        if (rc) goto out;
    }
    int64_t dups = effects - calls;
    o = json_pack("{s:I,s:I,s:I,s:f,s:I,s:{s:I,s:I,s:I,s:I},s:{s:I,s:I,s:I,s:I}}", "effects",
                  (json_int_t)effects, "logical_calls", (json_int_t)calls, "duplicate_effects",
                  (json_int_t)dups, "dsr", calls > 0 ? (double)dups / (double)calls : 0.0,
                  "honoured_requests", (json_int_t)honoured, "keys", "effects_with_key",
                  (json_int_t)keyed, "distinct", (json_int_t)keys, "with_duplicates",
                  (json_int_t)dkeys, "duplicate_effects", (json_int_t)dkey_effects, "references",
                  "effects_with_reference", (json_int_t)refd, "distinct", (json_int_t)refs,
                  "with_duplicates", (json_int_t)drefs, "duplicate_effects",
                  (json_int_t)dref_effects);
    if (!o) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "ledger stats: out of memory");
        goto out;
    }
    if ((rc = dup_list(l, topkeys_sql, top, json_object_get(o, "keys"), "top_duplicates", "key",
                       err)) != 0)
        goto out;
    rc = dup_list(l, toprefs_sql, top, json_object_get(o, "references"), "top_duplicates",
                  "reference", err);
out:
    oq_db_exec(l->db, "COMMIT", NULL);
    if (rc) {
        json_decref(o);
        return rc;
    }
    *out = o;
    return 0;
}

/* (here, not in server.c: `onceq verify --downstream-db` reads a ledger without linking the
 * service into the product binary) */
int oq_downstream_ledger_stats(const char *db, int top, json_t **out, oq_error_t *err)
{
    oq__ledger_t *l = NULL;
    int rc = oq__ledger_open(db, NULL, 1, &l, err);
    if (rc == 0) rc = oq__ledger_stats(l, top, out, err);
    oq__ledger_close(l);
    return rc;
}
