/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The MCP gateway's logic without HTTP (producer/mcp.c, issue 20 items 2-3): version
 * negotiation, the session table (required, bounded: the least recently used goes when it is
 * full), transport refusals (Origin, Accept, batches, parse errors), SSE framing, and the
 * CallToolResult of each terminal state (succeeded, failed with its code, needs_review,
 * running at the deadline). The HTTP side and the submit: tests/integration/test_mcp.sh.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "oq_mcp.h"

static json_t *post(oq_mcp_t *m, const oq_mcp_in_t *in, const char *body, oq_mcp_out_t *o)
{
    oq_mcp_call_t *call = NULL;
    assert_int_equal(oq_mcp_post(m, in, body, strlen(body), 32, &call, o), 0);
    assert_null(call);
    json_t *j = o->body && o->body[0] == '{' ? json_loads(o->body, 0, NULL) : NULL;
    return j;
}

static void open_session(oq_mcp_t *m, const char *version, char sid[OQ_MCP_SID_LEN + 1],
                         const char *expect)
{
    oq_mcp_in_t in = {0};
    oq_mcp_out_t o;
    char body[200];
    snprintf(body, sizeof body,
             "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":"
             "{\"protocolVersion\":\"%s\"}}",
             version);
    json_t *j = post(m, &in, body, &o);
    assert_int_equal(o.status, 200);
    assert_int_equal(strlen(o.session), OQ_MCP_SID_LEN);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(j, "result"), "protocolVersion")),
        expect);
    memcpy(sid, o.session, OQ_MCP_SID_LEN + 1);
    json_decref(j);
    free(o.body);
}

static int ping_status(oq_mcp_t *m, const char *sid)
{
    oq_mcp_in_t in = {.session = sid};
    oq_mcp_out_t o;
    json_t *j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}", &o);
    json_decref(j);
    free(o.body);
    return (int)o.status;
}

static void test_sessions(void **state)
{
    (void)state;
    oq_mcp_t *m = NULL;
    assert_int_equal(oq_mcp_new(NULL, 0, &m, NULL), 0);
    assert_int_equal(oq_mcp_wait_ms(m), OQ_MCP_WAIT_DEFAULT_MS);
    char first[OQ_MCP_SID_LEN + 1], sid[OQ_MCP_SID_LEN + 1], sid2[OQ_MCP_SID_LEN + 1];
    open_session(m, "2025-06-18", first, "2025-06-18");
    open_session(m, "2025-11-25", sid2, "2025-11-25");
    assert_string_not_equal(first, sid2);
    open_session(m, "2024-11-05", sid, "2025-11-25"); /* unsupported: the latest */
    assert_int_equal(ping_status(m, first), 200);
    assert_int_equal(ping_status(m, NULL), 400);
    assert_int_equal(ping_status(m, "0123456789abcdef0123456789abcdef"), 404);
    /* bounded: 4096 sessions; opening that many more evicts the least recently used */
    assert_int_equal(ping_status(m, sid2), 200); /* sid2 used after first and sid */
    for (int i = 0; i < 4096; i++)
        open_session(m, "2025-06-18", sid, "2025-06-18");
    assert_int_equal(ping_status(m, first), 404);
    assert_int_equal(ping_status(m, sid), 200);
    /* DELETE ends one */
    oq_mcp_in_t in = {.session = sid};
    oq_mcp_out_t o;
    oq_mcp_delete(m, &in, &o);
    assert_int_equal(o.status, 200);
    free(o.body);
    assert_int_equal(ping_status(m, sid), 404);
    oq_mcp_delete(m, &in, &o);
    assert_int_equal(o.status, 404);
    free(o.body);
    oq_mcp_destroy(m);
}

