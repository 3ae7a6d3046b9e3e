/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests for strict JSON parsing, RFC 8785 canonicalisation and fingerprints.
 *
 * The reference is external wherever possible: every vector of the RFC author's test data
 * (tests/data/jcs, found through ONCEQ_TESTDATA or relative to this file) must come out byte
 * for byte, the RFC's Appendix B number table must match exactly, and the known fingerprints
 * were computed with `printf '%s' '<canonical>' | sha256sum`. Property checks (idempotence,
 * key order and whitespace independence) use a fixed-seed PRNG so failures reproduce.
 * The last test prints canonicalise+fingerprint cost per call; it is informative only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "oq_json.h"

/* --- helpers -------------------------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    *len = n;
    return buf;
}

static void data_dir(char *out, size_t cap)
{
    const char *env = getenv("ONCEQ_TESTDATA");
    if (env && *env) {
        snprintf(out, cap, "%s/jcs", env);
        return;
    }
    /* Fallback: tests/unit/test_jcs.c -> tests/data/jcs */
    const char *file = __FILE__;
    const char *slash = strrchr(file, '/');
    int dlen = slash ? (int)(slash - file) : 1;
    snprintf(out, cap, "%.*s/../data/jcs", dlen, slash ? file : ".");
}

/* Parse "7b 22 ..." (whitespace-separated hex bytes) into a malloc()ed buffer. */
static unsigned char *parse_hex(const char *text, size_t *len)
{
    size_t cap = strlen(text) / 2 + 1, n = 0;
    unsigned char *out = malloc(cap);
    assert_non_null(out);
    const char *p = text;
    while (*p) {
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
            p++;
        if (!*p) break;
        unsigned v;
        assert_int_equal(sscanf(p, "%2x", &v), 1);
        out[n++] = (unsigned char)v;
        p += 2;
    }
    *len = n;
    return out;
}

static char *canon(const char *text, int *rc, oq_error_t *err)
{
    char *out = NULL;
    *rc = oq_jcs_canonicalize_text(text, strlen(text), &out, NULL, err);
    return out;
}

static void assert_canon(const char *in, const char *expected)
{
    oq_error_t err = {0};
    int rc;
    char *out = canon(in, &rc, &err);
    if (rc != 0) fail_msg("canonicalize(%s) failed: %s", in, err.msg);
    if (strcmp(out, expected) != 0) fail_msg("canonicalize(%s) = %s, want %s", in, out, expected);
    free(out);
}

static void assert_parse_error(const char *in, size_t len, int code, const char *needle)
{
    oq_error_t err = {0};
    json_t *v = NULL;
    int rc = oq_json_parse(in, len, 0, &v, &err);
    if (rc != code)
        fail_msg("parse(%.60s): rc %d (%s), want %d; msg: %s", in, rc, oq_error_name(rc), code,
                 err.msg);
    assert_null(v);
    assert_int_equal(err.code, code);
    if (needle && !strstr(err.msg, needle))
        fail_msg("parse(%.60s): message \"%s\" lacks \"%s\"", in, err.msg, needle);
}

static void fp_text(const char *tenant, const char *tool, const char *args, char out[65])
{
    oq_error_t err = {0};
    json_t *v = NULL;
    int rc = oq_json_parse(args, strlen(args), 0, &v, &err);
    if (rc) fail_msg("parse(%s): %s", args, err.msg);
    rc = oq_fingerprint(tenant, tool, v, out, &err);
    if (rc) fail_msg("fingerprint(%s): %s", args, err.msg);
    json_decref(v);
}

/* --- RFC 8785 test vectors ------------------------------------------------------------------ */

static void test_vectors(void **state)
{
    (void)state;
    char dir[1024], path[1400];
    data_dir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/input", dir);
    DIR *d = opendir(path);
    if (!d) fail_msg("cannot open %s (set ONCEQ_TESTDATA)", path);
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t nl = strlen(de->d_name);
        if (nl < 6 || strcmp(de->d_name + nl - 5, ".json") != 0) continue;
        char base[256];
        snprintf(base, sizeof(base), "%.*s", (int)(nl - 5), de->d_name);

        size_t in_len, exp_len, hex_len;
        snprintf(path, sizeof(path), "%s/input/%s.json", dir, base);
        char *in = read_file(path, &in_len);
        assert_non_null(in);
        snprintf(path, sizeof(path), "%s/outhex/%s.txt", dir, base);
        char *hex = read_file(path, &hex_len);
        if (!hex) fail_msg("missing %s", path);
        unsigned char *want = parse_hex(hex, &exp_len);

        char *out = NULL;
        size_t out_len = 0;
        oq_error_t err = {0};
        int rc = oq_jcs_canonicalize_text(in, in_len, &out, &out_len, &err);
        if (rc) fail_msg("%s: %s", base, err.msg);
        if (out_len != exp_len || memcmp(out, want, exp_len) != 0)
            fail_msg("%s: got %s", base, out);
        assert_int_equal(strlen(out), out_len);

        /* output/NAME.json, when present, is the same bytes */
        snprintf(path, sizeof(path), "%s/output/%s.json", dir, base);
        size_t o_len;
        char *o = read_file(path, &o_len);
        if (o) {
            assert_int_equal(o_len, out_len);
            assert_memory_equal(o, out, out_len);
            free(o);
        }
        free(out);
        free(want);
        free(hex);
        free(in);
        count++;
    }
    closedir(d);
    assert_true(count >= 6);
}

