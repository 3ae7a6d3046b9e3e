/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the consumer's rules over its store (consumer/execution.c, consumer/store.c,
 * consumer/tools.c) on a temporary effects.db: inbox dedupe, claim by conditional UPDATE and
 * fencing across two connections (two "workers"), the effects UNIQUE last gate, recovery and
 * reconcile, terminal rows left alone, stale writes refused, retries with backoff, new
 * attempts, dead letters, tool argument validation, the transition table (illegal moves are
 * refused and write nothing), the hand-back of an abandoned run, and a finish retried after a
 * rolled-back transaction, and the per-call reconciliation figures read from the rows. Time is
 * passed explicitly, so lease expiry needs no sleeping.
 * test_consumer_store_pg.c runs these same bodies on PostgreSQL.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_consumer.h"
#include "consumer_fixture.h"
#include "worker_int.h" /* oq__consumer_call_stats */
#include "oq_envelope.h"
#include "oq_json.h"
#include "oq_util.h"

static int64_t q_int(oq__consumer_store_t *s, const char *sql)
{
    return q_count(s, sql, NULL);
}

static void exec_sql(oq__consumer_store_t *s, const char *sql)
{
    fx_exec(s, sql);
}

/* Intake as the worker does it for a blocking tool: a NEW call is planned (PLANNED, due now). */
static int intake(oq__consumer_store_t *s, const oq_envelope_t *e, int64_t now)
{
    oq_error_t err = {0};
    int decision = -1;
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    assert_int_equal(oq__exec_intake(s, e, &src, now, &decision, &err), 0);
    if (decision == OQ__INTAKE_NEW) assert_int_equal(oq__exec_plan(s, e, now, &err), 0);
    assert_int_equal(oq__consumer_store_commit(s, &err), 0);
    return decision;
}

static int claim(oq__consumer_store_t *s, const char *call_id, int64_t now, oq__exec_row_t *x)
{
    oq_error_t err = {0};
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    int rc = oq__exec_claim(s, call_id, 1000, now, x, &err);
    if (rc == 0)
        assert_int_equal(oq__consumer_store_commit(s, &err), 0);
    else
        oq__consumer_store_rollback(s);
    return rc;
}

/* Runs the registry tool for \p x and finishes it; returns finish's rc. */
static int run_finish(oq__consumer_store_t *s, oq__exec_row_t *x, int64_t now, int *state,
                      int *enew)
{
    oq_error_t err = {0};
    oq__outcome_t o;
    run_registry_tool(x, NULL, &o);
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    int rc = oq__exec_finish(s, x, OQ__RUN_CLAIMED, &o, &policy, now, state, enew, &err);
    assert_int_equal(oq__consumer_store_commit(s, &err), 0);
    oq__outcome_clear(&o);
    return rc;
}

static void test_inbox_dedupe(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    mk_env(&e, "charge", "{\"amount\":5}", 1);
    int64_t now = 1000000;
    assert_int_equal(intake(f->a, &e, now), OQ__INTAKE_NEW);
    assert_int_equal(intake(f->b, &e, now), OQ__INTAKE_DUPLICATE); /* other worker, same message */
    assert_int_equal(intake(f->a, &e, now), OQ__INTAKE_DUPLICATE);
    assert_int_equal(q_count(f->a, "SELECT seen FROM inbox WHERE call_id=?1", e.call_id), 3);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM executions WHERE call_id=?1", e.call_id),
                     1);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "event='duplicate_skipped'",
                             e.call_id),
                     2);
    /* a new message id for the same in-flight call is not executed again */
    oq_id_uuid(e.message_id);
    assert_int_equal(intake(f->a, &e, now), OQ__INTAKE_IN_PROGRESS);
    oq_envelope_clear(&e);
}

static void test_claim_fencing(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t xa, xb;
    memset(&xa, 0, sizeof(xa));
    memset(&xb, 0, sizeof(xb));
    mk_env(&e, "charge", "{\"amount\":5}", 1);
    int64_t now = 2000000;
    intake(f->a, &e, now);
    assert_int_equal(claim(f->a, e.call_id, now, &xa), 0);
    assert_int_equal(xa.state, OQ_X_STARTED);
    assert_int_equal(xa.fence, 1);
    assert_int_equal(xa.tries, 1);
    assert_string_equal(xa.lease_owner, "worker-a");
    /* the conditional UPDATE lets exactly one worker win */
    assert_int_equal(claim(f->b, e.call_id, now, &xb), OQ_ESTATE);
    /* a renewal with a wrong fence or from another owner is refused */
    oq_error_t err = {0};
    assert_int_equal(oq__consumer_store_lease_renew(f->a, e.call_id, 1, now + 5000, &err), 0);
    assert_int_equal(oq__consumer_store_lease_renew(f->a, e.call_id, 2, now + 5000, &err),
                     OQ_EFENCED);
    assert_int_equal(oq__consumer_store_lease_renew(f->b, e.call_id, 1, now + 5000, &err),
                     OQ_EFENCED);
    int st = -1, enew = 0;
    assert_int_equal(run_finish(f->a, &xa, now + 1, &st, &enew), 0);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(enew, 1);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM outbox WHERE key=?1 AND "
                             "json_extract(payload,'$.status')='succeeded'",
                             e.call_id),
                     1);
    oq__exec_row_clear(&xa);
    oq__exec_row_clear(&xb);
    oq_envelope_clear(&e);
}

