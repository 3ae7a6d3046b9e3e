/* SPDX-License-Identifier: Apache-2.0 */
/*
 * writer.c: the producer's one writer thread on calls.db, its group commit and its checkpoints.
 *
 * Design. A durable commit (fsync of the WAL) costs 0.2-0.6 ms here, so a transaction per
 * submit tops out near 3,500/s. Instead, every submitter (blocking API caller or suspended
 * HTTP connection) hands a prepared work item to ONE writer thread through a mutex-protected
 * queue. The writer takes everything queued (up to max_batch), runs each item's decision
 * (decide.c) inside one BEGIN IMMEDIATE transaction, commits once, and only then completes the
 * items: no submit is acknowledged before its batch is durable, and there is one fsync per
 * batch. Batch size follows the offered concurrency by itself: while a commit runs, the next
 * batch queues.
 *
 * Work items are of three kinds (producer_int.h): a prepared submit (oq_submit_job_t), a batch
 * of tool_results from the ingest (oq__results_t) and a redrive pass (oq__redrive_t). Results
 * and redrives ride in the same transaction as the submits around them, on the same
 * connection, so the process has one writer on calls.db and they cost no extra fsync.
 *
 * Commit delay. Closed-loop clients (HTTP keep-alive connections, threads calling the blocking
 * API) come back right after their answer; without care they split into two groups that
 * alternate (one commits while the other queues), so every submit waits two fsyncs. After a
 * batch of more than one item, the writer therefore keeps gathering while items keep arriving
 * (gaps under 200 us), for at most the duration of the previous commit (capped at 3 ms) or
 * until max_batch: both groups share one fsync. A lone submitter never waits.
 *
 * Failure: when an item fails with a database error inside a batch, the batch is rolled back
 * and every item of it is re-run alone in its own transaction, so one bad item cannot fail its
 * neighbours; when the commit itself fails, every item of the batch reports the error and
 * nothing of it is durable (retrying with the same key is safe).
 *
 * Dead letters: about once a second (every 10 ms while full batches come back) the writer looks
 * for outbox rows its relay set aside (outbox_dead, a cheap probe of a partial index) and, when
 * there are any, fails their calls in a transaction of its own (decide.c, the same rule as a
 * consumer's result), so a call whose message Kafka refused ends `failed` with error code
 * "unpublishable" instead of staying pending.
 *
 * Waiters: after the commit of a batch, and before its items complete, the writer tells the
 * call waiters (waiters.c: GET ...?wait=) about each call the batch made terminal (a result
 * applied; a call failed for a dead letter): a woken client reads the committed state.
 *
 * Checkpoints: SQLite's auto-checkpoint would copy ~1000 WAL frames into the database and fsync
 * it inside every ~45th commit, stalling that batch. The writer connection is attached to a
 * background checkpointer instead (common/oq_ckpt.h, the same one the consumers and the relay
 * run): its thread copies the WAL on a connection of its own and keeps it bounded. When a pass
 * cannot catch up with the writer, the writer copies the last few frames itself after
 * answering its batch (oq_ckpt_finish), rather than being held off by a FULL checkpoint.
 *
 * PostgreSQL (a --db URI or keyword string): the same queue, batches and failure handling on
 * a libpq connection, through the store's begin/commit (producer/store_pg.c, which reconnects
 * a lost connection before a batch runs); durability is the server's synchronous_commit=on, and
 * there is no WAL of ours to checkpoint. The batches of results go to a second writer of the same
 * kind (its own thread, queue and connection: `rw`), so that submits are not held up behind
 * them: on SQLite one writer is all the file allows and a batch of results is cheap, but on
 * PostgreSQL applying a batch costs several milliseconds of server time (a multi-row UPDATE of
 * calls, its seven indexes), and in one serial writer a submit waited for its batch's results
 * too (e2e closed loop: submit p50 23 ms, writer busy 2.0 s of 2.5). The server runs the two
 * transactions side by side. What the two writers can meet on is a call row, and PostgreSQL
 * already allows it from many producers sharing one database: a result applies only to a call
 * whose submit committed before (it went through Kafka), a retry reset is guarded by the state
 * and attempt it read (store_pg.c), and a deadlock or serialization failure is retried as
 * after any database error (each item alone). The redrive passes, dead letters and webhook
 * marks stay with the submits' writer.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oq_ckpt.h"
#include "oq_log.h"
#include "oq_pg.h"
#include "producer_int.h"
#include "tasks.h"

struct oq__writer {
    int64_t key_ttl_ms;
    int64_t max_message_bytes;
    int64_t next_dead_us; /* writer thread: next look at outbox_dead */
    oq_metric_t *m_unpublishable;
    int64_t redrive_after_ms; /* <= 0: off */
    int max_batch;
    int commit_delay_us;
    sqlite3 *wdb;
    oq_stmt_cache_t *wcache;
    PGconn *wpg; /* PostgreSQL instead of wdb (no cache, no checkpointer) */
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    oq__work_t *head, *tail; /* under mu */
    size_t qlen;             /* under mu */
    int stopping;            /* under mu */
    oq_metric_t *m_new, *m_replay, *m_conflict, *m_reset, *m_failed, *m_too_large;
    oq_metric_t *m_batch, *m_commit, *m_wait, *m_queue, *m_batches, *m_wcpu, *m_redrives;
    double cpu_s; /* writer thread CPU in batches, the value of m_wcpu */
    /* the writer's time split (writer thread; counters, and logged at close): running the
     * submits, applying the results, the commits; and how many of each */
    int64_t t_submit_us, t_results_us, t_commit_us, n_submits, n_results, n_batches;
    oq_metric_t *m_tsplit[3];
    /* background checkpointer (see the file comment; NULL: SQLite's own, in the commits) */
    int ckpt_pages;
    oq_ckpt_t *ckpt;
    oq_waiters_t *waiters; /* told after each commit that made calls terminal */
    /* PostgreSQL: the writer of the batches of results (file comment), NULL on SQLite; in it,
     * results_only is set and waiters is the submit writer's (borrowed) */
    struct oq__writer *rw;
    int results_only;
};

