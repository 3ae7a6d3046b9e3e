/* SPDX-License-Identifier: Apache-2.0 */
/*
 * decide.c: the producer's rules, top to bottom. What happens to a submit (new, replay,
 * conflict, expired key, retry-reset), what happens to a tool_result (duplicate, unknown call,
 * stale attempt, already terminal, applied), and what retention deletes. The rows are read and
 * written through producer_store.h (no SQL here); the transactions belong to the caller.
 *
 * Submit, inside the caller's write transaction (the group commit, or a service's own
 * transaction in oq_producer_submit_in_tx), for one (tenant, idem_key):
 *  0. The message this submit would publish must fit the relay's limit (max_message_bytes,
 *     Kafka's message.max.bytes): a row over it would never be published. Too large -> the
 *     request is refused (OQ_ETOOBIG) when it would write anything (a new call, an expired
 *     key, a retry); a key that exists is still answered as below (replay, conflict), since
 *     nothing new is published then.
 *  1. Insert the prepared call and its outbox row; the insert does nothing when the key
 *     exists, so a new key costs one statement. A call id that is taken (time-ordered ids can
 *     collide) is redrawn here and the insert repeated.
 *  2. The key exists: read its call. Settled (`succeeded` or `failed`) and past expires_at
 *     (set to the moment it settled + key_ttl) -> the old call, its audit and its result rows
 *     are deleted and the request is a NEW call (as after a purge). A call that is not settled
 *     (`pending`, `running`, `needs_review`) never expires, whatever its age: an unresolved
 *     review replaced by a new call would run the operation a second time.
 *  3. Another fingerprint -> CONFLICT, nothing written.
 *  4. `failed` with error.retryable = true -> RETRY_RESET: back to `pending` with attempt + 1
 *     and a new outbox row (a new message id, the same call id), audited.
 *  5. Otherwise -> REPLAY of the stored call, nothing written.
 * Two submits of one key in one batch see each other (the second is a replay), and no other
 * writer can interleave: the read and the writes share the write transaction.
 *
 * Dead letters: a call whose message the relay set aside (outbox_dead: Kafka refused it for
 * good) gets a tool_result `failed` with error code "unpublishable" through the very same
 * result rule below, keyed by the dead message's id, and the dead letter is marked handled.
 *
 * Result, inside the writer's transaction, for one tool_result envelope: decide first from the
 * call's state and attempt (no call -> UNKNOWN_CALL; another attempt -> STALE; a terminal call,
 * or `running` again -> IGNORED, except that a call in needs_review takes one `succeeded` or
 * `failed`: the consumer emits those only when an operator resolved the review; else
 * APPLIED), then claim the message id in result_inbox with that outcome. So `running` never
 * overrides a terminal state and never comes back after one. A message id already claimed
 * stops everything (DUPLICATE: nothing else is written, not even an audit row). Only then is
 * the call updated, or the refusal audited. A
 * terminal result ends the call's redrive schedule; a settling one (`succeeded`, `failed`)
 * also starts the key's retention: expires_at = now + key_ttl.
 *
 * Webhooks (producer/webhooks.c sends; the rules are here):
 *  1. A result that settles a call (`succeeded` or `failed`, applied as above) whose call has a
 *     callback_url queues one delivery in the same transaction: a row with a fresh delivery id
 *     (the receivers' Idempotency-Key) and the call JSON as it stands then, due at once. So a
 *     crash never loses one, and an unapplied result (duplicate, stale, ignored) queues none.
 *     `needs_review` queues none: it is not an answer yet; the operator's resolution settles
 *     the call, and that is delivered. A retryable failure resubmitted (retry-reset) settles
 *     again under a new attempt: a second delivery, with its own id.
 *  2. A try answered 2xx -> delivered. Anything else -> tried again after an exponential
 *     backoff with jitter (at least the answer's Retry-After), until max_tries or max_age;
 *     then dead, for an operator (`onceq dlq`, redrive).
 *
 * Redrive (anti-entropy), inside the writer's transaction, for each call due (looked at before
 * and next_redrive_at passed, or never looked at and unchanged for redrive_after):
 *  1. Terminal after all -> unscheduled.
 *  2. Its state changed less than redrive_after ago -> looked at again redrive_after after it.
 *  3. Its message is still above the relay's watermark (not delivered yet) -> nothing to
 *     repair; looked at again one spacing later.
 *  4. Otherwise its tool_call message is published again with the SAME message id (the
 *     delivered outbox row moved to the tail; rebuilt from the call when retention deleted
 *     it): redrive_count + 1, next one after redrive_after * 2^redrive_count (capped), an audit
 *     row 'redrive' and an INFO line. Whatever was lost (the call message, or the result
 *     message coming back), the consumer's inbox turns the same id into "in flight: nothing"
 *     or "terminal: re-emit the result", never into a second execution.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_log.h"
#include "producer_int.h"
#include "tasks.h"

/* --- submit --------------------------------------------------------------------------------- */

