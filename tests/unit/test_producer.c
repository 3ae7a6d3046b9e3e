/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Producer store and C API: the seven scenarios of the reference design (same key, different
 * key, conflict, concurrent same key, retryable failure reset, crash after commit before the
 * reply, delayed response then retry), tenant scoping, the in-transaction API, results ingest
 * semantics (duplicate / stale / unknown / late running) and purge boundaries. Every test
 * works on a fresh database in a temp directory and checks the rows, not only return codes.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_producer.h"
#include "producer_int.h"

typedef struct fx {
    char dir[64];
    char path[128];
    oq_producer_t *p;
    sqlite3 *db; /* a second plain connection for checks */
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/oq-test-producer.XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/calls.db", f->dir);
    oq_error_t err = {0};
    if (oq_producer_open(f->path, NULL, &f->p, &err) != 0) {
        fprintf(stderr, "open: %s\n", err.msg);
        return -1;
    }
    if (oq_db_open(f->path, NULL, &f->db, &err) != 0) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    oq_producer_close(f->p);
    sqlite3_close_v2(f->db);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0) return -1;
    free(f);
    return 0;
}

static int64_t count(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
}

/* Whether SQLite's plan for \p sql reads the index \p index. */
static int plan_uses(sqlite3 *db, const char *sql, const char *index)
{
    char q[1024], want[96];
    snprintf(q, sizeof q, "EXPLAIN QUERY PLAN %s", sql);
    snprintf(want, sizeof want, "USING INDEX %s ", index);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, q, -1, &st, NULL), SQLITE_OK);
    int uses = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *d = (const char *)sqlite3_column_text(st, 3);
        if (d && strstr(d, want)) uses = 1;
    }
    sqlite3_finalize(st);
    return uses;
}

/* Assert that the single text value \p sql selects equals \p want (NULL: SQL NULL). */
static void text_is(sqlite3 *db, const char *sql, const char *want)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    const char *got = (const char *)sqlite3_column_text(st, 0);
    if (want)
        assert_string_equal(got ? got : "(null)", want);
    else
        assert_null(got);
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
}

/* The single text value \p sql selects, parsed, equals \p want as JSON. */
static void json_is(sqlite3 *db, const char *sql, const json_t *want)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    const char *got = (const char *)sqlite3_column_text(st, 0);
    assert_non_null(got);
    json_t *v = json_loads(got, 0, NULL);
    assert_non_null(v);
    assert_true(json_equal(v, want));
    json_decref(v);
    sqlite3_finalize(st);
}

static int submit(oq_producer_t *p, const char *tenant, const char *key, const char *tool,
                  const char *args_json, oq_call_t *call, oq_submit_outcome_t *oc)
{
    json_t *args = json_loads(args_json, 0, NULL);
    assert_non_null(args);
    oq_submit_req_t req = {tenant, key, tool, args, NULL, 0, 0, NULL};
    oq_error_t err = {0};
    int rc = oq_producer_submit(p, &req, call, oc, &err);
    json_decref(args);
    return rc;
}

/* Scenario 1 and 2: same key returns the same call and writes nothing; a new key is new. */
static void test_same_key_replay_and_new_key(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0}, b = {0}, c = {0};
    oq_submit_outcome_t oc;
    assert_int_equal(submit(f->p, NULL, "k1", "charge", "{\"amount\":5}", &a, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_NEW);
    assert_string_equal(a.state, "pending");
    assert_string_equal(a.tenant, "default");
    assert_int_equal(a.attempt, 1);
    assert_int_equal(strlen(a.call_id), OQ_CALL_ID_LEN);
    /* same key, same args in another key order/number form: replay */
    assert_int_equal(submit(f->p, NULL, "k1", "charge", "{ \"amount\" : 5.0 }", &b, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_REPLAY);
    assert_string_equal(a.call_id, b.call_id);
    assert_string_equal(a.fingerprint, b.fingerprint);
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), 1);
    /* different key: new call */
    assert_int_equal(submit(f->p, NULL, "k2", "charge", "{\"amount\":5}", &c, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_NEW);
    assert_string_not_equal(a.call_id, c.call_id);
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), 2);
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), 2);
    /* the outbox row carries a decodable tool_call envelope keyed by call_id */
    sqlite3_stmt *st = NULL;
    assert_int_equal(
        sqlite3_prepare_v2(f->db, "SELECT key,payload FROM outbox ORDER BY seq", -1, &st, NULL),
        SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), a.call_id);
    oq_envelope_t e = {0};
    oq_error_t err = {0};
    assert_int_equal(oq_envelope_decode((const char *)sqlite3_column_text(st, 1),
                                        (size_t)sqlite3_column_bytes(st, 1), &e, &err),
                     0);
    assert_int_equal(e.kind, OQ_KIND_TOOL_CALL);
    assert_string_equal(e.call_id, a.call_id);
    assert_string_equal(e.fingerprint, a.fingerprint);
    assert_int_equal(e.attempt, 1);
    oq_envelope_clear(&e);
    sqlite3_finalize(st);
    /* reads */
    oq_call_t g = {0};
    assert_int_equal(oq_producer_get(f->p, a.call_id, &g, NULL), 0);
    assert_string_equal(g.idem_key, "k1");
    assert_string_equal(g.args, "{\"amount\":5}");
    oq_call_clear(&g);
    assert_int_equal(oq_producer_get_by_key(f->p, NULL, "k2", &g, NULL), 0);
    assert_string_equal(g.call_id, c.call_id);
    oq_call_clear(&g);
    assert_int_equal(oq_producer_get(f->p, "c_0000000000000000", &g, NULL), OQ_ENOTFOUND);
    oq_call_clear(&a);
    oq_call_clear(&b);
    oq_call_clear(&c);
}

/* Scenario 3: same key, different args: conflict, nothing written. */
static void test_conflict(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0}, b = {0};
    oq_submit_outcome_t oc;
    assert_int_equal(submit(f->p, NULL, "k", "charge", "{\"amount\":5}", &a, &oc), 0);
    assert_int_equal(submit(f->p, NULL, "k", "charge", "{\"amount\":6}", &b, &oc), OQ_ECONFLICT);
    assert_int_equal(oc, OQ_SUBMIT_CONFLICT);
    assert_int_equal(submit(f->p, NULL, "k", "send_email", "{\"amount\":5}", NULL, &oc),
                     OQ_ECONFLICT);
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), 1);
    oq_call_clear(&a);
    oq_call_clear(&b);
}

/* Tenant scoping: the same key in two tenants is two calls. Bad input is refused. */
static void test_tenants_and_validation(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0}, b = {0};
    oq_submit_outcome_t oc;
    assert_int_equal(submit(f->p, "t1", "k", "charge", "{\"amount\":5}", &a, &oc), 0);
    assert_int_equal(submit(f->p, "t2", "k", "charge", "{\"amount\":5}", &b, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_NEW);
    assert_string_not_equal(a.call_id, b.call_id);
    assert_string_not_equal(a.fingerprint, b.fingerprint); /* tenant is in the fingerprint */
    char longkey[300];
    memset(longkey, 'x', 256);
    longkey[256] = '\0';
    assert_int_equal(submit(f->p, NULL, longkey, "charge", "{}", NULL, NULL), OQ_EINVAL);
    longkey[255] = '\0';
    assert_int_equal(submit(f->p, NULL, longkey, "charge", "{}", NULL, NULL), 0);
    assert_int_equal(submit(f->p, NULL, "", "charge", "{}", NULL, NULL), OQ_EINVAL);
    assert_int_equal(submit(f->p, NULL, "a\nb", "charge", "{}", NULL, NULL), OQ_EINVAL);
    assert_int_equal(submit(f->p, NULL, "k9", "bad tool", "{}", NULL, NULL), OQ_EINVAL);
    assert_int_equal(submit(f->p, NULL, "k9", "charge", "[1]", NULL, NULL), OQ_EINVAL);
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), 3);
    oq_call_clear(&a);
    oq_call_clear(&b);
}

