/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer's side of the redrive: a call message that comes again for a TERMINAL
 * execution (the same message id redelivered, or the producer's redrive) re-emits the call's
 * result, under the result's own derived message id, once the first copy was delivered; a
 * non-terminal execution is left alone. Result message ids: UUIDv8, the planning message's
 * 48 time bits, one id per (call, attempt, status), so the producer's result_inbox applies a
 * re-emitted result at most once.
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

/* Intake of \p e in its own transaction and, when new, the inline run (as the worker does). */
static int take(oq__consumer_store_t *s, const oq_envelope_t *e, int64_t now)
{
    oq_error_t err = {0};
    int d = -1, st = -1, enew = 0;
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    assert_int_equal(oq__exec_intake(s, e, &src, now, &d, &err), 0);
    if (d == OQ__INTAKE_NEW) {
        oq__exec_row_t x;
        oq__outcome_t o;
        assert_int_equal(oq__exec_start_inline(e, &x, &err), 0);
        run_registry_tool(&x, e->args, &o);
        assert_int_equal(oq__exec_finish(s, &x, OQ__RUN_INLINE, &o, &policy, now, &st, &enew, &err),
                         0);
        oq__outcome_clear(&o);
        oq__exec_row_clear(&x);
    }
    assert_int_equal(oq__consumer_store_commit(s, &err), 0);
    return d;
}

static void test_result_id_derived(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    mk_env(&e, "charge", "{\"amount\":3}", 1);
    assert_int_equal(take(f->a, &e, 1000), OQ__INTAKE_NEW);
    char *rid = q_text(f->a, "SELECT message_id FROM outbox WHERE key=?1", e.call_id);
    assert_non_null(rid);
    /* a valid envelope id, version 8, RFC 9562 variant, the call message's time bits */
    assert_int_equal(strlen(rid), OQ_UUID_LEN);
    assert_int_equal(rid[14], '8');
    assert_non_null(strchr("89ab", rid[19]));
    assert_memory_equal(rid, e.message_id, 13);
    assert_string_not_equal(rid, e.message_id);
    char *payload = q_text(f->a, "SELECT payload FROM outbox WHERE key=?1", e.call_id);
    oq_envelope_t r;
    oq_error_t err = {0};
    assert_int_equal(oq_envelope_decode(payload, strlen(payload), &r, &err), 0);
    assert_string_equal(r.message_id, rid);
    assert_string_equal(r.status, "succeeded");
    oq_envelope_clear(&r);

    /* re-emitted after delivery: the same row, same bytes, same id */
    relay_delivered_all(f->a);
    assert_int_equal(take(f->b, &e, 2000), OQ__INTAKE_REEMITTED);
    char *payload2 = q_text(f->a, "SELECT payload FROM outbox WHERE key=?1", e.call_id);
    assert_string_equal(payload, payload2);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox WHERE key=?1", e.call_id), 1);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM audit WHERE call_id=?1 AND "
                             "event='duplicate_skipped' AND detail LIKE '%result re-emitted'",
                             e.call_id),
                     1);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    free(payload2);
    free(payload);
    free(rid);
    oq_envelope_clear(&e);
}

/* A final failure re-emits 'failed' with its error, under an id of its own. */
static void test_failed_final_reemitted(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e, g;
    mk_env(&e, "fail", "{\"retryable\":false}", 1);
    mk_env(&g, "charge", "{\"amount\":3}", 1);
    assert_int_equal(take(f->a, &e, 1000), OQ__INTAKE_NEW);
    assert_int_equal(take(f->a, &g, 1000), OQ__INTAKE_NEW);
    assert_int_equal(
        q_count(f->a, "SELECT count(*) FROM executions WHERE call_id=?1 AND state='FAILED_FINAL'",
                e.call_id),
        1);
    char *rid = q_text(f->a, "SELECT message_id FROM outbox WHERE key=?1", e.call_id);
    char *gid = q_text(f->a, "SELECT message_id FROM outbox WHERE key=?1", g.call_id);
    assert_string_not_equal(rid, gid);
    relay_delivered_all(f->a);
    assert_int_equal(take(f->b, &e, 2000), OQ__INTAKE_REEMITTED);
    char *payload = q_text(f->a, "SELECT payload FROM outbox WHERE key=?1", e.call_id);
    oq_envelope_t r;
    oq_error_t err = {0};
    assert_int_equal(oq_envelope_decode(payload, strlen(payload), &r, &err), 0);
    assert_string_equal(r.message_id, rid);
    assert_string_equal(r.status, "failed");
    assert_non_null(r.error);
    oq_envelope_clear(&r);
    free(payload);
    free(rid);
    free(gid);
    oq_envelope_clear(&e);
    oq_envelope_clear(&g);
}

/* A call that is not terminal is left alone: it is running or will be retried. */
static void test_in_flight_left_alone(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq_error_t err = {0};
    int d = -1;
    mk_env(&e, "sleep", "{\"ms\":10}", 1);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_intake(f->a, &e, &src, 1000, &d, &err), 0);
    assert_int_equal(d, OQ__INTAKE_NEW);
    assert_int_equal(oq__exec_plan(f->a, &e, 1000, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    relay_delivered_all(f->a);
    assert_int_equal(take(f->b, &e, 2000), OQ__INTAKE_DUPLICATE);
    oq_id_uuid(e.message_id);
    assert_int_equal(take(f->b, &e, 2001), OQ__INTAKE_IN_PROGRESS);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM outbox", NULL), 0);
    assert_int_equal(q_count(f->a,
                             "SELECT count(*) FROM executions WHERE call_id=?1 AND state='PLANNED'",
                             e.call_id),
                     1);
    oq_envelope_clear(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_result_id_derived, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_final_reemitted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_in_flight_left_alone, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
