/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the invariant checker (chaos/verify.c): small producer and consumer databases
 * built by hand with the real migrations, one kind of violation injected per test, each must
 * be detected (and only where expected); a clean pair must come out clean. Two invariants are
 * enforced by the schemas themselves (UNIQUE(tenant, idem_key), UNIQUE effects.call_id); to
 * prove the checker does not merely trust them, those tests build databases whose tables lack
 * the constraint.
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
#include <jansson.h>

#include "ledger.h"
#include "oq_chaos.h"
#include "oq_db.h"
#include "oq_log.h"

typedef struct {
    char dir[64];
    char pdb[128];
    char cdb[128];
    sqlite3 *p;
    sqlite3 *c;
} fx_t;

#define FP_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define FP_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

static void exec_sql(sqlite3 *db, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void exec_sql(sqlite3 *db, const char *fmt, ...)
{
    char sql[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) fprintf(stderr, "SQL failed: %s\n  %s\n", msg ? msg : "?", sql);
    sqlite3_free(msg);
    assert_int_equal(rc, SQLITE_OK);
}

/* Open both databases; with \p migrate the real schemas, otherwise empty files. */
static fx_t *fx_new(int migrate)
{
    fx_t *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/oq-test-verify.XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->pdb, sizeof f->pdb, "%s/calls.db", f->dir);
    snprintf(f->cdb, sizeof f->cdb, "%s/effects.db", f->dir);
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(f->pdb, NULL, &f->p, &err), 0);
    assert_int_equal(oq_db_open(f->cdb, NULL, &f->c, &err), 0);
    if (migrate) {
        assert_int_equal(oq_db_migrate(f->p, oq_migrations_producer, &err), 0);
        assert_int_equal(oq_db_migrate(f->c, oq_migrations_consumer, &err), 0);
    }
    return f;
}

static void fx_free(fx_t *f)
{
    sqlite3_close_v2(f->p);
    sqlite3_close_v2(f->c);
    char path[160];
    static const char *const files[] = {
        "calls.db",       "calls.db-wal", "calls.db-shm", "effects.db",    "effects.db-wal",
        "effects.db-shm", "accepted",     "ledger.db",    "ledger.db-wal", "ledger.db-shm"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", f->dir, files[i]);
        unlink(path);
    }
    rmdir(f->dir);
    free(f);
}

static void add_call(fx_t *f, const char *id, const char *key, const char *fp, const char *tool,
                     const char *state)
{
    exec_sql(f->p,
             "INSERT INTO calls(call_id,tenant,idem_key,fingerprint,tool,args,state,attempt,"
             "created_at,updated_at,expires_at) VALUES('%s','default','%s','%s','%s','{}','%s',1,"
             "1000,2000,99999999)",
             id, key, fp, tool, state);
}

static void add_paudit(fx_t *f, const char *id, const char *event, int64_t ts)
{
    exec_sql(f->p, "INSERT INTO audit(ts,call_id,event) VALUES(%lld,'%s','%s')", (long long)ts, id,
             event);
}

static void add_exec(fx_t *f, const char *id, const char *fp, const char *tool, const char *state,
                     int attempt)
{
    exec_sql(f->c,
             "INSERT INTO executions(call_id,tenant,idem_key,fingerprint,tool,args,state,attempt,"
             "next_attempt_at,message_id,created_at,updated_at) VALUES('%s','default','k-%s','%s',"
             "'%s','{}','%s',%d,0,'m-%s',1000,2000)",
             id, id, fp, tool, state, attempt, id);
}

static void add_effect(fx_t *f, const char *id, const char *effect_id, const char *tool,
                       int attempt, int64_t ts)
{
    exec_sql(f->c,
             "INSERT INTO effects(effect_id,call_id,tool,attempt,fence,worker,created_at) "
             "VALUES('%s','%s','%s',%d,1,'w1',%lld)",
             effect_id, id, tool, attempt, (long long)ts);
}

