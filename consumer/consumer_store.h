/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file consumer_store.h
 * @brief Internal: every SQL statement of the consumer (consumer/store.c), as row operations on
 *        plain structs, so another backend can sit beside it. Not part of the public API.
 *
 * The store holds no rules: which transition is legal, what a redelivery means, when to retry
 * and how an unknown outcome is reconciled are decided in consumer/execution.c, which reads and
 * writes rows only through this header. The one thing the store adds is the connection's
 * identity: the worker id given at open is written into audit.worker and effects.worker.
 *
 * Functions marked "in tx" run inside the caller's open write transaction
 * (oq__consumer_store_begin) and commit nothing; the others are single autocommit statements.
 * Times are unix ms; a time of 0 in a row struct means NULL (none). Strings in the *_row_t and
 * update structs handed to the store are borrowed for the call.
 *
 * @locality one store per thread; the connection is not shared.
 */
#ifndef OQ_CONSUMER_STORE_H
#define OQ_CONSUMER_STORE_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "oq_ckpt.h"
#include "oq_db.h"
#include "oq_error.h"
#include "oq_json.h"
#include "oq_util.h"

typedef struct oq__consumer_store oq__consumer_store_t;

/**
 * Execution states, stored as their names in executions.state. Which moves between them are
 * legal is the transition table in consumer/execution.c (schema/consumer/0002_downstream.sql
 * draws it).
 */
typedef enum {
    OQ_X_PLANNED = 0,
    OQ_X_STARTED,
    OQ_X_COMMITTED,
    OQ_X_FAILED_RETRYABLE,
    OQ_X_FAILED_FINAL,
    OQ_X_UNKNOWN,
    OQ_X_RECONCILING,
    OQ_X_SAFE_RETRY,
    OQ_X_NEEDS_REVIEW,
    OQ_X__COUNT
} oq__xstate_t;

/** @brief "PLANNED", ... ; "?" when out of range. */
const char *oq__xstate_name(int state);
/** @brief State from its stored name, or -1. */
int oq__xstate_parse(const char *name);

/** One executions row as read. Strings are owned (malloc); free with oq__exec_row_clear(). */
typedef struct oq__exec_row {
    char call_id[OQ_CALL_ID_LEN + 1];
    char fingerprint[OQ_FINGERPRINT_LEN + 1];
    char message_id[OQ_UUID_LEN + 1]; /**< the inbox message that planned this attempt */
    char *tenant, *idem_key, *tool;
    char *args; /**< JSON object text */
    char *lease_owner, *result, *error, *effect_id;
    int state; /**< oq__xstate_t */
    int64_t attempt, tries, fence;
    int64_t lease_until, next_attempt_at; /**< 0: NULL */
    int64_t started_at;                   /**< last claim (0: never) */
    int64_t unknown_at;                   /**< start of the current unknown episode (0: none) */
    int64_t lookups;                      /**< undecided lookups in that episode */
    int64_t updated_at;                   /**< read only (set from `now` on every write) */
} oq__exec_row_t;

/** @brief Free what \p x owns and zero it; accepts NULL and a zeroed row. */
void oq__exec_row_clear(oq__exec_row_t *x);

/**
 * A conditional update of one execution: WHERE call_id, state = from_state, fence =
 * from_fence (and lease_owner = from_owner when that is not NULL); SET every mutable column to
 * the values given (NULL strings and 0 times write NULL). The caller decides the values; the
 * store only applies them if the row is still the one the caller saw.
 */
typedef struct oq__exec_update {
    const char *call_id;
    int from_state;
    int64_t from_fence;
    const char *from_owner; /**< NULL: the owner is not checked */
    int state;
    int64_t attempt, tries, fence;
    const char *lease_owner;
    int64_t lease_until;
    const char *result, *error, *effect_id;
    int64_t next_attempt_at;
    const char *message_id; /**< NULL: unchanged */
    int64_t now;            /**< updated_at */
    int64_t started_at, unknown_at, lookups;
} oq__exec_update_t;

/** Where a message came from. */
typedef struct oq__msg_src {
    const char *topic;
    int32_t partition;
    int64_t offset;
} oq__msg_src_t;

/** One inbox row. */
typedef struct oq__inbox_row {
    const char *message_id;
    const char *call_id; /**< NULL when the message did not decode */
    oq__msg_src_t src;
    const char *outcome; /**< 'planned', 'done', 'in_progress', 'stale', 'dlq' */
    int64_t received_at;
} oq__inbox_row_t;

