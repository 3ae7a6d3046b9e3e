/*
 * The consumer's rules, top to bottom: the states and the one table of legal transitions, the
 * retry policy, what a tool's outcome means, the intake decision for each message, the claim,
 * the one finish path of every run, and recovery. Every row is read and written through
 * consumer_store.h; nothing here knows SQL, Kafka or threads (consumer/worker.c).
 *
 * An execution is one call's progress in effects.db. It is PLANNED when its first message
 * arrives, STARTED when a worker claims it (a lease with a fencing token), and its run ends in
 * COMMITTED (effect + result), FAILED_RETRYABLE (nothing happened, retried after a backoff while
 * the budget lasts) or FAILED_FINAL. A STARTED row whose lease lapsed, or whose holder gave it
 * up, is UNKNOWN; reconciliation decides it: COMMITTED when its effect is found, SAFE_RETRY
 * (run again, same effect_id) when it is known absent, NEEDS_REVIEW when it cannot be decided
 * or the budget is spent. Every write of a stored row is a conditional UPDATE on the state and
 * fence it was read with, checked first against the table below, and appends an audit row whose
 * event is the new state's lowercase name.
 *
 * The fast path: a new call of a tool that does not block runs inline, in the batch transaction
 * that takes its message. Nobody can see its PLANNED and STARTED versions there, so the run is
 * prepared in memory (oq__exec_start_inline) and the same finish code writes the row once, in
 * its outcome state, with one audit row whose detail names the path ("inline: planned, started,
 * try 1 ..."). That halves the database work per call (see `onceq bench consumer`).
 *
 * Result messages carry a message id DERIVED from what they report (result_message_id: the
 * call, the producer's attempt, the terminal status and the call message that planned the
 * attempt), so the same result published twice has the same id and the producer's result
 * inbox applies it once. That is what makes re-emitting safe: a terminal call whose message
 * comes again (a redelivery, or the producer's redrive of a call it heard nothing from) gets
 * its result published again (oq_outbox_republish: the delivered row moved to the tail, or
 * nothing while it is still unpublished), which repairs a result lost on its way back.
 *
 * Seams for calls to other systems: the outcome class UNKNOWN (sent, no definite answer) is
 * refused by oq__exec_finish until UNKNOWN can be stored and reconciled against the downstream;
 * lookup_effect() is where that lookup belongs (today it reads the local effects table, which
 * is exact for tools whose effect is that row); RECONCILING is in the table for a lookup that
 * runs outside the transaction. A run that calls out must be claimed (STARTED durable before
 * the request leaves), never run inline.
 */
#include "execution.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_log.h"
#include "oq_util.h"

#define COMP "consumer"

/* --- states and transitions ------------------------------------------------------------------ */

/* The audit event of a transition: the lowercase name of the state it enters. */
static const char *const events[OQ_X__COUNT] = {"planned",          "started",      "committed",
                                                "failed_retryable", "failed_final", "unknown",
                                                "reconciling",      "safe_retry",   "needs_review"};

/*
 * Every legal transition. fence_step 1 marks a change of lease holder (a claim, or the loss of
 * a lease): the fence moves, so every write of the previous holder is refused from then on.
 */
static const struct edge {
    int from, to, fence_step;
} edges[] = {
    /* a call's first message plans it; a new producer attempt re-plans a failed call */
    {OQ__X_NONE, OQ_X_PLANNED, 0},
    {OQ_X_FAILED_FINAL, OQ_X_PLANNED, 0},
    /* a claim: due and not held */
    {OQ_X_PLANNED, OQ_X_STARTED, 1},
    {OQ_X_FAILED_RETRYABLE, OQ_X_STARTED, 1},
    {OQ_X_SAFE_RETRY, OQ_X_STARTED, 1},
    /* a run's outcome, written by its lease holder */
    {OQ_X_STARTED, OQ_X_COMMITTED, 0},
    {OQ_X_STARTED, OQ_X_FAILED_RETRYABLE, 0},
    {OQ_X_STARTED, OQ_X_FAILED_FINAL, 0},
    /* the lease ends without an answer: lapsed, or given up */
    {OQ_X_STARTED, OQ_X_UNKNOWN, 1},
    /* reconciliation, decided in the same transaction as its lookup ... */
    {OQ_X_UNKNOWN, OQ_X_COMMITTED, 0},
    {OQ_X_UNKNOWN, OQ_X_SAFE_RETRY, 0},
    {OQ_X_UNKNOWN, OQ_X_NEEDS_REVIEW, 0},
    /* ... or around a lookup that runs outside it (no code path takes these yet) */
    {OQ_X_UNKNOWN, OQ_X_RECONCILING, 0},
    {OQ_X_RECONCILING, OQ_X_COMMITTED, 0},
    {OQ_X_RECONCILING, OQ_X_SAFE_RETRY, 0},
    {OQ_X_RECONCILING, OQ_X_NEEDS_REVIEW, 0},
};

