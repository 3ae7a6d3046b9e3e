/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests for the message envelope codec (common/envelope.c).
 *
 * Round trips for both kinds check that encode -> decode gives back every field and that
 * encoding is deterministic (canonical bytes). The malformed table is the contract consumers
 * rely on for dead-lettering: each bad envelope must give the expected OQ_E* code and a message
 * that names the offending field. Malformed inputs are made by editing one field of a good
 * envelope (set, delete or replace), so each case fails for exactly one reason.
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

#define MID "0190f3a2-7b1c-7d2e-8f30-1a2b3c4d5e6f"
#define CID "c_0123456789abcdef"
#define FP "e3bc8eee77639b0cc275ae9d4d0e7b28d04c3c318aa2414079e275301518b541"

static const char *good_call =
    "{\"v\":1,\"kind\":\"tool_call\",\"message_id\":\"" MID "\",\"call_id\":\"" CID "\","
    "\"tenant\":\"acme\",\"idem_key\":\"order-42 retry\",\"fingerprint\":\"" FP "\","
    "\"tool\":\"charge\",\"args\":{\"amount\":100,\"currency\":\"EUR\"},\"attempt\":1,"
    "\"created_at\":1700000000000}";

static const char *good_result =
    "{\"v\":1,\"kind\":\"tool_result\",\"message_id\":\"" MID "\",\"call_id\":\"" CID "\","
    "\"tenant\":\"acme\",\"idem_key\":\"order-42\",\"fingerprint\":\"" FP "\","
    "\"tool\":\"charge\",\"attempt\":2,\"created_at\":1700000000001,\"status\":\"failed\","
    "\"result\":null,\"error\":{\"code\":\"declined\",\"message\":\"card declined\","
    "\"retryable\":false},\"effect_id\":\"eff_1\"}";

/* Decode \p text after setting field \p name to the JSON \p value (NULL: delete the field). */
static int decode_edited(const char *base, const char *name, const char *value, oq_error_t *err)
{
    json_t *root = json_loads(base, 0, NULL);
    assert_non_null(root);
    if (value) {
        json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
        if (!v) fail_msg("bad test value %s", value);
        assert_int_equal(json_object_set_new(root, name, v), 0);
    } else {
        json_object_del(root, name);
    }
    char *text = json_dumps(root, JSON_COMPACT);
    assert_non_null(text);
    oq_envelope_t e;
    memset(&e, 0xA5, sizeof(e)); /* decode must not rely on a zeroed struct */
    int rc = oq_envelope_decode(text, strlen(text), &e, err);
    if (rc == 0) oq_envelope_clear(&e);
    /* on failure the struct is left cleared */
    if (rc != 0) {
        assert_null(e.tenant);
        assert_null(e.args);
        assert_int_equal(e.v, 0);
    }
    free(text);
    json_decref(root);
    return rc;
}

/* --- round trips ---------------------------------------------------------------------------- */

/* The encoder writes members in order itself: its text must be exactly what canonicalising
 * the whole document gives. */
static void assert_canonical(const char *out, size_t len)
{
    char *canon = NULL;
    size_t clen = 0;
    oq_error_t err = {0};
    assert_int_equal(oq_jcs_canonicalize_text(out, len, &canon, &clen, &err), 0);
    assert_int_equal(clen, len);
    assert_string_equal(canon, out);
    free(canon);
}

static void test_roundtrip_call(void **state)
{
    (void)state;
    oq_envelope_t e = {0};
    oq_error_t err = {0};
    assert_int_equal(oq_envelope_decode(good_call, strlen(good_call), &e, &err), 0);
    assert_int_equal(e.v, 1);
    assert_int_equal(e.kind, OQ_KIND_TOOL_CALL);
    assert_string_equal(e.message_id, MID);
    assert_string_equal(e.call_id, CID);
    assert_string_equal(e.tenant, "acme");
    assert_string_equal(e.idem_key, "order-42 retry");
    assert_string_equal(e.fingerprint, FP);
    assert_string_equal(e.tool, "charge");
    assert_int_equal(e.attempt, 1);
    assert_true(e.created_at == 1700000000000LL);
    assert_true(json_is_object(e.args));
    assert_int_equal(json_integer_value(json_object_get(e.args, "amount")), 100);
    assert_null(e.status);
    assert_null(e.result);

    char *out = NULL;
    size_t len = 0;
    assert_int_equal(oq_envelope_encode(&e, &out, &len, &err), 0);
    assert_int_equal(strlen(out), len);
    assert_canonical(out, len);
    /* canonical: sorted keys, no whitespace */
    assert_string_equal(out, "{\"args\":{\"amount\":100,\"currency\":\"EUR\"},\"attempt\":1,"
                             "\"call_id\":\"" CID "\",\"created_at\":1700000000000,"
                             "\"fingerprint\":\"" FP "\",\"idem_key\":\"order-42 retry\","
                             "\"kind\":\"tool_call\",\"message_id\":\"" MID "\","
                             "\"tenant\":\"acme\",\"tool\":\"charge\",\"v\":1}");
    oq_envelope_t e2 = {0};
    assert_int_equal(oq_envelope_decode(out, len, &e2, &err), 0);
    char *out2 = NULL;
    assert_int_equal(oq_envelope_encode(&e2, &out2, NULL, &err), 0);
    assert_string_equal(out, out2);
    assert_true(json_equal(e.args, e2.args));
    free(out);
    free(out2);
    oq_envelope_clear(&e);
    oq_envelope_clear(&e2);
    oq_envelope_clear(&e2); /* twice is fine */
}

