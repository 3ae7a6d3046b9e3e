/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt.c: the background WAL checkpointer (oq_ckpt.h), one per database file and process.
 *
 * Design. Attached connections carry a WAL hook (wal_hook) in place of SQLite's
 * auto-checkpoint: after each commit it records the WAL's size and, past `next` frames, wakes
 * the thread; it takes one mutex and never does I/O, so a commit costs what its own fsync
 * costs. The thread runs a pass on its own connection:
 *
 *   - PASSIVE checkpoints, chased: a checkpoint copies the frames that were in the WAL when it
 *     began, while writers keep appending; SQLite restarts the WAL (writes it again from its
 *     start) only at a write that finds every frame copied. So while a checkpoint copies
 *     everything it saw, another one follows at once; it has little to copy (the frames of the
 *     commits made meanwhile), and the pass is complete when one finds nothing new. A
 *     checkpoint that leaves frames behind was held back by a reader's snapshot: the pass ends
 *     and the next one comes `frames` frames later (or at the interval).
 *   - When PASSIVE_CHASE checkpoints in a row still found new frames (writers that never
 *     pause), a FULL checkpoint ends the pass: it holds new writers off (FINISH_WAIT_MS at most)
 *     while it copies the last few frames, so the next write restarts the WAL. A single writer
 *     that has a moment between its transactions (the producer's, writer_finishes) does that
 *     copy itself after every pass instead (oq_ckpt_finish, a PASSIVE on its own connection):
 *     it then waits for no one, its clients were answered before it, and its next transaction
 *     starts on a fully copied WAL, which is when SQLite restarts it. (A writer that never
 *     pauses is always inside a transaction that began before the pass ended: without that
 *     copy its WAL never restarts, and only the TRUNCATE at max_frames bounds it, holding the
 *     writer off each time.)
 *   - Past max_frames (the passes did not get the WAL restarted: a reader that keeps old
 *     snapshots, or several in a row), a TRUNCATE, which holds new writers off for up to
 *     truncate_wait_ms while older readers finish, copies everything and empties the file. If
 *     it gives up, the next try is `frames` frames later.
 *
 * A pass also runs every interval_ms after commits, so that a WAL left behind by a reader, or
 * by a burst that ended below `frames`, is copied once the writes stop.
 *
 * Threads and locks: mu guards the fields the hook writes (frames, next, wanted, counters) and
 * stop; the connection `db` and the rest belong to the thread. The hook runs on the thread of
 * whichever attached connection commits.
 */
#include "oq_ckpt.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oq_db.h"
#include "oq_log.h"
#include "oq_pg.h"
#include "oq_util.h"

#define PASSIVE_CHASE 4
#define FINISH_WAIT_MS 10

struct oq_ckpt {
    sqlite3 *db; /* the thread's connection */
    int frames_step, max_frames, interval_ms, truncate_wait_ms;
    char component[32];
    pthread_t th;
    int started;
    int64_t deadline_us; /* thread: the busy handler's bound for the checkpoint under way */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    int stop, wanted;
    int frames;          /* the WAL's size at the last reported commit */
    int next;            /* frames that wake the next pass */
    int dirty;           /* commits since the last pass began */
    int tfails;          /* TRUNCATEs that gave up in a row: the next try backs off */
    int writer_finishes; /* set once at creation */
    int finish_due;      /* writer_finishes: the writer's next oq_ckpt_finish copies */
    oq_ckpt_stats_t st;
    oq_metric_t *m_pass, *m_finish, *m_truncates;
};

/** WAL hook of an attached connection. @locality the committing thread, inside COMMIT */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int frames)
{
    oq_ckpt_t *ck = arg;
    (void)db;
    (void)name;
    pthread_mutex_lock(&ck->mu);
    if (frames < ck->frames) { /* the WAL restarted */
        ck->st.restarts++;
        ck->next = ck->frames_step;
        ck->tfails = 0;
    }
    ck->frames = frames;
    ck->dirty = 1;
    ck->st.commits++;
    if (frames > ck->st.max_wal_frames) ck->st.max_wal_frames = frames;
    if (!ck->wanted && frames >= ck->next) {
        ck->wanted = 1;
        pthread_cond_signal(&ck->cv);
    }
    pthread_mutex_unlock(&ck->mu);
    return SQLITE_OK;
}

/* Busy handler of the checkpointer's connection (FULL, TRUNCATE): 100 us naps until the
 * deadline of the checkpoint under way. */
static int busy_cb(void *arg, int count)
{
    oq_ckpt_t *ck = arg;
    (void)count;
    if (oq_mono_us() >= ck->deadline_us) return 0;
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
    return 1;
}

