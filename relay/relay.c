/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The outbox relay engine: one thread per relay that competes for the database's lease and,
 * (About 1,500 lines, over the usual 800: the produce loop, the in-flight ring, the watermark
 * writer and dead letters share one thread's state without locks; its SQL is in store.c.)
 * while it holds it, streams unpublished outbox rows into an idempotent librdkafka producer
 * and marks them published from delivery reports.
 *
 * Pipeline. The thread reads up to batch_rows rows (and batch_bytes payload) after a cursor
 * (the highest seq handed to librdkafka) and produces each one straight from the SQLite row
 * (RD_KAFKA_MSG_F_COPY), keeping at most max_inflight messages without a delivery report. Each
 * message's opaque is a slot index in a fixed table that remembers its seq, created_at, topic
 * and its place in a ring of in-flight seqs kept in produce (= seq) order. Delivery reports are
 * served by rd_kafka_poll() on this same thread, so no locking is needed around the relay's own
 * state. A report flags its ring entry; the ring's head then moves over every delivered entry,
 * so `wm` (watermark) is always the highest seq such that every row up to it was delivered.
 * Publish progress is stored as that one number (relay_lease.published_seq, see store.c), not
 * as a mark per row: a writer thread with its own connection persists it in one small fenced
 * UPDATE that also renews the lease, when batch_rows rows were delivered since the last one,
 * when nothing is in flight, or after 10 ms. One job at a time: while it commits, the next
 * advance accumulates and the relay thread keeps producing. The writer also runs the retention
 * deletes.
 *
 * Failures. librdkafka retries retriable errors itself (the idempotent producer keeps order
 * across retries). A delivery report that still fails (message timeout, purge, a permanent
 * error) puts the relay into draining: it stops producing, waits until nothing is in flight
 * (the watermark stops below the failed row: its ring entry is never flagged), then rewinds
 * the cursor to the watermark and resumes after a bounded exponential backoff (100 ms .. 5 s).
 * Rows above the failed one that were delivered are sent again: duplicates the inbox absorbs,
 * and the partition's order of first copies is kept. A fatal producer error
 * (rd_kafka_fatal_error) purges and destroys the producer, treats every unreported message as
 * failed and builds a new producer: rows stay unpublished meanwhile. A broker outage needs
 * nothing special: messages wait in librdkafka's queue, max_inflight stops the reading, and
 * rd_kafka_poll() blocks, so the relay does not spin. A new lease holder starts from the stored
 * watermark, so rows delivered after the last stored advance are sent again, as after a crash.
 *
 * Dead letters. A few per-message errors cannot be cured by sending the same bytes again
 * (permanent_errs[]). When librdkafka's own size check refuses a row in rd_kafka_producev(),
 * the row alone is at fault: it is set aside at once. When a delivery report carries such an
 * error, the broker may have refused the whole batch for one bad record (or for its total
 * size), so the failure takes the usual drain and rewind, and then that row is sent alone
 * (probe_seq: after the rows before it were delivered, and nothing after it until it is
 * answered). Refused again, it is set aside; delivered, it was innocent. Setting a row aside
 * marks its ring entry done, so the watermark passes it, and queues its record, which the next
 * mark job writes to outbox_dead in the same fenced transaction as the watermark. A relay that
 * loses its lease drops the queued records with everything else: the next holder meets the
 * same rows again. Every other error keeps the drain-rewind-backoff path above.
 *
 * Idle latency. After a read that found nothing, the relay waits on a condition variable (woken by
 * oq_relay_notify()) for 1 ms, then 2, 4, up to poll_max_ms, and checks PRAGMA data_version between
 * waits: it changes when any other connection commits. The value is sampled *before* each read, so
 * a commit racing with the read is never missed. A relay in its own process (`onceq relay`,
 * opts.watch_wal) is never notified by the writer, another process, so it also watches the SQLite
 * WAL file with inotify: a commit's frames are written to the WAL before its fsync and become
 * visible after it, so a write wakes the relay, which then checks data_version every 100 us (for 5
 * ms, then with the poll's backoff restarted at 1 ms) and reads as soon as the commit is visible. A
 * write drained on the way into the wait, or together with an earlier commit's, also restarts the
 * backoff: a commit whose fsync is running then is announced by no later event (wal_drain). The
 * idle hop is then about the commit's own fsync instead of up to poll_max_ms (2-3 ms of a single
 * call's ~20 ms on the embedded broker); polling stays as the fallback (no inotify, a URI path) and
 * for a watch event missed. On PostgreSQL the idle relay waits on its LISTEN connection's socket
 * instead (note_wait): a commit's NOTIFY makes it readable and ends the wait, and oq_relay_notify()
 * also writes an eventfd polled beside it; the poll interval stays as the fallback (a lost
 * connection, a missed notification). Polling alone cost an idle commit half a poll interval on
 * average: `onceq-bench e2e --rate 50 --conns 1` on PostgreSQL p50 8 -> 5 ms, p99 12 -> 7 ms.
 *
 * Idle send. linger.ms (1 by default) lets a request gather what commits meanwhile, which under
 * load costs nothing (a request carries what accumulated while the previous ones were in
 * flight) but makes a lone row wait the whole linger. So the first batch read after an idle
 * wait, with nothing in flight, is sent at once (send_idle: rd_kafka_flush(), during which
 * librdkafka treats the linger as expired, up to the delivery report: one round trip); rows
 * that commit meanwhile are read after it and linger as usual, so a busy relay keeps its
 * batching (linger.ms=0 throughout cost the closed-loop e2e run 2.5x the relay CPU). One
 * producer, one queue: the order of messages is the same as without it.
 *
 * Partial batches. A read that did not fill (fewer than batch_rows rows and batch_bytes: the
 * relay has caught up with the writer) is not followed by another read until every message in
 * flight has its delivery report, or partial_wait_ms (100) has passed. Rows committed meanwhile
 * are read as one batch after the reports, instead of one small batch per writer commit; a read
 * that filled (a backlog) is followed at once, as before, so a backlog still keeps many
 * requests in flight. Why: librdkafka 2.0 (Debian 12) spins its broker threads on poll(0)
 * while a partition holds messages whose linger.ms has expired (or expires in under 1 ms, its
 * poll granularity) but that it may not send yet (a request unsent, or 5 in flight with
 * idempotence). Reading per commit kept that state almost all the time under load: in the
 * closed-loop e2e run the relay's and the consumers' result-relay broker threads made ~70,000
 * poll(0) calls a second, ~20-40 us of CPU per call over the pipeline, and the mock broker
 * answered ~3x more produce requests. The wait costs a row at most one round trip, which it
 * would have spent behind the requests in flight anyway; the 100 ms bound is for a partition
 * that does not answer (a leader down): rows of the others then leave at least every 100 ms, or
 * at once when they fill a batch. 10 ms was too short on a loaded host: the round trips grew
 * past it and the spinning came back (relay 31-36 us of CPU per call against 11-12 with 100).
 * The wait applies only after a read of at least partial_min_rows (64) rows. A delivery report
 * came back well after the consumers could already fetch the message (tens of ms: the embedded
 * broker left Nagle on its connections, fixed since in main/cmd_broker.c), so waiting for it
 * after every small read cost each relay hop 20-40 ms at 400 calls/s (end to end p50 10 ->
 * 59-66 ms, `onceq-bench e2e --rate 400 --conns 16`) and a 16-thread closed loop two thirds of
 * its rate. And it feeds
 * itself: rows gathered during a late report make the next read big enough to wait again, so
 * with a bound of 16 rows the same 400 calls/s ran at p50 37-45 ms in some runs and 12 in
 * others. 64 rows (p50 10-11 ms at 400 calls/s, 13 at 1,500) engages it only near capacity,
 * where the writer's group commits alone carry dozens of rows and the CPU it saves matters.
 *
 * Gather. librdkafka 2.0 sends one partition per Produce request, and with a 1 ms linger a
 * relay that reads per writer commit sends a handful of messages per request under load (6.6
 * for the outbox relay in the closed-loop e2e run, 0.24 Produce requests per call). While the
 * rows arrive at gather_min_rate (5,000/s) or more, reads are spaced gather_ms (10) apart, so
 * each partition's batch gathers 10 ms of rows; below that rate the relay reads per commit as
 * before, so a light load pays nothing. The rate is a moving average of rows over time between
 * reads (rate_ewma), which the spacing does not inflate (more rows, over a longer interval);
 * a stale rate after a burst costs the next read at most gather_ms. A read that filled (a
 * backlog) is followed at once. Measured (docs/SCALING.md, "Nagle in the embedded broker"):
 * closed loop +12 % calls/s and -15 % CPU per call, p50 +13 ms there; 400 calls/s unchanged.
 * On PostgreSQL the spacing is 5 ms: its one relay carries the calls and the results, and at
 * half of capacity (3,500 calls/s, 7,000 rows/s) 10 ms cost the end-to-end p99 6 ms (45-46
 * against 38-40 ms, three pairs alternated) while 5 ms kept the closed loop's rate (within
 * noise, two pairs); docs/SCALING.md, "The relay on PostgreSQL at half of capacity".
 *
 * Lease. Standbys try to take the lease every min(lease/10, 100 ms); the holder renews every
 * lease/3 (and in every mark transaction) and stops producing when less than a third of the
 * lease is left unrenewed. See store.c for the fencing SQL.
 */
#include "oq_relay.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#include "oq_envelope.h" /* OQ_HDR_MESSAGE_ID, the header the consumer reads */
#include "oq_kafka.h"
#include "oq_log.h"
#include "oq_pg.h" /* oq_backend_of: a connection string is never logged */
#include "oq_util.h"
#include "relay_store.h"

#define OQ__RELAY_MAX_TOPICS 64
#define OQ__RELAY_BACKOFF_MIN_MS 100
#define OQ__RELAY_BACKOFF_MAX_MS 5000
#define OQ__RELAY_MARK_MAX_DELAY_US 10000
/* gather_ms by backend when opts.gather_ms is -1 ("Gather") */
#define OQ__RELAY_GATHER_MS_SQLITE 10
#define OQ__RELAY_GATHER_MS_PG 5
#define OQ__RELAY_IDLE_SEND_MS 50 /* the idle send's wait for its delivery report, at most */

enum { OQ__JOB_IDLE = 0, OQ__JOB_PENDING, OQ__JOB_DONE };

typedef struct {
    int64_t seq;
    int32_t partition; /* -1: unknown (failed before partitioning) */
    int32_t topic;     /* index in the topic cache */
    int32_t err;       /* rd_kafka_resp_err_t of the failure (0: unknown, e.g. abandoned) */
} entry_t;

typedef struct {
    entry_t *v;
    size_t n, cap;
} list_t;

/* A row set aside: its ring entry counts as done, and the record goes to outbox_dead with the
 * mark that stores a watermark at or above it. */
typedef struct {
    int64_t seq;
    int32_t err;
    char message_id[40];
    char key[64];
    char detail[200];
} dead_t;

typedef struct {
    dead_t *v;
    size_t n, cap;
} dead_list_t;

/* The per-message errors that sending the same bytes again cannot cure (relay/README.md, "Dead
 * letters", says why each one is here and why the others are not). */
static const rd_kafka_resp_err_t permanent_errs[] = {
    RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
    RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE,
    RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE,
    RD_KAFKA_RESP_ERR_INVALID_RECORD,
};
#define OQ__RELAY_NPERM ((int)(sizeof(permanent_errs) / sizeof(permanent_errs[0])))

typedef struct {
    int64_t seq;
    int64_t created_at;
    int32_t topic;
    uint32_t next_free;
    uint32_t ring; /* index of this message's entry in the in-flight ring */
    int used;
} slot_t;

typedef struct {
    char *name; /* the rows' (logical) name; the handle is for its physical name */
    rd_kafka_topic_t *rkt;
} topic_t;

struct oq_relay {
    /* options (immutable after new) */
    char *db_path, *sync, *brokers, *lease_name, *owner, *topic_prefix;
    const oq_config_t *kafka_cfg;
    int64_t lease_ms, batch_bytes, retention_ms, stop_timeout_ms;
    int batch_rows, max_inflight, cleanup_batch, poll_max_ms, partial_wait_ms, watch_wal;
    int partial_min_rows, gather_ms, gather_min_rate;

    /* control */
    pthread_t thread;
    int started, joined;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int notified;
    int wake_fd; /* PostgreSQL: an eventfd oq_relay_notify() also writes, so the idle wait on
                    the LISTEN socket is woken by it too; -1 on SQLite (set before the thread) */
    atomic_int stop;
    oq_relay_stats_t shared; /* snapshot for oq_relay_stats(), under mu */

    /* relay-thread state */
    oq__relay_store_t *store;
    rd_kafka_t *rk;
    topic_t topics[OQ__RELAY_MAX_TOPICS];
    int ntopics;
    slot_t *slots;
    uint32_t free_head; /* slot index + 1, 0 = none */
    list_t failed;
    /* in-flight seqs in produce order (capacity max_inflight): head..tail, done = reported */
    int64_t *ring_seq;
    unsigned char *ring_done;
    uint32_t ring_head, ring_len;
    dead_list_t dead;           /* rows set aside, not yet covered by a submitted mark */
    int64_t probe_seq;          /* > 0: this row failed permanently in a batch; it is sent
                                   alone, and set aside if it fails permanently again */
    int64_t wm;                 /* every seq <= wm delivered (or stored as published) */
    int64_t wm_stored;          /* the watermark last stored by a mark (or read at acquire) */
    uint64_t ndelivered;        /* delivery reports not yet covered by a submitted mark */
    int64_t first_delivered_us; /* when the oldest such report arrived */
    int64_t cursor;
    int holder;
    int64_t fence;
    /* this process's own view of its lease, on CLOCK_MONOTONIC (a step of the wall clock
     * must neither stall the renewals nor stretch the time it publishes); the stored lease is
     * wall-clock (docs/DESIGN.md, "Clocks") */
    int64_t renewed_us, lease_until_us;
    int draining, fatal;
    int64_t resume_at_us, backoff_ms;
    int64_t last_dv;
    int idle_ms;
    int from_idle; /* the last pass ended in the idle wait (nothing to read, nothing in flight) */
    int wal_fd;    /* inotify on DB-wal while watch_wal (relay thread), -1 = poll only */
    uint64_t notify_wakes; /* idle waits ended by a NOTIFY on the LISTEN socket (PostgreSQL) */
    int batch_n;
    int64_t batch_payload; /* payload bytes of the batch being produced */
    int last_full;         /* the last batch read stopped at a limit: more rows were waiting */
    int last_n;            /* rows of the last batch read */
    int64_t last_read_us;  /* CLOCK_MONOTONIC of the last read that produced rows */
    double rate_ewma;      /* rows per second over the recent reads ("Gather") */
    int64_t rate_prev_us;  /* CLOCK_MONOTONIC of the last read, 0 before the first */
    int64_t next_stats_us, next_lease_try_us; /* CLOCK_MONOTONIC */
    int last_kafka_err;
    int64_t last_kafka_err_us;
    int64_t max_msg_bytes;        /* the producer's message.max.bytes (for log lines) */
    oq_relay_stats_t st;          /* working copy */
    int64_t t_read_us, t_poll_us; /* where the relay thread's time goes (stop log) */

    /* writer thread: marks (one job at a time) and retention, on its own connection */
    pthread_t writer;
    int writer_started;
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    int wstop;
    int job_state;        /* OQ__JOB_*, under wmu */
    int64_t job_upto;     /* watermark handed to the writer */
    uint64_t job_n;       /* delivery reports it covers (for the published counter) */
    int64_t job_fence;    /* fence the job was submitted under */
    dead_list_t job_dead; /* dead letters stored with the job's watermark */
    int job_rc;           /* results, valid in DONE */
    int64_t job_now, job_from;
    int64_t job_mono_us; /* CLOCK_MONOTONIC when the job's lease renewal was sampled */
    char job_err[256];
    oq__relay_store_t *wstore;
    oq_ckpt_t *ckpt; /* the stores' checkpointer (SQLite): opts.ckpt, or own_ckpt */
    int own_ckpt;
    atomic_int is_holder; /* the writer cleans up only while the relay holds the lease */
    atomic_ullong cleaned;
    int64_t t_mark_us; /* writer-only */

    /* metrics (NULL when no registry) */
    oq_metric_t *m_pending, *m_oldest, *m_published, *m_produced, *m_errors, *m_rewinds,
        *m_restarts, *m_fenced, *m_cleaned, *m_holder, *m_fence, *m_inflight, *m_batch, *m_latency;
    oq_metric_t *m_dead[OQ__RELAY_NPERM]; /* onceq_relay_dead_letters_total{reason} */
};

/* --- small helpers ------------------------------------------------------------------------- */

static char *dup_str(const char *s)
{
    return s ? strdup(s) : NULL;
}

static int list_push(list_t *l, entry_t e)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        entry_t *v = realloc(l->v, cap * sizeof(*v));
        if (!v) return OQ_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = e;
    return 0;
}