/** One effects row. */
typedef struct oq__effect_row {
    const char *effect_id, *call_id, *tool;
    int64_t amount;        /**< 0: NULL */
    const char *recipient; /**< NULL or "" : NULL */
    const char *detail;    /**< JSON text: the tool's result */
    int64_t attempt, fence, created_at;
    const char *downstream_id; /**< the downstream's object id (NULL or "": NULL) */
} oq__effect_row_t;

/** An effects row as read (owned strings; oq__effect_read_clear). */
typedef struct oq__effect_read {
    char *effect_id, *detail, *downstream_id, *worker;
    int64_t created_at;
} oq__effect_read_t;

/** @brief Free what \p e owns and zero it; accepts NULL. */
void oq__effect_read_clear(oq__effect_read_t *e);

/** One audit row as read; pointers valid only during the callback. */
typedef struct oq__audit_read {
    int64_t id, ts, attempt, fence;
    const char *event, *worker, *detail;
} oq__audit_read_t;

/** The unsettled executions (UNKNOWN, RECONCILING, NEEDS_REVIEW) at a glance. */
typedef struct oq__unsettled {
    int64_t unknown;        /**< UNKNOWN + RECONCILING rows */
    int64_t unknown_oldest; /**< unix ms the oldest of them became unknown (0: none) */
    int64_t review;         /**< NEEDS_REVIEW rows: the review queue */
    int64_t review_oldest;  /**< unix ms the oldest of them became unknown or was last written */
} oq__unsettled_t;

/** One audit row (the worker column is the store's worker id). */
typedef struct oq__audit_row {
    int64_t ts;
    const char *call_id; /**< may be NULL (a dead letter that did not decode) */
    const char *event, *detail;
    int64_t attempt, fence;
} oq__audit_row_t;

/** One dead letter. On reads (oq__consumer_store_dlq_pending) created_at is not filled and
 *  every pointer is valid only during the callback. */
typedef struct oq__dlq_row {
    int64_t id;
    const char *message_id, *reason;
    const char *code;    /**< stable reason code (OQ_DLQ_* of oq_consumer.h) */
    const char *redrive; /**< re-published by `onceq dlq redrive`: its header onceq-redrive (the
                              dead letter it came from); NULL otherwise */
    oq__msg_src_t src;
    const void *key, *payload;
    size_t key_len, len;
    int64_t created_at;
} oq__dlq_row_t;

/** One due execution; pointers valid only during the callback. */
typedef struct oq__due_row {
    const char *call_id, *tool, *args;
} oq__due_row_t;

/* --- connection ------------------------------------------------------------------------------ */

/**
 * @brief The lease clock, in ms: the one source of every time the rules store in effects.db
 *        and compare there (leases, next_attempt_at, started_at + settle_ms, unknown_at,
 *        updated_at, audit and inbox times). SQLite: the boot's anchor (read or written at
 *        open, schema/consumer/0005_lease_clock.sql) + CLOCK_BOOTTIME: the same clock for every
 *        process of the host, never stepped, near the wall clock in value (docs/DESIGN.md,
 *        "Clocks"). PostgreSQL (shared by several hosts): the database server's clock, read at
 *        open and carried by CLOCK_BOOTTIME (consumer/store_pg.c).
 * @locality any thread; reads nothing but the anchor.
 */
int64_t oq__consumer_store_now(const oq__consumer_store_t *s);

/**
 * @brief Open \p path (WAL, synchronous per \p opts) and migrate it to the consumer set; a
 *        PostgreSQL URI or keyword string (oq_backend_of) opens consumer/store_pg.c instead.
 * @param worker_id written into audit.worker and effects.worker; copied.
 * @returns 0 with \p out set, or OQ_EDB / OQ_EIO / OQ_EVERSION / OQ_ENOMEM.
 */
int oq__consumer_store_open(const char *path, const oq_db_opts_t *opts, const char *worker_id,
                            oq__consumer_store_t **out, oq_error_t *err);
/** @brief Close; accepts NULL. */
void oq__consumer_store_close(oq__consumer_store_t *s);
/** @brief Attach the store's SQLite connection to \p ck (oq_ckpt.h): its commits never
 *         checkpoint. No-op on PostgreSQL or with a NULL \p ck, which must outlive the store. */
void oq__consumer_store_attach(oq__consumer_store_t *s, oq_ckpt_t *ck);

/**
 * @brief A consumer database read as an SQLite file: the inbox, executions, effects and audit
 *        of the PostgreSQL store \p setting copied, from one snapshot, into a new SQLite
 *        consumer database at \p sqlite_path (which must not exist). What `onceq verify` reads
 *        when the consumer runs on PostgreSQL.
 */