/* Scenario 4: 16 threads submit one key at once: one call id, one outbox row. */
typedef struct conc {
    oq_producer_t *p;
    pthread_barrier_t *bar;
    char call_id[OQ_CALL_ID_LEN + 1];
    int rc;
    oq_submit_outcome_t oc;
} conc_t;

static void *conc_main(void *arg)
{
    conc_t *c = arg;
    json_t *args = json_pack("{s:i}", "amount", 7);
    oq_submit_req_t req = {"default", "same-key", "charge", args, NULL, 0, 0, NULL};
    oq_call_t call = {0};
    pthread_barrier_wait(c->bar);
    c->rc = oq_producer_submit(c->p, &req, &call, &c->oc, NULL);
    memcpy(c->call_id, call.call_id, sizeof c->call_id);
    oq_call_clear(&call);
    json_decref(args);
    return NULL;
}

static void test_concurrent_same_key(void **state)
{
    fx_t *f = *state;
    enum { N = 16 };
    pthread_t th[N];
    conc_t c[N];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N);
    for (int i = 0; i < N; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].p = f->p;
        c[i].bar = &bar;
        assert_int_equal(pthread_create(&th[i], NULL, conc_main, &c[i]), 0);
    }
    int news = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(c[i].rc, 0);
        assert_string_equal(c[i].call_id, c[0].call_id);
        if (c[i].oc == OQ_SUBMIT_NEW) news++;
    }
    pthread_barrier_destroy(&bar);
    assert_int_equal(news, 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), 1);
}

/* Apply one tool_result on the check connection, in its own transaction. */
/* The clock of apply(): 0 = now (a result comes after its submit, and a settling one starts
 * the key's retention then); a test of received_at boundaries sets a fixed time. */
static int64_t apply_clock;

static int apply(fx_t *f, const char *call_id, const char *msg_id, const char *status,
                 int64_t attempt, const char *error_json, const char *effect_id,
                 oq_result_outcome_t *oc)
{
    oq_envelope_t e;
    memset(&e, 0, sizeof e);
    e.v = 1;
    e.kind = OQ_KIND_TOOL_RESULT;
    snprintf(e.message_id, sizeof e.message_id, "%s", msg_id);
    snprintf(e.call_id, sizeof e.call_id, "%s", call_id);
    e.attempt = attempt;
    e.status = (char *)status;
    e.error = error_json ? json_loads(error_json, 0, NULL) : NULL;
    e.result = strcmp(status, "succeeded") == 0 ? json_pack("{s:b}", "ok", 1) : NULL;
    e.effect_id = (char *)effect_id;
    oq_error_t err = {0};
    assert_int_equal(oq_db_begin_immediate(f->db, 5000, &err), 0);
    int rc = oq_store_apply_result(f->db, &e, apply_clock ? apply_clock : oq_now_ms(), oc, &err);
    assert_int_equal(oq_db_commit(f->db, &err), 0);
    json_decref(e.error);
    json_decref(e.result);
    return rc;
}

/* needs_review is terminal for the machines but not for an operator: the consumer emits one
 * succeeded or failed when a review is resolved, and that one is applied; `running` and a
 * second needs_review are not, and nothing moves a call once resolved. */
static void test_review_resolution_applied(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0};
    oq_submit_outcome_t oc;
    oq_result_outcome_t ro;
    assert_int_equal(submit(f->p, NULL, "rv", "pay", "{\"amount\":1}", &a, &oc), 0);
    assert_int_equal(apply(f, a.call_id, "v1", "running", 1, NULL, NULL, &ro), 0);
    assert_int_equal(apply(f, a.call_id, "v2", "needs_review", 1,
                           "{\"code\":\"no_lookup_no_keys\",\"message\":\"x\"}", NULL, &ro),
                     0);
    assert_int_equal(ro, OQ_RESULT_APPLIED);
    assert_int_equal(apply(f, a.call_id, "v3", "running", 1, NULL, NULL, &ro), 0);
    assert_int_equal(ro, OQ_RESULT_IGNORED);
    assert_int_equal(apply(f, a.call_id, "v4", "needs_review", 1,
                           "{\"code\":\"x\",\"message\":\"y\"}", NULL, &ro),
                     0);
    assert_int_equal(ro, OQ_RESULT_IGNORED);
    text_is(f->db, "SELECT state FROM calls", "needs_review");
    assert_int_equal(apply(f, a.call_id, "v5", "succeeded", 1, NULL, "e_1", &ro), 0);
    assert_int_equal(ro, OQ_RESULT_APPLIED);
    text_is(f->db, "SELECT state FROM calls", "succeeded");
    text_is(f->db, "SELECT effect_id FROM calls", "e_1");
    assert_int_equal(
        apply(f, a.call_id, "v6", "failed", 1, "{\"code\":\"x\",\"message\":\"y\"}", NULL, &ro), 0);
    assert_int_equal(ro, OQ_RESULT_IGNORED);
    assert_int_equal(apply(f, a.call_id, "v7", "running", 1, NULL, NULL, &ro), 0);
    assert_int_equal(ro, OQ_RESULT_IGNORED);
    text_is(f->db, "SELECT state FROM calls", "succeeded");
    oq_call_clear(&a);
}

/* Scenario 5: failed + retryable -> same key resets to pending with attempt 2 and a new outbox
 * row; failed + not retryable -> replay; results are applied once. */