static int dead_push(dead_list_t *l, const dead_t *d)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        dead_t *v = realloc(l->v, cap * sizeof(*v));
        if (!v) return OQ_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *d;
    return 0;
}

static int permanent_index(rd_kafka_resp_err_t e)
{
    for (int i = 0; i < OQ__RELAY_NPERM; i++)
        if (permanent_errs[i] == e) return i;
    return -1;
}

void oq_relay_opts_init(oq_relay_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->lease_ms = 5000;
    o->batch_rows = 1000;
    o->batch_bytes = 1 << 20;
    o->max_inflight = 50000;
    o->retention_ms = 3600 * 1000;
    o->cleanup_batch = 1000;
    o->poll_max_ms = 5;
    o->partial_wait_ms = 100;
    o->partial_min_rows = 64;
    o->gather_ms = -1; /* by backend: OQ__RELAY_GATHER_MS_SQLITE / _PG */
    o->gather_min_rate = 5000;
    o->stop_timeout_ms = 10000;
}

/* --- slots --------------------------------------------------------------------------------- */

static void slots_reset(oq_relay_t *r)
{
    r->free_head = 0;
    for (int i = r->max_inflight - 1; i >= 0; i--) {
        r->slots[i].used = 0;
        r->slots[i].next_free = r->free_head;
        r->free_head = (uint32_t)i + 1;
    }
    r->st.inflight = 0;
}

static uint32_t slot_alloc(oq_relay_t *r)
{
    uint32_t h = r->free_head;
    if (!h) return 0;
    r->free_head = r->slots[h - 1].next_free;
    r->slots[h - 1].used = 1;
    return h;
}

static void slot_free(oq_relay_t *r, uint32_t h)
{
    r->slots[h - 1].used = 0;
    r->slots[h - 1].next_free = r->free_head;
    r->free_head = h;
}

/* --- the in-flight ring and the watermark ------------------------------------------------- */

static void ring_reset(oq_relay_t *r)
{
    r->ring_head = 0;
    r->ring_len = 0;
}

/* Appends \p seq (produced in seq order); the caller has a free slot, so there is room. */
static uint32_t ring_push(oq_relay_t *r, int64_t seq)
{
    uint32_t cap = (uint32_t)r->max_inflight;
    uint32_t i = (r->ring_head + r->ring_len) % cap;
    r->ring_seq[i] = seq;
    r->ring_done[i] = 0;
    r->ring_len++;
    return i;
}

/* A delivery report for ring entry \p i: move the head (and the watermark) over every
 * delivered entry. */
static void ring_delivered(oq_relay_t *r, uint32_t i)
{
    uint32_t cap = (uint32_t)r->max_inflight;
    r->ring_done[i] = 1;
    while (r->ring_len > 0 && r->ring_done[r->ring_head]) {
        r->wm = r->ring_seq[r->ring_head];
        r->ring_head = (r->ring_head + 1) % cap;
        r->ring_len--;
    }
}

/* Every message still without a delivery report counts as failed (producer gone or purged). */
static void abandon_inflight(oq_relay_t *r)
{
    for (int i = 0; i < r->max_inflight; i++) {
        if (!r->slots[i].used) continue;
        list_push(&r->failed,
                  (entry_t){.seq = r->slots[i].seq, .partition = -1, .topic = r->slots[i].topic});
    }
    if (r->failed.n) r->draining = 1;
    slots_reset(r);
}

/*
 * Sets row \p seq aside (dead letter): its ring entry \p ring counts as done, so the watermark
 * may pass it, and its record waits in r->dead for the mark that stores that watermark (the
 * record and the watermark are written in one transaction).
 * @returns 0, or OQ_ENOMEM (nothing changed: the caller fails the row as usual, it stays
 *          pending).
 */
static int set_aside(oq_relay_t *r, int64_t seq, uint32_t ring, rd_kafka_resp_err_t e,
                     const char *message_id, const void *key, size_t key_len, const char *detail)
{
    dead_t d;
    memset(&d, 0, sizeof(d));
    d.seq = seq;
    d.err = e;
    snprintf(d.message_id, sizeof(d.message_id), "%s", message_id ? message_id : "");
    if (key)
        snprintf(d.key, sizeof(d.key), "%.*s", (int)(key_len < 63 ? key_len : 63),
                 (const char *)key);
    snprintf(d.detail, sizeof(d.detail), "%s", detail);
    if (dead_push(&r->dead, &d) != 0) return OQ_ENOMEM;
    ring_delivered(r, ring);
    return 0;
}

