/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file producer_store.h
 * @brief Internal: every SQL statement of the producer (producer/store.c) as row operations on
 *        plain structs, so another backend can sit beside it. No rules here: which operation
 *        runs when (new, replay, conflict, retry-reset; applied, stale, ignored) is decided in
 *        producer/decide.c. Not part of the public API.
 *
 * A store borrows a connection and, optionally, that connection's statement cache: the
 * writer's, a reader's, or a service's own connection in oq_producer_submit_in_tx(). Write
 * operations run inside the caller's open write transaction and commit nothing; only
 * oq__producer_store_purge_batch() and oq__producer_store_counts() open transactions of their
 * own. Every function returns 0 or a negative OQ_E* code (OQ_EBUSY is retriable) with \p err
 * filled, and changes nothing it did not report.
 *
 * @locality the thread that owns the borrowed connection (one at a time).
 */
#ifndef OQ_PRODUCER_STORE_H
#define OQ_PRODUCER_STORE_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "oq_db.h"
#include "oq_dbh.h"
#include "oq_envelope.h"
#include "oq_error.h"
#include "oq_producer.h"
#include "oq_util.h"

struct pg_conn; /* libpq's PGconn */

/** A borrowed connection. Build it on the stack: {db, cache} or {db, NULL} for SQLite,
 *  {NULL, NULL, pg} for PostgreSQL. */
typedef struct oq__producer_store {
    sqlite3 *db;            /**< borrowed */
    oq_stmt_cache_t *cache; /**< borrowed statement cache of db; NULL = prepare per call */
    struct pg_conn *pg;     /**< borrowed; set: every operation runs on PostgreSQL (store_pg.c) */
} oq__producer_store_t;

/** The store of an operator's handle (oq_dbh.h): its connection, borrowed, no statement cache. */
static inline oq__producer_store_t oq__producer_store_of(const oq_dbh_t *h)
{
    oq__producer_store_t s = {h->db, NULL, (struct pg_conn *)h->pg};
    return s;
}

/** Non-zero when the borrowed connection has a transaction open. */
int oq__producer_store_in_tx(oq__producer_store_t *s);

/** Open the write transaction of a batch (SQLite: BEGIN IMMEDIATE, waiting up to \p wait_ms
 *  for the lock; PostgreSQL: BEGIN, reconnecting first when the connection was lost). */
int oq__producer_store_begin(oq__producer_store_t *s, int wait_ms, oq_error_t *err);
/** Commit it (durable on return: synchronous commit on both backends). */
int oq__producer_store_commit(oq__producer_store_t *s, oq_error_t *err);
/** Roll it back (also after a failed statement); never fails. */
void oq__producer_store_rollback(oq__producer_store_t *s);

/* --- calls ----------------------------------------------------------------------------------- */

/** A new call in state `pending`, attempt 1, and the outbox row of that attempt. Borrowed. */
typedef struct oq__producer_new_call {
    const char *call_id;
    const char *tenant;
    const char *idem_key;
    const char *fingerprint;
    const char *tool;
    const char *args; /**< canonical JSON text, \p args_len bytes */
    size_t args_len;
    const char *client_id; /**< NULL when not given */
    int64_t seq;
    int has_seq;
    int64_t created_at; /**< also updated_at */
    int64_t expires_at;
    const char *message_id; /**< the outbox row: key = call_id, topic onceq.tool-calls;
                                 also kept in calls.message_id for a redrive */
    const char *payload;    /**< its tool_call envelope */
    size_t payload_len;
    const char *callback_url; /**< NULL: no webhook */
} oq__producer_new_call_t;

/** What an insert did. */
typedef enum {
    OQ__INSERT_NEW = 1,        /**< call and outbox row written */
    OQ__INSERT_KEY_EXISTS = 2, /**< (tenant, idem_key) already has a call: nothing written */
    OQ__INSERT_ID_TAKEN = 3    /**< call_id already used by another call: nothing written, the
                                    transaction is intact (draw another id and retry) */
} oq__producer_insert_t;

/**
 * Insert \p c and, when the key is new, its outbox row (through oq_outbox_append). A new key
 * costs one probe of the key index (INSERT ... ON CONFLICT DO NOTHING), no SELECT first.
 */
