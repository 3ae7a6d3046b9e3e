/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_dbh.h
 * @brief A database an operator's tool reads or changes, on either backend: the one handle
 *        `onceq get/inspect/stats/purge/review/dlq` and `onceq console` open from their
 *        --db / --producer-db setting (a file path is SQLite, a libpq URI or keyword string is
 *        PostgreSQL: oq_backend_of). The stages' operator functions (oq_producer_db_*,
 *        oq_relay_db_*, oq_inspect_call) take it and hand it to their store, which runs the
 *        statement of its backend: one code path per action, whatever the backend.
 *
 * Caller-allocated, like libuv's handles: oq_dbh_open() fills it, oq_dbh_close() releases it.
 * A password in the setting is refused (it would be on a command line, visible to every user
 * of the host): it belongs in a passfile. The setting itself is never put in an error message;
 * oq_dbh_label() names the database for messages.
 */
#ifndef OQ_DBH_H
#define OQ_DBH_H

#include <sqlite3.h>
#include <stddef.h>

#include "oq_db.h"
#include "oq_error.h"
#include "oq_pg.h"

typedef struct oq_dbh {
    oq_backend_t backend;
    sqlite3 *db;  /**< SQLite: owned (borrowed when made by oq_dbh_sqlite) */
    PGconn *pg;   /**< PostgreSQL: owned */
    int borrowed; /**< oq_dbh_sqlite(): close leaves the connection alone */
} oq_dbh_t;

/**
 * @brief Open the database \p setting names.
 * @param opts SQLite's options (NULL: defaults); opts->readonly also makes a PostgreSQL session
 *        read-only (default_transaction_read_only), so a read-only command cannot write.
 * SQLite files are opened as oq_db_open() does (the schema guard included). On PostgreSQL the
 * schema `onceq` must exist (`onceq migrate --db URL`, or a daemon's start) and be no newer
 * than this binary.
 * @returns 0 with \p h filled; OQ_EINVAL (a password in the setting: nothing connected),
 *          OQ_EDB (cannot connect; retriable), OQ_ENOTFOUND (no schema onceq), OQ_EVERSION,
 *          OQ_EIO. \p h is left closed on failure (oq_dbh_close() on it is harmless).
 */
int oq_dbh_open(const char *setting, const oq_db_opts_t *opts, oq_dbh_t *h, oq_error_t *err);

/** @brief A handle over a caller's SQLite connection (borrowed: close does not close it). */
oq_dbh_t oq_dbh_sqlite(sqlite3 *db);

/** @brief Close \p h (NULL, or never opened: nothing). */
void oq_dbh_close(oq_dbh_t *h);

/** @brief How messages name the database \p setting: the file path for SQLite, "PostgreSQL"
 *         for a connection string (never echoed: it may name a passfile or a user). */
const char *oq_dbh_label(const char *setting);

#endif
