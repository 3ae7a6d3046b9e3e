/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file worker_int.h
 * @brief Internal: the consumer worker's object (struct oq_consumer) and the functions its
 *        files share: worker.c (Kafka poll loop, batch transaction, periodic work, lifecycle),
 *        runner.c (compiled tools: inline runs, runner threads, heartbeat), outside.c (jobs
 *        to the dispatcher and their outcomes back), consumer_metrics.c (metrics, /stats).
 *        consumer/README.md has the map of threads and locks. Not part of the public API.
 *
 * Locks: c->mu (with c->cv) guards the runners' queue and lease slots; c->stats_mu the stats
 * connection; lat_ring_t.mu each latency ring. Everything else of the batch (batch, handoff,
 * sends, outcomes, results_emitted, ...) belongs to the main thread alone; counters are atomic.
 */
#ifndef OQ_CONSUMER_WORKER_INT_H
#define OQ_CONSUMER_WORKER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "admin.h"
#include "consumer_store.h"
#include "dispatch.h"
#include "execution.h"
#include "http_tools.h"
#include "oq_ckpt.h"
#include "oq_consumer.h"
#include "oq_envelope.h"
#include "oq_metrics.h"
#include "oq_ready.h"
#include "oq_relay.h"

#define OQ__COMP "consumer"
#define OQ__DUE_CAP 256
#define OQ__RECOVER_CAP 200
#define OQ__LAT_RING 2048
#define OQ__DLQ_NREASONS 8             /* the seven codes of oq_consumer.h and "other" */
#define OQ__LAG_MAX 1024               /* partitions of the input topic with a lag series */
#define OQ__DRAIN_DEFAULT_MAX_MS 60000 /* the default --drain: the longest tool timeout, capped */

typedef struct {
    char call_id[OQ_CALL_ID_LEN + 1];
    int64_t fence;
    int used;
    int lost;
} lease_slot_t;

typedef struct runner {
    struct oq_consumer *c;
    int index;
    pthread_t th;
    oq__consumer_store_t *store;
} runner_t;

/* The last OQ__LAT_RING observations of a duration, for quantiles in the stats. */
typedef struct {
    pthread_mutex_t mu;
    double v[OQ__LAT_RING];
    int n, pos;
} lat_ring_t;

/* Per declared HTTP tool: its metrics and recent latencies. */
typedef struct {
    oq_metric_t *latency;     /* onceq_consumer_downstream_seconds{tool} */
    oq_metric_t *by_class[8]; /* onceq_consumer_downstream_requests_total{tool,class} */
    atomic_uint_fast64_t n_class[8];
    lat_ring_t ring;
} tool_metrics_t;

struct oq_consumer {
    oq_consumer_opts_t o;
    char *db_path, *brokers, *group, *topic, *sync, *metrics_listen, *topic_prefix;
    char dlq_topic[OQ_TOPIC_NAME_CAP];
    /* the start-up check of the topic's retention.ms (DescribeConfigs, polled) */
    rd_kafka_queue_t *rq;
    rd_kafka_AdminOptions_t *rao;
    rd_kafka_ConfigResource_t *rres;
    int64_t rdeadline_us;
    char worker_id[128];
    oq__retry_policy_t policy;
    volatile int stop;
    volatile int hb_stop;

    oq__consumer_store_t *store;
    rd_kafka_t *rk;
    rd_kafka_t *dlq_rk;
    oq_relay_t *relay;
    oq_metrics_t *metrics;
    oq__admin_t *msrv;                 /* metrics, stats and review over HTTP */
    oq_metrics_server_t *mosrv;        /* --metrics-only-listen: /metrics, /healthz, /readyz */
    oq__consumer_store_t *stats_store; /* the stats' own connection (admin thread) */
    pthread_mutex_t stats_mu;

    /* the batch being collected (main thread) */
    rd_kafka_message_t **batch;
    int64_t *batch_t0;
    int nbatch;
    /* the batch decoded once (its envelopes, decode codes and errors) and the ids its store
     * reads ahead (oq__consumer_store_begin_batch) */
    oq_envelope_t *envs;
    int *env_rc;
    oq_error_t *env_err;
    const char **ids_call, **ids_msg;
    int subscribed;
    /* long executions planned by the current batch, handed to runners after the commit */
    char (*handoff)[OQ_CALL_ID_LEN + 1];
    int nhandoff;
    int results_emitted;
    int dlq_added;
    int offsets_dirty;      /* offsets stored since the last commit request (main thread) */
    int64_t last_commit_us; /* when the stored offsets were last committed (main thread) */

    /* runners */
    runner_t *runners;
    int nrunners;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char (*queue)[OQ_CALL_ID_LEN + 1];
    int qlen, qcap;
    lease_slot_t *slots; /* one per runner, guarded by mu */
    pthread_t hb_th;
    int hb_started;
    oq__consumer_store_t *hb_store;
    /* effects.db's background checkpointer (SQLite; NULL on PostgreSQL): every store
     * connection of the worker and its result relay is attached, so no commit checkpoints */
    oq_ckpt_t *ckpt;