/* --- librdkafka callbacks (served by rd_kafka_poll on the relay thread) ------------------- */

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    oq_relay_t *r = opaque;
    uint32_t h = (uint32_t)(uintptr_t)m->_private;
    (void)rk;
    if (h == 0 || h > (uint32_t)r->max_inflight || !r->slots[h - 1].used) return; /* stale */
    slot_t *s = &r->slots[h - 1];
    entry_t e = {.seq = s->seq, .partition = m->partition, .topic = s->topic};
    int64_t created = s->created_at;
    uint32_t ring = s->ring;
    slot_free(r, h);
    r->st.inflight--;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        if (!r->holder) return; /* tracking was dropped with the lease */
        if (e.seq == r->probe_seq) {
            OQ_LOG_INFO("relay",
                        "seq=%" PRId64 " sent alone was delivered: the permanent error "
                        "was its batch's, not this row's",
                        e.seq);
            r->probe_seq = 0;
        }
        if (r->ndelivered++ == 0) r->first_delivered_us = oq_mono_us();
        ring_delivered(r, ring);
        if (r->m_latency) {
            int64_t lat = oq_now_ms() - created;
            oq_histogram_observe(r->m_latency, lat > 0 ? (double)lat / 1000.0 : 0.0);
        }
        return;
    }
    if (!r->holder) return; /* purged after losing the lease: nothing to re-send from here */
    if (e.seq == r->probe_seq && permanent_index(m->err) >= 0) {
        /* Sent alone and refused for good again: this row is at fault, set it aside. */
        char mid[40] = "", detail[200];
        rd_kafka_headers_t *hdrs = NULL;
        const void *v = NULL;
        size_t vn = 0;
        if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
            rd_kafka_header_get_last(hdrs, OQ_HDR_MESSAGE_ID, &v, &vn) ==
                RD_KAFKA_RESP_ERR_NO_ERROR &&
            v)
            snprintf(mid, sizeof(mid), "%.*s", (int)(vn < 39 ? vn : 39), (const char *)v);
        snprintf(detail, sizeof(detail),
                 "broker refused the row sent alone: %s (value %zu bytes, key %zu bytes, "
                 "topic %s partition %d)",
                 rd_kafka_err2str(m->err), m->len, m->key_len, rd_kafka_topic_name(m->rkt),
                 (int)m->partition);
        r->probe_seq = 0;
        if (set_aside(r, e.seq, ring, m->err, mid, m->key, m->key_len, detail) == 0) return;
    }
    e.err = m->err;
    r->st.delivery_errors++;
    oq_counter_add(r->m_errors, 1);
    if (r->failed.n == 0)
        OQ_LOG_WARN("relay",
                    "delivery failed seq=%" PRId64 " topic=%s partition=%d: %s; "
                    "draining in-flight messages, then re-publishing from that row",
                    e.seq, rd_kafka_topic_name(m->rkt), (int)m->partition,
                    rd_kafka_err2str(m->err));
    if (list_push(&r->failed, e) != 0) {
        /* Out of memory: a global rewind to this seq is still correct (rows stay pending). */
        e.partition = -1;
        if (r->failed.n) r->failed.v[0] = e;
    }
    r->draining = 1;
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
    oq_relay_t *r = opaque;
    (void)rk;
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        r->fatal = 1;
        OQ_LOG_ERROR("relay", "fatal producer error: %s", reason);
        return;
    }
    int64_t now = oq_mono_us();
    if (err == r->last_kafka_err && now - r->last_kafka_err_us < 5000000) return; /* rate limit */
    r->last_kafka_err = err;
    r->last_kafka_err_us = now;
    OQ_LOG_WARN("relay", "kafka error %s: %s (rows stay pending; librdkafka retries)",
                rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
}

/* --- producer ------------------------------------------------------------------------------ */

static int user_set(const oq_relay_t *r, const char *name)
{
    if (!r->kafka_cfg) return 0;
    int n = oq_config_kafka_count(r->kafka_cfg);
    for (int i = 0; i < n; i++) {
        const char *k, *v;
        oq_config_kafka_get(r->kafka_cfg, i, &k, &v);
        const char *prop = oq_kafka_prop_for(OQ_KAFKA_PRODUCER, k);
        if (prop && strcmp(prop, name) == 0) return 1;
    }
    return 0;
}

static rd_kafka_conf_t *kafka_conf(oq_relay_t *r, oq_error_t *err)
{
    rd_kafka_conf_t *conf = oq_kafka_conf_new(OQ_KAFKA_PRODUCER, r->brokers, r->kafka_cfg, err);
    if (!conf) return NULL;
    /* Relay defaults the user may override: a short linger keeps idle latency low; under load
     * batches fill up by size long before it matters. */
    if (!user_set(r, "linger.ms") && !user_set(r, "queue.buffering.max.ms") &&
        oq_kafka_conf_set(conf, "linger.ms", "1", err) != 0)
        goto fail;
    /* Order: with a finite message.timeout.ms the idempotent producer lets earlier messages of
     * a partition time out while later ones are still delivered when the leader returns (a
     * gap), so first copies could arrive out of order. Retrying forever keeps librdkafka's
     * in-order retries; an outage then simply stalls the relay. Gapless turns every other
     * batch failure that would leave a gap into a fatal error: the producer stops, is purged
     * and rebuilt, and the relay re-sends from the first undelivered row. */
    if (!user_set(r, "message.timeout.ms") && !user_set(r, "delivery.timeout.ms") &&
        oq_kafka_conf_set(conf, "message.timeout.ms", "0", err) != 0)
        goto fail;
    if (!user_set(r, "enable.gapless.guarantee") &&
        oq_kafka_conf_set(conf, "enable.gapless.guarantee", "true", err) != 0)
        goto fail;
    if (!user_set(r, "queue.buffering.max.messages")) {
        char v[32];
        snprintf(v, sizeof(v), "%d", r->max_inflight + 1000);
        if (oq_kafka_conf_set(conf, "queue.buffering.max.messages", v, err) != 0) goto fail;
    }
    /* The contract, not overridable: idempotent producer, acks from all in-sync replicas. */
    if ((user_set(r, "enable.idempotence") || user_set(r, "acks")) &&
        oq_log_threshold <= OQ_LOG_WARN)
        OQ_LOG_WARN("relay", "ignoring -X enable.idempotence/acks: the relay always uses "
                             "enable.idempotence=true acks=all");
    if (oq_kafka_conf_set(conf, "enable.idempotence", "true", err) != 0 ||
        oq_kafka_conf_set(conf, "acks", "all", err) != 0)
        goto fail;
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    rd_kafka_conf_set_error_cb(conf, error_cb);
    rd_kafka_conf_set_opaque(conf, r);
    return conf;
fail:
    rd_kafka_conf_destroy(conf);
    return NULL;
}

static void producer_destroy(oq_relay_t *r)
{
    if (!r->rk) return;
    rd_kafka_purge(r->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    /* Serve the purge reports so rows are accounted as failed (not lost). */
    int64_t deadline = oq_mono_us() + 2000000;
    while (r->st.inflight > 0 && oq_mono_us() < deadline)
        rd_kafka_poll(r->rk, 20);
    for (int i = 0; i < r->ntopics; i++) {
        rd_kafka_topic_destroy(r->topics[i].rkt);
        r->topics[i].rkt = NULL;
    }
    rd_kafka_destroy(r->rk);
    r->rk = NULL;
    abandon_inflight(r); /* anything that never got a report */
}

static int producer_new(oq_relay_t *r, oq_error_t *err)
{
    char errstr[512];
    rd_kafka_conf_t *conf = kafka_conf(r, err);
    if (!conf) return err ? err->code : OQ_EINVAL;
    r->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!r->rk) {
        rd_kafka_conf_destroy(conf);
        return oq_error_set(err, OQ_EKAFKA, 0, "rd_kafka_new: %s", errstr);
    }
    char v[32] = "";
    size_t vn = sizeof(v);
    if (rd_kafka_conf_get(rd_kafka_conf(r->rk), "message.max.bytes", v, &vn) == RD_KAFKA_CONF_OK)
        r->max_msg_bytes = strtoll(v, NULL, 10);
    for (int i = 0; i < r->ntopics; i++) {
        char phys[OQ_TOPIC_NAME_CAP];
        oq_topic_name(r->topic_prefix, r->topics[i].name, phys, sizeof phys);
        r->topics[i].rkt = rd_kafka_topic_new(r->rk, phys, NULL);
        if (!r->topics[i].rkt) {
            producer_destroy(r);
            return oq_error_set(err, OQ_EKAFKA, 0, "topic %s: %s", r->topics[i].name,
                                rd_kafka_err2str(rd_kafka_last_error()));
        }
    }
    return 0;
}

/* Topic index for \p name (creating the handle once); -1 when the cache is full. */
static int topic_index(oq_relay_t *r, const char *name)
{
    for (int i = 0; i < r->ntopics; i++)
        if (strcmp(r->topics[i].name, name) == 0) return i;
    if (r->ntopics == OQ__RELAY_MAX_TOPICS) return -1;
    char *dup = strdup(name);
    if (!dup) return -1;
    char phys[OQ_TOPIC_NAME_CAP];
    rd_kafka_topic_t *rkt =
        rd_kafka_topic_new(r->rk, oq_topic_name(r->topic_prefix, name, phys, sizeof phys), NULL);
    if (!rkt) {
        free(dup);
        return -1;
    }
    r->topics[r->ntopics] = (topic_t){.name = dup, .rkt = rkt};
    return r->ntopics++;
}

/* --- stats / metrics ----------------------------------------------------------------------- */

static void publish_stats(oq_relay_t *r)
{
    r->st.lease_state = r->holder ? OQ_RELAY_HOLDER : OQ_RELAY_STANDBY;
    r->st.fence = r->fence;
    pthread_mutex_lock(&r->mu);
    oq_relay_lease_state_t keep = r->shared.lease_state;
    r->shared = r->st;
    if (keep == OQ_RELAY_STOPPED) r->shared.lease_state = OQ_RELAY_STOPPED;
    pthread_mutex_unlock(&r->mu);
    oq_gauge_set(r->m_inflight, r->st.inflight);
    oq_gauge_set(r->m_holder, r->holder);
    /* the outbox is the database's, not this relay's: only the holder exports it, so the
     * relays of one database (standbys, the consumers' embedded ones) show it once */
    oq_metric_set_absent(r->m_pending, !r->holder);
    oq_metric_set_absent(r->m_oldest, !r->holder);
    oq_gauge_set(r->m_fence, (double)r->fence);
}

static void refresh_pending(oq_relay_t *r)
{
    oq_error_t err = {0};
    int64_t count, oldest;
    if (oq__relay_store_pending(r->store, &count, &oldest, &err) != 0) {
        OQ_LOG_DEBUG("relay", "pending stats: %s", err.msg);
        return;
    }
    int64_t now = oq_now_ms();
    r->st.pending = count;
    r->st.oldest_pending_age_ms = (oldest > 0 && now > oldest) ? now - oldest : 0;
    oq_gauge_set(r->m_pending, (double)count);
    oq_gauge_set(r->m_oldest, (double)r->st.oldest_pending_age_ms / 1000.0);
}

