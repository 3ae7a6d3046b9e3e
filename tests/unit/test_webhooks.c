/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Webhooks: the signature is the one clients/python and clients/typescript verify (their test
 * vector, computed with openssl dgst -hmac), and the try rule of decide.c: 2xx delivered, any
 * other outcome tried again after a delay that grows (base * 2^(tries-1), at most the cap, equal
 * jitter: between half and all of it), at least the answer's Retry-After (capped), dead once
 * max_tries tries were made or the next try would come after max_age.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "producer_int.h"

static void test_signature_vector(void **st)
{
    (void)st;
    const char *body = "{\"call_id\":\"c_1\",\"status\":\"succeeded\"}";
    char out[128];
    assert_int_equal(oq_webhook_sign("whsec_test", 1700000000, body, strlen(body), out, sizeof out),
                     0);
    assert_string_equal(
        out, "t=1700000000,v1=bbe9ca5a9906cc70ea96166155593457f6e8f2b1431cb2a255f0c46ce8461a23");
    assert_int_equal(oq_webhook_sign("whsec_test", 1700000000, body, strlen(body), out, 20),
                     OQ_ETOOBIG);
}

static void test_try_rule(void **st)
{
    (void)st;
    oq__producer_delivery_t d;
    memset(&d, 0, sizeof d);
    snprintf(d.delivery_id, sizeof d.delivery_id, "01a2-test");
    d.created_at = 1000;
    oq__webhook_policy_t pol = {5, 60000, 1000, 4000};
    oq__producer_delivery_mark_t m;
    /* 2xx: delivered, whatever the tries */
    for (long status = 200; status < 300; status += 99) {
        oq__webhook_try_t ok = {status, -1, ""};
        oq__decide_webhook_try(&d, &ok, &pol, 2000, &m);
        assert_string_equal(m.state, "delivered");
        assert_int_equal(m.tries, 1);
        assert_int_equal(m.last_status, status);
        assert_null(m.last_error);
    }
    /* failures: 1 s, 2 s, 4 s, then capped at 4 s, each with equal jitter */
    const long statuses[] = {0, 500, 503, 429, 404, 301};
    const int64_t full[] = {1000, 2000, 4000, 4000};
    for (size_t k = 0; k < sizeof statuses / sizeof statuses[0]; k++)
        for (int64_t tries = 0; tries < 4; tries++) {
            d.tries = tries;
            oq__webhook_try_t t = {statuses[k], -1, "x"};
            for (int rep = 0; rep < 20; rep++) {
                oq__decide_webhook_try(&d, &t, &pol, 2000, &m);
                assert_string_equal(m.state, "pending");
                assert_int_equal(m.tries, tries + 1);
                assert_in_range(m.next_at - 2000, full[tries] / 2, full[tries]);
                assert_int_equal(m.last_status, statuses[k] ? statuses[k] : -1);
            }
        }
    /* Retry-After is a floor, bounded by the cap */
    d.tries = 0;
    oq__webhook_try_t ra = {429, 3000, "HTTP 429"};
    oq__decide_webhook_try(&d, &ra, &pol, 2000, &m);
    assert_int_equal(m.next_at, 5000);
    ra.retry_after_ms = 3600000;
    oq__decide_webhook_try(&d, &ra, &pol, 2000, &m);
    assert_int_equal(m.next_at, 6000);
    /* the budget: the fifth try failed -> dead; a next try past max_age -> dead */
    oq__webhook_try_t fail = {500, -1, "HTTP 500"};
    d.tries = 4;
    oq__decide_webhook_try(&d, &fail, &pol, 2000, &m);
    assert_string_equal(m.state, "dead");
    assert_int_equal(m.tries, 5);
    assert_int_equal(m.next_at, 0);
    d.tries = 1;
    oq__decide_webhook_try(&d, &fail, &pol, 1000 + 60000 - 500, &m);
    assert_string_equal(m.state, "dead");
    assert_string_equal(m.last_error, "HTTP 500");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signature_vector),
        cmocka_unit_test(test_try_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
