/* SPDX-License-Identifier: Apache-2.0 */
/*
 * producer.c: the oq_producer_t object and the public entry points of oq_producer.h.
 *
 * A producer is a writer (writer.c: one thread, one connection, group commit) plus a small
 * pool of read-only connections for get and stats: WAL readers never wait for the writer.
 * Submits are prepared on the caller's thread (submit.c) and handed to the writer as work
 * items; the blocking calls (oq_producer_submit, oq_producer_apply_results) wait on a
 * condition variable that the item's completion signals. The reads on a plain connection
 * (oq_store_stats, oq_store_audit, used by the CLI) are here too, over the same store; the
 * client side that libonceq exports (migrate, lookups) is in client.c.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "oq_pg.h"
#include "producer_int.h"
#include "tasks.h"

typedef struct rconn {
    pthread_mutex_t mu;
    sqlite3 *db;
    oq_stmt_cache_t *cache;
    PGconn *pg; /* PostgreSQL instead of db */
} rconn_t;

struct oq_producer {
    char *path;
    int64_t key_ttl_ms;
    oq__writer_t *writer;
    rconn_t *reads;
    int nreads;
    atomic_uint rr;
    oq_metrics_t *metrics;
    char *topic_prefix; /* NULL: the default */
    oq_metric_t *m_calls[5], *m_outbox_pending, *m_oldest_pending;
    oq_metric_t *m_tasks[OQ_TASK_NSTATUS],
        *m_comp[2];           /* tasks by status; compensations ended ok / review */
    oq_metric_t *m_task_x[4]; /* compensation success, re-run steps, needed an operator, ratio */
    int64_t counts_next_us;   /* collect_counts reads again from then on (registry lock) */
};

static const char *const call_states[5] = {"pending", "running", "succeeded", "failed",
                                           "needs_review"};
static rconn_t *rconn_acquire(oq_producer_t *p);
static int stats_json(oq__producer_store_t *s, json_t **out, oq_error_t *err);

/* A scrape within this many times the last read's duration keeps its values: counting a large
 * calls table takes time (about 0.1 s per million calls on SQLite here), and scrapes then cost
 * at most 1/COUNTS_DUTY of a core, whatever their rate. A small table is read at every scrape. */
#define COUNTS_DUTY 10

/* Scrape time, under the registry lock: calls by status and the outbox from one snapshot on a
 * read connection (GET /stats's numbers, but only those the gauges show), at most one read per
 * COUNTS_DUTY times its duration. A failed read keeps the last values. */
static void collect_counts(oq_metrics_t *m, void *arg)
{
    oq_producer_t *p = arg;
    (void)m;
    int64_t t0 = oq_mono_us();
    if (t0 < p->counts_next_us) return;
    oq__producer_counts_t c;
    rconn_t *r = rconn_acquire(p);
    oq__producer_store_t s = {r->db, NULL, r->pg};
    int rc = oq__producer_store_counts(&s, OQ__COUNTS_GAUGES, &c, NULL);
    pthread_mutex_unlock(&r->mu);
    if (rc) return;
    const int64_t by[5] = {c.pending, c.running, c.succeeded, c.failed, c.needs_review};
    for (int i = 0; i < 5; i++)
        oq_gauge_set(p->m_calls[i], (double)by[i]);
    oq_gauge_set(p->m_outbox_pending, (double)c.outbox_pending);
    int64_t tb[OQ_TASK_NSTATUS], ok = 0, review = 0;
    r = rconn_acquire(p);
    s = (oq__producer_store_t){r->db, NULL, r->pg};
    rc = oq__task_store_counts(&s, NULL, tb, &ok, &review, NULL);
    int64_t op = 0, rerun = 0;
    int rc2 = rc ? rc : oq__task_store_recovery(&s, &op, &rerun, NULL);
    pthread_mutex_unlock(&r->mu);
    if (rc2 == 0) {
        int64_t all = 0;
        for (int i = 0; i < OQ_TASK_NSTATUS; i++)
            all += tb[i];
        oq_gauge_set(p->m_task_x[0], ok + review ? (double)ok / (double)(ok + review) : 1.0);
        oq_gauge_set(p->m_task_x[1], (double)rerun);
        oq_gauge_set(p->m_task_x[2], (double)op);
        oq_gauge_set(p->m_task_x[3], all ? (double)op / (double)all : 0.0);
    }
    for (int i = 0; rc == 0 && i < OQ_TASK_NSTATUS; i++)
        oq_gauge_set(p->m_tasks[i], (double)tb[i]);
    if (rc == 0) {
        oq_gauge_set(p->m_comp[0], (double)ok);
        oq_gauge_set(p->m_comp[1], (double)review);
    }
    oq_gauge_set(p->m_oldest_pending,
                 c.oldest_pending_created_at
                     ? (double)(oq_now_ms() - c.oldest_pending_created_at) / 1000.0
                     : 0);
    int64_t t1 = oq_mono_us();
    p->counts_next_us = t1 + (t1 - t0) * (COUNTS_DUTY - 1);
}