/* --- waiting ------------------------------------------------------------------------------- */

/* Sleep up to \p ms on the condition variable; returns early (1) on notify or stop. */
static int wait_ms(oq_relay_t *r, int ms)
{
    struct timespec ts;
    oq_mono_deadline(&ts, (int64_t)ms * 1000);
    pthread_mutex_lock(&r->mu);
    while (!r->notified && !atomic_load(&r->stop)) {
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT) break;
    }
    int woke = r->notified || atomic_load(&r->stop);
    r->notified = 0;
    pthread_mutex_unlock(&r->mu);
    return woke;
}

/* Watch DB-wal for writes (opts.watch_wal, SQLite). A failure only leaves the relay polling. */
static void wal_watch_open(oq_relay_t *r)
{
    r->wal_fd = -1;
    if (!r->watch_wal || oq_backend_of(r->db_path) == OQ_BACKEND_POSTGRES) return;
    char path[4096];
    if (snprintf(path, sizeof path, "%s-wal", r->db_path) >= (int)sizeof path) return;
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0 || inotify_add_watch(fd, path, IN_MODIFY) < 0) {
        OQ_LOG_INFO("relay", "no watch on %s (%s): polling data_version only", path,
                    strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    r->wal_fd = fd;
}

/* Discards the queued watch events. A write among them may belong to a commit whose fsync is
 * still running, which no later event announces (it becomes visible in the -shm, which inotify
 * does not see), and whose visibility need not be the data_version change that ends a wait (an
 * earlier commit's may): so a drained write restarts the poll's backoff at 1 ms, and that
 * commit is seen about when its fsync ends, not up to poll_max_ms later. */
static void wal_drain(oq_relay_t *r)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    while (read(r->wal_fd, buf, sizeof buf) > 0)
        r->idle_ms = 1;
}

/* The idle wait with the watch: up to \p ms for a write to the WAL; after one, data_version
 * every 100 us for 5 ms (the commit is visible only after its fsync), then the poll's backoff
 * restarts at 1 ms, so a slow fsync is still seen soon after it ends. @returns 1 when
 * data_version moved or the relay is stopping. */
static int wal_wait(oq_relay_t *r, int ms)
{
    struct pollfd p = {.fd = r->wal_fd, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0) return atomic_load(&r->stop);
    wal_drain(r);
    int64_t until = oq_mono_us() + 5000;
    while (!atomic_load(&r->stop) && oq_mono_us() < until) {
        oq_error_t derr = {0};
        int64_t v;
        if (oq__relay_store_data_version(r->store, &v, &derr) != 0 || v != r->last_dv) return 1;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return atomic_load(&r->stop);
}

/* The idle wait on PostgreSQL: up to \p ms for the LISTEN connection's socket to become
 * readable (a NOTIFY of another connection's commit has arrived; the caller's data_version
 * consumes it) or for oq_relay_notify(). @returns 1 when woken, 0 after \p ms. Without a
 * socket (the connection is being re-established) it waits as on SQLite. */
static int note_wait(oq_relay_t *r, int fd, int ms)
{
    struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = r->wake_fd, .events = POLLIN}};
    int n = poll(p, 2, ms);
    if (n < 0) return wait_ms(r, 1);
    if (p[0].revents & POLLIN) r->notify_wakes++;
    if (p[1].revents & POLLIN) {
        uint64_t v;
        ssize_t rd = read(r->wake_fd, &v, sizeof v);
        (void)rd;
        pthread_mutex_lock(&r->mu);
        r->notified = 0;
        pthread_mutex_unlock(&r->mu);
    }
    return n > 0 || atomic_load(&r->stop);
}

/* --- lease --------------------------------------------------------------------------------- */

static void mark_wait(oq_relay_t *r);

static void lose_lease(oq_relay_t *r, const char *why)
{
    mark_wait(r); /* may itself find the lease lost */
    if (!r->holder) return;
    OQ_LOG_WARN("relay",
                "lease %s lost: stop publishing, marking nothing; in-flight messages are dropped "
                "from tracking (already sent copies are duplicates the inbox absorbs) "
                "reason=\"%s\" owner=%s fence=%" PRId64,
                r->lease_name, why, r->owner, r->fence);
    r->holder = 0;
    atomic_store(&r->is_holder, 0);
    r->st.fenced++;
    oq_counter_add(r->m_fenced, 1);
    if (r->rk) producer_destroy(r);
    r->failed.n = 0;
    r->dead.n = 0; /* not stored: the next holder finds these rows again */
    r->probe_seq = 0;
    r->draining = 0;
    ring_reset(r);
    r->ndelivered = 0;
    r->cursor = r->wm = r->wm_stored = 0;
}

static void try_acquire(oq_relay_t *r)
{
    oq_error_t err = {0};
    char holder[256];
    int held = 0;
    int64_t now = oq_now_ms(), mono = oq_mono_us();
    int64_t fence = r->fence, wm = 0;
    int rc = oq__relay_lease_acquire(r->store, r->lease_name, r->owner, r->lease_ms, now, &fence,
                                     &held, holder, sizeof(holder), &wm, &err);
    if (rc != 0) {
        OQ_LOG_WARN("relay", "lease %s: %s", r->lease_name, err.msg);
        return;
    }
    r->st.lease_checked_ms = now;
    if (!held) return;
    r->holder = 1;
    atomic_store(&r->is_holder, 1);
    r->fence = fence;
    r->renewed_us = mono;
    r->lease_until_us = mono + r->lease_ms * 1000;
    r->cursor = r->wm = r->wm_stored = wm; /* publish everything after the stored watermark */
    ring_reset(r);
    r->ndelivered = 0;
    r->failed.n = 0;
    r->dead.n = 0;
    r->probe_seq = 0;
    r->draining = 0;
    r->backoff_ms = OQ__RELAY_BACKOFF_MIN_MS;
    r->resume_at_us = 0;
    OQ_LOG_INFO("relay",
                "lease %s acquired owner=%s fence=%" PRId64 " lease_ms=%" PRId64
                " published_seq=%" PRId64,
                r->lease_name, r->owner, fence, r->lease_ms, wm);
    OQ_CRASH_POINT("relay.after_lease_acquire");
}

static void renew(oq_relay_t *r)
{
    oq_error_t err = {0};
    int64_t now = oq_now_ms(), mono = oq_mono_us();
    int rc =
        oq__relay_lease_renew(r->store, r->lease_name, r->owner, r->fence, r->lease_ms, now, &err);
    if (rc == 0) {
        r->renewed_us = mono;
        r->lease_until_us = mono + r->lease_ms * 1000;
        r->st.lease_checked_ms = now;
    } else if (rc == OQ_EFENCED) {
        lose_lease(r, "renewal refused");
    } else {
        OQ_LOG_WARN("relay", "lease renewal failed (will retry): %s", err.msg);
        r->renewed_us = mono - r->lease_ms * 1000 / 3 + 50000; /* retry in ~50 ms */
    }
}

/* --- marking (relay thread side) ---------------------------------------------------------- */

/*
 * Collects the writer's finished mark job, if any. On success the watermark counts as stored
 * and the lease as renewed (the mark renewed it); a fenced job loses the lease; any other
 * failure leaves the watermark for the next job (it only grows meanwhile).
 * @returns 1 when a job was collected.
 */
static int mark_collect(oq_relay_t *r)
{
    pthread_mutex_lock(&r->wmu);
    if (r->job_state != OQ__JOB_DONE) {
        pthread_mutex_unlock(&r->wmu);
        return 0;
    }
    int rc = r->job_rc;
    int64_t now = r->job_now, fence = r->job_fence, upto = r->job_upto, from = r->job_from;
    int64_t mono = r->job_mono_us;
    uint64_t n = r->job_n;
    int current = r->holder && fence == r->fence;
    r->job_state = OQ__JOB_IDLE;
    pthread_mutex_unlock(&r->wmu);

    /* The job's dead letters (the writer is done with job_dead until the next submit). */
    for (size_t i = 0; i < r->job_dead.n; i++) {
        const dead_t *d = &r->job_dead.v[i];
        if (rc == 0) {
            int k = permanent_index((rd_kafka_resp_err_t)d->err);
            r->st.dead_letters++;
            if (k >= 0) oq_counter_add(r->m_dead[k], 1);
            OQ_LOG_WARN("relay",
                        "dead letter: outbox seq=%" PRId64 " message_id=%s key=%s set "
                        "aside (%s: %s); the watermark moved over it and the rows "
                        "behind it go on",
                        d->seq, d->message_id, d->key, rd_kafka_err2name(d->err), d->detail);
        } else if (rc != OQ_EFENCED && current) {
            /* not stored: it goes with the next mark (the watermark cannot be stored past it
             * without it) */
            if (dead_push(&r->dead, d) != 0) {
                OQ_LOG_ERROR("relay",
                             "out of memory keeping dead letter seq=%" PRId64
                             ": dropping the lease to start over",
                             d->seq);
                r->job_dead.n = 0;
                lose_lease(r, "out of memory");
                return 1;
            }
        }
    }
    r->job_dead.n = 0;

    if (rc == 0) {
        if (current) {
            r->renewed_us = mono;
            r->st.lease_checked_ms = now;
            r->lease_until_us = mono + r->lease_ms * 1000;
            r->backoff_ms = OQ__RELAY_BACKOFF_MIN_MS;
            if (upto > r->wm_stored) r->wm_stored = upto;
        }
        r->st.published += n;
        r->st.batches++;
        oq_counter_add(r->m_published, n);
        oq_histogram_observe(r->m_batch, (double)n);
        OQ_LOG_DEBUG("relay",
                     "watermark advanced from=%" PRId64 " published_seq=%" PRId64
                     " reports=%" PRIu64 " fence=%" PRId64,
                     from, upto, n, fence);
    } else if (rc == OQ_EFENCED) {
        if (current) lose_lease(r, "mark refused by the fencing check");
    } else {
        if (current) {
            if (r->ndelivered == 0) r->first_delivered_us = oq_mono_us();
            r->ndelivered += n; /* counted with the next mark */
        }
        OQ_LOG_WARN("relay", "storing published_seq=%" PRId64 " failed (will retry): %s", upto,
                    r->job_err);
        r->resume_at_us = oq_mono_us() + (rc == OQ_EBUSY ? 10000 : 1000000);
    }
    return 1;
}

/* Hands the watermark to the writer if it moved and the writer is idle. @returns 1 when
 * submitted. */
