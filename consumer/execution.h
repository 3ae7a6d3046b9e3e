/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file execution.h
 * @brief Internal: the consumer's rules (consumer/execution.c): the intake decision, the
 *        execution state machine with its one transition table, the one finish path of every
 *        run, recovery of lapsed leases, reconciliation of unknown outcomes, the operator's
 *        review decisions and the retry policy. Not part of the public API.
 *
 * Everything here works on a consumer store (consumer_store.h) inside the caller's open write
 * transaction ("in tx") and commits nothing; the callers (consumer/worker.c, runner.c,
 * outside.c) own transactions, Kafka, threads and the tool call itself.
 *
 * @locality any thread, one store per thread.
 */
#ifndef OQ_CONSUMER_EXECUTION_H
#define OQ_CONSUMER_EXECUTION_H

#include <stdint.h>

#include "consumer_store.h"
#include "oq_consumer.h"
#include "oq_envelope.h"
#include "oq_error.h"

/* --- states and transitions ------------------------------------------------------------------ */

/** Pseudo-state "no row yet", for oq__exec_transition_legal(). */
#define OQ__X_NONE (-1)

/** @brief Non-zero for COMMITTED, FAILED_FINAL, NEEDS_REVIEW. */
int oq__xstate_terminal(int state);

/**
 * @brief Non-zero when the transition table allows \p from -> \p to (\p from may be
 *        OQ__X_NONE). Every state write in execution.c is checked against it first.
 */
int oq__exec_transition_legal(int from, int to);

/* --- retry policy ---------------------------------------------------------------------------- */

/**
 * What the rules must know about a tool to decide an unknown outcome: whether its effect is a
 * local row (a compiled tool: the effects table answers exactly) or lives in another system,
 * and, then, what that system offers. The worker fills it from its registry and tools file.
 */
typedef struct oq__tool_traits {
    int known;         /**< declared on this worker (compiled, or in the tools file) */
    int remote;        /**< calls another system: its effect is not a row of effects.db */
    int has_lookup;    /**< the downstream can be asked whether it has the operation */
    int idempotent;    /**< declared: the downstream honours the idempotency key, so a resend
                            with the same key is safe */
    int64_t settle_ms; /**< remote with a lookup but no keys: a "not found" is trusted only this
                            long after the request was sent (a request still in flight at the
                            downstream is not found yet) */
} oq__tool_traits_t;

/** Fills \p out for the tool named \p tool. */
typedef void (*oq__traits_fn)(const char *tool, void *ctx, oq__tool_traits_t *out);

/** What a reconciliation step found, for metrics. */
typedef enum {
    OQ__LOOKUP_FOUND = 0, /**< the effect exists (local row, or the downstream has it) */
    OQ__LOOKUP_ABSENT,    /**< confirmed absent */
    OQ__LOOKUP_UNDECIDED, /**< the lookup gave no definite answer */
    OQ__LOOKUP_NONE       /**< no lookup possible: decided from the tool's declaration */
} oq__lookup_t;

/** @brief Told of every reconciliation decision (metrics): the verdict, the state entered and
 *         how long the execution had been unknown. Runs inside the transaction: must not
 *         block; a rolled-back transaction has still been counted. */
typedef void (*oq__reconciled_fn)(void *ctx, int verdict, int to_state, int64_t unknown_ms);

/**
 * The policy of the rules: the retry budget and backoff, the lookup budget, and the tool
 * traits. Zero fields take defaults; with traits NULL only compiled tools are known (every
 * other tool's unknown outcome goes to review, never to a resend).
 */
typedef struct oq__retry_policy {
    int max_attempts; /**< tool runs per producer attempt (the budget) */
    int64_t base_ms, max_ms;
    int lookup_budget;    /**< undecided lookups per unknown episode before the declaration
                               decides (a resend when idempotent, else NEEDS_REVIEW);
                               0: 5 */
    int64_t lease_ms;     /**< lease of a reconciler (RECONCILING); 0: 30 s */
    oq__traits_fn traits; /**< NULL: compiled tools only */
    void *traits_ctx;
    oq__reconciled_fn on_reconciled; /**< may be NULL */
    void *on_ctx;
} oq__retry_policy_t;