int oq__consumer_store_export(const char *setting, const char *sqlite_path, oq_error_t *err);
/** @brief The connection (tests read it directly); owned by the store. NULL on PostgreSQL. */
sqlite3 *oq__consumer_store_db(oq__consumer_store_t *s);
struct pg_conn; /* libpq's PGconn */
/** @brief The PostgreSQL connection (tests read it directly), or NULL on SQLite. */
struct pg_conn *oq__consumer_store_pgconn(oq__consumer_store_t *s);
/** @brief Statements sent to PostgreSQL and round trips waited for since open (0 and 0 on
 *  SQLite): what tests and benchmarks count per message. */
void oq__consumer_store_counts(const oq__consumer_store_t *s, int64_t *statements,
                               int64_t *round_trips);
/** @brief The worker id given at open. */
const char *oq__consumer_store_worker(const oq__consumer_store_t *s);

/** @brief BEGIN IMMEDIATE (bounded wait). @returns 0, OQ_EBUSY or OQ_EDB. */
int oq__consumer_store_begin(oq__consumer_store_t *s, oq_error_t *err);
/**
 * @brief Begin the transaction of a batch of messages: as oq__consumer_store_begin, with the
 *        batch's call ids and message ids (\p n of each, NULL or "" where a message has none)
 *        so that the store may read their rows ahead. SQLite: oq__consumer_store_begin.
 *        PostgreSQL: BEGIN and one read of the executions, inbox ids and effects of the batch
 *        in one round trip; until the commit, what the rules ask of those rows is answered
 *        from that read (a row this transaction writes is read again), and the plain writes
 *        (inbox, execution, effect and audit inserts, result events) are held behind and sent
 *        with the next read or the commit, in one pipeline (consumer/store_pg.c). What the
 *        rules see and decide is the same; a held write that fails (a row another consumer
 *        wrote meanwhile) fails the batch retriably, and its retry goes statement by statement.
 */
int oq__consumer_store_begin_batch(oq__consumer_store_t *s, const char *const *call_ids,
                                   const char *const *message_ids, int n, oq_error_t *err);
int oq__consumer_store_commit(oq__consumer_store_t *s, oq_error_t *err);
/** @brief ROLLBACK if a transaction is open. */
void oq__consumer_store_rollback(oq__consumer_store_t *s);

/* --- rows (in tx unless said otherwise) ------------------------------------------------------ */

/**
 * @brief Inbox insert of \p row. A new message id gets its row and *seen = 1; a known one is
 *        counted (seen + 1, nothing else changes) and *seen is its new count (> 1).
 */
int oq__consumer_store_inbox_upsert(oq__consumer_store_t *s, const oq__inbox_row_t *row,
                                    int64_t *seen, oq_error_t *err);

/**
 * @brief The row of a message id whose outcome is 'dlq' takes \p row's call_id, source,
 *        received_at and outcome (seen is left as the upsert counted it): the one way a
 *        dead-lettered message id is let through the inbox again. *taken = 1 when such a
 *        row was rewritten, 0 when the id's row has any other outcome (nothing changes).
 */
int oq__consumer_store_inbox_retake(oq__consumer_store_t *s, const oq__inbox_row_t *row, int *taken,
                                    oq_error_t *err);

/** @brief Load \p call_id. @returns 0, OQ_ENOTFOUND, OQ_EDB. Autocommit or in tx. */
int oq__consumer_store_exec_get(oq__consumer_store_t *s, const char *call_id, oq__exec_row_t *out,
                                oq_error_t *err);

/** @brief Insert the execution \p x (every column from \p x; created_at = updated_at = \p now).
 *  @returns 0, or OQ_EDB on SQLite / OQ_EEXIST on PostgreSQL (a second row for the call violates
 *  UNIQUE(call_id); on PostgreSQL the transaction is then aborted: roll back). */
int oq__consumer_store_exec_insert(oq__consumer_store_t *s, const oq__exec_row_t *x, int64_t now,
                                   oq_error_t *err);

/** @brief Apply \p u (see oq__exec_update_t). *updated = 1 when the row matched, 0 when it had
 *  moved on (nothing written). */
int oq__consumer_store_exec_update(oq__consumer_store_t *s, const oq__exec_update_t *u,
                                   int *updated, oq_error_t *err);

/** @brief Replace result and effect_id of \p call_id, whatever its state (the effects gate held
 *  and the existing effect's values stand). */
int oq__consumer_store_exec_set_result(oq__consumer_store_t *s, const char *call_id,
                                       const char *result, const char *effect_id, oq_error_t *err);

