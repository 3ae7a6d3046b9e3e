/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_pg.c: every SQL statement of the consumer on PostgreSQL (schema `onceq`,
 * schema/postgres/0003_consumer.sql), the twin of store.c behind consumer_store.h; store.c hands
 * an operation here when its database setting is a PostgreSQL URI or keyword string. No rules
 * here: consumer/execution.c decides, on the same rows.
 *
 * What differs from SQLite, and why:
 *  - Clock. Consumers on several hosts share these rows and do not share a clock. The store's
 *    clock (oq__consumer_store_now) is the server's: read with clock_timestamp() at open and
 *    carried by this host's boot clock (a constant offset, so a host whose wall clock is wrong,
 *    or stepped, still writes leases and due times on the server's scale). The lease lapse that
 *    lets another worker take an execution over is also checked in SQL against
 *    clock_timestamp() itself (exec_lapsed, recovery_pending: lapsed on the worker's clock
 *    AND on the server's): a consumer whose clock runs ahead cannot see a live lease as
 *    lapsed, and one whose clock runs behind cannot write a lease that outlives its term on
 *    the server's scale. Fences work as on SQLite: every conditional update names
 *    the state and fence it read, and READ COMMITTED re-checks that WHERE on the row's newest
 *    version after a concurrent writer committed, so a stale worker matches nothing.
 *  - A failed statement aborts a PostgreSQL transaction (SQLite aborts only the statement).
 *    So nothing the rules expect to "fail softly" raises: the inbox upsert, the effect insert
 *    and the outbox append are INSERT ... ON CONFLICT and report what happened; only a second
 *    execution of one call raises (unique_violation, OQ_EEXIST: the batch is rolled back and
 *    retried, and the retry reads the winner's row).
 *  - Result events go into onceq.outbox, the outbox of the producer's schema (0001), not a
 *    table of the consumer's: the relay's PostgreSQL publish scheme (relay/store_pg.c: pub_seq
 *    numbers assigned only to committed rows under one fenced lease, LISTEN/NOTIFY) then
 *    publishes them without skipping a late commit, with no second scheme. A delivered row is
 *    one whose pub_seq is at or below the relay's watermark; republish clears pub_seq (the row
 *    is numbered again, above the watermark).
 *  - The retention horizon is fenced by an advisory lock (HORIZON_FENCE): an intake's
 *    transaction takes it shared before it reads the horizon, a purge takes it exclusive
 *    before it raises the horizon, each until its transaction ends. A purge thus waits for the
 *    intakes that read the old value, and an intake that comes later waits for the purge to
 *    commit and then reads the new one; an old message can never find its execution purged
 *    and the horizon still low. The lock is its own statement, before the read: a statement's
 *    snapshot is taken when it starts, so a read in the statement that waited would still see
 *    the old horizon while the next statement sees the purge's deletions. A transaction reads
 *    the horizon once (the lock holds it until the end), not once per intake of its batch.
 *    It was a row lock (`FOR SHARE` on the horizon's row) up to schema version 9: every batch
 *    then wrote a WAL record and dirtied that one page, and batches of two consumers that
 *    overlapped made a MultiXact (86 % of the batches with four consumers). Version 10 keeps a
 *    consumer that still fences with the row lock off a database where this one runs.
 *  - Parameters go as text; integers are printed with PRId64; bytes (dead letters) as hex.
 *    Every statement is prepared once per connection (oq_pg_prepared() and oq_pg_run() in
 *    common/pg.c: named by its SQL literal's address, prepared again after a reconnect): one
 *    consumer drained a backlog of 6,000 inline calls at ~1,600 calls/s prepared against
 *    ~570/s parsed per execution (this 2-core host).
 *  - Round trips per batch, not per message. The worker begins a batch's transaction with the
 *    call ids and message ids of its messages (oq__consumer_pg_begin_batch): BEGIN and four
 *    reads (the fenced horizon, the batch's executions, which of its message ids the inbox
 *    holds, which of its calls have an effect) go in one pipeline (libpq pipeline mode), one
 *    round trip. Until the commit, exec_get of a call read ahead is answered from that read,
 *    and the writes whose answer the read already gives are held behind: an inbox row for an
 *    id the inbox did not hold, an execution insert, an effect for a call that had none, audit
 *    rows, result events. They are sent, in order, with the transaction's next statement that
 *    needs an answer, or with COMMIT: a batch of new fast calls is two round trips however
 *    many messages it has (test_consumer_batch_pg: 39 calls, 2 round trips, against 237 one
 *    statement at a time). The held rows of one INSERT go as one statement, each column an
 *    array (unnest; pend_stmts): 11 statements for those 39 calls, not 201. A row this
 *    transaction writes is read again (its entry dropped). What the rules see is what a read
 *    at BEGIN would have shown; every decision on it is still enforced where it was: a held
 *    write is the plain INSERT (no ON CONFLICT), so an inbox id, an execution or an effect
 *    another consumer wrote after the read ahead fails it at the send, the transaction rolls
 *    back (nothing was told to Kafka), the error is retriable and the worker's retry of the
 *    batch goes statement by statement (careful_next), where the rules meet that row as they
 *    always did. Fences, leases and conditional updates are never held: they are sent and
 *    answered in place.
 *
 * A connection the server closed (restart, pg_terminate_backend) is re-established before the
 * next operation outside a transaction (begin included); the operation that met it failed
 * retriably and the worker retries its whole batch: nothing is acknowledged to Kafka before
 * the batch's transaction committed.
 */
#include "store_pg.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_buf.h"
#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_pg.h"
#include "oq_pg_rows.h"
#include "oq_util.h"

/* A write held behind: its SQL literal and a copy of its parameters (one block). rows: the
 * same INSERT for many rows, parameter i an array of the rows' parameter i (unnest), or NULL:
 * the held rows of one INSERT go as one statement (pipe_run). */
typedef struct pend {
    const char *sql, *rows;
    const char *types; /* rows: its parameters' element types (oq_pg_array_t), in order */
    int n, plain;      /* plain: BEGIN or COMMIT, sent unprepared */
    char **pr;         /* n pointers, then the strings; NULL for none */
} pend_t;

/* A row the batch read ahead: an execution (x, when have), or only whether an inbox message id
 * or an effect's call id is there. live = 0 once this transaction wrote it: read it again. */
typedef struct ahead {
    char key[48];
    int live, have;
    int dlq; /* an inbox row whose outcome is 'dlq' */
    oq__exec_row_t x;
} ahead_t;

/* At most this many statements in one pipeline (their answers are read after its sync). */
#define PIPE_MAX 256
/* At most this many rows held behind (held INSERTs with a many-rows form go as one statement a
 * table, so a batch of a few hundred messages still sends its writes with its COMMIT). */
#define HELD_MAX 4096

struct oq__consumer_pg {
    PGconn *c;
    int tx;      /* inside the caller's transaction (begin .. commit/rollback): never reconnect */
    int hz_held; /* the transaction read the horizon behind its fence: held until the end */
    int64_t hz;  /* what it read */
    char worker[128];
    /* the batch (oq__consumer_pg_begin_batch): reads ahead, writes held behind */
    int ahead;        /* this transaction read ahead: its plain writes are held behind */
    int careful_next; /* a held write failed: the next batch goes statement by statement */
    pend_t *pend;
    int npend, pcap;
    ahead_t *ax, *ai, *ae; /* executions, inbox message ids, effects' call ids */
    int nax, nai, nae;
    int64_t n_stmt, n_rt; /* statements sent, round trips waited for */
    int wrote_outbox;     /* the transaction wrote outbox rows: its COMMIT wakes the relay */
};

/* The server's clock, unix ms. */
#define SRV_NOW "(extract(epoch from clock_timestamp()) * 1000)::bigint"
/* Outbox rows with pub_seq at or below it were delivered (relay/store_pg.c). */
#define WATERMARK "(SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease)"

/* The advisory lock key that fences the retention horizon ("onceq-h", as ASSIGN_LOCK in
 * relay/store_pg.c is "onceq-r"): intakes take it shared, a purge exclusive (file comment). */
#define HORIZON_KEY "x'6f6e6365712d68'::bigint"
#define HORIZON_FENCE "SELECT pg_advisory_xact_lock_shared(" HORIZON_KEY ")"
#define HORIZON_READ "SELECT horizon FROM onceq.consumer_retention WHERE name = 'executions'"

#define EXEC_COLS                                                                                  \
    "call_id, tenant, idem_key, fingerprint, tool, args, state, attempt, tries, lease_owner, "     \
    "lease_until, fence, result, error, effect_id, next_attempt_at, message_id, started_at, "      \
    "unknown_at, lookups, updated_at"

/* A time: 0 is NULL. */
static const char *tnum(num_t *n, int64_t v)
{
    return v ? num(n, v) : NULL;
}

static const char *col_str(PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

static int oom(oq_error_t *err)
{
    return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
}

/* Reconnects a connection the server closed, outside a transaction. */
static int ready(oq__consumer_pg_t *p, oq_error_t *err)
{
    if (PQstatus(p->c) == CONNECTION_OK) return 0;
    PQreset(p->c);
    if (PQstatus(p->c) != CONNECTION_OK) return oq_pg_error(p->c, NULL, err, "consumer reconnect");
    int rc = oq_pg_exec(p->c, "SET synchronous_commit = on", err);
    if (!rc) rc = oq_pg_wake_after(p->c, err);
    if (!rc) OQ_LOG_INFO("consumer", "reconnected to PostgreSQL");
    return rc;
}

static int in_tx(oq__consumer_pg_t *p)
{
    return p->tx;
}

/* Before a statement: outside a transaction a lost connection is re-established; inside one
 * it is not (what the transaction wrote is gone with it: the statement must fail, and the
 * caller rolls back and retries the whole transaction, never continues in autocommit). */
static int usable(oq__consumer_pg_t *p, oq_error_t *err)
{
    if (!p->tx) return ready(p, err);
    if (PQstatus(p->c) != CONNECTION_OK)
        return oq_pg_error(p->c, NULL, err, "connection lost inside a transaction");
    return 0;
}

/* Outside a transaction a statement is retried once more when the connection was lost
 * (reconnected first) or the server chose it as a deadlock or serialization victim: every
 * single statement of this file may run twice (ids, fences and ON CONFLICT make it so). */
static int again(oq__consumer_pg_t *p, int rc, const oq_error_t *err, int attempt)
{
    if (!rc || p->tx || attempt > 0) return 0;
    if (PQstatus(p->c) == CONNECTION_BAD) return 1;
    return rc == OQ_EBUSY && err && err->retriable;
}

/* --- the batch's pipeline ------------------------------------------------------------------- */

/* One statement to send in a pipeline. */
typedef struct stmt {
    const char *sql;
    int n, plain; /* plain: sent unprepared, so planned with its parameters every time */
    const char *const *pr;
    const int *len, *fmt; /* NULL: every parameter text; else as PQsendQueryParams's */
    int optional; /* the last one only: its failure is logged, not the pipeline's (a wake-up) */
} stmt_t;

static void pend_clear(oq__consumer_pg_t *p)
{
    for (int i = 0; i < p->npend; i++)
        free(p->pend[i].pr);
    p->npend = 0;
}

static void ahead_clear(oq__consumer_pg_t *p)
{
    for (int i = 0; i < p->nax; i++)
        oq__exec_row_clear(&p->ax[i].x);
    free(p->ax);
    free(p->ai);
    free(p->ae);
    p->ax = p->ai = p->ae = NULL;
    p->nax = p->nai = p->nae = 0;
    p->ahead = 0;
}

/* The live entry of \p key, or NULL. */
static ahead_t *ahead_find(ahead_t *a, int n, const char *key)
{
    for (int i = 0; key && i < n; i++)
        if (a[i].live && strcmp(a[i].key, key) == 0) return &a[i];
    return NULL;
}

/* This transaction writes \p key's row: what was read ahead of it no longer holds. */
static void ahead_drop(ahead_t *a, int n, const char *key)
{
    ahead_t *e = ahead_find(a, n, key);
    if (e) e->live = 0;
}

/* The parameters of one many-rows statement (pend_stmts), freed by rows_free. */
typedef struct rows_arg {
    int n;
    oq_pg_array_t a[OQ_PG_BIN_MAX];
    const char *pr[OQ_PG_BIN_MAX];
    int len[OQ_PG_BIN_MAX];
} rows_arg_t;

static void rows_free(rows_arg_t *r)
{
    if (!r) return;
    for (int c = 0; c < r->n; c++)
        oq_pg_array_free(&r->a[c]);
    free(r);
}

/*
 * The held writes as statements to send, into \p out (room for p->npend), in order: the rows of
 * one INSERT that has a many-rows form (pend_t.rows) go as one statement at the place of the
 * first of them, its parameter i the array of their parameters i (a plain statement, BEGIN,
 * is not crossed). Held writes are plain INSERTs into tables with no foreign keys between
 * them, so only the order within one table is kept (identity columns follow it). The arrays
 * (binary, oq_pg_array_t) are malloc()ed into \p owned (one per statement, NULL where none).
 * @returns the count, or -1 (out of memory, or a value not of its column's type).
 */
static int pend_stmts(oq__consumer_pg_t *p, stmt_t *out, rows_arg_t **owned)
{
    int n = 0;
    char *used = calloc((size_t)p->npend + 1, 1);
    int *grp = calloc((size_t)p->npend + 1, sizeof *grp);
    if (!used || !grp) goto nomem;
    for (int i = 0; i < p->npend; i++) {
        if (used[i]) continue;
        const pend_t *a = &p->pend[i];
        int rows = 0;
        grp[rows++] = i;
        used[i] = 1;
        for (int j = i + 1; a->rows && j < p->npend && !p->pend[j].plain; j++)
            if (!used[j] && p->pend[j].sql == a->sql) {
                grp[rows++] = j;
                used[j] = 1;
            }
        owned[n] = NULL;
        if (rows < 2) {
            out[n++] = (stmt_t){
                .sql = a->sql, .n = a->n, .plain = a->plain, .pr = (const char *const *)a->pr};
            continue;
        }
        rows_arg_t *arr = a->n <= OQ_PG_BIN_MAX ? calloc(1, sizeof *arr) : NULL;
        if (!arr) goto nomem;
        owned[n] = arr;
        arr->n = a->n;
        out[n++] =
            (stmt_t){.sql = a->rows, .n = a->n, .pr = arr->pr, .len = arr->len, .fmt = oq_pg_bin};
        for (int c = 0; c < a->n; c++) {
            oq_pg_array_init(&arr->a[c], a->types[c]);
            for (int k = 0; k < rows; k++)
                oq_pg_array_add(&arr->a[c], p->pend[grp[k]].pr[c]);
            if (oq_pg_array_end(&arr->a[c], &arr->pr[c], &arr->len[c])) goto nomem;
        }
    }
    free(used);
    free(grp);
    return n;
nomem:
    free(used);
    free(grp);
    for (int k = 0; k < n; k++)
        rows_free(owned[k]);
    return -1;
}

/*
 * Sends the writes held behind, then \p st (nst statements, their results into \p out, which
 * the caller clears), in one pipeline: one round trip. PostgreSQL skips a pipeline's statements
 * after a failure until its sync, so the first failure is the one reported. A held write's
 * failure (the rules were told it succeeded) is reported retriable, the transaction is to be
 * rolled back, and the next batch goes statement by statement (careful_next): it then meets
 * what made the write fail the way the statement-by-statement path always did.
 */
static int pipe_run(oq__consumer_pg_t *p, const stmt_t *st, int nst, PGresult **out,
                    oq_error_t *err)
{
    int rc = 0, sent = 0, failed_at = -1, nh = 0, total = 0;
    char(*names)[16] = NULL;
    stmt_t *all = NULL;
    rows_arg_t **owned = NULL;
    for (int i = 0; i < nst; i++)
        out[i] = NULL;
    if (p->npend + nst == 0) return 0;
    if (PQstatus(p->c) != CONNECTION_OK) {
        rc = oq_pg_error(p->c, NULL, err, "connection lost inside a transaction");
        goto out;
    }
    all = calloc((size_t)(p->npend + nst), sizeof *all);
    owned = calloc((size_t)p->npend + 1, sizeof *owned);
    if (!all || !owned || (nh = pend_stmts(p, all, owned)) < 0) {
        nh = 0;
        rc = oom(err);
        goto out;
    }
    for (int i = 0; i < nst; i++)
        all[nh + i] = st[i];
    total = nh + nst;
    if (!(names = calloc((size_t)total, sizeof *names))) {
        rc = oom(err);
        goto out;
    }
    /* prepared before the pipeline, once per session (a round trip the first time only) */
    for (int i = 0; i < total && !rc; i++)
        if (!all[i].plain) rc = oq_pg_stmt_name(p->c, all[i].sql, all[i].n, names[i], err);
    if (rc) goto out;
    if (!PQenterPipelineMode(p->c)) {
        rc = oq_pg_error(p->c, NULL, err, "pipeline");
        goto out;
    }
    p->n_rt++;
    for (; sent < total; sent++) {
        const stmt_t *x = &all[sent];
        int ok = names[sent][0]
                     ? PQsendQueryPrepared(p->c, names[sent], x->n, x->pr, x->len, x->fmt, 0)
                     : PQsendQueryParams(p->c, x->sql, x->n, NULL, x->pr, x->len, x->fmt, 0);
        if (!ok) break;
    }
    p->n_stmt += sent;
    int synced = PQpipelineSync(p->c);
    if (sent < total || !synced) {
        rc = oq_pg_error(p->c, NULL, err, "pipeline send");
        failed_at = sent;
        if (!synced) sent = 0; /* no answer will come: none is waited for */
    }
    /* every sent statement's answer (a result, then NULL), then the sync's */
    for (int i = 0; i < sent; i++) {
        PGresult *r = PQgetResult(p->c);
        if (!r) {
            if (!rc) rc = oq_pg_error(p->c, NULL, err, "pipeline: no answer");
            if (failed_at < 0) failed_at = i;
            break;
        }
        ExecStatusType s = PQresultStatus(r);
        if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) {
            if (i >= nh) {
                out[i - nh] = r;
                r = NULL;
            }
        } else if (all[i].optional && i == total - 1) {
            OQ_LOG_DEBUG("consumer", "pipeline: %.60s: %s", all[i].sql, PQresultErrorMessage(r));
        } else if (failed_at < 0) {
            failed_at = i;
            rc = oq_pg_error(p->c, r, err, "pipeline");
        }
        PQclear(r);
        while ((r = PQgetResult(p->c)) != NULL) /* the end of this statement's answer */
            PQclear(r);
    }
    if (oq_pg_pipeline_end(p->c) != 0) {
        /* a pipeline that could not be closed: a new session (the transaction is lost with the
         * old one, and the caller rolls back and retries it) */
        if (!rc) rc = oq_error_set_retriable(err, OQ_EDB, 0, 1, "pipeline left open: reconnected");
        if (PQstatus(p->c) == CONNECTION_OK) {
            PQclear(PQexec(p->c, "SET synchronous_commit = on"));
            oq_pg_wake_after(p->c, NULL);
        }
    }
    if (rc && failed_at >= 0 && failed_at < nh) {
        p->careful_next = 1;
        char m[200];
        snprintf(m, sizeof m, "%.190s", err ? err->msg : "");
        rc = oq_error_set_retriable(err, rc == OQ_EDB && oq_pg_lost(p->c, err) ? OQ_EDB : OQ_EBUSY,
                                    err ? err->cause : 0, 1,
                                    "a write held behind failed (batch retried statement by "
                                    "statement): %.190s",
                                    m);
    }
out:
    for (int i = 0; owned && i < nh; i++)
        rows_free(owned[i]);
    free(owned);
    free(all);
    free(names);
    pend_clear(p);
    if (rc)
        for (int i = 0; i < nst; i++) {
            PQclear(out[i]);
            out[i] = NULL;
        }
    return rc;
}

/* Holds \p sql behind (its parameters copied): sent with the transaction's next read or its
 * commit; \p rows, when not NULL, is its many-rows form (pend_t), \p types the element type
 * of each of its array parameters (oq_pg_array_t). Too many held: sent now. */
static int hold_as(oq__consumer_pg_t *p, const char *sql, const char *rows, const char *types,
                   int n, const char *const *pr, int plain, oq_error_t *err)
{
    int single = 0;
    for (int i = 0; i < p->npend && !rows; i++)
        single += !p->pend[i].rows;
    if (p->npend >= HELD_MAX || single >= PIPE_MAX) {
        int rc = pipe_run(p, NULL, 0, NULL, err);
        if (rc) return rc;
    }
    if (p->npend == p->pcap) {
        int cap = p->pcap ? 2 * p->pcap : 64;
        pend_t *np = realloc(p->pend, (size_t)cap * sizeof *np);
        if (!np) return oom(err);
        p->pend = np;
        p->pcap = cap;
    }
    size_t len = (size_t)n * sizeof(char *);
    for (int i = 0; i < n; i++)
        len += pr[i] ? strlen(pr[i]) + 1 : 0;
    char **b = n ? malloc(len) : NULL;
    if (n && !b) return oom(err);
    char *o = (char *)(b + n);
    for (int i = 0; i < n; i++) {
        if (!pr[i]) {
            b[i] = NULL;
            continue;
        }
        size_t l = strlen(pr[i]) + 1;
        memcpy(o, pr[i], l);
        b[i] = o;
        o += l;
    }
    p->pend[p->npend++] =
        (pend_t){.sql = sql, .rows = rows, .types = types, .n = n, .plain = plain, .pr = b};
    return 0;
}

static int hold(oq__consumer_pg_t *p, const char *sql, int n, const char *const *pr, int plain,
                oq_error_t *err)
{
    return hold_as(p, sql, NULL, NULL, n, pr, plain, err);
}

static int q(oq__consumer_pg_t *p, const char *sql, int n, const char *const *pr, PGresult **r,
             oq_error_t *err)
{
    int rc = 0;
    if (p->tx && p->npend) { /* the held writes go first, in the same round trip */
        stmt_t st = {.sql = sql, .n = n, .pr = pr};
        return pipe_run(p, &st, 1, r, err);
    }
    for (int i = 0; i == 0 || again(p, rc, err, i - 1); i++) {
        if (i) oq_sleep_ms(20, NULL);
        p->n_rt++;
        p->n_stmt++;
        if ((rc = usable(p, err)) == 0) rc = oq_pg_run(p->c, sql, n, pr, r, err);
    }
    return rc;
}

static int cmd(oq__consumer_pg_t *p, const char *sql, int n, const char *const *pr,
               int64_t *affected, oq_error_t *err)
{
    int rc = 0;
    PGresult *r = NULL;
    if (p->tx && p->npend) {
        stmt_t st = {.sql = sql, .n = n, .pr = pr};
        rc = pipe_run(p, &st, 1, &r, err);
    } else {
        for (int i = 0; i == 0 || again(p, rc, err, i - 1); i++) {
            if (i) oq_sleep_ms(20, NULL);
            p->n_rt++;
            p->n_stmt++;
            if ((rc = usable(p, err)) == 0) rc = oq_pg_run(p->c, sql, n, pr, &r, err);
        }
    }
    if (rc == 0 && affected) {
        const char *t = PQcmdTuples(r);
        *affected = t && *t ? strtoll(t, NULL, 10) : 0;
    }
    PQclear(r);
    return rc;
}

/* --- connection ------------------------------------------------------------------------------ */

/* Without migrating (a reader such as verify writes nothing): the schema must be this binary's
 * consumer set or a newer one it refuses the same way as oq_pg_migrate. */
static int check_version(PGconn *c, oq_error_t *err)
{
    int v = 0, n = 0, rc = oq_pg_schema_version(c, &v, err);
    while (oq_migrations_postgres[n])
        n++;
    if (rc) return rc;
    if (v > n)
        return oq_error_set(err, OQ_EVERSION, 0,
                            "database schema onceq version %d is newer than this binary (%d); "
                            "upgrade onceq",
                            v, n);
    if (v < n)
        return oq_error_set(err, OQ_EDB, 0,
                            "database schema onceq version %d: not migrated to %d yet (onceq "
                            "migrate --db URL, or start a consumer once)",
                            v, n);
    return 0;
}

int oq__consumer_pg_open(const char *conninfo, const char *worker, int migrate,
                         oq__consumer_pg_t **out, int64_t *server_ms, oq_error_t *err)
{
    *out = NULL;
    oq__consumer_pg_t *p = calloc(1, sizeof *p);
    if (!p) return oom(err);
    snprintf(p->worker, sizeof p->worker, "%s", worker ? worker : "worker");
    PGresult *r = NULL;
    int rc = oq_pg_connect(conninfo, &p->c, err);
    if (!rc) rc = oq_pg_prepared(p->c, err);
    if (!rc) rc = migrate ? oq_pg_migrate(p->c, err) : check_version(p->c, err);
    if (!rc) rc = oq_pg_wake_after(p->c, err); /* its commits wake the relay themselves */
    if (!rc) rc = oq_pg_query(p->c, "SELECT " SRV_NOW, 0, NULL, &r, err);
    if (rc) {
        oq__consumer_pg_close(p);
        return rc;
    }
    *server_ms = col_i64(r, 0, 0);
    PQclear(r);
    *out = p;
    return 0;
}

void oq__consumer_pg_close(oq__consumer_pg_t *p)
{
    if (!p) return;
    if (p->c) PQfinish(p->c);
    pend_clear(p);
    free(p->pend);
    ahead_clear(p);
    free(p);
}

void oq__consumer_pg_counts(const oq__consumer_pg_t *p, int64_t *statements, int64_t *round_trips)
{
    *statements = p->n_stmt;
    *round_trips = p->n_rt;
}

PGconn *oq__consumer_pg_conn(oq__consumer_pg_t *p)
{
    return p->c;
}

int oq__consumer_pg_begin(oq__consumer_pg_t *p, oq_error_t *err)
{
    p->tx = 0;
    p->hz_held = 0;
    pend_clear(p);
    ahead_clear(p);
    int rc = ready(p, err);
    if (rc) return rc;
    p->n_rt++;
    p->n_stmt++;
    rc = oq_pg_exec(p->c, "BEGIN", err);
    if (rc && PQstatus(p->c) == CONNECTION_BAD) {
        /* libpq learns of a closed connection only when it uses it: once more, reconnected */
        if ((rc = ready(p, err)) == 0) rc = oq_pg_exec(p->c, "BEGIN", err);
    }
    p->tx = rc == 0;
    return rc;
}

static int read_exec(PGresult *r, int i, oq__exec_row_t *x);

/* \p ids as a text[] parameter (binary) in \p a: *pr and *len. @returns 0 or -1. */
static int ids_array(oq_pg_array_t *a, const char *const *ids, int n, const char **pr, int *len)
{
    oq_pg_array_init(a, 't');
    for (int i = 0; i < n; i++)
        oq_pg_array_add(a, ids[i] ? ids[i] : "");
    return oq_pg_array_end(a, pr, len) ? -1 : 0;
}

/* Entries of \p ids (distinct, none empty) into *out, not there yet (have = 0). */
static int ahead_keys(const char *const *ids, int n, ahead_t **out, int *nout)
{
    *nout = 0;
    if (!(*out = calloc((size_t)(n ? n : 1), sizeof **out))) return -1;
    for (int i = 0; i < n; i++) {
        if (!ids[i] || !ids[i][0] || strlen(ids[i]) >= sizeof(*out)[0].key ||
            ahead_find(*out, *nout, ids[i]))
            continue;
        ahead_t *e = &(*out)[(*nout)++];
        snprintf(e->key, sizeof e->key, "%s", ids[i]);
        e->live = 1;
    }
    return 0;
}

int oq__consumer_pg_begin_batch(oq__consumer_pg_t *p, const char *const *call_ids,
                                const char *const *message_ids, int n, oq_error_t *err)
{
    int careful = p->careful_next;
    p->careful_next = 0;
    if (careful || n <= 0) return oq__consumer_pg_begin(p, err);
    p->tx = 0;
    p->hz_held = 0;
    pend_clear(p);
    ahead_clear(p);
    int rc = ready(p, err);
    if (rc) return rc;
    oq_pg_array_t calls, msgs;
    const char *pc[1], *pm[1];
    int lc[1], lm[1];
    int bad = ids_array(&calls, call_ids, n, pc, lc) | ids_array(&msgs, message_ids, n, pm, lm);
    PGresult *r[4] = {NULL, NULL, NULL, NULL};
    if (bad || ahead_keys(call_ids, n, &p->ax, &p->nax) ||
        ahead_keys(message_ids, n, &p->ai, &p->nai) || ahead_keys(call_ids, n, &p->ae, &p->nae)) {
        rc = oom(err);
        goto out;
    }
    /* BEGIN and the batch's reads in one round trip: the horizon (behind its fence, as
     * oq__consumer_pg_horizon reads it), the executions of its calls, which of its message ids the
     * inbox holds, which of its calls have an effect. The three reads of a key array are
     * prepared, and the transaction plans without sequential scans (OQ_PG_INDEX_PLANS): the
     * generic plan a prepared statement keeps from its sixth run is then an index lookup even
     * when it was chosen while its table was small (a sequential scan otherwise, which read the
     * whole table in every batch as it grew: 3 ms a batch at 5,000 rows in `onceq-bench e2e`).
     * Sent unprepared instead, each was planned again in every batch (70 us of the server's CPU
     * for each: see docs/SCALING.md, "Plans kept"). */
    const stmt_t st[] = {
        {.sql = HORIZON_READ},
        {.sql = "SELECT " EXEC_COLS " FROM onceq.consumer_executions WHERE call_id = "
                "ANY($1::text[])",
         .n = 1,
         .pr = pc,
         .len = lc,
         .fmt = oq_pg_bin},
        {.sql = "SELECT message_id, outcome = 'dlq' FROM onceq.consumer_inbox WHERE message_id "
                "= ANY($1::text[])",
         .n = 1,
         .pr = pm,
         .len = lm,
         .fmt = oq_pg_bin},
        {.sql = "SELECT call_id FROM onceq.consumer_effects WHERE call_id = ANY($1::text[])",
         .n = 1,
         .pr = pc,
         .len = lc,
         .fmt = oq_pg_bin},
    };
    p->tx = 1;
    if ((rc = hold(p, "BEGIN", 0, NULL, 1, err)) ||
        (rc = hold(p, OQ_PG_INDEX_PLANS, 0, NULL, 1, err)) ||
        (rc = hold(p, HORIZON_FENCE, 0, NULL, 0, err)) || (rc = pipe_run(p, st, 4, r, err)))
        goto out;
    p->hz = PQntuples(r[0]) == 1 ? col_i64(r[0], 0, 0) : 0;
    p->hz_held = 1;
    for (int i = 0; i < PQntuples(r[1]); i++) {
        ahead_t *e = ahead_find(p->ax, p->nax, col_str(r[1], i, 0));
        if (!e) continue;
        if (read_exec(r[1], i, &e->x)) {
            rc = oom(err);
            goto out;
        }
        e->have = 1;
    }
    for (int i = 0; i < PQntuples(r[2]); i++) {
        ahead_t *e = ahead_find(p->ai, p->nai, col_str(r[2], i, 0));
        if (e) {
            e->have = 1;
            e->dlq = PQgetvalue(r[2], i, 1)[0] != 'f';
        }
    }
    for (int i = 0; i < PQntuples(r[3]); i++) {
        ahead_t *e = ahead_find(p->ae, p->nae, col_str(r[3], i, 0));
        if (e) e->have = 1;
    }
    p->ahead = 1;
out:
    for (int i = 0; i < 4; i++)
        PQclear(r[i]);
    oq_pg_array_free(&calls);
    oq_pg_array_free(&msgs);
    if (rc) {
        ahead_clear(p);
        oq__consumer_pg_rollback(p);
    }
    return rc;
}

int oq__consumer_pg_commit(oq__consumer_pg_t *p, oq_error_t *err)
{
    if (!p->tx) return oq_error_set(err, OQ_ESTATE, 0, "commit without a transaction");
    /* A transaction a statement aborted answers COMMIT with "ROLLBACK" and no error: refuse it,
     * so that nothing is acknowledged to Kafka that did not commit. */
    if (PQstatus(p->c) != CONNECTION_OK || PQtransactionStatus(p->c) != PQTRANS_INTRANS) {
        int rc = PQstatus(p->c) != CONNECTION_OK
                     ? oq_pg_error(p->c, NULL, err, "commit: connection lost")
                     : oq_error_set(err, OQ_EDB, 0, "commit: the transaction was aborted");
        oq__consumer_pg_rollback(p);
        return rc;
    }
    PGresult *r = NULL, *rw = NULL;
    int rc = 0;
    int wake = p->wrote_outbox;
    p->wrote_outbox = 0;
    if (p->npend || wake) { /* the held writes, COMMIT and the wake-up in one round trip */
        stmt_t st[2] = {{.sql = "COMMIT", .plain = 1},
                        {.sql = "SELECT onceq.wake()", .optional = 1}};
        PGresult *out[2] = {NULL, NULL};
        rc = pipe_run(p, st, wake ? 2 : 1, out, err);
        r = out[0];
        rw = out[1];
        if (rc) {
            oq__consumer_pg_rollback(p);
            return rc;
        }
    } else {
        p->n_rt++;
        p->n_stmt++;
        r = PQexec(p->c, "COMMIT");
    }
    int ok = r && PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r), "COMMIT") == 0;
    rc = ok ? 0 : oq_pg_error(p->c, r, err, "commit");
    if (!ok && rc == 0) rc = oq_error_set(err, OQ_EDB, 0, "commit: rolled back by the server");
    PQclear(r);
    PQclear(rw);
    p->tx = 0;
    p->hz_held = 0;
    ahead_clear(p);
    return rc;
}

void oq__consumer_pg_rollback(oq__consumer_pg_t *p)
{
    p->tx = 0;
    p->wrote_outbox = 0;
    p->hz_held = 0;
    pend_clear(p); /* never sent: nothing to undo */
    ahead_clear(p);
    if (PQstatus(p->c) == CONNECTION_OK && PQtransactionStatus(p->c) != PQTRANS_IDLE) {
        p->n_rt++;
        p->n_stmt++;
        PQclear(PQexec(p->c, "ROLLBACK"));
    }
}

/* --- executions ------------------------------------------------------------------------------ */

static int read_exec(PGresult *r, int i, oq__exec_row_t *x)
{
    memset(x, 0, sizeof *x);
    col_copy(r, i, 0, x->call_id, sizeof x->call_id);
    x->tenant = col_dup(r, i, 1);
    x->idem_key = col_dup(r, i, 2);
    col_copy(r, i, 3, x->fingerprint, sizeof x->fingerprint);
    x->tool = col_dup(r, i, 4);
    x->args = col_dup(r, i, 5);
    x->state = oq__xstate_parse(col_str(r, i, 6));
    x->attempt = col_i64(r, i, 7);
    x->tries = col_i64(r, i, 8);
    x->lease_owner = col_dup(r, i, 9);
    x->lease_until = col_i64(r, i, 10);
    x->fence = col_i64(r, i, 11);
    x->result = col_dup(r, i, 12);
    x->error = col_dup(r, i, 13);
    x->effect_id = col_dup(r, i, 14);
    x->next_attempt_at = col_i64(r, i, 15);
    col_copy(r, i, 16, x->message_id, sizeof x->message_id);
    x->started_at = col_i64(r, i, 17);
    x->unknown_at = col_i64(r, i, 18);
    x->lookups = col_i64(r, i, 19);
    x->updated_at = col_i64(r, i, 20);
    if (!x->tenant || !x->idem_key || !x->tool || !x->args) {
        oq__exec_row_clear(x);
        return OQ_ENOMEM;
    }
    return 0;
}

/* A deep copy of \p a into \p b; -1 when out of memory (b cleared). */
static int exec_copy(const oq__exec_row_t *a, oq__exec_row_t *b)
{
    *b = *a;
    char **f[] = {&b->tenant,      &b->idem_key, &b->tool,  &b->args,
                  &b->lease_owner, &b->result,   &b->error, &b->effect_id};
    int bad = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (*f[i] && !(*f[i] = strdup(*f[i]))) bad = 1;
    if (bad) oq__exec_row_clear(b); /* a failed copy is NULL, the others are b's own */
    return bad ? -1 : 0;
}

int oq__consumer_pg_exec_get(oq__consumer_pg_t *p, const char *call_id, oq__exec_row_t *out,
                             oq_error_t *err)
{
    const char *pr[] = {call_id};
    PGresult *r = NULL;
    ahead_t *e = p->ahead ? ahead_find(p->ax, p->nax, call_id) : NULL;
    if (e) { /* read ahead by the batch, not written since */
        oq__exec_row_clear(out);
        if (!e->have) return oq_error_set(err, OQ_ENOTFOUND, 0, "no execution %s", call_id);
        return exec_copy(&e->x, out) ? oom(err) : 0;
    }
    int rc = q(p, "SELECT " EXEC_COLS " FROM onceq.consumer_executions WHERE call_id = $1", 1, pr,
               &r, err);
    if (rc) return rc;
    oq__exec_row_clear(out);
    if (PQntuples(r) == 0)
        rc = oq_error_set(err, OQ_ENOTFOUND, 0, "no execution %s", call_id);
    else if (read_exec(r, 0, out))
        rc = oom(err);
    PQclear(r);
    return rc;
}

int oq__consumer_pg_exec_insert(oq__consumer_pg_t *p, const oq__exec_row_t *x, int64_t now,
                                oq_error_t *err)
{
    num_t at, tr, fe, lu, na, nw, sa, ua, lk;
    const char *pr[] = {x->call_id,
                        x->tenant,
                        x->idem_key,
                        x->fingerprint,
                        x->tool,
                        x->args,
                        oq__xstate_name(x->state),
                        num(&at, x->attempt),
                        num(&tr, x->tries),
                        num(&fe, x->fence),
                        x->lease_owner,
                        tnum(&lu, x->lease_until),
                        x->result,
                        x->error,
                        x->effect_id,
                        tnum(&na, x->next_attempt_at),
                        x->message_id,
                        num(&nw, now),
                        tnum(&sa, x->started_at),
                        tnum(&ua, x->unknown_at),
                        num(&lk, x->lookups)};
    static const char sql[] =
        "INSERT INTO onceq.consumer_executions(call_id, tenant, idem_key, fingerprint, "
        "tool, args, state, attempt, tries, fence, lease_owner, lease_until, result, "
        "error, effect_id, next_attempt_at, message_id, created_at, updated_at, "
        "started_at, unknown_at, lookups) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, "
        "$10, $11, $12, $13, $14, $15, $16, $17, $18, $18, $19, $20, $21)";
    static const char rows[] =
        "INSERT INTO onceq.consumer_executions(call_id, tenant, idem_key, fingerprint, "
        "tool, args, state, attempt, tries, fence, lease_owner, lease_until, result, "
        "error, effect_id, next_attempt_at, message_id, created_at, updated_at, "
        "started_at, unknown_at, lookups) SELECT c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, "
        "c12, c13, c14, c15, c16, c17, c18, c18, c19, c20, c21 FROM unnest($1::text[], "
        "$2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[], "
        "$9::bigint[], $10::bigint[], $11::text[], $12::bigint[], $13::text[], $14::text[], "
        "$15::text[], $16::bigint[], $17::text[], $18::bigint[], $19::bigint[], $20::bigint[], "
        "$21::bigint[]) AS u(c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, "
        "c16, c17, c18, c19, c20, c21)";
    if (p->ahead) { /* a second row of the call fails at the send: the batch is retried */
        ahead_drop(p->ax, p->nax, x->call_id);
        return hold_as(p, sql, rows, "tttttttbbbtbtttbtbbbb", 21, pr, 0, err);
    }
    return cmd(p, sql, 21, pr, NULL, err);
}

int oq__consumer_pg_exec_update(oq__consumer_pg_t *p, const oq__exec_update_t *u, int *updated,
                                oq_error_t *err)
{
    num_t ff, at, tr, fe, lu, na, nw, sa, ua, lk;
    const char *pr[] = {u->call_id,
                        oq__xstate_name(u->from_state),
                        num(&ff, u->from_fence),
                        u->from_owner,
                        oq__xstate_name(u->state),
                        num(&at, u->attempt),
                        num(&tr, u->tries),
                        num(&fe, u->fence),
                        u->lease_owner,
                        tnum(&lu, u->lease_until),
                        u->result,
                        u->error,
                        u->effect_id,
                        tnum(&na, u->next_attempt_at),
                        u->message_id,
                        num(&nw, u->now),
                        tnum(&sa, u->started_at),
                        tnum(&ua, u->unknown_at),
                        num(&lk, u->lookups)};
    int64_t n = 0;
    *updated = 0;
    ahead_drop(p->ax, p->nax, u->call_id);
    int rc = cmd(p,
                 "UPDATE onceq.consumer_executions SET state = $5, attempt = $6, tries = $7, "
                 "fence = $8, lease_owner = $9, lease_until = $10, result = $11, error = $12, "
                 "effect_id = $13, next_attempt_at = $14, message_id = coalesce($15, message_id), "
                 "updated_at = $16, started_at = $17, unknown_at = $18, lookups = $19 "
                 "WHERE call_id = $1 AND state = $2 AND fence = $3 AND ($4::text IS NULL OR "
                 "lease_owner = $4)",
                 19, pr, &n, err);
    *updated = rc == 0 && n == 1;
    return rc;
}

int oq__consumer_pg_exec_set_result(oq__consumer_pg_t *p, const char *call_id, const char *result,
                                    const char *effect_id, oq_error_t *err)
{
    const char *pr[] = {call_id, result, effect_id};
    ahead_drop(p->ax, p->nax, call_id);
    return cmd(
        p, "UPDATE onceq.consumer_executions SET result = $2, effect_id = $3 WHERE call_id = $1", 3,
        pr, NULL, err);
}

int oq__consumer_pg_lease_renew(oq__consumer_pg_t *p, const char *call_id, int64_t fence,
                                int64_t lease_until, oq_error_t *err)
{
    num_t f, l;
    const char *pr[] = {call_id, num(&f, fence), num(&l, lease_until), p->worker};
    int64_t n = 0;
    ahead_drop(p->ax, p->nax, call_id);
    int rc = cmd(p,
                 "UPDATE onceq.consumer_executions SET lease_until = $3 WHERE call_id = $1 AND "
                 "state IN ('STARTED', 'RECONCILING') AND fence = $2 AND lease_owner = $4",
                 4, pr, &n, err);
    if (rc == 0 && n == 0)
        rc = oq_error_set(err, OQ_EFENCED, 0, "lease on %s (fence %" PRId64 ") lost", call_id,
                          fence);
    return rc;
}

static int read_execs(oq__consumer_pg_t *p, const char *sql, int np, const char *const *pr,
                      oq__exec_row_t *rows, int cap, int *n, oq_error_t *err)
{
    PGresult *r = NULL;
    *n = 0;
    int rc = q(p, sql, np, pr, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r) && *n < cap; i++) {
        if (read_exec(r, i, &rows[*n])) {
            for (int k = 0; k < *n; k++)
                oq__exec_row_clear(&rows[k]);
            *n = 0;
            rc = oom(err);
            break;
        }
        (*n)++;
    }
    PQclear(r);
    return rc;
}

