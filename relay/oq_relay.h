/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_relay.h
 * @brief The outbox relay: publishes a database's `outbox` rows to Kafka, at least once, in
 *        `seq` order per partition, with one active relay per database (lease + fencing).
 *
 * A relay owns one SQLite connection to the database at `db_path` (calls.db for the producer,
 * effects.db for a consumer's result outbox; both carry schema/common/0001_outbox.sql,
 * 0002_outbox_watermark.sql and 0003_outbox_dead.sql) and one
 * idempotent librdkafka producer (`enable.idempotence=true`, `acks=all`, forced). Rows are
 * appended by other code with oq_outbox_append() inside their own transactions; the relay
 * notices a commit by polling `PRAGMA data_version` with an adaptive backoff (1 ms up to
 * `poll_max_ms`), at once after oq_relay_notify(), or, with `watch_wal`, as soon as another
 * process's commit to the SQLite WAL is visible.
 *
 * Message contract: topic = outbox.topic, key = outbox.key (the call_id), value =
 * outbox.payload, header `onceq-message-id` = outbox.message_id.
 *
 * Guarantees:
 *  - Publish progress is a watermark, `relay_lease.published_seq`: every row with a seq at or
 *    below it had a successful delivery report. The relay advances it over the contiguous
 *    prefix of delivered rows, one small UPDATE per batch, and only while it holds the lease:
 *    the UPDATE checks `relay_lease(name, owner, fence, expires_at > now)`. A relay that lost
 *    its lease (paused past the expiry, then resumed) stores nothing. The view
 *    `outbox_unpublished` lists the rows above it.
 *  - Nothing is dropped: a failed delivery stops the watermark below that row; the relay drains
 *    its in-flight messages and re-publishes from the watermark. The one exception is a row
 *    Kafka refuses for good (a permanent per-message error: MSG_SIZE_TOO_LARGE,
 *    INVALID_MSG_SIZE, RECORD_LIST_TOO_LARGE, INVALID_RECORD; from the broker only when the
 *    row fails again sent alone): it is copied into `outbox_dead` with its reason in the same
 *    fenced transaction that moves the watermark over it, counted
 *    (onceq_relay_dead_letters_total{reason}) and logged, so no row blocks the ones behind it
 *    for ever. The database's owner acts on outbox_dead (the producer fails the call with
 *    error code "unpublishable"). Duplicates are possible (crash
 *    between delivery and the next advance, failover, failure rewind: every row above the
 *    stored watermark is sent again); the consumer's inbox absorbs them.
 *  - Order: per partition (hence per key), the first copy of every message arrives in seq
 *    order. The relay's producer defaults make this hold: message.timeout.ms=0 (librdkafka
 *    retries in order, forever; an outage stalls the relay instead of failing messages) and
 *    enable.gapless.guarantee=true (a batch failure that would leave a gap stops the producer;
 *    the relay rebuilds it and re-sends from the first undelivered row). If the user sets a
 *    finite message.timeout.ms (-X), an outage shorter than the timeout can let later messages
 *    of a partition be delivered after earlier ones timed out: the rewind then re-sends the
 *    tail, so the last copies are in order but a first copy may overtake.
 *  - Published rows older than `retention_ms` are deleted in bounded batches.
 *
 * Threads: oq_relay_start() runs the relay in a thread of its own plus a writer thread for
 * marks and retention (each with its own SQLite connection), and librdkafka's threads. All
 * functions below may be called from any thread except that new/start/stop/destroy must not
 * race with each other on the same relay.
 *
 * Crash points (OQ_CRASH_POINT, armed with ONCEQ_CRASH_AT=name[@N][!stop]), in pipeline order:
 *  - `relay.after_lease_acquire`            lease won, nothing produced yet
 *  - `relay.after_lease_check`              lease found valid, next batch not read yet (a
 *                                            test pauses here with `name@N!stop`)
 *  - `relay.after_read_batch`               rows read, none produced
 *  - `relay.after_produce_before_delivery`  batch handed to librdkafka, no delivery report seen
 *  - `relay.after_delivery_before_mark`     delivery reports received, mark not started
 *  - `relay.after_mark_before_commit`       mark UPDATEs done, COMMIT not issued
 *  - `relay.after_mark_commit`              batch marked and committed
 *  - `relay.cleanup_before_commit`          retention DELETE done, COMMIT not issued
 */
#ifndef OQ_RELAY_H
#define OQ_RELAY_H

#include <jansson.h>
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "oq_dbh.h"
#include "oq_config.h"
#include "oq_error.h"
#include "oq_metrics.h"

/** Opaque relay handle. */
typedef struct oq_relay oq_relay_t;

