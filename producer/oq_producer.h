/**
 * @file oq_producer.h
 * @brief The producer: idempotent submit of tool calls (calls + outbox row in one SQLite
 *        transaction), group commit, reads, stats, results ingest, purge and the HTTP API.
 *
 * Semantics (docs/DESIGN.md "Data flow", step 1), for one (tenant, idem_key):
 *  - new key                          -> OQ_SUBMIT_NEW: a `pending` call and an outbox row;
 *  - same key, same fingerprint       -> OQ_SUBMIT_REPLAY: the original call, nothing written;
 *  - same key, different fingerprint  -> OQ_SUBMIT_CONFLICT (return OQ_ECONFLICT), nothing written;
 *  - same key + fingerprint, call `failed` with error.retryable=true
 *                                     -> OQ_SUBMIT_RETRY_RESET: back to `pending`, attempt+1,
 *                                        a new outbox row (new message_id, same call_id).
 * A key whose call is terminal and past expires_at (created_at + key_ttl) is a new call, even
 * before `onceq purge` deleted it. Non-terminal calls never expire.
 *
 * Durability: oq_producer_submit() returns only after the batch holding the submit committed
 * (synchronous=FULL unless the opener lowered it). Many concurrent submitters share one
 * transaction per batch (group commit, one writer thread).
 *
 * Thread-safety: an oq_producer_t may be used from any number of threads.
 */
#ifndef OQ_PRODUCER_H
#define OQ_PRODUCER_H

#include <jansson.h>
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "oq_error.h"

/* This header is installed (include/onceq/) and must stand alone: it includes only the
 * public oq_error.h and the libraries whose types it uses (jansson, SQLite). The two lengths
 * repeat the definitions of oq_util.h and oq_json.h (an identical redefinition is allowed;
 * a different one fails the build of every file that includes both). */
#define OQ_CALL_ID_LEN 34               /**< "c_" + 32 lowercase hex */
#define OQ_FINGERPRINT_LEN 64           /**< SHA-256 as lowercase hex */
typedef struct oq_metrics oq_metrics_t; /**< metrics registry (opaque here) */

#define OQ_DEFAULT_TENANT "default"
#define OQ_DEFAULT_KEY_TTL_MS (24LL * 3600 * 1000)
/** librdkafka's default message.max.bytes: the largest message the relay publishes unless its
 *  `-X message.max.bytes` says otherwise. */
#define OQ_DEFAULT_MAX_MESSAGE_BYTES 1000000
/** The error code a call gets when its message could not be published (it was set aside by
 *  the relay, see relay/README.md "Dead letters"). */
#define OQ_ERROR_UNPUBLISHABLE "unpublishable"
/** Default age after which an open call with no news is redriven (oq_producer_redrive). */
#define OQ_DEFAULT_REDRIVE_AFTER_MS (2LL * 60 * 1000)

typedef struct oq_producer oq_producer_t;

/** Open options. Zero-initialise, then set what you need. */
typedef struct oq_producer_opts {
    const char *synchronous;   /**< "FULL" (default when NULL), "NORMAL", "OFF" */
    int64_t key_ttl_ms;        /**< retention of keys; 0 = 24 h */
    int max_batch;             /**< group-commit batch cap; 0 = 256 */
    int read_conns;            /**< read-only connections for get/stats; 0 = 4 */
    oq_metrics_t *metrics;     /**< optional registry (borrowed; must outlive the producer) */
    int commit_delay_us;       /**< max extra wait to grow a batch: 0 = adaptive (default),
                                    < 0 = off (commit whatever is queued at once) */
    int checkpoint_pages;      /**< WAL frames that trigger a checkpoint on a background thread
                                    (PASSIVE, its own connection): 0 = 1000; < 0 = SQLite's
                                    auto-checkpoint inside the writer's commits */
    int64_t max_message_bytes; /**< the relay's Kafka message.max.bytes (keep the two equal):
                                    a new call whose message (envelope + key + header, as
                                    oq_outbox_wire_size() counts it) would be larger is refused
                                    with OQ_ETOOBIG and nothing is written; 0 = 1,000,000 */
    int64_t redrive_after_ms;  /**< a call not terminal whose state has not changed for this
                                    long is due for a redrive (oq_producer_redrive): 0 = 2 min,
                                    < 0 = off (passes do nothing). Nothing is stored at submit,
                                    so the value applies to every open call. */
    const char *topic_prefix;  /**< topic names' prefix for this producer's results ingest
                                    (oq_ingest_start): NULL = "onceq.". The outbox rows name
                                    the logical topic onceq.tool-calls whatever the prefix;
                                    the relay maps it (oq_relay_opts_t.topic_prefix). */
} oq_producer_opts_t;

