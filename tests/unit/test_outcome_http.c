/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What an outside answer means (consumer/execution.c, oq__outcome_from_http): every class the
 * HTTP executor can give, for a call and for a lookup, against a table written out here, so a
 * changed row of the mapping fails this test. Plus what goes with each outcome: the result of
 * a success or a found lookup, the refusal message quoting the downstream's JSON, Retry-After,
 * and NOT_RUN only for a call abandoned unsent by a stopping worker (a typed flag, whatever
 * the code says).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "execution.h"
#include "http_tools.h"

/* The whole table: class -> (call's outcome, lookup's verdict). */
static const struct {
    oq__http_class_t cls;
    oq__outcome_class_t call;
    oq__lookup_t lookup;
} expected[] = {
    {OQ__HTTP_SUCCESS, OQ__OUTCOME_SUCCESS, OQ__LOOKUP_UNDECIDED},
    {OQ__HTTP_FINAL, OQ__OUTCOME_FINAL, OQ__LOOKUP_UNDECIDED},
    {OQ__HTTP_RETRYABLE, OQ__OUTCOME_RETRYABLE, OQ__LOOKUP_UNDECIDED},
    {OQ__HTTP_UNKNOWN, OQ__OUTCOME_UNKNOWN, OQ__LOOKUP_UNDECIDED},
    {OQ__HTTP_FOUND, OQ__OUTCOME_UNKNOWN, OQ__LOOKUP_FOUND},
    {OQ__HTTP_ABSENT, OQ__OUTCOME_UNKNOWN, OQ__LOOKUP_ABSENT},
    {OQ__HTTP_UNDECIDED, OQ__OUTCOME_UNKNOWN, OQ__LOOKUP_UNDECIDED},
    /* not a class (zeroed report, or one added later without a row): never a resend */
    {(oq__http_class_t)0, OQ__OUTCOME_UNKNOWN, OQ__LOOKUP_UNDECIDED},
    {(oq__http_class_t)99, OQ__OUTCOME_UNKNOWN, OQ__LOOKUP_UNDECIDED},
};

static oq__http_outcome_t report(oq__http_class_t cls, int sent)
{
    oq__http_outcome_t h;
    memset(&h, 0, sizeof(h));
    h.cls = cls;
    h.code = "some_code";
    h.message = "HTTP 200";
    h.status = 200;
    h.sent = sent;
    h.retry_after_ms = -1;
    return h;
}

static void test_every_class(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(expected) / sizeof(expected[0]); i++) {
        for (int sent = 0; sent <= 1; sent++) {
            oq__http_outcome_t h = report(expected[i].cls, sent);
            oq__outcome_t o;
            oq__outcome_from_http(&h, 0, &o);
            if (o.cls != expected[i].call)
                fail_msg("call, class %d sent %d: outcome %d, expected %d", (int)expected[i].cls,
                         sent, (int)o.cls, (int)expected[i].call);
            assert_string_equal(o.out.code, "some_code");
            oq__outcome_clear(&o);
            oq__outcome_from_http(&h, 1, &o);
            if (o.verdict != expected[i].lookup)
                fail_msg("lookup, class %d: verdict %d, expected %d", (int)expected[i].cls,
                         (int)o.verdict, (int)expected[i].lookup);
            assert_string_equal(o.out.code, "some_code");
            assert_string_equal(o.out.message, "HTTP 200");
            oq__outcome_clear(&o);
        }
    }
}

/* NOT_RUN: an unsent call the executor (or the dispatcher) abandoned because the worker stops.
 * Sent, or not abandoned (a local error, a refusal), it is a run that counts. */
