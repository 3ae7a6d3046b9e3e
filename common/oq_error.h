/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_error.h
 * @brief One error pattern for all of onceq.
 *
 * Functions that can fail return `int`: 0 on success or a negative OQ_E* code. They take an
 * optional caller-owned ::oq_error_t that receives the code, the underlying cause (an SQLite
 * result code, an rd_kafka_resp_err_t or an errno value, depending on OQ_E*), a retriable flag
 * and a fixed-size message, so reporting an error never allocates. Every code has a stable
 * lowercase name (oq_error_name()) used in logs and in HTTP error bodies.
 */
#ifndef OQ_ERROR_H
#define OQ_ERROR_H

#include <stdarg.h>

enum {
    OQ_OK = 0,
    OQ_EINVAL = -1,    /**< Bad input (argument, JSON, setting). Never retriable. */
    OQ_ENOMEM = -2,    /**< Allocation failed. */
    OQ_EIO = -3,       /**< OS-level I/O error; cause = errno. */
    OQ_EDB = -4,       /**< SQLite error; cause = SQLite extended result code. */
    OQ_EBUSY = -5,     /**< SQLITE_BUSY/LOCKED or similar: retriable. */
    OQ_ENOTFOUND = -6, /**< No such row / call / key. */
    OQ_ECONFLICT = -7, /**< Same idempotency key, different fingerprint. */
    OQ_EKAFKA = -8,    /**< librdkafka error; cause = rd_kafka_resp_err_t. */
    OQ_ETOOBIG = -9,   /**< Input over a configured limit. */
    OQ_EVERSION = -10, /**< Unknown envelope version or a database newer than the binary. */
    OQ_ESTATE = -11,   /**< Operation not allowed in the current state. */
    OQ_EFENCED = -12,  /**< A lease/fencing token no longer held: writes refused. */
    OQ_ETIMEDOUT = -13,
    OQ_ESHUTDOWN = -14, /**< Component is stopping. */
    OQ_ECRYPTO = -15,   /**< OpenSSL failure. */
    OQ_EDEPTH = -16,    /**< JSON nested too deeply. */
    OQ_ERANGE = -17,    /**< Number not representable (e.g. integer beyond +-2^53, NaN). */
    OQ_EDUPKEY = -18,   /**< Duplicate key in a JSON object. */
    OQ_EUTF8 = -19,     /**< Invalid UTF-8. */
    OQ_EHELP = -20,     /**< Not an error: --help was asked for and printed. */
    OQ_EEXIST = -21,    /**< A row with that unique key exists already; nothing written. */
    OQ__ECOUNT = 22
};

/** Caller-owned error detail. Zero-initialise or call oq_error_clear(). */
typedef struct oq_error {
    int code;      /**< OQ_E* (negative) or 0. */
    int cause;     /**< SQLite rc, rd_kafka_resp_err_t or errno; 0 if none. */
    int retriable; /**< Non-zero when the same operation may succeed if retried. */
    char msg[256]; /**< Human-readable, NUL-terminated. */
} oq_error_t;

/** @brief Reset \p err (NULL is allowed). */
void oq_error_clear(oq_error_t *err);

/**
 * @brief Fill \p err (may be NULL) and return \p code, so callers write
 *        `return oq_error_set(err, OQ_EINVAL, 0, "bad %s", x);`.
 * Retriable is set for OQ_EBUSY and OQ_ETIMEDOUT; use oq_error_set_retriable() otherwise.
 */
int oq_error_set(oq_error_t *err, int code, int cause, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/** @brief As oq_error_set() with an explicit retriable flag. */
int oq_error_set_retriable(oq_error_t *err, int code, int cause, int retriable, const char *fmt,
                           ...) __attribute__((format(printf, 5, 6)));

/** @brief Stable lowercase name of a code ("invalid", "db", "conflict", ...). */
const char *oq_error_name(int code);

/** @brief Short English description of a code. */
const char *oq_strerror(int code);

#endif