static void test_stale_worker_refused(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t xa, xb;
    oq_error_t err = {0};
    memset(&xa, 0, sizeof(xa));
    memset(&xb, 0, sizeof(xb));
    mk_env(&e, "charge", "{\"amount\":9}", 1);
    int64_t now = 3000000;
    intake(f->a, &e, now);
    assert_int_equal(claim(f->a, e.call_id, now, &xa), 0); /* lease until now + 1000 */
    /* worker A is paused; its lease lapses; B's recovery reconciles: no effect -> SAFE_RETRY */
    int n = 0;
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    /* not yet */
    assert_int_equal(oq__exec_recover(f->b, now + 500, &policy, 100, NULL, NULL, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(oq__exec_recover(f->b, now + 1500, &policy, 100, NULL, NULL, &n, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->b, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(oq__consumer_store_exec_get(f->b, e.call_id, &xb, &err), 0);
    assert_int_equal(xb.state, OQ_X_SAFE_RETRY);
    assert_int_equal(claim(f->b, e.call_id, now + 1600, &xb), 0);
    assert_int_equal(xb.fence, 3); /* claim 1, recovery 2, claim 3 */
    /* A wakes up: its heartbeat and its finishing write are refused */
    assert_int_equal(oq__consumer_store_lease_renew(f->a, e.call_id, xa.fence, now + 9000, &err),
                     OQ_EFENCED);
    int st = -1, enew = 0;
    assert_int_equal(run_finish(f->a, &xa, now + 1700, &st, &enew), OQ_EFENCED);
    assert_int_equal(enew, 0);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 0);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "event='lease_lost'",
                             e.call_id),
                     1);
    /* B completes: exactly one effect */
    assert_int_equal(run_finish(f->b, &xb, now + 1800, &st, &enew), 0);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    assert_int_equal(q_count(f->a, "SELECT fence FROM effects WHERE call_id=?1", e.call_id), 3);
    /* every audit row carries the producer attempt (the auditor compares attempts) */
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "attempt <> 1",
                             e.call_id),
                     0);
    /* audit order: planned, started, unknown, safe_retry, started, lease_lost, committed */
    assert_int_equal(q_count(f->a,
                             "SELECT group_concat(event) = 'planned,started,unknown,"
                             "safe_retry,started,lease_lost,committed' FROM (SELECT event "
                             "FROM audit WHERE call_id=?1 ORDER BY id) o",
                             e.call_id),
                     1);
    oq__exec_row_clear(&xa);
    oq__exec_row_clear(&xb);
    oq_envelope_clear(&e);
}

static void test_effects_unique_last_gate(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    memset(&x, 0, sizeof(x));
    mk_env(&e, "charge", "{\"amount\":3}", 1);
    int64_t now = 4000000;
    intake(f->a, &e, now);
    assert_int_equal(claim(f->a, e.call_id, now, &x), 0);
    /* someone already recorded this call's effect (e.g. a tool committing on its own) */
    char sql[512];
    snprintf(sql, sizeof(sql),
             "INSERT INTO effects(effect_id, call_id, tool, amount, detail, "
             "attempt, fence, worker, created_at) VALUES ('e_other', '%s', 'charge', 3, "
             "'{\"charged\":3,\"first\":true}', 1, 1, 'x', 0)",
             e.call_id);
    exec_sql(f->a, sql);
    int st = -1, enew = 1;
    assert_int_equal(run_finish(f->a, &x, now + 1, &st, &enew), 0);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(enew, 0);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    /* the existing effect wins: its id and result are what the execution reports */
    assert_int_equal(q_count(f->a,
                             "SELECT effect_id = 'e_other' AND "
                             "json_type(result,'$.first') = 'true' FROM executions WHERE "
                             "call_id=?1",
                             e.call_id),
                     1);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

static void test_reconcile(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e1, e2, e3;
    oq__exec_row_t x;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    int64_t now = 5000000;
    mk_env(&e1, "charge", "{\"amount\":1}", 1);
    mk_env(&e2, "charge", "{\"amount\":2}", 1);
    mk_env(&e3, "sleep", "{\"ms\":1}", 1);
    intake(f->a, &e1, now);
    intake(f->a, &e2, now);
    intake(f->a, &e3, now);
    assert_int_equal(claim(f->a, e1.call_id, now, &x), 0);
    assert_int_equal(claim(f->a, e2.call_id, now, &x), 0);
    assert_int_equal(claim(f->a, e3.call_id, now, &x), 0);
    /* e3 has used up its tries; a compiled tool's missing effect row means it did nothing, so
     * it fails final ("retries_exhausted"), it is not run again */
    exec_sql(f->a, "UPDATE executions SET tries = 3 WHERE tool = 'sleep' AND state='STARTED'");
    char sql[512];
    snprintf(sql, sizeof(sql),
             "INSERT INTO effects(effect_id, call_id, tool, amount, detail, "
             "attempt, fence, worker, created_at) VALUES ('e_x1', '%s', 'charge', 1, "
             "'{\"charged\":1}', 1, 1, 'worker-a', 0)",
             e1.call_id);
    exec_sql(f->a, sql);
    int n = 0;
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_recover(f->b, now + 2000, &policy, 100, NULL, NULL, &n, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->b, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(oq__consumer_store_exec_get(f->b, e1.call_id, &x, &err), 0);
    assert_int_equal(x.state, OQ_X_COMMITTED); /* effect present */
    assert_string_equal(x.effect_id, "e_x1");
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM outbox WHERE key=?1 AND "
                             "json_extract(payload,'$.status')='succeeded'",
                             e1.call_id),
                     1);
    assert_int_equal(oq__consumer_store_exec_get(f->b, e2.call_id, &x, &err), 0);
    assert_int_equal(x.state, OQ_X_SAFE_RETRY); /* no effect: safe to run again */
    assert_int_equal(oq__consumer_store_exec_get(f->b, e3.call_id, &x, &err), 0);
    assert_int_equal(x.state, OQ_X_FAILED_FINAL);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM outbox WHERE key=?1 AND "
                             "json_extract(payload,'$.status')='failed' AND "
                             "json_extract(payload,'$.error.code')='retries_exhausted'",
                             e3.call_id),
                     1);
    /* SAFE_RETRY is re-executed and commits once */
    assert_int_equal(claim(f->b, e2.call_id, now + 2001, &x), 0);
    int st = -1, enew = 0;
    assert_int_equal(run_finish(f->b, &x, now + 2002, &st, &enew), 0);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e2.call_id), 1);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e1);
    oq_envelope_clear(&e2);
    oq_envelope_clear(&e3);
}

