/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The relay's read on PostgreSQL (relay/store_pg.c, oq__relay_pg_read): the assign (numbers
 * for the committed rows that have none, in one short transaction under the advisory lock) and
 * the read of the rows above the cursor go in one round trip, a libpq pipeline, not four
 * (BEGIN with the lock, the UPDATE, COMMIT, the SELECT, each waited for). Counted by the store
 * (oq__relay_pg_counts), so a return to statement by statement fails here. And what the scheme
 * promises still holds through the pipeline: rows come in pub_seq order, a row whose
 * transaction is still open is not numbered and not read, and once committed it is read in a
 * later cycle above the cursor (never skipped); a failing assign reports an error and leaves
 * the connection usable. Skipped without ONCEQ_TEST_PG_URL (a failure under CI=true).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_pg.h"
#include "pg_fixture.h"
#include "../../relay/store_pg.h" /* consumer/ has a store_pg.h too */

static char conninfo[2048];

typedef struct {
    int64_t seq[512];
    char key[512][32];
    int n;
} got_t;

static int collect(void *ctx, const oq__relay_row_t *row)
{
    got_t *g = ctx;
    if (g->n >= 512) return 1;
    g->seq[g->n] = row->seq;
    snprintf(g->key[g->n], sizeof g->key[g->n], "%.*s", (int)row->key_len, row->key);
    g->n++;
    return 0;
}

static void insert_rows(PGconn *c, const char *prefix, int from, int to)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO onceq.outbox(message_id, topic, key, payload, created_at) SELECT "
             "'%s-' || g, 'onceq.tool-calls', '%s-' || g, '{}', 1 FROM generate_series(%d, %d) g",
             prefix, prefix, from, to);
    pgfx_exec(c, sql);
}

