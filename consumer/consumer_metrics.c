/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consumer_metrics.c: the worker's metrics (registered once, at start), the latency rings
 * behind the quantiles of /stats, the gauges read from effects.db and Kafka, and the /stats
 * JSON (oq_consumer_stats_json).
 *
 * The per-call reconciliation figures (oq__consumer_call_stats: calls gone UNKNOWN, resolved by
 * machine, sent to review, UNKNOWN -> final time) are folded from the rows, not counted in
 * memory: a call's story spans runs, workers and hosts (its UNKNOWN written by one, its lookup
 * by another, its resend by a third after a restart), and only the audit sees all of it.
 * /stats, `onceq stats --consumer-db` and the onceq_consumer_calls_* gauges read the same
 * function; the gauges are refreshed by the scrape (the registry's collect callback, on the
 * listener's thread, on the stats connection under c->stats_mu), so the scan never stalls the
 * main thread.
 *
 * Threads and locks: counters are atomics and the metric objects are thread-safe, so any
 * thread counts (main, runners, heartbeat, dispatcher callbacks through the main thread). Each
 * latency ring has its own mutex. The gauges are refreshed by the main thread on its store
 * connection; /stats runs on the admin listener's thread and reads the database on the stats
 * connection under c->stats_mu.
 */
#include "worker_int.h"
#include "oq_pg.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Dead-letter reasons as metric labels: the stable codes of oq_consumer.h (the detail text
 * goes with the message). */
static const char *const dlq_reasons[OQ__DLQ_NREASONS] = {
    OQ_DLQ_EMPTY,         OQ_DLQ_TOO_LARGE, OQ_DLQ_UNKNOWN_VERSION, OQ_DLQ_INVALID,
    OQ_DLQ_NOT_TOOL_CALL, OQ_DLQ_MISMATCH,  OQ_DLQ_EXPIRED,         "other"};

int oq__dlq_reason_index(const char *code)
{
    for (int i = 0; code && i < OQ__DLQ_NREASONS - 1; i++)
        if (strcmp(code, dlq_reasons[i]) == 0) return i;
    return OQ__DLQ_NREASONS - 1;
}

static void collect_calls(oq_metrics_t *m, void *arg);

