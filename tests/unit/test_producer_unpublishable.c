/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Calls whose message cannot be published (issue 14, item 1), on the producer's side:
 *  - at submit, a call whose Kafka message would be over max_message_bytes is refused with
 *    OQ_ETOOBIG and a message naming both sizes; nothing is written; the same key stays free;
 *    a key that exists is still answered (replay) even when its request is now too large;
 *  - a dead letter of the relay (outbox_dead) fails its call: state `failed`, error code
 *    "unpublishable", retryable false, audited, counted, the dead letter marked handled; a
 *    resubmit of the same key is a replay (the failure is final); a dead letter of an older
 *    attempt does not touch the call; the in-transaction entry point does the same;
 *  - the purge deletes handled dead letters past the key TTL.
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
#include "oq_metrics.h"
#include "oq_producer.h"

typedef struct fx {
    char dir[64];
    char path[128];
    oq_producer_t *p;
    oq_metrics_t *m;
    sqlite3 *db; /* a plain connection for checks and for playing the relay */
} fx_t;

static int open_producer(fx_t *f, int64_t max_message_bytes)
{
    oq_error_t err = {0};
    oq_producer_opts_t o;
    memset(&o, 0, sizeof o);
    o.metrics = f->m;
    o.max_message_bytes = max_message_bytes;
    if (oq_producer_open(f->path, &o, &f->p, &err) != 0) {
        fprintf(stderr, "open: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/oq-test-unpub.XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/calls.db", f->dir);
    f->m = oq_metrics_new();
    if (!f->m || open_producer(f, 4000) != 0) return -1;
    oq_error_t err = {0};
    if (oq_db_open(f->path, NULL, &f->db, &err) != 0) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    oq_producer_close(f->p);
    sqlite3_close_v2(f->db);
    oq_metrics_destroy(f->m);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0) return -1;
    free(f);
    return 0;
}

static int64_t num(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
}

/* Submits key \p key with a pad of \p pad bytes. */
static int submit(fx_t *f, const char *key, size_t pad, oq_call_t *call, oq_error_t *err)
{
    char *s = malloc(pad + 1);
    assert_non_null(s);
    memset(s, 'P', pad);
    s[pad] = '\0';
    json_t *args = json_pack("{s:i,s:s}", "amount", 1, "pad", s);
    free(s);
    oq_submit_req_t req = {.idem_key = key, .tool = "charge", .args = args};
    oq_submit_outcome_t oc = 0;
    memset(call, 0, sizeof *call);
    int rc = oq_producer_submit(f->p, &req, call, &oc, err);
    json_decref(args);
    return rc;
}

/* Plays the relay: sets the outbox row of \p message_id aside, as relay/store.c does. */
static void dead_letter(fx_t *f, const char *where)
{
    oq_error_t err = {0};
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO outbox_dead(seq,message_id,topic,key,payload,created_at,reason,detail,"
             "dead_at) SELECT seq,message_id,topic,key,payload,created_at,'MSG_SIZE_TOO_LARGE',"
             "'value 9 bytes over message.max.bytes=8',1 FROM outbox WHERE %s",
             where);
    assert_int_equal(oq_db_exec(f->db, sql, &err), 0);
    assert_int_equal(sqlite3_changes(f->db), 1);
}

static int wait_num(sqlite3 *db, const char *sql, int64_t want, int ms)
{
    for (int i = 0; i < ms / 20; i++) {
        if (num(db, sql) == want) return 1;
        usleep(20000);
    }
    return num(db, sql) == want;
}

