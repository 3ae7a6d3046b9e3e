/* SPDX-License-Identifier: Apache-2.0 */
/*
 * runner.c: the runs of compiled tools (the registry of consumer/tools.c), inline and on runner
 * threads, and the heartbeat that renews their leases.
 *
 * run_tool is the one place a compiled tool is called. A fast tool runs inline, inside the
 * main thread's batch or scheduler transaction (oq__run_inline: a NEW call's row is written
 * once, in its outcome state). A blocking tool is left PLANNED by the batch and handed here
 * after the commit (oq__runner_push); a runner thread, with its own store connection, claims
 * it in a short transaction (STARTED is durable before the tool runs), runs the tool with no
 * transaction open, and finishes with a fenced write.
 *
 * Threads and locks: nrunners runner threads and one heartbeat thread, each with its own store
 * connection (r->store, c->hb_store). c->mu guards the queue (c->queue, c->qlen) and the lease
 * slots (one per runner); c->cv wakes runners. The heartbeat renews every slot's lease every
 * lease/3 (50 ms .. 1 s) and marks a slot lost when the fence moved, then renews the outside
 * requests' leases (oq__outside_renew, outside.c). oq__run_inline runs on the main thread.
 */
#include "worker_int.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_log.h"
#include "oq_util.h"

/*
 * The one place a tool is called, for every path (inline new call, inline claimed call,
 * runner): the call is built from the execution \p x, with the call's stable effect id as the
 * downstream idempotency key, the registry tool runs with \p args (x's arguments, parsed), and
 * its answer is classified for oq__exec_finish(). \p stop (may be NULL) lets a blocking tool
 * return early when the worker stops. Clear \p o after.
 */
static void run_tool(const oq__exec_row_t *x, const json_t *args, volatile int *stop,
                     oq__outcome_t *o)
{
    char eid[OQ_CALL_ID_LEN + 1];
    memset(o, 0, sizeof(*o));
    oq__exec_effect_id(x->call_id, eid);
    oq_tool_call_t call = {.call_id = x->call_id,
                           .effect_id = eid,
                           .tenant = x->tenant,
                           .tool = x->tool,
                           .args = args,
                           .attempt = x->attempt,
                           .try_no = x->tries,
                           .stop = stop};
    int trc = oq_tool_invoke(oq_tool_find(x->tool), &call, &o->out);
    oq__outcome_classify(trc, o);
}

/*
 * Runs a fast tool inside the caller's (batch or scheduler) transaction and finishes the run
 * there: the first run of the NEW call \p env (nothing stored yet: the row is written once, in
 * its outcome state), or, with \p env NULL, the claimed run of \p call_id (not due, or taken
 * by another worker: nothing to do). \p args may be NULL (parsed from the row).
 */
int oq__run_inline(oq_consumer_t *c, const oq_envelope_t *env, const char *call_id,
                   const json_t *args, int64_t now, oq_error_t *err)
{
    oq__exec_row_t x;
    oq__outcome_t o;
    json_t *own = NULL;
    int rc, state = -1, enew = 0;
    memset(&x, 0, sizeof(x));
    memset(&o, 0, sizeof(o));
    if (env)
        rc = oq__exec_start_inline(env, &x, err);
    else
        rc = oq__exec_claim(c->store, call_id, c->o.lease_ms, now, &x, err);
    if (rc == OQ_ESTATE && !env) return 0;
    if (rc) goto out;
    if (!args) args = own = json_loads(x.args ? x.args : "{}", 0, NULL);
    run_tool(&x, args, NULL, &o);
    rc = oq__exec_finish(c->store, &x, env ? OQ__RUN_INLINE : OQ__RUN_CLAIMED, &o, &c->policy,
                         env ? now : lease_now(c), &state, &enew, err);
    if ((rc = oq__consumer_note_finish(c, rc, &x, state, enew)) == 0 && oq__xstate_terminal(state))
        c->results_emitted = 1;
out:
    json_decref(own);
    oq__outcome_clear(&o);
    oq__exec_row_clear(&x);
    return rc;
}

/* --- runners and heartbeat ------------------------------------------------------------------- */