static void add_caudit(fx_t *f, const char *id, const char *event, int attempt, int64_t ts)
{
    exec_sql(f->c,
             "INSERT INTO audit(ts,call_id,event,attempt,fence,worker) "
             "VALUES(%lld,'%s','%s',%d,1,'w1')",
             (long long)ts, id, event, attempt);
}

/* A succeeded effectful call with the full consumer trail. */
static void add_good(fx_t *f, const char *id, const char *tool)
{
    char key[64], eff[64];
    snprintf(key, sizeof key, "key-%s", id);
    snprintf(eff, sizeof eff, "e_%s", id);
    add_call(f, id, key, FP_A, tool, "succeeded");
    add_paudit(f, id, "submitted", 1000);
    add_paudit(f, id, "running", 1100);
    add_paudit(f, id, "succeeded", 1200);
    add_exec(f, id, FP_A, tool, "COMMITTED", 1);
    add_caudit(f, id, "planned", 1, 1010);
    add_caudit(f, id, "started", 1, 1020);
    add_effect(f, id, eff, tool, 1, 1030);
    add_caudit(f, id, "committed", 1, 1030);
}

/* The clean base every test starts from: two effectful successes, a sleep, a final failure. */
static void add_base(fx_t *f)
{
    add_good(f, "c_0000000000000001", "charge");
    add_good(f, "c_0000000000000002", "send_email");
    add_call(f, "c_0000000000000003", "key-3", FP_A, "sleep", "succeeded");
    add_exec(f, "c_0000000000000003", FP_A, "sleep", "COMMITTED", 1);
    add_caudit(f, "c_0000000000000003", "planned", 1, 1010);
    add_caudit(f, "c_0000000000000003", "started", 1, 1020);
    add_caudit(f, "c_0000000000000003", "committed", 1, 1030);
    add_call(f, "c_0000000000000004", "key-4", FP_A, "fail", "failed");
    add_exec(f, "c_0000000000000004", FP_A, "fail", "FAILED_FINAL", 1);
    add_caudit(f, "c_0000000000000004", "planned", 1, 1010);
    add_caudit(f, "c_0000000000000004", "started", 1, 1020);
    add_caudit(f, "c_0000000000000004", "failed_final", 1, 1030);
    add_paudit(f, "c_0000000000000004", "submitted", 1000);
    add_paudit(f, "c_0000000000000004", "failed", 1200);
}

static void run(fx_t *f, int allow_pending, oq_verify_report_t *rep)
{
    oq_verify_opts_t o = {.allow_pending = allow_pending, .max_examples = 5};
    oq_error_t err = {0};
    int rc = oq_verify_run(f->pdb, f->cdb, &o, rep, &err);
    if (rc) fprintf(stderr, "verify failed: %s\n", err.msg);
    assert_int_equal(rc, 0);
}

/* Exactly \p kind (with \p n rows) is reported, and an example names \p call_id. */
static void expect_only(const oq_verify_report_t *rep, int kind, int64_t n, const char *call_id)
{
    for (int k = 0; k < OQ__V_COUNT; k++) {
        if (k == kind) continue;
        if (rep->count[k])
            fprintf(stderr, "unexpected %s=%lld\n", oq_violation_name(k), (long long)rep->count[k]);
        assert_int_equal(rep->count[k], 0);
    }
    assert_int_equal(rep->count[kind], n);
    assert_int_equal(rep->violations, n);
    int found = 0;
    for (int i = 0; i < rep->nexamples; i++)
        if (rep->examples[i].kind == kind && strcmp(rep->examples[i].call_id, call_id) == 0)
            found = 1;
    assert_true(found);
}

