/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ingest.c: results back into calls.db. A librdkafka consumer-group member (group
 * "onceq-producer", default assignment strategy, auto commit off) reads onceq.tool-results on
 * its own thread.
 *
 * Design. Messages are taken in batches (one blocking poll, then whatever is already fetched,
 * up to 256), decoded on this thread, and handed to the producer's group-commit writer as one
 * work item (oq_producer_apply_results): the writer applies them, by the rules of decide.c, inside
 * the same transaction as the submits queued with them, on the same connection. calls.db thus
 * has one writer per process (plus the relay), so results never fight the submits for
 * SQLite's write lock, and they ride on commits that happen anyway. The result_inbox row keyed
 * by message_id makes a redelivered or republished result a no-op, an unknown call or a stale
 * attempt is recorded and counted but never applied, and a terminal call is never moved.
 * Offsets are committed to Kafka only after the database commit, so a crash in between
 * redelivers the batch and the inbox absorbs it (at-least-once in, exactly one state change
 * per message): after each database commit the batch's offsets are stored
 * (rd_kafka_offsets_store, enable.auto.offset.store=false, so nothing else is ever stored), and
 * the stored offsets are committed asynchronously at most once per OQ_KAFKA_COMMIT_INTERVAL_MS
 * (and synchronously when the ingest stops): an OffsetCommit per batch is a replicated write
 * on the group coordinator that cost a real cluster more than the results themselves. A commit
 * that fails, is lost in a crash or lands late only leaves the group's position behind, which
 * redelivers results that result_inbox deduplicates. Failures are logged from the offset
 * commit callback, served by rd_kafka_consumer_poll() on the ingest thread. A database failure
 * retries the same batch (in memory) until it succeeds or the ingest stops; undecodable messages
 * are logged, counted and skipped (their offsets are committed: they can never become decodable).
 *
 * Readiness (oq_ingest_probe) asks the same brokers for metadata once a second through a
 * producer handle of its own, never through the consumer's: on the consumer's handle each
 * metadata request held up the fetch of a result arriving meanwhile by ~40 ms (one client
 * thread calling an HTTP tool on `onceq up`: a 25-55 ms spike once a second, most of p99).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "oq_envelope.h"
#include "oq_kafka.h"
#include "oq_log.h"
#include "oq_metrics.h"
#include "oq_producer.h"
#include "oq_service.h"
#include "oq_util.h"

/* Results taken per batch: one writer commit for all that came while the previous one ran. At
 * 256 the ingest was a stop-and-wait loop capped near 5,600 results/s here (41 ms per writer
 * round trip under load), and an HTTP call costs two results: the results topic backed up as the
 * backlog grew. */
#define INGEST_BATCH 2048

struct oq_ingest {
    oq_producer_t *p;
    rd_kafka_t *rk;
    rd_kafka_t *probe_rk; /* readiness only: a producer handle of its own (oq_ingest_probe) */
    pthread_t th;
    int started;
    volatile int stop;
    int offsets_dirty;      /* stored since the last commit (ingest thread) */
    int64_t last_commit_us; /* ingest thread */
    _Atomic uint64_t applied, duplicate, unknown_call, stale, ignored, undecodable, batches;
    oq_metric_t *m[6];
    /* where a result's time goes on this side (ingest thread; logged at stop, and metrics):
     * Kafka lag = the message's timestamp (set when the relay produced it) to its poll here;
     * apply = the hand-off to the writer until its commit */
    int64_t t_poll_us, t_apply_us, lag_ms_sum, lag_ms_max, nmsgs;
    oq_metric_t *m_lag, *m_apply, *m_batch;
    /* the batch's scratch (ingest thread): INGEST_BATCH each */
    rd_kafka_message_t **msgs;
    oq_envelope_t *envs;
    oq_result_outcome_t *oc;
};

void oq_ingest_counts(const oq_ingest_t *in, oq_ingest_counts_t *o)
{
    memset(o, 0, sizeof *o);
    if (!in) return;
    o->applied = atomic_load(&in->applied);
    o->duplicate = atomic_load(&in->duplicate);
    o->unknown_call = atomic_load(&in->unknown_call);
    o->stale = atomic_load(&in->stale);
    o->ignored = atomic_load(&in->ignored);
    o->undecodable = atomic_load(&in->undecodable);
    o->batches = atomic_load(&in->batches);
}

typedef struct tally {
    uint64_t n[6]; /* applied, duplicate, unknown, stale, ignored, undecodable */
} tally_t;

/** Decode \p n messages and apply them through the producer's writer (one group commit).
 *  @returns 0 or the error of the commit (nothing applied; the caller retries). */