static void test_retryable_failure_and_results(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0}, b = {0};
    oq_submit_outcome_t oc;
    oq_result_outcome_t ro;
    assert_int_equal(submit(f->p, NULL, "r", "fail", "{\"retryable\":true}", &a, &oc), 0);
    /* running, then duplicated running, then failed retryable */
    assert_int_equal(apply(f, a.call_id, "m1", "running", 1, NULL, NULL, &ro), 0);
    assert_int_equal(ro, OQ_RESULT_APPLIED);
    assert_int_equal(apply(f, a.call_id, "m1", "running", 1, NULL, NULL, &ro), 0);
    assert_int_equal(ro, OQ_RESULT_DUPLICATE);
    /* a duplicate with another status changes nothing: no state change, no audit row, and
     * the inbox row keeps its first status and outcome */
    assert_int_equal(apply(f, a.call_id, "m1", "succeeded", 1, NULL, "ex", &ro), 0);
    assert_int_equal(ro, OQ_RESULT_DUPLICATE);
    text_is(f->db, "SELECT state FROM calls", "running");
    text_is(f->db, "SELECT effect_id FROM calls", NULL);
    text_is(f->db, "SELECT status||'/'||outcome FROM result_inbox WHERE message_id='m1'",
            "running/applied");
    assert_int_equal(count(f->db, "SELECT count(*) FROM audit"), 1);
    text_is(f->db, "SELECT event||' '||detail FROM audit",
            "running {\"from\":\"pending\",\"attempt\":1,\"message_id\":\"m1\","
            "\"effect_id\":null}");
    assert_int_equal(apply(f, a.call_id, "m2", "failed", 1,
                           "{\"code\":\"tool_failed\",\"message\":\"x\",\"retryable\":true}", NULL,
                           &ro),
                     0);
    assert_int_equal(ro, OQ_RESULT_APPLIED);
    /* duplicate of the failure: nothing more */
    assert_int_equal(apply(f, a.call_id, "m2", "failed", 1, "{\"retryable\":true}", NULL, &ro), 0);
    assert_int_equal(ro, OQ_RESULT_DUPLICATE);
    assert_int_equal(count(f->db, "SELECT count(*) FROM audit WHERE event='failed'"), 1);
    text_is(f->db, "SELECT detail FROM audit WHERE event='failed'",
            "{\"from\":\"running\",\"attempt\":1,\"message_id\":\"m2\",\"effect_id\":null,"
            "\"error\":{\"code\":\"tool_failed\",\"message\":\"x\",\"retryable\":true}}");
    text_is(f->db, "SELECT error FROM calls",
            "{\"code\":\"tool_failed\",\"message\":\"x\",\"retryable\":true}");
    text_is(f->db, "SELECT outcome FROM result_inbox WHERE message_id='m2'", "applied");
    /* a late 'running' does not move a terminal call */
    assert_int_equal(apply(f, a.call_id, "m3", "running", 1, NULL, NULL, &ro), 0);
    assert_int_equal(ro, OQ_RESULT_IGNORED);
    text_is(f->db, "SELECT outcome FROM result_inbox WHERE message_id='m3'", "ignored");
    text_is(f->db, "SELECT detail FROM audit WHERE event='result_ignored'",
            "{\"status\":\"running\",\"attempt\":1,\"reason\":\"call already terminal\","
            "\"message_id\":\"m3\"}");
    oq_call_t g = {0};
    assert_int_equal(oq_producer_get(f->p, a.call_id, &g, NULL), 0);
    assert_string_equal(g.state, "failed");
    oq_call_clear(&g);

    assert_int_equal(submit(f->p, NULL, "r", "fail", "{\"retryable\":true}", &b, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_RETRY_RESET);
    assert_string_equal(b.call_id, a.call_id);
    assert_int_equal(b.attempt, 2);
    assert_string_equal(b.state, "pending");
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), 2);
    assert_int_equal(count(f->db, "SELECT count(DISTINCT message_id) FROM outbox"), 2);
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), 1);
    {
        /* the new outbox row: the envelope of attempt 2, same call, same canonical args */
        sqlite3_stmt *st = NULL;
        assert_int_equal(sqlite3_prepare_v2(f->db,
                                            "SELECT message_id,key,payload FROM outbox ORDER BY "
                                            "seq DESC LIMIT 1",
                                            -1, &st, NULL),
                         SQLITE_OK);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        oq_envelope_t e = {0};
        oq_error_t err = {0};
        assert_int_equal(oq_envelope_decode((const char *)sqlite3_column_text(st, 2),
                                            (size_t)sqlite3_column_bytes(st, 2), &e, &err),
                         0);
        assert_string_equal(e.message_id, (const char *)sqlite3_column_text(st, 0));
        assert_string_equal((const char *)sqlite3_column_text(st, 1), a.call_id);
        assert_string_equal(e.call_id, a.call_id);
        assert_string_equal(e.fingerprint, a.fingerprint);
        assert_int_equal(e.attempt, 2);
        char *canon = NULL;
        assert_int_equal(oq_jcs_canonicalize(e.args, &canon, NULL, &err), 0);
        assert_string_equal(canon, "{\"retryable\":true}");
        free(canon);
        oq_envelope_clear(&e);
        sqlite3_finalize(st);
    }
    /* a stale result of attempt 1 is not applied; attempt 2 success is, with its effect id */
    assert_int_equal(apply(f, a.call_id, "m4", "succeeded", 1, NULL, "e1", &ro), 0);
    assert_int_equal(ro, OQ_RESULT_STALE);
    text_is(f->db, "SELECT outcome FROM result_inbox WHERE message_id='m4'", "stale");
    text_is(f->db,
            "SELECT detail FROM audit WHERE event='result_ignored' AND id>(SELECT "
            "min(id) FROM audit WHERE event='result_ignored')",
            "{\"status\":\"succeeded\",\"attempt\":1,\"reason\":\"stale attempt\","
            "\"message_id\":\"m4\"}");
    assert_int_equal(apply(f, a.call_id, "m5", "succeeded", 2, NULL, "e2", &ro), 0);
    assert_int_equal(ro, OQ_RESULT_APPLIED);
    text_is(f->db, "SELECT detail FROM audit WHERE event='succeeded'",
            "{\"from\":\"pending\",\"attempt\":2,\"message_id\":\"m5\",\"effect_id\":\"e2\"}");
    text_is(f->db, "SELECT result FROM calls", "{\"ok\":true}");
    int64_t audit_rows = count(f->db, "SELECT count(*) FROM audit");
    /* an unknown call is recorded in the inbox (no audit row), and deduplicated like any */
    apply_clock = 1000;
    assert_int_equal(apply(f, "c_ffffffffffffffff", "m6", "succeeded", 1, NULL, NULL, &ro), 0);
    apply_clock = 0;
    assert_int_equal(ro, OQ_RESULT_UNKNOWN_CALL);
    text_is(f->db,
            "SELECT call_id||' '||status||' '||outcome||' '||received_at FROM result_inbox "
            "WHERE message_id='m6'",
            "c_ffffffffffffffff succeeded unknown_call 1000");
    assert_int_equal(apply(f, "c_ffffffffffffffff", "m6", "failed", 1, NULL, NULL, &ro), 0);
    assert_int_equal(ro, OQ_RESULT_DUPLICATE);
    text_is(f->db, "SELECT status||'/'||outcome FROM result_inbox WHERE message_id='m6'",
            "succeeded/unknown_call");
    assert_int_equal(count(f->db, "SELECT count(*) FROM audit"), audit_rows);
    assert_int_equal(count(f->db, "SELECT count(*) FROM result_inbox"), 6);
    assert_int_equal(oq_producer_get(f->p, a.call_id, &g, NULL), 0);
    assert_string_equal(g.state, "succeeded");
    assert_string_equal(g.effect_id, "e2");
    assert_non_null(g.result);
    oq_call_clear(&g);
    /* a terminal success replays, never resets */
    oq_call_clear(&b);
    assert_int_equal(submit(f->p, NULL, "r", "fail", "{\"retryable\":true}", &b, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_REPLAY);
    json_t *s = NULL;
    assert_int_equal(oq_producer_stats(f->p, &s, NULL), 0);
    assert_int_equal(json_integer_value(json_object_get(s, "calls")), 1);
    assert_int_equal(json_integer_value(json_object_get(s, "effects")), 1);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(s, "by_status"), "succeeded")), 1);
    json_decref(s);

    /* non-retryable failure: replay, no reset */
    oq_call_t n = {0};
    assert_int_equal(submit(f->p, NULL, "nr", "fail", "{\"retryable\":false}", &n, &oc), 0);
    assert_int_equal(apply(f, n.call_id, "m7", "failed", 1,
                           "{\"code\":\"x\",\"message\":\"y\",\"retryable\":false}", NULL, &ro),
                     0);
    oq_call_clear(&b);
    assert_int_equal(submit(f->p, NULL, "nr", "fail", "{\"retryable\":false}", &b, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_REPLAY);
    assert_int_equal(b.attempt, 1);
    oq_call_clear(&a);
    oq_call_clear(&b);
    oq_call_clear(&n);
}

/* The audit detail of an applied result is the JSON it always was: the same value json_pack()
 * makes of effect_id and the error (quotes, backslashes, control characters escaped, non-ASCII
 * text kept as UTF-8; the escapes themselves are RFC 8785's), keys in the order from, attempt,
 * message_id, effect_id (null when absent), error. */
