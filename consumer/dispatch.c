/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dispatch.c: the worker's outside calls, on one thread.
 *
 * Design. The HTTP executor (http_tools.c) runs any number of transfers from one polling
 * thread; this file owns that thread and the bookkeeping around it, so the worker's batch
 * thread never blocks on the network and never runs a thread per request. Three lists, under
 * one mutex:
 *   - registered: every job between oq__dispatch_send() and oq__dispatch_forget(); the
 *     heartbeat renews their leases from it, so a lease is held until the outcome is durable,
 *     not merely until the answer arrived;
 *   - outbox: jobs sent by the batch thread and not yet handed to the executor (the executor's
 *     submit is thread-safe, but submitting on the polling thread keeps every executor call
 *     on one thread and lets a failed submit become an ordinary "done" job);
 *   - done: finished jobs waiting for the batch thread.
 * The executor's callback has execution.c say what the answer means (oq__outcome_from_http:
 * the one mapping of a class to an outcome; the report's pointers die with the callback, the
 * job keeps the oq__outcome_t the commit writes as it is), fires the crash point
 * consumer.after_request_sent_before_outcome for a call whose request left, queues the job as
 * done and wakes the batch thread.
 *
 * Stopping: oq__dispatch_drain() stops taking jobs and starts no new request (a queued one is
 * answered "abandoned", not sent), while the running requests go on to their answers until the
 * drain time is over; the worker writes those outcomes as they come (committed normally).
 * oq__dispatch_stop() then destroys the executor, whose callbacks answer every request still
 * running ("abandoned": UNKNOWN when it was sent, RETRYABLE when not); so every job ends done
 * and the worker writes its outcome, and a sent request whose answer never came is reconciled.
 */
#include "dispatch.h"
#include "mcp_tools.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oq_log.h"
#include "oq_util.h"

#define COMP "consumer"

struct oq__dispatch {
    oq__http_exec_t *x;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    oq__job_t *reg; /* registered (doubly linked by next/prev) */
    int nreg;
    oq__job_t *out_head, *out_tail;   /* to submit (linked by done_next) */
    oq__job_t *done_head, *done_tail; /* done (linked by done_next) */
    atomic_int ndone;
    pthread_cond_t done_cv; /* signalled at the first done job; waited on by wait_done */
    atomic_int stopping;    /* 1: drain; 2: abort now */
    int64_t drain_until_us;
    void (*wake)(void *);
    void *wake_ctx;
};

oq__job_t *oq__job_new(oq__job_kind_t kind, const oq__http_tool_t *tool)
{
    oq__job_t *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    j->kind = kind;
    j->tool = tool;
    return j;
}

void oq__job_free(oq__job_t *j)
{
    if (!j) return;
    oq__exec_row_clear(&j->row);
    json_decref(j->args);
    oq__outcome_clear(&j->out);
    free(j);
}

/* Append \p j to the list head..tail linked by done_next (under d->mu). */
static void list_append(oq__job_t **head, oq__job_t **tail, oq__job_t *j)
{
    j->done_next = NULL;
    if (*tail)
        (*tail)->done_next = j;
    else
        *head = j;
    *tail = j;
}

/* @locality the dispatcher thread (or the stopping one once the thread is gone). */
static void push_done(oq__dispatch_t *d, oq__job_t *j)
{
    pthread_mutex_lock(&d->mu);
    list_append(&d->done_head, &d->done_tail, j);
    /* one wake-up per batch of done jobs: the batch thread takes them all at once, and until it
     * does, the wake-up of the first one is pending (rd_kafka_queue_yield is remembered) */
    int first = atomic_fetch_add(&d->ndone, 1) == 0;
    if (first) pthread_cond_signal(&d->done_cv);
    pthread_mutex_unlock(&d->mu);
    if (first && d->wake) d->wake(d->wake_ctx);
}

/* The executor's callback: what the answer means (execution.c) goes into the job. */
static void on_outcome(const oq__http_outcome_t *o, void *ctx)
{
    oq__job_t *j = ctx;
    j->cls = o->cls;
    j->elapsed_us = o->elapsed_us;
    oq__mcp_answer_t m; /* an "mcp" tool's answer, as its JSON-RPC response says it */
    oq__mcp_refine(j->tool, j->kind == OQ__JOB_LOOKUP, o, &m);
    oq__outcome_from_http(&m.h, j->kind == OQ__JOB_LOOKUP, &j->out);
    oq__mcp_answer_clear(&m);
    if (j->kind == OQ__JOB_CALL && o->sent)
        OQ_CRASH_POINT("consumer.after_request_sent_before_outcome");
}