/** @brief Non-zero while another run is allowed after \p tries runs (tries < max_attempts). */
int oq__retry_allowed(const oq__retry_policy_t *p, int64_t tries);

/** @brief Backoff before run \p tries + 1 with full jitter: uniform in [0, d) where d =
 *         base * 2^(tries-1) capped at max (at least 1 ms), so calls that failed together
 *         spread out. */
int64_t oq__retry_backoff_ms(const oq__retry_policy_t *p, int64_t tries);

/** @brief The traits of \p tool under \p p (its traits function, else the registry). */
void oq__tool_traits(const oq__retry_policy_t *p, const char *tool, oq__tool_traits_t *out);

/* --- tool outcomes --------------------------------------------------------------------------- */

/**
 * What a run of a tool means for the execution. The class, not the tool's return code, drives
 * the state machine, so a tool that calls another system only has to classify its answer.
 */
typedef enum {
    OQ__OUTCOME_SUCCESS = 0, /**< done: result (and effect) recorded -> COMMITTED */
    OQ__OUTCOME_FINAL,       /**< definite refusal (bad arguments, unknown tool, a failure the
                                  tool declares final) -> FAILED_FINAL */
    OQ__OUTCOME_RETRYABLE,   /**< nothing happened, safe to run again (not sent, or refused
                                  before processing) -> FAILED_RETRYABLE while the budget lasts,
                                  then FAILED_FINAL */
    OQ__OUTCOME_NOT_RUN,     /**< abandoned before doing anything (the worker is stopping): the
                                  execution is handed back and the run does not count */
    OQ__OUTCOME_UNKNOWN      /**< sent, no definite answer (a timeout after the request left,
                                  a reset, an undeclared status): stored UNKNOWN and reconciled,
                                  never resent blind. Only a claimed run can report it. */
} oq__outcome_class_t;

/**
 * A classified run, or a lookup's answer: the one struct an outcome travels in, from the tool
 * or the executor's callback to the commit. out.code / out.message describe a failure, why it
 * is unknown, or (a lookup) what was answered.
 */
typedef struct oq__outcome {
    oq__outcome_class_t cls;
    oq_tool_out_t out;       /**< what the tool reported (owns out.result) */
    char *result_text;       /**< SUCCESS of an outside call, a lookup's FOUND: the result as
                                  RFC 8785 text, written where the answer was read (on the
                                  dispatcher's thread), so the worker neither encodes nor frees
                                  a tree; out.result is NULL then. Owned */
    char downstream_id[256]; /**< SUCCESS of a remote tool, or a lookup: the downstream's object
                                  id ("" none) */
    int64_t retry_after_ms;  /**< RETRYABLE: the downstream's Retry-After (<= 0: none) */
    oq__lookup_t verdict;    /**< a lookup's answer (oq__outcome_from_http); unused for a run */
} oq__outcome_t;

/**
 * @brief Classify a registry tool's return code (oq_tool_invoke()) and fill a default failure
 *        code ("bad_args", "tool_failed") when the tool gave none. \p o->out is the tool's.
 */
void oq__outcome_classify(int tool_rc, oq__outcome_t *o);

struct oq__http_outcome; /* http_tools.h: what the executor reports of one request */