static void test_result_detail_escaping(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0};
    oq_result_outcome_t ro;
    assert_int_equal(submit(f->p, NULL, "esc", "charge", "{\"amount\":1}", &a, NULL), 0);
    static const char eff[] = "e\"q\\b/\b\f\n\r\t\x01\x1f\x7f \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
    static const char errj[] = "{\"message\":\"bad \\\"x\\\"\\n\\u0002\xc3\xa9\",\"code\":\"c\","
                               "\"retryable\":false,\"n\":1.5}";
    assert_int_equal(apply(f, a.call_id, "m-esc", "failed", 1, errj, eff, &ro), 0);
    assert_int_equal(ro, OQ_RESULT_APPLIED);
    /* the oracle: the same value json_pack made of it (compared as JSON: escapes may differ
     * in form, e.g. \u001f and \u001F) */
    json_t *e = json_loads(errj, 0, NULL);
    assert_non_null(e);
    json_t *d = json_pack("{s:s,s:I,s:s,s:s?}", "from", "pending", "attempt", (json_int_t)1,
                          "message_id", "m-esc", "effect_id", eff);
    assert_non_null(d);
    json_object_set(d, "error", e);
    char *want_err = json_dumps(e, JSON_COMPACT | JSON_SORT_KEYS);
    json_is(f->db, "SELECT detail FROM audit WHERE event='failed'", d);
    text_is(f->db, "SELECT error FROM calls", want_err);
    text_is(f->db, "SELECT effect_id FROM calls", eff);
    free(want_err);
    json_decref(d);
    json_decref(e);
    oq_call_clear(&a);
}

/* Scenario 6: the process is killed after the commit and before the reply. After a restart
 * the same key returns the committed call and nothing is duplicated. */
/* Runs without the fixture: fork() copies only the calling thread, so a child forked while the
 * fixture's writer or checkpointer thread holds a lock (SQLite's, or the sanitizer allocator's)
 * would wait for it for ever (one CI run hung here under ASan). */
static void test_crash_after_commit(void **state)
{
    (void)state;
    char dir[] = "/tmp/oq-test-crash.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[160];
    snprintf(path, sizeof path, "%s/crash.db", dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("ONCEQ_CRASH_AT", "producer.after_commit_before_reply", 1);
        oq__crash_armed = -1;
        oq_producer_t *p = NULL;
        if (oq_producer_open(path, NULL, &p, NULL) != 0) _exit(3);
        submit(p, NULL, "crash-key", "charge", "{\"amount\":1}", NULL, NULL);
        _exit(0); /* not reached: the crash point kills us */
    }
    int st = 0;
    pid_t got = 0;
    for (int i = 0; i < 600 && got == 0; i++) { /* at most 30 s */
        got = waitpid(pid, &st, WNOHANG);
        if (got == 0) usleep(50 * 1000);
    }
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        fail_msg("the crashing child did not finish in 30 s");
    }
    assert_int_equal(got, pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGKILL);
    oq_producer_t *p = NULL;
    assert_int_equal(oq_producer_open(path, NULL, &p, NULL), 0);
    oq_call_t c = {0};
    oq_submit_outcome_t oc;
    assert_int_equal(submit(p, NULL, "crash-key", "charge", "{\"amount\":1}", &c, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_REPLAY); /* the commit survived the kill */
    oq_call_clear(&c);
    oq_producer_close(p);
    sqlite3 *db = NULL;
    assert_int_equal(oq_db_open(path, NULL, &db, NULL), 0);
    assert_int_equal(count(db, "SELECT count(*) FROM calls"), 1);
    assert_int_equal(count(db, "SELECT count(*) FROM outbox"), 1);
    sqlite3_close_v2(db);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Scenario 7: the response is delayed (the writer is blocked by another writer's lock), the
 * client gives up and retries with the same key: one call. */
typedef struct delayed {
    oq_producer_t *p;
    char call_id[OQ_CALL_ID_LEN + 1];
    int rc;
} delayed_t;

static void *delayed_main(void *arg)
{
    delayed_t *d = arg;
    oq_call_t c = {0};
    d->rc = submit(d->p, NULL, "slow", "charge", "{\"amount\":3}", &c, NULL);
    memcpy(d->call_id, c.call_id, sizeof d->call_id);
    oq_call_clear(&c);
    return NULL;
}

static void test_delayed_response_retry(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    assert_int_equal(oq_db_begin_immediate(f->db, 1000, &err), 0); /* hold the write lock */
    delayed_t d = {f->p, "", -99};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, delayed_main, &d), 0);
    usleep(300 * 1000);
    assert_int_equal(d.rc, -99); /* still waiting: not acknowledged before durable */
    assert_int_equal(oq_db_commit(f->db, &err), 0); /* release the lock */
    pthread_join(th, NULL);                         /* (the "lost" first response) */
    assert_int_equal(d.rc, 0);
    oq_call_t c = {0};
    oq_submit_outcome_t oc;
    assert_int_equal(submit(f->p, NULL, "slow", "charge", "{\"amount\":3}", &c, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_REPLAY);
    assert_string_equal(c.call_id, d.call_id);
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), 1);
    oq_call_clear(&c);
}

