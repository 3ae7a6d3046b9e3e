/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_pg.c: every SQL statement of the producer on PostgreSQL (schema `onceq`), the twin of
 * store.c behind the same row operations (producer_store.h); store.c hands an operation here
 * when the store holds a PostgreSQL connection. No rules here either: decide.c decides.
 *
 * What differs from SQLite, and why:
 *  - A failed statement aborts a PostgreSQL transaction (SQLite aborts only the statement). So
 *    the call insert never raises: ON CONFLICT DO NOTHING without a target absorbs both unique
 *    keys, and a second probe of the key tells a taken call id from an existing key. Two
 *    transactions inserting one key: the second waits on the first's index entry, then finds
 *    the key (committed) or inserts (rolled back); READ COMMITTED lets its next statement read
 *    the winner's row, so the decision is a replay, never a duplicate.
 *  - The relay's watermark runs over outbox.pub_seq, numbers the relay assigns after a row's
 *    transaction committed (relay/store_pg.c), not over seq (handed out at insert: a watermark
 *    over it would skip a row whose transaction commits late). A row is delivered when its
 *    pub_seq is at or below the watermark; a republish of a delivered row clears its pub_seq
 *    (it is assigned a new one, above the watermark: the tail), appends the row when retention
 *    deleted it, and leaves a pending row alone.
 *  - Retention: a call is purged only once settled (succeeded or failed) and its key expired;
 *    pending, running and needs_review calls are never purged. settled_at records when a call
 *    became succeeded or failed.
 *  - The operators' list of calls (onceq console) pages over the primary key: call ids are
 *    time-ordered (48 bits of milliseconds, then random bits, in hex; the SQL submit draws them
 *    alike), so a call's position is its id's first 60 bits, and a page is a backward range
 *    scan of calls_pkey. There is no rowid and no created_at index (it would cost every submit
 *    one more b-tree), as on SQLite.
 *  - Parameters go as text; integers are printed with PRId64. On the producer's own
 *    connections (opted in by oq_pg_prepared()) every statement is prepared once per session
 *    (oq_pg_run()); nothing is prepared on a caller's connection (oq_producer_submit_in_pgtx),
 *    so it is left as found.
 *  - A new call is one statement: the calls row and its outbox row in one INSERT (a CTE). The
 *    writer's batches go further (oq__producer_pg_insert_calls): the new calls of a whole
 *    batch in one multi-row INSERT, one round trip, then one COMMIT (group commit, writer.c);
 *    each column goes as one array (unnest), so its text is the same for any batch.
 *    The calls it wrote are remembered (per thread, for this connection, until the transaction
 *    ends), and the decision's own insert of such a row answers "new" without a statement.
 *  - Results likewise (oq__producer_pg_results_ahead, "read ahead, written behind" below): a
 *    batch of results costs one statement to read what its decisions need and one to write
 *    its result_inbox rows, call updates and audit rows, not five per result.
 *
 * Write operations run in the caller's open transaction; purge and counts open their own.
 */
#include "producer_store.h"

#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_buf.h"
#include "oq_envelope.h"
#include "oq_pg.h"
#include "oq_pg_rows.h"
#include "oq_util.h"

/* Rows with pub_seq at or below it were delivered (relay/store_pg.c). */
#define WATERMARK "(SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease)"

#define CALL_COLS                                                                                  \
    "call_id,tenant,idem_key,fingerprint,tool,args,state,result,error,attempt,effect_id,"          \
    "client_id,seq,created_at,updated_at,expires_at,callback_url"

/* A text of \p len bytes as a NUL-terminated parameter (args, payloads are given by length). */
static char *dupn(const char *p, size_t len)
{
    char *d = malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, p, len);
    d[len] = '\0';
    return d;
}

static int rah_sync(oq__producer_store_t *s, oq_error_t *err);
static int rah_flush(oq__producer_store_t *s, oq_error_t *err);
static void rah_forget(void);

static int q(oq__producer_store_t *s, const char *sql, int n, const char *const *p, PGresult **r,
             oq_error_t *err)
{
    int rc = rah_flush(s, err); /* results queued ahead are written first */
    return rc ? rc : oq_pg_run(s->pg, sql, n, p, r, err);
}

static int cmd(oq__producer_store_t *s, const char *sql, int n, const char *const *p,
               int64_t *affected, oq_error_t *err)
{
    int rc = rah_flush(s, err);
    return rc ? rc : oq_pg_run_cmd(s->pg, sql, n, p, affected, err);
}

static int oom(oq_error_t *err)
{
    return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
}

/* The calls oq__producer_pg_insert_calls() wrote in the open transaction of connection
 * ahead_conn (the writer's thread only ever has one open). Forgotten at begin, commit and
 * rollback, so never consulted outside that transaction. */
typedef struct {
    char call_id[OQ_CALL_ID_LEN + 1];
    char message_id[OQ_UUID_LEN + 1];
} ahead_t;
static _Thread_local PGconn *ahead_conn;
static _Thread_local ahead_t *ahead;
static _Thread_local int nahead;

static void ahead_forget(void)
{
    free(ahead);
    ahead = NULL;
    nahead = 0;
    ahead_conn = NULL;
}

/* Was \p c written ahead in this transaction? Then it is taken (answered once). */
static int ahead_take(oq__producer_store_t *s, const oq__producer_new_call_t *c)
{
    if (ahead_conn != s->pg || !c->message_id) return 0;
    for (int i = 0; i < nahead; i++)
        if (strcmp(ahead[i].call_id, c->call_id) == 0 &&
            strcmp(ahead[i].message_id, c->message_id) == 0) {
            ahead[i].call_id[0] = '\0';
            return 1;
        }
    return 0;
}

/* The connection whose open transaction inserted outbox rows on this thread: its COMMIT wakes
 * the relay (oq_pg_commit_wake), the NOTIFY having left the durable commit (0008). */
static _Thread_local PGconn *outbox_conn;

int oq__producer_pg_in_tx(oq__producer_store_t *s)
{
    PGTransactionStatusType t = PQtransactionStatus(s->pg);
    return t == PQTRANS_INTRANS || t == PQTRANS_INERROR;
}

int oq__producer_pg_begin(oq__producer_store_t *s, oq_error_t *err)
{
    /* A connection lost since the last batch (server restarted, backend terminated) is
     * re-established here, before anything of the new batch ran: nothing is lost or doubled. */
    if (PQstatus(s->pg) == CONNECTION_BAD) {
        PQreset(s->pg);
        if (PQstatus(s->pg) != CONNECTION_OK) return oq_pg_error(s->pg, NULL, err, "reconnect");
        int rc = oq_pg_exec(s->pg, "SET synchronous_commit = on", err);
        if (!rc) rc = oq_pg_wake_after(s->pg, err);
        if (rc) return rc;
    }
    ahead_forget();
    outbox_conn = NULL;
    rah_forget();
    /* one round trip: every statement of the transaction looks rows up by key, and a prepared
     * one keeps its generic plan (OQ_PG_INDEX_PLANS) */
    static const char begin[] = "BEGIN; " OQ_PG_INDEX_PLANS;
    int rc = oq_pg_exec(s->pg, begin, err);
    if (rc && PQstatus(s->pg) == CONNECTION_BAD) {
        /* libpq learns of a closed connection only when it uses it: once more, reconnected */
        PQreset(s->pg);
        if (PQstatus(s->pg) != CONNECTION_OK) return oq_pg_error(s->pg, NULL, err, "reconnect");
        if ((rc = oq_pg_exec(s->pg, "SET synchronous_commit = on", err)) ||
            (rc = oq_pg_wake_after(s->pg, err)))
            return rc;
        rc = oq_pg_exec(s->pg, begin, err);
    }
    return rc;
}

int oq__producer_pg_commit(oq__producer_store_t *s, oq_error_t *err)
{
    ahead_forget();
    int rc = rah_sync(s, err); /* the results queued, before COMMIT */
    if (rc) return rc;
    /* an aborted transaction answers COMMIT with "ROLLBACK" and no error: never report it
     * committed */
    if (PQtransactionStatus(s->pg) == PQTRANS_INERROR)
        return oq_error_set(err, OQ_EDB, 0, "commit: the transaction was aborted");
    int wake = outbox_conn == s->pg;
    outbox_conn = NULL;
    return wake ? oq_pg_commit_wake(s->pg, err) : oq_pg_exec(s->pg, "COMMIT", err);
}

void oq__producer_pg_rollback(oq__producer_store_t *s)
{
    ahead_forget();
    outbox_conn = NULL;
    rah_forget();
    if (PQstatus(s->pg) == CONNECTION_OK && PQtransactionStatus(s->pg) != PQTRANS_IDLE)
        PQclear(PQexec(s->pg, "ROLLBACK"));
}

/* Every column of a batch goes to the server as one array parameter in the binary format
 * (oq_pg_array_t: no quoting here, no parsing there); the type letters below name each
 * column's element type in the order of the statement's casts. */

/* --- results: read ahead, written behind ---------------------------------------------------- */

/* oq__producer_pg_results_ahead() reads, in one statement, the state of every call a batch of
 * results names and which of its message ids result_inbox holds already. From then on, on the
 * writer's connection rah_conn and until oq__producer_pg_results_done(), the transaction's end, or
 * a statement that changes a call's state, attempt or existence (rah_sync()), get_state answers
 * from what was read, claim_result decides from it and from what this transaction claimed, and
 * claim_result, set_result and audit_add queue their rows instead of running a statement each (a
 * set_result updates the state it read, so a second result of the same call in the batch decides on
 * the first one's state). The queued rows are written in ONE statement (three data-modifying CTEs:
 * the inbox rows, one UPDATE ... FROM unnest(...) of the calls, the audit rows in order) before
 * any other statement (a webhook delivery reads the call as it now stands), and before COMMIT. A
 * call is updated at most once per such statement: a second set_result of it in the batch is folded
 * into the row queued (rah_merge: the effect of the two in turn). The inbox rows are a plain
 * INSERT: a message id that another producer claimed after the read makes the statement fail, the
 * writer rolls the batch back and runs it again, and the read then sees the claim (nothing applied
 * twice). */
typedef struct {
    char *call_id;
    oq__producer_call_state_t st;
    int found, upd; /* upd: its update waits in rah_upd[upd - 1] (0: none) */
} rah_call_t;

typedef struct { /* a queued row: owned texts, NULL = SQL NULL */
    char *v[9];
} rah_row_t;

typedef struct { /* open addressing over strings: index + 1, 0 = empty */
    int *slot;
    size_t cap;
} rah_map_t;

static _Thread_local PGconn *rah_conn;
static _Thread_local rah_call_t *rah_calls;
static _Thread_local int rah_ncalls;
static _Thread_local rah_map_t rah_cmap; /* call id -> rah_calls */
static _Thread_local char **rah_msgs;    /* message ids in result_inbox (read or claimed) */
static _Thread_local int rah_nmsgs, rah_capmsgs;
static _Thread_local rah_map_t rah_mmap; /* message id -> rah_msgs */
static _Thread_local rah_row_t *rah_ins, *rah_upd, *rah_aud;
static _Thread_local int rah_nins, rah_nupd, rah_naud, rah_capins, rah_capupd, rah_capaud;

static size_t rah_hash(const char *k)
{
    size_t h = 1469598103934665603ull;
    for (; *k; k++)
        h = (h ^ (unsigned char)*k) * 1099511628211ull;
    return h;
}

