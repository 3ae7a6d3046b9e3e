/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http_tools.c: declarative HTTP tools and their executor (libcurl multi interface).
 * (About 1,500 lines, over the usual 800: the tools-file parser, the request templates and the
 * executor's exact "sent" classification are one contract; a split of the parser into its own
 * file is the obvious next step.)
 *
 * Design. A tools file declares, per tool, the request to send (URL, body and header templates,
 * the idempotency header that carries effect_id), how long to wait, how to read the
 * downstream's object id, and which answers mean what. Everything outside the request is
 * settled at load: secret header values ({"env"} / {"file"}) are read then and kept apart from
 * templates (never expanded, wiped on free), TLS files are checked readable, so a bad file
 * fails the start, not every call. The executor runs any number of such
 * requests from one thread with one curl multi handle: requests are queued by any thread
 * (oq__http_exec_submit), started on the polling thread up to max_inflight at a time, and each
 * ends in exactly one callback with a classified outcome. Connections are kept alive and
 * reused; HTTP/1.1 is forced so that "what was written to the socket" is exact.
 *
 * Cost per request, because every outside call pays it on the one polling thread: curl is
 * driven through its socket interface (curl_multi_socket_action over an epoll set, and
 * curl_multi_timeout for its timer), so an event touches only the transfers whose socket is ready,
 * never a poll of every transfer in flight; an easy handle is reset (curl_easy_reset: nothing of
 * one request's method, headers, body or timeouts carries over) and kept for the next transfer, up
 * to max_inflight (at most 1,024) of them; a wake-up is sent only when a queue goes from empty to
 * not empty; an answer is parsed once (oq__http_outcome_t.doc), for the object id here and for what
 * it means in execution.c; a kept-alive connection's socket stays in the epoll set between its
 * transfers (no epoll_ctl per request: see on_socket).
 *
 * The classification rule (what "sent" means). A request counts as SENT once its last byte
 * (end of headers and the whole body) has been written to the socket, as reported by curl's
 * debug callback (CURLINFO_HEADER_OUT / CURLINFO_DATA_OUT are reported after the write, with
 * the number of bytes actually written), or once any byte of an answer has arrived. Before
 * that the downstream cannot have a complete request, so it cannot have acted on it:
 *
 *   transfer ends with                                    call                lookup
 *   a status that a rule declares success/final/retry.    SUCCESS/FINAL/RETRY. FOUND/ABSENT
 *   a status no rule declares (e.g. 500, 502, 503 w/o     UNKNOWN             UNDECIDED
 *     Retry-After when only "503:retry-after" is declared)
 *   no status, request not sent (CURLE_COULDNT_CONNECT,   RETRYABLE           UNDECIDED
 *     CURLE_COULDNT_RESOLVE_HOST, CURLE_OPERATION_TIMEDOUT before the last byte was
 *     written, a connection that died while the request was being written)
 *   no status, request sent (CURLE_OPERATION_TIMEDOUT,    UNKNOWN             UNDECIDED
 *     CURLE_GOT_NOTHING, CURLE_RECV_ERROR, CURLE_SEND_ERROR after the last byte)
 *   bad arguments for the templates, malformed URL        FINAL (never sent)  UNDECIDED
 *
 * A status is definite once the status line and headers arrived, even when the body is then
 * cut off: the downstream decided. A SUCCESS whose body cannot be read has object_id NULL.
 *
 * One trap of libcurl is closed here: when a kept-alive connection dies after the request was
 * written and before any answer, curl silently resends the same request on a new connection
 * (up to 5 times). For a downstream that ignores keys that is a duplicate effect nobody asked
 * for. The pre-request callback (CURLOPT_PREREQFUNCTION) runs before every send attempt of a
 * transfer: a second attempt after a SENT first one is aborted, and the outcome is UNKNOWN
 * (code "connection_lost_after_send"); a second attempt after an unsent first one is allowed,
 * because nothing reached the downstream. Every resend is thus the caller's decision.
 */
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "http_tools.h"
#include "mcp_tools.h"
#include "oq_buf.h"
#include "oq_catalog.h"
#include "oq_json.h"
#include "oq_log.h"
#include "oq_util.h"

const char *oq__http_class_name(oq__http_class_t c)
{
    switch (c) {
    case OQ__HTTP_SUCCESS:
        return "SUCCESS";
    case OQ__HTTP_FINAL:
        return "FINAL";
    case OQ__HTTP_RETRYABLE:
        return "RETRYABLE_BEFORE_SEND";
    case OQ__HTTP_UNKNOWN:
        return "UNKNOWN";
    case OQ__HTTP_FOUND:
        return "FOUND";
    case OQ__HTTP_ABSENT:
        return "ABSENT";
    case OQ__HTTP_UNDECIDED:
        return "UNDECIDED";
    }
    return "?";
}

/* ============================================================================================
 * Tools file
 * ==========================================================================================*/

typedef struct pctx {
    const char *origin;
    char where[128];
    oq_error_t *err;
    int idem_alias; /* the tool being parsed uses the old name {idem_key} */
} pctx_t;

static int perr(pctx_t *p, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int perr(pctx_t *p, const char *field, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (field)
        return oq_error_set(p->err, OQ_EINVAL, 0, "%s: %s: field %s: %s", p->origin, p->where,
                            field, msg);
    return oq_error_set(p->err, OQ_EINVAL, 0, "%s: %s: %s", p->origin, p->where, msg);
}

static int check_fields(pctx_t *p, const json_t *obj, const char *prefix,
                        const char *const *allowed)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v)
    {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, k) == 0) ok = 1;
        if (!ok) {
            char list[200] = "";
            for (const char *const *a = allowed; *a; a++) {
                size_t n = strlen(list);
                snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", *a);
            }
            char f[96];
            snprintf(f, sizeof f, "%s%.64s", prefix, k);
            return perr(p, f, "unknown field (allowed: %s)", list);
        }
    }
    (void)v;
    return 0;
}

/* Placeholder syntax: {name} or {name?}, name = [A-Za-z_][A-Za-z0-9_]*. Counts them. */
static int check_template(pctx_t *p, const char *field, const char *t, int *count)
{
    for (const char *s = t; *s; s++) {
        if (*s == '}') return perr(p, field, "'}' without '{' in \"%.80s\"", t);
        if (*s != '{') continue;
        const char *e = strchr(s, '}');
        if (!e) return perr(p, field, "'{' without '}' in \"%.80s\"", t);
        const char *n = s + 1;
        size_t len = (size_t)(e - n);
        if (len && n[len - 1] == '?') len--;
        if (len == 0 || !(isalpha((unsigned char)n[0]) || n[0] == '_'))
            return perr(p, field, "bad placeholder \"%.*s\" (use {name} or {name?})",
                        (int)(e - s + 1), s);
        for (size_t i = 0; i < len; i++)
            if (!(isalnum((unsigned char)n[i]) || n[i] == '_'))
                return perr(p, field, "bad placeholder \"%.*s\" (use {name} or {name?})",
                            (int)(e - s + 1), s);
        if (len == 8 && strncmp(n, "idem_key", 8) == 0) p->idem_alias = 1;
        if (count) (*count)++;
        s = e;
    }
    return 0;
}

static int check_body_template(pctx_t *p, const json_t *v)
{
    if (json_is_string(v)) return check_template(p, "body", json_string_value(v), NULL);
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) if (check_body_template(p, e)) return OQ_EINVAL;
    } else if (json_is_object(v)) {
        const char *k;
        json_t *e;
        json_object_foreach((json_t *)v, k, e) if (check_body_template(p, e)) return OQ_EINVAL;
    }
    return 0;
}

static int get_string(pctx_t *p, const json_t *o, const char *name, const char *field, char **out,
                      int required)
{
    const json_t *v = json_object_get(o, name);
    if (!v) {
        if (required) return perr(p, field, "missing (a string is required)");
        return 0;
    }
    if (!json_is_string(v) || json_string_length(v) == 0)
        return perr(p, field, "expected a non-empty string");
    if (!(*out = strdup(json_string_value(v)))) return perr(p, field, "out of memory");
    return 0;
}

static int get_ms(pctx_t *p, const json_t *o, const char *name, const char *field, int64_t lo,
                  int64_t hi, int64_t *out)
{
    const json_t *v = json_object_get(o, name);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return perr(p, field, "expected an integer of milliseconds in %lld..%lld", (long long)lo,
                    (long long)hi);
    *out = json_integer_value(v);
    return 0;
}

static int get_path(pctx_t *p, const json_t *o, const char *name, const char *field, char **out,
                    int *given)
{
    const json_t *v = json_object_get(o, name);
    if (given) *given = v != NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return perr(p, field, "expected a JSON pointer or a dotted path");
    const char *s = json_string_value(v);
    if (!*s) return perr(p, field, "empty path (use \"/id\" or \"id\")");
    if (!(*out = strdup(s))) return perr(p, field, "out of memory");
    return 0;
}

