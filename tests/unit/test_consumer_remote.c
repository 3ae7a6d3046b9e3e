/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rules for calls to other systems (consumer/execution.c), on a real effects.db shared by
 * two workers: STARTED durable with the `running` event before a request leaves; the outcome
 * classes mapped exactly (UNKNOWN stored, Retry-After honoured, out of tries = FAILED_FINAL
 * "retries_exhausted"); reconciliation by lookup (found / absent / undecided, the settle time
 * of a downstream without keys, the lookup budget), by declaration (keys honoured: resend;
 * neither keys nor lookup: NEEDS_REVIEW, never a resend); late answers refused by the fence;
 * and the operator's review decisions (fenced, audited, one result event).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "oq_consumer.h"
#include "consumer_fixture.h"
#include "http_tools.h"

/* The tools of these tests, as a worker with a tools file would describe them. */
static void traits(const char *tool, void *ctx, oq__tool_traits_t *out)
{
    (void)ctx;
    memset(out, 0, sizeof(*out));
    if (strcmp(tool, "pay_keys") == 0) { /* keys honoured + lookup */
        *out = (oq__tool_traits_t){1, 1, 1, 1, 0};
    } else if (strcmp(tool, "pay_ref") == 0) { /* lookup by reference, no keys */
        *out = (oq__tool_traits_t){1, 1, 1, 0, 1000};
    } else if (strcmp(tool, "pay_idem") == 0) { /* keys honoured, no lookup */
        *out = (oq__tool_traits_t){1, 1, 0, 1, 0};
    } else if (strcmp(tool, "pay_blind") == 0) { /* neither */
        *out = (oq__tool_traits_t){1, 1, 0, 0, 0};
    } else {
        out->known = oq_tool_find(tool) != NULL;
    }
}

static int verdicts[4];
static void on_rec(void *ctx, int verdict, int to, int64_t ms)
{
    (void)ctx, (void)to, (void)ms;
    if (verdict >= 0 && verdict < 4) verdicts[verdict]++;
}

static const oq__retry_policy_t rp = {.max_attempts = 3,
                                      .base_ms = 100,
                                      .max_ms = 1000,
                                      .lookup_budget = 2,
                                      .lease_ms = 1000,
                                      .traits = traits,
                                      .on_reconciled = on_rec};

static int64_t qi(oq__consumer_store_t *s, const char *sql, const char *call_id)
{
    return q_count(s, sql, call_id);
}

static char *qs(oq__consumer_store_t *s, const char *sql, const char *call_id)
{
    return q_text(s, sql, call_id);
}

static void state_is(oq__consumer_store_t *s, const char *call_id, const char *want)
{
    char *v = qs(s, "SELECT state FROM executions WHERE call_id = ?1", call_id);
    if (!v || strcmp(v, want) != 0) fail_msg("%s is %s, want %s", call_id, v ? v : "-", want);
    free(v);
}

/* Results of \p status for the call in the outbox. */
static int64_t results(oq__consumer_store_t *s, const char *call_id, const char *status)
{
    char sql[200];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM outbox WHERE key = ?1 AND json_extract(payload, '$.status') "
             "= '%s'",
             status);
    return qi(s, sql, call_id);
}

/* A new call of \p tool started (STARTED committed) by worker \p s at \p now. */
static void start(oq__consumer_store_t *s, oq_envelope_t *e, const char *tool, int64_t now,
                  oq__exec_row_t *x)
{
    oq_error_t err = {0};
    mk_env(e, tool, "{\"amount\":5}", 1);
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    int d = -1;
    assert_int_equal(oq__exec_intake(s, e, &src, now, &d, &err), 0);
    assert_int_equal(d, OQ__INTAKE_NEW);
    assert_int_equal(oq__exec_start(s, e, 1000, now, x, &err), 0);
    assert_int_equal(oq__consumer_store_commit(s, &err), 0);
}

static int finish(oq__consumer_store_t *s, const oq__exec_row_t *x, oq__outcome_class_t cls,
                  const char *code, int64_t retry_after, const char *downstream_id, int64_t now,
                  int *st)
{
    oq__outcome_t o;
    oq_error_t err = {0};
    memset(&o, 0, sizeof(o));
    o.cls = cls;
    o.retry_after_ms = retry_after;
    snprintf(o.out.code, sizeof(o.out.code), "%s", code);
    snprintf(o.out.message, sizeof(o.out.message), "%s happened", code);
    if (cls == OQ__OUTCOME_SUCCESS) {
        o.out.has_effect = 1;
        o.out.result = json_pack("{s:s}", "object_id", downstream_id);
        snprintf(o.downstream_id, sizeof(o.downstream_id), "%s", downstream_id);
    }
    int enew = 0;
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    int rc = oq__exec_finish(s, x, OQ__RUN_CLAIMED, &o, &rp, now, st, &enew, &err);
    assert_int_equal(oq__consumer_store_commit(s, &err), 0);
    oq__outcome_clear(&o);
    return rc;
}