static int apply_batch(oq_ingest_t *in, rd_kafka_message_t **msgs, int n, tally_t *t)
{
    oq_envelope_t *envs = in->envs;
    oq_result_outcome_t *oc = in->oc;
    oq_error_t err = {0};
    int ne = 0;
    memset(t, 0, sizeof *t);
    for (int i = 0; i < n; i++) {
        rd_kafka_message_t *m = msgs[i];
        oq_envelope_t *e = &envs[ne];
        memset(e, 0, sizeof *e);
        oq_error_t derr = {0};
        if (oq_envelope_decode_result(m->payload, m->len, e, &derr) != 0 ||
            e->kind != OQ_KIND_TOOL_RESULT) {
            OQ_LOG_WARN("ingest",
                        "undecodable result topic=%s partition=%d offset=%lld reason=\"%s\"",
                        rd_kafka_topic_name(m->rkt), (int)m->partition, (long long)m->offset,
                        derr.code ? derr.msg : "not a tool_result");
            oq_envelope_clear(e);
            t->n[5]++;
            continue;
        }
        ne++;
    }
    if (ne == 0) return 0;
    int ret = oq_producer_apply_results(in->p, envs, ne, oc, &err);
    for (int i = 0; i < ne; i++) {
        if (ret == 0) {
            if (oc[i] >= OQ_RESULT_APPLIED && oc[i] <= OQ_RESULT_IGNORED)
                t->n[oc[i] - 1]++;
            else /* unknown status: treat as undecodable */
                t->n[5]++;
        }
        oq_envelope_clear(&envs[i]);
    }
    if (ret) OQ_LOG_WARN("ingest", "result batch of %d not applied, will retry: %s", n, err.msg);
    return ret;
}

/** Result of an asynchronous offset commit (ingest thread, from rd_kafka_consumer_poll()). */
static void commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *offsets, void *opaque)
{
    (void)rk;
    (void)opaque;
    for (int i = 0; !err && offsets && i < offsets->cnt; i++)
        err = offsets->elems[i].err;
    if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET) /* e.g. during a rebalance */
        OQ_LOG_WARN("ingest",
                    "offset commit failed: %s (the results will be redelivered and "
                    "deduplicated)",
                    rd_kafka_err2str(err));
}

/** Commit the stored offsets: asynchronously (the outcome reaches commit_cb()) and at most once
 *  per interval, or synchronously with \p final. */
static void commit_stored(oq_ingest_t *in, int final)
{
    int64_t now = oq_mono_us();
    if (!in->offsets_dirty ||
        (!final && now - in->last_commit_us < OQ_KAFKA_COMMIT_INTERVAL_MS * 1000))
        return;
    rd_kafka_resp_err_t e = rd_kafka_commit(in->rk, NULL, !final);
    if (e && e != RD_KAFKA_RESP_ERR__NO_OFFSET) /* the results will be redelivered */
        OQ_LOG_WARN("ingest", "offset commit failed: %s", rd_kafka_err2str(e));
    in->offsets_dirty = 0;
    in->last_commit_us = now;
}

/** Store the offsets after \p msgs (only after their database commit), then commit_stored(). */
static void commit_offsets(oq_ingest_t *in, rd_kafka_message_t **msgs, int n)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    for (int i = 0; i < n; i++) {
        rd_kafka_message_t *m = msgs[i];
        const char *topic = rd_kafka_topic_name(m->rkt);
        rd_kafka_topic_partition_t *p = rd_kafka_topic_partition_list_find(l, topic, m->partition);
        if (!p) p = rd_kafka_topic_partition_list_add(l, topic, m->partition);
        if (p->offset < m->offset + 1) p->offset = m->offset + 1;
    }
    rd_kafka_resp_err_t e = rd_kafka_offsets_store(in->rk, l);
    if (e) /* e.g. a partition revoked meanwhile: the batch will be redelivered */
        OQ_LOG_DEBUG("ingest", "offsets store: %s", rd_kafka_err2str(e));
    rd_kafka_topic_partition_list_destroy(l);
    in->offsets_dirty = 1;
    commit_stored(in, 0);
}

/** Kafka lag of a polled batch: each message's timestamp (the relay's produce time) to now. */
static void note_lag(oq_ingest_t *in, rd_kafka_message_t **msgs, int n)
{
    int64_t now = oq_now_ms();
    for (int i = 0; i < n; i++) {
        rd_kafka_timestamp_type_t tt;
        int64_t ts = rd_kafka_message_timestamp(msgs[i], &tt);
        if (ts <= 0 || tt == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE) continue;
        int64_t lag = now > ts ? now - ts : 0;
        in->lag_ms_sum += lag;
        if (lag > in->lag_ms_max) in->lag_ms_max = lag;
        in->nmsgs++;
        oq_histogram_observe(in->m_lag, (double)lag / 1000.0);
    }
}

