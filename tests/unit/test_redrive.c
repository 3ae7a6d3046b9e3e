/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stuck-call redrive, below the processes: the outbox's republish (one row per message id: a
 * delivered row moves to the tail with its stored bytes, a pending one is left alone, a deleted
 * one is appended again), the producer's pass rules (decide.c) driven with a chosen clock on a
 * plain connection (never looked at -> due after redrive_after; waiting while the message is
 * still unpublished; republished with the same message id, audited, spaced exponentially;
 * deferred after a state change; terminal calls never; rebuilt envelope when retention deleted
 * the row; a call stored without a message id; bounded passes), the migration of an existing
 * calls.db, and the public pass through the writer.
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

#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_producer.h"
#include "producer_int.h"

typedef struct fx {
    char dir[64];
    char path[128];
    sqlite3 *db;
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    oq_error_t err = {0};
    snprintf(f->dir, sizeof f->dir, "/tmp/oq-test-redrive.XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/calls.db", f->dir);
    oq_db_opts_t o = {.synchronous = "OFF"};
    if (oq_db_open(f->path, &o, &f->db, &err) != 0) return -1;
    if (oq_producer_migrate(f->db, &err) != 0) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    char cmd[160];
    sqlite3_close_v2(f->db);
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0) return -1;
    free(f);
    return 0;
}