typedef enum {
    OQ_SUBMIT_NEW = 1,
    OQ_SUBMIT_REPLAY = 2,
    OQ_SUBMIT_CONFLICT = 3,
    OQ_SUBMIT_RETRY_RESET = 4
} oq_submit_outcome_t;

/** @brief "new" / "replay" / "conflict" / "retry_reset". */
const char *oq_submit_outcome_name(oq_submit_outcome_t o);

/** A submit request. All fields borrowed for the duration of the call. */
typedef struct oq_submit_req {
    const char *tenant;    /**< NULL or "" = "default"; 1..128 printable ASCII bytes */
    const char *idem_key;  /**< 1..255 printable ASCII bytes (0x20..0x7e: space included) */
    const char *tool;      /**< 1..128 bytes, [A-Za-z0-9_.:-] */
    const json_t *args;    /**< a JSON object */
    const char *client_id; /**< optional; 1..128 printable ASCII bytes
                                (the rules: oq_envelope_valid_key / _name / _tool) */
    int64_t seq;           /**< optional client sequence number, used when has_seq */
    int has_seq;
} oq_submit_req_t;

/** One call row. Strings are owned by the struct; release with oq_call_clear(). */
typedef struct oq_call {
    char call_id[OQ_CALL_ID_LEN + 1];
    char fingerprint[OQ_FINGERPRINT_LEN + 1];
    char state[16]; /**< pending|running|succeeded|failed|needs_review */
    char *tenant;
    char *idem_key;
    char *tool;
    char *args;      /**< canonical JSON text */
    char *result;    /**< JSON text or NULL */
    char *error;     /**< JSON text {"code","message","retryable"} or NULL */
    char *effect_id; /**< NULL until a result reported one */
    char *client_id; /**< NULL when not given */
    int64_t attempt;
    int64_t seq;
    int has_seq;
    int64_t created_at, updated_at, expires_at; /**< unix ms */
} oq_call_t;

/** @brief Free the strings \p c owns and zero it; safe on a zeroed struct. */
void oq_call_clear(oq_call_t *c);

/** @brief Non-zero for succeeded / failed / needs_review. */
int oq_call_state_terminal(const char *state);

/**
 * @brief The call as the compact JSON text of the HTTP API and the CLI: call_id, tenant,
 *        idem_key, fingerprint, tool, args, status, attempt, result, error, effect_id,
 *        client_id, seq, created_at/updated_at/expires_at (RFC 3339), query_url. The one
 *        writer of a call's JSON (no intermediate jansson objects: the HTTP hot path).
 * @param out malloc()ed NUL-terminated text (caller free()s).
 * @returns 0, OQ_ENOMEM, or OQ_EUTF8 (a string of \p c that is not UTF-8).
 */
int oq_call_render(const oq_call_t *c, char **out, size_t *out_len);

/**
 * @brief The same object as oq_call_render() writes, as a jansson tree (its text parsed).
 * @returns a new reference, or NULL when rendering or parsing failed.
 */
json_t *oq_call_to_json(const oq_call_t *c);

/**
 * @brief Open (create, migrate) the producer database at \p path and start its writer thread.
 * @param opts may be NULL.
 * @returns 0 with \p out set (release with oq_producer_close), or a negative OQ_E* code.
 */
int oq_producer_open(const char *path, const oq_producer_opts_t *opts, oq_producer_t **out,
                     oq_error_t *err);

/** @brief Stop the writer after it drained queued submits, close the database. NULL ok. */
void oq_producer_close(oq_producer_t *p);

/**
 * @brief Submit one call and wait until it is durable (or refused).
 * @param call receives the call (the original one on a replay or conflict); may be NULL.
 * @param outcome receives the outcome (also on conflict); may be NULL.
 * @returns 0 for new / replay / retry-reset, OQ_ECONFLICT for a conflict, OQ_EINVAL for a bad
 *          request (nothing written), OQ_ETOOBIG when the call's message would be larger than
 *          max_message_bytes (nothing written; \p err says both sizes), OQ_EBUSY/OQ_EDB when
 *          the batch failed to commit (nothing of this submit is durable; retrying with the
 *          same key is safe), OQ_ESHUTDOWN.
 */