/* Settled: the call's outcome is known for good, so its key may expire (key_ttl after this).
 * needs_review is terminal for the pipeline but not settled: it waits for an operator. */
static int call_settled(const char *state)
{
    return strcmp(state, "succeeded") == 0 || strcmp(state, "failed") == 0;
}

/* The new call row of \p job at \p now_ms. */
static oq__producer_new_call_t new_row(const oq_submit_job_t *job, int64_t now_ms, int64_t ttl)
{
    oq__producer_new_call_t row = {.call_id = job->call_id,
                                   .tenant = job->tenant,
                                   .idem_key = job->idem_key,
                                   .fingerprint = job->fingerprint,
                                   .tool = job->tool,
                                   .args = job->args,
                                   .args_len = job->args_len,
                                   .client_id = job->client_id,
                                   .seq = job->seq,
                                   .has_seq = job->has_seq,
                                   .created_at = now_ms,
                                   .expires_at = now_ms + ttl,
                                   .message_id = job->message_id,
                                   .payload = job->payload,
                                   .payload_len = job->payload_len,
                                   .callback_url = job->callback_url};
    return row;
}

/* Step 1: insert the job's call; *exists when the key already has one (nothing written). */
static int insert_new(oq__producer_store_t *s, oq_submit_job_t *job, int64_t now_ms, int64_t ttl,
                      int *exists, oq_error_t *err)
{
    for (int tries = 0;; tries++) {
        oq__producer_new_call_t row = new_row(job, now_ms, ttl);
        oq__producer_insert_t res = 0;
        int ret = oq__producer_store_insert_call(s, &row, &res, err);
        if (ret) return ret;
        if (res == OQ__INSERT_ID_TAKEN) {
            if (tries >= 3)
                return oq_error_set(err, OQ_EDB, 0, "call id %s taken %d times in a row",
                                    job->call_id, tries + 1);
            OQ_LOG_INFO("producer", "call id %s already taken: drawing another", job->call_id);
            if ((ret = oq__job_new_ids(job, err))) return ret;
            continue;
        }
        *exists = res == OQ__INSERT_KEY_EXISTS;
        if (!*exists) {
            job->outcome = OQ_SUBMIT_NEW;
            job->call_from_job = 1; /* the call is the job's input: moved after the commit */
            job->call.created_at = job->call.updated_at = now_ms;
            job->call.expires_at = now_ms + ttl;
        }
        return 0;
    }
}

/* Step 0: the Kafka message of \p payload_len bytes (key = call id, header = message id) does
 * not fit \p max: fill \p err. */
static int refuse_too_big(size_t payload_len, int64_t max, oq_error_t *err)
{
    size_t wire = oq_outbox_wire_size(OQ_CALL_ID_LEN, payload_len, OQ_UUID_LEN);
    return oq_error_set(err, OQ_ETOOBIG, 0,
                        "the call's Kafka message would be %zu bytes, over the %lld bytes the "
                        "relay can publish (message.max.bytes, the producer's "
                        "--max-message-bytes): nothing was accepted; send smaller args",
                        wire, (long long)max);
}

static int fits(size_t payload_len, int64_t max)
{
    return max <= 0 ||
           (int64_t)oq_outbox_wire_size(OQ_CALL_ID_LEN, payload_len, OQ_UUID_LEN) <= max;
}

/** Is the stored error JSON marked retryable? */
static int error_retryable(const char *error_json)
{
    if (!error_json) return 0;
    json_t *e = json_loads(error_json, 0, NULL);
    int r = e && json_is_true(json_object_get(e, "retryable"));
    json_decref(e);
    return r;
}

/* Step 4: the stored call \p c (failed, retryable) starts attempt + 1. */
static int retry_reset(oq__producer_store_t *s, oq_call_t *c, int64_t now_ms, int64_t ttl,
                       int64_t max_bytes, oq_error_t *err)
{
    int64_t attempt = c->attempt + 1;
    char message_id[OQ_UUID_LEN + 1];
    oq_id_uuid(message_id);
    /* calls.args holds the canonical text the call was submitted with */
    oq__call_message_t m = {message_id, c->call_id, c->tenant,       c->idem_key, c->fingerprint,
                            c->tool,    c->args,    strlen(c->args), attempt,     now_ms};
    char *payload = NULL;
    size_t len = 0;
    int ret = oq__call_message_encode(&m, &payload, &len, err);
    if (ret) return ret;
    if (!fits(len, max_bytes)) {
        free(payload);
        return refuse_too_big(len, max_bytes, err);
    }
    oq__producer_attempt_t a = {.call_id = c->call_id,
                                .attempt = attempt,
                                .updated_at = now_ms,
                                .expires_at = now_ms + ttl,
                                .message_id = message_id,
                                .payload = payload,
                                .payload_len = len};
    ret = oq__producer_store_reset_call(s, &a, err);
    free(payload);
    if (ret) return ret;
    char detail[64];
    snprintf(detail, sizeof detail, "{\"attempt\":%lld}", (long long)attempt);
    if ((ret = oq__producer_store_audit_add(s, now_ms, c->call_id, "retry_reset", detail, err)))
        return ret;
    snprintf(c->state, sizeof c->state, "pending");
    c->attempt = attempt;
    free(c->result);
    free(c->error);
    c->result = c->error = NULL;
    c->updated_at = now_ms;
    c->expires_at = now_ms + ttl;
    OQ_LOGC_INFO("producer", c->call_id, "retryable failure resubmitted attempt=%lld",
                 (long long)attempt);
    return 0;
}