/* --- one batch -------------------------------------------------------------------------------*/

static int is_db_error(int rc)
{
    return rc == OQ_EDB || rc == OQ_EBUSY || rc == OQ_ENOMEM || rc == OQ_EIO;
}

/** The item's decision inside the open transaction. @returns its rc. */
static int run_item(oq__writer_t *w, oq__producer_store_t *s, oq__work_t *it, int64_t now)
{
    oq_error_clear(&it->err);
    if (it->kind == OQ__WORK_SUBMIT)
        return oq__decide_submit(s, (oq_submit_job_t *)it, now, w->key_ttl_ms, w->max_message_bytes,
                                 &it->err);
    if (it->kind == OQ__WORK_TASK)
        return oq__task_decide_submit(s, (oq_task_job_t *)it, now, w->key_ttl_ms,
                                      w->max_message_bytes, &it->err);
    if (it->kind == OQ__WORK_TASK_REVIEW)
        return oq__task_review_job_run(s, (oq_task_review_job_t *)it, now, w->key_ttl_ms, &it->err);
    if (it->kind == OQ__WORK_REDRIVE) {
        oq__redrive_t *d = (oq__redrive_t *)it;
        return oq__decide_redrive(s, now, w->redrive_after_ms, d->limit, &d->stats, &it->err);
    }
    if (it->kind == OQ__WORK_WEBHOOKS) {
        oq__webhook_marks_t *k = (oq__webhook_marks_t *)it;
        return oq__decide_webhook_marks(s, k->marks, k->n, &it->err);
    }
    oq__results_t *r = (oq__results_t *)it;
    return oq__decide_results(s, r->envs, r->n, r->outcomes, now, w->key_ttl_ms, &it->err);
}

