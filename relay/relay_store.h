/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file relay_store.h
 * @brief Internal: every SQL statement of the relay (relay/store.c), behind a small interface
 *        so another backend can sit beside it. Not part of the public API.
 *
 * @locality one store per relay thread; the connection is not shared.
 */
#ifndef OQ_RELAY_STORE_H
#define OQ_RELAY_STORE_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "oq_ckpt.h"
#include "oq_dbh.h"
#include "oq_error.h"

typedef struct oq__relay_store oq__relay_store_t;

/** One outbox row as read by the relay; every pointer is valid only during the callback. */
typedef struct oq__relay_row {
    int64_t seq;
    int64_t created_at;
    const char *message_id;
    const char *topic;
    const char *key;
    size_t key_len;
    const void *payload;
    size_t payload_len;
} oq__relay_row_t;

/** Row callback: return 0 to continue, non-zero to stop reading (that row is not consumed). */
typedef int (*oq__relay_row_cb)(void *ctx, const oq__relay_row_t *row);

/** Open \p path (WAL, \p synchronous), check that outbox, relay_lease (with its watermark) and
 *  outbox_dead exist: the relay never migrates, the producer or consumer does. */
int oq__relay_store_open(const char *path, const char *synchronous, oq__relay_store_t **out,
                         oq_error_t *err);
void oq__relay_store_close(oq__relay_store_t *s);
/** @brief Attach the store's SQLite connection to \p ck (oq_ckpt.h): its commits never
 *         checkpoint. No-op on PostgreSQL. \p ck must outlive the store. */
void oq__relay_store_attach(oq__relay_store_t *s, oq_ckpt_t *ck);

/** PRAGMA data_version: changes when another connection commits. */
int oq__relay_store_data_version(oq__relay_store_t *s, int64_t *out, oq_error_t *err);
/** The socket on which another connection's commits are announced, for poll(POLLIN) while idle
 *  (PostgreSQL: the LISTEN connection's; readable when a NOTIFY arrives, then
 *  oq__relay_store_data_version() consumes it), or -1 (SQLite; or no connection now). */
int oq__relay_store_notify_fd(oq__relay_store_t *s);

/**
 * Take or renew the lease \p name for \p owner in one BEGIN IMMEDIATE transaction: a missing
 * row is inserted (fence 1); an expired one, or one already ours with *fence, is taken
 * (fence + 1 on a change of holder, the same fence on renewal).
 * @param fence in: the fence we think we hold (0: none); out: the fence now held.
 * @param held out: 1 when \p owner holds the lease after the call.
 * @param holder out (may be NULL, \p holder_cap bytes): the current holder's owner id.
 * @param published_seq out (may be NULL): the lease's watermark (0 for a new lease row); with
 *        *held, where the new holder starts publishing.
 * @returns 0 or OQ_EBUSY / OQ_EDB.
 */
int oq__relay_lease_acquire(oq__relay_store_t *s, const char *name, const char *owner,
                            int64_t lease_ms, int64_t now_ms, int64_t *fence, int *held,
                            char *holder, size_t holder_cap, int64_t *published_seq,
                            oq_error_t *err);

/** Renew a held lease (expires_at = now + lease). @returns 0, OQ_EFENCED when lost,
 *  OQ_EBUSY / OQ_EDB. */
int oq__relay_lease_renew(oq__relay_store_t *s, const char *name, const char *owner, int64_t fence,
                          int64_t lease_ms, int64_t now_ms, oq_error_t *err);

/** Give the lease up (expires_at = 0) if still ours. */
int oq__relay_lease_release(oq__relay_store_t *s, const char *name, const char *owner,
                            int64_t fence, oq_error_t *err);

/**
 * Read rows with seq > \p after (the relay's cursor, never below the watermark) in seq order,
 * at most \p max_rows rows and about \p max_bytes payload bytes (at least one row), calling
 * \p cb for each.
 * @param nread out: rows passed to \p cb and accepted.
 */
int oq__relay_store_read(oq__relay_store_t *s, int64_t after, int max_rows, int64_t max_bytes,
                         oq__relay_row_cb cb, void *ctx, int *nread, oq_error_t *err);