/* --- RFC 8785 Appendix B: IEEE 754 -> ECMAScript string ------------------------------------- */

static const struct {
    uint64_t bits;
    const char *want;
} rfc_numbers[] = {
    {0x0000000000000000ULL, "0"},
    {0x8000000000000000ULL, "0"},
    {0x0000000000000001ULL, "5e-324"},
    {0x8000000000000001ULL, "-5e-324"},
    {0x7fefffffffffffffULL, "1.7976931348623157e+308"},
    {0xffefffffffffffffULL, "-1.7976931348623157e+308"},
    {0x4340000000000000ULL, "9007199254740992"},
    {0xc340000000000000ULL, "-9007199254740992"},
    {0x4430000000000000ULL, "295147905179352830000"},
    {0x44b52d02c7e14af5ULL, "9.999999999999997e+22"},
    {0x44b52d02c7e14af6ULL, "1e+23"},
    {0x44b52d02c7e14af7ULL, "1.0000000000000001e+23"},
    {0x444b1ae4d6e2ef4eULL, "999999999999999700000"},
    {0x444b1ae4d6e2ef4fULL, "999999999999999900000"},
    {0x444b1ae4d6e2ef50ULL, "1e+21"},
    {0x3eb0c6f7a0b5ed8cULL, "9.999999999999997e-7"},
    {0x3eb0c6f7a0b5ed8dULL, "0.000001"},
    {0x41b3de4355555553ULL, "333333333.3333332"},
    {0x41b3de4355555554ULL, "333333333.33333325"},
    {0x41b3de4355555555ULL, "333333333.3333333"},
    {0x41b3de4355555556ULL, "333333333.3333334"},
    {0x41b3de4355555557ULL, "333333333.33333343"},
    {0xbecbf647612f3696ULL, "-0.0000033333333333333333"},
    {0x43143ff3c1cb0959ULL, "1424953923781206.2"},
};

static void test_rfc_number_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(rfc_numbers) / sizeof(rfc_numbers[0]); i++) {
        double d;
        memcpy(&d, &rfc_numbers[i].bits, sizeof(d));
        char out[OQ_JCS_NUMBER_MAX];
        oq_error_t err = {0};
        assert_int_equal(oq_jcs_number(d, out, &err), 0);
        if (strcmp(out, rfc_numbers[i].want) != 0)
            fail_msg("0x%016llx: got %s, want %s", (unsigned long long)rfc_numbers[i].bits, out,
                     rfc_numbers[i].want);
        /* the same through a jansson real inside a document */
        json_t *r = json_real(d);
        assert_non_null(r);
        char *c = NULL;
        assert_int_equal(oq_jcs_canonicalize(r, &c, NULL, &err), 0);
        assert_string_equal(c, rfc_numbers[i].want);
        free(c);
        json_decref(r);
        /* and the text form parses back to the same double */
        assert_true(strtod(out, NULL) == d);
    }
    /* NaN and +-Infinity (bit patterns from the RFC table) are refused */
    static const uint64_t bad[] = {0x7fffffffffffffffULL, 0x7ff0000000000000ULL,
                                   0xfff0000000000000ULL};
    for (size_t i = 0; i < 3; i++) {
        double d;
        memcpy(&d, &bad[i], sizeof(d));
        char out[OQ_JCS_NUMBER_MAX];
        oq_error_t err = {0};
        assert_int_equal(oq_jcs_number(d, out, &err), OQ_ERANGE);
        assert_int_equal(err.code, OQ_ERANGE);
    }
}