/* The index of \p k in \p keys through \p m, or -1. */
static int rah_find(const rah_map_t *m, char *const *keys, size_t stride, const char *k)
{
    if (!m->cap) return -1;
    for (size_t i = rah_hash(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        int x = m->slot[i];
        if (!x) return -1;
        if (strcmp(*(char *const *)((const char *)keys + (size_t)(x - 1) * stride), k) == 0)
            return x - 1;
    }
}

/* Room for \p n keys in \p m (rehashed from \p keys, \p count of them). @returns 0 or -1. */
static int rah_grow(rah_map_t *m, char *const *keys, size_t stride, int count, int n)
{
    if (m->cap && (size_t)n * 2 <= m->cap) return 0;
    size_t cap = 64;
    while (cap < (size_t)n * 2)
        cap *= 2;
    int *slot = calloc(cap, sizeof *slot);
    if (!slot) return -1;
    free(m->slot);
    m->slot = slot;
    m->cap = cap;
    for (int x = 0; x < count; x++) {
        const char *k = *(char *const *)((const char *)keys + (size_t)x * stride);
        size_t i = rah_hash(k) & (cap - 1);
        while (slot[i])
            i = (i + 1) & (cap - 1);
        slot[i] = x + 1;
    }
    return 0;
}

static void rah_put(rah_map_t *m, const char *k, int x)
{
    size_t i = rah_hash(k) & (m->cap - 1);
    while (m->slot[i])
        i = (i + 1) & (m->cap - 1);
    m->slot[i] = x + 1;
}

static void rah_rows_free(rah_row_t *rows, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 9; j++)
            free(rows[i].v[j]);
}

/* Forget everything read and queued (nothing is written). */
static void rah_forget(void)
{
    for (int i = 0; i < rah_ncalls; i++)
        free(rah_calls[i].call_id);
    for (int i = 0; i < rah_nmsgs; i++)
        free(rah_msgs[i]);
    rah_rows_free(rah_ins, rah_nins);
    rah_rows_free(rah_upd, rah_nupd);
    rah_rows_free(rah_aud, rah_naud);
    free(rah_calls);
    free(rah_msgs);
    free(rah_ins);
    free(rah_upd);
    free(rah_aud);
    free(rah_cmap.slot);
    free(rah_mmap.slot);
    rah_calls = NULL;
    rah_msgs = NULL;
    rah_ins = rah_upd = rah_aud = NULL;
    rah_ncalls = rah_nmsgs = rah_capmsgs = 0;
    rah_nins = rah_nupd = rah_naud = rah_capins = rah_capupd = rah_capaud = 0;
    memset(&rah_cmap, 0, sizeof rah_cmap);
    memset(&rah_mmap, 0, sizeof rah_mmap);
    rah_conn = NULL;
}

static int rah_active(oq__producer_store_t *s)
{
    return rah_conn && rah_conn == s->pg;
}

/* Queue a row of \p n texts (copied) on \p rows. @returns 0 or -1 (out of memory). */
static int rah_queue(rah_row_t **rows, int *nrows, int *cap, const char *const *v, int n)
{
    if (*nrows == *cap) {
        int c = *cap ? *cap * 2 : 64;
        rah_row_t *r = realloc(*rows, (size_t)c * sizeof *r);
        if (!r) return -1;
        *rows = r;
        *cap = c;
    }
    rah_row_t *r = &(*rows)[*nrows];
    memset(r, 0, sizeof *r);
    for (int j = 0; j < n; j++)
        if (v[j] && !(r->v[j] = strdup(v[j]))) {
            for (int k = 0; k < j; k++)
                free(r->v[k]);
            return -1;
        }
    (*nrows)++;
    return 0;
}

/* The arrays of \p nrows rows of \p ncols columns of the element types \p types, column j
 * into \p out[j] and \p len[j] (owned by \p a[j], initialised here). @returns 0 or the
 * first failure (OQ_ENOMEM, or OQ_EINVAL: a value not of its column's type). */
static int rah_arrays(const rah_row_t *rows, int nrows, int ncols, const char *types,
                      oq_pg_array_t *a, const char **out, int *len)
{
    int rc = 0;
    for (int j = 0; j < ncols; j++) {
        oq_pg_array_init(&a[j], types[j]);
        for (int i = 0; i < nrows; i++)
            oq_pg_array_add(&a[j], rows[i].v[j]);
        if (!rc) rc = oq_pg_array_end(&a[j], &out[j], &len[j]);
    }
    return rc;
}

static int settles(const char *state)
{
    return strcmp(state, "succeeded") == 0 || strcmp(state, "failed") == 0;
}

static int rah_set(char **v, const char *x)
{
    char *d = NULL;
    if (x && !(d = strdup(x))) return -1;
    free(*v);
    *v = d;
    return 0;
}

/* Fold the update \p r into the queued update \p q of the same call, so that the one row has
 * the effect of \p q then \p r (oq__producer_pg_set_result's statement applied twice):
 * state, result, error and updated_at are r's; effect_id r's, else q's, else the call's;
 * next_redrive_at is cleared when either settled; expires_at r's when set, else q's; and
 * settled_at (column sa, NULL = the call's own, else this moment), when r settles: q's when q
 * settled too, else r's moment. @returns 0 or -1 (out of memory). */
static int rah_merge(rah_row_t *q, const oq__producer_result_t *r)
{
    num_t at, exp;
    int q_settles = settles(q->v[1]);
    int rc = 0;
    if (settles(r->state) && !q_settles) rc |= rah_set(&q->v[8], num(&at, r->updated_at));
    rc |= rah_set(&q->v[1], r->state);
    rc |= rah_set(&q->v[2], r->result);
    rc |= rah_set(&q->v[3], r->error);
    if (r->effect_id) rc |= rah_set(&q->v[4], r->effect_id);
    rc |= rah_set(&q->v[5], num(&at, r->updated_at));
    if (r->settled) rc |= rah_set(&q->v[6], "t");
    if (r->expires_at > 0) rc |= rah_set(&q->v[7], num(&exp, r->expires_at));
    return rc ? -1 : 0;
}

/* Write what is queued, in one statement; the reads stay valid. Each column goes as one array
 * (unnest), so the statement's text is the same for any number of rows, and it is prepared
 * once: its generic plan joins by `calls`' primary key however small the table was when it was
 * chosen, since the transaction plans without sequential scans (oq__producer_pg_begin). */
static int rah_write(oq__producer_store_t *s, oq_error_t *err)
{
    if (!rah_nins && !rah_nupd && !rah_naud) return 0;
    oq_pg_array_t a[18];
    const char *p[18];
    int len[18];
    int rc = 0;
    /* inbox: message_id, call_id, status, outcome, received_at; the calls' update (v below);
     * audit: ts, call_id, event, detail */
    int ra[3] = {rah_arrays(rah_ins, rah_nins, 5, "ttttb", a, p, len),
                 rah_arrays(rah_upd, rah_nupd, 9, "tttttbobb", a + 5, p + 5, len + 5),
                 rah_arrays(rah_aud, rah_naud, 4, "bttt", a + 14, p + 14, len + 14)};
    for (int k = 0; k < 3 && !rc; k++)
        if (ra[k])
            rc = oq_error_set(err, ra[k], 0, "results written behind: %s",
                              ra[k] == OQ_EINVAL ? "a value not of its column's type"
                                                 : "out of memory");
    PGresult *r = NULL;
    if (!rc)
        rc = oq_pg_run_bin(
            s->pg,
            "WITH i AS (INSERT INTO onceq.result_inbox(message_id,call_id,status,outcome,"
            "received_at) SELECT * FROM unnest($1::text[],$2::text[],$3::text[],$4::text[],"
            "$5::bigint[])), "
            "u AS (UPDATE onceq.calls c SET state=v.state,result=v.result,error=v.error,"
            "effect_id=COALESCE(v.effect_id,c.effect_id),updated_at=v.at,"
            "next_redrive_at=CASE WHEN v.settled THEN NULL ELSE c.next_redrive_at END,"
            "settled_at=CASE WHEN v.state IN ('succeeded','failed') THEN "
            "COALESCE(v.sa,c.settled_at,v.at) ELSE NULL END,expires_at=CASE WHEN v.exp > 0 "
            "THEN v.exp ELSE c.expires_at END FROM unnest($6::text[],$7::text[],$8::text[],"
            "$9::text[],$10::text[],$11::bigint[],$12::boolean[],$13::bigint[],$14::bigint[]) "
            "v(call_id,state,result,error,effect_id,at,settled,exp,sa) "
            "WHERE c.call_id=v.call_id), "
            "a AS (INSERT INTO onceq.audit(ts,call_id,event,detail) SELECT * FROM "
            "unnest($15::bigint[],$16::text[],$17::text[],$18::text[])) SELECT 1",
            18, p, len, oq_pg_bin, &r, err);
    /* whatever failed (a message id claimed meanwhile is OQ_EEXIST), the transaction is aborted
     * and rows of earlier decisions are lost: a database error, the batch is rolled back */
    if (rc && rc != OQ_EDB && rc != OQ_EBUSY && rc != OQ_ENOMEM && rc != OQ_EIO) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err ? err->msg : "");
        rc = oq_error_set(err, OQ_EDB, 0, "results written behind: %s", why);
    }
    PQclear(r);
    for (int j = 0; j < 18; j++)
        oq_pg_array_free(&a[j]);
    for (int i = 0; i < rah_ncalls; i++)
        rah_calls[i].upd = 0;
    rah_rows_free(rah_ins, rah_nins);
    rah_rows_free(rah_upd, rah_nupd);
    rah_rows_free(rah_aud, rah_naud);
    rah_nins = rah_nupd = rah_naud = 0;
    return rc;
}

/* Before any other statement on \p s: write what is queued. */
static int rah_flush(oq__producer_store_t *s, oq_error_t *err)
{
    return rah_active(s) ? rah_write(s, err) : 0;
}

/* At the end of a batch of results, before the commit, and before a statement that changes
 * what was read (a call's state or attempt, or its existence): write what is queued, forget
 * what was read. */
static int rah_sync(oq__producer_store_t *s, oq_error_t *err)
{
    if (!rah_active(s)) return 0;
    int rc = rah_write(s, err);
    rah_forget();
    return rc;
}

/* Queued rows past which rah_write() runs (a statement takes at most 65,535 parameters). */
#define RAH_MAX_PARAMS 30000

static int rah_room(oq__producer_store_t *s, oq_error_t *err)
{
    if (rah_nins * 5 + rah_nupd * 9 + rah_naud * 4 + 9 < RAH_MAX_PARAMS) return 0;
    return rah_write(s, err);
}

int oq__producer_pg_results_done(oq__producer_store_t *s, oq_error_t *err)
{
    return rah_sync(s, err);
}

