/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer's batch on PostgreSQL (oq__consumer_store_begin_batch, consumer/store_pg.c):
 * the batch's rows read ahead in one round trip, its plain writes held behind and sent with the
 * commit in one pipeline. What must hold: round trips per batch, not per message (counted with
 * oq__consumer_store_counts, so a return to statement by statement fails here), and the same
 * rows and decisions as statement by statement: one execution, effect, audit row and result
 * event per call, inbox rows keyed by message id, duplicates in a batch and across batches
 * skipped, and a row another consumer wrote after the read ahead failing the batch retriably,
 * its retry (statement by statement) deciding from that row; and the batch's reads stay index
 * lookups when the tables grow after the session's first batches (no sequential scan in the
 * batch's transaction, counted by pg_stat_xact_user_tables). Skipped without
 * ONCEQ_TEST_PG_URL (a failure under CI=true).
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <sqlite3.h>

#define OQ_TEST_CONSUMER_PG "oq_unit_consumer_batch"
#include "consumer_fixture.h"

#define N 40

/* One batch as the worker runs it (consumer/worker.c process_batch, handle_message): begin
 * with the batch's ids, intake each message, run a new call's fast tool inline, commit.
 * decisions[i] gets message i's intake decision. @returns the commit's code. */
static int batch(oq__consumer_store_t *s, oq_envelope_t *const *e, int n, int64_t now,
                 int *decisions, oq_error_t *err)
{
    const char *calls[64], *msgs[64];
    for (int i = 0; i < n; i++) {
        calls[i] = e[i]->call_id;
        msgs[i] = e[i]->message_id;
    }
    assert_int_equal(oq__consumer_store_begin_batch(s, calls, msgs, n, err), 0);
    for (int i = 0; i < n; i++) {
        int irc = oq__exec_intake(s, e[i], &src, now, &decisions[i], err);
        if (irc) print_message("intake %d: %s\n", i, err->msg);
        assert_int_equal(irc, 0);
        if (decisions[i] != OQ__INTAKE_NEW) continue;
        oq__exec_row_t x;
        oq__outcome_t o;
        int st = -1, enew = 0;
        assert_int_equal(oq__exec_start_inline(e[i], &x, err), 0);
        run_registry_tool(&x, e[i]->args, &o);
        assert_int_equal(oq__exec_finish(s, &x, OQ__RUN_INLINE, &o, &policy, now, &st, &enew, err),
                         0);
        assert_int_equal(st, OQ_X_COMMITTED);
        oq__outcome_clear(&o);
        oq__exec_row_clear(&x);
    }
    int rc = oq__consumer_store_commit(s, err);
    if (rc) oq__consumer_store_rollback(s);
    return rc;
}

static void counts(oq__consumer_store_t *s, int64_t *stmts, int64_t *rts)
{
    oq__consumer_store_counts(s, stmts, rts);
}