int oq_producer_submit(oq_producer_t *p, const oq_submit_req_t *req, oq_call_t *call,
                       oq_submit_outcome_t *outcome, oq_error_t *err);

/**
 * A submit prepared outside the writer (validation, canonical args, fingerprint, envelope of
 * a first attempt), so the writer does only SQL. Opaque; see oq_producer_submit_async().
 */
typedef struct oq_submit_job oq_submit_job_t;

/** Completion callback of an async submit, called on the writer thread after the commit
 *  (or the failure). It must not block; it typically wakes the requester (e.g. resumes a
 *  suspended HTTP connection), which then reads the job with oq_submit_job_result(). */
typedef void (*oq_submit_done_cb)(oq_submit_job_t *job, void *opaque);

/**
 * @brief Validate and prepare \p req (any thread). @returns 0 with \p out set (owned by the
 *        caller until oq_submit_job_destroy), OQ_EINVAL/OQ_ETOOBIG/OQ_EUTF8/... otherwise.
 */
int oq_submit_job_new(const oq_submit_req_t *req, oq_submit_job_t **out, oq_error_t *err);
/** @brief Free a job (not while it is queued). NULL ok. */
void oq_submit_job_destroy(oq_submit_job_t *job);
/**
 * @brief Queue a prepared job for the writer; \p cb runs once on the writer thread when done.
 * @returns 0, or OQ_ESHUTDOWN (the callback will not run).
 */
int oq_producer_submit_async(oq_producer_t *p, oq_submit_job_t *job, oq_submit_done_cb cb,
                             void *opaque);
/**
 * @brief Outcome of a finished job: return code (as oq_producer_submit), outcome, and the call
 *        (borrowed from the job). \p err may be NULL.
 */
int oq_submit_job_result(const oq_submit_job_t *job, oq_submit_outcome_t *outcome,
                         const oq_call_t **call, oq_error_t *err);

/**
 * @brief Submit inside the caller's own open write transaction on the caller's connection,
 *        so business rows and the intent commit (or roll back) together.
 * @remark \p db must hold an open write transaction (BEGIN IMMEDIATE) and carry the producer
 *         schema (oq_producer_migrate). Nothing is committed here. A conflict writes nothing.
 * @param key_ttl_ms 0 = 24 h.
 * @returns as oq_producer_submit(); the message size is checked against
 *          OQ_DEFAULT_MAX_MESSAGE_BYTES (the relay's default).
 */
int oq_producer_submit_in_tx(sqlite3 *db, const oq_submit_req_t *req, int64_t key_ttl_ms,
                             oq_call_t *call, oq_submit_outcome_t *outcome, oq_error_t *err);

struct pg_conn; /* libpq's PGconn: include <libpq-fe.h> to have one */

/**
 * @brief oq_producer_submit_in_tx() on PostgreSQL: inside the caller's own open transaction on
 *        the caller's own libpq connection (BEGIN issued by the caller), so the service's rows
 *        and the call with its outbox row commit or roll back together.
 * @remark \p conn must carry schema `onceq` (oq_producer_migrate_pg, or `onceq migrate --db
 *         URL`) and be inside a transaction block. Nothing is committed here. A conflict writes
 *         nothing; an error leaves the transaction aborted (the caller rolls back, as after any
 *         failed statement on PostgreSQL). Statements are unnamed: the connection's prepared
 *         statements and settings are left as found.
 * @returns as oq_producer_submit_in_tx().
 */
int oq_producer_submit_in_pgtx(struct pg_conn *conn, const oq_submit_req_t *req, int64_t key_ttl_ms,
                               oq_call_t *call, oq_submit_outcome_t *outcome, oq_error_t *err);

/** @brief Apply the migrations of schema `onceq` on the caller's PostgreSQL connection (in a
 *  transaction of its own: call it outside one). @returns 0, OQ_EVERSION, OQ_EDB. */
int oq_producer_migrate_pg(struct pg_conn *conn, oq_error_t *err);

/** @brief The topic prefix \p p was opened with (oq_producer_opts_t.topic_prefix), or NULL. */
const char *oq_producer_topic_prefix(const oq_producer_t *p);

/** @brief Apply the producer migrations (outbox + calls, ...) to the caller's \p db. */
int oq_producer_migrate(sqlite3 *db, oq_error_t *err);