/* One status list ("success": [200, "2xx", "503:retry-after"]) into req->rules. */
static int parse_rules(pctx_t *p, const json_t *o, const char *name, const char *field,
                       oq__http_class_t cls, const char *const *defaults, oq__http_request_t *req)
{
    const json_t *list = json_object_get(o, name);
    json_t *tmp = NULL;
    int rc = 0;
    if (!list) {
        tmp = json_array();
        for (const char *const *d = defaults; *d; d++) {
            char *e;
            long n = strtol(*d, &e, 10);
            json_array_append_new(tmp, *e ? json_string(*d) : json_integer(n));
        }
        list = tmp;
    }
    if (!json_is_array(list)) {
        rc = perr(p, field, "expected an array of statuses (200, \"4xx\", \"503:retry-after\")");
        goto out;
    }
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        char f[96];
        snprintf(f, sizeof f, "%s[%zu]", field, i);
        oq__http_rule_t r = {0, 0, 0, cls};
        if (json_is_integer(e)) {
            r.lo = r.hi = (int)json_integer_value(e);
            if (json_integer_value(e) < 100 || json_integer_value(e) > 599) {
                rc = perr(p, f, "status %lld is not in 100..599", (long long)json_integer_value(e));
                goto out;
            }
        } else if (json_is_string(e)) {
            const char *s = json_string_value(e);
            if (strlen(s) == 3 && s[0] >= '1' && s[0] <= '5' && (s[1] == 'x' || s[1] == 'X') &&
                (s[2] == 'x' || s[2] == 'X')) {
                r.lo = (s[0] - '0') * 100;
                r.hi = r.lo + 99;
            } else if (strlen(s) == 15 && isdigit((unsigned char)s[0]) &&
                       isdigit((unsigned char)s[1]) && isdigit((unsigned char)s[2]) &&
                       strcasecmp(s + 3, ":retry-after") == 0 && s[0] >= '1' && s[0] <= '5') {
                r.lo = r.hi = atoi(s);
                r.need_retry_after = 1;
            } else {
                rc = perr(p, f,
                          "\"%.40s\" is not a status (200), a class (\"4xx\") or "
                          "\"503:retry-after\"",
                          s);
                goto out;
            }
        } else {
            rc = perr(p, f, "expected a status (200), a class (\"4xx\") or \"503:retry-after\"");
            goto out;
        }
        for (size_t j = 0; j < req->nrules; j++) {
            const oq__http_rule_t *q = &req->rules[j];
            if (q->lo == r.lo && q->hi == r.hi && q->need_retry_after == r.need_retry_after) {
                rc = perr(p, f, "status rule listed twice (here and in the %s list)",
                          oq__http_class_name(q->cls));
                goto out;
            }
        }
        if (req->nrules == OQ__HTTP_MAX_RULES) {
            rc = perr(p, f, "more than %d status rules", OQ__HTTP_MAX_RULES);
            goto out;
        }
        req->rules[req->nrules++] = r;
    }
out:
    json_decref(tmp);
    return rc;
}

static int valid_header_name(const char *s, size_t n)
{
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || strchr("!#$%&'*+-.^_`|~", s[i]))) return 0;
    return 1;
}

static int add_header(oq__http_request_t *req, const char *name, const char *prefix,
                      const char *value, int kind)
{
    char **nh = realloc(req->headers, (req->nheaders + 1) * sizeof *nh);
    if (!nh) return OQ_ENOMEM;
    req->headers = nh;
    unsigned char *nk = realloc(req->header_kind, req->nheaders + 1);
    if (!nk) return OQ_ENOMEM;
    req->header_kind = nk;
    size_t n = strlen(name) + strlen(prefix) + strlen(value) + 3;
    if (!(nh[req->nheaders] = malloc(n))) return OQ_ENOMEM;
    snprintf(nh[req->nheaders], n, "%s: %s%s", name, prefix, value);
    nk[req->nheaders] = (unsigned char)kind;
    req->nheaders++;
    return 0;
}

/* A header value may go on one line as it is: no control character but tab. */
static int header_value_ok(const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)v[i] < 0x20 && v[i] != '\t') || v[i] == 0x7f) return 0;
    return 1;
}

/* A secret header value, {"env": NAME} or {"file": PATH} with an optional "prefix", read now.
 * Errors name the tool, the header and the variable or file, never the value. *out is
 * malloc()ed (the caller wipes and frees it). */
static int read_secret(pctx_t *p, const char *f, const json_t *v, char **out, const char **prefix)
{
    static const char *const fields[] = {"env", "file", "prefix", NULL};
    char sub[160];
    snprintf(sub, sizeof sub, "%s.", f);
    int rc = check_fields(p, v, sub, fields);
    if (rc) return rc;
    const json_t *env = json_object_get(v, "env"), *file = json_object_get(v, "file");
    const json_t *pre = json_object_get(v, "prefix");
    *out = NULL;
    *prefix = "";
    if (!env == !file)
        return perr(p, f, "a secret names one source: {\"env\": \"NAME\"} or {\"file\": \"PATH\"}");
    if (pre) {
        if (!json_is_string(pre) ||
            !header_value_ok(json_string_value(pre), json_string_length(pre)))
            return perr(p, f, "prefix: expected a one-line string");
        *prefix = json_string_value(pre);
    }
    if (env) {
        const char *name = json_is_string(env) ? json_string_value(env) : "";
        int ok = *name && (isalpha((unsigned char)*name) || *name == '_');
        for (const char *c = name; ok && *c; c++)
            ok = isalnum((unsigned char)*c) || *c == '_';
        if (!ok) return perr(p, f, "env: expected an environment variable name");
        const char *val = getenv(name);
        if (!val) return perr(p, f, "environment variable %.64s is not set", name);
        if (!*val) return perr(p, f, "environment variable %.64s is empty", name);
        if (!header_value_ok(val, strlen(val)))
            return perr(p, f, "environment variable %.64s holds a control character", name);
        if (!(*out = strdup(val))) return perr(p, f, "out of memory");
        return 0;
    }
    if (!json_is_string(file) || json_string_length(file) == 0)
        return perr(p, f, "file: expected a file name");
    const char *path = json_string_value(file);
    FILE *fp = fopen(path, "rb");
    if (!fp) return perr(p, f, "cannot read file %.100s: %s", path, strerror(errno));
    char *buf = malloc(65537);
    size_t n = buf ? fread(buf, 1, 65537, fp) : 0;
    int bad = !buf ? OQ_ENOMEM : ferror(fp) ? OQ_EIO : n > 65536 ? OQ_ETOOBIG : 0;
    fclose(fp);
    if (bad) {
        if (buf) explicit_bzero(buf, 65537);
        free(buf);
        return bad == OQ_ENOMEM ? perr(p, f, "out of memory")
               : bad == OQ_EIO  ? perr(p, f, "cannot read file %.100s", path)
                                : perr(p, f, "file %.100s is over 64 KiB", path);
    }
    while (n &&
           (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--; /* the newline an editor or `echo` leaves */
    buf[n] = '\0';
    const char *why = !n                         ? "is empty"
                      : memchr(buf, '\0', n)     ? "holds a NUL byte"
                      : !header_value_ok(buf, n) ? "holds a line break or a control character"
                                                 : NULL;
    if (why) {
        explicit_bzero(buf, 65537);
        free(buf);
        return perr(p, f, "file %.100s %s (one line expected)", path, why);
    }
    *out = buf;
    return 0;
}

static int parse_headers(pctx_t *p, const json_t *o, const char *field, oq__http_request_t *req,
                         const char *idem_header)
{
    const json_t *h = json_object_get(o, "headers");
    if (!h) return 0;
    if (!json_is_object(h)) return perr(p, field, "expected an object of name: value strings");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)h, k, v)
    {
        char f[128];
        snprintf(f, sizeof f, "%s.%.64s", field, k);
        if (!valid_header_name(k, strlen(k))) return perr(p, f, "not a valid header name");
        static const char *const reserved[] = {"Content-Length", "Host",       "Transfer-Encoding",
                                               "Expect",         "Connection", NULL};
        for (const char *const *r = reserved; *r; r++)
            if (strcasecmp(*r, k) == 0) return perr(p, f, "set by the executor, not by tools");
        if (idem_header && strcasecmp(idem_header, k) == 0)
            return perr(p, f, "is the idempotency header; its value is always the effect id");
        if (json_is_object(v)) {
            char *secret = NULL;
            const char *prefix;
            int rc = read_secret(p, f, v, &secret, &prefix);
            if (rc) return rc;
            rc = add_header(req, k, prefix, secret, OQ__HTTP_HDR_SECRET);
            explicit_bzero(secret, strlen(secret));
            free(secret);
            if (rc) return perr(p, f, "out of memory");
            continue;
        }
        if (!json_is_string(v) || !header_value_ok(json_string_value(v), json_string_length(v)))
            return perr(p, f,
                        "expected a one-line string, or a secret {\"env\": \"NAME\"} / "
                        "{\"file\": \"PATH\"}");
        /* a template like the URL: the same placeholders, expanded per request */
        const char *t = json_string_value(v);
        int rc = check_template(p, f, t, NULL);
        if (rc) return rc;
        if (strstr(t, "{args}") || strstr(t, "{args?}"))
            return perr(p, f, "{args} is the whole argument object: it cannot fill a header");
        if (add_header(req, k, "", t, OQ__HTTP_HDR_TEMPLATE)) return perr(p, f, "out of memory");
    }
    return 0;
}

static int parse_method(pctx_t *p, const json_t *o, const char *field, const char *def,
                        oq__http_request_t *req)
{
    static const char *const methods[] = {"GET", "POST", "PUT", "PATCH", "DELETE", NULL};
    const json_t *v = json_object_get(o, "method");
    const char *m = def;
    if (v) {
        if (!json_is_string(v)) return perr(p, field, "expected a string");
        m = json_string_value(v);
    }
    for (const char *const *x = methods; *x; x++)
        if (strcmp(*x, m) == 0) {
            if (!(req->method = strdup(m))) return perr(p, field, "out of memory");
            return 0;
        }
    return perr(p, field, "\"%.16s\" is not one of GET, POST, PUT, PATCH, DELETE", m);
}

static int parse_url(pctx_t *p, const json_t *o, const char *field, oq__http_request_t *req,
                     int *placeholders)
{
    int rc = get_string(p, o, "url", field, &req->url, 1);
    if (rc) return rc;
    if (strncmp(req->url, "http://", 7) != 0 && strncmp(req->url, "https://", 8) != 0)
        return perr(p, field, "must start with http:// or https://");
    if (strpbrk(req->url, " \t\r\n")) return perr(p, field, "contains white space");
    return check_template(p, field, req->url, placeholders);
}

