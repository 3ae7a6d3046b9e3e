/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_downstream.h
 * @brief `onceq-downstream`: a small payment service with its own SQLite ledger and
 *        switchable faults, to test what onceq promises against a real network peer.
 *
 * HTTP API (JSON; errors are {"error":{"code":...,"message":...}}):
 *   POST /v1/payments            body {"amount":int>0, "currency":"EUR", "reference":"...", ...}
 *                                header Idempotency-Key (optional). New -> 201 + payment.
 *                                Key honoured and seen before -> 200 + the same payment,
 *                                header Idempotent-Replayed: true, no new effect; same key with
 *                                another body -> 422 idempotency_conflict. Key ignored -> every
 *                                request is a new payment (the ledger counts the duplicates).
 *   GET  /v1/payments/{id}       200 payment | 404 not_found
 *   GET  /v1/payments?reference=R | ?idempotency_key=K
 *                                lookup: 200 + the first matching payment (header
 *                                X-Match-Count: n) | 404 not_found; with lookup off: 501
 *                                not_implemented (never 404, which a client could read as
 *                                "absent").
 *   GET  /ledger/stats           request counters (this process) + ledger effect counts
 *   GET  /admin/mode, POST /admin/mode   read / change keys, lookup, faults, delays
 *   POST /admin/down {"ms":N}    stop listening (connections refused) for N ms (0: until
 *                                SIGUSR2); SIGUSR1 / SIGUSR2 to the process do down / up too
 *   GET  /healthz, GET /metrics
 *
 * Per-request overrides (headers): X-Downstream-Fault: <fault>|none, X-Downstream-Keys:
 * honour|ignore, X-Downstream-Lookup: on|off, X-Downstream-Delay-Ms: N (slow / late delay),
 * X-Downstream-Retry-After: S (seconds, for 429/503).
 *
 * Faults (the flag takes "fault:probability[,fault:probability...]", probabilities summing to
 * at most 1, drawn from a seeded generator; POSTs only, headers work on any request):
 *   drop-after-commit    commit, then close the connection without a response
 *   late-after-commit    commit, then answer after the late delay (past a client's timeout)
 *   drop-before-commit   close the connection without a response, nothing committed
 *   500                  500 internal, nothing committed
 *   503                  503 unavailable + Retry-After, nothing committed
 *   429                  429 rate_limited + Retry-After, nothing committed
 *   decline              402 card_declined (a final refusal), nothing committed
 *   slow                 wait the slow delay, then process normally
 */
#ifndef OQ_DOWNSTREAM_H
#define OQ_DOWNSTREAM_H

#include <jansson.h>
#include <stdint.h>

#include "oq_error.h"

typedef struct oq_downstream oq_downstream_t;

/** Start options. Strings are borrowed for the duration of oq_downstream_start(). */
typedef struct oq_downstream_opts {
    const char *listen;      /**< "127.0.0.1:8090"; port 0 picks a free port */
    const char *db;          /**< ledger file (created when missing) */
    const char *synchronous; /**< "full" (default when NULL), "normal", "off" */
    int keys_ignore;         /**< 0: honour Idempotency-Key (default); 1: ignore it */
    int lookup_off;          /**< 0: lookup offered (default); 1: 501 */
    const char *faults;      /**< "drop-after-commit:0.2,429:0.1" or NULL */
    uint64_t seed;           /**< fault generator seed; 0 = random */
    int64_t slow_ms;         /**< delay of the "slow" fault (default 2000) */
    int64_t late_ms;         /**< delay of "late-after-commit" (default 5000) */
    int retry_after_s;       /**< Retry-After of 429 / 503 (default 1) */
    int threads;             /**< HTTP threads, at least (default 2; 9 for 1,000 connections) */
    int max_batch;           /**< payments per ledger transaction (default 256; 1 = none) */
    int64_t max_body;        /**< request body limit in bytes (default 64 KiB) */
} oq_downstream_opts_t;

/**
 * @brief Open the ledger and start serving.
 * @returns 0 with \p out set, OQ_EINVAL (bad listen address or fault spec, with \p err naming
 *          it), OQ_EIO (cannot listen), OQ_EDB (ledger).
 */
int oq_downstream_start(const oq_downstream_opts_t *opts, oq_downstream_t **out, oq_error_t *err);

/** @brief The bound port, or -1 while down / for NULL. */
int oq_downstream_port(const oq_downstream_t *d);

/**
 * @brief Housekeeping for the owning thread: applies pending down/up requests (admin API and
 *        oq_downstream_set_down()). Call it every few tens of milliseconds.
 * @locality the thread that called oq_downstream_start().
 */
void oq_downstream_tick(oq_downstream_t *d);

/**
 * @brief Stop listening (new connections are refused) for \p ms milliseconds, or until
 *        oq_downstream_set_down(d, -1) when \p ms is 0. \p ms < 0 brings it back now.
 *        Async-signal-safe (it only stores a request that oq_downstream_tick() applies).
 */
void oq_downstream_set_down(oq_downstream_t *d, int64_t ms);

/** @brief Stop serving (requests in flight are answered first, up to \p drain_ms), close the
 *         ledger, free \p d. Accepts NULL. */
void oq_downstream_stop(oq_downstream_t *d, int drain_ms);

/**
 * @brief Offline statistics of the ledger file \p db (opened read-only): effects, logical
 *        calls, duplicate effects, DSR, and the keys / references with more than one effect.
 * @param out a new JSON object (caller json_decref()s it).
 */
int oq_downstream_ledger_stats(const char *db, int top, json_t **out, oq_error_t *err);

/**
 * @brief Parse a fault spec ("kind:p[,kind:p...]") without starting anything (for validation
 *        at the command line). @returns 0 or OQ_EINVAL naming the bad part.
 */
int oq_downstream_check_faults(const char *spec, oq_error_t *err);

#endif