static void test_number_forms(void **state)
{
    (void)state;
    assert_canon("1.0", "1");
    assert_canon("1e0", "1");
    assert_canon("-0", "0");
    assert_canon("-0.0", "0");
    assert_canon("1e21", "1e+21");
    assert_canon("9007199254740992.0", "9007199254740992");
    assert_canon("-1e21", "-1e+21");
    /* Doubles in (2^53, 1e21) are integers that RFC 8785 prints as integer literals beyond
     * +-2^53: refused at parse time, so every accepted text has a re-parseable canonical form. */
    assert_parse_error("1e20", 4, OQ_ERANGE, "100000000000000000000");
    assert_parse_error("[9007199254740994.0]", 20, OQ_ERANGE, "outside +-2^53");
    assert_parse_error("-9.99e20", 8, OQ_ERANGE, NULL);
    /* ... while the canonicaliser itself stays RFC 8785 for hand-built values */
    json_t *r = json_real(1e20);
    char *txt = NULL;
    assert_int_equal(oq_jcs_canonicalize(r, &txt, NULL, NULL), 0);
    assert_string_equal(txt, "100000000000000000000");
    free(txt);
    json_decref(r);
    assert_canon("1E-7", "1e-7");
    assert_canon("0.000001", "0.000001");
    assert_canon("0.0000012345", "0.0000012345");
    assert_canon("123456789e-15", "1.23456789e-7");
    assert_canon("4.50", "4.5");
    assert_canon("2e-3", "0.002");
    assert_canon("1E30", "1e+30");
    assert_canon("-1.5e-10", "-1.5e-10");
    assert_canon("0.1", "0.1");
    assert_canon("[0.1,0.2,0.30000000000000004]", "[0.1,0.2,0.30000000000000004]");
    assert_canon("9007199254740992", "9007199254740992");
    assert_canon("-9007199254740992", "-9007199254740992");
    assert_canon("1e300", "1e+300");
    /* 1e-400 underflows to 0 in IEEE: refused (test_number_underflow), as overflow is */

    /* 1, 1.0, 1e0, 10e-1 all give one fingerprint */
    char a[65], b[65], c[65], d[65];
    fp_text("t", "x", "{\"n\":1}", a);
    fp_text("t", "x", "{\"n\":1.0}", b);
    fp_text("t", "x", "{\"n\":1e0}", c);
    fp_text("t", "x", "{\"n\":10e-1}", d);
    assert_string_equal(a, b);
    assert_string_equal(a, c);
    assert_string_equal(a, d);
    fp_text("t", "x", "{\"n\":2}", d);
    assert_string_not_equal(a, d);
}

static void test_nan_infinity_refused(void **state)
{
    (void)state;
    char out[OQ_JCS_NUMBER_MAX];
    assert_int_equal(oq_jcs_number(NAN, out, NULL), OQ_ERANGE);
    assert_int_equal(oq_jcs_number(INFINITY, out, NULL), OQ_ERANGE);
    assert_int_equal(oq_jcs_number(-INFINITY, out, NULL), OQ_ERANGE);
    assert_parse_error("NaN", 3, OQ_EINVAL, NULL);
    assert_parse_error("[Infinity]", 10, OQ_EINVAL, NULL);
    assert_parse_error("[-Infinity]", 11, OQ_EINVAL, NULL);
    assert_parse_error("1e400", 5, OQ_ERANGE, NULL);
    assert_parse_error("{\"a\":-1e999}", 12, OQ_ERANGE, NULL);
}

/* --- strings and key order ------------------------------------------------------------------ */

static void test_string_escapes(void **state)
{
    (void)state;
    assert_canon("\"\\u0001\\u001f\\b\\f\\n\\r\\t\\\"\\\\\\/\"",
                 "\"\\u0001\\u001f\\b\\f\\n\\r\\t\\\"\\\\/\"");
    assert_canon("\"\\u007f\\u0080\\u00e9\"", "\"\x7f\xc2\x80\xc3\xa9\"");
    assert_canon("\"\\u2028\\u2029\"", "\"\xe2\x80\xa8\xe2\x80\xa9\""); /* literal, as ES */
    assert_canon("\"\\ud83d\\ude02\"", "\"\xf0\x9f\x98\x82\"");
    assert_canon("\"\\u000B\"", "\"\\u000b\""); /* lowercase hex */
    assert_canon("\"</script>\"", "\"</script>\"");
    assert_canon("\"A\\u030a\"", "\"A\xcc\x8a\""); /* no Unicode normalisation */
    /* NUL inside strings is refused at parse time */
    assert_parse_error("\"a\\u0000b\"", 10, OQ_EINVAL, NULL);
    assert_parse_error("{\"a\\u0000\":1}", 13, OQ_EINVAL, NULL);
}