void oq__consumer_metrics_init(oq_consumer_t *c)
{
    static const double lat[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                 0.1,    0.25,  0.5,    1,     2.5,  5,     10};
    static const double att[] = {1, 2, 3, 4, 5, 7, 10, 20};
    oq_metrics_t *m = c->metrics;
    c->m_consumed = oq_metrics_counter(m, "onceq_consumer_consumed_total",
                                       "Kafka messages handled by this worker", NULL);
    c->m_dup = oq_metrics_counter(m, "onceq_consumer_duplicates_skipped_total",
                                  "redelivered messages skipped by the inbox", NULL);
    c->m_effects = oq_metrics_counter(m, "onceq_consumer_effects_total",
                                      "effects recorded by this worker", NULL);
    for (int i = 0; i < OQ__DLQ_NREASONS; i++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "reason=\"%s\"", dlq_reasons[i]);
        c->m_dlq[i] =
            oq_metrics_counter(m, "onceq_consumer_dlq_total",
                               "messages sent to the dead-letter topic, by reason", labels);
    }
    c->m_lease_lost =
        oq_metrics_counter(m, "onceq_consumer_lease_lost_total",
                           "finishing writes refused because the lease was lost", NULL);
    c->m_recovered = oq_metrics_counter(m, "onceq_consumer_recovered_total",
                                        "executions reconciled after a lapsed lease", NULL);
    c->m_rollbacks = oq_metrics_counter(
        m, "onceq_consumer_batch_rollbacks_total",
        "batch transactions rolled back (each is retried as a whole; /readyz's \"batch\" "
        "check fails while one keeps failing)",
        NULL);
    c->m_reemit = oq_metrics_counter(
        m, "onceq_consumer_results_reemitted_total",
        "results of terminal calls published again because their call message was delivered "
        "again (a redelivery or a producer redrive); also counted as duplicates",
        NULL);
    for (int i = 0; i < OQ_X__COUNT; i++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "state=\"%s\"", oq__xstate_name(i));
        c->m_state[i] = oq_metrics_gauge(
            m, "onceq_consumer_executions",
            "executions in the database by state (exported by one worker of a database: the "
            "holder of its results relay lease)",
            labels);
    }
    c->m_latency = oq_metrics_histogram(m, "onceq_consumer_processing_seconds",
                                        "poll to database commit, per message", NULL, lat,
                                        sizeof(lat) / sizeof(lat[0]));
    c->m_attempts = oq_metrics_histogram(m, "onceq_consumer_attempts",
                                         "tool runs per execution at its terminal state", NULL, att,
                                         sizeof(att) / sizeof(att[0]));

    /* outside calls and their reconciliation */
    static const double secs[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                  0.5,   1,      2.5,   5,    10,    30,   60,  300};
    static const char *const verdicts[4] = {"found", "absent", "undecided", "none"};
    c->m_unknown =
        oq_metrics_counter(m, "onceq_consumer_unknown_outcomes_total",
                           "runs whose outcome was stored UNKNOWN (sent, no answer)", NULL);
    for (int i = 0; i < 4; i++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "outcome=\"%s\"", verdicts[i]);
        c->m_recon[i] = oq_metrics_counter(
            m, "onceq_consumer_reconciliations_total",
            "reconciliation verdicts: found / absent (a definite lookup answer), undecided, none "
            "(decided by the tool's declaration)",
            labels);
    }
    c->m_recon_rate = oq_metrics_gauge(
        m, "onceq_consumer_reconciliation_success_ratio",
        "lookups with a definite answer (found + absent) / all lookups, by this worker", NULL);
    c->m_review = oq_metrics_gauge(m, "onceq_consumer_review_queue",
                                   "executions in NEEDS_REVIEW (waiting for an operator; one "
                                   "worker of a database exports it)",
                                   NULL);
    c->m_review_age = oq_metrics_gauge(m, "onceq_consumer_review_oldest_seconds",
                                       "age of the oldest execution waiting for review", NULL);
    c->m_unsettled_age =
        oq_metrics_gauge(m, "onceq_consumer_unknown_oldest_seconds",
                         "age of the oldest UNKNOWN / RECONCILING execution", NULL);
    oq_metrics_add_process(m, "consumer");
    /* database gauges: none until oq__consumer_refresh_gauges() knows whether this worker exports
     * them */
    for (int i = 0; i < OQ_X__COUNT && !c->o.no_relay; i++)
        oq_metric_set_absent(c->m_state[i], 1);
    oq_metric_set_absent(c->m_review, !c->o.no_relay);
    oq_metric_set_absent(c->m_review_age, !c->o.no_relay);
    oq_metric_set_absent(c->m_unsettled_age, !c->o.no_relay);
    c->m_resolve = oq_metrics_histogram(m, "onceq_consumer_unknown_resolved_seconds",
                                        "time from UNKNOWN to a reconciliation decision", NULL,
                                        secs, sizeof(secs) / sizeof(secs[0]));
    static const char *const calls_names[5][2] = {
        {"onceq_consumer_calls_unknown",
         "calls in the database whose outcome went UNKNOWN at least once (a call counts once)"},
        {"onceq_consumer_calls_unknown_resolved",
         "of those, calls a machine brought to COMMITTED or FAILED_FINAL (lookup, resend with "
         "the key) without ever going to NEEDS_REVIEW"},
        {"onceq_consumer_calls_review",
         "calls in the database that went to NEEDS_REVIEW (needed an operator)"},
        {"onceq_consumer_calls_reconciliation_success_ratio",
         "calls_unknown_resolved / calls_unknown (per call, not per lookup)"},
        {"onceq_consumer_calls_manual_recovery_ratio", "calls_review / all calls in the database"}};
    for (int i = 0; i < 5; i++)
        c->m_calls[i] = oq_metrics_gauge(m, calls_names[i][0], calls_names[i][1], NULL);
    static const char *const qs[3] = {"0.5", "0.95", "0.99"};
    for (int i = 0; i < 3; i++) {
        char labels[32];
        snprintf(labels, sizeof labels, "quantile=\"%s\"", qs[i]);
        c->m_calls_q[i] = oq_metrics_gauge(
            m, "onceq_consumer_calls_unknown_to_final_seconds",
            "time from a call's first UNKNOWN to its first final state, over the calls resolved "
            "by machine (calls that went to review are excluded)",
            labels);
    }
    /* read from the rows: exported like the state gauges, once the exporter is known */
    for (int i = 0; i < 8; i++)
        oq_metric_set_absent(i < 5 ? c->m_calls[i] : c->m_calls_q[i - 5], 1);
    oq_metrics_set_collect_cb(m, collect_calls, c);
    c->m_inflight = oq_metrics_gauge(m, "onceq_consumer_downstream_inflight",
                                     "outside requests in flight (leases held)", NULL);
    for (size_t t = 0; c->tools && t < c->tools->n; t++) {
        tool_metrics_t *tm = &c->tmetrics[t];
        char labels[160];
        snprintf(labels, sizeof(labels), "tool=\"%s\"", c->tools->tools[t].name);
        tm->latency = oq_metrics_histogram(m, "onceq_consumer_downstream_seconds",
                                           "outside request latency, submit to answer", labels,
                                           secs, sizeof(secs) / sizeof(secs[0]));
        for (int k = OQ__HTTP_SUCCESS; k <= OQ__HTTP_UNDECIDED; k++) {
            snprintf(labels, sizeof(labels), "tool=\"%s\",class=\"%s\"", c->tools->tools[t].name,
                     oq__http_class_name((oq__http_class_t)k));
            tm->by_class[k] = oq_metrics_counter(
                m, "onceq_consumer_downstream_requests_total",
                "outside requests by tool and outcome class (calls: SUCCESS, FINAL, "
                "RETRYABLE_BEFORE_SEND, UNKNOWN; lookups: FOUND, ABSENT, UNDECIDED)",
                labels);
        }
    }
}