int oq__decide_submit_ahead(oq__producer_store_t *s, oq__work_t **items, int n, int64_t now_ms,
                            int64_t ttl, int64_t max_bytes, oq_error_t *err)
{
    /* exactly the rows step 1 of oq__decide_submit() inserts first (a message too large for
     * the relay inserts nothing) */
    oq__producer_new_call_t *rows = calloc(n > 0 ? (size_t)n : 1, sizeof *rows);
    if (!rows) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    int m = 0;
    for (int i = 0; i < n; i++) {
        oq_submit_job_t *job = (oq_submit_job_t *)items[i];
        if (items[i]->kind == OQ__WORK_SUBMIT && fits(job->payload_len, max_bytes))
            rows[m++] = new_row(job, now_ms, ttl);
    }
    int ret = m > 1 ? oq__producer_store_insert_calls(s, rows, m, err) : 0;
    free(rows);
    return ret;
}

int oq__decide_submit(oq__producer_store_t *s, oq_submit_job_t *job, int64_t now_ms, int64_t ttl,
                      int64_t max_bytes, oq_error_t *err)
{
    oq_call_clear(&job->call);
    job->call_from_job = 0;
    oq_call_t *c = &job->call;

    /* 0. a message too large for the relay: only an existing key is answered */
    int big = !fits(job->payload_len, max_bytes);

    /* 1. a new key */
    int exists = 0, ret = 0;
    if (!big) {
        ret = insert_new(s, job, now_ms, ttl, &exists, err);
        if (ret || !exists) return ret;
    }

    /* 2. the key exists: its call, unless that is finished and past retention */
    ret = oq__producer_store_get_by_key(s, job->tenant, job->idem_key, c, err);
    if (ret == OQ_ENOTFOUND) /* cannot happen inside the write transaction, unless too big */
        ret = big ? refuse_too_big(job->payload_len, max_bytes, err)
                  : oq_error_set(err, OQ_EDB, 0, "key vanished inside the transaction");
    if (ret) {
        oq_call_clear(c);
        return ret;
    }
    if (call_settled(c->state) && c->expires_at <= now_ms) {
        if (big) {
            oq_call_clear(c);
            return refuse_too_big(job->payload_len, max_bytes, err);
        }
        OQ_LOGC_INFO("producer", c->call_id, "expired key reused: old call replaced");
        if ((ret = oq__producer_store_delete_call(s, c->call_id, err))) return ret;
        oq_call_clear(c);
        if ((ret = insert_new(s, job, now_ms, ttl, &exists, err))) return ret;
        return exists ? oq_error_set(err, OQ_EDB, 0, "expired call not replaced") : 0;
    }

    /* 3. the same key for another request */
    if (strcmp(c->fingerprint, job->fingerprint) != 0) {
        job->outcome = OQ_SUBMIT_CONFLICT;
        return oq_error_set(err, OQ_ECONFLICT, 0,
                            "idempotency key reused with a different request (call %s)",
                            c->call_id);
    }

    /* 4. a retryable failure, submitted again */
    if (strcmp(c->state, "failed") == 0 && error_retryable(c->error)) {
        if ((ret = retry_reset(s, c, now_ms, ttl, max_bytes, err))) return ret;
        job->outcome = OQ_SUBMIT_RETRY_RESET;
        return 0;
    }

    /* 5. the same request again */
    job->outcome = OQ_SUBMIT_REPLAY;
    return 0;
}