/**
 * @brief What an outside answer means: the one mapping from the class the HTTP executor gave
 *        a call's or a lookup's answer (http_tools.h) to an outcome, beside the compiled
 *        tools' (oq__outcome_classify). For a call, \p o->cls: SUCCESS -> SUCCESS (result
 *        {object_id, http_status, response}, an effect, downstream_id); FINAL -> FINAL;
 *        RETRYABLE -> RETRYABLE, or NOT_RUN when the executor abandoned it before sending
 *        (the worker is stopping: the run does not count); UNKNOWN and any other class ->
 *        UNKNOWN. For a lookup (\p is_lookup), \p o->verdict: FOUND -> FOUND (result with
 *        found_by "lookup"), ABSENT -> ABSENT, any other class -> UNDECIDED. A refusal's
 *        message quotes the answer's /error/message or /message when it is JSON.
 * @param h the executor's report; its pointers are read during this call only.
 * @param o zeroed and filled; clear it with oq__outcome_clear().
 */
void oq__outcome_from_http(const struct oq__http_outcome *h, int is_lookup, oq__outcome_t *o);

/** @brief Release what \p o owns. */
void oq__outcome_clear(oq__outcome_t *o);

/** @brief The stable effect id of a call: "e_" + the call id's hex part. It is the downstream
 *         idempotency key, the same on every run of the call. */
void oq__exec_effect_id(const char *call_id, char out[OQ_CALL_ID_LEN + 1]);

/* --- intake ---------------------------------------------------------------------------------- */

/** What a tool_call message means. */
typedef enum {
    OQ__INTAKE_DUPLICATE = 0, /**< message id already in the inbox: skipped (seen + 1) */
    OQ__INTAKE_NEW,           /**< first message of a call: only its inbox row is written; the
                                   caller either runs it inline (oq__exec_start_inline then
                                   oq__exec_finish) or plans it (oq__exec_plan) */
    OQ__INTAKE_REPLANNED,     /**< a new producer attempt of a FAILED_FINAL call: PLANNED again,
                                   due now; the caller claims it */
    OQ__INTAKE_DONE,          /**< a new message id for a call already terminal: nothing
                                   executed; its result is re-emitted (same result message id)
                                   when its first copy was delivered */
    OQ__INTAKE_IN_PROGRESS,   /**< call being executed: nothing to do */
    OQ__INTAKE_STALE,         /**< older attempt than the execution's: ignored */
    OQ__INTAKE_MISMATCH,      /**< same call_id, different fingerprint: nothing written; DLQ it */
    OQ__INTAKE_REEMITTED,     /**< message id already in the inbox (a redelivery, or the
                                   producer's redrive) and the call terminal with its result
                                   delivered once: seen + 1, nothing executed, the result
                                   published again under its own (derived, so unchanged) message
                                   id. The repair of a lost result. A duplicate whose result is
                                   still unpublished is OQ__INTAKE_DUPLICATE. */
    OQ__INTAKE_EXPIRED        /**< no execution, and the message was created before the
                                   retention horizon: its execution may have been purged, so it
                                   is never executed; nothing written, the caller dead-letters
                                   it (OQ_DLQ_EXPIRED) */
} oq__intake_t;

/** @brief In tx: the inbox row of \p env and the decision (an oq__intake_t in *decision). */
int oq__exec_intake(oq__consumer_store_t *s, const oq_envelope_t *env, const oq__msg_src_t *src,
                    int64_t now, int *decision, oq_error_t *err);

/**
 * @brief Retention of settled rows (see "what retention deletes" in execution.c): inbox and
 *        published dead letters older than \p inbox_ms; settled executions (COMMITTED,
 *        FAILED_FINAL), their effects and audit rows last written more than max(\p
 *        retention_ms, \p inbox_ms) ago, after raising the horizon that keeps their messages
 *        from running again. NEEDS_REVIEW and every other unsettled execution stay. Short
 *        transactions of \p batch rows each. \p retention_ms 0: executions are kept.
 * @param st accumulates what was deleted (zeroed first).
 */
int oq__exec_purge(oq__consumer_store_t *s, int64_t now, int64_t retention_ms, int64_t inbox_ms,
                   int batch, oq_consumer_purge_stats_t *st, oq_error_t *err);