void oq__lat_ring_add(lat_ring_t *r, double v)
{
    pthread_mutex_lock(&r->mu);
    r->v[r->pos] = v;
    r->pos = (r->pos + 1) % OQ__LAT_RING;
    if (r->n < OQ__LAT_RING) r->n++;
    pthread_mutex_unlock(&r->mu);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* p50, p95, p99 of the ring (zeros when empty); @returns the number of observations used. */
static int ring_quantiles(lat_ring_t *r, double q[3])
{
    static const double at[3] = {0.50, 0.95, 0.99};
    double *copy = malloc(sizeof(r->v));
    int n;
    q[0] = q[1] = q[2] = 0;
    if (!copy) return 0;
    pthread_mutex_lock(&r->mu);
    n = r->n;
    memcpy(copy, r->v, (size_t)n * sizeof(double));
    pthread_mutex_unlock(&r->mu);
    if (n > 0) {
        qsort(copy, (size_t)n, sizeof(double), cmp_double);
        for (int i = 0; i < 3; i++) {
            int k = (int)(at[i] * (double)n);
            q[i] = copy[k < n ? k : n - 1];
        }
    }
    free(copy);
    return n;
}

/* One call's unknown story, folded as its rows come (grouped by call, in id order). */
typedef struct story {
    oq__call_stats_t *st;
    char call_id[OQ_CALL_ID_LEN + 1];
    int64_t first_unknown, final_at;
    int reviewed;
    double *ms; /* resolve times of the calls resolved by machine */
    size_t n, cap;
    int oom;
} story_t;

/* The rule: a call that went to NEEDS_REVIEW needed an operator, whatever came after; one that
 * reached a final state after its first UNKNOWN without review was resolved by machine (its
 * time: first UNKNOWN to that final state); any other is still pending. */
static void story_close(story_t *y)
{
    if (!y->call_id[0] || !y->first_unknown) return;
    y->st->unknown++;
    if (y->reviewed) {
        y->st->review++;
    } else if (y->final_at) {
        y->st->resolved++;
        if (y->n == y->cap) {
            size_t cap = y->cap ? 2 * y->cap : 256;
            double *m = realloc(y->ms, cap * sizeof(double));
            if (!m) {
                y->oom = 1;
                return;
            }
            y->ms = m;
            y->cap = cap;
        }
        y->ms[y->n++] = (double)(y->final_at - y->first_unknown);
    } else {
        y->st->pending++;
    }
}

static void story_row(const oq__call_event_t *e, void *opaque)
{
    story_t *y = opaque;
    if (!e->call_id || !e->event) return;
    if (strcmp(e->call_id, y->call_id) != 0) {
        story_close(y);
        snprintf(y->call_id, sizeof y->call_id, "%s", e->call_id);
        y->first_unknown = y->final_at = 0;
        y->reviewed = 0;
    }
    if (strcmp(e->event, "unknown") == 0) {
        if (!y->first_unknown) y->first_unknown = e->ts;
    } else if (strcmp(e->event, "needs_review") == 0) {
        y->reviewed = 1;
    } else if (y->first_unknown && !y->final_at) { /* committed, failed_final */
        y->final_at = e->ts;
    }
}

int oq__consumer_call_stats(oq__consumer_store_t *s, oq__call_stats_t *out, oq_error_t *err)
{
    static const double at[3] = {0.50, 0.95, 0.99};
    int64_t counts[OQ_X__COUNT];
    story_t y;
    int rc;
    memset(out, 0, sizeof(*out));
    memset(&y, 0, sizeof(y));
    y.st = out;
    if ((rc = oq__consumer_store_state_counts(s, counts, err))) return rc;
    for (int i = 0; i < OQ_X__COUNT; i++)
        out->calls += counts[i];
    if ((rc = oq__consumer_store_unknown_story(s, story_row, &y, err))) goto out;
    story_close(&y);
    if (y.oom) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    if (y.n > 0) {
        qsort(y.ms, y.n, sizeof(double), cmp_double);
        for (int i = 0; i < 3; i++) {
            size_t k = (size_t)(at[i] * (double)y.n);
            out->q_ms[i] = y.ms[k < y.n ? k : y.n - 1];
        }
    }
out:
    free(y.ms);
    return rc;
}

json_t *oq__call_stats_json(const oq__call_stats_t *st)
{
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:{s:I, s:f, s:f, s:f}}", "calls",
                     (json_int_t)st->calls, "unknown", (json_int_t)st->unknown, "unknown_resolved",
                     (json_int_t)st->resolved, "unknown_pending", (json_int_t)st->pending, "review",
                     (json_int_t)st->review, "reconciliation_success_rate",
                     st->unknown ? json_real((double)st->resolved / (double)st->unknown)
                                 : json_null(),
                     "manual_recovery_rate",
                     st->calls ? json_real((double)st->review / (double)st->calls) : json_null(),
                     "unknown_to_final_ms", "n", (json_int_t)st->resolved, "p50", st->q_ms[0],
                     "p95", st->q_ms[1], "p99", st->q_ms[2]);
}