static void test_transport(void **state)
{
    (void)state;
    oq_mcp_t *m = NULL;
    assert_int_equal(oq_mcp_new(NULL, 0, &m, NULL), 0);
    char sid[OQ_MCP_SID_LEN + 1];
    open_session(m, "2025-06-18", sid, "2025-06-18");
    oq_mcp_out_t o;
    oq_mcp_in_t in = {.session = sid, .origin = "http://evil.example", .host = "127.0.0.1:8081"};
    json_t *j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}", &o);
    assert_int_equal(o.status, 403);
    json_decref(j);
    free(o.body);
    in.origin = "http://127.0.0.1:8081"; /* the Host itself */
    j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}", &o);
    assert_int_equal(o.status, 200);
    json_decref(j);
    free(o.body);
    /* DNS rebinding: a page at a name pointed at 127.0.0.1 sends Origin == Host == that name;
     * without authentication it is refused, and 127.evil.example is not loopback */
    in.origin = "http://rebind.example:8081";
    in.host = "rebind.example:8081";
    j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}", &o);
    assert_int_equal(o.status, 403);
    json_decref(j);
    free(o.body);
    in.origin = "http://127.evil.example";
    in.host = "127.0.0.1:8081";
    j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}", &o);
    assert_int_equal(o.status, 403);
    json_decref(j);
    free(o.body);
    in.origin = NULL;
    j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"id\":2,", &o);
    assert_int_equal(o.status, 400);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "error"), "code")),
                     -32700);
    json_decref(j);
    free(o.body);
    j = post(m, &in, "[{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}]", &o);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "error"), "code")),
                     -32600);
    json_decref(j);
    free(o.body);
    j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"nope\"}", &o);
    assert_int_equal(o.status, 200);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "error"), "code")),
                     -32601);
    json_decref(j);
    free(o.body);
    j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", &o);
    assert_int_equal(o.status, 202);
    assert_null(o.body);
    in.proto = "2030-01-01";
    j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}", &o);
    assert_int_equal(o.status, 400);
    json_decref(j);
    free(o.body);
    in.proto = "2025-11-25";
    in.accept = "text/event-stream";
    j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}", &o);
    assert_int_equal(o.status, 200);
    assert_string_equal(o.ctype, "text/event-stream");
    assert_string_equal(o.body,
                        "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n");
    free(o.body);
    in.accept = "text/html";
    j = post(m, &in, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}", &o);
    assert_int_equal(o.status, 406);
    json_decref(j);
    free(o.body);
    oq_mcp_destroy(m);
}

/* A tools/call prepared (no catalogue: any tool), then answered for each state. */
static json_t *answer(oq_mcp_t *m, const char *sid, const char *st, const char *result,
                      const char *error)
{
    oq_mcp_in_t in = {.session = sid};
    oq_mcp_out_t o;
    oq_mcp_call_t *call = NULL;
    const char *body =
        "{\"jsonrpc\":\"2.0\",\"id\":\"r-1\",\"method\":\"tools/call\",\"params\":"
        "{\"name\":\"charge\",\"arguments\":{\"amount\":1},\"idempotencyKey\":\"k\"}}";
    assert_int_equal(oq_mcp_post(m, &in, body, strlen(body), 32, &call, &o), 1);
    assert_non_null(oq_mcp_call_job(call));
    oq_call_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.call_id, sizeof c.call_id, "c_0123456789abcdef0123456789abcdef");
    snprintf(c.state, sizeof c.state, "%s", st);
    c.result = (char *)result;
    c.error = (char *)error;
    oq_mcp_call_answer(call, 0, &c, &o);
    oq_mcp_call_free(call);
    json_t *j = json_loads(o.body, 0, NULL);
    free(o.body);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "r-1");
    json_t *r = json_incref(json_object_get(j, "result"));
    json_decref(j);
    assert_non_null(r);
    return r;
}

static void test_results(void **state)
{
    (void)state;
    oq_mcp_t *m = NULL;
    assert_int_equal(oq_mcp_new(NULL, 1500, &m, NULL), 0);
    assert_int_equal(oq_mcp_wait_ms(m), 1500);
    char sid[OQ_MCP_SID_LEN + 1];
    open_session(m, "2025-06-18", sid, "2025-06-18");
    json_t *r = answer(m, sid, "succeeded", "{\"charged\":1}", NULL);
    assert_true(json_is_false(json_object_get(r, "isError")));
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(r, "structuredContent"), "charged")), 1);
    json_decref(r);
    r = answer(m, sid, "succeeded", "[1,2]", NULL); /* not an object: wrapped */
    assert_int_equal(
        json_array_size(json_object_get(json_object_get(r, "structuredContent"), "result")), 2);
    json_decref(r);
    r = answer(m, sid, "failed", NULL,
               "{\"code\":\"card_declined\",\"message\":\"no\",\"retryable\":false}");
    json_t *sc = json_object_get(r, "structuredContent");
    assert_true(json_is_true(json_object_get(r, "isError")));
    assert_string_equal(json_string_value(json_object_get(sc, "status")), "failed");
    assert_string_equal(json_string_value(json_object_get(json_object_get(sc, "error"), "code")),
                        "card_declined");
    json_decref(r);
    r = answer(m, sid, "needs_review", NULL, NULL);
    sc = json_object_get(r, "structuredContent");
    assert_true(json_is_true(json_object_get(r, "isError")));
    assert_string_equal(json_string_value(json_object_get(sc, "status")), "needs_review");
    assert_string_equal(json_string_value(json_object_get(sc, "call_id")),
                        "c_0123456789abcdef0123456789abcdef");
    json_decref(r);
    r = answer(m, sid, "pending", NULL, NULL);
    sc = json_object_get(r, "structuredContent");
    assert_true(json_is_true(json_object_get(r, "isError")));
    assert_string_equal(json_string_value(json_object_get(sc, "status")), "running");
    json_decref(r);
    oq_mcp_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sessions),
        cmocka_unit_test(test_transport),
        cmocka_unit_test(test_results),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
