/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The invariant checker: every invariant listed in oq_chaos.h as one SQL query over the
 * producer database with the consumer database ATTACHed as `c`, both read-only.
 *
 * Each check is a query that returns one row per violation, (call_id, detail); the runner
 * counts every row and keeps the first few as examples, so a check is one line in the table
 * below plus its SQL. Everything runs inside one read transaction, so each database is read
 * from one snapshot (the two snapshots are taken back to back, not atomically: that is why a
 * live pipeline should be checked with allow_pending, and a drained one without).
 *
 * The queries only read; the connection is opened with SQLITE_OPEN_READONLY and the attached
 * database through a `mode=ro` URI, so running `onceq verify` next to a live pipeline cannot
 * change it. The schemas are the producer's (schema/producer/) and the consumer's
 * (schema/consumer/); a database without the expected tables is refused with OQ_EDB rather
 * than reported as clean.
 *
 * The downstream ledger (optional) is read twice: its counts and duplicated keys through
 * oq_downstream_ledger_stats(), the one reader of what "a logical call" means there, and its
 * payment ids through a read-only ATTACH (made before the read transaction: ATTACH is refused
 * inside one), to check that every downstream id the consumer recorded exists. A ledger key or
 * reference is the effect id "e_<hex>" of call "c_<hex>".
 *
 * PostgreSQL: a stage whose database is a libpq string is read from one REPEATABLE READ
 * snapshot into a temporary SQLite file (the producer's tables through oq_pg_snapshot(), the
 * consumer's through its store, oq__consumer_store_export()), which the same queries then read;
 * the files are removed before returning. So every invariant has one definition, in SQL over
 * the SQLite tables, whatever the backend; the two snapshots are taken back to back, as the two
 * SQLite files are read (both may be one database, as under `onceq up --db-url`).
 */
#include <errno.h>
#include <jansson.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "consumer_store.h"
#include "oq_chaos.h"
#include "oq_db.h"
#include "oq_downstream.h"
#include "oq_log.h"
#include "oq_pg.h"
#include "oq_json.h"

static const char *const vnames[OQ__V_COUNT] = {
    "dup_key",
    "dup_effect",
    "conflict_effect",
    "unknown_call_effect",
    "not_terminal",
    "succeeded_no_effect",
    "failed_with_effect",
    "committed_no_effect",
    "effect_not_committed",
    "reexecuted",
    "terminal_left",
    "accepted_missing",
    "downstream_dup",
    "downstream_missing",
    "key_reexecuted",
    "task_step_rerun",
    "task_comp_twice",
    "task_false_end",
    "task_not_terminal",
};

const char *oq_violation_name(int kind)
{
    return (kind >= 0 && kind < OQ__V_COUNT) ? vnames[kind] : "?";
}

/* Tools whose success writes an effect (the effectful tools of the registry). */
#define OQ__EFFECT_TOOLS "('charge','send_email')"

/* One check: a query returning (call_id, detail) per violation. */
typedef struct {
    int kind;
    const char *sql;
} check_t;

static const check_t checks[] = {
    /* 1. One call per (tenant, idem_key): UNIQUE makes this hold by construction; a
     *    migration that lost the constraint would not. */
    {OQ_V_DUP_KEY,
     "SELECT min(call_id), 'tenant=' || tenant || ' key=' || idem_key || ' calls=' || count(*)"
     " FROM main.calls GROUP BY tenant, idem_key HAVING count(*) > 1"},
    /* 2. At most one effect per call_id. */
    {OQ_V_DUP_EFFECT,
     "SELECT call_id, 'effects=' || count(*) || ' ids=' || group_concat(effect_id, ',')"
     " FROM c.effects GROUP BY call_id HAVING count(*) > 1"},
    /* 3. No effect for a conflicting body: the execution that wrote the effect ran with a
     *    fingerprint other than the one the producer accepted for that call. */
    {OQ_V_CONFLICT_EFFECT,
     "SELECT e.call_id, 'effect=' || e.effect_id || ' exec_fp=' || substr(x.fingerprint,1,12)"
     " || ' call_fp=' || substr(p.fingerprint,1,12)"
     " FROM c.effects e JOIN c.executions x ON x.call_id = e.call_id"
     " JOIN main.calls p ON p.call_id = e.call_id WHERE x.fingerprint <> p.fingerprint"},
    {OQ_V_UNKNOWN_CALL_EFFECT,
     "SELECT e.call_id, 'effect=' || e.effect_id || ' tool=' || e.tool || ' (no such call)'"
     " FROM c.effects e WHERE NOT EXISTS (SELECT 1 FROM main.calls p"
     " WHERE p.call_id = e.call_id)"},
    /* 4. Nothing accepted is lost. */
    {OQ_V_NOT_TERMINAL,
     "SELECT call_id, 'state=' || state || ' tool=' || tool || ' attempt=' || attempt"
     " FROM main.calls WHERE state IN ('pending','running')"},
    {OQ_V_SUCCEEDED_NO_EFFECT,
     "SELECT p.call_id, 'tool=' || p.tool || ' succeeded without an effect'"
     " FROM main.calls p WHERE p.state = 'succeeded' AND p.tool IN " OQ__EFFECT_TOOLS
     " AND NOT EXISTS (SELECT 1 FROM c.effects e WHERE e.call_id = p.call_id)"},
    {OQ_V_FAILED_WITH_EFFECT,
     "SELECT p.call_id, 'state=failed but effect=' || e.effect_id"
     " FROM main.calls p JOIN c.effects e ON e.call_id = p.call_id WHERE p.state = 'failed'"},
    /* 5. Terminal never re-executed, consumer side. */
    {OQ_V_COMMITTED_NO_EFFECT,
     "SELECT x.call_id, 'execution COMMITTED, tool=' || x.tool || ', no effect'"
     " FROM c.executions x WHERE x.state = 'COMMITTED' AND x.tool IN " OQ__EFFECT_TOOLS
     " AND NOT EXISTS (SELECT 1 FROM c.effects e WHERE e.call_id = x.call_id)"},
    {OQ_V_EFFECT_NOT_COMMITTED,
     "SELECT x.call_id, 'execution ' || x.state || ' but effect=' || e.effect_id"
     " FROM c.executions x JOIN c.effects e ON e.call_id = x.call_id"
     " WHERE x.state IN ('FAILED_FINAL','FAILED_RETRYABLE','SAFE_RETRY','NEEDS_REVIEW')"},
    /* Ordered consumer audit: after 'committed' nothing may start again; after
     * 'failed_final' / 'needs_review' only a NEW producer attempt may (attempt > the terminal
     * one's), or, after 'needs_review', an operator's decision ('review_resolved' in between);
     * and no effect may be written for an attempt that had already failed finally. */
    {OQ_V_REEXECUTED,
     "SELECT a.call_id, 'audit: ' || a.event || ' (id ' || a.id || ', attempt '"
     " || ifnull(a.attempt,'?') || ') after ' || t.event || ' (id ' || t.id || ', attempt '"
     " || ifnull(t.attempt,'?') || ')'"
     " FROM c.audit t JOIN c.audit a ON a.call_id = t.call_id AND a.id > t.id"
     " WHERE a.event IN ('planned','started','committed','unknown','reconciling','safe_retry',"
     "                   'failed_retryable','failed_final')"
     " AND (t.event = 'committed' OR (t.event IN ('failed_final','needs_review')"
     "      AND ifnull(a.attempt,0) <= ifnull(t.attempt,0)"
     "      AND NOT (t.event = 'needs_review' AND EXISTS (SELECT 1 FROM c.audit r"
     "               WHERE r.call_id = t.call_id AND r.event = 'review_resolved'"
     "               AND r.id > t.id AND r.id < a.id))))"
     " GROUP BY a.call_id"
     " UNION ALL "
     "SELECT e.call_id, 'effect ' || e.effect_id || ' (attempt ' || e.attempt || ') written after '"
     " || t.event || ' (attempt ' || ifnull(t.attempt,'?') || ')'"
     " FROM c.effects e JOIN c.audit t ON t.call_id = e.call_id"
     " WHERE t.event IN ('failed_final','needs_review') AND t.ts < e.created_at"
     " AND e.attempt <= ifnull(t.attempt,0)"
     " AND NOT (t.event = 'needs_review' AND EXISTS (SELECT 1 FROM c.audit r"
     "          WHERE r.call_id = t.call_id AND r.event = 'review_resolved' AND r.id > t.id"
     "          AND r.ts <= e.created_at))"
     " GROUP BY e.call_id"},
    /* 5. Producer side: succeeded is final; needs_review is left only by the one resolution an
     *    operator made (succeeded or failed, applied once: a second one is caught after it);
     *    failed is left only through a retry_reset (a new attempt, same fingerprint). */
    {OQ_V_TERMINAL_LEFT,
     "SELECT a.call_id, 'audit: ' || a.event || ' (id ' || a.id || ') after ' || t.event"
     " || ' (id ' || t.id || ')'"
     " FROM main.audit a JOIN main.audit t ON t.call_id = a.call_id AND t.id < a.id"
     " WHERE t.event IN ('succeeded','needs_review')"
     " AND a.event IN ('running','succeeded','failed','needs_review','retry_reset','pending')"
     " AND NOT (t.event = 'needs_review' AND a.event IN ('succeeded','failed')"
     "          AND NOT EXISTS (SELECT 1 FROM main.audit b WHERE b.call_id = a.call_id"
     "          AND b.id > t.id AND b.id < a.id AND b.event IN ('succeeded','failed')))"
     " GROUP BY a.call_id"},
    /* 1 again, across calls: a key owns more than one call with an effect (an effect row, or
     *    a request that may have landed: STARTED, UNKNOWN, RECONCILING, NEEDS_REVIEW), and the
     *    later call was created while the earlier one was not settled yet. The consumer keeps
     *    executions longer than the producer keeps keys, so this sees a key whose first call
     *    the producer forgot or replaced too early; a key reused after its call settled and
     *    expired is a new call and is not reported. */
    {OQ_V_KEY_REEXECUTED,
     "WITH x AS (SELECT call_id, tenant, idem_key, state, created_at, updated_at FROM c.executions"
     "   WHERE state IN ('STARTED','UNKNOWN','RECONCILING','NEEDS_REVIEW')"
     "   OR EXISTS (SELECT 1 FROM c.effects e WHERE e.call_id = executions.call_id))"
     " SELECT b.call_id, 'tenant=' || b.tenant || ' key=' || b.idem_key || ': call ' || b.call_id"
     " || ' created while ' || a.call_id || ' was ' || CASE WHEN a.state IN"
     " ('COMMITTED','FAILED_FINAL') THEN 'not settled yet' ELSE a.state END"
     " FROM x a JOIN x b ON b.tenant = a.tenant AND b.idem_key = a.idem_key"
     " AND b.call_id <> a.call_id AND (b.created_at > a.created_at"
     "      OR (b.created_at = a.created_at AND b.call_id > a.call_id))"
     " WHERE a.state NOT IN ('COMMITTED','FAILED_FINAL') OR a.updated_at >= b.created_at"
     " GROUP BY b.call_id"},
};

/* Tasks (issue 19, producer/tasks.c), when the producer database has them: a step is one call
 * with the derived key, run once; a compensation is one call, run once, and only for a step
 * that succeeded; the end a task reports is the truth of its steps; and after a drain every
 * task is terminal. A call that retention purged is not held against its task (tasks are kept
 * longer than their calls). A task an operator settled (`onceq review resolve t_... --as
 * compensated|succeeded`) is held to the operator's word, audited, not the pipeline's claim. */
#define OQ_V_OPERATOR_SETTLED                                                                      \
    "EXISTS (SELECT 1 FROM main.audit r WHERE r.call_id = t.task_id AND r.event = 'task_review'"   \
    " AND json_extract(r.detail, '$.as') = t.status)"

static const check_t task_checks[] = {
    {OQ_V_TASK_STEP_RERUN,
     "SELECT min(call_id), 'task ' || task_id || ' step #' || idx || ' (' || role || ') has '"
     " || count(*) || ' calls' FROM main.task_calls GROUP BY task_id, idx, role"
     " HAVING count(*) > 1"
     " UNION ALL "
     "SELECT s.call_id, 'task ' || t.task_id || ' step ' || s.name || ' ran as call key '"
     " || p.idem_key FROM main.task_steps s JOIN main.tasks t ON t.task_id = s.task_id"
     " JOIN main.calls p ON p.call_id = s.call_id"
     " WHERE p.idem_key <> t.idem_key || '/' || s.name OR p.tenant <> t.tenant"},
    {OQ_V_TASK_COMP_TWICE,
     "SELECT s.comp_call_id, 'task ' || s.task_id || ' step ' || s.name || ': compensation has '"
     " || count(*) || ' effects' FROM main.task_steps s JOIN c.effects e"
     " ON e.call_id = s.comp_call_id GROUP BY s.comp_call_id HAVING count(*) > 1"
     " UNION ALL "
     "SELECT s.comp_call_id, 'task ' || s.task_id || ' step ' || s.name || ' compensated but its"
     " call is ' || ifnull(p.state, 'missing') FROM main.task_steps s"
     " LEFT JOIN main.calls p ON p.call_id = s.call_id"
     " WHERE s.comp_call_id IS NOT NULL AND (s.call_id IS NULL OR (p.state IS NOT NULL"
     " AND p.state <> 'succeeded'))"},
    {OQ_V_TASK_FALSE_END,
     "SELECT t.task_id, 'task compensated but step ' || s.name || ': ' || CASE WHEN"
     " s.comp_call_id IS NULL THEN 'no compensation written' ELSE 'compensation ' ||"
     " ifnull(k.state, 'missing') END FROM main.tasks t JOIN main.task_steps s"
     " ON s.task_id = t.task_id LEFT JOIN main.calls p ON p.call_id = s.call_id"
     " LEFT JOIN main.calls k ON k.call_id = s.comp_call_id WHERE t.status = 'compensated'"
     " AND ((s.comp_call_id IS NULL AND p.state = 'succeeded' AND json_extract(t.spec,"
     " '$.steps[' || s.idx || '].compensate') IS NOT NULL)"
     " OR (k.state IS NOT NULL AND k.state <> 'succeeded')) AND NOT " OQ_V_OPERATOR_SETTLED
     " UNION ALL "
     "SELECT t.task_id, 'task succeeded but step ' || s.name || ' is ' || s.status"
     " || ' (call ' || ifnull(p.state, 'missing') || ')' FROM main.tasks t"
     " JOIN main.task_steps s ON s.task_id = t.task_id"
     " LEFT JOIN main.calls p ON p.call_id = s.call_id"
     " WHERE t.status = 'succeeded' AND (s.status <> 'succeeded' OR (p.state IS NOT NULL"
     " AND p.state <> 'succeeded')) AND NOT " OQ_V_OPERATOR_SETTLED},
    {OQ_V_TASK_NOT_TERMINAL,
     "SELECT task_id, 'task ' || status || ' key=' || idem_key FROM main.tasks"
     " WHERE status IN ('running','compensating')"},
};

void oq_verify_report_clear(oq_verify_report_t *rep)
{
    if (!rep) return;
    free(rep->examples);
    memset(rep, 0, sizeof *rep);
}

/* Percent-encode \p path into a read-only SQLite URI. */
static int ro_uri(const char *path, char *out, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    const char *pre = "file:";
    for (const char *p = pre; *p; p++) {
        if (o + 1 >= n) return -1;
        out[o++] = *p;
    }
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                    (*p >= '0' && *p <= '9') || strchr("/._-~", *p);
        if (o + 4 >= n) return -1;
        if (plain) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    const char *suf = "?mode=ro";
    for (const char *p = suf; *p; p++) {
        if (o + 1 >= n) return -1;
        out[o++] = *p;
    }
    out[o] = '\0';
    return 0;
}

static int scalar(sqlite3 *db, const char *sql, int64_t *out, oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return oq_error_set(err, OQ_EDB, rc, "verify: %s: %s", sqlite3_errmsg(db), sql);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *out = sqlite3_column_int64(st, 0);
        rc = 0;
    } else if (rc == SQLITE_DONE) {
        *out = 0;
        rc = 0;
    } else {
        rc = oq_error_set(err, OQ_EDB, rc, "verify: %s", sqlite3_errmsg(db));
    }
    sqlite3_finalize(st);
    return rc;
}

