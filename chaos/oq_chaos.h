/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_chaos.h
 * @brief The invariant checker behind `onceq verify` (and the chaos tests).
 *
 * oq_verify_run() opens a producer database (calls.db) and a consumer database (effects.db)
 * read-only, in one read transaction across both (the consumer database is ATTACHed), and
 * checks the invariants of the pipeline:
 *   1. one call per (tenant, idem_key);
 *   2. at most one effect per call_id;
 *   3. no effect for a conflicting body (execution fingerprint != call fingerprint) and no
 *      effect for a call the producer does not know;
 *   4. every accepted call terminal once drained; a succeeded charge/send_email call has its
 *      effect;
 *   5. a terminal state is never left or re-executed (from the consumer's executions and
 *      ordered audit, and the producer's audit).
 * With the downstream's ledger as a third input (`onceq-downstream`'s database, optional), it
 * also reports the duplicate side-effect rate where a user's customer sees it, from that
 * ledger (oq_downstream_ledger_stats), and checks:
 *   6. at most one downstream effect per call (per idempotency key, else reference);
 *   7. every effect recorded with a downstream id names a payment the ledger holds.
 * Each violation has a kind; the report keeps the count of every kind and the first few
 * examples (call id + detail). Run it on a drained pipeline: against a running one the two
 * databases are snapshots taken at slightly different moments, so use allow_pending.
 */
#ifndef OQ_CHAOS_H
#define OQ_CHAOS_H

#include <stdint.h>
#include <stdio.h>

#include "oq_error.h"

/** Kinds of violation. Names (oq_violation_name) are stable: tests and JSON output use them. */
typedef enum {
    OQ_V_DUP_KEY = 0,          /**< two calls share (tenant, idem_key) */
    OQ_V_DUP_EFFECT,           /**< more than one effect for one call_id */
    OQ_V_CONFLICT_EFFECT,      /**< effect whose execution fingerprint != the call's */
    OQ_V_UNKNOWN_CALL_EFFECT,  /**< effect for a call_id unknown to the producer */
    OQ_V_NOT_TERMINAL,         /**< accepted call still pending/running (lost once drained) */
    OQ_V_SUCCEEDED_NO_EFFECT,  /**< succeeded charge/send_email call without its effect */
    OQ_V_FAILED_WITH_EFFECT,   /**< producer says failed but an effect exists */
    OQ_V_COMMITTED_NO_EFFECT,  /**< consumer execution COMMITTED for an effectful tool, no effect */
    OQ_V_EFFECT_NOT_COMMITTED, /**< effect exists but the execution ended failed */
    OQ_V_REEXECUTED,           /**< consumer audit: execution started again after terminal */
    OQ_V_TERMINAL_LEFT,        /**< producer audit: a terminal call moved again */
    OQ_V_ACCEPTED_MISSING,     /**< a client got 2xx for a call that calls.db does not hold */
    OQ_V_DOWNSTREAM_DUP,       /**< the downstream ledger holds > 1 effect for one key/ref */
    OQ_V_DOWNSTREAM_MISSING,   /**< an effect's downstream id is not in the ledger */
    OQ_V_KEY_REEXECUTED,       /**< one (tenant, idem_key) owns two calls with an effect, the
                                    second created before the first settled */
    OQ_V_TASK_STEP_RERUN,      /**< a task's step (or compensation) has more than one call, or
                                    a call that is not its derived key's */
    OQ_V_TASK_COMP_TWICE,      /**< a compensation with more than one effect, or one written
                                    for a step that never succeeded */
    OQ_V_TASK_FALSE_END,       /**< a task `compensated` with a compensation that did not
                                    succeed (or is missing), or `succeeded` with a step that
                                    did not */
    OQ_V_TASK_NOT_TERMINAL,    /**< a task still running or compensating (once drained) */
    OQ__V_COUNT
} oq_violation_kind_t;

/** @brief Stable name of a violation kind ("dup_effect", ...), or "?" when out of range. */
const char *oq_violation_name(int kind);

/** Options of one verification run. Zero-initialised = defaults. */
typedef struct oq_verify_opts {
    int allow_pending;         /**< non-terminal calls are reported (pending) but not violations */
    int max_examples;          /**< examples kept per kind (0: default 10; negative: none) */
    const char *accepted_file; /**< optional: call ids a client saw accepted (2xx), one per
                                    line; each missing from calls.db is OQ_V_ACCEPTED_MISSING */
    const char *downstream_db; /**< optional: the ledger of `onceq-downstream` (read-only) */
} oq_verify_opts_t;

/** One example of a violation. */
typedef struct oq_violation {
    int kind; /**< oq_violation_kind_t */
    char call_id[64];
    char detail[192];
} oq_violation_t;

/** The result of oq_verify_run(). Free what it owns with oq_verify_report_clear(). */
typedef struct oq_verify_report {
    int64_t calls;              /**< logical calls in the producer database */
    int64_t by_state[5];        /**< pending, running, succeeded, failed, needs_review */
    int64_t effects;            /**< rows in the consumer's effects table */
    int64_t expected_effects;   /**< succeeded charge + send_email calls */
    int64_t duplicates;         /**< duplicate effects: effects - distinct effect call_ids */
    int64_t pending;            /**< calls not terminal (pending + running) */
    int64_t lost;               /**< not terminal (unless allow_pending) + succeeded w/o effect */
    int64_t inbox_duplicates;   /**< consumer inbox rows marked duplicate (redelivery absorbed) */
    double dsr;                 /**< duplicates / calls (0 when no calls) */
    int64_t count[OQ__V_COUNT]; /**< violations per kind */
    int64_t violations;         /**< sum of count[] */
    oq_violation_t *examples;   /**< first max_examples of each kind, in kind order */
    int nexamples;
    int allow_pending;
    int has_downstream;    /**< the fields below were read from the downstream ledger */
    int64_t ds_effects;    /**< effects the downstream committed */
    int64_t ds_calls;      /**< logical calls there (by key, else reference, else id) */
    int64_t ds_duplicates; /**< ds_effects - ds_calls */
    double ds_dsr;         /**< ds_duplicates / ds_calls: the DSR a customer sees */
} oq_verify_report_t;

/**
 * @brief Check the invariants across \p producer_db and \p consumer_db (both opened read-only;
 *        neither is modified, no migration is run).
 * @param opts may be NULL (defaults).
 * @param rep filled on success (zeroed first); free with oq_verify_report_clear().
 * @returns 0 when the check ran (violations are in \p rep, not in the return code), OQ_EIO
 *          when a file is missing, OQ_EDB on SQL errors or a database that is not a
 *          producer/consumer/ledger database (\p err says which).
 */
int oq_verify_run(const char *producer_db, const char *consumer_db, const oq_verify_opts_t *opts,
                  oq_verify_report_t *rep, oq_error_t *err);

/** @brief Free the examples of \p rep and zero it; accepts NULL. */
void oq_verify_report_clear(oq_verify_report_t *rep);

/**
 * @brief Print \p rep as a human-readable report, or as one JSON object when \p json.
 * @returns 0, or OQ_ENOMEM / OQ_EIO.
 */
int oq_verify_print(const oq_verify_report_t *rep, FILE *out, int json);

#endif