/* What librdkafka does without a callback (take or let go of the partitions, eagerly or
 * incrementally as the group's protocol says), plus word to the service manager, or to
 * `onceq up`, that the results consumer has joined its group (oq_service_group_joined). */
static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    (void)opaque;
    oq_kafka_rebalance_apply(rk, err, parts, "ingest");
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        char group[256] = "onceq-producer";
        size_t gl = sizeof group;
        rd_kafka_conf_get(rd_kafka_conf(rk), "group.id", group, &gl);
        oq_service_group_joined(group, parts->cnt);
    }
}

static void *ingest_main(void *arg)
{
    oq_ingest_t *in = arg;
    rd_kafka_message_t **msgs = in->msgs;
    while (!in->stop) {
        int n = 0;
        commit_stored(in, 0);
        int64_t tp = oq_mono_us();
        rd_kafka_message_t *m = rd_kafka_consumer_poll(in->rk, 100);
        while (m) {
            if (m->err) {
                if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                    OQ_LOG_WARN("ingest", "consumer: %s", rd_kafka_message_errstr(m));
                rd_kafka_message_destroy(m);
            } else {
                msgs[n++] = m;
            }
            if (n == INGEST_BATCH) break;
            m = rd_kafka_consumer_poll(in->rk, 0);
        }
        int64_t ta = oq_mono_us();
        in->t_poll_us += ta - tp;
        if (n == 0) continue;
        note_lag(in, msgs, n);
        tally_t t;
        int rc;
        int64_t backoff = 50;
        while ((rc = apply_batch(in, msgs, n, &t)) != 0 && !in->stop) {
            oq_sleep_ms(backoff, &in->stop);
            if (backoff < 2000) backoff *= 2;
        }
        int64_t tz = oq_mono_us();
        in->t_apply_us += tz - ta;
        oq_histogram_observe(in->m_apply, (double)(tz - ta) / 1e6);
        oq_histogram_observe(in->m_batch, (double)n);
        if (rc == 0) {
            _Atomic uint64_t *ctr[6] = {&in->applied, &in->duplicate, &in->unknown_call,
                                        &in->stale,   &in->ignored,   &in->undecodable};
            for (int i = 0; i < 6; i++) {
                atomic_fetch_add(ctr[i], t.n[i]);
                oq_counter_add(in->m[i], t.n[i]);
            }
            atomic_fetch_add(&in->batches, 1);
            commit_offsets(in, msgs, n);
        }
        for (int i = 0; i < n; i++)
            rd_kafka_message_destroy(msgs[i]);
    }
    commit_stored(in, 1);
    OQ_LOG_INFO("ingest",
                "stopped: batches=%llu results=%lld poll_ms=%lld apply_ms=%lld "
                "kafka_lag_ms_avg=%.1f kafka_lag_ms_max=%lld",
                (unsigned long long)atomic_load(&in->batches), (long long)in->nmsgs,
                (long long)(in->t_poll_us / 1000), (long long)(in->t_apply_us / 1000),
                in->nmsgs ? (double)in->lag_ms_sum / (double)in->nmsgs : 0.0,
                (long long)in->lag_ms_max);
    return NULL;
}