static void test_abandoned(void **state)
{
    (void)state;
    oq__outcome_t o;
    oq__http_outcome_t h = report(OQ__HTTP_RETRYABLE, 0);
    h.code = "abandoned";
    h.abandoned = 1;
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_NOT_RUN);
    assert_true(o.out.retryable);
    oq__outcome_clear(&o);
    h.abandoned = 0; /* the code alone decides nothing */
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_RETRYABLE);
    oq__outcome_clear(&o);
    h.abandoned = 1;
    h.code = "local_error"; /* the flag decides, whatever the code */
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_NOT_RUN);
    oq__outcome_clear(&o);
    h.sent = 1; /* sent: the run counts */
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_RETRYABLE);
    oq__outcome_clear(&o);
    h = report(OQ__HTTP_UNKNOWN, 1); /* abandoned after sending: reconciled, never resent */
    h.abandoned = 1;
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_UNKNOWN);
    oq__outcome_clear(&o);
    h = report(OQ__HTTP_UNDECIDED, 0); /* a lookup abandoned: asked again later */
    h.abandoned = 1;
    oq__outcome_from_http(&h, 1, &o);
    assert_int_equal(o.verdict, OQ__LOOKUP_UNDECIDED);
    oq__outcome_clear(&o);
}

/* What goes with each outcome: the result, the downstream id, the refusal message, Retry-After. */
static void test_payloads(void **state)
{
    (void)state;
    oq__outcome_t o;
    const char *ok = "{\"id\":\"pay_1\",\"amount\":5}";
    oq__http_outcome_t h = report(OQ__HTTP_SUCCESS, 1);
    h.object_id = "pay_1";
    h.status = 201;
    h.body = ok;
    h.body_len = strlen(ok);
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_SUCCESS);
    assert_true(o.out.has_effect);
    assert_string_equal(o.downstream_id, "pay_1");
    /* the result as RFC 8785 text, no tree: members sorted, the answer canonicalised */
    assert_null(o.out.result);
    assert_string_equal(o.result_text, "{\"http_status\":201,\"object_id\":\"pay_1\","
                                       "\"response\":{\"amount\":5,\"id\":\"pay_1\"}}");
    oq__outcome_clear(&o);

    h.cls = OQ__HTTP_FOUND; /* a lookup's FOUND: the same result, found by the lookup */
    oq__outcome_from_http(&h, 1, &o);
    assert_int_equal(o.verdict, OQ__LOOKUP_FOUND);
    assert_string_equal(o.downstream_id, "pay_1");
    assert_string_equal(o.result_text, "{\"found_by\":\"lookup\",\"http_status\":201,"
                                       "\"object_id\":\"pay_1\",\"response\":{\"amount\":5,"
                                       "\"id\":\"pay_1\"}}");
    oq__outcome_clear(&o);

    /* an answer RFC 8785 cannot write exactly (an integer past 2^53): kept as its exact text;
     * an object id that is not UTF-8 is left out, not the whole result */
    const char *big = "{\"id\": 9007199254740993}";
    h = report(OQ__HTTP_SUCCESS, 1);
    h.object_id = "\xff";
    h.body = big;
    h.body_len = strlen(big);
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_SUCCESS);
    assert_string_equal(
        o.result_text,
        "{\"http_status\":200,\"response_text\":\"{\\\"id\\\": 9007199254740993}\"}");
    oq__outcome_clear(&o);
    h.body = "paid\n"; /* not JSON: its text too */
    h.body_len = 5;
    oq__outcome_from_http(&h, 0, &o);
    assert_string_equal(o.result_text, "{\"http_status\":200,\"response_text\":\"paid\\n\"}");
    oq__outcome_clear(&o);
    h.body = "\xff\xfe"; /* not even UTF-8: left out, and said so */
    h.body_len = 2;
    oq__outcome_from_http(&h, 0, &o);
    assert_string_equal(o.result_text, "{\"http_status\":200,\"response_omitted\":{\"bytes\":2,"
                                       "\"reason\":\"not UTF-8\"}}");
    oq__outcome_clear(&o);

    /* an answer over 64 KiB is not kept either: its size as it arrived (here cut to what the
     * executor keeps, max_response) is in the result, never an empty-looking success */
    size_t large = 64 * 1024 + 1;
    char *body = malloc(large);
    assert_non_null(body);
    memset(body, ' ', large);
    body[0] = '{';
    body[large - 1] = '}';
    h.body = body;
    h.body_len = large;
    h.body_bytes = 0; /* unknown: the kept length counts */
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_SUCCESS);
    assert_string_equal(o.result_text, "{\"http_status\":200,\"response_omitted\":{\"bytes\":65537,"
                                       "\"reason\":\"larger than 65536 bytes\"}}");
    oq__outcome_clear(&o);
    h.body_bytes = 5000000;
    oq__outcome_from_http(&h, 1, &o);                  /* a lookup's find says the same */
    assert_int_equal(o.verdict, OQ__LOOKUP_UNDECIDED); /* (report() made it SUCCESS) */
    oq__outcome_clear(&o);
    h.cls = OQ__HTTP_FOUND;
    oq__outcome_from_http(&h, 1, &o);
    assert_int_equal(o.verdict, OQ__LOOKUP_FOUND);
    assert_string_equal(o.result_text, "{\"found_by\":\"lookup\",\"http_status\":200,"
                                       "\"response_omitted\":{\"bytes\":5000000,"
                                       "\"reason\":\"larger than 65536 bytes\"}}");
    oq__outcome_clear(&o);
    free(body);

    const char *refusal = "{\"error\":{\"message\":\"card declined\"}}";
    h = report(OQ__HTTP_FINAL, 1);
    h.message = "HTTP 402";
    h.status = 402;
    h.body = refusal;
    h.body_len = strlen(refusal);
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_FINAL);
    assert_string_equal(o.out.message, "HTTP 402: card declined");
    assert_null(o.out.result);
    assert_null(o.result_text);
    assert_false(o.out.has_effect);
    oq__outcome_clear(&o);

    const char *busy = "{\"message\":\"slow down\"}";
    h = report(OQ__HTTP_RETRYABLE, 1);
    h.message = "HTTP 429";
    h.body = busy;
    h.body_len = strlen(busy);
    h.retry_after_ms = 3000;
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_RETRYABLE);
    assert_true(o.out.retryable);
    assert_int_equal(o.retry_after_ms, 3000);
    assert_string_equal(o.out.message, "HTTP 429: slow down");
    oq__outcome_clear(&o);

    h = report(OQ__HTTP_UNKNOWN, 1); /* the message as the executor said it, nothing parsed */
    h.message = "Timeout was reached (request sent)";
    h.body = busy;
    h.body_len = strlen(busy);
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_UNKNOWN);
    assert_string_equal(o.out.message, "Timeout was reached (request sent)");
    assert_null(o.out.result);
    oq__outcome_clear(&o);
}