static void test_terminal_untouched(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    int64_t now = 6000000;
    mk_env(&e, "send_email", "{\"to\":\"a@b.c\",\"subject\":\"hi\"}", 1);
    intake(f->a, &e, now);
    assert_int_equal(claim(f->a, e.call_id, now, &x), 0);
    int st = -1, enew = 0;
    assert_int_equal(run_finish(f->a, &x, now + 1, &st, &enew), 0);
    assert_int_equal(st, OQ_X_COMMITTED);
    char sql[256];
    /* even with a stale lease value left behind, recovery must not touch a terminal row */
    snprintf(sql, sizeof(sql),
             "UPDATE executions SET lease_until = 1, next_attempt_at = 0 "
             "WHERE call_id = '%s'",
             e.call_id);
    exec_sql(f->a, sql);
    int64_t fence = q_count(f->a, "SELECT fence FROM executions WHERE call_id=?1", e.call_id);
    int n = 0;
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_recover(f->b, now + 100000, &policy, 100, NULL, NULL, &n, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->b, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(claim(f->b, e.call_id, now + 100000, &x), OQ_ESTATE);
    assert_int_equal(q_count(f->a, "SELECT fence FROM executions WHERE call_id=?1", e.call_id),
                     fence);
    /* a redelivery under a new message id, even a higher attempt, is not executed again */
    oq_id_uuid(e.message_id);
    assert_int_equal(intake(f->b, &e, now + 100001), OQ__INTAKE_DONE);
    oq_id_uuid(e.message_id);
    e.attempt = 2;
    assert_int_equal(intake(f->b, &e, now + 100002), OQ__INTAKE_DONE);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "event='started'",
                             e.call_id),
                     1);
    /* the result was still unpublished: nothing re-emitted, one result row */
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM outbox WHERE key=?1 AND json_extract(payload, "
                             "'$.status') <> 'running'",
                             e.call_id),
                     1);
    /* once it was delivered, a new message of the call re-emits it, same message id */
    char *rid = q_text(f->a,
                       "SELECT message_id FROM outbox WHERE key=?1 AND json_extract(payload, "
                       "'$.status') <> 'running'",
                       e.call_id);
    relay_delivered_all(f->a);
    int64_t seq0 = q_count(f->a,
                           "SELECT " FX_POS
                           " FROM outbox WHERE key=?1 AND json_extract(payload, '$.status') <> "
                           "'running'",
                           e.call_id);
    oq_id_uuid(e.message_id);
    assert_int_equal(intake(f->b, &e, now + 100003), OQ__INTAKE_DONE);
    assert_true(q_count(f->a,
                        "SELECT " FX_POS " FROM outbox WHERE key=?1 AND json_extract(payload, "
                        "'$.status') <> 'running'",
                        e.call_id) > seq0);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM outbox WHERE key=?1 AND json_extract(payload, "
                             "'$.status') <> 'running'",
                             e.call_id),
                     1);
    char *rid2 = q_text(f->a,
                        "SELECT message_id FROM outbox WHERE key=?1 AND json_extract(payload, "
                        "'$.status') <> 'running'",
                        e.call_id);
    assert_string_equal(rid, rid2);
    free(rid);
    free(rid2);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

static void test_retry_backoff_and_exhaustion(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e, g;
    oq__exec_row_t x;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    int64_t now = 7000000;
    /* fails twice, succeeds on the third try */
    mk_env(&e, "charge", "{\"amount\":4,\"fail_times\":2}", 1);
    intake(f->a, &e, now);
    int st = -1, enew = 0;
    for (int i = 1; i <= 3; i++) {
        assert_int_equal(claim(f->a, e.call_id, now, &x), 0);
        assert_int_equal(x.tries, i);
        assert_int_equal(run_finish(f->a, &x, now, &st, &enew), 0);
        if (i < 3) {
            assert_int_equal(st, OQ_X_FAILED_RETRYABLE);
            assert_int_equal(oq__consumer_store_exec_get(f->a, e.call_id, &x, &err), 0);
            int64_t wait = x.next_attempt_at - now;
            assert_true(wait >= 0 && wait < 100 * i); /* full jitter under base 100, doubled */
            /* not due before its backoff: 1 ms before it (the full jitter may draw a wait of
             * 0, when a claim at `now` is due: that made this check fail about 1 run in 70) */
            assert_int_equal(claim(f->b, e.call_id, x.next_attempt_at - 1, &x), OQ_ESTATE);
            now = x.next_attempt_at;
        }
    }
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "event='failed_retryable'",
                             e.call_id),
                     2);

    /* always failing: exhausted after max_attempts (3) -> FAILED_FINAL + failed result */
    mk_env(&g, "fail", "{\"retryable\":true}", 1);
    intake(f->a, &g, now);
    for (int i = 1; i <= 3; i++) {
        assert_int_equal(claim(f->a, g.call_id, now + 100000 * i, &x), 0);
        assert_int_equal(run_finish(f->a, &x, now + 100000 * i, &st, &enew), 0);
    }
    assert_int_equal(st, OQ_X_FAILED_FINAL);
    assert_int_equal(claim(f->a, g.call_id, now + 900000, &x), OQ_ESTATE);
    /* out of tries is a final failure that says so (not NEEDS_REVIEW: nothing is unknown) */
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM outbox WHERE key=?1 AND "
                             "json_extract(payload,'$.status')='failed' AND "
                             "json_type(payload,'$.error.retryable')='true' AND "
                             "json_extract(payload,'$.error.code')='retries_exhausted'",
                             g.call_id),
                     1);
    /* a new producer attempt re-plans a FAILED_FINAL call; an old one is stale */
    oq_id_uuid(g.message_id);
    g.attempt = 2;
    assert_int_equal(intake(f->a, &g, now + 1000000), OQ__INTAKE_REPLANNED);
    assert_int_equal(oq__consumer_store_exec_get(f->a, g.call_id, &x, &err), 0);
    assert_int_equal(x.state, OQ_X_PLANNED);
    assert_int_equal(x.attempt, 2);
    assert_int_equal(x.tries, 0);
    oq_id_uuid(g.message_id);
    g.attempt = 1;
    assert_int_equal(intake(f->a, &g, now + 1000001), OQ__INTAKE_STALE);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
    oq_envelope_clear(&g);
}

