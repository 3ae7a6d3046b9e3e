/* SPDX-License-Identifier: Apache-2.0 */
/*
 * review.c: the operator's side of NEEDS_REVIEW (the API of oq_consumer.h used by
 * `onceq review` and by the worker's admin listener).
 *
 * An execution is NEEDS_REVIEW when no machine can tell whether its outside call happened
 * (execution.c, reconciliation): a downstream with neither keys nor a lookup lost an answer,
 * or its lookup kept failing. Only a person can decide, with what they can see elsewhere (the
 * provider's dashboard, a support ticket). This file lists that queue, shows one call's whole
 * story (the execution, its effect, every audit row), and records a decision: the rule itself
 * (oq__exec_resolve: fenced, audited, one result event) runs in one write transaction on the
 * effects database, so a resolution is either entirely written or not at all, and a racing
 * resolution or worker finds the fence moved. The result event goes out through the consumer's
 * outbox like any other, so the producer's call moves to the chosen end state once a worker's
 * relay publishes it.
 *
 * Every function opens its own connection (a short-lived store under the worker id
 * "review:<by>", the name the audit rows carry) and closes it: the CLI and the admin listener
 * call them from threads that own no store. A missing database is an error, never created.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "consumer_store.h"
#include "execution.h"
#include "oq_consumer.h"
#include "oq_pg.h"
#include "oq_util.h"

static int open_store(const char *db_path, const char *by, oq__consumer_store_t **s,
                      oq_error_t *err)
{
    struct stat sb;
    char who[128];
    if (!db_path || (oq_backend_of(db_path) != OQ_BACKEND_POSTGRES && stat(db_path, &sb) != 0))
        return oq_error_set(err, OQ_EIO, 0, "no consumer database at %s",
                            db_path ? db_path : "(none)");
    snprintf(who, sizeof(who), "review:%.100s", by && by[0] ? by : "operator");
    oq_db_opts_t o = {.busy_timeout_ms = 10000};
    return oq__consumer_store_open(db_path, &o, who, s, err);
}

/* A JSON text column as a value: parsed when it is JSON, else a string, NULL as null. */
static json_t *json_col(const char *text)
{
    if (!text) return json_null();
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    return v ? v : json_string(text);
}

static json_t *exec_json(const oq__exec_row_t *x)
{
    json_t *o = json_pack("{s:s, s:s*, s:s*, s:s*, s:s, s:I, s:I, s:I, s:s*, s:s*}", "call_id",
                          x->call_id, "tenant", x->tenant, "idem_key", x->idem_key, "tool", x->tool,
                          "state", oq__xstate_name(x->state), "attempt", (json_int_t)x->attempt,
                          "tries", (json_int_t)x->tries, "fence", (json_int_t)x->fence, "effect_id",
                          x->effect_id, "lease_owner", x->lease_owner);
    if (!o) return NULL;
    json_object_set_new(o, "args", json_col(x->args));
    json_object_set_new(o, "result", json_col(x->result));
    json_object_set_new(o, "error", json_col(x->error));
    json_object_set_new(o, "updated_at", json_integer(x->updated_at));
    json_object_set_new(o, "unknown_at", x->unknown_at ? json_integer(x->unknown_at) : json_null());
    json_object_set_new(o, "started_at", x->started_at ? json_integer(x->started_at) : json_null());
    json_object_set_new(o, "lookups", json_integer(x->lookups));
    json_object_set_new(o, "lease_until",
                        x->lease_until ? json_integer(x->lease_until) : json_null());
    return o;
}

int oq_review_list(const char *db_path, int limit, json_t **out, oq_error_t *err)
{
    oq__consumer_store_t *s = NULL;
    oq__exec_row_t *rows = NULL;
    int n = 0, rc;
    int64_t now;
    *out = NULL;
    if (limit <= 0 || limit > 10000) limit = 1000;
    if ((rc = open_store(db_path, NULL, &s, err))) return rc;
    now = oq__consumer_store_now(s); /* the clock of the rows' times */
    if (!(rows = calloc((size_t)limit, sizeof(*rows)))) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    if ((rc = oq__consumer_store_exec_in_state(s, OQ_X_NEEDS_REVIEW, rows, limit, &n, err)))
        goto out;
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        const oq__exec_row_t *x = &rows[i];
        json_t *e = x->error ? json_loads(x->error, 0, NULL) : NULL;
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *why = json_string_value(json_object_get(e, "message"));
        int64_t since = x->unknown_at ? x->unknown_at : x->updated_at;
        json_array_append_new(
            a, json_pack("{s:s, s:s*, s:s*, s:s*, s:I, s:I, s:f, s:s*, s:s*, s:I, s:I}", "call_id",
                         x->call_id, "tool", x->tool, "tenant", x->tenant, "idem_key", x->idem_key,
                         "attempt", (json_int_t)x->attempt, "since", (json_int_t)since, "age_s",
                         (double)(now - since) / 1000.0, "code", code, "why", why, "tries",
                         (json_int_t)x->tries, "fence", (json_int_t)x->fence));
        json_decref(e);
    }
    if (!a) rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    *out = a;
