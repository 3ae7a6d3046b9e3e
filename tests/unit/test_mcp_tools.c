/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tools of kind "mcp" (consumer/mcp_tools.c, common/mcpc.c): the tools-file translation (the
 * JSON-RPC body with the effect id as idempotencyKey, _meta key and id; the headers; the
 * lookup as a tools/call whose 2xx is read, never a path in the envelope; refused fields), the
 * reading of an answer in JSON and in SSE, and the classification of answers into the HTTP
 * tools' classes as a table.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dispatch.h"
#include "http_tools.h"
#include "mcp_tools.h"
#include "oq_mcpc.h"

#define EID "e_0123456789abcdef0123456789abcdef"

static const char *const file_text =
    "{\"version\":1,\"tools\":["
    "{\"name\":\"pay\",\"kind\":\"mcp\",\"url\":\"http://127.0.0.1:9/mcp\",\"tool\":\"make\","
    "\"idempotent\":true,\"object_id\":\"/id\"},"
    "{\"name\":\"ref\",\"kind\":\"mcp\",\"url\":\"http://127.0.0.1:9/mcp\","
    "\"lookup\":{\"tool\":\"find\",\"arguments\":{\"reference\":\"{effect_id}\"},"
    "\"exists\":\"/id\",\"settle_ms\":500}}]}";

static oq__http_tools_t *load(const char *text, oq_error_t *err)
{
    oq__http_tools_t *t = NULL;
    if (oq__http_tools_parse(text, strlen(text), "t.json", &t, err) != 0) return NULL;
    return t;
}

static int has_header(const oq__http_request_t *r, const char *line)
{
    for (size_t i = 0; i < r->nheaders; i++)
        if (strcmp(r->headers[i], line) == 0) return 1;
    return 0;
}

static void test_translation(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq__http_tools_t *t = load(file_text, &err);
    assert_non_null(t);
    const oq__http_tool_t *pay = oq__http_tools_find(t, "pay");
    assert_non_null(pay);
    assert_non_null(pay->mcp);
    assert_true(pay->idempotent);
    assert_string_equal(pay->idem_header, "Idempotency-Key");
    assert_string_equal(pay->call.method, "POST");
    assert_null(pay->call.object_id); /* read from the JSON-RPC result, not the envelope */
    assert_false(pay->has_lookup);
    assert_true(has_header(&pay->call, "Accept: application/json, text/event-stream"));
    assert_true(has_header(&pay->call, "Mcp-Session-Id:")); /* none yet: not sent */
    json_t *args = json_pack("{s:i}", "amount", 5);
    char *body = NULL;
    size_t n = 0;
    assert_int_equal(oq__http_build_body(&pay->call, "pay", args, EID, &body, &n, &err), 0);
    json_t *b = json_loadb(body, n, 0, NULL);
    assert_non_null(b);
    assert_string_equal(json_string_value(json_object_get(b, "method")), "tools/call");
    assert_string_equal(json_string_value(json_object_get(b, "id")), EID);
    json_t *p = json_object_get(b, "params");
    assert_string_equal(json_string_value(json_object_get(p, "name")), "make");
    assert_string_equal(json_string_value(json_object_get(p, "idempotencyKey")), EID);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(p, "_meta"), "io.onceq/idempotency-key")),
        EID);
    assert_true(json_equal(json_object_get(p, "arguments"), args));
    json_decref(b);
    free(body);

    const oq__http_tool_t *ref = oq__http_tools_find(t, "ref");
    assert_non_null(ref);
    assert_false(ref->idempotent);
    assert_true(ref->has_lookup);
    assert_int_equal(ref->settle_ms, 500);
    assert_string_equal(ref->lookup.method, "POST");
    assert_null(ref->lookup.exists);
    assert_int_equal(ref->lookup.nrules, 1);
    assert_int_equal(ref->lookup.rules[0].cls, OQ__HTTP_FOUND);
    assert_int_equal(oq__http_build_body(&ref->lookup, "ref", args, EID, &body, &n, &err), 0);
    b = json_loadb(body, n, 0, NULL);
    p = json_object_get(b, "params");
    assert_string_equal(json_string_value(json_object_get(p, "name")), "find");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(p, "arguments"), "reference")), EID);
    assert_null(json_object_get(p, "idempotencyKey"));
    json_decref(b);
    free(body);
    json_decref(args);
    oq__http_tools_destroy(t);
}

