/* SPDX-License-Identifier: Apache-2.0 */
/*
 * call.c: the producer's value types (oq_call_t, the outcome enums) and the one writer of a
 * call's JSON.
 *
 * The call JSON (HTTP responses, `onceq get`, `onceq submit`) is written by oq_call_render()
 * straight to text with the shared canonical string writer (oq_jcs_put_*): no jansson tree on
 * the HTTP hot path. args, result and error are stored as JSON text already (canonical args;
 * result and error as the ingest wrote them) and are copied verbatim. oq_call_to_json() is that
 * text parsed, for callers that want a tree (pretty printing in the CLI), so both forms are the
 * same object by construction.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_json.h"
#include "oq_producer.h"
#include "oq_util.h"

const char *oq_submit_outcome_name(oq_submit_outcome_t o)
{
    switch (o) {
    case OQ_SUBMIT_NEW:
        return "new";
    case OQ_SUBMIT_REPLAY:
        return "replay";
    case OQ_SUBMIT_CONFLICT:
        return "conflict";
    case OQ_SUBMIT_RETRY_RESET:
        return "retry_reset";
    }
    return "?";
}

const char *oq_result_outcome_name(oq_result_outcome_t o)
{
    switch (o) {
    case OQ_RESULT_APPLIED:
        return "applied";
    case OQ_RESULT_DUPLICATE:
        return "duplicate";
    case OQ_RESULT_UNKNOWN_CALL:
        return "unknown_call";
    case OQ_RESULT_STALE:
        return "stale";
    case OQ_RESULT_IGNORED:
        return "ignored";
    }
    return "?";
}

void oq_call_clear(oq_call_t *c)
{
    if (!c) return;
    free(c->tenant);
    free(c->idem_key);
    free(c->tool);
    free(c->args);
    free(c->result);
    free(c->error);
    free(c->effect_id);
    free(c->client_id);
    free(c->callback_url);
    memset(c, 0, sizeof *c);
}

int oq_call_state_terminal(const char *s)
{
    return s && (strcmp(s, "succeeded") == 0 || strcmp(s, "failed") == 0 ||
                 strcmp(s, "needs_review") == 0);
}

void oq_audit_free(oq_audit_row_t *rows, size_t n)
{
    for (size_t i = 0; rows && i < n; i++) {
        free(rows[i].event);
        free(rows[i].detail);
    }
    free(rows);
}

/* --- the call JSON -------------------------------------------------------------------------- */

/* A sticky-error front end to the shared canonical writer (common/json.c): the first failure
 * (out of memory; a string that is not UTF-8) makes every later put a no-op and is reported
 * once by oq_jcs_buf_finish(). */
typedef struct sbuf {
    oq_jcs_buf_t b;
    int rc;
} sbuf_t;

static void put(sbuf_t *b, const char *s, size_t n)
{
    if (!b->rc) b->rc = oq_jcs_put_raw(&b->b, s, n, NULL);
}

static void put_str(sbuf_t *b, const char *s)
{
    put(b, s, strlen(s));
}

/* ,"key": then \p v as a JSON string, or null. */
static void kv_str(sbuf_t *b, const char *k, const char *v)
{
    put_str(b, k);
    if (!v)
        put(b, "null", 4);
    else if (!b->rc)
        b->rc = oq_jcs_put_string(&b->b, v, NULL);
}

/* ,"key": then stored JSON text verbatim, or null. */
static void kv_raw(sbuf_t *b, const char *k, const char *json)
{
    put_str(b, k);
    put_str(b, json ? json : "null");
}

static void kv_int(sbuf_t *b, const char *k, int64_t v)
{
    char num[24];
    put_str(b, k);
    put(b, num, (size_t)snprintf(num, sizeof num, "%lld", (long long)v));
}

static void kv_time(sbuf_t *b, const char *k, int64_t ms)
{
    char t[32];
    oq_time_format(ms, t);
    put_str(b, k);
    put(b, "\"", 1);
    put_str(b, t);
    put(b, "\"", 1);
}

int oq_call_render(const oq_call_t *c, char **out, size_t *out_len)
{
    sbuf_t b = {0};
    kv_str(&b, "{\"call_id\":", c->call_id);
    kv_str(&b, ",\"tenant\":", c->tenant ? c->tenant : OQ_DEFAULT_TENANT);
    kv_str(&b, ",\"idem_key\":", c->idem_key ? c->idem_key : "");
    kv_str(&b, ",\"fingerprint\":", c->fingerprint);
    kv_str(&b, ",\"tool\":", c->tool ? c->tool : "");
    kv_raw(&b, ",\"args\":", c->args); /* canonical JSON text */
    kv_str(&b, ",\"status\":", c->state);
    kv_int(&b, ",\"attempt\":", c->attempt);
    kv_raw(&b, ",\"result\":", c->result); /* JSON text written by the ingest */
    kv_raw(&b, ",\"error\":", c->error);
    kv_str(&b, ",\"effect_id\":", c->effect_id);
    kv_str(&b, ",\"client_id\":", c->client_id);
    if (c->has_seq)
        kv_int(&b, ",\"seq\":", c->seq);
    else
        put_str(&b, ",\"seq\":null");
    kv_time(&b, ",\"created_at\":", c->created_at);
    kv_time(&b, ",\"updated_at\":", c->updated_at);
    kv_time(&b, ",\"expires_at\":", c->expires_at);
    kv_str(&b, ",\"callback_url\":", c->callback_url);
    put_str(&b, ",\"query_url\":\"/v1/tool-calls/");
    put_str(&b, c->call_id);
    put_str(&b, "\"}");
    return oq_jcs_buf_finish(&b.b, b.rc, out, out_len, NULL);
}

json_t *oq_call_to_json(const oq_call_t *c)
{
    char *text = NULL;
    size_t len = 0;
    if (oq_call_render(c, &text, &len) != 0) return NULL;
    json_t *o = json_loadb(text, len, 0, NULL);
    free(text);
    return o;
}
