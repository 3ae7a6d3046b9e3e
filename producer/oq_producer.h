/* SPDX-License-Identifier: Apache-2.0 */
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
 * A key whose call settled (`succeeded` or `failed`) and is past expires_at (the moment it
 * settled + key_ttl) is a new call, even before `onceq purge` deleted it. A call that is not
 * settled (`pending`, `running`, `needs_review`) never expires: a same-key submit gets it back.
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

#include "oq_dbh.h"
#include "oq_client.h"
#include "oq_error.h"

typedef struct oq_metrics oq_metrics_t; /**< metrics registry (opaque here) */
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
 * @remark No tool catalogue is consulted here: the catalogue belongs to the front doors (the
 *         HTTP API checks it, see oq_http_opts_t.catalog), because an embedding program is
 *         trusted code that may submit tools the file does not list. Such a program checks
 *         with oq_catalog_check() (oq_catalog.h) first when it wants the same refusals.
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

/** @brief The topic prefix \p p was opened with (oq_producer_opts_t.topic_prefix), or NULL. */
const char *oq_producer_topic_prefix(const oq_producer_t *p);

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

/** What the operators' list of calls shows (onceq console); NULL / 0 = any. */
typedef struct oq_call_query {
    const char *call_id;  /**< exactly this call (then only the tenant below applies) */
    const char *idem_key; /**< this key: in \p tenant, or in every tenant when NULL */
    const char *state, *tool, *tenant;
    int64_t since_ms, until_ms; /**< created_at bounds, inclusive (unix ms) */
    int64_t before;             /**< the `next` of the previous page (0: the newest) */
    int limit;                  /**< 1..500 */
} oq_call_query_t;

/**
 * @brief A page of calls, newest first: {"calls": [call...], "next": N or null}. Every page
 *        is bounded work at any table size (see producer/store.c): a filter no index answers
 *        reads a window of rows, so a page may hold fewer than \p limit calls and still have
 *        a `next`. @returns 0 with \p out a new reference, OQ_EINVAL, OQ_EDB.
 */
int oq_store_list(sqlite3 *db, const oq_call_query_t *q, json_t **out, oq_error_t *err);

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
 * @brief Delete settled calls (succeeded, failed) with expires_at <= \p now_ms, their audit and
 *        result_inbox rows, result_inbox rows of unknown calls received before
 *        now_ms - key_ttl_ms, and outbox rows published before now_ms - key_ttl_ms, in batches
 *        of \p batch rows (one short BEGIN IMMEDIATE transaction each, so the write lock is
 *        never held for long). Calls that are not settled (pending, running, needs_review)
 *        are never deleted.
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

/* --- the operators' tools on either backend (oq_dbh.h) -------------------------------------- */

/*
 * What `onceq get/inspect/stats/purge` and `onceq console` do with a producer database, on a
 * handle opened from the setting (oq_dbh_open: an SQLite file or PostgreSQL). Each goes to the
 * store function of its action (producer/store.c, producer/store_pg.c), the same one the
 * sqlite3-taking oq_store_* above reach: one code path per action on either backend.
 */

/** @brief The webhook deliveries of \p call_id on \p h (every attempt, any state, by attempt;
 *         the objects oq_webhooks_list() prints, without body): a new JSON array in \p out. */
int oq_producer_db_webhooks(const oq_dbh_t *h, const char *call_id, json_t **out, oq_error_t *err);
/** @brief Webhook deliveries pending and dead on \p h (the partial indexes). */
int oq_producer_db_webhook_counts(const oq_dbh_t *h, int64_t *pending, int64_t *dead,
                                  oq_error_t *err);
/** @brief oq_store_get() on \p h. @returns 0, OQ_ENOTFOUND, OQ_EDB. */
int oq_producer_db_get(const oq_dbh_t *h, const char *call_id, oq_call_t *out, oq_error_t *err);
/** @brief oq_store_get_by_key() on \p h. @returns 0, OQ_ENOTFOUND, OQ_EDB. */
int oq_producer_db_get_by_key(const oq_dbh_t *h, const char *tenant, const char *idem_key,
                              oq_call_t *out, oq_error_t *err);