static void test_too_large_refused_nothing_written(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_call_t c;
    assert_int_equal(submit(f, "big", 5000, &c, &err), OQ_ETOOBIG);
    assert_non_null(strstr(err.msg, "over the 4000 bytes the relay can publish"));
    assert_non_null(strstr(err.msg, "message.max.bytes"));
    oq_call_clear(&c);
    assert_int_equal(num(f->db, "SELECT count(*) FROM calls"), 0);
    assert_int_equal(num(f->db, "SELECT count(*) FROM outbox"), 0);
    assert_int_equal(num(f->db, "SELECT count(*) FROM audit"), 0);
    /* the key stays free: a small request under it is a new call */
    assert_int_equal(submit(f, "big", 10, &c, &err), 0);
    assert_string_equal(c.state, "pending");
    oq_call_clear(&c);
    /* just under the limit passes, just over is refused (the envelope is ~300 bytes + pad) */
    int ok = 0, refused = 0;
    for (size_t pad = 3500; pad < 3900; pad += 10) {
        char key[32];
        snprintf(key, sizeof key, "edge-%zu", pad);
        int rc = submit(f, key, pad, &c, &err);
        oq_call_clear(&c);
        if (rc == 0) {
            assert_int_equal(refused, 0); /* once refused, larger ones are refused too */
            ok++;
        } else {
            assert_int_equal(rc, OQ_ETOOBIG);
            refused++;
        }
    }
    assert_true(ok > 0 && refused > 0);
    /* every accepted row fits: wire size <= limit */
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(f->db,
                                        "SELECT length(key), length(payload), "
                                        "length(message_id) FROM outbox",
                                        -1, &st, NULL),
                     SQLITE_OK);
    while (sqlite3_step(st) == SQLITE_ROW)
        assert_true(oq_outbox_wire_size((size_t)sqlite3_column_int(st, 0),
                                        (size_t)sqlite3_column_int(st, 1),
                                        (size_t)sqlite3_column_int(st, 2)) <= 4000);
    sqlite3_finalize(st);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(oq_metrics_render(f->m, &text, &len), 0);
    char want[96];
    snprintf(want, sizeof want, "onceq_producer_submits_total{outcome=\"too_large\"} %d\n",
             1 + refused);
    assert_non_null(strstr(text, want));
    free(text);
}

/* A call accepted under a larger limit is still a replay after the limit was lowered. */
static void test_existing_key_still_replays(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_call_t c, again;
    oq_producer_close(f->p);
    assert_int_equal(open_producer(f, 100000), 0);
    assert_int_equal(submit(f, "accepted-before", 5000, &c, &err), 0);
    oq_producer_close(f->p);
    assert_int_equal(open_producer(f, 4000), 0);
    assert_int_equal(submit(f, "accepted-before", 5000, &again, &err), 0);
    assert_string_equal(again.call_id, c.call_id);
    assert_int_equal(num(f->db, "SELECT count(*) FROM outbox"), 1);
    oq_call_clear(&c);
    oq_call_clear(&again);
}

static void test_dead_letter_fails_call(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_call_t c, other;
    assert_int_equal(submit(f, "doomed", 10, &c, &err), 0);
    assert_int_equal(submit(f, "fine", 10, &other, &err), 0);
    char where[128], sql[256];
    snprintf(where, sizeof where, "key = '%s'", c.call_id);
    dead_letter(f, where);
    /* the writer looks about once a second */
    snprintf(sql, sizeof sql, "SELECT state = 'failed' FROM calls WHERE call_id = '%s'", c.call_id);
    assert_true(wait_num(f->db, sql, 1, 5000));
    oq_call_t got;
    memset(&got, 0, sizeof got);
    assert_int_equal(oq_producer_get(f->p, c.call_id, &got, &err), 0);
    json_t *e = json_loads(got.error, 0, NULL);
    assert_non_null(e);
    assert_string_equal(json_string_value(json_object_get(e, "code")), "unpublishable");
    assert_true(json_is_false(json_object_get(e, "retryable")));
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "MSG_SIZE_TOO_LARGE"));
    json_decref(e);
    oq_call_clear(&got);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM audit WHERE call_id = '%s' AND event = 'failed' AND detail "
             "LIKE '%%unpublishable%%'",
             c.call_id);
    assert_int_equal(num(f->db, sql), 1);
    assert_int_equal(num(f->db, "SELECT count(*) FROM outbox_dead WHERE handled_at IS NULL"), 0);
    /* the other call is untouched */
    snprintf(sql, sizeof sql, "SELECT state = 'pending' FROM calls WHERE call_id = '%s'",
             other.call_id);
    assert_int_equal(num(f->db, sql), 1);
    /* final: the same request again is a replay of the failed call, nothing new to publish */
    oq_call_t again;
    assert_int_equal(submit(f, "doomed", 10, &again, &err), 0);
    assert_string_equal(again.call_id, c.call_id);
    assert_string_equal(again.state, "failed");
    assert_int_equal(num(f->db, "SELECT count(*) FROM outbox"), 2);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(oq_metrics_render(f->m, &text, &len), 0);
    assert_non_null(strstr(text, "onceq_producer_unpublishable_total 1"));
    free(text);
    oq_call_clear(&again);
    oq_call_clear(&c);
    oq_call_clear(&other);
}

