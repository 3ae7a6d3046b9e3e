/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mcp.c: the MCP gateway of the producer (POST /mcp, Streamable HTTP, JSON-RPC 2.0).
 *
 * Design. /mcp is a second front door onto the same submit as POST /v1/tool-calls: a
 * tools/call becomes an oq_submit_req_t, prepared here with oq_submit_job_new() and queued by
 * producer/http.c with oq_producer_submit_async(), exactly as the HTTP handler queues its own;
 * then http.c waits on the call's state with the call waiters (the wait of GET ...?wait=) up
 * to --mcp-wait, and this file turns the call it reads into a CallToolResult. There is no
 * second submit path and no state of its own beyond the sessions.
 *
 * The key of a tools/call is, in order: params.idempotencyKey (SEP-3182),
 * params._meta["io.onceq/idempotency-key"], else "mcp:<session>:<request id>" (the JSON text
 * of the id; hashed when too long), which dies with the session: a client that reconnects
 * gets a new session and so a new call. Same key, other arguments: the submit's conflict,
 * answered as a JSON-RPC error whose data.code is "idempotency_conflict".
 *
 * Sessions (Mcp-Session-Id, 128 random bits as hex) are memory only: a bounded table, idle
 * ones expire, the oldest is evicted when full. A session remembers the negotiated protocol
 * version and, with tokens, the tenant that opened it (another tenant gets 404, as for an
 * unknown session). Calls are durable; sessions are not.
 *
 * Transport rules kept here: an Origin that is neither loopback nor the Host is 403 (DNS
 * rebinding); batches (JSON arrays) are refused (-32600: both supported versions removed
 * them); notifications and client responses are 202 with no body; a request other than
 * initialize needs a session (400 without, 404 unknown); an MCP-Protocol-Version header
 * naming an unsupported version is 400; a client whose Accept allows text/event-stream but
 * not application/json gets its one response as an SSE event.
 *
 * Tasks (protocol 2025-11-25). The server declares tasks.requests.tools.call and every tool
 * taskSupport "optional". A task IS the call: its taskId is the call id, so it lives in
 * calls.db and survives a producer restart (any later session of the same tenant may poll
 * it). A task-augmented tools/call (params.task) is answered as soon as the submit is durable
 * with a CreateTaskResult; a plain tools/call of a client that declared the tasks capability
 * and is still running at --mcp-wait names its task in
 * _meta["io.modelcontextprotocol/related-task"] beside the usual isError "running" answer.
 * tasks/get reads the call (pending/running/needs_review: "working", the review said in
 * statusMessage, since an operator may still settle it; succeeded: "completed"; failed:
 * "failed"); tasks/result waits like a tools/call, up to --mcp-wait (the spec's "block until
 * terminal", bounded: then a -32000 error "still running", and the client asks again).
 * tasks/list and tasks/cancel are not offered (a call cannot be cancelled once durable).
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "oq_mhd.h"
#include "oq_catalog.h"
#include "oq_envelope.h"
#include "oq_json.h"
#include "oq_mcp.h"
#include "oq_util.h"

#define SESSIONS_MAX 4096
#define SESSION_IDLE_US (60LL * 60 * 1000000) /* an hour without a request */
#define META_KEY "io.onceq/idempotency-key"

/* -32602 for arguments; a server error of the implementation-defined range for the rest. */
#define RPC_PARSE (-32700)
#define RPC_INVALID_REQUEST (-32600)
#define RPC_NO_METHOD (-32601)
#define RPC_INVALID_PARAMS (-32602)
#define RPC_INTERNAL (-32603)
#define RPC_UNAVAILABLE (-32000)

static const char *const versions[] = {"2025-11-25", "2025-06-18"}; /* the latest first */

typedef struct session {
    char id[OQ_MCP_SID_LEN + 1]; /* "" free */
    char version[16];
    char tenant[OQ_MAX_NAME_LEN + 1]; /* "" without authentication */
    int tasks;                        /* 2025-11-25 and the client declared tasks */
    int64_t last_us;
} session_t;

struct oq_mcp {
    const oq_catalog_t *catalog;
    int64_t wait_ms;
    json_t *tools;       /* the tools/list result's array */
    json_t *tools_tasks; /* the same for 2025-11-25 sessions: with execution.taskSupport */
    pthread_mutex_t lock;
    session_t *sessions;
};

enum { MODE_CALL = 0, MODE_TASK_CREATE, MODE_TASK_GET, MODE_TASK_RESULT };

struct oq_mcp_call {
    json_t *id; /* the JSON-RPC request id */
    int sse;
    oq_submit_job_t *job; /* tools/call; NULL for tasks/get and tasks/result */
    int mode;             /* MODE_* */
    int tasks;            /* 1: the client declared tasks; 0: not; -1: not a 2025-11-25 session */
    char task[OQ_CALL_ID_LEN + 1];    /* tasks/get, tasks/result: the call id */
    char tenant[OQ_MAX_NAME_LEN + 1]; /* "" without authentication */
};

#define RELATED_TASK "io.modelcontextprotocol/related-task"
#define TASK_POLL_MS 1000

/* --- answers ---------------------------------------------------------------------------------*/

static void out_body(oq_mcp_out_t *out, unsigned status, json_t *msg, int sse)
{
    char *text = msg ? oq_json_dumps(msg, JSON_COMPACT) : NULL;
    json_decref(msg);
    out->status = text ? status : 500;
    out->ctype = "application/json";
    if (text && sse) {
        size_t n = strlen(text) + 32;
        char *s = malloc(n);
        if (s) {
            snprintf(s, n, "event: message\ndata: %s\n\n", text);
            out->ctype = "text/event-stream";
        }
        free(text);
        text = s;
    }
    out->body = text ? text : strdup("{}");
}

static void rpc_result(oq_mcp_out_t *out, const json_t *id, json_t *result, int sse)
{
    out_body(
        out, 200,
        json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(), "result", result),
        sse);
}