static void test_key_order_utf16(void **state)
{
    (void)state;
    /* U+FB33 (UTF-8 EF AC B3) vs U+1F602 (F0 9F 98 82): UTF-8 byte order puts U+FB33 first,
     * UTF-16 code unit order (D83D DE02 < FB33) puts the emoji first. */
    assert_canon("{\"\\ufb33\":1,\"\\ud83d\\ude02\":2}",
                 "{\"\xf0\x9f\x98\x82\":2,\"\xef\xac\xb3\":1}");
    assert_canon(
        "{\"\\ue000\":1,\"\\ud800\\udc00\":2,\"\\uffff\":3,\"\\ud7ff\":4}",
        "{\"\xed\x9f\xbf\":4,\"\xf0\x90\x80\x80\":2,\"\xee\x80\x80\":1,\"\xef\xbf\xbf\":3}");
    /* prefixes first, then code units */
    assert_canon("{\"ab\":1,\"a\":2,\"\":3,\"B\":4,\"b\":5}",
                 "{\"\":3,\"B\":4,\"a\":2,\"ab\":1,\"b\":5}");
    /* two supplementary characters: compared by surrogate pairs (= code point order) */
    assert_canon("{\"\\ud83d\\ude03\":1,\"\\ud83d\\ude02\":2,\"\\ud83c\\udf00\":3}",
                 "{\"\xf0\x9f\x8c\x80\":3,\"\xf0\x9f\x98\x82\":2,\"\xf0\x9f\x98\x83\":1}");
    /* many members: the heap path of the member array */
    char in[4096], want[4096];
    size_t ni = 0, nw = 0;
    ni += (size_t)snprintf(in + ni, sizeof(in) - ni, "{");
    nw += (size_t)snprintf(want + nw, sizeof(want) - nw, "{");
    for (int i = 39; i >= 0; i--)
        ni +=
            (size_t)snprintf(in + ni, sizeof(in) - ni, "%s\"k%02d\":%d", i == 39 ? "" : ",", i, i);
    for (int i = 0; i < 40; i++)
        nw += (size_t)snprintf(want + nw, sizeof(want) - nw, "%s\"k%02d\":%d", i ? "," : "", i, i);
    snprintf(in + ni, sizeof(in) - ni, "}");
    snprintf(want + nw, sizeof(want) - nw, "}");
    assert_canon(in, want);
}

/* --- strict parsing ------------------------------------------------------------------------- */

static void test_duplicate_keys(void **state)
{
    (void)state;
    assert_parse_error("{\"a\":1,\"a\":2}", 13, OQ_EDUPKEY, "line 1");
    assert_parse_error("{\"x\":{\"b\":1,\"c\":2,\"b\":3}}", 25, OQ_EDUPKEY, "duplicate");
    assert_parse_error("[{\"\\u00e9\":1,\"\xc3\xa9\":2}]", 21, OQ_EDUPKEY, NULL);
    /* same key in different objects is fine */
    assert_canon("[{\"a\":1},{\"a\":2}]", "[{\"a\":1},{\"a\":2}]");
}

static void test_integer_range(void **state)
{
    (void)state;
    assert_parse_error("9007199254740993", 16, OQ_ERANGE, "9007199254740993 is outside +-2^53");
    assert_parse_error("{\"a\":[-9007199254740993]}", 25, OQ_ERANGE, "IEEE doubles");
    assert_parse_error("99999999999999999999", 20, OQ_ERANGE, NULL);
    assert_parse_error("-99999999999999999999", 21, OQ_ERANGE, NULL);
    assert_canon("[9007199254740992,-9007199254740992]", "[9007199254740992,-9007199254740992]");
    /* hand-built values are checked too */
    json_t *v = json_integer(9007199254740993LL);
    char *out = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_jcs_canonicalize(v, &out, NULL, &err), OQ_ERANGE);
    assert_null(out);
    assert_non_null(strstr(err.msg, "2^53"));
    char fp[65];
    assert_int_equal(oq_fingerprint("t", "x", v, fp, &err), OQ_ERANGE);
    json_decref(v);
}