int oq__producer_pg_results_ahead(oq__producer_store_t *s, const oq_envelope_t *envs, int n,
                                  oq_error_t *err)
{
    int rc = rah_sync(s, err);
    if (rc || n < 1) return rc;
    /* the distinct call ids and message ids, as two text[] parameters */
    oq_pg_array_t ids[2];
    oq_pg_array_init(&ids[0], 't');
    oq_pg_array_init(&ids[1], 't');
    rah_calls = calloc((size_t)n, sizeof *rah_calls);
    rah_msgs = calloc((size_t)n, sizeof *rah_msgs);
    if (!rah_calls || !rah_msgs || rah_grow(&rah_cmap, NULL, 0, 0, n) ||
        rah_grow(&rah_mmap, NULL, 0, 0, n))
        goto nomem;
    rah_capmsgs = n;
    rah_conn = s->pg;
    int nm = 0;
    for (int i = 0; i < n; i++) {
        const oq_envelope_t *e = &envs[i];
        if (e->kind != OQ_KIND_TOOL_RESULT || !e->call_id[0] || !e->message_id[0]) continue;
        if (rah_find(&rah_cmap, (char *const *)rah_calls, sizeof *rah_calls, e->call_id) < 0) {
            if (!(rah_calls[rah_ncalls].call_id = strdup(e->call_id))) goto nomem;
            rah_put(&rah_cmap, e->call_id, rah_ncalls);
            if (oq_pg_array_add(&ids[0], e->call_id)) goto nomem;
            rah_ncalls++;
        }
        if (oq_pg_array_add(&ids[1], e->message_id)) goto nomem;
        nm++;
    }
    if (!rah_ncalls) {
        oq_pg_array_free(&ids[0]);
        oq_pg_array_free(&ids[1]);
        rah_forget();
        return 0;
    }
    const char *p[2];
    int len[2];
    if (oq_pg_array_end(&ids[0], &p[0], &len[0]) || oq_pg_array_end(&ids[1], &p[1], &len[1]))
        goto nomem;
    PGresult *r = NULL;
    /* Prepared: its generic plan is two index lookups, since the transaction plans without
     * sequential scans (oq__producer_pg_begin). Without that it would keep a sequential scan
     * chosen while `calls` was small and read the whole table for every batch as it grows (14 ms
     * a batch at 5,000 calls in `onceq-bench e2e`); sent unprepared, it was planned again in
     * every batch (120 us of the server's CPU: docs/SCALING.md, "Plans kept"). */
    rc = oq_pg_run_bin(s->pg,
                       "SELECT call_id,state,attempt,(callback_url IS NOT NULL)::int FROM "
                       "onceq.calls WHERE call_id=ANY($1::text[]) UNION ALL SELECT message_id,"
                       "NULL,NULL,NULL FROM onceq.result_inbox WHERE message_id=ANY($2::text[])",
                       2, p, len, oq_pg_bin, &r, err);
    oq_pg_array_free(&ids[0]);
    oq_pg_array_free(&ids[1]);
    if (rc) {
        rah_forget();
        return rc;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        const char *k = PQgetvalue(r, i, 0);
        if (PQgetisnull(r, i, 1)) { /* a message id claimed before */
            if (rah_find(&rah_mmap, rah_msgs, sizeof *rah_msgs, k) >= 0) continue;
            if (rah_nmsgs >= rah_capmsgs || !(rah_msgs[rah_nmsgs] = strdup(k))) {
                PQclear(r);
                goto nomem;
            }
            rah_put(&rah_mmap, k, rah_nmsgs++);
            continue;
        }
        int x = rah_find(&rah_cmap, (char *const *)rah_calls, sizeof *rah_calls, k);
        if (x < 0) continue;
        rah_calls[x].found = 1;
        col_copy(r, i, 1, rah_calls[x].st.state, sizeof rah_calls[x].st.state);
        rah_calls[x].st.attempt = col_i64(r, i, 2);
        rah_calls[x].st.has_callback = (int)col_i64(r, i, 3);
    }
    PQclear(r);
    (void)nm;
    return 0;
nomem:
    oq_pg_array_free(&ids[0]);
    oq_pg_array_free(&ids[1]);
    rah_forget();
    return oom(err);
}

/* --- outbox --------------------------------------------------------------------------------- */

static int outbox_append(oq__producer_store_t *s, const char *message_id, const char *call_id,
                         const char *payload, size_t payload_len, int64_t now, oq_error_t *err)
{
    num_t t;
    char *pl = dupn(payload, payload_len);
    if (!pl) return oom(err);
    const char *p[] = {message_id, OQ_TOPIC_CALLS, call_id, pl, num(&t, now)};
    outbox_conn = s->pg;
    int rc = cmd(s,
                 "INSERT INTO onceq.outbox(message_id,topic,key,payload,created_at) "
                 "VALUES($1,$2,$3,$4,$5)",
                 5, p, NULL, err);
    free(pl);
    return rc;
}

int oq__producer_pg_republish(oq__producer_store_t *s, const char *message_id, const char *call_id,
                              const char *payload, size_t payload_len, int64_t now,
                              oq_outbox_republish_t *what, oq_error_t *err)
{
    const char *p[] = {message_id};
    int64_t n = 0;
    int rc = cmd(s,
                 "UPDATE onceq.outbox SET pub_seq=NULL WHERE message_id=$1 AND "
                 "pub_seq <= " WATERMARK,
                 1, p, &n, err);
    if (rc) return rc;
    if (n > 0) {
        *what = OQ_OUTBOX_REQUEUED;
        return 0;
    }
    PGresult *r = NULL;
    if ((rc = q(s, "SELECT 1 FROM onceq.outbox WHERE message_id=$1", 1, p, &r, err))) return rc;
    int pending = PQntuples(r) > 0;
    PQclear(r);
    if (pending) {
        *what = OQ_OUTBOX_PENDING;
        return 0;
    }
    rc = outbox_append(s, message_id, call_id, payload, payload_len, now, err);
    if (rc == 0) *what = OQ_OUTBOX_APPENDED;
    return rc;
}

/* --- calls ---------------------------------------------------------------------------------- */

/* Columns of one row of oq__producer_pg_insert_calls(). */
#define AHEAD_COLS 13

/* Number buffers behind the text of one new call's parameters. */
typedef struct {
    num_t seq, at, exp;
    char *args, *payload; /* NUL-terminated copies, freed by new_call_free() */
} new_call_text_t;

/* The AHEAD_COLS parameters of the new call \p c, in the column order of both inserts of a
 * call (insert_chunk's arrays, oq__producer_pg_insert_call's VALUES): call_id, tenant,
 * idem_key, fingerprint, tool, args, client_id, seq, created_at, expires_at, message_id,
 * callback_url, payload. The strings of \p v point into \p c and \p t. @returns 0, or -1
 * out of memory (\p t then holds nothing to free). */
static int new_call_params(const oq__producer_new_call_t *c, new_call_text_t *t,
                           const char *v[AHEAD_COLS])
{
    t->args = dupn(c->args, c->args_len);
    t->payload = dupn(c->payload, c->payload_len);
    if (!t->args || !t->payload) {
        free(t->args);
        free(t->payload);
        t->args = t->payload = NULL;
        return -1;
    }
    const char *x[AHEAD_COLS] = {c->call_id,
                                 c->tenant,
                                 c->idem_key,
                                 c->fingerprint,
                                 c->tool,
                                 t->args,
                                 c->client_id,
                                 c->has_seq ? num(&t->seq, c->seq) : NULL,
                                 num(&t->at, c->created_at),
                                 num(&t->exp, c->expires_at),
                                 c->message_id,
                                 c->callback_url,
                                 t->payload};
    memcpy(v, x, sizeof x);
    return 0;
}

static void new_call_free(new_call_text_t *t)
{
    free(t->args);
    free(t->payload);
}

/* Rows per statement: 13 parameters each, and a statement takes at most 65,535. */
#define AHEAD_CHUNK 1000

/* One statement of oq__producer_pg_insert_calls(): \p n <= AHEAD_CHUNK rows, the calls it
 * wrote appended to what is remembered. Each column goes as one array (unnest): the text is
 * the same for any n (a VALUES list of n rows was parsed anew each time, milliseconds for a
 * batch of a few hundred), so it is prepared once per session (oq_pg_run; unprepared on a
 * connection that has no prepared statements). Its plan reads no table whatever the sizes (two
 * inserts, their conflicts found by the unique indexes, and a join of what they return), so the
 * generic plan a prepared statement settles on cannot turn into a scan as `calls` grows, unlike
 * the reads by key array below (sent unprepared for that reason). */
static int insert_chunk(oq__producer_store_t *s, const oq__producer_new_call_t *rows, int n,
                        oq_error_t *err)
{
    /* call_id, tenant, idem_key, fingerprint, tool, args, client_id, seq, created_at,
     * expires_at, message_id, callback_url, payload; then the topic, as text */
    static const char types[AHEAD_COLS + 1] = "tttttttbbbttt";
    static const int fmt[AHEAD_COLS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    oq_pg_array_t col[AHEAD_COLS];
    const char *p[AHEAD_COLS + 1];
    int len[AHEAD_COLS + 1] = {0};
    for (int j = 0; j < AHEAD_COLS; j++)
        oq_pg_array_init(&col[j], types[j]);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        new_call_text_t t;
        const char *v[AHEAD_COLS];
        if (new_call_params(&rows[i], &t, v)) {
            rc = -1;
            break;
        }
        for (int j = 0; j < AHEAD_COLS && !rc; j++)
            rc = oq_pg_array_add(&col[j], v[j]);
        new_call_free(&t);
    }
    for (int j = 0; j < AHEAD_COLS && !rc; j++)
        rc = oq_pg_array_end(&col[j], &p[j], &len[j]);
    p[AHEAD_COLS] = OQ_TOPIC_CALLS;
    PGresult *r = NULL;
    if (rc) {
        rc = oom(err);
        goto out;
    }
    outbox_conn = s->pg;
    if ((rc = rah_sync(s, err)) ||
        (rc = oq_pg_run_bin(
             s->pg,
             "WITH v AS (SELECT * FROM unnest($1::text[],$2::text[],$3::text[],$4::text[],"
             "$5::text[],$6::text[],$7::text[],$8::bigint[],$9::bigint[],$10::bigint[],"
             "$11::text[],$12::text[],$13::text[]) AS u(call_id,tenant,idem_key,fingerprint,"
             "tool,args,client_id,seq,created_at,expires_at,message_id,callback_url,payload)), "
             "c AS (INSERT INTO onceq.calls(call_id,tenant,idem_key,fingerprint,tool,args,state,"
             "attempt,client_id,seq,created_at,updated_at,expires_at,message_id,callback_url) "
             "SELECT call_id,tenant,idem_key,fingerprint,tool,args,'pending',1,client_id,seq,"
             "created_at,created_at,expires_at,message_id,callback_url FROM v "
             "ON CONFLICT DO NOTHING RETURNING call_id,message_id), "
             "o AS (INSERT INTO onceq.outbox(message_id,topic,key,payload,created_at) "
             "SELECT v.message_id,$14::text,v.call_id,v.payload,v.created_at FROM v JOIN c ON "
             "c.call_id=v.call_id AND c.message_id=v.message_id) "
             "SELECT call_id,message_id FROM c",
             AHEAD_COLS + 1, p, len, fmt, &r, err)))
        goto out;
    int got = PQntuples(r);
    ahead_t *a = realloc(ahead, (size_t)(nahead + got + 1) * sizeof *ahead);
    if (!a) {
        PQclear(r);
        rc = oom(err);
        goto out;
    }
    ahead = a;
    for (int i = 0; i < got; i++) {
        col_copy(r, i, 0, ahead[nahead + i].call_id, sizeof ahead->call_id);
        col_copy(r, i, 1, ahead[nahead + i].message_id, sizeof ahead->message_id);
    }
    nahead += got;
    ahead_conn = s->pg;
    PQclear(r);
out:
    for (int j = 0; j < AHEAD_COLS; j++)
        oq_pg_array_free(&col[j]);
    return rc;
}

int oq__producer_pg_insert_calls(oq__producer_store_t *s, const oq__producer_new_call_t *rows,
                                 int n, oq_error_t *err)
{
    ahead_forget();
    int rc = 0;
    for (int i = 0; i < n && !rc; i += AHEAD_CHUNK)
        rc = insert_chunk(s, rows + i, n - i < AHEAD_CHUNK ? n - i : AHEAD_CHUNK, err);
    if (rc) ahead_forget(); /* the transaction is aborted: nothing of it holds */
    return rc;
}

