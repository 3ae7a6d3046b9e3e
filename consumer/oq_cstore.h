/**
 * @file oq_cstore.h
 * @brief The consumer's store: every SQL statement against effects.db (consumer/store.c),
 *        behind an interface small enough to re-implement on PostgreSQL.
 *
 * One oq_cstore_t is one connection and is used by one thread at a time. Functions marked
 * "in tx" run inside the caller's open write transaction (oq_cstore_begin) and commit nothing;
 * the others are single autocommit statements. Every state change appends an audit row.
 */
#ifndef OQ_CSTORE_H
#define OQ_CSTORE_H

#include <sqlite3.h>
#include <stdint.h>

#include "oq_consumer.h"
#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_error.h"

typedef struct oq_cstore oq_cstore_t;

/** Execution states (strings stored in executions.state). */
typedef enum {
    OQ_X_PLANNED = 0,
    OQ_X_STARTED,
    OQ_X_COMMITTED,
    OQ_X_FAILED_RETRYABLE,
    OQ_X_FAILED_FINAL,
    OQ_X_UNKNOWN,
    OQ_X_SAFE_RETRY,
    OQ_X_NEEDS_REVIEW,
    OQ_X__COUNT
} oq_xstate_t;

/** @brief "PLANNED", ... ; @returns "?" when out of range. */
const char *oq_xstate_name(int s);
/** @brief State from its name, or -1. */
int oq_xstate_parse(const char *name);
/** @brief Non-zero for COMMITTED, FAILED_FINAL, NEEDS_REVIEW. */
int oq_xstate_terminal(int s);

/** One execution row. Strings are owned; free with oq_exec_clear(). */
typedef struct oq_exec {
    char call_id[OQ_CALL_ID_LEN + 1];
    char *tenant, *idem_key, *tool, *args, *lease_owner, *result, *error, *effect_id;
    char fingerprint[OQ_FINGERPRINT_LEN + 1];
    int state;
    int64_t attempt, tries, fence, lease_until, next_attempt_at;
} oq_exec_t;
void oq_exec_clear(oq_exec_t *x);

/**
 * @brief Open \p path (WAL, synchronous per \p opts), migrate it to the consumer set.
 * @param worker_id written into lease_owner / audit.worker / effects.worker; copied.
 */
int oq_cstore_open(const char *path, const oq_db_opts_t *opts, const char *worker_id,
                   oq_cstore_t **out, oq_error_t *err);
/** @brief Close; accepts NULL. */
void oq_cstore_close(oq_cstore_t *s);
sqlite3 *oq_cstore_db(oq_cstore_t *s);
const char *oq_cstore_worker(const oq_cstore_t *s);

/** @brief BEGIN IMMEDIATE (bounded wait). */
int oq_cstore_begin(oq_cstore_t *s, oq_error_t *err);
int oq_cstore_commit(oq_cstore_t *s, oq_error_t *err);
void oq_cstore_rollback(oq_cstore_t *s);

/** Where a message came from. */
typedef struct oq_msg_src {
    const char *topic;
    int32_t partition;
    int64_t offset;
} oq_msg_src_t;

/** Outcomes of oq_cstore_intake(). */
typedef enum {
    OQ_IN_DUPLICATE = 0, /**< message_id already in the inbox: skipped (seen + 1) */
    OQ_IN_PLANNED,       /**< new execution (or new attempt) PLANNED, due now */
    OQ_IN_DONE,          /**< call already terminal: result re-emitted, nothing executed */
    OQ_IN_IN_PROGRESS,   /**< call being executed: nothing to do */
    OQ_IN_STALE,         /**< older attempt than the execution's: ignored */
    OQ_IN_MISMATCH       /**< same call_id, different fingerprint: nothing written; DLQ it */
} oq_intake_t;

/**
 * @brief In tx: inbox insert for \p env, then plan its execution.
 * @param outcome receives an oq_intake_t.
 */
int oq_cstore_intake(oq_cstore_t *s, const oq_envelope_t *env, const oq_msg_src_t *src,
                     int64_t now, int *outcome, oq_error_t *err);

/**
 * @brief In tx: as oq_cstore_intake(), and when the call is new and \p lease_ms > 0, insert
 *        its execution directly STARTED by this worker (fence 1, try 1; audit 'planned' then
 *        'started') and fill \p started (args not copied: the caller has them), so the caller
 *        runs a fast tool and oq_cstore_finish()es it in the same transaction. Otherwise
 *        \p started->state stays as zeroed (PLANNED) and the caller claims as usual.
 */