static void request_clear(oq__http_request_t *r)
{
    free(r->method);
    free(r->url);
    json_decref(r->body);
    for (size_t i = 0; i < r->nheaders; i++) {
        if (r->header_kind && r->header_kind[i] == OQ__HTTP_HDR_SECRET)
            explicit_bzero(r->headers[i], strlen(r->headers[i]));
        free(r->headers[i]);
    }
    free(r->headers);
    free(r->header_kind);
    free(r->object_id);
    free(r->exists);
    memset(r, 0, sizeof *r);
}

static int parse_lookup(pctx_t *p, const json_t *l, oq__http_tool_t *t)
{
    static const char *const fields[] = {"method",     "url",       "headers", "connect_timeout_ms",
                                         "timeout_ms", "object_id", "exists",  "found",
                                         "absent",     "settle_ms", NULL};
    static const char *const found_def[] = {"200", NULL};
    static const char *const absent_def[] = {"404", NULL};
    oq__http_request_t *r = &t->lookup;
    int rc, n = 0, given;
    if (!json_is_object(l)) return perr(p, "lookup", "expected an object");
    if ((rc = check_fields(p, l, "lookup.", fields))) return rc;
    if ((rc = parse_method(p, l, "lookup.method", "GET", r))) return rc;
    if (strcmp(r->method, "GET") != 0)
        return perr(p, "lookup.method", "a lookup must be a GET (it must not change anything)");
    if ((rc = parse_url(p, l, "lookup.url", r, &n))) return rc;
    if (n == 0)
        return perr(p, "lookup.url",
                    "needs a placeholder that identifies the call ({effect_id} or an argument)");
    r->body_mode = OQ__HTTP_BODY_NONE;
    if ((rc = parse_headers(p, l, "lookup.headers", r, NULL))) return rc;
    r->connect_timeout_ms = t->call.connect_timeout_ms;
    r->timeout_ms = t->call.timeout_ms;
    if ((rc = get_ms(p, l, "connect_timeout_ms", "lookup.connect_timeout_ms", 1, 600000,
                     &r->connect_timeout_ms)) ||
        (rc = get_ms(p, l, "timeout_ms", "lookup.timeout_ms", 1, 3600000, &r->timeout_ms)))
        return rc;
    if (r->connect_timeout_ms > r->timeout_ms)
        return perr(p, "lookup.connect_timeout_ms", "longer than lookup.timeout_ms");
    if ((rc = get_path(p, l, "object_id", "lookup.object_id", &r->object_id, &given))) return rc;
    if (!given && t->call.object_id && !(r->object_id = strdup(t->call.object_id)))
        return perr(p, "lookup.object_id", "out of memory");
    if ((rc = get_path(p, l, "exists", "lookup.exists", &r->exists, NULL))) return rc;
    /* how long after a send a "not found" is trusted (a downstream without keys): by default
     * the call's own timeout, after which the client has given the request up */
    t->settle_ms = t->call.timeout_ms;
    if ((rc = get_ms(p, l, "settle_ms", "lookup.settle_ms", 0, 86400000, &t->settle_ms))) return rc;
    if ((rc = parse_rules(p, l, "found", "lookup.found", OQ__HTTP_FOUND, found_def, r)) ||
        (rc = parse_rules(p, l, "absent", "lookup.absent", OQ__HTTP_ABSENT, absent_def, r)))
        return rc;
    t->has_lookup = 1;
    return 0;
}

/* A PEM file named by a TLS field: readable now, and PEM (a later failure would only show as
 * a failed handshake on every call). */
static int check_pem_file(pctx_t *p, const char *field, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return perr(p, field, "cannot read %.100s: %s", path, strerror(errno));
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    int rd = ferror(f);
    fclose(f);
    buf[n] = '\0';
    if (rd) return perr(p, field, "cannot read %.100s", path);
    int pem = strstr(buf, "-----BEGIN ") != NULL;
    explicit_bzero(buf, sizeof buf); /* may be a private key */
    if (!pem) return perr(p, field, "%.100s is not a PEM file (no -----BEGIN line)", path);
    return 0;
}

/* ca_file, client_cert, client_key: files checked now, used for the call and its lookup. */
static int parse_tls(pctx_t *p, const json_t *o, oq__http_tool_t *t)
{
    int rc;
    if ((rc = get_string(p, o, "ca_file", "ca_file", &t->ca_file, 0)) ||
        (rc = get_string(p, o, "client_cert", "client_cert", &t->client_cert, 0)) ||
        (rc = get_string(p, o, "client_key", "client_key", &t->client_key, 0)))
        return rc;
    if (!t->ca_file && !t->client_cert && !t->client_key) return 0;
    const char *f = t->ca_file ? "ca_file" : t->client_cert ? "client_cert" : "client_key";
    if (strncmp(t->call.url, "https://", 8) != 0)
        return perr(p, f, "TLS settings need an https:// url (url is \"%.60s\")", t->call.url);
    if (t->has_lookup && strncmp(t->lookup.url, "https://", 8) != 0)
        return perr(p, f, "TLS settings need an https:// url (lookup.url is \"%.60s\")",
                    t->lookup.url);
    if (t->client_key && !t->client_cert)
        return perr(p, "client_key", "needs client_cert (the certificate of that key)");
    if ((t->ca_file && (rc = check_pem_file(p, "ca_file", t->ca_file))) ||
        (t->client_cert && (rc = check_pem_file(p, "client_cert", t->client_cert))) ||
        (t->client_key && (rc = check_pem_file(p, "client_key", t->client_key))))
        return rc;
    return 0;
}

static void tool_clear(oq__http_tool_t *t);
static int parse_tool(pctx_t *p, const json_t *o, oq__http_tool_t *t);

/* kind "mcp": the tool's request(s) written by consumer/mcp_tools.c, parsed as HTTP tools. */
static int parse_mcp_tool(pctx_t *p, const json_t *o, oq__http_tool_t *t)
{
    json_t *call = NULL, *lookup = NULL;
    const char *field = NULL;
    char why[200], idx[sizeof p->where];
    oq__http_tool_t lt;
    memset(&lt, 0, sizeof lt);
    snprintf(idx, sizeof idx, "%s", p->where);
    snprintf(p->where, sizeof p->where, "tool \"%s\" (%.40s)",
             json_string_value(json_object_get(o, "name")), idx);
    int rc = oq__mcp_tool_translate(o, &call, &lookup, &field, why, sizeof why);
    if (rc)
        return rc == OQ_ENOMEM ? oq_error_set(p->err, rc, 0, "out of memory")
                               : perr(p, field, "%s", why);
    snprintf(p->where, sizeof p->where, "%s", idx);
    if ((rc = parse_tool(p, call, t)) == 0 && lookup) {
        snprintf(p->where, sizeof p->where, "%.100s, its lookup", idx);
        rc = parse_tool(p, lookup, &lt);
    }
    if (rc == 0) rc = oq__mcp_tool_bind(t, o, lookup ? &lt.call : NULL, p->err);
    tool_clear(&lt);
    json_decref(call);
    json_decref(lookup);
    return rc;
}

/* The HTTP part of a tool; name, description, input_schema, annotations and the field names
 * were checked by the catalogue (common/catalog.c), which parsed the file. */
static int parse_tool(pctx_t *p, const json_t *o, oq__http_tool_t *t)
{
    static const char *const success_def[] = {"2xx", NULL};
    static const char *const final_def[] = {"4xx", NULL};
    static const char *const retry_def[] = {"429", "503:retry-after", NULL};
    oq__http_request_t *r = &t->call;
    int rc, given;
    const json_t *v;
    if ((v = json_object_get(o, "kind")) && json_is_string(v) &&
        strcmp(json_string_value(v), "mcp") == 0)
        return parse_mcp_tool(p, o, t);
    if ((rc = get_string(p, o, "name", "name", &t->name, 1))) return rc;
    char idx[sizeof p->where];
    snprintf(idx, sizeof idx, "%s", p->where);
    snprintf(p->where, sizeof p->where, "tool \"%s\" (%.40s)", t->name, idx);
    if ((rc = parse_method(p, o, "method", "POST", r))) return rc;
    if ((rc = parse_url(p, o, "url", r, NULL))) return rc;

    /* idempotency header: default Idempotency-Key; null or "" sends none */
    const char *ih = "Idempotency-Key";
    if ((v = json_object_get(o, "idempotency_header"))) {
        if (json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0))
            ih = NULL;
        else if (json_is_string(v) &&
                 valid_header_name(json_string_value(v), json_string_length(v)))
            ih = json_string_value(v);
        else
            return perr(p, "idempotency_header", "expected a header name, or null for none");
    }
    if (ih && !(t->idem_header = strdup(ih))) return perr(p, "idempotency_header", "out of memory");
    if ((v = json_object_get(o, "idempotent"))) {
        if (!json_is_boolean(v)) return perr(p, "idempotent", "expected true or false");
        t->idempotent = json_is_true(v);
    }
    if (t->idempotent && !t->idem_header)
        return perr(p, "idempotent",
                    "true needs an idempotency_header (the downstream honours a key it never "
                    "receives?)");

    /* body */
    int can_body = strcmp(r->method, "GET") != 0 && strcmp(r->method, "DELETE") != 0;
    v = json_object_get(o, "body");
    if (!v) {
        r->body_mode = can_body ? OQ__HTTP_BODY_ARGS : OQ__HTTP_BODY_NONE;
    } else if (json_is_string(v) && strcmp(json_string_value(v), "args") == 0) {
        r->body_mode = OQ__HTTP_BODY_ARGS;
    } else if (json_is_string(v) && strcmp(json_string_value(v), "none") == 0) {
        r->body_mode = OQ__HTTP_BODY_NONE;
    } else if (json_is_object(v) || json_is_array(v)) {
        if ((rc = check_body_template(p, v))) return rc;
        r->body_mode = OQ__HTTP_BODY_TEMPLATE;
        r->body = json_deep_copy(v);
        if (!r->body) return perr(p, "body", "out of memory");
    } else {
        return perr(p, "body", "expected \"args\", \"none\", or a JSON object/array template");
    }
    if (r->body_mode != OQ__HTTP_BODY_NONE && strcmp(r->method, "GET") == 0)
        return perr(p, "body", "a GET carries no body (use \"none\")");

    if ((rc = parse_headers(p, o, "headers", r, t->idem_header))) return rc;
    r->connect_timeout_ms = 2000;
    r->timeout_ms = 10000;
    if ((rc = get_ms(p, o, "connect_timeout_ms", "connect_timeout_ms", 1, 600000,
                     &r->connect_timeout_ms)) ||
        (rc = get_ms(p, o, "timeout_ms", "timeout_ms", 1, 3600000, &r->timeout_ms)))
        return rc;
    if (r->connect_timeout_ms > r->timeout_ms)
        return perr(p, "connect_timeout_ms", "longer than timeout_ms");
    if ((rc = get_path(p, o, "object_id", "object_id", &r->object_id, &given))) return rc;
    if (!given && !(r->object_id = strdup("/id"))) return perr(p, "object_id", "out of memory");
    if ((rc = parse_rules(p, o, "success", "success", OQ__HTTP_SUCCESS, success_def, r)) ||
        (rc = parse_rules(p, o, "final", "final", OQ__HTTP_FINAL, final_def, r)) ||
        (rc = parse_rules(p, o, "retryable", "retryable", OQ__HTTP_RETRYABLE, retry_def, r)))
        return rc;
    if ((v = json_object_get(o, "lookup")) && !json_is_null(v) && (rc = parse_lookup(p, v, t)))
        return rc;
    return parse_tls(p, o, t);
}

