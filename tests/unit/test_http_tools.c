/* SPDX-License-Identifier: Apache-2.0 */
/*
 * HTTP tools: the tools-file parser on the example file, on defaults and on a table of bad
 * files (each error must name the tool and the field); URL and body expansion; JSON paths;
 * the outcome classification as a table (status rules, specificity, sent / not sent); and
 * the executor against raw TCP peers on 127.0.0.1 that misbehave in exact ways (close after
 * the whole request, never read a large body, read and never answer, reset after the
 * headers), so "sent" is checked on real sockets, not assumed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "dispatch.h"
#include "http_tools.h"
#include "oq_json.h"
#include "oq_log.h"
#include "oq_util.h"

static oq__http_tools_t *parse_ok(const char *text)
{
    oq_error_t err = {0};
    oq__http_tools_t *t = NULL;
    int rc = oq__http_tools_parse(text, strlen(text), "t.json", &t, &err);
    if (rc != 0) fprintf(stderr, "unexpected parse error: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_non_null(t);
    return t;
}

/* --- parser ------------------------------------------------------------------------------ */

static void test_example_file(void **state)
{
    (void)state;
    const char *data = getenv("ONCEQ_TESTDATA");
    char path[4096];
    snprintf(path, sizeof path, "%s/../../examples/tools.json", data ? data : "tests/data");
    oq_error_t err = {0};
    oq__http_tools_t *t = NULL;
    int rc = oq__http_tools_load(path, &t, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(t->n, 4);

    const oq__http_tool_t *pay = oq__http_tools_find(t, "pay");
    assert_non_null(pay);
    assert_string_equal(pay->call.method, "POST");
    assert_int_equal(pay->call.body_mode, OQ__HTTP_BODY_TEMPLATE);
    assert_string_equal(pay->idem_header, "Idempotency-Key");
    assert_true(pay->idempotent);
    assert_true(pay->has_lookup);
    assert_string_equal(pay->lookup.method, "GET");
    assert_string_equal(pay->lookup.object_id, "/id"); /* inherited from the call */
    assert_int_equal(pay->lookup.timeout_ms, pay->call.timeout_ms);

    const oq__http_tool_t *ex = oq__http_tools_find(t, "pay_explicit");
    assert_non_null(ex);
    assert_int_equal(ex->call.body_mode, OQ__HTTP_BODY_ARGS);
    assert_int_equal(ex->call.nheaders, 1);
    assert_string_equal(ex->call.headers[0], "X-Client: onceq");
    assert_int_equal(ex->call.connect_timeout_ms, 2000);
    assert_int_equal(ex->call.timeout_ms, 10000);

    const oq__http_tool_t *ref = oq__http_tools_find(t, "pay_by_reference");
    assert_non_null(ref);
    assert_null(ref->idem_header);
    assert_false(ref->idempotent);
    assert_true(ref->has_lookup);
    assert_int_equal(ref->call.timeout_ms, 5000);

    const oq__http_tool_t *blind = oq__http_tools_find(t, "pay_blind");
    assert_non_null(blind);
    assert_false(blind->has_lookup);
    assert_null(blind->idem_header);
    assert_null(oq__http_tools_find(t, "nope"));
    oq__http_tools_destroy(t);
}

static void test_defaults(void **state)
{
    (void)state;
    oq__http_tools_t *t =
        parse_ok("{\"tools\":[{\"name\":\"t\",\"url\":\"http://127.0.0.1:1/x\"},"
                 "{\"name\":\"g\",\"method\":\"GET\",\"url\":\"http://h/{id}\"}]}");
    const oq__http_tool_t *x = &t->tools[0];
    assert_string_equal(x->call.method, "POST");
    assert_int_equal(x->call.body_mode, OQ__HTTP_BODY_ARGS);
    assert_string_equal(x->idem_header, "Idempotency-Key");
    assert_false(x->idempotent);
    assert_false(x->has_lookup);
    assert_string_equal(x->call.object_id, "/id");
    assert_int_equal(x->call.connect_timeout_ms, 2000);
    assert_int_equal(x->call.timeout_ms, 10000);
    assert_int_equal(x->call.nrules, 4); /* 2xx, 4xx, 429, 503:retry-after */
    assert_int_equal(t->tools[1].call.body_mode, OQ__HTTP_BODY_NONE);
    oq__http_tools_destroy(t);
}

#define TOOL(extra) "{\"tools\":[{\"name\":\"t\",\"url\":\"http://h/x\"" extra "}]}"
#define LOOKUP(extra) TOOL(",\"lookup\":{\"url\":\"http://h/y?k={effect_id}\"" extra "}")

static const struct {
    const char *text;
    const char *needle; /* must occur in the error message */
} bad_files[] = {
    {"{\"tools\":[", "t.json: line 1"},
    {"[]", "expected an object"},
    {"{\"tools\":[],\"tools\":[]}", "t.json"}, /* duplicate key */
    {"{\"tools\":[],\"extra\":1}", "field extra: unknown field"},
    {"{\"version\":2,\"tools\":[]}", "field version: only version 1"},
    {"{\"tools\":{}}", "field tools: expected an array"},
    {"{\"tools\":[{\"url\":\"http://h/x\"}]}", "tools[0]: field name: missing"},
    {"{\"tools\":[{\"name\":\"a b\",\"url\":\"http://h/x\"}]}", "field name: use 1-64"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"http://h/x\"},{\"name\":\"t\",\"url\":\"http://h/\"}]}",
     "tool \"t\" (tools[1]): field name: declared twice"},
    {TOOL(",\"colour\":1"), "tool \"t\" (tools[0]): field colour: unknown field"},
    {"{\"tools\":[{\"name\":\"t\"}]}", "tool \"t\" (tools[0]): field url: missing"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"ftp://h/x\"}]}", "field url: must start with http"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"http://h/{a-b}\"}]}", "field url: bad placeholder"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"http://h/a b\"}]}", "field url: contains white"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"http://h/{a\"}]}", "field url: '{' without '}'"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"http://h/a}\"}]}", "field url: '}' without '{'"},
    {TOOL(",\"method\":\"FETCH\""), "field method: \"FETCH\" is not one of"},
    {TOOL(",\"method\":\"GET\",\"body\":\"args\""), "field body: a GET carries no body"},
    {TOOL(",\"body\":5"), "field body: expected \"args\""},
    {TOOL(",\"body\":{\"a\":\"{x y}\"}"), "field body: bad placeholder"},
    {TOOL(",\"idempotent\":true,\"idempotency_header\":null"), "field idempotent: true needs"},
    {TOOL(",\"idempotent\":\"yes\""), "field idempotent: expected true or false"},
    {TOOL(",\"idempotency_header\":\"Bad Header\""), "field idempotency_header"},
    {TOOL(",\"timeout_ms\":0"), "field timeout_ms: expected an integer"},
    {TOOL(",\"connect_timeout_ms\":5000,\"timeout_ms\":1000"), "field connect_timeout_ms: longer"},
    {TOOL(",\"success\":[600]"), "field success[0]: status 600"},
    {TOOL(",\"final\":[\"6xx\"]"), "field final[0]"},
    {TOOL(",\"retryable\":\"429\""), "field retryable: expected an array"},
    {TOOL(",\"final\":[\"2xx\"]"), "field final[0]: status rule listed twice"},
    {TOOL(",\"retryable\":[429,429]"), "field retryable[1]: status rule listed twice"},
    {TOOL(",\"headers\":{\"Bad Name\":\"x\"}"), "field headers.Bad Name: not a valid header"},
    {TOOL(",\"headers\":{\"X-A\":\"a\\r\\nB: c\"}"), "field headers.X-A: expected a one-line"},
    {TOOL(",\"headers\":{\"Content-Length\":\"1\"}"), "field headers.Content-Length: set by"},
    {TOOL(",\"headers\":{\"idempotency-key\":\"1\"}"), "is the idempotency header"},
    {TOOL(",\"object_id\":\"\""), "field object_id: empty path"},
    {TOOL(",\"lookup\":[]"), "field lookup: expected an object"},
    {TOOL(",\"lookup\":{}"), "field lookup.url: missing"},
    {TOOL(",\"lookup\":{\"url\":\"http://h/all\"}"), "field lookup.url: needs a placeholder"},
    {LOOKUP(",\"method\":\"POST\""), "field lookup.method: a lookup must be a GET"},
    {LOOKUP(",\"bogus\":1"), "field lookup.bogus: unknown field"},
    {LOOKUP(",\"found\":[200],\"absent\":[200]"), "field lookup.absent[0]: status rule listed"},
    {LOOKUP(",\"timeout_ms\":-5"), "field lookup.timeout_ms"},
    /* header templates: checked like the URL's; {args} cannot fill a header */
    {TOOL(",\"headers\":{\"X-A\":\"{a-b}\"}"), "field headers.X-A: bad placeholder"},
    {TOOL(",\"headers\":{\"X-A\":\"x{a\"}"), "field headers.X-A: '{' without '}'"},
    {TOOL(",\"headers\":{\"X-A\":\"{args}\"}"), "field headers.X-A: {args} is the whole"},
    {LOOKUP(",\"headers\":{\"X-A\":\"a}\"}"), "field lookup.headers.X-A: '}' without '{'"},
    /* secrets: read at load; errors name the tool, the header and the source */
    {TOOL(",\"headers\":{\"Authorization\":{\"env\":\"OQ_TEST_UNSET_VAR_4711\"}}"),
     "tool \"t\" (tools[0]): field headers.Authorization: environment variable "
     "OQ_TEST_UNSET_VAR_4711 is not set"},
    {TOOL(",\"headers\":{\"Authorization\":{\"env\":\"OQ_TEST_EMPTY_VAR\"}}"),
     "field headers.Authorization: environment variable OQ_TEST_EMPTY_VAR is empty"},
    {TOOL(",\"headers\":{\"Authorization\":{\"env\":\"OQ_TEST_CRLF_VAR\"}}"),
     "field headers.Authorization: environment variable OQ_TEST_CRLF_VAR holds a control"},
    {TOOL(",\"headers\":{\"X-Key\":{\"file\":\"/nonexistent/pay.key\"}}"),
     "tool \"t\" (tools[0]): field headers.X-Key: cannot read file /nonexistent/pay.key"},
    {LOOKUP(",\"headers\":{\"X-Key\":{\"file\":\"/nonexistent/k\"}}"),
     "field lookup.headers.X-Key: cannot read file /nonexistent/k"},
    {TOOL(",\"headers\":{\"X-Key\":{\"env\":\"A\",\"file\":\"/f\"}}"),
     "field headers.X-Key: a secret names one source"},
    {TOOL(",\"headers\":{\"X-Key\":{}}"), "field headers.X-Key: a secret names one source"},
    {TOOL(",\"headers\":{\"X-Key\":{\"env\":\"A-B\"}}"), "field headers.X-Key: env: expected"},
    {TOOL(",\"headers\":{\"X-Key\":{\"vault\":\"x\"}}"), "field headers.X-Key.vault: unknown"},
    {TOOL(",\"headers\":{\"X-Key\":5}"), "field headers.X-Key: expected a one-line string"},
    /* TLS files: https only, checked readable (and PEM) at load */
    {TOOL(",\"ca_file\":\"/etc/hostname\""), "field ca_file: TLS settings need an https:// url"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"https://h/x\",\"ca_file\":\"/nonexistent/ca.pem\"}]}",
     "tool \"t\" (tools[0]): field ca_file: cannot read /nonexistent/ca.pem"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"https://h/x\",\"client_cert\":\"/nonexistent/"
     "c.pem\"}]}",
     "field client_cert: cannot read /nonexistent/c.pem"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"https://h/x\",\"client_key\":\"/nonexistent/"
     "k.pem\"}]}",
     "field client_key: needs client_cert"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"https://h/x\",\"ca_file\":\"\"}]}",
     "field ca_file: expected a non-empty string"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"https://h/x\",\"ca_file\":\"/dev/null\"}]}",
     "field ca_file: /dev/null is not a PEM file"},
    {"{\"tools\":[{\"name\":\"t\",\"url\":\"https://h/x\",\"client_cert\":\"/dev/null\","
     "\"lookup\":{\"url\":\"http://h/{effect_id}\"}}]}",
     "field client_cert: TLS settings need an https:// url (lookup.url"},
};

static void test_bad_files(void **state)
{
    (void)state;
    setenv("OQ_TEST_EMPTY_VAR", "", 1);
    setenv("OQ_TEST_CRLF_VAR", "tok\r\nX-Evil: SECRET-PART", 1);
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        oq_error_t err = {0};
        oq__http_tools_t *t = NULL;
        int rc =
            oq__http_tools_parse(bad_files[i].text, strlen(bad_files[i].text), "t.json", &t, &err);
        if (rc != OQ_EINVAL || !strstr(err.msg, bad_files[i].needle))
            fprintf(stderr, "case %zu: %s\n  rc=%d msg=%s\n  wanted: %s\n", i, bad_files[i].text,
                    rc, err.msg, bad_files[i].needle);
        assert_int_equal(rc, OQ_EINVAL);
        assert_null(t);
        assert_non_null(strstr(err.msg, bad_files[i].needle));
        assert_null(strstr(err.msg, "SECRET-PART")); /* a secret value is never shown */
    }
}

