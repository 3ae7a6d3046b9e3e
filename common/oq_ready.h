/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_ready.h
 * @brief Readiness for the daemons' metrics listeners (GET /readyz): a thread probes a few
 *        named checks once a second, off the HTTP threads, and /readyz answers from the last
 *        results: 200 {"status":"ready", "<check>": "ok" | detail, ...} when every check passed,
 *        else 503 {"status":"unready", ...} naming the failing check. A probe that has not
 *        finished for 5 s makes the process unready too.
 *
 * Built-in checks: "database" (the SQLite file opens read-write and BEGIN IMMEDIATE gets the
 * write lock within 1 s; held by others for two probes in a row is a fault, once is load) and
 * "kafka" (metadata from the brokers within 1 s, on a small client of the readiness module's
 * own, so a standby relay that has no producer is probed too). A caller adds its own (the
 * relay's lease, the consumer's assignment). Transitions are logged once (INFO ready, WARN not
 * ready) and the gauge `onceq_ready` says 1 or 0.
 */
#ifndef OQ_READY_H
#define OQ_READY_H

#include <stddef.h>

#include "oq_config.h"
#include "oq_error.h"
#include "oq_metrics.h"

typedef struct oq_ready oq_ready_t;

/**
 * @brief One check, run on the prober thread: write "ok" or a detail into \p out and return 0
 *        when it passes; write the reason and return a negative OQ_E* when it does not.
 */
typedef int oq_ready_check_fn(void *arg, char *out, size_t cap);

/** @brief New prober for \p component (log lines); registers `onceq_ready` in \p m (may be
 *         NULL). @returns NULL on ENOMEM. */
oq_ready_t *oq_ready_new(const char *component, oq_metrics_t *m);

/** @brief Add a check (at most 8; before oq_ready_start). \p arg is borrowed. */
int oq_ready_add(oq_ready_t *r, const char *name, oq_ready_check_fn *fn, void *arg);

/** @brief Add the "database" check on \p path (copied). */
int oq_ready_add_db(oq_ready_t *r, const char *path);

/**
 * @brief Add the "kafka" check: a producer handle of its own built with oq_kafka_conf_new()
 *        from \p brokers and the -X properties of \p cfg (may be NULL; borrowed).
 * @returns 0, or OQ_EINVAL / OQ_EKAFKA with \p err filled.
 */
int oq_ready_add_kafka(oq_ready_t *r, const char *brokers, const oq_config_t *cfg, oq_error_t *err);

/** @brief Start probing (the first probe runs at once). */
int oq_ready_start(oq_ready_t *r, oq_error_t *err);

/**
 * @brief The /readyz answer: \p body is a malloc()ed JSON object (caller free()s).
 * @returns 1 ready, 0 unready, OQ_ENOMEM.
 */
int oq_ready_render(oq_ready_t *r, char **body, size_t *len);

/** @brief As oq_ready_new, with the gauge named \p gauge instead of `onceq_ready` (the
 *         producer's is `onceq_http_ready`). */
oq_ready_t *oq_ready_new_gauge(const char *component, oq_metrics_t *m, const char *gauge);

/** @brief Run the checks now rather than at the next second (a caller saw a fault happen).
 *         Thread-safe; accepts NULL. */
void oq_ready_probe_now(oq_ready_t *r);

/** @brief Answer GET /readyz of the metrics server \p s from \p r (borrowed; unset with NULL
 *         before freeing it). */
void oq_metrics_server_set_ready(oq_metrics_server_t *s, oq_ready_t *r);

/** @brief oq_metrics_serve() with \p ready answering /readyz from the first request on. */
oq_metrics_server_t *oq_metrics_serve_ready(oq_metrics_t *m, const char *listen, oq_ready_t *ready,
                                            oq_error_t *err);

/** @brief Stop the prober and free everything; accepts NULL. */
void oq_ready_destroy(oq_ready_t *r);

#endif
