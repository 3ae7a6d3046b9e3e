/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inspect.c: one call's story as one JSON document (oq_inspect_doc), the single source of
 * `onceq inspect --json` and of the console's call page, so both show the same rows in the
 * same order. The producer side is oq_producer_db_get and oq_producer_db_audit, on either
 * backend (creation is not an audit row: a "submitted" row is made from created_at); the consumer
 * side is oq_review_show (execution, effect with the downstream's id, audit rows with worker,
 * attempt and fence). The rows of both are merged by time; within one millisecond the producer's
 * come first. Beside them, the call's webhook deliveries (oq_producer_db_webhooks).
 *
 * A task's story (oq_inspect_task, `onceq inspect t_...` and the console's task page) is the
 * task as oq_producer_db_task_get renders it and one timeline of every step's and every
 * compensation's call, each call's rows (oq_inspect_call) tagged with its step and role and
 * merged by time.
 */
#include <stdlib.h>
#include <string.h>

#include "oq_console.h"
#include "oq_consumer.h"
#include "oq_producer.h"
#include "oq_tasks.h"

/* One timeline row from either database (strings borrowed). */
typedef struct {
    int64_t ts;
    int seq; /* order within its source */
    const char *from, *event, *detail, *worker;
    int64_t attempt, fence; /* -1: none */
} tl_row_t;

static int tl_cmp(const void *a, const void *b)
{
    const tl_row_t *x = a, *y = b;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    int fx = strcmp(x->from, "producer") != 0, fy = strcmp(y->from, "producer") != 0;
    if (fx != fy) return fx - fy; /* same millisecond: the producer's row first */
    return x->seq - y->seq;
}

static json_t *int_or_null(int64_t v)
{
    return v >= 0 ? json_integer(v) : json_null();
}

int oq_inspect_doc(sqlite3 *db, const char *consumer_db, const char *call_id, json_t **out,
                   oq_error_t *err)
{
    oq_dbh_t h = oq_dbh_sqlite(db);
    return oq_inspect_call(&h, consumer_db, call_id, out, err);
}

