/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pg.c: the PostgreSQL side of common/db.c. A database setting names its backend by its form
 * (oq_backend_of: a libpq URI or keyword string, else a file path), so one flag (--db) serves
 * both and no separate "backend" switch can disagree with it.
 *
 * Errors: libpq reports an SQLSTATE per failed statement; the few that callers branch on are
 * mapped to onceq's codes here, once: serialization failures and deadlocks are OQ_EBUSY (the
 * transaction is rolled back by the server and the whole of it may be run again), a unique
 * violation is OQ_EEXIST (the same meaning as SQLite's SQLITE_CONSTRAINT_UNIQUE in the stores),
 * a lost connection is a retriable OQ_EDB that oq_pg_tx() answers with a reconnect. The cause
 * is the SQLSTATE packed as PostgreSQL packs it (6 bits per character), so a log or a test can
 * compare it with oq_pg_sqlstate_code("40001").
 *
 * Retry: oq_pg_tx() runs a caller's function between BEGIN and COMMIT and runs it again from
 * the start after a retriable failure. Every write of onceq is keyed (idempotency keys, message
 * ids, fences), so running a transaction whose COMMIT was lost with the connection once more
 * turns into a replay, never into a second call.
 *
 * Migrations: the files of schema/postgres/, embedded like the SQLite ones (cmake/embed_sql.cmake),
 * applied in one transaction under an advisory lock (two processes migrating at once apply each
 * script exactly once; PostgreSQL's DDL is transactional, so a failed script leaves nothing).
 * onceq.schema_version counts the scripts applied; more than this binary knows is refused.
 */
#include "oq_pg.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <libpq-events.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oq_db.h"
#include "oq_log.h"

/* clang-format off */
const char *const oq_migrations_postgres[] = {
    "postgres/0001_producer.sql",
    "postgres/0002_submit.sql",
    "postgres/0003_consumer.sql",
    "postgres/0004_webhooks.sql",
    "postgres/0005_calls_state_id.sql",
    "postgres/0006_tasks.sql",
    "postgres/0007_hot_path_indexes.sql",
    "postgres/0008_wake_after_commit.sql",
    "postgres/0009_outbox_fillfactor.sql",
    "postgres/0010_horizon_fence.sql",
    NULL,
};
/* clang-format on */

/* The advisory lock key of the migrations: any constant of our own ("onceq" in ASCII). */
#define MIGRATE_LOCK "x'6f6e636571'::bigint"

oq_backend_t oq_backend_of(const char *setting)
{
    if (!setting) return OQ_BACKEND_SQLITE;
    if (strncmp(setting, "postgres://", 11) == 0 || strncmp(setting, "postgresql://", 13) == 0)
        return OQ_BACKEND_POSTGRES;
    /* A keyword string: its first word is keyword= with a keyword libpq knows. */
    const char *p = setting;
    while (isspace((unsigned char)*p))
        p++;
    size_t n = 0;
    while (p[n] && (isalnum((unsigned char)p[n]) || p[n] == '_'))
        n++;
    const char *q = p + n;
    while (isspace((unsigned char)*q))
        q++;
    if (n == 0 || *q != '=') return OQ_BACKEND_SQLITE;
    PQconninfoOption *opts = PQconndefaults();
    int known = 0;
    for (PQconninfoOption *o = opts; o && o->keyword; o++)
        if (strlen(o->keyword) == n && strncmp(o->keyword, p, n) == 0) known = 1;
    PQconninfoFree(opts);
    return known ? OQ_BACKEND_POSTGRES : OQ_BACKEND_SQLITE;
}

int oq_pg_conninfo_has_password(const char *conninfo)
{
    char *msg = NULL;
    PQconninfoOption *o = PQconninfoParse(conninfo ? conninfo : "", &msg);
    PQfreemem(msg);
    int has = 0;
    for (PQconninfoOption *p = o; p && p->keyword; p++)
        if (strcmp(p->keyword, "password") == 0 && p->val && *p->val) has = 1;
    PQconninfoFree(o);
    return has;
}

int oq_pg_sqlstate_code(const char *s)
{
    if (!s || strlen(s) < 5) return 0;
    int v = 0;
    for (int i = 0; i < 5; i++)
        v |= ((s[i] - '0') & 0x3F) << (6 * i);
    return v;
}

static int lost_state(const char *st)
{
    return st && (strncmp(st, "08", 2) == 0 || strcmp(st, "57P01") == 0 ||
                  strcmp(st, "57P02") == 0 || strcmp(st, "57P03") == 0);
}

int oq_pg_error(PGconn *c, const PGresult *res, oq_error_t *err, const char *what)
{
    const char *st = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = res ? PQresultErrorMessage(res) : NULL;
    if (!msg || !*msg) msg = c ? PQerrorMessage(c) : "no connection";
    char m[200];
    snprintf(m, sizeof m, "%s", msg);
    size_t l = strlen(m);
    while (l && (m[l - 1] == '\n' || m[l - 1] == ' '))
        m[--l] = '\0';
    int cause = oq_pg_sqlstate_code(st);
    if (!what) what = "postgres";
    if (st && (!strcmp(st, "40001") || !strcmp(st, "40P01") || !strcmp(st, "55P03")))
        return oq_error_set_retriable(err, OQ_EBUSY, cause, 1, "%s: %s", what, m);
    if (st && !strcmp(st, "23505")) return oq_error_set(err, OQ_EEXIST, cause, "%s: %s", what, m);
    if (st && !strcmp(st, "57014"))
        return oq_error_set(err, OQ_ETIMEDOUT, cause, "%s: %s", what, m);
    if (lost_state(st) || !c || PQstatus(c) == CONNECTION_BAD)
        return oq_error_set_retriable(err, OQ_EDB, cause ? cause : oq_pg_sqlstate_code("08006"), 1,
                                      "%s: connection lost: %s", what, m);
    return oq_error_set(err, OQ_EDB, cause, "%s: %s", what, m);
}

int oq_pg_lost(PGconn *c, const oq_error_t *err)
{
    if (!c || PQstatus(c) == CONNECTION_BAD) return 1;
    if (!err || !err->cause) return 0;
    return err->cause == oq_pg_sqlstate_code("08006") ||
           err->cause == oq_pg_sqlstate_code("08003") ||
           err->cause == oq_pg_sqlstate_code("08000") || err->cause == oq_pg_sqlstate_code("57P01");
}

int oq_pg_pipeline_end(PGconn *c)
{
    for (int k = 0; k < 4 && !PQexitPipelineMode(c); k++) {
        PGresult *r = PQgetResult(c); /* the sync, or what a broken pipeline left */
        if (!r && PQstatus(c) != CONNECTION_OK) break;
        PQclear(r);
    }
    if (PQpipelineStatus(c) == PQ_PIPELINE_OFF) return 0;
    PQreset(c);
    return -1;
}

static void notice_quiet(void *arg, const char *msg)
{
    (void)arg;
    (void)msg; /* NOTICEs (IF NOT EXISTS ...) are not onceq's log lines */
}

int oq_pg_connect(const char *conninfo, PGconn **out, oq_error_t *err)
{
    *out = NULL;
    if (!conninfo || !*conninfo) return oq_error_set(err, OQ_EINVAL, 0, "no PostgreSQL address");
    const char *keys[] = {"dbname", "application_name", "fallback_application_name", NULL};
    const char *vals[] = {conninfo, NULL, "onceq", NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (!c) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (PQstatus(c) != CONNECTION_OK) {
        char m[200];
        snprintf(m, sizeof m, "%s", PQerrorMessage(c));
        size_t l = strlen(m);
        while (l && (m[l - 1] == '\n' || m[l - 1] == ' '))
            m[--l] = '\0';
        PQfinish(c);
        return oq_error_set_retriable(err, OQ_EDB, oq_pg_sqlstate_code("08001"), 1,
                                      "cannot connect to PostgreSQL: %s", m);
    }
    PQsetNoticeProcessor(c, notice_quiet, NULL);
    int rc = oq_pg_exec(c, "SET synchronous_commit = on", err);
    if (rc) {
        PQfinish(c);
        return rc;
    }
    *out = c;
    return 0;
}

int oq_pg_exec(PGconn *c, const char *sql, oq_error_t *err)
{
    if (!c) return oq_pg_error(NULL, NULL, err, "exec");
    PGresult *r = PQexec(c, sql);
    int ok = r && (PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK);
    int rc = ok ? 0 : oq_pg_error(c, r, err, "exec");
    PQclear(r);
    return rc;
}

int oq_pg_wake_after(PGconn *c, oq_error_t *err)
{
    return oq_pg_exec(c, "SET onceq.wake = 'after'", err);
}

int oq_pg_commit_wake(PGconn *c, oq_error_t *err)
{
    if (!c || !PQsendQuery(c, "COMMIT; SELECT onceq.wake()"))
        return oq_pg_error(c, NULL, err, "commit");
    int rc = 0, n = 0;
    PGresult *r;
    while ((r = PQgetResult(c)) != NULL) {
        if (n++ == 0) { /* the COMMIT's: an aborted transaction answers "ROLLBACK" */
            int ok = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r), "COMMIT") == 0;
            if (!ok && (rc = oq_pg_error(c, r, err, "commit")) == 0)
                rc = oq_error_set(err, OQ_EDB, 0, "commit: rolled back by the server");
        } else if (PQresultStatus(r) != PGRES_TUPLES_OK) { /* the wake-up's: a hint, not data */
            OQ_LOG_DEBUG("pg", "wake-up after commit: %s", PQresultErrorMessage(r));
        }
        PQclear(r);
    }
    if (n == 0 && !rc) rc = oq_pg_error(c, NULL, err, "commit: no answer");
    return rc;
}

static int query_bin(PGconn *c, const char *sql, int n, const char *const *params, const int *lens,
                     const int *fmts, PGresult **out, oq_error_t *err)
{
    *out = NULL;
    if (!c) return oq_pg_error(NULL, NULL, err, "query");
    PGresult *r = PQexecParams(c, sql, n, NULL, params, lens, fmts, 0);
    if (r && (PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK)) {
        *out = r;
        return 0;
    }
    int rc = oq_pg_error(c, r, err, "query");
    PQclear(r);
    return rc;
}

int oq_pg_query(PGconn *c, const char *sql, int n, const char *const *params, PGresult **out,
                oq_error_t *err)
{
    return query_bin(c, sql, n, params, NULL, NULL, out, err);
}

int oq_pg_cmd(PGconn *c, const char *sql, int n, const char *const *params, int64_t *affected,
              oq_error_t *err)
{
    PGresult *r = NULL;
    int rc = oq_pg_query(c, sql, n, params, &r, err);
    if (rc) return rc;
    if (affected) {
        const char *t = PQcmdTuples(r);
        *affected = t && *t ? strtoll(t, NULL, 10) : 0;
    }
    PQclear(r);
    return 0;
}

/* --- array parameters in the binary format --------------------------------------------------- */

/* array_recv's layout (src/backend/utils/adt/arrayfuncs.c): int32 ndim, int32 has-nulls flag,
 * element type OID, then per dimension int32 size and int32 lower bound, then each element as
 * int32 length (-1: NULL) and its bytes in the element type's binary form; integers in network
 * byte order. An empty array has ndim 0 and no dimensions. */
#define ARR_HEAD 20

static uint32_t elem_oid(char type)
{
    switch (type) {
    case 'b':
        return 20; /* int8 */
    case 'i':
        return 23; /* int4 */
    case 'o':
        return 16; /* bool */
    default:
        return 25; /* text */
    }
}

static void put_be32(unsigned char *o, uint32_t v)
{
    o[0] = (unsigned char)(v >> 24);
    o[1] = (unsigned char)(v >> 16);
    o[2] = (unsigned char)(v >> 8);
    o[3] = (unsigned char)v;
}

static int arr_put32(oq_pg_array_t *a, uint32_t v)
{
    unsigned char o[4];
    put_be32(o, v);
    return oq_buf_put(&a->b, o, 4);
}

const int oq_pg_bin[OQ_PG_BIN_MAX] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

void oq_pg_array_init(oq_pg_array_t *a, char type)
{
    memset(a, 0, sizeof *a);
    a->type = type;
    static const char head[ARR_HEAD];
    oq_buf_put(&a->b, head, ARR_HEAD); /* filled in by oq_pg_array_end */
}

/* \p v as a whole decimal integer in [lo, hi], nothing around it. */
static int parse_int(const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    if (!(*v == '-' || (*v >= '0' && *v <= '9'))) return -1; /* strtoll skips spaces */
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

int oq_pg_array_add(oq_pg_array_t *a, const char *v)
{
    if (a->b.err) return a->b.err;
    if (a->bad) return OQ_EINVAL;
    a->n++;
    if (!v) {
        a->nulls = 1;
        return arr_put32(a, 0xffffffffu);
    }
    int64_t x = 0;
    switch (a->type) {
    case 't': {
        size_t len = strlen(v);
        if (len > INT32_MAX) return a->bad = OQ_EINVAL;
        arr_put32(a, (uint32_t)len);
        return oq_buf_put(&a->b, v, len);
    }
    case 'b':
        if (parse_int(v, INT64_MIN, INT64_MAX, &x)) return a->bad = OQ_EINVAL;
        arr_put32(a, 8);
        arr_put32(a, (uint32_t)((uint64_t)x >> 32));
        return arr_put32(a, (uint32_t)((uint64_t)x & 0xffffffffu));
    case 'i':
        if (parse_int(v, INT32_MIN, INT32_MAX, &x)) return a->bad = OQ_EINVAL;
        arr_put32(a, 4);
        return arr_put32(a, (uint32_t)(int32_t)x);
    case 'o': {
        int t = strcmp(v, "t") == 0 || strcmp(v, "true") == 0 || strcmp(v, "1") == 0;
        int f = strcmp(v, "f") == 0 || strcmp(v, "false") == 0 || strcmp(v, "0") == 0;
        if (!t && !f) return a->bad = OQ_EINVAL;
        arr_put32(a, 1);
        return oq_buf_putc(&a->b, t ? 1 : 0);
    }
    default:
        return a->bad = OQ_EINVAL;
    }
}

int oq_pg_array_end(oq_pg_array_t *a, const char **p, int *len)
{
    *p = NULL;
    *len = 0;
    if (a->b.err) return a->b.err;
    if (a->bad) return a->bad;
    if (a->b.len > INT32_MAX) return OQ_ERANGE;
    unsigned char *h = (unsigned char *)a->b.p;
    put_be32(h, a->n ? 1 : 0);
    put_be32(h + 4, (uint32_t)a->nulls);
    put_be32(h + 8, elem_oid(a->type));
    put_be32(h + 12, (uint32_t)a->n);
    put_be32(h + 16, 1);
    *p = a->b.p;
    *len = a->n ? (int)a->b.len : 12; /* empty: no dimension */
    return 0;
}

void oq_pg_array_free(oq_pg_array_t *a)
{
    oq_buf_free(&a->b);
    a->n = a->nulls = a->bad = 0;
}

/* --- prepared statements -------------------------------------------------------------------- */

#define PREP_MAX 64

/* The statements prepared in one connection's session, by the address of their SQL literal;
 * the i-th is named oq_s<i>. Attached to the PGconn as libpq instance data of prep_event. */
typedef struct prep {
    const char *sql[PREP_MAX];
    int n;
    int pid; /* PQbackendPID() of the session they live in */
} prep_t;

static int prep_event(PGEventId id, void *info, void *pass)
{
    (void)pass;
    if (id == PGEVT_CONNRESET) { /* a new session: nothing prepared in it */
        prep_t *p = PQinstanceData(((PGEventConnReset *)info)->conn, prep_event);
        if (p) p->n = 0;
    } else if (id == PGEVT_CONNDESTROY) {
        free(PQinstanceData(((PGEventConnDestroy *)info)->conn, prep_event));
    }
    return 1;
}

int oq_pg_prepared(PGconn *c, oq_error_t *err)
{
    if (!c) return oq_error_set(err, OQ_EINVAL, 0, "no PostgreSQL connection");
    if (PQinstanceData(c, prep_event)) return 0;
    prep_t *p = calloc(1, sizeof *p);
    if (!p) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (!PQregisterEventProc(c, prep_event, "onceq prepared statements", NULL)) {
        free(p);
        return oq_error_set(err, OQ_EDB, 0, "cannot register a libpq event procedure");
    }
    p->pid = PQbackendPID(c);
    PQsetInstanceData(c, prep_event, p);
    return 0;
}

static int prepare(PGconn *c, prep_t *p, int k, const char *name, const char *sql, int n,
                   oq_error_t *err)
{
    PGresult *r = PQprepare(c, name, sql, n, NULL);
    int ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
    int rc = ok ? 0 : oq_pg_error(c, r, err, "prepare");
    PQclear(r);
    if (!rc && k == p->n) p->sql[p->n++] = sql;
    return rc;
}

int oq_pg_run(PGconn *c, const char *sql, int n, const char *const *params, PGresult **out,
              oq_error_t *err)
{
    return oq_pg_run_bin(c, sql, n, params, NULL, NULL, out, err);
}

int oq_pg_run_bin(PGconn *c, const char *sql, int n, const char *const *params, const int *lens,
                  const int *fmts, PGresult **out, oq_error_t *err)
{
    *out = NULL;
    prep_t *p = c ? PQinstanceData(c, prep_event) : NULL;
    if (!p) return query_bin(c, sql, n, params, lens, fmts, out, err);
    if (p->pid != PQbackendPID(c)) { /* another session (reconnected): nothing prepared */
        p->n = 0;
        p->pid = PQbackendPID(c);
    }
    int k = 0;
    while (k < p->n && p->sql[k] != sql)
        k++;
    if (k >= PREP_MAX) return query_bin(c, sql, n, params, lens, fmts, out, err);
    char name[16];
    snprintf(name, sizeof name, "oq_s%d", k);
    int rc = 0;
    if (k == p->n && (rc = prepare(c, p, k, name, sql, n, err))) return rc;
    for (int again = 0;; again++) {
        PGresult *r = PQexecPrepared(c, name, n, params, lens, fmts, 0);
        ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
        if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
            *out = r;
            return 0;
        }
        const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
        /* Unknown to the session (DEALLOCATE, or a session libpq did not report as new):
         * prepared again, once, when no transaction was aborted by the failure. */
        int unknown =
            state && strcmp(state, "26000") == 0 && PQtransactionStatus(c) == PQTRANS_IDLE;
        rc = oq_pg_error(c, r, err, "query");
        PQclear(r);
        if (!unknown || again || (rc = prepare(c, p, k, name, sql, n, err))) return rc;
    }
}

int oq_pg_stmt_name(PGconn *c, const char *sql, int n, char name[16], oq_error_t *err)
{
    prep_t *p = c ? PQinstanceData(c, prep_event) : NULL;
    name[0] = '\0';
    if (!p) return 0;
    if (p->pid != PQbackendPID(c)) { /* another session (reconnected): nothing prepared */
        p->n = 0;
        p->pid = PQbackendPID(c);
    }
    int k = 0;
    while (k < p->n && p->sql[k] != sql)
        k++;
    if (k >= PREP_MAX) return 0;
    char nm[16];
    snprintf(nm, sizeof nm, "oq_s%d", k);
    int rc = k == p->n ? prepare(c, p, k, nm, sql, n, err) : 0;
    if (!rc) memcpy(name, nm, sizeof nm);
    return rc;
}

int oq_pg_run_cmd(PGconn *c, const char *sql, int n, const char *const *params, int64_t *affected,
                  oq_error_t *err)
{
    PGresult *r = NULL;
    int rc = oq_pg_run(c, sql, n, params, &r, err);
    if (rc) return rc;
    if (affected) {
        const char *t = PQcmdTuples(r);
        *affected = t && *t ? strtoll(t, NULL, 10) : 0;
    }
    PQclear(r);
    return 0;
}

int oq_pg_open(oq_pg_t *p, const char *conninfo, oq_error_t *err)
{
    memset(p, 0, sizeof *p);
    p->conninfo = strdup(conninfo ? conninfo : "");
    if (!p->conninfo) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    return oq_pg_connect(p->conninfo, &p->conn, err);
}

void oq_pg_close(oq_pg_t *p)
{
    if (!p) return;
    if (p->conn) PQfinish(p->conn);
    free(p->conninfo);
    memset(p, 0, sizeof *p);
}

static void backoff(int attempt)
{
    long ms = 5L << (attempt < 6 ? attempt : 6); /* 5 ms .. 320 ms */
    ms += rand() % (ms + 1);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int oq_pg_tx(oq_pg_t *p, int tries, int (*fn)(PGconn *c, void *arg, oq_error_t *err), void *arg,
             oq_error_t *err)
{
    int rc = 0;
    if (tries < 1) tries = 1;
    for (int i = 0; i < tries; i++) {
        if (i) backoff(i);
        if (!p->conn || PQstatus(p->conn) == CONNECTION_BAD) {
            if (p->conn) PQfinish(p->conn);
            p->conn = NULL;
            if ((rc = oq_pg_connect(p->conninfo, &p->conn, err))) continue;
        }
        if ((rc = oq_pg_exec(p->conn, "BEGIN", err)) == 0 && (rc = fn(p->conn, arg, err)) == 0 &&
            (rc = oq_pg_exec(p->conn, "COMMIT", err)) == 0)
            return 0;
        if (p->conn && PQstatus(p->conn) == CONNECTION_OK &&
            PQtransactionStatus(p->conn) != PQTRANS_IDLE) {
            PGresult *r = PQexec(p->conn, "ROLLBACK");
            PQclear(r);
        }
        int retry = err ? err->retriable : 0;
        if (!retry) return rc;
        OQ_LOG_INFO("pg", "transaction retried (try %d of %d): %s", i + 2, tries,
                    err ? err->msg : "");
    }
    return rc;
}

int oq_pg_schema_version(PGconn *c, int *version, oq_error_t *err)
{
    PGresult *r = NULL;
    *version = 0;
    /* two statements: a table named in a statement is resolved when it is parsed, whatever a
     * CASE around it would decide, so one statement fails on a database never migrated */
    int rc =
        oq_pg_query(c, "SELECT to_regclass('onceq.schema_version') IS NOT NULL", 0, NULL, &r, err);
    if (rc) return rc;
    int exists = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    if (!exists) return 0;
    if ((rc = oq_pg_query(c, "SELECT COALESCE(max(version),0) FROM onceq.schema_version", 0, NULL,
                          &r, err)))
        return rc;
    if (PQntuples(r) == 1) *version = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return 0;
}

int oq_pg_migrate(PGconn *c, oq_error_t *err)
{
    int n = 0, v = 0, rc;
    while (oq_migrations_postgres[n])
        n++;
    if ((rc = oq_pg_exec(c, "BEGIN", err))) return rc;
    if ((rc = oq_pg_exec(c,
                         "SET LOCAL client_min_messages = warning;"
                         "SELECT pg_advisory_xact_lock(" MIGRATE_LOCK ");"
                         "CREATE SCHEMA IF NOT EXISTS onceq;"
                         "CREATE TABLE IF NOT EXISTS onceq.schema_version("
                         "  id int PRIMARY KEY CHECK (id = 1), version int NOT NULL)",
                         err)) ||
        (rc = oq_pg_schema_version(c, &v, err)))
        goto fail;
    if (v > n) {
        rc = oq_error_set(err, OQ_EVERSION, 0,
                          "database schema onceq version %d is newer than this binary (%d); "
                          "upgrade onceq",
                          v, n);
        goto fail;
    }
    for (int i = v; i < n; i++) {
        const char *sql = oq_sql_file(oq_migrations_postgres[i]);
        if (!sql) {
            rc = oq_error_set(err, OQ_EINVAL, 0, "no embedded migration %s",
                              oq_migrations_postgres[i]);
            goto fail;
        }
        if ((rc = oq_pg_exec(c, sql, err))) {
            char m[160];
            snprintf(m, sizeof m, "%.150s", err ? err->msg : "");
            if (err) snprintf(err->msg, sizeof err->msg, "%.80s: %s", oq_migrations_postgres[i], m);
            goto fail;
        }
    }
    if (v < n) {
        char sql[160];
        snprintf(sql, sizeof sql,
                 "INSERT INTO onceq.schema_version VALUES (1, %d) ON CONFLICT (id) DO UPDATE "
                 "SET version = EXCLUDED.version",
                 n);
        if ((rc = oq_pg_exec(c, sql, err))) goto fail;
    }
    return oq_pg_exec(c, "COMMIT", err);
fail:
    PQclear(PQexec(c, "ROLLBACK"));
    return rc;
}

/* --- snapshot into SQLite (readers written over SQLite: onceq verify) ------------------------ */

/* The SQLite column type of a PostgreSQL type oid (pg_type.h): integers and booleans INTEGER,
 * floating and numeric REAL, everything else TEXT as PostgreSQL prints it. */
static const char *snap_type(Oid t)
{
    switch (t) {
    case 16: /* bool */
    case 20: /* int8 */
    case 21: /* int2 */
    case 23: /* int4 */
        return "INTEGER";
    case 700:  /* float4 */
    case 701:  /* float8 */
    case 1700: /* numeric */
        return "REAL";
    default:
        return "TEXT";
    }
}

static int snap_table(PGconn *c, const char *table, const char *name, sqlite3 *dst, oq_error_t *err)
{
    const char *p[1] = {table};
    PGresult *r = NULL;
    sqlite3_stmt *st = NULL;
    char *sql = NULL;
    int rc = oq_pg_query(c, "SELECT to_regclass($1) IS NOT NULL", 1, p, &r, err);
    if (rc) return rc;
    int exists = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    r = NULL;
    if (!exists) return 0;
    char q[160];
    snprintf(q, sizeof q, "SELECT * FROM %s", table);
    if ((rc = oq_pg_query(c, q, 0, NULL, &r, err))) return rc;
    int nf = PQnfields(r);
    size_t cap = 64 + (size_t)nf * 96;
    sql = malloc(cap);
    if (!sql || nf == 0) {
        rc = oq_error_set(err, sql ? OQ_EDB : OQ_ENOMEM, 0, "snapshot %s: no columns", table);
        goto out;
    }
    size_t o = (size_t)snprintf(sql, cap, "CREATE TABLE \"%s\" (", name);
    for (int i = 0; i < nf && o < cap; i++)
        o += (size_t)snprintf(sql + o, cap - o, "%s\"%.60s\" %s", i ? ", " : "", PQfname(r, i),
                              snap_type(PQftype(r, i)));
    if (o < cap) o += (size_t)snprintf(sql + o, cap - o, ")");
    if (o >= cap || sqlite3_exec(dst, sql, NULL, NULL, NULL) != SQLITE_OK) {
        rc = oq_error_set(err, OQ_EDB, 0, "snapshot %s: %s", table, sqlite3_errmsg(dst));
        goto out;
    }
    o = (size_t)snprintf(sql, cap, "INSERT INTO \"%s\" VALUES (", name);
    for (int i = 0; i < nf && o < cap; i++)
        o += (size_t)snprintf(sql + o, cap - o, "%s?", i ? ", " : "");
    if (o < cap) o += (size_t)snprintf(sql + o, cap - o, ")");
    if (o >= cap || sqlite3_prepare_v2(dst, sql, -1, &st, NULL) != SQLITE_OK) {
        rc = oq_error_set(err, OQ_EDB, 0, "snapshot %s: %s", table, sqlite3_errmsg(dst));
        goto out;
    }
    for (int row = 0; row < PQntuples(r); row++) {
        sqlite3_reset(st);
        for (int i = 0; i < nf; i++) {
            const char *v = PQgetvalue(r, row, i);
            if (PQgetisnull(r, row, i))
                sqlite3_bind_null(st, i + 1);
            else if (PQftype(r, i) == 16)
                sqlite3_bind_int(st, i + 1, v[0] == 't');
            else if (strcmp(snap_type(PQftype(r, i)), "INTEGER") == 0)
                sqlite3_bind_int64(st, i + 1, strtoll(v, NULL, 10));
            else if (strcmp(snap_type(PQftype(r, i)), "REAL") == 0)
                sqlite3_bind_double(st, i + 1, strtod(v, NULL));
            else
                sqlite3_bind_text(st, i + 1, v, PQgetlength(r, row, i), SQLITE_STATIC);
        }
        if (sqlite3_step(st) != SQLITE_DONE) {
            rc = oq_error_set(err, OQ_EDB, 0, "snapshot %s: %s", table, sqlite3_errmsg(dst));
            goto out;
        }
    }
out:
    sqlite3_finalize(st);
    free(sql);
    PQclear(r);
    return rc;
}

int oq_pg_snapshot(PGconn *c, const char *const *tables, const char *const *names, int n,
                   sqlite3 *dst, oq_error_t *err)
{
    int rc = oq_pg_exec(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", err);
    if (rc) return rc;
    for (int i = 0; i < n && rc == 0; i++)
        rc = snap_table(c, tables[i], names[i], dst, err);
    oq_error_t ignore = {0};
    oq_pg_exec(c, "ROLLBACK", &ignore);
    return rc;
}