int oq__producer_store_insert_call(oq__producer_store_t *s, const oq__producer_new_call_t *c,
                                   oq__producer_insert_t *result, oq_error_t *err);

/**
 * Ahead of a batch's decisions: insert the \p n new calls \p rows (and their outbox rows) in
 * one statement, skipping a row whose key or call id exists. The calls written are remembered
 * until the transaction ends, and oq__producer_store_insert_call() of the same row (call id and
 * message id) then answers OQ__INSERT_NEW without running anything; any other row takes its
 * usual path. PostgreSQL only (a batch costs one round trip instead of one per submit); on
 * SQLite, where a statement costs no round trip, nothing.
 */
int oq__producer_store_insert_calls(oq__producer_store_t *s, const oq__producer_new_call_t *rows,
                                    int n, oq_error_t *err);

/** The call \p call_id into \p out (owned by \p out). @returns 0 or OQ_ENOTFOUND. */
int oq__producer_store_get(oq__producer_store_t *s, const char *call_id, oq_call_t *out,
                           oq_error_t *err);

/** The call of (\p tenant, \p idem_key); \p tenant NULL or "" = "default". 0 / OQ_ENOTFOUND. */
int oq__producer_store_get_by_key(oq__producer_store_t *s, const char *tenant, const char *idem_key,
                                  oq_call_t *out, oq_error_t *err);

/** A new attempt of a `failed` call and the outbox row of that attempt. Borrowed. */
typedef struct oq__producer_attempt {
    const char *call_id;
    int64_t attempt; /**< the new attempt: the stored one + 1 */
    int64_t updated_at;
    int64_t expires_at;
    const char *message_id;
    const char *payload; /**< its tool_call envelope */
    size_t payload_len;
} oq__producer_attempt_t;

/**
 * Back to `pending` with attempt \p a->attempt, result and error cleared, the new message id
 * kept and the redrive count reset (never looked at), and the outbox row appended. @returns 0, or
 * OQ_ESTATE (nothing written) when the call is not `failed` at attempt \p a->attempt - 1.
 */
int oq__producer_store_reset_call(oq__producer_store_t *s, const oq__producer_attempt_t *a,
                                  oq_error_t *err);

/** Delete the call \p call_id with its audit and result_inbox rows (a key past retention). */
int oq__producer_store_delete_call(oq__producer_store_t *s, const char *call_id, oq_error_t *err);

/* --- results --------------------------------------------------------------------------------- */

/** Of a call, what a result decision needs. */
typedef struct oq__producer_call_state {
    char state[sizeof(((oq_call_t *)0)->state)];
    int64_t attempt;
    int has_callback; /**< calls.callback_url is set: a settling result writes a delivery */
} oq__producer_call_state_t;

/** The state and attempt of \p call_id; \p found = 0 (and \p out untouched) when none. */
int oq__producer_store_get_state(oq__producer_store_t *s, const char *call_id,
                                 oq__producer_call_state_t *out, int *found, oq_error_t *err);

/**
 * Ahead of the decisions on the \p n tool_result envelopes \p envs in this transaction: a
 * backend where a statement costs a round trip (PostgreSQL) reads what they need in one
 * statement and queues what they write (result_inbox, calls, audit rows), written in one
 * statement before any other statement runs and before the commit. The answers of
 * oq__producer_store_get_state(), _claim_result(), _set_result() and _audit_add() are the same
 * as without it. On SQLite, nothing.
 */
int oq__producer_store_results_ahead(oq__producer_store_t *s, const oq_envelope_t *envs, int n,
                                     oq_error_t *err);

/** The decisions of oq__producer_store_results_ahead() are made: what they queued is written,
 *  what was read ahead is forgotten. */
int oq__producer_store_results_done(oq__producer_store_t *s, oq_error_t *err);

/** One result_inbox row: a tool_result message and what was decided for it. Borrowed. */
typedef struct oq__producer_inbox_row {
    const char *message_id;
    const char *call_id;
    const char *status;
    const char *outcome; /**< oq_result_outcome_name() */
    int64_t received_at;
} oq__producer_inbox_row_t;

/** Insert \p r unless its message id is there already: then \p claimed = 0, nothing written. */
int oq__producer_store_claim_result(oq__producer_store_t *s, const oq__producer_inbox_row_t *r,
                                    int *claimed, oq_error_t *err);

