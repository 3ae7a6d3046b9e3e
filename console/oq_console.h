/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_console.h
 * @brief `onceq console`: the operators' web console (console/server.c) and the one call's
 *        story it shares with `onceq inspect` (console/inspect.c).
 *
 * The console holds no rules and no SQL of its own: calls come from oq_producer_db_list, a
 * call's timeline from oq_inspect_call (both on SQLite or PostgreSQL), the review queue and its
 * decisions from oq_review_list and oq_review_resolve, tasks from oq_producer_db_tasks and a
 * task's story from oq_inspect_task (SQLite only, as tasks are), the relay's dead rows from
 * oq_relay_db_dead_list, the DLQ topic's dead letters and their redrive from `onceq dlq` itself
 * (console/dlq.c), the charts from the daemons' own /metrics. Its pages are embedded in the binary
 * (console/assets/).
 */
#ifndef OQ_CONSOLE_H
#define OQ_CONSOLE_H

#include <jansson.h>
#include <sqlite3.h>
#include <stddef.h>

#include "oq_dbh.h"
#include "oq_error.h"

/**
 * @brief One call's story, the document `onceq inspect --json` prints: {"call": the call's
 *        JSON, "consumer": {"execution", "effect"} or null, "timeline": [{"ts", "from"
 *        ("producer"|"consumer"), "event", "detail", "worker", "attempt", "fence"}], "webhooks":
 *        the call's webhook deliveries (oq_producer_db_webhooks)}, both databases' rows merged
 *        by time.
 * @param consumer_db effects.db, or NULL for the producer's side only.
 * @returns 0 with \p out a new reference, OQ_ENOTFOUND (not in \p db), OQ_EDB, OQ_ENOMEM.
 */
int oq_inspect_doc(sqlite3 *db, const char *consumer_db, const char *call_id, json_t **out,
                   oq_error_t *err);

/** @brief oq_inspect_doc() on an operator's handle (oq_dbh.h): the producer's database on
 *         SQLite or PostgreSQL. oq_inspect_doc() calls this. */
int oq_inspect_call(const oq_dbh_t *h, const char *consumer_db, const char *call_id, json_t **out,
                    oq_error_t *err);

/**
 * @brief A task's story, the document `onceq inspect --json t_...` prints and the console's
 *        task page shows: {"task": the task's JSON (oq_producer_db_task_get: its steps and
 *        compensations in order, each with status, call id, result, object id), "timeline":
 *        every step's and compensation's call timeline rows (as oq_inspect_call gives them),
 *        each tagged "step", "role" ("step"|"compensate") and "call_id", merged by time}.
 * @returns 0 with \p out a new reference, OQ_ENOTFOUND, OQ_ESTATE (a PostgreSQL producer
 *          database: tasks need the SQLite store), OQ_EDB, OQ_ENOMEM.
 */
int oq_inspect_task(const oq_dbh_t *h, const char *consumer_db, const char *task_id, json_t **out,
                    oq_error_t *err);

typedef struct oq_console oq_console_t;

typedef struct oq_console_opts {
    const char *producer_db; /**< calls.db or a PostgreSQL connection string (required) */
    const char *consumer_db; /**< effects.db, or NULL: no consumer side, no review queue */
    const char *listen;      /**< HOST:PORT; without a token file HOST must be loopback */
    const char *token_file;  /**< NULL: no tokens (loopback only, the local user is operator) */
    const char *const *metrics_urls; /**< the daemons' /metrics, for the charts */
    size_t n_metrics_urls;
    const char *local_operator; /**< the operator's name without tokens (audit rows) */
    const char *brokers;        /**< the DLQ topic's cluster (NULL: only the relay's dead rows) */
    const char *topic_prefix;   /**< with brokers: the topics' prefix (NULL: none) */
    const char *self_exe;       /**< with brokers: the onceq binary, which runs `onceq dlq` */
} oq_console_opts_t;

/**
 * @brief Start serving (its own thread). Strings of \p opts are copied.
 * @returns 0, OQ_EINVAL (a non-loopback address without a token file, a bad address),
 *          OQ_EIO (cannot listen, token file unreadable).
 */
int oq_console_start(const oq_console_opts_t *opts, oq_console_t **out, oq_error_t *err);
/** @brief The port listened on (useful with port 0). */
int oq_console_port(const oq_console_t *c);
/** @brief Stop and free; accepts NULL. */
void oq_console_stop(oq_console_t *c);

#endif
