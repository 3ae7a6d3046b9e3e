/**
 * @file producer_int.h
 * @brief Internals shared by the producer's files (not installed, not for callers).
 */
#ifndef OQ_PRODUCER_INT_H
#define OQ_PRODUCER_INT_H

#include <pthread.h>
#include <stdint.h>

#include "oq_db.h"
#include "oq_producer.h"

/** A prepared submit: validated input, canonical args, fingerprint, a fresh call id and the
 *  envelope of attempt 1, all computed outside the writer. */
struct oq_submit_job {
    /* input (owned) */
    char *tenant;
    char *idem_key;
    char *tool;
    char *args; /**< canonical JSON */
    size_t args_len;
    char *client_id; /**< may be NULL */
    int64_t seq;
    int has_seq;
    char fingerprint[OQ_FINGERPRINT_LEN + 1];
    char call_id[OQ_CALL_ID_LEN + 1]; /**< used when the key is new */
    char message_id[OQ_UUID_LEN + 1]; /**< message id of that first outbox row */
    char *payload;                    /**< envelope of attempt 1 (call_id above) */
    size_t payload_len;
    int64_t created_at;
    /* output */
    int rc;
    oq_error_t err;
    oq_submit_outcome_t outcome;
    oq_call_t call;
    int call_from_job; /**< NEW: move the input strings into call after the commit */
    /* a results batch instead of a submit (oq_producer_apply_results): applied in the
     * writer's transaction; nothing above is used */
    const struct oq_envelope *envs;
    int nenv;
    oq_result_outcome_t *outcomes; /**< per envelope; 0 = refused (not a known status) */
    /* queue */
    oq_submit_done_cb cb;
    void *opaque;
    int64_t enq_us;
    struct oq_submit_job *next;
};

/**
 * @brief The submit decision and its writes, inside an open write transaction on \p db.
 * @param cache statement cache for \p db, or NULL.
 * @returns 0 (new/replay/retry-reset), OQ_ECONFLICT, or OQ_EBUSY/OQ_EDB/OQ_ENOMEM (the
 *          caller must roll the transaction back).
 * @locality writer thread (or the caller's thread for the in-transaction API)
 */
int oq__store_submit(sqlite3 *db, oq_stmt_cache_t *cache, oq_submit_job_t *job, int64_t now_ms,
                     int64_t key_ttl_ms, oq_error_t *err);

/**
 * @brief Draw a new call id and message id for \p job and re-encode its envelope: the id it
 *        had collided with an existing call's primary key. @returns 0, OQ_ENOMEM, ...
 */
int oq__job_new_call_id(oq_submit_job_t *job, oq_error_t *err);

/**
 * @brief oq_store_apply_result() with an optional statement cache (the writer's).
 * @locality writer thread, inside its open transaction
 */
int oq__store_apply_result(sqlite3 *db, oq_stmt_cache_t *cache, const struct oq_envelope *env,
                           int64_t now_ms, oq_result_outcome_t *outcome, oq_error_t *err);

/** @brief Move the job's strings into job->call after a NEW outcome committed. */
void oq__job_finish_new(oq_submit_job_t *job);

/** Cached or one-shot statements (cache may be NULL). */
int oq__store_get(sqlite3 *db, oq_stmt_cache_t *cache, const char *call_id, oq_call_t *out,
                  oq_error_t *err);
int oq__store_get_by_key(sqlite3 *db, oq_stmt_cache_t *cache, const char *tenant,
                         const char *idem_key, oq_call_t *out, oq_error_t *err);

/** @brief Fingerprint from canonical args text (equals oq_fingerprint()). For tests. */
int oq__fingerprint_canon(const char *tenant, const char *tool, const char *args, size_t args_len,
                          char out[OQ_FINGERPRINT_LEN + 1], oq_error_t *err);

/** @brief Validation helpers shared by the API and HTTP. */
int oq__valid_key(const char *s, size_t max);
int oq__valid_tool(const char *s);

#endif
