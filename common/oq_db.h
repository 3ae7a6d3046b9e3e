/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_db.h
 * @brief SQLite helpers: durable open, embedded migrations, a prepared-statement cache,
 *        transactions, and the outbox statements shared by the producer and the consumer
 *        (append, republish, retention of delivered rows, counts; the relay's reads are in
 *        relay/).
 *
 * Durability default: journal_mode=WAL, synchronous=FULL. A component may lower it only when
 * its user passes an explicit flag (`--synchronous normal`).
 *
 * Migrations are the schema/ files compiled into the binary (cmake/embed_sql.cmake). A
 * migration set is an ordered list of those names; PRAGMA user_version counts how many are
 * applied. oq_db_migrate() applies the missing ones in one transaction and refuses a database
 * whose user_version is higher than the set (a newer binary wrote it); oq_db_open() already
 * refuses such a database for every opener (oq_db_check_version()), before it writes anything.
 */
#ifndef OQ_DB_H
#define OQ_DB_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "oq_error.h"

/** One embedded SQL file (generated table, terminated by {NULL, NULL}). */
typedef struct oq_sql_file {
    const char *name; /**< path relative to schema/, e.g. "producer/0001_init.sql" */
    const char *sql;
} oq_sql_file_t;
extern const oq_sql_file_t oq_sql_files[];

/** @brief The SQL text of an embedded file, or NULL. */
const char *oq_sql_file(const char *name);

/** Ordered migration sets (NULL-terminated arrays of embedded names). */
extern const char *const oq_migrations_producer[];
extern const char *const oq_migrations_consumer[];

typedef struct oq_db_opts {
    const char *synchronous; /**< "FULL" (default when NULL), "NORMAL", "OFF" */
    int busy_timeout_ms;     /**< default 5000 when 0 */
    int readonly;            /**< open read-only (no create, no migrations) */
} oq_db_opts_t;

/**
 * @brief Open \p path with WAL, the synchronous level, busy timeout and foreign keys on.
 * @param opts may be NULL (defaults: FULL, 5000 ms, read-write, create).
 * @returns 0 with \p out set (close with sqlite3_close_v2 after oq_stmt_cache_destroy), or
 *          OQ_EDB / OQ_EIO.
 */
int oq_db_open(const char *path, const oq_db_opts_t *opts, sqlite3 **out, oq_error_t *err);

/**
 * @brief Bring \p db to the newest version of \p set, in one BEGIN IMMEDIATE transaction.
 * @returns 0 (also when already current), OQ_EVERSION when the database is newer than \p set,
 *          OQ_EDB on SQL failure (nothing applied).
 */
int oq_db_migrate(sqlite3 *db, const char *const *set, oq_error_t *err);

/**
 * @brief As oq_db_migrate() with the SQL texts given directly (NULL-terminated, borrowed).
 *        oq_db_migrate() resolves its names with oq_sql_file() and calls this; tests use it
 *        to run ad-hoc sets. @returns as oq_db_migrate().
 */
int oq_db_migrate_sql(sqlite3 *db, const char *const *sql_texts, oq_error_t *err);

/** @brief Current PRAGMA user_version, or a negative OQ_E* code. */
int oq_db_user_version(sqlite3 *db);

/**
 * @brief The schema-version guard every opener goes through (oq_db_open() calls it before it
 *        changes anything, so a refused database is left exactly as it was): refuse a
 *        database whose PRAGMA user_version is higher than this binary knows. The set is told
 *        by the tables: `calls` -> the producer set, `executions` -> the consumer set, neither
 *        -> the longer of the two. A fresh database (version 0) passes.
 * @param schema the attached schema to check ("main" when NULL), e.g. "c" for an ATTACHed one.
 * @param path the file, for the message; may be NULL.
 * @returns 0, OQ_EVERSION ("database X: schema version 99 is newer than this binary (5);
 *          upgrade onceq (nothing was changed)"), or OQ_EDB when it cannot be read.
 */
int oq_db_check_version(sqlite3 *db, const char *schema, const char *path, oq_error_t *err);

/** @brief Execute \p sql (no results); maps SQLITE_BUSY to OQ_EBUSY. */
int oq_db_exec(sqlite3 *db, const char *sql, oq_error_t *err);

/**
 * @brief BEGIN IMMEDIATE, retrying on SQLITE_BUSY until \p timeout_ms (beyond the busy
 *        handler) elapses. @returns 0, OQ_EBUSY or OQ_EDB.
 */
int oq_db_begin_immediate(sqlite3 *db, int timeout_ms, oq_error_t *err);
/** @brief Microseconds this process spent in oq_db_begin_immediate() (taking the write lock,
 *        busy waits included), over all connections: SQLite's busy time. */
int64_t oq_db_lock_wait_us(void);
/** @brief Times SQLite's busy handler ran for this process's connections (a writer that found
 *        the write lock taken and slept before trying again). */
uint64_t oq_db_busy_calls(void);
/** @brief COMMIT; the writer gate is given back once the transaction has ended. */
int oq_db_commit(sqlite3 *db, oq_error_t *err);
/** @brief ROLLBACK if a transaction is open; never fails loudly. Gives the writer gate back. */
void oq_db_rollback(sqlite3 *db);