int oq__consumer_pg_exec_lapsed(oq__consumer_pg_t *p, int64_t now, oq__exec_row_t *rows, int cap,
                                int *n, oq_error_t *err)
{
    num_t c, t;
    const char *pr[] = {num(&c, cap), num(&t, now)};
    /* lapsed on the worker's clock (the server's, carried) AND on the server's own */
    return read_execs(p,
                      "SELECT " EXEC_COLS " FROM onceq.consumer_executions WHERE state IN "
                      "('STARTED', 'RECONCILING') AND lease_until < LEAST($2::bigint, " SRV_NOW
                      ") LIMIT $1",
                      2, pr, rows, cap, n, err);
}

int oq__consumer_pg_exec_in_state(oq__consumer_pg_t *p, int state, oq__exec_row_t *rows, int cap,
                                  int *n, oq_error_t *err)
{
    num_t c;
    const char *pr[] = {oq__xstate_name(state), num(&c, cap)};
    return read_execs(p,
                      "SELECT " EXEC_COLS " FROM onceq.consumer_executions WHERE state = $1 "
                      "ORDER BY updated_at LIMIT $2",
                      2, pr, rows, cap, n, err);
}

int oq__consumer_pg_exec_held_by(oq__consumer_pg_t *p, const char *owner, oq__exec_row_t *rows,
                                 int cap, int *n, oq_error_t *err)
{
    num_t c;
    const char *pr[] = {owner, num(&c, cap)};
    return read_execs(p,
                      "SELECT " EXEC_COLS " FROM onceq.consumer_executions WHERE state IN "
                      "('STARTED', 'RECONCILING') AND lease_owner = $1 LIMIT $2",
                      2, pr, rows, cap, n, err);
}