int oq_cstore_intake_start(oq_cstore_t *s, const oq_envelope_t *env, const oq_msg_src_t *src,
                           int64_t now, int64_t lease_ms, oq_exec_t *started, int *outcome,
                           oq_error_t *err);

/**
 * @brief In tx, fast path for tools that run inline: as oq_cstore_intake(), except that a NEW
 *        call gets only its inbox row and *is_new = 1 (outcome OQ_IN_PLANNED): the caller
 *        then runs the tool and MUST call oq_cstore_finish_new() in the same transaction,
 *        before any other intake, so the execution row is written once, in its outcome state
 *        (no PLANNED/STARTED row versions, one audit row instead of three). For every other
 *        outcome nothing changes (*is_new = 0; a re-planned attempt is inserted PLANNED).
 */
int oq_cstore_intake_fast(oq_cstore_t *s, const oq_envelope_t *env, const oq_msg_src_t *src,
                          int64_t now, int *is_new, int *outcome, oq_error_t *err);

/**
 * @brief In tx: record a dead letter: inbox row (outcome 'dlq'), dlq row with the original
 *        bytes and \p reason, audit 'dlq'.
 * @param message_id inbox key (envelope id, header id, or "dlq:topic:partition:offset").
 * @param dup set to 1 when \p message_id was already in the inbox (nothing else written).
 */
int oq_cstore_dlq_add(oq_cstore_t *s, const char *message_id, const char *call_id,
                      const oq_msg_src_t *src, const void *key, size_t key_len,
                      const void *payload, size_t len, const char *reason, int64_t now,
                      int *dup, oq_error_t *err);

/** One unpublished dead letter (borrowed from the statement until the callback returns). */
typedef struct oq_dlq_row {
    int64_t id;
    const char *message_id, *reason;
    const void *key, *payload;
    size_t key_len, len;
} oq_dlq_row_t;
/** @brief Call \p cb for up to \p limit unpublished dead letters, in id order. */
int oq_cstore_dlq_pending(oq_cstore_t *s, int limit,
                          void (*cb)(const oq_dlq_row_t *row, void *opaque), void *opaque,
                          oq_error_t *err);
/** @brief Mark dead letter \p id published at \p now. */
int oq_cstore_dlq_mark(oq_cstore_t *s, int64_t id, int64_t now, oq_error_t *err);

/**
 * @brief Claim \p call_id if it is due (PLANNED, FAILED_RETRYABLE or SAFE_RETRY with
 *        next_attempt_at <= now): one conditional UPDATE (rowcount decides) sets STARTED,
 *        fence + 1, tries + 1, lease_owner = this worker, lease_until = now + lease_ms.
 *        In tx (audit 'started' is written with it).
 * @param out receives the claimed row (with the new fence), may be NULL.
 * @returns 0 when claimed, OQ_ESTATE when not due or taken by someone else.
 */
int oq_cstore_claim(oq_cstore_t *s, const char *call_id, int64_t lease_ms, int64_t now,
                    oq_exec_t *out, oq_error_t *err);

/**
 * @brief Heartbeat: extend the lease of \p call_id held with \p fence (autocommit).
 * @returns 0, or OQ_EFENCED when the row is no longer STARTED with this fence and owner.
 */
int oq_cstore_renew(oq_cstore_t *s, const char *call_id, int64_t fence, int64_t lease_until,
                    oq_error_t *err);

/**
 * @brief Give a lease back early (shutdown): lease_until = 0 so recovery takes it at once.
 *        Autocommit; fenced like renew.
 */
int oq_cstore_release(oq_cstore_t *s, const char *call_id, int64_t fence, oq_error_t *err);

/** Backoff policy handed to oq_cstore_finish. */
typedef struct oq_retry_policy {
    int max_attempts;      /**< tool runs per attempt */
    int64_t base_ms, max_ms;
} oq_retry_policy_t;

/** @brief Backoff before run \p tries + 1: base * 2^(tries-1), capped, jitter x[0.5,1.5). */
int64_t oq_retry_backoff_ms(const oq_retry_policy_t *p, int64_t tries);

/**
 * @brief In tx: finish the execution \p x (as returned by claim: call_id, fence, identity)
 *        with the tool's outcome \p rc / \p out. First a fenced UPDATE (state STARTED, same
 *        fence and owner): rowcount 0 -> audit 'lease_lost', nothing else, OQ_EFENCED.
 *        Success: effect insert when out->has_effect (UNIQUE call_id; a conflict keeps the
 *        existing effect and result), COMMITTED, result event appended to the outbox.
 *        Failure: FAILED_RETRYABLE with next_attempt_at = now + backoff while tries <
 *        max_attempts and the failure is retryable, else FAILED_FINAL + result event.
 *        OQ_TOOL_ABANDONED: back to SAFE_RETRY (via UNKNOWN), due now.
 * @param state_out receives the new oq_xstate_t (may be NULL).
 * @param effect_new set to 1 when an effect row was inserted (may be NULL).
 */