static void test_mismatch_and_dlq(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq_error_t err = {0};
    int64_t now = 8000000;
    mk_env(&e, "charge", "{\"amount\":4}", 1);
    intake(f->a, &e, now);
    oq_id_uuid(e.message_id);
    memset(e.fingerprint, 'a', OQ_FINGERPRINT_LEN);
    int outcome = -1, dup = -1;
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_intake(f->a, &e, &src, now, &outcome, &err), 0);
    assert_int_equal(outcome, OQ__INTAKE_MISMATCH);
    /* nothing written for the mismatching message: the worker dead-letters it */
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM inbox WHERE message_id=?1", e.message_id),
                     0);
    oq__dlq_row_t d = {.message_id = "dlq:onceq.tool-calls:3:42",
                       .reason = "undecodable",
                       .src = {.topic = "onceq.tool-calls", .partition = 3, .offset = 42},
                       .key = "k",
                       .key_len = 1,
                       .payload = "garbage",
                       .len = 7,
                       .created_at = now};
    assert_int_equal(oq__exec_dead_letter(f->a, &d, NULL, &dup, &err), 0);
    assert_int_equal(dup, 0);
    assert_int_equal(oq__exec_dead_letter(f->a, &d, NULL, &dup, &err), 0);
    assert_int_equal(dup, 1);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(q_int(f->a, "SELECT count(*) FROM dlq WHERE published_at IS NULL AND "
                                 "payload = CAST('garbage' AS BLOB)"),
                     1);
    assert_int_equal(q_int(f->a, "SELECT count(*) FROM inbox WHERE outcome='dlq' AND seen=2"), 1);
    assert_int_equal(q_int(f->a, "SELECT max(id) FROM dlq") > 0, 1);
    assert_int_equal(
        oq__consumer_store_dlq_mark(f->a, q_int(f->a, "SELECT max(id) FROM dlq"), now, &err), 0);
    assert_int_equal(q_int(f->a, "SELECT count(*) FROM dlq WHERE published_at IS NULL"), 0);
    oq_envelope_clear(&e);
}

/* A dead-lettered message id goes through the inbox again once it is valid (a fixed copy from
 * `onceq dlq redrive`): planned once, every later copy a duplicate; a redrive that fails again
 * is a dead letter again, any other copy of a dead letter a duplicate. */
static void test_dlq_redrive_through_inbox(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq_error_t err = {0};
    int64_t now = 9000000;
    int dup = -1;
    mk_env(&e, "charge", "{\"amount\":5}", 1);
    oq__dlq_row_t d = {.message_id = e.message_id,
                       .reason = "undecodable envelope: field attempt",
                       .code = OQ_DLQ_INVALID,
                       .src = {.topic = "onceq.tool-calls", .partition = 1, .offset = 9},
                       .payload = "{}",
                       .len = 2,
                       .created_at = now};
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_dead_letter(f->a, &d, NULL, &dup, &err), 0);
    assert_int_equal(dup, 0);
    /* the same bytes again (a redelivery): absorbed; as a redrive: a dead letter again */
    assert_int_equal(oq__exec_dead_letter(f->a, &d, NULL, &dup, &err), 0);
    assert_int_equal(dup, 1);
    d.redrive = "onceq.dlq:0:0";
    assert_int_equal(oq__exec_dead_letter(f->a, &d, NULL, &dup, &err), 0);
    assert_int_equal(dup, 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM dlq WHERE message_id=?1", e.message_id),
                     2);
    assert_int_equal(
        q_count(f->a, "SELECT count(*) FROM dlq WHERE message_id=?1 AND code='invalid_envelope'",
                e.message_id),
        2);
    /* the fixed message: through once, then a duplicate */
    assert_int_equal(intake(f->a, &e, now + 1), OQ__INTAKE_NEW);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM inbox WHERE message_id=?1 AND outcome='planned'",
                             e.message_id),
                     1);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND event='dlq_redriven'",
                             e.call_id),
                     1);
    assert_int_equal(intake(f->a, &e, now + 2), OQ__INTAKE_DUPLICATE);
    /* a redrive of the old bytes now: a duplicate, not a dead letter */
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_dead_letter(f->a, &d, NULL, &dup, &err), 0);
    assert_int_equal(dup, 1);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM executions WHERE call_id=?1", e.call_id),
                     1);
    oq_envelope_clear(&e);
}

/* Runs \p tool with \p args; returns the tool code, copies the error code. */
static int try_tool(const char *tool, const char *args, char code[48])
{
    oq_tool_out_t out;
    memset(&out, 0, sizeof(out));
    json_t *a = json_loads(args, 0, NULL);
    assert_non_null(a);
    oq_tool_call_t call = {.call_id = "c_0123456789abcdef",
                           .effect_id = "e_0123456789abcdef",
                           .tenant = "t",
                           .tool = tool,
                           .args = a,
                           .attempt = 1,
                           .try_no = 1};
    int rc = oq_tool_invoke(oq_tool_find(tool), &call, &out);
    snprintf(code, 48, "%s", out.code);
    if (rc == OQ_TOOL_BADARGS) assert_true(strlen(out.message) > 5);
    oq_tool_out_clear(&out);
    json_decref(a);
    return rc;
}

static void test_tool_args(void **state)
{
    (void)state;
    char code[48];
    assert_int_equal(try_tool("charge", "{\"amount\":10}", code), OQ_TOOL_OK);
    assert_int_equal(try_tool("charge", "{}", code), OQ_TOOL_BADARGS);
    assert_string_equal(code, "bad_args");
    assert_int_equal(try_tool("charge", "{\"amount\":0}", code), OQ_TOOL_BADARGS);
    assert_int_equal(try_tool("charge", "{\"amount\":-3}", code), OQ_TOOL_BADARGS);
    assert_int_equal(try_tool("charge", "{\"amount\":1.5}", code), OQ_TOOL_BADARGS);
    assert_int_equal(try_tool("charge", "{\"amount\":\"7\"}", code), OQ_TOOL_BADARGS);
    assert_int_equal(try_tool("charge", "{\"amount\":1,\"delay_ms\":20000}", code),
                     OQ_TOOL_BADARGS);
    assert_int_equal(try_tool("send_email", "{\"to\":\"a@b\",\"subject\":\"s\"}", code),
                     OQ_TOOL_OK);
    assert_int_equal(try_tool("send_email", "{\"to\":\"nobody\",\"subject\":\"s\"}", code),
                     OQ_TOOL_BADARGS);
    assert_int_equal(try_tool("send_email", "{\"to\":\"a@b\"}", code), OQ_TOOL_BADARGS);
    assert_int_equal(try_tool("sleep", "{\"ms\":1}", code), OQ_TOOL_OK);
    assert_int_equal(try_tool("sleep", "{\"ms\":10001}", code), OQ_TOOL_BADARGS);
    assert_int_equal(try_tool("sleep", "{}", code), OQ_TOOL_BADARGS);
    assert_int_equal(try_tool("fail", "{\"retryable\":\"yes\"}", code), OQ_TOOL_BADARGS);
    assert_int_equal(try_tool("fail", "{\"retryable\":false}", code), OQ_TOOL_FAIL);
    assert_int_equal(try_tool("nope", "{}", code), OQ_TOOL_BADARGS);
    assert_string_equal(code, "unknown_tool");
    /* blocking hints decide inline vs runner */
    json_t *a = json_loads("{\"ms\":250}", 0, NULL);
    assert_int_equal(oq_tool_blocks(oq_tool_find("sleep"), a), 250);
    assert_int_equal(oq_tool_blocks(oq_tool_find("send_email"), a), 0);
    json_decref(a);
}