int oq__producer_pg_insert_call(oq__producer_store_t *s, const oq__producer_new_call_t *c,
                                oq__producer_insert_t *result, oq_error_t *err)
{
    if (ahead_take(s, c)) { /* written by oq__producer_pg_insert_calls() in this transaction */
        *result = OQ__INSERT_NEW;
        return 0;
    }
    int rc0 = rah_sync(s, err); /* a call that was not there may be now */
    if (rc0) return rc0;
    new_call_text_t t;
    const char *v[AHEAD_COLS];
    if (new_call_params(c, &t, v)) return oom(err);
    /* $13 is the topic here, the payload $14 */
    const char *p[AHEAD_COLS + 1];
    memcpy(p, v, (AHEAD_COLS - 1) * sizeof *p);
    p[AHEAD_COLS - 1] = OQ_TOPIC_CALLS;
    p[AHEAD_COLS] = v[AHEAD_COLS - 1];
    int64_t n = 0;
    /* The call and, when it was inserted, its outbox row: one statement, one round trip. */
    outbox_conn = s->pg;
    int rc = cmd(s,
                 "WITH c AS (INSERT INTO onceq.calls(call_id,tenant,idem_key,fingerprint,tool,args,"
                 "state,attempt,client_id,seq,created_at,updated_at,expires_at,message_id,"
                 "callback_url) VALUES($1,$2,$3,$4,$5,$6,'pending',1,$7,$8,$9,$9,$10,$11,$12) "
                 "ON CONFLICT DO NOTHING RETURNING 1) "
                 "INSERT INTO onceq.outbox(message_id,topic,key,payload,created_at) "
                 "SELECT $11,$13,$1,$14,$9 FROM c",
                 14, p, &n, err);
    new_call_free(&t);
    if (rc) return rc;
    if (n == 0) {
        /* The key, or only the call id (then the key is free: draw another id)? */
        PGresult *r = NULL;
        const char *k[] = {c->tenant, c->idem_key};
        if ((rc = q(s, "SELECT 1 FROM onceq.calls WHERE tenant=$1 AND idem_key=$2", 2, k, &r, err)))
            return rc;
        *result = PQntuples(r) ? OQ__INSERT_KEY_EXISTS : OQ__INSERT_ID_TAKEN;
        PQclear(r);
        return 0;
    }
    *result = OQ__INSERT_NEW;
    return 0;
}

static int read_call(PGresult *r, int row, oq_call_t *c)
{
    memset(c, 0, sizeof *c);
    col_copy(r, row, 0, c->call_id, sizeof c->call_id);
    c->tenant = col_dup(r, row, 1);
    c->idem_key = col_dup(r, row, 2);
    col_copy(r, row, 3, c->fingerprint, sizeof c->fingerprint);
    c->tool = col_dup(r, row, 4);
    c->args = col_dup(r, row, 5);
    col_copy(r, row, 6, c->state, sizeof c->state);
    c->result = col_dup(r, row, 7);
    c->error = col_dup(r, row, 8);
    c->attempt = col_i64(r, row, 9);
    c->effect_id = col_dup(r, row, 10);
    c->client_id = col_dup(r, row, 11);
    c->has_seq = !PQgetisnull(r, row, 12);
    c->seq = col_i64(r, row, 12);
    c->created_at = col_i64(r, row, 13);
    c->updated_at = col_i64(r, row, 14);
    c->expires_at = col_i64(r, row, 15);
    c->callback_url = col_dup(r, row, 16);
    if (!c->tenant || !c->idem_key || !c->tool || !c->args) {
        oq_call_clear(c);
        return OQ_ENOMEM;
    }
    return 0;
}

static int get_one(oq__producer_store_t *s, const char *sql, int n, const char *const *p,
                   const char *call_id, oq_call_t *out, oq_error_t *err)
{
    PGresult *r = NULL;
    int rc = q(s, sql, n, p, &r, err);
    if (rc) return rc;
    if (PQntuples(r) == 0)
        rc = call_id ? oq_error_set(err, OQ_ENOTFOUND, 0, "no call %s", call_id)
                     : oq_error_set(err, OQ_ENOTFOUND, 0, "no call for key");
    else if ((rc = read_call(r, 0, out)))
        oom(err);
    PQclear(r);
    return rc;
}

int oq__producer_pg_get(oq__producer_store_t *s, const char *call_id, oq_call_t *out,
                        oq_error_t *err)
{
    const char *p[] = {call_id};
    return get_one(s, "SELECT " CALL_COLS " FROM onceq.calls WHERE call_id=$1", 1, p, call_id, out,
                   err);
}

int oq__producer_pg_get_by_key(oq__producer_store_t *s, const char *tenant, const char *idem_key,
                               oq_call_t *out, oq_error_t *err)
{
    const char *p[] = {tenant && *tenant ? tenant : OQ_DEFAULT_TENANT, idem_key};
    return get_one(s, "SELECT " CALL_COLS " FROM onceq.calls WHERE tenant=$1 AND idem_key=$2", 2, p,
                   NULL, out, err);
}

int oq__producer_pg_reset_call(oq__producer_store_t *s, const oq__producer_attempt_t *a,
                               oq_error_t *err)
{
    num_t att, up, exp;
    const char *p[] = {a->call_id, num(&att, a->attempt), num(&up, a->updated_at),
                       num(&exp, a->expires_at), a->message_id};
    int rc0 = rah_sync(s, err); /* the state and attempt read ahead change */
    if (rc0) return rc0;
    int64_t n = 0;
    int rc = cmd(s,
                 "UPDATE onceq.calls SET state='pending',attempt=$2,result=NULL,error=NULL,"
                 "updated_at=$3,expires_at=$4,message_id=$5,redrive_count=0,next_redrive_at=NULL,"
                 "settled_at=NULL WHERE call_id=$1 AND state='failed' AND attempt=$2::bigint-1",
                 5, p, &n, err);
    if (rc) return rc;
    if (n != 1)
        return oq_error_set(err, OQ_ESTATE, 0, "call %s is not failed at attempt %lld", a->call_id,
                            (long long)(a->attempt - 1));
    return outbox_append(s, a->message_id, a->call_id, a->payload, a->payload_len, a->updated_at,
                         err);
}

int oq__producer_pg_delete_call(oq__producer_store_t *s, const char *call_id, oq_error_t *err)
{
    const char *p[] = {call_id};
    int rc;
    if ((rc = rah_sync(s, err)) || /* the call read ahead goes */
        (rc = cmd(s, "DELETE FROM onceq.audit WHERE call_id=$1", 1, p, NULL, err)) ||
        (rc = cmd(s, "DELETE FROM onceq.result_inbox WHERE call_id=$1", 1, p, NULL, err)) ||
        (rc = cmd(s, "DELETE FROM onceq.webhook_deliveries WHERE call_id=$1", 1, p, NULL, err)))
        return rc;
    return cmd(s, "DELETE FROM onceq.calls WHERE call_id=$1", 1, p, NULL, err);
}

/* --- results -------------------------------------------------------------------------------- */

int oq__producer_pg_get_state(oq__producer_store_t *s, const char *call_id,
                              oq__producer_call_state_t *out, int *found, oq_error_t *err)
{
    int x = rah_active(s)
                ? rah_find(&rah_cmap, (char *const *)rah_calls, sizeof *rah_calls, call_id)
                : -1;
    if (x >= 0) { /* read ahead */
        *found = rah_calls[x].found;
        if (*found) *out = rah_calls[x].st;
        return 0;
    }
    const char *p[] = {call_id};
    PGresult *r = NULL;
    int rc = q(s,
               "SELECT state,attempt,(callback_url IS NOT NULL)::int FROM onceq.calls WHERE "
               "call_id=$1",
               1, p, &r, err);
    if (rc) return rc;
    *found = PQntuples(r) > 0;
    if (*found) {
        col_copy(r, 0, 0, out->state, sizeof out->state);
        out->attempt = col_i64(r, 0, 1);
        out->has_callback = (int)col_i64(r, 0, 2);
    }
    PQclear(r);
    return 0;
}

int oq__producer_pg_claim_result(oq__producer_store_t *s, const oq__producer_inbox_row_t *r,
                                 int *claimed, oq_error_t *err)
{
    num_t at;
    if (rah_active(s) &&
        rah_find(&rah_cmap, (char *const *)rah_calls, sizeof *rah_calls, r->call_id) >= 0) {
        int rc = rah_room(s, err);
        if (rc) return rc;
        if (rah_find(&rah_mmap, rah_msgs, sizeof *rah_msgs, r->message_id) >= 0) {
            *claimed = 0; /* claimed before, or earlier in this transaction */
            return 0;
        }
        const char *v[] = {r->message_id, r->call_id, r->status, r->outcome,
                           num(&at, r->received_at)};
        if (rah_nmsgs == rah_capmsgs) {
            int c = rah_capmsgs * 2 + 16;
            char **m = realloc(rah_msgs, (size_t)c * sizeof *m);
            if (!m) return oom(err);
            rah_msgs = m;
            rah_capmsgs = c;
        }
        if (rah_grow(&rah_mmap, rah_msgs, sizeof *rah_msgs, rah_nmsgs, rah_nmsgs + 1) ||
            !(rah_msgs[rah_nmsgs] = strdup(r->message_id)))
            return oom(err);
        rah_put(&rah_mmap, r->message_id, rah_nmsgs++);
        if (rah_queue(&rah_ins, &rah_nins, &rah_capins, v, 5)) return oom(err);
        *claimed = 1;
        return 0;
    }
    const char *p[] = {r->message_id, r->call_id, r->status, r->outcome, num(&at, r->received_at)};
    int64_t n = 0;
    int rc = cmd(s,
                 "INSERT INTO onceq.result_inbox(message_id,call_id,status,outcome,received_at) "
                 "VALUES($1,$2,$3,$4,$5) ON CONFLICT DO NOTHING",
                 5, p, &n, err);
    if (!rc) *claimed = n != 0;
    return rc;
}

int oq__producer_pg_set_result(oq__producer_store_t *s, const oq__producer_result_t *r,
                               oq_error_t *err)
{
    num_t at, exp;
    int x = rah_active(s)
                ? rah_find(&rah_cmap, (char *const *)rah_calls, sizeof *rah_calls, r->call_id)
                : -1;
    if (x >= 0) {
        int rc = rah_room(s, err);
        if (rc) return rc;
        if (rah_calls[x].upd) /* a second result of the call: one row, the two applied */
            rc = rah_merge(&rah_upd[rah_calls[x].upd - 1], r);
        else {
            const char *v[] = {r->call_id,
                               r->state,
                               r->result,
                               r->error,
                               r->effect_id,
                               num(&at, r->updated_at),
                               r->settled ? "t" : "f",
                               num(&exp, r->expires_at),
                               NULL};
            rc = rah_queue(&rah_upd, &rah_nupd, &rah_capupd, v, 9);
            rah_calls[x].upd = rah_nupd;
        }
        if (rc) return oom(err);
        snprintf(rah_calls[x].st.state, sizeof rah_calls[x].st.state, "%s", r->state);
        return 0;
    }
    const char *p[] = {r->call_id,
                       r->state,
                       r->result,
                       r->error,
                       r->effect_id,
                       num(&at, r->updated_at),
                       r->settled ? "t" : "f",
                       num(&exp, r->expires_at)};
    return cmd(
        s,
        "UPDATE onceq.calls SET state=$2,result=$3,error=$4,effect_id=COALESCE($5,effect_id),"
        "updated_at=$6,next_redrive_at=CASE WHEN $7::boolean THEN NULL ELSE next_redrive_at "
        "END,settled_at=CASE WHEN $2 IN ('succeeded','failed') THEN COALESCE(settled_at,$6) "
        "ELSE NULL END,expires_at=CASE WHEN $8::bigint > 0 THEN $8::bigint ELSE expires_at END "
        "WHERE call_id=$1",
        8, p, NULL, err);
}

/* --- dead letters --------------------------------------------------------------------------- */