static void tool_clear(oq__http_tool_t *t)
{
    free(t->name);
    free(t->idem_header);
    free(t->ca_file);
    free(t->client_cert);
    free(t->client_key);
    request_clear(&t->call);
    request_clear(&t->lookup);
    oq__mcp_tool_free(t->mcp);
}

void oq__http_tools_destroy(oq__http_tools_t *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n; i++)
        tool_clear(&t->tools[i]);
    free(t->tools);
    oq_catalog_destroy(t->catalog);
    free(t);
}

int oq__http_tools_parse(const char *text, size_t len, const char *origin, oq__http_tools_t **out,
                         oq_error_t *err)
{
    pctx_t p = {origin ? origin : "tools", "top level", err, 0};
    int rc;
    oq__http_tools_t *set = calloc(1, sizeof *set);
    if (!set) return oq_error_set(err, OQ_ENOMEM, 0, "%s: out of memory", p.origin);
    /* the file, its top level and each tool's catalogue part (common/catalog.c) */
    if ((rc = oq_catalog_parse(text, len, p.origin, &set->catalog, err))) goto out;
    size_t n = oq__catalog_nfile(set->catalog);
    if (n && !(set->tools = calloc(n, sizeof *set->tools))) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "%s: out of memory", p.origin);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(p.where, sizeof p.where, "tools[%zu]", i);
        set->n = i + 1;
        p.idem_alias = 0;
        if ((rc = parse_tool(&p, oq__catalog_file_tool(set->catalog, i), &set->tools[i]))) goto out;
        if (p.idem_alias) {
            OQ_LOG_WARN("tools",
                        "%s: %s: {idem_key} is the effect id, not the client's key: write "
                        "{effect_id} (the old name still works)",
                        p.origin, p.where);
            set->nwarnings++;
        }
    }
    *out = set;
    set = NULL;
    rc = 0;
out:
    oq__http_tools_destroy(set);
    return rc;
}

int oq__http_tools_load(const char *path, oq__http_tools_t **out, oq_error_t *err)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = oq__catalog_read_file(path, &buf, &len, err);
    if (rc == 0) rc = oq__http_tools_parse(buf, len, path, out, err);
    free(buf);
    return rc;
}

int64_t oq__http_tools_max_timeout(const oq__http_tools_t *t)
{
    int64_t m = 0;
    for (size_t i = 0; t && i < t->n; i++) {
        if (t->tools[i].call.timeout_ms > m) m = t->tools[i].call.timeout_ms;
        if (t->tools[i].has_lookup && t->tools[i].lookup.timeout_ms > m)
            m = t->tools[i].lookup.timeout_ms;
    }
    return m;
}

const oq__http_tool_t *oq__http_tools_find(const oq__http_tools_t *t, const char *name)
{
    if (!t || !name) return NULL;
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->tools[i].name, name) == 0) return &t->tools[i];
    return NULL;
}

/* ============================================================================================
 * Expansion
 * ==========================================================================================*/

typedef oq_buf_t sbuf_t;

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    oq_buf_put(b, s, n);
}

typedef struct tctx {
    const char *tool;
    const json_t *args;
    const char *effect_id;
    oq_error_t *err;
} tctx_t;

/* Resolves one placeholder name (without braces and '?') to a value: *str for text values,
 * *val for argument values. Returns 1 found, 0 absent, <0 error. */
static int resolve(const tctx_t *t, const char *name, size_t n, const char **str,
                   const json_t **val)
{
    *str = NULL;
    *val = NULL;
    if ((n == 9 && strncmp(name, "effect_id", 9) == 0) ||
        (n == 8 && strncmp(name, "idem_key", 8) == 0)) {
        *str = t->effect_id;
        return 1;
    }
    if (n == 4 && strncmp(name, "tool", 4) == 0) {
        *str = t->tool;
        return 1;
    }
    if (n == 4 && strncmp(name, "args", 4) == 0) {
        *val = t->args;
        return 1;
    }
    char key[128];
    if (n >= sizeof key) return 0;
    memcpy(key, name, n);
    key[n] = '\0';
    const json_t *v = t->args ? json_object_get(t->args, key) : NULL;
    if (!v || json_is_null(v)) return 0;
    *val = v;
    return 1;
}

/* Text of a scalar value (strings as they are, numbers canonical, booleans). */
static int scalar_text(const tctx_t *t, const char *name, size_t n, const char *str,
                       const json_t *val, char **out)
{
    if (str) return (*out = strdup(str)) ? 0 : OQ_ENOMEM;
    if (json_is_string(val)) return (*out = strdup(json_string_value(val))) ? 0 : OQ_ENOMEM;
    if (json_is_number(val) || json_is_boolean(val)) {
        oq_error_t e = {0};
        if (oq_jcs_canonicalize(val, out, NULL, &e) != 0)
            return oq_error_set(t->err, OQ_EINVAL, 0, "argument %.*s: %s", (int)n, name, e.msg);
        return 0;
    }
    return oq_error_set(t->err, OQ_EINVAL, 0,
                        "argument %.*s: an object or array cannot fill a text placeholder", (int)n,
                        name);
}

/* Expands the placeholders of text \p s into \p b; \p escape URL-encodes the values. */
static int expand_text(const tctx_t *t, const char *s, int escape, sbuf_t *b)
{
    for (;;) {
        const char *o = strchr(s, '{');
        if (!o) {
            sb_put(b, s, strlen(s));
            break;
        }
        sb_put(b, s, (size_t)(o - s));
        const char *c = strchr(o, '}');
        if (!c) return oq_error_set(t->err, OQ_EINVAL, 0, "unclosed placeholder");
        const char *name = o + 1;
        size_t n = (size_t)(c - name);
        int optional = n && name[n - 1] == '?';
        if (optional) n--;
        const char *str;
        const json_t *val;
        int found = resolve(t, name, n, &str, &val);
        if (!found) {
            if (!optional)
                return oq_error_set(t->err, OQ_EINVAL, 0, "missing argument %.*s", (int)n, name);
        } else {
            char *text = NULL;
            int rc = scalar_text(t, name, n, str, val, &text);
            if (rc) return rc == OQ_ENOMEM ? oq_error_set(t->err, rc, 0, "out of memory") : rc;
            if (escape) {
                char *e = curl_easy_escape(NULL, text, (int)strlen(text));
                free(text);
                if (!e) return oq_error_set(t->err, OQ_ENOMEM, 0, "out of memory");
                sb_put(b, e, strlen(e));
                curl_free(e);
            } else {
                sb_put(b, text, strlen(text));
                free(text);
            }
        }
        s = c + 1;
    }
    return b->err ? oq_error_set(t->err, OQ_ENOMEM, 0, "out of memory") : 0;
}

int oq__http_expand_url(const char *tmpl, const char *tool, const json_t *args,
                        const char *effect_id, char **out, oq_error_t *err)
{
    tctx_t t = {tool, args, effect_id, err};
    sbuf_t b = {0};
    int rc = expand_text(&t, tmpl, 1, &b);
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p ? b.p : strdup("");
    return *out ? 0 : oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
}

/* One header line "Name: value" with the value's placeholders expanded (not URL-encoded). A
 * value that would carry a control character (a line break from an argument) is refused. */
static int expand_header(const char *line, const char *tool, const json_t *args,
                         const char *effect_id, char **out, oq_error_t *err)
{
    tctx_t t = {tool, args, effect_id, err};
    sbuf_t b = {0};
    const char *colon = strchr(line, ':');
    size_t head = colon ? (size_t)(colon - line) + 2 : 0; /* "Name: " */
    sb_put(&b, line, head);
    int rc = expand_text(&t, line + head, 0, &b);
    if (rc == 0 && b.err) rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (rc == 0 && !header_value_ok(b.p + head, b.len - head))
        rc = oq_error_set(err, OQ_EINVAL, 0,
                          "header %.*s: an argument put a control character in its value",
                          (int)(head > 2 ? head - 2 : 0), line);
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    return 0;
}