static void test_bad_args_fail_final(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    memset(&x, 0, sizeof(x));
    int64_t now = 9000000;
    mk_env(&e, "charge", "{\"amount\":-1}", 1);
    intake(f->a, &e, now);
    assert_int_equal(claim(f->a, e.call_id, now, &x), 0);
    int st = -1, enew = 0;
    assert_int_equal(run_finish(f->a, &x, now, &st, &enew), 0);
    assert_int_equal(st, OQ_X_FAILED_FINAL);
    assert_int_equal(q_count(f->a,
                             "SELECT json_extract(error,'$.code')='bad_args' AND "
                             "json_type(error,'$.retryable')='false' FROM executions WHERE "
                             "call_id=?1",
                             e.call_id),
                     1);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 0);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

/* The transition table: the moves the design names are legal, everything else is refused. */
static void test_transition_table(void **state)
{
    (void)state;
    static const int legal[][2] = {
        {OQ__X_NONE, OQ_X_PLANNED},
        {OQ_X_FAILED_FINAL, OQ_X_PLANNED},
        {OQ_X_PLANNED, OQ_X_STARTED},
        {OQ_X_FAILED_RETRYABLE, OQ_X_STARTED},
        {OQ_X_SAFE_RETRY, OQ_X_STARTED},
        {OQ_X_STARTED, OQ_X_COMMITTED},
        {OQ_X_STARTED, OQ_X_FAILED_RETRYABLE},
        {OQ_X_STARTED, OQ_X_FAILED_FINAL},
        {OQ_X_STARTED, OQ_X_UNKNOWN},
        {OQ_X_UNKNOWN, OQ_X_COMMITTED},
        {OQ_X_UNKNOWN, OQ_X_SAFE_RETRY},
        {OQ_X_UNKNOWN, OQ_X_FAILED_FINAL},
        {OQ_X_UNKNOWN, OQ_X_NEEDS_REVIEW},
        {OQ_X_UNKNOWN, OQ_X_RECONCILING},
        {OQ_X_RECONCILING, OQ_X_COMMITTED},
        {OQ_X_RECONCILING, OQ_X_SAFE_RETRY},
        {OQ_X_RECONCILING, OQ_X_FAILED_FINAL},
        {OQ_X_RECONCILING, OQ_X_NEEDS_REVIEW},
        {OQ_X_RECONCILING, OQ_X_UNKNOWN},
    };
    int n_legal = 0;
    for (int from = OQ__X_NONE; from < OQ_X__COUNT; from++) {
        for (int to = 0; to < OQ_X__COUNT; to++) {
            int want = 0;
            for (size_t i = 0; i < sizeof(legal) / sizeof(legal[0]); i++)
                want |= legal[i][0] == from && legal[i][1] == to;
            if (oq__exec_transition_legal(from, to) != want)
                fail_msg("%s -> %s: legal=%d, want %d", oq__xstate_name(from), oq__xstate_name(to),
                         oq__exec_transition_legal(from, to), want);
            n_legal += want;
        }
    }
    assert_int_equal(n_legal, (int)(sizeof(legal) / sizeof(legal[0])));
    /* no way out of COMMITTED, none out of NEEDS_REVIEW but an operator's (onceq review:
     * not in the table of ordinary moves), and no outcome without a run */
    for (int to = 0; to < OQ_X__COUNT; to++) {
        assert_false(oq__exec_transition_legal(OQ_X_COMMITTED, to));
        assert_false(oq__exec_transition_legal(OQ_X_NEEDS_REVIEW, to));
    }
    assert_false(oq__exec_transition_legal(OQ_X_PLANNED, OQ_X_COMMITTED));
    assert_false(oq__exec_transition_legal(OQ__X_NONE, OQ_X_STARTED));
    assert_true(oq__xstate_terminal(OQ_X_FAILED_FINAL));
    assert_false(oq__xstate_terminal(OQ_X_UNKNOWN));
    assert_int_equal(oq__xstate_parse(oq__xstate_name(OQ_X_RECONCILING)), OQ_X_RECONCILING);
}

/* A finish the state machine cannot take writes nothing: an UNKNOWN outcome from an inline run
 * (no durable STARTED row: a call that can end unknown must be claimed first), and a run that
 * is not STARTED (an illegal transition). */
static void test_finish_refuses(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    oq__outcome_t o;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    memset(&o, 0, sizeof(o));
    int64_t now = 10000000;
    mk_env(&e, "charge", "{\"amount\":8}", 1);
    intake(f->a, &e, now);
    assert_int_equal(claim(f->a, e.call_id, now, &x), 0);
    int64_t audits = q_count(f->a, "SELECT count(*) FROM audit WHERE call_id=?1", e.call_id);
    int st = 0, enew = 1;
    o.cls = OQ__OUTCOME_UNKNOWN;
    oq_envelope_t e2;
    oq__exec_row_t y;
    memset(&y, 0, sizeof(y));
    mk_env(&e2, "charge", "{\"amount\":9}", 1);
    assert_int_equal(oq__exec_start_inline(&e2, &y, &err), 0);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_finish(f->a, &y, OQ__RUN_INLINE, &o, &policy, now, &st, &enew, &err),
                     OQ_EINVAL);
    assert_int_equal(st, -1);
    assert_int_equal(enew, 0);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM executions WHERE call_id=?1", e2.call_id),
                     0);
    oq__exec_row_clear(&y);
    oq_envelope_clear(&e2);
    /* a row that is not STARTED is not a run: PLANNED -> COMMITTED is not in the table */
    x.state = OQ_X_PLANNED;
    o.cls = OQ__OUTCOME_SUCCESS;
    assert_int_equal(oq__exec_finish(f->a, &x, OQ__RUN_CLAIMED, &o, &policy, now, &st, &enew, &err),
                     OQ_ESTATE);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM audit WHERE call_id=?1", e.call_id),
                     audits);
    assert_int_equal(
        q_count(f->a, "SELECT state='STARTED' FROM executions WHERE call_id=?1", e.call_id), 1);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 0);
    /* (only the `running` event of the claim) */
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", e.call_id), 1);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

