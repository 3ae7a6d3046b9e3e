/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/jschema.c: the JSON Schema subset. Cases in the JSON-Schema-Test-Suite layout (groups
 * of {description, schema, tests: [{description, data, valid}]}, written for this project, in
 * tests/data/jschema/valid.json; invalid ones may also name the expected "pointer" and
 * "keyword" of the first violation), schemas that must be refused at compile time with the
 * pointer of the offending keyword (refused.json), and the bounds that keep a hostile schema or
 * instance from looping or exhausting the stack.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "oq_jschema.h"

static json_t *load_data(const char *name)
{
    const char *dir = getenv("ONCEQ_TESTDATA");
    char path[4096];
    snprintf(path, sizeof path, "%s/jschema/%s", dir ? dir : "tests/data", name);
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!j) fprintf(stderr, "%s: %s (line %d)\n", path, je.text, je.line);
    assert_non_null(j);
    return j;
}

static void test_suite_valid(void **state)
{
    (void)state;
    json_t *all = load_data("valid.json");
    size_t ncases = 0, nfail = 0;
    size_t gi;
    json_t *g;
    json_array_foreach(all, gi, g)
    {
        const char *gd = json_string_value(json_object_get(g, "description"));
        oq_jschema_t *s = NULL;
        oq_error_t err = {0};
        if (oq_jschema_compile(json_object_get(g, "schema"), &s, &err) != 0) {
            fprintf(stderr, "group \"%s\": schema refused: %s\n", gd, err.msg);
            nfail++;
            continue;
        }
        size_t ti;
        json_t *t;
        json_array_foreach(json_object_get(g, "tests"), ti, t)
        {
            ncases++;
            oq_jschema_violation_t v;
            int rc = oq_jschema_validate(s, json_object_get(t, "data"), &v);
            int want = json_is_true(json_object_get(t, "valid"));
            const char *td = json_string_value(json_object_get(t, "description"));
            const json_t *wp = json_object_get(t, "pointer"), *wk = json_object_get(t, "keyword");
            if ((rc == 0) != want) {
                fprintf(stderr, "%s / %s: expected %s, got %s (%s at \"%s\": %s)\n", gd, td,
                        want ? "valid" : "invalid", rc == 0 ? "valid" : "invalid", v.keyword,
                        v.pointer, v.reason);
                nfail++;
            } else if (!want && ((wp && strcmp(json_string_value(wp), v.pointer) != 0) ||
                                 (wk && strcmp(json_string_value(wk), v.keyword) != 0))) {
                fprintf(stderr, "%s / %s: violation %s at \"%s\" (%s), expected %s at \"%s\"\n", gd,
                        td, v.keyword, v.pointer, v.reason, wk ? json_string_value(wk) : "*",
                        wp ? json_string_value(wp) : "*");
                nfail++;
            }
        }
        oq_jschema_destroy(s);
    }
    json_decref(all);
    fprintf(stderr, "%zu cases\n", ncases);
    assert_true(ncases > 150);
    assert_int_equal(nfail, 0);
}

static void test_suite_refused(void **state)
{
    (void)state;
    json_t *all = load_data("refused.json");
    size_t nfail = 0, gi;
    json_t *g;
    json_array_foreach(all, gi, g)
    {
        const char *gd = json_string_value(json_object_get(g, "description"));
        const char *want = json_string_value(json_object_get(g, "error"));
        oq_jschema_t *s = NULL;
        oq_error_t err = {0};
        int rc = oq_jschema_compile(json_object_get(g, "schema"), &s, &err);
        if (rc == 0) {
            fprintf(stderr, "%s: accepted, expected \"%s\"\n", gd, want);
            oq_jschema_destroy(s);
            nfail++;
        } else if (rc != OQ_EINVAL || !strstr(err.msg, want)) {
            fprintf(stderr, "%s: error \"%s\" (rc %d), expected \"%s\"\n", gd, err.msg, rc, want);
            nfail++;
        }
    }
    json_decref(all);
    assert_int_equal(nfail, 0);
}

/* {"properties":{"a":{"properties":{"a": ... }}}} n levels deep */
static json_t *nested_schema(int n)
{
    json_t *s = json_object();
    for (int i = 0; i < n; i++)
        s = json_pack("{s:{s:o}}", "properties", "a", s);
    return s;
}

static void test_compile_depth_bound(void **state)
{
    (void)state;
    json_t *ok = nested_schema(30), *deep = nested_schema(200);
    oq_jschema_t *s = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_jschema_compile(ok, &s, &err), 0);
    oq_jschema_destroy(s);
    s = NULL;
    assert_int_equal(oq_jschema_compile(deep, &s, &err), OQ_EINVAL);
    assert_null(s);
    assert_non_null(strstr(err.msg, "nested deeper than 64"));
    json_decref(ok);
    json_decref(deep);
}

/* Each level: anyOf of two refs to the next level, both failing: 2^40 paths without the step
 * budget. Must end quickly with a $limit violation, never hang. */