int oq__consumer_pg_exec_unknown_due(oq__consumer_pg_t *p, int64_t now, oq__exec_row_t *rows,
                                     int cap, int *n, oq_error_t *err)
{
    num_t t, c;
    const char *pr[] = {num(&t, now), num(&c, cap)};
    return read_execs(p,
                      "SELECT " EXEC_COLS " FROM onceq.consumer_executions WHERE state = 'UNKNOWN' "
                      "AND coalesce(next_attempt_at, 0) <= $1 ORDER BY updated_at LIMIT $2",
                      2, pr, rows, cap, n, err);
}

int oq__consumer_pg_unsettled(oq__consumer_pg_t *p, oq__unsettled_t *out, oq_error_t *err)
{
    PGresult *r = NULL;
    memset(out, 0, sizeof *out);
    int rc = q(p,
               "SELECT state, count(*), min(coalesce(unknown_at, updated_at)) FROM "
               "onceq.consumer_executions WHERE state IN ('UNKNOWN', 'RECONCILING', "
               "'NEEDS_REVIEW') GROUP BY state",
               0, NULL, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        int k = oq__xstate_parse(col_str(r, i, 0));
        int64_t count = col_i64(r, i, 1), oldest = col_i64(r, i, 2);
        if (k == OQ_X_NEEDS_REVIEW) {
            out->review = count;
            out->review_oldest = oldest;
        } else if (k == OQ_X_UNKNOWN || k == OQ_X_RECONCILING) {
            out->unknown += count;
            if (!out->unknown_oldest || oldest < out->unknown_oldest) out->unknown_oldest = oldest;
        }
    }
    PQclear(r);
    return 0;
}