/* Queues \p call_id for a runner unless it is queued or running already, or the queue is full
 * (the scheduler offers it again later). */
void oq__runner_push(oq_consumer_t *c, const char *call_id)
{
    pthread_mutex_lock(&c->mu);
    int dup = 0;
    for (int i = 0; i < c->qlen && !dup; i++)
        dup = strcmp(c->queue[i], call_id) == 0;
    for (int i = 0; i < c->nrunners && !dup; i++)
        dup = c->slots[i].used && strcmp(c->slots[i].call_id, call_id) == 0;
    if (!dup && c->qlen < c->qcap) {
        snprintf(c->queue[c->qlen++], OQ_CALL_ID_LEN + 1, "%s", call_id);
        pthread_cond_signal(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

int oq__runners_idle(oq_consumer_t *c)
{
    pthread_mutex_lock(&c->mu);
    int busy = c->qlen;
    for (int i = 0; i < c->nrunners; i++)
        busy += c->slots[i].used;
    pthread_mutex_unlock(&c->mu);
    return busy == 0;
}

/* A runner's execution: claim (committed: STARTED is durable before the tool runs), run the
 * tool with no transaction open while the heartbeat renews the lease, finish (fenced). */
static void runner_exec(runner_t *r, const char *call_id)
{
    oq_consumer_t *c = r->c;
    oq_error_t err = {0};
    oq__exec_row_t x;
    oq__outcome_t o;
    json_t *args = NULL;
    int rc, state = -1, enew = 0;
    memset(&x, 0, sizeof(x));
    memset(&o, 0, sizeof(o));

    if ((rc = oq__consumer_store_begin(r->store, &err)) == 0) {
        rc = oq__exec_claim(r->store, call_id, c->o.lease_ms, lease_now(c), &x, &err);
        if (rc == 0) rc = oq__consumer_store_commit(r->store, &err);
        if (rc) oq__consumer_store_rollback(r->store);
    }
    if (rc == OQ_ESTATE) return; /* taken by another worker or not due */
    if (rc) {
        OQ_LOGC_WARN(OQ__COMP, call_id, "claim failed: %s", err.msg);
        oq__exec_row_clear(&x);
        return;
    }
    /* The lease is ours and durable: register it with the heartbeat before the tool runs. */
    pthread_mutex_lock(&c->mu);
    snprintf(c->slots[r->index].call_id, sizeof(c->slots[r->index].call_id), "%s", x.call_id);
    c->slots[r->index].fence = x.fence;
    c->slots[r->index].lost = 0;
    c->slots[r->index].used = 1;
    pthread_mutex_unlock(&c->mu);
    OQ_CRASH_POINT("consumer.after_claim");
    OQ_LOGC_DEBUG(OQ__COMP, x.call_id, "running tool=%s fence=%" PRId64, x.tool, x.fence);

    args = json_loads(x.args ? x.args : "{}", 0, NULL);
    run_tool(&x, args, &c->stop, &o);

    pthread_mutex_lock(&c->mu);
    int lost = c->slots[r->index].lost;
    pthread_mutex_unlock(&c->mu);
    if (lost) OQ_LOGC_WARN(OQ__COMP, x.call_id, "heartbeat lost the lease during the tool run");

    /* The finishing write is fenced: a stale worker (lease lost) writes nothing but the audit
     * row that says so. A busy database is retried (x is unchanged by a rolled-back finish). */
    for (int tries = 0; tries < 20; tries++) {
        if ((rc = oq__consumer_store_begin(r->store, &err)) == 0) {
            rc = oq__exec_finish(r->store, &x, OQ__RUN_CLAIMED, &o, &c->policy, lease_now(c),
                                 &state, &enew, &err);
            if (rc == 0 || rc == OQ_EFENCED) {
                int frc = rc;
                OQ_CRASH_POINT("consumer.after_effect_before_commit");
                rc = oq__consumer_store_commit(r->store, &err);
                if (rc == 0) rc = frc;
            }
            if (rc && rc != OQ_EFENCED) oq__consumer_store_rollback(r->store);
        }
        if (rc != OQ_EBUSY) break;
    }
    pthread_mutex_lock(&c->mu);
    c->slots[r->index].used = 0;
    pthread_mutex_unlock(&c->mu);
    if ((rc = oq__consumer_note_finish(c, rc, &x, state, enew)))
        OQ_LOGC_ERROR(OQ__COMP, x.call_id, "finish failed: %s (the lease will lapse)", err.msg);
    else if (oq__xstate_terminal(state))
        oq_relay_notify(c->relay);
    json_decref(args);
    oq__outcome_clear(&o);
    oq__exec_row_clear(&x);
}

static void *runner_main(void *arg)
{
    runner_t *r = arg;
    oq_consumer_t *c = r->c;
    char call_id[OQ_CALL_ID_LEN + 1];
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->stop && c->qlen == 0)
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop) {
            pthread_mutex_unlock(&c->mu);
            break;
        }
        snprintf(call_id, sizeof(call_id), "%s", c->queue[0]);
        memmove(c->queue[0], c->queue[1], (size_t)(c->qlen - 1) * sizeof(c->queue[0]));
        c->qlen--;
        pthread_mutex_unlock(&c->mu);
        runner_exec(r, call_id);
    }
    return NULL;
}