/* {idem_key} is the effect id under its old name: it still works, with a warning at load. */
static void test_idem_key_alias(void **state)
{
    (void)state;
    oq__http_tools_t *t = parse_ok(LOOKUP(""));
    assert_int_equal(t->nwarnings, 0);
    oq__http_tools_destroy(t);
    t = parse_ok("{\"tools\":[{\"name\":\"a\",\"url\":\"http://h/{idem_key}\"},"
                 "{\"name\":\"b\",\"url\":\"http://h/\",\"body\":{\"k\":\"{idem_key}\"},"
                 "\"headers\":{\"X-K\":\"{idem_key}\"}},"
                 "{\"name\":\"c\",\"url\":\"http://h/{effect_id}\"}]}");
    assert_int_equal(t->nwarnings, 2); /* one per tool that uses it */
    oq__http_tools_destroy(t);
}

static void test_load_missing_file(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq__http_tools_t *t = NULL;
    assert_int_equal(oq__http_tools_load("/nonexistent/tools.json", &t, &err), OQ_EIO);
    assert_null(t);
    assert_non_null(strstr(err.msg, "/nonexistent/tools.json"));
}

/* --- expansion ----------------------------------------------------------------------------- */

static json_t *js(const char *text)
{
    json_t *v = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_json_parse(text, strlen(text), 32, &v, &err), 0);
    return v;
}