int oq__producer_pg_dead_list(oq__producer_store_t *s, int max, oq__producer_dead_t **rows,
                              size_t *n, oq_error_t *err)
{
    *rows = NULL;
    *n = 0;
    if (max <= 0) return 0;
    num_t m;
    const char *p[] = {num(&m, max)};
    PGresult *r = NULL;
    int rc = q(s,
               "SELECT seq,message_id,topic,key,onceq.try_jsonb(payload)->>'kind',"
               "CASE WHEN jsonb_typeof(onceq.try_jsonb(payload)->'attempt')='number' "
               "THEN (onceq.try_jsonb(payload)->>'attempt')::numeric::bigint END,reason,detail "
               "FROM onceq.outbox_dead WHERE handled_at IS NULL ORDER BY seq LIMIT $1",
               1, p, &r, err);
    if (rc) return rc;
    int cnt = PQntuples(r);
    oq__producer_dead_t *v = calloc(cnt ? (size_t)cnt : 1, sizeof *v);
    if (!v) {
        PQclear(r);
        return oom(err);
    }
    for (int i = 0; i < cnt; i++) {
        oq__producer_dead_t *d = &v[i];
        d->seq = col_i64(r, i, 0);
        d->message_id = col_dup(r, i, 1);
        d->topic = col_dup(r, i, 2);
        d->key = col_dup(r, i, 3);
        d->kind = col_dup(r, i, 4);
        d->attempt = col_i64(r, i, 5);
        d->reason = col_dup(r, i, 6);
        d->detail = col_dup(r, i, 7);
        if (!d->message_id || !d->topic || !d->key || !d->reason) {
            PQclear(r);
            oq__producer_dead_free(v, (size_t)i + 1);
            return oom(err);
        }
    }
    PQclear(r);
    *rows = v;
    *n = (size_t)cnt;
    return 0;
}

int oq__producer_pg_dead_handled(oq__producer_store_t *s, int64_t seq, int64_t now_ms,
                                 oq_error_t *err)
{
    num_t a, b;
    const char *p[] = {num(&a, seq), num(&b, now_ms)};
    return cmd(s, "UPDATE onceq.outbox_dead SET handled_at=$2 WHERE seq=$1", 2, p, NULL, err);
}

int oq__producer_pg_dead_any(oq__producer_store_t *s, int *any, oq_error_t *err)
{
    PGresult *r = NULL;
    *any = 0;
    int rc = q(s, "SELECT EXISTS(SELECT 1 FROM onceq.outbox_dead WHERE handled_at IS NULL)", 0,
               NULL, &r, err);
    if (rc) return rc;
    *any = PQntuples(r) && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return 0;
}

/* --- redrive -------------------------------------------------------------------------------- */

#define REDRIVE_COLS                                                                               \
    "call_id,tenant,idem_key,fingerprint,tool,args,state,attempt,message_id,redrive_count,"        \
    "created_at,updated_at,next_redrive_at"

static int redrive_select(oq__producer_store_t *s, const char *sql, int64_t t, int cap,
                          oq__producer_redrive_row_t *rows, int *n, oq_error_t *err)
{
    if (*n >= cap) return 0;
    num_t a, b;
    const char *p[] = {num(&a, t), num(&b, cap - *n)};
    PGresult *r = NULL;
    int rc = q(s, sql, 2, p, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r) && *n < cap; i++) {
        oq__producer_redrive_row_t *x = &rows[*n];
        memset(x, 0, sizeof *x);
        col_copy(r, i, 0, x->call_id, sizeof x->call_id);
        x->tenant = col_dup(r, i, 1);
        x->idem_key = col_dup(r, i, 2);
        col_copy(r, i, 3, x->fingerprint, sizeof x->fingerprint);
        x->tool = col_dup(r, i, 4);
        x->args = col_dup(r, i, 5);
        col_copy(r, i, 6, x->state, sizeof x->state);
        x->attempt = col_i64(r, i, 7);
        col_copy(r, i, 8, x->message_id, sizeof x->message_id);
        x->redrive_count = col_i64(r, i, 9);
        x->created_at = col_i64(r, i, 10);
        x->updated_at = col_i64(r, i, 11);
        x->next_redrive_at = col_i64(r, i, 12);
        (*n)++;
        if (!x->tenant || !x->idem_key || !x->tool || !x->args) {
            rc = oom(err);
            break;
        }
    }
    PQclear(r);
    return rc;
}

int oq__producer_pg_redrive_due(oq__producer_store_t *s, int64_t now, int64_t unchanged_since,
                                int cap, oq__producer_redrive_row_t *rows, int *n, oq_error_t *err)
{
    *n = 0;
    int rc = redrive_select(s,
                            "SELECT " REDRIVE_COLS " FROM onceq.calls WHERE next_redrive_at IS NOT "
                            "NULL AND next_redrive_at<=$1 ORDER BY next_redrive_at LIMIT $2",
                            now, cap, rows, n, err);
    if (rc == 0)
        rc =
            redrive_select(s,
                           "SELECT " REDRIVE_COLS " FROM onceq.calls WHERE next_redrive_at IS NULL "
                           "AND (state = 'pending' OR state = 'running') AND updated_at<=$1 "
                           "ORDER BY updated_at LIMIT $2",
                           unchanged_since, cap, rows, n, err);
    if (rc) {
        for (int i = 0; i < *n; i++)
            oq__producer_redrive_row_clear(&rows[i]);
        *n = 0;
    }
    return rc;
}

int oq__producer_pg_redrive_mark(oq__producer_store_t *s, const oq__producer_redrive_mark_t *m,
                                 oq_error_t *err)
{
    num_t a, b;
    const char *p[] = {m->call_id, num(&a, m->redrive_count),
                       m->next_redrive_at ? num(&b, m->next_redrive_at) : NULL, m->message_id};
    return cmd(s,
               "UPDATE onceq.calls SET redrive_count=$2,next_redrive_at=$3,"
               "message_id=COALESCE($4,message_id) WHERE call_id=$1",
               4, p, NULL, err);
}

/* --- audit ---------------------------------------------------------------------------------- */

int oq__producer_pg_audit_add(oq__producer_store_t *s, int64_t ts, const char *call_id,
                              const char *event, const char *detail, oq_error_t *err)
{
    num_t t;
    const char *p[] = {num(&t, ts), call_id, event, detail};
    if (rah_active(s)) { /* queued, in order behind the rows queued before */
        int rc = rah_room(s, err);
        if (rc) return rc;
        return rah_queue(&rah_aud, &rah_naud, &rah_capaud, p, 4) ? oom(err) : 0;
    }
    return cmd(s, "INSERT INTO onceq.audit(ts,call_id,event,detail) VALUES($1,$2,$3,$4)", 4, p,
               NULL, err);
}

int oq__producer_pg_audit_list(oq__producer_store_t *s, const char *call_id, oq_audit_row_t **rows,
                               size_t *n, oq_error_t *err)
{
    const char *p[] = {call_id};
    PGresult *r = NULL;
    int rc =
        q(s, "SELECT ts,event,detail FROM onceq.audit WHERE call_id=$1 ORDER BY id", 1, p, &r, err);
    if (rc) return rc;
    int cnt = PQntuples(r);
    oq_audit_row_t *v = calloc(cnt ? (size_t)cnt : 1, sizeof *v);
    if (!v) {
        PQclear(r);
        return oom(err);
    }
    for (int i = 0; i < cnt; i++) {
        v[i].ts = col_i64(r, i, 0);
        v[i].event = col_dup(r, i, 1);
        v[i].detail = col_dup(r, i, 2);
        if (!v[i].event) {
            PQclear(r);
            oq_audit_free(v, (size_t)i + 1);
            return oom(err);
        }
    }
    PQclear(r);
    if (cnt == 0) {
        free(v);
        v = NULL;
    }
    *rows = v;
    *n = (size_t)cnt;
    return 0;
}

/* --- retention ------------------------------------------------------------------------------ */

int oq__producer_pg_purge_batch(oq__producer_store_t *s, int64_t now_ms, int64_t ttl, int batch,
                                oq_purge_stats_t *stats, int *more, oq_error_t *err)
{
    num_t now, cut, lim;
    *more = 0;
    PGresult *r = NULL;
    int rc = oq_pg_exec(s->pg, "BEGIN", err);
    if (rc) return rc;
    /* One statement per table, each bounded by the batch: the calls first (settled, key
     * expired), then what hangs off them, in one CTE so the ids are read once. */
    const char *p3[] = {num(&now, now_ms), num(&lim, batch), num(&cut, now_ms - ttl)};
    rc = q(s,
           "WITH ids AS (SELECT call_id FROM onceq.calls WHERE expires_at<=$1 AND state IN "
           "('succeeded','failed') ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED),"
           " a AS (DELETE FROM onceq.audit WHERE call_id IN (SELECT call_id FROM ids) RETURNING 1),"
           " i AS (DELETE FROM onceq.result_inbox WHERE call_id IN (SELECT call_id FROM ids) "
           "RETURNING 1),"
           " w AS (DELETE FROM onceq.webhook_deliveries WHERE call_id IN (SELECT call_id FROM "
           "ids)),"
           " c AS (DELETE FROM onceq.calls WHERE call_id IN (SELECT call_id FROM ids) RETURNING 1),"
           " o AS (DELETE FROM onceq.outbox WHERE seq IN (SELECT seq FROM onceq.outbox WHERE "
           "pub_seq <= " WATERMARK " AND created_at<=$3 ORDER BY pub_seq LIMIT $2) RETURNING 1),"
           " u AS (DELETE FROM onceq.result_inbox WHERE message_id IN (SELECT message_id FROM "
           "onceq.result_inbox x WHERE received_at<=$3 AND NOT EXISTS (SELECT 1 FROM onceq.calls "
           "k WHERE k.call_id=x.call_id) LIMIT $2) RETURNING 1),"
           " d AS (DELETE FROM onceq.outbox_dead WHERE seq IN (SELECT seq FROM onceq.outbox_dead "
           "WHERE handled_at IS NOT NULL AND dead_at<=$3 LIMIT $2) RETURNING 1)"
           " SELECT (SELECT count(*) FROM c),(SELECT count(*) FROM a),(SELECT count(*) FROM i),"
           "(SELECT count(*) FROM o),(SELECT count(*) FROM u),(SELECT count(*) FROM d)",
           3, p3, &r, err);
    if (rc) goto fail;
    int64_t c = col_i64(r, 0, 0), ob = col_i64(r, 0, 3), orphans = col_i64(r, 0, 4),
            dead = col_i64(r, 0, 5);
    stats->calls += c;
    stats->audit += col_i64(r, 0, 1);
    stats->result_inbox += col_i64(r, 0, 2) + orphans;
    stats->outbox += ob;
    stats->dead += dead;
    PQclear(r);
    if ((rc = oq_pg_exec(s->pg, "COMMIT", err))) return rc;
    stats->batches++;
    *more = c >= batch || ob >= batch || orphans >= batch || dead >= batch;
    return 0;
fail:
    PQclear(PQexec(s->pg, "ROLLBACK"));
    return rc;
}

/* --- stats ---------------------------------------------------------------------------------- */

int oq__producer_pg_counts(oq__producer_store_t *s, oq__counts_what_t what,
                           oq__producer_counts_t *out, oq_error_t *err)
{
    memset(out, 0, sizeof *out);
    PGresult *r = NULL;
    /* One statement: one snapshot. The gauges leave out what sorts or reads more than the
     * calls' one pass (the distinct effect ids, the result inbox). */
#define COUNTS_BY_STATE                                                                            \
    "SELECT count(*),"                                                                             \
    "count(*) FILTER (WHERE state='pending'),count(*) FILTER (WHERE state='running'),"             \
    "count(*) FILTER (WHERE state='succeeded'),count(*) FILTER (WHERE state='failed'),"            \
    "count(*) FILTER (WHERE state='needs_review'),"
#define COUNTS_OUTBOX                                                                              \
    "(SELECT count(*) FROM onceq.outbox WHERE pub_seq IS NULL OR pub_seq > " WATERMARK "),"        \
    "(SELECT count(*) FROM onceq.outbox),"
#define COUNTS_OLDEST "COALESCE(min(created_at) FILTER (WHERE state='pending'),0) FROM onceq.calls"
    int rc = q(s,
               what == OQ__COUNTS_ALL ? COUNTS_BY_STATE
                   "count(DISTINCT effect_id)," COUNTS_OUTBOX
                   "(SELECT count(*) FROM onceq.result_inbox)," COUNTS_OLDEST
                                      : COUNTS_BY_STATE "0," COUNTS_OUTBOX "0," COUNTS_OLDEST,
               0, NULL, &r, err);
#undef COUNTS_BY_STATE
#undef COUNTS_OUTBOX
#undef COUNTS_OLDEST
    if (rc) return rc;
    out->calls = col_i64(r, 0, 0);
    out->pending = col_i64(r, 0, 1);
    out->running = col_i64(r, 0, 2);
    out->succeeded = col_i64(r, 0, 3);
    out->failed = col_i64(r, 0, 4);
    out->needs_review = col_i64(r, 0, 5);
    out->effects = col_i64(r, 0, 6);
    out->outbox_pending = col_i64(r, 0, 7);
    out->outbox_rows = col_i64(r, 0, 8);
    out->result_inbox = col_i64(r, 0, 9);
    out->oldest_pending_created_at = col_i64(r, 0, 10);
    PQclear(r);
    return 0;
}