static int mark_submit(oq_relay_t *r)
{
    if (!r->holder || r->wm <= r->wm_stored) return 0;
    pthread_mutex_lock(&r->wmu);
    if (r->job_state != OQ__JOB_IDLE) {
        pthread_mutex_unlock(&r->wmu);
        return 0;
    }
    /* Every dead letter at or below the watermark goes with it (room first, so that none is
     * ever left behind a stored watermark). */
    if (r->job_dead.cap < r->dead.n) {
        dead_t *v = realloc(r->job_dead.v, r->dead.n * sizeof(*v));
        if (!v) {
            pthread_mutex_unlock(&r->wmu);
            return 0;
        }
        r->job_dead.v = v;
        r->job_dead.cap = r->dead.n;
    }
    size_t keep = 0;
    r->job_dead.n = 0;
    for (size_t i = 0; i < r->dead.n; i++) {
        if (r->dead.v[i].seq <= r->wm)
            r->job_dead.v[r->job_dead.n++] = r->dead.v[i];
        else
            r->dead.v[keep++] = r->dead.v[i];
    }
    r->dead.n = keep;
    r->job_upto = r->wm;
    r->job_from = r->wm_stored;
    r->job_n = r->ndelivered;
    r->ndelivered = 0;
    r->job_fence = r->fence;
    r->job_state = OQ__JOB_PENDING;
    pthread_cond_signal(&r->wcv);
    pthread_mutex_unlock(&r->wmu);
    return 1;
}

/* Waits until the writer has no job, collecting a finished one. */
static void mark_wait(oq_relay_t *r)
{
    for (;;) {
        if (mark_collect(r)) return;
        pthread_mutex_lock(&r->wmu);
        int idle = r->job_state == OQ__JOB_IDLE;
        pthread_mutex_unlock(&r->wmu);
        if (idle) return;
        oq_sleep_ms(1, NULL);
    }
}

/* --- the writer thread --------------------------------------------------------------------- */

/* Runs one mark job on the writer's connection. @locality writer thread, job PENDING. */
static void writer_mark(oq_relay_t *r)
{
    oq_error_t err = {0};
    OQ_CRASH_POINT("relay.after_delivery_before_mark");
    int64_t now = oq_now_ms(), t0 = oq_mono_us();
    oq__relay_dead_t *dead = NULL;
    size_t nd = r->job_dead.n;
    int rc = 0;
    if (nd > 0 && !(dead = calloc(nd, sizeof(*dead))))
        rc = oq_error_set(&err, OQ_ENOMEM, 0, "relay: out of memory (dead letters)");
    for (size_t i = 0; dead && i < nd; i++)
        dead[i] = (oq__relay_dead_t){.seq = r->job_dead.v[i].seq,
                                     .reason = rd_kafka_err2name(r->job_dead.v[i].err),
                                     .detail = r->job_dead.v[i].detail};
    if (rc == 0)
        rc = oq__relay_store_mark_dead(r->wstore, r->lease_name, r->owner, r->job_fence,
                                       r->lease_ms, now, r->job_upto, dead, nd, &err);
    free(dead);
    r->t_mark_us += oq_mono_us() - t0;
    if (rc == 0) OQ_CRASH_POINT("relay.after_mark_commit");
    r->job_rc = rc;
    r->job_now = now;
    r->job_mono_us = t0;
    snprintf(r->job_err, sizeof(r->job_err), "%s", rc ? err.msg : "");
}

/* One bounded retention DELETE. @returns rows deleted. @locality writer thread. */
static int64_t writer_cleanup(oq_relay_t *r)
{
    oq_error_t err = {0};
    int64_t deleted = 0;
    int rc = oq__relay_store_cleanup(r->wstore, oq_now_ms() - r->retention_ms, r->cleanup_batch,
                                     &deleted, &err);
    if (rc != 0) {
        OQ_LOG_WARN("relay", "retention cleanup failed (will retry): %s", err.msg);
        return 0;
    }
    if (deleted > 0) {
        atomic_fetch_add(&r->cleaned, (unsigned long long)deleted);
        oq_counter_add(r->m_cleaned, (uint64_t)deleted);
        OQ_LOG_DEBUG("relay", "retention: deleted %" PRId64 " published rows", deleted);
    }
    return deleted;
}

/*
 * The writer: runs mark jobs as the relay thread submits them (one at a time, so the next job
 * accumulates everything delivered meanwhile: group commit), and the retention cleanup about
 * once a second while the relay holds the lease (sooner while full batches come back). Its
 * fsyncs overlap with the relay thread's reading and producing.
 */
static void *writer_main(void *arg)
{
    oq_relay_t *r = arg;
    int64_t next_cleanup_us = oq_mono_us() + 1000000;
    pthread_mutex_lock(&r->wmu);
    while (!r->wstop) {
        if (r->job_state == OQ__JOB_PENDING) {
            pthread_mutex_unlock(&r->wmu);
            writer_mark(r);
            pthread_mutex_lock(&r->wmu);
            r->job_state = OQ__JOB_DONE;
            pthread_mutex_unlock(&r->wmu);
            oq_relay_notify(r);
            pthread_mutex_lock(&r->wmu);
            continue;
        }
        int64_t now_us = oq_mono_us();
        if (r->retention_ms > 0 && now_us >= next_cleanup_us && atomic_load(&r->is_holder)) {
            pthread_mutex_unlock(&r->wmu);
            int64_t d = writer_cleanup(r);
            next_cleanup_us = oq_mono_us() + (d >= r->cleanup_batch ? 10000 : 1000000);
            pthread_mutex_lock(&r->wmu);
            continue;
        }
        int64_t wait_us = next_cleanup_us > now_us ? next_cleanup_us - now_us : 1000000;
        if (wait_us > 1000000) wait_us = 1000000;
        struct timespec ts;
        oq_mono_deadline(&ts, wait_us);
        pthread_cond_timedwait(&r->wcv, &r->wmu, &ts);
    }
    pthread_mutex_unlock(&r->wmu);
    return NULL;
}

/*
 * Nothing is in flight any more: every row up to the watermark was delivered, and the ring's
 * head is the lowest failed row. Rewind the cursor to the watermark (rows delivered above it
 * are sent again, in order) and back off.
 */
static void finish_drain(oq_relay_t *r)
{
    size_t nf = r->failed.n;
    int64_t gmin = INT64_MAX, pmin = INT64_MAX;
    int32_t perr = 0;
    for (size_t i = 0; i < nf; i++) {
        const entry_t *f = &r->failed.v[i];
        if (f->seq < gmin) gmin = f->seq;
        if (permanent_index((rd_kafka_resp_err_t)f->err) >= 0 && f->seq < pmin) {
            pmin = f->seq;
            perr = f->err;
        }
    }
    /* A permanent error may be the batch's (a broker refuses a whole batch that holds one bad
     * record, or that is too large as a whole): the lowest such row is sent alone next, and only
     * a permanent refusal of it alone sets it aside. A probe not answered yet stays. */
    if (pmin != INT64_MAX && pmin != r->probe_seq) {
        OQ_LOG_WARN("relay",
                    "seq=%" PRId64 " failed with %s: sending it alone, after the rows "
                    "before it, to tell whether the row or its batch is at fault",
                    pmin, rd_kafka_err2name(perr));
        r->probe_seq = pmin;
    }
    /* The failed row's ring entry stopped the head, so wm < gmin already; the clamp only
     * guards an entry the ring never saw (a failure before it was produced). */
    if (gmin != INT64_MAX && r->wm > gmin - 1) r->wm = gmin - 1;
    if (r->wm < r->wm_stored) r->wm = r->wm_stored;
    int64_t resend = r->cursor > r->wm ? r->cursor - r->wm : 0;
    ring_reset(r);
    r->cursor = r->wm;
    r->st.rewinds++;
    oq_counter_add(r->m_rewinds, 1);
    OQ_LOG_WARN("relay",
                "%zu deliveries failed; re-publishing from seq=%" PRId64 " in %" PRId64
                " ms (up to %" PRId64 " rows sent again)",
                nf, r->wm + 1, r->backoff_ms, resend);
    r->failed.n = 0;
    r->draining = 0;
    r->resume_at_us = oq_mono_us() + r->backoff_ms * 1000;
    r->backoff_ms *= 2;
    if (r->backoff_ms > OQ__RELAY_BACKOFF_MAX_MS) r->backoff_ms = OQ__RELAY_BACKOFF_MAX_MS;
}

static void handle_fatal(oq_relay_t *r)
{
    char buf[512] = "";
    rd_kafka_resp_err_t e = r->rk ? rd_kafka_fatal_error(r->rk, buf, sizeof(buf)) : 0;
    OQ_LOG_ERROR("relay",
                 "fatal producer error %s: %s; recreating the producer (rows stay "
                 "unpublished and are re-sent)",
                 rd_kafka_err2name(e), buf);
    producer_destroy(r); /* purged/abandoned messages land in `failed` */
    r->fatal = 0;
    r->st.producer_restarts++;
    oq_counter_add(r->m_restarts, 1);
    if (!r->draining) { /* nothing was in flight: still back off before a new producer */
        r->resume_at_us = oq_mono_us() + r->backoff_ms * 1000;
    }
}

/* --- producing ----------------------------------------------------------------------------- */

