/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ledger.h
 * @brief Internal: the test downstream's SQLite ledger (rows only; the rules live in
 *        server.c). Every payment the service commits is one row of `payments`; the ledger
 *        is what the duplicate side-effect rate is counted from.
 *
 * @locality A ledger handle belongs to one thread at a time (the writer, or the reader that
 *           took it from the pool); SQLite connections are opened NOMUTEX.
 */
#ifndef OQ_DOWNSTREAM_LEDGER_H
#define OQ_DOWNSTREAM_LEDGER_H

#include <jansson.h>
#include <sqlite3.h>
#include <stdint.h>

#include "oq_db.h"
#include "oq_error.h"

#define OQ__DS_ID_LEN 20   /**< "pay_" + 16 lowercase hex */
#define OQ__DS_MAX_KEY 255 /**< idempotency keys and references: 1..255 printable bytes */

/** One payment row. Strings are owned by the struct (oq__ds_payment_clear frees them). */
typedef struct oq__ds_payment {
    int64_t seq;                /**< commit order */
    char id[OQ__DS_ID_LEN + 1]; /**< "pay_<16 hex>" */
    char *idem_key;             /**< as received; NULL when the request had none */
    char *reference;            /**< the request's "reference" field; NULL when absent */
    int64_t amount;
    char currency[16];
    char *request;      /**< canonical JSON of the request body */
    int honoured;       /**< 1 when the key was honoured for this request */
    int64_t created_at; /**< unix ms */
} oq__ds_payment_t;

/** @brief Free the strings of \p p and zero it; accepts NULL. */
void oq__ds_payment_clear(oq__ds_payment_t *p);

typedef struct oq__ledger oq__ledger_t;

/**
 * @brief Open (and create or migrate) the ledger at \p path: WAL, \p synchronous level
 *        ("FULL" when NULL). \p readonly opens an existing file without writing.
 * @returns 0 with \p out set, or OQ_EDB / OQ_EIO / OQ_EVERSION with \p err filled.
 */
int oq__ledger_open(const char *path, const char *synchronous, int readonly, oq__ledger_t **out,
                    oq_error_t *err);
/** @brief Close; accepts NULL. */
void oq__ledger_close(oq__ledger_t *l);

/** @brief BEGIN IMMEDIATE / COMMIT / ROLLBACK on the ledger's connection. */
int oq__ledger_begin(oq__ledger_t *l, oq_error_t *err);
int oq__ledger_commit(oq__ledger_t *l, oq_error_t *err);
void oq__ledger_rollback(oq__ledger_t *l);

/**
 * @brief The first payment (lowest seq) recorded with idempotency key \p key.
 * @returns 0 with \p out filled (caller clears it), OQ_ENOTFOUND, or OQ_EDB/OQ_EBUSY.
 */
int oq__ledger_find_by_key(oq__ledger_t *l, const char *key, oq__ds_payment_t *out, int *count,
                           oq_error_t *err);
/** @brief As oq__ledger_find_by_key() by the "reference" field. \p count may be NULL. */
int oq__ledger_find_by_ref(oq__ledger_t *l, const char *ref, oq__ds_payment_t *out, int *count,
                           oq_error_t *err);
/** @brief The payment with id \p id. @returns 0, OQ_ENOTFOUND, or OQ_EDB/OQ_EBUSY. */
int oq__ledger_get(oq__ledger_t *l, const char *id, oq__ds_payment_t *out, oq_error_t *err);

/**
 * @brief Insert \p p (its id and created_at are set by the caller; seq is filled here).
 * @remark The caller holds the write transaction (oq__ledger_begin()).
 */
int oq__ledger_insert(oq__ledger_t *l, oq__ds_payment_t *p, oq_error_t *err);

/**
 * @brief Effect counts read from the ledger: effects, logical calls (rows grouped by
 *        idempotency key, else reference, else id), duplicate effects = effects - logical
 *        calls, DSR = duplicates / logical calls, and the keys and references with more than
 *        one effect (at most \p top of each, most effects first).
 * @param out a new JSON object (caller json_decref()s it).
 */
int oq__ledger_stats(oq__ledger_t *l, int top, json_t **out, oq_error_t *err);

#endif