static void test_roundtrip_result(void **state)
{
    (void)state;
    oq_envelope_t e = {0};
    oq_error_t err = {0};
    assert_int_equal(oq_envelope_decode(good_result, strlen(good_result), &e, &err), 0);
    assert_int_equal(e.kind, OQ_KIND_TOOL_RESULT);
    assert_string_equal(e.status, "failed");
    assert_null(e.result);
    assert_non_null(e.error);
    assert_string_equal(json_string_value(json_object_get(e.error, "code")), "declined");
    assert_string_equal(e.effect_id, "eff_1");
    assert_null(e.args);
    assert_int_equal(e.attempt, 2);

    char *out = NULL;
    size_t len;
    assert_int_equal(oq_envelope_encode(&e, &out, &len, &err), 0);
    assert_canonical(out, len);
    oq_envelope_t e2 = {0};
    assert_int_equal(oq_envelope_decode(out, len, &e2, &err), 0);
    assert_string_equal(e2.status, "failed");
    assert_true(json_equal(e.error, e2.error));
    assert_string_equal(e2.effect_id, "eff_1");
    free(out);
    oq_envelope_clear(&e2);
    oq_envelope_clear(&e);

    /* hand-built succeeded result with a result object and no error/effect_id */
    oq_envelope_t h = {0};
    h.v = OQ_ENVELOPE_VERSION;
    h.kind = OQ_KIND_TOOL_RESULT;
    oq_id_uuid(h.message_id);
    oq_id_call(h.call_id);
    h.tenant = strdup("default");
    h.idem_key = strdup("k \"q\" \\ x");
    memset(h.fingerprint, 'a', OQ_FINGERPRINT_LEN);
    h.tool = strdup("send_email");
    h.attempt = 1;
    h.created_at = 0;
    h.status = strdup("succeeded");
    h.result =
        json_pack("{s:s,s:f,s:s}", "sent", "yes", "ms", 1.5, "z\xc3\xa9", "\xe2\x80\xa8\t\x01");
    assert_int_equal(oq_envelope_validate(&h, &err), 0);
    assert_int_equal(oq_envelope_encode(&h, &out, &len, &err), 0);
    assert_canonical(out, len);
    assert_non_null(strstr(out, "\"error\":null"));
    assert_non_null(strstr(out, "\"effect_id\":null"));
    assert_non_null(strstr(
        out, "\"result\":{\"ms\":1.5,\"sent\":\"yes\",\"z\xc3\xa9\":\"\xe2\x80\xa8\\t\\u0001\"}"));
    assert_non_null(strstr(out, "\"idem_key\":\"k \\\"q\\\" \\\\ x\""));
    assert_int_equal(oq_envelope_decode(out, len, &e2, &err), 0);
    assert_string_equal(e2.call_id, h.call_id);
    assert_string_equal(e2.message_id, h.message_id);
    assert_null(e2.error);
    assert_null(e2.effect_id);
    assert_true(json_equal(e2.result, h.result));
    free(out);
    oq_envelope_clear(&e2);
    oq_envelope_clear(&h);
    assert_null(h.tenant);
}

static void test_unknown_fields_ignored(void **state)
{
    (void)state;
    oq_error_t err = {0};
    assert_int_equal(decode_edited(good_call, "trace_id", "\"abc\"", &err), 0);
    assert_int_equal(decode_edited(good_call, "x_future", "{\"a\":[1,2]}", &err), 0);
    assert_int_equal(decode_edited(good_result, "priority", "5", &err), 0);
    /* result fields absent means null */
    assert_int_equal(decode_edited(good_result, "effect_id", NULL, &err), 0);
    assert_int_equal(decode_edited(good_result, "error", NULL, &err), 0);
    assert_int_equal(decode_edited(good_result, "result", "{\"ok\":true}", &err), 0);
    assert_int_equal(
        decode_edited(good_result, "error", "{\"code\":\"x\",\"message\":\"y\"}", &err), 0);
}

/* --- malformed inputs ----------------------------------------------------------------------- */