/* The in-transaction API: a rolled-back business transaction leaves nothing. */
static void test_in_tx(void **state)
{
    fx_t *f = *state;
    sqlite3 *db = f->db;
    oq_error_t err = {0};
    assert_int_equal(oq_producer_migrate(db, &err), 0);
    assert_int_equal(
        oq_db_exec(db, "CREATE TABLE orders(id INTEGER PRIMARY KEY, amount INT)", &err), 0);
    json_t *args = json_pack("{s:i}", "amount", 9);
    oq_submit_req_t req = {NULL, "order-1", "charge", args, NULL, 0, 0, NULL};
    oq_call_t c = {0};
    oq_submit_outcome_t oc;
    /* without a transaction: refused */
    assert_int_equal(oq_producer_submit_in_tx(db, &req, 0, &c, &oc, &err), OQ_ESTATE);
    /* rolled back */
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    assert_int_equal(oq_db_exec(db, "INSERT INTO orders(amount) VALUES(9)", &err), 0);
    assert_int_equal(oq_producer_submit_in_tx(db, &req, 0, &c, &oc, &err), 0);
    assert_int_equal(oc, OQ_SUBMIT_NEW);
    oq_db_rollback(db);
    oq_call_clear(&c);
    assert_int_equal(count(db, "SELECT count(*) FROM orders"), 0);
    assert_int_equal(count(db, "SELECT count(*) FROM calls"), 0);
    assert_int_equal(count(db, "SELECT count(*) FROM outbox"), 0);
    /* committed */
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    assert_int_equal(oq_db_exec(db, "INSERT INTO orders(amount) VALUES(9)", &err), 0);
    assert_int_equal(oq_producer_submit_in_tx(db, &req, 0, &c, &oc, &err), 0);
    assert_int_equal(oq_db_commit(db, &err), 0);
    assert_int_equal(count(db, "SELECT count(*) FROM orders"), 1);
    assert_int_equal(count(db, "SELECT count(*) FROM calls"), 1);
    assert_int_equal(count(db, "SELECT count(*) FROM outbox"), 1);
    /* the producer sees it: the daemon's replay of the same key */
    oq_call_t r = {0};
    assert_int_equal(submit(f->p, NULL, "order-1", "charge", "{\"amount\":9}", &r, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_REPLAY);
    assert_string_equal(r.call_id, c.call_id);
    oq_call_clear(&r);
    oq_call_clear(&c);
    json_decref(args);
}

/* Purge: exact boundary, terminal only, dependent rows, and an expired key is a new call. */
static void test_purge(void **state)
{
    fx_t *f = *state;
    oq_call_t a = {0}, b = {0}, c = {0};
    oq_result_outcome_t ro;
    assert_int_equal(submit(f->p, NULL, "p1", "charge", "{\"amount\":1}", &a, NULL), 0);
    assert_int_equal(submit(f->p, NULL, "p2", "charge", "{\"amount\":2}", &b, NULL), 0);
    assert_int_equal(submit(f->p, NULL, "p3", "charge", "{\"amount\":3}", &c, NULL), 0);
    assert_int_equal(apply(f, a.call_id, "pm1", "succeeded", 1, NULL, "e1", &ro), 0);
    assert_int_equal(apply(f, b.call_id, "pm2", "running", 1, NULL, NULL, &ro), 0);
    /* p1 succeeded, p2 running, p3 pending; the outbox rows were published at creation */
    oq_error_t err = {0};
    oq_call_t g = {0};
    assert_int_equal(oq_producer_get(f->p, a.call_id, &g, NULL), 0);
    int64_t exp = g.expires_at;
    /* the relay's watermark covers every row (schema/common/0002_outbox_watermark.sql) */
    assert_int_equal(oq_db_exec(f->db,
                                "INSERT OR REPLACE INTO relay_lease(name, owner, fence, "
                                "expires_at, published_seq) SELECT 'outbox', 't', 1, 0, max(seq) "
                                "FROM outbox",
                                &err),
                     0);
    /* and all three rows as old as p1's retention (they age by created_at) */
    char up[128];
    snprintf(up, sizeof up, "UPDATE outbox SET created_at=%lld",
             (long long)(exp - OQ_DEFAULT_KEY_TTL_MS));
    assert_int_equal(oq_db_exec(f->db, up, &err), 0);
    /* the key's retention counts from the moment the call settled, not from its submit */
    assert_true(exp - g.created_at >= OQ_DEFAULT_KEY_TTL_MS);
    assert_int_equal(exp - g.updated_at, OQ_DEFAULT_KEY_TTL_MS);
    oq_call_clear(&g);
    /* calls_expires holds the settled calls only (schema/producer/0008_expires_settled.sql),
     * and the purge's query (store.c, word for word) reads it */
    assert_int_equal(count(f->db, "SELECT count(*) FROM sqlite_schema WHERE name='calls_expires' "
                                  "AND sql LIKE '%WHERE state=''succeeded'' OR state=''failed'''"),
                     1);
    assert_true(plan_uses(f->db,
                          "SELECT call_id FROM calls WHERE expires_at<=5 AND (state='succeeded' "
                          "OR state='failed') ORDER BY expires_at LIMIT 100",
                          "calls_expires"));
    /* a result for an unknown call, received at t=1000 */
    apply_clock = 1000;
    assert_int_equal(apply(f, "c_ffffffffffffffff", "pmx", "succeeded", 1, NULL, NULL, &ro), 0);
    apply_clock = 0;
    assert_int_equal(ro, OQ_RESULT_UNKNOWN_CALL);
    oq_purge_stats_t ps = {0};
    /* purge at t = 1000 + ttl - 1: the orphan stays */
    assert_int_equal(oq_store_purge(f->db, 1000 + OQ_DEFAULT_KEY_TTL_MS - 1, OQ_DEFAULT_KEY_TTL_MS,
                                    1, &ps, &err),
                     0);
    assert_int_equal(count(f->db, "SELECT count(*) FROM result_inbox WHERE message_id='pmx'"), 1);
    /* one ms before the expiry: no call, no outbox row; the old orphan result row goes */
    assert_int_equal(oq_store_purge(f->db, exp - 1, OQ_DEFAULT_KEY_TTL_MS, 1, &ps, &err), 0);
    assert_int_equal(ps.calls, 0);
    assert_int_equal(ps.outbox, 0);
    assert_int_equal(ps.result_inbox, 1);
    assert_int_equal(count(f->db, "SELECT count(*) FROM result_inbox WHERE message_id='pmx'"), 0);
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), 3);
    /* exactly at the expiry: the terminal call goes, pending/running stay */
    assert_int_equal(oq_store_purge(f->db, exp, OQ_DEFAULT_KEY_TTL_MS, 1, &ps, &err), 0);
    assert_int_equal(ps.calls, 1);
    assert_int_equal(ps.outbox, 3); /* published, created exactly key_ttl ago: inclusive */
    assert_true(ps.batches >= 3);   /* batch of 1 row */
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), 2);
    /* far past every expiry, batch of 1: still only terminal calls; old published rows go */
    memset(&ps, 0, sizeof ps);
    assert_int_equal(oq_store_purge(f->db, exp + 10 * OQ_DEFAULT_KEY_TTL_MS, OQ_DEFAULT_KEY_TTL_MS,
                                    1, &ps, &err),
                     0);
    assert_int_equal(ps.calls, 0);
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), 2);
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), 0);
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM audit WHERE call_id='%s'", a.call_id);
    assert_int_equal(count(f->db, sql), 0);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM result_inbox WHERE call_id='%s'", a.call_id);
    assert_int_equal(count(f->db, sql), 0);
    assert_int_equal(oq_producer_get(f->p, b.call_id, &g, NULL), 0);
    oq_call_clear(&g);
    /* a key reused after its retention is a new call */
    oq_submit_outcome_t oc;
    oq_call_t n = {0};
    assert_int_equal(submit(f->p, NULL, "p1", "charge", "{\"amount\":1}", &n, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_NEW);
    assert_string_not_equal(n.call_id, a.call_id);
    /* expired but not yet purged terminal call: also new */
    assert_int_equal(apply(f, n.call_id, "pm3", "succeeded", 1, NULL, "e9", &ro), 0);
    assert_int_equal(oq_db_exec(f->db, "UPDATE calls SET expires_at=1 WHERE idem_key='p1'", &err),
                     0);
    oq_call_t m = {0};
    assert_int_equal(submit(f->p, NULL, "p1", "charge", "{\"amount\":1}", &m, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_NEW);
    assert_string_not_equal(m.call_id, n.call_id);
    /* expired but still pending: never replaced */
    assert_int_equal(oq_db_exec(f->db, "UPDATE calls SET expires_at=1 WHERE idem_key='p3'", &err),
                     0);
    oq_call_t q = {0};
    assert_int_equal(submit(f->p, NULL, "p3", "charge", "{\"amount\":3}", &q, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_REPLAY);
    assert_string_equal(q.call_id, c.call_id);
    /* needs_review is not settled either: an operator may still decide, so the key keeps its
     * call (never replaced, never purged) whatever its age; retention starts when it settles */
    oq_call_clear(&q);
    assert_int_equal(apply(f, b.call_id, "pm4", "needs_review", 1,
                           "{\"code\":\"no_lookup_no_keys\",\"message\":\"x\"}", NULL, &ro),
                     0);
    assert_int_equal(ro, OQ_RESULT_APPLIED);
    assert_int_equal(oq_db_exec(f->db, "UPDATE calls SET expires_at=1 WHERE idem_key='p2'", &err),
                     0);
    assert_int_equal(submit(f->p, NULL, "p2", "charge", "{\"amount\":2}", &q, &oc), 0);
    assert_int_equal(oc, OQ_SUBMIT_REPLAY);
    assert_string_equal(q.call_id, b.call_id);
    assert_string_equal(q.state, "needs_review");
    memset(&ps, 0, sizeof ps);
    assert_int_equal(oq_store_purge(f->db, exp + 10 * OQ_DEFAULT_KEY_TTL_MS, OQ_DEFAULT_KEY_TTL_MS,
                                    100, &ps, &err),
                     0);
    assert_int_equal(ps.calls, 0);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM calls WHERE call_id='%s'", b.call_id);
    assert_int_equal(count(f->db, sql), 1);
    int64_t t0 = oq_now_ms();
    assert_int_equal(apply(f, b.call_id, "pm5", "succeeded", 1, NULL, "e2", &ro), 0);
    assert_int_equal(ro, OQ_RESULT_APPLIED);
    assert_int_equal(oq_producer_get(f->p, b.call_id, &g, NULL), 0);
    assert_true(g.expires_at >= t0 + OQ_DEFAULT_KEY_TTL_MS);
    oq_call_clear(&g);
    /* rows above the relay's watermark are never purged, however old */
    int64_t unpublished = count(f->db, "SELECT count(*) FROM outbox_unpublished");
    assert_true(unpublished >= 2);
    assert_int_equal(oq_db_exec(f->db, "UPDATE outbox SET created_at=1", &err), 0);
    memset(&ps, 0, sizeof ps);
    assert_int_equal(oq_store_purge(f->db, exp + 10 * OQ_DEFAULT_KEY_TTL_MS, OQ_DEFAULT_KEY_TTL_MS,
                                    100, &ps, &err),
                     0);
    assert_int_equal(ps.outbox, 0);
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), unpublished);
    oq_call_clear(&a);
    oq_call_clear(&b);
    oq_call_clear(&c);
    oq_call_clear(&n);
    oq_call_clear(&m);
    oq_call_clear(&q);
}