    /* outside calls: declared HTTP tools, their dispatcher, the jobs of the current batch */
    oq__http_tools_t *tools;
    tool_metrics_t *tmetrics; /* one per declared tool */
    oq__dispatch_t *disp;
    rd_kafka_queue_t *cq; /* the consumer's queue: yielded to wake the batch thread */
    oq__job_t **sends;    /* claimed in the open transaction, sent once it commits */
    int nsends, csends;
    oq__job_t *outcomes; /* done jobs taken, written by the next batch transaction */
    int noutcomes;
    /* admission of outside calls (main thread): outcomes per second, measured over ~1 s
     * windows (EWMA), and the window's start; oq__outside_admit_limit() */
    double out_rate;
    int64_t rate_t0_us;
    uint64_t rate_n0;
    int64_t running_scan_us; /* the last scan of oq__outside_tell_running (main thread) */
    atomic_int recover_now;
    oq__exec_row_t *lookups; /* recovery's RECONCILING rows (OQ__RECOVER_CAP) */

    /* counters */
    atomic_uint_fast64_t n_consumed, n_dup, n_effects, n_dlq, n_terminal;
    atomic_uint_fast64_t n_requests, n_unknown, n_lease_lost, n_recon[4], n_review;
    lat_ring_t resolve_ring; /* time from UNKNOWN to a decision */
    _Atomic int64_t first_poll_us;
    /* where the main thread's time goes (logged at stop) */
    int64_t t_poll_us, t_batch_us, t_commit_us, t_sched_us, t_recover_us, n_batches;
    oq_metric_t *m_consumed, *m_dup, *m_effects, *m_dlq[OQ__DLQ_NREASONS], *m_lease_lost,
        *m_recovered, *m_reemit, *m_rollbacks;
    /* A batch transaction that keeps failing (process_batch retries it as a whole): since when
     * (monotonic us, 0 while batches commit), how many tries, the last error. Written by the
     * main thread, read by the readiness check "batch" (check_batch) under stall_mu. */
    pthread_mutex_t stall_mu;
    int64_t stall_since_us;
    int stall_tries, stall_items;
    char stall_msg[256];
    oq_metric_t *m_state[OQ_X__COUNT], *m_latency, *m_attempts;
    /* lag per assigned partition (registered as partitions are first assigned; absent while
     * not assigned here) */
    struct {
        int32_t partition;
        oq_metric_t *g;
    } m_lag[OQ__LAG_MAX];
    int n_lag;
    oq_ready_t *ready;
    _Atomic int assigned_n; /* partitions assigned; -1 before the first assignment */
    oq_metric_t *m_unknown, *m_recon[4], *m_recon_rate, *m_review, *m_review_age, *m_unsettled_age,
        *m_resolve, *m_inflight;
    /* per-call reconciliation figures read from the rows (oq__consumer_call_stats): calls gone
     * UNKNOWN, resolved by machine, sent to review; the two rates; UNKNOWN -> final p50/95/99 */
    oq_metric_t *m_calls[5], *m_calls_q[3];
    atomic_int exporter;                /* this worker exports the database's gauges */
    _Atomic int64_t calls_refreshed_us; /* last refresh of m_calls (by a scrape) */
};

/* Every time the rules store or compare in effects.db comes from the store's lease clock (a
 * per-boot anchor + CLOCK_BOOTTIME, consumer_store.h; docs/DESIGN.md "Clocks"), never from
 * the wall clock: a step of the host's clock must not lapse leases or age a lookup's
 * "absent". Durations inside this process use oq_mono_us(). Any thread (the anchor is fixed
 * at open, and every store handle of one database has the same one). */
static inline int64_t lease_now(const oq_consumer_t *c)
{
    return oq__consumer_store_now(c->store);
}

/* --- consumer_metrics.c ----------------------------------------------------------------------- */

/** @brief Register every metric of the worker (after its tools are loaded). */
void oq__consumer_metrics_init(oq_consumer_t *c);
/** @brief Add one observation to \p r. Any thread. */
void oq__lat_ring_add(lat_ring_t *r, double v);
/** @brief Index of a dead-letter code among the metric labels ("other" when unknown). */
int oq__dlq_reason_index(const char *code);
/** @brief The rules' reconciliation callback (oq__retry_policy_t.on_reconciled): metrics. */
void oq__consumer_on_reconciled(void *ctx, int verdict, int to_state, int64_t unknown_ms);
/** @brief Counts what a finish did; absorbs OQ_EFENCED (counted). @returns the remaining
 *         error, or 0. Any thread. */
int oq__consumer_note_finish(oq_consumer_t *c, int rc, const oq__exec_row_t *x, int state,
                             int effect_new);