/* A string that is exactly one placeholder: its name (and optional flag), else NULL. */
static const char *whole_placeholder(const char *s, size_t *n, int *optional)
{
    size_t len = strlen(s);
    if (len < 3 || s[0] != '{' || s[len - 1] != '}' || memchr(s + 1, '{', len - 2) ||
        memchr(s + 1, '}', len - 2))
        return NULL;
    *n = len - 2;
    *optional = s[len - 2] == '?';
    if (*optional) (*n)--;
    return s + 1;
}

/* Expands template value \p v; *out = NULL means "leave the member out" (optional absent). */
static int expand_value(const tctx_t *t, const json_t *v, json_t **out)
{
    *out = NULL;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n;
        int optional;
        const char *name = whole_placeholder(s, &n, &optional);
        if (name) {
            const char *str;
            const json_t *val;
            if (!resolve(t, name, n, &str, &val)) {
                if (optional) return 0;
                return oq_error_set(t->err, OQ_EINVAL, 0, "missing argument %.*s", (int)n, name);
            }
            *out = str ? json_string(str) : json_deep_copy(val);
            return *out ? 0 : oq_error_set(t->err, OQ_ENOMEM, 0, "out of memory");
        }
        sbuf_t b = {0};
        int rc = expand_text(t, s, 0, &b);
        if (rc == 0) {
            *out = json_string(b.p ? b.p : "");
            if (!*out) rc = oq_error_set(t->err, OQ_EINVAL, 0, "expanded text is not UTF-8");
        }
        free(b.p);
        return rc;
    }
    if (json_is_array(v)) {
        json_t *a = json_array();
        size_t i;
        json_t *e;
        if (!a) return oq_error_set(t->err, OQ_ENOMEM, 0, "out of memory");
        json_array_foreach(v, i, e)
        {
            json_t *x;
            int rc = expand_value(t, e, &x);
            if (rc) {
                json_decref(a);
                return rc;
            }
            if (x) json_array_append_new(a, x);
        }
        *out = a;
        return 0;
    }
    if (json_is_object(v)) {
        json_t *o = json_object();
        const char *k;
        json_t *e;
        if (!o) return oq_error_set(t->err, OQ_ENOMEM, 0, "out of memory");
        json_object_foreach((json_t *)v, k, e)
        {
            json_t *x;
            int rc = expand_value(t, e, &x);
            if (rc) {
                json_decref(o);
                return rc;
            }
            if (x) json_object_set_new(o, k, x);
        }
        *out = o;
        return 0;
    }
    *out = json_deep_copy(v);
    return *out ? 0 : oq_error_set(t->err, OQ_ENOMEM, 0, "out of memory");
}

int oq__http_build_body(const oq__http_request_t *req, const char *tool, const json_t *args,
                        const char *effect_id, char **out, size_t *out_len, oq_error_t *err)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    if (req->body_mode == OQ__HTTP_BODY_NONE) return 0;
    json_t *empty = NULL, *doc = NULL;
    int rc;
    if (!args) args = empty = json_object();
    if (req->body_mode == OQ__HTTP_BODY_ARGS) {
        rc = oq_jcs_canonicalize(args, out, out_len, err);
    } else {
        tctx_t t = {tool, args, effect_id, err};
        rc = expand_value(&t, req->body, &doc);
        if (rc == 0) rc = oq_jcs_canonicalize(doc, out, out_len, err);
    }
    json_decref(doc);
    json_decref(empty);
    return rc;
}

const json_t *oq__http_json_path(const json_t *doc, const char *path)
{
    if (!doc || !path) return NULL;
    const json_t *cur = doc;
    char seg[256];
    const char *s = path;
    int pointer = *s == '/';
    if (pointer) s++;
    if (!*s) return pointer ? cur : NULL;
    for (;;) {
        const char *end = strchr(s, pointer ? '/' : '.');
        size_t n = end ? (size_t)(end - s) : strlen(s), k = 0;
        if (n >= sizeof seg) return NULL;
        for (size_t i = 0; i < n; i++) { /* RFC 6901 escapes: ~1 is '/', ~0 is '~' */
            if (pointer && s[i] == '~' && i + 1 < n && (s[i + 1] == '0' || s[i + 1] == '1')) {
                seg[k++] = s[i + 1] == '1' ? '/' : '~';
                i++;
            } else {
                seg[k++] = s[i];
            }
        }
        seg[k] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg);
        } else if (json_is_array(cur)) {
            char *e;
            if (!k || !isdigit((unsigned char)seg[0]) || (seg[0] == '0' && k > 1)) return NULL;
            unsigned long idx = strtoul(seg, &e, 10);
            if (*e) return NULL;
            cur = json_array_get(cur, idx);
        } else {
            return NULL;
        }
        if (!cur) return NULL;
        if (!end) return cur;
        s = end + 1;
    }
}

/* ============================================================================================
 * Classification
 * ==========================================================================================*/

static const oq__http_rule_t *match_rule(const oq__http_request_t *req, long status,
                                         int has_retry_after)
{
    const oq__http_rule_t *best = NULL;
    int best_score = 0;
    for (size_t i = 0; i < req->nrules; i++) {
        const oq__http_rule_t *r = &req->rules[i];
        if (status < r->lo || status > r->hi) continue;
        if (r->need_retry_after && !has_retry_after) continue;
        int score = r->need_retry_after ? 3 : r->lo == r->hi ? 2 : 1;
        if (score > best_score) {
            best = r;
            best_score = score;
        }
    }
    return best;
}

oq__http_class_t oq__http_classify(const oq__http_request_t *req, const oq__http_facts_t *f,
                                   char code[48])
{
    oq__http_class_t not_sent = f->is_lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_RETRYABLE;
    oq__http_class_t maybe = f->is_lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_UNKNOWN;
    if (f->status >= 100) {
        const oq__http_rule_t *r = match_rule(req, f->status, f->has_retry_after);
        if (!r) {
            snprintf(code, 48, "undeclared_status_%ld", f->status);
            return maybe;
        }
        snprintf(code, 48, "status_%ld", f->status);
        return r->cls;
    }
    switch (f->curl_code) {
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
        snprintf(code, 48, "bad_url");
        return f->is_lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_FINAL;
    default:
        break;
    }
    if (f->sent) {
        switch (f->curl_code) {
        case CURLE_OPERATION_TIMEDOUT:
            snprintf(code, 48, "timeout_after_send");
            break;
        case CURLE_GOT_NOTHING:
            snprintf(code, 48, "closed_without_answer");
            break;
        case CURLE_RECV_ERROR:
        case CURLE_SEND_ERROR:
            snprintf(code, 48, "connection_reset_after_send");
            break;
        case CURLE_ABORTED_BY_CALLBACK:
            snprintf(code, 48, "connection_lost_after_send");
            break;
        case CURLE_OK:
            snprintf(code, 48, "no_status");
            break;
        default:
            snprintf(code, 48, "error_after_send_%d", f->curl_code);
            break;
        }
        return maybe;
    }
    switch (f->curl_code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        snprintf(code, 48, "dns_failed");
        break;
    case CURLE_COULDNT_CONNECT:
        snprintf(code, 48, "connect_failed");
        break;
    case CURLE_OPERATION_TIMEDOUT:
        snprintf(code, 48, "timeout_before_send");
        break;
    default:
        snprintf(code, 48, "not_sent_%d", f->curl_code);
        break;
    }
    return not_sent;
}

/* ============================================================================================
 * Executor
 * ==========================================================================================*/

typedef struct xfer xfer_t;
struct xfer {
    oq__http_exec_t *x;
    CURL *easy;
    const oq__http_tool_t *tool;
    const oq__http_request_t *req;
    int is_lookup;
    char *effect_id;
    char *url;
    char *body;
    size_t body_len;
    struct curl_slist *hdrs;
    oq_buf_t resp;      /* the answer's body as kept (up to max_response) */
    int64_t resp_bytes; /* the body's bytes as they arrived, kept or not */
    /* what reached the socket in the current attempt */
    char tail[4];
    size_t tail_len;
    int hdr_done;
    int64_t body_out;
    int sent;
    int attempts;
    int got_answer;
    int has_retry_after;
    int64_t retry_after_ms;
    int64_t submit_us;
    oq__http_cb cb;
    void *ctx;
    /* set when the request failed before it could be built (bad arguments) */
    int prefail;
    int abandoned; /* given up by a draining or closing executor (deliver_abandoned) */
    char prefail_msg[256];
    xfer_t *next, *prev;
};