static int produce_row(void *ctx, const oq__relay_row_t *row)
{
    oq_relay_t *r = ctx;
    if (r->draining || r->fatal || atomic_load(&r->stop)) return 1;
    /* The lease was checked before the read, but the process may have been paused (SIGSTOP, a
     * VM freeze) between that check and this row: a row read now may be newer than anything a
     * successor saw as unpublished. Re-check on the monotonic clock before each produce. */
    if (oq_mono_us() >= r->lease_until_us - r->lease_ms * 1000 / 3) return 1;
    if (r->probe_seq) {
        if (r->cursor >= r->probe_seq) return 1; /* the probe is in flight: it goes alone */
        if (row->seq > r->probe_seq)
            r->probe_seq = 0; /* the row is gone (never above the watermark; be safe) */
        else if (row->seq == r->probe_seq && r->st.inflight > 0)
            return 1; /* wait for the rows before it */
    }
    if (r->batch_n == 0) OQ_CRASH_POINT("relay.after_read_batch");
    int t = topic_index(r, row->topic);
    if (t < 0) {
        OQ_LOG_ERROR("relay", "seq=%" PRId64 ": cannot create a handle for topic '%s'", row->seq,
                     row->topic);
        list_push(&r->failed, (entry_t){.seq = row->seq, .partition = -1, .topic = 0});
        r->draining = 1;
        return 1;
    }
    if (r->ring_len >= (uint32_t)r->max_inflight) return 1; /* ring full behind a slow row */
    uint32_t h = slot_alloc(r);
    if (!h) return 1; /* max_inflight reached */
    r->slots[h - 1].seq = row->seq;
    r->slots[h - 1].created_at = row->created_at;
    r->slots[h - 1].topic = t;
    for (;;) {
        rd_kafka_resp_err_t e = rd_kafka_producev(
            r->rk, RD_KAFKA_V_RKT(r->topics[t].rkt), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
            RD_KAFKA_V_KEY(row->key, row->key_len),
            RD_KAFKA_V_VALUE((void *)row->payload, row->payload_len),
            RD_KAFKA_V_HEADER(OQ_HDR_MESSAGE_ID, row->message_id, (ssize_t)strlen(row->message_id)),
            RD_KAFKA_V_OPAQUE((void *)(uintptr_t)h), RD_KAFKA_V_END);
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR) break;
        if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            rd_kafka_poll(r->rk, 50);
            if (!r->draining && !r->fatal && !atomic_load(&r->stop)) continue;
            slot_free(r, h);
            return 1;
        }
        slot_free(r, h);
        if (e == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE) {
            /* librdkafka's own check of this row against message.max.bytes: no broker and no
             * batch involved, so the row is at fault and can never be sent as configured. */
            char detail[200];
            snprintf(detail, sizeof(detail),
                     "value %zu bytes + key %zu bytes + header over the relay's "
                     "message.max.bytes=%" PRId64,
                     row->payload_len, row->key_len, r->max_msg_bytes);
            uint32_t ri = ring_push(r, row->seq);
            if (set_aside(r, row->seq, ri, e, row->message_id, row->key, row->key_len, detail) ==
                0) {
                if (r->probe_seq == row->seq) r->probe_seq = 0;
                r->cursor = row->seq;
                r->batch_n++;
                return 0;
            }
            r->ring_len--; /* out of memory: undo the push, fail the row as below */
        }
        if (e == RD_KAFKA_RESP_ERR__FATAL) {
            r->fatal = 1;
        } else {
            OQ_LOG_ERROR("relay", "produce seq=%" PRId64 " topic=%s: %s", row->seq, row->topic,
                         rd_kafka_err2str(e));
            list_push(&r->failed,
                      (entry_t){.seq = row->seq, .partition = -1, .topic = t, .err = e});
            r->st.delivery_errors++;
            oq_counter_add(r->m_errors, 1);
            r->draining = 1;
        }
        return 1;
    }
    /* Its delivery report can only come from a later rd_kafka_poll() on this thread. */
    r->slots[h - 1].ring = ring_push(r, row->seq);
    r->st.inflight++;
    r->st.produced++;
    oq_counter_add(r->m_produced, 1);
    r->cursor = row->seq;
    r->batch_n++;
    r->batch_payload += (int64_t)row->payload_len;
    return 0;
}

/* "Gather": microseconds until the next read may happen while rows arrive fast; 0: now. */
static int64_t gather_left_us(const oq_relay_t *r, int64_t now_us)
{
    if (r->gather_ms <= 0 || r->last_full || r->rate_ewma < (double)r->gather_min_rate) return 0;
    int64_t left = r->rate_prev_us + (int64_t)r->gather_ms * 1000 - now_us;
    return left > 0 ? left : 0;
}

/* Reads and produces one batch. @returns rows produced, or -1 on a database error. */
static int produce_batch(oq_relay_t *r)
{
    oq_error_t err = {0};
    int room = r->max_inflight - r->st.inflight;
    int ring_room = r->max_inflight - (int)r->ring_len;
    if (room > ring_room) room = ring_room;
    if (room > r->batch_rows) room = r->batch_rows;
    if (room <= 0) return 0;
    int n = 0;
    r->batch_n = 0;
    r->batch_payload = 0;
    int64_t t0 = oq_mono_us();
    r->st.reads++;
    int rc =
        oq__relay_store_read(r->store, r->cursor, room, r->batch_bytes, produce_row, r, &n, &err);
    r->t_read_us += oq_mono_us() - t0;
    if (rc != 0) {
        OQ_LOG_WARN("relay", "reading the outbox failed (will retry): %s", err.msg);
        r->resume_at_us = oq_mono_us() + (rc == OQ_EBUSY ? 10000 : 1000000);
        return n > 0 ? n : -1;
    }
    r->last_full = r->batch_n >= room || r->batch_payload >= r->batch_bytes;
    r->last_n = r->batch_n;
    int64_t now_us = oq_mono_us();
    if (r->rate_prev_us > 0 && now_us > r->rate_prev_us)
        r->rate_ewma = 0.7 * r->rate_ewma +
                       0.3 * ((double)r->batch_n * 1e6 / (double)(now_us - r->rate_prev_us));
    r->rate_prev_us = now_us;
    if (n > 0) {
        r->last_read_us = oq_mono_us();
        OQ_CRASH_POINT("relay.after_produce_before_delivery");
        rd_kafka_poll(r->rk, 0);
    }
    return n;
}

/* The first rows after an idle wait, with nothing in flight: there is no company to linger
 * for, so send them at once. rd_kafka_flush() makes librdkafka treat linger.ms as expired while
 * it runs (and serves our delivery reports, this thread's rd_kafka_poll), so the request leaves
 * now; it returns at the report, one round trip later, or after OQ__RELAY_IDLE_SEND_MS (a slow
 * broker: the rows then go on as usual). Same producer, same queue: order is not touched.
 * Rows committed meanwhile are read after it, with linger as under load (see the file comment). */
static void send_idle(oq_relay_t *r)
{
    int64_t t0 = oq_mono_us();
    rd_kafka_flush(r->rk, OQ__RELAY_IDLE_SEND_MS);
    r->t_poll_us += oq_mono_us() - t0;
    r->st.idle_sends++;
}

/* --- the thread ---------------------------------------------------------------------------- */

static void periodic(oq_relay_t *r)
{
    int64_t now_us = oq_mono_us();
    if (now_us >= r->next_stats_us) {
        /* count(*) over a large backlog is not free (~0.1 s per million pending rows): keep
         * the refresh under ~2% of the thread by spacing it 50x its own duration, >= 1 s. */
        refresh_pending(r);
        r->st.cleaned = atomic_load(&r->cleaned);
        int64_t took = oq_mono_us() - now_us;
        r->next_stats_us = now_us + (took * 50 > 1000000 ? took * 50 : 1000000);
    }
}

static void relay_shutdown(oq_relay_t *r)
{
    if (r->holder && r->rk) {
        int64_t deadline = oq_mono_us() + r->stop_timeout_ms * 1000;
        while (r->st.inflight > 0 && oq_mono_us() < deadline)
            rd_kafka_poll(r->rk, 20);
        if (r->st.inflight > 0)
            OQ_LOG_WARN("relay",
                        "stop: %d messages still without a delivery report after %" PRId64
                        " ms; they stay unpublished",
                        r->st.inflight, r->stop_timeout_ms);
        if (r->draining || r->st.inflight > 0) {
            abandon_inflight(r);
            finish_drain(r);
        }
        mark_wait(r);
        for (int tries = 0; r->holder && r->wm > r->wm_stored && tries < 20; tries++) {
            if (mark_submit(r)) mark_wait(r);
            if (r->wm > r->wm_stored) oq_sleep_ms(50, NULL);
        }
    }
    mark_wait(r);
    if (r->rk) producer_destroy(r);
    if (r->holder) {
        oq_error_t err = {0};
        if (oq__relay_lease_release(r->store, r->lease_name, r->owner, r->fence, &err) != 0)
            OQ_LOG_WARN("relay", "lease release failed: %s", err.msg);
        else
            OQ_LOG_INFO("relay", "lease %s released fence=%" PRId64, r->lease_name, r->fence);
        r->holder = 0;
        atomic_store(&r->is_holder, 0);
    }
    if (r->writer_started) {
        pthread_mutex_lock(&r->wmu);
        r->wstop = 1;
        pthread_cond_signal(&r->wcv);
        pthread_mutex_unlock(&r->wmu);
        pthread_join(r->writer, NULL);
        r->writer_started = 0;
    }
    r->st.cleaned = atomic_load(&r->cleaned);
    refresh_pending(r);
    publish_stats(r);
    pthread_mutex_lock(&r->mu);
    r->shared.lease_state = OQ_RELAY_STOPPED;
    pthread_mutex_unlock(&r->mu);
    OQ_LOG_INFO("relay",
                "stopped: published=%" PRIu64 " produced=%" PRIu64 " delivery_errors=%" PRIu64
                " dead_letters=%" PRIu64 " pending=%" PRId64 " idle_sends=%" PRIu64
                " busy_read_produce_s=%.2f busy_mark_s=%.2f wait_delivery_s=%.2f reads=%" PRIu64
                " notify_wakes=%" PRIu64,
                r->st.published, r->st.produced, r->st.delivery_errors, r->st.dead_letters,
                r->st.pending, r->st.idle_sends, (double)r->t_read_us / 1e6,
                (double)r->t_mark_us / 1e6, (double)r->t_poll_us / 1e6, r->st.reads,
                r->notify_wakes);
}

