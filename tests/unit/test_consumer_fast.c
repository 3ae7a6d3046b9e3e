/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the consumer's inline fast path (oq__exec_intake -> OQ__INTAKE_NEW, then
 * oq__exec_start_inline + oq__exec_finish(OQ__RUN_INLINE), the same finish as a claimed run):
 * a new call of a fast tool gets its inbox row at intake, runs, and its execution is inserted
 * once, directly in its outcome state, with ONE audit row carrying the planned -> started ->
 * outcome path. What must hold: the same guarantees as the general path
 * (inbox dedupe, effects UNIQUE(call_id) as the last gate, result event in the same
 * transaction, retries through the normal claim), a second message for the same call in the
 * same transaction sees the row, and any re-execution after a terminal state still leaves a
 * 'started' (or second terminal) audit row behind for onceq verify to catch.
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
#include <jansson.h>
#include <sqlite3.h>

#include "consumer_fixture.h"
#include "oq_envelope.h"
#include "oq_json.h"
#include "oq_util.h"

/* Intake as the worker does it for a fast tool and, when new, run the registry tool inline and
 * finish it, in one tx. */
static int fast(oq__consumer_store_t *s, const oq_envelope_t *e, int64_t now, int *is_new,
                int *state, int *enew)
{
    oq_error_t err = {0};
    int outcome = -1;
    *state = -1;
    *enew = 0;
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    assert_int_equal(oq__exec_intake(s, e, &src, now, &outcome, &err), 0);
    *is_new = outcome == OQ__INTAKE_NEW;
    if (*is_new) {
        /* nothing but the inbox row yet */
        assert_int_equal(q_count(s, "SELECT count(*) FROM executions WHERE call_id=?1", e->call_id),
                         0);
        oq__exec_row_t x;
        oq__outcome_t o;
        assert_int_equal(oq__exec_start_inline(e, &x, &err), 0);
        assert_int_equal(x.tries, 1);
        run_registry_tool(&x, e->args, &o);
        assert_int_equal(
            oq__exec_finish(s, &x, OQ__RUN_INLINE, &o, &policy, now, state, enew, &err), 0);
        oq__outcome_clear(&o);
        oq__exec_row_clear(&x);
    }
    assert_int_equal(oq__consumer_store_commit(s, &err), 0);
    return outcome;
}

static void test_fast_commit_one_audit_row(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e, again;
    oq__exec_row_t x;
    oq_error_t err = {0};
    int is_new = 0, st = -1, enew = 0;
    memset(&x, 0, sizeof(x));
    mk_env(&e, "charge", "{\"amount\":8}", 1);
    int64_t now = 5000000;
    assert_int_equal(fast(f->a, &e, now, &is_new, &st, &enew), OQ__INTAKE_NEW);
    assert_int_equal(is_new, 1);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(enew, 1);
    assert_int_equal(oq__consumer_store_exec_get(f->a, e.call_id, &x, &err), 0);
    assert_int_equal(x.state, OQ_X_COMMITTED);
    assert_int_equal(x.tries, 1);
    assert_int_equal(x.fence, 1);
    assert_null(x.lease_owner);
    assert_int_equal(x.next_attempt_at, 0);
    assert_non_null(x.effect_id);
    assert_non_null(strstr(x.result, "\"charged\""));
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    /* one audit row, the outcome, with the inline path in its detail */
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM audit WHERE call_id=?1", e.call_id), 1);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "event='committed' AND fence=1 AND worker='worker-a' AND "
                             "detail LIKE 'inline: planned, started, try 1%'",
                             e.call_id),
                     1);
    /* the result event went to the outbox in the same transaction */
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM outbox WHERE key=?1 AND "
                             "topic='onceq.tool-results'",
                             e.call_id),
                     1);
    oq__exec_row_clear(&x);

    char *rid = q_text(f->a, "SELECT message_id FROM outbox WHERE key=?1", e.call_id);
    assert_non_null(rid);
    /* the same message again (other worker) while the result is still unpublished: a
     * duplicate, nothing new (the result is on its way) */
    assert_int_equal(fast(f->b, &e, now + 10, &is_new, &st, &enew), OQ__INTAKE_DUPLICATE);
    assert_int_equal(is_new, 0);
    assert_int_equal(q_count(f->a, "SELECT seen FROM inbox WHERE call_id=?1", e.call_id), 2);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", e.call_id), 1);
    /* the same call under a new message id (producer republish): done, nothing to re-emit */
    again = e;
    oq_id_uuid(again.message_id);
    assert_int_equal(fast(f->b, &again, now + 20, &is_new, &st, &enew), OQ__INTAKE_DONE);
    assert_int_equal(is_new, 0);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", e.call_id), 1);
    /* once the result was delivered (and maybe lost on the way), the same message again
     * re-emits it: the same row moved to the tail, same result message id, nothing executed */
    relay_delivered_all(f->a);
    int64_t seq0 = q_count(f->a, "SELECT " FX_POS " FROM outbox WHERE key=?1", e.call_id);
    assert_int_equal(fast(f->b, &e, now + 30, &is_new, &st, &enew), OQ__INTAKE_REEMITTED);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", e.call_id), 1);
    assert_true(q_count(f->a, "SELECT " FX_POS " FROM outbox WHERE key=?1", e.call_id) > seq0);
    char *rid2 = q_text(f->a, "SELECT message_id FROM outbox WHERE key=?1", e.call_id);
    assert_string_equal(rid2, rid);
    free(rid2);
    /* and so does a new message id of the call (done), once that copy was delivered too */
    relay_delivered_all(f->a);
    seq0 = q_count(f->a, "SELECT " FX_POS " FROM outbox WHERE key=?1", e.call_id);
    oq_id_uuid(again.message_id);
    assert_int_equal(fast(f->a, &again, now + 40, &is_new, &st, &enew), OQ__INTAKE_DONE);
    assert_true(q_count(f->a, "SELECT " FX_POS " FROM outbox WHERE key=?1", e.call_id) > seq0);
    rid2 = q_text(f->a, "SELECT message_id FROM outbox WHERE key=?1", e.call_id);
    assert_string_equal(rid2, rid);
    free(rid2);
    free(rid);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "event IN ('started','committed')",
                             e.call_id),
                     1);
    /* and nobody can claim it: terminal */
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_claim(f->b, e.call_id, 1000, now + 100000, NULL, &err), OQ_ESTATE);
    oq__consumer_store_rollback(f->b);
    oq_envelope_clear(&e);
}

