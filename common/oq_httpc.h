/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_httpc.h
 * @brief The onceq HTTP client, on libcurl: one request at a time over a connection kept
 *        between requests; http and https (system CA store, or a given bundle), IPv4 and IPv6
 *        (`http://[::1]:8081`); the `Retry-After` of an answer decoded for the caller.
 *
 * Used by `onceq call` and by the tools' health checks. The load generator of onceq-bench
 * keeps its own event-loop client for CPU reasons (see bench/load.c).
 */
#ifndef OQ_HTTPC_H
#define OQ_HTTPC_H

#include <stddef.h>
#include <stdint.h>

#include "oq_error.h"

/** A client: one libcurl easy handle (its connection is reused by the next request). */
typedef struct oq_httpc oq_httpc_t;

/** Options of oq_httpc_new(). Zero-initialised = defaults. */
typedef struct oq_httpc_opts {
    int64_t timeout_ms; /**< deadline of one request, connect included (0: 5000) */
    const char *cacert; /**< https: CA bundle file (NULL: the system's); copied */
} oq_httpc_opts_t;

/** One answer. Free what it owns with oq_httpc_resp_clear(). */
typedef struct oq_httpc_resp {
    long status; /**< HTTP status */
    char *body;  /**< the body, NUL-terminated ("" when empty); owned */
    size_t body_len;
    int64_t retry_after_ms; /**< the answer's Retry-After (delay-seconds or HTTP-date) in ms
                                 from now; -1 when absent, 0 for a date already past */
} oq_httpc_resp_t;

/**
 * @brief New client. @param opts may be NULL (defaults).
 * @returns the client (free with oq_httpc_destroy()), or NULL with \p err filled (OQ_ENOMEM,
 *          OQ_EIO when libcurl cannot be initialised).
 */
oq_httpc_t *oq_httpc_new(const oq_httpc_opts_t *opts, oq_error_t *err);

/** @brief Close the client's connection and free it; accepts NULL. */
void oq_httpc_destroy(oq_httpc_t *c);

/**
 * @brief One request. Redirects are not followed; answers over 16 MiB are refused.
 * @param method "GET" or "POST".
 * @param url http:// or https:// URL (other schemes are OQ_EINVAL).
 * @param headers NULL-terminated "Name: value" lines to add, or NULL. `Accept:
 *        application/json` is always sent, `Content-Type: application/json` with a body.
 * @param body request body (POST), or NULL.
 * @param resp filled when the server answered, whatever the status (reset first).
 * @returns 0 when an answer came; OQ_ETIMEDOUT (retriable); OQ_EIO for a transport error
 *          (retriable unless it is a TLS verification failure; err->cause is the CURLcode);
 *          OQ_EINVAL for a bad URL or scheme; OQ_ENOMEM.
 */
int oq_httpc_request(oq_httpc_t *c, const char *method, const char *url, const char *const *headers,
                     const char *body, oq_httpc_resp_t *resp, oq_error_t *err);

/**
 * @brief Header \p name (case-insensitive; the last one when repeated) of the last answer
 *        \p c received, copied into \p out (at most \p n - 1 bytes, NUL-terminated).
 * @returns 0, or OQ_ENOTFOUND (absent, or no answer yet), OQ_ETOOBIG (value longer than n-1).
 */
int oq_httpc_header(oq_httpc_t *c, const char *name, char *out, size_t n);

/** @brief Free the body of \p r and zero it; accepts NULL. */
void oq_httpc_resp_clear(oq_httpc_resp_t *r);

#endif
