/*
 * client.c: the entry points of oq_client.h that work on a caller's connection and are not
 * rules (those are in decide.c: oq_producer_submit_in_tx, oq_store_fail_dead_letters):
 * migrate and the two lookups.
 *
 * libonceq is built from this file, decide.c, store.c, submit.c and call.c (with common's
 * SQLite, JSON, envelope, id and error code): it needs SQLite, jansson and libcrypto only.
 * These three therefore stay out of producer.c, whose oq_producer_t brings the writer thread
 * and the metrics registry (and with it libmicrohttpd) along.
 */
#include "producer_int.h"

int oq_producer_migrate(sqlite3 *db, oq_error_t *err)
{
    return oq_db_migrate(db, oq_migrations_producer, err);
}

int oq_store_get(sqlite3 *db, const char *call_id, oq_call_t *out, oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL};
    return oq__producer_store_get(&s, call_id, out, err);
}

int oq_store_get_by_key(sqlite3 *db, const char *tenant, const char *idem_key, oq_call_t *out,
                        oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL};
    return oq__producer_store_get_by_key(&s, tenant, idem_key, out, err);
}