static int64_t q_int(sqlite3 *db, const char *fmt, ...)
{
    char sql[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    int64_t v = -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* The text \p sql selects, malloc()ed (NULL: no row or NULL). */
static char *q_text(sqlite3 *db, const char *fmt, ...)
{
    char sql[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    char *v = NULL;
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        v = strdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return v;
}

static void exec(sqlite3 *db, const char *fmt, ...)
{
    char sql[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    oq_error_t err = {0};
    if (oq_db_exec(db, sql, &err) != 0) fail_msg("%s: %s", sql, err.msg);
}

/* As if a relay had delivered every outbox row so far. */
static void delivered_all(sqlite3 *db)
{
    exec(db, "INSERT OR REPLACE INTO relay_lease(name, owner, fence, expires_at, published_seq) "
             "VALUES ('outbox', 'test', 1, 0, (SELECT COALESCE(max(seq), 0) FROM outbox))");
}

/* --- the outbox op ------------------------------------------------------------------------- */

static int republish(sqlite3 *db, const char *id, const char *payload, int64_t now,
                     oq_outbox_republish_t *what)
{
    oq_error_t err = {0};
    oq_outbox_row_t row = {id, "t", "k", payload, strlen(payload), now};
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    int rc = oq_outbox_republish(db, NULL, &row, what, &err);
    assert_int_equal(oq_db_commit(db, &err), 0);
    return rc;
}

static void test_outbox_republish(void **state)
{
    fx_t *f = *state;
    const char *id = "01900000-0000-7000-8000-000000000001";
    oq_outbox_republish_t what = 0;
    oq_error_t err = {0};
    /* no row: appended */
    assert_int_equal(republish(f->db, id, "{\"first\":1}", 100, &what), 0);
    assert_int_equal(what, OQ_OUTBOX_APPENDED);
    int64_t seq1 = q_int(f->db, "SELECT seq FROM outbox WHERE message_id='%s'", id);
    /* still above the watermark: nothing written */
    assert_int_equal(republish(f->db, id, "{\"other\":2}", 200, &what), 0);
    assert_int_equal(what, OQ_OUTBOX_PENDING);
    assert_int_equal(q_int(f->db, "SELECT count(*) FROM outbox"), 1);
    assert_int_equal(q_int(f->db, "SELECT seq FROM outbox WHERE message_id='%s'", id), seq1);
    /* delivered: the row moves to the tail, its stored bytes kept, the new time */
    delivered_all(f->db);
    assert_int_equal(republish(f->db, id, "{\"other\":2}", 300, &what), 0);
    assert_int_equal(what, OQ_OUTBOX_REQUEUED);
    assert_int_equal(q_int(f->db, "SELECT count(*) FROM outbox"), 1);
    int64_t seq2 = q_int(f->db, "SELECT seq FROM outbox WHERE message_id='%s'", id);
    assert_true(seq2 > seq1);
    char *p = q_text(f->db, "SELECT payload FROM outbox WHERE seq=%lld", (long long)seq2);
    assert_string_equal(p, "{\"first\":1}");
    free(p);
    assert_int_equal(q_int(f->db, "SELECT created_at FROM outbox WHERE seq=%lld", (long long)seq2),
                     300);
    assert_int_equal(q_int(f->db, "SELECT count(*) FROM outbox_unpublished"), 1);
    /* seq keeps growing after the move (AUTOINCREMENT: never reused) */
    oq_outbox_row_t other = {"01900000-0000-7000-8000-000000000002", "t", "k2", "{}", 2, 400};
    assert_int_equal(oq_outbox_append(f->db, NULL, &other, &err), 0);
    assert_true(q_int(f->db, "SELECT seq FROM outbox WHERE key='k2'") > seq2);
    /* retention deleted it: the given row is appended */
    delivered_all(f->db);
    exec(f->db, "DELETE FROM outbox WHERE message_id='%s'", id);
    assert_int_equal(republish(f->db, id, "{\"rebuilt\":3}", 500, &what), 0);
    assert_int_equal(what, OQ_OUTBOX_APPENDED);
    p = q_text(f->db, "SELECT payload FROM outbox WHERE message_id='%s'", id);
    assert_string_equal(p, "{\"rebuilt\":3}");
    free(p);
    /* a row with a field missing: refused, nothing written */
    oq_outbox_row_t bad = {NULL, "t", "k", "{}", 2, 1};
    assert_int_equal(oq_outbox_republish(f->db, NULL, &bad, &what, &err), OQ_EINVAL);
    assert_int_equal(q_int(f->db, "SELECT count(*) FROM outbox"), 2);
}

/* --- the producer's pass ------------------------------------------------------------------- */

static void submit(sqlite3 *db, const char *key, oq_call_t *out)
{
    oq_error_t err = {0};
    json_t *args = json_pack("{s:i}", "amount", 7);
    oq_submit_req_t req = {NULL, key, "charge", args, NULL, 0, 0, NULL};
    oq_submit_outcome_t oc;
    memset(out, 0, sizeof *out);
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    assert_int_equal(oq_producer_submit_in_tx(db, &req, 0, out, &oc, &err), 0);
    assert_int_equal(oq_db_commit(db, &err), 0);
    assert_int_equal(oc, OQ_SUBMIT_NEW);
    json_decref(args);
}

static oq_redrive_stats_t pass(sqlite3 *db, int64_t now, int64_t after, int limit)
{
    oq_error_t err = {0};
    oq_redrive_stats_t st;
    oq__producer_store_t s = {db, NULL, NULL};
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    if (oq__decide_redrive(&s, now, after, limit, &st, &err) != 0) fail_msg("pass: %s", err.msg);
    assert_int_equal(oq_db_commit(db, &err), 0);
    return st;
}

static void apply(sqlite3 *db, const char *call_id, const char *status, int64_t now)
{
    oq_error_t err = {0};
    oq_envelope_t e;
    oq_result_outcome_t oc = 0;
    memset(&e, 0, sizeof e);
    e.v = 1;
    e.kind = OQ_KIND_TOOL_RESULT;
    oq_id_uuid(e.message_id);
    snprintf(e.call_id, sizeof e.call_id, "%s", call_id);
    e.attempt = 1;
    e.status = (char *)status;
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    assert_int_equal(oq_store_apply_result(db, &e, now, &oc, &err), 0);
    assert_int_equal(oq_db_commit(db, &err), 0);
    assert_int_equal(oc, OQ_RESULT_APPLIED);
}

static void test_pass_rules(void **state)
{
    fx_t *f = *state;
    const int64_t after = 2000;
    oq_call_t a, b, c;
    submit(f->db, "ka", &a);
    submit(f->db, "kb", &b);
    submit(f->db, "kc", &c);
    int64_t t0 = q_int(f->db, "SELECT max(updated_at) FROM calls");
    int64_t first = q_int(f->db, "SELECT min(updated_at) FROM calls");
    char *mid_a = q_text(f->db, "SELECT message_id FROM calls WHERE call_id='%s'", a.call_id);
    assert_non_null(mid_a);
    char *orig = q_text(f->db, "SELECT payload FROM outbox WHERE message_id='%s'", mid_a);
    assert_non_null(orig);

    /* younger than redrive_after: nothing is due */
    oq_redrive_stats_t st = pass(f->db, first + after - 1, after, 100);
    assert_int_equal(st.redriven + st.waiting + st.deferred, 0);
    /* due, but no relay delivered anything yet: waiting, looked at again one spacing later */
    int64_t now = t0 + after;
    st = pass(f->db, now, after, 100);
    assert_int_equal(st.waiting, 3);
    assert_int_equal(st.redriven, 0);
    assert_int_equal(q_int(f->db,
                           "SELECT count(*) FROM calls WHERE next_redrive_at=%lld AND "
                           "redrive_count=0",
                           (long long)(now + after)),
                     3);
    assert_int_equal(q_int(f->db, "SELECT count(*) FROM outbox"), 3);
    assert_int_equal(q_int(f->db, "SELECT count(*) FROM audit WHERE event='redrive'"), 0);
    assert_int_equal(pass(f->db, now + after - 1, after, 100).waiting, 0);

    /* delivered (and lost): republished with the same message id, audited, spaced 2x */
    delivered_all(f->db);
    int64_t seq_a = q_int(f->db, "SELECT seq FROM outbox WHERE message_id='%s'", mid_a);
    now += after;
    st = pass(f->db, now, after, 100);
    assert_int_equal(st.redriven, 3);
    assert_int_equal(q_int(f->db, "SELECT count(*) FROM outbox"), 3);
    assert_true(q_int(f->db, "SELECT seq FROM outbox WHERE message_id='%s'", mid_a) > seq_a);
    char *p = q_text(f->db, "SELECT payload FROM outbox WHERE message_id='%s'", mid_a);
    assert_string_equal(p, orig);
    free(p);
    assert_int_equal(q_int(f->db,
                           "SELECT count(*) FROM calls WHERE redrive_count=1 AND "
                           "next_redrive_at=%lld",
                           (long long)(now + 2 * after)),
                     3);
    assert_int_equal(q_int(f->db,
                           "SELECT count(*) FROM audit WHERE call_id='%s' AND event='redrive' AND "
                           "json_extract(detail,'$.message_id')='%s' AND "
                           "json_extract(detail,'$.redrive')=1 AND "
                           "json_extract(detail,'$.attempt')=1 AND "
                           "json_extract(detail,'$.outbox')='requeued'",
                           a.call_id, mid_a),
                     1);
    /* the API's view of the call did not change: a redrive is not a state change */
    assert_int_equal(
        q_int(f->db, "SELECT count(*) FROM calls WHERE updated_at > %lld", (long long)t0), 0);

    /* a: terminal -> unscheduled, never redriven again; b: news (running) -> deferred */
    apply(f->db, a.call_id, "succeeded", now + 10);
    assert_int_equal(
        q_int(f->db, "SELECT next_redrive_at IS NULL FROM calls WHERE call_id='%s'", a.call_id), 1);
    apply(f->db, b.call_id, "running", now + 2 * after - 100);
    delivered_all(f->db);
    now += 2 * after;
    st = pass(f->db, now, after, 100);
    assert_int_equal(st.redriven, 1); /* c */
    assert_int_equal(st.deferred, 1); /* b */
    assert_int_equal(
        q_int(f->db, "SELECT next_redrive_at FROM calls WHERE call_id='%s'", b.call_id),
        now - 100 + after);
    assert_int_equal(q_int(f->db, "SELECT redrive_count FROM calls WHERE call_id='%s'", c.call_id),
                     2);
    assert_int_equal(
        q_int(f->db, "SELECT next_redrive_at FROM calls WHERE call_id='%s'", c.call_id),
        now + 4 * after);
    for (int i = 0; i < 5; i++)
        pass(f->db, now + 3600000LL * (i + 1), after, 100);
    assert_int_equal(q_int(f->db,
                           "SELECT count(*) FROM audit WHERE call_id='%s' AND event='redrive'",
                           a.call_id),
                     1);
    /* spacing is capped at max(redrive_after, 1 h) */
    exec(f->db, "UPDATE calls SET redrive_count=40, next_redrive_at=1 WHERE call_id='%s'",
         c.call_id);
    delivered_all(f->db);
    now += 10 * 3600000LL;
    pass(f->db, now, after, 100);
    assert_int_equal(
        q_int(f->db, "SELECT next_redrive_at FROM calls WHERE call_id='%s'", c.call_id),
        now + 3600000);

    /* retention deleted c's row: the envelope is rebuilt with the same id, call, attempt, args */
    char *mid_c = q_text(f->db, "SELECT message_id FROM calls WHERE call_id='%s'", c.call_id);
    char *orig_c = q_text(f->db, "SELECT payload FROM outbox WHERE message_id='%s'", mid_c);
    delivered_all(f->db);
    exec(f->db, "DELETE FROM outbox WHERE message_id='%s'", mid_c);
    exec(f->db, "UPDATE calls SET next_redrive_at=1 WHERE call_id='%s'", c.call_id);
    pass(f->db, now + 1, after, 100);
    char *rebuilt = q_text(f->db, "SELECT payload FROM outbox WHERE message_id='%s'", mid_c);
    assert_non_null(rebuilt);
    oq_envelope_t e1, e2;
    oq_error_t err = {0};
    assert_int_equal(oq_envelope_decode(orig_c, strlen(orig_c), &e1, &err), 0);
    assert_int_equal(oq_envelope_decode(rebuilt, strlen(rebuilt), &e2, &err), 0);
    assert_string_equal(e1.message_id, e2.message_id);
    assert_string_equal(e1.call_id, e2.call_id);
    assert_string_equal(e1.fingerprint, e2.fingerprint);
    assert_string_equal(e1.tenant, e2.tenant);
    assert_string_equal(e1.idem_key, e2.idem_key);
    assert_string_equal(e1.tool, e2.tool);
    assert_int_equal(e1.attempt, e2.attempt);
    assert_true(json_equal(e1.args, e2.args));
    oq_envelope_clear(&e1);
    oq_envelope_clear(&e2);

    /* a call stored without a message id (written before the migration, row gone): one is
     * drawn, stored, and used from then on */
    exec(f->db, "UPDATE calls SET message_id=NULL, next_redrive_at=1 WHERE call_id='%s'",
         c.call_id);
    delivered_all(f->db);
    pass(f->db, now + 2, after, 100);
    char *mid_new = q_text(f->db, "SELECT message_id FROM calls WHERE call_id='%s'", c.call_id);
    assert_non_null(mid_new);
    assert_string_not_equal(mid_new, mid_c);
    assert_int_equal(q_int(f->db, "SELECT count(*) FROM outbox WHERE message_id='%s'", mid_new), 1);

    /* redrive off: a pass does nothing */
    exec(f->db, "UPDATE calls SET next_redrive_at=1 WHERE call_id='%s'", c.call_id);
    st = pass(f->db, now + 3, 0, 100);
    assert_int_equal(st.redriven + st.waiting + st.deferred, 0);
    free(mid_new);
    free(rebuilt);
    free(mid_c);
    free(orig_c);
    free(mid_a);
    free(orig);
    oq_call_clear(&a);
    oq_call_clear(&b);
    oq_call_clear(&c);
}

/* A pass looks at no more than its limit; the rest waits for the next one. */
static void test_pass_bounded(void **state)
{
    fx_t *f = *state;
    for (int i = 0; i < 7; i++) {
        char key[16];
        oq_call_t c;
        snprintf(key, sizeof key, "b%d", i);
        submit(f->db, key, &c);
        oq_call_clear(&c);
    }
    delivered_all(f->db);
    int64_t now = q_int(f->db, "SELECT max(updated_at) FROM calls") + 1000;
    assert_int_equal(pass(f->db, now, 1000, 3).redriven, 3);
    assert_int_equal(pass(f->db, now, 1000, 3).redriven, 3);
    assert_int_equal(pass(f->db, now, 1000, 3).redriven, 1);
    assert_int_equal(pass(f->db, now, 1000, 3).redriven, 0);
    assert_int_equal(q_int(f->db, "SELECT count(*) FROM calls WHERE redrive_count=1"), 7);
}

/* A retry-reset starts the new attempt unheard: new message id, count 0, no schedule. */
static void test_retry_reset_restarts(void **state)
{
    fx_t *f = *state;
    oq_call_t c, again;
    submit(f->db, "rr", &c);
    exec(f->db,
         "UPDATE calls SET state='failed', redrive_count=3, next_redrive_at=NULL, "
         "error='{\"code\":\"x\",\"message\":\"y\",\"retryable\":true}' WHERE call_id='%s'",
         c.call_id);
    char *mid1 = q_text(f->db, "SELECT message_id FROM calls WHERE call_id='%s'", c.call_id);
    oq_error_t err = {0};
    json_t *args = json_pack("{s:i}", "amount", 7);
    oq_submit_req_t req = {NULL, "rr", "charge", args, NULL, 0, 0, NULL};
    oq_submit_outcome_t oc;
    memset(&again, 0, sizeof again);
    assert_int_equal(oq_db_begin_immediate(f->db, 1000, &err), 0);
    assert_int_equal(oq_producer_submit_in_tx(f->db, &req, 0, &again, &oc, &err), 0);
    assert_int_equal(oq_db_commit(f->db, &err), 0);
    assert_int_equal(oc, OQ_SUBMIT_RETRY_RESET);
    char *mid2 = q_text(f->db, "SELECT message_id FROM calls WHERE call_id='%s'", c.call_id);
    assert_string_not_equal(mid1, mid2);
    assert_int_equal(q_int(f->db, "SELECT count(*) FROM outbox WHERE message_id='%s'", mid2), 1);
    assert_int_equal(q_int(f->db,
                           "SELECT redrive_count=0 AND next_redrive_at IS NULL FROM calls WHERE "
                           "call_id='%s'",
                           c.call_id),
                     1);
    free(mid1);
    free(mid2);
    json_decref(args);
    oq_call_clear(&c);
    oq_call_clear(&again);
}

/* --- migration and the public pass --------------------------------------------------------- */

/* A calls.db of the previous version (4 migrations) with an open and a finished call: the
 * migration keeps the open call's message id and both indexes hold what they should. */
static void test_migration(void **state)
{
    fx_t *f = *state;
    char path[160];
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    snprintf(path, sizeof path, "%s/old.db", f->dir);
    assert_int_equal(oq_db_open(path, NULL, &db, &err), 0);
    const char *texts[5];
    for (int i = 0; i < 4; i++)
        texts[i] = oq_sql_file(oq_migrations_producer[i]);
    texts[4] = NULL;
    assert_int_equal(oq_db_migrate_sql(db, texts, &err), 0);
    assert_int_equal(oq_db_user_version(db), 4);
    exec(db, "INSERT INTO calls(call_id,tenant,idem_key,fingerprint,tool,args,state,created_at,"
             "updated_at,expires_at) VALUES ('c_0000000000000001','default','o','f','charge','{}',"
             "'pending',10,10,99999999999999), ('c_0000000000000002','default','d','f','charge',"
             "'{}','succeeded',10,20,99999999999999)");
    exec(db, "INSERT INTO outbox(message_id,topic,key,payload,created_at) VALUES "
             "('01900000-0000-7000-8000-00000000000a','onceq.tool-calls','c_0000000000000001',"
             "'{}',10), ('01900000-0000-7000-8000-00000000000b','onceq.tool-calls',"
             "'c_0000000000000001','{}',11), ('01900000-0000-7000-8000-00000000000c',"
             "'onceq.tool-calls','c_0000000000000002','{}',12)");
    assert_int_equal(oq_producer_migrate(db, &err), 0);
    char *m = q_text(db, "SELECT message_id FROM calls WHERE call_id='c_0000000000000001'");
    assert_string_equal(m, "01900000-0000-7000-8000-00000000000b"); /* the newest row */
    free(m);
    assert_int_equal(
        q_int(db, "SELECT message_id IS NULL FROM calls WHERE call_id='c_0000000000000002'"), 1);
    /* the open call is due for a first look (unheard), the finished one is in no index */
    oq__producer_store_t s = {db, NULL, NULL};
    oq__producer_redrive_row_t rows[4];
    int n = 0;
    assert_int_equal(oq__producer_store_redrive_due(&s, 1000, 1000, 4, rows, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(rows[0].call_id, "c_0000000000000001");
    oq__producer_redrive_row_clear(&rows[0]);
    sqlite3_close_v2(db);
}

/* oq_producer_redrive through the writer: the same pass, its counts, and the metric. */
static void test_producer_api(void **state)
{
    fx_t *f = *state;
    char path[160];
    oq_error_t err = {0};
    oq_producer_t *p = NULL;
    oq_metrics_t *m = oq_metrics_new();
    snprintf(path, sizeof path, "%s/api.db", f->dir);
    oq_producer_opts_t o;
    memset(&o, 0, sizeof o);
    o.metrics = m;
    o.redrive_after_ms = 50;
    assert_int_equal(oq_producer_open(path, &o, &p, &err), 0);
    json_t *args = json_pack("{s:i}", "amount", 1);
    oq_submit_req_t req = {NULL, "api", "charge", args, NULL, 0, 0, NULL};
    assert_int_equal(oq_producer_submit(p, &req, NULL, NULL, &err), 0);
    oq_redrive_stats_t st;
    assert_int_equal(oq_producer_redrive(p, 0, &st, &err), 0);
    assert_int_equal(st.redriven + st.waiting, 0); /* too young */
    usleep(100 * 1000);
    assert_int_equal(oq_producer_redrive(p, 0, &st, &err), 0);
    assert_int_equal(st.waiting, 1); /* no relay here: still unpublished */
    sqlite3 *db = NULL;
    assert_int_equal(oq_db_open(path, NULL, &db, &err), 0);
    delivered_all(db);
    exec(db, "UPDATE calls SET next_redrive_at=1");
    assert_int_equal(oq_producer_redrive(p, 0, &st, &err), 0);
    assert_int_equal(st.redriven, 1);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(oq_metrics_render(m, &text, &len), 0);
    assert_non_null(strstr(text, "onceq_producer_redrives_total 1\n"));
    free(text);
    sqlite3_close_v2(db);
    oq_producer_close(p);
    /* off: passes do nothing */
    o.redrive_after_ms = -1;
    assert_int_equal(oq_producer_open(path, &o, &p, &err), 0);
    usleep(60 * 1000);
    assert_int_equal(oq_producer_redrive(p, 0, &st, &err), 0);
    assert_int_equal(st.redriven + st.waiting + st.deferred, 0);
    oq_producer_close(p);
    json_decref(args);
    oq_metrics_destroy(m);
}

int main(void)
{
    oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_outbox_republish, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pass_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pass_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retry_reset_restarts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_api, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