/** @brief oq_store_audit() on \p h. */
int oq_producer_db_audit(const oq_dbh_t *h, const char *call_id, oq_audit_row_t **rows, size_t *n,
                         oq_error_t *err);
/** @brief oq_store_stats() on \p h (GET /stats's document). */
int oq_producer_db_stats(const oq_dbh_t *h, json_t **out, oq_error_t *err);
/** @brief oq_store_list() on \p h. `next` is a position of \p h's backend: pass it back as
 *         `before`, never compare it across backends. */
int oq_producer_db_list(const oq_dbh_t *h, const oq_call_query_t *q, json_t **out, oq_error_t *err);
/** @brief oq_store_purge() on \p h (PostgreSQL: settled calls only, as on SQLite). */
int oq_producer_db_purge(const oq_dbh_t *h, int64_t now_ms, int64_t key_ttl_ms, int batch,
                         oq_purge_stats_t *stats, oq_error_t *err);

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

/* --- webhooks (completion without polling) ---------------------------------------------- */

/** The sender of webhook deliveries (producer/webhooks.c; rules in decide.c). */
typedef struct oq_webhooks oq_webhooks_t;

/** Sender options. Zero-initialise, then set what you need (0 = the default said here). */
typedef struct oq_webhooks_opts {
    int concurrency;         /**< deliveries sent at once (worker threads); default 8 */
    int64_t timeout_ms;      /**< one try, connect included; default 10 s */
    int max_tries;           /**< a delivery is dead after this many tries; default 20 */
    int64_t max_age_ms;      /**< ... or when its next try would come later than this after it
                                  was queued; default 24 h */
    int64_t backoff_base_ms; /**< the delay after the first failure; default 1 s (doubles) */
    int64_t backoff_max_ms;  /**< the longest delay between tries; default 1 h */
    int64_t poll_ms;         /**< how often due deliveries are looked for; default 200 ms */
    const char *secret;      /**< the signing secret of tenants without their own (copied);
                                  NULL: none (16..512 printable ASCII bytes) */
    const char *token_file;  /**< the tenants' webhook_secret= (oq_tokens.h), read at start and
                                  by oq_webhooks_reload; NULL: none */
    const char *cacert;      /**< https: a CA bundle (NULL: the system's) */
    oq_metrics_t *metrics;   /**< optional, borrowed */
} oq_webhooks_opts_t;

/**
 * @brief Start sending the webhook deliveries of \p p's database: every delivery queued in
 *        webhook_deliveries (a settled call with a callback_url) is POSTed to its URL with
 *        `Idempotency-Key: <delivery id>` and `Onceq-Signature: t=<unix>,v1=<hex
 *        HMAC-SHA256(secret, "<t>.<body>")>` until a 2xx; other outcomes are tried again with
 *        exponential backoff and jitter until max_tries or max_age, then the delivery is dead
 *        (oq_webhooks_list). Tries are recorded through \p p's writer. \p p (borrowed) must stay
 *        open until oq_webhooks_stop() returned.
 * @returns 0 with \p out set, or OQ_EINVAL (a bad secret or token file), OQ_EDB, OQ_EIO.
 */
int oq_webhooks_start(oq_producer_t *p, const oq_webhooks_opts_t *opts, oq_webhooks_t **out,
                      oq_error_t *err);
/** @brief Stop (tries under way end within their timeout; finished ones are recorded). Call it
 *         before oq_producer_close(). NULL ok. */
void oq_webhooks_stop(oq_webhooks_t *w);
/** @brief Read the token file's secrets again (SIGHUP); on error the old ones are kept. */
int oq_webhooks_reload(oq_webhooks_t *w, oq_error_t *err);
/** @brief Non-zero when a delivery of \p tenant can be signed (it has a secret, or there is a
 *         default one). 0 for \p w NULL. */
int oq_webhooks_can_sign(oq_webhooks_t *w, const char *tenant);
/**
 * @brief The header value of Onceq-Signature for \p body at unix time \p t:
 *        "t=<t>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>", into \p out (\p cap bytes, 96 are
 *        enough). @returns 0, OQ_ENOMEM, OQ_ETOOBIG.
 */
int oq_webhook_sign(const char *secret, int64_t t, const char *body, size_t len, char *out,
                    size_t cap);