static int checkpoint(oq_ckpt_t *ck, int mode, int wait_ms, int *log, int *done)
{
    ck->deadline_us = oq_mono_us() + (int64_t)wait_ms * 1000;
    *log = *done = 0;
    int rc = sqlite3_wal_checkpoint_v2(ck->db, NULL, mode, log, done);
    if (rc != SQLITE_OK && (rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED)
        OQ_LOG_WARN(ck->component, "checkpoint: %s", sqlite3_errmsg(ck->db));
    return rc;
}

/** One pass (see the file comment). @locality checkpointer thread */
static void run_pass(oq_ckpt_t *ck, int frames, int may_truncate)
{
    int64_t t0 = oq_mono_us();
    int log = 0, done = 0, rc;
    if (frames >= ck->max_frames && may_truncate) {
        rc = checkpoint(ck, SQLITE_CHECKPOINT_TRUNCATE, ck->truncate_wait_ms, &log, &done);
        oq_histogram_observe(ck->m_finish, (double)(oq_mono_us() - t0) / 1e6);
        pthread_mutex_lock(&ck->mu);
        if (rc == SQLITE_OK) {
            ck->st.truncates++;
            ck->frames = 0;
            ck->next = ck->frames_step;
            ck->tfails = 0;
        } else {
            ck->st.truncate_fails++;
            ck->tfails++;
        }
        pthread_mutex_unlock(&ck->mu);
        if (rc == SQLITE_OK) {
            oq_counter_add(ck->m_truncates, 1);
            OQ_LOG_INFO(ck->component, "checkpoint: WAL of %d frames truncated in %lld us", frames,
                        (long long)(oq_mono_us() - t0));
            return;
        }
        OQ_LOG_WARN(ck->component,
                    "checkpoint: the WAL holds %d frames and a reader kept it from being "
                    "truncated for %d ms; trying again later",
                    frames, ck->truncate_wait_ms);
        /* fall through: copy what can be copied */
    }
    int prev = -1, complete = 0, chased = 0;
    for (int i = 0; i < PASSIVE_CHASE; i++) {
        rc = checkpoint(ck, SQLITE_CHECKPOINT_PASSIVE, 0, &log, &done);
        if (rc != SQLITE_OK || done < log) break; /* busy, or a reader needs frames */
        if (log == prev || log == 0) {
            complete = 1; /* nothing new since the previous one: every frame is copied */
            break;
        }
        prev = log;
        chased = 1;
    }
    oq_histogram_observe(ck->m_pass, (double)(oq_mono_us() - t0) / 1e6);
    if (ck->writer_finishes) {
        /* even a pass that caught up: the writer that never pauses was already inside its next
         * transaction, whose frames keep the WAL from restarting until it copies them */
        pthread_mutex_lock(&ck->mu);
        ck->finish_due = 1;
        pthread_mutex_unlock(&ck->mu);
    } else if (!complete && chased && rc == SQLITE_OK && done == log) {
        int64_t t1 = oq_mono_us();
        checkpoint(ck, SQLITE_CHECKPOINT_FULL, FINISH_WAIT_MS, &log, &done);
        oq_histogram_observe(ck->m_finish, (double)(oq_mono_us() - t1) / 1e6);
    }
    OQ_LOG_DEBUG(ck->component, "checkpoint: wal=%d copied=%d in %lld us", log, done,
                 (long long)(oq_mono_us() - t0));
}

static void *ckpt_main(void *arg)
{
    oq_ckpt_t *ck = arg;
    int64_t last_us = oq_mono_us();
    pthread_mutex_lock(&ck->mu);
    while (!ck->stop) {
        if (!ck->wanted) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t ns = (int64_t)ts.tv_nsec + (int64_t)ck->interval_ms * 1000000;
            ts.tv_sec += (time_t)(ns / 1000000000);
            ts.tv_nsec = (long)(ns % 1000000000);
            pthread_cond_timedwait(&ck->cv, &ck->mu, &ts);
            if (ck->stop) break;
        }
        int due =
            ck->wanted || (ck->dirty && oq_mono_us() - last_us >= (int64_t)ck->interval_ms * 1000);
        if (!due) continue;
        int frames = ck->frames;
        uint64_t restarts = ck->st.restarts, truncates = ck->st.truncates;
        /* after a TRUNCATE gave up, the next one waits for the backed-off threshold, not the
         * time-based pass */
        int may_truncate = ck->wanted || ck->tfails == 0;
        ck->wanted = 0;
        ck->dirty = 0;
        ck->st.passes++;
        pthread_mutex_unlock(&ck->mu);
        run_pass(ck, frames, may_truncate);
        last_us = oq_mono_us();
        pthread_mutex_lock(&ck->mu);
        /* The WAL did not restart: the next pass comes frames_step frames later, and after
         * TRUNCATEs that gave up, later still (a reader that holds on would otherwise cost the
         * writers truncate_wait_ms every frames_step frames). A restart resets it (wal_hook). */
        if (ck->st.restarts == restarts && ck->st.truncates == truncates) {
            int shift = ck->tfails > 6 ? 6 : ck->tfails;
            ck->next = ck->frames + (ck->frames_step << shift);
        }
    }
    pthread_mutex_unlock(&ck->mu);
    return NULL;
}

