/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_consumer.h
 * @brief The consumer-group worker (`onceq consumer`) and its tools registry.
 *
 * A worker is one member of a Kafka consumer group reading onceq.tool-calls. Several worker
 * processes on one host share one effects database (SQLite WAL). Per poll batch, in one write
 * transaction (group commit), each message is de-duplicated by the inbox, and a fast compiled
 * tool of a new call is run right there, its effect inserted (UNIQUE call_id: the last gate)
 * and its execution row written once in its outcome state with its result event in the
 * consumer's outbox (a re-planned or due execution is claimed first: conditional UPDATE +
 * fencing token). Offsets are committed only after that transaction commits. Compiled tools
 * that block (sleep, a charge with delay_ms) are left PLANNED and run by runner threads outside
 * any transaction while a heartbeat renews their lease; their finishing write checks the fence.
 *
 * Tools declared in a tools file (`--tools`, HTTP tools, consumer/http_tools.h) call other
 * systems, where an answer can be lost. Their executions are STARTED (lease, fence, attempt,
 * effect_id, and the `running` event for the producer) in the batch transaction, and the
 * request leaves only after it commits; one dispatcher thread runs every request in flight
 * (consumer/dispatch.c, libcurl multi); the answers come back to the batch thread, whose next
 * transaction writes each outcome with its effect (the downstream's object id), state and
 * result event: success -> COMMITTED; declared final refusal -> FAILED_FINAL; not sent or
 * refused before processing -> FAILED_RETRYABLE (full-jitter backoff, Retry-After honoured, a
 * budget, then FAILED_FINAL "retries_exhausted"); sent without a definite answer -> UNKNOWN,
 * stored. Recovery (at start-up, periodically, after an UNKNOWN, on a redelivery) turns lapsed
 * leases into UNKNOWN and reconciles: the local effects table, a lookup at the downstream
 * (RECONCILING), or the tool's declaration; what cannot be decided is NEEDS_REVIEW, for an
 * operator (oq_review_*, `onceq review`). Never a blind resend to a downstream that neither
 * honours keys nor offers a lookup. Result events are published to onceq.tool-results by the
 * relay library embedded in the worker (one publisher per database at a time, by its lease).
 *
 * Where the code is (consumer/README.md has the map): consumer/worker.c (Kafka poll loop, the
 * batch transaction), consumer/runner.c (compiled tools: inline, runner threads, heartbeat),
 * consumer/outside.c (jobs to the dispatcher, outcomes back), consumer/consumer_metrics.c,
 * consumer/execution.c (the rules: intake, state machine, finish, recovery, reconciliation,
 * review), consumer/store.c behind consumer/consumer_store.h (every SQL statement),
 * consumer/tools.c (the registry and the built-in tools), consumer/http_tools.c (tools file,
 * HTTP executor), consumer/dispatch.c (the outside calls' thread), consumer/review.c (the
 * operator's API) and consumer/admin.c (the admin listener: metrics, stats, review over HTTP).
 *
 * Crash points (ONCEQ_CRASH_AT, see oq_util.h), in the order a call meets them:
 *   consumer.after_intake_before_commit  batch: inbox rows, plans and inline runs written,
 *                                        the batch transaction not committed
 *   consumer.after_claim                 runner: STARTED committed, tool not yet run
 *   consumer.in_tool                     inside a compiled tool run, inline or on a runner
 *                                        (before the tool function returns)
 *   consumer.after_request_sent_before_outcome
 *                                        HTTP tool: the request was sent (the downstream may
 *                                        have acted), its outcome not recorded (dispatcher
 *                                        thread, as the answer or its absence arrives)
 *   consumer.after_effect_before_commit  effect + outcome state written, not committed (in a
 *                                        batch at the same point as after_intake_before_commit;
 *                                        on a runner in its finishing transaction)
 *   consumer.after_outcome_commit_before_offset
 *                                        HTTP tool: a batch holding outside outcomes committed,
 *                                        Kafka offsets not committed
 *   consumer.after_commit_before_offset  batch committed, Kafka offsets not committed
 */
#ifndef OQ_CONSUMER_H
#define OQ_CONSUMER_H

#include <jansson.h>
#include <stdint.h>

#include "oq_config.h"
#include "oq_error.h"

/* --- dead letters -----------------------------------------------------------------------------
 * A message a worker cannot execute goes to onceq.dlq with these stable reason codes (header
 * onceq-dlq-reason, oq_envelope.h; the human-readable detail is in onceq-dlq-detail). Only
 * ever add codes: operators' alerts and runbooks match them. */
#define OQ_DLQ_EMPTY "empty_message"             /**< no payload */
#define OQ_DLQ_TOO_LARGE "too_large"             /**< over the envelope size limit */
#define OQ_DLQ_UNKNOWN_VERSION "unknown_version" /**< an envelope version this worker lacks */
#define OQ_DLQ_INVALID "invalid_envelope"        /**< not JSON, a field missing or invalid */
#define OQ_DLQ_NOT_TOOL_CALL "not_tool_call"     /**< a valid envelope of another kind */
#define OQ_DLQ_MISMATCH "fingerprint_mismatch"   /**< call_id known with another fingerprint */
#define OQ_DLQ_EXPIRED                                                                             \
    "expired" /**< no execution, created before the retention horizon: its                         \
                   execution may have been purged, so it never runs */

/* --- tools ------------------------------------------------------------------------------------
 * Adding a tool: write one `oq_tool_fn` (validate args -> OQ_TOOL_BADARGS with a message; do
 * the work passing `effect_id` downstream as the idempotency key; fill the result), and add one
 * line to the registry table in consumer/tools.c:
 *     {"my_tool", my_tool_run, NULL},
 * If the tool may block (network call, sleep), also give a `blocks_ms` function returning the
 * expected duration for these args (> 0 runs it on a runner thread, outside the write
 * transaction, under a renewed lease); fast tools run inline in the batch transaction.
 */

/** What a tool is asked to do. All fields borrowed for the duration of the call. */
typedef struct oq_tool_call {
    const char *call_id;
    const char *effect_id; /**< stable per call: the downstream idempotency key */
    const char *tenant;
    const char *tool;
    const json_t *args; /**< JSON object */
    int64_t attempt;    /**< producer attempt */
    int64_t try_no;     /**< 1-based run number within this attempt (retries) */
    volatile int *stop; /**< non-zero: the worker is stopping; long tools return early */
} oq_tool_call_t;

/** Tool return codes. */
enum {
    OQ_TOOL_OK = 0,       /**< success: out->result set (may stay NULL = {}) */
    OQ_TOOL_FAIL = 1,     /**< failed: out->retryable decides FAILED_RETRYABLE vs FINAL */
    OQ_TOOL_BADARGS = 2,  /**< invalid arguments: FAILED_FINAL, code "bad_args" */
    OQ_TOOL_ABANDONED = 3 /**< stopped early (call->stop): nothing happened, run it again */
};

/** What a tool reports. Zeroed by the caller before the call. */
typedef struct oq_tool_out {
    json_t *result;      /**< success: a JSON object (the tool gives its reference) */
    int has_effect;      /**< success: record one row in effects for this call */
    int64_t amount;      /**< effect column (charge) */
    char recipient[256]; /**< effect column (send_email) */
    int retryable;       /**< OQ_TOOL_FAIL: retry with backoff */
    char code[48];       /**< failure code, e.g. "tool_failed", "bad_args" */
    char message[256];   /**< failure message */
} oq_tool_out_t;

typedef int (*oq_tool_fn)(const oq_tool_call_t *call, oq_tool_out_t *out);
/** Expected blocking time in ms for \p args (0: fast, run inline). Must not fail. */
typedef int64_t (*oq_tool_blocks_fn)(const json_t *args);

typedef struct oq_tool {
    const char *name;
    oq_tool_fn run;
    oq_tool_blocks_fn blocks_ms; /**< NULL: always fast */
} oq_tool_t;

/**
 * @brief Look a tool up by name. @returns the registry entry or NULL (unknown tool: the
 *        execution fails final with code "unknown_tool").
 */
const oq_tool_t *oq_tool_find(const char *name);

/** @brief Expected blocking ms of running \p tool with \p args (0 for fast or unknown tools). */
int64_t oq_tool_blocks(const oq_tool_t *tool, const json_t *args);

/**
 * @brief Run \p tool (NULL: unknown tool) with crash point consumer.in_tool, mapping every
 *        failure into \p out (code/message/retryable) so the caller only branches on the code.
 * @returns OQ_TOOL_OK, OQ_TOOL_FAIL, OQ_TOOL_BADARGS or OQ_TOOL_ABANDONED.
 */
int oq_tool_invoke(const oq_tool_t *tool, const oq_tool_call_t *call, oq_tool_out_t *out);

/** @brief Release what \p out owns (the result reference). */
void oq_tool_out_clear(oq_tool_out_t *out);

/* --- the worker ----------------------------------------------------------------------------- */

/** Worker settings (see oq_consumer_settings for the command-line names and defaults). */
typedef struct oq_consumer_opts {
    const char *db_path;           /**< effects database (created and migrated) */
    const char *brokers;           /**< bootstrap servers */
    const char *group;             /**< consumer group id (default "onceq-workers") */
    const char *topic;             /**< input topic (default: topic_prefix + "tool-calls") */
    const char *topic_prefix;      /**< topic names' prefix (NULL: "onceq."): the input topic,
                                        the DLQ and the results the embedded relay publishes */
    const char *worker_id;         /**< NULL: host:pid:random */
    const char *synchronous;       /**< SQLite synchronous level (NULL: FULL) */
    const char *relay_synchronous; /**< the embedded result relay's own writes (marks, lease):
                                        NULL: NORMAL (see oq_relay_opts_t.db_synchronous) */
    const char *metrics_listen;    /**< NULL: no admin listener (metrics, stats, review over
                                        HTTP: consumer/admin.h) */
    const oq_config_t *cfg;        /**< -X Kafka properties (may be NULL); borrowed */
    int64_t lease_ms;              /**< execution lease (default 30000) */
    int max_attempts;              /**< tool runs per attempt before FAILED_FINAL (default 5) */
    int batch;                     /**< max messages per poll batch / transaction (default 500) */
    int runners;                   /**< threads for blocking tools (default 4) */
    int64_t retry_base_ms;         /**< first backoff (default 200) */
    int64_t retry_max_ms;          /**< backoff cap (default 30000) */
    int64_t recover_every_ms;      /**< recovery scan period (default 1000) */
    int no_relay;                  /**< do not embed the result relay (tests, benchmarks) */
    int64_t inbox_retention_ms;    /**< inbox rows older than this are purged (default 7 days;
                                        keep it >= the input topic's retention) */
    int64_t retention_ms;          /**< settled executions, their effects and audit rows are
                                        purged this long after they settled (at least
                                        inbox_retention_ms; 0: 7 days; < 0: never). Keep it
                                        >= the producer's key_ttl and the topic's retention */
    const char *tools_path;        /**< tools file of HTTP tools (NULL: compiled tools only); a
                                        name declared there and compiled in is an error */
    int http_inflight;             /**< outside requests running at once (default 256); as many
                                        more wait in the dispatcher's queue, their leases
                                        renewed; the rest stays in Kafka */
    int lookup_budget;             /**< undecided lookups per unknown outcome before it goes to
                                        review (or, for a tool that honours keys, is resent);
                                        default 5 */
    /** NULL, or the token file (the producer's format) whose operator tokens guard the review
     *  API and /stats; needed for a metrics_listen that is not on loopback */
    const char *token_file;
    /** NULL, or host:port serving /metrics, /healthz and /readyz only (open, any address) */
    const char *metrics_only_listen;
    int64_t drain_ms; /**< at stop, how long outside requests in flight may still
                           answer and commit: 0 = the longest timeout in the tools
                           file, at most 60000; negative = none (abandon at once) */
} oq_consumer_opts_t;

typedef struct oq_consumer oq_consumer_t;

/**
 * @brief Open the database (migrating it), create the Kafka consumer and the DLQ producer,
 *        start runner and heartbeat threads, the embedded relay and the metrics server.
 * @returns 0 with \p out set, or a negative OQ_E* code with \p err filled.
 */
int oq_consumer_new(const oq_consumer_opts_t *opts, oq_consumer_t **out, oq_error_t *err);

/**
 * @brief Run until oq_consumer_stop() (or \p max_idle_ms > 0 of no input and no due work; 0 =
 *        forever). On return the current batch is committed, offsets committed and the group
 *        left. @returns 0 or a negative OQ_E* code.
 */
int oq_consumer_run(oq_consumer_t *c, int64_t max_idle_ms, oq_error_t *err);

/** @brief Ask a running worker to stop (async-signal-safe: sets a flag). */
void oq_consumer_stop(oq_consumer_t *c);

/** @brief Free everything; accepts NULL. Call after oq_consumer_run returned. */
void oq_consumer_destroy(oq_consumer_t *c);

/** Counters of one worker (for benchmarks and tests). */
typedef struct oq_consumer_stats {
    uint64_t consumed;      /**< Kafka messages handled */
    uint64_t duplicates;    /**< inbox hits (redelivered message ids) */
    uint64_t effects;       /**< effects written by this worker */
    uint64_t dlq;           /**< messages dead-lettered */
    uint64_t terminal;      /**< executions this worker brought to a terminal state */
    int64_t first_poll_us;  /**< oq_mono_us() when the first message was polled (0: none) */
    uint64_t requests;      /**< outside requests answered (calls + lookups) */
    uint64_t unknown;       /**< runs whose outcome was stored UNKNOWN */
    uint64_t lease_lost;    /**< outcome writes refused by the fence */
    uint64_t reconciled[4]; /**< reconciliation verdicts: found, absent, undecided, none (decided
                                 by the tool's declaration) */
    uint64_t to_review;     /**< executions this worker sent to NEEDS_REVIEW */
    int inflight;           /**< outside requests in flight now */
} oq_consumer_stats_t;

/** @brief Snapshot of \p c's counters. */
void oq_consumer_get_stats(oq_consumer_t *c, oq_consumer_stats_t *out);

/**
 * @brief The worker's stats as JSON (GET /stats on its admin listener): the counters, executions
 *        by state, reconciliation verdicts and success rate, time from UNKNOWN to a decision
 *        (p50/p95/p99 of the last 2048), the review queue and its oldest age, and per declared
 *        HTTP tool the requests by outcome class and their latency (p50/p95/p99).
 * @returns a new object (caller json_decref()s it), or NULL when out of memory.
 * @locality any thread while the worker runs (the database is read on the worker's stats
 *        connection, under a lock).
 */
json_t *oq_consumer_stats_json(oq_consumer_t *c);

/**
 * @brief The per-call reconciliation figures of the consumer database \p db (a file or a
 *        PostgreSQL setting), read from its rows: the "calls" object of /stats,
 *        {"calls", "unknown", "unknown_resolved", "unknown_pending", "review",
 *        "reconciliation_success_rate", "manual_recovery_rate", "unknown_to_final_ms":
 *        {"n", "p50", "p95", "p99"}} (README, "Metrics"). What `onceq stats --consumer-db`
 *        prints under "calls".
 * @param out a new object (caller decrefs).
 * @returns 0, OQ_EIO (no database), OQ_EDB, OQ_ENOMEM.
 */
int oq_consumer_calls_stats(const char *db, json_t **out, oq_error_t *err);

/**
 * @brief Load the tools file \p path as a worker would and check it: syntax, fields, and that
 *        no declared name is also a compiled tool. Nothing is started.
 * @returns 0, OQ_EIO (unreadable) or OQ_EINVAL (\p err names the file, the tool, the field).
 */
int oq_consumer_check_tools(const char *path, oq_error_t *err);

/* --- review: executions no machine could decide (consumer/review.c) --------------------------
 * NEEDS_REVIEW means the outcome of an outside call cannot be decided automatically (no lookup
 * and no key support, or the lookup kept failing). These functions open the effects database
 * \p db_path themselves (it must exist) and may run in any process or thread. */

/**
 * @brief The review queue, oldest first: a JSON array of {call_id, tool, tenant, idem_key,
 *        attempt, tries, fence (the episode's, for oq_review_resolve), since (unix ms the
 *        outcome became unknown), age_s, code, why}. GET /v1/review and `onceq review list
 *        --json` both print it as {"review": [...], "count": N}.
 * @param limit at most this many (<= 0: 1000). @param out a new array (caller decrefs).
 * @returns 0, OQ_EIO (no database), OQ_EDB.
 */
int oq_review_list(const char *db_path, int limit, json_t **out, oq_error_t *err);

/**
 * @brief One call's story in the consumer database: {"execution": {...}, "effect": {...} |
 *        null, "timeline": [audit rows in order: id, ts, event, attempt, fence, worker,
 *        detail]}. Works for any call, in review or not.
 * @returns 0, OQ_ENOTFOUND, OQ_EIO, OQ_EDB.
 */
int oq_review_show(const char *db_path, const char *call_id, json_t **out, oq_error_t *err);

/**
 * @brief Resolve the NEEDS_REVIEW execution \p call_id \p as "committed" (the downstream did
 *        it: COMMITTED, effect recorded with downstream id \p ref, result `succeeded`),
 *        "failed" (it did not and must not: FAILED_FINAL, result `failed`) or "retry" (send
 *        once more with the same key: SAFE_RETRY, due now, a fresh try budget). One
 *        transaction: fenced (fence + 1), audited ('review_resolved' with the note and \p by),
 *        at most one result event; the producer's call moves to the end state once a worker's
 *        relay publishes it.
 * @param note required (1-1000 bytes, UTF-8); \p ref optional, only with committed.
 * @param fence the review episode decided on: the `fence` oq_review_list / oq_review_show
 *        reported (required, >= 0). It moves when the call leaves review and comes back.
 * @param out may be NULL; else {call_id, resolved_as, state}.
 * @returns 0, OQ_EINVAL (bad --as, note, ref or fence: nothing written), OQ_ENOTFOUND,
 *          OQ_ESTATE (not NEEDS_REVIEW: nothing written), OQ_EFENCED ("review_moved": in
 *          review with another fence, nothing written), OQ_EIO, OQ_EDB / OQ_EBUSY.
 */
int oq_review_resolve(const char *db_path, const char *call_id, const char *as, const char *ref,
                      const char *note, const char *by, int64_t fence, json_t **out,
                      oq_error_t *err);

/* --- retention (consumer/retention.c) -------------------------------------------------------- */

/** What a purge deleted. */
typedef struct oq_consumer_purge_stats {
    int64_t executions, effects, audit, inbox, outbox; /**< inbox: with handled dead letters;
                                                            outbox: delivered result events */
    int batches;
} oq_consumer_purge_stats_t;

/**
 * @brief Retention on the consumer database \p db_path (it must exist): the inbox and
 *        published dead letters older than \p inbox_retention_ms; settled executions
 *        (COMMITTED, FAILED_FINAL) with their effects and audit rows once they settled longer
 *        ago than max(\p retention_ms, \p inbox_retention_ms). Executions in review (or in
 *        any other unsettled state) are never deleted. Before deleting, the database's
 *        retention horizon is raised: a message that finds no execution and was created before
 *        it is never executed (dead-lettered `expired`), so a purged call cannot run again.
 *        What `onceq purge --consumer-db` and the consumer daemon (every minute) run.
 * @param batch rows per transaction (<= 0: 1000). @param stats may be NULL.
 * @returns 0, OQ_EINVAL (a retention <= 0), OQ_EIO (no database), OQ_EDB / OQ_EBUSY.
 */
int oq_consumer_purge(const char *db_path, int64_t retention_ms, int64_t inbox_retention_ms,
                      int batch, oq_consumer_purge_stats_t *stats, oq_error_t *err);

/** The settings table of `onceq consumer` (name, type, default, bounds, doc). */
extern const oq_setting_t oq_consumer_settings[];
extern const size_t oq_consumer_nsettings;

/** @brief Fill \p o from a parsed config holding oq_consumer_settings. */
void oq_consumer_opts_from_config(const oq_config_t *cfg, oq_consumer_opts_t *o);

#endif
