/* SPDX-License-Identifier: Apache-2.0 */
/*
 * query.c: the operators' list of calls (oq_store_list, for `onceq console`). The rows come
 * from producer/store.c (oq__producer_store_list and friends: the SQL is there, beside every
 * other statement of the producer); this file only picks the lookup: one call by id, one key
 * in one tenant or in each tenant in turn (the (tenant, idem_key) index, walked tenant by
 * tenant, so a key search never scans the table), or a filtered page, and renders the calls
 * with oq_call_to_json, the one writer of a call's JSON. The same lookups serve both backends
 * (oq_store_list on an SQLite connection, oq_producer_db_list on either): positions are the
 * store's (see oq__producer_store_list).
 */
#include <stdlib.h>
#include <string.h>

#include "oq_producer.h"
#include "producer_store.h"

#define MAX_TENANTS_SEARCHED 10000

static int push_call(json_t *a, const oq_call_t *c, oq_error_t *err)
{
    json_t *o = oq_call_to_json(c);
    if (!o || json_array_append_new(a, o) != 0)
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    return 0;
}

static int by_key(oq__producer_store_t *s, const char *tenant, const char *key, json_t *a,
                  oq_error_t *err)
{
    oq_call_t c;
    int rc = oq__producer_store_get_by_key(s, tenant, key, &c, err);
    if (rc == OQ_ENOTFOUND) return 0;
    if (rc) return rc;
    rc = push_call(a, &c, err);
    oq_call_clear(&c);
    return rc;
}

static int list_in_store(oq__producer_store_t *s, const oq_call_query_t *q, json_t **out,
                         oq_error_t *err);

int oq_store_list(sqlite3 *db, const oq_call_query_t *q, json_t **out, oq_error_t *err)
{
    oq__producer_store_t s = {db, NULL, NULL};
    return list_in_store(&s, q, out, err);
}

int oq_producer_db_list(const oq_dbh_t *h, const oq_call_query_t *q, json_t **out, oq_error_t *err)
{
    oq__producer_store_t s = oq__producer_store_of(h);
    return list_in_store(&s, q, out, err);
}

static int list_in_store(oq__producer_store_t *s, const oq_call_query_t *q, json_t **out,
                         oq_error_t *err)
{
    json_t *a = json_array(), *next = json_null();
    int rc = 0;
    if (!a) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (q->limit < 1 || q->limit > 500) {
        rc = oq_error_set(err, OQ_EINVAL, 0, "limit: 1..500");
        goto out;
    }
    if (q->call_id) {
        oq_call_t c;
        rc = oq__producer_store_get(s, q->call_id, &c, err);
        if (rc == OQ_ENOTFOUND) {
            rc = 0;
        } else if (rc == 0) {
            if (!q->tenant || strcmp(q->tenant, c.tenant) == 0) rc = push_call(a, &c, err);
            oq_call_clear(&c);
        }
    } else if (q->idem_key && q->tenant) {
        rc = by_key(s, q->tenant, q->idem_key, a, err);
    } else if (q->idem_key) {
        char t[OQ_MAX_NAME_LEN + 1] = "";
        for (int i = 0; i < MAX_TENANTS_SEARCHED && rc == 0; i++) {
            char prev[OQ_MAX_NAME_LEN + 1];
            memcpy(prev, t, sizeof prev);
            if ((rc = oq__producer_store_next_tenant(s, prev, t, err)) != 0 || !t[0]) break;
            rc = by_key(s, t, q->idem_key, a, err);
        }
    } else {
        oq__producer_list_q_t lq = {q->state,    q->tool,   q->tenant, q->since_ms,
                                    q->until_ms, q->before, 0,         q->limit};
        oq__producer_listed_t *v = NULL;
        size_t n = 0;
        int64_t nx = 0;
        /* a time range is a range of positions: rowids follow creation */
        if (q->until_ms) {
            int64_t p;
            if ((rc = oq__producer_store_pos_at(s, q->until_ms + 1, &p, err)) != 0) goto out;
            if (!lq.before || p + 1 < lq.before) lq.before = p + 1;
        }
        if (q->since_ms && (rc = oq__producer_store_pos_at(s, q->since_ms, &lq.floor, err)) != 0)
            goto out;
        if (lq.floor > 0) lq.floor -= lq.floor > 1000 ? 1000 : lq.floor; /* clock slack */
        if ((rc = oq__producer_store_list(s, &lq, &v, &n, &nx, err)) != 0) goto out;
        for (size_t i = 0; i < n && rc == 0; i++)
            rc = push_call(a, &v[i].call, err);
        oq__producer_listed_free(v, n);
        if (nx > 0) {
            json_decref(next);
            next = json_integer(nx);
        }
    }
out:
    if (rc) {
        json_decref(a);
        json_decref(next);
        return rc;
    }
    *out = json_pack("{s:o, s:o}", "calls", a, "next", next);
    return *out ? 0 : oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
}