/** The writer's time split: \p us spent running the item \p it (before the commit). */
static void note_item(oq__writer_t *w, const oq__work_t *it, int64_t us)
{
    if (it->kind == OQ__WORK_SUBMIT) {
        w->t_submit_us += us;
        w->n_submits++;
        oq_counter_set(w->m_tsplit[0], (double)w->t_submit_us / 1e6);
    } else if (it->kind == OQ__WORK_RESULTS) {
        w->t_results_us += us;
        w->n_results += ((const oq__results_t *)it)->n;
        oq_counter_set(w->m_tsplit[1], (double)w->t_results_us / 1e6);
    }
}

/** Run \p n items in one transaction. @returns 0, or the batch-level error (all items
 *  failed); \p item_failed is set when one item's database error caused it. */
static int run_batch(oq__writer_t *w, oq__work_t **items, int n, int *item_failed)
{
    oq_error_t err = {0};
    oq__producer_store_t s = {w->wdb, w->wcache, w->wpg};
    int64_t now = oq_now_ms();
    *item_failed = 0;
    int ret = oq__producer_store_begin(&s, 10000, &err);
    if (ret) goto fail;
    /* PostgreSQL: the batch's new calls in one round trip (nothing on SQLite) */
    if (w->wpg && n > 1 &&
        (ret = oq__decide_submit_ahead(&s, items, n, now, w->key_ttl_ms, w->max_message_bytes,
                                       &err))) {
        *item_failed = is_db_error(ret);
        oq__producer_store_rollback(&s);
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        oq__work_t *it = items[i];
        int64_t ti = oq_mono_us();
        it->rc = run_item(w, &s, it, now);
        note_item(w, it, oq_mono_us() - ti);
        if (is_db_error(it->rc)) {
            *item_failed = 1;
            err = it->err;
            ret = it->rc;
            oq__producer_store_rollback(&s);
            goto fail;
        }
    }
    int64_t t0 = oq_mono_us();
    ret = oq__producer_store_commit(&s, &err);
    int64_t tc = oq_mono_us() - t0;
    oq_histogram_observe(w->m_commit, (double)tc / 1e6);
    w->t_commit_us += tc;
    w->n_batches++;
    oq_counter_set(w->m_tsplit[2], (double)w->t_commit_us / 1e6);
    if (ret) {
        oq__producer_store_rollback(&s);
        goto fail;
    }
    for (int i = 0; i < n; i++)
        if (items[i]->kind == OQ__WORK_SUBMIT) oq__job_finish_new((oq_submit_job_t *)items[i]);
    return 0;
fail:
    OQ_LOG_WARN("producer", "batch of %d failed: %s", n, err.msg);
    for (int i = 0; i < n; i++) {
        items[i]->rc = ret;
        items[i]->err = err;
        if (items[i]->kind == OQ__WORK_SUBMIT) { /* nothing of it holds: no call to report */
            oq_submit_job_t *j = (oq_submit_job_t *)items[i];
            j->call_from_job = 0;
            oq_call_clear(&j->call);
        }
    }
    return ret;
}

static void count_outcome(oq__writer_t *w, const oq_submit_job_t *j)
{
    if (j->work.rc == OQ_ETOOBIG) {
        oq_counter_add(w->m_too_large, 1);
        return;
    }
    if (j->work.rc != 0 && j->work.rc != OQ_ECONFLICT) {
        oq_counter_add(w->m_failed, 1);
        return;
    }
    switch (j->outcome) {
    case OQ_SUBMIT_NEW:
        oq_counter_add(w->m_new, 1);
        break;
    case OQ_SUBMIT_REPLAY:
        oq_counter_add(w->m_replay, 1);
        break;
    case OQ_SUBMIT_CONFLICT:
        oq_counter_add(w->m_conflict, 1);
        break;
    case OQ_SUBMIT_RETRY_RESET:
        oq_counter_add(w->m_reset, 1);
        break;
    }
}

/* --- the queue ------------------------------------------------------------------------------*/