/** A result applied to a call. Borrowed. */
typedef struct oq__producer_result {
    const char *call_id;
    const char *state;     /**< the new state */
    const char *result;    /**< JSON text or NULL */
    const char *error;     /**< JSON text or NULL */
    const char *effect_id; /**< NULL keeps the stored one */
    int64_t updated_at;
    int settled;        /**< non-zero: the call is terminal, its redrive schedule ends */
    int64_t expires_at; /**< the key's new expiry (the call settled: succeeded or failed);
                             0 keeps the stored one */
} oq__producer_result_t;

/** Set the call's state, result, error and effect_id. */
int oq__producer_store_set_result(oq__producer_store_t *s, const oq__producer_result_t *r,
                                  oq_error_t *err);

/* --- dead letters (outbox_dead, written by the relay) ----------------------------------------- */

/** An outbox row the relay set aside and nobody acted on yet. Strings owned (free with
 *  oq__producer_dead_free). */
typedef struct oq__producer_dead {
    int64_t seq;
    char *message_id;
    char *topic;
    char *key;       /**< the call id, for a tool_call */
    char *kind;      /**< the envelope's "kind", NULL when the payload is not a JSON envelope */
    int64_t attempt; /**< the envelope's "attempt", 0 when absent */
    char *reason;    /**< librdkafka error name */
    char *detail;    /**< may be NULL */
} oq__producer_dead_t;

/** Up to \p max unhandled dead letters in seq order (0 rows is fine). The envelope fields are
 *  read with SQLite's JSON functions: the payload itself (up to the size Kafka refused) is
 *  never copied out. */
int oq__producer_store_dead_list(oq__producer_store_t *s, int max, oq__producer_dead_t **rows,
                                 size_t *n, oq_error_t *err);
void oq__producer_dead_free(oq__producer_dead_t *rows, size_t n);

/** Set handled_at of dead letter \p seq (in the caller's transaction). */
int oq__producer_store_dead_handled(oq__producer_store_t *s, int64_t seq, int64_t now_ms,
                                    oq_error_t *err);

/** Are there unhandled dead letters? A cheap probe of a partial index, in or outside a
 *  transaction. */
int oq__producer_store_dead_any(oq__producer_store_t *s, int *any, oq_error_t *err);
/* --- redrive -------------------------------------------------------------------------------- */

/** A call due for a redrive, as read. Strings owned; free with oq__producer_redrive_row_clear. */
typedef struct oq__producer_redrive_row {
    char call_id[OQ_CALL_ID_LEN + 1];
    char fingerprint[OQ_FINGERPRINT_LEN + 1];
    char message_id[OQ_UUID_LEN + 1]; /**< "" when the call has none stored */
    char state[sizeof(((oq_call_t *)0)->state)];
    char *tenant, *idem_key, *tool;
    char *args; /**< canonical JSON text */
    int64_t attempt, redrive_count;
    int64_t created_at, updated_at, next_redrive_at;
} oq__producer_redrive_row_t;

void oq__producer_redrive_row_clear(oq__producer_redrive_row_t *r);

/**
 * Up to \p cap calls due for a look, into \p rows (*n of them; clear each): first those looked
 * at before whose next_redrive_at is at or before \p now, earliest first; then open calls never
 * looked at whose last change (updated_at) is at or before \p unchanged_since, oldest first.
 * Each comes from its partial index (calls_redrive, calls_unheard), so the work is bounded
 * by \p cap whatever the table holds.
 */
int oq__producer_store_redrive_due(oq__producer_store_t *s, int64_t now, int64_t unchanged_since,
                                   int cap, oq__producer_redrive_row_t *rows, int *n,
                                   oq_error_t *err);

/** A call's new redrive schedule. Borrowed. */
typedef struct oq__producer_redrive_mark {
    const char *call_id;
    int64_t redrive_count;
    int64_t next_redrive_at; /**< 0 = none (NULL) */
    const char *message_id;  /**< stored when the call had none; NULL keeps the stored one */
} oq__producer_redrive_mark_t;

