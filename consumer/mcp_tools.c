/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mcp_tools.c: tools of kind "mcp", an upstream MCP server's tools/call behind onceq.
 *
 * Design. An "mcp" tool is an HTTP tool whose request is written for it: a POST of the JSON-RPC
 * request {"method": "tools/call", "params": {"name", "arguments": the call's args,
 * "idempotencyKey": effect_id, "_meta": {"io.onceq/idempotency-key": effect_id}}} (the id is
 * the effect id too) to the upstream's Streamable HTTP URL. oq__mcp_tool_translate() writes
 * that tool object and http_tools.c parses it like any other, so the request leaves through
 * the same executor and its "sent or not" classification is the HTTP tools' one (a connection
 * refused is RETRYABLE, an answer lost after the request left is UNKNOWN). What HTTP cannot
 * say is refined here from the JSON-RPC answer (oq__mcp_answer), into the same classes:
 *
 *   answer (HTTP 2xx, JSON or SSE)                     call                lookup
 *   result, isError false                              SUCCESS             FOUND if "exists"
 *                                                                          is set, else ABSENT
 *   result, isError true (the tool said no)            FINAL "tool_error"  UNDECIDED
 *   error -32700/-32600/-32601/-32602 (refused as      FINAL               UNDECIDED
 *     malformed: never processed)
 *   any other error (-32603, server-defined)           UNKNOWN             UNDECIDED
 *   no response with our id (cut off, not JSON-RPC)    UNKNOWN             UNDECIDED
 *   HTTP 400 or 404 (no session, or it expired: the    RETRYABLE           UNDECIDED
 *     transport refuses such a request unprocessed)
 *
 * So the execution protocol treats an upstream as it treats an HTTP downstream, by what the
 * tools file declares: "idempotent": true (the upstream honours idempotencyKey) gets an
 * UNKNOWN resent with the same key; a "lookup" (a read-only tool of the upstream, asked with
 * the effect id) reconciles; neither goes to NEEDS_REVIEW, never resent blind.
 *
 * Sessions. A stateful upstream answers initialize with an Mcp-Session-Id that every request
 * must repeat. It is opened lazily, on the dispatcher thread before a request leaves
 * (oq__mcp_before_send), and written into a header line of the tool's requests (only that
 * thread builds requests from them); a 400/404 answer drops it, and the next request opens a
 * new one. Opening blocks the dispatcher for at most 5 s, at most once a second while the
 * upstream is down; requests are still sent then (they fail to connect: RETRYABLE).
 */
#include "mcp_tools.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "oq_log.h"
#include "oq_mcpc.h"
#include "oq_util.h"

#define COMP "consumer"
#define META_KEY "io.onceq/idempotency-key"
#define SID_HEADER "Mcp-Session-Id"

struct oq__mcp_tool {
    char *url;
    char *object_id;             /* path in structuredContent, or NULL */
    char *exists;                /* lookup: path that must be set in structuredContent */
    char *lookup_object_id;      /* lookup: path of the object id */
    size_t sid_call, sid_lookup; /* index of the session header line in each request */
    int session_ok;              /* initialize succeeded (the upstream may have no sessions) */
    int64_t next_try_us;         /* no initialize before this */
};

/* --- the tools file --------------------------------------------------------------------------*/

static int fail(const char **field, char *why, size_t cap, const char *f, const char *msg)
{
    *field = f;
    snprintf(why, cap, "%s", msg);
    return OQ_EINVAL;
}

static json_t *rpc_body(const char *tool, json_t *arguments, int with_key)
{
    json_t *params = json_pack("{s:s,s:o}", "name", tool, "arguments", arguments);
    if (params && with_key) {
        json_object_set_new(params, "idempotencyKey", json_string("{effect_id}"));
        json_object_set_new(params, "_meta", json_pack("{s:s}", META_KEY, "{effect_id}"));
    }
    return params ? json_pack("{s:s,s:s,s:s,s:o}", "jsonrpc", "2.0", "id", "{effect_id}", "method",
                              "tools/call", "params", params)
                  : NULL;
}

/* A tool object for the HTTP parser: POST \p body to \p url, with \p o's headers, TLS files and
 * (unless \p t_over) timeouts. */
static json_t *http_object(const json_t *o, const char *url, json_t *body, const json_t *t_over)
{
    static const char *const copied[] = {
        "name", "ca_file", "client_cert", "client_key", "connect_timeout_ms", "timeout_ms", NULL};
    json_t *h = json_deep_copy(json_object_get(o, "headers"));
    if (!json_is_object(h)) {
        json_decref(h);
        h = json_object();
    }
    json_object_set_new(h, "Accept", json_string("application/json, text/event-stream"));
    json_object_set_new(h, "MCP-Protocol-Version", json_string(OQ_MCPC_VERSION));
    json_t *t =
        json_pack("{s:s,s:s,s:o,s:o}", "method", "POST", "url", url, "body", body, "headers", h);
    for (const char *const *k = copied; t && *k; k++) {
        const json_t *src = t_over && json_object_get(t_over, *k) ? t_over : o;
        json_t *v = json_object_get(src, *k);
        if (v) json_object_set(t, *k, v);
    }
    return t;
}

