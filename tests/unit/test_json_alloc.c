/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Allocation-failure tests for the JSON and envelope code, in the manner of jansson's own
 * test_chaos.c: jansson's allocator is replaced (json_set_alloc_funcs) by one that fails the
 * N-th allocation, for N = 1, 2, ... until a run completes without reaching N. Every run must
 * either succeed or return OQ_ENOMEM, and must leave no jansson allocation behind (a live
 * counter returns to zero once the run's own references are released).
 *
 * Only jansson's allocations are failed; onceq's own output buffer uses malloc() directly.
 * This found two jansson 2.14 behaviours that json.c now works around: allocation failures
 * reported as syntax errors (or with an uninitialised error code), and tokens silently
 * truncated when the lexer's buffer cannot grow.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_envelope.h"
#include "oq_json.h"

static size_t alloc_count, fail_at;
static long live;

static void *chaos_malloc(size_t n)
{
    alloc_count++;
    if (fail_at && alloc_count == fail_at) return NULL;
    void *p = malloc(n);
    if (p) live++;
    return p;
}

static void chaos_free(void *p)
{
    if (!p) return;
    live--;
    free(p);
}

static const char *args_text =
    "{\"to\":\"alice@example.com\",\"subject\":\"Invoice \\u20ac 12\",\"amount\":12999,"
    "\"customer\":{\"id\":\"cus_8f2a\",\"tier\":\"gold\",\"score\":0.875,\"k1\":1,\"k2\":2,"
    "\"k3\":3,\"k4\":4,\"k5\":5,\"k6\":6,\"k7\":7,\"k8\":8,\"k9\":9,\"k10\":10,\"k11\":11,"
    "\"k12\":12,\"k13\":13,\"k14\":14,\"k15\":15,\"k16\":16,\"k17\":17},"
    "\"tags\":[\"billing\",\"monthly\",[1,2,{\"x\":null}]],\"retry\":false,\"note\":null}";

static int scenario_json(void)
{
    json_t *v = NULL;
    char *c = NULL;
    char fp[OQ_FINGERPRINT_LEN + 1];
    oq_error_t err = {0};
    int rc = oq_json_parse(args_text, strlen(args_text), 0, &v, &err);
    if (rc == 0) rc = oq_jcs_canonicalize(v, &c, NULL, &err);
    if (rc == 0) rc = oq_fingerprint("acme", "send_email", v, fp, &err);
    if (rc == 0 && strlen(fp) != OQ_FINGERPRINT_LEN) rc = OQ_EINVAL;
    if (rc != 0 && err.code != rc) rc = OQ_EINVAL; /* the error must be reported */
    free(c);
    json_decref(v);
    return rc;
}

static const char *env_text =
    "{\"v\":1,\"kind\":\"tool_result\",\"message_id\":\"0190f3a2-7b1c-7d2e-8f30-1a2b3c4d5e6f\","
    "\"call_id\":\"c_0123456789abcdef\",\"tenant\":\"acme\",\"idem_key\":\"order-42\","
    "\"fingerprint\":\"e3bc8eee77639b0cc275ae9d4d0e7b28d04c3c318aa2414079e275301518b541\","
    "\"tool\":\"charge\",\"attempt\":2,\"created_at\":1700000000001,\"status\":\"failed\","
    "\"result\":{\"partial\":[1,2,3]},\"error\":{\"code\":\"declined\",\"message\":\"card "
    "declined\",\"retryable\":false},\"effect_id\":\"eff_1\",\"unknown\":{\"a\":[true]}}";

static int scenario_envelope(void)
{
    oq_envelope_t e;
    char *out = NULL;
    oq_error_t err = {0};
    int rc = oq_envelope_decode(env_text, strlen(env_text), &e, &err);
    if (rc == 0) {
        rc = oq_envelope_encode(&e, &out, NULL, &err);
        oq_envelope_clear(&e);
    } else if (e.tenant || e.result || e.error) {
        rc = OQ_EINVAL; /* must be left cleared on failure */
    }
    if (rc != 0 && err.code != rc) rc = OQ_EINVAL;
    if (rc != 0 && rc != OQ_ENOMEM) printf("# envelope: %s\n", err.msg);
    free(out);
    return rc;
}

static void run_chaos(int (*scenario)(void), const char *name)
{
    size_t n, failures = 0;
    for (n = 1; n < 10000; n++) {
        alloc_count = 0;
        fail_at = n;
        live = 0;
        int rc = scenario();
        if (live != 0) fail_msg("%s: failing allocation %zu leaked %ld blocks", name, n, live);
        if (rc != 0 && rc != OQ_ENOMEM)
            fail_msg("%s: failing allocation %zu gave %d (%s), want nomem", name, n, rc,
                     oq_error_name(rc));
        if (alloc_count < n) { /* the failure point was never reached: a clean run */
            assert_int_equal(rc, 0);
            break;
        }
        if (rc == OQ_ENOMEM) failures++;
    }
    fail_at = 0;
    assert_true(n > 5); /* the scenario does allocate through jansson */
    printf("# %s: %zu allocation points, %zu reported nomem\n", name, n - 1, failures);
}

static void test_json_alloc_failures(void **state)
{
    (void)state;
    run_chaos(scenario_json, "parse+canonicalize+fingerprint");
}

static void test_envelope_alloc_failures(void **state)
{
    (void)state;
    run_chaos(scenario_envelope, "envelope decode+encode");
}

int main(void)
{
    /* As jansson requires, the allocator is set before any other jansson call (oq_json_parse
     * wraps it on first use to detect failures); fail_at = 0 means "never fail". */
    json_set_alloc_funcs(chaos_malloc, chaos_free);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_alloc_failures),
        cmocka_unit_test(test_envelope_alloc_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
