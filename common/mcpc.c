/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mcpc.c: the few synchronous requests onceq makes to an upstream MCP server (oq_mcpc.h).
 *
 * Design. An upstream MCP server is reached over Streamable HTTP: every JSON-RPC message is a
 * POST to one URL with `Accept: application/json, text/event-stream`, and the server answers a
 * request either with a JSON body or with an SSE stream that carries the response as the data
 * of a `message` event (it may send notifications first). oq__mcpc_answer() reads both. A
 * server may keep sessions: `initialize` is answered with an `Mcp-Session-Id` header that
 * every later request repeats, and the server answers 404 once that session is gone (and 400
 * when a request lacks it); a stateless server gives none. Only what happens outside the call
 * path is here, on one curl easy handle per exchange (load time, or a session renewal);
 * tools/call itself is a request of the consumer's executor (consumer/mcp_tools.c), so its
 * "sent or not" classification is the HTTP tools' one.
 */
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "oq_mcpc.h"
#include "oq_buf.h"

#define MAX_ANSWER (8u << 20)

typedef struct buf {
    oq_buf_t b;
    int too_big;
} buf_t;

typedef struct xchg {
    buf_t body;
    char sid[OQ_MCPC_SID_MAX];
} xchg_t;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    buf_t *b = &((xchg_t *)ud)->body;
    size_t n = size * nmemb;
    if (n > MAX_ANSWER - b->b.len) {
        b->too_big = 1;
        return 0;
    }
    return oq_buf_put(&b->b, ptr, n) ? 0 : n;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *ud)
{
    xchg_t *x = ud;
    size_t n = size * nmemb;
    static const char name[] = "mcp-session-id:";
    if (n > sizeof name - 1 && strncasecmp(ptr, name, sizeof name - 1) == 0) {
        const char *v = ptr + sizeof name - 1;
        size_t len = n - (sizeof name - 1);
        while (len && (*v == ' ' || *v == '\t'))
            v++, len--;
        while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' '))
            len--;
        int ok = len > 0 && len < sizeof x->sid;
        for (size_t i = 0; ok && i < len; i++)
            if (v[i] < 0x21 || v[i] > 0x7e) ok = 0;
        if (ok) {
            memcpy(x->sid, v, len);
            x->sid[len] = '\0';
        }
    }
    return n;
}

json_t *oq__mcpc_answer(const char *body, size_t len, const json_t *id)
{
    if (!body || !len) return NULL;
    size_t i = 0;
    while (i < len && (body[i] == ' ' || body[i] == '\n' || body[i] == '\r' || body[i] == '\t'))
        i++;
    if (i < len && body[i] == '{') { /* application/json */
        json_t *m = json_loadb(body + i, len - i, 0, NULL);
        if (json_is_object(m) && (!id || json_equal(json_object_get(m, "id"), id))) return m;
        json_decref(m);
        return NULL;
    }
    /* text/event-stream: events end with a blank line; the data lines of one event join with
     * "\n"; the response is the event whose JSON has our id and a result or an error */
    json_t *found = NULL;
    oq_buf_t data = {0}; /* the data lines of the event so far; p NULL before the first */
    const char *p = body, *end = body + len;
    while (p <= end && !found) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        size_t ll = (size_t)(le - p);
        if (ll && p[ll - 1] == '\r') ll--;
        if (ll == 0) { /* end of an event */
            if (data.p) {
                json_t *m = json_loadb(data.p, data.len, 0, NULL);
                if (json_is_object(m) && (!id || json_equal(json_object_get(m, "id"), id)) &&
                    (json_object_get(m, "result") || json_object_get(m, "error")))
                    found = m;
                else
                    json_decref(m);
                oq_buf_free(&data);
            }
        } else if (ll >= 5 && strncmp(p, "data:", 5) == 0) {
            const char *v = p + 5;
            size_t vl = ll - 5;
            if (vl && *v == ' ') v++, vl--;
            if ((data.len && oq_buf_putc(&data, '\n')) || oq_buf_put(&data, v, vl)) break;
        }
        if (!nl) {
            if (data.p && !found) { /* a last event without its blank line */
                json_t *m = json_loadb(data.p, data.len, 0, NULL);
                if (json_is_object(m) && (!id || json_equal(json_object_get(m, "id"), id)) &&
                    (json_object_get(m, "result") || json_object_get(m, "error")))
                    found = m;
                else
                    json_decref(m);
            }
            break;
        }
        p = nl + 1;
    }
    oq_buf_free(&data);
    return found;
}

/* One POST of \p msg (NULL: a DELETE of the session). \p answer (may be NULL) receives the
 * response to \p msg's id; \p sid_out (may be NULL) the session id the answer named. */