static void metrics_init(oq_producer_t *p)
{
    for (int i = 0; i < 5; i++) {
        char labels[48];
        snprintf(labels, sizeof labels, "status=\"%s\"", call_states[i]);
        p->m_calls[i] = oq_metrics_gauge(p->metrics, "onceq_producer_calls",
                                         "calls in calls.db by status (needs_review: waiting for "
                                         "an operator)",
                                         labels);
    }
    for (int i = 0; i < OQ_TASK_NSTATUS; i++) {
        char labels[48];
        snprintf(labels, sizeof labels, "status=\"%s\"", oq__task_statuses[i]);
        p->m_tasks[i] = oq_metrics_gauge(p->metrics, "onceq_producer_tasks",
                                         "tasks in calls.db by status", labels);
    }
    p->m_comp[0] = oq_metrics_gauge(p->metrics, "onceq_producer_task_compensations",
                                    "task compensations by how they ended (compensated: "
                                    "succeeded; needs_review: failed past the retry budget or "
                                    "in review)",
                                    "outcome=\"compensated\"");
    p->m_comp[1] = oq_metrics_gauge(p->metrics, "onceq_producer_task_compensations",
                                    "task compensations by how they ended (compensated: "
                                    "succeeded; needs_review: failed past the retry budget or "
                                    "in review)",
                                    "outcome=\"needs_review\"");
    static const char *const task_x[4][2] = {
        {"onceq_producer_task_compensation_success_ratio",
         "task compensations that ended compensated / all that ended (1 when none ended)"},
        {"onceq_producer_task_steps_rerun",
         "task steps written as more than one call (a succeeded step run again): must stay 0"},
        {"onceq_producer_tasks_needed_operator",
         "tasks that needed an operator's recovery: in needs_review, or settled by onceq review "
         "(approvals not counted)"},
        {"onceq_producer_tasks_manual_recovery_ratio",
         "tasks_needed_operator / all tasks in calls.db"}};
    for (int i = 0; i < 4; i++)
        p->m_task_x[i] = oq_metrics_gauge(p->metrics, task_x[i][0], task_x[i][1], NULL);
    p->m_outbox_pending = oq_metrics_gauge(p->metrics, "onceq_producer_outbox_pending",
                                           "outbox rows the relay has not published yet", NULL);
    p->m_oldest_pending = oq_metrics_gauge(p->metrics, "onceq_producer_oldest_pending_seconds",
                                           "age of the oldest call still pending", NULL);
    oq_metrics_set_collect_cb(p->metrics, collect_counts, p);
}

/* --- open / close ----------------------------------------------------------------------------*/

const char *oq_producer_topic_prefix(const oq_producer_t *p)
{
    return p->topic_prefix;
}

