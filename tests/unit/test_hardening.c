/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Issue 14 hardening of common code the HTTP API relies on:
 *  - call ids: "c_" + 32 hex (48 bits of ms, then 80 random bits), time-ordered, and ids of
 *    the first format ("c_" + 16 hex) still valid in oq_call_id_valid and in envelopes, so
 *    databases and messages written before the change keep working;
 *  - the strict JSON parser refuses a number that underflows to 0 (1e-400) as it refuses
 *    overflow, and still accepts every spelling of zero and subnormal values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "oq_envelope.h"
#include "oq_json.h"
#include "oq_mhd.h"
#include "oq_util.h"

static void test_call_id_format(void **state)
{
    (void)state;
    char id[OQ_CALL_ID_LEN + 1], prev[OQ_CALL_ID_LEN + 1] = "";
    for (int i = 0; i < 2000; i++) {
        int64_t before = oq_now_ms();
        oq_id_call(id);
        int64_t after = oq_now_ms();
        assert_int_equal(strlen(id), 34);
        assert_true(strncmp(id, "c_", 2) == 0);
        assert_int_equal(strspn(id + 2, "0123456789abcdef"), 32);
        assert_true(oq_call_id_valid(id));
        /* the first 12 hex digits are the wall clock in ms */
        char ms_hex[13];
        memcpy(ms_hex, id + 2, 12);
        ms_hex[12] = '\0';
        int64_t ms = (int64_t)strtoull(ms_hex, NULL, 16);
        assert_true(ms >= before && ms <= after);
        /* ids of a later millisecond never sort before earlier ones */
        if (*prev && strncmp(prev, id, 14) > 0) fail_msg("%s after %s", id, prev);
        assert_string_not_equal(prev, id);
        memcpy(prev, id, sizeof prev);
    }
}

/* 80 random bits: two ids of the same millisecond differ in their tail; over many draws every
 * bit of the tail takes both values (a tail narrower than 80 bits would leave some fixed). */
static void test_call_id_random_tail(void **state)
{
    (void)state;
    unsigned char or_all[10] = {0}, and_all[10];
    memset(and_all, 0xff, sizeof and_all);
    for (int i = 0; i < 4000; i++) {
        char id[OQ_CALL_ID_LEN + 1];
        oq_id_call(id);
        for (int b = 0; b < 10; b++) {
            unsigned v;
            sscanf(id + 2 + 12 + 2 * b, "%2x", &v);
            or_all[b] |= (unsigned char)v;
            and_all[b] &= (unsigned char)v;
        }
    }
    for (int b = 0; b < 10; b++) {
        assert_int_equal(or_all[b], 0xff);
        assert_int_equal(and_all[b], 0x00);
    }
}

static void test_call_id_valid(void **state)
{
    (void)state;
    assert_true(oq_call_id_valid("c_0123456789abcdef"));                 /* first format */
    assert_true(oq_call_id_valid("c_0123456789abcdef0123456789abcdef")); /* current */
    assert_false(oq_call_id_valid(NULL));
    assert_false(oq_call_id_valid(""));
    assert_false(oq_call_id_valid("c_"));
    assert_false(oq_call_id_valid("c_0123456789abcde"));                   /* 15 */
    assert_false(oq_call_id_valid("c_0123456789abcdef0"));                 /* 17 */
    assert_false(oq_call_id_valid("c_0123456789abcdef0123456789abcde"));   /* 31 */
    assert_false(oq_call_id_valid("c_0123456789abcdef0123456789abcdef0")); /* 33 */
    assert_false(oq_call_id_valid("c_0123456789ABCDEF"));
    assert_false(oq_call_id_valid("x_0123456789abcdef"));
    assert_false(oq_call_id_valid("c_0123456789abcdeg0123456789abcdef"));
}

static char *envelope_with_call_id(const char *call_id)
{
    oq_envelope_t e;
    memset(&e, 0, sizeof e);
    e.v = OQ_ENVELOPE_VERSION;
    e.kind = OQ_KIND_TOOL_CALL;
    oq_id_uuid(e.message_id);
    snprintf(e.call_id, sizeof e.call_id, "%s", call_id);
    e.tenant = "t";
    e.idem_key = "k";
    memset(e.fingerprint, 'a', OQ_FINGERPRINT_LEN);
    e.tool = "charge";
    e.attempt = 1;
    e.args = json_object();
    char *out = NULL;
    size_t len = 0;
    int rc = oq_envelope_encode(&e, &out, &len, NULL);
    json_decref(e.args);
    return rc == 0 ? out : NULL;
}