static void test_bad_files(void **state)
{
    (void)state;
    static const struct {
        const char *tool, *field;
    } cases[] = {
        {"{\"name\":\"x\",\"kind\":\"mcp\"}", "url"},
        {"{\"name\":\"x\",\"kind\":\"mcp\",\"url\":\"ftp://h/mcp\"}", "url"},
        {"{\"name\":\"x\",\"kind\":\"mcp\",\"url\":\"http://h/mcp\",\"body\":\"args\"}", "body"},
        {"{\"name\":\"x\",\"kind\":\"mcp\",\"url\":\"http://h/mcp\",\"success\":[200]}", "success"},
        {"{\"name\":\"x\",\"kind\":\"mcp\",\"url\":\"http://h/mcp\",\"tool\":7}", "tool"},
        {"{\"name\":\"x\",\"kind\":\"mcp\",\"url\":\"http://h/mcp\",\"lookup\":{\"tool\":\"f\","
         "\"arguments\":{}}}",
         "lookup.exists"},
        {"{\"name\":\"x\",\"kind\":\"mcp\",\"url\":\"http://h/mcp\",\"lookup\":{\"url\":\"u\"}}",
         "lookup"},
        {"{\"name\":\"x\",\"kind\":\"ftp\",\"url\":\"http://h/mcp\"}", "kind"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"version\":1,\"tools\":[%s]}", cases[i].tool);
        oq_error_t err = {0};
        oq__http_tools_t *t = load(text, &err);
        if (t) fprintf(stderr, "case %zu parsed\n", i);
        assert_null(t);
        char want[64];
        snprintf(want, sizeof want, "field %s:", cases[i].field);
        if (!strstr(err.msg, want)) fprintf(stderr, "case %zu: %s\n", i, err.msg);
        assert_non_null(strstr(err.msg, want));
        assert_non_null(strstr(err.msg, "\"x\""));
    }
}

static void test_answer_reading(void **state)
{
    (void)state;
    json_t *id = json_string(EID);
    const char *json = "{\"jsonrpc\":\"2.0\",\"id\":\"" EID "\",\"result\":{\"isError\":false}}";
    json_t *a = oq__mcpc_answer(json, strlen(json), id);
    assert_non_null(a);
    json_decref(a);
    const char *sse = "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/"
                      "message\",\"params\":{}}\r\n\r\nid: 7\nevent: message\ndata: "
                      "{\"jsonrpc\":\"2.0\",\ndata: \"id\":\"" EID "\",\"result\":{\"x\":1}}\n";
    a = oq__mcpc_answer(sse, strlen(sse), id); /* split data lines, no final blank line */
    assert_non_null(a);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(a, "result"), "x")), 1);
    json_decref(a);
    const char *other = "{\"jsonrpc\":\"2.0\",\"id\":\"e_other\",\"result\":{}}";
    assert_null(oq__mcpc_answer(other, strlen(other), id));
    assert_null(oq__mcpc_answer("event: message\ndata: {\"jsonrpc\"", 31, id));
    json_decref(id);
}

/* The class of an answer with HTTP status \p status and body \p body, classified by the
 * executor as \p cls first (what the status rules say), refined into \p a. */
static oq__http_class_t classify(const oq__http_tool_t *tool, int lookup, oq__http_class_t cls,
                                 long status, const char *body, oq__mcp_answer_t *a)
{
    oq__http_outcome_t o;
    memset(&o, 0, sizeof o);
    o.cls = cls;
    o.status = status;
    o.body = body;
    o.body_len = body ? strlen(body) : 0;
    o.body_bytes = (int64_t)o.body_len + 1000; /* (say, an event stream's framing) */
    o.effect_id = EID;
    o.tool = tool;
    oq__mcp_refine(tool, lookup, &o, a);
    return a->h.cls;
}

#define RES(r) "{\"jsonrpc\":\"2.0\",\"id\":\"" EID "\",\"result\":" r "}"
#define ERR(c)                                                                                     \
    "{\"jsonrpc\":\"2.0\",\"id\":\"" EID "\",\"error\":{\"code\":" c ",\"message\":\"m\"}}"