/* Two messages of one call in ONE transaction: the second sees the row the first wrote. */
static void test_fast_same_call_twice_in_one_tx(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e, e2;
    oq_error_t err = {0};
    mk_env(&e, "send_email", "{\"to\":\"a@b.c\",\"subject\":\"s\"}", 1);
    e2 = e;
    oq_id_uuid(e2.message_id);
    int64_t now = 6000000;
    int outcome = -1, st = -1, enew = 0;
    oq__exec_row_t x;
    oq__outcome_t o;
    memset(&o, 0, sizeof(o));
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_intake(f->a, &e, &src, now, &outcome, &err), 0);
    assert_int_equal(outcome, OQ__INTAKE_NEW);
    assert_int_equal(oq__exec_start_inline(&e, &x, &err), 0);
    o.cls = OQ__OUTCOME_SUCCESS;
    o.out.has_effect = 1;
    snprintf(o.out.recipient, sizeof(o.out.recipient), "a@b.c");
    assert_int_equal(oq__exec_finish(f->a, &x, OQ__RUN_INLINE, &o, &policy, now, &st, &enew, &err),
                     0);
    oq__exec_row_clear(&x);
    assert_int_equal(oq__exec_intake(f->a, &e2, &src, now, &outcome, &err), 0);
    assert_int_equal(outcome, OQ__INTAKE_DONE);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM executions WHERE call_id=?1", e.call_id),
                     1);
    oq_envelope_clear(&e);
}

/* The effects gate still holds on the fast path: an existing effect wins. */
static void test_fast_effect_gate(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    mk_env(&e, "charge", "{\"amount\":3}", 1);
    char sql[400];
    snprintf(sql, sizeof(sql),
             "INSERT INTO effects(call_id, effect_id, tool, amount, detail, attempt, fence, "
             "worker, created_at) VALUES ('%s', 'e_old', 'charge', 3, '{\"old\":true}', 1, 1, "
             "'w0', 1)",
             e.call_id);
    fx_exec(f->a, sql);
    int is_new = 0, st = -1, enew = 0;
    assert_int_equal(fast(f->a, &e, 7000000, &is_new, &st, &enew), OQ__INTAKE_NEW);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(enew, 0);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    assert_int_equal(oq__consumer_store_exec_get(f->a, e.call_id, &x, &err), 0);
    assert_string_equal(x.effect_id, "e_old");
    assert_string_equal(x.result, "{\"old\":true}");
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "detail LIKE '%effect already present'",
                             e.call_id),
                     1);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

/* A retryable failure on the inline first try goes through the normal claim afterwards. */
static void test_fast_retry_then_claim(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    mk_env(&e, "fail", "{\"retryable\":true}", 1);
    int64_t now = 8000000;
    int is_new = 0, st = -1, enew = 0;
    assert_int_equal(fast(f->a, &e, now, &is_new, &st, &enew), OQ__INTAKE_NEW);
    assert_int_equal(st, OQ_X_FAILED_RETRYABLE);
    assert_int_equal(oq__consumer_store_exec_get(f->a, e.call_id, &x, &err), 0);
    assert_int_equal(x.state, OQ_X_FAILED_RETRYABLE);
    assert_int_equal(x.tries, 1);
    /* full jitter: uniform in [0, base 100 ms) after the first try */
    assert_true(x.next_attempt_at >= now && x.next_attempt_at < now + 100);
    oq__exec_row_clear(&x);
    /* not due yet, then due: claimed with fence 2, try 2 */
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_claim(f->b, e.call_id, 1000, now - 1, NULL, &err), OQ_ESTATE);
    assert_int_equal(oq__exec_claim(f->b, e.call_id, 1000, now + 200, &x, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->b, &err), 0);
    assert_int_equal(x.fence, 2);
    assert_int_equal(x.tries, 2);
    oq__exec_row_clear(&x);
    assert_int_equal(q_count(f->a,
                             "SELECT group_concat(event) = 'failed_retryable,started' "
                             "FROM (SELECT event FROM audit WHERE call_id=?1 ORDER BY id) o",
                             e.call_id),
                     1);
    /* no result event for a non-terminal failure */
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", e.call_id), 0);
    oq_envelope_clear(&e);
}

