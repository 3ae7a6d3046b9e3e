/**
 * @file execution.h
 * @brief Internal: the consumer's rules (consumer/execution.c): the intake decision, the
 *        execution state machine with its one transition table, the one finish path of every
 *        run, recovery of lapsed leases and the retry policy. Not part of the public API.
 *
 * Everything here works on a consumer store (consumer_store.h) inside the caller's open write
 * transaction ("in tx") and commits nothing; the caller (consumer/worker.c) owns transactions,
 * Kafka, threads and the tool call itself.
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

/** The retry budget and backoff. */
typedef struct oq__retry_policy {
    int max_attempts; /**< tool runs per producer attempt (the budget) */
    int64_t base_ms, max_ms;
} oq__retry_policy_t;

/** @brief Non-zero while another run is allowed after \p tries runs (tries < max_attempts). */
int oq__retry_allowed(const oq__retry_policy_t *p, int64_t tries);

/** @brief Backoff before run \p tries + 1: base * 2^(tries-1), capped at max, times a jitter
 *         factor in [0.5, 1.5) so calls that failed together do not retry together. */
int64_t oq__retry_backoff_ms(const oq__retry_policy_t *p, int64_t tries);

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
    OQ__OUTCOME_UNKNOWN      /**< sent, no definite answer: the execution must be stored
                                  UNKNOWN and reconciled. No tool reports it yet and
                                  oq__exec_finish() refuses it (OQ_EINVAL, nothing written). */
} oq__outcome_class_t;

/** A classified run. out.code / out.message describe a failure. */
typedef struct oq__outcome {
    oq__outcome_class_t cls;
    oq_tool_out_t out; /**< what the tool reported (owns out.result) */
} oq__outcome_t;

/**
 * @brief Classify a registry tool's return code (oq_tool_invoke()) and fill a default failure
 *        code ("bad_args", "tool_failed") when the tool gave none. \p o->out is the tool's.
 */
void oq__outcome_classify(int tool_rc, oq__outcome_t *o);

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
    OQ__INTAKE_REEMITTED      /**< message id already in the inbox (a redelivery, or the
                                   producer's redrive) and the call terminal with its result
                                   delivered once: seen + 1, nothing executed, the result
                                   published again under its own (derived, so unchanged) message
                                   id. The repair of a lost result. A duplicate whose result is
                                   still unpublished is OQ__INTAKE_DUPLICATE. */
} oq__intake_t;

/** @brief In tx: the inbox row of \p env and the decision (an oq__intake_t in *decision). */
int oq__exec_intake(oq__consumer_store_t *s, const oq_envelope_t *env, const oq__msg_src_t *src,
                    int64_t now, int *decision, oq_error_t *err);

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
 * @brief In tx: claim \p call_id if it is due (a state the table lets move to STARTED, with
 *        next_attempt_at <= now): one conditional UPDATE sets STARTED, fence + 1, tries + 1,
 *        this worker's lease until now + \p lease_ms; audit 'started'.
 * @param out receives the claimed row (may be NULL).
 * @returns 0 when claimed, OQ_ESTATE when not due, terminal or taken by someone else.
 */
int oq__exec_claim(oq__consumer_store_t *s, const char *call_id, int64_t lease_ms, int64_t now,
                   oq__exec_row_t *out, oq_error_t *err);

/** How the run being finished began. */
typedef enum {
    OQ__RUN_CLAIMED = 0, /**< STARTED is stored (oq__exec_claim): the outcome write is fenced */
    OQ__RUN_INLINE       /**< oq__exec_start_inline: no row yet; it is written once, in its
                              outcome state, with ONE audit row ("inline: planned, started, ...") */
} oq__run_kind_t;

/**
 * @brief In tx: the one finish path of every run. The outcome class and the retry budget
 *        decide the next state; then the row is written (a claimed run: a conditional UPDATE on
 *        STARTED with its fence and owner, rowcount 0 -> audit 'lease_lost', OQ_EFENCED; an
 *        inline run: inserted), the effect inserted (UNIQUE call_id: an existing effect wins
 *        and its result stands), the audit row appended and, for a terminal state, the result
 *        event appended to the outbox.
 * @param run the run (from oq__exec_claim or oq__exec_start_inline); not changed, so a finish
 *        whose transaction was rolled back can be retried with it.
 * @param state_out receives the new state (-1 on failure; may be NULL).
 * @param effect_new set to 1 when an effect row was inserted (may be NULL).
 * @returns 0, OQ_EFENCED (lease lost: only the audit row written), OQ_EINVAL (an outcome class
 *          the state machine does not handle yet: nothing written), OQ_EDB / OQ_EBUSY.
 */
int oq__exec_finish(oq__consumer_store_t *s, const oq__exec_row_t *run, oq__run_kind_t kind,
                    const oq__outcome_t *o, const oq__retry_policy_t *p, int64_t now,
                    int *state_out, int *effect_new, oq_error_t *err);

/**
 * @brief In tx: recovery. STARTED rows whose lease lapsed before \p now become UNKNOWN (fence +
 *        1); every UNKNOWN row is reconciled: effect found -> COMMITTED (result re-emitted);
 *        absent -> SAFE_RETRY (due now) while the retry budget lasts, else NEEDS_REVIEW (result
 *        event). Terminal rows are never touched. At most \p limit rows per step.
 * @param n_recovered receives the number of rows reconciled (may be NULL).
 */
int oq__exec_recover(oq__consumer_store_t *s, int64_t now, const oq__retry_policy_t *p, int limit,
                     int *n_recovered, oq_error_t *err);

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