/** @brief Get by call id. @returns 0, OQ_ENOTFOUND, OQ_EDB. */
int oq_producer_get(oq_producer_t *p, const char *call_id, oq_call_t *out, oq_error_t *err);
/** @brief Get by (tenant, key); \p tenant NULL = "default". @returns 0, OQ_ENOTFOUND, OQ_EDB. */
int oq_producer_get_by_key(oq_producer_t *p, const char *tenant, const char *idem_key,
                           oq_call_t *out, oq_error_t *err);

/**
 * @brief Stats: {"calls":N,"effects":N,"by_status":{...},"outbox_pending":N,
 *        "result_inbox":N, "oldest_pending_age_ms":N}. @returns 0 with \p out a new reference.
 */
int oq_producer_stats(oq_producer_t *p, json_t **out, oq_error_t *err);

/* --- the same reads on a plain connection (CLI tools) ------------------------------------- */
int oq_store_get(sqlite3 *db, const char *call_id, oq_call_t *out, oq_error_t *err);
int oq_store_get_by_key(sqlite3 *db, const char *tenant, const char *idem_key, oq_call_t *out,
                        oq_error_t *err);
int oq_store_stats(sqlite3 *db, json_t **out, oq_error_t *err);

/** One audit row (strings owned by the array; free with oq_audit_free). */
typedef struct oq_audit_row {
    int64_t ts;
    char *event;
    char *detail; /**< JSON text or NULL */
} oq_audit_row_t;
/** @brief Audit rows of \p call_id in order. @returns 0 (also with 0 rows) or OQ_EDB. */
int oq_store_audit(sqlite3 *db, const char *call_id, oq_audit_row_t **rows, size_t *n,
                   oq_error_t *err);
void oq_audit_free(oq_audit_row_t *rows, size_t n);

/* --- retention ---------------------------------------------------------------------------- */

typedef struct oq_purge_stats {
    int64_t calls;        /**< expired terminal calls deleted */
    int64_t audit;        /**< their audit rows */
    int64_t result_inbox; /**< their result_inbox rows, and rows of unknown calls older
                               than the TTL */
    int64_t outbox;       /**< published outbox rows older than the TTL */
    int64_t dead;         /**< handled dead letters (outbox_dead) older than the TTL */
    int batches;
} oq_purge_stats_t;

/**
 * @brief Delete calls with expires_at <= \p now_ms in a terminal state, their audit and
 *        result_inbox rows, result_inbox rows of unknown calls received before
 *        now_ms - key_ttl_ms, and outbox rows published before now_ms - key_ttl_ms, in batches
 *        of \p batch rows (one short BEGIN IMMEDIATE transaction each, so the write lock is
 *        never held for long). Pending/running calls are never deleted.
 * @param stats accumulates what was deleted; may be NULL.
 * @returns 0, OQ_EBUSY, OQ_EDB.
 */
int oq_store_purge(sqlite3 *db, int64_t now_ms, int64_t key_ttl_ms, int batch,
                   oq_purge_stats_t *stats, oq_error_t *err);

/** @brief oq_store_purge() on a producer opened on PostgreSQL (its own connection; settled
 *  calls only: pending, running and needs_review calls are never purged).
 *  @returns 0, OQ_ESTATE on an SQLite producer (use oq_store_purge on a connection of its own),
 *  OQ_EBUSY, OQ_EDB. */
int oq_producer_purge(oq_producer_t *p, int64_t now_ms, int64_t key_ttl_ms, int batch,
                      oq_purge_stats_t *stats, oq_error_t *err);

/* --- dead letters ------------------------------------------------------------------------- */

/**
 * @brief Fail the calls whose message the relay set aside (outbox_dead rows not handled yet,
 *        at most \p max): each becomes a tool_result `failed` with error
 *        {"code":"unpublishable","message":...,"retryable":false} applied by the same rules
 *        as a consumer's result (oq_store_apply_result: audited, deduplicated by the dead
 *        message's id, a stale attempt or a terminal call is left alone), and the row is marked
 *        handled. A producer (oq_producer_open) does this by itself about once a second; a
 *        service using oq_producer_submit_in_tx with its own relay calls this.
 * @remark Runs in the caller's open write transaction; commits nothing.
 * @param failed receives the number of calls moved to `failed`; may be NULL.
 * @param handled receives the number of rows handled; may be NULL.
 * @returns 0, OQ_EBUSY, OQ_EDB, OQ_ENOMEM.
 */