static void *relay_main(void *arg)
{
    oq_relay_t *r = arg;
    oq_error_t err = {0};
    int standby_poll_ms = (int)(r->lease_ms / 10 < 100 ? r->lease_ms / 10 : 100);
    if (standby_poll_ms < 1) standby_poll_ms = 1;
    r->backoff_ms = OQ__RELAY_BACKOFF_MIN_MS;
    r->idle_ms = 1;
    r->last_dv = -1;
    r->wal_fd = -1;
    int e = pthread_create(&r->writer, NULL, writer_main, r);
    if (e != 0) {
        OQ_LOG_ERROR("relay", "cannot start the writer thread: %s; relay not running", strerror(e));
        pthread_mutex_lock(&r->mu);
        r->shared.lease_state = OQ_RELAY_STOPPED;
        pthread_mutex_unlock(&r->mu);
        return NULL;
    }
    pthread_setname_np(r->writer, "oq-relay-w");
    r->writer_started = 1;
    wal_watch_open(r);

    while (!atomic_load(&r->stop)) {
        mark_collect(r);
        periodic(r);
        if (!r->holder) {
            if (oq_mono_us() >= r->next_lease_try_us) {
                try_acquire(r);
                r->next_lease_try_us = oq_mono_us() + standby_poll_ms * 1000;
            }
            publish_stats(r);
            if (!r->holder) {
                wait_ms(r, standby_poll_ms);
                continue;
            }
        } else if (oq_mono_us() - r->renewed_us >= r->lease_ms * 1000 / 3) {
            renew(r);
            if (!r->holder) continue;
        }
        if (!r->rk) {
            if (producer_new(r, &err) != 0) {
                OQ_LOG_ERROR("relay", "cannot create the producer (retrying in %" PRId64 " ms): %s",
                             r->backoff_ms, err.msg);
                wait_ms(r, (int)r->backoff_ms);
                if (r->backoff_ms < OQ__RELAY_BACKOFF_MAX_MS) r->backoff_ms *= 2;
                continue;
            }
        }
        rd_kafka_poll(r->rk, 0);
        if (r->fatal) {
            handle_fatal(r);
            continue;
        }
        if (r->draining) {
            if (r->st.inflight > 0) {
                rd_kafka_poll(r->rk, 10);
                publish_stats(r);
                continue;
            }
            finish_drain(r);
        }

        int progressed = 0, caught_up = 0;
        int64_t dv = -1;
        int64_t now_us = oq_mono_us();
        int lease_ok = now_us < r->lease_until_us - r->lease_ms * 1000 / 3;
        if (now_us >= r->resume_at_us && lease_ok && r->st.inflight < r->max_inflight &&
            (r->st.inflight == 0 || r->last_full || r->last_n < r->partial_min_rows ||
             now_us - r->last_read_us >= (int64_t)r->partial_wait_ms * 1000) &&
            gather_left_us(r, now_us) == 0) {
            OQ_CRASH_POINT("relay.after_lease_check");
            oq_error_t derr = {0};
            if (oq__relay_store_data_version(r->store, &dv, &derr) != 0) dv = -1;
            int quiet = r->from_idle && r->st.inflight == 0;
            r->from_idle = 0;
            int n = produce_batch(r);
            if (n > 0) progressed = 1;
            if (n > 0 && quiet && !r->draining && !r->fatal) send_idle(r);
            if (n == 0 && !r->draining && !r->fatal) caught_up = 1;
        }
        if (r->wm > r->wm_stored &&
            (r->st.inflight == 0 || r->ndelivered >= (uint64_t)r->batch_rows ||
             oq_mono_us() - r->first_delivered_us >= OQ__RELAY_MARK_MAX_DELAY_US)) {
            if (mark_submit(r)) progressed = 1;
        }
        publish_stats(r);
        if (progressed) {
            r->idle_ms = 1;
            continue;
        }
        int64_t gather_us = gather_left_us(r, oq_mono_us());
        int wait = gather_us > 0 && gather_us < (int64_t)r->poll_max_ms * 1000
                       ? (int)((gather_us + 999) / 1000)
                       : r->poll_max_ms;
        if (r->st.inflight > 0) {
            /* Waiting for delivery reports: block in librdkafka, not in a loop. */
            int64_t t0 = oq_mono_us();
            rd_kafka_poll(r->rk, wait);
            r->t_poll_us += oq_mono_us() - t0;
            continue;
        }
        if (gather_us > 0) { /* gathering: the next read is due in under gather_ms */
            wait_ms(r, wait);
            continue;
        }
        now_us = oq_mono_us();
        if (now_us < r->resume_at_us) { /* backing off after a failure */
            int64_t ms = (r->resume_at_us - now_us) / 1000;
            wait_ms(r, (int)(ms < 1 ? 1 : ms > 50 ? 50 : ms));
            continue;
        }
        if (!lease_ok || !caught_up || dv < 0) { /* renewal pending or a read error */
            wait_ms(r, r->poll_max_ms);
            continue;
        }
        r->last_dv = dv;
        r->from_idle = 1;
        /* Idle: wait until another connection commits (data_version moves) or a notify. */
        int64_t wait_until = now_us + 200000; /* re-check lease/cleanup at least every 200 ms */
        if (r->wal_fd >= 0) { /* writes up to here are seen by one data_version check, or (their
                               * fsync still running) by the restarted backoff: wal_drain */
            wal_drain(r);
            oq_error_t derr = {0};
            int64_t v;
            if (oq__relay_store_data_version(r->store, &v, &derr) != 0 || v != dv) continue;
        }
        while (!atomic_load(&r->stop) && oq_mono_us() < wait_until) {
            int nfd = r->wake_fd >= 0 ? oq__relay_store_notify_fd(r->store) : -1;
            int woke = r->wal_fd >= 0 ? wal_wait(r, r->idle_ms)
                       : nfd >= 0     ? note_wait(r, nfd, r->idle_ms)
                                      : wait_ms(r, r->idle_ms);
            if (r->idle_ms < r->poll_max_ms)
                r->idle_ms = r->idle_ms * 2 > r->poll_max_ms ? r->poll_max_ms : r->idle_ms * 2;
            oq_error_t derr = {0};
            int64_t v;
            if (oq__relay_store_data_version(r->store, &v, &derr) != 0 || v != r->last_dv) break;
            if (woke || oq_mono_us() - r->renewed_us >= r->lease_ms * 1000 / 3) break;
        }
    }
    relay_shutdown(r);
    if (r->wal_fd >= 0) close(r->wal_fd);
    return NULL;
}

/* --- public API ---------------------------------------------------------------------------- */

static int register_metrics(oq_relay_t *r, oq_metrics_t *m, const char *labels, oq_error_t *err)
{
    static const double batch_bounds[] = {1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000};
    static const double lat_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,      2.5,   5,    10,    30,   60};
    r->m_pending =
        oq_metrics_gauge(m, "onceq_relay_pending_rows", "Unpublished outbox rows", labels);
    r->m_oldest = oq_metrics_gauge(m, "onceq_relay_oldest_pending_age_seconds",
                                   "Age of the oldest unpublished outbox row", labels);
    r->m_published = oq_metrics_counter(m, "onceq_relay_published_total",
                                        "Delivery reports covered by a stored watermark", labels);
    r->m_produced = oq_metrics_counter(m, "onceq_relay_produced_total",
                                       "Messages handed to librdkafka (includes re-sends)", labels);
    r->m_errors = oq_metrics_counter(m, "onceq_relay_delivery_errors_total",
                                     "Failed delivery reports and produce calls", labels);
    r->m_rewinds = oq_metrics_counter(m, "onceq_relay_rewinds_total",
                                      "Times publishing restarted from a failed row", labels);
    r->m_restarts = oq_metrics_counter(m, "onceq_relay_producer_restarts_total",
                                       "Producers recreated after a fatal error", labels);
    r->m_fenced = oq_metrics_counter(m, "onceq_relay_fenced_total",
                                     "Times this relay found its lease lost", labels);
    r->m_cleaned = oq_metrics_counter(m, "onceq_relay_cleaned_total",
                                      "Published rows deleted after the retention", labels);
    r->m_holder = oq_metrics_gauge(m, "onceq_relay_lease_holder",
                                   "1 while this relay holds the lease, else 0", labels);
    r->m_fence =
        oq_metrics_gauge(m, "onceq_relay_lease_fence", "Fencing token held (or last held)", labels);
    r->m_inflight = oq_metrics_gauge(m, "onceq_relay_inflight",
                                     "Messages produced without a delivery report", labels);
    r->m_batch =
        oq_metrics_histogram(m, "onceq_relay_batch_rows", "Delivery reports per watermark advance",
                             labels, batch_bounds, sizeof(batch_bounds) / sizeof(batch_bounds[0]));
    r->m_latency = oq_metrics_histogram(m, "onceq_relay_publish_latency_seconds",
                                        "Outbox created_at to successful delivery report", labels,
                                        lat_bounds, sizeof(lat_bounds) / sizeof(lat_bounds[0]));
    for (int i = 0; i < OQ__RELAY_NPERM; i++) {
        char l[256];
        snprintf(l, sizeof(l), "%s%sreason=\"%s\"", labels ? labels : "", labels ? "," : "",
                 rd_kafka_err2name(permanent_errs[i]));
        r->m_dead[i] = oq_metrics_counter(m, "onceq_relay_dead_letters_total",
                                          "Outbox rows set aside after a permanent error", l);
        if (!r->m_dead[i])
            return oq_error_set(err, OQ_EINVAL, 0,
                                "relay metrics: registration failed (name clash or out of memory)");
    }
    if (!r->m_pending || !r->m_oldest || !r->m_published || !r->m_produced || !r->m_errors ||
        !r->m_rewinds || !r->m_restarts || !r->m_fenced || !r->m_cleaned || !r->m_holder ||
        !r->m_fence || !r->m_inflight || !r->m_batch || !r->m_latency)
        return oq_error_set(err, OQ_EINVAL, 0,
                            "relay metrics: registration failed (name clash or out of memory)");
    return 0;
}