/** @brief In tx: the execution of a NEW call, PLANNED and due now (audit 'planned'). */
int oq__exec_plan(oq__consumer_store_t *s, const oq_envelope_t *env, int64_t now, oq_error_t *err);

/**
 * @brief In memory only: \p x becomes the first run of the NEW call \p env, STARTED by this
 *        worker (try 1, fence 1), for a tool run inline in the intake transaction. Nothing is
 *        written until oq__exec_finish(..., OQ__RUN_INLINE, ...), which MUST follow in the same
 *        transaction before any other intake of the call. Clear \p x after.
 */
int oq__exec_start_inline(const oq_envelope_t *env, oq__exec_row_t *x, oq_error_t *err);

/**
 * @brief In tx: the first run of the NEW call \p env of a tool that calls another system: the
 *        row is inserted STARTED (try 1, fence 1, this worker's lease until now + \p lease_ms,
 *        effect_id, started_at), with one audit row 'started' ("planned, started, try 1") and
 *        the `running` result event. Once the transaction commits, STARTED is durable and the
 *        request may leave; its outcome is written by oq__exec_finish(..., OQ__RUN_CLAIMED).
 * @param out receives the row as written (clear it after).
 */
int oq__exec_start(oq__consumer_store_t *s, const oq_envelope_t *env, int64_t lease_ms, int64_t now,
                   oq__exec_row_t *out, oq_error_t *err);

/**
 * @brief In tx: claim \p call_id if it is due (a state the table lets move to STARTED, with
 *        next_attempt_at <= now): one conditional UPDATE sets STARTED, fence + 1, tries + 1,
 *        this worker's lease until now + \p lease_ms, effect_id and started_at; audit
 *        'started'. A claim from PLANNED (the attempt's first run) also appends the `running`
 *        result event, so the producer sees the call start.
 * @param out receives the claimed row (may be NULL).
 * @returns 0 when claimed, OQ_ESTATE when not due, terminal or taken by someone else.
 */
int oq__exec_claim(oq__consumer_store_t *s, const char *call_id, int64_t lease_ms, int64_t now,
                   oq__exec_row_t *out, oq_error_t *err);

/**
 * @brief In tx: as oq__exec_start, without the `running` result event: the caller owes it and
 *        tells it with oq__exec_tell_running only when the run is still out after a while or
 *        ends in a state that is not final, so a call answered at once costs the producer one
 *        result, as an inline run does (an outside call: consumer/outside.c).
 */
int oq__exec_start_owing(oq__consumer_store_t *s, const oq_envelope_t *env, int64_t lease_ms,
                         int64_t now, oq__exec_row_t *out, oq_error_t *err);

/**
 * @brief In tx: as oq__exec_claim, without the `running` result event; *owed = 1 when the claim
 *        would have appended it (the attempt's first run), for oq__exec_tell_running.
 */
int oq__exec_claim_owing(oq__consumer_store_t *s, const char *call_id, int64_t lease_ms,
                         int64_t now, int *owed, oq__exec_row_t *out, oq_error_t *err);

/**
 * @brief In tx: tell the producer that the run \p run (from oq__exec_start_owing or
 *        oq__exec_claim_owing) is running: its `running` result event, the same message (same
 *        derived id) the start would have appended. Unless \p checked (the caller has just
 *        written this run's row in the same transaction), the event is appended only while the
 *        row is still this run (STARTED, same fence and attempt): a run that another worker
 *        moved on tells nothing. *told (may be NULL) says whether it was appended.
 */
int oq__exec_tell_running(oq__consumer_store_t *s, const oq__exec_row_t *run, int checked,
                          int64_t now, int *told, oq_error_t *err);

/** How the run being finished began. */
typedef enum {
    OQ__RUN_CLAIMED = 0, /**< STARTED is stored (oq__exec_claim): the outcome write is fenced */
    OQ__RUN_INLINE       /**< oq__exec_start_inline: no row yet; it is written once, in its
                              outcome state, with ONE audit row ("inline: planned, started, ...") */
} oq__run_kind_t;