int oq_consumer_calls_stats(const char *db, json_t **out, oq_error_t *err)
{
    oq__consumer_store_t *s = NULL;
    oq__call_stats_t st;
    struct stat sb;
    int rc;
    *out = NULL;
    if (!db || (oq_backend_of(db) != OQ_BACKEND_POSTGRES && stat(db, &sb) != 0))
        return oq_error_set(err, OQ_EIO, 0, "no consumer database at %s", db ? db : "(none)");
    oq_db_opts_t o = {.busy_timeout_ms = 10000};
    if ((rc = oq__consumer_store_open(db, &o, "stats", &s, err))) return rc;
    if ((rc = oq__consumer_call_stats(s, &st, err)) == 0 && !(*out = oq__call_stats_json(&st)))
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    oq__consumer_store_close(s);
    return rc;
}

/* The collect callback of the worker's registry, run by a scrape before it renders: the
 * per-call gauges, read on the stats connection so the scan of the audit never stalls the
 * main thread; by the exporting worker only, at most every 10 s. */
static void collect_calls(oq_metrics_t *m, void *arg)
{
    oq_consumer_t *c = arg;
    oq__call_stats_t cs;
    int64_t now_us = oq_mono_us(), last = atomic_load(&c->calls_refreshed_us);
    (void)m;
    if (!atomic_load(&c->exporter) || (last && now_us - last < 10000000)) return;
    pthread_mutex_lock(&c->stats_mu);
    int rc = c->stats_store ? oq__consumer_call_stats(c->stats_store, &cs, NULL) : -1;
    pthread_mutex_unlock(&c->stats_mu);
    if (rc) return;
    atomic_store(&c->calls_refreshed_us, now_us);
    oq_gauge_set(c->m_calls[0], (double)cs.unknown);
    oq_gauge_set(c->m_calls[1], (double)cs.resolved);
    oq_gauge_set(c->m_calls[2], (double)cs.review);
    oq_gauge_set(c->m_calls[3], cs.unknown ? (double)cs.resolved / (double)cs.unknown : 0);
    oq_gauge_set(c->m_calls[4], cs.calls ? (double)cs.review / (double)cs.calls : 0);
    for (int i = 0; i < 3; i++)
        oq_gauge_set(c->m_calls_q[i], cs.q_ms[i] / 1000.0);
}