/** Commit delay (see the file comment). Called with w->mu held and a non-empty queue. */
static void gather(oq__writer_t *w, int last_n, int64_t last_commit_us)
{
    if (w->commit_delay_us < 0 || last_n <= 1) return;
    int64_t max_us = w->commit_delay_us > 0 ? w->commit_delay_us
                                            : (last_commit_us < 3000 ? last_commit_us : 3000);
    int64_t end = oq_mono_us() + max_us;
    while (!w->stopping && w->qlen < (size_t)w->max_batch) {
        int64_t left = end - oq_mono_us();
        if (left <= 0) break;
        size_t before = w->qlen;
        struct timespec ts;
        oq_mono_deadline(&ts, left < 200 ? left : 200);
        while (w->qlen == before && !w->stopping &&
               pthread_cond_timedwait(&w->cv, &w->mu, &ts) == 0) {
        }
        if (w->qlen == before) break; /* nobody came within the gap: go */
    }
}

int oq__writer_enqueue(oq__writer_t *w, oq__work_t *item)
{
    if (w->rw && item->kind == OQ__WORK_RESULTS) w = w->rw;
    item->next = NULL;
    item->enq_us = oq_mono_us();
    pthread_mutex_lock(&w->mu);
    if (w->stopping) {
        pthread_mutex_unlock(&w->mu);
        return OQ_ESHUTDOWN;
    }
    if (w->tail)
        w->tail->next = item;
    else
        w->head = item;
    w->tail = item;
    w->qlen++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

/* --- dead letters ----------------------------------------------------------------------------*/

#define DEAD_BATCH 64

typedef struct settled_ids {
    char id[DEAD_BATCH][OQ_CALL_ID_LEN + 1];
    int n;
} settled_ids_t;

static void remember_settled(const char *call_id, void *arg)
{
    settled_ids_t *s = arg;
    if (s->n < DEAD_BATCH) snprintf(s->id[s->n++], sizeof s->id[0], "%s", call_id);
}

/** Fails the calls of dead letters, if there are any (see the file comment). @locality writer */
static void dead_letters(oq__writer_t *w)
{
    oq_error_t err = {0};
    oq__producer_store_t s = {w->wdb, w->wcache, w->wpg};
    int any = 0, failed = 0, handled = 0;
    settled_ids_t settled;
    settled.n = 0;
    w->next_dead_us = oq_mono_us() + 1000000;
    if (oq__producer_store_dead_any(&s, &any, &err) != 0) {
        OQ_LOG_WARN("producer", "dead letters: %s", err.msg);
        return;
    }
    if (!any) return;
    int ret = oq__producer_store_begin(&s, 1000, &err);
    if (!ret)
        ret = oq__decide_dead_letters(&s, oq_now_ms(), w->key_ttl_ms, DEAD_BATCH, &failed, &handled,
                                      remember_settled, &settled, &err);
    if (!ret) ret = oq__producer_store_commit(&s, &err);
    if (ret) {
        oq__producer_store_rollback(&s);
        OQ_LOG_WARN("producer", "dead letters not handled (will retry): %s", err.msg);
        return;
    }
    oq_counter_add(w->m_unpublishable, (uint64_t)failed);
    for (int i = 0; i < settled.n; i++) /* committed: waiters read the failed call */
        oq_waiters_notify(w->waiters, settled.id[i]);
    if (handled >= DEAD_BATCH) w->next_dead_us = oq_mono_us() + 10000;
}

/* --- task compensation retries --------------------------------------------------------------*/

/** New attempts of failed task compensations whose backoff ran out (tasks.c), looked at with
 *  the dead letters, once a second. @locality writer */
static void task_retries(oq__writer_t *w)
{
    oq_error_t err = {0};
    oq__producer_store_t s = {w->wdb, w->wcache, w->wpg};
    int n = 0;
    int ret = oq__producer_store_begin(&s, 1000, &err);
    if (!ret) ret = oq__task_retry_due(&s, oq_now_ms(), w->key_ttl_ms, &n, &err);
    if (!ret && n) ret = oq__producer_store_commit(&s, &err);
    if (ret || !n) oq__producer_store_rollback(&s);
    if (ret) OQ_LOG_WARN("producer", "task compensation retries (will retry): %s", err.msg);
}

/* --- the writer thread -----------------------------------------------------------------------*/

/** After the commit of \p r (never before: a woken waiter reads the committed state), and
 *  before its completion (the envelopes are the ingest's): wake the waiters of each call the
 *  batch made terminal. @locality writer */
static void notify_settled(oq__writer_t *w, const oq__results_t *r)
{
    for (int k = 0; k < r->n; k++)
        if (r->outcomes[k] == OQ_RESULT_APPLIED && r->envs[k].status &&
            oq_call_state_terminal(r->envs[k].status))
            oq_waiters_notify(w->waiters, r->envs[k].call_id);
}

static void *writer_main(void *arg)
{
    oq__writer_t *w = arg;
    int cap = w->max_batch;
    int last_n = 0;
    int64_t last_commit_us = 0;
    oq__work_t **items = calloc((size_t)cap, sizeof *items);
    if (!items) abort();
    for (;;) {
        pthread_mutex_lock(&w->mu);
        for (;;) {
            int64_t left = w->next_dead_us - oq_mono_us();
            if (w->head || w->stopping || left <= 0) break;
            struct timespec ts;
            oq_mono_deadline(&ts, left);
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        }
        if (!w->head) {
            int stopping = w->stopping;
            pthread_mutex_unlock(&w->mu);
            if (stopping) break;
            if (w->results_only) {
                w->next_dead_us = oq_mono_us() + 3600000000LL; /* nothing else to look at */
                continue;
            }
            dead_letters(w);
            task_retries(w);
            continue;
        }
        gather(w, last_n, last_commit_us);
        int n = 0;
        while (w->head && n < cap) {
            items[n++] = w->head;
            w->head = w->head->next;
            w->qlen--;
        }
        if (!w->head) w->tail = NULL;
        oq_gauge_set(w->m_queue, (double)w->qlen);
        pthread_mutex_unlock(&w->mu);

        int item_failed = 0;
        struct timespec c0, c1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        int64_t t_batch = oq_mono_us();
        int rc = run_batch(w, items, n, &item_failed);
        last_commit_us = oq_mono_us() - t_batch;
        last_n = n;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        w->cpu_s += (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) / 1e9;
        oq_counter_set(w->m_wcpu, w->cpu_s);
        if (rc && item_failed && n > 1) {
            /* Isolate the bad item: each item alone. */
            for (int i = 0; i < n; i++) {
                int dummy;
                run_batch(w, &items[i], 1, &dummy);
            }
        }
        OQ_CRASH_POINT("producer.after_commit_before_reply");
        oq_counter_add(w->m_batches, 1);
        oq_histogram_observe(w->m_batch, (double)n);
        int64_t now_us = oq_mono_us();
        for (int i = 0; i < n; i++) {
            oq__work_t *it = items[i];
            if (it->kind == OQ__WORK_SUBMIT) {
                count_outcome(w, (oq_submit_job_t *)it);
                oq_histogram_observe(w->m_wait, (double)(now_us - it->enq_us) / 1e6);
            } else if (it->kind == OQ__WORK_REDRIVE && it->rc == 0) {
                oq_counter_add(w->m_redrives, (uint64_t)((oq__redrive_t *)it)->stats.redriven);
            } else if (it->kind == OQ__WORK_RESULTS && it->rc == 0) {
                notify_settled(w, (oq__results_t *)it);
            }
            it->next = NULL;
            it->done(it, it->opaque);
        }
        oq_ckpt_finish(w->ckpt, w->wdb); /* after the answers: see oq_ckpt.h */
        if (!w->results_only && oq_mono_us() >= w->next_dead_us) {
            dead_letters(w);
            task_retries(w);
        }
    }
    free(items);
    return NULL;
}

/* --- open / close ----------------------------------------------------------------------------*/

oq_waiters_t *oq__writer_waiters(oq__writer_t *w)
{
    return w->waiters;
}

static void register_metrics(oq__writer_t *w, oq_metrics_t *m)
{
    if (!m) return;
    const char *h = "Submits by outcome";
    w->m_new = oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"new\"");
    w->m_replay = oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"replay\"");
    w->m_conflict =
        oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"conflict\"");
    w->m_reset =
        oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"retry_reset\"");
    w->m_failed = oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"error\"");
    w->m_too_large =
        oq_metrics_counter(m, "onceq_producer_submits_total", h, "outcome=\"too_large\"");
    w->m_unpublishable = oq_metrics_counter(
        m, "onceq_producer_unpublishable_total",
        "Calls failed because the relay set their message aside (error code unpublishable)", NULL);
    w->m_batches =
        oq_metrics_counter(m, "onceq_producer_batches_total", "Group-commit transactions", NULL);
    w->m_redrives = oq_metrics_counter(
        m, "onceq_producer_redrives_total",
        "Calls whose tool_call message was published again by a redrive pass", NULL);
    static const double bsz[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    w->m_batch = oq_metrics_histogram(m, "onceq_producer_batch_size", "Submits per group commit",
                                      NULL, bsz, sizeof bsz / sizeof bsz[0]);
    static const double lat[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                 0.01,   0.025,   0.05,   0.1,   0.5,    1};
    w->m_commit = oq_metrics_histogram(m, "onceq_producer_commit_seconds",
                                       "Duration of a group COMMIT (fsync)", NULL, lat,
                                       sizeof lat / sizeof lat[0]);
    w->m_wait =
        oq_metrics_histogram(m, "onceq_producer_submit_seconds", "Queue + batch time of a submit",
                             NULL, lat, sizeof lat / sizeof lat[0]);
    w->m_queue =
        oq_metrics_gauge(m, "onceq_producer_queue_depth", "Submits waiting for the writer", NULL);
    static const char *const split[3] = {"work=\"submits\"", "work=\"results\"", "work=\"commit\""};
    for (int i = 0; i < 3; i++)
        w->m_tsplit[i] = oq_metrics_counter(
            m, "onceq_producer_writer_seconds_total",
            "Writer thread time: running submits, applying results, committing", split[i]);
    w->m_wcpu = oq_metrics_counter(m, "onceq_producer_writer_cpu_seconds_total",
                                   "CPU time of the writer thread in batches (SQL + commit)", NULL);
}