/* \p data: a new reference or NULL. */
static void rpc_error(oq_mcp_out_t *out, unsigned status, const json_t *id, int code,
                      const char *msg, json_t *data, int sse)
{
    json_t *e = json_pack("{s:i,s:s}", "code", code, "message", msg);
    if (e && data)
        json_object_set_new(e, "data", data);
    else
        json_decref(data);
    out_body(
        out, status,
        e ? json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(), "error", e)
          : NULL,
        sse);
}

/* --- sessions --------------------------------------------------------------------------------*/

static session_t *session_find(oq_mcp_t *m, const char *id, int64_t now)
{
    if (!id || strlen(id) != OQ_MCP_SID_LEN) return NULL;
    for (size_t i = 0; i < SESSIONS_MAX; i++) {
        session_t *s = &m->sessions[i];
        if (!s->id[0] || strcmp(s->id, id) != 0) continue;
        if (now - s->last_us > SESSION_IDLE_US) {
            s->id[0] = '\0';
            return NULL;
        }
        return s;
    }
    return NULL;
}

static void session_new(oq_mcp_t *m, const char *version, const char *tenant, int tasks,
                        char id[OQ_MCP_SID_LEN + 1])
{
    unsigned char r[OQ_MCP_SID_LEN / 2];
    oq_random_bytes(r, sizeof r);
    oq_hex(r, sizeof r, id);
    int64_t now = oq_mono_us();
    pthread_mutex_lock(&m->lock);
    session_t *slot = NULL, *oldest = NULL;
    for (size_t i = 0; i < SESSIONS_MAX && !slot; i++) {
        session_t *s = &m->sessions[i];
        if (!s->id[0] || now - s->last_us > SESSION_IDLE_US)
            slot = s;
        else if (!oldest || s->last_us < oldest->last_us)
            oldest = s;
    }
    if (!slot) slot = oldest; /* full: the least recently used goes */
    memcpy(slot->id, id, OQ_MCP_SID_LEN + 1);
    snprintf(slot->version, sizeof slot->version, "%s", version);
    snprintf(slot->tenant, sizeof slot->tenant, "%s", tenant ? tenant : "");
    slot->tasks = tasks;
    slot->last_us = now;
    pthread_mutex_unlock(&m->lock);
}

/* --- transport checks ------------------------------------------------------------------------*/

/* The host part of "scheme://host[:port]" or of a Host header "host[:port]" into \p out. */
static void host_part(const char *s, char *out, size_t cap)
{
    const char *p = strstr(s, "://");
    p = p ? p + 3 : s;
    size_t n = 0;
    if (*p == '[') {
        const char *e = strchr(p, ']');
        n = e ? (size_t)(e - p + 1) : strlen(p);
    } else {
        n = strcspn(p, ":/");
    }
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = '\0';
}