/* Metrics of every reconciliation decision (called by the rules, inside the transaction). */
void oq__consumer_on_reconciled(void *ctx, int verdict, int to_state, int64_t unknown_ms)
{
    oq_consumer_t *c = ctx;
    if (verdict >= 0 && verdict < 4) {
        atomic_fetch_add(&c->n_recon[verdict], 1);
        oq_counter_add(c->m_recon[verdict], 1);
        uint64_t def = atomic_load(&c->n_recon[0]) + atomic_load(&c->n_recon[1]);
        uint64_t all = def + atomic_load(&c->n_recon[2]);
        if (all) oq_gauge_set(c->m_recon_rate, (double)def / (double)all);
    }
    if (to_state == OQ_X_NEEDS_REVIEW) atomic_fetch_add(&c->n_review, 1);
    if (to_state != OQ_X_UNKNOWN && to_state != OQ_X_RECONCILING) {
        oq_histogram_observe(c->m_resolve, (double)unknown_ms / 1000.0);
        oq__lat_ring_add(&c->resolve_ring, (double)unknown_ms);
    }
}

/* Counts what a finish did. A refused finish (OQ_EFENCED: the lease was lost, which the
 * finish already audited) is counted and absorbed. @returns the remaining error, or 0. */
int oq__consumer_note_finish(oq_consumer_t *c, int rc, const oq__exec_row_t *x, int state,
                             int effect_new)
{
    if (rc == OQ_EFENCED) {
        atomic_fetch_add(&c->n_lease_lost, 1);
        oq_counter_add(c->m_lease_lost, 1);
        return 0;
    }
    if (rc) return rc;
    if (effect_new) {
        atomic_fetch_add(&c->n_effects, 1);
        oq_counter_add(c->m_effects, 1);
    }
    if (oq__xstate_terminal(state)) {
        atomic_fetch_add(&c->n_terminal, 1);
        oq_histogram_observe(c->m_attempts, (double)x->tries);
    }
    return 0;
}

/* The lag gauge of one partition, registered the first time it is assigned here. */
static oq_metric_t *lag_gauge(oq_consumer_t *c, const char *topic, int32_t partition)
{
    for (int i = 0; i < c->n_lag; i++)
        if (c->m_lag[i].partition == partition) return c->m_lag[i].g;
    if (c->n_lag >= OQ__LAG_MAX) return NULL;
    char labels[320];
    snprintf(labels, sizeof labels, "topic=\"%s\",partition=\"%d\"", topic, (int)partition);
    oq_metric_t *g = oq_metrics_gauge(
        c->metrics, "onceq_consumer_lag",
        "messages behind the high watermark, per partition assigned to this worker", labels);
    if (g) {
        c->m_lag[c->n_lag].partition = partition;
        c->m_lag[c->n_lag++].g = g;
    }
    return g;
}