/**
 * In one transaction, under the fencing check (owner, fence, unexpired): renew the lease and
 * advance the watermark to \p upto (every row with seq <= upto was delivered; it never moves
 * back). Crash point relay.after_mark_before_commit inside.
 * @returns 0, OQ_EFENCED (lease lost: nothing written), OQ_EBUSY or OQ_EDB.
 */
int oq__relay_store_mark(oq__relay_store_t *s, const char *name, const char *owner, int64_t fence,
                         int64_t lease_ms, int64_t now_ms, int64_t upto, oq_error_t *err);

/** A row set aside (dead-lettered): stored with the watermark that passes it. Borrowed. */
typedef struct oq__relay_dead {
    int64_t seq;        /**< the outbox row */
    const char *reason; /**< librdkafka error name, e.g. "MSG_SIZE_TOO_LARGE" */
    const char *detail; /**< human-readable; may be NULL */
} oq__relay_dead_t;

/**
 * As oq__relay_store_mark(), and in the same transaction, after the fencing check passed: copy
 * each of the \p ndead outbox rows \p dead (all with seq <= \p upto) into outbox_dead with its
 * reason (a row already there is left as it is). So the watermark never passes a dead row
 * without its dead letter, and a fenced relay writes neither.
 * @returns 0, OQ_EFENCED (nothing written), OQ_EBUSY or OQ_EDB.
 */
int oq__relay_store_mark_dead(oq__relay_store_t *s, const char *name, const char *owner,
                              int64_t fence, int64_t lease_ms, int64_t now_ms, int64_t upto,
                              const oq__relay_dead_t *dead, size_t ndead, oq_error_t *err);

/** Delete published rows created before \p cutoff_ms among the \p limit oldest rows, one
 *  transaction. */
int oq__relay_store_cleanup(oq__relay_store_t *s, int64_t cutoff_ms, int limit, int64_t *deleted,
                            oq_error_t *err);

/** Pending row count and created_at of the oldest pending row (0 when none). */
int oq__relay_store_pending(oq__relay_store_t *s, int64_t *count, int64_t *oldest_created_at,
                            oq_error_t *err);

#define OQ__RELAY_STATUS_LEASES 8

/** One relay_lease row. */
typedef struct oq__relay_lease_status {
    char name[64], owner[128];
    int64_t fence, expires_at, published_seq;
} oq__relay_lease_status_t;

/** What oq_relay_status_line() and oq_relay_status_json() show. */
typedef struct oq__relay_status {
    int64_t pending, oldest_pending_at, published, dead;      /**< oldest 0: none pending */
    oq__relay_lease_status_t leases[OQ__RELAY_STATUS_LEASES]; /**< by name; more are left out */
    int nleases;
} oq__relay_status_t;

/** Read the status of any connection's outbox, leases and dead letters (read-only). */
int oq__relay_store_status(sqlite3 *db, oq__relay_status_t *out, oq_error_t *err);

/** One outbox_dead row as read; pointers valid only during the callback. */
typedef struct oq__relay_dead_read {
    int64_t seq, created_at, dead_at, handled_at; /**< handled_at 0: not handled */
    const char *message_id, *topic, *key, *reason, *detail;
    const void *payload;
    size_t len;
} oq__relay_dead_read_t;

/** The outbox_dead row \p seq (> 0), or the \p limit oldest rows, on any connection. */
int oq__relay_store_dead_read(sqlite3 *db, int64_t seq, int limit,
                              void (*cb)(const oq__relay_dead_read_t *row, void *opaque),
                              void *opaque, oq_error_t *err);

/** oq__relay_store_status() and oq__relay_store_dead_read() on an operator's handle, on either
 *  backend (PostgreSQL: relay/store_pg.c). */
int oq__relay_store_status_of(const oq_dbh_t *h, oq__relay_status_t *out, oq_error_t *err);
int oq__relay_store_dead_read_of(const oq_dbh_t *h, int64_t seq, int limit,
                                 void (*cb)(const oq__relay_dead_read_t *row, void *opaque),
                                 void *opaque, oq_error_t *err);

#endif