static const struct {
    const char *base; /* NULL: good_call */
    const char *field;
    const char *value; /* NULL: delete */
    int code;
    const char *needle;
} bad_cases[] = {
    {NULL, "v", NULL, OQ_EINVAL, "missing field v"},
    {NULL, "v", "2", OQ_EVERSION, "unknown version 2"},
    {NULL, "v", "0", OQ_EVERSION, "unknown version 0"},
    {NULL, "v", "\"1\"", OQ_EINVAL, "field v"},
    {NULL, "v", "1.5", OQ_EINVAL, "field v"},
    {NULL, "kind", NULL, OQ_EINVAL, "missing field kind"},
    {NULL, "kind", "\"tool_cal\"", OQ_EINVAL, "field kind"},
    {NULL, "kind", "3", OQ_EINVAL, "field kind"},
    {NULL, "message_id", NULL, OQ_EINVAL, "missing field message_id"},
    {NULL, "message_id", "\"0190F3A2-7B1C-7D2E-8F30-1A2B3C4D5E6F\"", OQ_EINVAL, "message_id"},
    {NULL, "message_id", "\"0190f3a2-7b1c-7d2e-8f30-1a2b3c4d5e6\"", OQ_EINVAL, "message_id"},
    {NULL, "message_id", "\"0190f3a2-7b1c-7d2e-8f30-1a2b3c4d5e6f0\"", OQ_EINVAL, "message_id"},
    {NULL, "message_id", "\"0190f3a2x7b1c-7d2e-8f30-1a2b3c4d5e6f\"", OQ_EINVAL, "message_id"},
    {NULL, "message_id", "12", OQ_EINVAL, "field message_id: expected string"},
    {NULL, "call_id", NULL, OQ_EINVAL, "missing field call_id"},
    {NULL, "call_id", "\"d_0123456789abcdef\"", OQ_EINVAL, "call_id"},
    {NULL, "call_id", "\"c_0123456789abcdeg\"", OQ_EINVAL, "call_id"},
    {NULL, "call_id", "\"c_0123456789abcdef0123456789\"", OQ_EINVAL, "call_id"},
    {NULL, "tenant", NULL, OQ_EINVAL, "missing field tenant"},
    {NULL, "tenant", "\"\"", OQ_EINVAL, "field tenant"},
    {NULL, "tenant", "null", OQ_EINVAL, "field tenant: expected string"},
    {NULL, "tenant",
     "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"",
     OQ_EINVAL, "field tenant"},
    {NULL, "idem_key", NULL, OQ_EINVAL, "missing field idem_key"},
    {NULL, "idem_key", "\"\"", OQ_EINVAL, "field idem_key"},
    {NULL, "idem_key", "\"tab\\there\"", OQ_EINVAL, "field idem_key"},
    {NULL, "idem_key", "\"caf\\u00e9\"", OQ_EINVAL, "field idem_key"},
    {NULL, "idem_key", "\"del\\u007f\"", OQ_EINVAL, "field idem_key"},
    {NULL, "tenant", "\"caf\\u00e9\"", OQ_EINVAL, "field tenant: expected 1..128 printable"},
    {NULL, "tenant", "\"new\\nline\"", OQ_EINVAL, "field tenant"},
    {NULL, "fingerprint", NULL, OQ_EINVAL, "missing field fingerprint"},
    {NULL, "fingerprint", "\"abc\"", OQ_EINVAL, "field fingerprint"},
    {NULL, "fingerprint", "\"E3BC8EEE77639B0CC275AE9D4D0E7B28D04C3C318AA2414079E275301518B541\"",
     OQ_EINVAL, "field fingerprint"},
    {NULL, "tool", NULL, OQ_EINVAL, "missing field tool"},
    {NULL, "tool", "\"\"", OQ_EINVAL, "field tool"},
    {NULL, "tool", "[\"charge\"]", OQ_EINVAL, "field tool: expected string"},
    {NULL, "tool", "\"bad tool\"", OQ_EINVAL, "field tool: expected 1..128 bytes of"},
    {NULL, "tool", "\"a/b\"", OQ_EINVAL, "field tool"},
    {NULL, "tool", "\"caf\\u00e9\"", OQ_EINVAL, "field tool"},
    {NULL, "attempt", NULL, OQ_EINVAL, "missing field attempt"},
    {NULL, "attempt", "0", OQ_EINVAL, "field attempt: expected integer >= 1"},
    {NULL, "attempt", "-3", OQ_EINVAL, "field attempt"},
    {NULL, "attempt", "1.0", OQ_EINVAL, "field attempt"},
    {NULL, "attempt", "\"1\"", OQ_EINVAL, "field attempt"},
    {NULL, "created_at", NULL, OQ_EINVAL, "missing field created_at"},
    {NULL, "created_at", "-1", OQ_EINVAL, "field created_at: expected integer >= 0"},
    {NULL, "created_at", "true", OQ_EINVAL, "field created_at"},
    {NULL, "args", NULL, OQ_EINVAL, "missing field args"},
    {NULL, "args", "[1,2]", OQ_EINVAL, "field args: expected object"},
    {NULL, "args", "null", OQ_EINVAL, "field args"},
    {NULL, "args", "{\"n\":9007199254740993}", OQ_ERANGE, "2^53"},
    {"R", "status", NULL, OQ_EINVAL, "missing field status"},
    {"R", "status", "\"done\"", OQ_EINVAL, "field status"},
    {"R", "status", "1", OQ_EINVAL, "field status: expected string"},
    {"R", "result", "[1]", OQ_EINVAL, "field result"},
    {"R", "result", "\"ok\"", OQ_EINVAL, "field result"},
    {"R", "error", "\"boom\"", OQ_EINVAL, "field error"},
    {"R", "error", "{\"message\":\"m\"}", OQ_EINVAL, "missing field error.code"},
    {"R", "error", "{\"code\":1,\"message\":\"m\"}", OQ_EINVAL, "field error.code"},
    {"R", "error", "{\"code\":\"c\"}", OQ_EINVAL, "missing field error.message"},
    {"R", "error", "{\"code\":\"c\",\"message\":false}", OQ_EINVAL, "field error.message"},
    {"R", "error", "{\"code\":\"c\",\"message\":\"m\",\"retryable\":\"yes\"}", OQ_EINVAL,
     "field error.retryable"},
    {"R", "effect_id", "42", OQ_EINVAL, "field effect_id"},
    {"R", "v", "7", OQ_EVERSION, "unknown version 7"},
};

static void test_malformed_fields(void **state)
{
    (void)state;
    size_t n = sizeof(bad_cases) / sizeof(bad_cases[0]);
    assert_true(n >= 25);
    for (size_t i = 0; i < n; i++) {
        oq_error_t err = {0};
        const char *base = bad_cases[i].base ? good_result : good_call;
        int rc = decode_edited(base, bad_cases[i].field, bad_cases[i].value, &err);
        if (rc != bad_cases[i].code || err.code != rc || !strstr(err.msg, bad_cases[i].needle))
            fail_msg("case %zu (%s=%s): rc %d (%s) msg \"%s\"; want %d and \"%s\"", i,
                     bad_cases[i].field, bad_cases[i].value ? bad_cases[i].value : "<deleted>", rc,
                     oq_error_name(rc), err.msg, bad_cases[i].code, bad_cases[i].needle);
    }
}

