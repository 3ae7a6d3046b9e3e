/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The producer's store on both backends, with the same test bodies: each body runs once on a
 * temporary SQLite file and once on PostgreSQL (a fresh database on ONCEQ_TEST_PG_URL; that
 * group is skipped, exit 77, without it, and fails under CI=true). The bodies go through the
 * rules (decide.c, by oq__submit_in_store) and the row operations of producer_store.h only;
 * what each backend stores is counted with one SQL helper that names the table.
 *
 * Covered: new / replay / conflict in one transaction; rollback leaves no call and no outbox
 * row, commit leaves exactly one; a taken call id is reported and the transaction stays usable
 * (PostgreSQL aborts a transaction on a failed statement: the store must not raise one); the
 * result inbox dedupes by message id; a retryable failure resets on the next submit (a second
 * outbox row); audit in order; republish of a pending row writes nothing, of a missing row
 * appends it; retention purges a settled expired call with its rows and never a pending one;
 * the counts; webhooks: a settling result of a call with a callback_url queues its delivery in
 * the same transaction (a rollback leaves none), with GET's call JSON as body, and no other
 * result does; due, mark, dead list, redrive and counts of the delivery rows; the task rows
 * (insert once per key, get by id and key, update, steps with their calls' state, links of a
 * call found inside and outside a batch of results read ahead, one linked in mid-batch too,
 * compensation retries due, the list's pages, counts, recovery counts); on PostgreSQL, a task
 * read in a transaction is locked until its end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_pg.h"
#include "pg_fixture.h"
#include "producer_int.h"

typedef struct {
    int pg;
    char dir[64];
    sqlite3 *db;
    PGconn *conn;
    oq__producer_store_t s;
} fx_t;

static char pg_conninfo[2048];

static int setup_sqlite(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    oq_error_t err = {0};
    snprintf(f->dir, sizeof f->dir, "/tmp/oq-pstore-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    char path[128];
    snprintf(path, sizeof path, "%s/calls.db", f->dir);
    oq_db_opts_t o = {.synchronous = "OFF"};
    assert_int_equal(oq_db_open(path, &o, &f->db, &err), 0);
    assert_int_equal(oq_producer_migrate(f->db, &err), 0);
    f->s = (oq__producer_store_t){f->db, NULL, NULL};
    *state = f;
    return 0;
}

static int setup_pg(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    oq_error_t err = {0};
    f->pg = 1;
    assert_int_equal(oq_pg_connect(pg_conninfo, &f->conn, &err), 0);
    assert_int_equal(oq_pg_migrate(f->conn, &err), 0);
    assert_int_equal(oq_pg_exec(f->conn,
                                "TRUNCATE onceq.calls, onceq.outbox, onceq.audit, "
                                "onceq.result_inbox, onceq.outbox_dead, onceq.webhook_deliveries, "
                                "onceq.tasks, onceq.task_steps, onceq.task_calls",
                                &err),
                     0);
    f->s = (oq__producer_store_t){NULL, NULL, f->conn};
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    if (f->db) {
        sqlite3_close_v2(f->db);
        char cmdline[160];
        snprintf(cmdline, sizeof cmdline, "rm -rf %s", f->dir);
        if (system(cmdline) != 0) fprintf(stderr, "could not remove %s\n", f->dir);
    }
    if (f->conn) PQfinish(f->conn);
    free(f);
    return 0;
}

static void begin(fx_t *f)
{
    oq_error_t err = {0};
    if (f->pg)
        assert_int_equal(oq_pg_exec(f->conn, "BEGIN", &err), 0);
    else
        assert_int_equal(oq_db_begin_immediate(f->db, 1000, &err), 0);
}

static void commit(fx_t *f)
{
    oq_error_t err = {0};
    if (f->pg)
        assert_int_equal(oq_pg_exec(f->conn, "COMMIT", &err), 0);
    else
        assert_int_equal(oq_db_commit(f->db, &err), 0);
}

static void rollback(fx_t *f)
{
    if (f->pg)
        oq_pg_exec(f->conn, "ROLLBACK", NULL);
    else
        oq_db_rollback(f->db);
}

/* count(*) of \p table (onceq.\p table on PostgreSQL) WHERE \p where. */
static int64_t count(fx_t *f, const char *table, const char *where)
{
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s%s WHERE %s", f->pg ? "onceq." : "", table,
             where ? where : "true");
    int64_t n = -1;
    if (f->pg) {
        PGresult *r = PQexec(f->conn, sql);
        assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
        n = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
    } else {
        sqlite3_stmt *st = NULL;
        assert_int_equal(sqlite3_prepare_v2(f->db, sql, -1, &st, NULL), SQLITE_OK);
        if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    return n;
}

static int submit(fx_t *f, const char *key, int amount, oq_call_t *c, oq_submit_outcome_t *oc)
{
    oq_error_t err = {0};
    json_t *args = json_pack("{s:i, s:s}", "amount", amount, "note", "caf\xc3\xa9 \"x\"");
    oq_submit_req_t req = {NULL, key, "charge", args, NULL, 0, 0, NULL};
    int rc = oq__submit_in_store(&f->s, &req, 0, c, oc, &err);
    json_decref(args);
    return rc;
}

static void test_new_replay_conflict(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0}, b = {0}, c = {0};
    oq_submit_outcome_t oc = 0;
    /* outside a transaction: refused, nothing written */
    assert_int_equal(submit(f, "k1", 1, &a, &oc), OQ_ESTATE);
    begin(f);
    assert_int_equal(submit(f, "k1", 1, &a, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_NEW);
    assert_int_equal(submit(f, "k1", 1, &b, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_REPLAY);
    assert_string_equal(a.call_id, b.call_id);
    assert_int_equal(submit(f, "k1", 2, &c, &oc), OQ_ECONFLICT);
    commit(f);
    assert_int_equal(count(f, "calls", NULL), 1);
    assert_int_equal(count(f, "outbox", NULL), 1);
    /* what was stored reads back byte for byte */
    oq_call_t g = {0};
    oq_error_t err = {0};
    assert_int_equal(oq__producer_store_get(&f->s, a.call_id, &g, &err), 0);
    assert_string_equal(g.args, a.args);
    assert_string_equal(g.fingerprint, a.fingerprint);
    assert_string_equal(g.state, "pending");
    oq_call_clear(&g);
    assert_int_equal(oq__producer_store_get_by_key(&f->s, NULL, "k1", &g, &err), 0);
    assert_string_equal(g.call_id, a.call_id);
    oq_call_clear(&g);
    assert_int_equal(oq__producer_store_get(&f->s, "c_nope", &g, &err), OQ_ENOTFOUND);
    oq_call_clear(&a);
    oq_call_clear(&b);
    oq_call_clear(&c);
}

static void test_rollback_commit(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0};
    oq_submit_outcome_t oc = 0;
    begin(f);
    assert_int_equal(submit(f, "order-1", 9, &a, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_NEW);
    rollback(f);
    oq_call_clear(&a);
    assert_int_equal(count(f, "calls", NULL), 0);
    assert_int_equal(count(f, "outbox", NULL), 0);
    begin(f);
    assert_int_equal(submit(f, "order-1", 9, &a, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_NEW);
    commit(f);
    oq_call_clear(&a);
    assert_int_equal(count(f, "calls", NULL), 1);
    assert_int_equal(count(f, "outbox", NULL), 1);
}

static void test_id_taken(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0};
    oq_submit_outcome_t oc = 0;
    oq_error_t err = {0};
    begin(f);
    assert_int_equal(submit(f, "k-a", 1, &a, &oc), 0);
    oq__producer_new_call_t c = {.call_id = a.call_id,
                                 .tenant = "default",
                                 .idem_key = "k-b",
                                 .fingerprint = a.fingerprint,
                                 .tool = "charge",
                                 .args = "{}",
                                 .args_len = 2,
                                 .created_at = 1,
                                 .expires_at = 2,
                                 .message_id = "m-id-taken",
                                 .payload = "{}",
                                 .payload_len = 2};
    oq__producer_insert_t res = 0;
    assert_int_equal(oq__producer_store_insert_call(&f->s, &c, &res, &err), 0);
    assert_int_equal(res, OQ__INSERT_ID_TAKEN);
    c.idem_key = "k-a";
    c.call_id = "c_other";
    assert_int_equal(oq__producer_store_insert_call(&f->s, &c, &res, &err), 0);
    assert_int_equal(res, OQ__INSERT_KEY_EXISTS);
    /* the transaction is intact: more work and a commit */
    oq_call_clear(&a);
    assert_int_equal(submit(f, "k-c", 1, &a, &oc), 0);
    commit(f);
    oq_call_clear(&a);
    assert_int_equal(count(f, "calls", NULL), 2);
    assert_int_equal(count(f, "outbox", NULL), 2);
}

static void test_results_and_retry(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0};
    oq_submit_outcome_t oc = 0;
    oq_error_t err = {0};
    begin(f);
    assert_int_equal(submit(f, "k-r", 1, &a, &oc), 0);
    commit(f);
    begin(f);
    int claimed = -1;
    oq__producer_inbox_row_t in = {"m-r-1", a.call_id, "failed", "applied", 5};
    assert_int_equal(oq__producer_store_claim_result(&f->s, &in, &claimed, &err), 0);
    assert_int_equal(claimed, 1);
    assert_int_equal(oq__producer_store_claim_result(&f->s, &in, &claimed, &err), 0);
    assert_int_equal(claimed, 0);
    oq__producer_result_t r = {
        a.call_id, "failed", NULL, "{\"code\":\"x\",\"message\":\"m\",\"retryable\":true}",
        "e-1",     6,        1,    0};
    assert_int_equal(oq__producer_store_set_result(&f->s, &r, &err), 0);
    assert_int_equal(oq__producer_store_audit_add(&f->s, 6, a.call_id, "result", "{\"n\":1}", &err),
                     0);
    assert_int_equal(oq__producer_store_audit_add(&f->s, 7, a.call_id, "second", NULL, &err), 0);
    commit(f);
    oq__producer_call_state_t st;
    int found = 0;
    assert_int_equal(oq__producer_store_get_state(&f->s, a.call_id, &st, &found, &err), 0);
    assert_true(found);
    assert_string_equal(st.state, "failed");
    assert_int_equal(st.attempt, 1);
    assert_int_equal(oq__producer_store_get_state(&f->s, "c_none", &st, &found, &err), 0);
    assert_false(found);
    oq_audit_row_t *rows = NULL;
    size_t n = 0;
    assert_int_equal(oq__producer_store_audit_list(&f->s, a.call_id, &rows, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(rows[0].event, "result");
    assert_string_equal(rows[0].detail, "{\"n\":1}");
    assert_null(rows[1].detail);
    oq_audit_free(rows, n);
    /* a retryable failure: the same submit resets the call to a second attempt */
    oq_call_t b = {0};
    begin(f);
    assert_int_equal(submit(f, "k-r", 1, &b, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_RETRY_RESET);
    commit(f);
    assert_string_equal(b.call_id, a.call_id);
    assert_int_equal(b.attempt, 2);
    assert_int_equal(count(f, "outbox", NULL), 2);
    assert_int_equal(count(f, "calls", "state='pending' AND attempt=2"), 1);
    /* a reset of a call that is not failed at that attempt: OQ_ESTATE, nothing written */
    begin(f);
    oq__producer_attempt_t at = {a.call_id, 2, 9, 10, "m-r-x", "{}", 2};
    assert_int_equal(oq__producer_store_reset_call(&f->s, &at, &err), OQ_ESTATE);
    commit(f);
    assert_int_equal(count(f, "outbox", NULL), 2);
    oq_call_clear(&a);
    oq_call_clear(&b);
}

static void test_republish(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_outbox_republish_t what = 0;
    begin(f);
    assert_int_equal(
        oq__producer_store_republish(&f->s, "m-rp-1", "c_rp", "{\"a\":1}", 7, 5, &what, &err), 0);
    assert_int_equal(what, OQ_OUTBOX_APPENDED);
    assert_int_equal(
        oq__producer_store_republish(&f->s, "m-rp-1", "c_rp", "{\"a\":1}", 7, 6, &what, &err), 0);
    assert_int_equal(what, OQ_OUTBOX_PENDING);
    commit(f);
    assert_int_equal(count(f, "outbox", "message_id='m-rp-1'"), 1);
}

static void test_purge(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0}, b = {0};
    oq_submit_outcome_t oc = 0;
    oq_error_t err = {0};
    begin(f);
    assert_int_equal(submit(f, "k-done", 1, &a, &oc), 0);
    assert_int_equal(submit(f, "k-open", 1, &b, &oc), 0);
    oq__producer_result_t r = {a.call_id, "succeeded", "{}", NULL, "e", a.created_at + 1, 1, 0};
    assert_int_equal(oq__producer_store_set_result(&f->s, &r, &err), 0);
    assert_int_equal(oq__producer_store_audit_add(&f->s, 1, a.call_id, "x", NULL, &err), 0);
    commit(f);
    oq_purge_stats_t ps = {0};
    int more = 0;
    /* far in the future: every key expired */
    int64_t later = a.expires_at + 1000;
    assert_int_equal(oq__producer_store_purge_batch(&f->s, later, 1000, 100, &ps, &more, &err), 0);
    assert_int_equal(ps.calls, 1);
    assert_int_equal(ps.audit, 1);
    assert_int_equal(count(f, "calls", NULL), 1);
    oq_call_t g = {0};
    assert_int_equal(oq__producer_store_get(&f->s, b.call_id, &g, &err), 0); /* pending stays */
    oq_call_clear(&g);
    oq__producer_counts_t ct;
    assert_int_equal(oq__producer_store_counts(&f->s, OQ__COUNTS_ALL, &ct, &err), 0);
    assert_int_equal(ct.calls, 1);
    assert_int_equal(ct.pending, 1);
    assert_int_equal(ct.succeeded, 0);
    assert_int_equal(ct.oldest_pending_created_at, b.created_at);
    /* the oldest pending call is found in either partial index of the open calls: b with a
     * redrive scheduled (calls_redrive), a newer c without (calls_unheard); the gauges read
     * no distinct effects */
    oq_call_t c = {0};
    begin(f);
    oq__producer_redrive_mark_t mk = {b.call_id, 1, b.created_at + 60000, NULL};
    assert_int_equal(oq__producer_store_redrive_mark(&f->s, &mk, &err), 0);
    assert_int_equal(submit(f, "k-newer", 1, &c, &oc), 0);
    commit(f);
    assert_true(c.created_at >= b.created_at);
    assert_int_equal(oq__producer_store_counts(&f->s, OQ__COUNTS_GAUGES, &ct, &err), 0);
    assert_int_equal(ct.pending, 2);
    assert_int_equal(ct.oldest_pending_created_at, b.created_at);
    assert_int_equal(ct.effects, 0);
    begin(f);
    mk.next_redrive_at = 0;
    assert_int_equal(oq__producer_store_redrive_mark(&f->s, &mk, &err), 0);
    oq__producer_result_t rb = {b.call_id, "succeeded", "{}", NULL, "e2", b.created_at + 1, 1, 0};
    assert_int_equal(oq__producer_store_set_result(&f->s, &rb, &err), 0);
    commit(f);
    assert_int_equal(oq__producer_store_counts(&f->s, OQ__COUNTS_ALL, &ct, &err), 0);
    assert_int_equal(ct.oldest_pending_created_at, c.created_at);
    assert_int_equal(ct.effects, 1);
    oq_call_clear(&a);
    oq_call_clear(&b);
    oq_call_clear(&c);
}

/* One tool_result for \p call_id at attempt 1, applied by the rules (decide.c). */
static oq_result_outcome_t result(fx_t *f, const char *mid, const char *call_id, const char *status,
                                  int64_t now)
{
    oq_envelope_t env;
    memset(&env, 0, sizeof env);
    env.v = OQ_ENVELOPE_VERSION;
    env.kind = OQ_KIND_TOOL_RESULT;
    snprintf(env.message_id, sizeof env.message_id, "%s", mid);
    snprintf(env.call_id, sizeof env.call_id, "%s", call_id);
    env.attempt = 1;
    env.created_at = now;
    env.status = (char *)status;
    env.result = json_pack("{s:s}", "charge_id", "ch_1");
    oq_result_outcome_t oc = 0;
    oq_error_t err = {0};
    assert_int_equal(oq__decide_results(&f->s, &env, 1, &oc, now, 0, &err), 0);
    json_decref(env.result);
    return oc;
}

static void test_webhook_rows(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_call_t a = {0}, b = {0}, c = {0};
    oq_submit_outcome_t oc = 0;
    json_t *args = json_pack("{s:i}", "amount", 7);
    oq_submit_req_t req = {.idem_key = "k-hook",
                           .tool = "charge",
                           .args = args,
                           .callback_url = "https://hooks.example.com/onceq?x=1"};
    begin(f);
    assert_int_equal(oq__submit_in_store(&f->s, &req, 0, &a, &oc, &err), 0);
    assert_int_equal(submit(f, "k-plain", 1, &b, &oc), 0);
    req.idem_key = "k-review";
    assert_int_equal(oq__submit_in_store(&f->s, &req, 0, &c, &oc, &err), 0);
    commit(f);
    json_decref(args);
    assert_string_equal(a.callback_url, "https://hooks.example.com/onceq?x=1");
    assert_null(b.callback_url);
    /* the delivery is written in the transaction that settles the call: a rollback, none */
    begin(f);
    assert_int_equal(result(f, "m-h-1", a.call_id, "succeeded", 100), OQ_RESULT_APPLIED);
    assert_int_equal(count(f, "webhook_deliveries", NULL), 1);
    rollback(f);
    assert_int_equal(count(f, "webhook_deliveries", NULL), 0);
    assert_int_equal(count(f, "calls", "state='pending'"), 3);
    begin(f);
    assert_int_equal(result(f, "m-h-1", a.call_id, "succeeded", 100), OQ_RESULT_APPLIED);
    assert_int_equal(result(f, "m-h-1", a.call_id, "succeeded", 101), OQ_RESULT_DUPLICATE);
    assert_int_equal(result(f, "m-h-2", b.call_id, "succeeded", 100), OQ_RESULT_APPLIED);
    assert_int_equal(result(f, "m-h-3", c.call_id, "needs_review", 100), OQ_RESULT_APPLIED);
    commit(f);
    /* one delivery: the settled call with a callback; none for the call without one, none for
     * needs_review (not settled) */
    assert_int_equal(count(f, "webhook_deliveries", NULL), 1);
    oq__producer_delivery_t due[4];
    int n = 0;
    assert_int_equal(oq__producer_store_delivery_due(&f->s, 99, 4, due, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(oq__producer_store_delivery_due(&f->s, 100, 4, due, &n, &err), 0);
    assert_int_equal(n, 1);
    oq__producer_delivery_t *d = &due[0];
    assert_string_equal(d->call_id, a.call_id);
    assert_string_equal(d->state, "pending");
    assert_string_equal(d->url, "https://hooks.example.com/onceq?x=1");
    assert_string_equal(d->tenant, "default");
    assert_int_equal(d->attempt, 1);
    assert_int_equal(d->tries, 0);
    assert_int_equal(d->last_status, -1);
    /* the body is GET's call JSON, as the call stands settled */
    oq_call_t now = {0};
    char *text = NULL;
    assert_int_equal(oq__producer_store_get(&f->s, a.call_id, &now, &err), 0);
    assert_int_equal(oq_call_render(&now, &text, NULL), 0);
    assert_string_equal(d->body, text);
    assert_non_null(strstr(text, "\"status\":\"succeeded\""));
    free(text);
    oq_call_clear(&now);
    /* a failed try: pending again later; then dead */
    oq__webhook_policy_t pol = {3, 3600000, 1000, 4000};
    oq__webhook_try_t t = {500, -1, "HTTP 500"};
    oq__producer_delivery_mark_t m;
    oq__decide_webhook_try(d, &t, &pol, 200, &m);
    assert_string_equal(m.state, "pending");
    assert_int_equal(m.tries, 1);
    assert_in_range(m.next_at, 200 + 500, 200 + 1000);
    begin(f);
    assert_int_equal(oq__decide_webhook_marks(&f->s, &m, 1, &err), 0);
    commit(f);
    int n2 = 0;
    oq__producer_delivery_t due2[2];
    assert_int_equal(oq__producer_store_delivery_due(&f->s, 200, 2, due2, &n2, &err), 0);
    assert_int_equal(n2, 0);
    d->tries = 2; /* as stored after a second failure: the third is the last */
    oq__webhook_try_t none = {0, -1, "connection refused"};
    oq__decide_webhook_try(d, &none, &pol, 5000, &m);
    assert_string_equal(m.state, "dead");
    assert_int_equal(m.tries, 3);
    begin(f);
    assert_int_equal(oq__decide_webhook_marks(&f->s, &m, 1, &err), 0);
    commit(f);
    oq__producer_delivery_t *rows = NULL;
    size_t nr = 0;
    assert_int_equal(oq__producer_store_delivery_list(&f->s, NULL, "dead", 10, &rows, &nr, &err),
                     0);
    assert_int_equal(nr, 1);
    assert_string_equal(rows[0].delivery_id, d->delivery_id);
    assert_string_equal(rows[0].last_error, "connection refused");
    assert_int_equal(rows[0].last_status, -1);
    oq__producer_delivery_clear(&rows[0]);
    free(rows);
    int64_t pending = -1, oldest = -1, dead = -1;
    assert_int_equal(oq__producer_store_delivery_counts(&f->s, &pending, &oldest, &dead, &err), 0);
    assert_int_equal(pending, 0);
    assert_int_equal(dead, 1);
    /* the operator's redrive: pending, a fresh budget, due now; once only */
    int changed = -1;
    begin(f);
    assert_int_equal(
        oq__producer_store_delivery_redrive(&f->s, d->delivery_id, 6000, &changed, &err), 0);
    assert_int_equal(changed, 1);
    assert_int_equal(
        oq__producer_store_delivery_redrive(&f->s, d->delivery_id, 6000, &changed, &err), 0);
    assert_int_equal(changed, 0);
    commit(f);
    assert_int_equal(
        count(f, "webhook_deliveries", "state='pending' AND tries=0 AND created_at=6000"), 1);
    /* a 2xx: delivered; a mark of a delivery no longer pending changes nothing */
    oq__webhook_try_t ok = {204, -1, ""};
    d->tries = 0;
    oq__decide_webhook_try(d, &ok, &pol, 7000, &m);
    assert_string_equal(m.state, "delivered");
    begin(f);
    assert_int_equal(oq__producer_store_delivery_mark(&f->s, &m, &changed, &err), 0);
    assert_int_equal(changed, 1);
    assert_int_equal(oq__producer_store_delivery_mark(&f->s, &m, &changed, &err), 0);
    assert_int_equal(changed, 0);
    commit(f);
    assert_int_equal(oq__producer_store_delivery_counts(&f->s, &pending, &oldest, &dead, &err), 0);
    assert_int_equal(pending + dead, 0);
    /* a call's deliveries, any state (the console's call page); none for a call without one */
    assert_int_equal(oq__producer_store_delivery_of_call(&f->s, a.call_id, &rows, &nr, &err), 0);
    assert_int_equal(nr, 1);
    assert_string_equal(rows[0].delivery_id, d->delivery_id);
    assert_string_equal(rows[0].state, "delivered");
    assert_int_equal(rows[0].last_status, 204);
    oq__producer_delivery_clear(&rows[0]);
    free(rows);
    assert_int_equal(oq__producer_store_delivery_of_call(&f->s, b.call_id, &rows, &nr, &err), 0);
    assert_int_equal(nr, 0);
    free(rows);
    oq__producer_delivery_clear(d);
    oq_call_clear(&a);
    oq_call_clear(&b);
    oq_call_clear(&c);
}

static void task_row(oq__task_row_t *t, const char *id, const char *key, const char *status,
                     int64_t at)
{
    memset(t, 0, sizeof *t);
    snprintf(t->task_id, sizeof t->task_id, "%s", id);
    t->tenant = (char *)"default";
    t->idem_key = (char *)key;
    snprintf(t->fingerprint, sizeof t->fingerprint, "%064d", 7);
    t->spec = (char *)"{\"steps\":[]}";
    snprintf(t->status, sizeof t->status, "%s", status);
    t->created_at = t->updated_at = at;
}

#define TID(c) "t_0000000000000000000000000000000" c

static void test_task_rows(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_call_t a = {0}, b = {0};
    oq_submit_outcome_t oc = 0;
    oq__task_row_t t, g;
    int exists = -1;
    begin(f);
    assert_int_equal(submit(f, "task-1/a", 1, &a, &oc), 0);
    assert_int_equal(submit(f, "task-1/b", 2, &b, &oc), 0);
    task_row(&t, TID("1"), "task-1", "running", 100);
    assert_int_equal(oq__task_store_insert(&f->s, &t, &exists, &err), 0);
    assert_int_equal(exists, 0);
    task_row(&t, TID("9"), "task-1", "running", 100); /* the same key: nothing written */
    assert_int_equal(oq__task_store_insert(&f->s, &t, &exists, &err), 0);
    assert_int_equal(exists, 1);
    task_row(&t, TID("2"), "task-2", "running", 200);
    assert_int_equal(oq__task_store_insert(&f->s, &t, &exists, &err), 0);
    task_row(&t, TID("3"), "task-3", "compensated", 300);
    assert_int_equal(oq__task_store_insert(&f->s, &t, &exists, &err), 0);
    oq__task_step_row_t st = {0};
    st.idx = 0;
    st.name = (char *)"a";
    snprintf(st.status, sizeof st.status, "pending");
    assert_int_equal(oq__task_store_step_put(&f->s, TID("1"), &st, &err), 0);
    snprintf(st.status, sizeof st.status, "running");
    snprintf(st.call_id, sizeof st.call_id, "%s", a.call_id);
    assert_int_equal(oq__task_store_step_put(&f->s, TID("1"), &st, &err), 0); /* replaces */
    st.idx = 1;
    st.name = (char *)"b";
    st.call_id[0] = '\0';
    snprintf(st.status, sizeof st.status, "compensated");
    snprintf(st.comp_call_id, sizeof st.comp_call_id, "%s", b.call_id);
    st.comp_attempts = 2;
    st.comp_next_at = 500;
    assert_int_equal(oq__task_store_step_put(&f->s, TID("1"), &st, &err), 0);
    assert_int_equal(oq__task_store_link(&f->s, a.call_id, TID("1"), 0, "step", &err), 0);
    assert_int_equal(oq__task_store_link(&f->s, a.call_id, TID("2"), 5, "step", &err),
                     0); /* kept */
    commit(f);
    /* get by id and by key */
    assert_int_equal(oq__task_store_get(&f->s, NULL, NULL, "task-1", &g, &err), 0);
    assert_string_equal(g.task_id, TID("1"));
    assert_string_equal(g.spec, "{\"steps\":[]}");
    assert_int_equal(g.created_at, 100);
    assert_null(g.reason);
    oq__task_row_clear(&g);
    assert_int_equal(oq__task_store_get(&f->s, TID("8"), NULL, NULL, &g, &err), OQ_ENOTFOUND);
    assert_int_equal(oq__task_store_get(&f->s, NULL, "other", "task-1", &g, &err), OQ_ENOTFOUND);
    /* update */
    begin(f);
    task_row(&t, TID("2"), "task-2", "needs_review", 200);
    t.reason = (char *)"why";
    t.updated_at = 250;
    t.review_fence = 3;
    assert_int_equal(oq__task_store_update(&f->s, &t, &err), 0);
    commit(f);
    assert_int_equal(oq__task_store_get(&f->s, TID("2"), NULL, NULL, &g, &err), 0);
    assert_string_equal(g.status, "needs_review");
    assert_string_equal(g.reason, "why");
    assert_int_equal(g.updated_at, 250);
    assert_int_equal(g.review_fence, 3);
    oq__task_row_clear(&g);
    /* steps, with their calls' state */
    oq__task_step_row_t *v = NULL;
    size_t n = 0;
    assert_int_equal(oq__task_store_steps(&f->s, TID("1"), &v, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(v[0].name, "a");
    assert_string_equal(v[0].status, "running");
    assert_string_equal(v[0].call_id, a.call_id);
    assert_string_equal(v[0].call_state, "pending");
    assert_int_equal(v[0].call_attempt, 1);
    assert_string_equal(v[0].comp_call_id, "");
    assert_string_equal(v[0].comp_state, "");
    assert_string_equal(v[1].comp_call_id, b.call_id);
    assert_string_equal(v[1].comp_state, "pending");
    assert_int_equal(v[1].comp_attempts, 2);
    assert_int_equal(v[1].comp_next_at, 500);
    oq__task_steps_free(v, n);
    /* a call's task, outside a batch of results */
    char tid[OQ_TASK_ID_LEN + 1];
    int idx = -1, is_comp = -1, found = -1;
    assert_int_equal(oq__task_store_of_call(&f->s, a.call_id, tid, &idx, &is_comp, &found, &err),
                     0);
    assert_true(found);
    assert_string_equal(tid, TID("1"));
    assert_int_equal(idx, 0);
    assert_false(is_comp);
    assert_int_equal(oq__task_store_of_call(&f->s, b.call_id, tid, &idx, &is_comp, &found, &err),
                     0);
    assert_false(found);
    /* inside a batch read ahead: a's link found, b's linked during the batch found too */
    oq_envelope_t env[2];
    memset(env, 0, sizeof env);
    for (int i = 0; i < 2; i++) {
        env[i].kind = OQ_KIND_TOOL_RESULT;
        snprintf(env[i].call_id, sizeof env[i].call_id, "%s", i ? b.call_id : a.call_id);
        snprintf(env[i].message_id, sizeof env[i].message_id, "m-task-%d", i);
    }
    begin(f);
    assert_int_equal(oq__producer_store_results_ahead(&f->s, env, 2, &err), 0);
    assert_int_equal(oq__task_store_of_call(&f->s, b.call_id, tid, &idx, &is_comp, &found, &err),
                     0);
    assert_false(found);
    assert_int_equal(oq__task_store_of_call(&f->s, a.call_id, tid, &idx, &is_comp, &found, &err),
                     0);
    assert_true(found);
    assert_string_equal(tid, TID("1"));
    assert_int_equal(oq__task_store_link(&f->s, b.call_id, TID("1"), 1, "compensate", &err), 0);
    assert_int_equal(oq__task_store_of_call(&f->s, b.call_id, tid, &idx, &is_comp, &found, &err),
                     0);
    assert_true(found);
    assert_int_equal(idx, 1);
    assert_true(is_comp);
    assert_int_equal(oq__producer_store_results_done(&f->s, &err), 0);
    commit(f);
    /* compensation retries due */
    char ids[4][OQ_TASK_ID_LEN + 1];
    int ix[4], nd = -1;
    assert_int_equal(oq__task_store_due(&f->s, 499, 4, ids, ix, &nd, &err), 0);
    assert_int_equal(nd, 0);
    assert_int_equal(oq__task_store_due(&f->s, 500, 4, ids, ix, &nd, &err), 0);
    assert_int_equal(nd, 1);
    assert_string_equal(ids[0], TID("1"));
    assert_int_equal(ix[0], 1);
    /* the list: newest first, pages without a gap, filters */
    char **l = NULL;
    int64_t next = 0;
    oq__task_list_q_t lq = {NULL, NULL, NULL, 0, 2};
    assert_int_equal(oq__task_store_list(&f->s, &lq, &l, &n, &next, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(l[0], TID("3"));
    assert_string_equal(l[1], TID("2"));
    assert_true(next > 0);
    for (size_t i = 0; i < n; i++)
        free(l[i]);
    free(l);
    lq.before = next;
    assert_int_equal(oq__task_store_list(&f->s, &lq, &l, &n, &next, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(l[0], TID("1"));
    assert_int_equal(next, 0);
    free(l[0]);
    free(l);
    oq__task_list_q_t ls = {"needs_review", "default", NULL, 0, 10};
    assert_int_equal(oq__task_store_list(&f->s, &ls, &l, &n, &next, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(l[0], TID("2"));
    free(l[0]);
    free(l);
    /* counts and the recovery counts (a step linked to a second call counts as re-run) */
    int64_t by[OQ_TASK_NSTATUS], ok = -1, review = -1, op = -1, rerun = -1;
    assert_int_equal(oq__task_store_counts(&f->s, NULL, by, &ok, &review, &err), 0);
    assert_int_equal(by[0], 1); /* running */
    assert_int_equal(by[3], 1); /* compensated */
    assert_int_equal(by[5], 1); /* needs_review */
    assert_int_equal(ok, 1);
    assert_int_equal(review, 0);
    assert_int_equal(oq__task_store_counts(&f->s, "other", by, &ok, &review, &err), 0);
    assert_int_equal(by[0] + by[3] + by[5] + ok, 0);
    begin(f);
    assert_int_equal(oq__task_store_link(&f->s, "c_other", TID("1"), 0, "step", &err), 0);
    commit(f);
    assert_int_equal(oq__task_store_recovery(&f->s, &op, &rerun, &err), 0);
    assert_int_equal(op, 1);
    assert_int_equal(rerun, 1);
    assert_int_equal(count(f, "task_calls", NULL), 3);
    oq_call_clear(&a);
    oq_call_clear(&b);
}

/* PostgreSQL only: a task read inside a transaction is locked until its end (FOR UPDATE), so a
 * second transaction that reads it to change it waits (here: gives up after lock_timeout);
 * outside a transaction a read takes no lock. */
static void test_task_lock_pg(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq__task_row_t t, g;
    int exists = 0;
    begin(f);
    task_row(&t, TID("1"), "lock-1", "running", 100);
    assert_int_equal(oq__task_store_insert(&f->s, &t, &exists, &err), 0);
    commit(f);
    PGconn *c2 = NULL;
    assert_int_equal(oq_pg_connect(pg_conninfo, &c2, &err), 0);
    assert_int_equal(oq_pg_exec(c2, "SET lock_timeout = '200ms'", &err), 0);
    oq__producer_store_t s2 = {NULL, NULL, c2};
    begin(f);
    assert_int_equal(oq__task_store_get(&f->s, TID("1"), NULL, NULL, &g, &err), 0);
    oq__task_row_clear(&g);
    /* outside a transaction: read, no lock taken or waited for */
    assert_int_equal(oq__task_store_get(&s2, NULL, NULL, "lock-1", &g, &err), 0);
    oq__task_row_clear(&g);
    /* inside one: waits for the first, by id and by key */
    assert_int_equal(oq_pg_exec(c2, "BEGIN", &err), 0);
    assert_int_not_equal(oq__task_store_get(&s2, TID("1"), NULL, NULL, &g, &err), 0);
    oq_pg_exec(c2, "ROLLBACK", NULL);
    assert_int_equal(oq_pg_exec(c2, "BEGIN", &err), 0);
    assert_int_not_equal(oq__task_store_get(&s2, NULL, NULL, "lock-1", &g, &err), 0);
    oq_pg_exec(c2, "ROLLBACK", NULL);
    /* the first ends: the second reads what it committed */
    task_row(&t, TID("1"), "lock-1", "succeeded", 100);
    t.updated_at = 150;
    assert_int_equal(oq__task_store_update(&f->s, &t, &err), 0);
    commit(f);
    assert_int_equal(oq_pg_exec(c2, "BEGIN", &err), 0);
    assert_int_equal(oq__task_store_get(&s2, TID("1"), NULL, NULL, &g, &err), 0);
    assert_string_equal(g.status, "succeeded");
    oq__task_row_clear(&g);
    oq_pg_exec(c2, "ROLLBACK", NULL);
    PQfinish(c2);
}

#define BOTH(setup)                                                                                \
    {                                                                                              \
        cmocka_unit_test_setup_teardown(test_new_replay_conflict, setup, teardown),                \
            cmocka_unit_test_setup_teardown(test_rollback_commit, setup, teardown),                \
            cmocka_unit_test_setup_teardown(test_id_taken, setup, teardown),                       \
            cmocka_unit_test_setup_teardown(test_results_and_retry, setup, teardown),              \
            cmocka_unit_test_setup_teardown(test_republish, setup, teardown),                      \
            cmocka_unit_test_setup_teardown(test_purge, setup, teardown),                          \
            cmocka_unit_test_setup_teardown(test_webhook_rows, setup, teardown),                   \
            cmocka_unit_test_setup_teardown(test_task_rows, setup, teardown),                      \
    }

int main(void)
{
    const struct CMUnitTest sqlite_tests[] = BOTH(setup_sqlite);
    int rc = cmocka_run_group_tests_name("producer_store_sqlite", sqlite_tests, NULL, NULL);
    if (rc) return rc;
    pgfx_available(1);
    pgfx_fresh_db("onceq_test_producer_store", pg_conninfo, sizeof pg_conninfo);
    const struct CMUnitTest pg_tests[] = BOTH(setup_pg);
    rc = cmocka_run_group_tests_name("producer_store_postgres", pg_tests, NULL, NULL);
    if (rc) return rc;
    const struct CMUnitTest pg_only[] = {
        cmocka_unit_test_setup_teardown(test_task_lock_pg, setup_pg, teardown)};
    return cmocka_run_group_tests_name("producer_store_postgres_only", pg_only, NULL, NULL);
}