/* --- webhook deliveries ---------------------------------------------------------------------- */

#define DELIVERY_COLS                                                                              \
    "delivery_id,call_id,attempt,tenant,url,body,state,tries,next_at,last_status,last_error,"      \
    "created_at,updated_at"

static int read_delivery(PGresult *r, int row, oq__producer_delivery_t *d)
{
    memset(d, 0, sizeof *d);
    col_copy(r, row, 0, d->delivery_id, sizeof d->delivery_id);
    col_copy(r, row, 1, d->call_id, sizeof d->call_id);
    d->attempt = col_i64(r, row, 2);
    d->tenant = col_dup(r, row, 3);
    d->url = col_dup(r, row, 4);
    d->body = col_dup(r, row, 5);
    col_copy(r, row, 6, d->state, sizeof d->state);
    d->tries = col_i64(r, row, 7);
    d->next_at = col_i64(r, row, 8);
    d->last_status = PQgetisnull(r, row, 9) ? -1 : col_i64(r, row, 9);
    d->last_error = col_dup(r, row, 10);
    d->created_at = col_i64(r, row, 11);
    d->updated_at = col_i64(r, row, 12);
    if (!d->tenant || !d->url || !d->body) {
        oq__producer_delivery_clear(d);
        return OQ_ENOMEM;
    }
    return 0;
}

int oq__producer_pg_delivery_add(oq__producer_store_t *s, const oq__producer_delivery_t *d,
                                 oq_error_t *err)
{
    num_t att, next, at;
    const char *p[] = {d->delivery_id, d->call_id, num(&att, d->attempt),  d->tenant,
                       d->url,         d->body,    num(&next, d->next_at), num(&at, d->created_at)};
    return cmd(s,
               "INSERT INTO onceq.webhook_deliveries(delivery_id,call_id,attempt,tenant,url,body,"
               "state,tries,next_at,created_at,updated_at) "
               "VALUES($1,$2,$3,$4,$5,$6,'pending',0,$7,$8,$8) ON CONFLICT DO NOTHING",
               8, p, NULL, err);
}

int oq__producer_pg_delivery_due(oq__producer_store_t *s, int64_t now, int cap,
                                 oq__producer_delivery_t *rows, int *n, oq_error_t *err)
{
    num_t t, lim;
    const char *p[] = {num(&t, now), num(&lim, cap)};
    PGresult *r = NULL;
    *n = 0;
    int rc = q(s,
               "SELECT " DELIVERY_COLS " FROM onceq.webhook_deliveries WHERE state = 'pending' AND "
               "next_at<=$1 ORDER BY next_at LIMIT $2",
               2, p, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r) && *n < cap; i++) {
        if (read_delivery(r, i, &rows[*n])) {
            rc = oom(err);
            break;
        }
        (*n)++;
    }
    PQclear(r);
    if (rc) {
        for (int i = 0; i < *n; i++)
            oq__producer_delivery_clear(&rows[i]);
        *n = 0;
    }
    return rc;
}

int oq__producer_pg_delivery_mark(oq__producer_store_t *s, const oq__producer_delivery_mark_t *m,
                                  int *changed, oq_error_t *err)
{
    num_t tries, next, st, up;
    const char *p[] = {m->delivery_id,
                       m->state,
                       num(&tries, m->tries),
                       m->next_at ? num(&next, m->next_at) : NULL,
                       m->last_status >= 0 ? num(&st, m->last_status) : NULL,
                       m->last_error,
                       num(&up, m->updated_at)};
    int64_t n = 0;
    int rc = cmd(s,
                 "UPDATE onceq.webhook_deliveries SET state=$2,tries=$3,next_at=$4,last_status=$5,"
                 "last_error=$6,updated_at=$7 WHERE delivery_id=$1 AND state='pending'",
                 7, p, &n, err);
    if (!rc && changed) *changed = n != 0;
    return rc;
}

static int delivery_select(oq__producer_store_t *s, const char *id, const char *call_id,
                           const char *state, int limit, oq__producer_delivery_t **rows, size_t *n,
                           oq_error_t *err);

int oq__producer_pg_delivery_of_call(oq__producer_store_t *s, const char *call_id,
                                     oq__producer_delivery_t **rows, size_t *n, oq_error_t *err)
{
    return delivery_select(s, NULL, call_id, NULL, 0, rows, n, err);
}

int oq__producer_pg_delivery_list(oq__producer_store_t *s, const char *id, const char *state,
                                  int limit, oq__producer_delivery_t **rows, size_t *n,
                                  oq_error_t *err)
{
    return delivery_select(s, id, NULL, state, limit, rows, n, err);
}

static int delivery_select(oq__producer_store_t *s, const char *id, const char *call_id,
                           const char *state, int limit, oq__producer_delivery_t **rows, size_t *n,
                           oq_error_t *err)
{
    num_t lim;
    const char *p[] = {id ? id : call_id ? call_id : state, num(&lim, limit > 0 ? limit : 100)};
    PGresult *r = NULL;
    *rows = NULL;
    *n = 0;
    int rc =
        id ? q(s, "SELECT " DELIVERY_COLS " FROM onceq.webhook_deliveries WHERE delivery_id=$1", 1,
               p, &r, err)
        : call_id ? q(s, /* a call's: the UNIQUE(call_id, attempt) index */
                      "SELECT " DELIVERY_COLS " FROM onceq.webhook_deliveries WHERE call_id=$1 "
                      "ORDER BY attempt",
                      1, p, &r, err)
                  : q(s,
                      "SELECT " DELIVERY_COLS " FROM onceq.webhook_deliveries WHERE state=$1 "
                      "ORDER BY updated_at, delivery_id LIMIT $2",
                      2, p, &r, err);
    if (rc) return rc;
    int nt = PQntuples(r);
    if (nt > 0 && !(*rows = calloc((size_t)nt, sizeof **rows))) rc = oom(err);
    for (int i = 0; !rc && i < nt; i++) {
        if (read_delivery(r, i, &(*rows)[*n])) {
            rc = oom(err);
            break;
        }
        (*n)++;
    }
    PQclear(r);
    if (rc) {
        for (size_t i = 0; i < *n; i++)
            oq__producer_delivery_clear(&(*rows)[i]);
        free(*rows);
        *rows = NULL;
        *n = 0;
    }
    return rc;
}

int oq__producer_pg_delivery_redrive(oq__producer_store_t *s, const char *id, int64_t now,
                                     int *changed, oq_error_t *err)
{
    num_t t;
    const char *p[] = {id, num(&t, now)};
    int64_t n = 0;
    int rc = cmd(s,
                 "UPDATE onceq.webhook_deliveries SET state='pending',tries=0,next_at=$2,"
                 "updated_at=$2,created_at=$2 WHERE delivery_id=$1 AND state='dead'",
                 2, p, &n, err);
    if (!rc) *changed = n != 0;
    return rc;
}

int oq__producer_pg_delivery_counts(oq__producer_store_t *s, int64_t *pending,
                                    int64_t *oldest_created_at, int64_t *dead, oq_error_t *err)
{
    PGresult *r = NULL;
    int rc = q(s,
               "SELECT (SELECT count(*) FROM onceq.webhook_deliveries WHERE state = 'pending'),"
               "(SELECT COALESCE(min(created_at),0) FROM onceq.webhook_deliveries WHERE "
               "state = 'pending'),"
               "(SELECT count(*) FROM onceq.webhook_deliveries WHERE state = 'dead')",
               0, NULL, &r, err);
    if (rc) return rc;
    *pending = col_i64(r, 0, 0);
    *oldest_created_at = col_i64(r, 0, 1);
    *dead = col_i64(r, 0, 2);
    PQclear(r);
    return 0;
}

/* --- the operators' list of calls (onceq console) --------------------------------------------- */

/*
 * A position is the first 15 hex digits of a call id (its creation millisecond << 12, plus 12
 * random bits): "before P" is call_id < 'c_' || hex15(P), a range of the primary key in the
 * order ids sort (hex digits and one prefix: the same in the C collation and the usual
 * glibc/ICU ones). Two calls of one millisecond share a position once in 4096: a page never
 * ends inside such a group (its tail is left to the next page, or, when the group is the whole
 * page, the page holds all of it), so paging skips and repeats nothing. Filters no index answers
 * read a window of OQ__PG_LIST_SCAN rows at most, as on SQLite, so a page is bounded work at any
 * table size.
 */
#define OQ__PG_LIST_SCAN 200000
#define POS_HEX 15

static int64_t pos_of(const char *call_id)
{
    char h[POS_HEX + 1];
    if (strncmp(call_id, "c_", 2) != 0) return 0;
    snprintf(h, sizeof h, "%s", call_id + 2);
    return strlen(h) == POS_HEX ? strtoll(h, NULL, 16) : 0;
}

static const char *pos_bound(char out[24], int64_t pos)
{
    snprintf(out, 24, "c_%015llx", (unsigned long long)pos & 0xfffffffffffffffULL);
    return out;
}

int oq__producer_pg_pos_at(oq__producer_store_t *s, int64_t t, int64_t *pos, oq_error_t *err)
{
    (void)s;
    (void)err;
    *pos = t > 0 ? t << 12 : 0;
    return 0;
}

/* One query of a page: the calls with hi > id >= lo (bounds as text) among the \p window
 * newest of that range, filtered, newest first, at most \p limit, into a new array. */
static int page_query(oq__producer_store_t *s, const oq__producer_list_q_t *lq, const char *hi,
                      const char *lo, int limit, int window, oq__producer_listed_t **out, int *n,
                      oq_error_t *err)
{
    char sql[1024];
    num_t a, b, lim, win;
    snprintf(sql, sizeof sql,
             "SELECT " CALL_COLS " FROM (SELECT * FROM onceq.calls WHERE call_id < $1 AND "
             "call_id >= $2%s ORDER BY call_id DESC LIMIT $9) w WHERE true%s%s%s%s "
             "ORDER BY call_id DESC LIMIT $8",
             /* a status inside the window: the calls_state_id index (0006) walks that status's
              * calls alone, so a rare one costs its page, not a window of every status */
             lq->state ? " AND state=$3" : " AND $3::text IS NULL",
             lq->tool ? " AND tool=$4" : " AND $4::text IS NULL",
             lq->tenant ? " AND tenant=$5" : " AND $5::text IS NULL",
             lq->since_ms ? " AND created_at >= $6::bigint" : " AND $6::text IS NULL",
             lq->until_ms ? " AND created_at <= $7::bigint" : " AND $7::text IS NULL");
    const char *p[] = {hi,
                       lo,
                       lq->state,
                       lq->tool,
                       lq->tenant,
                       lq->since_ms ? num(&a, lq->since_ms) : NULL,
                       lq->until_ms ? num(&b, lq->until_ms) : NULL,
                       num(&lim, limit),
                       num(&win, window)};
    PGresult *r = NULL;
    int rc = q(s, sql, 9, p, &r, err);
    if (rc) return rc;
    int k = PQntuples(r);
    oq__producer_listed_t *v = calloc((size_t)(k ? k : 1), sizeof *v);
    if (!v) {
        PQclear(r);
        return oom(err);
    }
    for (int i = 0; i < k; i++) {
        if (read_call(r, i, &v[i].call)) {
            PQclear(r);
            oq__producer_listed_free(v, (size_t)i);
            return oom(err);
        }
        v[i].pos = pos_of(v[i].call.call_id);
    }
    PQclear(r);
    *out = v;
    *n = k;
    return 0;
}