int oq_producer_open(const char *path, const oq_producer_opts_t *opts, oq_producer_t **out,
                     oq_error_t *err)
{
    oq_producer_opts_t o;
    memset(&o, 0, sizeof o);
    if (opts) o = *opts;
    o.key_ttl_ms = o.key_ttl_ms > 0 ? o.key_ttl_ms : OQ_DEFAULT_KEY_TTL_MS;
    o.max_batch = o.max_batch > 0 ? o.max_batch : 256;
    o.read_conns = o.read_conns > 0 ? o.read_conns : 4;
    o.checkpoint_pages = o.checkpoint_pages == 0 ? 1000 : o.checkpoint_pages;
    o.max_message_bytes =
        o.max_message_bytes > 0 ? o.max_message_bytes : OQ_DEFAULT_MAX_MESSAGE_BYTES;
    o.redrive_after_ms = o.redrive_after_ms == 0 ? OQ_DEFAULT_REDRIVE_AFTER_MS : o.redrive_after_ms;
    int ret = 0;
    oq_producer_t *p = calloc(1, sizeof *p);
    if (!p) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    p->path = strdup(path);
    p->key_ttl_ms = o.key_ttl_ms;
    p->metrics = o.metrics;
    oq_error_t perr = {0};
    if (o.topic_prefix && (ret = oq_topic_prefix_check(o.topic_prefix, &perr)) != 0) {
        oq_error_set(err, ret, 0, "topic prefix '%s': %s", o.topic_prefix, perr.msg);
        goto out;
    }
    p->topic_prefix = o.topic_prefix ? strdup(o.topic_prefix) : NULL;
    p->reads = calloc((size_t)o.read_conns, sizeof *p->reads);
    if (!p->path || !p->reads || (o.topic_prefix && !p->topic_prefix)) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    /* the writer first: it creates and migrates the database */
    if ((ret = oq__writer_open(path, &o, &p->writer, err))) goto out;
    for (; p->nreads < o.read_conns; p->nreads++) {
        rconn_t *r = &p->reads[p->nreads];
        pthread_mutex_init(&r->mu, NULL);
        if (oq_backend_of(path) == OQ_BACKEND_POSTGRES) {
            if ((ret = oq_pg_connect(path, &r->pg, err)) || (ret = oq_pg_prepared(r->pg, err))) {
                p->nreads++;
                goto out;
            }
            continue;
        }
        oq_db_opts_t ro = {o.synchronous, 0, 1};
        if ((ret = oq_db_open(path, &ro, &r->db, err))) {
            p->nreads++;
            goto out;
        }
        r->cache = oq_stmt_cache_new(r->db);
        if (!r->cache) {
            p->nreads++;
            ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            goto out;
        }
    }
out:
    if (ret) {
        oq_producer_close(p);
        return ret;
    }
    if (p->metrics) metrics_init(p);
    *out = p;
    return 0;
}

void oq_producer_close(oq_producer_t *p)
{
    if (!p) return;
    if (p->metrics && p->m_calls[0]) oq_metrics_set_collect_cb(p->metrics, NULL, NULL);
    oq__writer_close(p->writer); /* runs what is queued first */
    for (int i = 0; p->reads && i < p->nreads; i++) {
        oq_stmt_cache_destroy(p->reads[i].cache);
        if (p->reads[i].db) sqlite3_close_v2(p->reads[i].db);
        if (p->reads[i].pg) PQfinish(p->reads[i].pg);
        pthread_mutex_destroy(&p->reads[i].mu);
    }
    free(p->reads);
    free(p->path);
    free(p->topic_prefix);
    free(p);
}

int oq_producer_purge(oq_producer_t *p, int64_t now_ms, int64_t key_ttl_ms, int batch,
                      oq_purge_stats_t *stats, oq_error_t *err)
{
    if (!p->reads[0].pg) return oq_error_set(err, OQ_ESTATE, 0, "purge: not a PostgreSQL producer");
    rconn_t *r = rconn_acquire(p);
    oq__producer_store_t s = {NULL, NULL, r->pg};
    int ret = oq__purge_in_store(&s, now_ms, key_ttl_ms, batch, stats, err);
    pthread_mutex_unlock(&r->mu);
    return ret;
}

/* --- writes through the writer ---------------------------------------------------------------*/

static void job_done(oq__work_t *w, void *opaque)
{
    oq_submit_job_t *job = (oq_submit_job_t *)w;
    job->cb(job, opaque);
}

int oq_producer_submit_async(oq_producer_t *p, oq_submit_job_t *job, oq_submit_done_cb cb,
                             void *opaque)
{
    job->cb = cb;
    job->work.kind = OQ__WORK_SUBMIT;
    job->work.done = job_done;
    job->work.opaque = opaque;
    return oq__writer_enqueue(p->writer, &job->work);
}

/* A blocking caller's wait for its item. */
typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} waiter_t;

static void waiter_done(oq__work_t *w, void *opaque)
{
    (void)w;
    waiter_t *wt = opaque;
    pthread_mutex_lock(&wt->mu);
    wt->done = 1;
    pthread_cond_signal(&wt->cv);
    pthread_mutex_unlock(&wt->mu);
}

