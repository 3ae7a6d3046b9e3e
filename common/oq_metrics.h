/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_metrics.h
 * @brief A small metrics registry rendered in the Prometheus text exposition format (0.0.4).
 *
 * Metrics are registered once (at start-up) and updated lock-free with C11 atomics from any
 * thread. A metric name may carry a fixed label set: register
 * `onceq_calls_total` with labels `state="pending"` and again with `state="running"`; the
 * renderer groups them under one HELP/TYPE header. Histograms have fixed upper bounds given at
 * registration (plus +Inf) and export _bucket/_sum/_count.
 */
#ifndef OQ_METRICS_H
#define OQ_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "oq_error.h"

typedef struct oq_metrics oq_metrics_t;
typedef struct oq_metric oq_metric_t;

oq_metrics_t *oq_metrics_new(void);
/** @brief Free the registry and every metric in it; accepts NULL. */
void oq_metrics_destroy(oq_metrics_t *m);

/**
 * @brief Register a counter/gauge. \p labels is NULL or `key="value"[,key="value"]`.
 * @returns the metric (owned by the registry), or NULL on a name/type clash or ENOMEM.
 */
oq_metric_t *oq_metrics_counter(oq_metrics_t *m, const char *name, const char *help,
                                const char *labels);
oq_metric_t *oq_metrics_gauge(oq_metrics_t *m, const char *name, const char *help,
                              const char *labels);
/** @brief Histogram with \p n ascending upper bounds (the +Inf bucket is implicit). */
oq_metric_t *oq_metrics_histogram(oq_metrics_t *m, const char *name, const char *help,
                                  const char *labels, const double *bounds, size_t n);

/** Updates; all accept NULL metrics (so optional metrics need no branches at call sites). */
void oq_counter_add(oq_metric_t *c, uint64_t n);
void oq_gauge_set(oq_metric_t *g, double v);
void oq_gauge_add(oq_metric_t *g, double d);
void oq_histogram_observe(oq_metric_t *h, double v);
/**
 * @brief Set a counter that mirrors a monotonic source measured as a real number (CPU seconds,
 *        a total read from elsewhere): the value only grows; a smaller \p v is ignored. Use
 *        either oq_counter_add() or this on one counter, not both.
 */
void oq_counter_set(oq_metric_t *c, double v);
/**
 * @brief Render no sample for \p mt while \p absent (its family header stays): for series that
 *        only one process of several should export (a gauge read from a shared database), or
 *        that exist only for a while (the lag of an assigned partition).
 */
void oq_metric_set_absent(oq_metric_t *mt, int absent);
double oq_metric_value(const oq_metric_t *mt); /**< counter or gauge value (tests, stats) */

/**
 * @brief Callback run under the registry lock before every render (e.g. to refresh a
 *        "rows pending" gauge from the database only when scraped). It may update metrics but
 *        must not register new ones or render.
 */
typedef void oq_metrics_collect_cb_t(oq_metrics_t *m, void *arg);
/** @brief Install (or with NULL remove) the collect callback; \p arg is borrowed. */
void oq_metrics_set_collect_cb(oq_metrics_t *m, oq_metrics_collect_cb_t *cb, void *arg);

/**
 * @brief Register `onceq_build_info{version,component} 1` and the standard process metrics
 *        (process_cpu_seconds_total, process_resident_memory_bytes,
 *        process_virtual_memory_bytes, process_open_fds, process_max_fds,
 *        process_start_time_seconds), read from /proc at every render. @returns 0 or OQ_ENOMEM.
 */
int oq_metrics_add_process(oq_metrics_t *m, const char *component);

/**
 * @brief Render all metrics. @param out malloc()ed text (caller free()s).
 * @returns 0 or OQ_ENOMEM.
 */
int oq_metrics_render(oq_metrics_t *m, char **out, size_t *out_len);

/**
 * @brief Serve GET /metrics, GET /healthz (200 "ok" while the process serves) and GET /readyz
 *        (see oq_metrics_server_set_readyz) for \p m on \p listen ("127.0.0.1:9100") with
 *        libmicrohttpd in its own thread. @returns a handle for oq_metrics_serve_stop(), or
 *        NULL (\p err filled).
 */
typedef struct oq_metrics_server oq_metrics_server_t;
oq_metrics_server_t *oq_metrics_serve(oq_metrics_t *m, const char *listen, oq_error_t *err);
/** A /readyz answer: \p body a malloc()ed JSON object (the caller frees it). @returns 1 ready
 *  (200), 0 unready (503), a negative OQ_E* code on failure. oq_ready.h's prober renders one
 *  (oq_metrics_server_set_ready there); the metrics server knows only this shape. */
typedef int oq_readyz_fn(void *ctx, char **body, size_t *len);
/**
 * @brief Answer GET /readyz with \p fn (\p ctx borrowed: it must outlive the server or be
 *        unset with NULL first). Without one, /readyz is 200 {"status":"ready"} once serving.
 */
void oq_metrics_server_set_readyz(oq_metrics_server_t *s, oq_readyz_fn *fn, void *ctx);
/** @brief oq_metrics_serve() with \p fn answering /readyz from the first request on. */
oq_metrics_server_t *oq_metrics_serve_readyz(oq_metrics_t *m, const char *listen, oq_readyz_fn *fn,
                                             void *ctx, oq_error_t *err);
/** @brief Stop the server and free it; accepts NULL. The registry stays with the caller. */
void oq_metrics_serve_stop(oq_metrics_server_t *s);
/** @brief The bound TCP port (useful after listening on port 0), or -1 for NULL. */
int oq_metrics_server_port(const oq_metrics_server_t *s);

/**
 * @brief Parse "host:port" (IPv4 dotted or "localhost", which becomes 127.0.0.1; an empty
 *        host or a bare "port" also means 127.0.0.1). @returns 0 or OQ_EINVAL.
 */
int oq_parse_listen(const char *listen, char host[64], int *port, oq_error_t *err);

#endif
