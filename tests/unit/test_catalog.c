/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/catalog.c: the tool catalogue read from the tools file (names, input_schema,
 * annotations, keys and lookups), its load errors, the check of a call's arguments, the JSON
 * list GET /v1/tools serves, the compiled tools' entries (each names a tool the consumer's
 * registry has), and the consumer's HTTP tools parser reading the same file through it.
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

#include "http_tools.h"
#include "oq_catalog.h"
#include "oq_consumer.h"

static const char good[] =
    "{\"version\":1,\"tools\":[{\"name\":\"pay\",\"description\":\"Pay someone\","
    "\"url\":\"http://127.0.0.1:1/pay\",\"idempotent\":true,"
    "\"lookup\":{\"url\":\"http://127.0.0.1:1/pay?k={effect_id}\"},"
    "\"input_schema\":{\"type\":\"object\",\"properties\":{"
    "\"amount\":{\"type\":\"integer\",\"minimum\":1},"
    "\"currency\":{\"enum\":[\"EUR\",\"USD\"]}},"
    "\"required\":[\"amount\",\"currency\"],\"additionalProperties\":false},"
    "\"annotations\":{\"title\":\"Pay\",\"destructiveHint\":false,\"idempotentHint\":true}},"
    "{\"name\":\"ping\",\"url\":\"http://127.0.0.1:1/ping\"}]}";

static oq_catalog_t *parse_good(void)
{
    oq_catalog_t *c = NULL;
    oq_error_t err = {0};
    int rc = oq_catalog_parse(good, strlen(good), "t.json", &c, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    return c;
}

static void test_check(void **state)
{
    (void)state;
    oq_catalog_t *c = parse_good();
    assert_true(oq_catalog_has(c, "pay"));
    assert_true(oq_catalog_has(c, "ping"));
    assert_true(oq_catalog_has(c, "charge")); /* compiled tools are known */
    assert_false(oq_catalog_has(c, "nope"));
    assert_int_equal(oq_catalog_size(c), 6);
    oq_jschema_violation_t v;
    json_t *ok = json_pack("{s:i,s:s}", "amount", 5, "currency", "EUR");
    json_t *bad = json_pack("{s:i,s:s}", "amount", 0, "currency", "EUR");
    json_t *extra = json_pack("{s:i,s:s,s:b}", "amount", 5, "currency", "EUR", "x", 1);
    json_t *charge_bad = json_pack("{s:s}", "amount", "5");
    json_t *any = json_pack("{s:[]}", "whatever");
    json_t *notobj = json_pack("[]");
    assert_int_equal(oq_catalog_check(c, "pay", ok, &v), 0);
    assert_int_equal(oq_catalog_check(c, "pay", bad, &v), OQ_EINVAL);
    assert_string_equal(v.pointer, "/amount");
    assert_string_equal(v.keyword, "minimum");
    assert_int_equal(oq_catalog_check(c, "pay", extra, &v), OQ_EINVAL);
    assert_string_equal(v.pointer, "/x");
    assert_int_equal(oq_catalog_check(c, "ping", any, &v), 0); /* no schema: any object */
    assert_int_equal(oq_catalog_check(c, "ping", notobj, &v), OQ_EINVAL);
    assert_string_equal(v.pointer, "");
    assert_int_equal(oq_catalog_check(c, "charge", charge_bad, &v), OQ_EINVAL);
    assert_string_equal(v.pointer, "/amount");
    assert_int_equal(oq_catalog_check(c, "nope", ok, &v), OQ_ENOTFOUND);
    json_decref(ok);
    json_decref(bad);
    json_decref(extra);
    json_decref(charge_bad);
    json_decref(any);
    json_decref(notobj);
    oq_catalog_destroy(c);
}

static void test_list(void **state)
{
    (void)state;
    oq_catalog_t *c = parse_good();
    json_t *l = oq_catalog_list(c);
    assert_non_null(l);
    assert_int_equal(json_array_size(l), 6);
    json_t *pay = json_array_get(l, 0), *ping = json_array_get(l, 1), *ch = json_array_get(l, 2);
    assert_string_equal(json_string_value(json_object_get(pay, "name")), "pay");
    assert_string_equal(json_string_value(json_object_get(pay, "description")), "Pay someone");
    assert_true(json_is_true(json_object_get(pay, "honours_keys")));
    assert_true(json_is_true(json_object_get(pay, "has_lookup")));
    assert_string_equal(json_string_value(json_object_get(pay, "kind")), "http");
    assert_non_null(json_object_get(
        json_object_get(json_object_get(pay, "input_schema"), "properties"), "amount"));
    assert_true(
        json_is_true(json_object_get(json_object_get(pay, "annotations"), "idempotentHint")));
    assert_string_equal(json_string_value(json_object_get(ping, "description")), "");
    assert_false(json_is_true(json_object_get(ping, "honours_keys")));
    assert_false(json_is_true(json_object_get(ping, "has_lookup")));
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(ping, "input_schema"), "type")),
        "object");
    assert_int_equal(json_object_size(json_object_get(ping, "annotations")), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "name")), "charge");
    assert_string_equal(json_string_value(json_object_get(ch, "kind")), "compiled");
    assert_true(json_is_true(json_object_get(ch, "honours_keys")));
    json_decref(l);
    oq_catalog_destroy(c);
}