/* The executor parses an answer once (h.parsed): the result is written from its tree, the text
 * is not read again; "parsed, not JSON" (doc NULL) keeps no response and quotes nothing. */
static void test_parsed_once(void **state)
{
    (void)state;
    oq__outcome_t o;
    const char *text = "{\"id\":\"from_text\",\"message\":\"from text\"}";
    json_t *doc = json_pack("{s:s, s:s}", "id", "from_tree", "message", "from tree");
    oq__http_outcome_t h = report(OQ__HTTP_SUCCESS, 1);
    h.body = text;
    h.body_len = strlen(text);
    h.parsed = 1;
    h.doc = doc;
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_SUCCESS);
    /* written from the tree, which the outcome does not keep */
    assert_string_equal(o.result_text, "{\"http_status\":200,\"response\":{\"id\":\"from_tree\","
                                       "\"message\":\"from tree\"}}");
    assert_int_equal(doc->refcount, 1);
    json_decref(doc); /* the executor lets go of its own after the callback */
    oq__outcome_clear(&o);

    h = report(OQ__HTTP_FINAL, 1);
    h.message = "HTTP 402";
    h.body = text;
    h.body_len = strlen(text);
    h.parsed = 1; /* parsed, and not JSON (say, duplicate keys) */
    h.doc = NULL;
    oq__outcome_from_http(&h, 0, &o);
    assert_int_equal(o.cls, OQ__OUTCOME_FINAL);
    assert_string_equal(o.out.message, "HTTP 402");
    oq__outcome_clear(&o);

    h.parsed = 0; /* not parsed by the executor (an "mcp" tool's answer): read here */
    oq__outcome_from_http(&h, 0, &o);
    assert_string_equal(o.out.message, "HTTP 402: from text");
    oq__outcome_clear(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_class),
        cmocka_unit_test(test_abandoned),
        cmocka_unit_test(test_payloads),
        cmocka_unit_test(test_parsed_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