/** What this process's writer gates did (common/dbgate.c): times one was taken, times a
 *  writer waited for it, waits that reached their deadline (then BEGIN IMMEDIATE went on
 *  without it), holders found dead (EOWNERDEAD), and times a writer took it from a holder
 *  that had let waiters go first (the hand-over of "Fairness"). */
typedef struct oq_db_gate_counts {
    uint64_t taken, waited, timeouts, owner_dead, handoffs;
} oq_db_gate_counts_t;
void oq_db_gate_counts(oq_db_gate_counts_t *out);

/** @brief Fill \p err from the connection's last error; returns OQ_EBUSY or OQ_EDB. */
int oq_db_error(sqlite3 *db, int rc, oq_error_t *err, const char *what);

/** Prepared-statement cache keyed by the SQL text's address (use string literals). */
typedef struct oq_stmt_cache oq_stmt_cache_t;
oq_stmt_cache_t *oq_stmt_cache_new(sqlite3 *db);
/** @brief Finalize all statements; accepts NULL. Call before closing the db. */
void oq_stmt_cache_destroy(oq_stmt_cache_t *c);
/**
 * @brief A reset, unbound statement for \p sql, prepared once (SQLITE_PREPARE_PERSISTENT).
 * @returns NULL on prepare failure (\p err filled). The statement stays owned by the cache.
 */
sqlite3_stmt *oq_stmt_get(oq_stmt_cache_t *c, const char *sql, oq_error_t *err);

/* --- outbox (schema/common/0001_outbox.sql) --------------------------------------------------*/

/** One outbox row to append. All fields borrowed. */
typedef struct oq_outbox_row {
    const char *message_id; /**< unique; the consumer's inbox key */
    const char *topic;
    const char *key;     /**< Kafka key: the call_id, for per-call ordering */
    const char *payload; /**< envelope JSON */
    size_t payload_len;
    int64_t created_at; /**< unix ms */
} oq_outbox_row_t;

/**
 * @brief What librdkafka counts against its message.max.bytes for a row the relay publishes:
 *        value + key + the onceq-message-id header (name, value and their two length varints)
 *        + the record's worst-case framing (36 bytes for MsgVersion 2). The producer refuses a
 *        call whose row would be larger than the relay's limit, so a row accepted is a row the
 *        relay can publish.
 */
size_t oq_outbox_wire_size(size_t key_len, size_t payload_len, size_t message_id_len);

/**
 * @brief Append \p row to the outbox.
 * @remark The caller holds an open write transaction on \p db; nothing is committed here.
 * @param cache optional statement cache for \p db (NULL: prepare each time).
 * @returns 0, or a negative OQ_E* code with \p err filled (OQ_EBUSY is retriable).
 */
int oq_outbox_append(sqlite3 *db, oq_stmt_cache_t *cache, const oq_outbox_row_t *row,
                     oq_error_t *err);

/** What oq_outbox_republish() did. */
typedef enum {
    OQ_OUTBOX_APPENDED = 1, /**< no row had the message id: \p row was appended */
    OQ_OUTBOX_REQUEUED,     /**< its row was delivered: moved to the tail (new seq), stored
                                 bytes kept, so the relay publishes it once more */
    OQ_OUTBOX_PENDING       /**< its row is not delivered yet: nothing written (the relay
                                 will publish it) */
} oq_outbox_republish_t;

/**
 * @brief Publish the message \p row->message_id once more, under the same message id: the
 *        repair for a message that was reported delivered but never reached a consumer
 *        (redrive). The outbox keeps one row per message id (UNIQUE), so a delivered row is
 *        deleted and appended again with a new seq and \p row->created_at, its stored topic,
 *        key and payload unchanged; \p row's own topic, key and payload are used only when
 *        the outbox has no row for the id any more (retention deleted it). A row above the
 *        relay's watermark is still on its way and is left alone.
 * @remark The caller holds an open write transaction on \p db; nothing is committed here.
 * @param cache optional statement cache for \p db (NULL: prepare each time).
 * @param what receives what was done.
 * @returns 0, or a negative OQ_E* code with \p err filled (OQ_EBUSY is retriable).
 */
int oq_outbox_republish(sqlite3 *db, oq_stmt_cache_t *cache, const oq_outbox_row_t *row,
                        oq_outbox_republish_t *what, oq_error_t *err);

/**
 * @brief Retention: delete delivered rows (seq at or below the relay's watermark,
 *        relay_lease.published_seq) created before \p cutoff_ms, looking at the \p limit
 *        oldest delivered rows only, so the work per call is bounded. Rows not yet delivered
 *        are never deleted, however old.
 * @remark Runs in the caller's transaction if one is open; commits nothing itself.
 * @param deleted receives the number of rows deleted; may be NULL.
 * @returns 0, OQ_EBUSY or OQ_EDB.
 */
int oq_outbox_purge_published(sqlite3 *db, int64_t cutoff_ms, int limit, int64_t *deleted,
                              oq_error_t *err);

/**
 * @brief Rows not yet delivered (above the relay's watermark) and all rows, in one statement.
 * @param pending, total may be NULL. @returns 0, OQ_EBUSY or OQ_EDB.
 */
int oq_outbox_count(sqlite3 *db, int64_t *pending, int64_t *total, oq_error_t *err);

#endif