/**
 * @brief In tx: the one finish path of every run. The outcome class and the retry budget
 *        decide the next state: SUCCESS -> COMMITTED; FINAL -> FAILED_FINAL; RETRYABLE ->
 *        FAILED_RETRYABLE after max(full-jitter backoff, Retry-After) while the budget lasts,
 *        then FAILED_FINAL "retries_exhausted"; UNKNOWN -> UNKNOWN (stored, due for
 *        reconciliation now; only a claimed run); NOT_RUN -> handed back. Then the row is
 *        written (a claimed run: a conditional UPDATE on STARTED with its fence and owner,
 *        rowcount 0 -> audit 'lease_lost', OQ_EFENCED; an inline run: inserted), the effect
 *        inserted with the downstream id (UNIQUE call_id: an existing effect wins and its
 *        result stands), the audit row appended and, for a terminal state, the result event
 *        appended to the outbox.
 * @param run the run (from oq__exec_claim or oq__exec_start_inline); not changed, so a finish
 *        whose transaction was rolled back can be retried with it.
 * @param state_out receives the new state (-1 on failure; may be NULL).
 * @param effect_new set to 1 when an effect row was inserted (may be NULL).
 * @returns 0, OQ_EFENCED (lease lost: only the audit row written), OQ_EINVAL (UNKNOWN from an
 *          inline run, which has nothing durable to reconcile: nothing written), OQ_EDB /
 *          OQ_EBUSY.
 */
int oq__exec_finish(oq__consumer_store_t *s, const oq__exec_row_t *run, oq__run_kind_t kind,
                    const oq__outcome_t *o, const oq__retry_policy_t *p, int64_t now,
                    int *state_out, int *effect_new, oq_error_t *err);

/**
 * @brief In tx: recovery and reconciliation. STARTED and RECONCILING rows whose lease lapsed
 *        before \p now become UNKNOWN (fence + 1). Every UNKNOWN row that is due is decided:
 *          - its effect is in the effects table -> COMMITTED (result re-emitted);
 *          - a compiled tool (the table is exact): absent -> SAFE_RETRY (due now) while the
 *            retry budget lasts, else FAILED_FINAL "retries_exhausted";
 *          - a remote tool with a lookup -> RECONCILING under this worker's lease (fence + 1,
 *            audit 'reconciling'); the row is returned in \p lookups: the caller sends the
 *            lookup after the commit and reports it with oq__exec_lookup_done();
 *          - a remote tool without a lookup that honours keys -> SAFE_RETRY (the resend carries
 *            the same key) while the budget lasts, else NEEDS_REVIEW;
 *          - a remote tool with neither, or a tool this worker does not know -> NEEDS_REVIEW
 *            (result event): never a blind resend.
 *        Terminal rows are never touched. At most \p limit rows per step.
 * @param lookups receives up to \p limit RECONCILING rows (owned: clear them); may be NULL
 *        only when no tool has a lookup.
 * @param n_lookups receives their number (may be NULL with \p lookups).
 * @param n_recovered receives the number of UNKNOWN rows decided or sent to a lookup (may be
 *        NULL).
 */
int oq__exec_recover(oq__consumer_store_t *s, int64_t now, const oq__retry_policy_t *p, int limit,
                     oq__exec_row_t *lookups, int *n_lookups, int *n_recovered, oq_error_t *err);

/**
 * @brief In tx: at start-up, the STARTED and RECONCILING rows held by this store's worker id
 *        belong to a previous process with the same --worker-id, which is dead: they become
 *        UNKNOWN now rather than when their leases lapse. @param n receives how many.
 */
int oq__exec_release_held(oq__consumer_store_t *s, int64_t now, int *n, oq_error_t *err);