static void test_batch_round_trips(void **state)
{
    fx_t *f = *state;
    oq_envelope_t env[N], *e[N];
    oq_error_t err = {0};
    int d[N];
    int64_t s0, r0, s1, r1;
    for (int i = 0; i < N; i++) {
        mk_env(&env[i], "charge", "{\"amount\":5}", 1);
        e[i] = &env[i];
    }
    /* one call first: every statement is prepared (a round trip once per session) */
    assert_int_equal(batch(f->a, e, 1, 5000000, d, &err), 0);
    assert_int_equal(d[0], OQ__INTAKE_NEW);

    counts(f->a, &s0, &r0);
    assert_int_equal(batch(f->a, e + 1, N - 1, 5000000, d, &err), 0);
    counts(f->a, &s1, &r1);
    print_message("new calls: %d messages, %" PRId64 " statements, %" PRId64 " round trips\n",
                  N - 1, s1 - s0, r1 - r0);
    for (int i = 0; i < N - 1; i++)
        assert_int_equal(d[i], OQ__INTAKE_NEW);
    /* BEGIN with the batch's reads, then its writes with COMMIT: two round trips a batch
     * (statement by statement: 6 or more a message) */
    assert_true(r1 - r0 <= 3);
    /* five writes a call (inbox, execution, effect, audit, result event), each table's rows
     * in one multi-row INSERT, and nine statements a batch (BEGIN, the plans without
     * sequential scans, the retention horizon's fence, four reads, COMMIT, the relay's wake-up
     * after it, schema/postgres/0008): fourteen statements however many messages (one INSERT a
     * row: 5 * (N - 1) + 9) */
    assert_true(s1 - s0 <= 14);

    /* the same rows as statement by statement */
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM executions WHERE state='COMMITTED'", NULL),
                     N);
    assert_int_equal(oq__consumer_store_effect_count(f->a, NULL), N);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM inbox WHERE seen=1", NULL), N);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE event='committed' AND "
                             "detail LIKE 'inline: planned, started, try 1%'",
                             NULL),
                     N);
    assert_int_equal(
        q_count(f->a, "SELECT count(*) FROM outbox WHERE topic='onceq.tool-results'", NULL), N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(
            q_count(f->a, "SELECT count(*) FROM effects WHERE call_id=?1", e[i]->call_id), 1);
        assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", e[i]->call_id),
                         1);
    }

    /* the whole batch again (a redelivery), on the other worker: duplicates, nothing new */
    counts(f->b, &s0, &r0);
    assert_int_equal(batch(f->b, e, N, 5000100, d, &err), 0);
    counts(f->b, &s1, &r1);
    print_message("duplicates: %d messages, %" PRId64 " statements, %" PRId64 " round trips\n", N,
                  s1 - s0, r1 - r0);
    for (int i = 0; i < N; i++)
        assert_int_equal(d[i], OQ__INTAKE_DUPLICATE);
    /* each: the inbox's count and the result's republish (update, then append) */
    assert_true(r1 - r0 <= 3 * N + 3);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM inbox WHERE seen=2", NULL), N);
    assert_int_equal(oq__consumer_store_effect_count(f->a, NULL), N);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox", NULL), N);
    assert_int_equal(
        q_count(f->a, "SELECT count(*) FROM audit WHERE event='duplicate_skipped'", NULL), N);
    for (int i = 0; i < N; i++)
        oq_envelope_clear(&env[i]);
}

/* One call three times in one batch: its message, the same message again, and a new message
 * id of the call (a producer's republish): new, duplicate, done, as statement by statement. */
static void test_batch_same_call_thrice(void **state)
{
    fx_t *f = *state;
    oq_envelope_t m1, m2;
    oq_error_t err = {0};
    int d[3];
    mk_env(&m1, "charge", "{\"amount\":7}", 1);
    m2 = m1;
    oq_id_uuid(m2.message_id);
    oq_envelope_t *e[3] = {&m1, &m1, &m2};
    assert_int_equal(batch(f->a, e, 3, 6000000, d, &err), 0);
    assert_int_equal(d[0], OQ__INTAKE_NEW);
    assert_int_equal(d[1], OQ__INTAKE_DUPLICATE);
    assert_int_equal(d[2], OQ__INTAKE_DONE);
    assert_int_equal(oq__consumer_store_effect_count(f->a, m1.call_id), 1);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM executions WHERE call_id=?1", m1.call_id),
                     1);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", m1.call_id), 1);
    assert_int_equal(q_count(f->a, "SELECT sum(seen) FROM inbox WHERE call_id=?1", m1.call_id), 3);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM inbox WHERE call_id=?1", m1.call_id), 2);
    oq_envelope_clear(&m1);
}

/* Another consumer takes the message after this batch read ahead (a rebalance): the held inbox
 * row fails at the commit, retriably, nothing of the batch is kept, and the retry decides from
 * the other's rows: a duplicate, one effect. */