/** Store \p m on its call (updated_at is left alone: a redrive is not a state change). */
int oq__producer_store_redrive_mark(oq__producer_store_t *s, const oq__producer_redrive_mark_t *m,
                                    oq_error_t *err);

/**
 * Publish the tool_call \p message_id of \p call_id once more (oq_outbox_republish): its
 * outbox row is moved to the tail when delivered, left alone when not yet, and \p payload
 * appended when retention deleted it.
 */
int oq__producer_store_republish(oq__producer_store_t *s, const char *message_id,
                                 const char *call_id, const char *payload, size_t payload_len,
                                 int64_t now, oq_outbox_republish_t *what, oq_error_t *err);

/* --- webhook deliveries (schema/producer/0005_webhooks.sql) --------------------------------- */

/** One delivery row. Read: strings owned (oq__producer_delivery_clear); written: borrowed. */
typedef struct oq__producer_delivery {
    char delivery_id[OQ_UUID_LEN + 1];
    char call_id[OQ_CALL_ID_LEN + 1];
    char state[12]; /**< pending | delivered | dead */
    int64_t attempt;
    char *tenant, *url, *body;
    char *last_error;    /**< NULL when none */
    int64_t last_status; /**< -1 when no answer */
    int64_t tries, next_at, created_at, updated_at;
} oq__producer_delivery_t;

void oq__producer_delivery_clear(oq__producer_delivery_t *d);

/** Insert \p d as `pending`, due at d->next_at, unless the call's attempt has one already. */
int oq__producer_store_delivery_add(oq__producer_store_t *s, const oq__producer_delivery_t *d,
                                    oq_error_t *err);

/** Up to \p cap pending deliveries due at \p now (next_at <= now), earliest first, from the
 *  partial index webhook_due (clear each). */
int oq__producer_store_delivery_due(oq__producer_store_t *s, int64_t now, int cap,
                                    oq__producer_delivery_t *rows, int *n, oq_error_t *err);

/** The outcome of a try, as decide.c ruled it. Borrowed. */
typedef struct oq__producer_delivery_mark {
    const char *delivery_id;
    const char *state;      /**< pending (another try at next_at) | delivered | dead */
    int64_t tries;          /**< tries made so far */
    int64_t next_at;        /**< pending: when; else 0 (NULL) */
    int64_t last_status;    /**< -1: no answer (NULL) */
    const char *last_error; /**< may be NULL */
    int64_t updated_at;
} oq__producer_delivery_mark_t;

/** Store \p m on its delivery if that is still `pending` (\p changed: 1 or 0; may be NULL). */
int oq__producer_store_delivery_mark(oq__producer_store_t *s, const oq__producer_delivery_mark_t *m,
                                     int *changed, oq_error_t *err);

/** Deliveries for the operator: \p id set: that one (any state); else up to \p limit in
 *  \p state ("dead": oldest death first). */
int oq__producer_store_delivery_list(oq__producer_store_t *s, const char *id, const char *state,
                                     int limit, oq__producer_delivery_t **rows, size_t *n,
                                     oq_error_t *err);

/** The deliveries of \p call_id (every attempt, any state), by attempt. */
int oq__producer_store_delivery_of_call(oq__producer_store_t *s, const char *call_id,
                                        oq__producer_delivery_t **rows, size_t *n, oq_error_t *err);

/** A dead delivery back to `pending` with a fresh budget: tries 0, its age counted from \p now
 *  (created_at), due at \p now (\p changed: 1, or 0 when it is not dead). */
int oq__producer_store_delivery_redrive(oq__producer_store_t *s, const char *id, int64_t now,
                                        int *changed, oq_error_t *err);

/** Pending deliveries, the creation time of the oldest (0: none), and dead ones. */
int oq__producer_store_delivery_counts(oq__producer_store_t *s, int64_t *pending,
                                       int64_t *oldest_created_at, int64_t *dead, oq_error_t *err);

/* --- audit ----------------------------------------------------------------------------------- */

/** Append an audit row (\p detail: JSON text or NULL). */
int oq__producer_store_audit_add(oq__producer_store_t *s, int64_t ts, const char *call_id,
                                 const char *event, const char *detail, oq_error_t *err);

/** The audit rows of \p call_id in order (oq_audit_free them); 0 also with no rows. */
int oq__producer_store_audit_list(oq__producer_store_t *s, const char *call_id,
                                  oq_audit_row_t **rows, size_t *n, oq_error_t *err);

