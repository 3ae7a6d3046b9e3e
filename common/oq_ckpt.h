/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_ckpt.h
 * @brief A background WAL checkpointer for one SQLite database file of a process: the
 *        commits of the connections attached to it never run a checkpoint.
 *
 * SQLite's auto-checkpoint copies the WAL into the database file, and fsyncs it, inside the
 * COMMIT that takes the WAL past 1000 frames: that commit, and whatever waits for it, stalls.
 * An attached connection reports the WAL's size after each commit instead (its WAL hook, which
 * replaces the auto-checkpoint), and a thread of the checkpointer, on a connection of its own,
 * copies the WAL in the background (PASSIVE: it never blocks a writer or a reader).
 *
 * Several processes may write one file (consumers sharing effects.db, the producer and the
 * relay on calls.db): each runs a checkpointer of its own. A commit reports the WAL's size
 * whoever wrote the frames, so any of them copies; two passes at once cost nothing (the second
 * finds SQLite's checkpoint lock taken and returns). Bounded growth: SQLite restarts the WAL
 * from its beginning at the first write after every frame was copied, and readers keep frames
 * from being copied while their snapshot needs them, so a busy writer or a long reader can
 * keep a PASSIVE pass from ever catching up. A pass chases the writers with more PASSIVE
 * checkpoints while each one copies everything it saw, and ends with a FULL one (writers held
 * off for the few frames left, 10 ms at most) if they never pause. Past `max_frames` the pass
 * is a TRUNCATE instead,
 * which holds new writers off for at most `truncate_wait_ms` while the readers of older
 * snapshots finish, copies the rest and empties the file (if a reader holds on for longer,
 * it gives up, and tries again `frames` frames later).
 */
#ifndef OQ_CKPT_H
#define OQ_CKPT_H

#include <sqlite3.h>
#include <stdint.h>

#include "oq_error.h"
#include "oq_metrics.h"

typedef struct oq_ckpt oq_ckpt_t;

typedef struct oq_ckpt_opts {
    int frames;                /**< WAL frames that wake a pass; default 1000 (SQLite's own) */
    int max_frames;            /**< WAL frames past which a pass truncates; default 4 x frames */
    int interval_ms;           /**< a pass at least this often after commits; default 5000 */
    int truncate_wait_ms;      /**< how long a TRUNCATE may hold writers off; default 100 */
    const char *synchronous;   /**< of the checkpointer's connection (NULL: FULL) */
    const char *component;     /**< log component; default "db" */
    oq_metrics_t *metrics;     /**< may be NULL; borrowed, outlives the checkpointer */
    const char *metric_prefix; /**< e.g. "onceq_producer": PREFIX_checkpoint_seconds, ... */
    /** 1: the one writer finishes a pass itself, between its batches (oq_ckpt_finish), instead
     *  of the thread's FULL checkpoint, which holds that writer off while it copies and syncs
     *  (the producer's submits: p99 3.9 -> 13 ms, rate -15 % with the FULL) */
    int writer_finishes;
} oq_ckpt_opts_t;

/** What a checkpointer did (tests, logs). */
typedef struct oq_ckpt_stats {
    uint64_t commits;        /**< commits reported by attached connections */
    uint64_t passes;         /**< background passes (each one or more checkpoint calls) */
    uint64_t restarts;       /**< WAL restarts seen (a commit reported fewer frames than before) */
    uint64_t truncates;      /**< TRUNCATE checkpoints that succeeded */
    uint64_t truncate_fails; /**< TRUNCATE checkpoints that gave up (a reader held on) */
    int max_wal_frames;      /**< the largest WAL size a commit reported */
} oq_ckpt_stats_t;

/**
 * @brief Open a connection to \p path and start the checkpointer's thread.
 * @param o may be NULL (defaults).
 * @returns 0 with \p out set, or OQ_EDB / OQ_EIO / OQ_ENOMEM / OQ_EINVAL (a PostgreSQL
 *          setting or ":memory:": there is no WAL file to checkpoint).
 */
int oq_ckpt_new(const char *path, const oq_ckpt_opts_t *o, oq_ckpt_t **out, oq_error_t *err);

/**
 * @brief Attach \p db (a read-write connection to the same file): its commits report the WAL's
 *        size to \p ck and never checkpoint. Sets its journal_size_limit, so that the WAL file
 *        shrinks back when SQLite restarts it after a burst.
 * @remark \p ck must outlive \p db (close the connections first, then oq_ckpt_destroy()).
 *         Call from the thread that owns \p db, before it is used by another.
 */
void oq_ckpt_attach(oq_ckpt_t *ck, sqlite3 *db);

/**
 * @brief With writer_finishes: when the last pass could not catch up with the writer, copy
 *        the few frames written since, on the writer's own connection \p db, so that its
 *        next transaction restarts the WAL; otherwise nothing (one mutex). Call between the
 *        writer's transactions, after its clients were answered. \p ck may be NULL.
 */
void oq_ckpt_finish(oq_ckpt_t *ck, sqlite3 *db);

/** @brief Counters so far; \p ck may be NULL (zeros). Thread-safe. */
void oq_ckpt_stats(oq_ckpt_t *ck, oq_ckpt_stats_t *out);

/** @brief Stop the thread (a pass under way ends first) and close; accepts NULL. */
void oq_ckpt_destroy(oq_ckpt_t *ck);

#endif