/* The writer's own state, settings and locks, no connection and no thread yet. */
static oq__writer_t *writer_new(const oq_producer_opts_t *o)
{
    oq__writer_t *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->key_ttl_ms = o->key_ttl_ms;
    w->max_message_bytes = o->max_message_bytes;
    w->next_dead_us = oq_mono_us(); /* a first look at once */
    w->redrive_after_ms = o->redrive_after_ms;
    w->max_batch = o->max_batch;
    w->commit_delay_us = o->commit_delay_us;
    w->ckpt_pages = o->checkpoint_pages;
    return w;
}

/* PostgreSQL: the results' writer of \p w (file comment), started. */
static int results_writer_open(oq__writer_t *w, const char *path, const oq_producer_opts_t *o,
                               oq_error_t *err)
{
    oq__writer_t *rw = writer_new(o);
    if (!rw) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    rw->results_only = 1;
    rw->waiters = w->waiters;
    rw->ckpt_pages = 0;
    rw->m_tsplit[1] = w->m_tsplit[1];
    w->rw = rw; /* closed with w from here on */
    int ret = oq_pg_connect(path, &rw->wpg, err);
    if (!ret) ret = oq_pg_prepared(rw->wpg, err);
    if (!ret) ret = oq_pg_wake_after(rw->wpg, err); /* its commits wake the relay themselves */
    if (ret) return ret;
    if (pthread_create(&rw->th, NULL, writer_main, rw) != 0)
        return oq_error_set(err, OQ_EIO, errno, "cannot start the results writer thread");
    rw->started = 1;
    pthread_setname_np(rw->th, "oq-writer-r");
    return 0;
}