int oq__consumer_pg_recovery_pending(oq__consumer_pg_t *p, int64_t now)
{
    num_t t;
    const char *pr[] = {num(&t, now)};
    PGresult *r = NULL;
    if (q(p,
          "SELECT EXISTS (SELECT 1 FROM onceq.consumer_executions WHERE state IN ('STARTED', "
          "'RECONCILING') AND lease_until < LEAST($1::bigint, " SRV_NOW
          ")) OR EXISTS (SELECT 1 FROM "
          "onceq.consumer_executions WHERE state = 'UNKNOWN' AND coalesce(next_attempt_at, 0) "
          "<= $1)",
          1, pr, &r, NULL))
        return 1;
    int v = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return v;
}

int oq__consumer_pg_due(oq__consumer_pg_t *p, int64_t now, int limit,
                        void (*cb)(const oq__due_row_t *row, void *opaque), void *opaque,
                        oq_error_t *err)
{
    num_t t, l;
    const char *pr[] = {num(&t, now), num(&l, limit)};
    PGresult *r = NULL;
    int rc = q(p,
               "SELECT call_id, tool, args FROM onceq.consumer_executions WHERE next_attempt_at "
               "<= $1 AND state IN ('PLANNED', 'FAILED_RETRYABLE', 'SAFE_RETRY') ORDER BY "
               "next_attempt_at LIMIT $2",
               2, pr, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        oq__due_row_t d = {
            .call_id = col_str(r, i, 0), .tool = col_str(r, i, 1), .args = col_str(r, i, 2)};
        cb(&d, opaque);
    }
    PQclear(r);
    return 0;
}