/* One recovery step by \p s; RECONCILING rows land in lk (cap 8). */
static int recover(oq__consumer_store_t *s, int64_t now, oq__exec_row_t lk[8], int *nl)
{
    oq_error_t err = {0};
    int n = 0;
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    assert_int_equal(oq__exec_recover(s, now, &rp, 8, lk, nl, &n, &err), 0);
    assert_int_equal(oq__consumer_store_commit(s, &err), 0);
    return n;
}

static int lookup_done(oq__consumer_store_t *s, const oq__exec_row_t *rec, int verdict,
                       const char *id, int64_t now, int *st)
{
    oq_error_t err = {0};
    char r[128];
    snprintf(r, sizeof(r), "{\"object_id\":\"%s\"}", id ? id : "");
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    int rc = oq__exec_lookup_done(s, rec, verdict, id, verdict == OQ__LOOKUP_FOUND ? r : NULL,
                                  "test", &rp, now, st, &err);
    assert_int_equal(oq__consumer_store_commit(s, &err), 0);
    return rc;
}

static void clear_rows(oq__exec_row_t *r, int n)
{
    for (int i = 0; i < n; i++)
        oq__exec_row_clear(&r[i]);
}

/* The run \p x answered by the executor with class \p cls, status \p status and \p body (parsed
 * as the executor parses it): the outcome read from it (oq__outcome_from_http), whose message
 * must be valid UTF-8, finished by worker \p s at \p now; the new state in *st. */
static void finish_answer(oq__consumer_store_t *s, const oq__exec_row_t *x, oq__http_class_t cls,
                          long status, const char *object_id, const char *body, int64_t now,
                          int *st, int *enew)
{
    oq_error_t err = {0};
    json_t *doc = json_loads(body, 0, NULL);
    assert_non_null(doc);
    oq__http_outcome_t h;
    memset(&h, 0, sizeof(h));
    h.cls = cls;
    h.code = "some_code";
    h.message = status == 402 ? "HTTP 402" : "HTTP 200";
    h.status = status;
    h.sent = 1;
    h.retry_after_ms = -1;
    h.object_id = object_id;
    h.body = body;
    h.body_len = strlen(body);
    h.parsed = 1;
    h.doc = doc;
    oq__outcome_t o;
    oq__outcome_from_http(&h, 0, &o);
    json_decref(doc); /* the executor's tree goes with its transfer */
    assert_true(oq_utf8_valid(o.out.message, strlen(o.out.message)));
    assert_int_equal(oq__consumer_store_begin(s, &err), 0);
    int rc = oq__exec_finish(s, x, OQ__RUN_CLAIMED, &o, &rp, now, st, enew, &err);
    if (rc) fail_msg("finish: %d %s", rc, err.msg);
    assert_int_equal(oq__consumer_store_commit(s, &err), 0);
    oq__outcome_clear(&o);
}

/* A success whose answer holds a number RFC 8785 cannot write exactly (an integer past 2^53, as
 * a payment API's numeric id can be): the effect happened, so it is recorded, and the result
 * keeps the answer as its text ("response_text") instead of a tree that cannot be encoded. It
 * used to fail the whole batch transaction on every try (OQ_ERANGE from the result message),
 * which stalled the worker behind one answer. */