int oq_ingest_start(oq_producer_t *p, const char *brokers, const void *cfg, oq_metrics_t *metrics,
                    oq_ingest_t **out, oq_error_t *err)
{
    int ret = 0;
    char errstr[512];
    rd_kafka_conf_t *conf = NULL;
    rd_kafka_topic_partition_list_t *topics = NULL;
    oq_ingest_t *in = calloc(1, sizeof *in);
    if (!in) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    in->p = p;
    in->msgs = calloc(INGEST_BATCH, sizeof *in->msgs);
    in->envs = calloc(INGEST_BATCH, sizeof *in->envs);
    in->oc = calloc(INGEST_BATCH, sizeof *in->oc);
    if (!in->msgs || !in->envs || !in->oc) {
        ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    conf = oq_kafka_conf_new(OQ_KAFKA_CONSUMER, brokers, (const oq_config_t *)cfg, err);
    if (!conf) {
        ret = err ? err->code : OQ_EINVAL;
        goto out;
    }
    /* Defaults first, then the user's -X again so that they win. */
    if ((ret = oq_kafka_conf_set(conf, "group.id", "onceq-producer", err)) ||
        (ret = oq_kafka_conf_set(conf, "enable.auto.commit", "false", err)) ||
        (ret = oq_kafka_conf_set(conf, "auto.offset.reset", "earliest", err)))
        goto out;
    if ((ret = oq_kafka_conf_apply(conf, OQ_KAFKA_CONSUMER, (const oq_config_t *)cfg, err)))
        goto out;
    /* The commit discipline is not the user's to change: only offsets of applied results. */
    if ((ret = oq_kafka_conf_set(conf, "enable.auto.commit", "false", err)) ||
        (ret = oq_kafka_conf_set(conf, "enable.auto.offset.store", "false", err)))
        goto out;
    rd_kafka_conf_set_offset_commit_cb(conf, commit_cb);
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    in->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    if (!in->rk) {
        ret = oq_error_set(err, OQ_EKAFKA, 0, "rd_kafka_new: %s", errstr);
        goto out;
    }
    conf = NULL; /* owned by rk */
    rd_kafka_poll_set_consumer(in->rk);
    topics = rd_kafka_topic_partition_list_new(1);
    char topic[OQ_TOPIC_NAME_CAP];
    oq_topic_name(oq_producer_topic_prefix(p), OQ_TOPIC_RESULTS, topic, sizeof topic);
    rd_kafka_topic_partition_list_add(topics, topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t ke = rd_kafka_subscribe(in->rk, topics);
    if (ke) {
        ret = oq_error_set(err, OQ_EKAFKA, ke, "subscribe: %s", rd_kafka_err2str(ke));
        goto out;
    }
    /* The readiness probe's metadata requests go through a handle of their own: asked on the
     * consumer's handle once a second, each one held up the fetch of a result that was
     * arriving meanwhile by ~40 ms (oq_ingest_probe). */
    if (!(conf = oq_kafka_conf_new(OQ_KAFKA_PRODUCER, brokers, (const oq_config_t *)cfg, err))) {
        ret = err ? err->code : OQ_EINVAL;
        goto out;
    }
    in->probe_rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
    if (!in->probe_rk) {
        ret = oq_error_set(err, OQ_EKAFKA, 0, "rd_kafka_new (readiness probe): %s", errstr);
        goto out;
    }
    conf = NULL; /* owned by probe_rk */
    if (metrics) {
        static const char *const names[6] = {"applied", "duplicate", "unknown_call",
                                             "stale",   "ignored",   "undecodable"};
        for (int i = 0; i < 6; i++) {
            char labels[48];
            snprintf(labels, sizeof labels, "outcome=\"%s\"", names[i]);
            in->m[i] = oq_metrics_counter(metrics, "onceq_producer_results_total",
                                          "Result messages by outcome", labels);
        }
        static const double lat[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                     0.05,   0.1,   0.25,   0.5,   1,    2.5};
        static const double bsz[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
        in->m_lag = oq_metrics_histogram(
            metrics, "onceq_producer_results_lag_seconds",
            "Result message: its Kafka timestamp (the relay produced it) to its poll by the ingest",
            NULL, lat, sizeof lat / sizeof lat[0]);
        in->m_apply =
            oq_metrics_histogram(metrics, "onceq_producer_results_apply_seconds",
                                 "A batch of results handed to the writer until its commit", NULL,
                                 lat, sizeof lat / sizeof lat[0]);
        in->m_batch = oq_metrics_histogram(metrics, "onceq_producer_results_batch_size",
                                           "Result messages per ingest batch", NULL, bsz,
                                           sizeof bsz / sizeof bsz[0]);
    }
    if (pthread_create(&in->th, NULL, ingest_main, in) != 0) {
        ret = oq_error_set(err, OQ_EIO, 0, "cannot start the ingest thread");
        goto out;
    }
    in->started = 1;
    pthread_setname_np(in->th, "oq-ingest"); /* top -H, perf; failure harmless */
    OQ_LOG_INFO("ingest", "consuming %s as group onceq-producer from %s", topic, brokers);
out:
    if (topics) rd_kafka_topic_partition_list_destroy(topics);
    if (conf) rd_kafka_conf_destroy(conf);
    if (ret) {
        oq_ingest_stop(in);
        return ret;
    }
    *out = in;
    return 0;
}

void oq_ingest_stop(oq_ingest_t *in)
{
    if (!in) return;
    in->stop = 1;
    if (in->started) pthread_join(in->th, NULL);
    if (in->rk) {
        rd_kafka_consumer_close(in->rk);
        rd_kafka_destroy(in->rk);
    }
    if (in->probe_rk) rd_kafka_destroy(in->probe_rk);
    free(in->msgs);
    free(in->envs);
    free(in->oc);
    free(in);
}

int oq_ingest_probe(oq_ingest_t *in, int timeout_ms, oq_error_t *err)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_poll(in->probe_rk, 0); /* nothing else polls it: its statistics (common/kafka.c) */
    rd_kafka_resp_err_t e = rd_kafka_metadata(in->probe_rk, 0, NULL, &md, timeout_ms);
    if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
        return oq_error_set(err, OQ_EKAFKA, e, "no broker answered within %d ms: %s", timeout_ms,
                            rd_kafka_err2str(e));
    int brokers = md->broker_cnt;
    rd_kafka_metadata_destroy(md);
    if (brokers == 0) return oq_error_set(err, OQ_EKAFKA, 0, "the cluster lists no broker");
    return 0;
}