int oq__writer_open(const char *path, const oq_producer_opts_t *o, oq__writer_t **out,
                    oq_error_t *err)
{
    int ret = 0;
    oq__writer_t *w = writer_new(o);
    if (!w) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if ((ret = oq_waiters_new(&w->waiters, err))) goto out; /* both backends: GET ?wait=, /mcp */
    if (oq_backend_of(path) == OQ_BACKEND_POSTGRES) {
        /* PostgreSQL: the same queue and group commit on a connection, and the results' own
         * writer on another; durability is the server's (synchronous_commit=on), and it has no
         * WAL file of ours to checkpoint. */
        if ((ret = oq_pg_connect(path, &w->wpg, err)) || (ret = oq_pg_migrate(w->wpg, err)) ||
            (ret = oq_pg_prepared(w->wpg, err)) || (ret = oq_pg_wake_after(w->wpg, err)))
            goto out;
        register_metrics(w, o->metrics);
        w->ckpt_pages = 0;
        if ((ret = results_writer_open(w, path, o, err))) goto out;
        goto start;
    }
    oq_db_opts_t dbo = {o->synchronous, 0, 0};
    if ((ret = oq_db_open(path, &dbo, &w->wdb, err))) goto out;
    if ((ret = oq_db_migrate(w->wdb, oq_migrations_producer, err))) goto out;
    w->wcache = oq_stmt_cache_new(w->wdb);
    if (!w->wcache) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    register_metrics(w, o->metrics);
    if (w->ckpt_pages > 0) {
        oq_ckpt_opts_t co = {.frames = w->ckpt_pages,
                             .synchronous = o->synchronous,
                             .component = "producer",
                             .metrics = o->metrics,
                             .metric_prefix = "onceq_producer",
                             .writer_finishes = 1};
        if ((ret = oq_ckpt_new(path, &co, &w->ckpt, err))) goto out;
        oq_ckpt_attach(w->ckpt, w->wdb); /* the writer's commits never checkpoint */
    }
start:
    if (pthread_create(&w->th, NULL, writer_main, w) != 0) {
        ret = oq_error_set(err, OQ_EIO, errno, "cannot start the writer thread");
        goto out;
    }
    w->started = 1;
    pthread_setname_np(w->th, "oq-writer");
out:
    if (ret) {
        oq__writer_close(w);
        return ret;
    }
    *out = w;
    return 0;
}