int oq_ckpt_new(const char *path, const oq_ckpt_opts_t *o, oq_ckpt_t **out, oq_error_t *err)
{
    *out = NULL;
    if (!path || !path[0] || strcmp(path, ":memory:") == 0 ||
        oq_backend_of(path) != OQ_BACKEND_SQLITE)
        return oq_error_set(err, OQ_EINVAL, 0, "checkpointer: not an SQLite database file");
    oq_ckpt_opts_t d = {0};
    if (o) d = *o;
    oq_ckpt_t *ck = calloc(1, sizeof *ck);
    if (!ck) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    ck->frames_step = d.frames > 0 ? d.frames : 1000;
    ck->max_frames = d.max_frames > ck->frames_step ? d.max_frames : 4 * ck->frames_step;
    ck->interval_ms = d.interval_ms > 0 ? d.interval_ms : 5000;
    ck->truncate_wait_ms = d.truncate_wait_ms > 0 ? d.truncate_wait_ms : 100;
    ck->writer_finishes = d.writer_finishes != 0;
    ck->next = ck->frames_step;
    snprintf(ck->component, sizeof ck->component, "%s", d.component ? d.component : "db");
    pthread_mutex_init(&ck->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ck->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (d.metrics && d.metric_prefix) {
        static const double lat[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                     0.01,   0.025,   0.05,   0.1,   0.5,    1};
        char name[128];
        snprintf(name, sizeof name, "%s_checkpoint_seconds", d.metric_prefix);
        ck->m_pass =
            oq_metrics_histogram(d.metrics, name, "Duration of a background WAL checkpoint pass",
                                 NULL, lat, sizeof lat / sizeof lat[0]);
        snprintf(name, sizeof name, "%s_checkpoint_finish_seconds", d.metric_prefix);
        ck->m_finish = oq_metrics_histogram(
            d.metrics, name,
            "Duration of a checkpoint that holds writers off (FULL after a pass that kept "
            "finding new frames, TRUNCATE past the WAL limit)",
            NULL, lat, sizeof lat / sizeof lat[0]);
        snprintf(name, sizeof name, "%s_checkpoint_truncates_total", d.metric_prefix);
        ck->m_truncates = oq_metrics_counter(
            d.metrics, name, "WAL files emptied because they passed the checkpointer's limit",
            NULL);
    }
    oq_db_opts_t dbo = {.synchronous = d.synchronous};
    int ret = oq_db_open(path, &dbo, &ck->db, err);
    if (ret) goto fail;
    sqlite3_busy_handler(ck->db, busy_cb, ck);
    if (pthread_create(&ck->th, NULL, ckpt_main, ck) != 0) {
        ret = oq_error_set(err, OQ_EIO, errno, "cannot start the checkpointer thread");
        goto fail;
    }
    ck->started = 1;
    pthread_setname_np(ck->th, "oq-ckpt"); /* top -H, perf; failure harmless */
    *out = ck;
    return 0;
fail:
    oq_ckpt_destroy(ck);
    return ret;
}

void oq_ckpt_attach(oq_ckpt_t *ck, sqlite3 *db)
{
    if (!ck || !db) return;
    sqlite3_wal_hook(db, wal_hook, ck); /* also turns the in-commit checkpoint off */
    /* after a restart, the WAL file shrinks back to about two passes' worth of frames (4 KiB
     * pages and their frame headers) */
    char sql[96];
    snprintf(sql, sizeof sql, "PRAGMA journal_size_limit=%lld",
             (long long)ck->frames_step * 2 * (4096 + 24));
    sqlite3_exec(db, sql, NULL, NULL, NULL);
}

void oq_ckpt_finish(oq_ckpt_t *ck, sqlite3 *db)
{
    if (!ck || !db) return;
    pthread_mutex_lock(&ck->mu);
    int due = ck->finish_due;
    ck->finish_due = 0;
    pthread_mutex_unlock(&ck->mu);
    if (!due) return;
    int64_t t0 = oq_mono_us();
    int log = 0, done = 0;
    int rc = sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
    oq_histogram_observe(ck->m_finish, (double)(oq_mono_us() - t0) / 1e6);
    if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) {
        /* the thread's next pass is copying: try again after the writer's next transaction */
        pthread_mutex_lock(&ck->mu);
        ck->finish_due = 1;
        pthread_mutex_unlock(&ck->mu);
    } else if (rc != SQLITE_OK) {
        OQ_LOG_WARN(ck->component, "checkpoint: %s", sqlite3_errmsg(db));
    }
}

void oq_ckpt_stats(oq_ckpt_t *ck, oq_ckpt_stats_t *out)
{
    memset(out, 0, sizeof *out);
    if (!ck) return;
    pthread_mutex_lock(&ck->mu);
    *out = ck->st;
    pthread_mutex_unlock(&ck->mu);
}

void oq_ckpt_destroy(oq_ckpt_t *ck)
{
    if (!ck) return;
    pthread_mutex_lock(&ck->mu);
    ck->stop = 1;
    pthread_cond_signal(&ck->cv);
    pthread_mutex_unlock(&ck->mu);
    if (ck->started) pthread_join(ck->th, NULL);
    sqlite3_close_v2(ck->db);
    pthread_mutex_destroy(&ck->mu);
    pthread_cond_destroy(&ck->cv);
    free(ck);
}
