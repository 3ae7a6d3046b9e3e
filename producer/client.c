/* SPDX-License-Identifier: Apache-2.0 */
/*
 * client.c: the entry points of oq_client.h that work on a caller's connection and are not
 * rules (those are in decide.c: oq_producer_submit_in_tx, oq_store_fail_dead_letters):
 * migrate and the two lookups.
 *
 * libonceq is built from this file, decide.c, store.c, submit.c and call.c (with common's
 * SQLite and PostgreSQL store code, JSON, envelope, id and error code): it needs SQLite,
 * libpq, jansson and libcrypto only.
 * These three therefore stay out of producer.c, whose oq_producer_t brings the writer thread
 * and the metrics registry (and with it libmicrohttpd) along.
 */
#include "oq_pg.h"
#include "producer_int.h"

int oq_producer_migrate(sqlite3 *db, oq_error_t *err)
{
    return oq_db_migrate(db, oq_migrations_producer, err);
}

int oq_store_get(sqlite3 *db, const char *call_id, oq_call_t *out, oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    return oq__producer_store_get(&s, call_id, out, err);
}

int oq_store_get_by_key(sqlite3 *db, const char *tenant, const char *idem_key, oq_call_t *out,
                        oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    return oq__producer_store_get_by_key(&s, tenant, idem_key, out, err);
}

int oq_producer_migrate_pg(struct pg_conn *conn, oq_error_t *err)
{
    if (!conn) return oq_error_set(err, OQ_EINVAL, 0, "no PostgreSQL connection");
    return oq_pg_migrate(conn, err);
}

int oq_producer_submit_in_pgtx(struct pg_conn *conn, const oq_submit_req_t *req, int64_t key_ttl_ms,
                               oq_call_t *call, oq_submit_outcome_t *outcome, oq_error_t *err)
{
    if (!conn) return oq_error_set(err, OQ_EINVAL, 0, "no PostgreSQL connection");
    oq__producer_store_t s = {NULL, NULL, conn};
    return oq__submit_in_store(&s, req, key_ttl_ms, call, outcome, err);
}