static void test_expand_url(void **state)
{
    (void)state;
    json_t *args = js("{\"s\":\"a b/c?&=\",\"n\":5,\"f\":1.5,\"b\":true,\"o\":{},\"z\":null}");
    oq_error_t err = {0};
    char *u = NULL;
    assert_int_equal(oq__http_expand_url("http://h/{s}/{n}?f={f}&b={b}&e={effect_id}&k={idem_key}"
                                         "&t={tool}&x={missing?}",
                                         "pay", args, "eff 1", &u, &err),
                     0);
    assert_string_equal(u,
                        "http://h/a%20b%2Fc%3F%26%3D/5?f=1.5&b=true&e=eff%201&k=eff%201&t=pay&x=");
    free(u);
    u = NULL;
    assert_int_equal(oq__http_expand_url("http://h/{missing}", "pay", args, "e", &u, &err),
                     OQ_EINVAL);
    assert_non_null(strstr(err.msg, "missing argument missing"));
    assert_int_equal(oq__http_expand_url("http://h/{z}", "pay", args, "e", &u, &err), OQ_EINVAL);
    assert_int_equal(oq__http_expand_url("http://h/{o}", "pay", args, "e", &u, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "argument o"));
    assert_null(u);
    json_decref(args);
}

static void test_build_body(void **state)
{
    (void)state;
    oq__http_tools_t *t = parse_ok(
        "{\"tools\":[{\"name\":\"a\",\"url\":\"http://h/\"},"
        "{\"name\":\"b\",\"url\":\"http://h/\",\"body\":{\"amount\":\"{amount}\",\"cur\":"
        "\"{currency?}\",\"ref\":\"r-{effect_id}\",\"all\":\"{args}\",\"list\":[\"{amount}\","
        "\"{gone?}\",7],\"k\":\"{idem_key}\"}},"
        "{\"name\":\"c\",\"method\":\"DELETE\",\"url\":\"http://h/\"}]}");
    json_t *args = js("{\"b\":1,\"amount\":250}");
    oq_error_t err = {0};
    char *body = NULL;
    size_t len = 0;
    assert_int_equal(oq__http_build_body(&t->tools[0].call, "a", args, "e1", &body, &len, &err), 0);
    assert_string_equal(body, "{\"amount\":250,\"b\":1}"); /* canonical: sorted keys */
    assert_int_equal(len, strlen(body));
    free(body);
    assert_int_equal(oq__http_build_body(&t->tools[1].call, "b", args, "e1", &body, &len, &err), 0);
    assert_string_equal(body, "{\"all\":{\"amount\":250,\"b\":1},\"amount\":250,\"k\":\"e1\","
                              "\"list\":[250,7],\"ref\":\"r-e1\"}");
    char *again = NULL;
    assert_int_equal(oq__http_build_body(&t->tools[1].call, "b", args, "e1", &again, NULL, &err),
                     0);
    assert_string_equal(body, again); /* a resend carries the identical bytes */
    free(body);
    free(again);
    json_t *none = js("{\"b\":1}");
    body = NULL;
    assert_int_equal(oq__http_build_body(&t->tools[1].call, "b", none, "e1", &body, &len, &err),
                     OQ_EINVAL);
    assert_non_null(strstr(err.msg, "missing argument amount"));
    assert_null(body);
    assert_int_equal(oq__http_build_body(&t->tools[2].call, "c", args, "e1", &body, &len, &err), 0);
    assert_null(body); /* DELETE: no body by default */
    json_decref(none);
    json_decref(args);
    oq__http_tools_destroy(t);
}

static void test_json_path(void **state)
{
    (void)state;
    json_t *d =
        js("{\"id\":\"pay_1\",\"data\":[{\"id\":7,\"a/b\":\"s\",\"m~n\":\"t\"}],\"n\":null}");
    assert_string_equal(json_string_value(oq__http_json_path(d, "/id")), "pay_1");
    assert_string_equal(json_string_value(oq__http_json_path(d, "id")), "pay_1");
    assert_int_equal(json_integer_value(oq__http_json_path(d, "/data/0/id")), 7);
    assert_int_equal(json_integer_value(oq__http_json_path(d, "data.0.id")), 7);
    assert_string_equal(json_string_value(oq__http_json_path(d, "/data/0/a~1b")), "s");
    assert_string_equal(json_string_value(oq__http_json_path(d, "/data/0/m~0n")), "t");
    assert_ptr_equal(oq__http_json_path(d, "/"), d);
    assert_null(oq__http_json_path(d, "/data/1/id"));
    assert_null(oq__http_json_path(d, "/data/01"));
    assert_null(oq__http_json_path(d, "/id/x"));
    assert_null(oq__http_json_path(d, "/missing"));
    assert_true(json_is_null(oq__http_json_path(d, "n")));
    assert_null(oq__http_json_path(NULL, "/id"));
    json_decref(d);
}

/* --- classification table ------------------------------------------------------------------ */

typedef struct crow {
    int tool; /* 0: defaults, 1: custom rules */
    int is_lookup;
    int curl_code;
    int sent;
    long status;
    int retry_after;
    oq__http_class_t want;
    const char *code;
} crow_t;

static const crow_t class_rows[] = {
    /* default rules: success 2xx, final 4xx, retryable 429 and 503 with Retry-After */
    {0, 0, CURLE_OK, 1, 201, 0, OQ__HTTP_SUCCESS, "status_201"},
    {0, 0, CURLE_OK, 1, 200, 0, OQ__HTTP_SUCCESS, "status_200"},
    {0, 0, CURLE_OK, 1, 400, 0, OQ__HTTP_FINAL, "status_400"},
    {0, 0, CURLE_OK, 1, 404, 0, OQ__HTTP_FINAL, "status_404"},
    {0, 0, CURLE_OK, 1, 429, 0, OQ__HTTP_RETRYABLE, "status_429"},
    {0, 0, CURLE_OK, 1, 429, 1, OQ__HTTP_RETRYABLE, "status_429"},
    {0, 0, CURLE_OK, 1, 503, 1, OQ__HTTP_RETRYABLE, "status_503"},
    {0, 0, CURLE_OK, 1, 503, 0, OQ__HTTP_UNKNOWN, "undeclared_status_503"},
    {0, 0, CURLE_OK, 1, 500, 0, OQ__HTTP_UNKNOWN, "undeclared_status_500"},
    {0, 0, CURLE_OK, 1, 502, 1, OQ__HTTP_UNKNOWN, "undeclared_status_502"},
    {0, 0, CURLE_OK, 1, 302, 0, OQ__HTTP_UNKNOWN, "undeclared_status_302"},
    /* a status is definite even when the body was then cut off */
    {0, 0, CURLE_OPERATION_TIMEDOUT, 1, 201, 0, OQ__HTTP_SUCCESS, "status_201"},
    {0, 0, CURLE_RECV_ERROR, 1, 500, 0, OQ__HTTP_UNKNOWN, "undeclared_status_500"},
    /* no status: sent or not decides */
    {0, 0, CURLE_COULDNT_CONNECT, 0, 0, 0, OQ__HTTP_RETRYABLE, "connect_failed"},
    {0, 0, CURLE_COULDNT_RESOLVE_HOST, 0, 0, 0, OQ__HTTP_RETRYABLE, "dns_failed"},
    {0, 0, CURLE_OPERATION_TIMEDOUT, 0, 0, 0, OQ__HTTP_RETRYABLE, "timeout_before_send"},
    {0, 0, CURLE_SEND_ERROR, 0, 0, 0, OQ__HTTP_RETRYABLE, "not_sent_55"},
    {0, 0, CURLE_OPERATION_TIMEDOUT, 1, 0, 0, OQ__HTTP_UNKNOWN, "timeout_after_send"},
    {0, 0, CURLE_GOT_NOTHING, 1, 0, 0, OQ__HTTP_UNKNOWN, "closed_without_answer"},
    {0, 0, CURLE_RECV_ERROR, 1, 0, 0, OQ__HTTP_UNKNOWN, "connection_reset_after_send"},
    {0, 0, CURLE_SEND_ERROR, 1, 0, 0, OQ__HTTP_UNKNOWN, "connection_reset_after_send"},
    {0, 0, CURLE_ABORTED_BY_CALLBACK, 1, 0, 0, OQ__HTTP_UNKNOWN, "connection_lost_after_send"},
    /* a refused reconnect after a sent first attempt is still UNKNOWN: the first one left */
    {0, 0, CURLE_COULDNT_CONNECT, 1, 0, 0, OQ__HTTP_UNKNOWN, "error_after_send_7"},
    {0, 0, CURLE_URL_MALFORMAT, 0, 0, 0, OQ__HTTP_FINAL, "bad_url"},
    /* custom: success [200, 404], final [400, 422], retryable [429, "5xx", "503:retry-after"] */
    {1, 0, CURLE_OK, 1, 404, 0, OQ__HTTP_SUCCESS, "status_404"}, /* code beats class */
    {1, 0, CURLE_OK, 1, 201, 0, OQ__HTTP_UNKNOWN, "undeclared_status_201"},
    {1, 0, CURLE_OK, 1, 409, 0, OQ__HTTP_UNKNOWN, "undeclared_status_409"},
    {1, 0, CURLE_OK, 1, 422, 0, OQ__HTTP_FINAL, "status_422"},
    {1, 0, CURLE_OK, 1, 500, 0, OQ__HTTP_RETRYABLE, "status_500"},
    {1, 0, CURLE_OK, 1, 503, 0, OQ__HTTP_RETRYABLE, "status_503"},
    /* lookups (default found [200], absent [404]) */
    {0, 1, CURLE_OK, 1, 200, 0, OQ__HTTP_FOUND, "status_200"},
    {0, 1, CURLE_OK, 1, 404, 0, OQ__HTTP_ABSENT, "status_404"},
    {0, 1, CURLE_OK, 1, 410, 0, OQ__HTTP_UNDECIDED, "undeclared_status_410"},
    {0, 1, CURLE_OK, 1, 501, 0, OQ__HTTP_UNDECIDED, "undeclared_status_501"},
    {0, 1, CURLE_OK, 1, 503, 1, OQ__HTTP_UNDECIDED, "undeclared_status_503"},
    {0, 1, CURLE_COULDNT_CONNECT, 0, 0, 0, OQ__HTTP_UNDECIDED, "connect_failed"},
    {0, 1, CURLE_OPERATION_TIMEDOUT, 1, 0, 0, OQ__HTTP_UNDECIDED, "timeout_after_send"},
    {0, 1, CURLE_URL_MALFORMAT, 0, 0, 0, OQ__HTTP_UNDECIDED, "bad_url"},
};