/* The executor's callback (its context is the job, which knows its dispatcher). */
static void on_done(const oq__http_outcome_t *o, void *ctx)
{
    oq__job_t *j = ctx;
    on_outcome(o, j);
    push_done(j->d, j);
}

/* A job that never left: answered here, as the executor would answer an unsent request
 * (\p abandoned: the worker is stopping, the run does not count; else "local_error"). */
static void fail_local(oq__dispatch_t *d, oq__job_t *j, int abandoned, const char *why)
{
    oq__http_outcome_t o;
    memset(&o, 0, sizeof(o));
    o.cls = j->kind == OQ__JOB_LOOKUP ? OQ__HTTP_UNDECIDED : OQ__HTTP_RETRYABLE;
    o.code = abandoned ? "abandoned" : "local_error";
    o.message = why;
    o.abandoned = abandoned;
    o.retry_after_ms = -1;
    o.tool = j->tool;
    j->cls = o.cls;
    j->elapsed_us = 0;
    oq__outcome_from_http(&o, j->kind == OQ__JOB_LOOKUP, &j->out);
    push_done(d, j);
}

/* The queued jobs (a done_next list), taken off the queue. */
static oq__job_t *take_queued(oq__dispatch_t *d)
{
    pthread_mutex_lock(&d->mu);
    oq__job_t *j = d->out_head;
    d->out_head = d->out_tail = NULL;
    pthread_mutex_unlock(&d->mu);
    return j;
}

/* Hands the queued jobs to the executor; while draining, answers them as never sent.
 * @locality the dispatcher thread. */
static void submit_queued(oq__dispatch_t *d)
{
    oq__job_t *j = take_queued(d);
    while (j) {
        oq__job_t *next = j->done_next;
        if (atomic_load(&d->stopping)) {
            fail_local(d, j, 1, "the worker is stopping: not sent");
            j = next;
            continue;
        }
        oq_error_t err = {0};
        char eid[OQ_CALL_ID_LEN + 1];
        snprintf(eid, sizeof(eid), "%s", j->row.effect_id ? j->row.effect_id : "");
        int rc = OQ_ENOMEM;
        if (j->tool && j->tool->mcp) oq__mcp_before_send(j->tool);
        if (j->args && eid[0]) {
            j->d = d;
            rc = j->kind == OQ__JOB_LOOKUP
                     ? oq__http_exec_lookup(d->x, j->tool, j->args, eid, on_done, j, &err)
                     : oq__http_exec_submit(d->x, j->tool, j->args, eid, on_done, j, &err);
        }
        if (rc) {
            OQ_LOGC_WARN(COMP, j->row.call_id, "request not submitted: %s",
                         err.msg[0] ? err.msg : "bad row");
            fail_local(d, j, rc == OQ_ESHUTDOWN,
                       err.msg[0] ? err.msg : "request could not be built");
        }
        j = next;
    }
}

static void *dispatch_main(void *arg)
{
    oq__dispatch_t *d = arg;
    for (;;) {
        int stopping = atomic_load(&d->stopping);
        if (stopping == 2) break;
        if (stopping == 1 &&
            (oq__http_exec_pending(d->x) == 0 || oq_mono_us() >= d->drain_until_us))
            break;
        submit_queued(d);
        oq_error_t err = {0};
        if (oq__http_exec_poll(d->x, 100, &err) < 0) {
            OQ_LOG_WARN(COMP, "http executor: %s", err.msg);
            oq_sleep_ms(10, NULL);
        }
    }
    submit_queued(d); /* (refused by the closing executor only after destroy: answered there) */
    return NULL;
}

