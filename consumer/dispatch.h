/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file dispatch.h
 * @brief Internal: the worker's dispatcher of outside calls (consumer/dispatch.c). It runs the
 *        calls and lookups of declared HTTP tools on the executor of consumer/http_tools.h
 *        from ONE thread, however many are in flight, keeps every request's claimed row
 *        until its outcome is written (the heartbeat renews those leases), and hands finished
 *        requests back to the worker's batch thread, which writes their outcomes in its next
 *        transaction. Not part of the public API.
 *
 * A job's life: the batch thread claims a row (STARTED, or RECONCILING for a lookup) and
 * commits; then oq__dispatch_send() registers the job and queues its request; the dispatcher
 * thread runs it and, when it ends, fills the job's answer and queues it as done (crash point
 * consumer.after_request_sent_before_outcome fires there when the request was sent); the batch
 * thread takes done jobs (oq__dispatch_take), writes their outcomes, commits, and only then
 * forgets them (oq__dispatch_forget), so a job's lease is renewed until its outcome is durable.
 */
#ifndef OQ_CONSUMER_DISPATCH_H
#define OQ_CONSUMER_DISPATCH_H

#include <jansson.h>
#include <stdint.h>

#include "consumer_store.h"
#include "execution.h"
#include "http_tools.h"
#include "oq_error.h"

typedef enum { OQ__JOB_CALL = 0, OQ__JOB_LOOKUP } oq__job_kind_t;

/** One outside request and its claimed row. Owned by the dispatcher between send and forget. */
typedef struct oq__job {
    oq__job_kind_t kind;
    oq__exec_row_t row;          /**< as claimed (STARTED / RECONCILING); owned */
    json_t *args;                /**< the call's arguments, parsed once (from the envelope, or
                                      the row's text at a claim) and sent as they are; owned.
                                      NULL: unreadable, answered "local_error", never sent */
    const oq__http_tool_t *tool; /**< borrowed from the tools set, which outlives the job */
    /* the answer, set by the dispatcher thread before the job is handed back */
    oq__http_class_t cls; /**< the executor's class (metrics by class) */
    int64_t elapsed_us;
    oq__outcome_t out; /**< what the answer means (oq__outcome_from_http); written as it is */
    /* the batch thread's own (never touched by the dispatcher thread) */
    int running_owed; /**< the `running` event is not told yet (oq__exec_tell_running) */
    int64_t sent_us;  /**< oq_mono_us() when the batch thread sent it */
    /* internal */
    struct oq__dispatch *d; /**< the dispatcher it was sent to (the executor's callback) */
    struct oq__job *next, *prev, *done_next;
} oq__job_t;

/** @brief A new job of \p kind for \p tool; the caller fills row and args. NULL when out of
 *         memory. */
oq__job_t *oq__job_new(oq__job_kind_t kind, const oq__http_tool_t *tool);
/** @brief Free a job that was never sent; accepts NULL. */
void oq__job_free(oq__job_t *j);

typedef struct oq__dispatch oq__dispatch_t;

/** A lease the heartbeat must renew. */
typedef struct oq__lease {
    char call_id[OQ_CALL_ID_LEN + 1];
    int64_t fence;
} oq__lease_t;

/**
 * @brief Start the dispatcher thread with an executor of \p opts (may be NULL).
 * @param wake called (from the dispatcher thread) when a job is done, to wake the batch thread.
 * @returns the dispatcher, or NULL with \p err filled.
 */
oq__dispatch_t *oq__dispatch_new(const oq__http_exec_opts_t *opts, void (*wake)(void *ctx),
                                 void *wake_ctx, oq_error_t *err);

/**
 * @brief Queue \p j's request; the dispatcher owns \p j from now on (even on failure: a job
 *        that cannot be submitted is handed back as done, RETRYABLE "local_error" for a call,
 *        UNDECIDED for a lookup, never sent).
 * @locality the batch thread.
 */
void oq__dispatch_send(oq__dispatch_t *d, oq__job_t *j);

/** @brief The done jobs, oldest first, as a list linked by done_next (NULL: none). They stay
 *         registered (leases renewed) until forgotten. @locality the batch thread. */
oq__job_t *oq__dispatch_take(oq__dispatch_t *d);

/** @brief Non-zero when done jobs wait to be taken. Thread-safe. */
int oq__dispatch_has_done(oq__dispatch_t *d);

/** @brief Wait up to \p ms for a done job (no longer than until one is there). @returns non-zero
 * when done jobs wait to be taken. @locality the batch thread, while it may take no new message. */
int oq__dispatch_wait_done(oq__dispatch_t *d, int64_t ms);

/** @brief Unregister and free \p j (its outcome is committed, or refused by the fence). */
void oq__dispatch_forget(oq__dispatch_t *d, oq__job_t *j);

/** @brief Jobs registered (sent and not forgotten). Thread-safe. */
int oq__dispatch_count(oq__dispatch_t *d);

/** @brief Copy up to \p cap leases of registered jobs into \p out. @returns the number copied.
 *         Thread-safe (the heartbeat). */
int oq__dispatch_leases(oq__dispatch_t *d, oq__lease_t *out, int cap);

/**
 * @brief Up to \p cap registered jobs that owe their `running` event and were sent at or
 *        before \p sent_before_us, into \p out (borrowed: only the batch thread forgets, so
 *        frees, jobs).
 * @locality the batch thread (it reads the jobs' running_owed and sent_us).
 */
int oq__dispatch_owing(oq__dispatch_t *d, int64_t sent_before_us, oq__job_t **out, int cap);

/**
 * @brief Begin the stop without waiting: take no new job and start no new request (queued and
 *        later ones are answered RETRYABLE / UNDECIDED "abandoned", not sent); the running
 *        requests may answer for up to \p drain_ms more (0: none). Their jobs end done as usual;
 *        the caller takes them while oq__dispatch_count() > 0, then calls oq__dispatch_stop(d, 0).
 *        Thread-safe; a second call does nothing.
 */
void oq__dispatch_drain(oq__dispatch_t *d, int64_t drain_ms);

/**
 * @brief Stop taking requests: wait up to \p drain_ms for the running ones, then abort the
 *        rest (a sent call is answered UNKNOWN "abandoned", an unsent one RETRYABLE
 *        "abandoned", a lookup UNDECIDED) and stop the thread. Every job ends done; take and
 *        forget them after.
 */
void oq__dispatch_stop(oq__dispatch_t *d, int64_t drain_ms);

/** @brief Free the dispatcher and every job still registered; accepts NULL. Stops it first. */
void oq__dispatch_destroy(oq__dispatch_t *d);

#endif