int oq_store_fail_dead_letters(sqlite3 *db, int64_t now_ms, int max, int *failed, int *handled,
                               oq_error_t *err);

/* --- results ingest ----------------------------------------------------------------------- */

/** Outcome of applying one tool_result. */
typedef enum {
    OQ_RESULT_APPLIED = 1,  /**< state changed (audit row written) */
    OQ_RESULT_DUPLICATE,    /**< message_id already in result_inbox: nothing done */
    OQ_RESULT_UNKNOWN_CALL, /**< no such call: recorded, not applied */
    OQ_RESULT_STALE,        /**< attempt older (or newer) than the call's: not applied */
    OQ_RESULT_IGNORED       /**< would leave a terminal state or repeat one: not applied */
} oq_result_outcome_t;

const char *oq_result_outcome_name(oq_result_outcome_t o);

struct oq_envelope;
/**
 * @brief Apply one decoded tool_result envelope inside the caller's open write transaction.
 * @returns 0 with \p outcome set, or OQ_EINVAL (not a tool_result), OQ_EBUSY, OQ_EDB.
 */
int oq_store_apply_result(sqlite3 *db, const struct oq_envelope *env, int64_t now_ms,
                          oq_result_outcome_t *outcome, oq_error_t *err);

/**
 * @brief Apply \p n decoded tool_result envelopes through the producer's writer: they join
 *        the next group commit (the same transaction and connection as submits, so calls.db
 *        has one writer per process) and this returns after that commit.
 * @param outcomes receives one outcome per envelope; 0 for an envelope refused as not a
 *        tool_result with a known status (nothing written for it).
 * @returns 0 when the batch committed, OQ_EBUSY/OQ_EDB when it did not (nothing of it is
 *          durable: retry the same batch), OQ_ESHUTDOWN when the producer is closing.
 * @remark Blocks; do not call from the writer thread (a submit completion callback).
 */
int oq_producer_apply_results(oq_producer_t *p, const struct oq_envelope *envs, int n,
                              oq_result_outcome_t *outcomes, oq_error_t *err);

typedef struct oq_ingest oq_ingest_t;

/** Ingest counters (also exported as metrics when a registry is given). */
typedef struct oq_ingest_counts {
    uint64_t applied, duplicate, unknown_call, stale, ignored, undecodable, batches;
} oq_ingest_counts_t;

/**
 * @brief Start consuming onceq.tool-results (group "onceq-producer"; under the producer's
 *        topic_prefix, PREFIX + tool-results) on a thread of its own;
 *        batches are applied through \p p's writer (oq_producer_apply_results), so the
 *        results share the submits' group commits and connection. @param cfg -X properties
 *        (may be NULL). \p p (borrowed) must stay open until oq_ingest_stop() returned.
 * @returns 0 with \p out set, or OQ_EKAFKA/OQ_EINVAL.
 */
int oq_ingest_start(oq_producer_t *p, const char *brokers, const void *cfg, oq_metrics_t *metrics,
                    oq_ingest_t **out, oq_error_t *err);
/** @brief Stop the thread (after its current batch), close the consumer. NULL ok. Call it
 *         before oq_producer_close(). */
void oq_ingest_stop(oq_ingest_t *in);
void oq_ingest_counts(const oq_ingest_t *in, oq_ingest_counts_t *out);

/* --- redrive (anti-entropy) ------------------------------------------------------------- */

/** What one redrive pass did. */
typedef struct oq_redrive_stats {
    int redriven; /**< calls whose tool_call message was published again (same message id) */
    int waiting;  /**< due calls whose message is not delivered yet (the relay is behind):
                       nothing published, looked at again later */
    int deferred; /**< due calls whose state changed less than redrive_after ago: rescheduled */
} oq_redrive_stats_t;