static void test_depth_limit(void **state)
{
    (void)state;
    char buf[8192];
    static const int depths[] = {1, 63, 64, 65, 100, 2047, 3000};
    for (size_t di = 0; di < sizeof(depths) / sizeof(depths[0]); di++) {
        int depth = depths[di];
        size_t n = 0;
        for (int i = 0; i < depth; i++)
            buf[n++] = '[';
        for (int i = 0; i < depth; i++)
            buf[n++] = ']';
        json_t *v = NULL;
        oq_error_t err = {0};
        int rc = oq_json_parse(buf, n, 0, &v, &err);
        if (depth <= OQ_JSON_DEFAULT_MAX_DEPTH) {
            assert_int_equal(rc, 0);
            json_decref(v);
        } else {
            assert_int_equal(rc, OQ_EDEPTH);
            assert_null(v);
        }
    }
    /* objects count too, and the caller's limit applies */
    const char *two = "{\"a\":{\"b\":1}}";
    json_t *v = NULL;
    assert_int_equal(oq_json_parse(two, strlen(two), 2, &v, NULL), 0);
    json_decref(v);
    v = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_json_parse(two, strlen(two), 1, &v, &err), OQ_EDEPTH);
    assert_null(v);
    assert_non_null(strstr(err.msg, "deeper"));
    /* scalars have depth 0 */
    assert_int_equal(oq_json_parse("1", 1, 1, &v, NULL), 0);
    json_decref(v);
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t len;
        int valid;
    } cases[] = {
        {"abc", 3, 1},
        {"\xc3\xa9", 2, 1},
        {"\xe2\x82\xac", 3, 1},
        {"\xf0\x9f\x98\x82", 4, 1},
        {"\xf4\x8f\xbf\xbf", 4, 1}, /* U+10FFFF */
        {"\xed\x9f\xbf", 3, 1},     /* U+D7FF */
        {"\xff", 1, 0},             /* never valid */
        {"\x80", 1, 0},             /* lone continuation */
        {"\xc0\xaf", 2, 0},         /* overlong '/' */
        {"\xc1\xbf", 2, 0},         /* overlong */
        {"\xe0\x80\xaf", 3, 0},     /* overlong */
        {"\xf0\x80\x80\xaf", 4, 0}, /* overlong */
        {"\xed\xa0\x80", 3, 0},     /* surrogate U+D800 */
        {"\xed\xbf\xbf", 3, 0},     /* surrogate U+DFFF */
        {"\xf4\x90\x80\x80", 4, 0}, /* U+110000 */
        {"\xe2\x82", 2, 0},         /* truncated */
        {"\xc3", 1, 0},             /* truncated */
        {"\xc3\x28", 2, 0},         /* bad continuation */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (oq_utf8_valid(cases[i].s, cases[i].len) != cases[i].valid)
            fail_msg("utf8 case %zu: expected %s", i, cases[i].valid ? "valid" : "invalid");
        if (cases[i].valid) continue;
        char doc[32];
        int n = snprintf(doc, sizeof(doc), "[\"%.*s\"]", (int)cases[i].len, cases[i].s);
        assert_parse_error(doc, (size_t)n, OQ_EUTF8, "byte 2");
        /* repaired: valid, as long, every byte of the bad sequence a '?', the rest kept */
        char r[16];
        snprintf(r, sizeof(r), "x%.*sy", (int)cases[i].len, cases[i].s);
        size_t fixed = oq_utf8_repair(r);
        if (fixed < 1 || fixed > cases[i].len || !oq_utf8_valid(r, strlen(r)) ||
            strlen(r) != cases[i].len + 2 || r[0] != 'x' || r[strlen(r) - 1] != 'y')
            fail_msg("utf8 case %zu: repaired to \"%s\" (%zu bytes fixed)", i, r, fixed);
    }
    char cut[] = "a\xe2\x82\xac\xe2\x82"; /* a euro sign, then one cut in two by a limit */
    assert_int_equal(oq_utf8_repair(cut), 2);
    assert_string_equal(cut, "a\xe2\x82\xac??");
    char ok[] = "caf\xc3\xa9";
    assert_int_equal(oq_utf8_repair(ok), 0);
    assert_string_equal(ok, "caf\xc3\xa9");
    /* a hand-built string that skipped jansson's check is refused by the canonicaliser */
    json_t *s = json_stringn_nocheck("a\xff", 2);
    char *out = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_jcs_canonicalize(s, &out, NULL, &err), OQ_EUTF8);
    assert_null(out);
    json_decref(s);
    char fp[65];
    json_t *args = json_object();
    assert_int_equal(oq_fingerprint("bad\xc3", "x", args, fp, &err), OQ_EUTF8);
    json_decref(args);
}

static void test_syntax_errors(void **state)
{
    (void)state;
    assert_parse_error("", 0, OQ_EINVAL, NULL);
    assert_parse_error("{", 1, OQ_EINVAL, "line 1");
    assert_parse_error("{\"a\":1,}", 8, OQ_EINVAL, NULL);
    assert_parse_error("[1] [2]", 7, OQ_EINVAL, NULL);
    assert_parse_error("{'a':1}", 7, OQ_EINVAL, NULL);
    assert_parse_error("\"\\ud800\"", 8, OQ_EINVAL, NULL); /* lone surrogate escape */
    assert_parse_error("01", 2, OQ_EINVAL, NULL);
    assert_parse_error("[1]\0", 4, OQ_EINVAL, NULL);
    oq_error_t err = {0};
    json_t *v = NULL;
    const char *multi = "{\n  \"a\": 1,\n  \"b\": tru\n}";
    assert_int_equal(oq_json_parse(multi, strlen(multi), 0, &v, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "line 3"));
}