static void test_classify_table(void **state)
{
    (void)state;
    oq__http_tools_t *t =
        parse_ok("{\"tools\":[{\"name\":\"d\",\"url\":\"http://h/\",\"lookup\":{\"url\":\"http://h/"
                 "{effect_id}\"}},"
                 "{\"name\":\"c\",\"url\":\"http://h/\",\"success\":[200,404],\"final\":[400,422],"
                 "\"retryable\":[429,\"5xx\",\"503:retry-after\"]}]}");
    for (size_t i = 0; i < sizeof class_rows / sizeof class_rows[0]; i++) {
        const crow_t *r = &class_rows[i];
        const oq__http_tool_t *tool = &t->tools[r->tool];
        oq__http_facts_t f = {r->is_lookup,
                              r->curl_code,
                              r->sent,
                              r->status,
                              r->curl_code == CURLE_OK,
                              r->retry_after,
                              r->retry_after ? 1000 : -1};
        char code[48] = "";
        oq__http_class_t got =
            oq__http_classify(r->is_lookup ? &tool->lookup : &tool->call, &f, code);
        if (got != r->want || strcmp(code, r->code) != 0)
            fprintf(stderr, "row %zu: got %s/%s, want %s/%s\n", i, oq__http_class_name(got), code,
                    oq__http_class_name(r->want), r->code);
        assert_int_equal(got, r->want);
        assert_string_equal(code, r->code);
    }
    oq__http_tools_destroy(t);
}

/* --- executor against raw TCP peers --------------------------------------------------------- */

enum {
    PEER_CLOSE_AFTER_REQUEST,
    PEER_NEVER_READ,
    PEER_READ_NEVER_ANSWER,
    PEER_RESET_AFTER_HEADERS,
    PEER_ANSWER_200 /* reads the request, answers 200 {"id":"p1"} */
};

typedef struct peer {
    int lfd, port, mode;
    atomic_int stop;
    pthread_t th;
    char got[8192]; /* the header block of the last request read */
} peer_t;

/* Reads one request (headers, then Content-Length bytes); with headers_only, stops after the
 * headers. Returns 0 when read, -1 on error or stop. */
static int read_request(peer_t *p, int fd, int headers_only)
{
    char buf[65536];
    size_t have = 0;
    long long need = -1, got_body = 0;
    char head[8192];
    size_t hl = 0;
    while (!atomic_load(&p->stop)) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 50) <= 0) continue;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return -1;
        if (need < 0) {
            size_t take = (size_t)n < sizeof head - 1 - hl ? (size_t)n : sizeof head - 1 - hl;
            memcpy(head + hl, buf, take);
            hl += take;
            head[hl] = '\0';
            char *end = strstr(head, "\r\n\r\n");
            if (!end) continue;
            snprintf(p->got, sizeof p->got, "%.*s", (int)(end + 4 - head), head);
            if (headers_only) return 0;
            char *cl = strcasestr(head, "content-length:");
            need = cl ? atoll(cl + 15) : 0;
            got_body =
                (long long)(hl - (size_t)(end + 4 - head)) + ((long long)n - (long long)take);
        } else {
            got_body += n;
        }
        have += (size_t)n;
        if (got_body >= need) return 0;
    }
    (void)have;
    return -1;
}

