/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The indexes of onceq.calls and onceq.outbox after schema/postgres/0007_hot_path_indexes.sql
 * (fewer entries per call on the hot path: calls_settled and calls_effect dropped, calls_expires
 * partial on the settled states, outbox_pub_seq_key partial on the numbered rows) still serve
 * every query that read them: the producer's purge (calls_expires; the published outbox rows
 * through outbox_pub_seq_key), the relay's read above its cursor and its cleanup below the
 * watermark (outbox_pub_seq_key). Counted by the server, as in test_relay_store_pg: each query
 * runs on tables of 20,000 rows and may not read calls or outbox sequentially; without the
 * index it needs (drop it, or the partial predicate its query does not imply) it does. Also:
 * the hot path's entries (an insert of a pending call writes none into calls_expires, a numbered
 * outbox row one into outbox_pub_seq_key, an unnumbered row none). Skipped without
 * ONCEQ_TEST_PG_URL (a failure under CI=true).
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
#include "../../producer/producer_store.h"
#include "../../relay/store_pg.h" /* consumer/ has a store_pg.h too */

static char conninfo[2048];

/* Sequential scans of calls + outbox so far, as the statistics collector has them (this
 * session's own counts flushed first). */
static int64_t seq_scans(PGconn *c)
{
    pgfx_exec(c, "SELECT pg_stat_force_next_flush()");
    PQclear(PQexec(c, "SELECT pg_stat_clear_snapshot()"));
    return pgfx_one(c, "SELECT sum(seq_scan) FROM pg_stat_user_tables WHERE relid IN "
                       "('onceq.calls'::regclass, 'onceq.outbox'::regclass)");
}

/* 20,000 settled calls whose key has not expired, 2,000 pending ones past their expiry (never
 * purged), 5 settled and expired; 20,000 published outbox rows (created at 1), 5 numbered above
 * the watermark, 3 not numbered yet. */
static void fill(PGconn *c)
{
    pgfx_exec(c, "DELETE FROM onceq.calls");
    pgfx_exec(c, "DELETE FROM onceq.outbox");
    pgfx_exec(c, "DELETE FROM onceq.relay_lease");
    pgfx_exec(c, "INSERT INTO onceq.calls(call_id, idem_key, fingerprint, tool, args, state, "
                 "created_at, updated_at, expires_at, settled_at) SELECT 'c_' || lpad(g::text, 8, "
                 "'0'), 'k' || g, 'f', 'echo', '{}', CASE WHEN g <= 2000 THEN 'pending' ELSE "
                 "'succeeded' END, 1, 1, CASE WHEN g <= 2000 THEN 1000 WHEN g <= 2005 THEN 1500 "
                 "ELSE 9000000000000 END, CASE WHEN g <= 2000 THEN NULL ELSE 1 END FROM "
                 "generate_series(1, 22005) g");
    pgfx_exec(c,
              "INSERT INTO onceq.outbox(message_id, topic, key, payload, created_at) SELECT "
              "'m-' || g, 'onceq.tool-calls', 'c_' || g, '{}', 1 FROM generate_series(1, 20005) g");
    pgfx_exec(c, "UPDATE onceq.outbox SET pub_seq = nextval('onceq.outbox_pub_seq')");
    pgfx_exec(c, "INSERT INTO onceq.relay_lease(name, owner, fence, expires_at, published_seq) "
                 "SELECT 'outbox', 'relay-x', 1, now(), max(pub_seq) - 5 FROM onceq.outbox");
    pgfx_exec(c, "INSERT INTO onceq.outbox(message_id, topic, key, payload, created_at) SELECT "
                 "'n-' || g, 'onceq.tool-calls', 'n_' || g, '{}', 1 FROM generate_series(1, 3) g");
    pgfx_exec(c, "VACUUM ANALYZE onceq.calls");
    pgfx_exec(c, "VACUUM ANALYZE onceq.outbox");
}

/* The producer's purge: the expired settled calls through calls_expires (partial), the
 * published outbox rows through outbox_pub_seq_key (partial); the pending calls stay. */
static void test_purge_reads_no_table_whole(void **state)
{
    (void)state;
    oq_error_t err = {0};
    PGconn *c = pgfx_connect(conninfo);
    fill(c);
    int64_t before = seq_scans(c);
    oq__producer_store_t s = {NULL, NULL, (struct pg_conn *)c};
    oq_purge_stats_t st = {0};
    int more = 0;
    assert_int_equal(oq__producer_store_purge_batch(&s, 2000, 1000, 100, &st, &more, &err), 0);
    int64_t after = seq_scans(c);
    print_message("purge: %lld calls, %lld outbox rows, %lld sequential scans\n",
                  (long long)st.calls, (long long)st.outbox, (long long)(after - before));
    assert_int_equal(st.calls, 5);
    assert_int_equal(st.outbox, 100);
    assert_int_equal(pgfx_one(c, "SELECT count(*) FROM onceq.calls WHERE state = 'pending'"), 2000);
    assert_int_equal(after - before, 0);
    PQfinish(c);
}

