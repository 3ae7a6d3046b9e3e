/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file producer_int.h
 * @brief Internals shared by the producer's files (not installed, not for callers).
 *
 * The files and who calls whom (no cycle; SQL only in store.c):
 *   producer.c  the oq_producer_t object: open/close, the read pool, the public entry points
 *               -> writer.c, submit.c, store.c
 *   writer.c    the writer thread: queue of work items, group commit, checkpoints
 *               -> decide.c, submit.c
 *   decide.c    the rules: submit (new / replay / conflict / expired key / retry-reset) and
 *               result apply (duplicate / unknown / stale / ignored / applied), retention
 *               -> store.c, submit.c
 *   submit.c    a submit request prepared outside the writer (oq_submit_job_t)
 *   store.c     every SQL statement (producer_store.h)
 *   call.c      oq_call_t and its one JSON writer
 *   waiters.c   call waiters (oq_waiters.h), owned and notified by the writer after commits
 *   webhooks.c  the webhook sender: reads due deliveries, POSTs them signed, records the tries
 *               through the writer (oq__producer_webhook_marks) -> decide.c, store.c
 *   http.c, ingest.c  the HTTP API and the results consumer, on the public API
 */
#ifndef OQ_PRODUCER_INT_H
#define OQ_PRODUCER_INT_H

#include <stdint.h>

#include "oq_envelope.h"
#include "oq_json.h"
#include "oq_metrics.h"
#include "oq_producer.h"
#include "oq_util.h"
#include "oq_waiters.h"
#include "producer_store.h"

/* --- work items of the writer's queue ------------------------------------------------------ */

typedef enum {
    OQ__WORK_SUBMIT = 1,     /**< an oq_submit_job_t */
    OQ__WORK_RESULTS = 2,    /**< an oq__results_t */
    OQ__WORK_REDRIVE = 3,    /**< an oq__redrive_t */
    OQ__WORK_WEBHOOKS = 4,   /**< an oq__webhook_marks_t */
    OQ__WORK_TASK = 5,       /**< an oq_task_job_t (producer/tasks.c) */
    OQ__WORK_TASK_REVIEW = 6 /**< an oq_task_review_job_t (producer/tasks.c) */
} oq__work_kind_t;

typedef struct oq__work oq__work_t;

/** Completion of a work item, on the writer thread after the commit (or the failure). It must
 *  not block. */
typedef void (*oq__work_done_cb)(oq__work_t *w, void *opaque);

/** The header every work item starts with. */
struct oq__work {
    oq__work_kind_t kind;
    int rc;         /**< 0, OQ_ECONFLICT, or the error that failed it */
    oq_error_t err; /**< with rc */
    oq__work_done_cb done;
    void *opaque;
    int64_t enq_us; /**< monotonic time it was queued */
    oq__work_t *next;
};

/** A submit prepared outside the writer (oq_submit_job_new): validated input, canonical args,
 *  fingerprint, a fresh call id and the envelope of attempt 1; the writer runs only SQL. */
struct oq_submit_job {
    oq__work_t work; /**< first member: a job is a work item */
    /* input (owned) */
    char *tenant;
    char *idem_key;
    char *tool;
    char *args; /**< canonical JSON */
    size_t args_len;
    char *client_id; /**< may be NULL */
    int64_t seq;
    int has_seq;
    char *callback_url; /**< may be NULL: stored with a new call (not in the fingerprint) */
    char fingerprint[OQ_FINGERPRINT_LEN + 1];
    char call_id[OQ_CALL_ID_LEN + 1]; /**< used when the key is new */
    char message_id[OQ_UUID_LEN + 1]; /**< message id of that first outbox row */
    char *payload;                    /**< envelope of attempt 1 (call_id above) */
    size_t payload_len;
    int64_t created_at;
    /* output, set by the decision */
    oq_submit_outcome_t outcome;
    oq_call_t call;
    int call_from_job;    /**< NEW: the input strings move into call after the commit */
    oq_submit_done_cb cb; /**< of oq_producer_submit_async(); its opaque is work.opaque */
};

/** A batch of tool_result envelopes (oq_producer_apply_results), applied in the writer's
 *  transaction with the submits queued around it. */
