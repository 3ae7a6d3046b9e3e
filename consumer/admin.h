/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file admin.h
 * @brief Internal: the consumer's admin listener (consumer/admin.c), on --metrics-listen:
 *        Prometheus metrics, the worker's stats, and the review workflow over HTTP.
 *
 *   GET  /metrics                        Prometheus text (the worker's registry)
 *   GET  /healthz                        "ok"
 *   GET  /readyz                         200/503 JSON from the worker's prober (oq_ready.h);
 *                                        503 "starting" until oq__admin_set_ready
 *   GET  /stats                          the worker's stats (oq_consumer_stats_json)
 *   GET  /v1/review[?limit=N]            the review queue (oq_review_list)
 *   GET  /v1/review/{call_id}            one call's story (oq_review_show)
 *   POST /v1/review/{call_id}/resolve    body {"as": "committed"|"failed"|"retry",
 *                                        "fence": N, "ref": "...", "note": "...",
 *                                        "by": "..."} (oq_review_resolve)
 * Errors are {"error":{"code":...,"message":...}}: 400 bad_request, 401 unauthorized,
 * 403 forbidden, 404 not_found, 409 not_in_review, 409 review_moved (the fence moved: another
 * review episode), 405 method_not_allowed, 413 payload_too_large, 415 unsupported_media_type,
 * 500 internal.
 * It binds 127.0.0.1 unless told otherwise: resolving a review is an operator's act. A
 * non-loopback address needs a token file (operator tokens guard the review API and /stats).
 */
#ifndef OQ_CONSUMER_ADMIN_H
#define OQ_CONSUMER_ADMIN_H

#include <jansson.h>

#include "oq_error.h"
#include "oq_metrics.h"

typedef struct oq__admin oq__admin_t;

/** Returns the stats JSON (a new reference) or NULL. */
typedef json_t *(*oq__admin_stats_fn)(void *ctx);

/**
 * @brief Serve on \p listen ("127.0.0.1:9100") from one thread of libmicrohttpd.
 * @param token_file NULL, or a token file in the producer's format (oq_tokens.h): the review
 *        API and /stats then need a bearer token with the operator role.
 * @param m the metrics registry (borrowed); @param db_path the effects database (copied).
 * @returns the listener, or NULL with \p err filled (OQ_EINVAL: a non-loopback \p listen
 *          without \p token_file, or a token file that does not load).
 */
oq__admin_t *oq__admin_start(const char *listen, const char *token_file, oq_metrics_t *m,
                             const char *db_path, oq__admin_stats_fn stats, void *ctx,
                             oq_error_t *err);

/**
 * @brief The start-up rule of the admin listener: an address that is not loopback needs a
 *        token file. @returns 0, or OQ_EINVAL with \p err saying so.
 */
int oq__admin_check_listen(const char *listen, const char *token_file, oq_error_t *err);

struct oq_ready;
/** @brief Answer GET /readyz from \p r (borrowed; unset with NULL before freeing it). */
void oq__admin_set_ready(oq__admin_t *a, struct oq_ready *r);

/** @brief The bound port, -1 for NULL. */
int oq__admin_port(const oq__admin_t *a);

/** @brief Stop and free; accepts NULL. */
void oq__admin_stop(oq__admin_t *a);

#endif