struct oq__http_exec {
    CURLM *multi;
    int max_inflight;
    int64_t max_response;
    long max_conn_age_s;
    /* submissions from any thread */
    pthread_mutex_t mu;
    xfer_t *in_head, *in_tail;
    int closing;
    atomic_int pending;
    atomic_int draining; /* no new transfer starts (oq__http_exec_drain) */
    /* polling thread only */
    xfer_t *wait_head, *wait_tail; /* accepted, waiting for a slot */
    xfer_t *running;               /* in the multi handle (doubly linked) */
    int nrunning;
    CURL **idle; /* reset easy handles kept for the next transfers (up to cap_idle) */
    int nidle, cap_idle;
    /* the multi's sockets (CURLMOPT_SOCKETFUNCTION); its timer is read with curl_multi_timeout */
    int epfd; /* the sockets curl asks to watch, and evfd */
    int evfd; /* eventfd: oq__http_exec_wakeup */
    /* what epfd holds of each socket curl opened through on_open_socket (index: the fd; FD_*) */
    unsigned char *fdst;
    int nfdst;
    uint64_t epoll_ctls; /* on curl's sockets (oq__http_exec_epoll_ctls) */
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void xfer_free(xfer_t *t)
{
    if (!t) return;
    free(t->effect_id);
    free(t->url);
    free(t->body);
    curl_slist_free_all(t->hdrs);
    oq_buf_free(&t->resp);
    free(t);
}

/*
 * The sockets in the epoll set. curl says REMOVE for a connection's socket at the end of every
 * transfer, when the connection goes back to its cache, and asks for it again (IN, once the
 * next request is written) at the start of the next one: an EPOLL_CTL_DEL and an _ADD per
 * request on a kept-alive connection. So a socket curl opened here (on_open_socket) and closes
 * here (on_close_socket, which forgets it: close() takes it out of the set) is parked instead
 * at REMOVE: left in the set with its last events, marked FD_PARKED; asked for again with the
 * same events, it costs nothing. A parked socket that becomes ready (the peer closed the idle
 * connection, or sent what nobody asked for) is taken out of the set then (drive), and curl,
 * which checks a connection before it reuses it, finds it dead. Any other socket (one curl
 * opened itself) is added and deleted as before.
 */
enum { FD_OURS = 1, FD_REG = 2, FD_PARKED = 4, FD_IN = 8, FD_OUT = 16 };

/* The state of socket \p s (NULL when not tracked); \p grow: make room for it. */
static unsigned char *fd_state(oq__http_exec_t *x, curl_socket_t s, int grow)
{
    if (s < 0) return NULL;
    if (s < x->nfdst) return &x->fdst[s];
    if (!grow || s >= (1 << 24)) return NULL;
    int n = x->nfdst ? x->nfdst : 64;
    while (n <= s)
        n *= 2;
    unsigned char *ns = realloc(x->fdst, (size_t)n);
    if (!ns) return NULL;
    memset(ns + x->nfdst, 0, (size_t)(n - x->nfdst));
    x->fdst = ns;
    x->nfdst = n;
    return &x->fdst[s];
}

/* CURLOPT_OPENSOCKETFUNCTION: the socket of a new connection, known from now on. */
static curl_socket_t on_open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *a)
{
    oq__http_exec_t *x = ud;
    (void)purpose;
    curl_socket_t s = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
    if (s == CURL_SOCKET_BAD) return s;
    unsigned char *st = fd_state(x, s, 1);
    if (st) *st = FD_OURS;
    return s;
}

/* CURLOPT_CLOSESOCKETFUNCTION: a connection closed (which takes its socket out of epfd). */
static int on_close_socket(void *ud, curl_socket_t s)
{
    oq__http_exec_t *x = ud;
    unsigned char *st = fd_state(x, s, 0);
    if (st) *st = 0;
    return close(s);
}

/* CURLMOPT_SOCKETFUNCTION: curl says which of its sockets to watch, and for what. The socket
 * is added to epfd the first time (marked with curl_multi_assign), changed after, parked or
 * removed when curl is done with it (above). @locality the polling thread (inside curl's
 * calls). */
static int on_socket(CURL *e, curl_socket_t s, int what, void *ud, void *sockp)
{
    oq__http_exec_t *x = ud;
    (void)e;
    unsigned char *st = fd_state(x, s, 0);
    if (st && !(*st & FD_OURS)) st = NULL;
    if (what == CURL_POLL_REMOVE) {
        if (st && (*st & FD_REG)) {
            *st |= FD_PARKED;
            return 0;
        }
        x->epoll_ctls++;
        epoll_ctl(x->epfd, EPOLL_CTL_DEL, s, NULL); /* (ENOENT/EBADF: already gone) */
        return 0;
    }
    unsigned char want =
        (unsigned char)((what & CURL_POLL_IN ? FD_IN : 0) | (what & CURL_POLL_OUT ? FD_OUT : 0));
    if (st && (*st & FD_REG) && (*st & (FD_IN | FD_OUT)) == want) {
        *st = (unsigned char)(FD_OURS | FD_REG | want); /* (no longer parked) */
        if (!sockp) curl_multi_assign(x->multi, s, x);
        return 0;
    }
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u);
    ev.data.fd = s;
    int op = (st ? (*st & FD_REG) != 0 : sockp != NULL) ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    x->epoll_ctls++;
    int rc = epoll_ctl(x->epfd, op, s, &ev);
    if (rc != 0 && errno == (op == EPOLL_CTL_ADD ? EEXIST : ENOENT)) {
        x->epoll_ctls++;
        rc = epoll_ctl(x->epfd, op == EPOLL_CTL_ADD ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, s, &ev);
    }
    if (st) *st = (unsigned char)(rc == 0 ? FD_OURS | FD_REG | want : FD_OURS);
    if (rc == 0 && !sockp) curl_multi_assign(x->multi, s, x);
    /* (never -1: curl would mark the whole multi handle dead. A socket not watched leaves its
     * transfer to curl's timer: it ends at its timeout, classified sent or not as usual.) */
    if (rc != 0) OQ_LOG_WARN("tools", "http exec: epoll_ctl on a socket: %s", strerror(errno));
    return 0;
}

uint64_t oq__http_exec_epoll_ctls(const oq__http_exec_t *x)
{
    return x ? x->epoll_ctls : 0;
}

