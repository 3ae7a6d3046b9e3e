/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer's rules, top to bottom: the states and the one table of legal transitions, the
 * retry policy, what a tool's outcome means (a compiled tool's return code, and the class of an
 * outside answer: http_tools.c classifies a transfer, the table http_meaning here says what
 * each class means), the intake decision for each message, the claim, the one finish path of
 * every run, recovery and reconciliation of unknown outcomes, and the operator's review
 * decisions. Every row is read and written through consumer_store.h; nothing here knows SQL,
 * Kafka, sockets or threads (consumer/worker.c, consumer/dispatch.c).
 *
 * An execution is one call's progress in effects.db. It is PLANNED when its first message
 * arrives, STARTED when a worker claims it (a lease with a fencing token), and its run ends in
 * COMMITTED (effect + result), FAILED_RETRYABLE (nothing happened: retried after a backoff
 * while the budget lasts), FAILED_FINAL (refused, or out of tries: "retries_exhausted"), or
 * UNKNOWN: the request left and no definite answer came back. UNKNOWN is stored, and so is a
 * STARTED row whose lease lapsed. Reconciliation decides it, never by a blind re-run:
 *   - the effect is in the local effects table -> COMMITTED;
 *   - a compiled tool's effect is that table's row (it commits with the outcome), so its
 *     absence is exact -> SAFE_RETRY (run again, same effect_id);
 *   - a tool that calls another system is looked up there (RECONCILING, a lease held while the
 *     lookup runs outside any transaction): found -> COMMITTED with the downstream's object
 *     id; confirmed absent -> SAFE_RETRY; undecided -> asked again, and past the lookup budget
 *     a downstream that honours keys gets the resend (safe by declaration), any other goes to
 *     NEEDS_REVIEW;
 *   - no lookup: keys honoured -> SAFE_RETRY (same key), neither -> NEEDS_REVIEW.
 * NEEDS_REVIEW means "cannot be decided by a machine"; an operator resolves it (committed /
 * failed / retry), fenced and audited. Every write of a stored row is a conditional UPDATE on
 * the state and fence it was read with, checked first against the table below, and appends an
 * audit row whose event is the new state's lowercase name.
 *
 * The fast path: a new call of a compiled tool that does not block runs inline, in the batch
 * transaction that takes its message. Nobody can see its PLANNED and STARTED versions there,
 * so the run is prepared in memory (oq__exec_start_inline) and the same finish code writes the
 * row once, in its outcome state, with one audit row whose detail names the path ("inline:
 * planned, started, try 1 ..."). That halves the database work per call (`onceq-bench
 * consumer`). Its effect and its state commit together, so it never has an unknown outcome.
 * A tool that calls another system never takes that path: its STARTED row (lease, fence,
 * attempt, effect_id) is committed before the request leaves (oq__exec_start, oq__exec_claim)
 * and its outcome is written by a second transaction, which the fence refuses when the lease
 * was lost meanwhile. An outside call starts with the _owing variants: its `running` event is
 * told later (oq__exec_tell_running), only if the request is still out after a while or the
 * outcome is not final, so a call answered at once costs the producer one result, as an inline
 * run does.
 *
 * Result messages carry a message id DERIVED from what they report (result_message_id: the
 * call, the producer's attempt, the terminal status and the call message that planned the
 * attempt), so the same result published twice has the same id and the producer's result
 * inbox applies it once. That is what makes re-emitting safe: a terminal call whose message
 * comes again (a redelivery, or the producer's redrive of a call it heard nothing from) gets
 * its result published again (oq_outbox_republish: the delivered row moved to the tail, or
 * nothing while it is still unpublished), which repairs a result lost on its way back.

 *
 * (About 1,300 lines, over the usual 800: the rules of one stage read top to bottom in one
 * file; the SQL, the Kafka worker, the HTTP dispatcher and the tools live elsewhere.)
 */
#include "execution.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_tools.h"
#include "oq_json.h"
#include "oq_log.h"
#include "oq_util.h"

#define COMP "consumer"

/* --- states and transitions ------------------------------------------------------------------ */

/* The audit event of a transition: the lowercase name of the state it enters. */
static const char *const events[OQ_X__COUNT] = {"planned",          "started",      "committed",
                                                "failed_retryable", "failed_final", "unknown",
                                                "reconciling",      "safe_retry",   "needs_review"};

/* Who may take an edge: anyone (with the fence it read), or only an operator (onceq review). */
enum { BY_ANY = 0, BY_OPERATOR = 1 };

/*
 * Every legal transition. fence_step 1 marks a change of lease holder (a claim, a reconciler
 * taking the row, the loss of a lease, an operator's decision): the fence moves, so every
 * write of the previous holder is refused from then on.
 */
static const struct edge {
    int from, to, fence_step, by;
} edges[] = {
    /* a call's first message plans it; a new producer attempt re-plans a failed call */
    {OQ__X_NONE, OQ_X_PLANNED, 0, BY_ANY},
    {OQ_X_FAILED_FINAL, OQ_X_PLANNED, 0, BY_ANY},
    /* a claim: due and not held */
    {OQ_X_PLANNED, OQ_X_STARTED, 1, BY_ANY},
    {OQ_X_FAILED_RETRYABLE, OQ_X_STARTED, 1, BY_ANY},
    {OQ_X_SAFE_RETRY, OQ_X_STARTED, 1, BY_ANY},
    /* a run's outcome, written by its lease holder */
    {OQ_X_STARTED, OQ_X_COMMITTED, 0, BY_ANY},
    {OQ_X_STARTED, OQ_X_FAILED_RETRYABLE, 0, BY_ANY},
    {OQ_X_STARTED, OQ_X_FAILED_FINAL, 0, BY_ANY},
    /* sent, no definite answer; or the lease ended without an answer (lapsed, given up) */
    {OQ_X_STARTED, OQ_X_UNKNOWN, 1, BY_ANY},
    /* reconciliation decided in one transaction (local effects table, or a declaration) */
    {OQ_X_UNKNOWN, OQ_X_COMMITTED, 0, BY_ANY},
    {OQ_X_UNKNOWN, OQ_X_SAFE_RETRY, 0, BY_ANY},
    {OQ_X_UNKNOWN, OQ_X_FAILED_FINAL, 0, BY_ANY},
    {OQ_X_UNKNOWN, OQ_X_NEEDS_REVIEW, 0, BY_ANY},
    /* ... or around a lookup at the downstream, under the reconciler's lease */
    {OQ_X_UNKNOWN, OQ_X_RECONCILING, 1, BY_ANY},
    {OQ_X_RECONCILING, OQ_X_COMMITTED, 0, BY_ANY},
    {OQ_X_RECONCILING, OQ_X_SAFE_RETRY, 0, BY_ANY},
    {OQ_X_RECONCILING, OQ_X_FAILED_FINAL, 0, BY_ANY},
    {OQ_X_RECONCILING, OQ_X_NEEDS_REVIEW, 0, BY_ANY},
    {OQ_X_RECONCILING, OQ_X_UNKNOWN, 1, BY_ANY}, /* undecided, or the reconciler's lease lapsed */
    /* an operator's decision on what no machine could decide */
    {OQ_X_NEEDS_REVIEW, OQ_X_COMMITTED, 1, BY_OPERATOR},
    {OQ_X_NEEDS_REVIEW, OQ_X_FAILED_FINAL, 1, BY_OPERATOR},
    {OQ_X_NEEDS_REVIEW, OQ_X_SAFE_RETRY, 1, BY_OPERATOR},
};

static const struct edge *edge_find(int from, int to)
{
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
        if (edges[i].from == from && edges[i].to == to) return &edges[i];
    return NULL;
}

int oq__exec_transition_legal(int from, int to)
{
    const struct edge *e = edge_find(from, to);
    return e != NULL && e->by == BY_ANY;
}

int oq__xstate_terminal(int state)
{
    return state == OQ_X_COMMITTED || state == OQ_X_FAILED_FINAL || state == OQ_X_NEEDS_REVIEW;
}

/* --- retry policy ---------------------------------------------------------------------------- */

int oq__retry_allowed(const oq__retry_policy_t *p, int64_t tries)
{
    return tries < p->max_attempts;
}

int64_t oq__retry_backoff_ms(const oq__retry_policy_t *p, int64_t tries)
{
    int64_t base = p->base_ms > 0 ? p->base_ms : 200;
    int64_t cap = p->max_ms > 0 ? p->max_ms : 30000;
    int64_t d = base;
    for (int64_t i = 1; i < tries && d < cap; i++)
        d *= 2;
    if (d > cap) d = cap;
    if (d < 1) d = 1;
    uint32_t r;
    oq_random_bytes(&r, sizeof(r));
    return (int64_t)((double)d * ((double)r / 4294967296.0));
}

static int lookup_budget(const oq__retry_policy_t *p)
{
    return p->lookup_budget > 0 ? p->lookup_budget : 5;
}

void oq__tool_traits(const oq__retry_policy_t *p, const char *tool, oq__tool_traits_t *out)
{
    memset(out, 0, sizeof(*out));
    if (p && p->traits) {
        p->traits(tool, p->traits_ctx, out);
        return;
    }
    out->known = oq_tool_find(tool) != NULL;
}

/* --- tool outcomes --------------------------------------------------------------------------- */

void oq__outcome_classify(int tool_rc, oq__outcome_t *o)
{
    switch (tool_rc) {
    case OQ_TOOL_OK:
        o->cls = OQ__OUTCOME_SUCCESS;
        return;
    case OQ_TOOL_ABANDONED:
        o->cls = OQ__OUTCOME_NOT_RUN;
        return;
    case OQ_TOOL_FAIL:
        o->cls = o->out.retryable ? OQ__OUTCOME_RETRYABLE : OQ__OUTCOME_FINAL;
        break;
    default: /* OQ_TOOL_BADARGS (oq_tool_invoke maps unknown codes to OQ_TOOL_FAIL) */
        o->cls = OQ__OUTCOME_FINAL;
        break;
    }
    if (!o->out.code[0])
        snprintf(o->out.code, sizeof(o->out.code), "%s",
                 tool_rc == OQ_TOOL_BADARGS ? "bad_args" : "tool_failed");
}

/* What each class of an outside answer means (http_tools.h classifies, this decides): for a
 * call, the outcome class; for a lookup, the verdict. Indexed by class; a class not listed
 * (0, or one added later) means UNKNOWN / UNDECIDED: never a blind resend. The one exception,
 * a call abandoned unsent by a stopping worker (NOT_RUN), is in oq__outcome_from_http. */
static const struct {
    oq__outcome_class_t call;
    oq__lookup_t lookup;
} http_meaning[] = {
    [OQ__HTTP_SUCCESS] = {OQ__OUTCOME_SUCCESS, OQ__LOOKUP_UNDECIDED},
    [OQ__HTTP_FINAL] = {OQ__OUTCOME_FINAL, OQ__LOOKUP_UNDECIDED},
    [OQ__HTTP_RETRYABLE] = {OQ__OUTCOME_RETRYABLE, OQ__LOOKUP_UNDECIDED},
    [OQ__HTTP_UNKNOWN] = {OQ__OUTCOME_UNKNOWN, OQ__LOOKUP_UNDECIDED},
    [OQ__HTTP_FOUND] = {OQ__OUTCOME_UNKNOWN, OQ__LOOKUP_FOUND},
    [OQ__HTTP_ABSENT] = {OQ__OUTCOME_UNKNOWN, OQ__LOOKUP_ABSENT},
    [OQ__HTTP_UNDECIDED] = {OQ__OUTCOME_UNKNOWN, OQ__LOOKUP_UNDECIDED},
};

#define OQ__MAX_ANSWER (64 * 1024) /* an answer larger than this is not kept in the result */

/*
 * The one form a result is stored in and sent in is RFC 8785 text, written once where the
 * outcome is made. A value that form cannot write exactly (an integer beyond +-2^53, as a
 * payment API's numeric id can be) is kept as its JSON text instead, in a string member
 * ("result_text", an answer's "response_text"): the effect happened, so its result is recorded
 * however it is spelled. Refusing it would fail the transaction that records the effect, on
 * every try, and stall the worker behind one answer.
 */
#define PUT_RAW(lit) (rc = rc ? rc : oq_jcs_put_raw(&b, lit, sizeof(lit) - 1, &e))

/* Out of the value's control (its numbers, its strings' UTF-8, its depth), as opposed to out
 * of memory. */
static int unwritable(int rc)
{
    return rc == OQ_ERANGE || rc == OQ_EUTF8 || rc == OQ_EDEPTH;
}

/* {"<key>":"<text>"}: \p n bytes of JSON text as one string member, in *out. */
static int text_member(const char *key, const char *text, size_t n, char **out, oq_error_t *err)
{
    oq_jcs_buf_t b = {0};
    oq_error_t e = {0};
    int rc = oq_jcs_put_raw(&b, "{", 1, &e);
    rc = rc ? rc : oq_jcs_put_string(&b, key, &e);
    PUT_RAW(":");
    rc = rc ? rc : oq_jcs_put_stringn(&b, text, n, &e);
    PUT_RAW("}");
    if ((rc = oq_jcs_buf_finish(&b, rc, out, NULL, &e)))
        return oq_error_set(err, rc, 0, "result encode: %s", e.msg);
    return 0;
}

/* \p r (NULL: {}) as a result's text in *out (malloc()ed): its RFC 8785 form, else
 * {"result_text": its JSON text} (an integer past 2^53, nested deeper than the form's limit),
 * else, for a tree no JSON text can hold (a string that is not UTF-8, which a tool can build
 * with json_stringn_nocheck), {"result_omitted": {"reason": "not UTF-8"}}: the effect happened,
 * so it is recorded, and the result says what it lacks. */
static int result_canon(const json_t *r, char **out, oq_error_t *err)
{
    oq_error_t e = {0};
    *out = NULL;
    if (!r) return (*out = strdup("{}")) ? 0 : oq_error_set(err, OQ_ENOMEM, 0, "result encode");
    int rc = oq_jcs_canonicalize(r, out, NULL, &e);
    if (!unwritable(rc)) return rc ? oq_error_set(err, rc, 0, "result encode: %s", e.msg) : 0;
    int why = rc;
    char *t = oq_json_dumps(r, JSON_COMPACT);
    if (t) {
        oq_error_t te = {0};
        rc = text_member("result_text", t, strlen(t), out, &te);
        free(t);
        if (rc != OQ_EUTF8) return rc ? oq_error_set(err, rc, 0, "%s", te.msg) : 0;
        why = rc;
    }
    if (why != OQ_EUTF8) return oq_error_set(err, OQ_ENOMEM, 0, "result encode");
    static const char omitted[] = "{\"result_omitted\":{\"reason\":\"not UTF-8\"}}";
    return (*out = strdup(omitted)) ? 0 : oq_error_set(err, OQ_ENOMEM, 0, "result encode");
}

/* A result as stored (text of an earlier version, an operator's), in RFC 8785 form in *out;
 * *out NULL for text that is not a JSON object (the message then says null). */
static int result_canon_text(const char *t, char **out, oq_error_t *err)
{
    oq_error_t e = {0};
    size_t n = strlen(t);
    *out = NULL;
    int rc = oq_jcs_canonicalize_text(t, n, out, NULL, &e);
    if (unwritable(rc)) return text_member("result_text", t, n, out, err);
    if (rc == OQ_ENOMEM) return oq_error_set(err, rc, 0, "result encode: %s", e.msg);
    if (rc || (*out)[0] != '{') {
        free(*out);
        *out = NULL;
    }
    return 0;
}

/*
 * The result of an answer, as RFC 8785 text (members in that order): how it was found, the
 * status, the downstream's object id, and the answer: as JSON when it is JSON the form can
 * write, else as its exact text ("response_text": not JSON, or an integer beyond +-2^53, or
 * past what jansson reads), when that text is UTF-8. A body it leaves out (over 64 KiB, or not
 * UTF-8) is named instead: "response_omitted": {"bytes": <as it arrived>, "reason": ...}, so
 * a missing answer is never read as an empty one. Written on the dispatcher's thread, beside
 * the executor's tree, so the worker neither encodes the answer nor frees it. NULL when out of
 * memory (the result is then {}).
 */
static char *answer_result(const oq__http_outcome_t *h, const json_t *answer, const char *found_by)
{
    const char *id = h->object_id && h->object_id[0] ? h->object_id : NULL;
    oq_jcs_buf_t b = {0};
    oq_error_t e = {0};
    char *out = NULL;
    int rc = 0;
    PUT_RAW("{");
    if (found_by) {
        PUT_RAW("\"found_by\":");
        rc = rc ? rc : oq_jcs_put_string(&b, found_by, &e);
        PUT_RAW(",");
    }
    PUT_RAW("\"http_status\":");
    rc = rc ? rc : oq_jcs_put_int(&b, h->status, &e);
    if (id && oq_utf8_valid(id, strlen(id))) {
        PUT_RAW(",\"object_id\":");
        rc = rc ? rc : oq_jcs_put_string(&b, id, &e);
    }
    size_t mark = b.len;
    if (answer) {
        PUT_RAW(",\"response\":");
        rc = rc ? rc : oq_jcs_put_value(&b, answer, &e);
    }
    if ((!answer || unwritable(rc)) && h->body && h->body_len > 0 &&
        h->body_len <= OQ__MAX_ANSWER && (rc == 0 || unwritable(rc))) {
        b.len = mark;
        rc = 0;
        PUT_RAW(",\"response_text\":");
        rc = rc ? rc : oq_jcs_put_stringn(&b, h->body, h->body_len, &e);
    }
    char omitted[48] = ""; /* a body that is not in the result says so, and its size */
    if (unwritable(rc)) {  /* not even as text: a body that is not UTF-8 */
        b.len = mark;
        rc = 0;
        snprintf(omitted, sizeof omitted, "not UTF-8");
    } else if (b.len == mark && h->body && h->body_len > OQ__MAX_ANSWER) {
        snprintf(omitted, sizeof omitted, "larger than %d bytes", OQ__MAX_ANSWER);
    }
    if (omitted[0]) {
        int64_t bytes = h->body_bytes > (int64_t)h->body_len ? h->body_bytes : (int64_t)h->body_len;
        PUT_RAW(",\"response_omitted\":{\"bytes\":");
        rc = rc ? rc : oq_jcs_put_int(&b, bytes, &e);
        PUT_RAW(",\"reason\":");
        rc = rc ? rc : oq_jcs_put_string(&b, omitted, &e);
        PUT_RAW("}");
    }
    PUT_RAW("}");
    return oq_jcs_buf_finish(&b, rc, &out, NULL, &e) ? NULL : out;
}

#undef PUT_RAW

/* A refusal's message: the status and what the downstream said, if it said it in JSON. */
static void refusal_message(const oq__http_outcome_t *h, const json_t *answer, char *out, size_t n)
{
    const char *msg = h->message ? h->message : "";
    const json_t *m = oq__http_json_path(answer, "/error/message");
    if (!json_is_string(m)) m = oq__http_json_path(answer, "/message");
    if (json_is_string(m))
        snprintf(out, n, "%.60s: %.180s", msg, json_string_value(m));
    else
        snprintf(out, n, "%s", msg);
}

void oq__outcome_from_http(const oq__http_outcome_t *h, int is_lookup, oq__outcome_t *o)
{
    /* (index 0 is no class: its zeroed row would read as SUCCESS / FOUND) */
    int known = h->cls > 0 && (size_t)h->cls < sizeof(http_meaning) / sizeof(http_meaning[0]);
    json_t *answer = NULL;
    memset(o, 0, sizeof(*o));
    o->retry_after_ms = h->retry_after_ms;
    snprintf(o->out.code, sizeof(o->out.code), "%s", h->code ? h->code : "");
    if (h->body && h->body_len > 0 && h->body_len <= OQ__MAX_ANSWER) {
        answer = h->parsed ? json_incref((json_t *)h->doc) /* (the executor's one parse) */
                           : json_loadb(h->body, h->body_len, JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(answer) && !json_is_array(answer)) {
            json_decref(answer);
            answer = NULL;
        }
    }
    if (is_lookup) {
        o->cls = OQ__OUTCOME_UNKNOWN; /* (not a run) */
        o->verdict = known ? http_meaning[h->cls].lookup : OQ__LOOKUP_UNDECIDED;
        snprintf(o->downstream_id, sizeof(o->downstream_id), "%s",
                 h->object_id ? h->object_id : "");
        snprintf(o->out.message, sizeof(o->out.message), "%s", h->message ? h->message : "");
        if (o->verdict == OQ__LOOKUP_FOUND) o->result_text = answer_result(h, answer, "lookup");
        json_decref(answer);
        oq_utf8_repair(o->out.message);
        oq_utf8_repair(o->downstream_id);
        return;
    }
    o->cls = known ? http_meaning[h->cls].call : OQ__OUTCOME_UNKNOWN;
    if (o->cls == OQ__OUTCOME_RETRYABLE && !h->sent && h->abandoned) o->cls = OQ__OUTCOME_NOT_RUN;
    switch (o->cls) {
    case OQ__OUTCOME_SUCCESS:
        o->result_text = answer_result(h, answer, NULL);
        o->out.has_effect = 1;
        snprintf(o->downstream_id, sizeof(o->downstream_id), "%s",
                 h->object_id ? h->object_id : "");
        break;
    case OQ__OUTCOME_FINAL:
        refusal_message(h, answer, o->out.message, sizeof(o->out.message));
        break;
    case OQ__OUTCOME_RETRYABLE:
    case OQ__OUTCOME_NOT_RUN:
        o->out.retryable = 1;
        refusal_message(h, answer, o->out.message, sizeof(o->out.message));
        break;
    default:
        snprintf(o->out.message, sizeof(o->out.message), "%s", h->message ? h->message : "");
        break;
    }
    json_decref(answer);
    oq_utf8_repair(o->out.message); /* (the answer's text, cut to fit) */
    oq_utf8_repair(o->downstream_id);
}

void oq__outcome_clear(oq__outcome_t *o)
{
    if (!o) return;
    oq_tool_out_clear(&o->out);
    free(o->result_text);
    o->result_text = NULL;
}

void oq__exec_effect_id(const char *call_id, char out[OQ_CALL_ID_LEN + 1])
{
    const char *hex = (call_id && strncmp(call_id, "c_", 2) == 0) ? call_id + 2 : call_id;
    /* "e_" + at most OQ_CALL_ID_LEN - 2 characters of the id (its 16 hex digits) */
    snprintf(out, OQ_CALL_ID_LEN + 1, "e_%.*s", OQ_CALL_ID_LEN - 2, hex ? hex : "");
}

/* --- writing: transitions, audit, result events ---------------------------------------------- */

/* The values of \p x entering \p to, starting from its current ones (strings borrowed from
 * \p x); the caller changes what the transition changes. */
static void update_from(const oq__exec_row_t *x, int to, int64_t now, oq__exec_update_t *u)
{
    memset(u, 0, sizeof(*u));
    u->call_id = x->call_id;
    u->from_state = x->state;
    u->from_fence = x->fence;
    u->state = to;
    u->attempt = x->attempt;
    u->tries = x->tries;
    u->fence = x->fence;
    u->lease_owner = x->lease_owner;
    u->lease_until = x->lease_until;
    u->result = x->result;
    u->error = x->error;
    u->effect_id = x->effect_id;
    u->next_attempt_at = x->next_attempt_at;
    u->now = now;
    u->started_at = x->started_at;
    u->unknown_at = x->unknown_at;
    u->lookups = x->lookups;
}

/* How move() matches the row: on state and fence only, also on this worker's lease (a run's or
 * a lookup's outcome: only the holder may write it), or as an operator (edges BY_OPERATOR). */
enum { AS_ANYONE = 0, AS_HOLDER = 1, AS_OPERATOR = 2 };

/*
 * One transition of a stored execution: checked against the table (the fence moves by the
 * edge's step), then one conditional UPDATE on the state and fence \p x was read with, and on
 * the lease owner for AS_HOLDER. *moved = 0 when the row had moved on: nothing was written.
 * When it moved, \p x's state, counters and times follow; its strings (lease owner, result,
 * error, effect_id) are left as they were.
 */
static int move(oq__consumer_store_t *s, oq__exec_row_t *x, oq__exec_update_t *u, int as,
                int *moved, oq_error_t *err)
{
    const struct edge *e = edge_find(x->state, u->state);
    *moved = 0;
    if (!e || (e->by == BY_OPERATOR && as != AS_OPERATOR))
        return oq_error_set(err, OQ_ESTATE, 0, "%s: illegal transition %s -> %s", x->call_id,
                            oq__xstate_name(x->state), oq__xstate_name(u->state));
    u->fence = x->fence + e->fence_step;
    u->from_owner = as == AS_HOLDER ? oq__consumer_store_worker(s) : NULL;
    int rc = oq__consumer_store_exec_update(s, u, moved, err);
    if (rc || !*moved) return rc;
    x->state = u->state;
    x->attempt = u->attempt;
    x->tries = u->tries;
    x->fence = u->fence;
    x->lease_until = u->lease_until;
    x->next_attempt_at = u->next_attempt_at;
    x->started_at = u->started_at;
    x->unknown_at = u->unknown_at;
    x->lookups = u->lookups;
    if (u->message_id) snprintf(x->message_id, sizeof(x->message_id), "%s", u->message_id);
    return 0;
}

/*
 * The two sinks of text that comes from outside (a downstream's refusal quoted in a message,
 * cut to fit a buffer by the snprintf()s that compose it, which can split a character) are
 * audit() and error_json(): both store valid UTF-8, with '?' for what a cut left over. Text
 * that PostgreSQL, a JSON encoder or the producer would refuse must not fail the transaction
 * that records an outcome: it would fail on every try and stall the worker
 * (test_refusal_cut_in_a_character).
 */
static int audit(oq__consumer_store_t *s, const char *call_id, const char *event, int64_t attempt,
                 int64_t fence, const char *detail, int64_t now, oq_error_t *err)
{
    char *fixed = NULL;
    if (detail && !oq_utf8_valid(detail, strlen(detail))) {
        if (!(fixed = strdup(detail))) return oq_error_set(err, OQ_ENOMEM, 0, "audit detail");
        oq_utf8_repair(fixed);
        detail = fixed;
    }
    oq__audit_row_t a = {.ts = now,
                         .call_id = call_id,
                         .event = event,
                         .detail = detail,
                         .attempt = attempt,
                         .fence = fence};
    int rc = oq__consumer_store_audit_add(s, &a, err);
    free(fixed);
    return rc;
}

static char *error_json(const char *code, const char *message, int retryable)
{
    char m[512];
    snprintf(m, sizeof(m), "%s", message ? message : "");
    oq_utf8_repair(m);
    json_t *e = json_pack("{s:s, s:s, s:b}", "code", code && code[0] ? code : "tool_failed",
                          "message", m, "retryable", retryable ? 1 : 0);
    char *t = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    return t;
}

static int hex_nibble(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/*
 * The message id of the result \p status of \p x's attempt: a UUID of version 8 (RFC 9562,
 * "custom") whose first 48 bits are those of the call message that planned the attempt (a
 * UUIDv7: its submit time, so result ids stay roughly time-ordered in the producer's
 * result_inbox index) and whose other 74 bits come from SHA-256 over (call_id, attempt, status,
 * that message id). One attempt ends in one terminal state, so a result has one id however
 * often it is emitted, and it can never equal a random (version 7) id.
 */
static int result_message_id(const oq__exec_row_t *x, const char *status, char out[OQ_UUID_LEN + 1],
                             oq_error_t *err)
{
    unsigned char md[32], b[16];
    char in[160], hex[33];
    int n = snprintf(in, sizeof(in), "onceq.tool_result\n%s\n%" PRId64 "\n%s\n%s", x->call_id,
                     x->attempt, status, x->message_id);
    if (n < 0 || (size_t)n >= sizeof(in) || oq_sha256(in, (size_t)n, md) != 0)
        return oq_error_set(err, OQ_ECRYPTO, 0, "%s: result message id", x->call_id);
    /* the first 48 bits of the planning message id ("xxxxxxxx-xxxx-..."), else hash bits */
    unsigned char t[6] = {0};
    int ok = 1;
    for (int i = 0; i < 12 && ok; i++) {
        int v = hex_nibble(x->message_id[i < 8 ? i : i + 1]);
        if (v < 0)
            ok = 0;
        else
            t[i / 2] = (unsigned char)(t[i / 2] | (i % 2 ? v : v << 4));
    }
    memcpy(b, ok ? t : md + 10, 6);
    memcpy(b + 6, md, 10);
    b[6] = (unsigned char)(0x80 | (b[6] & 0x0f)); /* version 8 */
    b[8] = (unsigned char)(0x80 | (b[8] & 0x3f)); /* RFC 9562 variant */
    oq_hex(b, sizeof(b), hex);
    snprintf(out, OQ_UUID_LEN + 1, "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16,
             hex + 20);
    return 0;
}

/*
 * Appends the tool_result event of \p x to the outbox: status running (nothing else),
 * succeeded (result, effect_id), failed or needs_review (error). \p result is the result's
 * text: in RFC 8785 form already when \p canon (a fresh result: result_canon, answer_result),
 * written into the message as it is, else (a stored row, an operator's) canonicalised first; a
 * text that is not an object, and NULL, mean null, as does a NULL \p error_json_text.
 * \p again: the result was emitted before (a re-emit): its row is republished (moved to the
 * outbox's tail when delivered, left alone while not) and *written says whether a row was
 * written; otherwise it is appended (a first emit: its derived id is new).
 */
static int emit_result(oq__consumer_store_t *s, const oq__exec_row_t *x, const char *status,
                       const char *result, int canon, const char *error_json_text,
                       const char *effect_id, int64_t now, int again, int *written, oq_error_t *err)
{
    oq_envelope_t e;
    char *payload = NULL, *own = NULL;
    size_t len = 0;
    int rc;
    memset(&e, 0, sizeof(e));
    if (written) *written = 0;
    e.v = OQ_ENVELOPE_VERSION;
    e.kind = OQ_KIND_TOOL_RESULT;
    if ((rc = result_message_id(x, status, e.message_id, err))) return rc;
    snprintf(e.call_id, sizeof(e.call_id), "%s", x->call_id);
    snprintf(e.fingerprint, sizeof(e.fingerprint), "%s", x->fingerprint);
    e.tenant = x->tenant;
    e.idem_key = x->idem_key;
    e.tool = x->tool;
    e.attempt = x->attempt > 0 ? x->attempt : 1;
    e.created_at = now;
    e.status = (char *)status;
    e.effect_id = (char *)effect_id;
    if (result && !canon) {
        if ((rc = result_canon_text(result, &own, err))) return rc;
        result = own;
    }
    if (result && result[0] != '{') result = NULL;
    if (error_json_text) e.error = json_loads(error_json_text, 0, NULL);
    rc = oq_envelope_encode_canon(&e, result, result ? strlen(result) : 0, &payload, &len, err);
    json_decref(e.error);
    free(own);
    if (rc) return rc;
    oq_outbox_row_t row = {.message_id = e.message_id,
                           .topic = OQ_TOPIC_RESULTS,
                           .key = x->call_id,
                           .payload = payload,
                           .payload_len = len,
                           .created_at = now};
    if (again) {
        oq_outbox_republish_t what = 0;
        rc = oq__consumer_store_outbox_republish(s, &row, &what, err);
        if (rc == 0 && written) *written = what != OQ_OUTBOX_PENDING;
    } else {
        rc = oq__consumer_store_outbox_append(s, &row, err);
        if (rc == 0 && written) *written = 1;
        /* The same derived id already in the outbox: this result was emitted before (e.g. a
         * call resolved for a retry ends in the same state again). Publish that row again. */
        if (rc == OQ_EEXIST) {
            oq_outbox_republish_t what = 0;
            if (err) memset(err, 0, sizeof(*err));
            rc = oq__consumer_store_outbox_republish(s, &row, &what, err);
            if (rc == 0 && written) *written = what != OQ_OUTBOX_PENDING;
        }
    }
    free(payload);
    return rc;
}

/* Re-emits the result of a terminal execution (its call message came again); *written = 0 when
 * the result is still waiting in the outbox (nothing to repair). */
static int reemit(oq__consumer_store_t *s, const oq__exec_row_t *x, int64_t now, int *written,
                  oq_error_t *err)
{
    *written = 0;
    switch (x->state) {
    case OQ_X_COMMITTED:
        return emit_result(s, x, "succeeded", x->result ? x->result : "{}", 0, NULL, x->effect_id,
                           now, 1, written, err);
    case OQ_X_FAILED_FINAL:
        return emit_result(s, x, "failed", NULL, 0, x->error, NULL, now, 1, written, err);
    case OQ_X_NEEDS_REVIEW:
        return emit_result(s, x, "needs_review", NULL, 0, x->error, NULL, now, 1, written, err);
    default:
        return 0;
    }
}

/* An execution row for \p env (owned strings; args encoded), in no state yet. */
static int row_from_envelope(const oq_envelope_t *env, oq__exec_row_t *x, oq_error_t *err)
{
    memset(x, 0, sizeof(*x));
    snprintf(x->call_id, sizeof(x->call_id), "%s", env->call_id);
    snprintf(x->fingerprint, sizeof(x->fingerprint), "%s", env->fingerprint);
    snprintf(x->message_id, sizeof(x->message_id), "%s", env->message_id);
    x->tenant = strdup(env->tenant);
    x->idem_key = strdup(env->idem_key);
    x->tool = strdup(env->tool);
    x->args = env->args_json ? strdup(env->args_json) /* the same text (oq_envelope.h) */
              : env->args    ? json_dumps(env->args, JSON_COMPACT)
                             : NULL;
    x->attempt = env->attempt;
    if (!x->tenant || !x->idem_key || !x->tool || !x->args) {
        oq__exec_row_clear(x);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    return 0;
}

/* --- intake ---------------------------------------------------------------------------------- */

/* A new producer attempt of a FAILED_FINAL call: PLANNED again, due now, try count reset. */
static int replan(oq__consumer_store_t *s, oq__exec_row_t *x, const oq_envelope_t *env, int64_t now,
                  oq_error_t *err)
{
    oq__exec_update_t u;
    char detail[64];
    int moved = 0;
    update_from(x, OQ_X_PLANNED, now, &u);
    u.attempt = env->attempt;
    u.tries = 0;
    u.lease_owner = u.result = u.error = u.effect_id = NULL;
    u.lease_until = 0;
    u.next_attempt_at = now;
    u.message_id = env->message_id;
    int rc = move(s, x, &u, AS_ANYONE, &moved, err);
    if (rc == 0 && !moved) rc = oq_error_set(err, OQ_ESTATE, 0, "re-plan lost a race");
    if (rc) return rc;
    snprintf(detail, sizeof(detail), "new attempt %" PRId64, env->attempt);
    return audit(s, x->call_id, events[OQ_X_PLANNED], x->attempt, x->fence, detail, now, err);
}

int oq__exec_intake(oq__consumer_store_t *s, const oq_envelope_t *env, const oq__msg_src_t *src,
                    int64_t now, int *decision, oq_error_t *err)
{
    oq__exec_row_t x;
    int rc, have = 0, d;
    int64_t seen = 0;
    memset(&x, 0, sizeof(x));

    rc = oq__consumer_store_exec_get(s, env->call_id, &x, err);
    if (rc == 0)
        have = 1;
    else if (rc != OQ_ENOTFOUND)
        return rc;

    /* The decision, from the execution as it stands (the inbox only says "seen before"). */
    if (!have) {
        /* No execution: a new call, unless the message is older than the retention horizon,
         * when its execution may have been purged (see "what retention deletes" below). */
        int64_t horizon = 0;
        if ((rc = oq__consumer_store_horizon(s, &horizon, err)) != 0) return rc;
        if (env->created_at < horizon) {
            *decision = OQ__INTAKE_EXPIRED; /* nothing written: the caller dead-letters it */
            return 0;
        }
        d = OQ__INTAKE_NEW;
    } else if (strcmp(x.fingerprint, env->fingerprint) != 0) {
        *decision = OQ__INTAKE_MISMATCH; /* nothing written: the caller dead-letters it */
        rc = 0;
        goto out;
    } else if (x.state == OQ_X_FAILED_FINAL && env->attempt > x.attempt) {
        d = OQ__INTAKE_REPLANNED;
    } else if (env->attempt < x.attempt) {
        d = OQ__INTAKE_STALE;
    } else if (oq__xstate_terminal(x.state)) {
        d = OQ__INTAKE_DONE;
    } else {
        d = OQ__INTAKE_IN_PROGRESS;
    }

    oq__inbox_row_t in = {.message_id = env->message_id,
                          .call_id = env->call_id,
                          .src = *src,
                          .outcome = d == OQ__INTAKE_STALE         ? "stale"
                                     : d == OQ__INTAKE_DONE        ? "done"
                                     : d == OQ__INTAKE_IN_PROGRESS ? "in_progress"
                                                                   : "planned",
                          .received_at = now};
    if ((rc = oq__consumer_store_inbox_upsert(s, &in, &seen, err)) != 0) goto out;
    if (seen > 1) {
        /* A message id that was dead-lettered and now decodes and is valid (a fixed copy
         * re-published by `onceq dlq redrive`, or the same bytes after a consumer fix) goes
         * through once: its inbox row takes the new outcome, so any later copy is a duplicate. */
        int taken = 0;
        if ((rc = oq__consumer_store_inbox_retake(s, &in, &taken, err)) != 0) goto out;
        if (taken) {
            seen = 1;
            if ((rc = audit(s, env->call_id, "dlq_redriven", env->attempt, have ? x.fence : 0,
                            "a dead-lettered message id, valid now: let through the inbox once",
                            now, err)) != 0)
                goto out;
        }
    }
    if (seen > 1) {
        /* A redelivery. For a terminal call it may be the producer's redrive of a call whose
         * result never arrived: the result goes out again (same result id: applied once). */
        int written = 0;
        if (d == OQ__INTAKE_DONE && (rc = reemit(s, &x, now, &written, err)) != 0) goto out;
        *decision = written ? OQ__INTAKE_REEMITTED : OQ__INTAKE_DUPLICATE;
        rc = audit(s, env->call_id, "duplicate_skipped", env->attempt, have ? x.fence : 0,
                   written ? "redelivered message_id: call terminal, result re-emitted"
                           : "redelivered message_id",
                   now, err);
        goto out;
    }
    *decision = d;
    switch (d) {
    case OQ__INTAKE_NEW:
        break; /* the caller plans it or runs it inline */
    case OQ__INTAKE_REPLANNED:
        rc = replan(s, &x, env, now, err);
        break;
    case OQ__INTAKE_DONE: {
        int written = 0;
        if ((rc = reemit(s, &x, now, &written, err)) != 0) break;
        rc = audit(s, env->call_id, "duplicate_skipped", env->attempt, x.fence,
                   written ? "call already terminal: result re-emitted"
                           : "call already terminal: result not delivered yet",
                   now, err);
        break;
    }
    case OQ__INTAKE_STALE:
        rc = audit(s, env->call_id, "duplicate_skipped", env->attempt, x.fence, "stale attempt",
                   now, err);
        break;
    default:
        rc = audit(s, env->call_id, "duplicate_skipped", env->attempt, x.fence, "call in progress",
                   now, err);
        break;
    }
out:
    oq__exec_row_clear(&x);
    return rc;
}

int oq__exec_plan(oq__consumer_store_t *s, const oq_envelope_t *env, int64_t now, oq_error_t *err)
{
    oq__exec_row_t x;
    char detail[64];
    int rc = row_from_envelope(env, &x, err);
    if (rc) return rc;
    x.state = OQ_X_PLANNED;
    x.next_attempt_at = now;
    if (!oq__exec_transition_legal(OQ__X_NONE, OQ_X_PLANNED))
        rc = oq_error_set(err, OQ_ESTATE, 0, "planning is not a legal transition");
    if (rc == 0) rc = oq__consumer_store_exec_insert(s, &x, now, err);
    if (rc == 0) {
        snprintf(detail, sizeof(detail), "attempt %" PRId64, env->attempt);
        rc = audit(s, x.call_id, events[OQ_X_PLANNED], x.attempt, 0, detail, now, err);
    }
    oq__exec_row_clear(&x);
    return rc;
}

int oq__exec_start_inline(const oq_envelope_t *env, oq__exec_row_t *x, oq_error_t *err)
{
    int rc = row_from_envelope(env, x, err);
    if (rc) return rc;
    /* PLANNED -> STARTED, in memory: the row is written by oq__exec_finish */
    x->state = OQ_X_STARTED;
    x->tries = 1;
    x->fence = 1;
    return 0;
}

/* --- claim ----------------------------------------------------------------------------------- */

/* oq__exec_start / oq__exec_start_owing: \p tell_now says whether the `running` event is
 * appended here. */
static int start_run(oq__consumer_store_t *s, const oq_envelope_t *env, int64_t lease_ms,
                     int64_t now, int tell_now, oq__exec_row_t *out, oq_error_t *err)
{
    oq__exec_row_t x;
    char eid[OQ_CALL_ID_LEN + 1];
    int rc = row_from_envelope(env, &x, err);
    if (rc) return rc;
    /* PLANNED -> STARTED inside this transaction: the row is written once, as STARTED */
    if (!oq__exec_transition_legal(OQ__X_NONE, OQ_X_PLANNED) ||
        !oq__exec_transition_legal(OQ_X_PLANNED, OQ_X_STARTED)) {
        rc = oq_error_set(err, OQ_ESTATE, 0, "starting is not a legal transition");
        goto out;
    }
    oq__exec_effect_id(x.call_id, eid);
    x.state = OQ_X_STARTED;
    x.tries = 1;
    x.fence = 1;
    x.lease_until = now + lease_ms;
    x.started_at = now;
    if (!(x.lease_owner = strdup(oq__consumer_store_worker(s))) || !(x.effect_id = strdup(eid))) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    if ((rc = oq__consumer_store_exec_insert(s, &x, now, err)) ||
        (rc = audit(s, x.call_id, events[OQ_X_STARTED], x.attempt, x.fence,
                    "planned, started, try 1", now, err)) ||
        (tell_now && (rc = emit_result(s, &x, "running", NULL, 0, NULL, NULL, now, 0, NULL, err))))
        goto out;
    oq__exec_row_clear(out);
    *out = x;
    memset(&x, 0, sizeof(x));
out:
    oq__exec_row_clear(&x);
    return rc;
}

int oq__exec_start(oq__consumer_store_t *s, const oq_envelope_t *env, int64_t lease_ms, int64_t now,
                   oq__exec_row_t *out, oq_error_t *err)
{
    return start_run(s, env, lease_ms, now, 1, out, err);
}

int oq__exec_start_owing(oq__consumer_store_t *s, const oq_envelope_t *env, int64_t lease_ms,
                         int64_t now, oq__exec_row_t *out, oq_error_t *err)
{
    return start_run(s, env, lease_ms, now, 0, out, err);
}

/* oq__exec_claim / oq__exec_claim_owing: the `running` event of the attempt's first run is
 * appended here when \p owed is NULL, else *owed says it is owed. */
static int claim_run(oq__consumer_store_t *s, const char *call_id, int64_t lease_ms, int64_t now,
                     int *owed, oq__exec_row_t *out, oq_error_t *err)
{
    oq__exec_row_t x;
    oq__exec_update_t u;
    char detail[48], eid[OQ_CALL_ID_LEN + 1];
    int moved = 0;
    memset(&x, 0, sizeof(x));
    int rc = oq__consumer_store_exec_get(s, call_id, &x, err);
    if (rc && rc != OQ_ENOTFOUND) goto out;
    /* due: a state that may move to STARTED, whose backoff is over */
    if (rc == OQ_ENOTFOUND || !oq__exec_transition_legal(x.state, OQ_X_STARTED) ||
        x.next_attempt_at <= 0 || x.next_attempt_at > now) {
        rc = oq_error_set(err, OQ_ESTATE, 0, "%s is not due or taken", call_id);
        goto out;
    }
    const int first = x.state == OQ_X_PLANNED; /* the attempt's first run: tell the producer */
    oq__exec_effect_id(x.call_id, eid);
    update_from(&x, OQ_X_STARTED, now, &u);
    u.tries = x.tries + 1;
    u.lease_owner = oq__consumer_store_worker(s);
    u.lease_until = now + lease_ms;
    u.next_attempt_at = 0;
    u.effect_id = eid;
    u.started_at = now;
    if ((rc = move(s, &x, &u, AS_ANYONE, &moved, err))) goto out;
    if (!moved) {
        rc = oq_error_set(err, OQ_ESTATE, 0, "%s is not due or taken", call_id);
        goto out;
    }
    free(x.lease_owner);
    free(x.effect_id);
    x.effect_id = NULL;
    if (!(x.lease_owner = strdup(oq__consumer_store_worker(s))) || !(x.effect_id = strdup(eid))) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    snprintf(detail, sizeof(detail), "try %" PRId64, x.tries);
    if ((rc = audit(s, call_id, events[OQ_X_STARTED], x.attempt, x.fence, detail, now, err)))
        goto out;
    if (owed)
        *owed = first;
    else if (first && (rc = emit_result(s, &x, "running", NULL, 0, NULL, NULL, now, 0, NULL, err)))
        goto out;
    if (out) {
        oq__exec_row_clear(out);
        *out = x;
        memset(&x, 0, sizeof(x));
    }
out:
    oq__exec_row_clear(&x);
    return rc;
}

int oq__exec_claim(oq__consumer_store_t *s, const char *call_id, int64_t lease_ms, int64_t now,
                   oq__exec_row_t *out, oq_error_t *err)
{
    return claim_run(s, call_id, lease_ms, now, NULL, out, err);
}

int oq__exec_claim_owing(oq__consumer_store_t *s, const char *call_id, int64_t lease_ms,
                         int64_t now, int *owed, oq__exec_row_t *out, oq_error_t *err)
{
    int first = 0;
    int rc = claim_run(s, call_id, lease_ms, now, &first, out, err);
    if (owed) *owed = rc == 0 && first;
    return rc;
}

int oq__exec_tell_running(oq__consumer_store_t *s, const oq__exec_row_t *run, int checked,
                          int64_t now, int *told, oq_error_t *err)
{
    oq__exec_row_t x;
    int rc = 0, still = 1;
    if (told) *told = 0;
    memset(&x, 0, sizeof(x));
    if (!checked) { /* still this run: STARTED with its fence (not moved on by anyone) */
        rc = oq__consumer_store_exec_get(s, run->call_id, &x, err);
        if (rc == OQ_ENOTFOUND) {
            if (err) memset(err, 0, sizeof(*err));
            rc = 0;
            still = 0;
        } else if (rc == 0) {
            still = x.state == OQ_X_STARTED && x.fence == run->fence && x.attempt == run->attempt;
        }
    }
    if (rc == 0 && still) {
        rc = emit_result(s, run, "running", NULL, 0, NULL, NULL, now, 0, NULL, err);
        if (rc == 0 && told) *told = 1;
    }
    oq__exec_row_clear(&x);
    return rc;
}

/* --- finish ---------------------------------------------------------------------------------- */

/* The finishing write of \p x matched nothing: another worker or recovery moved it on. */
static int lease_lost(oq__consumer_store_t *s, const oq__exec_row_t *x, int64_t now,
                      oq_error_t *err)
{
    OQ_LOGC_WARN(COMP, x->call_id, "lease lost: writes refused fence=%" PRId64, x->fence);
    int rc = audit(s, x->call_id, "lease_lost", x->attempt, x->fence,
                   "stale worker: fence changed, writes refused", now, err);
    if (rc == 0) rc = oq_error_set(err, OQ_EFENCED, 0, "lease on %s lost", x->call_id);
    return rc;
}

/* The first row of an inline run, written in its outcome state \p to (x: the run in memory). */
static int insert_inline(oq__consumer_store_t *s, oq__exec_row_t *x, int to, const char *result,
                         const char *error, const char *effect_id, int64_t next_at, int64_t now,
                         oq_error_t *err)
{
    /* the path the row takes inside this transaction, PLANNED -> STARTED -> to, or just
     * PLANNED when the run did nothing */
    int legal = oq__exec_transition_legal(OQ__X_NONE, OQ_X_PLANNED) &&
                (to == OQ_X_PLANNED || (oq__exec_transition_legal(OQ_X_PLANNED, OQ_X_STARTED) &&
                                        oq__exec_transition_legal(OQ_X_STARTED, to)));
    if (!legal)
        return oq_error_set(err, OQ_ESTATE, 0, "%s: illegal inline run to %s", x->call_id,
                            oq__xstate_name(to));
    oq__exec_row_t y = *x; /* shallow: only the columns that differ are replaced */
    y.state = to;
    y.lease_owner = NULL;
    y.lease_until = 0;
    y.result = (char *)result;
    y.error = (char *)error;
    y.effect_id = (char *)effect_id;
    y.next_attempt_at = next_at;
    int rc = oq__consumer_store_exec_insert(s, &y, now, err);
    if (rc == 0) x->state = to;
    return rc;
}

/*
 * A run that did nothing (the worker is stopping): the execution goes back to be run again and
 * the run does not count. Inline, nothing is stored yet: the call is planned as if it had not
 * run. Claimed, STARTED is stored: its holder gives the lease up (STARTED -> UNKNOWN, the fence
 * moves) and, the outcome being known ("nothing done"), SAFE_RETRY follows at once, due now.
 */
static int hand_back(oq__consumer_store_t *s, oq__exec_row_t *x, oq__run_kind_t kind, int64_t now,
                     int *state_out, oq_error_t *err)
{
    oq__exec_update_t u;
    int rc, moved = 0;
    if (kind == OQ__RUN_INLINE) {
        x->tries = 0;
        x->fence = 0;
        if ((rc = insert_inline(s, x, OQ_X_PLANNED, NULL, NULL, NULL, now, now, err)) ||
            (rc = audit(s, x->call_id, events[OQ_X_PLANNED], x->attempt, 0,
                        "inline run abandoned at stop", now, err)))
            return rc;
        if (state_out) *state_out = OQ_X_PLANNED;
        return 0;
    }
    update_from(x, OQ_X_UNKNOWN, now, &u);
    u.lease_owner = u.result = u.error = u.effect_id = NULL;
    u.lease_until = 0;
    u.next_attempt_at = 0;
    if ((rc = move(s, x, &u, AS_HOLDER, &moved, err))) return rc;
    if (!moved) return lease_lost(s, x, now, err);
    if ((rc = audit(s, x->call_id, events[OQ_X_UNKNOWN], x->attempt, x->fence, "abandoned at stop",
                    now, err)))
        return rc;
    update_from(x, OQ_X_SAFE_RETRY, now, &u);
    u.lease_owner = u.result = u.error = u.effect_id = NULL; /* x's text is as claimed */
    u.tries = x->tries - 1;
    u.next_attempt_at = now;
    if ((rc = move(s, x, &u, AS_ANYONE, &moved, err))) return rc;
    if (!moved) return oq_error_set(err, OQ_ESTATE, 0, "%s moved during hand-back", x->call_id);
    if ((rc = audit(s, x->call_id, events[OQ_X_SAFE_RETRY], x->attempt, x->fence,
                    "abandoned at stop: nothing done", now, err)))
        return rc;
    if (state_out) *state_out = OQ_X_SAFE_RETRY;
    return 0;
}

/*
 * Records the effect of \p x (COMMITTED now, written in this transaction). UNIQUE(call_id) is
 * the last gate: when the call already has an effect, that one stands, and *final_result /
 * *final_eid point at its values (owned by *old_eid / *old_detail) and the execution row is
 * set to them.
 */
static int record_effect(oq__consumer_store_t *s, const oq__exec_row_t *x, const char *eid,
                         const oq_tool_out_t *out, const char *downstream_id, const char *result,
                         int64_t now, int *inserted, const char **final_result,
                         const char **final_eid, char **old_eid, char **old_detail, oq_error_t *err)
{
    oq__effect_row_t e = {.effect_id = eid,
                          .call_id = x->call_id,
                          .tool = x->tool,
                          .amount = out ? out->amount : 0,
                          .recipient = out ? out->recipient : NULL,
                          .detail = result,
                          .attempt = x->attempt,
                          .fence = x->fence,
                          .created_at = now,
                          .downstream_id = downstream_id};
    int found = 0, rc;
    *inserted = 0;
    if ((rc = oq__consumer_store_effect_insert(s, &e, inserted, err)) || *inserted) return rc;
    if ((rc = oq__consumer_store_effect_get(s, x->call_id, &found, old_eid, old_detail, err)))
        return rc;
    if (found) {
        *final_result = *old_detail ? *old_detail : "{}";
        *final_eid = *old_eid;
        rc = oq__consumer_store_exec_set_result(s, x->call_id, *final_result, *final_eid, err);
    }
    OQ_LOGC_WARN(COMP, x->call_id, "effect already present: unique gate held");
    return rc;
}

int oq__exec_finish(oq__consumer_store_t *s, const oq__exec_row_t *run, oq__run_kind_t kind,
                    const oq__outcome_t *o, const oq__retry_policy_t *p, int64_t now,
                    int *state_out, int *effect_new, oq_error_t *err)
{
    /* A shallow working copy: the caller's row stays as claimed, so a finish whose
     * transaction was rolled back can be run again. Its strings are borrowed, never freed. */
    oq__exec_row_t copy = *run, *x = &copy;
    char eid[OQ_CALL_ID_LEN + 1], why[200], detail[256];
    char *result = NULL, *error = NULL, *old_eid = NULL, *old_detail = NULL;
    const char *final_result = NULL, *final_eid = NULL;
    int rc = 0, to, moved = 0;
    int64_t next_at = 0, wait = 0;
    const int inl = kind == OQ__RUN_INLINE;
    if (state_out) *state_out = -1;
    if (effect_new) *effect_new = 0;
    if (x->state != OQ_X_STARTED)
        return oq_error_set(err, OQ_ESTATE, 0, "%s is %s, not a run", x->call_id,
                            oq__xstate_name(x->state));

    /* 1. The decision: the outcome's class and the retry budget give the next state. */
    if (o->cls == OQ__OUTCOME_SUCCESS)
        to = OQ_X_COMMITTED;
    else if (o->cls == OQ__OUTCOME_RETRYABLE && oq__retry_allowed(p, x->tries))
        to = OQ_X_FAILED_RETRYABLE;
    else if (o->cls == OQ__OUTCOME_RETRYABLE || o->cls == OQ__OUTCOME_FINAL)
        to = OQ_X_FAILED_FINAL;
    else if (o->cls == OQ__OUTCOME_NOT_RUN)
        return hand_back(s, x, kind, now, state_out, err);
    else if (o->cls == OQ__OUTCOME_UNKNOWN && !inl)
        to = OQ_X_UNKNOWN;
    else
        return oq_error_set(err, OQ_EINVAL, 0,
                            "%s: outcome class %d from an inline run: a call whose outcome can be "
                            "unknown must be claimed (STARTED durable) before it runs",
                            x->call_id, (int)o->cls);

    oq__exec_effect_id(x->call_id, eid);
    if (to == OQ_X_COMMITTED) {
        snprintf(why, sizeof(why), "try %" PRId64 "%s%.100s", x->tries,
                 o->downstream_id[0] ? ": downstream id " : "", o->downstream_id);
        /* the text made with the outcome (an outside answer), else the tool's tree, written
         * once: for the execution, the effect and the message alike */
        if (o->result_text)
            final_result = o->result_text;
        else if ((rc = result_canon(o->out.result, &result, err)))
            return rc;
        else
            final_result = result;
        if (o->out.has_effect) final_eid = eid;
    } else if (to == OQ_X_UNKNOWN) {
        snprintf(why, sizeof(why), "try %" PRId64 ": %s: %.120s", x->tries, o->out.code,
                 o->out.message);
        if (!(error = error_json(o->out.code, o->out.message, 0)))
            return oq_error_set(err, OQ_ENOMEM, 0, "error encode");
    } else {
        const char *code = o->out.code;
        char msg[256];
        snprintf(msg, sizeof(msg), "%s", o->out.message);
        if (to == OQ_X_FAILED_RETRYABLE) {
            wait = oq__retry_backoff_ms(p, x->tries);
            if (o->retry_after_ms > wait) wait = o->retry_after_ms; /* the downstream asked */
            next_at = now + wait;
            snprintf(why, sizeof(why), "try %" PRId64 "/%d: %s: %.60s; retry in %" PRId64 " ms%s",
                     x->tries, p->max_attempts, code, o->out.message, wait,
                     o->retry_after_ms > 0 ? " (Retry-After)" : "");
        } else if (o->cls == OQ__OUTCOME_RETRYABLE) {
            /* out of tries: nothing happened, and nothing more will be tried for this attempt */
            snprintf(msg, sizeof(msg), "%" PRId64 " tries; last: %.40s: %.160s", x->tries, code,
                     o->out.message);
            code = "retries_exhausted";
            snprintf(why, sizeof(why), "try %" PRId64 ": %.180s", x->tries, msg);
        } else {
            snprintf(why, sizeof(why), "try %" PRId64 ": %s: %.100s", x->tries, code,
                     o->out.message);
        }
        if (!(error = error_json(code, msg, o->cls == OQ__OUTCOME_RETRYABLE)))
            return oq_error_set(err, OQ_ENOMEM, 0, "error encode");
    }

    /* 2. The row: inserted for an inline run; for a claimed one, written only while this
     *    worker still holds the lease it was claimed with. */
    if (inl) {
        rc = insert_inline(s, x, to, final_result, error, final_eid, next_at, now, err);
    } else {
        oq__exec_update_t u;
        update_from(x, to, now, &u);
        u.lease_owner = NULL;
        u.lease_until = 0;
        u.result = final_result;
        u.error = error;
        u.effect_id = to == OQ_X_UNKNOWN ? eid : final_eid; /* UNKNOWN: the key that was sent */
        u.next_attempt_at = next_at;                        /* UNKNOWN: 0, due now */
        if (to == OQ_X_UNKNOWN) {
            u.unknown_at = now; /* a new unknown episode */
            u.lookups = 0;
        }
        rc = move(s, x, &u, AS_HOLDER, &moved, err);
        if (rc == 0 && !moved) {
            rc = lease_lost(s, x, now, err);
            goto out;
        }
    }
    if (rc) goto out;

    /* 3. The effect, with the downstream's id when the tool gave one. */
    if (to == OQ_X_COMMITTED && o->out.has_effect) {
        int inserted = 0;
        if ((rc = record_effect(s, x, eid, &o->out, o->downstream_id, final_result, now, &inserted,
                                &final_result, &final_eid, &old_eid, &old_detail, err)))
            goto out;
        if (effect_new) *effect_new = inserted;
        if (!inserted)
            snprintf(why, sizeof(why), "try %" PRId64 ": effect already present", x->tries);
    }

    /* 4. The audit row and, for a terminal state, the result event, in this transaction. */
    snprintf(detail, sizeof(detail), "%s%s", inl ? "inline: planned, started, " : "", why);
    if ((rc = audit(s, x->call_id, events[to], x->attempt, x->fence, detail, now, err))) goto out;
    if (to == OQ_X_COMMITTED)
        rc = emit_result(s, x, "succeeded", final_result,
                         final_result == result || final_result == o->result_text, NULL, final_eid,
                         now, 0, NULL, err);
    else if (to == OQ_X_FAILED_FINAL)
        rc = emit_result(s, x, "failed", NULL, 0, error, NULL, now, 0, NULL, err);
    if (rc == 0 && to == OQ_X_UNKNOWN)
        OQ_LOGC_WARN(COMP, x->call_id, "outcome unknown (%s): stored for reconciliation", why);
out:
    if (state_out) *state_out = rc ? -1 : to;
    free(result);
    free(error);
    free(old_eid);
    free(old_detail);
    return rc;
}

/* --- recovery and reconciliation -------------------------------------------------------------- */

/* A decision on an unsettled execution (UNKNOWN, RECONCILING, NEEDS_REVIEW). */
typedef struct decision {
    int to;
    int as;                    /* AS_ANYONE, AS_HOLDER (a lookup's answer), AS_OPERATOR */
    int verdict;               /* oq__lookup_t, for on_reconciled (-1: do not report) */
    const char *result;        /* COMMITTED: result JSON text */
    const char *effect_id;     /* COMMITTED: the effect's id */
    int record;                /* COMMITTED: insert the effect (0: it is in the table already) */
    const char *downstream_id; /* COMMITTED + record: the downstream's object id */
    const char *error;         /* UNKNOWN, FAILED_FINAL, NEEDS_REVIEW: error JSON */
    int64_t next_at;           /* SAFE_RETRY, UNKNOWN: when due (0: now / NULL) */
    int64_t tries, lookups;
    const char *why; /* audit detail */
} decision_t;

static void notify(const oq__retry_policy_t *p, const oq__exec_row_t *x, int verdict, int to,
                   int64_t now)
{
    if (p && p->on_reconciled && verdict >= 0)
        p->on_reconciled(p->on_ctx, verdict, to, x->unknown_at ? now - x->unknown_at : 0);
}

/*
 * Writes decision \p d on \p x: the transition (with the lease released), the effect, the audit
 * row and, for a terminal state, the result event. *moved = 0 when the row had moved on
 * (nothing written).
 */
static int decide(oq__consumer_store_t *s, oq__exec_row_t *x, const decision_t *d,
                  const oq__retry_policy_t *p, int64_t now, int *moved, oq_error_t *err)
{
    oq__exec_update_t u;
    char *old_eid = NULL, *old_detail = NULL;
    const char *final_result = d->result ? d->result : "{}", *final_eid = d->effect_id;
    int rc, inserted = 0;
    update_from(x, d->to, now, &u);
    u.lease_owner = NULL;
    u.lease_until = 0;
    u.result = d->to == OQ_X_COMMITTED ? final_result : NULL;
    u.error = d->to == OQ_X_COMMITTED || d->to == OQ_X_SAFE_RETRY ? NULL : d->error;
    u.effect_id = d->to == OQ_X_COMMITTED ? d->effect_id : x->effect_id;
    u.next_attempt_at = d->to == OQ_X_SAFE_RETRY || d->to == OQ_X_UNKNOWN ? d->next_at : 0;
    u.tries = d->tries;
    u.lookups = d->lookups;
    if ((rc = move(s, x, &u, d->as, moved, err)) || !*moved) return rc;
    if (d->to == OQ_X_COMMITTED && d->record &&
        (rc = record_effect(s, x, d->effect_id, NULL, d->downstream_id, final_result, now,
                            &inserted, &final_result, &final_eid, &old_eid, &old_detail, err)))
        goto out;
    if ((rc = audit(s, x->call_id, events[d->to], x->attempt, x->fence, d->why, now, err)))
        goto out;
    if (d->to == OQ_X_COMMITTED)
        rc = emit_result(s, x, "succeeded", final_result, 0, NULL, final_eid, now, 0, NULL, err);
    else if (d->to == OQ_X_FAILED_FINAL)
        rc = emit_result(s, x, "failed", NULL, 0, d->error, NULL, now, 0, NULL, err);
    else if (d->to == OQ_X_NEEDS_REVIEW)
        rc = emit_result(s, x, "needs_review", NULL, 0, d->error, NULL, now, 0, NULL, err);
    if (rc == 0) notify(p, x, d->verdict, d->to, now);
    if (rc == 0 && d->to == OQ_X_NEEDS_REVIEW)
        OQ_LOGC_WARN(COMP, x->call_id, "needs review: %s", d->why);
out:
    free(old_eid);
    free(old_detail);
    return rc;
}

/* Sets \p d to "resend" (SAFE_RETRY, due now) while the retry budget lasts, else to
 * \p out_of_tries (FAILED_FINAL when the operation is known not to have happened, else
 * NEEDS_REVIEW); *error_out receives the error of the latter (owned by the caller). */
static void resend_or(decision_t *d, const oq__exec_row_t *x, const oq__retry_policy_t *p,
                      int out_of_tries, int64_t now, char **error_out, const char *why)
{
    d->why = why;
    if (oq__retry_allowed(p, x->tries)) {
        d->to = OQ_X_SAFE_RETRY;
        d->next_at = now;
        return;
    }
    char msg[400];
    snprintf(msg, sizeof(msg), "%.300s; %" PRId64 " tries, none left", why, x->tries);
    d->to = out_of_tries;
    *error_out =
        error_json(out_of_tries == OQ_X_FAILED_FINAL ? "retries_exhausted" : "outcome_unknown", msg,
                   out_of_tries == OQ_X_FAILED_FINAL);
    d->error = *error_out;
}

/* A STARTED or RECONCILING row whose holder is gone (lease lapsed, or held by the dead previous
 * process of this worker id) becomes UNKNOWN; the fence moves, so the old holder is stale. */
static int lapse(oq__consumer_store_t *s, oq__exec_row_t *x, const char *why, int64_t now,
                 int *moved, oq_error_t *err)
{
    oq__exec_update_t u;
    char *error = NULL;
    int rc, reconciling = x->state == OQ_X_RECONCILING;
    int64_t fence = x->fence;
    update_from(x, OQ_X_UNKNOWN, now, &u);
    u.lease_owner = NULL;
    u.lease_until = 0;
    u.next_attempt_at = 0;
    if (reconciling) {
        u.lookups = x->lookups + 1; /* a lookup that never answered counts as undecided */
    } else {
        u.unknown_at = now;
        u.lookups = 0;
        if (!(error = error_json("lease_lapsed", why, 0)))
            return oq_error_set(err, OQ_ENOMEM, 0, "error encode");
        u.error = error;
    }
    if ((rc = move(s, x, &u, AS_ANYONE, moved, err)) || !*moved) goto out;
    OQ_LOGC_WARN(COMP, x->call_id, "%s: UNKNOWN during=%s fence=%" PRId64, why,
                 reconciling ? "lookup" : "run", fence);
    rc = audit(s, x->call_id, events[OQ_X_UNKNOWN], x->attempt, x->fence,
               reconciling ? "lookup lease lapsed" : why, now, err);
out:
    free(error);
    return rc;
}

/*
 * Decides one UNKNOWN execution \p x (see oq__exec_recover). A lookup to run moves it to
 * RECONCILING and hands the row to \p lookup_out (*took = 1), which takes ownership of \p x's
 * strings. *moved = 1 when it moved.
 */
static int reconcile(oq__consumer_store_t *s, oq__exec_row_t *x, const oq__retry_policy_t *p,
                     int64_t now, oq__exec_row_t *lookup_out, int *took, int *moved,
                     oq_error_t *err)
{
    oq__tool_traits_t t;
    decision_t d;
    char *eid = NULL, *detail = NULL, *error = NULL, why[200], msg[200];
    int found = 0, rc;
    *took = 0;
    *moved = 0;
    memset(&d, 0, sizeof(d));
    d.as = AS_ANYONE;
    d.tries = x->tries;
    d.lookups = x->lookups;
    if ((rc = oq__consumer_store_effect_get(s, x->call_id, &found, &eid, &detail, err))) goto out;
    oq__tool_traits(p, x->tool, &t);
    if (found) {
        /* the last gate: whatever the tool, its effect is recorded */
        d.to = OQ_X_COMMITTED;
        d.verdict = OQ__LOOKUP_FOUND;
        d.result = detail ? detail : "{}";
        d.effect_id = eid;
        d.why = "reconciled: effect present";
    } else if (!t.known) {
        snprintf(msg, sizeof(msg),
                 "tool %.60s is not declared on this worker: its outcome cannot be looked up, "
                 "and it is not resent",
                 x->tool);
        d.to = OQ_X_NEEDS_REVIEW;
        d.verdict = OQ__LOOKUP_NONE;
        d.error = error = error_json("tool_not_declared", msg, 0);
        d.why = "reconciled: tool not declared here";
    } else if (!t.remote) {
        /* a compiled tool's effect commits with its outcome: no row, nothing happened */
        d.verdict = OQ__LOOKUP_ABSENT;
        resend_or(&d, x, p, OQ_X_FAILED_FINAL, now, &error, "reconciled: no effect");
    } else if (t.has_lookup) {
        if (!lookup_out) goto out; /* the caller runs no lookups: left UNKNOWN */
        oq__exec_update_t u;
        update_from(x, OQ_X_RECONCILING, now, &u);
        u.lease_owner = oq__consumer_store_worker(s);
        u.lease_until = now + (p->lease_ms > 0 ? p->lease_ms : 30000);
        u.next_attempt_at = 0;
        if ((rc = move(s, x, &u, AS_ANYONE, moved, err)) || !*moved) goto out;
        snprintf(why, sizeof(why), "lookup %" PRId64 " sent", x->lookups + 1);
        if ((rc = audit(s, x->call_id, events[OQ_X_RECONCILING], x->attempt, x->fence, why, now,
                        err)))
            goto out;
        free(x->lease_owner);
        x->lease_owner = strdup(oq__consumer_store_worker(s));
        *lookup_out = *x;
        memset(x, 0, sizeof(*x));
        *took = 1;
        goto out;
    } else if (t.idempotent) {
        d.verdict = OQ__LOOKUP_NONE;
        resend_or(&d, x, p, OQ_X_NEEDS_REVIEW, now, &error,
                  "reconciled: no lookup; the downstream honours the key, resent with it");
    } else {
        d.to = OQ_X_NEEDS_REVIEW;
        d.verdict = OQ__LOOKUP_NONE;
        d.error = error = error_json("no_lookup_no_keys",
                                     "the downstream neither honours idempotency keys nor offers "
                                     "a lookup: the call is not resent",
                                     0);
        d.why = "reconciled: cannot be decided (no lookup, no keys)";
    }
    if ((d.to == OQ_X_NEEDS_REVIEW || d.to == OQ_X_FAILED_FINAL) && !d.error) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "error encode");
        goto out;
    }
    rc = decide(s, x, &d, p, now, moved, err);
out:
    free(eid);
    free(detail);
    free(error);
    return rc;
}

int oq__exec_recover(oq__consumer_store_t *s, int64_t now, const oq__retry_policy_t *p, int limit,
                     oq__exec_row_t *lookups, int *n_lookups, int *n_recovered, oq_error_t *err)
{
    oq__exec_row_t *rows = NULL;
    int n = 0, rc, done = 0, nl = 0;
    if (limit <= 0) limit = 100;
    if (n_recovered) *n_recovered = 0;
    if (n_lookups) *n_lookups = 0;
    if (!(rows = calloc((size_t)limit, sizeof(*rows))))
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");

    /* 1. STARTED or RECONCILING with a lapsed lease -> UNKNOWN. */
    if ((rc = oq__consumer_store_exec_lapsed(s, now, rows, limit, &n, err))) goto out;
    for (int i = 0; i < n; i++) {
        int moved = 0;
        if ((rc = lapse(s, &rows[i], "lease lapsed", now, &moved, err))) goto out;
    }
    for (int i = 0; i < n; i++)
        oq__exec_row_clear(&rows[i]);

    /* 2. Decide every UNKNOWN row that is due. */
    if ((rc = oq__consumer_store_exec_unknown_due(s, now, rows, limit, &n, err))) goto out;
    for (int i = 0; i < n && rc == 0; i++) {
        int moved = 0, took = 0;
        rc = reconcile(s, &rows[i], p, now, lookups && nl < limit ? &lookups[nl] : NULL, &took,
                       &moved, err);
        nl += took;
        done += moved;
    }
out:
    for (int i = 0; i < n; i++)
        oq__exec_row_clear(&rows[i]);
    free(rows);
    if (rc) { /* rolled back by the caller: the lookups were not taken */
        for (int i = 0; i < nl; i++)
            oq__exec_row_clear(&lookups[i]);
        nl = 0;
    }
    if (n_recovered) *n_recovered = done;
    if (n_lookups) *n_lookups = nl;
    return rc;
}

int oq__exec_release_held(oq__consumer_store_t *s, int64_t now, int *n_out, oq_error_t *err)
{
    oq__exec_row_t rows[64];
    int n = 0, rc, done = 0;
    memset(rows, 0, sizeof(rows));
    if (n_out) *n_out = 0;
    rc = oq__consumer_store_exec_held_by(s, oq__consumer_store_worker(s), rows, 64, &n, err);
    for (int i = 0; i < n && rc == 0; i++) {
        int moved = 0;
        rc = lapse(s, &rows[i], "held by the previous process of this worker id", now, &moved, err);
        done += moved;
    }
    for (int i = 0; i < n; i++)
        oq__exec_row_clear(&rows[i]);
    if (n_out) *n_out = done;
    return rc;
}

int oq__exec_lookup_done(oq__consumer_store_t *s, const oq__exec_row_t *rec, int verdict,
                         const char *downstream_id, const char *result, const char *why,
                         const oq__retry_policy_t *p, int64_t now, int *state_out, oq_error_t *err)
{
    oq__exec_row_t copy = *rec, *x = &copy; /* shallow: a rolled-back write can be redone */
    oq__tool_traits_t t;
    decision_t d;
    char eid[OQ_CALL_ID_LEN + 1], text[400], msg[300];
    char *error = NULL;
    int rc = 0, moved = 0;
    if (state_out) *state_out = -1;
    if (x->state != OQ_X_RECONCILING)
        return oq_error_set(err, OQ_ESTATE, 0, "%s is %s, not a lookup", x->call_id,
                            oq__xstate_name(x->state));
    oq__tool_traits(p, x->tool, &t);
    memset(&d, 0, sizeof(d));
    d.as = AS_HOLDER;
    d.verdict = verdict;
    d.tries = x->tries;
    d.lookups = x->lookups;
    d.why = text;
    const char *reason = why && why[0] ? why : "no reason given";
    if (verdict == OQ__LOOKUP_FOUND) {
        oq__exec_effect_id(x->call_id, eid);
        d.to = OQ_X_COMMITTED;
        d.result = result ? result : "{}";
        d.effect_id = eid;
        d.record = 1;
        d.downstream_id = downstream_id;
        snprintf(text, sizeof(text), "reconciled: found at the downstream%s%.100s",
                 downstream_id && downstream_id[0] ? ", id " : "",
                 downstream_id ? downstream_id : "");
    } else if (verdict == OQ__LOOKUP_ABSENT && !t.idempotent && t.settle_ms > 0 &&
               now < x->started_at + t.settle_ms) {
        /* without keys a resend is safe only once the first request can no longer land */
        d.to = OQ_X_UNKNOWN;
        d.next_at = x->started_at + t.settle_ms;
        d.error = x->error;
        snprintf(text, sizeof(text),
                 "lookup: not found %" PRId64 " ms after the send; trusted from %" PRId64
                 " ms (settle time), asked again then",
                 now - x->started_at, t.settle_ms);
    } else if (verdict == OQ__LOOKUP_ABSENT) {
        snprintf(text, sizeof(text), "reconciled: confirmed absent at the downstream");
        resend_or(&d, x, p, OQ_X_FAILED_FINAL, now, &error, text);
    } else { /* UNDECIDED */
        d.lookups = x->lookups + 1;
        snprintf(msg, sizeof(msg), "lookup %" PRId64 " undecided: %.200s", d.lookups, reason);
        if (d.lookups < lookup_budget(p)) {
            d.to = OQ_X_UNKNOWN;
            d.next_at = now + oq__retry_backoff_ms(p, d.lookups) + 1;
            d.error = error = error_json("lookup_undecided", msg, 0);
            snprintf(text, sizeof(text), "%.300s; asked again in %" PRId64 " ms", msg,
                     d.next_at - now);
        } else if (t.idempotent) {
            snprintf(text, sizeof(text),
                     "%.300s; lookup budget spent; the downstream honours the key: resent with it",
                     msg);
            x->lookups = d.lookups;
            resend_or(&d, x, p, OQ_X_NEEDS_REVIEW, now, &error, text);
        } else {
            snprintf(text, sizeof(text), "%.300s; lookup budget (%d) spent", msg, lookup_budget(p));
            d.to = OQ_X_NEEDS_REVIEW;
            d.error = error = error_json("lookup_failed", text, 0);
        }
    }
    if (!d.error && (d.to == OQ_X_NEEDS_REVIEW || d.to == OQ_X_FAILED_FINAL)) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "error encode");
        goto out;
    }
    rc = decide(s, x, &d, p, now, &moved, err);
    if (rc == 0 && !moved) rc = lease_lost(s, x, now, err);
    if (rc == 0 && state_out) *state_out = d.to;
out:
    free(error);
    return rc;
}

/* --- review: what no machine could decide ------------------------------------------------------
 */

static int printable(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e) return 0;
    return 1;
}

int oq__exec_resolve(oq__consumer_store_t *s, const char *call_id, int as, const char *ref,
                     const char *note, const char *by, int64_t fence, int64_t now, int *state_out,
                     oq_error_t *err)
{
    static const char *const names[] = {"committed", "failed", "retry"};
    oq__exec_row_t x;
    decision_t d;
    json_t *j = NULL;
    char eid[OQ_CALL_ID_LEN + 1], why[300];
    char *detail = NULL, *result = NULL, *error = NULL;
    int rc, moved = 0;
    memset(&x, 0, sizeof(x));
    memset(&d, 0, sizeof(d));
    if (state_out) *state_out = -1;
    if (as < OQ__RESOLVE_COMMITTED || as > OQ__RESOLVE_RETRY)
        return oq_error_set(err, OQ_EINVAL, 0, "resolve as what? (committed, failed, retry)");
    if (!note || !note[0] || strlen(note) > 1000)
        return oq_error_set(err, OQ_EINVAL, 0, "a note of 1-1000 bytes is required");
    if (fence < 0)
        return oq_error_set(err, OQ_EINVAL, 0,
                            "the review's fence is required (--fence N, as review list/show "
                            "print it)");
    if (ref && (as != OQ__RESOLVE_COMMITTED || !printable(ref, 255)))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "--ref goes with --as committed: 1-255 printable ASCII bytes");
    if (!(j = json_pack("{s:s, s:s?, s:s, s:s?}", "as", names[as], "ref", ref, "note", note, "by",
                        by)) ||
        !(detail = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS))) {
        rc = oq_error_set(err, OQ_EINVAL, 0, "the note or the operator name is not UTF-8");
        goto out;
    }
    json_decref(j);
    j = NULL;
    if ((rc = oq__consumer_store_exec_get(s, call_id, &x, err))) goto out;
    if (x.state != OQ_X_NEEDS_REVIEW) {
        rc = oq_error_set(err, OQ_ESTATE, 0, "%s is %s, not NEEDS_REVIEW: nothing to resolve",
                          call_id, oq__xstate_name(x.state));
        goto out;
    }
    if (x.fence != fence) {
        /* another episode: the call left review (a retry, its resend) and came back */
        rc = oq_error_set(err, OQ_EFENCED, 0,
                          "review_moved: %s is in review with fence %lld, not %lld: it left "
                          "review and came back since that decision was made; look at it again",
                          call_id, (long long)x.fence, (long long)fence);
        goto out;
    }
    if ((rc = audit(s, call_id, "review_resolved", x.attempt, x.fence + 1, detail, now, err)))
        goto out;
    d.as = AS_OPERATOR;
    d.verdict = -1;
    d.tries = x.tries;
    d.lookups = x.lookups;
    d.why = why;
    snprintf(why, sizeof(why), "resolved by %.60s as %s: %.200s", by ? by : "an operator",
             names[as], note);
    if (as == OQ__RESOLVE_COMMITTED) {
        oq__exec_effect_id(call_id, eid);
        if (!(j = json_pack("{s:s?, s:s, s:s}", "object_id", ref, "resolved_by", "operator", "note",
                            note)) ||
            !(result = json_dumps(j, JSON_COMPACT))) {
            rc = oq_error_set(err, OQ_ENOMEM, 0, "result encode");
            goto out;
        }
        d.to = OQ_X_COMMITTED;
        d.result = result;
        d.effect_id = eid;
        d.record = 1;
        d.downstream_id = ref;
    } else if (as == OQ__RESOLVE_FAILED) {
        d.to = OQ_X_FAILED_FINAL;
        if (!(d.error = error = error_json("resolved_failed", note, 0))) {
            rc = oq_error_set(err, OQ_EINVAL, 0, "the note is not UTF-8");
            goto out;
        }
    } else {
        d.to = OQ_X_SAFE_RETRY; /* one more send, same key, with a fresh budget */
        d.next_at = now;
        d.tries = 0;
        d.lookups = 0;
    }
    if ((rc = decide(s, &x, &d, NULL, now, &moved, err))) goto out;
    if (!moved) {
        rc = oq_error_set(err, OQ_ESTATE, 0, "%s changed while being resolved", call_id);
        goto out;
    }
    if (state_out) *state_out = d.to;
    OQ_LOGC_INFO(COMP, call_id, "%s", why);
out:
    json_decref(j);
    free(detail);
    free(result);
    free(error);
    oq__exec_row_clear(&x);
    return rc;
}

/* --- dead letters ---------------------------------------------------------------------------- */

int oq__exec_dead_letter(oq__consumer_store_t *s, const oq__dlq_row_t *r, const char *call_id,
                         int *dup, oq_error_t *err)
{
    oq__inbox_row_t in = {.message_id = r->message_id,
                          .call_id = call_id,
                          .src = r->src,
                          .outcome = "dlq",
                          .received_at = r->created_at};
    int64_t seen = 0;
    int rc = oq__consumer_store_inbox_upsert(s, &in, &seen, err);
    *dup = 0;
    if (rc) return rc;
    if (seen > 1) {
        /* A redrive that failed again is a dead letter again (so the operator sees it); any
         * other copy of a dead-lettered (or handled) message id is a duplicate. */
        int taken = 0;
        if (r->redrive && (rc = oq__consumer_store_inbox_retake(s, &in, &taken, err))) return rc;
        if (!taken) {
            *dup = 1;
            return 0;
        }
    }
    if ((rc = oq__consumer_store_dlq_insert(s, r, err))) return rc;
    return audit(s, call_id, "dlq", 0, 0, r->reason, r->created_at, err);
}

/* --- what retention deletes -------------------------------------------------------------------
 * Settled executions (COMMITTED, FAILED_FINAL) go with their effect and audit rows once they
 * were last written more than R = max(retention, inbox retention) ago: an execution outlives
 * its message id in the inbox, so a redelivery the inbox no longer knows still finds it. An
 * execution in review, or in any other unsettled state, is never deleted, whatever its age.
 *
 * What could run a deleted call again is a message of it arriving later: Kafka keeping or
 * replaying it (topic retention, an offset reset), or the producer redriving a call it heard
 * nothing from (a lost result: the redrive repeats the call's message with its original
 * created_at). The horizon closes that for good, whatever the topic's retention or the
 * producer's redrive window: before a pass deletes anything, it raises the database's horizon
 * to the pass's cutoff + a skew allowance (R / 10, at most 1 h), in the same transaction as the
 * first deletions. Every deleted execution was last written before the cutoff, so every
 * message of its call was created before it (a call's message is created at its submit or its
 * retry, before the execution that ran it was written): intake refuses a message that finds no
 * execution and was created before the horizon (OQ__INTAKE_EXPIRED, dead-lettered `expired`),
 * and lets every later one through, which cannot belong to a deleted execution. The allowance
 * covers a producer clock ahead of the consumer's (created_at is the producer's time). The
 * cost: a call never executed whose message comes more than R late (a consumer group stopped
 * longer than R with a topic that keeps messages longer) is dead-lettered instead of run;
 * the consumer warns at start when the topic's retention exceeds R.
 */
int oq__exec_purge(oq__consumer_store_t *s, int64_t now, int64_t retention_ms, int64_t inbox_ms,
                   int batch, oq_consumer_purge_stats_t *st, oq_error_t *err)
{
    int64_t n = 0, r = retention_ms > inbox_ms ? retention_ms : inbox_ms;
    int rc = 0;
    memset(st, 0, sizeof(*st));
    if (batch <= 0) batch = 1000;
    if (inbox_ms <= 0) return oq_error_set(err, OQ_EINVAL, 0, "inbox retention must be > 0");
    /* the inbox, handled dead letters and delivered result events (autocommit batches; the
     * embedded relay also deletes the result events after its own --retention) */
    for (int i = 0; i < 100000; i++) {
        if ((rc = oq__consumer_store_purge(s, now - inbox_ms, batch, &n, err))) return rc;
        st->inbox += n;
        if (n < batch) break;
    }
    for (int i = 0; i < 100000; i++) {
        if ((rc = oq__consumer_store_purge_outbox(s, now - inbox_ms, batch, &n, err))) return rc;
        st->outbox += n;
        if (n < batch) break;
    }
    if (retention_ms <= 0) return 0; /* executions kept */
    int64_t skew = r / 10 < 3600000 ? r / 10 : 3600000;
    oq__purge_batch_t b = {.before = now - r, .horizon = now - r + skew, .limit = batch};
    int64_t max_rowid = 0, max_audit = 0, last = 0, n_exec = 0, n_eff = 0;
    if ((rc = oq__consumer_store_purge_bounds(s, b.before, &max_rowid, &max_audit, err))) return rc;
    b.upto = max_rowid;
    for (int more = 1; more && rc == 0;) {
        if ((rc = oq__consumer_store_begin(s, err))) return rc;
        rc = oq__consumer_store_purge_settled(s, &b, &last, &n_exec, &n_eff, err);
        if (rc == 0) rc = oq__consumer_store_commit(s, err);
        if (rc) {
            oq__consumer_store_rollback(s);
            return rc;
        }
        st->executions += n_exec;
        st->effects += n_eff;
        st->batches++;
        b.after = last;
        more = n_exec >= batch;
    }
    b.after = 0;
    b.upto = max_audit;
    for (int more = 1; more && rc == 0;) {
        if ((rc = oq__consumer_store_begin(s, err))) return rc;
        rc = oq__consumer_store_purge_audit(s, &b, &last, &n, err);
        if (rc == 0) rc = oq__consumer_store_commit(s, err);
        if (rc) {
            oq__consumer_store_rollback(s);
            return rc;
        }
        st->audit += n;
        st->batches++;
        b.after = last;
        more = n >= batch;
    }
    return 0;
}