static void test_classes(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq__http_tools_t *t = load(file_text, &err);
    const oq__http_tool_t *pay = oq__http_tools_find(t, "pay"),
                          *ref = oq__http_tools_find(t, "ref");
    static const struct {
        int lookup;
        oq__http_class_t in;
        long status;
        const char *body;
        oq__http_class_t want;
        const char *code;
    } rows[] = {
        {0, OQ__HTTP_SUCCESS, 200, RES("{\"structuredContent\":{\"id\":\"p1\"},\"isError\":false}"),
         OQ__HTTP_SUCCESS, ""},
        {0, OQ__HTTP_SUCCESS, 200,
         RES("{\"content\":[{\"type\":\"text\",\"text\":\"no\"}],"
             "\"isError\":true}"),
         OQ__HTTP_FINAL, "tool_error"},
        {0, OQ__HTTP_SUCCESS, 200, ERR("-32602"), OQ__HTTP_FINAL, "mcp_error_-32602"},
        {0, OQ__HTTP_SUCCESS, 200, ERR("-32603"), OQ__HTTP_UNKNOWN, "mcp_error_-32603"},
        {0, OQ__HTTP_SUCCESS, 200, "event: message\ndata: {\"jsonrpc\"", OQ__HTTP_UNKNOWN,
         "mcp_no_answer"},
        {0, OQ__HTTP_SUCCESS, 202, NULL, OQ__HTTP_UNKNOWN, "mcp_no_answer"},
        {0, OQ__HTTP_FINAL, 404, "{}", OQ__HTTP_RETRYABLE, "mcp_session"},
        {0, OQ__HTTP_FINAL, 400, "{}", OQ__HTTP_RETRYABLE, "mcp_session"},
        {0, OQ__HTTP_UNKNOWN, 0, NULL, OQ__HTTP_UNKNOWN, "x"},     /* HTTP said it: kept */
        {0, OQ__HTTP_RETRYABLE, 0, NULL, OQ__HTTP_RETRYABLE, "x"}, /* not sent: kept */
        {1, OQ__HTTP_FOUND, 200, RES("{\"structuredContent\":{\"id\":\"p1\"}}"), OQ__HTTP_FOUND,
         "found"},
        {1, OQ__HTTP_FOUND, 200, RES("{\"structuredContent\":{\"id\":null}}"), OQ__HTTP_ABSENT,
         "not_in_answer"},
        {1, OQ__HTTP_FOUND, 200, RES("{\"isError\":true}"), OQ__HTTP_UNDECIDED, "tool_error"},
        {1, OQ__HTTP_FOUND, 200, ERR("-32601"), OQ__HTTP_UNDECIDED, "mcp_error_-32601"},
        {1, OQ__HTTP_UNDECIDED, 404, "{}", OQ__HTTP_UNDECIDED, "mcp_session"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        oq__mcp_answer_t a;
        oq__http_class_t got = classify(rows[i].lookup ? ref : pay, rows[i].lookup, rows[i].in,
                                        rows[i].status, rows[i].body, &a);
        const char *code = a.h.code ? a.h.code : "";
        if (got != rows[i].want || (strcmp(rows[i].code, "x") && strcmp(code, rows[i].code)))
            fprintf(stderr, "row %zu: %s %s\n", i, oq__http_class_name(got), code);
        assert_int_equal(got, rows[i].want);
        if (strcmp(rows[i].code, "x") != 0) assert_string_equal(code, rows[i].code);
        if (i == 0) { /* the result is the CallToolResult, the object id from structuredContent */
            assert_string_equal(a.h.object_id, "p1");
            json_t *r = json_loadb(a.h.body, a.h.body_len, 0, NULL);
            assert_non_null(json_object_get(r, "structuredContent"));
            json_decref(r);
            /* the HTTP body's size is not the result's: an omitted result counts its own */
            assert_int_equal(a.h.body_bytes, 0);
        }
        if (i == 10) assert_string_equal(a.h.object_id ? a.h.object_id : "", "");
        oq__mcp_answer_clear(&a);
    }
    oq__http_tools_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translation),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_answer_reading),
        cmocka_unit_test(test_classes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