static int post(const char *url, const char *sid, const char *const *headers, const json_t *msg,
                int64_t timeout_ms, json_t **answer, char *sid_out, oq_error_t *err)
{
    pthread_once(&once, global_init);
    if (answer) *answer = NULL;
    int rc = 0;
    xchg_t x;
    memset(&x, 0, sizeof x);
    char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    struct curl_slist *h = NULL, *t;
    char line[OQ_MCPC_SID_MAX + 32];
    CURL *c = curl_easy_init();
    if (!c || (msg && !text)) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    t = curl_slist_append(h, "Accept: application/json, text/event-stream");
    if (t) h = t;
    t = curl_slist_append(h, "Content-Type: application/json");
    if (t) h = t;
    t = curl_slist_append(h, "MCP-Protocol-Version: " OQ_MCPC_VERSION);
    if (t) h = t;
    if (sid && *sid) {
        snprintf(line, sizeof line, "Mcp-Session-Id: %s", sid);
        if ((t = curl_slist_append(h, line))) h = t;
    }
    for (size_t i = 0; headers && headers[i]; i++)
        if ((t = curl_slist_append(h, headers[i]))) h = t;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_ms > 0 ? timeout_ms : 5000));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
    if (msg) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, text);
    } else {
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "DELETE");
    }
    CURLcode cc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK) {
        rc = oq_error_set(err, cc == CURLE_OPERATION_TIMEDOUT ? OQ_ETIMEDOUT : OQ_EIO, (int)cc,
                          "MCP server %s: %s", url, curl_easy_strerror(cc));
        goto out;
    }
    if (!msg) goto out; /* a DELETE: whatever it says */
    if (status < 200 || status > 299) {
        rc = oq_error_set(err, OQ_EIO, 0, "MCP server %s answered %ld to %s", url, status,
                          json_string_value(json_object_get(msg, "method")));
        goto out;
    }
    if (sid_out) snprintf(sid_out, OQ_MCPC_SID_MAX, "%s", x.sid);
    if (answer && json_object_get(msg, "id")) {
        json_t *a = oq__mcpc_answer(x.body.b.p, x.body.b.len, json_object_get(msg, "id"));
        if (!a) {
            rc = oq_error_set(err, OQ_EIO, 0, "MCP server %s: no JSON-RPC answer to %s", url,
                              json_string_value(json_object_get(msg, "method")));
            goto out;
        }
        json_t *e = json_object_get(a, "error");
        if (e) {
            rc = oq_error_set(err, OQ_EIO, 0, "MCP server %s: %s: error %lld: %.120s", url,
                              json_string_value(json_object_get(msg, "method")),
                              (long long)json_integer_value(json_object_get(e, "code")),
                              json_string_value(json_object_get(e, "message")));
            json_decref(a);
            goto out;
        }
        *answer = a;
    }
out:
    if (c) curl_easy_cleanup(c);
    curl_slist_free_all(h);
    free(text);
    oq_buf_free(&x.body.b);
    return rc;
}

int oq__mcpc_initialize(const char *url, const char *const *headers, int64_t timeout_ms,
                        char sid[OQ_MCPC_SID_MAX], oq_error_t *err)
{
    sid[0] = '\0';
    json_t *init =
        json_pack("{s:s,s:s,s:s,s:{s:s,s:{},s:{s:s,s:s}}}", "jsonrpc", "2.0", "id", "onceq-init",
                  "method", "initialize", "params", "protocolVersion", OQ_MCPC_VERSION,
                  "capabilities", "clientInfo", "name", "onceq", "version", ONCEQ_VERSION);
    json_t *note = json_pack("{s:s,s:s}", "jsonrpc", "2.0", "method", "notifications/initialized");
    json_t *a = NULL;
    int rc = init && note ? post(url, NULL, headers, init, timeout_ms, &a, sid, err)
                          : oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (rc == 0 && !json_is_object(json_object_get(a, "result")))
        rc = oq_error_set(err, OQ_EIO, 0, "MCP server %s: initialize: no result", url);
    if (rc == 0) rc = post(url, sid, headers, note, timeout_ms, NULL, NULL, err);
    json_decref(a);
    json_decref(init);
    json_decref(note);
    return rc;
}

int oq__mcpc_list_tools(const char *url, int64_t timeout_ms, json_t **tools, oq_error_t *err)
{
    char sid[OQ_MCPC_SID_MAX];
    *tools = NULL;
    int rc = oq__mcpc_initialize(url, NULL, timeout_ms, sid, err);
    if (rc) return rc;
    json_t *all = json_array();
    char *cursor = NULL;
    for (int page = 0; rc == 0 && page < 100; page++) {
        json_t *req =
            json_pack("{s:s,s:i,s:s,s:o}", "jsonrpc", "2.0", "id", page + 1, "method", "tools/list",
                      "params", cursor ? json_pack("{s:s}", "cursor", cursor) : json_object());
        json_t *a = NULL;
        rc = req && all ? post(url, sid, NULL, req, timeout_ms, &a, NULL, err)
                        : oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        json_decref(req);
        if (rc) break;
        json_t *res = json_object_get(a, "result");
        json_t *list = json_object_get(res, "tools");
        if (!json_is_array(list) || json_array_extend(all, list) != 0) {
            rc = oq_error_set(err, OQ_EIO, 0, "MCP server %s: tools/list: no tools array", url);
            json_decref(a);
            break;
        }
        const char *next = json_string_value(json_object_get(res, "nextCursor"));
        free(cursor);
        cursor = next && *next ? strdup(next) : NULL;
        json_decref(a);
        if (!cursor) break;
    }
    free(cursor);
    if (sid[0]) post(url, sid, NULL, NULL, timeout_ms, NULL, NULL, NULL); /* end the session */
    if (rc) {
        json_decref(all);
        return rc;
    }
    *tools = all;
    return 0;
}