/* Many blocking submitters share group commits and every one gets its own call. */
typedef struct many {
    oq_producer_t *p;
    int id;
    int fails;
} many_t;

static void *many_main(void *arg)
{
    many_t *m = arg;
    for (int i = 0; i < 200; i++) {
        char key[64];
        snprintf(key, sizeof key, "m-%d-%d", m->id, i);
        json_t *args = json_pack("{s:i}", "amount", i + 1);
        oq_submit_req_t req = {NULL, key, "charge", args, NULL, 0, 0, NULL};
        oq_submit_outcome_t oc;
        if (oq_producer_submit(m->p, &req, NULL, &oc, NULL) != 0 || oc != OQ_SUBMIT_NEW) m->fails++;
        json_decref(args);
    }
    return NULL;
}

static void test_group_commit_many(void **state)
{
    fx_t *f = *state;
    enum { N = 8 };
    pthread_t th[N];
    many_t m[N];
    for (int i = 0; i < N; i++) {
        m[i] = (many_t){f->p, i, 0};
        pthread_create(&th[i], NULL, many_main, &m[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(m[i].fails, 0);
    }
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls"), N * 200);
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), N * 200);
}

/* The fingerprint of canonical args text is the fingerprint of the tree, and the call JSON
 * (one writer, oq_call_render; oq_call_to_json is its text parsed) is the documented object
 * with every member in order. */
static void test_fingerprint_and_render(void **state)
{
    (void)state;
    static const char *const tenants[] = {"default", "t\"q", "back\\slash", " sp ace",
                                          "~!@#$%^&*()"};
    static const char *const argss[] = {"{}", "{\"b\":1.0,\"a\":[1e2,\"\\u00e9\\n\"]}",
                                        "{\"z\":{\"y\":null,\"x\":true},\"\\u20ac\":-0.5}"};
    for (size_t i = 0; i < sizeof tenants / sizeof tenants[0]; i++) {
        for (size_t k = 0; k < sizeof argss / sizeof argss[0]; k++) {
            json_t *args = json_loads(argss[k], 0, NULL);
            assert_non_null(args);
            char *canon = NULL;
            size_t cl = 0;
            char a[OQ_FINGERPRINT_LEN + 1], b[OQ_FINGERPRINT_LEN + 1];
            assert_int_equal(oq_jcs_canonicalize(args, &canon, &cl, NULL), 0);
            assert_int_equal(oq_fingerprint(tenants[i], "send_email", args, a, NULL), 0);
            assert_int_equal(oq_fingerprint_canon(tenants[i], "send_email", canon, cl, b, NULL), 0);
            assert_string_equal(a, b);
            free(canon);
            json_decref(args);
        }
    }
    oq_call_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.call_id, sizeof c.call_id, "c_0123456789abcdef");
    snprintf(c.fingerprint, sizeof c.fingerprint, "%064d", 7);
    snprintf(c.state, sizeof c.state, "failed");
    c.tenant = strdup("t\"\\x");
    c.idem_key = strdup("key with \"quotes\"");
    c.tool = strdup("charge");
    c.args = strdup("{\"a\":1}");
    c.error = strdup("{\"code\":\"x\",\"message\":\"caf\xc3\xa9\",\"retryable\":true}");
    c.effect_id = strdup("e\x01");
    c.attempt = 3;
    c.has_seq = 1;
    c.seq = 42;
    c.created_at = 1700000000123;
    c.updated_at = c.created_at + 1;
    c.expires_at = c.created_at + 2;
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(oq_call_render(&c, &text, &len), 0);
    assert_int_equal(strlen(text), len);
    json_t *r = json_loads(text, 0, NULL);
    assert_non_null(r);
    /* the oracle, member by member */
    json_t *want = json_pack(
        "{s:s,s:s,s:s,s:s,s:s,s:{s:i},s:s,s:i,s:n,s:{s:s,s:s,s:b},s:s,s:n,s:i,s:s,s:s,s:s,s:n,"
        "s:s}",
        "call_id", "c_0123456789abcdef", "tenant", "t\"\\x", "idem_key", "key with \"quotes\"",
        "fingerprint", c.fingerprint, "tool", "charge", "args", "a", 1, "status", "failed",
        "attempt", 3, "result", "error", "code", "x", "message", "caf\xc3\xa9", "retryable", 1,
        "effect_id", "e\x01", "client_id", "seq", 42, "created_at", "2023-11-14T22:13:20.123Z",
        "updated_at", "2023-11-14T22:13:20.124Z", "expires_at", "2023-11-14T22:13:20.125Z",
        "callback_url", "query_url", "/v1/tool-calls/c_0123456789abcdef");
    assert_non_null(want);
    if (!json_equal(r, want)) fail_msg("rendered %s", text);
    static const char *const order[] = {
        "call_id", "tenant",     "idem_key",   "fingerprint", "tool",         "args",
        "status",  "attempt",    "result",     "error",       "effect_id",    "client_id",
        "seq",     "created_at", "updated_at", "expires_at",  "callback_url", "query_url"};
    const char *at = text;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        char k[32];
        snprintf(k, sizeof k, "\"%s\":", order[i]);
        const char *p = strstr(at, k);
        if (!p) fail_msg("member %s missing or out of order in %s", order[i], text);
        at = p;
    }
    json_t *tree = oq_call_to_json(&c);
    assert_non_null(tree);
    assert_true(json_equal(tree, want));
    /* without a sequence number: null */
    c.has_seq = 0;
    free(text);
    assert_int_equal(oq_call_render(&c, &text, &len), 0);
    assert_non_null(strstr(text, ",\"seq\":null,"));
    json_decref(r);
    json_decref(tree);
    json_decref(want);
    free(text);
    oq_call_clear(&c);
}

/* The hot-path envelope of a first attempt is byte for byte oq_envelope_encode()'s, and call
 * ids are well-formed, distinct and time-ordered (index locality). */