/** Relay options. Initialise with oq_relay_opts_init(), then override fields. */
typedef struct oq_relay_opts {
    const char *db_path;          /**< database holding `outbox` + `relay_lease` (required) */
    const char *db_synchronous;   /**< the relay's own connections (marks, lease, retention
                                       deletes): "NORMAL" (default when NULL) / "FULL" / "OFF".
                                       NORMAL is safe here: the relay never writes accepted
                                       data, and a mark lost in a power failure only makes the
                                       row published again, which the consumers' inbox absorbs.
                                       The rows themselves are as durable as their writer made
                                       them (FULL by default), and a later FULL commit on the
                                       file syncs the earlier NORMAL frames too. */
    const char *brokers;          /**< bootstrap.servers (required unless set via kafka_cfg) */
    const oq_config_t *kafka_cfg; /**< -X / kafka.* pass-through; may be NULL; borrowed */
    const char *lease_name;       /**< relay_lease.name; default "outbox" */
    const char *owner;            /**< lease owner id; default "host:pid:random" */
    int64_t lease_ms;             /**< lease duration; default 5000; renewed every third */
    int batch_rows;               /**< rows read per batch (a mark transaction takes all rows
                                       delivered since the previous one); default 1000 */
    int64_t batch_bytes;          /**< payload bytes per batch; default 1 MiB */
    int max_inflight;             /**< rows produced but not yet reported; default 50000 */
    int64_t retention_ms;         /**< delete published rows older than this; default 1 h;
                                       0 disables cleanup */
    int cleanup_batch;            /**< rows per cleanup DELETE transaction; default 1000 */
    int poll_max_ms;              /**< idle data_version poll cap; default 5 */
    int partial_wait_ms;          /**< after a batch that did not fill (the relay had caught
                                       up), the next read waits until every message in flight
                                       has its delivery report, or this long at most; default
                                       100 (see relay.c, "Partial batches"); 0: no wait */
    int partial_min_rows;         /**< the wait above follows only a read of at least this
                                       many rows (a loaded relay); default 64; 0: after any */
    int gather_ms;                /**< while rows arrive at gather_min_rate or more, read at
                                       most every this many ms, so that each partition's
                                       request carries more messages (relay.c, "Gather");
                                       default -1: by backend, 10 on SQLite, 5 on
                                       PostgreSQL; 0: read per commit at any rate */
    int gather_min_rate;          /**< rows per second (a moving average over the reads) from
                                       which gather_ms applies; default 5000 */
    int watch_wal;                /**< 1: while idle, also watch the SQLite WAL file (Linux
                                       inotify) and wake on another process's commit instead
                                       of at the next poll (the `onceq relay` process, whose
                                       writer is another process and cannot notify it; an
                                       oq_relay_notify() is then seen at the next poll); 0
                                       (default): polls and oq_relay_notify() only; ignored on
                                       PostgreSQL and where the watch cannot be set */
    int64_t stop_timeout_ms;      /**< oq_relay_stop(): max wait for in-flight; default 10000 */
    oq_metrics_t *metrics;        /**< registry for onceq_relay_* metrics; may be NULL; borrowed,
                                       must outlive the relay */
    const char *metrics_labels;   /**< labels for every metric, e.g. `relay="results"`; may be
                                       NULL. Two relays in one registry need distinct labels,
                                       else they share (and mix) the same series */
    const char *topic_prefix;     /**< rows name logical topics ("onceq.tool-calls"); a row
                                       whose topic starts with "onceq." is published to this
                                       prefix + the rest (oq_topic_name); NULL = as named */
    struct oq_ckpt *ckpt;         /**< SQLite: the background checkpointer (oq_ckpt.h) the
                                       relay's connections attach to, borrowed, outliving the
                                       relay (a consumer passes its own); NULL: the relay runs
                                       one of its own. Either way its commits never checkpoint */
} oq_relay_opts_t;

/** Lease state, as seen by the relay itself. */
typedef enum {
    OQ_RELAY_STANDBY = 0, /**< another relay holds the lease (or not started) */
    OQ_RELAY_HOLDER = 1,  /**< this relay holds the lease and publishes */
    OQ_RELAY_STOPPED = 2  /**< stopped, lease released */
} oq_relay_lease_state_t;

/** Counters and state of one relay (a snapshot; see oq_relay_stats()). */
typedef struct oq_relay_stats {
    uint64_t produced;             /**< messages handed to librdkafka (includes re-publishes) */
    uint64_t published;            /**< delivery reports covered by a stored watermark */
    uint64_t delivery_errors;      /**< failed delivery reports */
    uint64_t rewinds;              /**< times publishing restarted from a failed row */
    uint64_t batches;              /**< mark transactions committed */
    uint64_t producer_restarts;    /**< producers recreated after a fatal error */
    uint64_t fenced;               /**< times the lease was found lost */
    uint64_t cleaned;              /**< published rows deleted by retention */
    uint64_t dead_letters;         /**< rows set aside (outbox_dead) after a permanent error */
    int64_t pending;               /**< unpublished rows (refreshed about every second) */
    int64_t oldest_pending_age_ms; /**< age of the oldest unpublished row, 0 if none */
    int64_t fence;                 /**< fencing token while holder, else last held (0 never) */
    int inflight;                  /**< produced, no delivery report yet */
    oq_relay_lease_state_t lease_state;
    int64_t lease_checked_ms; /**< wall clock of the last lease read that answered: a renewal
                                   stored, or a standby's acquire attempt (0: none yet) */
    uint64_t idle_sends;      /**< batches sent at once after an idle wait, without linger.ms */
    uint64_t reads;           /**< reads of the outbox (on PostgreSQL each is an assign
                                   transaction and a round trip; see partial_wait_ms) */
} oq_relay_stats_t;