static void test_clean(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    assert_int_equal(rep.violations, 0);
    assert_int_equal(rep.calls, 4);
    assert_int_equal(rep.by_state[2], 3);
    assert_int_equal(rep.by_state[3], 1);
    assert_int_equal(rep.effects, 2);
    assert_int_equal(rep.expected_effects, 2);
    assert_int_equal(rep.duplicates, 0);
    assert_int_equal(rep.lost, 0);
    assert_true(rep.dsr == 0.0);
    assert_int_equal(rep.nexamples, 0);
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_empty_is_clean(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    assert_int_equal(rep.violations, 0);
    assert_int_equal(rep.calls, 0);
    assert_true(rep.dsr == 0.0);
    oq_verify_report_clear(&rep);
    fx_free(f);
}

/* Databases without the UNIQUE constraints, to inject what the real schemas forbid. */
static void fx_bare_schema(fx_t *f)
{
    exec_sql(f->p, "CREATE TABLE calls(call_id TEXT, tenant TEXT, idem_key TEXT, fingerprint TEXT,"
                   " tool TEXT, args TEXT, state TEXT, attempt INTEGER, created_at INTEGER,"
                   " updated_at INTEGER, expires_at INTEGER);"
                   "CREATE TABLE audit(id INTEGER PRIMARY KEY, ts INTEGER, call_id TEXT,"
                   " event TEXT, detail TEXT)");
    exec_sql(f->c, "CREATE TABLE executions(call_id TEXT, tenant TEXT, idem_key TEXT,"
                   " fingerprint TEXT, tool TEXT, args TEXT, state TEXT, attempt INTEGER,"
                   " next_attempt_at INTEGER, message_id TEXT, created_at INTEGER,"
                   " updated_at INTEGER);"
                   "CREATE TABLE effects(effect_id TEXT, call_id TEXT, tool TEXT, attempt INTEGER,"
                   " fence INTEGER, worker TEXT, created_at INTEGER);"
                   "CREATE TABLE audit(id INTEGER PRIMARY KEY, ts INTEGER, call_id TEXT,"
                   " event TEXT, attempt INTEGER, fence INTEGER, worker TEXT, detail TEXT)");
}

static void test_dup_key(void **state)
{
    (void)state;
    fx_t *f = fx_new(0);
    fx_bare_schema(f);
    add_base(f);
    add_call(f, "c_0000000000000009", "key-3", FP_A, "sleep", "succeeded");
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_DUP_KEY, 1, "c_0000000000000003");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_dup_effect(void **state)
{
    (void)state;
    fx_t *f = fx_new(0);
    fx_bare_schema(f);
    add_base(f);
    add_effect(f, "c_0000000000000001", "e_second", "charge", 1, 1040);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_DUP_EFFECT, 1, "c_0000000000000001");
    assert_int_equal(rep.duplicates, 1);
    assert_int_equal(rep.effects, 3);
    assert_true(rep.dsr > 0.24 && rep.dsr < 0.26);
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_conflict_effect(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    exec_sql(f->c, "UPDATE executions SET fingerprint='%s' WHERE call_id='c_0000000000000002'",
             FP_B);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_CONFLICT_EFFECT, 1, "c_0000000000000002");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_unknown_call_effect(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    add_exec(f, "c_00000000000000ff", FP_A, "charge", "COMMITTED", 1);
    add_effect(f, "c_00000000000000ff", "e_ff", "charge", 1, 1030);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_UNKNOWN_CALL_EFFECT, 1, "c_00000000000000ff");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_not_terminal_and_allow_pending(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    add_call(f, "c_0000000000000005", "key-5", FP_A, "charge", "pending");
    add_call(f, "c_0000000000000006", "key-6", FP_A, "sleep", "running");
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_NOT_TERMINAL, 2, "c_0000000000000005");
    assert_int_equal(rep.lost, 2);
    assert_int_equal(rep.pending, 2);
    oq_verify_report_clear(&rep);

    run(f, 1, &rep);
    assert_int_equal(rep.violations, 0);
    assert_int_equal(rep.lost, 0);
    assert_int_equal(rep.pending, 2);
    assert_int_equal(rep.nexamples, 0);
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_succeeded_no_effect(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    add_call(f, "c_0000000000000007", "key-7", FP_A, "send_email", "succeeded");
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_SUCCEEDED_NO_EFFECT, 1, "c_0000000000000007");
    assert_int_equal(rep.lost, 1);
    assert_int_equal(rep.expected_effects, 3);
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_failed_with_effect(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    exec_sql(f->p, "UPDATE calls SET state='failed' WHERE call_id='c_0000000000000001'");
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_FAILED_WITH_EFFECT, 1, "c_0000000000000001");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_committed_no_effect(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    add_call(f, "c_0000000000000008", "key-8", FP_A, "charge", "failed");
    add_exec(f, "c_0000000000000008", FP_A, "charge", "COMMITTED", 1);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_COMMITTED_NO_EFFECT, 1, "c_0000000000000008");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_effect_not_committed(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    exec_sql(f->c, "UPDATE executions SET state='NEEDS_REVIEW' WHERE call_id='c_0000000000000002'");
    exec_sql(f->p, "UPDATE calls SET state='needs_review' WHERE call_id='c_0000000000000002'");
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_EFFECT_NOT_COMMITTED, 1, "c_0000000000000002");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_reexecuted_after_commit(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    add_caudit(f, "c_0000000000000003", "started", 1, 1050);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_REEXECUTED, 1, "c_0000000000000003");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_reexecuted_after_final_same_attempt(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    add_caudit(f, "c_0000000000000004", "started", 1, 1050);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_REEXECUTED, 1, "c_0000000000000004");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

/* A call an operator resolved after NEEDS_REVIEW (audit 'review_resolved'): its effect and
 * the producer's needs_review -> succeeded are clean; the same trail without the operator's
 * row is a re-execution, and a second resolution at the producer leaves a terminal state. */
static void add_reviewed(fx_t *f, const char *id, int resolved)
{
    add_call(f, id, "key-r", FP_A, "pay", "succeeded");
    add_paudit(f, id, "submitted", 1000);
    add_paudit(f, id, "running", 1100);
    add_paudit(f, id, "needs_review", 1200);
    add_paudit(f, id, "succeeded", 1500);
    add_exec(f, id, FP_A, "pay", "COMMITTED", 1);
    add_caudit(f, id, "started", 1, 1020);
    add_caudit(f, id, "unknown", 1, 1030);
    add_caudit(f, id, "needs_review", 1, 1040);
    if (resolved) add_caudit(f, id, "review_resolved", 1, 1400);
    add_caudit(f, id, "committed", 1, 1400);
    add_effect(f, id, "e_r", "pay", 1, 1400);
}

static void test_review_resolution(void **state)
{
    (void)state;
    oq_verify_report_t rep;
    fx_t *f = fx_new(1);
    add_base(f);
    add_reviewed(f, "c_0000000000000009", 1);
    run(f, 0, &rep);
    assert_int_equal(rep.violations, 0);
    oq_verify_report_clear(&rep);
    add_paudit(f, "c_0000000000000009", "failed", 1600); /* a second resolution */
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_TERMINAL_LEFT, 1, "c_0000000000000009");
    oq_verify_report_clear(&rep);
    fx_free(f);
    f = fx_new(1);
    add_base(f);
    add_reviewed(f, "c_0000000000000009", 0);
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_REEXECUTED, 2, "c_0000000000000009"); /* the run and the effect */
    oq_verify_report_clear(&rep);
    fx_free(f);
}