static void test_job_envelope_and_ids(void **state)
{
    (void)state;
    static const char *const keys[] = {"k1", "key with \"quotes\" and \\", " ~x~ "};
    static const char *const tenants[] = {NULL, "t\"q", "back\\slash"};
    static const char *const argss[] = {"{}", "{\"b\":1.0,\"a\":[1e2,\"\\u00e9\\n\"]}",
                                        "{\"z\":{\"y\":null,\"x\":true},\"\\u20ac\":-0.5}"};
    char prev[OQ_CALL_ID_LEN + 1] = "";
    for (size_t i = 0; i < 3; i++) {
        json_t *args = json_loads(argss[i], 0, NULL);
        assert_non_null(args);
        oq_submit_req_t req = {tenants[i], keys[i], "send_email", args, NULL, 0, 0, NULL};
        oq_submit_job_t *job = NULL;
        assert_int_equal(oq_submit_job_new(&req, &job, NULL), 0);
        oq_envelope_t e;
        memset(&e, 0, sizeof e);
        e.v = OQ_ENVELOPE_VERSION;
        e.kind = OQ_KIND_TOOL_CALL;
        memcpy(e.message_id, job->message_id, sizeof e.message_id);
        memcpy(e.call_id, job->call_id, sizeof e.call_id);
        e.tenant = job->tenant;
        e.idem_key = job->idem_key;
        memcpy(e.fingerprint, job->fingerprint, sizeof e.fingerprint);
        e.tool = job->tool;
        e.attempt = 1;
        e.created_at = job->created_at;
        e.args = args;
        char *ref = NULL;
        size_t rl = 0;
        assert_int_equal(oq_envelope_encode(&e, &ref, &rl, NULL), 0);
        assert_int_equal(job->payload_len, rl);
        assert_string_equal(job->payload, ref);
        oq_envelope_t d;
        assert_int_equal(oq_envelope_decode(job->payload, job->payload_len, &d, NULL), 0);
        oq_envelope_clear(&d);
        free(ref);
        /* a redrawn id re-renders the envelope with the new ids */
        char old[OQ_CALL_ID_LEN + 1];
        memcpy(old, job->call_id, sizeof old);
        assert_int_equal(oq__job_new_ids(job, NULL), 0);
        assert_string_not_equal(old, job->call_id);
        assert_non_null(strstr(job->payload, job->call_id));
        assert_null(strstr(job->payload, old));
        assert_int_equal(strlen(job->call_id), OQ_CALL_ID_LEN);
        assert_true(strncmp(job->call_id, "c_", 2) == 0);
        assert_int_equal(strspn(job->call_id + 2, "0123456789abcdef"), 32);
        oq_submit_job_destroy(job);
        json_decref(args);
    }
    /* ids drawn later never sort before ids of an earlier millisecond */
    json_t *args = json_object();
    for (int i = 0; i < 200; i++) {
        oq_submit_req_t req = {NULL, "k", "charge", args, NULL, 0, 0, NULL};
        oq_submit_job_t *job = NULL;
        assert_int_equal(oq_submit_job_new(&req, &job, NULL), 0);
        if (*prev && strncmp(prev, job->call_id, 2 + 10) > 0)
            fail_msg("%s after %s", job->call_id, prev);
        memcpy(prev, job->call_id, sizeof prev);
        oq_submit_job_destroy(job);
        if (i % 50 == 0) usleep(2000);
    }
    json_decref(args);
}

/* The decision redraws a call id the store reports as taken (time-ordered ids can collide):
 * the call is new under another id, its outbox row carries that id, the other call is intact.
 * And the store's retry-reset refuses a call that is not failed at the previous attempt. */
static void test_call_id_taken(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    json_t *args = json_pack("{s:i}", "amount", 4);
    oq_submit_req_t req = {NULL, "collide", "charge", args, NULL, 0, 0, NULL};
    oq_submit_job_t *job = NULL;
    assert_int_equal(oq_submit_job_new(&req, &job, &err), 0);
    char taken[OQ_CALL_ID_LEN + 1];
    memcpy(taken, job->call_id, sizeof taken);
    /* another key already holds the job's call id */
    char sql[512];
    snprintf(sql, sizeof sql,
             "INSERT INTO calls(call_id,tenant,idem_key,fingerprint,tool,args,state,attempt,"
             "created_at,updated_at,expires_at) VALUES('%s','default','other','f','charge','{}',"
             "'pending',1,1,1,9999999999999)",
             taken);
    assert_int_equal(oq_db_exec(f->db, sql, &err), 0);
    assert_int_equal(oq_db_begin_immediate(f->db, 5000, &err), 0);
    oq__producer_store_t st = {f->db, NULL, NULL};
    assert_int_equal(oq__decide_submit(&st, job, 1000, OQ_DEFAULT_KEY_TTL_MS,
                                       OQ_DEFAULT_MAX_MESSAGE_BYTES, &err),
                     0);
    assert_int_equal(oq_db_commit(f->db, &err), 0);
    oq__job_finish_new(job);
    assert_int_equal(job->outcome, OQ_SUBMIT_NEW);
    assert_string_not_equal(job->call.call_id, taken);
    assert_non_null(strstr(job->payload, job->call.call_id));
    snprintf(sql, sizeof sql, "SELECT idem_key FROM calls WHERE call_id='%s'", taken);
    text_is(f->db, sql, "other");
    snprintf(sql, sizeof sql, "SELECT key FROM outbox WHERE message_id='%s'", job->message_id);
    text_is(f->db, sql, job->call.call_id);
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), 1);

    /* reset of a pending call: refused, nothing written */
    oq__producer_attempt_t a = {
        job->call.call_id, 2, 2000, 3000, "0190f3a2-7b1c-7d2e-8f30-1a2b3c4d5e6f", "{}", 2};
    assert_int_equal(oq_db_begin_immediate(f->db, 5000, &err), 0);
    assert_int_equal(oq__producer_store_reset_call(&st, &a, &err), OQ_ESTATE);
    assert_int_equal(oq_db_commit(f->db, &err), 0);
    assert_int_equal(count(f->db, "SELECT count(*) FROM outbox"), 1);
    snprintf(sql, sizeof sql, "SELECT state||attempt FROM calls WHERE call_id='%s'",
             job->call.call_id);
    text_is(f->db, sql, "pending1");
    oq_submit_job_destroy(job);
    json_decref(args);
}

/* Results go through the producer's writer (oq_producer_apply_results) while submitters run:
 * applied once, duplicates and unknown calls counted, a bad status refused, and the stats
 * (which count pending as all minus the settled index) agree with the rows. */
typedef struct sub_arg {
    oq_producer_t *p;
    int id, fails;
} sub_arg_t;

static void *sub_main(void *arg)
{
    sub_arg_t *a = arg;
    for (int i = 0; i < 100; i++) {
        char key[32];
        snprintf(key, sizeof key, "w%d-%d", a->id, i);
        json_t *args = json_pack("{s:i}", "amount", i + 1);
        oq_submit_req_t req = {NULL, key, "charge", args, NULL, 0, 0, NULL};
        oq_submit_outcome_t oc;
        if (oq_producer_submit(a->p, &req, NULL, &oc, NULL) != 0 || oc != OQ_SUBMIT_NEW) a->fails++;
        json_decref(args);
    }
    return NULL;
}

static void fill_result(oq_envelope_t *e, const char *call_id, const char *status,
                        const char *effect_id)
{
    memset(e, 0, sizeof *e);
    e->v = 1;
    e->kind = OQ_KIND_TOOL_RESULT;
    oq_id_uuid(e->message_id);
    snprintf(e->call_id, sizeof e->call_id, "%.*s", OQ_CALL_ID_LEN, call_id);
    e->attempt = 1;
    e->status = (char *)status;
    e->effect_id = (char *)effect_id;
}