int oq__mcp_tool_translate(const json_t *o, json_t **call, json_t **lookup, const char **field,
                           char *why, size_t why_cap)
{
    static const char *const refused[] = {
        "method", "body", "idempotency_header", "success", "final", "retryable", NULL};
    *call = *lookup = NULL;
    for (const char *const *k = refused; *k; k++)
        if (json_object_get(o, *k))
            return fail(field, why, why_cap, *k,
                        "not for kind \"mcp\" (the request is the upstream's tools/call)");
    const char *url = json_string_value(json_object_get(o, "url"));
    if (!url || (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0))
        return fail(field, why, why_cap, "url", "expected the http(s) URL of an MCP server");
    const json_t *tv = json_object_get(o, "tool");
    if (tv && (!json_is_string(tv) || json_string_length(tv) == 0))
        return fail(field, why, why_cap, "tool", "expected the upstream's tool name");
    const char *upstream =
        tv ? json_string_value(tv) : json_string_value(json_object_get(o, "name"));
    const json_t *oid = json_object_get(o, "object_id");
    if (oid && !json_is_string(oid) && !json_is_null(oid))
        return fail(field, why, why_cap, "object_id", "expected a JSON pointer or a dotted path");
    const json_t *l = json_object_get(o, "lookup");
    if (l && !json_is_null(l)) {
        static const char *const lf[] = {"tool",      "arguments",  "exists",
                                         "object_id", "timeout_ms", "connect_timeout_ms",
                                         "settle_ms", NULL};
        if (!json_is_object(l))
            return fail(field, why, why_cap, "lookup",
                        "expected {\"tool\", \"arguments\", \"exists\"}");
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)l, k, v)
        {
            int ok = 0;
            for (const char *const *a = lf; *a; a++)
                ok |= strcmp(*a, k) == 0;
            if (!ok)
                return fail(field, why, why_cap, "lookup",
                            "unknown field (allowed for kind \"mcp\": tool, arguments, exists, "
                            "object_id, timeout_ms, connect_timeout_ms, settle_ms)");
        }
        if (!json_is_string(json_object_get(l, "tool")))
            return fail(field, why, why_cap, "lookup.tool", "expected the upstream's lookup tool");
        if (!json_is_object(json_object_get(l, "arguments")))
            return fail(field, why, why_cap, "lookup.arguments",
                        "expected an object template, e.g. {\"reference\": \"{effect_id}\"}");
        if (!json_is_string(json_object_get(l, "exists")))
            return fail(field, why, why_cap, "lookup.exists",
                        "expected the path in structuredContent that is set when found");
        const json_t *lo = json_object_get(l, "object_id");
        if (lo && !json_is_string(lo))
            return fail(field, why, why_cap, "lookup.object_id", "expected a path");
        if (json_object_get(l, "settle_ms") && !json_is_integer(json_object_get(l, "settle_ms")))
            return fail(field, why, why_cap, "lookup.settle_ms", "expected milliseconds");
        json_t *lb = rpc_body(json_string_value(json_object_get(l, "tool")),
                              json_deep_copy(json_object_get(l, "arguments")), 0);
        if (!lb || !(*lookup = http_object(o, url, lb, l))) goto nomem;
        json_object_set_new(*lookup, "idempotency_header", json_null());
    }
    json_t *b = rpc_body(upstream, json_string("{args}"), 1);
    if (!b || !(*call = http_object(o, url, b, NULL))) goto nomem;
    json_object_set_new(*call, "idempotency_header", json_string("Idempotency-Key"));
    json_t *idem = json_object_get(o, "idempotent");
    if (idem) json_object_set(*call, "idempotent", idem);
    return 0;
nomem:
    json_decref(*call);
    json_decref(*lookup);
    *call = *lookup = NULL;
    return fail(field, why, why_cap, "kind", "out of memory");
}

/* Appends the (empty: not sent) session header line to \p r; its index in \p idx. */
static int add_sid_line(oq__http_request_t *r, size_t *idx)
{
    char **h = realloc(r->headers, (r->nheaders + 1) * sizeof *h);
    if (!h) return OQ_ENOMEM;
    r->headers = h;
    unsigned char *k = realloc(r->header_kind, r->nheaders + 1);
    if (!k) return OQ_ENOMEM;
    r->header_kind = k;
    if (!(h[r->nheaders] = strdup(SID_HEADER ":"))) return OQ_ENOMEM;
    k[r->nheaders] = OQ__HTTP_HDR_SECRET; /* sent as it is, never expanded */
    *idx = r->nheaders++;
    return 0;
}