/* A browser's Origin may call /mcp when its host is loopback, or, with authentication on, when
 * it is the request's own Host. Without authentication Origin == Host is not enough: a page
 * whose name DNS points at 127.0.0.1 (rebinding) sends Origin and Host both with its own name. */
static int origin_ok(const char *origin, const char *host, int authenticated)
{
    if (!origin || !*origin) return 1; /* not a browser */
    if (strcmp(origin, "null") == 0) return 0;
    char o[256], hh[256];
    host_part(origin, o, sizeof o);
    if (oq_mhd_host_is_loopback(o)) return 1;
    if (!host || !authenticated) return 0;
    host_part(host, hh, sizeof hh);
    return strcasecmp(o, hh) == 0;
}

/* 0 JSON, 1 SSE, -1 neither acceptable. */
static int accept_kind(const char *accept)
{
    if (!accept || !*accept) return 0;
    if (strcasestr(accept, "application/json") || strstr(accept, "*/*") ||
        strcasestr(accept, "application/*"))
        return 0;
    if (strcasestr(accept, "text/event-stream")) return 1;
    return -1;
}

static const char *version_supported(const char *v)
{
    for (size_t i = 0; v && i < sizeof versions / sizeof *versions; i++)
        if (strcmp(v, versions[i]) == 0) return versions[i];
    return NULL;
}

/* --- tools/list --------------------------------------------------------------------------------*/

static json_t *build_tools(const oq_catalog_t *cat, int tasks)
{
    json_t *tools = json_array();
    if (!tools || !cat) return tools;
    json_t *list = oq_catalog_list(cat);
    if (!list) {
        json_decref(tools);
        return NULL;
    }
    size_t i;
    json_t *t;
    json_array_foreach(list, i, t)
    {
        json_t *schema = json_object_get(t, "input_schema");
        json_t *ann = json_deep_copy(json_object_get(t, "annotations"));
        if (!json_is_object(ann)) {
            json_decref(ann);
            ann = json_object();
        }
        /* onceq guards every tool: a retry with the same key has no second effect */
        json_object_set_new(ann, "idempotentHint", json_true());
        json_t *e = json_pack("{s:O,s:O,s:o,s:o}", "name", json_object_get(t, "name"),
                              "description", json_object_get(t, "description"), "inputSchema",
                              json_is_object(schema) ? json_incref(schema)
                                                     : json_pack("{s:s}", "type", "object"),
                              "annotations", ann);
        if (e && tasks)
            json_object_set_new(e, "execution", json_pack("{s:s}", "taskSupport", "optional"));
        if (!e || json_array_append_new(tools, e) != 0) {
            json_decref(list);
            json_decref(tools);
            return NULL;
        }
    }
    json_decref(list);
    return tools;
}

/* --- tools/call --------------------------------------------------------------------------------*/

/* 0 with \p key set, or -1 with \p out filled (invalid params). */
static int call_key(const json_t *params, const char *sid, const json_t *id, char *key, size_t cap,
                    oq_mcp_out_t *out, int sse)
{
    const json_t *k = json_object_get(params, "idempotencyKey");
    const char *src = "params.idempotencyKey";
    if (!k) {
        const json_t *meta = json_object_get(params, "_meta");
        k = json_is_object(meta) ? json_object_get(meta, META_KEY) : NULL;
        src = "params._meta[\"" META_KEY "\"]";
    }
    if (k) {
        const char *s = json_string_value(k);
        if (!s || !oq_envelope_valid_key(s) || s[0] == ' ' || s[strlen(s) - 1] == ' ') {
            char msg[160];
            snprintf(msg, sizeof msg, "%s: 1-255 printable ASCII bytes, no space at either end",
                     src);
            rpc_error(out, 200, id, RPC_INVALID_PARAMS, msg,
                      json_pack("{s:s}", "code", "invalid_idempotency_key"), sse);
            return -1;
        }
        snprintf(key, cap, "%s", s);
        return 0;
    }
    /* derived: weaker, it dies with the session */
    char *idt = json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
    snprintf(key, cap, "mcp:%s:%s", sid, idt ? idt : "");
    if (!idt || !oq_envelope_valid_key(key)) {
        unsigned char d[32];
        char hex[65];
        oq_sha256(idt ? idt : "", idt ? strlen(idt) : 0, d);
        oq_hex(d, sizeof d, hex);
        snprintf(key, cap, "mcp:%s:h:%s", sid, hex);
    }
    free(idt);
    return 0;
}