static void test_results_through_writer(void **state)
{
    fx_t *f = *state;
    enum { N = 20 };
    oq_call_t calls[N];
    for (int i = 0; i < N; i++) {
        char key[16];
        snprintf(key, sizeof key, "r%d", i);
        memset(&calls[i], 0, sizeof calls[i]);
        assert_int_equal(submit(f->p, NULL, key, "charge", "{\"amount\":1}", &calls[i], NULL), 0);
    }
    pthread_t th[4];
    sub_arg_t sa[4];
    for (int i = 0; i < 4; i++) {
        sa[i] = (sub_arg_t){f->p, i, 0};
        pthread_create(&th[i], NULL, sub_main, &sa[i]);
    }
    /* running for all, succeeded for the first half (each twice: same message id), one
     * unknown call, one bad status */
    oq_envelope_t env[2 * N + N / 2 + 2];
    oq_result_outcome_t oc[2 * N + N / 2 + 2];
    int n = 0;
    for (int i = 0; i < N; i++)
        fill_result(&env[n++], calls[i].call_id, "running", NULL);
    assert_int_equal(oq_producer_apply_results(f->p, env, n, oc, NULL), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(oc[i], OQ_RESULT_APPLIED);
    n = 0;
    for (int i = 0; i < N / 2; i++) {
        fill_result(&env[n], calls[i].call_id, "succeeded", "eff");
        env[n + 1] = env[n];
        n += 2;
    }
    fill_result(&env[n++], "c_00000000deadbeef", "succeeded", NULL);
    fill_result(&env[n++], calls[0].call_id, "bogus", NULL);
    assert_int_equal(oq_producer_apply_results(f->p, env, n, oc, NULL), 0);
    for (int i = 0; i < N; i += 2) {
        assert_int_equal(oc[i], OQ_RESULT_APPLIED);
        assert_int_equal(oc[i + 1], OQ_RESULT_DUPLICATE);
    }
    assert_int_equal(oc[N], OQ_RESULT_UNKNOWN_CALL);
    assert_int_equal(oc[N + 1], 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(sa[i].fails, 0);
    }
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls WHERE state='succeeded'"), N / 2);
    assert_int_equal(count(f->db, "SELECT count(*) FROM calls WHERE state='running'"), N / 2);
    assert_int_equal(count(f->db, "SELECT count(*) FROM audit WHERE event='succeeded'"), N / 2);
    assert_int_equal(count(f->db, "SELECT count(*) FROM result_inbox"), N + N / 2 + 1);
    json_t *st = NULL;
    assert_int_equal(oq_producer_stats(f->p, &st, NULL), 0);
    json_t *by = json_object_get(st, "by_status");
    assert_int_equal(json_integer_value(json_object_get(st, "calls")), N + 400);
    assert_int_equal(json_integer_value(json_object_get(by, "pending")), 400);
    assert_int_equal(json_integer_value(json_object_get(by, "running")), N / 2);
    assert_int_equal(json_integer_value(json_object_get(by, "succeeded")), N / 2);
    assert_int_equal(json_integer_value(json_object_get(by, "failed")), 0);
    assert_int_equal(json_integer_value(json_object_get(st, "effects")), 1);
    json_decref(st);
    for (int i = 0; i < N; i++)
        oq_call_clear(&calls[i]);
}

/* A database written by the first schema (calls with the IN check and calls_state) migrates
 * to the hot-path table with its rows, and keeps working. */
static void test_migration_from_v1(void **state)
{
    (void)state;
    char dir[] = "/tmp/oq-test-producer-mig.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/calls.db", dir);
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(path, NULL, &db, &err), 0);
    const char *v1[] = {oq_sql_file("common/0001_outbox.sql"),
                        oq_sql_file("producer/0001_init.sql"), NULL};
    assert_int_equal(oq_db_migrate_sql(db, v1, &err), 0);
    assert_int_equal(oq_db_exec(db,
                                "INSERT INTO calls(call_id,tenant,idem_key,fingerprint,tool,args,"
                                "state,created_at,updated_at,expires_at) VALUES"
                                "('c_0000000000000001','default','old','f','charge','{}',"
                                "'succeeded',1,1,9999999999999),"
                                "('c_0000000000000002','default','old2','f','charge','{}',"
                                "'pending',2,2,9999999999999)",
                                &err),
                     0);
    sqlite3_close_v2(db);
    oq_producer_t *p = NULL;
    assert_int_equal(oq_producer_open(path, NULL, &p, &err), 0);
    oq_call_t c;
    memset(&c, 0, sizeof c);
    assert_int_equal(oq_producer_get_by_key(p, NULL, "old", &c, NULL), 0);
    assert_string_equal(c.call_id, "c_0000000000000001");
    assert_string_equal(c.state, "succeeded");
    oq_call_clear(&c);
    assert_int_equal(submit(p, NULL, "new", "charge", "{}", &c, NULL), 0);
    oq_call_clear(&c);
    json_t *st = NULL;
    assert_int_equal(oq_producer_stats(p, &st, NULL), 0);
    assert_int_equal(json_integer_value(json_object_get(st, "calls")), 3);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(st, "by_status"), "pending")), 2);
    json_decref(st);
    oq_producer_close(p);
    assert_int_equal(oq_db_open(path, NULL, &db, &err), 0);
    assert_int_equal(count(db, "SELECT count(*) FROM sqlite_schema WHERE name='calls_state'"), 0);
    assert_int_equal(count(db, "SELECT count(*) FROM sqlite_schema WHERE name='calls_settled'"), 1);
    assert_int_equal(oq_db_exec(db, "UPDATE calls SET state='bogus'", &err), OQ_EDB); /* CHECK */
    sqlite3_close_v2(db);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* The background checkpointer keeps the WAL bounded under a steady stream of submits (its pass
 * plus the writer's finishing checkpoint let SQLite restart the WAL), and nothing is lost. */
static void test_background_checkpoint(void **state)
{
    (void)state;
    char dir[] = "/tmp/oq-test-producer-ckpt.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128], wal[140];
    snprintf(path, sizeof path, "%s/calls.db", dir);
    snprintf(wal, sizeof wal, "%s-wal", path);
    oq_producer_opts_t o;
    memset(&o, 0, sizeof o);
    o.checkpoint_pages = 20;
    oq_producer_t *p = NULL;
    assert_int_equal(oq_producer_open(path, &o, &p, NULL), 0);
    pthread_t th[4];
    sub_arg_t sa[4];
    for (int i = 0; i < 4; i++) {
        sa[i] = (sub_arg_t){p, i, 0};
        pthread_create(&th[i], NULL, sub_main, &sa[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(sa[i].fails, 0);
    }
    struct stat stw;
    assert_int_equal(stat(wal, &stw), 0);
    sqlite3 *db = NULL;
    assert_int_equal(oq_db_open(path, NULL, &db, NULL), 0);
    assert_int_equal(count(db, "SELECT count(*) FROM calls"), 400);
    assert_int_equal(count(db, "SELECT count(*) FROM outbox"), 400);
    /* 400 submits write well over 400 frames (two tables, four indexes); a WAL that never
     * restarted would hold them all */
    int64_t frames = ((int64_t)stw.st_size - 32) / (4096 + 24);
    if (frames > 300) fail_msg("WAL holds %lld frames: not restarted", (long long)frames);
    sqlite3_close_v2(db);
    oq_producer_close(p);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_key_replay_and_new_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conflict, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tenants_and_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_same_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retryable_failure_and_results, setup, teardown),
        cmocka_unit_test_setup_teardown(test_result_detail_escaping, setup, teardown),
        cmocka_unit_test(test_crash_after_commit),
        cmocka_unit_test_setup_teardown(test_delayed_response_retry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_in_tx, setup, teardown),
        cmocka_unit_test_setup_teardown(test_purge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_group_commit_many, setup, teardown),
        cmocka_unit_test(test_fingerprint_and_render),
        cmocka_unit_test(test_job_envelope_and_ids),
        cmocka_unit_test_setup_teardown(test_call_id_taken, setup, teardown),
        cmocka_unit_test_setup_teardown(test_results_through_writer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_review_resolution_applied, setup, teardown),
        cmocka_unit_test(test_migration_from_v1),
        cmocka_unit_test(test_background_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