static void test_batch_race_retried(void **state)
{
    fx_t *f = *state;
    oq_envelope_t m;
    oq_error_t err = {0};
    int d[1], dd[1];
    mk_env(&m, "charge", "{\"amount\":9}", 1);
    oq_envelope_t *e[1] = {&m};
    const char *calls[1] = {m.call_id}, *msgs[1] = {m.message_id};
    assert_int_equal(oq__consumer_store_begin_batch(f->a, calls, msgs, 1, &err), 0);
    /* worker b takes and runs it meanwhile */
    assert_int_equal(batch(f->b, e, 1, 7000000, dd, &err), 0);
    assert_int_equal(dd[0], OQ__INTAKE_NEW);
    /* a decides from what it read ahead: new */
    assert_int_equal(oq__exec_intake(f->a, &m, &src, 7000010, &d[0], &err), 0);
    assert_int_equal(d[0], OQ__INTAKE_NEW);
    oq__exec_row_t x;
    oq__outcome_t o;
    int st = -1, enew = 0;
    assert_int_equal(oq__exec_start_inline(&m, &x, &err), 0);
    run_registry_tool(&x, m.args, &o);
    assert_int_equal(
        oq__exec_finish(f->a, &x, OQ__RUN_INLINE, &o, &policy, 7000010, &st, &enew, &err), 0);
    oq__outcome_clear(&o);
    oq__exec_row_clear(&x);
    memset(&err, 0, sizeof err);
    assert_int_not_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_true(err.retriable);
    oq__consumer_store_rollback(f->a);
    assert_int_equal(oq__consumer_store_effect_count(f->a, m.call_id), 1);
    /* the retry: a duplicate of what b did */
    assert_int_equal(batch(f->a, e, 1, 7000020, d, &err), 0);
    assert_int_equal(d[0], OQ__INTAKE_DUPLICATE);
    assert_int_equal(oq__consumer_store_effect_count(f->a, m.call_id), 1);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", m.call_id), 1);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND event='committed'",
                             m.call_id),
                     1);
    assert_int_equal(q_count(f->a, "SELECT seen FROM inbox WHERE call_id=?1", m.call_id), 2);
    /* and the batch after it reads ahead again */
    oq_envelope_t n1;
    mk_env(&n1, "charge", "{\"amount\":1}", 1);
    oq_envelope_t *e1[1] = {&n1};
    int64_t s0, r0, s1, r1;
    assert_int_equal(batch(f->a, e1, 1, 7000030, d, &err), 0);
    counts(f->a, &s0, &r0);
    oq_envelope_t n2;
    mk_env(&n2, "charge", "{\"amount\":1}", 1);
    e1[0] = &n2;
    assert_int_equal(batch(f->a, e1, 1, 7000040, d, &err), 0);
    counts(f->a, &s1, &r1);
    assert_int_equal(d[0], OQ__INTAKE_NEW);
    assert_true(r1 - r0 <= 3);
    oq_envelope_clear(&m);
    oq_envelope_clear(&n1);
    oq_envelope_clear(&n2);
}

/* The connection killed (pg_terminate_backend) while a batch holds writes: the commit fails
 * retriably, nothing of it is kept, and the batch run again (reconnected) takes the call once. */
static void test_batch_connection_lost(void **state)
{
    fx_t *f = *state;
    oq_envelope_t m;
    oq_error_t err = {0};
    int d[1];
    mk_env(&m, "charge", "{\"amount\":3}", 1);
    oq_envelope_t *e[1] = {&m};
    const char *calls[1] = {m.call_id}, *msgs[1] = {m.message_id};
    assert_int_equal(oq__consumer_store_begin_batch(f->a, calls, msgs, 1, &err), 0);
    assert_int_equal(oq__exec_intake(f->a, &m, &src, 8000000, &d[0], &err), 0);
    assert_int_equal(d[0], OQ__INTAKE_NEW);
    char sql[80];
    snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%d)",
             PQbackendPID(oq__consumer_store_pgconn(f->a)));
    fx_exec(f->b, sql);
    usleep(100000);
    memset(&err, 0, sizeof err);
    assert_int_not_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_true(err.retriable);
    oq__consumer_store_rollback(f->a);
    assert_int_equal(q_count(f->b, "SELECT count(*) FROM inbox WHERE call_id=?1", m.call_id), 0);
    /* the worker's retry */
    int rc = -1;
    for (int i = 0; i < 3 && rc != 0; i++)
        rc = batch(f->a, e, 1, 8000010, d, &err);
    assert_int_equal(rc, 0);
    assert_int_equal(d[0], OQ__INTAKE_NEW);
    assert_int_equal(oq__consumer_store_effect_count(f->b, m.call_id), 1);
    assert_int_equal(q_count(f->b, "SELECT count(*) FROM outbox WHERE key=?1", m.call_id), 1);
    oq_envelope_clear(&m);
}

/* Sequential scans of \p table that \p c's session has not reported yet
 * (pg_stat_xact_user_tables: since PostgreSQL 15 its earlier transactions' counts too, until the
 * next flush; flush_scans() flushes them). */
static int64_t xact_seq_scans(PGconn *c, const char *table)
{
    const char *pr[] = {table};
    PGresult *r = PQexecParams(c,
                               "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE "
                               "schemaname = 'onceq' AND relname = $1",
                               1, NULL, pr, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), 1);
    int64_t v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

/* Reports \p c's session's counts now: what xact_seq_scans() shows next is what came after. */
static void flush_scans(PGconn *c)
{
    PGresult *r = PQexec(c, "SELECT pg_stat_force_next_flush()");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    PQclear(r);
    PQclear(PQexec(c, "SELECT 1")); /* the flush ran when the session went idle before it */
}