/* Every compiled entry names a tool of the consumer's registry, and an empty file lists them. */
static void test_compiled_entries(void **state)
{
    (void)state;
    oq_catalog_t *c = NULL;
    assert_int_equal(oq_catalog_parse("{\"tools\":[]}", 12, "e.json", &c, NULL), 0);
    json_t *l = oq_catalog_list(c);
    assert_int_equal(json_array_size(l), 4);
    size_t i;
    json_t *t;
    json_array_foreach(l, i, t)
    {
        const char *name = json_string_value(json_object_get(t, "name"));
        assert_non_null(oq_tool_find(name));
    }
    json_decref(l);
    oq_catalog_destroy(c);
}

#define TOOL(extra) "{\"tools\":[{\"name\":\"t\",\"url\":\"http://h/x\"" extra "}]}"

static const struct {
    const char *text;
    const char *needle;
} bad_files[] = {
    {TOOL(",\"input_schema\":{\"properties\":{\"a\":{\"contains\":{}}}}"),
     "t.json: tool \"t\" (tools[0]): field input_schema: at /properties/a/contains: keyword "
     "\"contains\" is not supported"},
    {TOOL(",\"input_schema\":{\"pattern\":\"(\"}"),
     "field input_schema: at /pattern: not a POSIX extended regular expression"},
    {TOOL(",\"input_schema\":{\"$ref\":\"#/$defs/x\"}"), "field input_schema: $ref"},
    {TOOL(",\"input_schema\":3"), "field input_schema: at the root: expected a schema"},
    {TOOL(",\"annotations\":[]"), "field annotations: expected an object"},
    {TOOL(",\"annotations\":{\"readOnlyHint\":1}"),
     "field annotations.readOnlyHint: expected true or false"},
    {TOOL(",\"annotations\":{\"title\":true}"), "field annotations.title: expected a string"},
    {TOOL(",\"annotations\":{\"colour\":\"red\"}"), "field annotations.colour: unknown field"},
    {TOOL(",\"description\":5"), "field description: expected a string"},
    {TOOL(",\"colour\":1"), "tool \"t\" (tools[0]): field colour: unknown field"},
    {"{\"tools\":[{\"name\":\"charge\",\"url\":\"http://h/x\"}]}",
     "tool \"charge\" is declared there and compiled into onceq"},
    {"{\"tools\":[{\"name\":\"t\"},{\"name\":\"t\"}]}", "field name: declared twice"},
    {"{\"tools\":[{\"url\":\"x\"}]}", "tools[0]: field name: missing"},
    {"{\"tools\":[", "t.json: line 1"},
    {"{\"tools\":[],\"x\":1}", "field x: unknown field"},
};

static void test_load_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        oq_catalog_t *c = NULL;
        oq_error_t err = {0};
        int rc = oq_catalog_parse(bad_files[i].text, strlen(bad_files[i].text), "t.json", &c, &err);
        if (rc != OQ_EINVAL || !strstr(err.msg, bad_files[i].needle)) {
            fprintf(stderr, "case %zu: rc %d, \"%s\", want \"%s\"\n", i, rc, err.msg,
                    bad_files[i].needle);
            fail();
        }
        assert_null(c);
        /* the consumer reads the same file through the catalogue: the same error */
        oq__http_tools_t *t = NULL;
        oq_error_t err2 = {0};
        assert_int_equal(
            oq__http_tools_parse(bad_files[i].text, strlen(bad_files[i].text), "t.json", &t, &err2),
            OQ_EINVAL);
        assert_non_null(strstr(err2.msg, bad_files[i].needle));
    }
}

/* The consumer's parser accepts the catalogue's fields and keeps the catalogue. */
static void test_http_tools_through_catalog(void **state)
{
    (void)state;
    oq__http_tools_t *t = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq__http_tools_parse(good, strlen(good), "t.json", &t, &err), 0);
    assert_int_equal(t->n, 2);
    assert_string_equal(t->tools[0].name, "pay");
    assert_true(t->tools[0].idempotent);
    assert_true(t->tools[0].has_lookup);
    assert_non_null(t->catalog);
    assert_true(oq_catalog_has(t->catalog, "pay"));
    oq__http_tools_destroy(t);
}

/* The producer reads the catalogue only: a secret header's variable or file, or a TLS file,
 * need not exist where the producer runs (the consumer still refuses them at load). */
static void test_no_secrets_read(void **state)
{
    (void)state;
    static const char text[] =
        "{\"tools\":[{\"name\":\"t\",\"url\":\"https://h/x\","
        "\"headers\":{\"Authorization\":{\"env\":\"OQ_TEST_UNSET_VAR_4711\"}},"
        "\"ca_file\":\"/nonexistent/ca.pem\"}]}";
    oq_catalog_t *c = NULL;
    assert_int_equal(oq_catalog_parse(text, strlen(text), "t.json", &c, NULL), 0);
    assert_true(oq_catalog_has(c, "t"));
    oq_catalog_destroy(c);
    oq__http_tools_t *t = NULL;
    assert_int_equal(oq__http_tools_parse(text, strlen(text), "t.json", &t, NULL), OQ_EINVAL);
}

static void test_load_file(void **state)
{
    (void)state;
    char path[] = "/tmp/oq_catalog_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(good, f);
    fclose(f);
    oq_catalog_t *c = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_catalog_load(path, &c, &err), 0);
    assert_true(oq_catalog_has(c, "pay"));
    oq_catalog_destroy(c);
    unlink(path);
    assert_int_equal(oq_catalog_load(path, &c, &err), OQ_EIO);
    oq_catalog_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_compiled_entries),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_http_tools_through_catalog),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_no_secrets_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