/* --- properties ----------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

static const char *const prop_keys[] = {
    "amount", "currency",        "\\u20ac", "\\ud83d\\ude02", "\\ufb33", "b", "B", "ab",
    "z",      "\\u00e9t\\u00e9", "nested",  "list",           "10",      "1", "",
};
static const char *const prop_vals[] = {
    "1",           "1.0",  "-0",   "2.5e3",          "\"text\"",
    "\"\\u2028\"", "null", "true", "[1,2,3]",        "{\"y\":1,\"x\":2}",
    "[]",          "{}",   "1e-7", "\"caf\\u00e9\"",
};

static size_t ws(char *buf, size_t n)
{
    static const char w[] = " \t\n\r";
    int k = (int)(rng() % 3);
    for (int i = 0; i < k; i++)
        buf[n++] = w[rng() % 4];
    return n;
}

/* Write the same object (members i..) in a random order with random whitespace. */
static size_t random_doc(char *buf, const int *vals, int nkeys)
{
    int order[32];
    for (int i = 0; i < nkeys; i++)
        order[i] = i;
    for (int i = nkeys - 1; i > 0; i--) {
        int j = (int)(rng() % (uint32_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    size_t n = ws(buf, 0);
    buf[n++] = '{';
    for (int i = 0; i < nkeys; i++) {
        int k = order[i];
        if (i) buf[n++] = ',';
        n = ws(buf, n);
        n += (size_t)sprintf(buf + n, "\"%s\"", prop_keys[k]);
        n = ws(buf, n);
        buf[n++] = ':';
        n = ws(buf, n);
        n += (size_t)sprintf(buf + n, "%s", prop_vals[vals[k]]);
        n = ws(buf, n);
    }
    buf[n++] = '}';
    n = ws(buf, n);
    buf[n] = '\0';
    return n;
}

static void test_properties(void **state)
{
    (void)state;
    int nkeys = (int)(sizeof(prop_keys) / sizeof(prop_keys[0]));
    char doc[4096];
    for (int round = 0; round < 50; round++) {
        int vals[32];
        for (int i = 0; i < nkeys; i++)
            vals[i] = (int)(rng() % (sizeof(prop_vals) / sizeof(prop_vals[0])));
        char first_fp[65] = "", first_canon[4096] = "";
        for (int perm = 0; perm < 20; perm++) {
            random_doc(doc, vals, nkeys);
            oq_error_t err = {0};
            int rc;
            char *c1 = canon(doc, &rc, &err);
            if (rc) fail_msg("%s: %s", doc, err.msg);
            /* canonicalising the canonical form changes nothing */
            char *c2 = canon(c1, &rc, &err);
            assert_int_equal(rc, 0);
            assert_string_equal(c1, c2);
            char fp[65];
            fp_text("tenant-1", "charge", doc, fp);
            if (perm == 0) {
                strcpy(first_fp, fp);
                snprintf(first_canon, sizeof(first_canon), "%s", c1);
            } else {
                if (strcmp(fp, first_fp) != 0) fail_msg("fingerprint changed for %s", doc);
                assert_string_equal(c1, first_canon);
            }
            free(c1);
            free(c2);
        }
    }
}

static void test_known_fingerprints(void **state)
{
    (void)state;
    char fp[65];
    /* printf '%s' '{"args":{"amount":100,"currency":"EUR","memo":"café €","rate":1.5},
     *   "tenant":"acme","tool":"charge"}' | sha256sum   (one line) */
    fp_text("acme", "charge",
            " { \"rate\": 1.50, \"memo\": \"caf\\u00e9 \\u20ac\",\n \"currency\": \"EUR\", "
            "\"amount\": 1e2 } ",
            fp);
    assert_string_equal(fp, "e3bc8eee77639b0cc275ae9d4d0e7b28d04c3c318aa2414079e275301518b541");
    /* printf '%s' '{"args":{},"tenant":"default","tool":"noop"}' | sha256sum */
    fp_text("default", "noop", "{}", fp);
    assert_string_equal(fp, "000b4a27ad36b0248f4aab40bee51e3e87eab1ee8d22cb83cd6debbde1d2d2c5");
    /* tenant and tool are part of the fingerprint */
    char other[65];
    fp_text("default2", "noop", "{}", other);
    assert_string_not_equal(fp, other);
    fp_text("default", "noop2", "{}", other);
    assert_string_not_equal(fp, other);
    assert_int_equal(oq_fingerprint("t", "x", NULL, fp, NULL), OQ_EINVAL);
}

/* --- throughput (informative) --------------------------------------------------------------- */

static void test_throughput(void **state)
{
    (void)state;
    const char *args = "{\"to\":\"alice@example.com\",\"subject\":\"Your invoice 2024-0042\","
                       "\"amount\":12999,\"currency\":\"EUR\",\"customer\":{\"id\":\"cus_8f2a\","
                       "\"tier\":\"gold\",\"score\":0.875},\"tags\":[\"billing\",\"monthly\"],"
                       "\"retry\":false,\"note\":null}";
    json_t *v = NULL;
    assert_int_equal(oq_json_parse(args, strlen(args), 0, &v, NULL), 0);
    const int iters = 20000;
    char fp[65];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < iters; i++)
        assert_int_equal(oq_fingerprint("acme", "send_email", v, fp, NULL), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / iters;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < iters; i++) {
        json_t *p = NULL;
        assert_int_equal(oq_json_parse(args, strlen(args), 0, &p, NULL), 0);
        assert_int_equal(oq_fingerprint("acme", "send_email", p, fp, NULL), 0);
        json_decref(p);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns2 =
        ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / iters;
    printf("# fingerprint of a %zu-byte args object: %.0f ns/op canonicalise+SHA-256, "
           "%.0f ns/op parse+canonicalise+SHA-256\n",
           strlen(args), ns, ns2);
    json_decref(v);
}

/* --- the CLI tools (onceq canon / onceq fingerprint), through ONCEQ_BIN ---------------------- */

/* Run `$ONCEQ_BIN <args> < input`; stdout/stderr are returned malloc()ed. Returns the exit code,
 * or -1 when the binary is not available (the test is then skipped). */
static int run_cli(const char *args, const char *input, size_t input_len, char **out, char **errt)
{
    const char *bin = getenv("ONCEQ_BIN");
    if (!bin || !*bin || access(bin, X_OK) != 0) return -1;
    char in_path[] = "/tmp/oq_jcs_in_XXXXXX", out_path[] = "/tmp/oq_jcs_out_XXXXXX",
         err_path[] = "/tmp/oq_jcs_err_XXXXXX";
    int fi = mkstemp(in_path), fo = mkstemp(out_path), fe = mkstemp(err_path);
    assert_true(fi >= 0 && fo >= 0 && fe >= 0);
    assert_int_equal(write(fi, input, input_len), (ssize_t)input_len);
    close(fi);
    close(fo);
    close(fe);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "'%s' %s < %s > %s 2> %s", bin, args, in_path, out_path, err_path);
    int st = system(cmd);
    size_t n;
    *out = read_file(out_path, &n);
    *errt = read_file(err_path, &n);
    unlink(in_path);
    unlink(out_path);
    unlink(err_path);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void test_cli_canon(void **state)
{
    (void)state;
    char *out = NULL, *errt = NULL;
    const char *in = " { \"b\" : [ 1.0 , 1e21 ], \"a\" : \"\\u00e9\" } ";
    int rc = run_cli("canon", in, strlen(in), &out, &errt);
    if (rc < 0) skip();
    assert_int_equal(rc, 0);
    assert_string_equal(out, "{\"a\":\"\xc3\xa9\",\"b\":[1,1e+21]}"); /* no newline */
    free(out);
    free(errt);

    /* every RFC vector through the binary too */
    char dir[1024], path[1400];
    data_dir(dir, sizeof(dir));
    static const char *const names[] = {"arrays",  "french", "structures",
                                        "unicode", "values", "weird"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t il, wl;
        snprintf(path, sizeof(path), "%s/input/%s.json", dir, names[i]);
        char *input = read_file(path, &il);
        snprintf(path, sizeof(path), "%s/outhex/%s.txt", dir, names[i]);
        char *hex = read_file(path, &wl);
        assert_non_null(input);
        assert_non_null(hex);
        unsigned char *want = parse_hex(hex, &wl);
        assert_int_equal(run_cli("canon", input, il, &out, &errt), 0);
        if (strlen(out) != wl || memcmp(out, want, wl) != 0) fail_msg("%s: got %s", names[i], out);
        free(out);
        free(errt);
        free(want);
        free(hex);
        free(input);
    }

    static const struct {
        const char *in, *err;
    } bad[] = {
        {"{\"a\":1,\"a\":2}", "onceq canon: duplicate_key: "},
        {"[9007199254740993]", "onceq canon: range: integer 9007199254740993"},
        {"\"\xff\"", "onceq canon: utf8: "},
        {"", "onceq canon: invalid: "},
        {"[1,]", "onceq canon: invalid: "},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(run_cli("canon", bad[i].in, strlen(bad[i].in), &out, &errt), 2);
        if (strncmp(errt, bad[i].err, strlen(bad[i].err)) != 0)
            fail_msg("canon %s: stderr \"%s\"", bad[i].in, errt);
        assert_string_equal(out, "");
        free(out);
        free(errt);
    }
    assert_int_equal(run_cli("canon extra", "1", 1, &out, &errt), 2);
    free(out);
    free(errt);
    assert_int_equal(run_cli("canon --help", "", 0, &out, &errt), 0);
    assert_non_null(strstr(out, "RFC 8785"));
    free(out);
    free(errt);
}

static void test_cli_fingerprint(void **state)
{
    (void)state;
    char *out = NULL, *errt = NULL;
    const char *args = "{\"rate\":1.50,\"memo\":\"caf\\u00e9 \\u20ac\",\"currency\":\"EUR\","
                       "\"amount\":100}";
    int rc = run_cli("fingerprint --tool charge --tenant acme", args, strlen(args), &out, &errt);
    if (rc < 0) skip();
    assert_int_equal(rc, 0);
    assert_string_equal(out, "e3bc8eee77639b0cc275ae9d4d0e7b28d04c3c318aa2414079e275301518b541\n");
    free(out);
    free(errt);
    /* tenant defaults to "default" */
    assert_int_equal(run_cli("fingerprint --tool=noop", " {} ", 4, &out, &errt), 0);
    assert_string_equal(out, "000b4a27ad36b0248f4aab40bee51e3e87eab1ee8d22cb83cd6debbde1d2d2c5\n");
    free(out);
    free(errt);

    static const struct {
        const char *argv, *in, *err;
    } bad[] = {
        {"fingerprint --tool t", "[1,2]", "args must be a JSON object, got array"},
        {"fingerprint --tool t", "\"x\"", "args must be a JSON object, got string"},
        {"fingerprint --tool t", "{\"a\":1,\"a\":1}", "duplicate_key"},
        {"fingerprint --tool t", "{\"a\":1e400}", "range"},
        {"fingerprint --tool t", "", "invalid"},
        {"fingerprint", "{}", "--tool is required"},
        {"fingerprint --tool ''", "{}", "tool"},
        {"fingerprint --tool t --bogus 1", "{}", "bogus"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(run_cli(bad[i].argv, bad[i].in, strlen(bad[i].in), &out, &errt), 2);
        if (!strstr(errt, bad[i].err))
            fail_msg("%s < %s: stderr \"%s\", want \"%s\"", bad[i].argv, bad[i].in, errt,
                     bad[i].err);
        assert_string_equal(out, "");
        free(out);
        free(errt);
    }
}

/* oq_json_dumps: jansson's layout, reals without binary noise, the same doubles read back. */
static void test_json_dumps(void **state)
{
    (void)state;
    static const struct {
        double x;
        const char *want;
    } reals[] = {
        {3.545, "3.545"},
        {0.1, "0.1"},
        {100.0, "100.0"},
        {-2.5, "-2.5"},
        {1e21, "1e21"},
        {1e-7, "1e-7"},
        {0.0, "0.0"},
        {0.30000000000000004, "0.30000000000000004"},
        {1e16, "10000000000000000.0"},
        {123456.789, "123456.789"},
        {2.5e-5, "2.5e-5"},
    };
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        char t[OQ_JSON_REAL_MAX];
        oq_json_real_text(reals[i].x, t);
        if (strcmp(t, reals[i].want) != 0)
            fail_msg("%.17g: got %s, want %s", reals[i].x, t, reals[i].want);
        assert_true(strtod(t, NULL) == reals[i].x);
    }
    json_t *v = json_pack("{s:f, s:[f, i, s], s:s, s:{s:f}}", "dsr", 3.545, "list", 0.1, 7,
                          "3.5449999999999999", "s", "x 1.5 \"q\" 2e5", "o", "p50", 1.0 / 3);
    assert_non_null(v);
    char *got = oq_json_dumps(v, JSON_COMPACT);
    assert_string_equal(got, "{\"dsr\":3.545,\"list\":[0.1,7,\"3.5449999999999999\"],\"s\":\"x 1.5 "
                             "\\\"q\\\" 2e5\",\"o\":{\"p50\":0.3333333333333333}}");
    json_t *back = json_loads(got, 0, NULL);
    assert_non_null(back);
    assert_true(json_equal(v, back)); /* the same doubles */
    json_decref(back);
    free(got);
    /* without reals, byte for byte what json_dumps writes, in every layout */
    json_t *plain =
        json_pack("{s:i, s:[s, b, n], s:{}, s:s}", "n", 5, "a", "1.5", 1, "e", "k", "\u00e9\n");
    size_t layouts[] = {0, JSON_COMPACT, JSON_INDENT(2), JSON_INDENT(2) | JSON_SORT_KEYS,
                        JSON_COMPACT | JSON_ENSURE_ASCII};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        char *a = json_dumps(plain, layouts[i]), *b = oq_json_dumps(plain, layouts[i]);
        assert_string_equal(a, b);
        free(a);
        free(b);
    }
    got = oq_json_dumps(v, JSON_INDENT(2) | JSON_SORT_KEYS);
    assert_non_null(strstr(got, "\"dsr\": 3.545,\n"));
    free(got);
    json_decref(plain);
    json_decref(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_dumps),
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_rfc_number_table),
        cmocka_unit_test(test_number_forms),
        cmocka_unit_test(test_nan_infinity_refused),
        cmocka_unit_test(test_string_escapes),
        cmocka_unit_test(test_key_order_utf16),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_integer_range),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_properties),
        cmocka_unit_test(test_known_fingerprints),
        cmocka_unit_test(test_cli_canon),
        cmocka_unit_test(test_cli_fingerprint),
        cmocka_unit_test(test_throughput),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