static int tools_call(oq_mcp_t *m, const json_t *id, const json_t *params, const char *sid,
                      const char *tenant, int sse, int tasks, oq_mcp_call_t **callp,
                      oq_mcp_out_t *out)
{
    const char *name = json_string_value(json_object_get(params, "name"));
    const json_t *args = json_object_get(params, "arguments");
    if (!json_is_object(params) || !name) {
        rpc_error(out, 200, id, RPC_INVALID_PARAMS, "tools/call needs params.name (a string)",
                  json_pack("{s:s}", "code", "bad_request"), sse);
        return 0;
    }
    json_t *empty = NULL;
    if (!args) args = empty = json_object();
    if (!json_is_object(args)) {
        rpc_error(out, 200, id, RPC_INVALID_PARAMS, "params.arguments must be an object",
                  json_pack("{s:s,s:s}", "code", "bad_args", "pointer", ""), sse);
        return 0;
    }
    char key[OQ_MAX_KEY_LEN + 64];
    if (call_key(params, sid, id, key, sizeof key, out, sse) != 0) goto done;
    if (m->catalog) {
        oq_jschema_violation_t v;
        int crc = oq_catalog_check(m->catalog, name, args, &v);
        char msg[1024];
        if (crc == OQ_ENOTFOUND) {
            snprintf(msg, sizeof msg, "no tool named \"%.128s\" (tools/list)", name);
            rpc_error(out, 200, id, RPC_INVALID_PARAMS, msg,
                      json_pack("{s:s,s:s}", "code", "unknown_tool", "tool", name), sse);
            goto done;
        }
        if (crc) {
            snprintf(msg, sizeof msg,
                     "arguments do not match the inputSchema of %.128s: at "
                     "\"%s\": %s",
                     name, v.pointer, v.reason);
            rpc_error(out, 200, id, RPC_INVALID_PARAMS, msg,
                      json_pack("{s:s,s:s,s:s}", "code", "bad_args", "pointer", v.pointer,
                                "keyword", v.keyword),
                      sse);
            goto done;
        }
    }
    oq_submit_req_t req;
    memset(&req, 0, sizeof req);
    req.tool = name;
    req.args = args;
    req.idem_key = key;
    req.tenant = tenant;
    oq_error_t err = {0};
    oq_mcp_call_t *c = calloc(1, sizeof *c);
    if (!c) {
        rpc_error(out, 200, id, RPC_INTERNAL, "out of memory", NULL, sse);
        goto done;
    }
    if (oq_submit_job_new(&req, &c->job, &err) != 0) {
        free(c);
        rpc_error(out, 200, id, RPC_INVALID_PARAMS, err.msg,
                  json_pack("{s:s}", "code", "bad_request"), sse);
        goto done;
    }
    c->id = json_deep_copy(id);
    c->sse = sse;
    c->tasks = tasks;
    /* task-augmented (2025-11-25 sessions only; others process it normally, as the spec says) */
    if (tasks >= 0 && json_is_object(json_object_get(params, "task"))) c->mode = MODE_TASK_CREATE;
    *callp = c;
    json_decref(empty);
    return 1;
done:
    json_decref(empty);
    return 0;
}

/* tasks/get, tasks/result: 2 with \p callp set (read or wait for the call), or 0 with \p out. */
static int task_request(const json_t *id, const json_t *params, const char *tenant, int sse,
                        int get, oq_mcp_call_t **callp, oq_mcp_out_t *out)
{
    const char *tid = json_string_value(json_object_get(params, "taskId"));
    if (!tid || strlen(tid) != OQ_CALL_ID_LEN || strncmp(tid, "c_", 2) != 0) {
        rpc_error(out, 200, id, RPC_INVALID_PARAMS, "unknown taskId",
                  json_pack("{s:s}", "code", "unknown_task"), sse);
        return 0;
    }
    oq_mcp_call_t *c = calloc(1, sizeof *c);
    if (!c || !(c->id = json_deep_copy(id))) {
        free(c);
        rpc_error(out, 200, id, RPC_INTERNAL, "out of memory", NULL, sse);
        return 0;
    }
    c->sse = sse;
    c->tasks = 1;
    c->mode = get ? MODE_TASK_GET : MODE_TASK_RESULT;
    memcpy(c->task, tid, OQ_CALL_ID_LEN + 1);
    snprintf(c->tenant, sizeof c->tenant, "%s", tenant ? tenant : "");
    *callp = c;
    return 2;
}

