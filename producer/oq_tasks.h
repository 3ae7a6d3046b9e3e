/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_tasks.h
 * @brief Tasks: an agent's run of steps, each step an ordinary onceq call with a derived key,
 *        checkpointed in the transaction that applies each result, compensated in reverse
 *        order when a step fails for good (producer/tasks.c has the rules).
 *
 * A task request is `{"tenant"?: "...", "steps": [{"name", "tool", "args", "compensate"?:
 * {"tool", "args"}, "irreversible"?: bool}, ...]}` under an idempotency key. Submitting it
 * writes the task, its steps and the first step's call (and outbox row) in one transaction;
 * every later call is written by the results ingest when the previous result is applied.
 *
 * Thread-safety: a job belongs to one thread at a time; the producer functions are safe from
 * any thread. Tasks run on either producer store (SQLite calls.db, PostgreSQL schema onceq);
 * the functions that take a caller's sqlite3 connection (oq_store_task_*,
 * oq_producer_task_submit_in_tx) are SQLite's.
 */
#ifndef OQ_TASKS_H
#define OQ_TASKS_H

#include <jansson.h>
#include <sqlite3.h>
#include <stdint.h>

#include "oq_error.h"
#include "oq_producer.h"

/** A task submit prepared off the writer (validated, canonicalised, fingerprinted). */
typedef struct oq_task_job oq_task_job_t;

/** What a task submit did. */
typedef enum {
    OQ_TASK_NEW = 1,     /**< written: the task, its steps, the first step's call */
    OQ_TASK_REPLAY = 2,  /**< the key had this very task: nothing written */
    OQ_TASK_CONFLICT = 3 /**< the key had another request: nothing written (OQ_ECONFLICT) */
} oq_task_outcome_t;

/**
 * @brief Validate \p body (the request object) under \p idem_key and prepare its job.
 * @param tenant overrides the body's tenant when not NULL (a bearer token's tenant).
 * @param code set on OQ_EINVAL to the stable error code: "bad_request" (shape, types, unknown
 *        members), "bad_task" (duplicate step names, an irreversible step before a compensated
 *        one, derived keys too long) or "bad_reference" (a reference to an unknown, later or
 *        malformed step result). May be NULL.
 * @returns 0 with \p out set (oq_task_job_destroy), OQ_EINVAL or OQ_ENOMEM. Borrows nothing.
 */
int oq_task_job_new(const char *tenant, const char *idem_key, const json_t *body,
                    oq_task_job_t **out, const char **code, oq_error_t *err);

/** @brief Free a job (NULL ok). */
void oq_task_job_destroy(oq_task_job_t *job);

/** Completion of oq_producer_task_submit_async(), on the writer thread after the commit. */
typedef void (*oq_task_done_cb)(oq_task_job_t *job, void *opaque);

/** @brief Queue \p job for the writer; \p cb runs once after its commit (or failure).
 *  @returns 0 or OQ_ESHUTDOWN (cb will not run). */
int oq_producer_task_submit_async(oq_producer_t *p, oq_task_job_t *job, oq_task_done_cb cb,
                                  void *opaque);

/** @brief Submit \p job and wait for its commit. @returns as oq_task_job_result(). */
int oq_producer_task_submit(oq_producer_t *p, oq_task_job_t *job, oq_error_t *err);

/**
 * @brief The outcome of a job that completed.
 * @param task set to the task's JSON as it stood at the commit (borrowed from the job).
 * @returns 0 (new / replay), OQ_ECONFLICT, or the error that failed it.
 */
int oq_task_job_result(oq_task_job_t *job, oq_task_outcome_t *outcome, const json_t **task,
                       oq_error_t *err);

/**
 * @brief The task \p task_id, or of (\p tenant, \p idem_key) when \p task_id is NULL, as JSON
 *        (*out owned: json_decref). @returns 0, OQ_ENOTFOUND, or a database error.
 */
int oq_producer_task_get(oq_producer_t *p, const char *task_id, const char *tenant,
                         const char *idem_key, json_t **out, oq_error_t *err);

/* The same read on a caller's connection to calls.db (the CLI, a service): oq_store_task_get
 * in oq_client.h (libonceq), with oq_producer_task_submit_in_tx. */

/** @brief Tasks newest first (\p status NULL = any), as a JSON array of task objects
 *         (oq_producer_db_tasks' first page). */
int oq_store_task_list(sqlite3 *db, const char *status, int limit, json_t **out, oq_error_t *err);

/** A page of tasks for operators (`onceq tasks list`, the console). Every filter optional. */
typedef struct oq_task_query {
    const char *status;  /**< running, succeeded, compensating, compensated, failed, needs_review */
    const char *tenant;  /**< one tenant's tasks (a tenant's token sets it) */
    const char *task_id; /**< this task only */
    const char *idem_key; /**< the task(s) of this key (one per tenant) */
    int64_t before;       /**< a page's `next`: the tasks before it; 0: the newest */
    int limit;            /**< at most this many (<= 0: 100) */
} oq_task_query_t;