int64_t oq__consumer_pg_next_due(oq__consumer_pg_t *p)
{
    PGresult *r = NULL;
    int64_t v = INT64_MAX;
    if (q(p,
          "SELECT min(next_attempt_at) FROM onceq.consumer_executions WHERE next_attempt_at "
          "IS NOT NULL",
          0, NULL, &r, NULL))
        return v;
    if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) v = col_i64(r, 0, 0);
    PQclear(r);
    return v;
}

int oq__consumer_pg_state_counts(oq__consumer_pg_t *p, int64_t counts[OQ_X__COUNT], oq_error_t *err)
{
    PGresult *r = NULL;
    for (int i = 0; i < OQ_X__COUNT; i++)
        counts[i] = 0;
    int rc = q(p, "SELECT state, count(*) FROM onceq.consumer_executions GROUP BY state", 0, NULL,
               &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        int k = oq__xstate_parse(col_str(r, i, 0));
        if (k >= 0) counts[k] = col_i64(r, i, 1);
    }
    PQclear(r);
    return 0;
}

/* --- inbox ----------------------------------------------------------------------------------- */

int oq__consumer_pg_inbox_upsert(oq__consumer_pg_t *p, const oq__inbox_row_t *row, int64_t *seen,
                                 oq_error_t *err)
{
    num_t pa, of, at;
    const char *pr[] = {row->message_id,
                        row->call_id,
                        row->src.topic ? row->src.topic : "",
                        num(&pa, row->src.partition),
                        num(&of, row->src.offset),
                        num(&at, row->received_at),
                        row->outcome};
    PGresult *r = NULL;
    ahead_t *e = p->ahead ? ahead_find(p->ai, p->nai, row->message_id) : NULL;
    if (e && !e->have) {
        /* not in the inbox when the batch read ahead: its row, held behind; the id taken
         * meanwhile fails the plain INSERT at the send, and the batch is retried */
        e->live = 0;
        *seen = 1;
        return hold_as(p,
                       "INSERT INTO onceq.consumer_inbox(message_id, call_id, topic, partition, "
                       "\"offset\", received_at, outcome) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                       "INSERT INTO onceq.consumer_inbox(message_id, call_id, topic, partition, "
                       "\"offset\", received_at, outcome) SELECT * FROM unnest($1::text[], "
                       "$2::text[], $3::text[], $4::integer[], $5::bigint[], $6::bigint[], "
                       "$7::text[])",
                       "tttibbt", 7, pr, 0, err);
    }
    /* a row read ahead stays as read but for its count (only retake changes an outcome) */
    /* one statement: a new id gets its row (seen 1), a known one is counted */
    int rc = q(p,
               "INSERT INTO onceq.consumer_inbox AS i (message_id, call_id, topic, partition, "
               "\"offset\", received_at, outcome) VALUES ($1, $2, $3, $4, $5, $6, $7) ON "
               "CONFLICT (message_id) DO UPDATE SET seen = i.seen + 1 RETURNING seen",
               7, pr, &r, err);
    if (rc) return rc;
    *seen = PQntuples(r) == 1 ? col_i64(r, 0, 0) : 2;
    PQclear(r);
    return 0;
}

int oq__consumer_pg_inbox_retake(oq__consumer_pg_t *p, const oq__inbox_row_t *row, int *taken,
                                 oq_error_t *err)
{
    num_t pa, of, at;
    const char *pr[] = {row->message_id,
                        row->call_id,
                        row->src.topic ? row->src.topic : "",
                        num(&pa, row->src.partition),
                        num(&of, row->src.offset),
                        num(&at, row->received_at),
                        row->outcome};
    int64_t n = 0;
    *taken = 0;
    ahead_t *e = p->ahead ? ahead_find(p->ai, p->nai, row->message_id) : NULL;
    if (e && e->have && !e->dlq) return 0; /* read ahead, not dead-lettered: none is ever made so */
    ahead_drop(p->ai, p->nai, row->message_id);
    int rc = cmd(p,
                 "UPDATE onceq.consumer_inbox SET call_id = $2, topic = $3, partition = $4, "
                 "\"offset\" = $5, received_at = $6, outcome = $7 WHERE message_id = $1 AND "
                 "outcome = 'dlq'",
                 7, pr, &n, err);
    if (rc == 0) *taken = n == 1;
    return rc;
}

/* --- effects and audit ----------------------------------------------------------------------- */

int oq__consumer_pg_effect_insert(oq__consumer_pg_t *p, const oq__effect_row_t *e, int *inserted,
                                  oq_error_t *err)
{
    num_t am, at, fe, ca;
    const char *pr[] = {e->effect_id,
                        e->call_id,
                        e->tool ? e->tool : "",
                        e->amount ? num(&am, e->amount) : NULL,
                        e->recipient && e->recipient[0] ? e->recipient : NULL,
                        e->detail,
                        num(&at, e->attempt),
                        num(&fe, e->fence),
                        p->worker,
                        num(&ca, e->created_at),
                        e->downstream_id && e->downstream_id[0] ? e->downstream_id : NULL};
    int64_t n = 0;
    *inserted = 0;
    ahead_t *a = p->ahead ? ahead_find(p->ae, p->nae, e->call_id) : NULL;
    if (a && !a->have) {
        /* the call had no effect when the batch read ahead: held behind, as a plain INSERT
         * (an effect written meanwhile fails it at the send: the batch is retried) */
        a->live = 0;
        *inserted = 1;
        return hold_as(p,
                       "INSERT INTO onceq.consumer_effects(effect_id, call_id, tool, amount, "
                       "recipient, detail, attempt, fence, worker, created_at, downstream_id) "
                       "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                       "INSERT INTO onceq.consumer_effects(effect_id, call_id, tool, amount, "
                       "recipient, detail, attempt, fence, worker, created_at, downstream_id) "
                       "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], "
                       "$5::text[], $6::text[], $7::bigint[], $8::bigint[], $9::text[], "
                       "$10::bigint[], $11::text[])",
                       "tttbttbbtbt", 11, pr, 0, err);
    }
    ahead_drop(p->ae, p->nae, e->call_id);
    int rc = cmd(p,
                 "INSERT INTO onceq.consumer_effects(effect_id, call_id, tool, amount, recipient, "
                 "detail, attempt, fence, worker, created_at, downstream_id) VALUES ($1, $2, $3, "
                 "$4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
                 11, pr, &n, err);
    *inserted = rc == 0 && n == 1;
    return rc;
}

int oq__consumer_pg_effect_get(oq__consumer_pg_t *p, const char *call_id, int *found,
                               char **effect_id, char **detail, oq_error_t *err)
{
    const char *pr[] = {call_id};
    PGresult *r = NULL;
    *found = 0;
    int rc = q(p, "SELECT effect_id, detail FROM onceq.consumer_effects WHERE call_id = $1", 1, pr,
               &r, err);
    if (rc) return rc;
    if (PQntuples(r) == 1) {
        *found = 1;
        if (effect_id) *effect_id = col_dup(r, 0, 0);
        if (detail) *detail = col_dup(r, 0, 1);
    }
    PQclear(r);
    return 0;
}

int oq__consumer_pg_effect_read(oq__consumer_pg_t *p, const char *call_id, int *found,
                                oq__effect_read_t *out, oq_error_t *err)
{
    const char *pr[] = {call_id};
    PGresult *r = NULL;
    *found = 0;
    memset(out, 0, sizeof *out);
    int rc = q(p,
               "SELECT effect_id, detail, downstream_id, created_at, worker FROM "
               "onceq.consumer_effects WHERE call_id = $1",
               1, pr, &r, err);
    if (rc) return rc;
    if (PQntuples(r) == 1) {
        *found = 1;
        out->effect_id = col_dup(r, 0, 0);
        out->detail = col_dup(r, 0, 1);
        out->downstream_id = col_dup(r, 0, 2);
        out->created_at = col_i64(r, 0, 3);
        out->worker = col_dup(r, 0, 4);
    }
    PQclear(r);
    return 0;
}

int64_t oq__consumer_pg_effect_count(oq__consumer_pg_t *p, const char *call_id)
{
    const char *pr[] = {call_id};
    PGresult *r = NULL;
    int rc = call_id ? q(p, "SELECT count(*) FROM onceq.consumer_effects WHERE call_id = $1", 1, pr,
                         &r, NULL)
                     : q(p, "SELECT count(*) FROM onceq.consumer_effects", 0, NULL, &r, NULL);
    if (rc) return OQ_EDB;
    int64_t v = col_i64(r, 0, 0);
    PQclear(r);
    return v;
}

int oq__consumer_pg_audit_add(oq__consumer_pg_t *p, const oq__audit_row_t *a, oq_error_t *err)
{
    num_t ts, at, fe;
    const char *pr[] = {num(&ts, a->ts),    a->call_id, a->event, num(&at, a->attempt),
                        num(&fe, a->fence), p->worker,  a->detail};
    static const char sql[] = "INSERT INTO onceq.consumer_audit(ts, call_id, event, attempt, "
                              "fence, worker, detail) VALUES ($1, $2, $3, $4, $5, $6, $7)";
    static const char rows[] =
        "INSERT INTO onceq.consumer_audit(ts, call_id, event, attempt, fence, worker, detail) "
        "SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], "
        "$6::text[], $7::text[])";
    if (p->ahead) return hold_as(p, sql, rows, "bttbbtt", 7, pr, 0, err);
    return cmd(p, sql, 7, pr, NULL, err);
}

int oq__consumer_pg_audit_list(oq__consumer_pg_t *p, const char *call_id,
                               void (*cb)(const oq__audit_read_t *row, void *opaque), void *opaque,
                               oq_error_t *err)
{
    const char *pr[] = {call_id};
    PGresult *r = NULL;
    int rc = q(p,
               "SELECT id, ts, event, attempt, fence, worker, detail FROM onceq.consumer_audit "
               "WHERE call_id = $1 ORDER BY id",
               1, pr, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        oq__audit_read_t a = {.id = col_i64(r, i, 0),
                              .ts = col_i64(r, i, 1),
                              .event = col_str(r, i, 2),
                              .attempt = col_i64(r, i, 3),
                              .fence = col_i64(r, i, 4),
                              .worker = col_str(r, i, 5),
                              .detail = col_str(r, i, 6)};
        cb(&a, opaque);
    }
    PQclear(r);
    return 0;
}

int oq__consumer_pg_unknown_story(oq__consumer_pg_t *p,
                                  void (*cb)(const oq__call_event_t *row, void *opaque),
                                  void *opaque, oq_error_t *err)
{
    PGresult *r = NULL;
    int rc = q(p,
               "SELECT call_id, event, ts FROM onceq.consumer_audit WHERE event IN ('unknown', "
               "'needs_review', 'committed', 'failed_final') AND call_id IN (SELECT call_id FROM "
               "onceq.consumer_executions WHERE unknown_at IS NOT NULL) ORDER BY call_id, id",
               0, NULL, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        oq__call_event_t e = {
            .call_id = col_str(r, i, 0), .event = col_str(r, i, 1), .ts = col_i64(r, i, 2)};
        cb(&e, opaque);
    }
    PQclear(r);
    return 0;
}

/* --- outbox (onceq.outbox, published by relay/store_pg.c) ------------------------------------ */

static char *dupn(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* \p may_hold: a first emit in a batch, held behind (a republish asks statement by statement:
 * its row may be there). */
static int outbox_append(oq__consumer_pg_t *p, const oq_outbox_row_t *row, int may_hold,
                         oq_error_t *err)
{
    num_t at;
    char *pl = dupn(row->payload, row->payload_len);
    if (!pl) return oom(err);
    const char *pr[] = {row->message_id, row->topic, row->key, pl, num(&at, row->created_at)};
    int64_t n = 0;
    p->wrote_outbox = 1;
    if (p->ahead && may_hold) {
        /* held behind as a plain INSERT: a result id that is there already (a rare re-emit
         * of the same state) fails it at the send, and the batch is retried statement by
         * statement, where this append answers OQ_EEXIST as below */
        int rc = hold_as(p,
                         "INSERT INTO onceq.outbox(message_id, topic, key, payload, created_at) "
                         "VALUES ($1, $2, $3, $4, $5)",
                         "INSERT INTO onceq.outbox(message_id, topic, key, payload, created_at) "
                         "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], "
                         "$5::bigint[])",
                         "ttttb", 5, pr, 0, err);
        free(pl);
        return rc;
    }
    /* ON CONFLICT: a taken message id must not abort the caller's transaction */
    int rc = cmd(p,
                 "INSERT INTO onceq.outbox(message_id, topic, key, payload, created_at) VALUES "
                 "($1, $2, $3, $4, $5) ON CONFLICT (message_id) DO NOTHING",
                 5, pr, &n, err);
    free(pl);
    if (rc == 0 && n == 0)
        return oq_error_set(err, OQ_EEXIST, 0, "outbox append: message id %.40s exists",
                            row->message_id);
    return rc;
}

int oq__consumer_pg_outbox_append(oq__consumer_pg_t *p, const oq_outbox_row_t *row, oq_error_t *err)
{
    return outbox_append(p, row, 1, err);
}

int oq__consumer_pg_outbox_republish(oq__consumer_pg_t *p, const oq_outbox_row_t *row,
                                     oq_outbox_republish_t *what, oq_error_t *err)
{
    const char *pr[] = {row->message_id};
    int64_t n = 0;
    p->wrote_outbox = 1; /* a row requeued or appended: the relay is woken at the commit */
    /* delivered: numbered again by the relay's next assign, above its watermark */
    int rc = cmd(
        p, "UPDATE onceq.outbox SET pub_seq = NULL WHERE message_id = $1 AND pub_seq <= " WATERMARK,
        1, pr, &n, err);
    if (rc) return rc;
    if (n > 0) {
        *what = OQ_OUTBOX_REQUEUED;
        return 0;
    }
    rc = outbox_append(p, row, 0, err);
    if (rc == 0) {
        *what = OQ_OUTBOX_APPENDED;
    } else if (rc == OQ_EEXIST) {
        if (err) memset(err, 0, sizeof *err);
        *what = OQ_OUTBOX_PENDING; /* not delivered yet: the relay will publish it */
        rc = 0;
    }
    return rc;
}

int oq__consumer_pg_purge_outbox(oq__consumer_pg_t *p, int64_t before, int limit,
                                 int64_t *n_deleted, oq_error_t *err)
{
    num_t b, l;
    const char *pr[] = {num(&b, before), num(&l, limit), OQ_TOPIC_RESULTS};
    int64_t n = 0;
    /* the consumer's rows only (the producer purges its own) */
    int rc = cmd(p,
                 "DELETE FROM onceq.outbox WHERE seq IN (SELECT seq FROM onceq.outbox WHERE "
                 "pub_seq <= " WATERMARK " AND topic = $3 AND created_at < $1 ORDER BY pub_seq "
                 "LIMIT $2)",
                 3, pr, &n, err);
    if (n_deleted) *n_deleted = rc ? 0 : n;
    return rc;
}

/* --- dead letters ---------------------------------------------------------------------------- */

static char *hex(const void *b, size_t n)
{
    static const char d[] = "0123456789abcdef";
    char *h = malloc(2 * n + 1);
    if (!h) return NULL;
    for (size_t i = 0; i < n; i++) {
        h[2 * i] = d[((const unsigned char *)b)[i] >> 4];
        h[2 * i + 1] = d[((const unsigned char *)b)[i] & 15];
    }
    h[2 * n] = '\0';
    return h;
}

static int unhex_in_place(char *h, size_t *n)
{
    size_t l = strlen(h);
    for (size_t i = 0; 2 * i + 1 < l; i++) {
        unsigned v = 0;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) return -1;
        h[i] = (char)v;
    }
    *n = l / 2;
    return 0;
}

int oq__consumer_pg_dlq_insert(oq__consumer_pg_t *p, const oq__dlq_row_t *r, oq_error_t *err)
{
    num_t pa, of, at;
    char *k = r->key ? hex(r->key, r->key_len) : NULL;
    char *v = hex(r->payload ? r->payload : "", r->payload ? r->len : 0);
    if ((r->key && !k) || !v) {
        free(k);
        free(v);
        return oom(err);
    }
    const char *pr[] = {r->message_id,
                        r->src.topic ? r->src.topic : "",
                        num(&pa, r->src.partition),
                        num(&of, r->src.offset),
                        k,
                        v,
                        r->reason,
                        num(&at, r->created_at),
                        r->code ? r->code : "invalid_envelope",
                        r->redrive};
    int rc = cmd(p,
                 "INSERT INTO onceq.consumer_dlq(message_id, topic, partition, \"offset\", "
                 "msg_key, payload, reason, created_at, code, redrive) VALUES ($1, $2, $3, $4, "
                 "decode($5, 'hex'), decode($6, 'hex'), $7, $8, $9, $10)",
                 10, pr, NULL, err);
    free(k);
    free(v);
    return rc;
}

int oq__consumer_pg_dlq_pending(oq__consumer_pg_t *p, int limit,
                                void (*cb)(const oq__dlq_row_t *row, void *opaque), void *opaque,
                                oq_error_t *err)
{
    num_t l;
    const char *pr[] = {num(&l, limit)};
    PGresult *r = NULL;
    int rc = q(p,
               "SELECT id, message_id, reason, encode(msg_key, 'hex'), encode(payload, 'hex'), "
               "code, topic, partition, \"offset\", redrive FROM onceq.consumer_dlq WHERE "
               "published_at IS NULL ORDER BY id LIMIT $1",
               1, pr, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        oq__dlq_row_t d;
        memset(&d, 0, sizeof d);
        d.id = col_i64(r, i, 0);
        d.message_id = col_str(r, i, 1);
        d.reason = col_str(r, i, 2);
        char *k = PQgetisnull(r, i, 3) ? NULL : PQgetvalue(r, i, 3);
        char *v = PQgetisnull(r, i, 4) ? NULL : PQgetvalue(r, i, 4);
        /* decoded in place: the result's text is ours until PQclear */
        if (k && unhex_in_place(k, &d.key_len) == 0) d.key = k;
        if (v && unhex_in_place(v, &d.len) == 0) d.payload = v;
        d.code = col_str(r, i, 5);
        d.src.topic = col_str(r, i, 6);
        d.src.partition = (int32_t)col_i64(r, i, 7);
        d.src.offset = col_i64(r, i, 8);
        d.redrive = col_str(r, i, 9);
        cb(&d, opaque);
    }
    PQclear(r);
    return 0;
}

int oq__consumer_pg_dlq_mark(oq__consumer_pg_t *p, int64_t id, int64_t now, oq_error_t *err)
{
    num_t a, b;
    const char *pr[] = {num(&a, id), num(&b, now)};
    return cmd(p, "UPDATE onceq.consumer_dlq SET published_at = $2 WHERE id = $1", 2, pr, NULL,
               err);
}

/* --- retention ------------------------------------------------------------------------------- */

int oq__consumer_pg_purge(oq__consumer_pg_t *p, int64_t before, int limit, int64_t *n_deleted,
                          oq_error_t *err)
{
    num_t b, l;
    const char *pr[] = {num(&b, before), num(&l, limit)};
    int64_t a = 0, d = 0;
    if (n_deleted) *n_deleted = 0;
    int rc = cmd(p,
                 "DELETE FROM onceq.consumer_inbox WHERE message_id IN (SELECT message_id FROM "
                 "onceq.consumer_inbox WHERE received_at < $1 LIMIT $2)",
                 2, pr, &a, err);
    if (rc) return rc;
    rc = cmd(p,
             "DELETE FROM onceq.consumer_dlq WHERE id IN (SELECT id FROM onceq.consumer_dlq "
             "WHERE published_at IS NOT NULL AND created_at < $1 LIMIT $2)",
             2, pr, &d, err);
    if (rc) return rc;
    if (n_deleted) *n_deleted = a + d;
    return 0;
}

int oq__consumer_pg_horizon(oq__consumer_pg_t *p, int64_t *horizon, oq_error_t *err)
{
    /* Read once per transaction: behind the fence it cannot change before the transaction
     * ends (a purge raising it waits; this store raises it only in a purge's own transaction),
     * so a batch's every intake after the first reads the same value without a round trip. */
    if (p->hz_held && in_tx(p)) {
        *horizon = p->hz;
        return 0;
    }
    PGresult *r = NULL;
    /* Inside a transaction the fence first, in a statement of its own (held: it goes in the
     * read's round trip): a purge raising the horizon waits for this reader, and this read sees
     * a purge it waited for (file comment) */
    int rc = in_tx(p) ? hold(p, HORIZON_FENCE, 0, NULL, 0, err) : 0;
    if (!rc) rc = q(p, HORIZON_READ, 0, NULL, &r, err);
    if (rc) return rc;
    *horizon = PQntuples(r) == 1 ? col_i64(r, 0, 0) : 0;
    PQclear(r);
    if (in_tx(p)) {
        p->hz = *horizon;
        p->hz_held = 1;
    }
    return 0;
}

int oq__consumer_pg_purge_bounds(oq__consumer_pg_t *p, int64_t before, int64_t *max_rowid,
                                 int64_t *max_audit_id, oq_error_t *err)
{
    num_t b;
    const char *pr[] = {num(&b, before)};
    PGresult *r = NULL;
    int rc = q(p,
               "SELECT coalesce((SELECT id FROM onceq.consumer_executions WHERE created_at >= $1 "
               "ORDER BY id LIMIT 1) - 1, (SELECT coalesce(max(id), 0) FROM "
               "onceq.consumer_executions)), coalesce((SELECT id FROM onceq.consumer_audit WHERE "
               "ts >= $1 ORDER BY id LIMIT 1) - 1, (SELECT coalesce(max(id), 0) FROM "
               "onceq.consumer_audit))",
               1, pr, &r, err);
    if (rc) return rc;
    *max_rowid = col_i64(r, 0, 0);
    *max_audit_id = col_i64(r, 0, 1);
    PQclear(r);
    return 0;
}

int oq__consumer_pg_purge_settled(oq__consumer_pg_t *p, const oq__purge_batch_t *b, int64_t *last,
                                  int64_t *n_exec, int64_t *n_eff, oq_error_t *err)
{
    num_t h, a, u, be, l;
    const char *ph[] = {num(&h, b->horizon)};
    *n_exec = *n_eff = 0;
    *last = b->after;
    p->hz_held = 0; /* raised here: read again */
    ahead_clear(p); /* rows deleted: nothing read ahead holds */
    /* the horizon first, behind its fence (taken exclusive: waits for the intakes that read
     * the old value, holds the later ones until this commits): nothing settled after it is
     * deleted, no message older is executed */
    int rc = cmd(p, "SELECT pg_advisory_xact_lock(" HORIZON_KEY ")", 0, NULL, NULL, err);
    if (!rc)
        rc = cmd(p,
                 "UPDATE onceq.consumer_retention SET horizon = GREATEST(horizon, $1) WHERE name "
                 "= 'executions'",
                 1, ph, NULL, err);
    if (rc) return rc;
    const char *pr[] = {num(&a, b->after), num(&u, b->upto), num(&be, b->before),
                        num(&l, b->limit)};
    PGresult *r = NULL;
    rc = q(p,
           "WITH x AS (SELECT id, call_id FROM onceq.consumer_executions WHERE id > $1 AND id <= "
           "$2 AND state IN ('COMMITTED', 'FAILED_FINAL') AND updated_at < $3 ORDER BY id LIMIT "
           "$4 FOR UPDATE), e AS (DELETE FROM onceq.consumer_effects WHERE call_id IN (SELECT "
           "call_id FROM x) RETURNING 1), d AS (DELETE FROM onceq.consumer_executions WHERE id "
           "IN (SELECT id FROM x) RETURNING id) SELECT (SELECT count(*) FROM d), (SELECT "
           "coalesce(max(id), 0) FROM x), (SELECT count(*) FROM e)",
           4, pr, &r, err);
    if (rc) return rc;
    *n_exec = col_i64(r, 0, 0);
    if (*n_exec) *last = col_i64(r, 0, 1);
    *n_eff = col_i64(r, 0, 2);
    PQclear(r);
    return 0;
}

int oq__consumer_pg_purge_audit(oq__consumer_pg_t *p, const oq__purge_batch_t *b, int64_t *last,
                                int64_t *n_deleted, oq_error_t *err)
{
    num_t a, u, be, l;
    const char *pr[] = {num(&a, b->after), num(&u, b->upto), num(&be, b->before),
                        num(&l, b->limit)};
    PGresult *r = NULL;
    *n_deleted = 0;
    *last = b->after;
    int rc = q(p,
               "WITH x AS (SELECT id FROM onceq.consumer_audit a WHERE id > $1 AND id <= $2 AND "
               "ts < $3 AND (a.call_id IS NULL OR NOT EXISTS (SELECT 1 FROM "
               "onceq.consumer_executions e WHERE e.call_id = a.call_id)) ORDER BY id LIMIT $4), "
               "d AS (DELETE FROM onceq.consumer_audit WHERE id IN (SELECT id FROM x) RETURNING "
               "id) SELECT count(*), coalesce(max(id), 0) FROM d",
               4, pr, &r, err);
    if (rc) return rc;
    *n_deleted = col_i64(r, 0, 0);
    if (*n_deleted) *last = col_i64(r, 0, 1);
    PQclear(r);
    return 0;
}

/* --- export (onceq verify) ------------------------------------------------------------------- */

/* The tables `onceq verify` reads, with their columns in both schemas (dead letters are not
 * read there, and their bytes stay here). */
static const struct {
    const char *pg, *lite, *cols;
} export_tables[] = {
    {"consumer_inbox", "inbox",
     "message_id, call_id, topic, partition, \"offset\", received_at, outcome, seen"},
    {"consumer_executions", "executions",
     "call_id, tenant, idem_key, fingerprint, tool, args, state, attempt, tries, lease_owner, "
     "lease_until, fence, result, error, effect_id, next_attempt_at, message_id, created_at, "
     "updated_at, started_at, unknown_at, lookups"},
    {"consumer_effects", "effects",
     "call_id, effect_id, tool, amount, recipient, detail, attempt, fence, worker, created_at, "
     "downstream_id"},
    {"consumer_audit", "audit", "id, ts, call_id, event, attempt, fence, worker, detail"},
};

int oq__consumer_pg_export(oq__consumer_pg_t *p, sqlite3 *dst, oq_error_t *err)
{
    int rc = ready(p, err);
    /* one snapshot of every table */
    if (rc || (rc = oq_pg_exec(p->c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", err)))
        return rc;
    if ((rc = oq_db_exec(dst, "BEGIN", err))) goto out;
    for (size_t t = 0; t < sizeof export_tables / sizeof export_tables[0] && !rc; t++) {
        char sql[1024], ins[1024], marks[200] = "";
        PGresult *r = NULL;
        snprintf(sql, sizeof sql, "SELECT %s FROM onceq.%s ORDER BY 1", export_tables[t].cols,
                 export_tables[t].pg);
        if ((rc = oq_pg_query(p->c, sql, 0, NULL, &r, err))) break;
        int nf = PQnfields(r);
        for (int i = 0; i < nf; i++)
            snprintf(marks + strlen(marks), sizeof marks - strlen(marks), "%s?", i ? "," : "");
        snprintf(ins, sizeof ins, "INSERT INTO %s(%s) VALUES(%s)", export_tables[t].lite,
                 export_tables[t].cols, marks);
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(dst, ins, -1, &st, NULL) != SQLITE_OK) {
            rc = oq_db_error(dst, SQLITE_ERROR, err, "export prepare");
            PQclear(r);
            break;
        }
        for (int i = 0; i < PQntuples(r) && !rc; i++) {
            for (int f = 0; f < nf; f++) {
                if (PQgetisnull(r, i, f))
                    sqlite3_bind_null(st, f + 1);
                else
                    sqlite3_bind_text(st, f + 1, PQgetvalue(r, i, f), -1, SQLITE_STATIC);
            }
            int s = sqlite3_step(st);
            if (s != SQLITE_DONE) rc = oq_db_error(dst, s, err, "export insert");
            sqlite3_reset(st);
        }
        sqlite3_finalize(st);
        PQclear(r);
    }
    if (!rc) rc = oq_db_commit(dst, err);
    if (rc) oq_db_rollback(dst);
out:
    PQclear(PQexec(p->c, "ROLLBACK"));
    return rc;
}