/* --- retention and stats --------------------------------------------------------------------- */

/**
 * One purge batch in its own short BEGIN IMMEDIATE transaction: up to \p batch terminal calls
 * with expires_at <= \p now_ms and their audit and result_inbox rows; delivered outbox rows
 * created at or before now_ms - ttl_ms (oq_outbox_purge_published) among the \p batch oldest;
 * result_inbox rows of unknown calls received at or before now_ms - ttl_ms, up to \p batch;
 * handled dead letters (outbox_dead) set aside at or before now_ms - ttl_ms, up to \p batch.
 * @param stats accumulates what was deleted (and +1 batch). @param more set when a limit was
 *        reached (another batch may find more).
 */
int oq__producer_store_purge_batch(oq__producer_store_t *s, int64_t now_ms, int64_t ttl_ms,
                                   int batch, oq_purge_stats_t *stats, int *more, oq_error_t *err);

/** Row counts for the stats, read in one snapshot (a read transaction of its own). With
 *  OQ__COUNTS_GAUGES only what the /metrics gauges show is read (calls by status, the pending
 *  outbox rows, the oldest pending call): effects and result_inbox stay 0, and no statement
 *  reads a whole table or index beyond the calls' counts (a scrape of a large calls.db). */
typedef struct oq__producer_counts {
    int64_t calls;
    int64_t pending, running, succeeded, failed, needs_review;
    int64_t effects; /**< distinct effect ids reported */
    int64_t outbox_pending, outbox_rows, result_inbox;
    int64_t oldest_pending_created_at; /**< 0 when no call is pending */
} oq__producer_counts_t;

typedef enum { OQ__COUNTS_ALL = 0, OQ__COUNTS_GAUGES = 1 } oq__counts_what_t;

int oq__producer_store_counts(oq__producer_store_t *s, oq__counts_what_t what,
                              oq__producer_counts_t *out, oq_error_t *err);

/* --- the operators' list of calls (onceq console, through oq_store_list) ---------------------- */

/** A page's filters: NULL / 0 = any. Rows with before > rowid >= floor (0 = no bound). */
typedef struct oq__producer_list_q {
    const char *state, *tool, *tenant;
    int64_t since_ms, until_ms; /**< created_at bounds, inclusive */
    int64_t before, floor;
    int limit; /**< 1.. */
} oq__producer_list_q_t;

/** One listed call and its position (rowid: insertion order). */
typedef struct oq__producer_listed {
    int64_t pos;
    oq_call_t call;
} oq__producer_listed_t;

/** Newest first, at most q->limit; \p next: the `before` of the next page (0: no more).
 *  Positions: SQLite's rowid; on PostgreSQL the call id's first 60 bits (its 48-bit creation
 *  millisecond and 12 random bits, see store_pg.c), so a page walks the primary key. */
int oq__producer_store_list(oq__producer_store_t *s, const oq__producer_list_q_t *q,
                            oq__producer_listed_t **out, size_t *n, int64_t *next, oq_error_t *err);
void oq__producer_listed_free(oq__producer_listed_t *v, size_t n);
/** The first position whose call was created at or after \p t. */
int oq__producer_store_pos_at(oq__producer_store_t *s, int64_t t, int64_t *pos, oq_error_t *err);
/** The smallest tenant after \p after, or "" (through the (tenant, idem_key) index). */
int oq__producer_store_next_tenant(oq__producer_store_t *s, const char *after,
                                   char out[OQ_MAX_NAME_LEN + 1], oq_error_t *err);

/* --- PostgreSQL (producer/store_pg.c) -------------------------------------------------------- */

/* The same operations on schema `onceq`, with the same contracts; store.c hands an operation
 * to its twin here when the store has a PostgreSQL connection (s->pg). Differences: leases and
 * the outbox's delivery mark are per row (see store_pg.c), and a unique violation aborts a
 * PostgreSQL transaction, so the inserts avoid raising one (ON CONFLICT DO NOTHING). */