static void test_unencodable_answer(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    memset(&x, 0, sizeof(x));
    int st = -1, enew = 0;
    start(f->a, &e, "pay_keys", 2000000, &x);
    const char *body = "{\"ok\": true, \"id\": 9007199254740993}";
    finish_answer(f->a, &x, OQ__HTTP_SUCCESS, 200, "pay_9", body, 2000100, &st, &enew);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(enew, 1);
    assert_int_equal(oq__consumer_store_effect_count(f->b, e.call_id), 1);
    assert_int_equal(results(f->b, e.call_id, "succeeded"), 1);
    /* the result message: the answer as its exact text, the id and status as they were */
    char *t = qs(f->b,
                 "SELECT json_extract(payload, '$.result.response_text') || '|' || "
                 "json_extract(payload, '$.result.object_id') || '|' || "
                 "json_extract(payload, '$.result.http_status') || '|' || "
                 "CASE WHEN json_extract(payload, '$.result.response') IS NULL THEN 'text' "
                 "ELSE 'tree' END FROM outbox "
                 "WHERE key = ?1 AND json_extract(payload, '$.status') = 'succeeded'",
                 e.call_id);
    char want[256];
    snprintf(want, sizeof(want), "%s|pay_9|200|text", body);
    assert_non_null(t);
    assert_string_equal(t, want);
    free(t);
    /* the execution's and the effect's result are the same text */
    assert_int_equal(qi(f->b,
                        "SELECT x.result = f.detail AND json_extract(x.result, '$.response_text') "
                        "IS NOT NULL FROM executions x JOIN effects f USING (call_id) "
                        "WHERE call_id = ?1",
                        e.call_id),
                     1);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

/* A refusal whose message the byte limits cut inside a character (an ASCII letter, then
 * three-byte characters): the failure is recorded with valid UTF-8 text, not refused. */
static void test_refusal_cut_in_a_character(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    memset(&x, 0, sizeof(x));
    int st = -1, enew = 0;
    start(f->a, &e, "pay_keys", 2000000, &x);
    char body[1024] = "{\"error\":{\"message\":\"a";
    for (int i = 0; i < 150; i++)
        strcat(body, "\xe2\x82\xac"); /* the euro sign */
    strcat(body, "\"}}");
    finish_answer(f->a, &x, OQ__HTTP_FINAL, 402, NULL, body, 2000100, &st, &enew);
    assert_int_equal(st, OQ_X_FAILED_FINAL);
    assert_int_equal(results(f->b, e.call_id, "failed"), 1);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

/* STARTED is one row with lease, fence, try, effect_id and started_at, and `running` is told. */
static void test_start_durable_and_running(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    memset(&x, 0, sizeof(x));
    start(f->a, &e, "pay_keys", 1000000, &x);
    assert_int_equal(x.state, OQ_X_STARTED);
    state_is(f->b, e.call_id, "STARTED");
    assert_int_equal(qi(f->b,
                        "SELECT tries = 1 AND fence = 1 AND lease_owner = 'worker-a' AND "
                        "lease_until = 1001000 AND started_at = 1000000 AND effect_id = 'e_' || "
                        "substr(call_id, 3) FROM executions WHERE call_id = ?1",
                        e.call_id),
                     1);
    assert_int_equal(results(f->b, e.call_id, "running"), 1);
    assert_int_equal(qi(f->b, "SELECT count(*) FROM audit WHERE call_id = ?1", e.call_id), 1);
    /* a success: COMMITTED, effect with the downstream id, `succeeded` */
    int st = -1;
    assert_int_equal(finish(f->a, &x, OQ__OUTCOME_SUCCESS, "status_201", -1, "pay_1", 1000010, &st),
                     0);
    assert_int_equal(st, OQ_X_COMMITTED);
    char *d = qs(f->b, "SELECT downstream_id FROM effects WHERE call_id = ?1", e.call_id);
    assert_string_equal(d, "pay_1");
    free(d);
    assert_int_equal(qi(f->b,
                        "SELECT count(*) FROM outbox WHERE key = ?1 AND "
                        "json_extract(payload, '$.result.object_id') = 'pay_1'",
                        e.call_id),
                     1);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

/* A start that owes its `running` event (an outside call, consumer/outside.c) writes STARTED
 * without it; oq__exec_tell_running appends it while the row is still that run, and tells
 * nothing once the run was written (COMMITTED); a retry's claim owes nothing. */
static void test_running_owed(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e, g;
    oq__exec_row_t x, y;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    memset(&y, 0, sizeof(y));
    int d = -1, told = -1, owed = -1, st = -1;
    mk_env(&e, "pay_keys", "{\"amount\":5}", 1);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_intake(f->a, &e, &src, 1000000, &d, &err), 0);
    assert_int_equal(oq__exec_start_owing(f->a, &e, 1000, 1000000, &x, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    state_is(f->b, e.call_id, "STARTED");
    assert_int_equal(qi(f->b, "SELECT count(*) FROM outbox WHERE key = ?1", e.call_id), 0);
    /* still out: told once */
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_tell_running(f->a, &x, 0, 1000500, &told, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(told, 1);
    assert_int_equal(results(f->b, e.call_id, "running"), 1);

    /* answered before anyone told it: one result, `succeeded`; a late tell writes nothing */
    mk_env(&g, "pay_keys", "{\"amount\":6}", 1);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_intake(f->a, &g, &src, 2000000, &d, &err), 0);
    assert_int_equal(oq__exec_start_owing(f->a, &g, 1000, 2000000, &y, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(finish(f->a, &y, OQ__OUTCOME_SUCCESS, "status_201", -1, "pay_2", 2000010, &st),
                     0);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_tell_running(f->a, &y, 0, 2000020, &told, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(told, 0);
    assert_int_equal(qi(f->b, "SELECT count(*) FROM outbox WHERE key = ?1", g.call_id), 1);
    assert_int_equal(results(f->b, g.call_id, "succeeded"), 1);

    /* a retryable refusal, then the retry's claim: nothing owed (not the attempt's first run) */
    assert_int_equal(finish(f->a, &x, OQ__OUTCOME_RETRYABLE, "status_503", -1, NULL, 1000600, &st),
                     0);
    assert_int_equal(st, OQ_X_FAILED_RETRYABLE);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_claim_owing(f->a, e.call_id, 1000, 9000000, &owed, &x, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(owed, 0);
    assert_int_equal(results(f->b, e.call_id, "running"), 1);
    oq__exec_row_clear(&x);
    oq__exec_row_clear(&y);
    oq_envelope_clear(&e);
    oq_envelope_clear(&g);
}

/* UNKNOWN is stored (fence moved, no result), a retryable refusal honours Retry-After, and out
 * of tries a retryable refusal is FAILED_FINAL "retries_exhausted". */
static void test_outcome_classes(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e, g;
    oq__exec_row_t x, y;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    memset(&y, 0, sizeof(y));
    int st = -1;
    start(f->a, &e, "pay_blind", 2000000, &x);
    assert_int_equal(
        finish(f->a, &x, OQ__OUTCOME_UNKNOWN, "timeout_after_send", -1, NULL, 2000500, &st), 0);
    assert_int_equal(st, OQ_X_UNKNOWN);
    assert_int_equal(qi(f->b,
                        "SELECT state = 'UNKNOWN' AND fence = 2 AND lease_owner IS NULL AND "
                        "unknown_at = 2000500 AND json_extract(error, '$.code') = "
                        "'timeout_after_send' AND effect_id IS NOT NULL FROM executions "
                        "WHERE call_id = ?1",
                        e.call_id),
                     1);
    assert_int_equal(results(f->b, e.call_id, "running"), 1);
    assert_int_equal(qi(f->b, "SELECT count(*) FROM outbox WHERE key = ?1", e.call_id), 1);
    assert_int_equal(oq__consumer_store_effect_count(f->b, e.call_id), 0);

    /* 429 with Retry-After 5 s: not before 5 s, whatever the jitter */
    start(f->a, &g, "pay_keys", 3000000, &y);
    assert_int_equal(
        finish(f->a, &y, OQ__OUTCOME_RETRYABLE, "status_429", 5000, NULL, 3000000, &st), 0);
    assert_int_equal(st, OQ_X_FAILED_RETRYABLE);
    assert_int_equal(
        qi(f->b, "SELECT next_attempt_at FROM executions WHERE call_id = ?1", g.call_id), 3005000);
    for (int i = 2; i <= 3; i++) {
        assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
        assert_int_equal(oq__exec_claim(f->a, g.call_id, 1000, 3000000 + 10000 * i, &y, &err), 0);
        assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
        assert_int_equal(finish(f->a, &y, OQ__OUTCOME_RETRYABLE, "status_503", -1, NULL,
                                3000000 + 10000 * i, &st),
                         0);
    }
    assert_int_equal(st, OQ_X_FAILED_FINAL);
    assert_int_equal(qi(f->b,
                        "SELECT count(*) FROM outbox WHERE key = ?1 AND "
                        "json_extract(payload, '$.error.code') = 'retries_exhausted'",
                        g.call_id),
                     1);
    assert_int_equal(results(f->b, g.call_id, "running"), 1); /* once per attempt */
    oq__exec_row_clear(&x);
    oq__exec_row_clear(&y);
    oq_envelope_clear(&e);
    oq_envelope_clear(&g);
}

/* Lookup FOUND: COMMITTED with the downstream's id; the reconciler's lease is fenced. */
static void test_lookup_found(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x, lk[8];
    memset(&x, 0, sizeof(x));
    memset(lk, 0, sizeof(lk));
    int st = -1, nl = 0;
    memset(verdicts, 0, sizeof(verdicts));
    start(f->a, &e, "pay_keys", 4000000, &x);
    assert_int_equal(
        finish(f->a, &x, OQ__OUTCOME_UNKNOWN, "closed_without_answer", -1, NULL, 4000100, &st), 0);
    assert_int_equal(recover(f->b, 4000200, lk, &nl), 1);
    assert_int_equal(nl, 1);
    assert_int_equal(lk[0].state, OQ_X_RECONCILING);
    state_is(f->a, e.call_id, "RECONCILING");
    assert_int_equal(qi(f->a, "SELECT fence FROM executions WHERE call_id = ?1", e.call_id), 3);
    /* the late answer of the first request is refused (its lease is long gone) */
    assert_int_equal(
        finish(f->a, &x, OQ__OUTCOME_SUCCESS, "status_201", -1, "pay_late", 4000300, &st),
        OQ_EFENCED);
    assert_int_equal(lookup_done(f->b, &lk[0], OQ__LOOKUP_FOUND, "pay_9", 4000400, &st), 0);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 1);
    char *d = qs(f->a, "SELECT downstream_id FROM effects WHERE call_id = ?1", e.call_id);
    assert_string_equal(d, "pay_9");
    free(d);
    assert_int_equal(results(f->a, e.call_id, "succeeded"), 1);
    assert_int_equal(verdicts[OQ__LOOKUP_FOUND], 1);
    /* a second answer of the same lookup changes nothing */
    assert_int_equal(lookup_done(f->b, &lk[0], OQ__LOOKUP_ABSENT, NULL, 4000500, &st), OQ_EFENCED);
    state_is(f->a, e.call_id, "COMMITTED");
    clear_rows(lk, 8);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

/* Without keys a "not found" is trusted only after the settle time; then the resend. */
static void test_lookup_absent_settle(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x, lk[8];
    memset(&x, 0, sizeof(x));
    memset(lk, 0, sizeof(lk));
    int st = -1, nl = 0;
    start(f->a, &e, "pay_ref", 5000000, &x); /* settle 1000 ms */
    assert_int_equal(finish(f->a, &x, OQ__OUTCOME_UNKNOWN, "connection_reset_after_send", -1, NULL,
                            5000050, &st),
                     0);
    assert_int_equal(recover(f->b, 5000100, lk, &nl), 1);
    assert_int_equal(lookup_done(f->b, &lk[0], OQ__LOOKUP_ABSENT, NULL, 5000200, &st), 0);
    assert_int_equal(st, OQ_X_UNKNOWN); /* too early: the request may still land */
    assert_int_equal(
        qi(f->a, "SELECT next_attempt_at FROM executions WHERE call_id = ?1", e.call_id), 5001000);
    clear_rows(lk, 8);
    assert_int_equal(recover(f->b, 5000900, lk, &nl), 0); /* not due yet */
    assert_int_equal(nl, 0);
    assert_int_equal(recover(f->b, 5001000, lk, &nl), 1);
    assert_int_equal(lookup_done(f->b, &lk[0], OQ__LOOKUP_ABSENT, NULL, 5001100, &st), 0);
    assert_int_equal(st, OQ_X_SAFE_RETRY);
    assert_int_equal(
        qi(f->a, "SELECT next_attempt_at FROM executions WHERE call_id = ?1", e.call_id), 5001100);
    assert_int_equal(oq__consumer_store_effect_count(f->a, e.call_id), 0);
    clear_rows(lk, 8);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

/* Undecided lookups: asked again after a backoff, then the declaration decides. */
static void test_lookup_undecided_budget(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e, g;
    oq__exec_row_t x, lk[8];
    memset(&x, 0, sizeof(x));
    memset(lk, 0, sizeof(lk));
    int st = -1, nl = 0;
    int64_t now = 6000000;
    start(f->a, &e, "pay_ref", now, &x);
    assert_int_equal(
        finish(f->a, &x, OQ__OUTCOME_UNKNOWN, "timeout_after_send", -1, NULL, now, &st), 0);
    oq__exec_row_clear(&x);
    start(f->a, &g, "pay_keys", now, &x);
    assert_int_equal(
        finish(f->a, &x, OQ__OUTCOME_UNKNOWN, "timeout_after_send", -1, NULL, now, &st), 0);
    /* budget 2: the first undecided answer asks again later, the second decides */
    for (int round = 1; round <= 2; round++) {
        now += 5000;
        assert_int_equal(recover(f->b, now, lk, &nl), 2);
        assert_int_equal(nl, 2);
        for (int i = 0; i < nl; i++) {
            assert_int_equal(lookup_done(f->b, &lk[i], OQ__LOOKUP_UNDECIDED, NULL, now, &st), 0);
            if (round == 1) assert_int_equal(st, OQ_X_UNKNOWN);
        }
        clear_rows(lk, 8);
    }
    state_is(f->a, e.call_id, "NEEDS_REVIEW"); /* no keys: an operator decides */
    assert_int_equal(results(f->a, e.call_id, "needs_review"), 1);
    assert_int_equal(qi(f->a,
                        "SELECT json_extract(error, '$.code') = 'lookup_failed' FROM executions "
                        "WHERE call_id = ?1",
                        e.call_id),
                     1);
    state_is(f->a, g.call_id, "SAFE_RETRY"); /* keys honoured: resent with the same key */
    assert_int_equal(results(f->a, g.call_id, "needs_review"), 0);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
    oq_envelope_clear(&g);
}

/* No lookup: keys honoured -> resend; neither -> NEEDS_REVIEW, never resent; a tool this
 * worker does not know -> NEEDS_REVIEW. A lapsed STARTED becomes UNKNOWN first. */
static void test_declarations(void **state)
{
    fx_t *f = *state;
    oq_envelope_t a, b, c;
    oq__exec_row_t x, lk[8];
    memset(&x, 0, sizeof(x));
    memset(lk, 0, sizeof(lk));
    int nl = 0;
    int64_t now = 7000000;
    start(f->a, &a, "pay_idem", now, &x);
    oq__exec_row_clear(&x);
    start(f->a, &b, "pay_blind", now, &x);
    oq__exec_row_clear(&x);
    start(f->a, &c, "webhook_nobody_declared", now, &x);
    oq__exec_row_clear(&x);
    /* worker A dies holding all three; B finds the leases lapsed */
    assert_int_equal(recover(f->b, now + 500, lk, &nl), 0);
    state_is(f->b, a.call_id, "STARTED");
    assert_int_equal(recover(f->b, now + 1500, lk, &nl), 3);
    assert_int_equal(nl, 0);
    state_is(f->b, a.call_id, "SAFE_RETRY");
    state_is(f->b, b.call_id, "NEEDS_REVIEW");
    state_is(f->b, c.call_id, "NEEDS_REVIEW");
    assert_int_equal(qi(f->b,
                        "SELECT json_extract(error, '$.code') = 'no_lookup_no_keys' FROM "
                        "executions WHERE call_id = ?1",
                        b.call_id),
                     1);
    assert_int_equal(qi(f->b,
                        "SELECT json_extract(error, '$.code') = 'tool_not_declared' FROM "
                        "executions WHERE call_id = ?1",
                        c.call_id),
                     1);
    assert_int_equal(qi(f->b,
                        "SELECT group_concat(event) = 'started,unknown,needs_review' FROM "
                        "(SELECT event FROM audit WHERE call_id = ?1 ORDER BY id) o",
                        b.call_id),
                     1);
    /* NEEDS_REVIEW is terminal for the machines: nothing more happens */
    assert_int_equal(recover(f->b, now + 100000, lk, &nl), 0);
    oq_error_t err = {0};
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_claim(f->b, b.call_id, 1000, now + 200000, &x, &err), OQ_ESTATE);
    oq__consumer_store_rollback(f->b);
    oq_envelope_clear(&a);
    oq_envelope_clear(&b);
    oq_envelope_clear(&c);
}

/* The execution's fence: the review episode an operator decides on. */
#define RFENCE(id) qi(f->b, "SELECT fence FROM executions WHERE call_id = ?1", (id))

/* The operator: committed with a reference, failed, retry (once more, same key, new budget);
 * only from NEEDS_REVIEW, with a note, fenced and audited, one result event each. */
static void test_review_resolve(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e[3];
    oq__exec_row_t x, lk[8];
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    memset(lk, 0, sizeof(lk));
    int st = -1, nl = 0;
    int64_t now = 8000000;
    for (int i = 0; i < 3; i++) {
        start(f->a, &e[i], "pay_blind", now, &x);
        assert_int_equal(
            finish(f->a, &x, OQ__OUTCOME_UNKNOWN, "closed_without_answer", -1, NULL, now, &st), 0);
        oq__exec_row_clear(&x);
    }
    assert_int_equal(recover(f->b, now + 10, lk, &nl), 3);
    /* refused: not in review, no note, a ref on a failure, bad UTF-8 */
    oq_envelope_t other;
    start(f->a, &other, "pay_keys", now, &x);
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_resolve(f->b, other.call_id, OQ__RESOLVE_COMMITTED, NULL, "n", "op",
                                      RFENCE(other.call_id), now, &st, &err),
                     OQ_ESTATE);
    assert_int_equal(oq__exec_resolve(f->b, e[0].call_id, OQ__RESOLVE_COMMITTED, NULL, "", "op",
                                      RFENCE(e[0].call_id), now, &st, &err),
                     OQ_EINVAL);
    assert_int_equal(oq__exec_resolve(f->b, e[0].call_id, OQ__RESOLVE_FAILED, "pay_x", "n", "op",
                                      RFENCE(e[0].call_id), now, &st, &err),
                     OQ_EINVAL);
    assert_int_equal(oq__exec_resolve(f->b, e[0].call_id, OQ__RESOLVE_FAILED, NULL, "\xff\xfe",
                                      "op", RFENCE(e[0].call_id), now, &st, &err),
                     OQ_EINVAL);
    assert_int_equal(oq__exec_resolve(f->b, "c_0000000000000000", OQ__RESOLVE_FAILED, NULL, "n",
                                      "op", 0, now, &st, &err),
                     OQ_ENOTFOUND);
    /* the review episode pinned: no fence, or another episode's, is refused */
    assert_int_equal(oq__exec_resolve(f->b, e[0].call_id, OQ__RESOLVE_FAILED, NULL, "n", "op", -1,
                                      now, &st, &err),
                     OQ_EINVAL);
    assert_int_equal(oq__exec_resolve(f->b, e[0].call_id, OQ__RESOLVE_FAILED, NULL, "n", "op",
                                      RFENCE(e[0].call_id) - 1, now, &st, &err),
                     OQ_EFENCED);
    oq__consumer_store_commit(f->b, &err);
    assert_int_equal(qi(f->b, "SELECT count(*) FROM audit WHERE event = 'review_resolved'", NULL),
                     0);
    int64_t fence = qi(f->b, "SELECT fence FROM executions WHERE call_id = ?1", e[0].call_id);

    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_resolve(f->b, e[0].call_id, OQ__RESOLVE_COMMITTED, "pay_77",
                                      "found it in the provider's dashboard", "ada",
                                      RFENCE(e[0].call_id), now + 20, &st, &err),
                     0);
    assert_int_equal(st, OQ_X_COMMITTED);
    assert_int_equal(oq__exec_resolve(f->b, e[1].call_id, OQ__RESOLVE_FAILED, NULL,
                                      "never reached the provider", "ada", RFENCE(e[1].call_id),
                                      now + 20, &st, &err),
                     0);
    assert_int_equal(st, OQ_X_FAILED_FINAL);
    assert_int_equal(oq__exec_resolve(f->b, e[2].call_id, OQ__RESOLVE_RETRY, NULL, "try again",
                                      "ada", RFENCE(e[2].call_id), now + 20, &st, &err),
                     0);
    assert_int_equal(st, OQ_X_SAFE_RETRY);
    /* a second resolution is refused */
    assert_int_equal(oq__exec_resolve(f->b, e[1].call_id, OQ__RESOLVE_COMMITTED, NULL, "again",
                                      "ada", RFENCE(e[1].call_id), now + 21, &st, &err),
                     OQ_ESTATE);
    assert_int_equal(oq__consumer_store_commit(f->b, &err), 0);

    assert_int_equal(qi(f->b, "SELECT fence FROM executions WHERE call_id = ?1", e[0].call_id),
                     fence + 1);
    char *d = qs(f->b, "SELECT downstream_id FROM effects WHERE call_id = ?1", e[0].call_id);
    assert_string_equal(d, "pay_77");
    free(d);
    assert_int_equal(results(f->b, e[0].call_id, "succeeded"), 1);
    assert_int_equal(qi(f->b,
                        "SELECT json_extract(detail, '$.by') = 'ada' AND "
                        "json_extract(detail, '$.ref') = 'pay_77' FROM audit WHERE call_id = ?1 "
                        "AND event = 'review_resolved'",
                        e[0].call_id),
                     1);
    assert_int_equal(results(f->b, e[1].call_id, "failed"), 1);
    assert_int_equal(oq__consumer_store_effect_count(f->b, e[1].call_id), 0);
    assert_int_equal(
        results(f->b, e[2].call_id, "succeeded") + results(f->b, e[2].call_id, "failed"), 0);
    /* retry: claimed again (try 1 of a fresh budget), same effect id as before */
    char *eid = qs(f->b, "SELECT effect_id FROM executions WHERE call_id = ?1", e[2].call_id);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_claim(f->a, e[2].call_id, 1000, now + 30, &x, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    assert_int_equal(x.tries, 1);
    assert_string_equal(x.effect_id, eid);
    free(eid);
    clear_rows(lk, 8);
    oq__exec_row_clear(&x);
    oq_envelope_clear(&other);
    for (int i = 0; i < 3; i++)
        oq_envelope_clear(&e[i]);
}

/* At start-up, rows held under this worker id by its dead previous process become UNKNOWN. */
static void test_release_held(void **state)
{
    fx_t *f = *state;
    oq_envelope_t e;
    oq__exec_row_t x;
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    start(f->a, &e, "pay_keys", 9000000, &x);
    int n = 0;
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_release_held(f->b, 9000001, &n, &err), 0); /* not b's */
    assert_int_equal(n, 0);
    assert_int_equal(oq__consumer_store_commit(f->b, &err), 0);
    state_is(f->b, e.call_id, "STARTED");
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_release_held(f->a, 9000001, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    state_is(f->b, e.call_id, "UNKNOWN");
    oq__exec_row_clear(&x);
    oq_envelope_clear(&e);
}

/* The unsettled rows are read through their partial index. */
static void test_unsettled_index(void **state)
{
    fx_t *f = *state;
#if !FX_PG /* (SQLite's plan; PostgreSQL's planner picks by statistics) */
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(oq__consumer_store_db(f->a),
                                        "EXPLAIN QUERY PLAN SELECT count(*) FROM executions "
                                        "WHERE state = 'NEEDS_REVIEW'",
                                        -1, &st, NULL),
                     SQLITE_OK);
    int uses = 0;
    while (sqlite3_step(st) == SQLITE_ROW)
        uses |= strstr((const char *)sqlite3_column_text(st, 3), "executions_unsettled") != NULL;
    sqlite3_finalize(st);
    assert_true(uses);
#endif
    oq__unsettled_t u;
    oq_error_t err = {0};
    assert_int_equal(oq__consumer_store_unsettled(f->a, &u, &err), 0);
    assert_int_equal(u.review, 0);
}

/* Retention (issue 17, item 7): settled executions go with their effects and audit rows;
 * executions in review stay, whatever their age; a message of a purged call is never
 * executed again (created before the horizon the purge raised), a later one runs. */
static void test_purge_keeps_review(void **state)
{
    fx_t *f = *state;
    const int64_t day = 86400000;
    oq_envelope_t e[2], g, late;
    oq__exec_row_t x, lk[8];
    oq_error_t err = {0};
    memset(&x, 0, sizeof(x));
    memset(lk, 0, sizeof(lk));
    int st = -1, nl = 0, d = -1;
    int64_t now = 9000000;
    for (int i = 0; i < 2; i++) {
        start(f->a, &e[i], "pay_blind", now, &x);
        assert_int_equal(
            finish(f->a, &x, OQ__OUTCOME_UNKNOWN, "closed_without_answer", -1, NULL, now, &st), 0);
        oq__exec_row_clear(&x);
    }
    assert_int_equal(recover(f->b, now + 10, lk, &nl), 2);
    state_is(f->b, e[0].call_id, "NEEDS_REVIEW");
    /* e[1] resolved (settled), g committed with an effect */
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_resolve(f->b, e[1].call_id, OQ__RESOLVE_FAILED, NULL, "not there",
                                      "ada", RFENCE(e[1].call_id), now + 20, &st, &err),
                     0);
    assert_int_equal(oq__consumer_store_commit(f->b, &err), 0);
    start(f->a, &g, "pay_keys", now, &x);
    assert_int_equal(
        finish(f->a, &x, OQ__OUTCOME_SUCCESS, "status_201", -1, "pay_9", now + 30, &st), 0);
    oq__exec_row_clear(&x);
    assert_int_equal(oq__consumer_store_effect_count(f->b, g.call_id), 1);
    int64_t review_audit = qi(f->b, "SELECT count(*) FROM audit WHERE call_id = ?1", e[0].call_id);
    assert_true(review_audit > 0);

    /* ten days later, one day of retention */
    oq_consumer_purge_stats_t ps;
    int64_t later = now + 10 * day;
    assert_int_equal(oq__exec_purge(f->b, later, day, day, 1, &ps, &err), 0);
    assert_int_equal(ps.executions, 2);
    assert_int_equal(ps.effects, 1);
    assert_true(ps.audit > 0);
    state_is(f->b, e[0].call_id, "NEEDS_REVIEW");
    assert_int_equal(qi(f->b, "SELECT count(*) FROM audit WHERE call_id = ?1", e[0].call_id),
                     review_audit);
    assert_int_equal(qi(f->b, "SELECT count(*) FROM executions WHERE call_id = ?1", g.call_id), 0);
    assert_int_equal(oq__consumer_store_effect_count(f->b, g.call_id), 0);
    assert_int_equal(qi(f->b, "SELECT count(*) FROM audit WHERE call_id = ?1", g.call_id), 0);
    assert_int_equal(qi(f->b, "SELECT count(*) FROM audit WHERE call_id = ?1", e[1].call_id), 0);
    assert_int_equal(qi(f->b, "SELECT horizon FROM retention", NULL),
                     later - day + 3600000) /* skew allowance: min(R / 10, 1 h) */;

    /* g's message again (a redrive, a replay): no execution, created before the horizon */
    /* a copy under another id: the inbox does not know it */
    oq_id_uuid(g.message_id);
    g.created_at = now;
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_intake(f->b, &g, &src, later, &d, &err), 0);
    assert_int_equal(d, OQ__INTAKE_EXPIRED);
    assert_int_equal(oq__consumer_store_commit(f->b, &err), 0);
    assert_int_equal(qi(f->b, "SELECT count(*) FROM executions WHERE call_id = ?1", g.call_id), 0);
    /* a call created after the horizon is new */
    mk_env(&late, "pay_keys", "{\"amount\":5}", 1);
    late.created_at = later;
    assert_int_equal(oq__consumer_store_begin(f->b, &err), 0);
    assert_int_equal(oq__exec_intake(f->b, &late, &src, later, &d, &err), 0);
    assert_int_equal(d, OQ__INTAKE_NEW);
    assert_int_equal(oq__consumer_store_commit(f->b, &err), 0);
    /* a second purge never lowers the horizon */
    assert_int_equal(oq__exec_purge(f->b, now, day, day, 100, &ps, &err), 0);
    assert_int_equal(qi(f->b, "SELECT horizon FROM retention", NULL),
                     later - day + 3600000) /* skew allowance: min(R / 10, 1 h) */;
    clear_rows(lk, 8);
    for (int i = 0; i < 2; i++)
        oq_envelope_clear(&e[i]);
    oq_envelope_clear(&g);
    oq_envelope_clear(&late);
}

int main(void)
{
    (void)run_registry_tool; /* (the shared fixture's; these tests run no compiled tool) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_start_durable_and_running, setup, teardown),
        cmocka_unit_test_setup_teardown(test_running_owed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_outcome_classes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unencodable_answer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusal_cut_in_a_character, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup_found, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup_absent_settle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup_undecided_budget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_declarations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_review_resolve, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsettled_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_purge_keeps_review, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