void oq__consumer_refresh_gauges(oq_consumer_t *c)
{
    int64_t counts[OQ_X__COUNT];
    oq__unsettled_t un;
    /* Gauges read from effects.db describe the database, which the workers of one host share:
     * one of them exports them, the holder of the results relay lease (or every worker when it
     * runs without a relay), so a sum over workers does not count a row N times. */
    int exporter = 1;
    if (c->relay) {
        oq_relay_stats_t rs;
        oq_relay_stats(c->relay, &rs);
        exporter = rs.lease_state == OQ_RELAY_HOLDER;
    }
    for (int i = 0; i < OQ_X__COUNT; i++)
        oq_metric_set_absent(c->m_state[i], !exporter);
    oq_metric_set_absent(c->m_review, !exporter);
    oq_metric_set_absent(c->m_review_age, !exporter);
    oq_metric_set_absent(c->m_unsettled_age, !exporter);
    /* counts by state scan the table: only worth it when someone scrapes them */
    if (exporter && c->msrv && oq__consumer_store_state_counts(c->store, counts, NULL) == 0)
        for (int i = 0; i < OQ_X__COUNT; i++)
            oq_gauge_set(c->m_state[i], (double)counts[i]);
    /* the per-call figures: refreshed by the scrape itself (collect_calls) */
    atomic_store(&c->exporter, exporter);
    for (int i = 0; i < 8; i++)
        oq_metric_set_absent(i < 5 ? c->m_calls[i] : c->m_calls_q[i - 5], !exporter);
    /* the unsettled rows come from a small partial index: cheap enough to read always */
    if (oq__consumer_store_unsettled(c->store, &un, NULL) == 0) {
        int64_t now = lease_now(c);
        oq_gauge_set(c->m_review, (double)un.review);
        oq_gauge_set(c->m_review_age, un.review ? (double)(now - un.review_oldest) / 1000.0 : 0);
        oq_gauge_set(c->m_unsettled_age,
                     un.unknown ? (double)(now - un.unknown_oldest) / 1000.0 : 0);
    }
    oq_gauge_set(c->m_inflight, (double)oq__dispatch_count(c->disp));
    rd_kafka_topic_partition_list_t *parts = NULL;
    if (rd_kafka_assignment(c->rk, &parts) != RD_KAFKA_RESP_ERR_NO_ERROR || !parts) return;
    for (int i = 0; i < c->n_lag; i++) /* partitions no longer assigned here: no series */
        oq_metric_set_absent(c->m_lag[i].g, 1);
    if (parts->cnt > 0 && rd_kafka_position(c->rk, parts) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        for (int i = 0; i < parts->cnt; i++) {
            int64_t lo = 0, hi = 0;
            if (rd_kafka_get_watermark_offsets(c->rk, parts->elems[i].topic,
                                               parts->elems[i].partition, &lo, &hi) != 0)
                continue;
            int64_t pos = parts->elems[i].offset;
            if (pos < 0) pos = lo;
            oq_metric_t *g = lag_gauge(c, parts->elems[i].topic, parts->elems[i].partition);
            oq_gauge_set(g, hi > pos ? (double)(hi - pos) : 0);
            oq_metric_set_absent(g, 0);
        }
    }
    rd_kafka_topic_partition_list_destroy(parts);
}

void oq_consumer_get_stats(oq_consumer_t *c, oq_consumer_stats_t *out)
{
    out->consumed = atomic_load(&c->n_consumed);
    out->duplicates = atomic_load(&c->n_dup);
    out->effects = atomic_load(&c->n_effects);
    out->dlq = atomic_load(&c->n_dlq);
    out->terminal = atomic_load(&c->n_terminal);
    out->first_poll_us = atomic_load(&c->first_poll_us);
    out->requests = atomic_load(&c->n_requests);
    out->unknown = atomic_load(&c->n_unknown);
    out->lease_lost = atomic_load(&c->n_lease_lost);
    for (int i = 0; i < 4; i++)
        out->reconciled[i] = atomic_load(&c->n_recon[i]);
    out->to_review = atomic_load(&c->n_review);
    out->inflight = oq__dispatch_count(c->disp);
}