static void test_malformed_documents(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int code;
        const char *needle;
    } docs[] = {
        {"", OQ_EINVAL, NULL},
        {"[1,2]", OQ_EINVAL, "expected a JSON object"},
        {"\"tool_call\"", OQ_EINVAL, "expected a JSON object"},
        {"null", OQ_EINVAL, "expected a JSON object"},
        {"{\"v\":1,", OQ_EINVAL, "line 1"},
        {"{\"v\":1,\"v\":1}", OQ_EDUPKEY, NULL},
        {"{\"v\":1,\"kind\":\"tool_call\xff\"}", OQ_EUTF8, "byte"},
        {"{}", OQ_EINVAL, "missing field v"},
        {"{\"v\":99999999999999999999}", OQ_ERANGE, NULL},
    };
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        oq_envelope_t e;
        memset(&e, 0x5A, sizeof(e));
        oq_error_t err = {0};
        int rc = oq_envelope_decode(docs[i].text, strlen(docs[i].text), &e, &err);
        if (rc != docs[i].code || (docs[i].needle && !strstr(err.msg, docs[i].needle)))
            fail_msg("doc %zu: rc %d msg \"%s\"", i, rc, err.msg);
        assert_null(e.tenant);
        assert_null(e.tool);
    }
    /* size limit */
    size_t big = 1024 * 1024 + 1;
    char *buf = malloc(big);
    assert_non_null(buf);
    memset(buf, ' ', big);
    memcpy(buf, good_call, strlen(good_call));
    oq_envelope_t e = {0};
    oq_error_t err = {0};
    assert_int_equal(oq_envelope_decode(buf, big, &e, &err), OQ_ETOOBIG);
    assert_non_null(strstr(err.msg, "limit"));
    /* just under the limit is fine (trailing whitespace) */
    assert_int_equal(oq_envelope_decode(buf, big - 1, &e, &err), 0);
    oq_envelope_clear(&e);
    free(buf);
}

static void test_validate_and_encode_refuse(void **state)
{
    (void)state;
    oq_envelope_t e = {0};
    oq_error_t err = {0};
    assert_int_equal(oq_envelope_decode(good_call, strlen(good_call), &e, &err), 0);
    char *out = NULL;

    e.attempt = 0;
    assert_int_equal(oq_envelope_validate(&e, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "attempt"));
    assert_int_equal(oq_envelope_encode(&e, &out, NULL, &err), OQ_EINVAL);
    assert_null(out);
    e.attempt = 1;

    e.v = 2;
    assert_int_equal(oq_envelope_validate(&e, &err), OQ_EVERSION);
    assert_int_equal(oq_envelope_encode(&e, &out, NULL, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "unknown version 2"));
    e.v = 1;

    e.kind = (oq_kind_t)9;
    assert_int_equal(oq_envelope_validate(&e, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "kind"));
    e.kind = OQ_KIND_TOOL_CALL;

    char *t = e.tenant;
    e.tenant = NULL;
    assert_int_equal(oq_envelope_validate(&e, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "tenant"));
    e.tenant = t;

    e.call_id[3] = 'X';
    assert_int_equal(oq_envelope_validate(&e, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "call_id"));
    e.call_id[3] = '1';

    json_t *a = e.args;
    e.args = json_array();
    assert_int_equal(oq_envelope_validate(&e, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "args"));
    json_decref(e.args);
    e.args = a;

    /* args holding a number JCS cannot represent: encode refuses, nothing leaks */
    json_object_set_new(e.args, "big", json_integer(9007199254740993LL));
    assert_int_equal(oq_envelope_encode(&e, &out, NULL, &err), OQ_ERANGE);
    assert_null(out);
    json_object_del(e.args, "big");

    assert_int_equal(oq_envelope_validate(&e, &err), 0);
    assert_int_equal(oq_envelope_encode(&e, &out, NULL, &err), 0);
    free(out);
    oq_envelope_clear(&e);

    assert_string_equal(oq_kind_name(OQ_KIND_TOOL_CALL), "tool_call");
    assert_string_equal(oq_kind_name(OQ_KIND_TOOL_RESULT), "tool_result");
    assert_int_equal(oq_envelope_validate(NULL, &err), OQ_EINVAL);
}

/* --- names and keys: the one rule (oq_envelope.h) ------------------------------------------- */

static void test_names_and_keys(void **state)
{
    (void)state;
    char s[300];
    /* keys: 1..255 bytes of 0x20..0x7e */
    memset(s, 'k', sizeof s);
    s[255] = '\0';
    assert_true(oq_envelope_valid_key(s));
    s[255] = 'k';
    s[256] = '\0';
    assert_false(oq_envelope_valid_key(s));
    assert_false(oq_envelope_valid_key(NULL));
    assert_false(oq_envelope_valid_key(""));
    assert_true(oq_envelope_valid_key(" "));
    assert_true(oq_envelope_valid_key("order-42 retry ~!\"\\"));
    assert_false(oq_envelope_valid_key("tab\there"));
    assert_false(oq_envelope_valid_key("nl\n"));
    assert_false(oq_envelope_valid_key("del\x7f"));
    assert_false(oq_envelope_valid_key("caf\xc3\xa9"));
    assert_false(oq_envelope_valid_key("\x80"));
    /* tenants and client ids: the same bytes, 1..128 */
    memset(s, 't', sizeof s);
    s[128] = '\0';
    assert_true(oq_envelope_valid_name(s));
    s[128] = 't';
    s[129] = '\0';
    assert_false(oq_envelope_valid_name(s));
    assert_true(oq_envelope_valid_name("t\"q \\ x"));
    assert_false(oq_envelope_valid_name(""));
    assert_false(oq_envelope_valid_name("caf\xc3\xa9"));
    assert_false(oq_envelope_valid_name("a\x01"));
    /* tools: 1..128 of [A-Za-z0-9_.:-] */
    memset(s, 'T', sizeof s);
    s[128] = '\0';
    assert_true(oq_envelope_valid_tool(s));
    s[128] = 'T';
    s[129] = '\0';
    assert_false(oq_envelope_valid_tool(s));
    assert_true(oq_envelope_valid_tool("send_email"));
    assert_true(oq_envelope_valid_tool("a.b:c-d_E9"));
    assert_false(oq_envelope_valid_tool(NULL));
    assert_false(oq_envelope_valid_tool(""));
    assert_false(oq_envelope_valid_tool("bad tool"));
    assert_false(oq_envelope_valid_tool("a/b"));
    assert_false(oq_envelope_valid_tool("caf\xc3\xa9"));
    /* a NUL inside a JSON string never reaches the checks: the parser refuses it (a key
     * "a\u0000b" must not become "a") */
    static const char nul_key[] =
        "{\"v\":1,\"kind\":\"tool_call\",\"message_id\":\"" MID "\",\"call_id\":\"" CID "\","
        "\"tenant\":\"acme\",\"idem_key\":\"a\\u0000b\",\"fingerprint\":\"" FP "\","
        "\"tool\":\"charge\",\"args\":{},\"attempt\":1,\"created_at\":1}";
    oq_envelope_t e;
    oq_error_t err = {0};
    assert_int_not_equal(oq_envelope_decode(nul_key, strlen(nul_key), &e, &err), 0);
    assert_null(e.idem_key);
}