/* Queue \p item and wait for its completion. @returns 0 or OQ_ESHUTDOWN (not queued). */
static int run_and_wait(oq_producer_t *p, oq__work_t *item)
{
    waiter_t wt = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    item->done = waiter_done;
    item->opaque = &wt;
    int ret = oq__writer_enqueue(p->writer, item);
    if (ret == 0) {
        pthread_mutex_lock(&wt.mu);
        while (!wt.done)
            pthread_cond_wait(&wt.cv, &wt.mu);
        pthread_mutex_unlock(&wt.mu);
    }
    pthread_mutex_destroy(&wt.mu);
    pthread_cond_destroy(&wt.cv);
    return ret;
}

int oq_producer_submit(oq_producer_t *p, const oq_submit_req_t *req, oq_call_t *call,
                       oq_submit_outcome_t *outcome, oq_error_t *err)
{
    oq_submit_job_t *job = NULL;
    int ret = oq_submit_job_new(req, &job, err);
    if (ret) return ret;
    if ((ret = run_and_wait(p, &job->work))) {
        oq_submit_job_destroy(job);
        return oq_error_set(err, ret, 0, "producer is shutting down");
    }
    ret = job->work.rc;
    if (err && ret) *err = job->work.err;
    if (outcome) *outcome = job->outcome;
    if (call) {
        *call = job->call;
        memset(&job->call, 0, sizeof job->call);
    }
    oq_submit_job_destroy(job);
    return ret;
}

int oq_producer_apply_results(oq_producer_t *p, const oq_envelope_t *envs, int n,
                              oq_result_outcome_t *outcomes, oq_error_t *err)
{
    if (n <= 0) return 0;
    oq__results_t batch;
    memset(&batch, 0, sizeof batch);
    batch.work.kind = OQ__WORK_RESULTS;
    batch.envs = envs;
    batch.n = n;
    batch.outcomes = outcomes;
    int ret = run_and_wait(p, &batch.work);
    if (ret) return oq_error_set(err, ret, 0, "producer is shutting down");
    if (batch.work.rc && err) *err = batch.work.err;
    return batch.work.rc;
}

int oq_producer_redrive(oq_producer_t *p, int limit, oq_redrive_stats_t *stats, oq_error_t *err)
{
    oq__redrive_t pass;
    memset(&pass, 0, sizeof pass);
    pass.work.kind = OQ__WORK_REDRIVE;
    pass.limit = limit > 0 ? limit : 100;
    int ret = run_and_wait(p, &pass.work);
    if (ret) return oq_error_set(err, ret, 0, "producer is shutting down");
    if (pass.work.rc && err) *err = pass.work.err;
    if (stats) *stats = pass.work.rc ? (oq_redrive_stats_t){0, 0, 0} : pass.stats;
    return pass.work.rc;
}

int oq__producer_webhook_marks(oq_producer_t *p, const oq__producer_delivery_mark_t *marks, int n,
                               oq_error_t *err)
{
    if (n <= 0) return 0;
    oq__webhook_marks_t item;
    memset(&item, 0, sizeof item);
    item.work.kind = OQ__WORK_WEBHOOKS;
    item.marks = marks;
    item.n = n;
    int ret = run_and_wait(p, &item.work);
    if (ret) return oq_error_set(err, ret, 0, "producer is shutting down");
    if (item.work.rc && err) *err = item.work.err;
    return item.work.rc;
}

/* --- tasks (producer/tasks.c) ----------------------------------------------------------------*/

int oq_producer_task_submit_async(oq_producer_t *p, oq_task_job_t *job, oq_task_done_cb cb,
                                  void *opaque)
{
    return oq__writer_enqueue(p->writer, oq__task_job_prepare(job, cb, opaque));
}

int oq_producer_task_submit(oq_producer_t *p, oq_task_job_t *job, oq_error_t *err)
{
    int ret = run_and_wait(p, oq__task_job_prepare(job, NULL, NULL));
    if (ret) return oq_error_set(err, ret, 0, "producer is shutting down");
    return oq_task_job_result(job, NULL, NULL, err);
}

int oq_producer_task_review_async(oq_producer_t *p, oq_task_review_job_t *job,
                                  oq_task_review_done_cb cb, void *opaque)
{
    return oq__writer_enqueue(p->writer, oq__task_review_job_prepare(job, cb, opaque));
}