static int has_table(sqlite3 *db, const char *schema, const char *table)
{
    char sql[200];
    int64_t n = 0;
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM %s.sqlite_master WHERE type='table' AND "
             "name='%s'",
             schema, table);
    if (scalar(db, sql, &n, NULL) != 0) return 0;
    return n > 0;
}

static int run_check(sqlite3 *db, const check_t *ck, int max_examples, oq_verify_report_t *rep,
                     oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, ck->sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return oq_error_set(err, OQ_EDB, rc, "verify %s: %s", oq_violation_name(ck->kind),
                            sqlite3_errmsg(db));
    int64_t kept = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        rep->count[ck->kind]++;
        if (kept >= max_examples) continue;
        oq_violation_t *nv = realloc(rep->examples, (size_t)(rep->nexamples + 1) * sizeof *nv);
        if (!nv) {
            sqlite3_finalize(st);
            return oq_error_set(err, OQ_ENOMEM, 0, "verify: out of memory");
        }
        rep->examples = nv;
        oq_violation_t *v = &rep->examples[rep->nexamples++];
        memset(v, 0, sizeof *v);
        v->kind = ck->kind;
        const unsigned char *cid = sqlite3_column_text(st, 0);
        const unsigned char *det = sqlite3_column_text(st, 1);
        snprintf(v->call_id, sizeof v->call_id, "%s", cid ? (const char *)cid : "");
        snprintf(v->detail, sizeof v->detail, "%s", det ? (const char *)det : "");
        kept++;
    }
    if (rc != SQLITE_DONE) {
        rc = oq_error_set(err, OQ_EDB, rc, "verify %s: %s", oq_violation_name(ck->kind),
                          sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return rc;
    }
    sqlite3_finalize(st);
    return 0;
}