/* A claimed run that did nothing (worker stopping) is handed back: STARTED -> UNKNOWN ->
 * SAFE_RETRY, due now, the run not counted, the old fence stale. */
static void test_hand_back(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x, y;
    oq__outcome_t o;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    memset(&y, 0, sizeof(y));
    memset(&o, 0, sizeof(o));
    int64_t now = 11000000;
    mk_env(&e, "sleep", "{\"ms\":5000}", 1);
    intake(f->a, &e, now);
    assert_int_equal(claim(f->a, e.call_id, now, &x), 0);
    o.cls = OQ__OUTCOME_NOT_RUN;
    int st = -1, enew = 0;
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(
        oq__exec_finish(f->a, &x, OQ__RUN_CLAIMED, &o, &policy, now + 5, &st, &enew, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(st, OQ_X_SAFE_RETRY);
    assert_int_equal(oq__consumer_store_exec_get(f->a, e.call_id, &y, &err), 0);
    assert_int_equal(y.state, OQ_X_SAFE_RETRY);
    assert_int_equal(y.tries, 0);
    assert_int_equal(y.fence, x.fence + 1);
    assert_int_equal(y.next_attempt_at, now + 5);
    assert_null(y.lease_owner);
    assert_int_equal(q_count(f->a,
                             "SELECT group_concat(event) = 'planned,started,unknown,"
                             "safe_retry' FROM (SELECT event FROM audit WHERE call_id=?1 "
                             "ORDER BY id) o",
                             e.call_id),
                     1);
    /* the old holder's renewal is refused; the next claim is try 1 again */
    assert_int_equal(oq__consumer_store_lease_renew(f->a, e.call_id, x.fence, now + 9000, &err),
                     OQ_EFENCED);
    assert_int_equal(claim(f->b, e.call_id, now + 6, &y), 0);
    assert_int_equal(y.tries, 1);
    assert_int_equal(y.fence, x.fence + 2);
    /* `running` once, at the first claim of the attempt; no result */
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", e.call_id), 1);
    oq__exec_row_clear(&x);
    oq__exec_row_clear(&y);
    oq_envelope_clear(&e);
}

/* The runner retries a finish whose transaction was rolled back (a busy database): the run
 * it holds is unchanged by the first try, so the second one commits exactly once. */
/* The outbox's unique message id is reported as OQ_EEXIST (no backend code), nothing written:
 * the rules (execution.c) republish on that code, whatever the store's engine. */
static void test_outbox_append_exists(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_outbox_row_t row = {.message_id = "m-exists-1",
                           .topic = OQ_TOPIC_RESULTS,
                           .key = "c-1",
                           .payload = "{}",
                           .payload_len = 2,
                           .created_at = 1};
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__consumer_store_outbox_append(f->a, &row, &err), 0);
    assert_int_equal(oq__consumer_store_outbox_append(f->a, &row, &err), OQ_EEXIST);
    assert_string_equal(oq_error_name(err.code), "exists");
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(q_int(f->a, "SELECT count(*) FROM outbox WHERE message_id='m-exists-1'"), 1);
}

static void test_finish_after_rollback(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    oq__outcome_t o;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    int64_t now = 12000000;
    mk_env(&e, "charge", "{\"amount\":6}", 1);
    intake(f->a, &e, now);
    assert_int_equal(claim(f->a, e.call_id, now, &x), 0);
    run_registry_tool(&x, NULL, &o);
    int st = -1, enew = 0;
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_finish(f->a, &x, OQ__RUN_CLAIMED, &o, &policy, now, &st, &enew, &err),
                     0);
    oq__consumer_store_rollback(f->a);
    assert_int_equal(x.state, OQ_X_STARTED);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_finish(f->a, &x, OQ__RUN_CLAIMED, &o, &policy, now, &st, &enew, &err),
                     0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(enew, 1);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "event='committed'",
                             e.call_id),
                     1);
    oq__outcome_clear(&o);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

static void test_purge(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e1, e2;
    oq_error_t err = {0};
    mk_env(&e1, "charge", "{\"amount\":1}", 1);
    mk_env(&e2, "charge", "{\"amount\":2}", 1);
    intake(f->a, &e1, 1000);
    intake(f->a, &e2, 5000);
    int64_t n = -1;
    assert_int_equal(oq__consumer_store_purge(f->a, 2000, 100, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM inbox WHERE call_id=?1", e1.call_id), 0);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM inbox WHERE call_id=?1", e2.call_id), 1);
    /* executions stay: a late redelivery of e1 is recognised by its call, not re-run */
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM executions WHERE call_id=?1", e1.call_id),
                     1);
    assert_int_equal(intake(f->a, &e1, 6000), OQ__INTAKE_IN_PROGRESS);
    oq_envelope_clear(&e1);
    oq_envelope_clear(&e2);
}

/* Rows of one call for test_call_stats: its execution (unknown_at 0: never UNKNOWN) and its
 * audit, events at the times given. */
static void story(oq__consumer_store_t *s, const char *call_id, int state, int64_t unknown_at,
                  const char *const *events, const int64_t *ts, int n)
{
    oq_error_t err = {0};
    oq__exec_row_t x;
    memset(&x, 0, sizeof(x));
    snprintf(x.call_id, sizeof x.call_id, "%s", call_id);
    snprintf(x.fingerprint, sizeof x.fingerprint, "%064d", 0);
    snprintf(x.message_id, sizeof x.message_id, "m-%s", call_id);
    x.tenant = "default";
    x.idem_key = (char *)call_id;
    x.tool = "pay";
    x.args = "{}";
    x.state = state;
    x.attempt = 1;
    x.unknown_at = unknown_at;
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    assert_int_equal(oq__consumer_store_exec_insert(s, &x, 1, &err), 0);
    for (int i = 0; i < n; i++) {
        oq__audit_row_t a = {.ts = ts[i], .call_id = call_id, .event = events[i], .attempt = 1};
        assert_int_equal(oq__consumer_store_audit_add(s, &a, &err), 0);
    }
    assert_int_equal(oq__consumer_store_commit(s, &err), 0);
}