/**
 * @brief In tx: the answer of the lookup sent for \p rec (the RECONCILING row as returned by
 *        oq__exec_recover). Written only while this worker still holds that lease (else audit
 *        'lease_lost', OQ_EFENCED):
 *          FOUND -> COMMITTED, the effect recorded with \p downstream_id and \p result, the
 *                   result event `succeeded`;
 *          ABSENT -> SAFE_RETRY (due now) while the retry budget lasts, else FAILED_FINAL
 *                   "retries_exhausted"; for a tool without keys, a "not found" earlier than
 *                   started_at + settle_ms is not trusted yet: UNKNOWN again, due then;
 *          UNDECIDED -> UNKNOWN again after a backoff while the lookup budget lasts; then
 *                   SAFE_RETRY when the tool honours keys, else NEEDS_REVIEW.
 * @param result FOUND: the result as JSON text (the outcome's result_text; NULL: {}).
 * @param why a short reason for the audit and the review queue (UNDECIDED: what failed).
 * @param state_out receives the new state (may be NULL).
 */
int oq__exec_lookup_done(oq__consumer_store_t *s, const oq__exec_row_t *rec, int verdict,
                         const char *downstream_id, const char *result, const char *why,
                         const oq__retry_policy_t *p, int64_t now, int *state_out, oq_error_t *err);

/** How an operator resolves a NEEDS_REVIEW execution. */
typedef enum {
    OQ__RESOLVE_COMMITTED = 0, /**< the downstream did it: COMMITTED, effect with the reference */
    OQ__RESOLVE_FAILED,        /**< it did not, and must not be tried again: FAILED_FINAL */
    OQ__RESOLVE_RETRY          /**< send once more, same key: SAFE_RETRY, due now */
} oq__resolve_t;

/**
 * @brief In tx: an operator's decision on a NEEDS_REVIEW execution. One conditional UPDATE on
 *        NEEDS_REVIEW with the fence it was read with (fence + 1: any stale writer is refused),
 *        an audit row 'review_resolved' (detail {"as","ref","note","by"}) and the audit row of
 *        the state entered; COMMITTED also records the effect (downstream id = \p ref) and
 *        FAILED_FINAL / COMMITTED append ONE result event, so the producer's call moves to
 *        succeeded / failed. RETRY resets the try count: the next run gets a full budget.
 *        \p fence pins the review episode the operator decided on: the execution's fence as
 *        `onceq review list/show` printed it. It moves whenever the call leaves NEEDS_REVIEW
 *        (a resolution, a retry's resend), so a decision made while looking at an earlier
 *        episode is refused instead of applied to the next one.
 * @param note required, 1..1000 bytes; \p ref optional (COMMITTED only); \p by who resolved.
 * @returns 0, OQ_ENOTFOUND (no such call), OQ_ESTATE (not NEEDS_REVIEW: nothing written),
 *          OQ_EFENCED (NEEDS_REVIEW, but with another fence: the review moved, nothing
 *          written), OQ_EINVAL (bad note, ref or a negative fence), OQ_EDB / OQ_EBUSY.
 */
int oq__exec_resolve(oq__consumer_store_t *s, const char *call_id, int as, const char *ref,
                     const char *note, const char *by, int64_t fence, int64_t now, int *state_out,
                     oq_error_t *err);

/**
 * @brief In tx: intake of a message that cannot be executed (undecodable, not a tool_call,
 *        fingerprint mismatch): inbox row (outcome 'dlq'), dlq row with the original bytes and
 *        \p r->reason, audit 'dlq'. \p r->message_id is the inbox key (envelope id, header id,
 *        or "dlq:topic:partition:offset").
 * @param dup set to 1 when the message id was already in the inbox (nothing else written).
 */
int oq__exec_dead_letter(oq__consumer_store_t *s, const oq__dlq_row_t *r, const char *call_id,
                         int *dup, oq_error_t *err);

#endif