int oq_producer_task_get(oq_producer_t *p, const char *task_id, const char *tenant,
                         const char *idem_key, json_t **out, oq_error_t *err)
{
    rconn_t *r = rconn_acquire(p);
    oq__producer_store_t s = {r->db, r->cache, r->pg};
    int ret = oq__task_get_json(&s, task_id, tenant, idem_key, out, err);
    pthread_mutex_unlock(&r->mu);
    return ret;
}

/* --- reads -----------------------------------------------------------------------------------*/

/* A PostgreSQL read connection lost (server restarted, backend terminated) is re-established
 * before use; when that fails too, the read reports the error and the next one tries again. */
static rconn_t *rconn_ready(rconn_t *r)
{
    if (r->pg && PQstatus(r->pg) == CONNECTION_BAD) PQreset(r->pg);
    return r;
}

static rconn_t *rconn_acquire(oq_producer_t *p)
{
    unsigned start = atomic_fetch_add(&p->rr, 1);
    for (int i = 0; i < p->nreads; i++) {
        rconn_t *r = &p->reads[(start + (unsigned)i) % (unsigned)p->nreads];
        if (pthread_mutex_trylock(&r->mu) == 0) return rconn_ready(r);
    }
    rconn_t *r = &p->reads[start % (unsigned)p->nreads];
    pthread_mutex_lock(&r->mu);
    return rconn_ready(r);
}

int oq_producer_get(oq_producer_t *p, const char *call_id, oq_call_t *out, oq_error_t *err)
{
    rconn_t *r = rconn_acquire(p);
    oq__producer_store_t s = {r->db, r->cache, r->pg};
    int ret = oq__producer_store_get(&s, call_id, out, err);
    pthread_mutex_unlock(&r->mu);
    return ret;
}

int oq_producer_get_by_key(oq_producer_t *p, const char *tenant, const char *idem_key,
                           oq_call_t *out, oq_error_t *err)
{
    rconn_t *r = rconn_acquire(p);
    oq__producer_store_t s = {r->db, r->cache, r->pg};
    int ret = oq__producer_store_get_by_key(&s, tenant, idem_key, out, err);
    pthread_mutex_unlock(&r->mu);
    return ret;
}

int oq_producer_stats(oq_producer_t *p, json_t **out, oq_error_t *err)
{
    rconn_t *r = rconn_acquire(p);
    oq__producer_store_t s = {r->db, NULL, r->pg};
    int ret = stats_json(&s, out, err);
    pthread_mutex_unlock(&r->mu);
    return ret;
}

int oq_store_audit(sqlite3 *db, const char *call_id, oq_audit_row_t **rows, size_t *n,
                   oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    return oq__producer_store_audit_list(&s, call_id, rows, n, err);
}

int oq_store_stats(sqlite3 *db, json_t **out, oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    return stats_json(&s, out, err);
}

/* --- the operators' tools on either backend ------------------------------------------------ */

int oq_producer_db_get(const oq_dbh_t *h, const char *call_id, oq_call_t *out, oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    return oq__producer_store_get(&s, call_id, out, err);
}

int oq_producer_db_get_by_key(const oq_dbh_t *h, const char *tenant, const char *idem_key,
                              oq_call_t *out, oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    return oq__producer_store_get_by_key(&s, tenant, idem_key, out, err);
}

int oq_producer_db_audit(const oq_dbh_t *h, const char *call_id, oq_audit_row_t **rows, size_t *n,
                         oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    return oq__producer_store_audit_list(&s, call_id, rows, n, err);
}

int oq_producer_db_stats(const oq_dbh_t *h, json_t **out, oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    return stats_json(&s, out, err);
}

int oq_producer_db_purge(const oq_dbh_t *h, int64_t now_ms, int64_t key_ttl_ms, int batch,
                         oq_purge_stats_t *stats, oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    return oq__purge_in_store(&s, now_ms, key_ttl_ms, batch, stats, err);
}