oq__dispatch_t *oq__dispatch_new(const oq__http_exec_opts_t *opts, void (*wake)(void *ctx),
                                 void *wake_ctx, oq_error_t *err)
{
    oq__dispatch_t *d = calloc(1, sizeof(*d));
    if (!d) {
        oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    d->wake = wake;
    d->wake_ctx = wake_ctx;
    if (!(d->x = oq__http_exec_new(opts, err))) goto fail;
    if (pthread_create(&d->th, NULL, dispatch_main, d) != 0) {
        oq_error_set(err, OQ_EIO, 0, "dispatcher thread");
        goto fail;
    }
    pthread_setname_np(d->th, "oq-http");
    d->started = 1;
    return d;
fail:
    oq__http_exec_destroy(d->x);
    pthread_cond_destroy(&d->done_cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
    return NULL;
}

void oq__dispatch_send(oq__dispatch_t *d, oq__job_t *j)
{
    pthread_mutex_lock(&d->mu);
    j->prev = NULL;
    j->next = d->reg;
    if (d->reg) d->reg->prev = j;
    d->reg = j;
    d->nreg++;
    int closed = atomic_load(&d->stopping) != 0;
    int first = d->out_head == NULL; /* else the first queued job's wake-up is still pending */
    if (!closed) list_append(&d->out_head, &d->out_tail, j);
    pthread_mutex_unlock(&d->mu);
    if (closed)
        fail_local(d, j, 1, "the worker is stopping: not sent");
    else if (first)
        oq__http_exec_wakeup(d->x);
}

oq__job_t *oq__dispatch_take(oq__dispatch_t *d)
{
    if (!d || atomic_load(&d->ndone) == 0) return NULL;
    pthread_mutex_lock(&d->mu);
    oq__job_t *j = d->done_head;
    d->done_head = d->done_tail = NULL;
    atomic_store(&d->ndone, 0);
    pthread_mutex_unlock(&d->mu);
    return j;
}

int oq__dispatch_has_done(oq__dispatch_t *d)
{
    return d && atomic_load(&d->ndone) > 0;
}

int oq__dispatch_wait_done(oq__dispatch_t *d, int64_t ms)
{
    if (!d) return 0;
    struct timespec until;
    oq_mono_deadline(&until, ms * 1000);
    pthread_mutex_lock(&d->mu);
    while (atomic_load(&d->ndone) == 0)
        if (pthread_cond_timedwait(&d->done_cv, &d->mu, &until) != 0) break;
    pthread_mutex_unlock(&d->mu);
    return atomic_load(&d->ndone) > 0;
}

void oq__dispatch_forget(oq__dispatch_t *d, oq__job_t *j)
{
    pthread_mutex_lock(&d->mu);
    if (j->prev)
        j->prev->next = j->next;
    else if (d->reg == j)
        d->reg = j->next;
    if (j->next) j->next->prev = j->prev;
    d->nreg--;
    pthread_mutex_unlock(&d->mu);
    oq__job_free(j);
}

int oq__dispatch_count(oq__dispatch_t *d)
{
    if (!d) return 0;
    pthread_mutex_lock(&d->mu);
    int n = d->nreg;
    pthread_mutex_unlock(&d->mu);
    return n;
}

int oq__dispatch_leases(oq__dispatch_t *d, oq__lease_t *out, int cap)
{
    int n = 0;
    if (!d) return 0;
    pthread_mutex_lock(&d->mu);
    for (oq__job_t *j = d->reg; j && n < cap; j = j->next) {
        snprintf(out[n].call_id, sizeof(out[n].call_id), "%s", j->row.call_id);
        out[n].fence = j->row.fence;
        n++;
    }
    pthread_mutex_unlock(&d->mu);
    return n;
}

int oq__dispatch_owing(oq__dispatch_t *d, int64_t sent_before_us, oq__job_t **out, int cap)
{
    int n = 0;
    if (!d) return 0;
    pthread_mutex_lock(&d->mu);
    for (oq__job_t *j = d->reg; j && n < cap; j = j->next)
        if (j->running_owed && j->sent_us <= sent_before_us) out[n++] = j;
    pthread_mutex_unlock(&d->mu);
    return n;
}

void oq__dispatch_drain(oq__dispatch_t *d, int64_t drain_ms)
{
    if (!d || !d->started || atomic_load(&d->stopping)) return;
    d->drain_until_us = oq_mono_us() + (drain_ms > 0 ? drain_ms : 0) * 1000;
    oq__http_exec_drain(d->x); /* nothing new starts; the running go on */
    atomic_store(&d->stopping, drain_ms > 0 ? 1 : 2);
    oq__http_exec_wakeup(d->x);
}

void oq__dispatch_stop(oq__dispatch_t *d, int64_t drain_ms)
{
    if (!d || !d->started) return;
    oq__dispatch_drain(d, drain_ms);
    if (drain_ms <= 0) atomic_store(&d->stopping, 2);
    oq__http_exec_wakeup(d->x);
    pthread_join(d->th, NULL);
    d->started = 0;
    /* every request still running or queued is answered now ("abandoned") */
    oq__http_exec_destroy(d->x);
    d->x = NULL;
    oq__job_t *j = take_queued(d);
    while (j) {
        oq__job_t *next = j->done_next;
        fail_local(d, j, 1, "the worker stopped before the request was sent");
        j = next;
    }
}

void oq__dispatch_destroy(oq__dispatch_t *d)
{
    if (!d) return;
    oq__dispatch_stop(d, 0);
    oq__http_exec_destroy(d->x);
    for (oq__job_t *j = d->reg, *next; j; j = next) {
        next = j->next;
        oq__job_free(j);
    }
    pthread_cond_destroy(&d->done_cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
}