int oq__producer_pg_in_tx(oq__producer_store_t *s);
int oq__producer_pg_begin(oq__producer_store_t *s, oq_error_t *err);
int oq__producer_pg_commit(oq__producer_store_t *s, oq_error_t *err);
void oq__producer_pg_rollback(oq__producer_store_t *s);
int oq__producer_pg_insert_call(oq__producer_store_t *s, const oq__producer_new_call_t *c,
                                oq__producer_insert_t *result, oq_error_t *err);
int oq__producer_pg_insert_calls(oq__producer_store_t *s, const oq__producer_new_call_t *rows,
                                 int n, oq_error_t *err);
int oq__producer_pg_results_ahead(oq__producer_store_t *s, const oq_envelope_t *envs, int n,
                                  oq_error_t *err);
int oq__producer_pg_results_done(oq__producer_store_t *s, oq_error_t *err);
int oq__producer_pg_get(oq__producer_store_t *s, const char *call_id, oq_call_t *out,
                        oq_error_t *err);
int oq__producer_pg_get_by_key(oq__producer_store_t *s, const char *tenant, const char *idem_key,
                               oq_call_t *out, oq_error_t *err);
int oq__producer_pg_reset_call(oq__producer_store_t *s, const oq__producer_attempt_t *a,
                               oq_error_t *err);
int oq__producer_pg_delete_call(oq__producer_store_t *s, const char *call_id, oq_error_t *err);
int oq__producer_pg_get_state(oq__producer_store_t *s, const char *call_id,
                              oq__producer_call_state_t *out, int *found, oq_error_t *err);
int oq__producer_pg_claim_result(oq__producer_store_t *s, const oq__producer_inbox_row_t *r,
                                 int *claimed, oq_error_t *err);
int oq__producer_pg_set_result(oq__producer_store_t *s, const oq__producer_result_t *r,
                               oq_error_t *err);
int oq__producer_pg_dead_list(oq__producer_store_t *s, int max, oq__producer_dead_t **rows,
                              size_t *n, oq_error_t *err);
int oq__producer_pg_dead_handled(oq__producer_store_t *s, int64_t seq, int64_t now_ms,
                                 oq_error_t *err);
int oq__producer_pg_dead_any(oq__producer_store_t *s, int *any, oq_error_t *err);
int oq__producer_pg_redrive_due(oq__producer_store_t *s, int64_t now, int64_t unchanged_since,
                                int cap, oq__producer_redrive_row_t *rows, int *n, oq_error_t *err);
int oq__producer_pg_redrive_mark(oq__producer_store_t *s, const oq__producer_redrive_mark_t *m,
                                 oq_error_t *err);
int oq__producer_pg_republish(oq__producer_store_t *s, const char *message_id, const char *call_id,
                              const char *payload, size_t payload_len, int64_t now,
                              oq_outbox_republish_t *what, oq_error_t *err);
int oq__producer_pg_audit_add(oq__producer_store_t *s, int64_t ts, const char *call_id,
                              const char *event, const char *detail, oq_error_t *err);
int oq__producer_pg_audit_list(oq__producer_store_t *s, const char *call_id, oq_audit_row_t **rows,
                               size_t *n, oq_error_t *err);
int oq__producer_pg_purge_batch(oq__producer_store_t *s, int64_t now_ms, int64_t ttl_ms, int batch,
                                oq_purge_stats_t *stats, int *more, oq_error_t *err);
int oq__producer_pg_counts(oq__producer_store_t *s, oq__counts_what_t what,
                           oq__producer_counts_t *out, oq_error_t *err);
int oq__producer_pg_delivery_add(oq__producer_store_t *s, const oq__producer_delivery_t *d,
                                 oq_error_t *err);
int oq__producer_pg_delivery_due(oq__producer_store_t *s, int64_t now, int cap,
                                 oq__producer_delivery_t *rows, int *n, oq_error_t *err);
int oq__producer_pg_delivery_mark(oq__producer_store_t *s, const oq__producer_delivery_mark_t *m,
                                  int *changed, oq_error_t *err);
int oq__producer_pg_delivery_of_call(oq__producer_store_t *s, const char *call_id,
                                     oq__producer_delivery_t **rows, size_t *n, oq_error_t *err);
int oq__producer_pg_delivery_list(oq__producer_store_t *s, const char *id, const char *state,
                                  int limit, oq__producer_delivery_t **rows, size_t *n,
                                  oq_error_t *err);