/* --- the POST --------------------------------------------------------------------------------*/

int oq_mcp_post(oq_mcp_t *m, const oq_mcp_in_t *in, const char *body, size_t len, size_t max_depth,
                oq_mcp_call_t **call, oq_mcp_out_t *out)
{
    memset(out, 0, sizeof *out);
    *call = NULL;
    if (!origin_ok(in->origin, in->host, in->tenant != NULL)) {
        rpc_error(out, 403, NULL, RPC_INVALID_REQUEST, "Origin not allowed",
                  json_pack("{s:s}", "code", "forbidden"), 0);
        return 0;
    }
    int sse = accept_kind(in->accept);
    if (sse < 0) {
        rpc_error(out, 406, NULL, RPC_INVALID_REQUEST,
                  "Accept must allow application/json or text/event-stream", NULL, 0);
        return 0;
    }
    json_t *msg = NULL;
    oq_error_t err = {0};
    if (oq_json_parse(body ? body : "", len, max_depth, &msg, &err) != 0) {
        rpc_error(out, 400, NULL, RPC_PARSE, err.msg, NULL, sse);
        return 0;
    }
    int ret = 0;
    if (json_is_array(msg)) {
        rpc_error(out, 400, NULL, RPC_INVALID_REQUEST,
                  "batches are not supported (removed in protocol 2025-06-18)", NULL, sse);
        goto out;
    }
    json_t *id = json_object_get(msg, "id");
    const char *method = json_string_value(json_object_get(msg, "method"));
    if (!json_is_object(msg) || !json_is_string(json_object_get(msg, "jsonrpc")) ||
        strcmp(json_string_value(json_object_get(msg, "jsonrpc")), "2.0") != 0 ||
        (id && !json_is_string(id) && !json_is_integer(id))) {
        rpc_error(out, 400, NULL, RPC_INVALID_REQUEST, "not a JSON-RPC 2.0 message", NULL, sse);
        goto out;
    }
    if (!method) {
        if (id && (json_object_get(msg, "result") || json_object_get(msg, "error"))) {
            out->status = 202; /* a response: we ask clients nothing, so nothing to do */
            goto out;
        }
        rpc_error(out, 400, id, RPC_INVALID_REQUEST, "no method", NULL, sse);
        goto out;
    }
    json_t *params = json_object_get(msg, "params");
    if (params && !json_is_object(params)) {
        rpc_error(out, 200, id, RPC_INVALID_PARAMS, "params must be an object", NULL, sse);
        goto out;
    }
    if (strcmp(method, "initialize") == 0 && id) {
        const char *want = json_string_value(json_object_get(params, "protocolVersion"));
        if (!want) {
            rpc_error(out, 200, id, RPC_INVALID_PARAMS, "initialize needs params.protocolVersion",
                      NULL, sse);
            goto out;
        }
        const char *v = version_supported(want);
        if (!v) v = versions[0];
        int v2511 = strcmp(v, "2025-11-25") == 0;
        const json_t *ccap = json_object_get(json_object_get(params, "capabilities"), "tasks");
        session_new(m, v, in->tenant, v2511 && json_is_object(ccap), out->session);
        json_t *caps = json_pack("{s:{s:b}}", "tools", "listChanged", 0);
        if (caps && v2511)
            json_object_set_new(caps, "tasks",
                                json_pack("{s:{s:{s:{}}}}", "requests", "tools", "call"));
        rpc_result(out, id,
                   json_pack("{s:s,s:o,s:{s:s,s:s},s:s}", "protocolVersion", v, "capabilities",
                             caps, "serverInfo", "name", "onceq", "version", ONCEQ_VERSION,
                             "instructions",
                             "Every tools/call is an effectively-once onceq call: retry with the "
                             "same idempotencyKey (or _meta \"" META_KEY
                             "\") to get the same result, never a second effect."),
                   sse);
        goto out;
    }
    /* everything else belongs to a session */
    if (!in->session || !*in->session) {
        rpc_error(out, 400, id, RPC_INVALID_REQUEST,
                  "Mcp-Session-Id header required (send initialize first)", NULL, sse);
        goto out;
    }
    char sid[OQ_MCP_SID_LEN + 1];
    int tasks = 0, v2511 = 0;
    pthread_mutex_lock(&m->lock);
    session_t *s = session_find(m, in->session, oq_mono_us());
    if (s && strcmp(s->tenant, in->tenant ? in->tenant : "") != 0) s = NULL;
    if (s) {
        s->last_us = oq_mono_us();
        memcpy(sid, s->id, sizeof sid);
        tasks = s->tasks;
        v2511 = strcmp(s->version, "2025-11-25") == 0;
    }
    pthread_mutex_unlock(&m->lock);
    if (!s) {
        rpc_error(out, 404, id, RPC_INVALID_REQUEST, "unknown or expired session: initialize again",
                  NULL, sse);
        goto out;
    }
    if (in->proto && !version_supported(in->proto)) {
        rpc_error(out, 400, id, RPC_INVALID_REQUEST, "unsupported MCP-Protocol-Version", NULL, sse);
        goto out;
    }
    if (!id) { /* a notification (notifications/initialized, cancelled, ...) */
        out->status = 202;
        goto out;
    }
    if (strcmp(method, "ping") == 0) {
        rpc_result(out, id, json_object(), sse);
    } else if (strcmp(method, "tools/list") == 0) {
        rpc_result(out, id, json_pack("{s:O}", "tools", v2511 ? m->tools_tasks : m->tools), sse);
    } else if (strcmp(method, "tools/call") == 0) {
        ret = tools_call(m, id, params, sid, in->tenant, sse, v2511 ? tasks : -1, call, out);
    } else if (v2511 && (strcmp(method, "tasks/get") == 0 || strcmp(method, "tasks/result") == 0)) {
        ret =
            task_request(id, params, in->tenant, sse, strcmp(method, "tasks/get") == 0, call, out);
    } else {
        char text[200];
        snprintf(text, sizeof text, "method not found: %.120s", method);
        rpc_error(out, 200, id, RPC_NO_METHOD, text, NULL, sse);
    }
out:
    json_decref(msg);
    return ret;
}

