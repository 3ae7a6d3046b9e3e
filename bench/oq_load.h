/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_load.h
 * @brief The HTTP load generator of `onceq-bench e2e` and the end-to-end tests
 *        (tests/tools/oq_e2e_load): submits tool calls to a producer over keep-alive
 *        connections, open-loop paced or closed loop, retrying with the same key and body.
 *        A tool, not part of the product: it lives in the onceq-bench sources.
 */
#ifndef OQ_LOAD_H
#define OQ_LOAD_H

#include <stdint.h>
#include <stdio.h>

#include "oq_error.h"

/** Tools the load generator submits, in the order of oq_load_opts_t.mix. */
enum {
    OQ_LOAD_CHARGE = 0,
    OQ_LOAD_EMAIL,
    OQ_LOAD_SLEEP,
    OQ_LOAD_FAIL_RETRY,
    OQ_LOAD_FAIL_FINAL,
    OQ_LOAD__NTOOLS
};

/** Options of oq_load_run(). Zero-initialise, then set host/port/calls. */
typedef struct oq_load_opts {
    const char *host;         /**< producer address (default 127.0.0.1) */
    int port;                 /**< producer port */
    int64_t calls;            /**< logical calls to submit */
    int64_t first;            /**< index of the first call (keys are prefix-<index>) */
    int conns;                /**< keep-alive connections (default 8, at most 256); call k goes
                                   to connection k % conns. Served by an epoll loop on two
                                   threads (one below 8 connections), not a thread each */
    double rate;              /**< offered load in calls/s over all connections; 0 = closed loop */
    const char *key_prefix;   /**< idempotency key prefix (default "k") */
    int mix[OQ_LOAD__NTOOLS]; /**< weights; all zero = charge 40, send_email 30, sleep 10,
                                   fail retryable 10, fail final 10 */
    int sleep_ms;             /**< ms for the sleep tool (default 5) */
    const char *charge_tool;  /**< tool name submitted for the charge share, with the same
                                   {"amount":N} args (e.g. an HTTP tool); NULL: "charge" */
    int dup_every;            /**< every Nth call is submitted twice: same key + body must give
                                   the same call_id (0 = never) */
    int conflict_every;       /**< every Nth call is re-sent with another body: must get 422 */
    int hot_key;              /**< every call is call `first`: one key and one body hammered by
                                   every connection (the hot-key benchmark: calls=1, effects=1) */
    int64_t retry_ms;         /**< keep retrying a call (same key, same body) on connection errors
                                   and 5xx/429 for this long (default 60000) */
    FILE *accepted;           /**< optional: "call_id\n" of every accepted call (locked writes) */
} oq_load_opts_t;

/** Outcome of oq_load_run(). */
typedef struct oq_load_result {
    int64_t accepted; /**< calls answered 200/202 (replays of our own dups not counted) */
    int64_t by_tool[OQ_LOAD__NTOOLS]; /**< accepted calls per tool */
    int64_t replays_ok;               /**< duplicate submits that returned the same call_id */
    int64_t replays_bad;   /**< duplicate submits that returned another call_id or an error */
    int64_t conflicts_ok;  /**< conflicting submits answered 422 idempotency_conflict */
    int64_t conflicts_bad; /**< conflicting submits answered anything else */
    int64_t retries;       /**< requests re-sent after an error (same key) */
    int64_t failed;        /**< calls given up after retry_ms */
    double elapsed_s;      /**< wall time of the submit phase */
    double p50_ms, p99_ms, max_ms; /**< submit latency (request sent -> response read) */
    int64_t first_ms, last_ms;     /**< unix ms of the first send and the last response */
} oq_load_result_t;

/**
 * @brief Submit \p o->calls tool calls over HTTP to a producer and wait for every answer.
 * @returns 0 when the run completed (per-call failures are counted in \p r), OQ_EINVAL for
 *          bad options, OQ_ENOMEM.
 */
int oq_load_run(const oq_load_opts_t *o, oq_load_result_t *r, oq_error_t *err);

#endif