static void *peer_main(void *arg)
{
    peer_t *p = arg;
    int fd = -1;
    while (!atomic_load(&p->stop) && fd < 0) {
        struct pollfd pf = {p->lfd, POLLIN, 0};
        if (poll(&pf, 1, 50) > 0) fd = accept(p->lfd, NULL, NULL);
    }
    if (fd < 0) return NULL;
    if (p->mode == PEER_CLOSE_AFTER_REQUEST) {
        read_request(p, fd, 0);
    } else if (p->mode == PEER_READ_NEVER_ANSWER) {
        read_request(p, fd, 0);
        while (!atomic_load(&p->stop))
            usleep(10000);
    } else if (p->mode == PEER_NEVER_READ) {
        while (!atomic_load(&p->stop))
            usleep(10000);
    } else if (p->mode == PEER_ANSWER_200) {
        static const char ans[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                  "Content-Length: 11\r\nConnection: close\r\n\r\n{\"id\":\"p1\"}";
        if (read_request(p, fd, 0) == 0) (void)!write(fd, ans, sizeof ans - 1);
    } else if (p->mode == PEER_RESET_AFTER_HEADERS) {
        read_request(p, fd, 1);
        struct linger lg = {1, 0}; /* close with RST: the rest of the body is refused */
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(fd);
    return NULL;
}

static void peer_start(peer_t *p, int mode)
{
    memset(p, 0, sizeof *p);
    p->mode = mode;
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(p->lfd >= 0);
    int small = 4096; /* a small receive window, so an unread large body cannot all be sent */
    setsockopt(p->lfd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(p->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(p->lfd, 4), 0);
    socklen_t sl = sizeof sa;
    getsockname(p->lfd, (struct sockaddr *)&sa, &sl);
    p->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&p->th, NULL, peer_main, p), 0);
}

static void peer_stop(peer_t *p)
{
    atomic_store(&p->stop, 1);
    pthread_join(p->th, NULL);
    close(p->lfd);
}

typedef struct got {
    int n;
    oq__http_class_t cls;
    char code[48];
    char msg[256];
    int sent;
    long status;
} got_t;

static void on_outcome(const oq__http_outcome_t *o, void *ctx)
{
    got_t *g = ctx;
    g->n++;
    g->cls = o->cls;
    snprintf(g->code, sizeof g->code, "%s", o->code);
    snprintf(g->msg, sizeof g->msg, "%s", o->message ? o->message : "");
    g->sent = o->sent;
    g->status = o->status;
}

/* One call of a tool aimed at 127.0.0.1:port with a body of body_bytes; returns the outcome. */
static got_t call_once(int port, size_t body_bytes, int timeout_ms)
{
    char text[512];
    snprintf(text, sizeof text,
             "{\"tools\":[{\"name\":\"t\",\"url\":\"http://127.0.0.1:%d/pay\",\"body\":{\"pad\":"
             "\"{pad}\"},\"connect_timeout_ms\":%d,\"timeout_ms\":%d}]}",
             port, timeout_ms, timeout_ms);
    oq__http_tools_t *t = parse_ok(text);
    char *pad = malloc(body_bytes + 1);
    assert_non_null(pad);
    memset(pad, 'x', body_bytes);
    pad[body_bytes] = '\0';
    json_t *args = json_pack("{s:s}", "pad", pad);
    free(pad);
    oq_error_t err = {0};
    oq__http_exec_t *x = oq__http_exec_new(NULL, &err);
    assert_non_null(x);
    got_t g = {0};
    assert_int_equal(oq__http_exec_submit(x, &t->tools[0], args, "eff-1", on_outcome, &g, &err), 0);
    int64_t deadline = oq_mono_us() + 20 * 1000000LL;
    while (g.n == 0 && oq_mono_us() < deadline)
        assert_true(oq__http_exec_poll(x, 200, &err) >= 0);
    assert_int_equal(g.n, 1);
    assert_int_equal(oq__http_exec_pending(x), 0);
    oq__http_exec_destroy(x);
    assert_int_equal(g.n, 1); /* destroy does not call back twice */
    json_decref(args);
    oq__http_tools_destroy(t);
    return g;
}

static void test_exec_closed_after_request(void **state)
{
    (void)state;
    peer_t p;
    peer_start(&p, PEER_CLOSE_AFTER_REQUEST);
    got_t g = call_once(p.port, 100, 5000);
    peer_stop(&p);
    assert_int_equal(g.cls, OQ__HTTP_UNKNOWN);
    assert_string_equal(g.code, "closed_without_answer");
    assert_true(g.sent);
}

static void test_exec_timeout_after_send(void **state)
{
    (void)state;
    peer_t p;
    peer_start(&p, PEER_READ_NEVER_ANSWER);
    got_t g = call_once(p.port, 100, 300);
    peer_stop(&p);
    assert_int_equal(g.cls, OQ__HTTP_UNKNOWN);
    assert_string_equal(g.code, "timeout_after_send");
    assert_true(g.sent);
}

static void test_exec_timeout_before_send(void **state)
{
    (void)state;
    peer_t p;
    peer_start(&p, PEER_NEVER_READ); /* 32 MiB cannot fit in the socket buffers */
    got_t g = call_once(p.port, 32u << 20, 300);
    peer_stop(&p);
    assert_int_equal(g.cls, OQ__HTTP_RETRYABLE);
    assert_string_equal(g.code, "timeout_before_send");
    assert_false(g.sent);
}

static void test_exec_reset_while_sending(void **state)
{
    (void)state;
    peer_t p;
    peer_start(&p, PEER_RESET_AFTER_HEADERS);
    got_t g = call_once(p.port, 32u << 20, 5000);
    peer_stop(&p);
    assert_int_equal(g.cls, OQ__HTTP_RETRYABLE);
    assert_false(g.sent);
}

static void test_exec_refused_and_bad_args(void **state)
{
    (void)state;
    /* a port that was just free: connection refused */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    int port = ntohs(sa.sin_port);
    close(fd);
    got_t g = call_once(port, 10, 2000);
    assert_int_equal(g.cls, OQ__HTTP_RETRYABLE);
    assert_string_equal(g.code, "connect_failed");
    assert_false(g.sent);

    /* bad arguments: FINAL bad_args from poll, never sent; lookup without one: OQ_ESTATE */
    oq__http_tools_t *t = parse_ok("{\"tools\":[{\"name\":\"t\",\"url\":\"http://127.0.0.1:1/"
                                   "{id}\"}]}");
    oq_error_t err = {0};
    oq__http_exec_t *x = oq__http_exec_new(NULL, &err);
    got_t b = {0};
    json_t *args = json_object();
    assert_int_equal(oq__http_exec_submit(x, &t->tools[0], args, "e", on_outcome, &b, &err), 0);
    assert_int_equal(b.n, 0); /* never called back from inside submit */
    assert_int_equal(oq__http_exec_poll(x, 0, &err), 1);
    assert_int_equal(b.n, 1);
    assert_int_equal(b.cls, OQ__HTTP_FINAL);
    assert_string_equal(b.code, "bad_args");
    assert_false(b.sent);
    assert_int_equal(oq__http_exec_lookup(x, &t->tools[0], args, "e", on_outcome, &b, &err),
                     OQ_ESTATE);
    assert_int_equal(oq__http_exec_submit(x, &t->tools[0], NULL, NULL, on_outcome, &b, &err),
                     OQ_EINVAL);
    /* destroy with queued work: each request called back exactly once */
    got_t q = {0};
    json_t *ok = json_pack("{s:s}", "id", "x");
    for (int i = 0; i < 5; i++)
        assert_int_equal(oq__http_exec_submit(x, &t->tools[0], ok, "e", on_outcome, &q, &err), 0);
    assert_int_equal(oq__http_exec_pending(x), 5);
    oq__http_exec_destroy(x);
    assert_int_equal(q.n, 5);
    assert_int_equal(q.cls, OQ__HTTP_RETRYABLE);
    assert_string_equal(q.code, "abandoned");
    json_decref(ok);
    json_decref(args);
    oq__http_tools_destroy(t);
}

/* Header templates are expanded per request; secrets from the environment and from a file
 * are read once at load and sent as they are: all of them reach the downstream. */
static void test_exec_headers(void **state)
{
    (void)state;
    char path[] = "/tmp/oq_test_secretXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "filekey-123\n", 12), 12);
    close(fd);
    setenv("OQ_TEST_PAY_TOKEN", "tok-abc", 1);
    setenv("OQ_TEST_BRACE", "{kept}", 1);
    peer_t p;
    peer_start(&p, PEER_ANSWER_200);
    char text[1024];
    snprintf(text, sizeof text,
             "{\"tools\":[{\"name\":\"t\",\"url\":\"http://127.0.0.1:%d/pay\",\"headers\":{"
             "\"X-Order\":\"o-{order}\",\"X-Trace\":\"{tool}/"
             "{effect_id}\",\"X-Opt\":\"[{gone?}]\",\"X-Empty\":\"{gone?}\","
             "\"Authorization\":{\"env\":\"OQ_TEST_PAY_TOKEN\",\"prefix\":\"Bearer \"},"
             "\"X-Api-Key\":{\"file\":\"%s\"},\"X-Brace\":{\"env\":\"OQ_TEST_BRACE\"}}}]}",
             p.port, path);
    oq__http_tools_t *t = parse_ok(text);
    unlink(path);
    setenv("OQ_TEST_PAY_TOKEN", "changed-after-load", 1); /* read at load: not seen */
    json_t *args = js("{\"order\":17}");
    oq_error_t err = {0};
    oq__http_exec_t *x = oq__http_exec_new(NULL, &err);
    assert_non_null(x);
    got_t g = {0};
    assert_int_equal(oq__http_exec_submit(x, &t->tools[0], args, "eff-9", on_outcome, &g, &err), 0);
    int64_t deadline = oq_mono_us() + 20 * 1000000LL;
    while (g.n == 0 && oq_mono_us() < deadline)
        assert_true(oq__http_exec_poll(x, 200, &err) >= 0);
    peer_stop(&p);
    assert_int_equal(g.n, 1);
    if (g.cls != OQ__HTTP_SUCCESS) fprintf(stderr, "outcome %s\n", g.code);
    assert_int_equal(g.cls, OQ__HTTP_SUCCESS);
    const char *want[] = {"\r\nX-Order: o-17\r\n",
                          "\r\nX-Trace: t/eff-9\r\n",
                          "\r\nX-Opt: []\r\n",
                          "\r\nAuthorization: Bearer tok-abc\r\n",
                          "\r\nX-Api-Key: filekey-123\r\n",
                          "\r\nX-Brace: {kept}\r\n",
                          "\r\nIdempotency-Key: eff-9\r\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (!strstr(p.got, want[i])) fprintf(stderr, "missing %s in:\n%s\n", want[i], p.got);
        assert_non_null(strstr(p.got, want[i]));
    }
    assert_null(strstr(p.got, "X-Empty")); /* expanded to nothing: not sent */
    /* an argument cannot break a header line, and a missing one fails: never sent */
    const char *bad[] = {"{\"order\":\"1\\r\\nX-Evil: 1\"}", "{}"};
    const char *why[] = {"header X-Order: an argument put a control character", "missing argument"};
    for (int i = 0; i < 2; i++) {
        json_t *a = js(bad[i]);
        got_t b = {0};
        assert_int_equal(oq__http_exec_submit(x, &t->tools[0], a, "eff-10", on_outcome, &b, &err),
                         0);
        assert_int_equal(oq__http_exec_poll(x, 0, &err), 1);
        assert_int_equal(b.cls, OQ__HTTP_FINAL);
        assert_string_equal(b.code, "bad_args");
        assert_false(b.sent);
        assert_non_null(strstr(b.msg, why[i]));
        json_decref(a);
    }
    oq__http_exec_destroy(x);
    json_decref(args);
    oq__http_tools_destroy(t);
}

/* --- many requests, kept-alive connections, reused handles ----------------------------------- */

#define KA_MAX_REQS 512
#define KA_MAX_CONNS 64

/* A peer that keeps connections alive and answers every request 200 {"id":"p1"}, after
 * 700 ms when its path starts with /slow; it keeps each request (head and body) in order. */
typedef struct ka_peer {
    int lfd, port;
    atomic_int stop;
    pthread_t th;
    char *reqs[KA_MAX_REQS];
    atomic_int nreqs;
    int conns;         /* connections accepted */
    int close;         /* KA_CLOSE_*: what the peer does after an answer */
    atomic_int closed; /* connections the peer closed after an answer */
} ka_peer_t;

enum {
    KA_KEEP = 0,       /* keeps the connection */
    KA_CLOSE_SAID = 1, /* answers "Connection: close" and closes */
    KA_CLOSE_IDLE = 2  /* closes the idle connection without a word */
};

/* Reads one whole request from \p fd (head, then Content-Length bytes) into a new string;
 * NULL when the connection ended first. */
static char *ka_read(ka_peer_t *p, int fd)
{
    size_t cap = 4096, len = 0;
    char *b = malloc(cap);
    assert_non_null(b);
    long long need = -1;
    while (!atomic_load(&p->stop)) {
        if (need >= 0 && (long long)len >= need) {
            b[len] = '\0';
            return b;
        }
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 50) <= 0) continue;
        if (len + 2048 > cap) {
            cap *= 2;
            b = realloc(b, cap);
            assert_non_null(b);
        }
        ssize_t n = recv(fd, b + len, cap - len - 1, 0);
        if (n <= 0) break;
        len += (size_t)n;
        b[len] = '\0';
        char *end = need < 0 ? strstr(b, "\r\n\r\n") : NULL;
        if (end) {
            char *cl = strcasestr(b, "\r\ncontent-length:");
            need = (long long)(end + 4 - b) + (cl && cl < end ? atoll(cl + 17) : 0);
        }
    }
    free(b);
    return NULL;
}