int oq_inspect_call(const oq_dbh_t *h, const char *consumer_db, const char *call_id, json_t **out,
                    oq_error_t *err)
{
    oq_call_t c = {0};
    oq_audit_row_t *rows = NULL;
    size_t n = 0, nt = 0;
    json_t *cons = NULL, *doc = NULL, *hooks = NULL;
    tl_row_t *tl = NULL;
    int rc = oq_producer_db_get(h, call_id, &c, err);
    if (rc) return rc;
    if ((rc = oq_producer_db_audit(h, call_id, &rows, &n, err)) != 0) goto out;
    if (consumer_db && (rc = oq_review_show(consumer_db, call_id, &cons, err)) != 0) {
        if (rc != OQ_ENOTFOUND) goto out;
        rc = 0;
    }
    if ((rc = oq_producer_db_webhooks(h, call_id, &hooks, err)) != 0) goto out;
    json_t *ctl = json_object_get(cons, "timeline");
    if (!(tl = calloc(n + json_array_size(ctl) + 1, sizeof *tl))) {
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    tl[nt++] = (tl_row_t){c.created_at, 0, "producer", "submitted", NULL, NULL, c.attempt, -1};
    for (size_t i = 0; i < n; i++)
        tl[nt++] = (tl_row_t){rows[i].ts,     (int)i + 1, "producer", rows[i].event,
                              rows[i].detail, NULL,       -1,         -1};
    for (size_t i = 0; i < json_array_size(ctl); i++) {
        json_t *r = json_array_get(ctl, i);
        tl[nt++] = (tl_row_t){json_integer_value(json_object_get(r, "ts")),
                              (int)i,
                              "consumer",
                              json_string_value(json_object_get(r, "event")),
                              json_string_value(json_object_get(r, "detail")),
                              json_string_value(json_object_get(r, "worker")),
                              json_integer_value(json_object_get(r, "attempt")),
                              json_integer_value(json_object_get(r, "fence"))};
    }
    qsort(tl, nt, sizeof *tl, tl_cmp);
    doc = json_pack("{s:o, s:o, s:[], s:O}", "call", oq_call_to_json(&c), "consumer",
                    cons ? json_pack("{s:O, s:O}", "execution", json_object_get(cons, "execution"),
                                     "effect", json_object_get(cons, "effect"))
                         : json_null(),
                    "timeline", "webhooks", hooks);
    json_t *a = json_object_get(doc, "timeline");
    for (size_t i = 0; a && i < nt; i++)
        if (json_array_append_new(
                a, json_pack("{s:I, s:s, s:s, s:s*, s:s*, s:o, s:o}", "ts", (json_int_t)tl[i].ts,
                             "from", tl[i].from, "event", tl[i].event ? tl[i].event : "?", "detail",
                             tl[i].detail, "worker", tl[i].worker, "attempt",
                             int_or_null(tl[i].attempt), "fence", int_or_null(tl[i].fence))) != 0)
            a = NULL;
    if (!a) {
        json_decref(doc);
        doc = NULL;
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        goto out;
    }
    *out = doc;
out:
    free(tl);
    json_decref(hooks);
    json_decref(cons);
    oq_audit_free(rows, n);
    oq_call_clear(&c);
    return rc;
}

/* One call's timeline rows, tagged with the step and role, appended to \p tl. */
static int add_call(const oq_dbh_t *h, const char *cdb, const char *call_id, const char *step,
                    const char *role, json_t *tl, oq_error_t *err)
{
    json_t *doc = NULL;
    int rc = oq_inspect_call(h, cdb, call_id, &doc, err);
    if (rc) return rc;
    json_t *rows = json_object_get(doc, "timeline");
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *r = json_array_get(rows, i);
        json_object_set_new(r, "step", json_string(step));
        json_object_set_new(r, "role", json_string(role));
        json_object_set_new(r, "call_id", json_string(call_id));
        if (json_array_append(tl, r)) rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    }
    json_decref(doc);
    return rc;
}

/* By time; rows of one time keep their order (the sort is on (ts, position)). */
typedef struct {
    json_t *row;
    size_t pos;
} tl_ref_t;

static int by_ts(const void *a, const void *b)
{
    const tl_ref_t *x = a, *y = b;
    json_int_t tx = json_integer_value(json_object_get(x->row, "ts"));
    json_int_t ty = json_integer_value(json_object_get(y->row, "ts"));
    if (tx != ty) return tx < ty ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static const char *jstr(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

int oq_inspect_task(const oq_dbh_t *h, const char *consumer_db, const char *task_id, json_t **out,
                    oq_error_t *err)
{
    json_t *task = NULL, *tl = json_array();
    tl_ref_t *v = NULL;
    if (!tl) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    int rc = oq_producer_db_task_get(h, task_id, NULL, NULL, &task, err);
    json_t *steps = json_object_get(task, "steps");
    for (size_t i = 0; !rc && i < json_array_size(steps); i++) {
        json_t *s = json_array_get(steps, i), *c = json_object_get(s, "compensation");
        const char *name = jstr(s, "name");
        if (json_is_string(json_object_get(s, "call_id")))
            rc = add_call(h, consumer_db, jstr(s, "call_id"), name, "step", tl, err);
        if (!rc && json_is_string(json_object_get(c, "call_id")))
            rc = add_call(h, consumer_db, jstr(c, "call_id"), name, "compensate", tl, err);
    }
    size_t n = json_array_size(tl);
    if (!rc && !(v = calloc(n ? n : 1, sizeof *v)))
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (rc) goto out;
    for (size_t i = 0; i < n; i++)
        v[i] = (tl_ref_t){json_incref(json_array_get(tl, i)), i};
    qsort(v, n, sizeof *v, by_ts);
    json_array_clear(tl);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(tl, v[i].row);
    if (!(*out = json_pack("{s:O,s:O}", "task", task, "timeline", tl)))
        rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
out:
    free(v);
    json_decref(task);
    json_decref(tl);
    return rc;
}