int oq__producer_pg_delivery_redrive(oq__producer_store_t *s, const char *id, int64_t now,
                                     int *changed, oq_error_t *err);
int oq__producer_pg_delivery_counts(oq__producer_store_t *s, int64_t *pending,
                                    int64_t *oldest_created_at, int64_t *dead, oq_error_t *err);
int oq__producer_pg_list(oq__producer_store_t *s, const oq__producer_list_q_t *q,
                         oq__producer_listed_t **out, size_t *n, int64_t *next, oq_error_t *err);
int oq__producer_pg_pos_at(oq__producer_store_t *s, int64_t t, int64_t *pos, oq_error_t *err);
int oq__producer_pg_next_tenant(oq__producer_store_t *s, const char *after,
                                char out[OQ_MAX_NAME_LEN + 1], oq_error_t *err);

/* --- tasks (producer/tasks.c decides; both backends) ------------------------------------------ */

#define OQ_TASK_ID_LEN 34 /**< "t_" + 32 lowercase hex */

/** A task row. Strings owned (oq__task_row_clear). */
typedef struct oq__task_row {
    char task_id[OQ_TASK_ID_LEN + 1];
    char *tenant, *idem_key;
    char fingerprint[OQ_FINGERPRINT_LEN + 1];
    char *spec; /**< the canonical request */
    char status[24];
    char *reason; /**< NULL when none */
    int64_t created_at, updated_at;
    int64_t review_fence; /**< the operator's episode: moves on entering awaiting_approval or
                               needs_review (schema/producer/0007_task_review.sql) */
} oq__task_row_t;

void oq__task_row_clear(oq__task_row_t *t);

/** A task_steps row and, read with it, the durable state of its two calls. Strings owned
 *  (oq__task_steps_free). The call fields are "" / NULL when the call is not written. */
typedef struct oq__task_step_row {
    int idx;
    char *name;
    char status[16];
    char call_id[OQ_CALL_ID_LEN + 1];
    char comp_call_id[OQ_CALL_ID_LEN + 1];
    int64_t comp_attempts;
    int64_t comp_next_at; /**< 0 = none */
    /* read only: calls.state / result / error of the step's call and the compensation's */
    char call_state[16], comp_state[16];
    char *result, *error, *comp_result, *comp_error;
    int64_t call_attempt, comp_attempt;
} oq__task_step_row_t;

void oq__task_steps_free(oq__task_step_row_t *v, size_t n);

/** Insert \p t (its steps go with oq__task_store_step_put); \p exists = 1 and nothing written
 *  when (tenant, idem_key) has a task already. */
int oq__task_store_insert(oq__producer_store_t *s, const oq__task_row_t *t, int *exists,
                          oq_error_t *err);
/** The task \p task_id, or of (\p tenant, \p idem_key) when \p task_id is NULL. OQ_ENOTFOUND. */
int oq__task_store_get(oq__producer_store_t *s, const char *task_id, const char *tenant,
                       const char *idem_key, oq__task_row_t *out, oq_error_t *err);
/** Set status, reason and updated_at of \p t->task_id. */
int oq__task_store_update(oq__producer_store_t *s, const oq__task_row_t *t, oq_error_t *err);
/** Insert or replace the progress columns of one step (the read-only fields are ignored). */
int oq__task_store_step_put(oq__producer_store_t *s, const char *task_id,
                            const oq__task_step_row_t *r, oq_error_t *err);
/** The steps of \p task_id in order, with their calls' state (*v owned, *n of them). */
int oq__task_store_steps(oq__producer_store_t *s, const char *task_id, oq__task_step_row_t **v,
                         size_t *n, oq_error_t *err);
/** Map \p call_id to (\p task_id, \p idx, \p role: "step" or "compensate"). */
int oq__task_store_link(oq__producer_store_t *s, const char *call_id, const char *task_id, int idx,
                        const char *role, oq_error_t *err);
/** The task step of \p call_id; \p found = 0 when the call belongs to no task. */
int oq__task_store_of_call(oq__producer_store_t *s, const char *call_id,
                           char task_id[OQ_TASK_ID_LEN + 1], int *idx, int *is_comp, int *found,
                           oq_error_t *err);