typedef struct oq__results {
    oq__work_t work;           /**< first member */
    const oq_envelope_t *envs; /**< borrowed */
    int n;
    oq_result_outcome_t *outcomes; /**< per envelope; 0 = refused (not a known status) */
} oq__results_t;

/** A redrive pass (oq_producer_redrive), run in the writer's transaction. */
typedef struct oq__redrive {
    oq__work_t work; /**< first member */
    int limit;
    oq_redrive_stats_t stats; /**< output */
} oq__redrive_t;

/** Outcomes of webhook tries (webhooks.c), written in the writer's transaction. */
typedef struct oq__webhook_marks {
    oq__work_t work; /**< first member */
    const oq__producer_delivery_mark_t *marks;
    int n;
} oq__webhook_marks_t;

/** How long and how often a webhook delivery is tried (oq_webhooks_opts_t, resolved). */
typedef struct oq__webhook_policy {
    int max_tries;
    int64_t max_age_ms, backoff_base_ms, backoff_max_ms;
} oq__webhook_policy_t;

/** What one try of a delivery came to. */
typedef struct oq__webhook_try {
    long status;            /**< the HTTP status, 0 when no answer came */
    int64_t retry_after_ms; /**< the answer's Retry-After, -1 when none */
    const char *error;      /**< why it failed, "" or NULL when it did not */
} oq__webhook_try_t;

/* --- submit.c: the prepared request -------------------------------------------------------- */

/**
 * @brief Draw a new call id and message id for \p job and re-encode its envelope: the id it
 *        had is taken by another call. @returns 0 or OQ_ENOMEM.
 */
int oq__job_new_ids(oq_submit_job_t *job, oq_error_t *err);

/** @brief After a NEW outcome committed: move the job's strings into job->call. */
void oq__job_finish_new(oq_submit_job_t *job);

/* --- decide.c: the rules ------------------------------------------------------------------- */

/**
 * @brief The submit decision and its writes, inside an open write transaction on \p s.
 *        Sets job->outcome and job->call (on NEW, after oq__job_finish_new()).
 * @param max_message_bytes the relay's limit (0 = no check): a message over it is refused with
 *        OQ_ETOOBIG when the submit would publish it, and nothing is written.
 * @returns 0 (new / replay / retry-reset), OQ_ECONFLICT, OQ_ETOOBIG, or OQ_EBUSY/OQ_EDB/
 *          OQ_ENOMEM/OQ_ESTATE (the caller must roll the transaction back).
 * @locality writer thread (or the caller's thread for the in-transaction API)
 */
/** The in-transaction submit on any store (oq_producer_submit_in_tx, _in_pgtx): the caller's
 *  open transaction, nothing committed. */
int oq__submit_in_store(oq__producer_store_t *s, const oq_submit_req_t *req, int64_t key_ttl_ms,
                        oq_call_t *call, oq_submit_outcome_t *outcome, oq_error_t *err);
/** Retention on any store: purge batches until none is full (oq_producer_purge). */
int oq__purge_in_store(oq__producer_store_t *s, int64_t now_ms, int64_t key_ttl_ms, int batch,
                       oq_purge_stats_t *stats, oq_error_t *err);
int oq__decide_submit(oq__producer_store_t *s, oq_submit_job_t *job, int64_t now_ms,
                      int64_t key_ttl_ms, int64_t max_message_bytes, oq_error_t *err);
/** Before the decisions of a batch: the new calls its submits would insert, in one store
 *  operation (oq__producer_store_insert_calls); each oq__decide_submit() then decides as
 *  usual. */
int oq__decide_submit_ahead(oq__producer_store_t *s, oq__work_t **items, int n, int64_t now_ms,
                            int64_t key_ttl_ms, int64_t max_message_bytes, oq_error_t *err);

/** Told the id of each call a decision made terminal, inside the transaction (so: remember
 *  it, act after the commit). */
typedef void (*oq__settled_cb)(const char *call_id, void *arg);

/**
 * @brief Fail the calls of up to \p max unhandled dead letters (outbox_dead) and mark them
 *        handled, inside an open write transaction on \p s (see oq_store_fail_dead_letters).
 * @param failed, handled incremented per call failed / row handled; may be NULL.
 * @param settled called with each call failed (may be NULL), \p arg its argument.
 * @returns 0, or a database error (roll back: nothing of it holds).
 * @locality writer thread (or the caller's thread for oq_store_fail_dead_letters)
 */