/* The per-call reconciliation figures (README, "Metrics"): a call counts once however many
 * UNKNOWN episodes it had; resolved = a final state after the first UNKNOWN with no review,
 * timed from the first UNKNOWN to the first final state; a call that saw review counts as
 * manual even when a machine finished it later, and is left out of the times. */
static void test_call_stats(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq__call_stats_t st;
    assert_int_equal(oq__consumer_call_stats(f->a, &st, &err), 0);
    assert_int_equal(st.calls, 0);
    assert_int_equal(st.unknown, 0);
    json_t *j = oq__call_stats_json(&st);
    assert_true(json_is_null(json_object_get(j, "reconciliation_success_rate")));
    assert_true(json_is_null(json_object_get(j, "manual_recovery_rate")));
    json_decref(j);

    /* never UNKNOWN */
    story(f->a, "c_a", OQ_X_COMMITTED, 0, (const char *[]){"started", "committed"},
          (int64_t[]){50, 100}, 2);
    /* two episodes and an undecided lookup, then found: 1000 ms from the first UNKNOWN */
    story(f->a, "c_b", OQ_X_COMMITTED, 1500,
          (const char *[]){"started", "unknown", "reconciling", "unknown", "committed"},
          (int64_t[]){900, 1000, 1100, 1500, 2000}, 5);
    /* review, an operator's retry, UNKNOWN again, then a machine: still manual, not timed */
    story(f->a, "c_c", OQ_X_COMMITTED, 3000,
          (const char *[]){"unknown", "needs_review", "safe_retry", "unknown", "committed"},
          (int64_t[]){1000, 1100, 2500, 3000, 9000}, 5);
    /* lookup says absent, out of tries: FAILED_FINAL is final (300 ms); a later attempt's
     * commit does not move the time */
    story(f->a, "c_d", OQ_X_COMMITTED, 1000,
          (const char *[]){"unknown", "failed_final", "planned", "committed"},
          (int64_t[]){1000, 1300, 4000, 4100}, 4);
    /* still UNKNOWN */
    story(f->a, "c_e", OQ_X_UNKNOWN, 1000, (const char *[]){"unknown"}, (int64_t[]){1000}, 1);

    assert_int_equal(oq__consumer_call_stats(f->b, &st, &err), 0);
    assert_int_equal(st.calls, 5);
    assert_int_equal(st.unknown, 4);
    assert_int_equal(st.resolved, 2);
    assert_int_equal(st.review, 1);
    assert_int_equal(st.pending, 1);
    assert_true(st.q_ms[0] == 1000 && st.q_ms[1] == 1000 && st.q_ms[2] == 1000);
    j = oq__call_stats_json(&st);
    assert_true(json_real_value(json_object_get(j, "reconciliation_success_rate")) == 0.5);
    assert_true(json_real_value(json_object_get(j, "manual_recovery_rate")) == 0.2);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "unknown_to_final_ms"), "n")), 2);
    json_decref(j);
}

#if FX_PG
/* A schema onceq newer than this binary: the consumer store refuses to open, changing nothing. */
static void test_pg_newer_schema_refused(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq__consumer_store_t *s = NULL;
    oq_db_opts_t o = {.synchronous = "OFF"};
    fx_exec(f->a, "UPDATE onceq.schema_version SET version = version + 1");
    assert_int_equal(oq__consumer_store_open(f->path, &o, "worker-c", &s, &err), OQ_EVERSION);
    assert_null(s);
    assert_non_null(strstr(err.msg, "newer"));
    fx_exec(f->a, "UPDATE onceq.schema_version SET version = version - 1");
    assert_int_equal(oq__consumer_store_open(f->path, &o, "worker-c", &s, &err), 0);
    oq__consumer_store_close(s);
}

/* The server ends worker a's connection (restart, pg_terminate_backend). */
static void pg_kill_a(fx_t *f)
{
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%d, 5000)",
             PQbackendPID(oq__consumer_store_pgconn(f->a)));
    fx_exec(f->b, sql);
}

/* A lost connection: a single statement outside a transaction is retried on a new connection;
 * inside a transaction the statement fails and nothing of the transaction is written, even by
 * the statements after it (never continued in autocommit on a new connection), and the next
 * transaction runs on a new connection. */
static void test_pg_connection_lost(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    int64_t counts[OQ_X__COUNT];
    pg_kill_a(f);
    assert_int_equal(oq__consumer_store_state_counts(f->a, counts, &err), 0);

    pg_kill_a(f);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    oq__audit_row_t a = {.ts = 1, .call_id = "lost-1", .event = "probe", .attempt = 1};
    assert_int_equal(oq__consumer_store_audit_add(f->a, &a, &err), 0);
    pg_kill_a(f);
    a.call_id = "lost-2";
    assert_int_not_equal(oq__consumer_store_audit_add(f->a, &a, &err), 0);
    a.call_id = "lost-3";
    assert_int_not_equal(oq__consumer_store_audit_add(f->a, &a, &err), 0);
    assert_int_not_equal(oq__consumer_store_commit(f->a, &err), 0);
    oq__consumer_store_rollback(f->a);
    assert_int_equal(q_int(f->b, "SELECT count(*) FROM audit WHERE event = 'probe'"), 0);

    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__consumer_store_audit_add(f->a, &a, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(q_int(f->b, "SELECT count(*) FROM audit WHERE event = 'probe'"), 1);
}
/* Scans of onceq.consumer_retention (the horizon's row) by worker a's open transaction. */
static int64_t pg_horizon_scans(fx_t *f)
{
    PGresult *r = PQexec(oq__consumer_store_pgconn(f->a),
                         "SELECT COALESCE(sum(COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0)), 0) "
                         "FROM pg_stat_xact_user_tables WHERE schemaname = 'onceq' AND relname = "
                         "'consumer_retention'");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    int64_t n = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return n;
}

/* The retention horizon is read once per transaction (behind its fence: it cannot change
 * before the transaction ends), not once per intake: a batch of intakes costs one round trip
 * for it. The next transaction reads it again and sees a purge's raise. */
static void test_pg_horizon_once_per_tx(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    int64_t h = -1;
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__consumer_store_horizon(f->a, &h, &err), 0);
    assert_int_equal(h, 0);
    int64_t first = pg_horizon_scans(f);
    assert_true(first > 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(oq__consumer_store_horizon(f->a, &h, &err), 0);
        assert_int_equal(h, 0);
    }
    assert_int_equal(pg_horizon_scans(f), first);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    fx_exec(f->b, "UPDATE onceq.consumer_retention SET horizon = 42 WHERE name = 'executions'");
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__consumer_store_horizon(f->a, &h, &err), 0);
    assert_int_equal(h, 42);
    assert_int_equal(oq__consumer_store_horizon(f->a, &h, &err), 0);
    assert_int_equal(h, 42);
    oq__consumer_store_rollback(f->a);
}