/* The downstream's ledger as a third input: its DSR, a key with two effects, and an effect
 * whose downstream id the ledger does not hold. */
static void ledger_pay(oq__ledger_t *l, const char *id, const char *key, const char *ref)
{
    oq_error_t err = {0};
    oq__ds_payment_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.id, sizeof p.id, "%s", id);
    p.idem_key = key ? strdup(key) : NULL;
    p.reference = ref ? strdup(ref) : NULL;
    p.amount = 1;
    snprintf(p.currency, sizeof p.currency, "EUR");
    p.request = strdup("{}");
    p.created_at = 1000;
    assert_int_equal(oq__ledger_insert(l, &p, &err), 0);
    oq__ds_payment_clear(&p);
}

/* Issue 17, item 1: a key whose call is still in review was given a second call, which
 * executed: one key, two calls that may each have charged. A key reused after its first call
 * settled (and expired) is a new call, not reported. */
static void test_key_reexecuted(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    /* the old call: in review at the consumer, forgotten by the producer */
    add_exec(f, "c_0000000000000010", FP_A, "pay", "NEEDS_REVIEW", 1);
    exec_sql(f->c, "UPDATE executions SET idem_key='order-7', effect_id='e_10' WHERE "
                   "call_id='c_0000000000000010'");
    /* the new call of the same key, created while the old one waits: executed */
    add_good(f, "c_0000000000000011", "charge");
    exec_sql(f->c, "UPDATE executions SET idem_key='order-7', created_at=3000, updated_at=3100 "
                   "WHERE call_id='c_0000000000000011'");
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_KEY_REEXECUTED, 1, "c_0000000000000011");
    oq_verify_report_clear(&rep);
    /* the old call resolved (committed) after the new one was created: still reported */
    exec_sql(f->c, "UPDATE executions SET state='COMMITTED', updated_at=4000 WHERE "
                   "call_id='c_0000000000000010'");
    add_effect(f, "c_0000000000000010", "e_10", "pay", 1, 4000);
    run(f, 0, &rep);
    assert_int_equal(rep.count[OQ_V_KEY_REEXECUTED], 1);
    oq_verify_report_clear(&rep);
    /* settled before the new call was created: a key reused after its retention, clean */
    exec_sql(f->c, "UPDATE executions SET updated_at=2500 WHERE call_id='c_0000000000000010'");
    exec_sql(f->c, "UPDATE effects SET created_at=2500 WHERE call_id='c_0000000000000010'");
    run(f, 0, &rep);
    assert_int_equal(rep.count[OQ_V_KEY_REEXECUTED], 0);
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_downstream_ledger(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    char ldb[160];
    snprintf(ldb, sizeof ldb, "%s/ledger.db", f->dir);
    oq__ledger_t *l = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq__ledger_open(ldb, "OFF", 0, &l, &err), 0);
    assert_int_equal(oq__ledger_begin(l, &err), 0);
    ledger_pay(l, "pay_0000000000000001", "e_0000000000000001", NULL);
    ledger_pay(l, "pay_0000000000000002", NULL, "e_0000000000000002");
    assert_int_equal(oq__ledger_commit(l, &err), 0);
    exec_sql(f->c, "UPDATE effects SET downstream_id = 'pay_0000000000000001' "
                   "WHERE call_id = 'c_0000000000000001'");
    oq_verify_opts_t o = {.max_examples = 5, .downstream_db = ldb};
    oq_verify_report_t rep;
    assert_int_equal(oq_verify_run(f->pdb, f->cdb, &o, &rep, &err), 0);
    assert_int_equal(rep.violations, 0);
    assert_true(rep.has_downstream);
    assert_int_equal(rep.ds_effects, 2);
    assert_int_equal(rep.ds_calls, 2);
    oq_verify_report_clear(&rep);
    /* a resend that the downstream did not deduplicate, and a downstream id nobody holds */
    assert_int_equal(oq__ledger_begin(l, &err), 0);
    ledger_pay(l, "pay_0000000000000003", "e_0000000000000001", NULL);
    assert_int_equal(oq__ledger_commit(l, &err), 0);
    exec_sql(f->c, "UPDATE effects SET downstream_id = 'pay_ffffffffffffffff' "
                   "WHERE call_id = 'c_0000000000000002'");
    assert_int_equal(oq_verify_run(f->pdb, f->cdb, &o, &rep, &err), 0);
    assert_int_equal(rep.count[OQ_V_DOWNSTREAM_DUP], 1);
    assert_int_equal(rep.count[OQ_V_DOWNSTREAM_MISSING], 1);
    assert_int_equal(rep.violations, 2);
    assert_int_equal(rep.ds_duplicates, 1);
    assert_true(rep.ds_dsr > 0.49 && rep.ds_dsr < 0.51);
    int seen = 0;
    for (int i = 0; i < rep.nexamples; i++)
        seen |= rep.examples[i].kind == OQ_V_DOWNSTREAM_DUP &&
                strcmp(rep.examples[i].call_id, "c_0000000000000001") == 0;
    assert_true(seen);
    oq_verify_report_clear(&rep);
    oq__ledger_close(l);
    /* not a ledger: refused, not reported clean */
    o.downstream_db = f->pdb;
    assert_int_equal(oq_verify_run(f->pdb, f->cdb, &o, &rep, &err), OQ_EDB);
    fx_free(f);
}