static void test_fast_bad_args_final(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    mk_env(&e, "charge", "{\"amount\":-1}", 1);
    int is_new = 0, st = -1, enew = 0;
    assert_int_equal(fast(f->a, &e, 9000000, &is_new, &st, &enew), OQ__INTAKE_NEW);
    assert_int_equal(st, OQ_X_FAILED_FINAL);
    assert_int_equal(enew, 0);
    assert_int_equal(oq__consumer_store_exec_get(f->a, e.call_id, &x, &err), 0);
    assert_int_equal(x.state, OQ_X_FAILED_FINAL);
    assert_non_null(strstr(x.error, "bad_args"));
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 0);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "event='failed_final'",
                             e.call_id),
                     1);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", e.call_id), 1);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

/* A compiled tool's result the canonical form cannot write still records the effect: as its
 * JSON text (an integer past 2^53, nesting past the form's 2,048 levels), or, when no JSON text can
 * hold it (a string that is not UTF-8), named as omitted; the execution, the effect and the
 * result message carry the same text. Before, the last one failed the finish on every try. */
#define MSG(m) "SELECT json_extract(payload, '$.result." m "') FROM outbox WHERE key=?1"

static char *finish_with(fx_t *f, const char *key, json_t *result, const char *path,
                         const char *want)
{
    oq_envelope_t e;
    oq__exec_row_t x;
    oq__outcome_t o;
    oq_error_t err = {0};
    int outcome = -1, st = -1, enew = 0;
    mk_env(&e, "charge", "{\"amount\":3}", 1);
    snprintf(e.call_id, sizeof e.call_id, "%s", key);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_intake(f->a, &e, &src, 7000000, &outcome, &err), 0);
    assert_int_equal(outcome, OQ__INTAKE_NEW);
    assert_int_equal(oq__exec_start_inline(&e, &x, &err), 0);
    run_registry_tool(&x, e.args, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_SUCCESS);
    json_decref(o.out.result);
    o.out.result = result;
    int rc = oq__exec_finish(f->a, &x, OQ__RUN_INLINE, &o, &policy, 7000000, &st, &enew, &err);
    if (rc) fprintf(stderr, "finish %s: %s\n", key, err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    oq__outcome_clear(&o);
    oq__exec_row_clear(&x);
    char *stored = q_text(f->a, "SELECT detail FROM effects WHERE call_id=?1", e.call_id);
    assert_non_null(stored);
    assert_int_equal(oq__consumer_store_exec_get(f->a, e.call_id, &x, &err), 0);
    assert_string_equal(x.result, stored);
    oq__exec_row_clear(&x);
    /* the result message carries the same (its member read back: \p path, \p want) */
    char *sent = q_text(f->a, path, e.call_id);
    assert_non_null(sent);
    assert_string_equal(sent, want);
    free(sent);
    oq_envelope_clear(&e);
    return stored;
}

static void test_fast_result_no_json_can_hold(void **state)
{
    fx_t *f = *state;
    char *r = finish_with(f, "c_00000000000000000000000000000b16",
                          json_pack("{s:I}", "id", (json_int_t)9007199254740993LL),
                          MSG("result_text"), "{\"id\":9007199254740993}");
    assert_string_equal(r, "{\"result_text\":\"{\\\"id\\\":9007199254740993}\"}");
    free(r);

    enum { DEEP = 2100 }; /* levels: past the canonical form's 2,048 */
    json_t *deep = json_object();
    for (int i = 0; i < DEEP; i++) {
        json_t *up = json_array();
        json_array_append_new(up, deep);
        deep = up;
    }
    char *want = malloc(2 * DEEP + 16);
    assert_non_null(want);
    memcpy(want, "{\"d\":", 5);
    memset(want + 5, '[', DEEP);
    memcpy(want + 5 + DEEP, "{}", 2);
    memset(want + 7 + DEEP, ']', DEEP);
    memcpy(want + 7 + 2 * DEEP, "}", 2);
    r = finish_with(f, "c_00000000000000000000000000000dee", json_pack("{s:o}", "d", deep),
                    MSG("result_text"), want);
    free(want);
    free(r);

    r = finish_with(f, "c_00000000000000000000000000000f7f",
                    json_pack("{s:o}", "name", json_stringn_nocheck("caf\xe9", 4)),
                    MSG("result_omitted.reason"), "not UTF-8");
    assert_string_equal(r, "{\"result_omitted\":{\"reason\":\"not UTF-8\"}}");
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fast_commit_one_audit_row, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fast_same_call_twice_in_one_tx, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fast_effect_gate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fast_retry_then_claim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fast_bad_args_final, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fast_result_no_json_can_hold, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