/* One example of a duplicated ledger key or reference ("e_<hex>": call "c_<hex>"). */
static int ds_example(oq_verify_report_t *rep, int max_examples, int64_t *kept, const char *v,
                      int64_t n, const char *what)
{
    if (*kept >= max_examples) return 0;
    oq_violation_t *nv = realloc(rep->examples, (size_t)(rep->nexamples + 1) * sizeof *nv);
    if (!nv) return OQ_ENOMEM;
    rep->examples = nv;
    oq_violation_t *x = &rep->examples[rep->nexamples++];
    memset(x, 0, sizeof *x);
    x->kind = OQ_V_DOWNSTREAM_DUP;
    if (strncmp(v, "e_", 2) == 0)
        snprintf(x->call_id, sizeof x->call_id, "c_%.60s", v + 2);
    else
        snprintf(x->call_id, sizeof x->call_id, "?");
    snprintf(x->detail, sizeof x->detail, "ledger: %lld effects for %s %.120s", (long long)n, what,
             v);
    (*kept)++;
    return 0;
}

/* The downstream ledger (attached as d): its DSR, its duplicated keys, and whether the
 * downstream ids we recorded are there. */
static int check_downstream(sqlite3 *db, const char *path, int max_examples,
                            oq_verify_report_t *rep, oq_error_t *err)
{
    json_t *st = NULL;
    if (!has_table(db, "d", "payments"))
        return oq_error_set(err, OQ_EDB, 0, "%s is not a downstream ledger", path);
    int rc = oq_downstream_ledger_stats(path, max_examples > 0 ? max_examples : 1, &st, err);
    if (rc) return rc;
    rep->has_downstream = 1;
    rep->ds_effects = json_integer_value(json_object_get(st, "effects"));
    rep->ds_calls = json_integer_value(json_object_get(st, "logical_calls"));
    rep->ds_duplicates = json_integer_value(json_object_get(st, "duplicate_effects"));
    rep->ds_dsr = rep->ds_calls > 0 ? (double)rep->ds_duplicates / (double)rep->ds_calls : 0;
    rep->count[OQ_V_DOWNSTREAM_DUP] = rep->ds_duplicates;
    int64_t kept = 0;
    static const char *const groups[2][2] = {{"keys", "key"}, {"references", "reference"}};
    for (int g = 0; g < 2 && rc == 0; g++) {
        json_t *top = json_object_get(json_object_get(st, groups[g][0]), "top_duplicates");
        size_t i;
        json_t *e;
        json_array_foreach(top, i, e)
        {
            const char *v = json_string_value(json_object_get(e, groups[g][1]));
            if (v &&
                (rc = ds_example(rep, max_examples, &kept, v,
                                 json_integer_value(json_object_get(e, "effects")), groups[g][1])))
                break;
        }
    }
    json_decref(st);
    if (rc) return oq_error_set(err, rc, 0, "verify: out of memory");
    static const check_t missing = {
        OQ_V_DOWNSTREAM_MISSING,
        "SELECT e.call_id, 'effect ' || e.effect_id || ' names downstream id ' || e.downstream_id"
        " || ', which the ledger does not hold'"
        " FROM c.effects e WHERE e.downstream_id IS NOT NULL AND NOT EXISTS"
        " (SELECT 1 FROM d.payments p WHERE p.id = e.downstream_id)"};
    /* (a consumer database from before downstream ids has no such column: nothing to check) */
    int64_t has_col = 0;
    if (scalar(db,
               "SELECT count(*) FROM pragma_table_info('effects', 'c') "
               "WHERE name = 'downstream_id'",
               &has_col, NULL) == 0 &&
        has_col)
        return run_check(db, &missing, max_examples, rep, err);
    return 0;
}