static char *dup_or_null(const json_t *v)
{
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

int oq__mcp_tool_bind(oq__http_tool_t *t, const json_t *o, oq__http_request_t *lookup_req,
                      oq_error_t *err)
{
    oq__mcp_tool_t *m = calloc(1, sizeof *m);
    if (!m || !(m->url = strdup(json_string_value(json_object_get(o, "url"))))) goto nomem;
    m->object_id = dup_or_null(json_object_get(o, "object_id"));
    /* the executor must not read paths in the JSON-RPC envelope: answers are read here */
    free(t->call.object_id);
    t->call.object_id = NULL;
    if (add_sid_line(&t->call, &m->sid_call)) goto nomem;
    if (lookup_req) {
        const json_t *l = json_object_get(o, "lookup");
        t->lookup = *lookup_req;
        memset(lookup_req, 0, sizeof *lookup_req);
        free(t->lookup.object_id);
        free(t->lookup.exists);
        t->lookup.object_id = t->lookup.exists = NULL;
        /* any 2xx is read here (FOUND / ABSENT / UNDECIDED); another status is UNDECIDED */
        t->lookup.rules[0] = (oq__http_rule_t){200, 299, 0, OQ__HTTP_FOUND};
        t->lookup.nrules = 1;
        t->has_lookup = 1;
        const json_t *s = json_object_get(l, "settle_ms");
        t->settle_ms = s ? json_integer_value(s) : t->call.timeout_ms;
        m->exists = dup_or_null(json_object_get(l, "exists"));
        m->lookup_object_id = dup_or_null(json_object_get(l, "object_id"));
        if (!m->lookup_object_id && m->object_id && !(m->lookup_object_id = strdup(m->object_id)))
            goto nomem;
        if (add_sid_line(&t->lookup, &m->sid_lookup)) goto nomem;
    }
    t->mcp = m;
    return 0;
nomem:
    oq__mcp_tool_free(m);
    return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
}

void oq__mcp_tool_free(oq__mcp_tool_t *m)
{
    if (!m) return;
    free(m->url);
    free(m->object_id);
    free(m->exists);
    free(m->lookup_object_id);
    free(m);
}

/* --- sessions --------------------------------------------------------------------------------*/

static void set_sid_line(oq__http_request_t *r, size_t idx, const char *sid)
{
    char line[OQ_MCPC_SID_MAX + 32];
    snprintf(line, sizeof line, SID_HEADER ":%s%s", sid[0] ? " " : "", sid);
    char *s = strdup(line);
    if (!s) return;
    free(r->headers[idx]);
    r->headers[idx] = s;
}

void oq__mcp_before_send(const oq__http_tool_t *t)
{
    oq__mcp_tool_t *m = t->mcp;
    if (!m || m->session_ok) return;
    int64_t now = oq_mono_us();
    if (now < m->next_try_us) return;
    /* the tool's own fixed header lines (credentials) go with initialize too */
    const char *lines[OQ__HTTP_MAX_RULES + 1];
    size_t n = 0;
    for (size_t i = 0; i < t->call.nheaders && n < OQ__HTTP_MAX_RULES; i++)
        if (i != m->sid_call && !strchr(t->call.headers[i], '{') &&
            strncasecmp(t->call.headers[i], "Accept:", 7) != 0 && /* initialize sends its own */
            strncasecmp(t->call.headers[i], "MCP-Protocol-Version:", 21) != 0)
            lines[n++] = t->call.headers[i];
    lines[n] = NULL;
    char sid[OQ_MCPC_SID_MAX];
    oq_error_t err = {0};
    int64_t to = t->call.timeout_ms < 5000 ? t->call.timeout_ms : 5000;
    if (oq__mcpc_initialize(m->url, lines, to, sid, &err) != 0) {
        m->next_try_us = oq_mono_us() + 1000000;
        OQ_LOG_WARN(COMP, "tool %s: no session with the MCP server: %s", t->name, err.msg);
        return;
    }
    set_sid_line((oq__http_request_t *)&t->call, m->sid_call, sid);
    if (t->has_lookup) set_sid_line((oq__http_request_t *)&t->lookup, m->sid_lookup, sid);
    m->session_ok = 1;
    OQ_LOG_INFO(COMP, "tool %s: MCP session %s with %s", t->name, sid[0] ? "open" : "(stateless)",
                m->url);
}

/* --- answers ---------------------------------------------------------------------------------*/

static void set(oq__mcp_answer_t *a, oq__http_class_t cls, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void set(oq__mcp_answer_t *a, oq__http_class_t cls, const char *code, const char *fmt, ...)
{
    va_list ap;
    a->h.cls = cls;
    snprintf(a->code, sizeof a->code, "%s", code);
    a->h.code = a->code;
    va_start(ap, fmt);
    vsnprintf(a->message, sizeof a->message, fmt, ap);
    va_end(ap);
    a->h.message = a->message;
}

static void object_id(oq__mcp_answer_t *a, const json_t *sc, const char *path)
{
    const json_t *v = path ? oq__http_json_path(sc, path) : NULL;
    if (json_is_string(v))
        snprintf(a->object_id, sizeof a->object_id, "%s", json_string_value(v));
    else if (json_is_integer(v))
        snprintf(a->object_id, sizeof a->object_id, "%lld", (long long)json_integer_value(v));
    else
        a->object_id[0] = '\0';
    a->h.object_id = a->object_id;
}

/* The answer's body becomes \p res (the CallToolResult), or none. */
static void body(oq__mcp_answer_t *a, const json_t *res)
{
    free(a->body);
    a->body = res ? json_dumps(res, JSON_COMPACT) : NULL;
    a->h.body = a->body;
    a->h.body_len = a->body ? strlen(a->body) : 0;
    a->h.body_bytes = 0; /* (the HTTP body's size is not this one's: body_len counts) */
    a->h.parsed = 0;     /* (a new body: read again) */
    a->h.doc = NULL;
}

/* The first text block of a CallToolResult (for messages). */
static const char *first_text(const json_t *res)
{
    size_t i;
    json_t *b;
    json_array_foreach(json_object_get(res, "content"), i, b)
    {
        const char *s = json_string_value(json_object_get(b, "text"));
        if (s) return s;
    }
    return "";
}

void oq__mcp_refine(const oq__http_tool_t *t, int lookup, const oq__http_outcome_t *o,
                    oq__mcp_answer_t *a)
{
    oq__mcp_tool_t *m = t ? t->mcp : NULL;
    memset(a, 0, sizeof *a);
    a->h = *o;
    if (!m) return;
    if (o->status == 400 || o->status == 404) { /* refused by the transport: not processed */
        m->session_ok = 0;
        body(a, NULL);
        set(a, lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_RETRYABLE, "mcp_session",
            "HTTP status %ld: the upstream refused the session (opened again before the next "
            "request)",
            o->status);
        return;
    }
    if (o->cls != (lookup ? OQ__HTTP_FOUND : OQ__HTTP_SUCCESS)) return; /* HTTP said it all */
    body(a, NULL);
    object_id(a, NULL, NULL);
    json_t *id = json_string(o->effect_id ? o->effect_id : "");
    json_t *ans = oq__mcpc_answer(o->body, o->body_len, id);
    json_decref(id);
    json_t *err = json_object_get(ans, "error");
    json_t *res = json_object_get(ans, "result");
    if (!ans || (!err && !json_is_object(res))) {
        set(a, lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_UNKNOWN, "mcp_no_answer",
            "HTTP %ld but no JSON-RPC response to the request (cut off?)", o->status);
    } else if (err) {
        json_int_t c = json_integer_value(json_object_get(err, "code"));
        char code[48];
        snprintf(code, sizeof code, "mcp_error_%lld", (long long)c);
        int refused = c == -32700 || c == -32600 || c == -32601 || c == -32602;
        const char *msg = json_string_value(json_object_get(err, "message"));
        set(a,
            lookup    ? OQ__HTTP_UNDECIDED
            : refused ? OQ__HTTP_FINAL
                      : OQ__HTTP_UNKNOWN,
            code, "%.200s", msg ? msg : "");
    } else if (json_is_true(json_object_get(res, "isError"))) {
        set(a, lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_FINAL, "tool_error", "%.240s",
            first_text(res));
        if (!lookup) body(a, res);
    } else {
        const json_t *sc = json_object_get(res, "structuredContent");
        if (lookup) {
            const json_t *e = oq__http_json_path(sc, m->exists);
            int found = e && !json_is_null(e) && !json_is_false(e) &&
                        !(json_is_array(e) && json_array_size(e) == 0);
            set(a, found ? OQ__HTTP_FOUND : OQ__HTTP_ABSENT, found ? "found" : "not_in_answer",
                "lookup: %s", found ? "found" : "nothing at the exists path");
            if (found) {
                object_id(a, sc, m->lookup_object_id);
                body(a, res);
            }
        } else {
            set(a, OQ__HTTP_SUCCESS, o->code ? o->code : "", "%s", o->message ? o->message : "");
            body(a, res);
            object_id(a, sc, m->object_id);
        }
    }
    json_decref(ans);
}

void oq__mcp_answer_clear(oq__mcp_answer_t *a)
{
    if (!a) return;
    free(a->body);
    a->body = NULL;
}