int oq__submit_in_store(oq__producer_store_t *s, const oq_submit_req_t *req, int64_t key_ttl_ms,
                        oq_call_t *call, oq_submit_outcome_t *outcome, oq_error_t *err)
{
    if (!oq__producer_store_in_tx(s))
        return oq_error_set(err, OQ_ESTATE, 0,
                            "the in-transaction submit needs an open transaction (BEGIN)");
    oq_submit_job_t *job = NULL;
    int ret = oq_submit_job_new(req, &job, err);
    if (ret) return ret;
    int64_t ttl = key_ttl_ms > 0 ? key_ttl_ms : OQ_DEFAULT_KEY_TTL_MS;
    ret = oq__decide_submit(s, job, oq_now_ms(), ttl, OQ_DEFAULT_MAX_MESSAGE_BYTES, err);
    if (ret == 0) oq__job_finish_new(job);
    if (outcome) *outcome = job->outcome;
    if (call && (ret == 0 || ret == OQ_ECONFLICT)) {
        *call = job->call;
        memset(&job->call, 0, sizeof job->call);
    }
    oq_submit_job_destroy(job);
    return ret;
}

int oq_producer_submit_in_tx(sqlite3 *db, const oq_submit_req_t *req, int64_t key_ttl_ms,
                             oq_call_t *call, oq_submit_outcome_t *outcome, oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    return oq__submit_in_store(&s, req, key_ttl_ms, call, outcome, err);
}

/* --- results -------------------------------------------------------------------------------- */

static int known_result_status(const char *s)
{
    return s && (strcmp(s, "running") == 0 || strcmp(s, "succeeded") == 0 ||
                 strcmp(s, "failed") == 0 || strcmp(s, "needs_review") == 0);
}

/* The audit detail of an applied result: {"from":…,"attempt":…,"message_id":…,"effect_id":…|null
 * [,"error":…]}, written without building a JSON tree, strings escaped as RFC 8785 escapes them
 * (oq_jcs_put_string); \p error_json is the error as stored in calls.error, copied verbatim.
 * @returns malloc()ed text, or NULL (out of memory, or a string that is not UTF-8: the detail
 * is then stored as NULL). */
static char *applied_detail(const char *from, const oq_envelope_t *env, const char *error_json)
{
    oq_jcs_buf_t b = {0};
    char *out = NULL;
    int rc = oq_jcs_put_raw(&b, "{\"from\":", 8, NULL);
    if (!rc) rc = oq_jcs_put_string(&b, from, NULL);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"attempt\":", 11, NULL);
    if (!rc) rc = oq_jcs_put_int(&b, env->attempt, NULL);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"message_id\":", 14, NULL);
    if (!rc) rc = oq_jcs_put_string(&b, env->message_id, NULL);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"effect_id\":", 13, NULL);
    if (!rc)
        rc = env->effect_id ? oq_jcs_put_string(&b, env->effect_id, NULL)
                            : oq_jcs_put_raw(&b, "null", 4, NULL);
    if (!rc && error_json) {
        rc = oq_jcs_put_raw(&b, ",\"error\":", 9, NULL);
        if (!rc) rc = oq_jcs_put_raw(&b, error_json, strlen(error_json), NULL);
    }
    if (!rc) rc = oq_jcs_put_raw(&b, "}", 1, NULL);
    return oq_jcs_buf_finish(&b, rc, &out, NULL, NULL) ? NULL : out;
}

/* The detail of a result not applied: {"status":…,"attempt":…,"reason":…,"message_id":…}
 * (every string escaped: the public oq_store_apply_result() takes any message id). */
static char *ignored_detail(const oq_envelope_t *env, const char *why)
{
    oq_jcs_buf_t b = {0};
    char *out = NULL;
    int rc = oq_jcs_put_raw(&b, "{\"status\":", 10, NULL);
    if (!rc) rc = oq_jcs_put_string(&b, env->status, NULL);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"attempt\":", 11, NULL);
    if (!rc) rc = oq_jcs_put_int(&b, env->attempt, NULL);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"reason\":", 10, NULL);
    if (!rc) rc = oq_jcs_put_string(&b, why, NULL);
    if (!rc) rc = oq_jcs_put_raw(&b, ",\"message_id\":", 14, NULL);
    if (!rc) rc = oq_jcs_put_string(&b, env->message_id, NULL);
    if (!rc) rc = oq_jcs_put_raw(&b, "}", 1, NULL);
    return oq_jcs_buf_finish(&b, rc, &out, NULL, NULL) ? NULL : out;
}

/* Webhooks, rule 1: the call \p call_id (its callback_url set) just settled: its delivery row,
 * carrying the call JSON as it stands now in this transaction (GET's body, oq_call_render). */