int oq_cstore_finish(oq_cstore_t *s, const oq_exec_t *x, int rc, const oq_tool_out_t *out,
                     const oq_retry_policy_t *p, int64_t now, int *state_out, int *effect_new,
                     oq_error_t *err);

/**
 * @brief In tx: write the execution of a new call after its first run, inline in this
 *        transaction (see oq_cstore_intake_fast): tries 1, fence 1, no lease ever visible.
 *        Success: effect (UNIQUE call_id gate), COMMITTED, result event. Failure:
 *        FAILED_RETRYABLE (backoff as oq_cstore_finish) or FAILED_FINAL + result event.
 *        OQ_TOOL_ABANDONED: PLANNED, due now. ONE audit row carries the path: its event is
 *        the outcome ('committed', 'failed_retryable', 'failed_final'; 'planned' when
 *        abandoned) and its detail starts with "inline: planned, started, try 1".
 * @param state_out receives the new oq_xstate_t (may be NULL).
 * @param effect_new set to 1 when an effect row was inserted (may be NULL).
 */
int oq_cstore_finish_new(oq_cstore_t *s, const oq_envelope_t *env, int rc_tool,
                         const oq_tool_out_t *o, const oq_retry_policy_t *p, int64_t now,
                         int *state_out, int *effect_new, oq_error_t *err);

/**
 * @brief In tx: recovery. STARTED rows whose lease lapsed before \p now (and UNKNOWN rows)
 *        become UNKNOWN (fence + 1) and are reconciled against effects: effect present ->
 *        COMMITTED (result re-emitted); absent -> SAFE_RETRY (due now), or NEEDS_REVIEW (with a
 *        result event) when tries >= max_attempts. Terminal rows are never touched.
 * @param n_recovered receives the number of rows reconciled (may be NULL).
 */
int oq_cstore_recover(oq_cstore_t *s, int64_t now, int max_attempts, int limit,
                      int *n_recovered, oq_error_t *err);

/**
 * @brief Retention: delete up to \p limit inbox rows received before \p before and published
 *        dead letters created before it (one autocommit DELETE each). Executions, effects and
 *        audit are kept (the effects table stays the last gate for late redeliveries).
 * @param n_deleted receives the number of rows deleted (may be NULL).
 */
int oq_cstore_purge(oq_cstore_t *s, int64_t before, int limit, int64_t *n_deleted,
                    oq_error_t *err);

/** @brief Cheap read: non-zero when oq_cstore_recover() would find work at \p now. */
int oq_cstore_recover_needed(oq_cstore_t *s, int64_t now);

/** A due execution (PLANNED / FAILED_RETRYABLE / SAFE_RETRY, next_attempt_at <= now). */
typedef struct oq_due {
    char call_id[OQ_CALL_ID_LEN + 1];
    char tool[OQ_MAX_NAME_LEN + 1];
    int64_t blocks_ms; /**< oq_tool_blocks() of its args */
} oq_due_t;
/** @brief Up to \p cap due executions, oldest due first. */
int oq_cstore_due(oq_cstore_t *s, int64_t now, oq_due_t *out, int cap, int *n, oq_error_t *err);

/** @brief Earliest next_attempt_at of a waiting row, or INT64_MAX when none. */
int64_t oq_cstore_next_due(oq_cstore_t *s);

/** @brief Load \p call_id. @returns 0, OQ_ENOTFOUND, OQ_EDB. */
int oq_cstore_exec_get(oq_cstore_t *s, const char *call_id, oq_exec_t *out, oq_error_t *err);

/** @brief Execution counts by state (indexed by oq_xstate_t). */
int oq_cstore_state_counts(oq_cstore_t *s, int64_t counts[OQ_X__COUNT], oq_error_t *err);

/** @brief Number of effects for \p call_id (NULL: all effects). Negative OQ_E* on error. */
int64_t oq_cstore_effect_count(oq_cstore_t *s, const char *call_id);

/** @brief The stable effect id of a call: "e_" + the call id's hex part. */
void oq_effect_id_for(const char *call_id, char out[OQ_CALL_ID_LEN + 1]);

#endif