void oq_mcp_delete(oq_mcp_t *m, const oq_mcp_in_t *in, oq_mcp_out_t *out)
{
    memset(out, 0, sizeof *out);
    if (!origin_ok(in->origin, in->host, in->tenant != NULL)) {
        rpc_error(out, 403, NULL, RPC_INVALID_REQUEST, "Origin not allowed", NULL, 0);
        return;
    }
    if (!in->session || !*in->session) {
        rpc_error(out, 400, NULL, RPC_INVALID_REQUEST, "Mcp-Session-Id header required", NULL, 0);
        return;
    }
    pthread_mutex_lock(&m->lock);
    session_t *s = session_find(m, in->session, oq_mono_us());
    if (s && strcmp(s->tenant, in->tenant ? in->tenant : "") != 0) s = NULL;
    if (s) s->id[0] = '\0';
    pthread_mutex_unlock(&m->lock);
    if (!s) {
        rpc_error(out, 404, NULL, RPC_INVALID_REQUEST, "unknown or expired session", NULL, 0);
        return;
    }
    out->status = 200;
}

/* --- results -----------------------------------------------------------------------------------*/

oq_submit_job_t *oq_mcp_call_job(oq_mcp_call_t *c)
{
    return c->job;
}

static json_t *text_block(const char *text)
{
    return json_pack("[{s:s,s:s}]", "type", "text", "text", text);
}