static void test_step_budget(void **state)
{
    (void)state;
    json_t *defs = json_object();
    enum { LEVELS = 40 };
    for (int i = 0; i < LEVELS; i++) {
        char name[16], next[32];
        snprintf(name, sizeof name, "d%d", i);
        snprintf(next, sizeof next, "#/$defs/d%d", i + 1);
        json_object_set_new(defs, name,
                            i + 1 < LEVELS ? json_pack("{s:[{s:s},{s:s,s:i}]}", "anyOf", "$ref",
                                                       next, "$ref", next, "minimum", 0)
                                           : json_pack("{s:s}", "type", "string"));
    }
    json_t *schema = json_pack("{s:o,s:s}", "$defs", defs, "$ref", "#/$defs/d0");
    oq_jschema_t *s = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_jschema_compile(schema, &s, &err), 0);
    oq_jschema_violation_t v;
    json_t *inst = json_integer(5);
    assert_int_equal(oq_jschema_validate(s, inst, &v), OQ_EINVAL);
    assert_string_equal(v.keyword, "$limit");
    json_decref(inst);
    oq_jschema_destroy(s);
    json_decref(schema);
}

/* A recursive schema (descending through items) on an instance nested deeper than the
 * validator's depth bound: a $limit violation, no stack exhaustion. */
static void test_depth_budget(void **state)
{
    (void)state;
    json_t *schema = json_pack("{s:{s:{s:{s:s}}},s:s}", "$defs", "n", "items", "$ref", "#/$defs/n",
                               "$ref", "#/$defs/n");
    oq_jschema_t *s = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_jschema_compile(schema, &s, &err), 0);
    json_t *inst = json_array();
    for (int i = 0; i < 500; i++)
        inst = json_pack("[o]", inst);
    oq_jschema_violation_t v;
    assert_int_equal(oq_jschema_validate(s, inst, &v), OQ_EINVAL);
    assert_string_equal(v.keyword, "$limit");
    json_t *shallow = json_pack("[[[]]]");
    assert_int_equal(oq_jschema_validate(s, shallow, &v), 0);
    json_decref(shallow);
    json_decref(inst);
    oq_jschema_destroy(s);
    json_decref(schema);
}

/* A pointer or a reason cut to fit its buffer is still UTF-8 (the HTTP API puts both in JSON):
 * a 700-byte property name of two-byte characters, missing and then not allowed. */
static void test_utf8_cuts(void **state)
{
    (void)state;
    char name[701];
    for (int i = 0; i < 700; i += 2)
        memcpy(name + i, "\xc3\xa9", 2);
    name[700] = 0;
    json_t *schema = json_pack("{s:[s],s:b}", "required", name, "additionalProperties", 0);
    oq_jschema_t *s = NULL;
    assert_int_equal(oq_jschema_compile(schema, &s, NULL), 0);
    json_t *empty = json_object(), *extra = json_pack("{s:i}", name, 1);
    oq_jschema_violation_t v;
    const json_t *cases[] = {empty, extra};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(oq_jschema_validate(s, cases[i], &v), OQ_EINVAL);
        json_t *p = json_string(v.pointer), *r = json_string(v.reason);
        assert_non_null(p);
        assert_non_null(r);
        assert_true(strlen(v.pointer) > 100);
        json_decref(p);
        json_decref(r);
    }
    oq_jschema_destroy(s);
    json_decref(schema);
    json_decref(empty);
    json_decref(extra);
    /* a compile error naming a long keyword of two-byte characters */
    json_t *bad = json_pack("{s:{s:i}}", "properties", name, 1);
    oq_error_t err = {0};
    assert_int_equal(oq_jschema_compile(bad, &s, &err), OQ_EINVAL);
    json_t *m = json_string(err.msg);
    assert_non_null(m);
    json_decref(m);
    json_decref(bad);
}

static void test_equal_and_source(void **state)
{
    (void)state;
    json_t *a = json_pack("{s:[i,f,n]}", "x", 1, 2.0, NULL);
    json_t *b = json_pack("{s:[f,i,n]}", "x", 1.0, 2);
    json_t *c = json_pack("{s:[f,i,b]}", "x", 1.0, 2, 0);
    assert_true(oq_jschema_equal(a, b));
    assert_false(oq_jschema_equal(a, c));
    assert_false(oq_jschema_equal(a, NULL));
    oq_jschema_t *s = NULL;
    assert_int_equal(oq_jschema_compile(a, &s, NULL), OQ_EINVAL); /* "x" is no keyword */
    json_t *schema = json_pack("{s:s}", "type", "object");
    assert_int_equal(oq_jschema_compile(schema, &s, NULL), 0);
    assert_true(json_equal((json_t *)oq_jschema_source(s), schema));
    assert_int_equal(oq_jschema_validate(s, a, NULL), 0);
    assert_int_equal(oq_jschema_validate(s, NULL, NULL), OQ_EINVAL);
    oq_jschema_destroy(s);
    oq_jschema_destroy(NULL);
    json_decref(schema);
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_suite_valid),         cmocka_unit_test(test_suite_refused),
        cmocka_unit_test(test_compile_depth_bound), cmocka_unit_test(test_step_budget),
        cmocka_unit_test(test_depth_budget),        cmocka_unit_test(test_equal_and_source),
        cmocka_unit_test(test_utf8_cuts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