static const struct edge *edge_find(int from, int to)
{
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
        if (edges[i].from == from && edges[i].to == to) return &edges[i];
    return NULL;
}

int oq__exec_transition_legal(int from, int to)
{
    return edge_find(from, to) != NULL;
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
    uint32_t r;
    oq_random_bytes(&r, sizeof(r));
    return d / 2 + (int64_t)((double)d * ((double)r / 4294967296.0));
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

void oq__outcome_clear(oq__outcome_t *o)
{
    if (o) oq_tool_out_clear(&o->out);
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
}

/*
 * One transition of a stored execution: checked against the table (the fence moves by the
 * edge's step), then one conditional UPDATE on the state and fence \p x was read with, and on
 * the lease owner when \p holder_only (a run's outcome: only the holder may write it). *moved =
 * 0 when the row had moved on: nothing was written. When it moved, \p x's state, counters and
 * times follow; its strings (lease owner, result, error, effect_id) are left as they were.
 */
static int move(oq__consumer_store_t *s, oq__exec_row_t *x, oq__exec_update_t *u, int holder_only,
                int *moved, oq_error_t *err)
{
    const struct edge *e = edge_find(x->state, u->state);
    *moved = 0;
    if (!e)
        return oq_error_set(err, OQ_ESTATE, 0, "%s: illegal transition %s -> %s", x->call_id,
                            oq__xstate_name(x->state), oq__xstate_name(u->state));
    u->fence = x->fence + e->fence_step;
    u->from_owner = holder_only ? oq__consumer_store_worker(s) : NULL;
    int rc = oq__consumer_store_exec_update(s, u, moved, err);
    if (rc || !*moved) return rc;
    x->state = u->state;
    x->attempt = u->attempt;
    x->tries = u->tries;
    x->fence = u->fence;
    x->lease_until = u->lease_until;
    x->next_attempt_at = u->next_attempt_at;
    if (u->message_id) snprintf(x->message_id, sizeof(x->message_id), "%s", u->message_id);
    return 0;
}

static int audit(oq__consumer_store_t *s, const char *call_id, const char *event, int64_t attempt,
                 int64_t fence, const char *detail, int64_t now, oq_error_t *err)
{
    oq__audit_row_t a = {.ts = now,
                         .call_id = call_id,
                         .event = event,
                         .detail = detail,
                         .attempt = attempt,
                         .fence = fence};
    return oq__consumer_store_audit_add(s, &a, err);
}

static char *error_json(const char *code, const char *message, int retryable)
{
    json_t *e = json_pack("{s:s, s:s, s:b}", "code", code && code[0] ? code : "tool_failed",
                          "message", message ? message : "", "retryable", retryable ? 1 : 0);
    char *t = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    return t;
}

/* OpenSSL 3 looks a digest up on every EVP_sha256() call; fetch it once (never released). */
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static const EVP_MD *sha256_md;

static void sha256_init(void)
{
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
#endif
    if (!sha256_md) sha256_md = EVP_sha256();
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
    unsigned char md[EVP_MAX_MD_SIZE], b[16];
    unsigned int mdlen = 0;
    char in[160], hex[33];
    int n = snprintf(in, sizeof(in), "onceq.tool_result\n%s\n%" PRId64 "\n%s\n%s", x->call_id,
                     x->attempt, status, x->message_id);
    pthread_once(&sha256_once, sha256_init);
    if (n < 0 || (size_t)n >= sizeof(in) || !sha256_md ||
        EVP_Digest(in, (size_t)n, md, &mdlen, sha256_md, NULL) != 1 || mdlen < 16)
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
 * Appends the tool_result event of \p x to the outbox: status succeeded (result, effect_id),
 * failed or needs_review (error). The result is \p result_obj (borrowed) when given, which
 * saves re-parsing text just produced, else \p result_json; NULL texts mean null.
 * \p again: the result was emitted before (a re-emit): its row is republished (moved to the
 * outbox's tail when delivered, left alone while not) and *written says whether a row was
 * written; otherwise it is appended (a first emit: its derived id is new).
 */
static int emit_result(oq__consumer_store_t *s, const oq__exec_row_t *x, const char *status,
                       const json_t *result_obj, const char *result_json,
                       const char *error_json_text, const char *effect_id, int64_t now, int again,
                       int *written, oq_error_t *err)
{
    oq_envelope_t e;
    char *payload = NULL;
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
    if (result_obj)
        e.result = json_incref((json_t *)result_obj);
    else if (result_json)
        e.result = json_loads(result_json, 0, NULL);
    if (error_json_text) e.error = json_loads(error_json_text, 0, NULL);
    if (e.result && !json_is_object(e.result)) {
        json_decref(e.result);
        e.result = NULL;
    }
    rc = oq_envelope_encode(&e, &payload, &len, err);
    json_decref(e.result);
    json_decref(e.error);
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
        return emit_result(s, x, "succeeded", NULL, x->result ? x->result : "{}", NULL,
                           x->effect_id, now, 1, written, err);
    case OQ_X_FAILED_FINAL:
        return emit_result(s, x, "failed", NULL, NULL, x->error, NULL, now, 1, written, err);
    case OQ_X_NEEDS_REVIEW:
        return emit_result(s, x, "needs_review", NULL, NULL, x->error, NULL, now, 1, written, err);
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
    x->args = env->args ? json_dumps(env->args, JSON_COMPACT) : NULL;
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
    int rc = move(s, x, &u, 0, &moved, err);
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

int oq__exec_claim(oq__consumer_store_t *s, const char *call_id, int64_t lease_ms, int64_t now,
                   oq__exec_row_t *out, oq_error_t *err)
{
    oq__exec_row_t x;
    oq__exec_update_t u;
    char detail[48];
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
    update_from(&x, OQ_X_STARTED, now, &u);
    u.tries = x.tries + 1;
    u.lease_owner = oq__consumer_store_worker(s);
    u.lease_until = now + lease_ms;
    u.next_attempt_at = 0;
    if ((rc = move(s, &x, &u, 0, &moved, err))) goto out;
    if (!moved) {
        rc = oq_error_set(err, OQ_ESTATE, 0, "%s is not due or taken", call_id);
        goto out;
    }
    free(x.lease_owner);
    if (!(x.lease_owner = strdup(oq__consumer_store_worker(s)))) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    snprintf(detail, sizeof(detail), "try %" PRId64, x.tries);
    if ((rc = audit(s, call_id, events[OQ_X_STARTED], x.attempt, x.fence, detail, now, err)))
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

/* --- finish ---------------------------------------------------------------------------------- */

/* The finishing write of \p x matched nothing: another worker or recovery moved it on. */
static int lease_lost(oq__consumer_store_t *s, const oq__exec_row_t *x, int64_t now,
                      oq_error_t *err)
{
    OQ_LOGC_WARN(COMP, x->call_id, "lease lost (fence %" PRId64 "): writes refused", x->fence);
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
    if ((rc = move(s, x, &u, 1, &moved, err))) return rc;
    if (!moved) return lease_lost(s, x, now, err);
    if ((rc = audit(s, x->call_id, events[OQ_X_UNKNOWN], x->attempt, x->fence, "abandoned at stop",
                    now, err)))
        return rc;
    update_from(x, OQ_X_SAFE_RETRY, now, &u);
    u.lease_owner = u.result = u.error = u.effect_id = NULL; /* x's text is as claimed */
    u.tries = x->tries - 1;
    u.next_attempt_at = now;
    if ((rc = move(s, x, &u, 0, &moved, err))) return rc;
    if (!moved) return oq_error_set(err, OQ_ESTATE, 0, "%s moved during hand-back", x->call_id);
    if ((rc = audit(s, x->call_id, events[OQ_X_SAFE_RETRY], x->attempt, x->fence,
                    "abandoned at stop: nothing done", now, err)))
        return rc;
    if (state_out) *state_out = OQ_X_SAFE_RETRY;
    return 0;
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
    else
        return oq_error_set(err, OQ_EINVAL, 0,
                            "%s: outcome class %d (unknown outcome) cannot be stored yet",
                            x->call_id, (int)o->cls);

    if (to == OQ_X_COMMITTED) {
        snprintf(why, sizeof(why), "try %" PRId64, x->tries);
        if (!(result = o->out.result ? json_dumps(o->out.result, JSON_COMPACT) : strdup("{}")))
            return oq_error_set(err, OQ_ENOMEM, 0, "result encode");
        final_result = result;
        if (o->out.has_effect) {
            oq__exec_effect_id(x->call_id, eid);
            final_eid = eid;
        }
    } else {
        if (to == OQ_X_FAILED_RETRYABLE) {
            wait = oq__retry_backoff_ms(p, x->tries);
            next_at = now + wait;
            snprintf(why, sizeof(why), "try %" PRId64 "/%d: %.60s; retry in %" PRId64 " ms",
                     x->tries, p->max_attempts, o->out.message, wait);
        } else {
            snprintf(why, sizeof(why), "try %" PRId64 ": %s: %.100s", x->tries, o->out.code,
                     o->out.message);
        }
        if (!(error = error_json(o->out.code, o->out.message, o->cls == OQ__OUTCOME_RETRYABLE)))
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
        u.effect_id = final_eid;
        u.next_attempt_at = next_at;
        rc = move(s, x, &u, 1, &moved, err);
        if (rc == 0 && !moved) {
            rc = lease_lost(s, x, now, err);
            goto out;
        }
    }
    if (rc) goto out;

    /* 3. The effect. UNIQUE(call_id) is the last gate: when the call already has an effect,
     *    that one stands (its id and result are what the execution reports), ours is dropped. */
    if (to == OQ_X_COMMITTED && o->out.has_effect) {
        oq__effect_row_t e = {.effect_id = eid,
                              .call_id = x->call_id,
                              .tool = x->tool,
                              .amount = o->out.amount,
                              .recipient = o->out.recipient,
                              .detail = result,
                              .attempt = x->attempt,
                              .fence = x->fence,
                              .created_at = now};
        int inserted = 0, found = 0;
        if ((rc = oq__consumer_store_effect_insert(s, &e, &inserted, err))) goto out;
        if (effect_new) *effect_new = inserted;
        if (!inserted) {
            if ((rc = oq__consumer_store_effect_get(s, x->call_id, &found, &old_eid, &old_detail,
                                                    err)))
                goto out;
            if (found) {
                final_result = old_detail ? old_detail : "{}";
                final_eid = old_eid;
                if ((rc = oq__consumer_store_exec_set_result(s, x->call_id, final_result, final_eid,
                                                             err)))
                    goto out;
            }
            snprintf(why, sizeof(why), "try %" PRId64 ": effect already present", x->tries);
            OQ_LOGC_WARN(COMP, x->call_id, "effect already present: unique gate held");
        }
    }

    /* 4. The audit row and, for a terminal state, the result event, in this transaction. */
    snprintf(detail, sizeof(detail), "%s%s", inl ? "inline: planned, started, " : "", why);
    if ((rc = audit(s, x->call_id, events[to], x->attempt, x->fence, detail, now, err))) goto out;
    if (to == OQ_X_COMMITTED)
        rc = emit_result(s, x, "succeeded",
                         final_result == result && json_is_object(o->out.result) ? o->out.result
                                                                                 : NULL,
                         final_result, NULL, final_eid, now, 0, NULL, err);
    else if (to == OQ_X_FAILED_FINAL)
        rc = emit_result(s, x, "failed", NULL, NULL, error, NULL, now, 0, NULL, err);
out:
    if (state_out) *state_out = rc ? -1 : to;
    free(result);
    free(error);
    free(old_eid);
    free(old_detail);
    return rc;
}

/* --- recovery -------------------------------------------------------------------------------- */

/* What is known about the effect of an UNKNOWN execution. */
typedef enum { LOOKUP_FOUND, LOOKUP_ABSENT, LOOKUP_UNDECIDED } lookup_t;

/*
 * Looks the effect of \p x up. Today the one place to look is the local effects table, which is
 * exact for tools whose effect is that row (it commits with the outcome). A tool that calls
 * another system needs a lookup there, by effect_id; its answer belongs here (UNDECIDED when
 * the downstream can neither be asked nor trusted with a resend).
 */
static int lookup_effect(oq__consumer_store_t *s, const oq__exec_row_t *x, lookup_t *verdict,
                         char **effect_id, char **detail, oq_error_t *err)
{
    int found = 0;
    int rc = oq__consumer_store_effect_get(s, x->call_id, &found, effect_id, detail, err);
    *verdict = found ? LOOKUP_FOUND : LOOKUP_ABSENT;
    return rc;
}

/* Decides one UNKNOWN execution; *done = 1 when it moved. */
static int reconcile(oq__consumer_store_t *s, oq__exec_row_t *x, const oq__retry_policy_t *p,
                     int64_t now, int *done, oq_error_t *err)
{
    oq__exec_update_t u;
    char *eid = NULL, *detail = NULL, *error = NULL;
    char msg[128];
    lookup_t verdict = LOOKUP_UNDECIDED;
    int to, moved = 0;
    int rc = lookup_effect(s, x, &verdict, &eid, &detail, err);
    if (rc) goto out;
    if (verdict == LOOKUP_FOUND) {
        to = OQ_X_COMMITTED;
    } else if (verdict == LOOKUP_ABSENT && oq__retry_allowed(p, x->tries)) {
        to = OQ_X_SAFE_RETRY;
    } else {
        to = OQ_X_NEEDS_REVIEW;
        if (verdict == LOOKUP_ABSENT)
            snprintf(msg, sizeof(msg), "outcome unknown after %" PRId64 " tries", x->tries);
        else
            snprintf(msg, sizeof(msg), "outcome cannot be decided");
        if (!(error = error_json("needs_review", msg, 0))) {
            rc = oq_error_set(err, OQ_ENOMEM, 0, "error encode");
            goto out;
        }
    }
    update_from(x, to, now, &u);
    u.result = to == OQ_X_COMMITTED ? (detail ? detail : "{}") : NULL;
    u.error = error;
    u.effect_id = to == OQ_X_COMMITTED ? eid : NULL;
    u.next_attempt_at = to == OQ_X_SAFE_RETRY ? now : 0;
    if ((rc = move(s, x, &u, 0, &moved, err)) || !moved) goto out;
    *done = 1;
    if ((rc =
             audit(s, x->call_id, events[to], x->attempt, x->fence,
                   verdict == LOOKUP_FOUND ? "reconciled: effect present" : "reconciled: no effect",
                   now, err)))
        goto out;
    if (to == OQ_X_COMMITTED)
        rc = emit_result(s, x, "succeeded", NULL, detail ? detail : "{}", NULL, eid, now, 0, NULL,
                         err);
    else if (to == OQ_X_NEEDS_REVIEW)
        rc = emit_result(s, x, "needs_review", NULL, NULL, error, NULL, now, 0, NULL, err);
out:
    free(eid);
    free(detail);
    free(error);
    return rc;
}

int oq__exec_recover(oq__consumer_store_t *s, int64_t now, const oq__retry_policy_t *p, int limit,
                     int *n_recovered, oq_error_t *err)
{
    oq__exec_row_t *rows = NULL;
    oq__exec_update_t u;
    int n = 0, rc, done = 0;
    if (limit <= 0) limit = 100;
    if (n_recovered) *n_recovered = 0;
    if (!(rows = calloc((size_t)limit, sizeof(*rows))))
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");

    /* 1. STARTED with a lapsed lease -> UNKNOWN (the fence moves: the old holder is stale). */
    if ((rc = oq__consumer_store_exec_lapsed(s, now, rows, limit, &n, err))) goto out;
    for (int i = 0; i < n; i++) {
        int64_t fence = rows[i].fence;
        int moved = 0;
        update_from(&rows[i], OQ_X_UNKNOWN, now, &u);
        u.lease_owner = NULL;
        u.lease_until = 0;
        u.next_attempt_at = 0;
        if ((rc = move(s, &rows[i], &u, 0, &moved, err))) goto out;
        if (!moved) continue;
        OQ_LOGC_WARN(COMP, rows[i].call_id, "lease lapsed (fence %" PRId64 "): UNKNOWN", fence);
        if ((rc = audit(s, rows[i].call_id, events[OQ_X_UNKNOWN], rows[i].attempt, rows[i].fence,
                        "lease lapsed", now, err)))
            goto out;
    }
    for (int i = 0; i < n; i++)
        oq__exec_row_clear(&rows[i]);

    /* 2. Reconcile every UNKNOWN row. */
    if ((rc = oq__consumer_store_exec_in_state(s, OQ_X_UNKNOWN, rows, limit, &n, err))) goto out;
    for (int i = 0; i < n && rc == 0; i++) {
        int moved = 0;
        rc = reconcile(s, &rows[i], p, now, &moved, err);
        done += moved;
    }
out:
    for (int i = 0; i < n; i++)
        oq__exec_row_clear(&rows[i]);
    free(rows);
    if (n_recovered) *n_recovered = done;
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
        *dup = 1;
        return 0;
    }
    if ((rc = oq__consumer_store_dlq_insert(s, r, err))) return rc;
    return audit(s, call_id, "dlq", 0, 0, r->reason, r->created_at, err);
}