/**
 * @brief A page of tasks, newest first: {"tasks": [task JSON as GET /v1/tasks/{id}...],
 *        "next": N or null}. \p h is the producer's database (oq_dbh.h).
 * @returns 0 with \p out a new reference; OQ_EDB, OQ_ENOMEM.
 */
int oq_producer_db_tasks(const oq_dbh_t *h, const oq_task_query_t *q, json_t **out,
                         oq_error_t *err);

/** @brief oq_store_task_get() on an operator's handle (either backend). @returns as it. */
int oq_producer_db_task_get(const oq_dbh_t *h, const char *task_id, const char *tenant,
                            const char *idem_key, json_t **out, oq_error_t *err);

/**
 * @brief Tasks by status, as the producer's onceq_producer_tasks gauges count them:
 *        {"running": n, "succeeded", "compensating", "compensated", "failed", "needs_review",
 *        "compensations": {"compensated": n, "needs_review": n}}; \p tenant's (NULL: all).
 * @returns 0 with \p out a new reference; OQ_EDB, OQ_ENOMEM.
 */
int oq_producer_db_task_counts(const oq_dbh_t *h, const char *tenant, json_t **out,
                               oq_error_t *err);

/**
 * @brief An operator's decision on a task, in one transaction on a caller's connection to
 *        calls.db (`onceq review resolve t_...`), audited (audit.call_id = \p task_id, event
 *        `task_review`, with \p as, \p by, \p note, \p fence).
 * @param fence the task's review episode the decision was made on (its "fence").
 * @param as awaiting_approval: "approve" (the waiting step is written and runs) or "reject"
 *        (it and every later step skipped; what ran is compensated in reverse); needs_review:
 *        "compensated" or "succeeded" (the operator settled it outside onceq) or
 *        "retry-compensation" (the compensation that spent its budget: a fresh budget, a new
 *        attempt of the same call now).
 * @param out the task as committed (owned; may be NULL).
 * @param code on error, the stable code: bad_request, not_found, not_awaiting_approval,
 *        not_in_review, not_retryable, review_moved.
 * @returns 0; OQ_EINVAL, OQ_ENOTFOUND, OQ_ESTATE (not in that status), OQ_ECONFLICT (the fence
 *          moved): nothing written.
 */
int oq_store_task_review(sqlite3 *db, const char *task_id, int64_t fence, const char *as,
                         const char *by, const char *note, json_t **out, const char **code,
                         oq_error_t *err);

/** @brief oq_store_task_review() on an operator's handle (oq_dbh.h: SQLite or PostgreSQL), in a
 *         transaction of its own; the same rules, codes and returns. */
int oq_producer_db_task_review(const oq_dbh_t *h, const char *task_id, int64_t fence,
                               const char *as, const char *by, const char *note, json_t **out,
                               const char **code, oq_error_t *err);

/** An operator's decision queued for the producer's writer (POST /v1/tasks/{id}/resolve). */
typedef struct oq_task_review_job oq_task_review_job_t;

/**
 * @brief Prepare the decision \p as on \p task_id made on review episode \p fence by \p by
 *        (the rules and the values of oq_store_task_review). Copies every string.
 * @returns 0 with \p out set (oq_task_review_job_destroy); OQ_ENOTFOUND (not a task id),
 *          OQ_EINVAL (a missing member), OQ_ENOMEM.
 */
int oq_task_review_job_new(const char *task_id, int64_t fence, const char *as, const char *by,
                           const char *note, oq_task_review_job_t **out, oq_error_t *err);

/** @brief Free a review job (NULL ok). */
void oq_task_review_job_destroy(oq_task_review_job_t *job);

/** Completion of oq_producer_task_review_async(), on the writer thread after the commit. */
typedef void (*oq_task_review_done_cb)(oq_task_review_job_t *job, void *opaque);

/**
 * @brief Queue \p job for the writer: the decision runs through oq_store_task_review's rules
 *        (oq__task_review) inside a group-commit transaction, audited, fenced. \p cb runs once
 *        after its commit (or failure). @returns 0 or OQ_ESHUTDOWN (cb will not run).
 */
int oq_producer_task_review_async(oq_producer_t *p, oq_task_review_job_t *job,
                                  oq_task_review_done_cb cb, void *opaque);

/**
 * @brief The outcome of a review job that completed.
 * @param task the task as committed (borrowed from the job), NULL on error.
 * @param code on error, oq_store_task_review's stable code (NULL for a database error).
 * @returns 0, or as oq_store_task_review (OQ_EINVAL, OQ_ENOTFOUND, OQ_ESTATE, OQ_ECONFLICT:
 *          nothing written), or the database error that rolled the batch back.
 */
int oq_task_review_job_result(oq_task_review_job_t *job, const json_t **task, const char **code,
                              oq_error_t *err);

/** @brief Non-zero for a terminal task status (succeeded, compensated, failed, needs_review). */
int oq_task_status_terminal(const char *status);

#endif