/* oq_envelope_encode_canon(): the same encoder fed canonical args (or result) text gives the
 * same bytes as the tree, and refuses what is not an object or does not validate. */
static void test_encode_canon(void **state)
{
    (void)state;
    static const char *const argss[] = {"{}", "{\"b\":1.0,\"a\":[1e2,\"\\u00e9\\n\"]}",
                                        "{\"z\":{\"y\":null,\"x\":true},\"\\u20ac\":-0.5}"};
    oq_envelope_t e = {0};
    oq_error_t err = {0};
    assert_int_equal(oq_envelope_decode(good_call, strlen(good_call), &e, &err), 0);
    json_t *orig = e.args;
    for (size_t i = 0; i < sizeof argss / sizeof argss[0]; i++) {
        e.args = json_loads(argss[i], 0, NULL);
        assert_non_null(e.args);
        char *canon = NULL, *a = NULL, *b = NULL;
        size_t cl = 0, al = 0, bl = 0;
        assert_int_equal(oq_jcs_canonicalize(e.args, &canon, &cl, &err), 0);
        assert_int_equal(oq_envelope_encode(&e, &a, &al, &err), 0);
        json_t *tree = e.args;
        e.args = NULL; /* not used */
        assert_int_equal(oq_envelope_encode_canon(&e, canon, cl, &b, &bl, &err), 0);
        assert_int_equal(al, bl);
        assert_string_equal(a, b);
        /* refused: not an object, a result, a bad field; nothing allocated */
        char *c = NULL;
        assert_int_equal(oq_envelope_encode_canon(&e, "[1]", 3, &c, NULL, &err), OQ_EINVAL);
        assert_int_equal(oq_envelope_encode_canon(&e, NULL, 0, &c, NULL, &err), OQ_EINVAL);
        e.attempt = 0;
        assert_int_equal(oq_envelope_encode_canon(&e, canon, cl, &c, NULL, &err), OQ_EINVAL);
        assert_non_null(strstr(err.msg, "attempt"));
        e.attempt = 1;
        e.kind = OQ_KIND_TOOL_RESULT; /* no status: not a result */
        assert_int_equal(oq_envelope_encode_canon(&e, canon, cl, &c, NULL, &err), OQ_EINVAL);
        e.kind = OQ_KIND_TOOL_CALL;
        assert_null(c);
        json_decref(tree);
        free(canon);
        free(a);
        free(b);
    }
    e.args = orig;
    oq_envelope_clear(&e);

    /* a tool_result's result as canonical text: the same bytes as from the tree; null without
     * text; its error still checked as a tree */
    assert_int_equal(oq_envelope_decode(good_result, strlen(good_result), &e, &err), 0);
    for (size_t i = 0; i < sizeof argss / sizeof argss[0]; i++) {
        json_decref(e.result);
        e.result = json_loads(argss[i], 0, NULL);
        char *canon = NULL, *a = NULL, *b = NULL, *c = NULL;
        size_t cl = 0, al = 0, bl = 0;
        assert_int_equal(oq_jcs_canonicalize(e.result, &canon, &cl, &err), 0);
        assert_int_equal(oq_envelope_encode(&e, &a, &al, &err), 0);
        assert_int_equal(oq_envelope_encode_canon(&e, canon, cl, &b, &bl, &err), 0);
        assert_int_equal(al, bl);
        assert_string_equal(a, b);
        assert_int_equal(oq_envelope_encode_canon(&e, "[1]", 3, &c, NULL, &err), OQ_EINVAL);
        json_t *keep = e.error;
        e.error = json_pack("{s:i}", "code", 1);
        assert_int_equal(oq_envelope_encode_canon(&e, canon, cl, &c, NULL, &err), OQ_EINVAL);
        assert_non_null(strstr(err.msg, "error"));
        json_decref(e.error);
        e.error = keep;
        assert_null(c);
        free(canon);
        free(a);
        free(b);
    }
    json_decref(e.result);
    e.result = NULL;
    char *n1 = NULL, *n2 = NULL;
    assert_int_equal(oq_envelope_encode(&e, &n1, NULL, &err), 0);
    assert_int_equal(oq_envelope_encode_canon(&e, NULL, 0, &n2, NULL, &err), 0);
    assert_string_equal(n1, n2);
    assert_non_null(strstr(n1, "\"result\":null"));
    free(n1);
    free(n2);
    oq_envelope_clear(&e);
}