json_t *oq__consumer_stats_cb(void *ctx)
{
    return oq_consumer_stats_json(ctx);
}

json_t *oq_consumer_stats_json(oq_consumer_t *c)
{
    static const char *const verdicts[4] = {"found", "absent", "undecided", "none"};
    oq_consumer_stats_t st;
    oq__unsettled_t un;
    double q[3];
    oq_consumer_get_stats(c, &st);
    json_t *o = json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i}", "worker", c->worker_id,
        "consumed", (json_int_t)st.consumed, "duplicates", (json_int_t)st.duplicates, "effects",
        (json_int_t)st.effects, "dlq", (json_int_t)st.dlq, "terminal", (json_int_t)st.terminal,
        "requests", (json_int_t)st.requests, "unknown", (json_int_t)st.unknown, "lease_lost",
        (json_int_t)st.lease_lost, "to_review", (json_int_t)st.to_review, "inflight", st.inflight);
    if (!o) return NULL;
    json_t *rec = json_object();
    uint64_t def = st.reconciled[0] + st.reconciled[1], all = def + st.reconciled[2];
    for (int i = 0; i < 4; i++)
        json_object_set_new(rec, verdicts[i], json_integer((json_int_t)st.reconciled[i]));
    json_object_set_new(rec, "success_rate",
                        all ? json_real((double)def / (double)all) : json_null());
    int n = ring_quantiles(&c->resolve_ring, q);
    json_object_set_new(
        rec, "unknown_to_resolved_ms",
        json_pack("{s:i, s:f, s:f, s:f}", "n", n, "p50", q[0], "p95", q[1], "p99", q[2]));
    json_object_set_new(o, "reconciliation", rec);
    pthread_mutex_lock(&c->stats_mu); /* (the stats connection: any thread may ask) */
    if (oq__consumer_store_unsettled(c->stats_store, &un, NULL) == 0) {
        int64_t now = lease_now(c);
        json_object_set_new(
            o, "review",
            json_pack("{s:I, s:f, s:I, s:f}", "queue", (json_int_t)un.review, "oldest_s",
                      un.review ? (double)(now - un.review_oldest) / 1000.0 : 0.0, "unknown",
                      (json_int_t)un.unknown, "unknown_oldest_s",
                      un.unknown ? (double)(now - un.unknown_oldest) / 1000.0 : 0.0));
    }
    int64_t counts[OQ_X__COUNT];
    if (oq__consumer_store_state_counts(c->stats_store, counts, NULL) == 0) {
        json_t *by = json_object();
        for (int i = 0; i < OQ_X__COUNT; i++)
            json_object_set_new(by, oq__xstate_name(i), json_integer(counts[i]));
        json_object_set_new(o, "executions", by);
    }
    oq__call_stats_t cs;
    if (oq__consumer_call_stats(c->stats_store, &cs, NULL) == 0)
        json_object_set_new(o, "calls", oq__call_stats_json(&cs));
    pthread_mutex_unlock(&c->stats_mu);
    json_t *tools = json_object();
    for (size_t t = 0; c->tools && t < c->tools->n; t++) {
        tool_metrics_t *tm = &c->tmetrics[t];
        json_t *cls = json_object();
        for (int k = OQ__HTTP_SUCCESS; k <= OQ__HTTP_UNDECIDED; k++)
            json_object_set_new(cls, oq__http_class_name((oq__http_class_t)k),
                                json_integer((json_int_t)atomic_load(&tm->n_class[k])));
        n = ring_quantiles(&tm->ring, q);
        json_object_set_new(tools, c->tools->tools[t].name,
                            json_pack("{s:o, s:{s:i, s:f, s:f, s:f}}", "by_class", cls,
                                      "latency_ms", "n", n, "p50", q[0], "p95", q[1], "p99", q[2]));
    }
    json_object_set_new(o, "downstream", tools);
    return o;
}