oq__http_exec_t *oq__http_exec_new(const oq__http_exec_opts_t *opts, oq_error_t *err)
{
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        oq_error_set(err, OQ_EIO, (int)curl_init_rc, "curl_global_init: %s",
                     curl_easy_strerror(curl_init_rc));
        return NULL;
    }
    oq__http_exec_t *x = calloc(1, sizeof *x);
    if (!x) {
        oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        return NULL;
    }
    x->epfd = x->evfd = -1;
    x->max_inflight = opts && opts->max_inflight > 0 ? opts->max_inflight : 1024;
    x->max_response = opts && opts->max_response > 0 ? opts->max_response : 1024 * 1024;
    int64_t age = opts && opts->max_conn_age_ms > 0 ? opts->max_conn_age_ms : 20000;
    x->max_conn_age_s = age < 1000 ? 1 : (long)(age / 1000);
    x->cap_idle = x->max_inflight < 1024 ? x->max_inflight : 1024;
    pthread_mutex_init(&x->mu, NULL);
    if (!(x->idle = calloc((size_t)x->cap_idle, sizeof *x->idle))) {
        oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto fail;
    }
    if ((x->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        (x->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        oq_error_set(err, OQ_EIO, errno, "http exec: epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.fd = x->evfd;
    if (epoll_ctl(x->epfd, EPOLL_CTL_ADD, x->evfd, &ev) != 0) {
        oq_error_set(err, OQ_EIO, errno, "http exec: epoll_ctl: %s", strerror(errno));
        goto fail;
    }
    if (!(x->multi = curl_multi_init())) {
        oq_error_set(err, OQ_ENOMEM, 0, "curl_multi_init failed");
        goto fail;
    }
    curl_multi_setopt(x->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, 0L);
    curl_multi_setopt(x->multi, CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
    curl_multi_setopt(x->multi, CURLMOPT_MAXCONNECTS, (long)x->max_inflight);
    curl_multi_setopt(x->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(x->multi, CURLMOPT_SOCKETDATA, x);
    return x;
fail:
    if (x->epfd >= 0) close(x->epfd);
    if (x->evfd >= 0) close(x->evfd);
    free(x->idle);
    pthread_mutex_destroy(&x->mu);
    free(x);
    return NULL;
}

/* --- curl callbacks (polling thread) ----------------------------------------------------- */

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    xfer_t *t = ud;
    size_t n = size * nmemb;
    t->got_answer = 1;
    t->resp_bytes += (int64_t)n;
    size_t keep = n;
    if ((int64_t)(t->resp.len + keep) > t->x->max_response)
        keep = t->x->max_response > (int64_t)t->resp.len ? (size_t)t->x->max_response - t->resp.len
                                                         : 0;
    if (keep) oq_buf_put(&t->resp, ptr, keep); /* on failure, keep reading: the body is not kept */
    return n;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *ud)
{
    xfer_t *t = ud;
    size_t n = size * nmemb;
    t->got_answer = 1;
    t->sent = 1; /* an answer arrived: the request reached the downstream */
    if (n >= 5 && strncmp(ptr, "HTTP/", 5) == 0) { /* a new response (e.g. after a 1xx) */
        t->has_retry_after = 0;
        t->retry_after_ms = -1;
        return n;
    }
    static const char name[] = "retry-after:";
    if (n > sizeof name - 1 && strncasecmp(ptr, name, sizeof name - 1) == 0) {
        char v[128];
        size_t vl = n - (sizeof name - 1);
        if (vl >= sizeof v) vl = sizeof v - 1;
        memcpy(v, ptr + sizeof name - 1, vl);
        v[vl] = '\0';
        char *s = v;
        while (*s == ' ' || *s == '\t')
            s++;
        size_t l = strlen(s);
        while (l && (s[l - 1] == '\r' || s[l - 1] == '\n' || s[l - 1] == ' '))
            s[--l] = '\0';
        char *e;
        long long secs = strtoll(s, &e, 10);
        if (l && !*e && secs >= 0) {
            t->has_retry_after = 1;
            t->retry_after_ms = secs > 86400 ? 86400000 : secs * 1000;
        } else {
            time_t when = curl_getdate(s, NULL);
            if (when != (time_t)-1) {
                int64_t ms = ((int64_t)when - (int64_t)time(NULL)) * 1000;
                t->has_retry_after = 1;
                t->retry_after_ms = ms < 0 ? 0 : ms > 86400000 ? 86400000 : ms;
            }
        }
    }
    return n;
}

static int on_debug(CURL *h, curl_infotype type, char *data, size_t size, void *ud)
{
    xfer_t *t = ud;
    (void)h;
    if (type == CURLINFO_HEADER_OUT) {
        /* track the last 4 bytes written: the header block ends with CRLF CRLF (only the
         * last 4 of a write matter, and of the ones before only what they leave) */
        size_t take = size < 4 ? size : 4, keep = 4 - take;
        if (t->tail_len > keep) {
            memmove(t->tail, t->tail + (t->tail_len - keep), keep);
            t->tail_len = keep;
        }
        memcpy(t->tail + t->tail_len, data + (size - take), take);
        t->tail_len += take;
        if (t->tail_len == 4 && memcmp(t->tail, "\r\n\r\n", 4) == 0) t->hdr_done = 1;
    } else if (type == CURLINFO_DATA_OUT) {
        t->body_out += (int64_t)size;
    } else if (type == CURLINFO_HEADER_IN) {
        t->sent = 1;
    } else {
        return 0;
    }
    if (t->hdr_done && t->body_out >= (int64_t)t->body_len) t->sent = 1;
    return 0;
}

static int on_prereq(void *ud, char *ip, char *lip, int port, int lport)
{
    xfer_t *t = ud;
    (void)ip, (void)lip, (void)port, (void)lport;
    if (t->attempts++ > 0) {
        /* curl is about to resend on a new connection after the old one died */
        if (t->sent) return CURL_PREREQFUNC_ABORT;
        t->tail_len = 0;
        t->hdr_done = 0;
        t->body_out = 0;
    }
    return CURL_PREREQFUNC_OK;
}

/* --- lifecycle of one transfer ----------------------------------------------------------- */

static void deliver(oq__http_exec_t *x, xfer_t *t, oq__http_class_t cls, const char *code,
                    const char *msg, long status, int curl_code)
{
    oq__http_outcome_t o;
    memset(&o, 0, sizeof o);
    o.cls = cls;
    o.code = code;
    o.message = msg;
    o.status = status;
    o.curl_code = curl_code;
    o.sent = t->sent;
    o.abandoned = t->abandoned;
    o.retry_after_ms = t->has_retry_after ? t->retry_after_ms : -1;
    o.body = t->resp.p;
    o.body_len = t->resp.len;
    o.body_bytes = t->resp_bytes;
    o.elapsed_us = oq_mono_us() - t->submit_us;
    o.effect_id = t->effect_id;
    o.tool = t->tool;
    char idbuf[256];
    json_t *doc = NULL, *strict = NULL;
    const char *exists_missing = NULL;
    /* one parse for every reader: the object id here, what the answer means in the callback
     * (an "mcp" tool's body is read as JSON-RPC there instead) */
    if (t->resp.len && t->resp.len <= OQ__HTTP_PARSE_MAX && !t->tool->mcp) {
        strict = json_loadb(t->resp.p, t->resp.len, JSON_REJECT_DUPLICATES, NULL);
        o.parsed = 1;
        o.doc = strict;
    }
    if ((cls == OQ__HTTP_SUCCESS || cls == OQ__HTTP_FOUND) && t->resp.len &&
        (t->req->object_id || t->req->exists))
        doc = strict ? json_incref(strict) : json_loadb(t->resp.p, t->resp.len, 0, NULL);
    if (cls == OQ__HTTP_FOUND && t->req->exists) {
        const json_t *e = oq__http_json_path(doc, t->req->exists);
        if (!doc) {
            o.cls = OQ__HTTP_UNDECIDED;
            o.code = "unreadable_answer";
        } else if (!e || json_is_null(e) || (json_is_array(e) && json_array_size(e) == 0)) {
            o.cls = OQ__HTTP_ABSENT;
            o.code = "not_in_answer";
            exists_missing = t->req->exists;
        }
    }
    if ((o.cls == OQ__HTTP_SUCCESS || o.cls == OQ__HTTP_FOUND) && t->req->object_id) {
        const json_t *v = oq__http_json_path(doc, t->req->object_id);
        if (json_is_string(v) && json_string_length(v) < sizeof idbuf) {
            o.object_id = json_string_value(v);
        } else if (json_is_integer(v)) {
            snprintf(idbuf, sizeof idbuf, "%lld", (long long)json_integer_value(v));
            o.object_id = idbuf;
        }
    }
    char mbuf[256];
    if (exists_missing) {
        snprintf(mbuf, sizeof mbuf, "status %ld but nothing at %s", status, exists_missing);
        o.message = mbuf;
    }
    atomic_fetch_sub(&x->pending, 1);
    t->cb(&o, t->ctx);
    json_decref(doc);
    json_decref(strict);
}

/* The executor gives up on \p t (draining or closing): "abandoned", flagged as such. */
static void deliver_abandoned(oq__http_exec_t *x, xfer_t *t, oq__http_class_t cls, const char *msg)
{
    t->abandoned = 1;
    deliver(x, t, cls, "abandoned", msg, 0, 0);
}

static void finish(oq__http_exec_t *x, xfer_t *t, CURLcode cc)
{
    long status = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    oq__http_facts_t f = {t->is_lookup,
                          (int)cc,
                          t->sent,
                          status,
                          cc == CURLE_OK,
                          t->has_retry_after,
                          t->has_retry_after ? t->retry_after_ms : -1};
    char code[48], msg[256];
    oq__http_class_t cls = oq__http_classify(t->req, &f, code);
    if (cc == CURLE_OK)
        snprintf(msg, sizeof msg, "HTTP %ld", status);
    else
        snprintf(msg, sizeof msg, "%s%s (request %s)", curl_easy_strerror(cc),
                 status ? " after the status line" : "", t->sent ? "sent" : "not sent");
    deliver(x, t, cls, code, msg, status, (int)cc);
}

static int start(oq__http_exec_t *x, xfer_t *t)
{
    CURL *e = x->nidle ? x->idle[--x->nidle] : curl_easy_init();
    if (!e) return OQ_ENOMEM;
    t->easy = e;
    t->retry_after_ms = -1;
    const oq__http_request_t *r = t->req;
    curl_easy_setopt(e, CURLOPT_URL, t->url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)r->connect_timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)r->timeout_ms);
    curl_easy_setopt(e, CURLOPT_MAXAGE_CONN, x->max_conn_age_s);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->hdrs);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, t);
    curl_easy_setopt(e, CURLOPT_VERBOSE, 1L); /* feeds on_debug: bytes actually written */
    curl_easy_setopt(e, CURLOPT_DEBUGFUNCTION, on_debug);
    curl_easy_setopt(e, CURLOPT_DEBUGDATA, t);
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, t);
    curl_easy_setopt(e, CURLOPT_PRIVATE, t);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, x);
    curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, on_close_socket);
    curl_easy_setopt(e, CURLOPT_CLOSESOCKETDATA, x);
    if (t->tool->ca_file) curl_easy_setopt(e, CURLOPT_CAINFO, t->tool->ca_file);
    if (t->tool->client_cert) {
        curl_easy_setopt(e, CURLOPT_SSLCERT, t->tool->client_cert);
        curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
    }
    if (t->tool->client_key) {
        curl_easy_setopt(e, CURLOPT_SSLKEY, t->tool->client_key);
        curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
    }
    if (strcmp(r->method, "GET") == 0) {
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    } else {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, t->body ? t->body : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)t->body_len);
        if (strcmp(r->method, "POST") != 0) curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
    }
    CURLMcode mc = curl_multi_add_handle(x->multi, e);
    if (mc != CURLM_OK) {
        curl_easy_cleanup(e);
        t->easy = NULL;
        return OQ_ENOMEM;
    }
    t->prev = NULL;
    t->next = x->running;
    if (x->running) x->running->prev = t;
    x->running = t;
    x->nrunning++;
    return 0;
}

static void retire(oq__http_exec_t *x, xfer_t *t)
{
    curl_multi_remove_handle(x->multi, t->easy);
    if (t->prev)
        t->prev->next = t->next;
    else
        x->running = t->next;
    if (t->next) t->next->prev = t->prev;
    x->nrunning--;
    if (x->nidle < x->cap_idle) {
        curl_easy_reset(t->easy);
        x->idle[x->nidle++] = t->easy;
    } else {
        curl_easy_cleanup(t->easy);
    }
    t->easy = NULL;
}

/* Builds a transfer (URL, body, headers) on the submitting thread. Bad arguments do not fail
 * the submit: they become a FINAL "bad_args" outcome delivered by poll(). */