/* The retention horizon's fence, both ways (consumer/store_pg.c, file comment). A thread runs
 * one side while the test holds the other open; it must wait on a lock until the test commits. */
typedef struct {
    oq__consumer_store_t *s;
    int batch;           /* intake side: begin_batch (the pipeline) rather than begin */
    int64_t raise_to;    /* purge side: the horizon to raise to (0: the intake side) */
    int64_t seen;        /* intake side: the horizon it read */
    atomic_int done, rc; /* rc: 0, or the step that failed */
} fence_job_t;

static void *fence_job(void *arg)
{
    fence_job_t *j = arg;
    oq_error_t err = {0};
    int rc = 0;
    if (j->raise_to) {
        oq__purge_batch_t b = {.before = 1, .horizon = j->raise_to, .limit = 10};
        int64_t last = 0, ne = 0, nf = 0;
        if (oq__consumer_store_begin(j->s, &err))
            rc = 1;
        else if (oq__consumer_store_purge_settled(j->s, &b, &last, &ne, &nf, &err))
            rc = 2;
        else if (oq__consumer_store_commit(j->s, &err))
            rc = 3;
    } else {
        const char *calls[] = {"fence-call"}, *msgs[] = {"fence-msg"};
        if (j->batch ? oq__consumer_store_begin_batch(j->s, calls, msgs, 1, &err)
                     : oq__consumer_store_begin(j->s, &err))
            rc = 4;
        else if (oq__consumer_store_horizon(j->s, &j->seen, &err))
            rc = 5;
        oq__consumer_store_rollback(j->s);
    }
    if (rc) fprintf(stderr, "fence job step %d: %s\n", rc, err.msg);
    atomic_store(&j->rc, rc);
    atomic_store(&j->done, 1);
    return NULL;
}

/* 1 once the backend \p pid waits for a lock (asked on \p s's connection), within 5 s. */
static int waits_for_lock(oq__consumer_store_t *s, int pid)
{
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = %d", pid);
    for (int i = 0; i < 250; i++) {
        PGresult *r = PQexec(oq__consumer_store_pgconn(s), sql);
        int n = PQresultStatus(r) == PGRES_TUPLES_OK ? atoi(PQgetvalue(r, 0, 0)) : -1;
        PQclear(r);
        if (n > 0) return 1;
        usleep(20000);
    }
    return 0;
}

/* A purge that raises the horizon waits for the intake transactions that read it, and an intake
 * that starts while a purge holds the fence waits for its commit and reads the raised value (a
 * read in the same statement as the wait would see the old one: its snapshot is older). */
static void test_pg_horizon_fence(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    int64_t h = -1;
    int pid_a = PQbackendPID(oq__consumer_store_pgconn(f->a));
    int pid_b = PQbackendPID(oq__consumer_store_pgconn(f->b));
    /* 1. a has read the horizon in an open transaction: b's purge waits for it */
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__consumer_store_horizon(f->a, &h, &err), 0);
    assert_int_equal(h, 0);
    fence_job_t purge = {.s = f->b, .raise_to = 1000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fence_job, &purge), 0);
    int waited = waits_for_lock(f->a, pid_b);
    int early = atomic_load(&purge.done);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    pthread_join(th, NULL);
    assert_true(waited);
    assert_false(early);
    assert_int_equal(atomic_load(&purge.rc), 0);
    /* 2. b's purge holds the fence: an intake (either way of beginning) waits, then reads it */
    for (int batch = 0; batch < 2; batch++) {
        int64_t to = 2000 + batch;
        oq__purge_batch_t b = {.before = 1, .horizon = to, .limit = 10};
        int64_t last = 0, ne = 0, nf = 0;
        assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
        assert_int_equal(oq__consumer_store_purge_settled(f->b, &b, &last, &ne, &nf, &err), 0);
        fence_job_t in = {.s = f->a, .batch = batch, .seen = -1};
        assert_int_equal(pthread_create(&th, NULL, fence_job, &in), 0);
        waited = waits_for_lock(f->b, pid_a);
        early = atomic_load(&in.done);
        assert_int_equal(oq__consumer_store_commit(f->b, &err), 0);
        pthread_join(th, NULL);
        assert_true(waited);
        assert_false(early);
        assert_int_equal(atomic_load(&in.rc), 0);
        assert_int_equal(in.seen, to);
    }
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_inbox_dedupe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_fencing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_worker_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_effects_unique_last_gate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconcile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_terminal_untouched, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retry_backoff_and_exhaustion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatch_and_dlq, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dlq_redrive_through_inbox, setup, teardown),
        cmocka_unit_test(test_tool_args),
        cmocka_unit_test_setup_teardown(test_bad_args_fail_final, setup, teardown),
        cmocka_unit_test(test_transition_table),
        cmocka_unit_test_setup_teardown(test_finish_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hand_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_outbox_append_exists, setup, teardown),
        cmocka_unit_test_setup_teardown(test_finish_after_rollback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_purge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_stats, setup, teardown),
#if FX_PG
        cmocka_unit_test_setup_teardown(test_pg_newer_schema_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pg_connection_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pg_horizon_once_per_tx, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pg_horizon_fence, setup, teardown),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