/* Refuses new items (OQ_ESHUTDOWN), runs what is queued and ends the thread. */
static void writer_stop(oq__writer_t *w)
{
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (w->started) {
        pthread_join(w->th, NULL);
        w->started = 0;
        OQ_LOG_INFO("producer",
                    "%s stopped: batches=%lld submits=%lld results=%lld ms: submits=%lld "
                    "results=%lld commit=%lld",
                    w->results_only ? "results writer" : "writer", (long long)w->n_batches,
                    (long long)w->n_submits, (long long)w->n_results,
                    (long long)(w->t_submit_us / 1000), (long long)(w->t_results_us / 1000),
                    (long long)(w->t_commit_us / 1000));
    }
}

void oq__writer_close(oq__writer_t *w)
{
    if (!w) return;
    /* The results' writer first: it applies what is queued and tells the shared waiters. It is
     * freed last, so that an item routed to it meanwhile is refused, not written to freed
     * memory. */
    if (w->rw) writer_stop(w->rw);
    writer_stop(w);
    if (!w->results_only)               /* the results' writer borrows the waiters */
        oq_waiters_destroy(w->waiters); /* wakes whoever still waits: the writer is gone */
    oq_stmt_cache_destroy(w->wcache);
    if (w->wdb) sqlite3_close_v2(w->wdb);
    oq_ckpt_destroy(w->ckpt); /* after the connection attached to it */
    if (w->wpg) PQfinish(w->wpg);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    oq__writer_close(w->rw); /* stopped above */
    free(w);
}