/* Leaves out the rows of position \p pos at the end of \p v (the next page shows them). */
static int drop_tail(oq__producer_listed_t *v, int k, int64_t pos)
{
    while (k > 0 && v[k - 1].pos == pos)
        oq_call_clear(&v[--k].call);
    return k;
}

int oq__producer_pg_list(oq__producer_store_t *s, const oq__producer_list_q_t *lq,
                         oq__producer_listed_t **out, size_t *n, int64_t *next, oq_error_t *err)
{
    char hb[24], lb[24], gb[24];
    int64_t lo = lq->floor > 0 ? lq->floor : 0;
    /* a call id may be drawn before its created_at (the submit's queue wait): a minute of slack */
    if (lq->since_ms > 60000 && lo > ((lq->since_ms - 60000) << 12))
        lo = (lq->since_ms - 60000) << 12;
    int filtered = lq->state || lq->tool || lq->tenant || lq->since_ms || lq->until_ms;
    const char *hi_s = lq->before > 0 ? pos_bound(hb, lq->before) : "c_g"; /* above every id */
    const char *lo_s = lo > 0 ? pos_bound(lb, lo) : "";
    oq__producer_listed_t *v = NULL;
    int k = 0, rc;
    /* one row more than the page: does the last row's position go on below it? */
    if ((rc = page_query(s, lq, hi_s, lo_s, lq->limit + 1,
                         filtered ? OQ__PG_LIST_SCAN : lq->limit + 1, &v, &k, err)))
        return rc;
    *next = 0;
    if (k > lq->limit) {
        /* full: the next page starts below the last row's position. When the row after the
         * page has that position too (two calls of one millisecond), the position's calls go
         * wholly to the next page, or, when they are the whole page, all come on this one. */
        int64_t last = v[lq->limit - 1].pos, after = v[lq->limit].pos;
        oq_call_clear(&v[--k].call);
        int keep = k;
        while (after == last && keep > 0 && v[keep - 1].pos == last)
            keep--;
        if (after != last) {
            *next = last;
        } else if (keep > 0) {
            k = drop_tail(v, k, last);
            *next = last + 1;
        } else {
            oq__producer_listed_free(v, (size_t)k);
            v = NULL;
            if ((rc = page_query(s, lq, pos_bound(gb, last + 1), pos_bound(hb, last), 1000, 1000,
                                 &v, &k, err)))
                return rc;
            *next = last;
        }
    } else if (filtered) {
        /* not full: was the window cut short of the range? then the next page goes on from
         * the window's last position, whose calls this page leaves to it */
        num_t win;
        const char *pw[] = {hi_s, lo_s, num(&win, OQ__PG_LIST_SCAN - 1), lq->state};
        PGresult *r = NULL;
        if ((rc =
                 q(s,
                   lq->state ? "SELECT call_id FROM onceq.calls WHERE call_id < $1 AND call_id "
                               ">= $2 AND state=$4 ORDER BY call_id DESC OFFSET $3 LIMIT 1"
                             : "SELECT call_id FROM onceq.calls WHERE call_id < $1 AND call_id "
                               ">= $2 AND $4::text IS NULL ORDER BY call_id DESC OFFSET $3 LIMIT 1",
                   4, pw, &r, err))) {
            oq__producer_listed_free(v, (size_t)k);
            return rc;
        }
        if (PQntuples(r) == 1) {
            int64_t end = pos_of(PQgetvalue(r, 0, 0));
            k = drop_tail(v, k, end);
            *next = end + 1;
        }
        PQclear(r);
    }
    *out = v;
    *n = (size_t)k;
    return 0;
}

int oq__producer_pg_next_tenant(oq__producer_store_t *s, const char *after,
                                char out[OQ_MAX_NAME_LEN + 1], oq_error_t *err)
{
    const char *p[] = {after ? after : ""};
    PGresult *r = NULL;
    out[0] = 0;
    int rc = q(s, "SELECT tenant FROM onceq.calls WHERE tenant > $1 ORDER BY tenant LIMIT 1", 1, p,
               &r, err);
    if (rc) return rc;
    if (PQntuples(r) == 1) col_copy(r, 0, 0, out, OQ_MAX_NAME_LEN + 1);
    PQclear(r);
    return 0;
}

/* --- tasks ----------------------------------------------------------------------------------- */

/* Task rows (schema/postgres/0006_tasks.sql), the twins of store.c's: the same statements on
 * schema `onceq`; the list pages on tasks.pos (an identity drawn at insert) where SQLite pages
 * on the rowid. The results ingest asks, for every result it applies, whether the call belongs
 * to a task (oq__producer_pg_task_of_call): within a batch read ahead (above) that is one
 * statement for the batch's calls, not one per result, and it runs without writing the queued
 * rows first (task_calls is never queued). What it read is forgotten when the next batch is
 * read ahead (oq__producer_pg_task_forget, from store.c) and used only while this one is. */

#define PG_TASK_COLS                                                                               \
    "task_id,tenant,idem_key,fingerprint,spec,status,reason,created_at,updated_at,review_fence"

/* A statement parsed each time (not prepared: rare, and the session's prepared set is kept
 * for the hot path), after the queued result rows are written. */
static int q_once(oq__producer_store_t *s, const char *sql, int n, const char *const *p,
                  PGresult **r, oq_error_t *err)
{
    int rc = rah_flush(s, err);
    return rc ? rc : oq_pg_query(s->pg, sql, n, p, r, err);
}

/* The task links of the calls read ahead, read once per batch (tk_read): those found. */
typedef struct {
    char call_id[OQ_CALL_ID_LEN + 1];
    char task_id[OQ_TASK_ID_LEN + 1];
    int idx, is_comp;
} tk_link_t;
static _Thread_local int tk_read;         /* the batch's links were read */
static _Thread_local tk_link_t *tk_links; /* found */
static _Thread_local int tk_nlinks, tk_caplinks;

void oq__producer_pg_task_forget(void)
{
    free(tk_links);
    tk_links = NULL;
    tk_nlinks = tk_caplinks = 0;
    tk_read = 0;
}

static int tk_add(const char *call_id, const char *task_id, int idx, int is_comp)
{
    if (tk_nlinks == tk_caplinks) {
        int c = tk_caplinks ? tk_caplinks * 2 : 16;
        tk_link_t *v = realloc(tk_links, (size_t)c * sizeof *v);
        if (!v) return -1;
        tk_links = v;
        tk_caplinks = c;
    }
    tk_link_t *l = &tk_links[tk_nlinks++];
    snprintf(l->call_id, sizeof l->call_id, "%s", call_id);
    snprintf(l->task_id, sizeof l->task_id, "%s", task_id);
    l->idx = idx;
    l->is_comp = is_comp;
    return 0;
}

/* Read the task links of every call read ahead, in one statement. */
static int tk_read_batch(oq__producer_store_t *s, oq_error_t *err)
{
    oq_pg_array_t ids;
    oq_pg_array_init(&ids, 't');
    for (int i = 0; i < rah_ncalls; i++)
        oq_pg_array_add(&ids, rah_calls[i].call_id);
    const char *p[1];
    int len[1];
    if (oq_pg_array_end(&ids, &p[0], &len[0])) {
        oq_pg_array_free(&ids);
        return oom(err);
    }
    PGresult *r = NULL;
    int rc = oq_pg_run_bin(s->pg,
                           "SELECT call_id,task_id,idx,role FROM onceq.task_calls WHERE "
                           "call_id=ANY($1::text[])",
                           1, p, len, oq_pg_bin, &r, err);
    oq_pg_array_free(&ids);
    if (rc) return rc;
    oq__producer_pg_task_forget();
    for (int i = 0; i < PQntuples(r); i++)
        if (tk_add(PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), (int)col_i64(r, i, 2),
                   strcmp(PQgetvalue(r, i, 3), "compensate") == 0)) {
            PQclear(r);
            oq__producer_pg_task_forget();
            return oom(err);
        }
    PQclear(r);
    tk_read = 1;
    return 0;
}

int oq__producer_pg_task_insert(oq__producer_store_t *s, const oq__task_row_t *t, int *exists,
                                oq_error_t *err)
{
    num_t at;
    const char *p[] = {t->task_id, t->tenant, t->idem_key, t->fingerprint,
                       t->spec,    t->status, t->reason,   num(&at, t->created_at)};
    int64_t n = 0;
    int rc = cmd(s,
                 "INSERT INTO onceq.tasks(task_id,tenant,idem_key,fingerprint,spec,status,reason,"
                 "created_at,updated_at) VALUES($1,$2,$3,$4,$5,$6,$7,$8,$8) "
                 "ON CONFLICT(tenant,idem_key) DO NOTHING",
                 8, p, &n, err);
    if (!rc) *exists = n == 0;
    return rc;
}

int oq__producer_pg_task_get(oq__producer_store_t *s, const char *task_id, const char *tenant,
                             const char *idem_key, oq__task_row_t *out, oq_error_t *err)
{
    PGresult *r = NULL;
    int rc;
    /* In a transaction the row is locked until its end: a task read to be changed (a result of
     * its step, an operator's decision, a compensation retry, from this process or another on
     * the same database) is changed by one transaction at a time, as BEGIN IMMEDIATE does on
     * SQLite; the second reads what the first committed. */
    int lock = oq__producer_pg_in_tx(s);
    if (task_id) {
        const char *p[] = {task_id};
        rc = q(s,
               lock ? "SELECT " PG_TASK_COLS " FROM onceq.tasks WHERE task_id=$1 FOR UPDATE"
                    : "SELECT " PG_TASK_COLS " FROM onceq.tasks WHERE task_id=$1",
               1, p, &r, err);
    } else {
        const char *p[] = {tenant && *tenant ? tenant : OQ_DEFAULT_TENANT, idem_key};
        rc = q(s,
               lock ? "SELECT " PG_TASK_COLS
                      " FROM onceq.tasks WHERE tenant=$1 AND idem_key=$2 FOR UPDATE"
                    : "SELECT " PG_TASK_COLS " FROM onceq.tasks WHERE tenant=$1 AND idem_key=$2",
               2, p, &r, err);
    }
    memset(out, 0, sizeof *out);
    if (rc) return rc;
    if (PQntuples(r) == 0) {
        PQclear(r);
        return oq_error_set(err, OQ_ENOTFOUND, 0, "no such task");
    }
    col_copy(r, 0, 0, out->task_id, sizeof out->task_id);
    out->tenant = col_dup(r, 0, 1);
    out->idem_key = col_dup(r, 0, 2);
    col_copy(r, 0, 3, out->fingerprint, sizeof out->fingerprint);
    out->spec = col_dup(r, 0, 4);
    col_copy(r, 0, 5, out->status, sizeof out->status);
    out->reason = col_dup(r, 0, 6);
    out->created_at = col_i64(r, 0, 7);
    out->updated_at = col_i64(r, 0, 8);
    out->review_fence = col_i64(r, 0, 9);
    PQclear(r);
    if (!out->tenant || !out->idem_key || !out->spec) {
        oq__task_row_clear(out);
        return oom(err);
    }
    return 0;
}