/* --- the JSON Schema documents what the decoder does ---------------------------------------- */

static char *read_schema(size_t *len)
{
    char path[1024];
    const char *env = getenv("ONCEQ_TESTDATA"); /* <src>/tests/data */
    if (env && *env) {
        snprintf(path, sizeof(path), "%s/../../schema/envelope.schema.json", env);
    } else {
        const char *slash = strrchr(__FILE__, '/');
        snprintf(path, sizeof(path), "%.*s/../../schema/envelope.schema.json",
                 slash ? (int)(slash - __FILE__) : 1, slash ? __FILE__ : ".");
    }
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    static char buf[65536];
    *len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[*len] = '\0';
    return buf;
}

static void test_schema_matches_decoder(void **state)
{
    (void)state;
    size_t len;
    char *text = read_schema(&len);
    json_t *schema = NULL;
    oq_error_t err = {0};
    if (oq_json_parse(text, len, 0, &schema, &err)) fail_msg("schema: %s", err.msg);
    json_t *examples = json_object_get(schema, "examples");
    json_t *required = json_object_get(schema, "required");
    assert_true(json_array_size(examples) >= 2);
    assert_true(json_array_size(required) >= 10);
    size_t i, j;
    json_t *ex, *name;
    json_array_foreach(examples, i, ex)
    {
        char *doc = json_dumps(ex, JSON_COMPACT);
        assert_non_null(doc);
        oq_envelope_t e = {0};
        if (oq_envelope_decode(doc, strlen(doc), &e, &err)) fail_msg("example %zu: %s", i, err.msg);
        oq_envelope_clear(&e);
        /* every field the schema requires is required by the decoder, with that message */
        json_array_foreach(required, j, name)
        {
            char want[128];
            snprintf(want, sizeof(want), "missing field %s", json_string_value(name));
            oq_error_t e2 = {0};
            int rc = decode_edited(doc, json_string_value(name), NULL, &e2);
            if (rc == 0 || !strstr(e2.msg, want))
                fail_msg("example %zu without %s: rc %d \"%s\"", i, json_string_value(name), rc,
                         e2.msg);
        }
        free(doc);
    }
    json_decref(schema);
}

/* --- oq_envelope_decode_result: the producer's fast path ----------------------------------- */

/* A tool_result as the encoder writes it, with \p result and \p error (JSON text): succeeded
 * when \p error is null, else failed. malloc()ed. */
static char *result_msg(const char *result, const char *error)
{
    size_t cap = strlen(result) + strlen(error) + 512;
    char *out = malloc(cap);
    assert_non_null(out);
    int n = snprintf(out, cap,
                     "{\"attempt\":1,\"call_id\":\"" CID "\",\"created_at\":1700000000001,"
                     "\"effect_id\":\"e_1\",\"error\":%s,\"fingerprint\":\"" FP "\","
                     "\"idem_key\":\"order-42\",\"kind\":\"tool_result\",\"message_id\":\"" MID
                     "\",\"result\":%s,\"status\":\"%s\",\"tenant\":\"acme\",\"tool\":\"charge\","
                     "\"v\":1}",
                     error, result, strcmp(error, "null") ? "failed" : "succeeded");
    assert_true(n > 0 && (size_t)n < cap);
    return out;
}

/* oq_envelope_decode_result() of \p text gives what oq_envelope_decode() gives: the same
 * return code and error code, the same fields, and calls.result's text (result_json, or the
 * tree dumped as decide.c dumps it). @returns whether the fast path kept the result as text. */
