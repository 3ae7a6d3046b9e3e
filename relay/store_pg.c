/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store_pg.c: all SQL of the relay on PostgreSQL (schema `onceq`, schema/postgres/), the twin of
 * store.c behind relay_store.h; store.c hands an operation here when its database setting is a
 * PostgreSQL URI or keyword string. relay.c does not know which one runs.
 *
 * Publish order (see docs/DESIGN.md, "The relay on PostgreSQL"). relay.c keeps one number of
 * progress, a watermark: every row at or below it was delivered. On SQLite that number is the
 * outbox's seq, which is safe there because one writer commits in seq order. On PostgreSQL seq is
 * handed out at INSERT, and transactions commit in any order: a transaction holding seq 100 can
 * commit after seq 101 was published, and a watermark over seq would pass 100 for ever. So the
 * relay's numbers are not seq but pub_seq, drawn by the relay itself from a sequence for rows
 * that are already committed, in short "assign" transactions that take one advisory lock
 * (every relay on this database serializes on it, a fenced one included) and commit before any
 * read looks at their numbers. A row invisible to an assign (its transaction still open, or
 * rolled back) keeps pub_seq NULL and gets a number in a later assign, larger than every number
 * handed out before: it lands above the watermark, never below. So every pub_seq at or below
 * the watermark was final when the relay read it, and no row can appear there later. The assign
 * does not lock the rows it numbers (no FOR UPDATE): under the advisory lock it is the only
 * writer that gives a NULL pub_seq a number, and the other writers of outbox rows (republish,
 * retention) touch only rows numbered at or below the watermark, which the assign never selects.
 * Each row lock was a WAL record and a write to the row's page, for nothing.
 *
 * Leases are decided on the database server's clock: expires_at is a timestamptz compared with
 * clock_timestamp(), so relays on hosts whose clocks disagree still agree on who holds the
 * lease; the now_ms the relay passes is ignored here (its own renew schedule is relative). The
 * fencing check (owner, fence, unexpired) sits in every write's WHERE clause, as on SQLite.
 *
 * Waking: LISTEN onceq_outbox while the relay holds the lease, never as a standby (listen_as;
 * a trigger, or onceq's writers after their commit, NOTIFY at every insert's commit). The idle
 * relay polls the connection's socket (oq__relay_pg_notify_fd), which a notification makes
 * readable; data_version consumes the input, counts the notifications received and also changes
 * once a second, so an idle relay reads at least that often even if a notification was missed (a
 * connection lost and re-established).
 *
 * A lost connection is re-established before the next operation (PQreset, LISTEN again if it
 * listened); the operation that met it fails retriably and relay.c retries as after any
 * database error.
 * Statements are prepared once per connection (oq_pg_prepared(), oq_pg_run(): prepared again
 * after a reconnect). A read cycle (the assign's transaction, then the read) is one round trip:
 * its five statements go in one libpq pipeline (assign_and_read).
 */
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_log.h"
#include "oq_pg.h"
#include "oq_pg_rows.h"
#include "oq_util.h"
#include "relay_store.h"
#include "store_pg.h"

struct oq__relay_pg {
    PGconn *c;
    int listening;           /* LISTEN onceq_outbox: while this relay holds the lease */
    int64_t notes;           /* notifications received */
    int64_t reads, read_rts; /* oq__relay_pg_read calls, and their round trips */
};

/* The advisory lock key of the assign step ("onceq-relay" as a number of our own). */
#define ASSIGN_LOCK "x'6f6e6365712d72'::bigint"

#define WATERMARK "(SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease)"

/* Counts and frees the notifications libpq has read: a list of its own that only PQnotifies
 * empties (each one a malloc until then). */
static void drain(oq__relay_pg_t *p)
{
    PGnotify *n;
    while ((n = PQnotifies(p->c)) != NULL) {
        p->notes++;
        PQfreemem(n);
    }
}

/* LISTEN while this relay holds the lease, UNLISTEN when it does not: a standby reads nothing
 * it would be woken for, and a listening connection costs the server a signal and a wake-up of
 * its backend at every NOTIFY, and costs the client memory until it drains (a standby, whose
 * loop only asks for the lease, never drained: its list grew with every commit of every host).
 * Turned on before the acquire returns, so every commit after the holder's first read wakes
 * it. */
static int listen_as(oq__relay_pg_t *p, int on, oq_error_t *err)
{
    int rc = 0;
    if (on != p->listening) {
        rc = oq_pg_exec(p->c, on ? "LISTEN onceq_outbox" : "UNLISTEN onceq_outbox", err);
        if (!rc) p->listening = on;
    }
    drain(p);
    return rc;
}

/* Reconnects a connection the server closed; the caller's operation then runs on it. */
static int ready(oq__relay_pg_t *p, oq_error_t *err)
{
    if (PQstatus(p->c) == CONNECTION_OK) return 0;
    PQreset(p->c);
    if (PQstatus(p->c) != CONNECTION_OK) return oq_pg_error(p->c, NULL, err, "relay reconnect");
    int rc = oq_pg_exec(p->c, "SET synchronous_commit = on", err);
    if (!rc && p->listening) rc = oq_pg_exec(p->c, "LISTEN onceq_outbox", err);
    if (!rc) OQ_LOG_INFO("relay", "reconnected to PostgreSQL");
    return rc;
}

static void rollback(oq__relay_pg_t *p)
{
    if (PQstatus(p->c) == CONNECTION_OK && PQtransactionStatus(p->c) != PQTRANS_IDLE)
        PQclear(PQexec(p->c, "ROLLBACK"));
}

int oq__relay_pg_open(const char *conninfo, oq__relay_pg_t **out, oq_error_t *err)
{
    *out = NULL;
    oq__relay_pg_t *p = calloc(1, sizeof *p);
    if (!p) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    int rc = oq_pg_connect(conninfo, &p->c, err), v = 0;
    if (!rc) rc = oq_pg_prepared(p->c, err);
    if (!rc) rc = oq_pg_schema_version(p->c, &v, err);
    if (!rc && v < 1)
        rc = oq_error_set(err, OQ_EDB, 0,
                          "database has no schema onceq (not migrated yet? onceq migrate --db URL, "
                          "or start the producer once)");
    if (rc) {
        oq__relay_pg_close(p);
        return rc;
    }
    *out = p;
    return 0;
}

void oq__relay_pg_close(oq__relay_pg_t *p)
{
    if (!p) return;
    if (p->c) PQfinish(p->c);
    free(p);
}

int oq__relay_pg_data_version(oq__relay_pg_t *p, int64_t *out, oq_error_t *err)
{
    int rc = ready(p, err);
    if (rc) return rc;
    if (!PQconsumeInput(p->c)) return oq_pg_error(p->c, NULL, err, "relay notifications");
    drain(p);
    *out = p->notes * 1000000 + oq_mono_us() / 1000000; /* and once a second regardless */
    return 0;
}

PGconn *oq__relay_pg_conn(oq__relay_pg_t *p)
{
    return p ? p->c : NULL;
}

int oq__relay_pg_notify_fd(oq__relay_pg_t *p)
{
    return p && p->c && PQstatus(p->c) == CONNECTION_OK ? PQsocket(p->c) : -1;
}

/* --- lease ---------------------------------------------------------------------------------- */

static int lease_acquire(oq__relay_pg_t *p, const char *name, const char *owner, int64_t lease_ms,
                         int64_t *fence, int *held, char *holder, size_t holder_cap,
                         int64_t *published_seq, oq_error_t *err)
{
    num_t l, f;
    PGresult *r = NULL;
    *held = 0;
    if (published_seq) *published_seq = 0;
    if (holder && holder_cap) holder[0] = '\0';
    int rc = ready(p, err);
    if (rc) return rc;
    /* A standby asks every 100 ms or so. A lease that another owner holds, live, is seen by a
     * plain read: no transaction, no row lock, no commit (the lock made it a WAL flush each
     * time). Only a lease that looks missing, lapsed or ours takes the locked path below, which
     * decides again on the row it locked: the fencing is the same. */
    const char *get[] = {name};
    if ((rc = oq_pg_run(p->c,
                        "SELECT owner, fence, expires_at > clock_timestamp(), published_seq "
                        "FROM onceq.relay_lease WHERE name = $1",
                        1, get, &r, err)))
        return rc;
    if (PQntuples(r) == 1 && PQgetvalue(r, 0, 2)[0] == 't' &&
        (strcmp(PQgetvalue(r, 0, 0), owner) != 0 ||
         strtoll(PQgetvalue(r, 0, 1), NULL, 10) != *fence)) {
        if (published_seq) *published_seq = strtoll(PQgetvalue(r, 0, 3), NULL, 10);
        if (holder && holder_cap) snprintf(holder, holder_cap, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        return 0; /* someone else holds it */
    }
    PQclear(r);
    r = NULL;
    if ((rc = oq_pg_exec(p->c, "BEGIN", err))) return rc;
    const char *ins[] = {name, owner, num(&l, lease_ms)};
    /* A missing row is ours (fence 1); a concurrent insert of the same name wins or loses on
     * the primary key without an error. */
    if ((rc = oq_pg_run_cmd(p->c,
                            "INSERT INTO onceq.relay_lease(name, owner, fence, expires_at) VALUES "
                            "($1, $2, 0, '-infinity') ON CONFLICT (name) DO NOTHING",
                            2, ins, NULL, err)))
        goto out;
    if ((rc = oq_pg_run(p->c,
                        "SELECT owner, fence, expires_at > clock_timestamp(), published_seq "
                        "FROM onceq.relay_lease WHERE name = $1 FOR UPDATE",
                        1, get, &r, err)))
        goto out;
    if (PQntuples(r) != 1) {
        rc = oq_error_set(err, OQ_EDB, 0, "relay lease %s: no row", name);
        goto out;
    }
    const char *cur_owner = PQgetvalue(r, 0, 0);
    int64_t cur_fence = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    int live = PQgetvalue(r, 0, 2)[0] == 't';
    if (published_seq) *published_seq = strtoll(PQgetvalue(r, 0, 3), NULL, 10);
    if (holder && holder_cap) snprintf(holder, holder_cap, "%s", cur_owner);
    int ours = strcmp(cur_owner, owner) == 0 && cur_fence == *fence && live;
    if (!ours && live) goto commit; /* someone else holds it */
    int64_t new_fence = ours ? cur_fence : cur_fence + 1;
    const char *up[] = {name, owner, num(&f, new_fence), num(&l, lease_ms)};
    if ((rc = oq_pg_run_cmd(p->c,
                            "UPDATE onceq.relay_lease SET owner = $2, fence = $3, expires_at = "
                            "clock_timestamp() + $4 * interval '1 millisecond' WHERE name = $1",
                            4, up, NULL, err)))
        goto out;
    *fence = new_fence;
    *held = 1;
    if (holder && holder_cap) snprintf(holder, holder_cap, "%s", owner);
commit:
    PQclear(r);
    r = NULL;
    rc = oq_pg_exec(p->c, "COMMIT", err);
    if (rc) *held = 0;
    return rc;
out:
    PQclear(r);
    *held = 0;
    rollback(p);
    return rc;
}

int oq__relay_pg_lease_acquire(oq__relay_pg_t *p, const char *name, const char *owner,
                               int64_t lease_ms, int64_t *fence, int *held, char *holder,
                               size_t holder_cap, int64_t *published_seq, oq_error_t *err)
{
    int rc = lease_acquire(p, name, owner, lease_ms, fence, held, holder, holder_cap, published_seq,
                           err);
    if (rc) return rc;
    if ((rc = listen_as(p, *held, err))) *held = 0; /* not woken: try again, as after an error */
    return rc;
}

/* A fenced write: the lease row, renewed, when (owner, fence) still holds it on the server's
 * clock. Inside the caller's transaction (or alone). */
static int fenced_renew(oq__relay_pg_t *p, const char *name, const char *owner, int64_t fence,
                        int64_t lease_ms, int64_t upto, int64_t now_ms, oq_error_t *err)
{
    num_t f, l, u, t;
    const char *pr[] = {name,          owner,          num(&f, fence), num(&l, lease_ms),
                        num(&u, upto), num(&t, now_ms)};
    int64_t n = 0;
    int rc =
        oq_pg_run_cmd(p->c,
                      "UPDATE onceq.relay_lease SET expires_at = clock_timestamp() + $4 * "
                      "interval '1 millisecond', published_seq = GREATEST(published_seq, $5), "
                      "published_at = CASE WHEN $5::bigint > published_seq THEN $6::bigint ELSE "
                      "published_at END WHERE name = $1 AND owner = $2 AND fence = $3 AND "
                      "expires_at > clock_timestamp()",
                      6, pr, &n, err);
    if (rc) return rc;
    if (n != 1)
        return oq_error_set(err, OQ_EFENCED, 0, "relay lease %s: fence %" PRId64 " no longer held",
                            name, fence);
    return 0;
}

int oq__relay_pg_lease_renew(oq__relay_pg_t *p, const char *name, const char *owner, int64_t fence,
                             int64_t lease_ms, oq_error_t *err)
{
    int rc = ready(p, err);
    if (rc) return rc;
    return fenced_renew(p, name, owner, fence, lease_ms, 0, oq_now_ms(), err);
}

int oq__relay_pg_lease_release(oq__relay_pg_t *p, const char *name, const char *owner,
                               int64_t fence, oq_error_t *err)
{
    num_t f;
    const char *pr[] = {name, owner, num(&f, fence)};
    int rc = ready(p, err);
    if (rc) return rc;
    rc = oq_pg_run_cmd(p->c,
                       "UPDATE onceq.relay_lease SET expires_at = '-infinity' WHERE name = $1 AND "
                       "owner = $2 AND fence = $3",
                       3, pr, NULL, err);
    int lrc = listen_as(p, 0, err); /* a standby now: nothing to be woken for */
    return rc ? rc : lrc;
}

/* --- read ----------------------------------------------------------------------------------- */

#define ASSIGN_SQL                                                                                 \
    "WITH c AS (SELECT seq FROM onceq.outbox WHERE pub_seq IS NULL ORDER BY seq LIMIT $1), n AS "  \
    "(SELECT seq, nextval('onceq.outbox_pub_seq') AS ps FROM (SELECT seq FROM c "                  \
    "ORDER BY seq) z) UPDATE onceq.outbox o SET pub_seq = n.ps FROM n WHERE o.seq = n.seq"
#define READ_SQL                                                                                   \
    "SELECT pub_seq, created_at, message_id, topic, key, payload FROM onceq.outbox WHERE pub_seq " \
    "> $1 ORDER BY pub_seq LIMIT $2"

/* Sends \p sql (prepared when \p name is set) into the open pipeline. */
static int send_one(PGconn *c, const char *name, const char *sql, int n, const char *const *pr)
{
    return name && name[0] ? PQsendQueryPrepared(c, name, n, pr, NULL, NULL, 0)
                           : PQsendQueryParams(c, sql, n, NULL, pr, NULL, NULL, 0);
}

/*
 * One cycle's database work in one round trip (a libpq pipeline): the assign, a short
 * transaction that numbers the committed rows that have none yet, in seq order, above every
 * number handed out before (see the file comment: BEGIN, the advisory lock, the UPDATE, COMMIT),
 * then the read of the rows above \p after. The server runs a pipeline's statements in order
 * and skips the rest after a failure until the sync, so the read runs only after the assign's
 * COMMIT succeeded: it sees every number handed out so far, as when they were four round trips.
 * *out is the read's result (the caller clears it).
 */
static int assign_and_read(oq__relay_pg_t *p, int64_t after, int max_rows, PGresult **out,
                           oq_error_t *err)
{
    num_t m, a, l;
    const char *pa[] = {num(&m, max_rows > 0 ? max_rows * 4 : 1000)};
    const char *pr[] = {num(&a, after), num(&l, max_rows)};
    char an[16], rn[16];
    *out = NULL;
    int rc = oq_pg_stmt_name(p->c, ASSIGN_SQL, 1, an, err); /* prepared once per session */
    if (!rc) rc = oq_pg_stmt_name(p->c, READ_SQL, 2, rn, err);
    if (rc) return rc;
    if (!PQenterPipelineMode(p->c)) return oq_pg_error(p->c, NULL, err, "relay pipeline");
    p->read_rts++;
    enum { NST = 5 };
    int sent = 0;
    if (send_one(p->c, NULL, "BEGIN", 0, NULL)) sent++;
    if (sent == 1 && send_one(p->c, NULL, "SELECT pg_advisory_xact_lock(" ASSIGN_LOCK ")", 0, NULL))
        sent++;
    if (sent == 2 && send_one(p->c, an, ASSIGN_SQL, 1, pa)) sent++;
    if (sent == 3 && send_one(p->c, NULL, "COMMIT", 0, NULL)) sent++;
    if (sent == 4 && send_one(p->c, rn, READ_SQL, 2, pr)) sent++;
    int synced = PQpipelineSync(p->c);
    if (sent < NST || !synced) rc = oq_pg_error(p->c, NULL, err, "relay pipeline send");
    if (!synced) sent = 0; /* no answer will come */
    for (int i = 0; i < sent; i++) {
        PGresult *r = PQgetResult(p->c);
        if (!r) {
            if (!rc) rc = oq_pg_error(p->c, NULL, err, "relay pipeline: no answer");
            break;
        }
        ExecStatusType st = PQresultStatus(r);
        int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
        /* a COMMIT the server answers with ROLLBACK: nothing was assigned */
        if (ok && i == 3 && strcmp(PQcmdStatus(r), "COMMIT") != 0) ok = 0;
        if (!ok && !rc)
            rc = st == PGRES_COMMAND_OK ? oq_error_set(err, OQ_EBUSY, 0, "relay assign rolled back")
                                        : oq_pg_error(p->c, r, err, "relay assign/read");
        if (ok && i == NST - 1 && !rc) {
            *out = r;
            r = NULL;
        }
        PQclear(r);
        while ((r = PQgetResult(p->c)) != NULL) /* the end of this statement's answer */
            PQclear(r);
    }
    if (oq_pg_pipeline_end(p->c) != 0 && !rc) /* not closed: the session was reset */
        rc = oq_pg_error(p->c, NULL, err, "relay pipeline not closed");
    if (rc) {
        PQclear(*out);
        *out = NULL;
        rollback(p); /* an assign that failed inside its transaction */
    }
    return rc;
}

int oq__relay_pg_read(oq__relay_pg_t *p, int64_t after, int max_rows, int64_t max_bytes,
                      oq__relay_row_cb cb, void *ctx, int *nread, oq_error_t *err)
{
    PGresult *r = NULL;
    *nread = 0;
    int rc = ready(p, err);
    if (rc) return rc;
    p->reads++;
    if ((rc = assign_and_read(p, after, max_rows, &r, err))) return rc;
    int64_t bytes = 0;
    int n = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        oq__relay_row_t row;
        row.seq = strtoll(PQgetvalue(r, i, 0), NULL, 10);
        row.created_at = strtoll(PQgetvalue(r, i, 1), NULL, 10);
        row.message_id = PQgetvalue(r, i, 2);
        row.topic = PQgetvalue(r, i, 3);
        row.key = PQgetvalue(r, i, 4);
        row.key_len = (size_t)PQgetlength(r, i, 4);
        row.payload = PQgetvalue(r, i, 5);
        row.payload_len = (size_t)PQgetlength(r, i, 5);
        if (cb(ctx, &row) != 0) break;
        n++;
        bytes += (int64_t)row.payload_len;
        if (bytes >= max_bytes) break;
    }
    PQclear(r);
    *nread = n;
    return 0;
}

void oq__relay_pg_counts(oq__relay_pg_t *p, int64_t *reads, int64_t *round_trips)
{
    *reads = p->reads;
    *round_trips = p->read_rts;
}

/* --- mark ----------------------------------------------------------------------------------- */

int oq__relay_pg_mark_dead(oq__relay_pg_t *p, const char *name, const char *owner, int64_t fence,
                           int64_t lease_ms, int64_t now_ms, int64_t upto,
                           const oq__relay_dead_t *dead, size_t ndead, oq_error_t *err)
{
    int rc = ready(p, err);
    if (rc || (rc = oq_pg_exec(p->c, "BEGIN", err))) return rc;
    if ((rc = fenced_renew(p, name, owner, fence, lease_ms, upto, now_ms, err))) goto fail;
    for (size_t i = 0; i < ndead; i++) {
        num_t s, t;
        const char *pr[] = {num(&s, dead[i].seq), dead[i].reason, dead[i].detail, num(&t, now_ms)};
        if ((rc = oq_pg_run_cmd(
                 p->c,
                 "INSERT INTO onceq.outbox_dead(seq, message_id, topic, key, payload, "
                 "created_at, reason, detail, dead_at) SELECT pub_seq, message_id, "
                 "topic, key, payload, created_at, $2, $3, $4 FROM onceq.outbox WHERE "
                 "pub_seq = $1 ON CONFLICT (seq) DO NOTHING",
                 4, pr, NULL, err)))
            goto fail;
    }
    OQ_CRASH_POINT("relay.after_mark_before_commit");
    return oq_pg_exec(p->c, "COMMIT", err);
fail:
    rollback(p);
    return rc;
}

/* --- retention and status ------------------------------------------------------------------- */

int oq__relay_pg_cleanup(oq__relay_pg_t *p, int64_t cutoff_ms, int limit, int64_t *deleted,
                         oq_error_t *err)
{
    num_t c, l;
    const char *pr[] = {num(&c, cutoff_ms), num(&l, limit)};
    int rc = ready(p, err);
    if (rc) return rc;
    return oq_pg_run_cmd(
        p->c,
        "DELETE FROM onceq.outbox WHERE seq IN (SELECT seq FROM onceq.outbox WHERE "
        "pub_seq <= " WATERMARK " ORDER BY pub_seq LIMIT $2) AND created_at < $1",
        2, pr, deleted, err);
}

int oq__relay_pg_pending(oq__relay_pg_t *p, int64_t *count, int64_t *oldest_created_at,
                         oq_error_t *err)
{
    PGresult *r = NULL;
    int rc = ready(p, err);
    if (rc) return rc;
    /* The watermark first, then the rows without a number (the partial index outbox_unassigned)
     * and those numbered above it (a range of outbox_pub_seq_key), sent unprepared so that it is
     * planned with the watermark's value: both index scans of the few rows not yet published.
     * With the watermark a subquery (`pub_seq IS NULL OR pub_seq > (SELECT ...)`) the plan read
     * the whole outbox, published rows kept for the retention included (77 ms at 10,600 rows,
     * every refresh of the relay's metrics; an hour of retention holds millions). */
    if ((rc = oq_pg_run(p->c, "SELECT " WATERMARK, 0, NULL, &r, err))) return rc;
    char wm[32];
    snprintf(wm, sizeof wm, "%s", PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "0");
    PQclear(r);
    r = NULL;
    const char *pr[] = {wm};
    if ((rc = oq_pg_query(p->c,
                          "SELECT count(*), COALESCE(min(created_at), 0) FROM (SELECT created_at "
                          "FROM onceq.outbox WHERE pub_seq IS NULL UNION ALL SELECT created_at "
                          "FROM onceq.outbox WHERE pub_seq > $1::bigint) x",
                          1, pr, &r, err)))
        return rc;
    *count = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    *oldest_created_at = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    PQclear(r);
    return 0;
}

/* --- the operators' views (onceq stats, onceq dlq, the console) ------------------------------ */

int oq__relay_pg_status(PGconn *c, oq__relay_status_t *out, oq_error_t *err)
{
    PGresult *r = NULL;
    memset(out, 0, sizeof *out);
    /* one statement: one snapshot */
    int rc = oq_pg_query(c,
                         "SELECT (SELECT count(*) FROM onceq.outbox WHERE pub_seq IS NULL OR "
                         "pub_seq > " WATERMARK "),"
                         "(SELECT COALESCE(min(created_at), 0) FROM onceq.outbox WHERE pub_seq IS "
                         "NULL OR pub_seq > " WATERMARK "),"
                         "(SELECT count(*) FROM onceq.outbox WHERE pub_seq <= " WATERMARK "),"
                         "(SELECT count(*) FROM onceq.outbox_dead)",
                         0, NULL, &r, err);
    if (rc) return rc;
    out->pending = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    out->oldest_pending_at = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    out->published = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
    out->dead = strtoll(PQgetvalue(r, 0, 3), NULL, 10);
    PQclear(r);
    /* expires_at is on the server's clock: what is left of it, on this host's clock */
    if ((rc = oq_pg_query(c,
                          "SELECT name, owner, fence, (extract(epoch FROM (expires_at - "
                          "clock_timestamp())) * 1000)::bigint, published_seq "
                          "FROM onceq.relay_lease ORDER BY name",
                          0, NULL, &r, err)))
        return rc;
    int64_t now = oq_now_ms();
    for (int i = 0; i < PQntuples(r) && out->nleases < OQ__RELAY_STATUS_LEASES; i++) {
        oq__relay_lease_status_t *l = &out->leases[out->nleases++];
        snprintf(l->name, sizeof l->name, "%s", PQgetvalue(r, i, 0));
        snprintf(l->owner, sizeof l->owner, "%s", PQgetvalue(r, i, 1));
        l->fence = strtoll(PQgetvalue(r, i, 2), NULL, 10);
        l->expires_at = now + strtoll(PQgetvalue(r, i, 3), NULL, 10);
        l->published_seq = strtoll(PQgetvalue(r, i, 4), NULL, 10);
    }
    PQclear(r);
    return 0;
}

int oq__relay_pg_dead_read(PGconn *c, int64_t seq, int limit,
                           void (*cb)(const oq__relay_dead_read_t *row, void *opaque), void *opaque,
                           oq_error_t *err)
{
    num_t s, l;
    const char *p[] = {num(&s, seq), num(&l, limit)};
    PGresult *r = NULL;
    int rc = oq_pg_query(c,
                         "SELECT seq, message_id, topic, key, payload, created_at, reason, detail, "
                         "dead_at, COALESCE(handled_at, 0) FROM onceq.outbox_dead WHERE "
                         "$1::bigint = 0 OR seq = $1::bigint ORDER BY seq LIMIT $2",
                         2, p, &r, err);
    if (rc) return rc;
    for (int i = 0; i < PQntuples(r); i++) {
        oq__relay_dead_read_t d = {
            .seq = strtoll(PQgetvalue(r, i, 0), NULL, 10),
            .message_id = PQgetvalue(r, i, 1),
            .topic = PQgetvalue(r, i, 2),
            .key = PQgetvalue(r, i, 3),
            .payload = PQgetvalue(r, i, 4),
            .len = (size_t)PQgetlength(r, i, 4),
            .created_at = strtoll(PQgetvalue(r, i, 5), NULL, 10),
            .reason = PQgetvalue(r, i, 6),
            .detail = PQgetisnull(r, i, 7) ? NULL : PQgetvalue(r, i, 7),
            .dead_at = strtoll(PQgetvalue(r, i, 8), NULL, 10),
            .handled_at = strtoll(PQgetvalue(r, i, 9), NULL, 10),
        };
        cb(&d, opaque);
    }
    PQclear(r);
    return 0;
}