/** Up to \p cap (task_id, idx) whose compensation retry is due at \p now (comp_next_at). */
int oq__task_store_due(oq__producer_store_t *s, int64_t now, int cap,
                       char (*task_ids)[OQ_TASK_ID_LEN + 1], int *idx, int *n, oq_error_t *err);
/** The task statuses, in the order of oq__task_store_counts' \p by. */
#define OQ_TASK_NSTATUS 7
extern const char *const oq__task_statuses[OQ_TASK_NSTATUS];
/** Tasks by status (\p by: running, succeeded, compensating, compensated, failed,
 *  needs_review, awaiting_approval), and the steps whose compensation ended well (\p comp_ok:
 *  `compensated`) or not (\p comp_review: `needs_review` with a compensation written); \p
 *  tenant's only, or every tenant's when NULL. Its own read snapshot. */
int oq__task_store_counts(oq__producer_store_t *s, const char *tenant, int64_t by[OQ_TASK_NSTATUS],
                          int64_t *comp_ok, int64_t *comp_review, oq_error_t *err);
/** A page of the tasks list: every filter optional (NULL / 0). */
typedef struct oq__task_list_q {
    const char *status, *tenant, *idem_key;
    int64_t before; /**< a page's \p next: older tasks than this position; 0: the newest */
    int limit;      /**< <= 0: 100 */
} oq__task_list_q_t;
/** Task ids newest first, at most \p q->limit (*ids owned: free each); \p next the position
 *  to pass as `before` for the next page, 0 when there is none. */
int oq__task_store_list(oq__producer_store_t *s, const oq__task_list_q_t *q, char ***ids, size_t *n,
                        int64_t *next, oq_error_t *err);
/** Tasks that needed an operator's recovery (\p operator: in needs_review now, or settled by
 *  an operator's decision other than approve / reject) and steps that were run again (\p rerun:
 *  a step with more than one call in task_calls: must stay 0). */
int oq__task_store_recovery(oq__producer_store_t *s, int64_t *operator_, int64_t *rerun,
                            oq_error_t *err);

/* The same on PostgreSQL (producer/store_pg.c, schema/postgres/0006_tasks.sql). */
int oq__producer_pg_task_insert(oq__producer_store_t *s, const oq__task_row_t *t, int *exists,
                                oq_error_t *err);
int oq__producer_pg_task_get(oq__producer_store_t *s, const char *task_id, const char *tenant,
                             const char *idem_key, oq__task_row_t *out, oq_error_t *err);
int oq__producer_pg_task_update(oq__producer_store_t *s, const oq__task_row_t *t, oq_error_t *err);
int oq__producer_pg_task_step_put(oq__producer_store_t *s, const char *task_id,
                                  const oq__task_step_row_t *r, oq_error_t *err);
int oq__producer_pg_task_steps(oq__producer_store_t *s, const char *task_id,
                               oq__task_step_row_t **v, size_t *n, oq_error_t *err);
int oq__producer_pg_task_link(oq__producer_store_t *s, const char *call_id, const char *task_id,
                              int idx, const char *role, oq_error_t *err);
int oq__producer_pg_task_of_call(oq__producer_store_t *s, const char *call_id,
                                 char task_id[OQ_TASK_ID_LEN + 1], int *idx, int *is_comp,
                                 int *found, oq_error_t *err);
int oq__producer_pg_task_due(oq__producer_store_t *s, int64_t now, int cap,
                             char (*task_ids)[OQ_TASK_ID_LEN + 1], int *idx, int *n,
                             oq_error_t *err);
int oq__producer_pg_task_list(oq__producer_store_t *s, const oq__task_list_q_t *q, char ***ids,
                              size_t *n, int64_t *next, oq_error_t *err);
int oq__producer_pg_task_recovery(oq__producer_store_t *s, int64_t *operator_, int64_t *rerun,
                                  oq_error_t *err);
int oq__producer_pg_task_counts(oq__producer_store_t *s, const char *tenant,
                                int64_t by[OQ_TASK_NSTATUS], int64_t *comp_ok, int64_t *comp_review,
                                oq_error_t *err);
/** Forget the task links read for the last batch of results (a new batch is read ahead). */
void oq__producer_pg_task_forget(void);

#endif