/** @brief Fill \p o with the defaults documented on ::oq_relay_opts_t (all pointers NULL). */
void oq_relay_opts_init(oq_relay_opts_t *o);

/**
 * @brief Create a relay: opens the database (it must already be migrated: the outbox and
 *        relay_lease tables must exist), builds the librdkafka conf (validating -X settings),
 *        registers metrics. Nothing is published until oq_relay_start().
 * @param opts copied; strings are copied too, except kafka_cfg and metrics (borrowed).
 * @returns the relay (free with oq_relay_destroy()), or NULL with \p err filled (OQ_EINVAL for
 *          bad options or Kafka settings, OQ_EDB when the database cannot be opened or lacks
 *          the tables).
 */
oq_relay_t *oq_relay_new(const oq_relay_opts_t *opts, oq_error_t *err);

/**
 * @brief Start the relay thread: it competes for the lease and, while holding it, publishes.
 * @returns 0, OQ_ESTATE if already started, or OQ_EIO if the thread cannot be created.
 */
int oq_relay_start(oq_relay_t *r, oq_error_t *err);

/** @brief Wake the relay now (call after committing outbox rows in this process). Cheap;
 *         async-signal-unsafe; safe from any thread. Accepts NULL. */
void oq_relay_notify(oq_relay_t *r);

/**
 * @brief Stop publishing: stop reading new rows, wait up to stop_timeout_ms for in-flight
 *        delivery reports, mark what was delivered, release the lease, destroy the producer,
 *        join the thread. Undelivered rows stay unpublished for the next holder.
 * @returns 0 (also when not started or already stopped).
 */
int oq_relay_stop(oq_relay_t *r);

/** @brief Stop (if running) and free everything; accepts NULL. */
void oq_relay_destroy(oq_relay_t *r);

/** @brief Snapshot of counters and state into \p out. */
void oq_relay_stats(oq_relay_t *r, oq_relay_stats_t *out);

/** @brief The lease owner id this relay uses (borrowed, valid until destroy). */
const char *oq_relay_owner(const oq_relay_t *r);

/**
 * @brief One-line status of any database's outbox and leases, for `onceq stats`:
 *        `relay: pending=12 oldest_pending_age=0.35s published=9988 lease=outbox
 *        holder=host:123:ab12 fence=3 expires_in=4.2s` (or `holder=none` / `expired`).
 * @param db an open connection (read-only is fine); not modified.
 * @returns 0, or OQ_EDB (\p err filled) when the tables are missing or unreadable.
 */
int oq_relay_status_line(sqlite3 *db, char *buf, size_t n, oq_error_t *err);

/**
 * @brief The same status as one JSON object, for `onceq stats --json`: {"pending",
 *        "oldest_pending_age_s", "published", "dead", "leases": [{"name", "published_seq",
 *        "holder" (null when the lease lapsed), "last_holder", "fence", "expires_in_s"}]}.
 * @param out a new object (the caller json_decref()s it).
 * @returns 0, or OQ_EDB (\p err filled) when the tables are missing or unreadable.
 */
int oq_relay_status_json(sqlite3 *db, json_t **out, oq_error_t *err);

/**
 * @brief The outbox rows this database's relay set aside (outbox_dead), for `onceq dlq`:
 *        a JSON array, oldest first, of {"seq", "message_id", "topic", "key", "payload"
 *        (text, null when not UTF-8), "payload_bytes", "created_at", "reason", "detail",
 *        "dead_at", "handled_at" (null: not yet)}.
 * @param seq > 0: only that row (an empty array when there is none); 0: the \p limit oldest.
 * @returns 0, or OQ_EDB when the table is missing or unreadable.
 */
int oq_relay_dead_list(sqlite3 *db, int64_t seq, int limit, json_t **out, oq_error_t *err);

/** @brief oq_relay_status_line(), oq_relay_status_json() and oq_relay_dead_list() on an
 *         operator's handle (oq_dbh.h): an SQLite file or PostgreSQL (schema onceq; a lease's
 *         expiry, on the server's clock there, is shown as what is left of it). The sqlite3
 *         forms above call these. */
int oq_relay_db_status_line(const oq_dbh_t *h, char *buf, size_t n, oq_error_t *err);
int oq_relay_db_status_json(const oq_dbh_t *h, json_t **out, oq_error_t *err);
int oq_relay_db_dead_list(const oq_dbh_t *h, int64_t seq, int limit, json_t **out, oq_error_t *err);

#endif