/**
 * @brief For operators (onceq dlq --webhooks-db): the dead deliveries of database \p db (a file
 *        or a PostgreSQL string), oldest death first, at most \p limit; with \p id, that one
 *        delivery in any state, its body included. @returns 0 with \p out a new JSON array.
 */
int oq_webhooks_list(const char *db, const char *id, int limit, json_t **out, oq_error_t *err);
/**
 * @brief Give dead delivery \p id (or every dead one: "all") a fresh budget: pending, 0 tries,
 *        due now; the producer's sender sends it again (same id, same body). A delivery that is
 *        not dead is left alone. Each one redriven gets an audit row on its call, event
 *        "webhook_redriven", detail {"delivery_id", "by": \p by}, in the same transaction.
 *        `onceq dlq redrive --webhooks-db` and the console both call this.
 * @param redriven receives how many were.
 */
int oq_webhooks_redrive(const char *db, const char *id, const char *by, int *redriven,
                        oq_error_t *err);

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
    int request_timeout_ms; /**< a request's line, headers and body must arrive within this of
                                 the accept or the previous request's end; default 30 s */
    int probe_slots;        /**< connections over max_conns for /healthz and /readyz only,
                                 when no slow request can be evicted; default 8; < 0 = none */
    const char *token_file; /**< API tokens, lines "TOKEN TENANT" (README "Authentication");
                                 NULL = no authentication. Borrowed: kept for oq_http_reload */
    oq_http_metrics_access_t metrics_access;
    const char *metrics_token_file;   /**< lines "TOKEN", for OQ_HTTP_METRICS_TOKEN (borrowed) */
    const struct oq_catalog *catalog; /**< tool catalogue (oq_catalog.h), borrowed, must outlive
                                           the server; NULL = none. With one, a submit naming a
                                           tool it lacks is 400 unknown_tool, arguments its
                                           input_schema refuses are 400 bad_args (nothing is
                                           written), and GET /v1/tools lists it */
    int64_t mcp_wait_ms;     /**< POST /mcp: how long a tools/call waits for its call to settle
                                  before it answers "running" (oq_mcp.h); default 30 s */
    oq_webhooks_t *webhooks; /**< the sender (borrowed), or NULL: a submit with a callback_url is
                                  then 400 webhook_secret_missing, as one whose tenant has no
                                  secret */
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
 *        Safe from any thread while the ingest runs. It goes through a producer handle of the
 *        ingest's own, not the consumer's, whose fetches it would hold up.
 * @returns 0 when a broker answered, OQ_EKAFKA otherwise.
 */
int oq_ingest_probe(oq_ingest_t *in, int timeout_ms, oq_error_t *err);

/** @brief Metrics registry the producer was opened with (may be NULL). */
oq_metrics_t *oq_producer_metrics(oq_producer_t *p);
/**
 * @brief The producer's call waiters (oq_waiters.h): arm one on a call id to be woken once the
 *        call is terminal (the writer notifies after the commit), at a deadline, or at close.
 *        Owned by \p p; valid until oq_producer_close(), which wakes whoever still waits.
 */
typedef struct oq_waiters oq_waiters_t;
oq_waiters_t *oq_producer_waiters(oq_producer_t *p);

/**
 * @brief Wait until call \p call_id is terminal (succeeded, failed, needs_review), at most
 *        \p timeout_ms, then read it: the blocking form of GET ...?wait=. A call terminal
 *        already is read at once; \p timeout_ms <= 0 does not wait.
 * @param out receives the call as it stands then (not terminal when the time ran out or the
 *        producer is closing); the caller clears it with oq_call_clear().
 * @returns 0, OQ_ENOTFOUND, OQ_EDB (as oq_producer_get).
 * @remark Blocks the calling thread; a server uses oq_producer_waiters() with a callback.
 */
int oq_producer_wait(oq_producer_t *p, const char *call_id, int64_t timeout_ms, oq_call_t *out,
                     oq_error_t *err);
/** @brief Path of the database. */
const char *oq_producer_path(const oq_producer_t *p);
/** @brief Configured key TTL (ms). */
int64_t oq_producer_key_ttl(const oq_producer_t *p);

#endif
