/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dbh.c: the operator's database handle (oq_dbh.h). Opening is the only backend-specific part
 * of an operator's command: the setting picks SQLite or PostgreSQL, a password in it is
 * refused before anything connects, and PostgreSQL's schema is checked the way oq_db_open()
 * checks an SQLite file's (missing: run `onceq migrate`; newer than this binary: refused).
 * Operator tools never migrate PostgreSQL themselves: that is `onceq migrate`'s or a daemon's.
 */
#include "oq_dbh.h"

#include <string.h>

oq_dbh_t oq_dbh_sqlite(sqlite3 *db)
{
    oq_dbh_t h = {OQ_BACKEND_SQLITE, db, NULL, 1};
    return h;
}

const char *oq_dbh_label(const char *setting)
{
    return oq_backend_of(setting) == OQ_BACKEND_POSTGRES ? "PostgreSQL" : setting;
}

int oq_dbh_open(const char *setting, const oq_db_opts_t *opts, oq_dbh_t *h, oq_error_t *err)
{
    memset(h, 0, sizeof *h);
    if (oq_backend_of(setting) != OQ_BACKEND_POSTGRES) {
        h->backend = OQ_BACKEND_SQLITE;
        return oq_db_open(setting, opts, &h->db, err);
    }
    h->backend = OQ_BACKEND_POSTGRES;
    if (oq_pg_conninfo_has_password(setting))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "the PostgreSQL connection string holds a password: put it in a "
                            "passfile (passfile=... in the string, or PGPASSFILE)");
    int rc = oq_pg_connect(setting, &h->pg, err), version = 0, known = 0;
    if (rc) return rc;
    while (oq_migrations_postgres[known])
        known++;
    if ((rc = oq_pg_schema_version(h->pg, &version, err)) != 0) goto fail;
    if (version == 0) {
        rc = oq_error_set(err, OQ_ENOTFOUND, 0,
                          "no schema onceq in this database (onceq migrate --db URL)");
        goto fail;
    }
    if (version > known) {
        rc = oq_error_set(err, OQ_EVERSION, 0,
                          "schema onceq version %d is newer than this binary (%d); "
                          "upgrade onceq (nothing was changed)",
                          version, known);
        goto fail;
    }
    if (opts && opts->readonly &&
        (rc = oq_pg_exec(h->pg, "SET default_transaction_read_only = on", err)) != 0)
        goto fail;
    return 0;
fail:
    oq_dbh_close(h);
    return rc;
}

void oq_dbh_close(oq_dbh_t *h)
{
    if (!h) return;
    if (h->db && !h->borrowed) sqlite3_close_v2(h->db);
    if (h->pg) PQfinish(h->pg);
    memset(h, 0, sizeof *h);
}