static int same_as_tree_as(const char *text, size_t len, int call)
{
    oq_envelope_t a, b;
    oq_error_t ea = {0}, eb = {0};
    memset(&b, 0xA5, sizeof b);
    int ra = oq_envelope_decode(text, len, &a, &ea);
    int rb = call ? oq_envelope_decode_call(text, len, &b, &eb)
                  : oq_envelope_decode_result(text, len, &b, &eb);
    if (ra != rb) fail_msg("rc %d (tree) vs %d (fast) for %.*s", ra, rb, (int)len, text);
    assert_int_equal(ea.code, eb.code);
    assert_string_equal(ea.msg, eb.msg);
    int fast = call ? b.args_json != NULL : b.result_json != NULL;
    assert_null(call ? b.result_json : b.args_json);
    if (ra == 0) {
        assert_int_equal(a.v, b.v);
        assert_int_equal(a.kind, b.kind);
        assert_string_equal(a.message_id, b.message_id);
        assert_string_equal(a.call_id, b.call_id);
        assert_string_equal(a.tenant, b.tenant);
        assert_string_equal(a.idem_key, b.idem_key);
        assert_string_equal(a.fingerprint, b.fingerprint);
        assert_string_equal(a.tool, b.tool);
        assert_int_equal(a.attempt, b.attempt);
        assert_int_equal(a.created_at, b.created_at);
        assert_true((a.status == NULL) == (b.status == NULL));
        if (a.status) assert_string_equal(a.status, b.status);
        assert_true((a.effect_id == NULL) == (b.effect_id == NULL));
        if (a.effect_id) assert_string_equal(a.effect_id, b.effect_id);
        assert_true((a.args == NULL) == (b.args == NULL));
        if (a.args) assert_true(json_equal(a.args, b.args));
        if (b.args_json) { /* what the consumer's executions row stored before: the same text */
            char *t = json_dumps(a.args, JSON_COMPACT);
            assert_string_equal(t, b.args_json);
            free(t);
        }
        assert_true((a.error == NULL) == (b.error == NULL));
        if (a.error) assert_true(json_equal(a.error, b.error));
        char *ta = a.result ? json_dumps(a.result, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        char *tb = b.result_json ? strdup(b.result_json)
                   : b.result    ? json_dumps(b.result, JSON_COMPACT | JSON_SORT_KEYS)
                                 : NULL;
        if (fast) assert_null(b.result);
        assert_true((ta == NULL) == (tb == NULL));
        if (ta) assert_string_equal(ta, tb);
        free(ta);
        free(tb);
    } else {
        assert_null(b.tenant);
        assert_null(b.result_json);
        assert_null(b.args_json);
        assert_null(b.args);
        assert_int_equal(b.v, 0);
    }
    oq_envelope_clear(&a);
    oq_envelope_clear(&b);
    return fast;
}

static int same_as_tree(const char *text, size_t len)
{
    return same_as_tree_as(text, len, 0);
}

/* same_as_tree_as() of \p base with each edit's first text replaced by its second. */
static void edit_each(const char *base, const char *const (*edits)[2], size_t n, int call)
{
    for (size_t i = 0; i < n; i++) {
        const char *at = strstr(base, edits[i][0]);
        assert_non_null(at);
        size_t off = (size_t)(at - base), cut = off + strlen(edits[i][0]);
        char *e = NULL;
        assert_true(asprintf(&e, "%.*s%s%s", (int)off, base, edits[i][1], base + cut) > 0);
        same_as_tree_as(e, strlen(e), call);
        free(e);
    }
}

static void test_decode_result_fast(void **state)
{
    (void)state;
    /* in the encoder's subset: read by the scanner, the result kept as text */
    static const char *const fast[] = {
        "{\"charge_id\":\"e_01\",\"charged\":6922,\"currency\":\"EUR\"}",
        "{}",
        "{\"a\":[],\"b\":[1,-2,0,true,false,null,\"x\",{\"c\":{}}],\"ba\":{\"z\":[[]]}}",
        "{\"name\":\"Zo\xc3\xab \xe2\x82\xac \xf0\x9f\x98\x80\",\"\xc3\xa9\":1}",
        "{\"big\":999999999999999,\"neg\":-999999999999999}",
    };
    for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++) {
        char *m = result_msg(fast[i], "null");
        if (!same_as_tree(m, strlen(m))) fail_msg("not read by the fast path: %s", m);
        free(m);
    }
    char *m = result_msg("null", "null"); /* no result: nothing to keep as text */
    same_as_tree(m, strlen(m));
    free(m);
    /* outside it, valid or not: the tree decoder's answer, whatever the scanner would say */
    static const char *const slow[] = {
        "{\"b\":1,\"a\":2}",            /* keys not in byte order: jansson sorts them */
        "{\"a\":1,\"a\":2}",            /* duplicate key: refused */
        "{\"a\":1.5}",                  /* reals: jansson's own formatting */
        "{\"a\":1e3}",                  /* exponent */
        "{\"a\":-0}",                   /* -0 dumps as 0 */
        "{\"a\":0123}",                 /* not JSON */
        "{\"a\":12345678901234567890}", /* overflow: refused */
        "{\"a\":1234567890123456789}",  /* 19 digits */
        "{\"a\":9007199254740991}",     /* 16 digits: the tree's +-2^53 check */
        "{\"a\":9007199254740992}",     /* past 2^53: refused */
        "{\"a\":\"x\\u00e9\\n\"}",      /* escapes */
        "{\"a\": 1}",                   /* whitespace */
        "{\"a\":tru}",                  /* not JSON */
        "{\"a\":[1,]}",                 /* not JSON */
        "[1]",                          /* not an object: refused */
        "\"x\"",                        /* not an object: refused */
        "{\"a\":{\"b\":{\"c\":{\"d\":{\"e\":{\"f\":{\"g\":{\"h\":{\"i\":{\"j\":{\"k\":{\"l\":{"
        "\"m\":{\"n\":{\"o\":{\"p\":{\"q\":{\"r\":{\"s\":{\"t\":{\"u\":{\"v\":{\"w\":{\"x\":{"
        "\"y\":{\"z\":{\"0\":{\"1\":{\"2\":{\"3\":{\"4\":{\"5\":{}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}}",
    };
    for (size_t i = 0; i < sizeof slow / sizeof slow[0]; i++) {
        m = result_msg(slow[i], "null");
        if (same_as_tree(m, strlen(m))) fail_msg("read by the fast path: %s", m);
        free(m);
    }
    /* an error object: the tree (check_error_obj) */
    m = result_msg("null", "{\"code\":\"declined\",\"message\":\"no\",\"retryable\":false}");
    assert_false(same_as_tree(m, strlen(m)));
    free(m);
    /* the other documents of this file, edits of the fast one, and every truncation */
    const char *docs[] = {good_result, good_call, "", "{", "{}", "null"};
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++)
        same_as_tree(docs[i], strlen(docs[i]));
    char *base = result_msg("{\"charge_id\":\"e_01\",\"charged\":6922}", "null");
    size_t blen = strlen(base);
    for (size_t n = 0; n < blen; n++)
        same_as_tree(base, n);
    static const char *const edits[][2] = {
        {"\"v\":1", "\"v\":2"},
        {"\"v\":1", "\"v\":true"},
        {"\"v\":1}", "\"v\":1,\"zz\":1}"},                   /* unknown field: ignored */
        {"\"attempt\":1", "\"attempt\":0"},                  /* validation */
        {"\"attempt\":1,", ""},                              /* missing field */
        {"\"status\":\"succeeded\"", "\"status\":\"done\""}, /* unknown status */
        {"\"status\":\"succeeded\"", "\"status\":\"running\""},
        {"\"kind\":\"tool_result\"", "\"kind\":\"tool_call\""},
        {"\"effect_id\":\"e_1\"", "\"effect_id\":null"},
        {"\"effect_id\":\"e_1\",", ""},
        {"\"effect_id\":\"e_1\"", "\"effect_id\":7"},
        {"\"result\":{", "\"result\":[{"},
        {"\"tenant\":\"acme\"", "\"tenant\":\"\""},
        {"\"call_id\":\"" CID "\"", "\"call_id\":\"c_0123456789abcdef0123456789abcdef00\""},
        {"\"v\":1}", "\"v\":1} "},
        {"\"v\":1}", "\"v\":1}x"},
        {"\"tool\":\"charge\"", "\"tool\":\"ch\\u0061rge\""},
    };
    edit_each(base, edits, sizeof edits / sizeof edits[0], 0);
    free(base);
}

