/* SPDX-License-Identifier: Apache-2.0 */
/*
 * outside.c: the worker's side of outside calls (the HTTP tools of the --tools file): jobs
 * handed to the dispatcher (consumer/dispatch.c) and their outcomes brought back to the batch
 * transaction.
 *
 * A new call's execution is STARTED in the batch transaction (oq__outside_start), a due one
 * claimed in the scheduler's (oq__outside_claim); either queues a job in c->sends, and the jobs
 * go to the dispatcher only after that transaction commits (oq__outside_flush; a rollback drops
 * them: oq__outside_drop), so STARTED is durable before a request leaves. Recovery's lookups of
 * RECONCILING rows go the same way (oq__outside_send_lookups). Answers come back as done jobs:
 * the next batch transaction takes them (oq__outside_take), writes their outcomes with the
 * same finish path as every run (oq__outside_apply), and only after it commits are the jobs
 * forgotten (oq__outside_forget), so the heartbeat renews a job's lease until its outcome is
 * durable (oq__outside_renew: all of them in one transaction per beat). The `running` event
 * is not part of the start: a job owes it, and it is told (oq__exec_tell_running) when the
 * outcome written is not final, or by oq__outside_tell_running for a request still out
 * OQ__RUNNING_AFTER_MS after it left; a call answered at once costs one result message, not
 * two (each is an outbox row, a Kafka message and a producer transaction's share).
 *
 * Threads: everything here runs on the main (batch) thread, except oq__outside_wake (the
 * dispatcher thread) and oq__outside_renew (the heartbeat thread, on c->hb_store). c->sends
 * and c->outcomes belong to the main thread; the dispatcher's lists have their own mutex.
 */
#include "worker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_log.h"
#include "oq_util.h"

/* The dispatcher has a done job: cut the batch thread's Kafka wait short. */
void oq__outside_wake(void *ctx)
{
    oq_consumer_t *c = ctx;
    if (c->cq) rd_kafka_queue_yield(c->cq);
}

/* --- outside calls -----------------------------------------------------------------------------
 */

/* The arguments a job carries to its request: \p parsed (the envelope's tree: a reference is
 * taken) or, for a row claimed from the database, its text parsed once, here. NULL when
 * unreadable (the dispatcher answers "local_error", nothing is sent). */
static json_t *job_args(const oq__exec_row_t *x, const json_t *parsed)
{
    if (parsed) return json_incref((json_t *)parsed);
    return json_loads(x->args ? x->args : "{}", 0, NULL);
}

/* Queues a job for the claimed row \p x (its strings move to the job) with its arguments
 * \p args (owned; moved to the job), to be sent once the open transaction commits: STARTED
 * (or RECONCILING) is durable before the request leaves. \p owed: the run's `running` event
 * is not told yet (see oq__outside_tell_running). */