typedef struct {
    int n;
    int64_t first, last;
} got_t;

static int collect(void *ctx, const oq__relay_row_t *row)
{
    got_t *g = ctx;
    if (g->n++ == 0) g->first = row->seq;
    g->last = row->seq;
    return 0;
}

/* The relay: its read (numbers the 3 unnumbered rows through outbox_unassigned, reads the 8
 * rows above the cursor through outbox_pub_seq_key) and its cleanup below the watermark. */
static void test_relay_reads_no_table_whole(void **state)
{
    (void)state;
    oq_error_t err = {0};
    PGconn *c = pgfx_connect(conninfo);
    fill(c);
    int64_t wm = pgfx_one(c, "SELECT published_seq FROM onceq.relay_lease");
    pgfx_others_gone(c);
    int64_t before = seq_scans(c);

    oq__relay_pg_t *p = NULL;
    assert_int_equal(oq__relay_pg_open(conninfo, &p, &err), 0);
    got_t g = {0};
    int nread = 0;
    assert_int_equal(oq__relay_pg_read(p, wm, 100, 1 << 20, collect, &g, &nread, &err), 0);
    int64_t deleted = 0;
    assert_int_equal(oq__relay_pg_cleanup(p, 2, 100, &deleted, &err), 0);
    oq__relay_pg_close(p);
    pgfx_others_gone(c);
    int64_t after = seq_scans(c);
    print_message("relay: read %d rows (%lld..%lld), cleaned %lld, %lld sequential scans\n", g.n,
                  (long long)g.first, (long long)g.last, (long long)deleted,
                  (long long)(after - before));
    assert_int_equal(g.n, 8);
    assert_int_equal(g.first, wm + 1);
    assert_int_equal(g.last, wm + 8);
    assert_int_equal(deleted, 100);
    assert_int_equal(after - before, 0);
    PQfinish(c);
}

/* Pages of index \p name: 1 (the metapage) while it holds no entry. */
static int64_t pages(PGconn *c, const char *name)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT pg_relation_size('onceq.%s') / current_setting('block_size')::bigint", name);
    return pgfx_one(c, sql);
}

/* What the hot path writes: a pending call no entry in calls_expires (its settling does), an
 * unnumbered outbox row none in outbox_pub_seq_key (its numbering does); calls_settled and
 * calls_effect are gone. */
static void test_hot_path_entries(void **state)
{
    (void)state;
    PGconn *c = pgfx_connect(conninfo);
    pgfx_exec(c, "TRUNCATE onceq.calls, onceq.outbox");
    assert_int_equal(pgfx_one(c, "SELECT count(*) FROM pg_indexes WHERE schemaname = 'onceq' AND "
                                 "indexname IN ('calls_settled', 'calls_effect')"),
                     0);
    pgfx_exec(c, "INSERT INTO onceq.calls(call_id, idem_key, fingerprint, tool, args, created_at, "
                 "updated_at, expires_at) VALUES ('c_1', 'k1', 'f', 'echo', '{}', 1, 1, 5)");
    pgfx_exec(c, "INSERT INTO onceq.outbox(message_id, topic, key, payload, created_at) VALUES "
                 "('m-1', 'onceq.tool-calls', 'c_1', '{}', 1)");
    assert_int_equal(pages(c, "calls_expires"), 1);
    assert_int_equal(pages(c, "outbox_pub_seq_key"), 1);
    assert_int_equal(pages(c, "calls_state_id"), 2); /* a kept index has its entry */
    pgfx_exec(c, "UPDATE onceq.calls SET state = 'succeeded', expires_at = 9");
    pgfx_exec(c, "UPDATE onceq.outbox SET pub_seq = 1");
    assert_int_equal(pages(c, "calls_expires"), 2);
    assert_int_equal(pages(c, "outbox_pub_seq_key"), 2);
    PQfinish(c);
}

int main(void)
{
    pgfx_available(1);
    pgfx_migrated_db("onceq_test_pg_indexes", conninfo, sizeof conninfo);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_purge_reads_no_table_whole),
        cmocka_unit_test(test_relay_reads_no_table_whole),
        cmocka_unit_test(test_hot_path_entries),
    };
    return cmocka_run_group_tests_name("pg_indexes", tests, NULL, NULL);
}