/* The CallToolResult of \p call. */
static json_t *call_result(const oq_call_t *call)
{
    json_t *meta = json_pack("{s:s}", "io.onceq/call-id", call->call_id);
    char text[600];
    if (strcmp(call->state, "succeeded") == 0) {
        const char *rt = call->result ? call->result : "null";
        json_t *r = json_loads(rt, JSON_DECODE_ANY, NULL);
        json_t *sc =
            json_is_object(r) ? json_incref(r) : json_pack("{s:O}", "result", r ? r : json_null());
        json_decref(r);
        return json_pack("{s:o,s:o,s:b,s:o}", "content", text_block(rt), "structuredContent", sc,
                         "isError", 0, "_meta", meta);
    }
    json_t *sc;
    if (strcmp(call->state, "failed") == 0) {
        json_t *e = call->error ? json_loads(call->error, 0, NULL) : NULL;
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        snprintf(text, sizeof text, "the call failed: %.100s: %.400s", code ? code : "error",
                 msg ? msg : "");
        sc = json_pack("{s:s,s:s,s:o}", "status", "failed", "call_id", call->call_id, "error",
                       e ? e : json_object());
    } else if (strcmp(call->state, "needs_review") == 0) {
        snprintf(text, sizeof text,
                 "the call needs review: whether it took effect is not known, and onceq will "
                 "not send it again blind (onceq review). Retry with the same key later to get "
                 "the outcome.");
        sc = json_pack("{s:s,s:s}", "status", "needs_review", "call_id", call->call_id);
    } else {
        snprintf(text, sizeof text,
                 "the call is still running (call %s): retry tools/call with the same "
                 "idempotency key to get its result; it will not run twice.",
                 call->call_id);
        sc = json_pack("{s:s,s:s}", "status", "running", "call_id", call->call_id);
    }
    return json_pack("{s:o,s:o,s:b,s:o}", "content", text_block(text), "structuredContent", sc,
                     "isError", 1, "_meta", meta);
}

/* The Task of \p call (its id is the call id). */
static json_t *task_of(const oq_call_t *call)
{
    const char *st = call->state, *status = "working", *msg = "the call is pending";
    if (strcmp(st, "succeeded") == 0) {
        status = "completed";
        msg = "the call succeeded";
    } else if (strcmp(st, "failed") == 0) {
        status = "failed";
        msg = "the call failed";
    } else if (strcmp(st, "needs_review") == 0) {
        msg = "the call needs review: whether it took effect is not known; an operator decides "
              "(onceq review)";
    } else if (strcmp(st, "running") == 0) {
        msg = "the call is running";
    }
    char created[32], updated[32];
    oq_time_format(call->created_at, created);
    oq_time_format(call->updated_at, updated);
    json_t *t = json_pack("{s:s,s:s,s:s,s:s,s:s,s:i}", "taskId", call->call_id, "status", status,
                          "statusMessage", msg, "createdAt", created, "lastUpdatedAt", updated,
                          "pollInterval", TASK_POLL_MS);
    if (t)
        json_object_set_new(t, "ttl",
                            call->expires_at > call->created_at
                                ? json_integer((json_int_t)(call->expires_at - call->created_at))
                                : json_null());
    return t;
}

/* \p result (a CallToolResult) with its _meta naming the task \p call_id. */
static json_t *with_related_task(json_t *result, const char *call_id)
{
    json_t *meta = json_object_get(result, "_meta");
    if (json_is_object(meta))
        json_object_set_new(meta, RELATED_TASK, json_pack("{s:s}", "taskId", call_id));
    return result;
}

int oq_mcp_call_submitted(oq_mcp_call_t *c, int refused, oq_mcp_out_t *out,
                          char call_id[OQ_CALL_ID_LEN + 1])
{
    memset(out, 0, sizeof *out);
    oq_submit_outcome_t oc;
    const oq_call_t *call = NULL;
    oq_error_t err = {0};
    int rc = refused ? OQ_ESHUTDOWN : oq_submit_job_result(c->job, &oc, &call, &err);
    if (rc == OQ_ECONFLICT) {
        rpc_error(out, 200, c->id, RPC_INVALID_PARAMS,
                  "this idempotency key was used with other arguments",
                  json_pack("{s:s,s:s}", "code", "idempotency_conflict", "call_id",
                            call ? call->call_id : ""),
                  c->sse);
        return 0;
    }
    if (rc == OQ_EINVAL || rc == OQ_ETOOBIG) {
        rpc_error(
            out, 200, c->id, RPC_INVALID_PARAMS, err.msg,
            json_pack("{s:s}", "code", rc == OQ_ETOOBIG ? "payload_too_large" : "bad_request"),
            c->sse);
        return 0;
    }
    if (rc) {
        rpc_error(out, 200, c->id, RPC_UNAVAILABLE,
                  rc == OQ_ESHUTDOWN ? "shutting down: retry with the same key"
                                     : "submit not durable: retry with the same key",
                  json_pack("{s:s}", "code", "unavailable"), c->sse);
        return 0;
    }
    if (c->mode == MODE_TASK_CREATE) { /* durable: the task exists, answer at once */
        rpc_result(out, c->id, json_pack("{s:o}", "task", task_of(call)), c->sse);
        return 0;
    }
    if (!oq_call_state_terminal(call->state)) {
        memcpy(call_id, call->call_id, OQ_CALL_ID_LEN + 1);
        return 1;
    }
    rpc_result(out, c->id, call_result(call), c->sse);
    return 0;
}