static void *ka_main(void *arg)
{
    ka_peer_t *p = arg;
    struct pollfd pf[KA_MAX_CONNS + 1];
    int n = 1;
    pf[0].fd = p->lfd;
    pf[0].events = POLLIN;
    while (!atomic_load(&p->stop)) {
        if (poll(pf, (nfds_t)n, 50) <= 0) continue;
        if ((pf[0].revents & POLLIN) && n <= KA_MAX_CONNS) {
            int fd = accept(p->lfd, NULL, NULL);
            if (fd >= 0) {
                pf[n].fd = fd;
                pf[n].events = POLLIN;
                pf[n++].revents = 0;
                p->conns++;
            }
        }
        for (int i = 1; i < n; i++) {
            if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char *r = ka_read(p, pf[i].fd);
            if (!r) { /* closed by the client */
                close(pf[i].fd);
                pf[i--] = pf[--n];
                continue;
            }
            if (strncmp(strchr(r, ' ') ? strchr(r, ' ') + 1 : r, "/slow", 5) == 0) usleep(700000);
            int k = atomic_load(&p->nreqs);
            if (k < KA_MAX_REQS) {
                p->reqs[k] = r;
                atomic_store(&p->nreqs, k + 1);
            } else {
                free(r);
            }
            static const char ans[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                      "Content-Length: 11\r\n\r\n{\"id\":\"p1\"}";
            static const char bye[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                      "Connection: close\r\nContent-Length: 11\r\n\r\n"
                                      "{\"id\":\"p1\"}";
            if (p->close == KA_CLOSE_SAID)
                (void)!write(pf[i].fd, bye, sizeof bye - 1);
            else
                (void)!write(pf[i].fd, ans, sizeof ans - 1);
            if (p->close != KA_KEEP) {
                close(pf[i].fd);
                pf[i--] = pf[--n];
                atomic_fetch_add(&p->closed, 1);
            }
        }
    }
    for (int i = 1; i < n; i++)
        close(pf[i].fd);
    return NULL;
}

static void ka_start_mode(ka_peer_t *p, int close_mode)
{
    memset(p, 0, sizeof *p);
    p->close = close_mode;
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(p->lfd >= 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(p->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(p->lfd, 128), 0);
    socklen_t sl = sizeof sa;
    getsockname(p->lfd, (struct sockaddr *)&sa, &sl);
    p->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&p->th, NULL, ka_main, p), 0);
}

static void ka_start(ka_peer_t *p)
{
    ka_start_mode(p, KA_KEEP);
}

static void ka_stop(ka_peer_t *p)
{
    atomic_store(&p->stop, 1);
    pthread_join(p->th, NULL);
    close(p->lfd);
    for (int i = 0; i < atomic_load(&p->nreqs); i++)
        free(p->reqs[i]);
}

/* Polls \p x until \p *n reaches \p want (20 s at most). */
static void poll_until(oq__http_exec_t *x, const int *n, int want)
{
    oq_error_t err = {0};
    int64_t deadline = oq_mono_us() + 20 * 1000000LL;
    while (*n < want && oq_mono_us() < deadline)
        assert_true(oq__http_exec_poll(x, 200, &err) >= 0);
    assert_int_equal(*n, want);
}

/* One transfer at a time reuses the same easy handle (and the kept-alive connection): the
 * second request must carry nothing of the first one's method, headers, body or timeout. */
static void test_exec_reused_handle(void **state)
{
    (void)state;
    ka_peer_t p;
    ka_start(&p);
    char text[1024];
    snprintf(text, sizeof text,
             "{\"tools\":["
             "{\"name\":\"a\",\"method\":\"PUT\",\"url\":\"http://127.0.0.1:%d/a\","
             "\"body\":{\"pad\":\"{pad}\"},\"headers\":{\"X-First\":\"yes\"},\"connect_timeout_"
             "ms\":300,\"timeout_ms\":300},"
             "{\"name\":\"b\",\"method\":\"POST\",\"url\":\"http://127.0.0.1:%d/slow/b\","
             "\"body\":\"none\",\"idempotency_header\":null,\"timeout_ms\":15000}]}",
             p.port, p.port);
    oq__http_tools_t *t = parse_ok(text);
    oq__http_exec_opts_t o = {.max_inflight = 1};
    oq_error_t err = {0};
    oq__http_exec_t *x = oq__http_exec_new(&o, &err);
    assert_non_null(x);
    json_t *args = js("{\"pad\":\"first-body\"}");
    got_t g[2];
    memset(g, 0, sizeof g);
    assert_int_equal(oq__http_exec_submit(x, &t->tools[0], args, "eff-a", on_outcome, &g[0], &err),
                     0);
    poll_until(x, &g[0].n, 1);
    assert_int_equal(g[0].cls, OQ__HTTP_SUCCESS);
    /* b: answered after 700 ms, more than a's 300 ms timeout */
    assert_int_equal(oq__http_exec_submit(x, &t->tools[1], args, "eff-b", on_outcome, &g[1], &err),
                     0);
    poll_until(x, &g[1].n, 1);
    if (g[1].cls != OQ__HTTP_SUCCESS) fprintf(stderr, "second request: %s\n", g[1].code);
    assert_int_equal(g[1].cls, OQ__HTTP_SUCCESS);
    oq__http_exec_destroy(x);
    assert_int_equal(atomic_load(&p.nreqs), 2);
    const char *a = p.reqs[0], *b = p.reqs[1];
    assert_true(strncmp(a, "PUT /a ", 7) == 0);
    assert_non_null(strstr(a, "\r\nX-First: yes\r\n"));
    assert_non_null(strstr(a, "\r\nIdempotency-Key: eff-a\r\n"));
    assert_non_null(strstr(a, "first-body"));
    if (strncmp(b, "POST /slow/b ", 13) != 0) fprintf(stderr, "second request:\n%s\n", b);
    assert_true(strncmp(b, "POST /slow/b ", 13) == 0);
    assert_null(strstr(b, "X-First"));
    assert_null(strstr(b, "Idempotency-Key"));
    assert_null(strstr(b, "first-body"));
    assert_non_null(strstr(b, "\r\nContent-Length: 0\r\n"));
    assert_int_equal(p.conns, 1); /* the connection was kept alive and reused */
    json_decref(args);
    ka_stop(&p);
    oq__http_tools_destroy(t);
}

/* One request after the other on a kept-alive connection: its socket stays in the executor's
 * epoll set between transfers (curl's REMOVE at the end of each is parked, its next IN costs
 * nothing), so twenty requests cost the two registrations of the connection, not two epoll_ctl
 * calls each. */
static void test_exec_keeps_sockets(void **state)
{
    (void)state;
    ka_peer_t p;
    ka_start(&p);
    char text[256];
    snprintf(text, sizeof text, "{\"tools\":[{\"name\":\"k\",\"url\":\"http://127.0.0.1:%d/k\"}]}",
             p.port);
    oq__http_tools_t *t = parse_ok(text);
    oq__http_exec_opts_t o = {.max_inflight = 1};
    oq_error_t err = {0};
    oq__http_exec_t *x = oq__http_exec_new(&o, &err);
    assert_non_null(x);
    json_t *args = json_object();
    enum { N = 20 };
    got_t g[N];
    memset(g, 0, sizeof g);
    for (int i = 0; i < N; i++) {
        char eid[32];
        snprintf(eid, sizeof eid, "k-%d", i);
        assert_int_equal(oq__http_exec_submit(x, &t->tools[0], args, eid, on_outcome, &g[i], &err),
                         0);
        poll_until(x, &g[i].n, 1);
        assert_int_equal(g[i].cls, OQ__HTTP_SUCCESS);
    }
    assert_int_equal(p.conns, 1);
    uint64_t ctls = oq__http_exec_epoll_ctls(x);
    if (ctls > 4)
        fprintf(stderr, "%d requests: %llu epoll_ctl calls\n", N, (unsigned long long)ctls);
    assert_true(ctls <= 4);
    oq__http_exec_destroy(x);
    json_decref(args);
    ka_stop(&p);
    oq__http_tools_destroy(t);
}

/* A peer that closes each connection after its answer, saying so or not: a parked socket that
 * becomes readable (end of stream) leaves the epoll set, curl finds the connection dead before
 * reusing it, and the next connection (often the same descriptor number) is watched as a new
 * one: every request succeeds, on a connection of its own. */
static void test_exec_peer_closes(void **state)
{
    (void)state;
    for (int mode = KA_CLOSE_SAID; mode <= KA_CLOSE_IDLE; mode++) {
        ka_peer_t p;
        ka_start_mode(&p, mode);
        char text[256];
        snprintf(text, sizeof text,
                 "{\"tools\":[{\"name\":\"c\",\"url\":\"http://127.0.0.1:%d/c\"}]}", p.port);
        oq__http_tools_t *t = parse_ok(text);
        oq__http_exec_opts_t o = {.max_inflight = 1};
        oq_error_t err = {0};
        oq__http_exec_t *x = oq__http_exec_new(&o, &err);
        assert_non_null(x);
        json_t *args = json_object();
        enum { N = 5 };
        got_t g[N];
        memset(g, 0, sizeof g);
        for (int i = 0; i < N; i++) {
            char eid[32];
            snprintf(eid, sizeof eid, "c-%d", i);
            /* the peer has closed the last connection before the next request is made */
            int64_t deadline = oq_mono_us() + 20 * 1000000LL;
            while (atomic_load(&p.closed) < i && oq_mono_us() < deadline)
                assert_true(oq__http_exec_poll(x, 20, &err) >= 0);
            assert_int_equal(atomic_load(&p.closed), i);
            (void)oq__http_exec_poll(x, 20, &err); /* (the end of stream, if not seen yet) */
            assert_int_equal(
                oq__http_exec_submit(x, &t->tools[0], args, eid, on_outcome, &g[i], &err), 0);
            poll_until(x, &g[i].n, 1);
            if (g[i].cls != OQ__HTTP_SUCCESS)
                fprintf(stderr, "mode %d request %d: %s %s\n", mode, i, g[i].code, g[i].msg);
            assert_int_equal(g[i].cls, OQ__HTTP_SUCCESS);
        }
        assert_int_equal(p.conns, N);
        oq__http_exec_destroy(x);
        json_decref(args);
        ka_stop(&p);
        oq__http_tools_destroy(t);
    }
}

typedef struct many {
    int n, ok, parsed;
} many_t;

static void on_many(const oq__http_outcome_t *o, void *ctx)
{
    many_t *m = ctx;
    m->n++;
    if (o->cls == OQ__HTTP_SUCCESS && o->object_id && strcmp(o->object_id, "p1") == 0) m->ok++;
    /* the answer is parsed once, for every reader */
    const char *id = json_string_value(json_object_get(o->doc, "id"));
    if (o->parsed && id && strcmp(id, "p1") == 0) m->parsed++;
}

static void *wake_later(void *arg)
{
    usleep(200000);
    oq__http_exec_wakeup(arg);
    return NULL;
}

/* A kept-alive peer started in \p p and one tool "m" that POSTs to it, its answer's /id the
 * object id. */
static oq__http_tools_t *ka_tool_m(ka_peer_t *p)
{
    ka_start(p);
    char text[512];
    snprintf(text, sizeof text,
             "{\"tools\":[{\"name\":\"m\",\"url\":\"http://127.0.0.1:%d/m/{effect_id}\","
             "\"object_id\":\"/id\"}]}",
             p->port);
    return parse_ok(text);
}

/* Many requests over many kept-alive connections, more than may run at once: every one is
 * called back once, with its answer parsed; a wake-up from another thread ends a poll early. */
static void test_exec_many(void **state)
{
    (void)state;
    ka_peer_t p;
    oq__http_tools_t *t = ka_tool_m(&p);
    oq__http_exec_opts_t o = {.max_inflight = 16};
    oq_error_t err = {0};
    oq__http_exec_t *x = oq__http_exec_new(&o, &err);
    assert_non_null(x);
    json_t *args = json_object();
    many_t m = {0};
    enum { N = 300 };
    for (int i = 0; i < N; i++) {
        char eid[32];
        snprintf(eid, sizeof eid, "e-%d", i);
        assert_int_equal(oq__http_exec_submit(x, &t->tools[0], args, eid, on_many, &m, &err), 0);
    }
    poll_until(x, &m.n, N);
    assert_int_equal(m.ok, N);
    assert_int_equal(m.parsed, N);
    assert_int_equal(oq__http_exec_pending(x), 0);
    assert_true(p.conns <= 16);
    /* nothing to do: a poll waits, and a wake-up from another thread ends it early */
    pthread_t th;
    int64_t t0 = oq_mono_us();
    assert_int_equal(pthread_create(&th, NULL, wake_later, x), 0);
    assert_int_equal(oq__http_exec_poll(x, 15000, &err), 0);
    assert_true(oq_mono_us() - t0 < 10 * 1000000LL);
    pthread_join(th, NULL);
    oq__http_exec_destroy(x);
    assert_int_equal(m.n, N);
    json_decref(args);
    ka_stop(&p);
    oq__http_tools_destroy(t);
}

/* The batch thread's wait while it may take no new message (consumer/worker.c): it ends at the
 * first done job, not at its timeout (a 5 ms nap there held every answer back up to 5 ms),
 * and with nothing out it lasts its timeout and says so. */
static void test_dispatch_wait_done(void **state)
{
    (void)state;
    ka_peer_t p;
    oq__http_tools_t *t = ka_tool_m(&p);
    oq__http_exec_opts_t o = {.max_inflight = 4};
    oq_error_t err = {0};
    oq__dispatch_t *d = oq__dispatch_new(&o, NULL, NULL, &err);
    assert_non_null(d);
    /* nothing out: the wait lasts its timeout */
    int64_t t0 = oq_mono_us();
    assert_int_equal(oq__dispatch_wait_done(d, 50), 0);
    int64_t waited = oq_mono_us() - t0;
    assert_true(waited >= 45000);
    assert_true(waited < 5 * 1000000LL);
    /* a request out: the wait ends when it is answered, long before its timeout */
    for (int round = 0; round < 3; round++) {
        oq__job_t *j = oq__job_new(OQ__JOB_CALL, &t->tools[0]);
        assert_non_null(j);
        j->args = json_object();
        j->row.effect_id = strdup("e-wait");
        assert_non_null(j->row.effect_id);
        t0 = oq_mono_us();
        oq__dispatch_send(d, j);
        assert_int_equal(oq__dispatch_wait_done(d, 20000), 1);
        assert_true(oq_mono_us() - t0 < 10 * 1000000LL);
        oq__job_t *done = oq__dispatch_take(d);
        assert_ptr_equal(done, j);
        assert_null(done->done_next);
        assert_int_equal(done->cls, OQ__HTTP_SUCCESS);
        oq__dispatch_forget(d, done);
        /* taken: the next wait has nothing done again */
        assert_int_equal(oq__dispatch_has_done(d), 0);
    }
    oq__dispatch_destroy(d);
    ka_stop(&p);
    oq__http_tools_destroy(t);
}

/* Transfers whose only way to end is curl's timer (a peer that reads and never answers), with
 * timeouts spread over many milliseconds and nothing else on the wire: each one must end, at
 * its timeout, as UNKNOWN timeout_after_send. (A timer remembered from curl's callback and
 * fired a little early on our clock was never told again: the rest waited for ever.) */
static void test_exec_timer_only(void **state)
{
    (void)state;
    peer_t p[6];
    oq__http_tools_t *t[6];
    oq_error_t err = {0};
    oq__http_exec_t *x = oq__http_exec_new(NULL, &err);
    assert_non_null(x);
    json_t *args = json_pack("{s:s}", "pad", "x");
    got_t g[6];
    memset(g, 0, sizeof g);
    for (int i = 0; i < 6; i++) {
        peer_start(&p[i], PEER_READ_NEVER_ANSWER);
        char text[512];
        snprintf(text, sizeof text,
                 "{\"tools\":[{\"name\":\"t\",\"url\":\"http://127.0.0.1:%d/pay\",\"body\":{"
                 "\"pad\":\"{pad}\"},\"connect_timeout_ms\":%d,\"timeout_ms\":%d}]}",
                 p[i].port, 97 + 37 * i, 97 + 37 * i);
        t[i] = parse_ok(text);
        assert_int_equal(
            oq__http_exec_submit(x, &t[i]->tools[0], args, "eff-t", on_outcome, &g[i], &err), 0);
    }
    int64_t deadline = oq_mono_us() + 20 * 1000000LL;
    int done = 0;
    while (done < 6 && oq_mono_us() < deadline) {
        assert_true(oq__http_exec_poll(x, 200, &err) >= 0);
        done = 0;
        for (int i = 0; i < 6; i++)
            done += g[i].n;
    }
    for (int i = 0; i < 6; i++) {
        assert_int_equal(g[i].n, 1);
        assert_int_equal(g[i].cls, OQ__HTTP_UNKNOWN);
        assert_string_equal(g[i].code, "timeout_after_send");
    }
    oq__http_exec_destroy(x);
    for (int i = 0; i < 6; i++) {
        peer_stop(&p[i]);
        oq__http_tools_destroy(t[i]);
    }
    json_decref(args);
}

int main(void)
{
    oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_file),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_load_missing_file),
        cmocka_unit_test(test_expand_url),
        cmocka_unit_test(test_build_body),
        cmocka_unit_test(test_json_path),
        cmocka_unit_test(test_classify_table),
        cmocka_unit_test(test_exec_closed_after_request),
        cmocka_unit_test(test_exec_timeout_after_send),
        cmocka_unit_test(test_exec_timeout_before_send),
        cmocka_unit_test(test_exec_reset_while_sending),
        cmocka_unit_test(test_exec_refused_and_bad_args),
        cmocka_unit_test(test_exec_headers),
        cmocka_unit_test(test_idem_key_alias),
        cmocka_unit_test(test_exec_reused_handle),
        cmocka_unit_test(test_exec_many),
        cmocka_unit_test(test_dispatch_wait_done),
        cmocka_unit_test(test_exec_keeps_sockets),
        cmocka_unit_test(test_exec_peer_closes),
        cmocka_unit_test(test_exec_timer_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