/* Read the accepted call ids (one per line) into temp.accepted; the temp schema is writable
 * on a read-only connection and vanishes with it. */
static int load_accepted(sqlite3 *db, const char *path, oq_error_t *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return oq_error_set(err, OQ_EIO, errno, "accepted file %s: %s", path, strerror(errno));
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_exec(db, "CREATE TEMP TABLE accepted (call_id TEXT PRIMARY KEY) WITHOUT ROWID",
                          NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO temp.accepted VALUES (?1)", -1, &st,
                                NULL);
    char line[256];
    while (rc == SQLITE_OK && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n \t")] = '\0';
        if (!line[0]) continue;
        sqlite3_reset(st);
        sqlite3_bind_text(st, 1, line, -1, SQLITE_TRANSIENT);
        rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    int ferr = ferror(f);
    fclose(f);
    sqlite3_finalize(st);
    if (rc != SQLITE_OK)
        return oq_error_set(err, OQ_EDB, rc, "accepted file: %s", sqlite3_errmsg(db));
    if (ferr) return oq_error_set(err, OQ_EIO, 0, "accepted file %s: read error", path);
    return 0;
}

static int verify_files(const char *producer_db, const char *consumer_db,
                        const oq_verify_opts_t *opts, oq_verify_report_t *rep, oq_error_t *err)
{
    oq_verify_opts_t defaults = {0};
    if (!opts) opts = &defaults;
    int max_examples = opts->max_examples > 0   ? opts->max_examples
                       : opts->max_examples < 0 ? 0
                                                : 10;
    memset(rep, 0, sizeof *rep);
    rep->allow_pending = opts->allow_pending;

    struct stat sb;
    if (stat(producer_db, &sb) != 0)
        return oq_error_set(err, OQ_EIO, errno, "producer db %s: %s", producer_db, strerror(errno));
    if (stat(consumer_db, &sb) != 0)
        return oq_error_set(err, OQ_EIO, errno, "consumer db %s: %s", consumer_db, strerror(errno));
    if (opts->downstream_db && stat(opts->downstream_db, &sb) != 0)
        return oq_error_set(err, OQ_EIO, errno, "downstream db %s: %s", opts->downstream_db,
                            strerror(errno));

    char puri[4200], curi[4200];
    if (ro_uri(producer_db, puri, sizeof puri) || ro_uri(consumer_db, curi, sizeof curi))
        return oq_error_set(err, OQ_EINVAL, 0, "verify: database path too long");

    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_open_v2(puri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
    if (rc != SQLITE_OK) {
        rc = oq_error_set(err, OQ_EIO, rc, "open %s: %s", producer_db,
                          db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        goto out;
    }
    sqlite3_busy_timeout(db, 5000);
    rc = sqlite3_prepare_v2(db, "ATTACH DATABASE ?1 AS c", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, curi, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (rc != SQLITE_OK) {
        rc = oq_error_set(err, OQ_EIO, rc, "attach %s: %s", consumer_db, sqlite3_errmsg(db));
        goto out;
    }
    /* A schema newer than this binary: its checks might not hold there. */
    if ((rc = oq_db_check_version(db, "main", producer_db, err)) != 0 ||
        (rc = oq_db_check_version(db, "c", consumer_db, err)) != 0)
        goto out;
    if (opts->downstream_db) { /* ATTACH is refused inside a transaction: do it now */
        char duri[4200];
        if (ro_uri(opts->downstream_db, duri, sizeof duri)) {
            rc = oq_error_set(err, OQ_EINVAL, 0, "verify: ledger path too long");
            goto out;
        }
        rc = sqlite3_prepare_v2(db, "ATTACH DATABASE ?1 AS d", -1, &st, NULL);
        if (rc == SQLITE_OK) {
            sqlite3_bind_text(st, 1, duri, -1, SQLITE_STATIC);
            rc = sqlite3_step(st);
            if (rc == SQLITE_DONE) rc = SQLITE_OK;
        }
        sqlite3_finalize(st);
        st = NULL;
        if (rc != SQLITE_OK) {
            rc = oq_error_set(err, OQ_EIO, rc, "attach %s: %s", opts->downstream_db,
                              sqlite3_errmsg(db));
            goto out;
        }
    }
    /* One read transaction; touching both schemas starts both snapshots back to back. */
    rc = sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        rc = oq_error_set(err, OQ_EDB, rc, "verify: BEGIN: %s", sqlite3_errmsg(db));
        goto out;
    }
    int64_t dummy;
    rc = scalar(db,
                "SELECT (SELECT count(*) FROM main.sqlite_master) + "
                "(SELECT count(*) FROM c.sqlite_master)",
                &dummy, err);
    if (rc != 0) goto out;
    if (!has_table(db, "main", "calls") || !has_table(db, "main", "audit")) {
        rc = oq_error_set(err, OQ_EDB, 0, "%s is not a producer database (no calls/audit table)",
                          producer_db);
        goto out;
    }
    if (!has_table(db, "c", "effects") || !has_table(db, "c", "executions") ||
        !has_table(db, "c", "audit")) {
        rc = oq_error_set(err, OQ_EDB, 0,
                          "%s is not a consumer database (no effects/executions/audit table)",
                          consumer_db);
        goto out;
    }

    static const char *const states[5] = {"pending", "running", "succeeded", "failed",
                                          "needs_review"};
    if ((rc = scalar(db, "SELECT count(*) FROM main.calls", &rep->calls, err))) goto out;
    for (int i = 0; i < 5; i++) {
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM main.calls WHERE state = '%s'", states[i]);
        if ((rc = scalar(db, sql, &rep->by_state[i], err))) goto out;
    }
    if ((rc = scalar(db, "SELECT count(*) FROM c.effects", &rep->effects, err))) goto out;
    int64_t distinct = 0;
    if ((rc = scalar(db, "SELECT count(DISTINCT call_id) FROM c.effects", &distinct, err)))
        goto out;
    rep->duplicates = rep->effects - distinct;
    if ((rc = scalar(db,
                     "SELECT count(*) FROM main.calls WHERE state = 'succeeded' AND tool "
                     "IN " OQ__EFFECT_TOOLS,
                     &rep->expected_effects, err)))
        goto out;
    /* Redeliveries absorbed: informative only (unknown = -1, never an error). */
    rep->inbox_duplicates = -1;
    if (has_table(db, "c", "inbox") &&
        scalar(db, "SELECT ifnull(sum(seen - 1),0) FROM c.inbox WHERE seen > 1", &dummy, NULL) == 0)
        rep->inbox_duplicates = dummy;

    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if ((rc = run_check(db, &checks[i], max_examples, rep, err))) goto out;
    if (has_table(db, "main", "tasks"))
        for (size_t i = 0; i < sizeof task_checks / sizeof task_checks[0]; i++)
            if ((rc = run_check(db, &task_checks[i], max_examples, rep, err))) goto out;
    if (opts->accepted_file) {
        if ((rc = load_accepted(db, opts->accepted_file, err))) goto out;
        static const check_t acc = {
            OQ_V_ACCEPTED_MISSING,
            "SELECT a.call_id, 'accepted (2xx) but not in calls.db' FROM temp.accepted a"
            " WHERE NOT EXISTS (SELECT 1 FROM main.calls p WHERE p.call_id = a.call_id)"};
        if ((rc = run_check(db, &acc, max_examples, rep, err))) goto out;
    }
    if (opts->downstream_db &&
        (rc = check_downstream(db, opts->downstream_db, max_examples, rep, err)))
        goto out;

    rep->pending = rep->by_state[0] + rep->by_state[1];
    rep->lost = rep->count[OQ_V_SUCCEEDED_NO_EFFECT] + (opts->allow_pending ? 0 : rep->pending);
    if (opts->allow_pending) {
        /* Reported, not violations: drop them from the totals and the examples. */
        rep->count[OQ_V_NOT_TERMINAL] = 0;
        rep->count[OQ_V_TASK_NOT_TERMINAL] = 0;
        int w = 0;
        for (int i = 0; i < rep->nexamples; i++)
            if (rep->examples[i].kind != OQ_V_NOT_TERMINAL &&
                rep->examples[i].kind != OQ_V_TASK_NOT_TERMINAL)
                rep->examples[w++] = rep->examples[i];
        rep->nexamples = w;
    }
    for (int k = 0; k < OQ__V_COUNT; k++)
        rep->violations += rep->count[k];
    rep->dsr = rep->calls > 0 ? (double)rep->duplicates / (double)rep->calls : 0.0;
out:
    if (db) {
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        sqlite3_close_v2(db);
    }
    if (rc != 0) oq_verify_report_clear(rep);
    return rc;
}

static int print_json(const oq_verify_report_t *rep, FILE *out)
{
    json_t *o = json_object();
    json_t *bs = json_object();
    json_t *counts = json_object();
    json_t *ex = json_array();
    if (!o || !bs || !counts || !ex) goto nomem;
    static const char *const states[5] = {"pending", "running", "succeeded", "failed",
                                          "needs_review"};
    for (int i = 0; i < 5; i++)
        json_object_set_new(bs, states[i], json_integer(rep->by_state[i]));
    for (int k = 0; k < OQ__V_COUNT; k++)
        json_object_set_new(counts, oq_violation_name(k), json_integer(rep->count[k]));
    for (int i = 0; i < rep->nexamples; i++)
        json_array_append_new(
            ex, json_pack("{s:s,s:s,s:s}", "kind", oq_violation_name(rep->examples[i].kind),
                          "call_id", rep->examples[i].call_id, "detail", rep->examples[i].detail));
    json_object_set_new(o, "clean", json_boolean(rep->violations == 0));
    json_object_set_new(o, "calls", json_integer(rep->calls));
    json_object_set_new(o, "by_state", bs);
    json_object_set_new(o, "effects", json_integer(rep->effects));
    json_object_set_new(o, "expected_effects", json_integer(rep->expected_effects));
    json_object_set_new(o, "duplicates", json_integer(rep->duplicates));
    json_object_set_new(o, "pending", json_integer(rep->pending));
    json_object_set_new(o, "lost", json_integer(rep->lost));
    json_object_set_new(o, "inbox_duplicates", json_integer(rep->inbox_duplicates));
    json_object_set_new(o, "dsr", json_real(rep->dsr));
    if (rep->has_downstream)
        json_object_set_new(o, "downstream",
                            json_pack("{s:I, s:I, s:I, s:f}", "effects",
                                      (json_int_t)rep->ds_effects, "logical_calls",
                                      (json_int_t)rep->ds_calls, "duplicates",
                                      (json_int_t)rep->ds_duplicates, "dsr", rep->ds_dsr));
    json_object_set_new(o, "violations", json_integer(rep->violations));
    json_object_set_new(o, "by_kind", counts);
    json_object_set_new(o, "examples", ex);
    char *s = oq_json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return OQ_ENOMEM;
    int rc = fprintf(out, "%s\n", s) < 0 ? OQ_EIO : 0;
    free(s);
    return rc;
nomem:
    json_decref(o);
    json_decref(bs);
    json_decref(counts);
    json_decref(ex);
    return OQ_ENOMEM;
}

int oq_verify_print(const oq_verify_report_t *rep, FILE *out, int json)
{
    if (json) return print_json(rep, out);
    fprintf(out,
            "calls            %lld (pending %lld, running %lld, succeeded %lld, failed %lld, "
            "needs_review %lld)\n",
            (long long)rep->calls, (long long)rep->by_state[0], (long long)rep->by_state[1],
            (long long)rep->by_state[2], (long long)rep->by_state[3], (long long)rep->by_state[4]);
    /* expected_effects counts the built-in effectful tools only: a tools-file (HTTP) tool's
     * effects are the downstream's, checked with --downstream-db */
    fprintf(out,
            "effects          %lld (built-in charge/send_email: %lld succeeded calls, each must "
            "have one; other tools are not counted here)\n",
            (long long)rep->effects, (long long)rep->expected_effects);
    fprintf(out, "duplicates       %lld (duplicate effects)\n", (long long)rep->duplicates);
    fprintf(out, "lost             %lld%s\n", (long long)rep->lost,
            rep->allow_pending && rep->pending ? " (pending not counted: --allow-pending)" : "");
    if (rep->allow_pending) fprintf(out, "pending          %lld\n", (long long)rep->pending);
    if (rep->inbox_duplicates >= 0)
        fprintf(out, "redelivered      %lld (consumer inbox duplicates absorbed)\n",
                (long long)rep->inbox_duplicates);
    fprintf(out, "DSR              %.6f\n", rep->dsr);
    if (rep->has_downstream)
        fprintf(out,
                "downstream       %lld effects for %lld calls, %lld duplicates, DSR %.6f (the "
                "downstream's own ledger)\n",
                (long long)rep->ds_effects, (long long)rep->ds_calls, (long long)rep->ds_duplicates,
                rep->ds_dsr);
    fprintf(out, "violations       %lld\n", (long long)rep->violations);
    for (int k = 0; k < OQ__V_COUNT; k++) {
        if (!rep->count[k]) continue;
        fprintf(out, "  %-22s %lld\n", oq_violation_name(k), (long long)rep->count[k]);
        for (int i = 0; i < rep->nexamples; i++)
            if (rep->examples[i].kind == k)
                fprintf(out, "    %s  %s\n", rep->examples[i].call_id, rep->examples[i].detail);
    }
    if (fprintf(out, "result           %s\n", rep->violations ? "VIOLATIONS" : "CLEAN") < 0)
        return OQ_EIO;
    return 0;
}

/* The producer's tables the checks read, by their PostgreSQL names (schema onceq); the task
 * tables (schema/postgres/0006_tasks.sql) when there (a snapshot skips a missing table). */
static const char *const pg_producer_tables[] = {"onceq.calls", "onceq.audit", "onceq.tasks",
                                                 "onceq.task_steps", "onceq.task_calls"};
static const char *const pg_producer_names[] = {"calls", "audit", "tasks", "task_steps",
                                                "task_calls"};

/* A producer on PostgreSQL: its tables copied from one snapshot into \p path (a new file). */
static int producer_export(const char *conninfo, const char *path, oq_error_t *err)
{
    sqlite3 *db = NULL;
    PGconn *c = NULL;
    int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc != SQLITE_OK) {
        rc = oq_error_set(err, OQ_EIO, rc, "verify: %s: %s", path,
                          db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        goto out;
    }
    sqlite3_exec(db, "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; BEGIN", NULL, NULL, NULL);
    if ((rc = oq_pg_connect(conninfo, &c, err)) ||
        (rc = oq_pg_snapshot(c, pg_producer_tables, pg_producer_names,
                             (int)(sizeof pg_producer_tables / sizeof *pg_producer_tables), db,
                             err)))
        goto out;
    if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        rc = oq_error_set(err, OQ_EIO, 0, "verify: %s: %s", path, sqlite3_errmsg(db));
out:
    if (c) PQfinish(c);
    if (db) sqlite3_close_v2(db);
    return rc;
}

/* A stage on PostgreSQL: its rows are read from one snapshot into a temporary SQLite copy
 * (calls.db / effects.db in a private folder), and the checks run on the copies. */
int oq_verify_run(const char *producer_db, const char *consumer_db, const oq_verify_opts_t *opts,
                  oq_verify_report_t *rep, oq_error_t *err)
{
    int ppg = producer_db && oq_backend_of(producer_db) == OQ_BACKEND_POSTGRES;
    int cpg = consumer_db && oq_backend_of(consumer_db) == OQ_BACKEND_POSTGRES;
    if (!ppg && !cpg) return verify_files(producer_db, consumer_db, opts, rep, err);
    const char *tmp = getenv("TMPDIR");
    char dir[512], ppath[600], cpath[600], f[640];
    memset(rep, 0, sizeof *rep);
    snprintf(dir, sizeof dir, "%s/onceq-verify-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return oq_error_set(err, OQ_EIO, errno, "verify: mkdtemp: %s", strerror(errno));
    snprintf(ppath, sizeof ppath, "%s/calls.db", dir);
    snprintf(cpath, sizeof cpath, "%s/effects.db", dir);
    int rc = 0;
    if (ppg) rc = producer_export(producer_db, ppath, err);
    if (rc == 0 && cpg) rc = oq__consumer_store_export(consumer_db, cpath, err);
    if (rc == 0)
        rc = verify_files(ppg ? ppath : producer_db, cpg ? cpath : consumer_db, opts, rep, err);
    static const char *const sfx[] = {"", "-wal", "-shm", "-journal"};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
            snprintf(f, sizeof f, "%s%s", k ? cpath : ppath, sfx[i]);
            unlink(f);
        }
    rmdir(dir);
    return rc;
}