int oq__decide_dead_letters(oq__producer_store_t *s, int64_t now_ms, int64_t ttl, int max,
                            int *failed, int *handled, oq__settled_cb settled, void *arg,
                            oq_error_t *err);

/**
 * @brief The result decision for each of \p n envelopes, inside an open write transaction.
 *        An envelope that is not a tool_result with a known status gets outcome 0 and writes
 *        nothing. @returns 0, or a database error (roll back: nothing of the batch holds).
 * @locality writer thread
 */
int oq__decide_results(oq__producer_store_t *s, const oq_envelope_t *envs, int n,
                       oq_result_outcome_t *outcomes, int64_t now_ms, int64_t ttl, oq_error_t *err);

/**
 * @brief One redrive pass inside an open write transaction (see oq_producer_redrive()): up to
 *        \p limit due calls, each republished, rescheduled or unscheduled. \p stats is zeroed
 *        first. @returns 0, or a database error (roll back: nothing of the pass holds).
 * @locality writer thread
 */
int oq__decide_redrive(oq__producer_store_t *s, int64_t now_ms, int64_t redrive_after_ms, int limit,
                       oq_redrive_stats_t *stats, oq_error_t *err);

/**
 * @brief Webhooks, rule 2 (see the top of decide.c): the row change after try \p t of \p d at
 *        \p now_ms, into \p m (its strings borrowed from \p d and \p t). Pure: no I/O.
 */
void oq__decide_webhook_try(const oq__producer_delivery_t *d, const oq__webhook_try_t *t,
                            const oq__webhook_policy_t *pol, int64_t now_ms,
                            oq__producer_delivery_mark_t *m);

/** @brief Store \p n try outcomes inside an open write transaction (a delivery no longer
 *  pending, e.g. redriven meanwhile, is left alone). @locality writer thread */
int oq__decide_webhook_marks(oq__producer_store_t *s, const oq__producer_delivery_mark_t *marks,
                             int n, oq_error_t *err);

/** @brief Run \p n marks through \p p's writer (a work item of the next group commit) and wait.
 *  @returns 0, OQ_EBUSY/OQ_EDB (nothing of it holds: the deliveries are sent again, which the
 *  receivers dedupe), OQ_ESHUTDOWN. */
int oq__producer_webhook_marks(oq_producer_t *p, const oq__producer_delivery_mark_t *marks, int n,
                               oq_error_t *err);

/* --- writer.c: the writer thread ----------------------------------------------------------- */

typedef struct oq__writer oq__writer_t;

/**
 * @brief Open the writer's connection on \p path (migrating the producer schema) and start the
 *        writer and checkpointer threads. \p o has its defaults resolved (key_ttl_ms,
 *        max_batch, checkpoint_pages, redrive_after_ms; metrics may be NULL and is borrowed).
 * @returns 0 with \p out set (oq__writer_close), or OQ_EDB/OQ_EIO/OQ_ENOMEM/...
 */
int oq__writer_open(const char *path, const oq_producer_opts_t *o, oq__writer_t **out,
                    oq_error_t *err);

/** @brief Run what is queued, stop the threads, close the connections. NULL ok. */
void oq__writer_close(oq__writer_t *w);

/** @brief The call waiters the writer notifies after each commit that made calls terminal
 *         (results applied, dead letters failed). Owned by the writer. */
oq_waiters_t *oq__writer_waiters(oq__writer_t *w);

/**
 * @brief Queue \p item (its kind, done and opaque set); done runs once on the writer thread.
 * @returns 0, or OQ_ESHUTDOWN (done will not run).
 */
int oq__writer_enqueue(oq__writer_t *w, oq__work_t *item);

/** The fields of a tool_call message, borrowed (\p args: canonical JSON text). */
typedef struct oq__call_message {
    const char *message_id, *call_id, *tenant, *idem_key, *fingerprint, *tool, *args;
    size_t args_len;
    int64_t attempt, created_at;
} oq__call_message_t;

/**
 * @brief The one place the producer builds a tool_call envelope (first attempt, retry reset,
 *        redrive): common's encoder over canonical args. @returns 0 or OQ_E* (*out owned).
 */
int oq__call_message_encode(const oq__call_message_t *m, char **out, size_t *out_len,
                            oq_error_t *err);

#endif