/**
 * @brief One redrive pass through the writer (its own small transaction in the group commit):
 *        up to \p limit calls that are not terminal and whose state has not changed for
 *        redrive_after_ms get their current attempt's tool_call message published again, with
 *        the same message id and envelope (oq_outbox_republish). The consumer's inbox knows that
 *        id: a call in flight is left alone; a call already terminal re-emits its result under
 *        the result's own message id, so a lost call message and a lost result message both
 *        recover and no effect runs twice. Each call's next redrive comes after an
 *        exponentially growing delay (2x, 4x, ... redrive_after, at most max(redrive_after,
 *        1 h)); each redrive writes an audit row ('redrive') and an INFO log line. Terminal
 *        calls are never redriven.
 * @remark Run it only where results are ingested (oq_ingest_start): without results every
 *         call looks stuck.
 * @param limit calls per pass; 0 = 100.
 * @param stats receives what was done (may be NULL).
 * @returns 0, OQ_EBUSY/OQ_EDB (nothing of the pass holds), OQ_ESHUTDOWN.
 * @remark Blocks; do not call from the writer thread.
 */
int oq_producer_redrive(oq_producer_t *p, int limit, oq_redrive_stats_t *stats, oq_error_t *err);

/* --- HTTP --------------------------------------------------------------------------------- */

typedef struct oq_http oq_http_t;

/** Who may read GET /metrics and GET /stats on the API port. */
typedef enum {
    OQ_HTTP_METRICS_LOOPBACK = 0, /**< clients whose TCP peer is 127.0.0.0/8 or ::1 (default) */
    OQ_HTTP_METRICS_OPEN,         /**< anyone who reaches the port */
    OQ_HTTP_METRICS_TOKEN         /**< a bearer token listed in metrics_token_file */
} oq_http_metrics_access_t;

/** HTTP options. Zero-initialise, then set what you need (0 = the default said here). */
typedef struct oq_http_opts {
    const char *listen;     /**< "127.0.0.1:8081" */
    int64_t max_body;       /**< default 1 MiB */
    int threads;            /**< libmicrohttpd thread pool; default 2 (minimum 2) */
    size_t max_depth;       /**< JSON nesting limit; default 32 */
    oq_metrics_t *metrics;  /**< optional, served on GET /metrics */
    oq_ingest_t *ingest;    /**< optional: its counters appear in GET /stats as "results", and
                                 GET /readyz checks that its brokers answer */
    int max_conns;          /**< open connections in all; a new one over it is closed at accept
                                 (counted, logged); default 1000 */
    int max_conns_per_ip;   /**< open connections per client address; default 256; < 0 = none */
    int idle_timeout_ms;    /**< close a connection that sent nothing for this long (a request
                                 still incomplete, or keep-alive between requests); a submit
                                 waiting for its commit is never timed out; default 10 s */
    const char *token_file; /**< API tokens, lines "TOKEN TENANT" (README "Authentication");
                                 NULL = no authentication. Borrowed: kept for oq_http_reload */
    oq_http_metrics_access_t metrics_access;
    const char *metrics_token_file; /**< lines "TOKEN", for OQ_HTTP_METRICS_TOKEN (borrowed) */
} oq_http_opts_t;

/**
 * @brief Serve the HTTP API for \p p.
 * @returns 0 with \p out set, or OQ_EIO (cannot listen), OQ_EINVAL (bad address, unreadable
 *          or malformed token file: \p err names the file and line, never a token).
 */
int oq_http_start(oq_producer_t *p, const oq_http_opts_t *opts, oq_http_t **out, oq_error_t *err);
/** @brief Port actually bound (useful with port 0). */
int oq_http_port(const oq_http_t *h);
/**
 * @brief Read the token files again (SIGHUP). Requests in progress keep the tokens they were
 *        checked with; later ones see the new set. On any error the tokens in use are kept.
 * @returns 0 (also when no token file is configured), or OQ_EINVAL/OQ_EIO with \p err set.
 */
int oq_http_reload(oq_http_t *h, oq_error_t *err);
/**
 * @brief Stop accepting, wait up to \p drain_ms for in-flight requests to be answered, then
 *        stop the server. NULL ok.
 */
void oq_http_stop(oq_http_t *h, int drain_ms);

/**
 * @brief Ask the ingest's brokers for metadata (readiness): blocks up to \p timeout_ms.
 *        Safe from any thread while the ingest runs.
 * @returns 0 when a broker answered, OQ_EKAFKA otherwise.
 */
int oq_ingest_probe(oq_ingest_t *in, int timeout_ms, oq_error_t *err);

/** @brief Metrics registry the producer was opened with (may be NULL). */
oq_metrics_t *oq_producer_metrics(oq_producer_t *p);
/** @brief Path of the database. */
const char *oq_producer_path(const oq_producer_t *p);
/** @brief Configured key TTL (ms). */
int64_t oq_producer_key_ttl(const oq_producer_t *p);

#endif