static int stats_json(oq__producer_store_t *s, json_t **out, oq_error_t *err)
{
    oq__producer_counts_t c;
    int ret = oq__producer_store_counts(s, OQ__COUNTS_ALL, &c, err);
    if (ret) return ret;
    json_t *o = json_pack(
        "{s:I,s:I,s:{s:I,s:I,s:I,s:I,s:I},s:I,s:I,s:I,s:I}", "calls", (json_int_t)c.calls,
        "effects", (json_int_t)c.effects, "by_status", "pending", (json_int_t)c.pending, "running",
        (json_int_t)c.running, "succeeded", (json_int_t)c.succeeded, "failed", (json_int_t)c.failed,
        "needs_review", (json_int_t)c.needs_review, "outbox_pending", (json_int_t)c.outbox_pending,
        "outbox_rows", (json_int_t)c.outbox_rows, "result_inbox", (json_int_t)c.result_inbox,
        "oldest_pending_age_ms",
        (json_int_t)(c.oldest_pending_created_at ? oq_now_ms() - c.oldest_pending_created_at : 0));
    if (!o) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    /* tasks: by status, how compensations ended, re-run steps, operators */
    int64_t tb[OQ_TASK_NSTATUS], ok = 0, review = 0, op = 0, rerun = 0, all = 0;
    if ((ret = oq__task_store_counts(s, NULL, tb, &ok, &review, err)) ||
        (ret = oq__task_store_recovery(s, &op, &rerun, err))) {
        json_decref(o);
        return ret;
    }
    json_t *by = json_object();
    for (int i = 0; by && i < OQ_TASK_NSTATUS; i++) {
        json_object_set_new(by, oq__task_statuses[i], json_integer(tb[i]));
        all += tb[i];
    }
    json_t *t =
        json_pack("{s:I,s:o,s:{s:I,s:I},s:o,s:I,s:I,s:o}", "total", (json_int_t)all, "by_status",
                  by ? by : json_object(), "compensations", "compensated", (json_int_t)ok,
                  "needs_review", (json_int_t)review, "compensation_success_rate",
                  ok + review ? json_real((double)ok / (double)(ok + review)) : json_null(),
                  "steps_rerun", (json_int_t)rerun, "needed_operator", (json_int_t)op,
                  "manual_recovery_rate", all ? json_real((double)op / (double)all) : json_null());
    if (!t || json_object_set_new(o, "tasks", t)) {
        json_decref(o);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    *out = o;
    return 0;
}

/* --- waiting for a call ----------------------------------------------------------------------*/

typedef struct sync_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fired;
} sync_wait_t;

static void sync_woken(oq_waiter_t *w, oq_wake_t why, void *opaque)
{
    sync_wait_t *sw = opaque;
    (void)w;
    (void)why;
    pthread_mutex_lock(&sw->mu);
    sw->fired = 1;
    pthread_cond_signal(&sw->cv);
    pthread_mutex_unlock(&sw->mu);
}

int oq_producer_wait(oq_producer_t *p, const char *call_id, int64_t timeout_ms, oq_call_t *out,
                     oq_error_t *err)
{
    int ret = oq_producer_get(p, call_id, out, err);
    if (ret || timeout_ms <= 0 || oq_call_state_terminal(out->state)) return ret;
    oq_waiters_t *ws = oq__writer_waiters(p->writer);
    sync_wait_t sw = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    oq_waiter_t w;
    memset(&w, 0, sizeof w);
    if (oq_waiters_add(ws, &w, out->call_id, oq_mono_us() + timeout_ms * 1000, sync_woken, &sw,
                       NULL, NULL) == 0) {
        /* read again: a result committed since the first read woke nobody */
        oq_call_clear(out);
        ret = oq_producer_get(p, call_id, out, err);
        if (ret == 0 && !oq_call_state_terminal(out->state)) {
            pthread_mutex_lock(&sw.mu);
            while (!sw.fired)
                pthread_cond_wait(&sw.cv, &sw.mu);
            pthread_mutex_unlock(&sw.mu);
            oq_call_clear(out);
            ret = oq_producer_get(p, call_id, out, err);
        }
        oq_waiters_cancel(ws, &w); /* also waits for a callback still running */
    }
    pthread_mutex_destroy(&sw.mu);
    pthread_cond_destroy(&sw.cv);
    return ret;
}

/* --- accessors -------------------------------------------------------------------------------*/

oq_metrics_t *oq_producer_metrics(oq_producer_t *p)
{
    return p->metrics;
}

oq_waiters_t *oq_producer_waiters(oq_producer_t *p)
{
    return oq__writer_waiters(p->writer);
}

const char *oq_producer_path(const oq_producer_t *p)
{
    return p->path;
}

int64_t oq_producer_key_ttl(const oq_producer_t *p)
{
    return p->key_ttl_ms;
}