static void test_read_one_round_trip(void **state)
{
    (void)state;
    oq_error_t err = {0};
    PGconn *c = pgfx_connect(conninfo);
    oq__relay_pg_t *p = NULL;
    assert_int_equal(oq__relay_pg_open(conninfo, &p, &err), 0);

    insert_rows(c, "a", 1, 30);
    got_t g = {.n = 0};
    int n = 0;
    /* the first read prepares its statements (a round trip each, once per session) */
    assert_int_equal(oq__relay_pg_read(p, 0, 10, 1 << 20, collect, &g, &n, &err), 0);
    assert_int_equal(n, 10);
    int64_t r0, t0, r1, t1;
    oq__relay_pg_counts(p, &r0, &t0);
    int64_t cursor = g.seq[g.n - 1];
    for (int k = 0; k < 2; k++) {
        assert_int_equal(oq__relay_pg_read(p, cursor, 10, 1 << 20, collect, &g, &n, &err), 0);
        assert_int_equal(n, 10);
        cursor = g.seq[g.n - 1];
    }
    oq__relay_pg_counts(p, &r1, &t1);
    print_message("2 reads of 10 rows: %lld round trips\n", (long long)(t1 - t0));
    assert_int_equal(r1 - r0, 2);
    assert_int_equal(t1 - t0, 2); /* one per read: assign and read in one pipeline */
    assert_int_equal(g.n, 30);
    for (int i = 0; i < 30; i++) { /* pub_seq order is seq order here, each row once */
        char want[32];
        snprintf(want, sizeof want, "a-%d", i + 1);
        assert_string_equal(g.key[i], want);
        if (i) assert_true(g.seq[i] > g.seq[i - 1]);
    }

    /* a row whose transaction is still open: not numbered, not read; later rows are */
    PGconn *late = pgfx_connect(conninfo);
    pgfx_exec(late, "BEGIN");
    insert_rows(late, "late", 1, 1);
    insert_rows(c, "b", 1, 5);
    g.n = 0;
    assert_int_equal(oq__relay_pg_read(p, cursor, 100, 1 << 20, collect, &g, &n, &err), 0);
    assert_int_equal(n, 5);
    for (int i = 0; i < 5; i++)
        assert_memory_equal(g.key[i], "b-", 2);
    cursor = g.seq[g.n - 1];
    /* committed now: numbered above the cursor, read by the next cycle */
    pgfx_exec(late, "COMMIT");
    g.n = 0;
    assert_int_equal(oq__relay_pg_read(p, cursor, 100, 1 << 20, collect, &g, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(g.key[0], "late-1");
    assert_true(g.seq[0] > cursor);
    cursor = g.seq[0];

    /* the advisory lock held elsewhere with a lock timeout: the read fails, nothing read, the
     * connection usable again once the lock is free */
    pgfx_exec(late, "BEGIN");
    pgfx_exec(late, "SELECT pg_advisory_xact_lock(x'6f6e6365712d72'::bigint)");
    insert_rows(c, "c", 1, 3);
    pgfx_exec(c, "ALTER DATABASE onceq_test_relay_store_pg SET lock_timeout = '200ms'");
    oq__relay_pg_close(p);
    assert_int_equal(oq__relay_pg_open(conninfo, &p, &err), 0);
    g.n = 0;
    memset(&err, 0, sizeof err);
    assert_int_not_equal(oq__relay_pg_read(p, cursor, 100, 1 << 20, collect, &g, &n, &err), 0);
    assert_int_equal(g.n, 0);
    pgfx_exec(late, "COMMIT");
    assert_int_equal(oq__relay_pg_read(p, cursor, 100, 1 << 20, collect, &g, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_string_equal(g.key[0], "c-1");
    pgfx_exec(c, "ALTER DATABASE onceq_test_relay_store_pg RESET lock_timeout");

    oq__relay_pg_close(p);
    PQfinish(late);
    PQfinish(c);
}

/* The relay's metrics (oq__relay_pg_pending: rows not yet published, the oldest one's age) count
 * the unnumbered rows and those numbered above the watermark, and read only those: not the
 * published rows that retention keeps (an hour of them by default). Counted by the server: the
 * store's session reports its sequential scans of the outbox when it ends. */
static void test_pending_reads_only_pending(void **state)
{
    (void)state;
    oq_error_t err = {0};
    PGconn *c = pgfx_connect(conninfo);
    pgfx_exec(c, "DELETE FROM onceq.outbox");
    pgfx_exec(c, "DELETE FROM onceq.relay_lease");
    /* 20,000 published rows, 5 numbered above the watermark, 3 with no number yet */
    insert_rows(c, "pub", 1, 20005);
    pgfx_exec(c, "UPDATE onceq.outbox SET pub_seq = nextval('onceq.outbox_pub_seq'), "
                 "created_at = 100 + seq % 7");
    pgfx_exec(c, "INSERT INTO onceq.relay_lease(name, owner, fence, expires_at, published_seq) "
                 "SELECT 'outbox', 'relay-x', 1, now(), max(pub_seq) - 5 FROM onceq.outbox");
    insert_rows(c, "new", 1, 3);
    pgfx_exec(c, "UPDATE onceq.outbox SET created_at = CASE key WHEN 'new-2' THEN 50 ELSE 60 END "
                 "WHERE key LIKE 'new-%'");
    pgfx_exec(c, "VACUUM ANALYZE onceq.outbox");
    pgfx_exec(c, "SELECT pg_stat_force_next_flush()");
    PQclear(PQexec(c, "SELECT pg_stat_clear_snapshot()"));
    int64_t before = pgfx_one(c, "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = "
                                 "'onceq.outbox'::regclass");

    oq__relay_pg_t *p = NULL;
    assert_int_equal(oq__relay_pg_open(conninfo, &p, &err), 0);
    int64_t count = -1, oldest = -1;
    assert_int_equal(oq__relay_pg_pending(p, &count, &oldest, &err), 0);
    assert_int_equal(count, 8);
    assert_int_equal(oldest, 50);
    oq__relay_pg_close(p); /* its session reports its counts as it ends */

    /* wait for the session to end (its counts are flushed before it does) */
    pgfx_others_gone(c);
    PQclear(PQexec(c, "SELECT pg_stat_clear_snapshot()"));
    int64_t after = pgfx_one(c, "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = "
                                "'onceq.outbox'::regclass");
    print_message("sequential scans of the outbox by the pending count: %lld\n",
                  (long long)(after - before));
    assert_int_equal(after - before, 0);
    PQfinish(c);
}

/* Two relays on an empty lease table; relay-a has taken the lease (fence fa). */
typedef struct {
    PGconn *c;
    oq__relay_pg_t *a, *b;
    int64_t fa, fb, wm;
    int held;
    char holder[64];
    oq_error_t err;
} two_t;

static void two_relays(two_t *t)
{
    memset(t, 0, sizeof *t);
    t->c = pgfx_connect(conninfo);
    pgfx_exec(t->c, "DELETE FROM onceq.relay_lease");
    assert_int_equal(oq__relay_pg_open(conninfo, &t->a, &t->err), 0);
    assert_int_equal(oq__relay_pg_open(conninfo, &t->b, &t->err), 0);
    assert_int_equal(oq__relay_pg_lease_acquire(t->a, "outbox", "relay-a", 60000, &t->fa, &t->held,
                                                t->holder, sizeof t->holder, &t->wm, &t->err),
                     0);
    assert_true(t->held);
}

/* A standby's try of a lease another relay holds, live, is a plain read: it locks no row (the
 * lock made every try a transaction with a WAL flush at its commit, some ten a second per
 * standby), and it still says who holds the lease. Once released, the standby takes it with the
 * next fence, and the old holder's fenced renewal fails. */
static void test_standby_try_locks_nothing(void **state)
{
    (void)state;
    two_t t;
    two_relays(&t);
    assert_int_equal(t.fa, 1);
    /* the row's xmax as relay-a's acquire left it: a try that locks the row changes it */
    int64_t xmax0 = pgfx_one(t.c, "SELECT xmax::text::bigint FROM onceq.relay_lease");
    for (int i = 0; i < 3; i++) {
        assert_int_equal(oq__relay_pg_lease_acquire(t.b, "outbox", "relay-b", 60000, &t.fb, &t.held,
                                                    t.holder, sizeof t.holder, &t.wm, &t.err),
                         0);
        assert_false(t.held);
        assert_string_equal(t.holder, "relay-a");
    }
    int64_t xmax = pgfx_one(t.c, "SELECT xmax::text::bigint FROM onceq.relay_lease");
    print_message("lease row's xmax: %lld before 3 standby tries, %lld after\n", (long long)xmax0,
                  (long long)xmax);
    assert_int_equal(xmax, xmax0);
    /* released: the standby takes it with the next fence; the old holder is fenced out */
    assert_int_equal(oq__relay_pg_lease_release(t.a, "outbox", "relay-a", t.fa, &t.err), 0);
    assert_int_equal(oq__relay_pg_lease_acquire(t.b, "outbox", "relay-b", 60000, &t.fb, &t.held,
                                                t.holder, sizeof t.holder, &t.wm, &t.err),
                     0);
    assert_true(t.held);
    assert_int_equal(t.fb, 2);
    assert_int_not_equal(oq__relay_pg_lease_renew(t.a, "outbox", "relay-a", t.fa, 60000, &t.err),
                         0);
    assert_int_equal(oq__relay_pg_lease_renew(t.b, "outbox", "relay-b", t.fb, 60000, &t.err), 0);
    oq__relay_pg_close(t.a);
    oq__relay_pg_close(t.b);
    PQfinish(t.c);
}

/* Channels the store's connection listens to, asked on that connection. */
static int64_t listening(oq__relay_pg_t *p)
{
    return pgfx_one(oq__relay_pg_conn(p), "SELECT count(*) FROM pg_listening_channels()");
}

/* Notifications the store has counted (data_version's millions), after \p ms for them to come. */
static int64_t notes_after(oq__relay_pg_t *p, int ms)
{
    oq_error_t err = {0};
    int64_t v = 0;
    usleep((useconds_t)ms * 1000);
    assert_int_equal(oq__relay_pg_data_version(p, &v, &err), 0);
    return v / 1000000;
}

/* Only the holder of the lease listens: a standby is never signalled, and libpq keeps no list of
 * notifications for it (a standby that listened, asking only for the lease, grew that list with
 * every commit on the database). The holder is woken; a standby that takes over listens. */
static void test_only_the_holder_listens(void **state)
{
    (void)state;
    two_t t;
    two_relays(&t);
    assert_int_equal(oq__relay_pg_lease_acquire(t.b, "outbox", "relay-b", 60000, &t.fb, &t.held,
                                                t.holder, sizeof t.holder, &t.wm, &t.err),
                     0);
    assert_false(t.held);
    assert_int_equal(listening(t.a), 1);
    assert_int_equal(listening(t.b), 0);
    int64_t na = notes_after(t.a, 0);
    /* 200 commits' worth of wake-ups (distinct payloads: one transaction folds equal ones) */
    pgfx_exec(t.c, "SELECT pg_notify('onceq_outbox', g::text) FROM generate_series(1, 200) g");
    assert_true(notes_after(t.a, 200) >= na + 200);
    assert_int_equal(oq__relay_pg_lease_acquire(t.b, "outbox", "relay-b", 60000, &t.fb, &t.held,
                                                t.holder, sizeof t.holder, &t.wm, &t.err),
                     0);
    assert_false(t.held);
    int kept = 0;
    PGnotify *n;
    assert_true(PQconsumeInput(oq__relay_pg_conn(t.b)));
    while ((n = PQnotifies(oq__relay_pg_conn(t.b))) != NULL) {
        kept++;
        PQfreemem(n);
    }
    assert_int_equal(kept, 0);
    /* a hands over: it stops listening, b listens once it holds the lease, and is woken */
    assert_int_equal(oq__relay_pg_lease_release(t.a, "outbox", "relay-a", t.fa, &t.err), 0);
    assert_int_equal(listening(t.a), 0);
    assert_int_equal(oq__relay_pg_lease_acquire(t.b, "outbox", "relay-b", 60000, &t.fb, &t.held,
                                                t.holder, sizeof t.holder, &t.wm, &t.err),
                     0);
    assert_true(t.held);
    assert_int_equal(listening(t.b), 1);
    int64_t nb = notes_after(t.b, 0);
    pgfx_exec(t.c, "SELECT pg_notify('onceq_outbox', 'wake')");
    assert_true(notes_after(t.b, 200) >= nb + 1);
    oq__relay_pg_close(t.a);
    oq__relay_pg_close(t.b);
    PQfinish(t.c);
}

int main(void)
{
    pgfx_available(1);
    pgfx_migrated_db("onceq_test_relay_store_pg", conninfo, sizeof conninfo);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_one_round_trip),
        cmocka_unit_test(test_pending_reads_only_pending),
        cmocka_unit_test(test_standby_try_locks_nothing),
        cmocka_unit_test(test_only_the_holder_listens),
    };
    return cmocka_run_group_tests_name("relay_store_pg", tests, NULL, NULL);
}