static int queue_delivery(oq__producer_store_t *s, const char *call_id, int64_t now_ms,
                          oq_error_t *err)
{
    oq_call_t c;
    memset(&c, 0, sizeof c);
    char *body = NULL;
    int ret = oq__producer_store_get(s, call_id, &c, err);
    if (ret) return ret;
    if (!c.callback_url) goto out; /* cannot happen: has_callback said so in this transaction */
    if (oq_call_render(&c, &body, NULL) != 0) { /* only out of memory: args and results are
                                                    checked UTF-8 on their way in */
        OQ_LOGC_ERROR("producer", call_id, "webhook not queued: its body cannot be rendered");
        goto out;
    }
    oq__producer_delivery_t d;
    memset(&d, 0, sizeof d);
    oq_id_uuid(d.delivery_id);
    snprintf(d.call_id, sizeof d.call_id, "%s", c.call_id);
    d.attempt = c.attempt;
    d.tenant = c.tenant ? c.tenant : (char *)OQ_DEFAULT_TENANT;
    d.url = c.callback_url;
    d.body = body;
    d.next_at = d.created_at = now_ms;
    if ((ret = oq__producer_store_delivery_add(s, &d, err))) goto out;
    char detail[96];
    snprintf(detail, sizeof detail, "{\"delivery_id\":\"%s\"}", d.delivery_id);
    ret = oq__producer_store_audit_add(s, now_ms, call_id, "webhook_queued", detail, err);
out:
    free(body);
    oq_call_clear(&c);
    return ret;
}

/* Record the change: the call's new state, result, error and effect id, and its audit row; a
 * settling result of a call with a callback_url also queues its webhook delivery. */