/* In a service's own transaction; a dead letter of an older attempt leaves the call alone; a
 * dead letter that is not a tool call is only marked handled. */
static void test_fail_dead_letters_in_tx(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_producer_close(f->p); /* no writer: the caller does it */
    f->p = NULL;
    sqlite3_exec(f->db,
                 "INSERT INTO calls(call_id,tenant,idem_key,fingerprint,tool,args,state,attempt,"
                 "created_at,updated_at,expires_at) VALUES('c_00000000000000aa','default','k',"
                 "'f','charge','{}','pending',2,1,1,9999999999999);"
                 "INSERT INTO outbox(message_id,topic,key,payload,created_at) VALUES"
                 "('00000000-0000-4000-8000-000000000001','onceq.tool-calls','c_00000000000000aa',"
                 "'{\"kind\":\"tool_call\",\"attempt\":1}',1),"
                 "('00000000-0000-4000-8000-000000000002','other.topic','x','not json',1);",
                 NULL, NULL, NULL);
    dead_letter(f, "seq = 1");
    dead_letter(f, "seq = 2");
    int failed = -1, handled = -1;
    assert_int_equal(oq_db_begin_immediate(f->db, 1000, &err), 0);
    assert_int_equal(oq_store_fail_dead_letters(f->db, 5, 0, &failed, &handled, &err), 0);
    assert_int_equal(oq_db_commit(f->db, &err), 0);
    assert_int_equal(failed, 0); /* attempt 1 is stale: the call is at attempt 2 */
    assert_int_equal(handled, 2);
    assert_int_equal(num(f->db, "SELECT state = 'pending' FROM calls"), 1);
    assert_int_equal(num(f->db, "SELECT count(*) FROM result_inbox WHERE outcome = 'stale'"), 1);
    assert_int_equal(num(f->db, "SELECT count(*) FROM outbox_dead WHERE handled_at = 5"), 2);
    /* handled twice is harmless: nothing left to handle */
    assert_int_equal(oq_db_begin_immediate(f->db, 1000, &err), 0);
    assert_int_equal(oq_store_fail_dead_letters(f->db, 6, 0, &failed, &handled, &err), 0);
    assert_int_equal(oq_db_commit(f->db, &err), 0);
    assert_int_equal(handled, 0);
}

static void test_purge_handled_dead_letters(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_call_t c;
    assert_int_equal(submit(f, "p", 10, &c, &err), 0);
    dead_letter(f, "seq = 1");
    assert_true(
        wait_num(f->db, "SELECT count(*) FROM outbox_dead WHERE handled_at IS NULL", 0, 5000));
    oq_purge_stats_t ps;
    memset(&ps, 0, sizeof ps);
    /* dead_at = 1 (above): past any TTL */
    assert_int_equal(oq_store_purge(f->db, oq_now_ms(), 1000, 100, &ps, &err), 0);
    assert_int_equal(ps.dead, 1);
    assert_int_equal(num(f->db, "SELECT count(*) FROM outbox_dead"), 0);
    /* an unhandled one stays, however old */
    sqlite3_exec(f->db,
                 "INSERT INTO outbox_dead(seq,message_id,topic,key,payload,created_at,"
                 "reason,dead_at) VALUES (99,'m','t','k','p',1,'INVALID_RECORD',1)",
                 NULL, NULL, NULL);
    oq_producer_close(f->p);
    f->p = NULL;
    memset(&ps, 0, sizeof ps);
    assert_int_equal(oq_store_purge(f->db, oq_now_ms(), 1000, 100, &ps, &err), 0);
    assert_int_equal(ps.dead, 0);
    assert_int_equal(num(f->db, "SELECT count(*) FROM outbox_dead"), 1);
    oq_call_clear(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_too_large_refused_nothing_written, setup, teardown),
        cmocka_unit_test_setup_teardown(test_existing_key_still_replays, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_letter_fails_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_dead_letters_in_tx, setup, teardown),
        cmocka_unit_test_setup_teardown(test_purge_handled_dead_letters, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