const char *oq_mcp_call_task(const oq_mcp_call_t *c, int *wait)
{
    *wait = c->mode == MODE_TASK_RESULT;
    return c->task;
}

void oq_mcp_call_answer(oq_mcp_call_t *c, int rc, const oq_call_t *call, oq_mcp_out_t *out)
{
    memset(out, 0, sizeof *out);
    if (c->mode == MODE_TASK_GET || c->mode == MODE_TASK_RESULT) {
        /* another tenant's call is as unknown as a missing one */
        if (rc == OQ_ENOTFOUND ||
            (rc == 0 && c->tenant[0] && strcmp(call->tenant ? call->tenant : "", c->tenant))) {
            rpc_error(out, 200, c->id, RPC_INVALID_PARAMS, "unknown taskId",
                      json_pack("{s:s}", "code", "unknown_task"), c->sse);
            return;
        }
        if (rc == 0 && c->mode == MODE_TASK_GET) {
            rpc_result(out, c->id, task_of(call), c->sse);
            return;
        }
        if (rc == 0 && !oq_call_state_terminal(call->state)) {
            rpc_error(out, 200, c->id, RPC_UNAVAILABLE,
                      "the task is still working: ask tasks/result again",
                      json_pack("{s:s,s:s}", "code", "running", "taskId", c->task), c->sse);
            return;
        }
        if (rc == 0) {
            rpc_result(out, c->id, with_related_task(call_result(call), call->call_id), c->sse);
            return;
        }
    }
    if (rc) {
        rpc_error(out, 200, c->id, RPC_UNAVAILABLE, "cannot read the call: retry with the same key",
                  json_pack("{s:s}", "code", "unavailable"), c->sse);
        return;
    }
    json_t *r = call_result(call);
    if (c->tasks > 0 && !oq_call_state_terminal(call->state)) /* a task it can poll */
        r = with_related_task(r, call->call_id);
    rpc_result(out, c->id, r, c->sse);
}

void oq_mcp_call_free(oq_mcp_call_t *c)
{
    if (!c) return;
    oq_submit_job_destroy(c->job);
    json_decref(c->id);
    free(c);
}

/* --- life --------------------------------------------------------------------------------------*/

int oq_mcp_new(const oq_catalog_t *catalog, int64_t wait_ms, oq_mcp_t **out, oq_error_t *err)
{
    oq_mcp_t *m = calloc(1, sizeof *m);
    if (!m) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    m->catalog = catalog;
    m->wait_ms = wait_ms > 0 ? wait_ms : OQ_MCP_WAIT_DEFAULT_MS;
    m->sessions = calloc(SESSIONS_MAX, sizeof *m->sessions);
    m->tools = build_tools(catalog, 0);
    m->tools_tasks = build_tools(catalog, 1);
    if (!m->sessions || !m->tools || !m->tools_tasks) {
        free(m->sessions);
        json_decref(m->tools);
        json_decref(m->tools_tasks);
        free(m);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    pthread_mutex_init(&m->lock, NULL);
    *out = m;
    return 0;
}

void oq_mcp_destroy(oq_mcp_t *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->lock);
    json_decref(m->tools);
    json_decref(m->tools_tasks);
    free(m->sessions);
    free(m);
}

int64_t oq_mcp_wait_ms(const oq_mcp_t *m)
{
    return m->wait_ms;
}