static int apply(oq__producer_store_t *s, const oq_envelope_t *env, const char *from,
                 int has_callback, int64_t now_ms, int64_t ttl, oq_error_t *err)
{
    /* the ingest's fast decode carries the result as that very text (oq_envelope_decode_result) */
    char *result = env->result && !env->result_json
                       ? json_dumps(env->result, JSON_COMPACT | JSON_SORT_KEYS)
                       : NULL;
    char *error = env->error ? json_dumps(env->error, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *detail = NULL;
    oq__producer_result_t r = {.call_id = env->call_id,
                               .state = env->status,
                               .result = env->result_json ? env->result_json : result,
                               .error = error,
                               .effect_id = env->effect_id,
                               .updated_at = now_ms,
                               .settled = oq_call_state_terminal(env->status),
                               .expires_at = call_settled(env->status) ? now_ms + ttl : 0};
    int ret = oq__producer_store_set_result(s, &r, err);
    if (ret) goto out;
    detail = applied_detail(from, env, error);
    if ((ret = oq__producer_store_audit_add(s, now_ms, env->call_id, env->status, detail, err)))
        goto out;
    OQ_LOGC_DEBUG("producer", env->call_id, "result applied from=%s status=%s", from, env->status);
    if (has_callback && call_settled(env->status))
        ret = queue_delivery(s, env->call_id, now_ms, err);
out:
    free(detail);
    free(result);
    free(error);
    return ret;
}

static int decide_result(oq__producer_store_t *s, const oq_envelope_t *env, int64_t now_ms,
                         int64_t ttl, oq_result_outcome_t *outcome, oq_error_t *err)
{
    if (env->kind != OQ_KIND_TOOL_RESULT || !known_result_status(env->status))
        return oq_error_set(err, OQ_EINVAL, 0, "not a tool_result with a known status");

    /* Decide first (the write transaction makes read-then-claim atomic)... */
    oq__producer_call_state_t call = {"", 0, 0};
    int found = 0;
    int ret = oq__producer_store_get_state(s, env->call_id, &call, &found, err);
    if (ret) return ret;
    oq_result_outcome_t oc = OQ_RESULT_APPLIED;
    const char *why = NULL;
    if (!found) {
        oc = OQ_RESULT_UNKNOWN_CALL;
        why = "unknown call";
    } else if (env->attempt != call.attempt) {
        oc = OQ_RESULT_STALE;
        why = env->attempt < call.attempt ? "stale attempt" : "attempt ahead of the call";
    } else if (strcmp(call.state, "needs_review") == 0 &&
               (strcmp(env->status, "succeeded") == 0 || strcmp(env->status, "failed") == 0)) {
        /* an operator's resolution (onceq review resolve): applied */
    } else if (oq_call_state_terminal(call.state)) {
        oc = OQ_RESULT_IGNORED;
        why = "call already terminal";
    } else if (strcmp(env->status, "running") == 0 && strcmp(call.state, "running") == 0) {
        oc = OQ_RESULT_IGNORED;
        why = "already running";
    }

    /* ...then claim the message id with the final outcome: a duplicate does nothing at all. */
    oq__producer_inbox_row_t in = {env->message_id, env->call_id, env->status,
                                   oq_result_outcome_name(oc), now_ms};
    int claimed = 0;
    if ((ret = oq__producer_store_claim_result(s, &in, &claimed, err))) return ret;
    if (!claimed) {
        *outcome = OQ_RESULT_DUPLICATE;
        return 0;
    }

    if (why) {
        OQ_LOGC_WARN("producer", env->call_id,
                     "result not applied: %s status=%s attempt=%lld message_id=%s", why,
                     env->status, (long long)env->attempt, env->message_id);
        if (oc != OQ_RESULT_UNKNOWN_CALL) {
            char *detail = ignored_detail(env, why);
            ret = oq__producer_store_audit_add(s, now_ms, env->call_id, "result_ignored", detail,
                                               err);
            free(detail);
            if (ret) return ret;
        }
        *outcome = oc;
        return 0;
    }
    if ((ret = apply(s, env, call.state, call.has_callback, now_ms, ttl, err))) return ret;
    /* a task's step: its checkpoint and what comes next, in this transaction (tasks.c) */
    if ((ret = oq__task_on_result(s, env->call_id, env->status, now_ms, ttl, err))) return ret;
    *outcome = OQ_RESULT_APPLIED;
    return 0;
}

int oq__decide_results(oq__producer_store_t *s, const oq_envelope_t *envs, int n,
                       oq_result_outcome_t *outcomes, int64_t now_ms, int64_t ttl, oq_error_t *err)
{
    if (ttl <= 0) ttl = OQ_DEFAULT_KEY_TTL_MS;
    /* what the batch's decisions read, in one go where that saves round trips (the store) */
    int ret = oq__producer_store_results_ahead(s, envs, n, err);
    if (ret) return ret;
    for (int k = 0; k < n; k++) {
        oq_result_outcome_t oc = 0;
        int rc = decide_result(s, &envs[k], now_ms, ttl, &oc, err);
        if (rc == OQ_EINVAL) { /* refused as a whole, nothing written for it */
            oq_error_clear(err);
            oc = 0;
        } else if (rc) {
            return rc;
        }
        outcomes[k] = oc;
    }
    return oq__producer_store_results_done(s, err);
}

int oq_store_apply_result(sqlite3 *db, const oq_envelope_t *env, int64_t now_ms,
                          oq_result_outcome_t *outcome, oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    return decide_result(&s, env, now_ms, OQ_DEFAULT_KEY_TTL_MS, outcome, err);
}

/* --- dead letters --------------------------------------------------------------------------- */

/* The tool_result that fails the call of dead letter \p d, applied by decide_result(). */
static int fail_dead_call(oq__producer_store_t *s, const oq__producer_dead_t *d, int64_t now_ms,
                          int64_t ttl, oq_result_outcome_t *oc, oq_error_t *err)
{
    char msg[512];
    snprintf(msg, sizeof msg,
             "the call's message could not be published to Kafka and was set aside (%s: %s); "
             "it was not executed",
             d->reason, d->detail ? d->detail : "no detail");
    oq_envelope_t env;
    memset(&env, 0, sizeof env);
    env.v = OQ_ENVELOPE_VERSION;
    env.kind = OQ_KIND_TOOL_RESULT;
    snprintf(env.message_id, sizeof env.message_id, "%s", d->message_id); /* the dedupe key */
    snprintf(env.call_id, sizeof env.call_id, "%s", d->key);
    env.attempt = d->attempt;
    env.created_at = now_ms;
    env.status = "failed";
    env.error =
        json_pack("{s:s,s:s,s:b}", "code", OQ_ERROR_UNPUBLISHABLE, "message", msg, "retryable", 0);
    if (!env.error) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    int ret = decide_result(s, &env, now_ms, ttl, oc, err);
    json_decref(env.error);
    return ret;
}

int oq__decide_dead_letters(oq__producer_store_t *s, int64_t now_ms, int64_t ttl, int max,
                            int *failed, int *handled, oq__settled_cb settled, void *arg,
                            oq_error_t *err)
{
    if (ttl <= 0) ttl = OQ_DEFAULT_KEY_TTL_MS;
    oq__producer_dead_t *rows = NULL;
    size_t n = 0;
    int ret = oq__producer_store_dead_list(s, max, &rows, &n, err);
    if (ret) return ret;
    for (size_t i = 0; i < n; i++) {
        const oq__producer_dead_t *d = &rows[i];
        int is_call = d->kind && strcmp(d->kind, oq_kind_name(OQ_KIND_TOOL_CALL)) == 0 &&
                      strcmp(d->topic, OQ_TOPIC_CALLS) == 0 && d->attempt >= 1 &&
                      oq_call_id_valid(d->key) && strlen(d->message_id) == OQ_UUID_LEN;
        if (is_call) {
            oq_result_outcome_t oc = 0;
            if ((ret = fail_dead_call(s, d, now_ms, ttl, &oc, err))) break;
            if (oc == OQ_RESULT_APPLIED) {
                if (failed) (*failed)++;
                if (settled) settled(d->key, arg);
                OQ_LOGC_WARN("producer", d->key,
                             "call failed: its message was set aside by the relay code=%s "
                             "attempt=%lld message_id=%s seq=%lld reason=\"%s\"",
                             OQ_ERROR_UNPUBLISHABLE, (long long)d->attempt, d->message_id,
                             (long long)d->seq, d->reason);
            }
        } else {
            OQ_LOG_WARN("producer",
                        "dead letter not a tool call of this database: left in outbox_dead for "
                        "the operator seq=%lld topic=%s",
                        (long long)d->seq, d->topic);
        }
        if ((ret = oq__producer_store_dead_handled(s, d->seq, now_ms, err))) break;
        if (handled) (*handled)++;
    }
    oq__producer_dead_free(rows, n);
    return ret;
}

int oq_store_fail_dead_letters(sqlite3 *db, int64_t now_ms, int max, int *failed, int *handled,
                               oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    if (failed) *failed = 0;
    if (handled) *handled = 0;
    return oq__decide_dead_letters(&s, now_ms, OQ_DEFAULT_KEY_TTL_MS, max > 0 ? max : 64, failed,
                                   handled, NULL, NULL, err);
}

/* --- redrive -------------------------------------------------------------------------------- */

/* The delay before the next look at a call redriven \p count times: redrive_after * 2^count,
 * at most max(redrive_after, 1 h). */
static int64_t redrive_spacing(int64_t after, int64_t count)
{
    const int64_t cap = after > 3600000 ? after : 3600000;
    int64_t d = after;
    for (int64_t i = 0; i < count && d < cap; i++)
        d *= 2;
    return d < cap ? d : cap;
}

/* Step 4: the current attempt's tool_call message of \p r, published again. */
static int redrive_one(oq__producer_store_t *s, oq__producer_redrive_row_t *r, int64_t now_ms,
                       oq_outbox_republish_t *what, int *new_id, oq_error_t *err)
{
    /* The envelope as submit wrote it, in case retention deleted the outbox row: same message
     * id, call, tenant, key, fingerprint, tool, attempt and canonical args; only created_at
     * (informational) comes from the call row and may differ by the writer's queueing delay.
     * A call stored before calls.message_id existed, whose row is gone, gets a new id. */
    char *payload = NULL;
    size_t len = 0;
    *new_id = !r->message_id[0];
    if (*new_id) oq_id_uuid(r->message_id);
    oq__call_message_t m = {r->message_id,  r->call_id,
                            r->tenant,      r->idem_key,
                            r->fingerprint, r->tool,
                            r->args,        strlen(r->args),
                            r->attempt,     r->attempt > 1 ? r->updated_at : r->created_at};
    int ret = oq__call_message_encode(&m, &payload, &len, err);
    if (ret) return ret;
    ret =
        oq__producer_store_republish(s, r->message_id, r->call_id, payload, len, now_ms, what, err);
    free(payload);
    return ret;
}

int oq__decide_redrive(oq__producer_store_t *s, int64_t now_ms, int64_t after, int limit,
                       oq_redrive_stats_t *stats, oq_error_t *err)
{
    oq__producer_redrive_row_t *rows = NULL;
    int n = 0, ret = 0;
    memset(stats, 0, sizeof *stats);
    if (after <= 0) return 0;
    if (limit <= 0) limit = 100;
    if (!(rows = calloc((size_t)limit, sizeof *rows)))
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if ((ret = oq__producer_store_redrive_due(s, now_ms, now_ms - after, limit, rows, &n, err)))
        goto out;
    for (int i = 0; i < n && ret == 0; i++) {
        oq__producer_redrive_row_t *r = &rows[i];
        oq__producer_redrive_mark_t m = {r->call_id, r->redrive_count, 0, NULL};
        oq_outbox_republish_t what = 0;
        int new_id = 0;
        if (oq_call_state_terminal(r->state)) {
            /* 1. terminal: never redriven (unscheduled, count kept) */
        } else if (now_ms - r->updated_at < after) {
            /* 2. news came recently */
            m.next_redrive_at = r->updated_at + after;
            stats->deferred++;
        } else if ((ret = redrive_one(s, r, now_ms, &what, &new_id, err))) {
            break;
        } else if (what == OQ_OUTBOX_PENDING) {
            /* 3. still on its way: nothing to repair yet */
            m.next_redrive_at = now_ms + redrive_spacing(after, r->redrive_count);
            stats->waiting++;
        } else {
            /* 4. published again */
            char detail[160];
            const char *how = what == OQ_OUTBOX_REQUEUED ? "requeued" : "appended";
            m.redrive_count = r->redrive_count + 1;
            m.next_redrive_at = now_ms + redrive_spacing(after, m.redrive_count);
            m.message_id = new_id ? r->message_id : NULL;
            snprintf(detail, sizeof detail,
                     "{\"attempt\":%lld,\"redrive\":%lld,\"message_id\":\"%s\",\"outbox\":\"%s\"}",
                     (long long)r->attempt, (long long)m.redrive_count, r->message_id, how);
            if ((ret = oq__producer_store_audit_add(s, now_ms, r->call_id, "redrive", detail, err)))
                break;
            OQ_LOGC_INFO("producer", r->call_id,
                         "redrive: call message published again attempt=%lld redrive=%lld "
                         "message_id=%s state=%s outbox=%s",
                         (long long)r->attempt, (long long)m.redrive_count, r->message_id, r->state,
                         how);
            stats->redriven++;
        }
        if (ret == 0) ret = oq__producer_store_redrive_mark(s, &m, err);
    }
out:
    for (int i = 0; i < n; i++)
        oq__producer_redrive_row_clear(&rows[i]);
    free(rows);
    return ret;
}

/* --- webhooks ------------------------------------------------------------------------------- */

/* The delay before try number \p tries + 1 of a delivery that failed \p tries times: base *
 * 2^(tries-1), at most max, with "equal jitter" (half of it fixed, half drawn at random), so
 * the deliveries of an outage do not all come back at the same instant and the delay still
 * grows with every failure. */
static int64_t webhook_backoff(const oq__webhook_policy_t *pol, int64_t tries)
{
    int64_t d = pol->backoff_base_ms > 0 ? pol->backoff_base_ms : 1000;
    int64_t cap = pol->backoff_max_ms > d ? pol->backoff_max_ms : d;
    for (int64_t i = 1; i < tries && d < cap; i++)
        d *= 2;
    if (d > cap) d = cap;
    uint64_t r = 0;
    oq_random_bytes(&r, sizeof r);
    return d / 2 + (int64_t)(r % (uint64_t)(d / 2 + 1));
}

void oq__decide_webhook_try(const oq__producer_delivery_t *d, const oq__webhook_try_t *t,
                            const oq__webhook_policy_t *pol, int64_t now_ms,
                            oq__producer_delivery_mark_t *m)
{
    memset(m, 0, sizeof *m);
    m->delivery_id = d->delivery_id;
    m->tries = d->tries + 1;
    m->last_status = t->status > 0 ? t->status : -1;
    m->last_error = t->error && *t->error ? t->error : NULL;
    m->updated_at = now_ms;
    /* 1. a 2xx answer: delivered, for good */
    if (t->status >= 200 && t->status < 300) {
        m->state = "delivered";
        m->last_error = NULL;
        return;
    }
    /* 2. anything else (no answer: refused, reset, timeout; a 429 or a 5xx; also a 3xx or
     *    another 4xx, as Stripe retries every non-2xx: a receiver's 404 or 401 is usually a
     *    deployment being fixed) is tried again after the backoff, at least the answer's
     *    Retry-After (bounded by the policy's longest delay) ... */
    int64_t delay = webhook_backoff(pol, m->tries);
    if (t->retry_after_ms > delay)
        delay = t->retry_after_ms < pol->backoff_max_ms ? t->retry_after_ms : pol->backoff_max_ms;
    /* 3. ... unless the budget is spent: max_tries made, or the next try would come more than
     *    max_age after the delivery was queued. Then it is dead: `onceq dlq` lists it, and
     *    `onceq dlq redrive` gives it a fresh budget. */
    if ((pol->max_tries > 0 && m->tries >= pol->max_tries) ||
        (pol->max_age_ms > 0 && now_ms + delay - d->created_at > pol->max_age_ms)) {
        m->state = "dead";
        return;
    }
    m->state = "pending";
    m->next_at = now_ms + delay;
}

int oq__decide_webhook_marks(oq__producer_store_t *s, const oq__producer_delivery_mark_t *marks,
                             int n, oq_error_t *err)
{
    for (int i = 0; i < n; i++) {
        int ret = oq__producer_store_delivery_mark(s, &marks[i], NULL, err);
        if (ret) return ret;
    }
    return 0;
}

/* --- retention ------------------------------------------------------------------------------ */

/* Terminal calls past expires_at go with their rows, in short batches; pending and running
 * calls never expire (the purge batch selects terminal states only). */
int oq_store_purge(sqlite3 *db, int64_t now_ms, int64_t key_ttl_ms, int batch,
                   oq_purge_stats_t *stats, oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    return oq__purge_in_store(&s, now_ms, key_ttl_ms, batch, stats, err);
}

/* The same loop on any store (oq_producer_purge: a PostgreSQL producer's own connection). */
int oq__purge_in_store(oq__producer_store_t *s, int64_t now_ms, int64_t key_ttl_ms, int batch,
                       oq_purge_stats_t *stats, oq_error_t *err)
{
    oq_purge_stats_t local;
    memset(&local, 0, sizeof local);
    if (!stats) stats = &local;
    if (batch <= 0) batch = 500;
    if (key_ttl_ms <= 0) key_ttl_ms = OQ_DEFAULT_KEY_TTL_MS;
    int more = 1, ret = 0;
    for (int i = 0; more && i < 1000000; i++)
        if ((ret = oq__producer_store_purge_batch(s, now_ms, key_ttl_ms, batch, stats, &more, err)))
            break;
    return ret;
}