/**
 * @brief Heartbeat (autocommit, or in the caller's transaction): lease_until = \p lease_until
 *        on \p call_id if it is STARTED or RECONCILING with \p fence and held by this store's
 *        worker.
 * @returns 0, or OQ_EFENCED when it is not (the lease is lost).
 */
int oq__consumer_store_lease_renew(oq__consumer_store_t *s, const char *call_id, int64_t fence,
                                   int64_t lease_until, oq_error_t *err);

/** @brief Up to \p cap STARTED or RECONCILING rows whose lease_until is before \p now. Caller
 *  clears rows. */
int oq__consumer_store_exec_lapsed(oq__consumer_store_t *s, int64_t now, oq__exec_row_t *rows,
                                   int cap, int *n, oq_error_t *err);

/** @brief Up to \p cap rows in \p state, least recently written first. Caller clears rows. */
int oq__consumer_store_exec_in_state(oq__consumer_store_t *s, int state, oq__exec_row_t *rows,
                                     int cap, int *n, oq_error_t *err);

/** @brief Up to \p cap STARTED or RECONCILING rows whose lease \p owner holds. */
int oq__consumer_store_exec_held_by(oq__consumer_store_t *s, const char *owner,
                                    oq__exec_row_t *rows, int cap, int *n, oq_error_t *err);

/** @brief Up to \p cap UNKNOWN rows due for reconciliation (next_attempt_at NULL or <= \p now),
 *  least recently written first. */
int oq__consumer_store_exec_unknown_due(oq__consumer_store_t *s, int64_t now, oq__exec_row_t *rows,
                                        int cap, int *n, oq_error_t *err);

/** @brief Counts and ages of the unsettled rows (autocommit; reads the partial index only). */
int oq__consumer_store_unsettled(oq__consumer_store_t *s, oq__unsettled_t *out, oq_error_t *err);

/** @brief Cheap read (autocommit): non-zero when a STARTED or RECONCILING row's lease lapsed
 *  before \p now or an UNKNOWN row is due (also on error, so that recovery itself reports it). */
int oq__consumer_store_recovery_pending(oq__consumer_store_t *s, int64_t now);

/** @brief Call \p cb for up to \p limit waiting rows (PLANNED, FAILED_RETRYABLE, SAFE_RETRY)
 *  with next_attempt_at <= \p now, earliest first (autocommit). */
int oq__consumer_store_due(oq__consumer_store_t *s, int64_t now, int limit,
                           void (*cb)(const oq__due_row_t *row, void *opaque), void *opaque,
                           oq_error_t *err);

/** @brief Earliest next_attempt_at of any row, or INT64_MAX when none (autocommit). */
int64_t oq__consumer_store_next_due(oq__consumer_store_t *s);

/** @brief Insert \p e unless the call has an effect already (UNIQUE call_id): *inserted = 0
 *  then, and nothing is written. */
int oq__consumer_store_effect_insert(oq__consumer_store_t *s, const oq__effect_row_t *e,
                                     int *inserted, oq_error_t *err);

/** @brief The effect of \p call_id: *found, and (when not NULL) its effect_id and detail,
 *  malloc()ed for the caller. */
int oq__consumer_store_effect_get(oq__consumer_store_t *s, const char *call_id, int *found,
                                  char **effect_id, char **detail, oq_error_t *err);

/** @brief The effect of \p call_id with its downstream id, creation time and worker. */
int oq__consumer_store_effect_read(oq__consumer_store_t *s, const char *call_id, int *found,
                                   oq__effect_read_t *out, oq_error_t *err);

/** @brief Call \p cb for every audit row of \p call_id in order (autocommit or in tx). */
int oq__consumer_store_audit_list(oq__consumer_store_t *s, const char *call_id,
                                  void (*cb)(const oq__audit_read_t *row, void *opaque),
                                  void *opaque, oq_error_t *err);

/** One audit row of a call's unknown story; pointers valid only during the callback. */
typedef struct oq__call_event {
    const char *call_id, *event;
    int64_t ts;
} oq__call_event_t;

/**
 * @brief Call \p cb for the audit rows 'unknown', 'needs_review', 'committed' and
 *        'failed_final' of every call whose execution went UNKNOWN at least once
 *        (executions.unknown_at set: it is never cleared), grouped by call and in id order
 *        within a call (autocommit; scans the audit). What the per-call reconciliation
 *        figures are computed from (oq__consumer_call_stats).
 */
int oq__consumer_store_unknown_story(oq__consumer_store_t *s,
                                     void (*cb)(const oq__call_event_t *row, void *opaque),
                                     void *opaque, oq_error_t *err);