out:
    for (int i = 0; rows && i < n; i++)
        oq__exec_row_clear(&rows[i]);
    free(rows);
    oq__consumer_store_close(s);
    return rc;
}

static void audit_to_json(const oq__audit_read_t *a, void *opaque)
{
    json_array_append_new(
        (json_t *)opaque,
        json_pack("{s:I, s:I, s:s, s:I, s:I, s:s*, s:s*}", "id", (json_int_t)a->id, "ts",
                  (json_int_t)a->ts, "event", a->event, "attempt", (json_int_t)a->attempt, "fence",
                  (json_int_t)a->fence, "worker", a->worker, "detail", a->detail));
}

int oq_review_show(const char *db_path, const char *call_id, json_t **out, oq_error_t *err)
{
    oq__consumer_store_t *s = NULL;
    oq__exec_row_t x;
    oq__effect_read_t e;
    json_t *o = NULL, *tl = NULL;
    int rc, found = 0;
    memset(&x, 0, sizeof(x));
    memset(&e, 0, sizeof(e));
    *out = NULL;
    if ((rc = open_store(db_path, NULL, &s, err))) return rc;
    if ((rc = oq__consumer_store_exec_get(s, call_id, &x, err))) goto out;
    if ((rc = oq__consumer_store_effect_read(s, call_id, &found, &e, err))) goto out;
    if (!(o = json_object()) || !(tl = json_array())) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    if ((rc = oq__consumer_store_audit_list(s, call_id, audit_to_json, tl, err))) goto out;
    json_object_set_new(o, "execution", exec_json(&x));
    json_object_set_new(o, "effect",
                        found ? json_pack("{s:s*, s:s*, s:I, s:s*, s:o}", "effect_id", e.effect_id,
                                          "downstream_id", e.downstream_id, "created_at",
                                          (json_int_t)e.created_at, "worker", e.worker, "detail",
                                          json_col(e.detail))
                              : json_null());
    json_object_set_new(o, "timeline", tl);
    tl = NULL;
    *out = o;
    o = NULL;
out:
    json_decref(o);
    json_decref(tl);
    oq__effect_read_clear(&e);
    oq__exec_row_clear(&x);
    oq__consumer_store_close(s);
    return rc;
}

int oq_review_resolve(const char *db_path, const char *call_id, const char *as, const char *ref,
                      const char *note, const char *by, int64_t fence, json_t **out,
                      oq_error_t *err)
{
    oq__consumer_store_t *s = NULL;
    int rc, st = -1, kind;
    if (out) *out = NULL;
    if (!as) return oq_error_set(err, OQ_EINVAL, 0, "--as is required: committed, failed, retry");
    if (strcmp(as, "committed") == 0)
        kind = OQ__RESOLVE_COMMITTED;
    else if (strcmp(as, "failed") == 0)
        kind = OQ__RESOLVE_FAILED;
    else if (strcmp(as, "retry") == 0)
        kind = OQ__RESOLVE_RETRY;
    else
        return oq_error_set(err, OQ_EINVAL, 0, "--as %.40s: expected committed, failed or retry",
                            as);
    if (!call_id || !call_id[0]) return oq_error_set(err, OQ_EINVAL, 0, "which call_id?");
    if ((rc = open_store(db_path, by, &s, err))) return rc;
    if ((rc = oq__consumer_store_begin(s, err)) == 0) {
        rc = oq__exec_resolve(s, call_id, kind, ref, note, by && by[0] ? by : "operator", fence,
                              oq__consumer_store_now(s), &st, err);
        if (rc == 0) rc = oq__consumer_store_commit(s, err);
        if (rc) oq__consumer_store_rollback(s);
    }
    if (rc == 0 && out)
        *out = json_pack("{s:s, s:s, s:s}", "call_id", call_id, "resolved_as", as, "state",
                         oq__xstate_name(st));
    oq__consumer_store_close(s);
    return rc;
}