/* A new producer attempt of a FAILED_FINAL call is allowed to run again (retry reset). */
static void test_new_attempt_after_final_is_clean(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    add_caudit(f, "c_0000000000000004", "planned", 2, 1050);
    add_caudit(f, "c_0000000000000004", "started", 2, 1060);
    add_caudit(f, "c_0000000000000004", "failed_final", 2, 1070);
    add_paudit(f, "c_0000000000000004", "retry_reset", 1300);
    add_paudit(f, "c_0000000000000004", "failed", 1400);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    assert_int_equal(rep.violations, 0);
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_effect_after_final_failure(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    /* An effect written after the attempt had failed finally (and the execution then,
     * wrongly, committed). */
    add_effect(f, "c_0000000000000004", "e_4", "fail", 1, 1100);
    exec_sql(f->c, "UPDATE executions SET state='COMMITTED' WHERE call_id='c_0000000000000004'");
    exec_sql(f->p, "UPDATE calls SET state='succeeded' WHERE call_id='c_0000000000000004'");
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_REEXECUTED, 1, "c_0000000000000004");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

/* The consumer's inline fast path leaves ONE audit row per call ('committed', detail
 * "inline: planned, started, try 1 ..."): that trail is clean, and a later start or a second
 * commit of the same call is still caught as a re-execution. */
static void add_good_inline(fx_t *f, const char *id)
{
    char key[64], eff[64];
    snprintf(key, sizeof key, "key-%s", id);
    snprintf(eff, sizeof eff, "e_%s", id);
    add_call(f, id, key, FP_A, "charge", "succeeded");
    add_paudit(f, id, "submitted", 1000);
    add_paudit(f, id, "running", 1100);
    add_paudit(f, id, "succeeded", 1200);
    add_exec(f, id, FP_A, "charge", "COMMITTED", 1);
    add_effect(f, id, eff, "charge", 1, 1030);
    add_caudit(f, id, "committed", 1, 1030);
}

static void test_inline_trail(void **state)
{
    (void)state;
    const char *later[] = {"started", "committed"};
    for (int i = 0; i < 3; i++) {
        fx_t *f = fx_new(1);
        add_base(f);
        add_good_inline(f, "c_0000000000000005");
        if (i < 2) add_caudit(f, "c_0000000000000005", later[i], 1, 1060);
        oq_verify_report_t rep;
        run(f, 0, &rep);
        if (i == 2) {
            assert_int_equal(rep.violations, 0);
            assert_int_equal(rep.effects, 3);
        } else {
            expect_only(&rep, OQ_V_REEXECUTED, 1, "c_0000000000000005");
        }
        oq_verify_report_clear(&rep);
        fx_free(f);
    }
}

static void test_terminal_left(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    add_paudit(f, "c_0000000000000001", "failed", 1300);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    expect_only(&rep, OQ_V_TERMINAL_LEFT, 1, "c_0000000000000001");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_accepted_missing(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    char path[160];
    snprintf(path, sizeof path, "%s/accepted", f->dir);
    FILE *a = fopen(path, "w");
    assert_non_null(a);
    fprintf(a, "c_0000000000000001\nc_0000000000000002\nc_00000000000000aa\n\n");
    fclose(a);
    oq_verify_opts_t o = {.accepted_file = path};
    oq_verify_report_t rep;
    oq_error_t err = {0};
    assert_int_equal(oq_verify_run(f->pdb, f->cdb, &o, &rep, &err), 0);
    expect_only(&rep, OQ_V_ACCEPTED_MISSING, 1, "c_00000000000000aa");
    oq_verify_report_clear(&rep);
    fx_free(f);
}

static void test_io_errors(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    oq_verify_report_t rep;
    oq_error_t err = {0};
    assert_int_equal(oq_verify_run("/nonexistent/calls.db", f->cdb, NULL, &rep, &err), OQ_EIO);
    assert_int_equal(oq_verify_run(f->pdb, "/nonexistent/effects.db", NULL, &rep, &err), OQ_EIO);
    /* Swapped databases: neither is the kind expected. */
    assert_int_equal(oq_verify_run(f->cdb, f->pdb, NULL, &rep, &err), OQ_EDB);
    assert_non_null(strstr(err.msg, "not a producer database"));
    fx_free(f);
}

/* The checker must not write: the files are byte-for-byte unchanged afterwards. */
static void test_read_only_and_json(void **state)
{
    (void)state;
    fx_t *f = fx_new(1);
    add_base(f);
    add_call(f, "c_0000000000000005", "key-5", FP_A, "charge", "pending");
    int64_t before = 0;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(f->p, "SELECT count(*) FROM calls", -1, &st, NULL), 0);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    before = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    oq_verify_report_t rep;
    run(f, 0, &rep);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_non_null(m);
    assert_int_equal(oq_verify_print(&rep, m, 1), 0);
    fclose(m);
    json_error_t je;
    json_t *j = json_loads(buf, 0, &je);
    assert_non_null(j);
    assert_false(json_is_true(json_object_get(j, "clean")));
    assert_int_equal(json_integer_value(json_object_get(j, "calls")), before);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "by_kind"), "not_terminal")), 1);
    json_decref(j);
    free(buf);
    buf = NULL;
    m = open_memstream(&buf, &len);
    assert_int_equal(oq_verify_print(&rep, m, 0), 0);
    fclose(m);
    assert_non_null(strstr(buf, "not_terminal"));
    assert_non_null(strstr(buf, "VIOLATIONS"));
    /* the effects line says what its number counts: the built-in effectful tools only (an
     * HTTP tool's effects are not "expected 0") */
    assert_non_null(strstr(buf, "(built-in charge/send_email: "));
    assert_non_null(strstr(buf, " succeeded calls, each must have one; other tools are not "
                                "counted here)"));
    free(buf);
    oq_verify_report_clear(&rep);
    fx_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean),
        cmocka_unit_test(test_empty_is_clean),
        cmocka_unit_test(test_dup_key),
        cmocka_unit_test(test_dup_effect),
        cmocka_unit_test(test_conflict_effect),
        cmocka_unit_test(test_unknown_call_effect),
        cmocka_unit_test(test_not_terminal_and_allow_pending),
        cmocka_unit_test(test_succeeded_no_effect),
        cmocka_unit_test(test_failed_with_effect),
        cmocka_unit_test(test_committed_no_effect),
        cmocka_unit_test(test_effect_not_committed),
        cmocka_unit_test(test_reexecuted_after_commit),
        cmocka_unit_test(test_reexecuted_after_final_same_attempt),
        cmocka_unit_test(test_new_attempt_after_final_is_clean),
        cmocka_unit_test(test_review_resolution),
        cmocka_unit_test(test_downstream_ledger),
        cmocka_unit_test(test_key_reexecuted),
        cmocka_unit_test(test_effect_after_final_failure),
        cmocka_unit_test(test_terminal_left),
        cmocka_unit_test(test_inline_trail),
        cmocka_unit_test(test_accepted_missing),
        cmocka_unit_test(test_io_errors),
        cmocka_unit_test(test_read_only_and_json),
    };
    oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