/* A message in flight from before the change (16-hex id) still decodes; so does a new one. */
static void test_envelope_both_id_formats(void **state)
{
    (void)state;
    char fresh[OQ_CALL_ID_LEN + 1];
    oq_id_call(fresh);
    const char *ids[] = {"c_0123456789abcdef", fresh};
    for (int i = 0; i < 2; i++) {
        char *text = envelope_with_call_id(ids[i]);
        assert_non_null(text);
        oq_envelope_t d;
        memset(&d, 0, sizeof d);
        assert_int_equal(oq_envelope_decode(text, strlen(text), &d, NULL), 0);
        assert_string_equal(d.call_id, ids[i]);
        oq_envelope_clear(&d);
        free(text);
    }
    /* a wrong length is refused, naming the field */
    char *text = envelope_with_call_id("c_0123456789abcdef");
    assert_non_null(text);
    char *p = strstr(text, "c_0123456789abcdef");
    assert_non_null(p);
    size_t n = strlen(text);
    char *bad = malloc(n + 2);
    memcpy(bad, text, (size_t)(p - text) + 18);
    bad[(p - text) + 18] = '0'; /* 17 hex digits */
    memcpy(bad + (p - text) + 19, p + 18, n - (size_t)(p - text) - 18 + 1);
    oq_envelope_t d;
    memset(&d, 0, sizeof d);
    oq_error_t err = {0};
    assert_int_equal(oq_envelope_decode(bad, strlen(bad), &d, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "call_id"));
    oq_envelope_clear(&d);
    free(bad);
    free(text);
}

static void assert_range_error(const char *text)
{
    json_t *v = NULL;
    oq_error_t err = {0};
    int rc = oq_json_parse(text, strlen(text), 0, &v, &err);
    if (rc != OQ_ERANGE) fail_msg("%s: expected OQ_ERANGE, got %d (%s)", text, rc, err.msg);
    assert_null(v);
    assert_non_null(strstr(err.msg, "too small"));
}

static void assert_parses(const char *text)
{
    json_t *v = NULL;
    oq_error_t err = {0};
    int rc = oq_json_parse(text, strlen(text), 0, &v, &err);
    if (rc != 0) fail_msg("%s: %s", text, err.msg);
    json_decref(v);
}

static void test_number_underflow(void **state)
{
    (void)state;
    assert_range_error("1e-400");
    assert_range_error("-1e-400");
    assert_range_error("{\"a\":[1,2,{\"b\":2.5e-999}]}");
    assert_range_error("{\"s\":\"1e-400 in a string is fine\",\"n\":0.1e-330}");
    assert_range_error("[0.0, 1E-324]");
    /* a long mantissa takes the heap path of the scan */
    char big[600] = "0.";
    memset(big + 2, '0', 500);
    strcpy(big + 502, "1e-10");
    assert_range_error(big);
    /* every spelling of zero stays valid, and so do subnormals and strings that look small */
    assert_parses("0");
    assert_parses("[0.0, -0.0, 0e5, 0.000e-400, -0E+3]");
    assert_parses("{\"a\":0.0,\"s\":\"1e-400\",\"k\\\"1e-999\":0.0}");
    assert_parses("5e-324");
    assert_parses("[1e-310, 0.0]");
    /* the canonical form of an accepted small number reads back as the same number */
    char *c = NULL;
    assert_int_equal(oq_jcs_canonicalize_text("[1e-310,0.0]", 12, &c, NULL, NULL), 0);
    assert_string_equal(c, "[1e-310,0]");
    free(c);
}

/* A Host (or an Origin's host) is loopback only when it names a loopback address exactly: a
 * name DNS could point anywhere (127.evil.example) is not, whatever it starts with. */
static void test_host_is_loopback(void **state)
{
    (void)state;
    const char *yes[] = {"127.0.0.1",    "127.0.0.1:8081", "127.1.2.3:1", "localhost",
                         "LOCALHOST:80", "[::1]",          "[::1]:8081"};
    const char *no[] = {"127.evil.example",
                        "127.0.0.1.evil.example",
                        "127.0.0.1evil",
                        "evil.example:8081",
                        "localhost.evil.example",
                        "[::1]x",
                        "[::2]:80",
                        "[::1",
                        "",
                        "128.0.0.1",
                        "0.0.0.0:8081"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        assert_true(oq_mhd_host_is_loopback(yes[i]));
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        assert_false(oq_mhd_host_is_loopback(no[i]));
    assert_false(oq_mhd_host_is_loopback(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_is_loopback),         cmocka_unit_test(test_call_id_format),
        cmocka_unit_test(test_call_id_random_tail),      cmocka_unit_test(test_call_id_valid),
        cmocka_unit_test(test_envelope_both_id_formats), cmocka_unit_test(test_number_underflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