static int queue_send(oq_consumer_t *c, oq__job_kind_t kind, const oq__http_tool_t *tool,
                      oq__exec_row_t *x, json_t *args, int owed, oq_error_t *err)
{
    if (c->nsends == c->csends) {
        int cap = c->csends ? c->csends * 2 : 64;
        oq__job_t **ns = realloc(c->sends, (size_t)cap * sizeof(*ns));
        if (!ns) {
            json_decref(args);
            return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        }
        c->sends = ns;
        c->csends = cap;
    }
    oq__job_t *j = oq__job_new(kind, tool);
    if (!j) {
        json_decref(args);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    j->args = args;
    j->row = *x;
    j->running_owed = owed;
    memset(x, 0, sizeof(*x));
    c->sends[c->nsends++] = j;
    return 0;
}

/* The transaction rolled back: nothing was claimed, nothing is sent. */
void oq__outside_drop(oq_consumer_t *c)
{
    for (int i = 0; i < c->nsends; i++)
        oq__job_free(c->sends[i]);
    c->nsends = 0;
}

/* The transaction committed: the requests may leave. */
void oq__outside_flush(oq_consumer_t *c)
{
    int64_t now = oq_mono_us();
    for (int i = 0; i < c->nsends; i++) {
        c->sends[i]->sent_us = now;
        oq__dispatch_send(c->disp, c->sends[i]);
    }
    c->nsends = 0;
}

/* In tx: the first run of a NEW call of the HTTP tool \p tool: STARTED now, sent after commit. */
int oq__outside_start(oq_consumer_t *c, const oq_envelope_t *env, const oq__http_tool_t *tool,
                      int64_t now, oq_error_t *err)
{
    oq__exec_row_t x;
    memset(&x, 0, sizeof(x));
    int rc = oq__exec_start_owing(c->store, env, c->o.lease_ms, now, &x, err);
    if (rc == 0) rc = queue_send(c, OQ__JOB_CALL, tool, &x, job_args(&x, env->args), 1, err);
    oq__exec_row_clear(&x);
    return rc;
}

/* In tx: claim the due (or re-planned) \p call_id of the HTTP tool \p tool; sent after commit.
 * Not due or taken by another worker: nothing to do. */
int oq__outside_claim(oq_consumer_t *c, const char *call_id, const oq__http_tool_t *tool,
                      int64_t now, oq_error_t *err)
{
    oq__exec_row_t x;
    memset(&x, 0, sizeof(x));
    int owed = 0;
    int rc = oq__exec_claim_owing(c->store, call_id, c->o.lease_ms, now, &owed, &x, err);
    if (rc == OQ_ESTATE) return 0;
    if (rc == 0) rc = queue_send(c, OQ__JOB_CALL, tool, &x, job_args(&x, NULL), owed, err);
    oq__exec_row_clear(&x);
    return rc;
}

/* Counts a finished request: per tool and class, and its latency. */
static void count_request(oq_consumer_t *c, const oq__job_t *j)
{
    atomic_fetch_add(&c->n_requests, 1);
    if (!c->tools || j->tool < c->tools->tools || j->tool >= c->tools->tools + c->tools->n) return;
    tool_metrics_t *tm = &c->tmetrics[j->tool - c->tools->tools];
    if (j->cls >= OQ__HTTP_SUCCESS && j->cls <= OQ__HTTP_UNDECIDED) {
        oq_counter_add(tm->by_class[j->cls], 1);
        atomic_fetch_add(&tm->n_class[j->cls], 1);
    }
    oq_histogram_observe(tm->latency, (double)j->elapsed_us / 1e6);
    oq__lat_ring_add(&tm->ring, (double)j->elapsed_us / 1000.0);
}

/*
 * Admission. Every job the worker holds has its execution STARTED and leased: the call is the
 * worker's until its outcome is written. So it takes no more than it can finish inside its
 * lease: at most twice --http-inflight (one window of requests running, one queued behind it,
 * so the executor never idles between batches), and, once the rate at which outcomes come back
 * is known, at most what that rate finishes in half a lease (never under --http-inflight, so a
 * slow start cannot shut the door). The rest stays in Kafka, where another worker of the group
 * can take it, instead of queueing here with its lease ticking: before this, a worker took up
 * to four times --http-inflight (4,096) and the queue it built was the backlog the results
 * waited behind.
 */
int oq__outside_admit_limit(oq_consumer_t *c, int64_t now_us)
{
    uint64_t n = atomic_load(&c->n_requests);
    if (c->rate_t0_us == 0) {
        c->rate_t0_us = now_us;
        c->rate_n0 = n;
    } else if (now_us - c->rate_t0_us >= 1000000) {
        double r = (double)(n - c->rate_n0) * 1e6 / (double)(now_us - c->rate_t0_us);
        c->out_rate = c->out_rate > 0 ? 0.5 * c->out_rate + 0.5 * r : r;
        c->rate_t0_us = now_us;
        c->rate_n0 = n;
    }
    int64_t limit = 2 * (int64_t)c->o.http_inflight;
    if (c->out_rate > 0) {
        int64_t in_lease = (int64_t)(c->out_rate * (double)c->o.lease_ms / 2000.0);
        if (in_lease < c->o.http_inflight) in_lease = c->o.http_inflight;
        if (in_lease < limit) limit = in_lease;
    }
    return (int)limit;
}

/* Takes the done jobs for the next transaction (they stay registered until it commits). */
void oq__outside_take(oq_consumer_t *c)
{
    oq__job_t *j = oq__dispatch_take(c->disp), *tail = c->outcomes;
    if (!j) return;
    while (tail && tail->done_next)
        tail = tail->done_next;
    if (tail)
        tail->done_next = j;
    else
        c->outcomes = j;
    for (; j; j = j->done_next) {
        count_request(c, j);
        c->noutcomes++;
    }
}

/* The outcomes are committed (or cannot be): forget the jobs, their leases are not needed. */
void oq__outside_forget(oq_consumer_t *c)
{
    for (oq__job_t *j = c->outcomes, *next; j; j = next) {
        next = j->done_next;
        oq__dispatch_forget(c->disp, j);
    }
    c->outcomes = NULL;
    c->noutcomes = 0;
}

/* In tx: the outcome of the finished job \p j, as oq__outcome_from_http (execution.c) read
 * it from the answer, written as it is. A write refused by the fence (the lease was lost:
 * another worker reconciled the call) is counted and absorbed. */
int oq__outside_apply(oq_consumer_t *c, const oq__job_t *j, int64_t now, oq_error_t *err)
{
    const oq__outcome_t *o = &j->out;
    int state = -1, enew = 0, rc;
    char why[320];
    if (j->kind == OQ__JOB_LOOKUP) {
        snprintf(why, sizeof(why), "%s: %s", o->out.code, o->out.message);
        rc = oq__exec_lookup_done(c->store, &j->row, o->verdict, o->downstream_id, o->result_text,
                                  why, &c->policy, now, &state, err);
        if (rc == 0 && oq__xstate_terminal(state)) c->results_emitted = 1;
        return oq__consumer_note_finish(c, rc, &j->row, state, o->verdict == OQ__LOOKUP_FOUND);
    }
    rc =
        oq__exec_finish(c->store, &j->row, OQ__RUN_CLAIMED, o, &c->policy, now, &state, &enew, err);
    if ((rc = oq__consumer_note_finish(c, rc, &j->row, state, enew))) return rc;
    /* not final (UNKNOWN, a retry waiting its backoff): the call goes on, the producer hears
     * it runs; a final outcome says it all in its one result */
    if (j->running_owed && (state == OQ_X_UNKNOWN || state == OQ_X_FAILED_RETRYABLE) &&
        (rc = oq__exec_tell_running(c->store, &j->row, 1, now, NULL, err)))
        return rc;
    if (state == OQ_X_UNKNOWN) {
        atomic_fetch_add(&c->n_unknown, 1);
        oq_counter_add(c->m_unknown, 1);
        atomic_store(&c->recover_now, 1); /* reconcile it soon, not at the next period */
    }
    if (oq__xstate_terminal(state)) c->results_emitted = 1;
    return 0;
}

/*
 * The leases of outside requests in flight (and of those answered but not yet written): renewed
 * in one transaction, so a thousand requests cost one commit per beat. A lease found lost is
 * only logged: the outcome write is fenced and will be refused.
 * @locality the heartbeat thread.
 */
void oq__outside_renew(oq_consumer_t *c)
{
    int n = oq__dispatch_count(c->disp), lost = 0;
    oq_error_t err = {0};
    if (n <= 0) return;
    oq__lease_t *ls = malloc((size_t)n * sizeof(*ls));
    if (!ls) return;
    n = oq__dispatch_leases(c->disp, ls, n);
    int64_t until = lease_now(c) + c->o.lease_ms;
    int rc = oq__consumer_store_begin(c->hb_store, &err);
    for (int i = 0; i < n && rc == 0; i++) {
        rc = oq__consumer_store_lease_renew(c->hb_store, ls[i].call_id, ls[i].fence, until, &err);
        if (rc == OQ_EFENCED) {
            OQ_LOGC_DEBUG(OQ__COMP, ls[i].call_id, "heartbeat: lease lost (fence %" PRId64 ")",
                          ls[i].fence);
            lost++;
            rc = 0;
        }
    }
    if (rc == 0) rc = oq__consumer_store_commit(c->hb_store, &err);
    if (rc) {
        oq__consumer_store_rollback(c->hb_store);
        OQ_LOG_WARN(OQ__COMP, "heartbeat of %d outside request(s): %s", n, err.msg);
    }
    if (lost) OQ_LOG_WARN(OQ__COMP, "heartbeat: %d outside request(s) lost their lease", lost);
    free(ls);
}

/*
 * The `running` event of the outside calls still out OQ__RUNNING_AFTER_MS after they were sent
 * (at most one scan every quarter of that), in one transaction: a call answered sooner never
 * costs it (its outcome is the one result the producer applies, as for an inline run), one
 * that takes longer shows `running` about a second after it left. A transaction that fails
 * tells them at the next scan.
 * @locality the main thread.
 */
void oq__outside_tell_running(oq_consumer_t *c, int64_t now_us)
{
    enum { CAP = 256 };
    oq__job_t *owing[CAP];
    if (!c->disp || now_us - c->running_scan_us < OQ__RUNNING_AFTER_MS * 250) return;
    c->running_scan_us = now_us;
    int n = oq__dispatch_owing(c->disp, now_us - OQ__RUNNING_AFTER_MS * 1000, owing, CAP);
    if (n <= 0) return;
    oq_error_t err = {0};
    int64_t now = lease_now(c), told = 0;
    int rc = oq__consumer_store_begin(c->store, &err);
    for (int i = 0; i < n && rc == 0; i++) {
        int t = 0;
        rc = oq__exec_tell_running(c->store, &owing[i]->row, 0, now, &t, &err);
        told += t;
    }
    if (rc == 0) rc = oq__consumer_store_commit(c->store, &err);
    if (rc) {
        oq__consumer_store_rollback(c->store);
        OQ_LOG_WARN(OQ__COMP, "telling %d outside call(s) running: %s", n, err.msg);
        return;
    }
    for (int i = 0; i < n; i++)
        owing[i]->running_owed = 0;
    if (told) oq_relay_notify(c->relay);
}

void oq__outside_send_lookups(oq_consumer_t *c, int nl)
{
    for (int i = 0; i < nl; i++) {
        const oq__http_tool_t *tool = oq__http_tools_find(c->tools, c->lookups[i].tool);
        oq__job_t *j = tool ? oq__job_new(OQ__JOB_LOOKUP, tool) : NULL;
        if (!j) { /* the RECONCILING lease lapses and another step asks again */
            oq__exec_row_clear(&c->lookups[i]);
            continue;
        }
        j->args = job_args(&c->lookups[i], NULL);
        j->row = c->lookups[i];
        memset(&c->lookups[i], 0, sizeof(c->lookups[i]));
        oq__dispatch_send(c->disp, j);
    }
}