static void *heartbeat_main(void *arg)
{
    oq_consumer_t *c = arg;
    int64_t every = c->o.lease_ms / 3;
    if (every < 50) every = 50;
    if (every > 1000) every = 1000;
    while (!c->hb_stop) {
        oq_sleep_ms(every, &c->hb_stop);
        for (int i = 0; i < c->nrunners; i++) {
            char call_id[OQ_CALL_ID_LEN + 1];
            int64_t fence;
            pthread_mutex_lock(&c->mu);
            int live = c->slots[i].used && !c->slots[i].lost;
            snprintf(call_id, sizeof(call_id), "%s", c->slots[i].call_id);
            fence = c->slots[i].fence;
            pthread_mutex_unlock(&c->mu);
            if (!live) continue;
            oq_error_t err = {0};
            int rc = oq__consumer_store_lease_renew(c->hb_store, call_id, fence,
                                                    lease_now(c) + c->o.lease_ms, &err);
            if (rc == OQ_EFENCED) {
                OQ_LOGC_WARN(OQ__COMP, call_id, "heartbeat: %s", err.msg);
                pthread_mutex_lock(&c->mu);
                /* Only if the slot still holds that lease: the runner may have finished this
                 * call and claimed another one (with a fence that can be equal) meanwhile. */
                if (c->slots[i].used && c->slots[i].fence == fence &&
                    strcmp(c->slots[i].call_id, call_id) == 0)
                    c->slots[i].lost = 1;
                pthread_mutex_unlock(&c->mu);
            } else if (rc) {
                OQ_LOGC_WARN(OQ__COMP, call_id, "heartbeat renew failed: %s", err.msg);
            }
        }
        oq__outside_renew(c);
    }
    return NULL;
}

void oq__runners_stop(oq_consumer_t *c)
{
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    c->qlen = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->nrunners; i++) {
        if (c->runners[i].th) pthread_join(c->runners[i].th, NULL);
        c->runners[i].th = 0;
    }
    c->nrunners = 0;
    if (c->hb_started) {
        c->hb_stop = 1;
        pthread_join(c->hb_th, NULL);
        c->hb_started = 0;
    }
}

int oq__runners_start(oq_consumer_t *c, oq_error_t *err)
{
    int rc = 0;
    for (int i = 0; i < c->nrunners; i++) {
        if (pthread_create(&c->runners[i].th, NULL, runner_main, &c->runners[i]) != 0) {
            rc = oq_error_set(err, OQ_EIO, 0, "runner thread");
            c->nrunners = i;
            goto fail;
        }
        pthread_setname_np(c->runners[i].th, "oq-runner"); /* top -H, perf; failure harmless */
    }
    if (pthread_create(&c->hb_th, NULL, heartbeat_main, c) != 0) {
        rc = oq_error_set(err, OQ_EIO, 0, "heartbeat thread");
        goto fail;
    }
    c->hb_started = 1;
    pthread_setname_np(c->hb_th, "oq-heartbeat");
fail:
    return rc;
}