/* Rows of calls c-FROM .. c-TO in the inbox, executions and effects, written by worker b. */
static void grow(fx_t *f, int from, int to)
{
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO onceq.consumer_inbox(message_id, call_id, topic, partition, \"offset\", "
             "received_at, outcome) SELECT 'm-' || g, 'c-' || g, 't', 0, g, 1, 'done' FROM "
             "generate_series(%d, %d) g",
             from, to);
    fx_exec(f->b, sql);
    snprintf(sql, sizeof sql,
             "INSERT INTO onceq.consumer_executions(call_id, tenant, idem_key, fingerprint, tool, "
             "args, state, attempt, message_id, created_at, updated_at) SELECT 'c-' || g, "
             "'default', 'k-' || g, 'f', 'charge', '{}', 'COMMITTED', 1, 'm-' || g, 1, 1 FROM "
             "generate_series(%d, %d) g",
             from, to);
    fx_exec(f->b, sql);
    snprintf(sql, sizeof sql,
             "INSERT INTO onceq.consumer_effects(call_id, effect_id, tool, attempt, fence, worker, "
             "created_at) SELECT 'c-' || g, 'e-' || g, 'charge', 1, 1, 'w', 1 FROM "
             "generate_series(%d, %d) g",
             from, to);
    fx_exec(f->b, sql);
}

/* The batch's reads (executions, inbox, effects by key array) stay index lookups when their
 * tables grow after the session's first batches. A prepared statement keeps the generic plan it
 * chose while the tables were empty, a sequential scan, for the whole session: every batch then
 * read whole tables (3 ms a batch at 5,000 rows under `onceq-bench e2e`). */
static void test_batch_reads_follow_table_growth(void **state)
{
    fx_t *f = *state;
    enum { W = 8, B = 30 };
    static oq_envelope_t env[W * B];
    oq_envelope_t *e[W * B];
    oq_error_t err = {0};
    int d[B];
    /* batches of 30 new calls while the tables are small, as at a pipeline's start: a prepared
     * read's plan is from its sixth execution on the generic one, made for a table that small */
    for (int i = 0; i < W * B; i++) {
        mk_env(&env[i], "charge", "{\"amount\":2}", 1);
        e[i] = &env[i];
    }
    for (int w = 0; w < W; w++) {
        assert_int_equal(batch(f->a, e + w * B, B, 9000000 + w, d, &err), 0);
        for (int i = 0; i < B; i++)
            assert_int_equal(d[i], OQ__INTAKE_NEW);
    }
    /* then the tables grow (another writer: this session's plans are not told) */
    grow(f, 1, 20000);
    /* a batch of a new call and of one of the grown tables' calls, read ahead */
    oq_envelope_t m;
    mk_env(&m, "charge", "{\"amount\":2}", 1);
    const char *calls[2] = {m.call_id, "c-77"}, *msgs[2] = {m.message_id, "m-77"};
    PGconn *c = oq__consumer_store_pgconn(f->a);
    flush_scans(c);
    int64_t ex = -xact_seq_scans(c, "consumer_executions"),
            in = -xact_seq_scans(c, "consumer_inbox"), ef = -xact_seq_scans(c, "consumer_effects");
    assert_int_equal(oq__consumer_store_begin_batch(f->a, calls, msgs, 2, &err), 0);
    ex += xact_seq_scans(c, "consumer_executions");
    in += xact_seq_scans(c, "consumer_inbox");
    ef += xact_seq_scans(c, "consumer_effects");
    print_message("sequential scans in the batch's reads: executions %" PRId64 ", inbox %" PRId64
                  ", effects %" PRId64 "\n",
                  ex, in, ef);
    assert_int_equal(ex, 0);
    assert_int_equal(in, 0);
    assert_int_equal(ef, 0);
    /* and what it read is right: the grown table's call has its execution and effect */
    int dd = -1;
    assert_int_equal(oq__exec_intake(f->a, &m, &src, 9000100, &dd, &err), 0);
    assert_int_equal(dd, OQ__INTAKE_NEW);
    oq__consumer_store_rollback(f->a);
    for (int i = 0; i < W * B; i++)
        oq_envelope_clear(&env[i]);
    oq_envelope_clear(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_batch_round_trips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_same_call_thrice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_race_retried, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_connection_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_reads_follow_table_growth, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
