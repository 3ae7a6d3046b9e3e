/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file tasks.h
 * @brief Internal: the task rules of producer/tasks.c (validation, references, the state
 *        machine) and the hooks the writer and the result decision call. Not installed.
 */
#ifndef OQ_TASKS_INT_H
#define OQ_TASKS_INT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "oq_tasks.h"
#include "producer_int.h"
#include "producer_store.h"

#define OQ_TASK_MAX_STEPS 64
#define OQ_TASK_MAX_NAME 64
/** A compensation is tried at most this many times (attempts), then the task needs review. */
#define OQ_TASK_COMP_ATTEMPTS 4
/** The wait before a compensation's attempt n+1: base * 2^(n-1), capped. */
#define OQ_TASK_COMP_BACKOFF_MS 500
#define OQ_TASK_COMP_BACKOFF_MAX_MS 60000

/** One step in memory: the request's part (borrowed from the task's spec) and its row. */
typedef struct oq__task_step {
    oq__task_step_row_t row; /**< progress and the calls' durable state (owned) */
    const char *tool;
    const json_t *args;
    const char *comp_tool; /**< NULL: no compensation */
    const json_t *comp_args;
    int irreversible;
    int approval;   /**< "approval": true: the task waits in awaiting_approval before it */
    json_t *result; /**< row.result parsed when needed (owned) */
    int dirty;      /**< row changed: written back by the caller */
} oq__task_step_t;

/** A task in memory (oq__task_clear). */
typedef struct oq__task {
    oq__task_row_t row;
    json_t *spec; /**< the request, parsed from row.spec */
    oq__task_step_t *steps;
    size_t n;
    int dirty;
} oq__task_t;

typedef enum { OQ__TASK_WAIT = 0, OQ__TASK_START_STEP = 1, OQ__TASK_START_COMP = 2 } oq__task_act_t;

/** Validate a request's steps (the rules of oq_task_job_new). @returns 0, or OQ_EINVAL with
 *  \p code ("bad_request", "bad_task", "bad_reference") and \p err filled. */
int oq__task_validate(const json_t *steps, size_t key_len, const char **code, oq_error_t *err);

/** Build \p t from \p spec (taken: decref'ed by oq__task_clear), every step pending. */
int oq__task_from_spec(oq__task_t *t, json_t *spec, oq_error_t *err);
void oq__task_clear(oq__task_t *t);

/** Resolve the references in \p args from the results of \p t's steps (those before \p upto,
 *  or up to and including it when \p self). @returns 0 with *out owned, or OQ_EINVAL (a
 *  missing path or step result) with \p err filled. */
int oq__task_resolve(const oq__task_t *t, const json_t *args, size_t upto, int self, json_t **out,
                     oq_error_t *err);

/** The state machine. A step's call reached \p status (running / succeeded / failed /
 *  needs_review); \p why: an extra reason (NULL). Ignored unless the step is running. */
void oq__task_on_step(oq__task_t *t, size_t i, const char *status, const char *why);
/** A compensation's call reached \p status; a failure under budget schedules a retry. */
void oq__task_on_comp(oq__task_t *t, size_t i, const char *status, int64_t now_ms);
/** What comes next (sets a terminal status when nothing does). */
oq__task_act_t oq__task_next(oq__task_t *t, size_t *idx);

/** The task's JSON (the HTTP body). */
json_t *oq__task_render(const oq__task_t *t);

/* Hooks, inside the writer's open transaction. */

/** A submit job (OQ__WORK_TASK). */
int oq__task_decide_submit(oq__producer_store_t *s, oq_task_job_t *job, int64_t now_ms, int64_t ttl,
                           int64_t max_bytes, oq_error_t *err);
/** The result \p status was just applied to \p call_id: checkpoint its step and write what
 *  comes next. Nothing when the call belongs to no task. */
int oq__task_on_result(oq__producer_store_t *s, const char *call_id, const char *status,
                       int64_t now_ms, int64_t ttl, oq_error_t *err);
/** Compensation retries that are due: each a new attempt of its call. */
int oq__task_retry_due(oq__producer_store_t *s, int64_t now_ms, int64_t ttl, int *n,
                       oq_error_t *err);
/** An operator's decision on \p task_id (oq_store_task_review), inside an open transaction:
 *  \p ttl 0 = the default key TTL. */
int oq__task_review(oq__producer_store_t *s, const char *task_id, int64_t fence, const char *as,
                    const char *by, const char *note, int64_t now_ms, int64_t ttl, json_t **out,
                    const char **code, oq_error_t *err);
/** The work item of \p job (kind OQ__WORK_TASK_REVIEW), completion as oq__task_job_prepare. */
oq__work_t *oq__task_review_job_prepare(oq_task_review_job_t *job, oq_task_review_done_cb cb,
                                        void *opaque);
/** Run \p job's decision (oq__task_review) inside the writer's open transaction. */
int oq__task_review_job_run(oq__producer_store_t *s, oq_task_review_job_t *job, int64_t now_ms,
                            int64_t ttl, oq_error_t *err);
/** The task (by id, or by tenant + key when \p task_id is NULL) as JSON (*out owned). */
int oq__task_get_json(oq__producer_store_t *s, const char *task_id, const char *tenant,
                      const char *key, json_t **out, oq_error_t *err);
/** The work item of \p job, its kind and completion set: \p cb (may be NULL: the caller sets
 *  done and opaque itself) with \p opaque. */
oq__work_t *oq__task_job_prepare(oq_task_job_t *job, oq_task_done_cb cb, void *opaque);

#endif