int oq__producer_pg_task_update(oq__producer_store_t *s, const oq__task_row_t *t, oq_error_t *err)
{
    num_t at, fence;
    const char *p[] = {t->task_id, t->status, t->reason, num(&at, t->updated_at),
                       num(&fence, t->review_fence)};
    return cmd(s,
               "UPDATE onceq.tasks SET status=$2,reason=$3,updated_at=$4,review_fence=$5 WHERE "
               "task_id=$1",
               5, p, NULL, err);
}

int oq__producer_pg_task_step_put(oq__producer_store_t *s, const char *task_id,
                                  const oq__task_step_row_t *r, oq_error_t *err)
{
    num_t idx, att, next;
    const char *p[] = {task_id,
                       num(&idx, r->idx),
                       r->name,
                       r->status,
                       r->call_id[0] ? r->call_id : NULL,
                       r->comp_call_id[0] ? r->comp_call_id : NULL,
                       num(&att, r->comp_attempts),
                       r->comp_next_at ? num(&next, r->comp_next_at) : NULL};
    return cmd(s,
               "INSERT INTO onceq.task_steps(task_id,idx,name,status,call_id,comp_call_id,"
               "comp_attempts,comp_next_at) VALUES($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT(task_id,"
               "idx) DO UPDATE SET status=excluded.status,call_id=excluded.call_id,comp_call_id="
               "excluded.comp_call_id,comp_attempts=excluded.comp_attempts,comp_next_at="
               "excluded.comp_next_at",
               8, p, NULL, err);
}

int oq__producer_pg_task_steps(oq__producer_store_t *s, const char *task_id,
                               oq__task_step_row_t **v, size_t *n, oq_error_t *err)
{
    *v = NULL;
    *n = 0;
    const char *p[] = {task_id};
    PGresult *r = NULL;
    int rc = q(s,
               "SELECT s.idx,s.name,s.status,s.call_id,s.comp_call_id,s.comp_attempts,"
               "s.comp_next_at,c.state,c.result,c.error,c.attempt,k.state,k.result,k.error,"
               "k.attempt FROM onceq.task_steps s LEFT JOIN onceq.calls c ON c.call_id=s.call_id "
               "LEFT JOIN onceq.calls k ON k.call_id=s.comp_call_id WHERE s.task_id=$1 ORDER BY "
               "s.idx",
               1, p, &r, err);
    if (rc) return rc;
    int cnt = PQntuples(r);
    oq__task_step_row_t *rows = calloc(cnt ? (size_t)cnt : 1, sizeof *rows);
    if (!rows) {
        PQclear(r);
        return oom(err);
    }
    for (int i = 0; i < cnt; i++) {
        oq__task_step_row_t *x = &rows[i];
        x->idx = (int)col_i64(r, i, 0);
        x->name = col_dup(r, i, 1);
        col_copy(r, i, 2, x->status, sizeof x->status);
        col_copy(r, i, 3, x->call_id, sizeof x->call_id);
        col_copy(r, i, 4, x->comp_call_id, sizeof x->comp_call_id);
        x->comp_attempts = col_i64(r, i, 5);
        x->comp_next_at = col_i64(r, i, 6);
        col_copy(r, i, 7, x->call_state, sizeof x->call_state);
        x->result = col_dup(r, i, 8);
        x->error = col_dup(r, i, 9);
        x->call_attempt = col_i64(r, i, 10);
        col_copy(r, i, 11, x->comp_state, sizeof x->comp_state);
        x->comp_result = col_dup(r, i, 12);
        x->comp_error = col_dup(r, i, 13);
        x->comp_attempt = col_i64(r, i, 14);
        if (!x->name) {
            PQclear(r);
            oq__task_steps_free(rows, (size_t)i + 1);
            return oom(err);
        }
    }
    PQclear(r);
    if (cnt == 0) {
        free(rows);
        rows = NULL;
    }
    *v = rows;
    *n = (size_t)cnt;
    return 0;
}

int oq__producer_pg_task_link(oq__producer_store_t *s, const char *call_id, const char *task_id,
                              int idx, const char *role, oq_error_t *err)
{
    num_t i;
    const char *p[] = {call_id, task_id, num(&i, idx), role};
    int64_t n = 0;
    int rc = cmd(s,
                 "INSERT INTO onceq.task_calls(call_id,task_id,idx,role) VALUES($1,$2,$3,$4) "
                 "ON CONFLICT(call_id) DO NOTHING",
                 4, p, &n, err);
    /* a call of the batch read ahead linked now (a step's key replayed it): its result, still
     * to come in this batch, must find its task */
    if (!rc && n == 1 && tk_read && tk_add(call_id, task_id, idx, strcmp(role, "compensate") == 0))
        oq__producer_pg_task_forget(); /* out of memory: read again when asked */
    return rc;
}

int oq__producer_pg_task_of_call(oq__producer_store_t *s, const char *call_id,
                                 char task_id[OQ_TASK_ID_LEN + 1], int *idx, int *is_comp,
                                 int *found, oq_error_t *err)
{
    *found = 0;
    if (rah_active(s) &&
        rah_find(&rah_cmap, (char *const *)rah_calls, sizeof *rah_calls, call_id) >= 0) {
        int rc = tk_read ? 0 : tk_read_batch(s, err);
        if (rc) return rc;
        for (int i = 0; i < tk_nlinks; i++)
            if (strcmp(tk_links[i].call_id, call_id) == 0) {
                snprintf(task_id, OQ_TASK_ID_LEN + 1, "%s", tk_links[i].task_id);
                *idx = tk_links[i].idx;
                *is_comp = tk_links[i].is_comp;
                *found = 1;
                break;
            }
        return 0;
    }
    const char *p[] = {call_id};
    PGresult *r = NULL;
    int rc = q(s, "SELECT task_id,idx,role FROM onceq.task_calls WHERE call_id=$1", 1, p, &r, err);
    if (rc) return rc;
    if (PQntuples(r) == 1) {
        col_copy(r, 0, 0, task_id, OQ_TASK_ID_LEN + 1);
        *idx = (int)col_i64(r, 0, 1);
        *is_comp = strcmp(PQgetvalue(r, 0, 2), "compensate") == 0;
        *found = 1;
    }
    PQclear(r);
    return 0;
}

int oq__producer_pg_task_due(oq__producer_store_t *s, int64_t now, int cap,
                             char (*task_ids)[OQ_TASK_ID_LEN + 1], int *idx, int *n,
                             oq_error_t *err)
{
    num_t t, lim;
    const char *p[] = {num(&t, now), num(&lim, cap)};
    PGresult *r = NULL;
    *n = 0;
    int rc = q_once(s,
                    "SELECT task_id,idx FROM onceq.task_steps WHERE comp_next_at IS NOT NULL AND "
                    "comp_next_at<=$1 ORDER BY comp_next_at LIMIT $2",
                    2, p, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r) && *n < cap; i++) {
        col_copy(r, i, 0, task_ids[*n], OQ_TASK_ID_LEN + 1);
        idx[*n] = (int)col_i64(r, i, 1);
        (*n)++;
    }
    PQclear(r);
    return 0;
}

int oq__producer_pg_task_list(oq__producer_store_t *s, const oq__task_list_q_t *lq, char ***ids,
                              size_t *n, int64_t *next, oq_error_t *err)
{
    int limit = lq->limit > 0 ? lq->limit : 100;
    num_t before, lim;
    const char *p[] = {lq->status, lq->tenant, lq->idem_key,
                       num(&before, lq->before > 0 ? lq->before : INT64_MAX),
                       num(&lim, limit + 1)}; /* one more: is there a next page */
    PGresult *r = NULL;
    *ids = NULL;
    *n = 0;
    *next = 0;
    /* a status walks tasks_status (status, pos): that status's tasks alone, in order */
    int rc =
        q_once(s,
               lq->status ? "SELECT pos,task_id FROM onceq.tasks WHERE status=$1 AND ($2::text "
                            "IS NULL OR tenant=$2) AND ($3::text IS NULL OR idem_key=$3) AND "
                            "pos<$4::bigint ORDER BY pos DESC LIMIT $5"
                          : "SELECT pos,task_id FROM onceq.tasks WHERE $1::text IS NULL AND "
                            "($2::text IS NULL OR tenant=$2) AND ($3::text IS NULL OR "
                            "idem_key=$3) AND pos<$4::bigint ORDER BY pos DESC LIMIT $5",
               5, p, &r, err);
    if (rc) return rc;
    int cnt = PQntuples(r), k = cnt > limit ? limit : cnt;
    char **v = calloc((size_t)(k ? k : 1), sizeof *v);
    if (!v) {
        PQclear(r);
        return oom(err);
    }
    for (int i = 0; i < k; i++)
        if (!(v[i] = col_dup(r, i, 1))) {
            for (int j = 0; j < i; j++)
                free(v[j]);
            free(v);
            PQclear(r);
            return oom(err);
        }
    if (cnt > limit) *next = col_i64(r, limit - 1, 0);
    PQclear(r);
    *ids = v;
    *n = (size_t)k;
    return 0;
}

int oq__producer_pg_task_recovery(oq__producer_store_t *s, int64_t *operator_, int64_t *rerun,
                                  oq_error_t *err)
{
    PGresult *r = NULL;
    /* one statement, one snapshot: a count over the status index and one probe of the audit
     * per task; steps written as more than one call */
    int rc = q_once(s,
                    "SELECT (SELECT count(*) FROM onceq.tasks t WHERE t.status='needs_review' OR "
                    "EXISTS (SELECT 1 FROM onceq.audit a WHERE a.call_id=t.task_id AND "
                    "a.event='task_review' AND onceq.try_jsonb(a.detail)->>'as' NOT IN "
                    "('approve','reject'))),(SELECT count(*) FROM (SELECT 1 FROM onceq.task_calls "
                    "WHERE role='step' GROUP BY task_id,idx HAVING count(*) > 1) x)",
                    0, NULL, &r, err);
    if (rc) return rc;
    *operator_ = col_i64(r, 0, 0);
    *rerun = col_i64(r, 0, 1);
    PQclear(r);
    return 0;
}

int oq__producer_pg_task_counts(oq__producer_store_t *s, const char *tenant,
                                int64_t by[OQ_TASK_NSTATUS], int64_t *comp_ok, int64_t *comp_review,
                                oq_error_t *err)
{
    const char *p[] = {tenant};
    PGresult *r = NULL;
    /* one statement, one snapshot: tasks by status (column 2 = 0), then the steps whose
     * compensation was written, by status (1); the whole table or one tenant's tasks */
    int rc = q_once(
        s,
        tenant ? "SELECT status,count(*),0 FROM onceq.tasks WHERE tenant=$1 GROUP BY status "
                 "UNION ALL SELECT s.status,count(*),1 FROM onceq.task_steps s JOIN onceq.tasks t "
                 "ON t.task_id=s.task_id WHERE s.comp_call_id IS NOT NULL AND t.tenant=$1 GROUP "
                 "BY s.status"
               : "SELECT status,count(*),0 FROM onceq.tasks GROUP BY status UNION ALL SELECT "
                 "status,count(*),1 FROM onceq.task_steps WHERE comp_call_id IS NOT NULL GROUP "
                 "BY status",
        tenant ? 1 : 0, tenant ? p : NULL, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *k = PQgetvalue(r, i, 0);
        int64_t c = col_i64(r, i, 1);
        if (col_i64(r, i, 2) == 0) {
            for (int j = 0; j < OQ_TASK_NSTATUS; j++)
                if (strcmp(k, oq__task_statuses[j]) == 0) by[j] = c;
        } else if (strcmp(k, "compensated") == 0) {
            *comp_ok = c;
        } else if (strcmp(k, "needs_review") == 0) {
            *comp_review = c;
        }
    }
    PQclear(r);
    return 0;
}