/* --- oq_envelope_decode_call: the consumer's fast path ------------------------------------- */

/* A tool_call as the encoder writes it, with \p args (JSON text). malloc()ed. */
static char *call_msg(const char *args)
{
    size_t cap = strlen(args) + 512;
    char *out = malloc(cap);
    assert_non_null(out);
    int n = snprintf(out, cap,
                     "{\"args\":%s,\"attempt\":1,\"call_id\":\"" CID "\",\"created_at\":"
                     "1700000000001,\"fingerprint\":\"" FP "\",\"idem_key\":\"order-42\","
                     "\"kind\":\"tool_call\",\"message_id\":\"" MID "\",\"tenant\":\"acme\","
                     "\"tool\":\"charge\",\"v\":1}",
                     args);
    assert_true(n > 0 && (size_t)n < cap);
    return out;
}

static void test_decode_call_fast(void **state)
{
    (void)state;
    /* in the encoder's subset: the top level scanned, the args parsed alone and kept as text */
    static const char *const fast[] = {
        "{\"amount\":6922,\"currency\":\"EUR\",\"to\":\"alice@example.com\"}",
        "{}",
        "{\"a\":[],\"b\":[1,-2,0,true,false,null,\"x\",{\"c\":{}}],\"ba\":{\"z\":[[]]}}",
        "{\"name\":\"Zo\xc3\xab \xe2\x82\xac \xf0\x9f\x98\x80\",\"\xc3\xa9\":1}",
        "{\"big\":999999999999999,\"neg\":-999999999999999}",
    };
    for (size_t i = 0; i < sizeof fast / sizeof fast[0]; i++) {
        char *m = call_msg(fast[i]);
        if (!same_as_tree_as(m, strlen(m), 1)) fail_msg("not read by the fast path: %s", m);
        free(m);
    }
    /* outside it, valid or not: the tree decoder's answer */
    static const char *const slow[] = {
        "{\"b\":1,\"a\":2}",
        "{\"a\":1,\"a\":2}",
        "{\"a\":1.5}",
        "{\"a\":1e3}",
        "{\"a\":-0}",
        "{\"a\":0123}",
        "{\"a\":12345678901234567890}",
        "{\"a\":9007199254740991}",
        "{\"a\":9007199254740992}",
        "{\"a\":\"x\\u00e9\\n\"}",
        "{\"a\": 1}",
        "{\"a\":[1,]}",
        "[1]",
        "\"x\"",
        "null",
        "{\"a\":{\"b\":1}",
    };
    for (size_t i = 0; i < sizeof slow / sizeof slow[0]; i++) {
        char *m = call_msg(slow[i]);
        if (same_as_tree_as(m, strlen(m), 1)) fail_msg("read by the fast path: %s", m);
        free(m);
    }
    /* the other documents of this file (a tool_result among them), and every truncation */
    const char *docs[] = {good_result, good_call, "", "{", "{}", "null"};
    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++)
        same_as_tree_as(docs[i], strlen(docs[i]), 1);
    char *base = call_msg("{\"amount\":6922,\"to\":\"bob\"}");
    size_t blen = strlen(base);
    for (size_t n = 0; n < blen; n++)
        same_as_tree_as(base, n, 1);
    static const char *const edits[][2] = {
        {"\"v\":1", "\"v\":2"},
        {"\"v\":1}", "\"v\":1,\"zz\":1}"},                 /* unknown field: ignored */
        {"\"v\":1}", "\"status\":\"succeeded\",\"v\":1}"}, /* a result's field: ignored */
        {"\"created_at\":1700000000001,",                  /* a result's field: ignored, not read */
         "\"created_at\":1700000000001,\"effect_id\":\"e_1\","},
        {"\"attempt\":1", "\"attempt\":0"},
        {"\"attempt\":1,", ""},
        {"\"args\":{\"amount\":6922,\"to\":\"bob\"},", ""}, /* missing args */
        {"\"kind\":\"tool_call\"", "\"kind\":\"tool_result\""},
        {"\"kind\":\"tool_call\"", "\"kind\":\"tool\""},
        {"\"tenant\":\"acme\"", "\"tenant\":\"\""},
        {"\"tool\":\"charge\"", "\"tool\":\"ch arge\""},
        {"\"fingerprint\":\"", "\"fingerprint\":\"x"},
        {"\"v\":1}", "\"v\":1} "},
        {"\"args\":{", "\"args\":[{"},
    };
    edit_each(base, edits, sizeof edits / sizeof edits[0], 1);
    free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_call),
        cmocka_unit_test(test_roundtrip_result),
        cmocka_unit_test(test_unknown_fields_ignored),
        cmocka_unit_test(test_malformed_fields),
        cmocka_unit_test(test_malformed_documents),
        cmocka_unit_test(test_validate_and_encode_refuse),
        cmocka_unit_test(test_names_and_keys),
        cmocka_unit_test(test_encode_canon),
        cmocka_unit_test(test_schema_matches_decoder),
        cmocka_unit_test(test_decode_result_fast),
        cmocka_unit_test(test_decode_call_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