oq_relay_t *oq_relay_new(const oq_relay_opts_t *opts, oq_error_t *err)
{
    oq_relay_t *r = NULL;
    if (!opts || !opts->db_path || !*opts->db_path) {
        oq_error_set(err, OQ_EINVAL, 0, "relay: db_path is required");
        return NULL;
    }
    if (opts->lease_ms < 100 || opts->batch_rows < 1 || opts->batch_bytes < 1 ||
        opts->max_inflight < 1 || opts->retention_ms < 0 || opts->cleanup_batch < 1 ||
        opts->poll_max_ms < 1 || opts->partial_wait_ms < 0 || opts->partial_min_rows < 0 ||
        opts->gather_ms < -1 || opts->gather_min_rate < 0 || opts->stop_timeout_ms < 0) {
        oq_error_set(err, OQ_EINVAL, 0,
                     "relay: bad options (lease_ms>=100, batch_rows/bytes>=1, max_inflight>=1, "
                     "cleanup_batch>=1, poll_max_ms>=1; did you call oq_relay_opts_init?)");
        return NULL;
    }
    r = calloc(1, sizeof(*r));
    if (!r) {
        oq_error_set(err, OQ_ENOMEM, 0, "relay: out of memory");
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_cond_init(&r->wcv, &ca); /* both wait with CLOCK_MONOTONIC deadlines */
    pthread_condattr_destroy(&ca);
    atomic_init(&r->stop, 0);
    r->wake_fd = oq_backend_of(opts->db_path) == OQ_BACKEND_POSTGRES
                     ? eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
                     : -1; /* -1 on failure too: the idle wait then polls, as on SQLite */
    pthread_mutex_init(&r->wmu, NULL);
    atomic_init(&r->is_holder, 0);
    atomic_init(&r->cleaned, 0);

    r->db_path = dup_str(opts->db_path);
    r->sync = dup_str(opts->db_synchronous ? opts->db_synchronous : "NORMAL");
    r->brokers = dup_str(opts->brokers);
    r->lease_name = dup_str(opts->lease_name ? opts->lease_name : "outbox");
    r->topic_prefix = dup_str(opts->topic_prefix);
    if (opts->owner) {
        r->owner = dup_str(opts->owner);
    } else {
        char host[128] = "host", rnd[9], buf[200];
        unsigned char b[4];
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        oq_random_bytes(b, sizeof(b));
        oq_hex(b, sizeof(b), rnd);
        snprintf(buf, sizeof(buf), "%s:%d:%s", host, (int)getpid(), rnd);
        r->owner = dup_str(buf);
    }
    r->kafka_cfg = opts->kafka_cfg;
    r->lease_ms = opts->lease_ms;
    r->batch_rows = opts->batch_rows;
    r->batch_bytes = opts->batch_bytes;
    r->max_inflight = opts->max_inflight > 1000000 ? 1000000 : opts->max_inflight;
    r->retention_ms = opts->retention_ms;
    r->cleanup_batch = opts->cleanup_batch;
    r->poll_max_ms = opts->poll_max_ms;
    r->partial_wait_ms = opts->partial_wait_ms;
    r->partial_min_rows = opts->partial_min_rows;
    r->gather_ms = opts->gather_ms >= 0 ? opts->gather_ms
                   : oq_backend_of(opts->db_path) == OQ_BACKEND_POSTGRES
                       ? OQ__RELAY_GATHER_MS_PG
                       : OQ__RELAY_GATHER_MS_SQLITE;
    r->gather_min_rate = opts->gather_min_rate;
    r->watch_wal = opts->watch_wal;
    r->stop_timeout_ms = opts->stop_timeout_ms;
    if (!r->db_path || !r->lease_name || !r->owner || (opts->brokers && !r->brokers) || !r->sync ||
        (opts->topic_prefix && !r->topic_prefix)) {
        oq_error_set(err, OQ_ENOMEM, 0, "relay: out of memory");
        goto fail;
    }
    r->slots = calloc((size_t)r->max_inflight, sizeof(*r->slots));
    r->ring_seq = calloc((size_t)r->max_inflight, sizeof(*r->ring_seq));
    r->ring_done = calloc((size_t)r->max_inflight, sizeof(*r->ring_done));
    if (!r->slots || !r->ring_seq || !r->ring_done) {
        oq_error_set(err, OQ_ENOMEM, 0, "relay: out of memory");
        goto fail;
    }
    slots_reset(r);

    /* Validate the Kafka settings now, so a typo fails at start-up, not in the thread. */
    rd_kafka_conf_t *conf = kafka_conf(r, err);
    if (!conf) goto fail;
    rd_kafka_conf_destroy(conf);

    if (oq__relay_store_open(r->db_path, r->sync, &r->store, err) != 0 ||
        oq__relay_store_open(r->db_path, r->sync, &r->wstore, err) != 0)
        goto fail;
    /* The watermark and retention commits never checkpoint (oq_ckpt.h): the writer of the
     * database checkpoints it, and so does a relay in a process of its own (several
     * checkpointers on one file share the work). */
    r->ckpt = opts->ckpt;
    if (!r->ckpt && oq_backend_of(r->db_path) == OQ_BACKEND_SQLITE && r->db_path[0] &&
        strcmp(r->db_path, ":memory:") != 0) {
        oq_ckpt_opts_t co = {.synchronous = r->sync,
                             .component = "relay",
                             .metrics = opts->metrics,
                             .metric_prefix = "onceq_relay"};
        if (oq_ckpt_new(r->db_path, &co, &r->ckpt, err) != 0) goto fail;
        r->own_ckpt = 1;
    }
    oq__relay_store_attach(r->store, r->ckpt);
    oq__relay_store_attach(r->wstore, r->ckpt);
    if (opts->metrics && register_metrics(r, opts->metrics, opts->metrics_labels, err) != 0)
        goto fail;
    refresh_pending(r);
    r->shared = r->st;
    return r;
fail:
    oq_relay_destroy(r);
    return NULL;
}

int oq_relay_start(oq_relay_t *r, oq_error_t *err)
{
    if (!r) return oq_error_set(err, OQ_EINVAL, 0, "relay: NULL");
    if (r->started) return oq_error_set(err, OQ_ESTATE, 0, "relay: already started");
    int e = pthread_create(&r->thread, NULL, relay_main, r);
    if (e != 0) return oq_error_set(err, OQ_EIO, e, "relay: pthread_create: %s", strerror(e));
    r->started = 1;
    pthread_setname_np(r->thread, "oq-relay"); /* shows in top -H / perf; failure harmless */
    OQ_LOG_INFO("relay",
                "started db=%s lease=%s owner=%s batch_rows=%d max_inflight=%d "
                "retention_ms=%" PRId64,
                oq_backend_of(r->db_path) == OQ_BACKEND_POSTGRES ? "postgres" : r->db_path,
                r->lease_name, r->owner, r->batch_rows, r->max_inflight, r->retention_ms);
    return 0;
}

void oq_relay_notify(oq_relay_t *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->notified = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(r->wake_fd, &one, sizeof one); /* EAGAIN: a wake-up is pending */
        (void)w;
    }
}

int oq_relay_stop(oq_relay_t *r)
{
    if (!r || !r->started || r->joined) return 0;
    atomic_store(&r->stop, 1);
    oq_relay_notify(r);
    pthread_join(r->thread, NULL);
    r->joined = 1;
    return 0;
}

void oq_relay_destroy(oq_relay_t *r)
{
    if (!r) return;
    oq_relay_stop(r);
    if (r->rk) producer_destroy(r);
    for (int i = 0; i < r->ntopics; i++)
        free(r->topics[i].name);
    oq__relay_store_close(r->store);
    oq__relay_store_close(r->wstore);
    if (r->own_ckpt) oq_ckpt_destroy(r->ckpt);
    free(r->slots);
    free(r->ring_seq);
    free(r->ring_done);
    free(r->failed.v);
    free(r->dead.v);
    free(r->job_dead.v);
    free(r->db_path);
    free(r->sync);
    free(r->brokers);
    free(r->lease_name);
    free(r->topic_prefix);
    free(r->owner);
    if (r->wake_fd >= 0) close(r->wake_fd);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->wcv);
    pthread_mutex_destroy(&r->wmu);
    free(r);
}

void oq_relay_stats(oq_relay_t *r, oq_relay_stats_t *out)
{
    if (!r || !out) return;
    pthread_mutex_lock(&r->mu);
    *out = r->shared;
    pthread_mutex_unlock(&r->mu);
}

const char *oq_relay_owner(const oq_relay_t *r)
{
    return r ? r->owner : NULL;
}

/* Appends printf output to buf at *pos, never past n (truncates silently). */
static void append(char *buf, size_t n, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t n, size_t *pos, const char *fmt, ...)
{
    if (*pos >= n) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *pos, n - *pos, fmt, ap);
    va_end(ap);
    if (w > 0) *pos += (size_t)w;
    if (*pos >= n) *pos = n - 1;
}

static double age_s(int64_t at, int64_t now)
{
    return at > 0 && now > at ? (double)(now - at) / 1000.0 : 0.0;
}

int oq_relay_status_line(sqlite3 *db, char *buf, size_t n, oq_error_t *err)
{
    if (!db) return oq_error_set(err, OQ_EINVAL, 0, "relay status: no database");
    oq_dbh_t h = oq_dbh_sqlite(db);
    return oq_relay_db_status_line(&h, buf, n, err);
}

int oq_relay_db_status_line(const oq_dbh_t *h, char *buf, size_t n, oq_error_t *err)
{
    oq__relay_status_t st;
    int64_t now = oq_now_ms();
    size_t pos = 0;
    int rc;
    if (!buf || n == 0) return oq_error_set(err, OQ_EINVAL, 0, "status: no buffer");
    buf[0] = '\0';
    if ((rc = oq__relay_store_status_of(h, &st, err)) != 0) return rc;
    append(buf, n, &pos, "relay: pending=%" PRId64 " oldest_pending_age=%.2fs published=%" PRId64,
           st.pending, age_s(st.oldest_pending_at, now), st.published);
    for (int i = 0; i < st.nleases; i++) {
        const oq__relay_lease_status_t *l = &st.leases[i];
        append(buf, n, &pos, " lease=%s published_seq=%" PRId64, l->name, l->published_seq);
        if (l->expires_at > now)
            append(buf, n, &pos, " holder=%s fence=%" PRId64 " expires_in=%.1fs", l->owner,
                   l->fence, (double)(l->expires_at - now) / 1000.0);
        else
            append(buf, n, &pos, " holder=none fence=%" PRId64 " last_holder=%s expired", l->fence,
                   l->owner);
    }
    if (st.nleases == 0) append(buf, n, &pos, " holder=none");
    if (st.dead > 0) append(buf, n, &pos, " dead=%" PRId64, st.dead);
    return 0;
}

static void dead_to_json(const oq__relay_dead_read_t *r, void *opaque)
{
    json_t *p = r->payload ? json_stringn((const char *)r->payload, r->len) : NULL;
    json_array_append_new((json_t *)opaque,
                          json_pack("{s:I, s:s*, s:s*, s:s*, s:o, s:I, s:I, s:s*, s:s*, s:I, s:o}",
                                    "seq", (json_int_t)r->seq, "message_id", r->message_id, "topic",
                                    r->topic, "key", r->key, "payload", p ? p : json_null(),
                                    "payload_bytes", (json_int_t)r->len, "created_at",
                                    (json_int_t)r->created_at, "reason", r->reason, "detail",
                                    r->detail, "dead_at", (json_int_t)r->dead_at, "handled_at",
                                    r->handled_at ? json_integer(r->handled_at) : json_null()));
}

int oq_relay_dead_list(sqlite3 *db, int64_t seq, int limit, json_t **out, oq_error_t *err)
{
    *out = NULL;
    if (!db) return oq_error_set(err, OQ_EINVAL, 0, "outbox_dead: no database");
    oq_dbh_t h = oq_dbh_sqlite(db);
    return oq_relay_db_dead_list(&h, seq, limit, out, err);
}

int oq_relay_db_dead_list(const oq_dbh_t *h, int64_t seq, int limit, json_t **out, oq_error_t *err)
{
    *out = NULL;
    json_t *a = json_array();
    if (!a) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    int rc = oq__relay_store_dead_read_of(h, seq, limit > 0 ? limit : 100, dead_to_json, a, err);
    if (rc) {
        json_decref(a);
        return rc;
    }
    *out = a;
    return 0;
}

int oq_relay_status_json(sqlite3 *db, json_t **out, oq_error_t *err)
{
    *out = NULL;
    if (!db) return oq_error_set(err, OQ_EINVAL, 0, "relay status: no database");
    oq_dbh_t h = oq_dbh_sqlite(db);
    return oq_relay_db_status_json(&h, out, err);
}

int oq_relay_db_status_json(const oq_dbh_t *h, json_t **out, oq_error_t *err)
{
    oq__relay_status_t st;
    int64_t now = oq_now_ms();
    int rc;
    *out = NULL;
    if ((rc = oq__relay_store_status_of(h, &st, err)) != 0) return rc;
    json_t *o = json_pack("{s:I, s:f, s:I, s:I, s:[]}", "pending", (json_int_t)st.pending,
                          "oldest_pending_age_s", age_s(st.oldest_pending_at, now), "published",
                          (json_int_t)st.published, "dead", (json_int_t)st.dead, "leases");
    json_t *a = json_object_get(o, "leases");
    for (int i = 0; a && i < st.nleases; i++) {
        const oq__relay_lease_status_t *l = &st.leases[i];
        int held = l->expires_at > now;
        json_array_append_new(a, json_pack("{s:s, s:I, s:s*, s:s, s:I, s:f}", "name", l->name,
                                           "published_seq", (json_int_t)l->published_seq, "holder",
                                           held ? l->owner : NULL, "last_holder", l->owner, "fence",
                                           (json_int_t)l->fence, "expires_in_s",
                                           held ? (double)(l->expires_at - now) / 1000.0 : 0.0));
    }
    if (!a) {
        json_decref(o);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    *out = o;
    return 0;
}