/** @brief Refresh the gauges read from effects.db and Kafka. @locality main thread. */
void oq__consumer_refresh_gauges(oq_consumer_t *c);
/**
 * Per-call reconciliation figures, read from the durable rows (executions + audit) of one
 * consumer database, so they hold across restarts and for every worker and host sharing it.
 * A call counts once however many UNKNOWN episodes, lookups or resends it went through.
 */
typedef struct oq__call_stats {
    int64_t calls;    /**< executions in the database (each call has one) */
    int64_t unknown;  /**< calls that went UNKNOWN at least once */
    int64_t resolved; /**< of those: reached COMMITTED / FAILED_FINAL with no NEEDS_REVIEW */
    int64_t review;   /**< calls that went to NEEDS_REVIEW (needed an operator) */
    int64_t pending;  /**< went UNKNOWN, neither resolved nor ever in review yet */
    double q_ms[3];   /**< first UNKNOWN -> first final state after it, p50/p95/p99, over the
                           resolved calls only (0 when none) */
} oq__call_stats_t;

/** @brief Compute \p out from \p s's rows (autocommit reads; scans the audit). */
int oq__consumer_call_stats(oq__consumer_store_t *s, oq__call_stats_t *out, oq_error_t *err);
/** @brief \p st as the "calls" object of /stats and `onceq stats` (a new object or NULL). */
json_t *oq__call_stats_json(const oq__call_stats_t *st);

/** @brief The admin listener's /stats callback. @locality the admin thread. */
json_t *oq__consumer_stats_cb(void *ctx);

/* --- runner.c --------------------------------------------------------------------------------- */

/** @brief Run a fast compiled tool inside the open (batch or scheduler) transaction.
 *  @locality main thread. */
int oq__run_inline(oq_consumer_t *c, const oq_envelope_t *env, const char *call_id,
                   const json_t *args, int64_t now, oq_error_t *err);
/** @brief Queue \p call_id (PLANNED, durable) for a runner. Any thread; takes c->mu. */
void oq__runner_push(oq_consumer_t *c, const char *call_id);
/** @brief Non-zero when no runner is busy and nothing is queued. Takes c->mu. */
int oq__runners_idle(oq_consumer_t *c);
/** @brief Start the runner threads and the heartbeat. */
int oq__runners_start(oq_consumer_t *c, oq_error_t *err);
/** @brief Stop and join the runner threads and the heartbeat; safe to call twice. */
void oq__runners_stop(oq_consumer_t *c);

/* --- outside.c ------------------------------------------------------------------------------- */

/** @brief The dispatcher's wake callback: cut the batch thread's Kafka wait short. */
void oq__outside_wake(void *ctx);
/** @brief In tx: start a NEW call of the HTTP tool \p tool; sent after commit. @locality main. */
int oq__outside_start(oq_consumer_t *c, const oq_envelope_t *env, const oq__http_tool_t *tool,
                      int64_t now, oq_error_t *err);
/** @brief In tx: claim the due \p call_id of \p tool; sent after commit. @locality main. */
int oq__outside_claim(oq_consumer_t *c, const char *call_id, const oq__http_tool_t *tool,
                      int64_t now, oq_error_t *err);
/** @brief The transaction rolled back: drop the queued sends. @locality main thread. */
void oq__outside_drop(oq_consumer_t *c);
/** @brief The transaction committed: send the queued requests. @locality main thread. */
void oq__outside_flush(oq_consumer_t *c);
/** @brief Send the lookups of the first \p n of c->lookups (RECONCILING, committed). */
void oq__outside_send_lookups(oq_consumer_t *c, int n);
/** @brief Take the done jobs for the next transaction. @locality main thread. */
void oq__outside_take(oq_consumer_t *c);
/** How many outside jobs (started, leased, not yet written) the worker may hold at \p now_us:
 *  it takes no new message from Kafka at or above it. Main thread. */
int oq__outside_admit_limit(oq_consumer_t *c, int64_t now_us);
/** @brief Forget the taken jobs (their outcomes are committed). @locality main thread. */
void oq__outside_forget(oq_consumer_t *c);
/** @brief In tx: write the outcome of the done job \p j. @locality main thread. */
int oq__outside_apply(oq_consumer_t *c, const oq__job_t *j, int64_t now, oq_error_t *err);
/** An outside call still out this long after it was sent has its `running` event told. */
#define OQ__RUNNING_AFTER_MS 1000
/** @brief Tell `running` for the outside calls out OQ__RUNNING_AFTER_MS or longer that owe it,
 *  in one transaction (at most one scan per quarter of that). @locality main thread. */
void oq__outside_tell_running(oq_consumer_t *c, int64_t now_us);
/** @brief Renew the leases of the jobs registered with the dispatcher, in one transaction.
 *  @locality the heartbeat thread. */
void oq__outside_renew(oq_consumer_t *c);

#endif