/** @brief Number of effects of \p call_id (NULL: all effects), or a negative OQ_E* code. */
int64_t oq__consumer_store_effect_count(oq__consumer_store_t *s, const char *call_id);

/** @brief Append \p a to the audit. */
int oq__consumer_store_audit_add(oq__consumer_store_t *s, const oq__audit_row_t *a,
                                 oq_error_t *err);

/** @brief Append \p row (a result event) to the outbox, through oq_outbox_append.
 *  @returns 0, OQ_EEXIST (nothing written) when its message id is there already, or OQ_E*. */
int oq__consumer_store_outbox_append(oq__consumer_store_t *s, const oq_outbox_row_t *row,
                                     oq_error_t *err);

/** @brief Publish the result event \p row again under its message id, through
 *  oq_outbox_republish (*what: appended, requeued, or still pending: nothing written). */
int oq__consumer_store_outbox_republish(oq__consumer_store_t *s, const oq_outbox_row_t *row,
                                        oq_outbox_republish_t *what, oq_error_t *err);

/** @brief Insert the dead letter \p r (original bytes and reason), unpublished. */
int oq__consumer_store_dlq_insert(oq__consumer_store_t *s, const oq__dlq_row_t *r, oq_error_t *err);

/** @brief Call \p cb for up to \p limit unpublished dead letters, in id order (autocommit). */
int oq__consumer_store_dlq_pending(oq__consumer_store_t *s, int limit,
                                   void (*cb)(const oq__dlq_row_t *row, void *opaque), void *opaque,
                                   oq_error_t *err);

/** @brief Mark dead letter \p id published at \p now (autocommit). */
int oq__consumer_store_dlq_mark(oq__consumer_store_t *s, int64_t id, int64_t now, oq_error_t *err);

/** @brief Execution counts by state, indexed by oq__xstate_t (autocommit; scans the table). */
int oq__consumer_store_state_counts(oq__consumer_store_t *s, int64_t counts[OQ_X__COUNT],
                                    oq_error_t *err);

/**
 * @brief Retention (autocommit): delete up to \p limit inbox rows received before \p before and
 *        up to \p limit published dead letters created before it. Executions, effects and audit
 *        are kept (the effects table stays the last gate for late redeliveries).
 * @param n_deleted receives the number of rows deleted (may be NULL).
 */
int oq__consumer_store_purge(oq__consumer_store_t *s, int64_t before, int limit, int64_t *n_deleted,
                             oq_error_t *err);

/* --- retention of settled executions (the rule: oq__exec_purge in consumer/execution.c) ------ */

/** One batch of a purge pass: rows after \p after up to \p upto (rowid / audit id) older than
 *  \p before, at most \p limit; \p horizon is raised first (executions only). */
typedef struct oq__purge_batch {
    int64_t after, upto, before, horizon;
    int limit;
} oq__purge_batch_t;

/** @brief Autocommit: delete up to \p limit result events the relay delivered, created before
 *  \p before (oq_outbox_purge_published; a re-emit appends a new row when it is gone). */
int oq__consumer_store_purge_outbox(oq__consumer_store_t *s, int64_t before, int limit,
                                    int64_t *n_deleted, oq_error_t *err);

/** @brief The retention horizon (0: nothing was ever purged). Any transaction. */
int oq__consumer_store_horizon(oq__consumer_store_t *s, int64_t *horizon, oq_error_t *err);

/** @brief The last execution rowid and audit id written before \p before (the end of a pass's
 *  scan; rows are appended in time order). Autocommit. */
int oq__consumer_store_purge_bounds(oq__consumer_store_t *s, int64_t before, int64_t *max_rowid,
                                    int64_t *max_audit_id, oq_error_t *err);

/**
 * @brief In tx: raise the horizon to \p b->horizon, then delete up to \p b->limit settled
 *        executions (COMMITTED, FAILED_FINAL) last written before \p b->before, in rowid order
 *        within (after, upto], with their effects. @param last the last rowid deleted (the next
 *        batch's \p after); \p n_exec < limit means the pass is done.
 */
int oq__consumer_store_purge_settled(oq__consumer_store_t *s, const oq__purge_batch_t *b,
                                     int64_t *last, int64_t *n_exec, int64_t *n_eff,
                                     oq_error_t *err);

/** @brief In tx: delete up to \p b->limit audit rows in (after, upto] older than \p b->before
 *  whose execution is gone (or that name no call). */
int oq__consumer_store_purge_audit(oq__consumer_store_t *s, const oq__purge_batch_t *b,
                                   int64_t *last, int64_t *n_deleted, oq_error_t *err);

#endif