static int submit(oq__http_exec_t *x, const oq__http_tool_t *tool, int is_lookup,
                  const json_t *args, const char *effect_id, oq__http_cb cb, void *ctx,
                  oq_error_t *err)
{
    if (!x || !tool || !effect_id || !cb)
        return oq_error_set(err, OQ_EINVAL, 0, "http exec: missing argument");
    if (args && !json_is_object(args))
        return oq_error_set(err, OQ_EINVAL, 0, "http exec: args must be a JSON object");
    if (is_lookup && !tool->has_lookup)
        return oq_error_set(err, OQ_ESTATE, 0, "tool %s declares no lookup", tool->name);
    xfer_t *t = calloc(1, sizeof *t);
    if (!t || !(t->effect_id = strdup(effect_id))) {
        free(t);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    t->x = x;
    t->tool = tool;
    t->is_lookup = is_lookup;
    t->req = is_lookup ? &tool->lookup : &tool->call;
    t->cb = cb;
    t->ctx = ctx;
    t->submit_us = oq_mono_us();
    t->retry_after_ms = -1;
    oq_error_t e = {0};
    int rc = oq__http_expand_url(t->req->url, tool->name, args, effect_id, &t->url, &e);
    if (rc == 0)
        rc = oq__http_build_body(t->req, tool->name, args, effect_id, &t->body, &t->body_len, &e);
    if (rc == OQ_ENOMEM) {
        xfer_free(t);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    if (rc != 0) {
        t->prefail = 1;
        snprintf(t->prefail_msg, sizeof t->prefail_msg, "%s", e.msg);
    } else {
        struct curl_slist *h = NULL, *n;
        char line[300];
        int ok = 1;
        if (t->body && (n = curl_slist_append(h, "Content-Type: application/json")))
            h = n;
        else if (t->body)
            ok = 0;
        if (ok && !tool->mcp && (n = curl_slist_append(h, "Accept: application/json")))
            h = n;                                              /* an "mcp" tool sends its own */
        if (ok && (n = curl_slist_append(h, "Expect:"))) h = n; /* no 100-continue round trip */
        if (ok && !is_lookup && tool->idem_header) {
            snprintf(line, sizeof line, "%s: %s", tool->idem_header, effect_id);
            if ((n = curl_slist_append(h, line)))
                h = n;
            else
                ok = 0;
        }
        for (size_t i = 0; ok && !t->prefail && i < t->req->nheaders; i++) {
            const char *hl = t->req->headers[i];
            char *expanded = NULL;
            if (t->req->header_kind[i] == OQ__HTTP_HDR_TEMPLATE && strchr(hl, '{')) {
                rc = expand_header(hl, tool->name, args, effect_id, &expanded, &e);
                if (rc == OQ_ENOMEM) {
                    ok = 0;
                    break;
                }
                if (rc) {
                    t->prefail = 1;
                    snprintf(t->prefail_msg, sizeof t->prefail_msg, "%s", e.msg);
                    break;
                }
                hl = expanded;
            }
            if ((n = curl_slist_append(h, hl)))
                h = n;
            else
                ok = 0;
            free(expanded);
        }
        t->hdrs = h;
        if (!ok) {
            xfer_free(t);
            return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        }
    }
    pthread_mutex_lock(&x->mu);
    if (x->closing) {
        pthread_mutex_unlock(&x->mu);
        xfer_free(t);
        return oq_error_set(err, OQ_ESHUTDOWN, 0, "http exec: closing");
    }
    int first = x->in_head == NULL; /* else the first one's wake-up is still to be seen */
    if (x->in_tail)
        x->in_tail->next = t;
    else
        x->in_head = t;
    x->in_tail = t;
    atomic_fetch_add(&x->pending, 1);
    pthread_mutex_unlock(&x->mu);
    if (first) oq__http_exec_wakeup(x);
    return 0;
}

int oq__http_exec_submit(oq__http_exec_t *x, const oq__http_tool_t *tool, const json_t *args,
                         const char *effect_id, oq__http_cb cb, void *ctx, oq_error_t *err)
{
    return submit(x, tool, 0, args, effect_id, cb, ctx, err);
}

int oq__http_exec_lookup(oq__http_exec_t *x, const oq__http_tool_t *tool, const json_t *args,
                         const char *effect_id, oq__http_cb cb, void *ctx, oq_error_t *err)
{
    return submit(x, tool, 1, args, effect_id, cb, ctx, err);
}

/* Moves submissions in, delivers bad-argument outcomes, starts what fits. */
static int admit(oq__http_exec_t *x)
{
    int delivered = 0;
    pthread_mutex_lock(&x->mu);
    xfer_t *in = x->in_head;
    x->in_head = x->in_tail = NULL;
    pthread_mutex_unlock(&x->mu);
    while (in) {
        xfer_t *t = in;
        in = in->next;
        t->next = NULL;
        if (t->prefail) {
            deliver(x, t, t->is_lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_FINAL, "bad_args",
                    t->prefail_msg, 0, 0);
            xfer_free(t);
            delivered++;
            continue;
        }
        if (x->wait_tail)
            x->wait_tail->next = t;
        else
            x->wait_head = t;
        x->wait_tail = t;
    }
    /* draining: nothing waiting starts any more; it is answered as never sent */
    while (x->wait_head && atomic_load(&x->draining)) {
        xfer_t *t = x->wait_head;
        x->wait_head = t->next;
        if (!x->wait_head) x->wait_tail = NULL;
        t->next = NULL;
        deliver_abandoned(x, t, t->is_lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_RETRYABLE,
                          "the worker is stopping: not sent");
        xfer_free(t);
        delivered++;
    }
    while (x->wait_head && x->nrunning < x->max_inflight) {
        xfer_t *t = x->wait_head;
        x->wait_head = t->next;
        if (!x->wait_head) x->wait_tail = NULL;
        t->next = NULL;
        if (start(x, t) != 0) {
            deliver(x, t, t->is_lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_RETRYABLE, "local_error",
                    "could not start the transfer (out of memory)", 0, 0);
            xfer_free(t);
            delivered++;
        }
    }
    return delivered;
}

static int reap(oq__http_exec_t *x)
{
    int delivered = 0, left;
    CURLMsg *m;
    while ((m = curl_multi_info_read(x->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        CURL *e = m->easy_handle;
        CURLcode cc = m->data.result;
        xfer_t *t = NULL;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&t);
        finish(x, t, cc);
        retire(x, t);
        xfer_free(t);
        delivered++;
    }
    return delivered;
}

/* Waits up to \p wait_ms (0: only looks) for the sockets curl watches, the wake-up eventfd
 * and curl's timer, and lets curl act on what is ready: only the transfers whose socket is
 * ready are touched (curl_multi_socket_action), never a poll of every transfer. A wake-up is
 * consumed only by a waiting call (wait_ms > 0), which the caller follows with admit(): one
 * that comes while the queue is being looked at is never lost. Curl's timer is asked for each
 * time (curl_multi_timeout), not remembered from CURLMOPT_TIMERFUNCTION: curl calls that only
 * when its next expiry changes, so a timer that fired a little early on our clock (curl's
 * clock is another one) would never be told again, and the transfers waiting on it (a new
 * one, a timeout) would wait for ever. */
static int drive(oq__http_exec_t *x, int wait_ms, oq_error_t *err)
{
    int take_wakeup = wait_ms > 0;
    long tmo = -1;
    curl_multi_timeout(x->multi, &tmo);
    if (tmo >= 0 && tmo < wait_ms) wait_ms = (int)tmo;
    struct epoll_event evs[64];
    int n = epoll_wait(x->epfd, evs, (int)(sizeof evs / sizeof evs[0]), wait_ms);
    if (n < 0 && errno != EINTR)
        return oq_error_set(err, OQ_EIO, errno, "epoll_wait: %s", strerror(errno));
    int running = 0;
    for (int i = 0; i < n; i++) {
        if (evs[i].data.fd == x->evfd) {
            uint64_t v;
            if (take_wakeup) (void)!read(x->evfd, &v, sizeof v);
            continue;
        }
        unsigned char *st = fd_state(x, evs[i].data.fd, 0);
        if (st && (*st & FD_PARKED)) { /* an idle connection: out of the set until asked for */
            x->epoll_ctls++;
            epoll_ctl(x->epfd, EPOLL_CTL_DEL, evs[i].data.fd, NULL);
            *st = FD_OURS;
            continue;
        }
        int mask = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                   (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                   (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
        CURLMcode mc = curl_multi_socket_action(x->multi, evs[i].data.fd, mask, &running);
        if (mc != CURLM_OK)
            return oq_error_set(err, OQ_EIO, (int)mc, "curl_multi_socket_action: %s",
                                curl_multi_strerror(mc));
    }
    tmo = -1;
    curl_multi_timeout(x->multi, &tmo);
    if (tmo == 0) {
        CURLMcode mc = curl_multi_socket_action(x->multi, CURL_SOCKET_TIMEOUT, 0, &running);
        if (mc != CURLM_OK)
            return oq_error_set(err, OQ_EIO, (int)mc, "curl_multi_socket_action: %s",
                                curl_multi_strerror(mc));
    }
    return 0;
}

int oq__http_exec_poll(oq__http_exec_t *x, int timeout_ms, oq_error_t *err)
{
    int n = admit(x);
    int rc = drive(x, 0, err);
    if (rc) return rc;
    n += reap(x);
    if (n == 0 && timeout_ms > 0) {
        if ((rc = drive(x, timeout_ms, err))) return rc;
        n += admit(x);
        if ((rc = drive(x, 0, err))) return rc;
        n += reap(x);
    }
    n += admit(x); /* slots freed by reaped transfers */
    return n;
}

void oq__http_exec_wakeup(oq__http_exec_t *x)
{
    uint64_t one = 1;
    if (x) (void)!write(x->evfd, &one, sizeof one);
}

int oq__http_exec_pending(oq__http_exec_t *x)
{
    return x ? atomic_load(&x->pending) : 0;
}

void oq__http_exec_drain(oq__http_exec_t *x)
{
    if (!x) return;
    atomic_store(&x->draining, 1);
    oq__http_exec_wakeup(x);
}

void oq__http_exec_destroy(oq__http_exec_t *x)
{
    if (!x) return;
    pthread_mutex_lock(&x->mu);
    x->closing = 1;
    pthread_mutex_unlock(&x->mu);
    /* every request is called back exactly once, even now */
    reap(x);
    while (x->running) {
        xfer_t *t = x->running;
        oq__http_class_t cls = t->is_lookup ? OQ__HTTP_UNDECIDED
                               : t->sent    ? OQ__HTTP_UNKNOWN
                                            : OQ__HTTP_RETRYABLE;
        deliver_abandoned(x, t, cls,
                          t->sent ? "executor closed after the request was sent"
                                  : "executor closed before the request was sent");
        retire(x, t);
        xfer_free(t);
    }
    pthread_mutex_lock(&x->mu);
    xfer_t *in = x->in_head;
    x->in_head = x->in_tail = NULL;
    pthread_mutex_unlock(&x->mu);
    if (x->wait_tail)
        x->wait_tail->next = in;
    else
        x->wait_head = in;
    for (xfer_t *t = x->wait_head, *next; t; t = next) {
        next = t->next;
        if (t->prefail)
            deliver(x, t, t->is_lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_FINAL, "bad_args",
                    t->prefail_msg, 0, 0);
        else
            deliver_abandoned(x, t, t->is_lookup ? OQ__HTTP_UNDECIDED : OQ__HTTP_RETRYABLE,
                              "executor closed before the request was sent");
        xfer_free(t);
    }
    for (int i = 0; i < x->nidle; i++)
        curl_easy_cleanup(x->idle[i]);
    curl_multi_cleanup(x->multi); /* (closes the kept connections: on_socket still runs) */
    close(x->epfd);
    close(x->evfd);
    free(x->idle);
    free(x->fdst);
    pthread_mutex_destroy(&x->mu);
    free(x);
}
