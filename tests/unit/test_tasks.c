/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tasks (issue 19), the rules of producer/tasks.c and their rows:
 *  - validation: shapes, unique names, references to earlier steps only (bad_reference),
 *    irreversible steps after every compensated one (bad_task), and a run of mangled inputs
 *    that must all be refused cleanly;
 *  - references: a whole-string reference keeps the JSON type, an embedded one is spliced as
 *    text, a missing path is an error;
 *  - the state machine without a database;
 *  - on calls.db: submit writes the task and the first step's call (new / replay / conflict);
 *    each applied result writes the next call in the same transaction, a redelivered result
 *    changes nothing, a final failure compensates the succeeded steps in reverse order, a
 *    compensation that fails is retried with a new attempt of the same call and past its
 *    budget the task needs review; a step failing after an irreversible one needs review.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_chaos.h"
#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_producer.h"
#include "tasks.h"

static json_t *J(const char *text)
{
    json_error_t e;
    json_t *v = json_loads(text, JSON_DECODE_ANY, &e);
    if (!v) fprintf(stderr, "bad test JSON %s: %s\n", text, e.text);
    assert_non_null(v);
    return v;
}

/* --- validation ------------------------------------------------------------------------------ */

static const char *job_code(const char *body)
{
    json_t *b = J(body);
    oq_task_job_t *job = NULL;
    const char *code = NULL;
    oq_error_t err = {0};
    int rc = oq_task_job_new(NULL, "k1", b, &job, &code, &err);
    json_decref(b);
    oq_task_job_destroy(job);
    return rc == 0 ? "ok" : code;
}

static void test_validate(void **state)
{
    (void)state;
    const struct {
        const char *body, *code;
    } cases[] = {
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{}}]}", "ok"},
        {"{\"tenant\":\"shop\",\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{},"
         "\"compensate\":{\"tool\":\"refund\",\"args\":{\"id\":\"{steps.a.object_id}\"}}},"
         "{\"name\":\"b\",\"tool\":\"mail\",\"args\":{\"x\":\"id {steps.a.result.id.0}\"},"
         "\"irreversible\":true}]}",
         "ok"},
        {"{}", "bad_request"},
        {"[]", "bad_request"},
        {"{\"steps\":[]}", "bad_request"},
        {"{\"steps\":{}}", "bad_request"},
        {"{\"steps\":[1]}", "bad_request"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\"}]}", "bad_request"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":[]}]}", "bad_request"},
        {"{\"steps\":[{\"name\":\"a b\",\"tool\":\"pay\",\"args\":{}}]}", "bad_request"},
        {"{\"steps\":[{\"name\":\"\",\"tool\":\"pay\",\"args\":{}}]}", "bad_request"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"p y\",\"args\":{}}]}", "bad_request"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{},\"x\":1}]}", "bad_request"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{}}],\"extra\":1}", "bad_request"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{},\"irreversible\":1}]}",
         "bad_request"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{},\"compensate\":{\"tool\":"
         "\"r\"}}]}",
         "bad_request"},
        {"{\"tenant\":5,\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{}}]}", "bad_request"},
        /* unique names */
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{}},{\"name\":\"a\",\"tool\":"
         "\"pay\",\"args\":{}}]}",
         "bad_task"},
        /* references: to itself, to a later step, to an unknown one, malformed */
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{\"x\":\"{steps.a.result}\"}}]}",
         "bad_reference"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{\"x\":[\"{steps.b.result}\"]}},"
         "{\"name\":\"b\",\"tool\":\"pay\",\"args\":{}}]}",
         "bad_reference"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{\"x\":\"{steps.zz.object_id}\"}}]"
         "}",
         "bad_reference"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{}},{\"name\":\"b\",\"tool\":"
         "\"pay\",\"args\":{\"x\":\"{steps.a.result.}\"}}]}",
         "bad_reference"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{}},{\"name\":\"b\",\"tool\":"
         "\"pay\",\"args\":{\"x\":\"{steps.a.resul}\"}}]}",
         "bad_reference"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{}},{\"name\":\"b\",\"tool\":"
         "\"pay\",\"args\":{\"x\":\"{steps.a.result\"}}]}",
         "bad_reference"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{}},{\"name\":\"b\",\"tool\":"
         "\"pay\",\"args\":{\"x\":\"{steps.a..x}\"}}]}",
         "bad_reference"},
        /* a compensation may cite its own step, not a later one */
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{},\"compensate\":{\"tool\":"
         "\"r\",\"args\":{\"x\":\"{steps.b.object_id}\"}}},{\"name\":\"b\",\"tool\":\"pay\","
         "\"args\":{}}]}",
         "bad_reference"},
        /* irreversible before a compensated step; irreversible with a compensation */
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{},\"irreversible\":true},"
         "{\"name\":\"b\",\"tool\":\"pay\",\"args\":{},\"compensate\":{\"tool\":\"r\","
         "\"args\":{}}}]}",
         "bad_task"},
        {"{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{},\"irreversible\":true,"
         "\"compensate\":{\"tool\":\"r\",\"args\":{}}}]}",
         "bad_task"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = job_code(cases[i].body);
        if (strcmp(got, cases[i].code) != 0)
            fail_msg("case %zu: %s -> %s, want %s", i, cases[i].body, got, cases[i].code);
    }
    /* a key so long that a step's derived key would not fit */
    char key[260];
    memset(key, 'k', 250);
    key[250] = '\0';
    json_t *b = J("{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{}}]}");
    oq_task_job_t *job = NULL;
    const char *code = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_task_job_new(NULL, key, b, &job, &code, &err), OQ_EINVAL);
    assert_string_equal(code, "bad_task");
    assert_int_equal(oq_task_job_new(NULL, "", b, &job, &code, &err), OQ_EINVAL);
    assert_string_equal(code, "invalid_idempotency_key");
    json_decref(b);
}

/* Fuzz-ish: every prefix of a valid body, and each byte of it replaced, must either parse and
 * validate or be refused with one of the stable codes; never crash or leak. */
static void test_validate_mangled(void **state)
{
    (void)state;
    const char *good =
        "{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{\"n\":1},\"compensate\":{"
        "\"tool\":\"r\",\"args\":{\"id\":\"{steps.a.object_id}\"}}},{\"name\":\"b\",\"tool\":"
        "\"t\",\"args\":{\"c\":\"x{steps.a.result.k.0}y\"}}]}";
    size_t n = strlen(good);
    char buf[512];
    const char subst[] = "{}[]\".:,0a{";
    int accepted = 0, refused = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof subst - 1; k++) {
            memcpy(buf, good, n + 1);
            buf[i] = subst[k];
            json_t *b = json_loads(buf, 0, NULL);
            if (!b) continue;
            oq_task_job_t *job = NULL;
            const char *code = NULL;
            oq_error_t err = {0};
            int rc = oq_task_job_new(NULL, "key", b, &job, &code, &err);
            if (rc == 0) {
                accepted++;
            } else {
                assert_int_equal(rc, OQ_EINVAL);
                assert_true(strcmp(code, "bad_request") == 0 || strcmp(code, "bad_task") == 0 ||
                            strcmp(code, "bad_reference") == 0);
                assert_true(err.msg[0] != '\0');
                refused++;
            }
            oq_task_job_destroy(job);
            json_decref(b);
        }
    }
    assert_true(accepted > 0);
    assert_true(refused > 0);
}

/* --- references and the state machine -------------------------------------------------------- */

static void make_task(oq__task_t *t, const char *spec)
{
    memset(t, 0, sizeof *t);
    oq_error_t err = {0};
    assert_int_equal(oq__task_from_spec(t, J(spec), &err), 0);
    snprintf(t->row.status, sizeof t->row.status, "running");
    t->row.idem_key = strdup("k");
    t->row.tenant = strdup("default");
}

static void test_resolve(void **state)
{
    (void)state;
    oq__task_t t;
    make_task(&t, "{\"steps\":[{\"name\":\"pay\",\"tool\":\"p\",\"args\":{}},{\"name\":\"b\","
                  "\"tool\":\"p\",\"args\":{}}]}");
    t.steps[0].row.result = strdup("{\"object_id\":\"pay_7\",\"amount\":1999,\"lines\":[{\"sku\":"
                                   "\"x\"},{\"sku\":\"y\"}],\"ok\":true}");
    json_t *args = J("{\"whole\":\"{steps.pay.result.amount}\",\"obj\":\"{steps.pay.result.lines."
                     "1}\",\"id\":\"{steps.pay.object_id}\",\"text\":\"paid {steps.pay.result."
                     "amount} as {steps.pay.object_id}!\",\"deep\":[{\"b\":\"{steps.pay.result."
                     "ok}\"}],\"plain\":\"{not a ref}\",\"n\":3}");
    json_t *out = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq__task_resolve(&t, args, 1, 0, &out, &err), 0);
    json_t *want = J("{\"whole\":1999,\"obj\":{\"sku\":\"y\"},\"id\":\"pay_7\",\"text\":\"paid "
                     "1999 as pay_7!\",\"deep\":[{\"b\":true}],\"plain\":\"{not a ref}\",\"n\":3}");
    assert_true(json_equal(out, want));
    json_decref(out);
    json_decref(want);
    json_decref(args);
    /* a path that is not in the result, an index past the end: refused, with the reason */
    const char *bad[] = {"{\"x\":\"{steps.pay.result.nope}\"}",
                         "{\"x\":\"a {steps.pay.result.lines.9} b\"}",
                         "{\"x\":\"{steps.pay.result.amount.x}\"}"};
    for (size_t i = 0; i < 3; i++) {
        args = J(bad[i]);
        out = NULL;
        assert_int_equal(oq__task_resolve(&t, args, 1, 0, &out, &err), OQ_EINVAL);
        assert_null(out);
        assert_non_null(strstr(err.msg, "pay"));
        json_decref(args);
    }
    /* a step with no result yet (b, not run) cannot be cited */
    args = J("{\"x\":\"{steps.b.result}\"}");
    assert_int_equal(oq__task_resolve(&t, args, 2, 0, &out, &err), OQ_EINVAL);
    json_decref(args);
    oq__task_clear(&t);
}

static const char *SPEC3 =
    "{\"steps\":[{\"name\":\"charge\",\"tool\":\"pay\",\"args\":{\"amount\":5},\"compensate\":{"
    "\"tool\":\"refund\",\"args\":{\"payment\":\"{steps.charge.object_id}\"}}},{\"name\":"
    "\"ticket\",\"tool\":\"open\",\"args\":{\"charge\":\"{steps.charge.object_id}\",\"note\":"
    "\"paid {steps.charge.result.amount} EUR\"},\"compensate\":{\"tool\":\"close\",\"args\":{}}},"
    "{\"name\":\"email\",\"tool\":\"mail\",\"args\":{\"t\":\"{steps.ticket.object_id}\"}}]}";

static void test_state_machine(void **state)
{
    (void)state;
    oq__task_t t;
    size_t i = 99;
    make_task(&t, SPEC3);
    assert_int_equal(oq__task_next(&t, &i), OQ__TASK_START_STEP);
    assert_int_equal(i, 0);
    snprintf(t.steps[0].row.status, 16, "running");
    assert_int_equal(oq__task_next(&t, &i), OQ__TASK_WAIT); /* waits for step 0's result */
    oq__task_on_step(&t, 0, "succeeded", NULL);
    assert_int_equal(oq__task_next(&t, &i), OQ__TASK_START_STEP);
    assert_int_equal(i, 1);
    snprintf(t.steps[1].row.status, 16, "running");
    oq__task_on_step(&t, 1, "succeeded", NULL);
    oq__task_on_step(&t, 1, "failed", NULL); /* not running any more: ignored */
    assert_string_equal(t.steps[1].row.status, "succeeded");
    assert_int_equal(oq__task_next(&t, &i), OQ__TASK_START_STEP);
    snprintf(t.steps[2].row.status, 16, "running");
    oq__task_on_step(&t, 2, "failed", NULL);
    assert_string_equal(t.row.status, "compensating");
    assert_non_null(strstr(t.row.reason, "email"));
    /* reverse order: ticket first, then charge */
    assert_int_equal(oq__task_next(&t, &i), OQ__TASK_START_COMP);
    assert_int_equal(i, 1);
    snprintf(t.steps[1].row.status, 16, "compensating");
    t.steps[1].row.comp_attempts = 1;
    assert_int_equal(oq__task_next(&t, &i), OQ__TASK_WAIT);
    oq__task_on_comp(&t, 1, "failed", 1000); /* under budget: a retry is scheduled */
    assert_int_equal(t.steps[1].row.comp_next_at, 1000 + OQ_TASK_COMP_BACKOFF_MS);
    assert_string_equal(t.row.status, "compensating");
    t.steps[1].row.comp_next_at = 0;
    t.steps[1].row.comp_attempts = 2;
    oq__task_on_comp(&t, 1, "failed", 1000); /* backoff doubles */
    assert_int_equal(t.steps[1].row.comp_next_at, 1000 + 2 * OQ_TASK_COMP_BACKOFF_MS);
    t.steps[1].row.comp_next_at = 0;
    oq__task_on_comp(&t, 1, "succeeded", 2000);
    assert_string_equal(t.steps[1].row.status, "compensated");
    assert_int_equal(oq__task_next(&t, &i), OQ__TASK_START_COMP);
    assert_int_equal(i, 0);
    snprintf(t.steps[0].row.status, 16, "compensating");
    t.steps[0].row.comp_attempts = OQ_TASK_COMP_ATTEMPTS;
    oq__task_on_comp(&t, 0, "failed", 3000); /* budget spent: review, never compensated */
    assert_string_equal(t.row.status, "needs_review");
    assert_string_equal(t.steps[0].row.status, "needs_review");
    assert_non_null(strstr(t.row.reason, "charge"));
    assert_int_equal(oq__task_next(&t, &i), OQ__TASK_WAIT);
    assert_string_equal(t.row.status, "needs_review");
    oq__task_clear(&t);

    /* nothing to undo: failed; first step failing: the rest skipped */
    make_task(&t, "{\"steps\":[{\"name\":\"a\",\"tool\":\"p\",\"args\":{}},{\"name\":\"b\","
                  "\"tool\":\"p\",\"args\":{}}]}");
    snprintf(t.steps[0].row.status, 16, "running");
    oq__task_on_step(&t, 0, "failed", NULL);
    assert_string_equal(t.row.status, "failed");
    assert_string_equal(t.steps[1].row.status, "skipped");
    oq__task_clear(&t);

    /* a step failing after an irreversible one: review */
    make_task(&t, "{\"steps\":[{\"name\":\"a\",\"tool\":\"p\",\"args\":{},\"compensate\":{"
                  "\"tool\":\"r\",\"args\":{}}},{\"name\":\"b\",\"tool\":\"p\",\"args\":{},"
                  "\"irreversible\":true},{\"name\":\"c\",\"tool\":\"p\",\"args\":{}}]}");
    snprintf(t.steps[0].row.status, 16, "succeeded");
    snprintf(t.steps[1].row.status, 16, "succeeded");
    snprintf(t.steps[2].row.status, 16, "running");
    oq__task_on_step(&t, 2, "failed", NULL);
    assert_string_equal(t.row.status, "needs_review");
    assert_non_null(strstr(t.row.reason, "irreversible step b"));
    oq__task_clear(&t);

    /* a step that needs review: the task does */
    make_task(&t, SPEC3);
    snprintf(t.steps[0].row.status, 16, "running");
    oq__task_on_step(&t, 0, "needs_review", NULL);
    assert_string_equal(t.row.status, "needs_review");
    assert_string_equal(t.steps[2].row.status, "skipped");
    oq__task_clear(&t);
}

/* --- on calls.db ----------------------------------------------------------------------------- */

typedef struct fx {
    char dir[64], path[128];
    sqlite3 *db;
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/oq-test-tasks.XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/calls.db", f->dir);
    oq_error_t err = {0};
    if (oq_db_open(f->path, NULL, &f->db, &err) != 0) return -1;
    if (oq_producer_migrate(f->db, &err) != 0) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    sqlite3_close_v2(f->db);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0) return -1;
    free(f);
    return 0;
}

static char *text(sqlite3 *db, const char *fmt, ...)
{
    char sql[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof sql, fmt, ap);
    va_end(ap);
    sqlite3_stmt *st = NULL;
    char *out = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        out = strdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return out;
}

static int64_t num(sqlite3 *db, const char *fmt, const char *a)
{
    char *t = text(db, fmt, a);
    int64_t v = t ? strtoll(t, NULL, 10) : -1;
    free(t);
    return v;
}

static int submit(sqlite3 *db, const char *key, const char *body, oq_task_outcome_t *oc,
                  char task_id[OQ_TASK_ID_LEN + 1])
{
    json_t *b = J(body);
    oq_task_job_t *job = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_task_job_new(NULL, key, b, &job, NULL, &err), 0);
    json_decref(b);
    oq__producer_store_t s = {db, NULL, NULL};
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    int rc = oq__task_decide_submit(&s, job, oq_now_ms(), 0, 0, &err);
    assert_int_equal(oq_db_commit(db, &err), 0);
    const json_t *task = NULL;
    oq_task_job_result(job, oc, &task, NULL);
    if (task_id && task)
        snprintf(task_id, OQ_TASK_ID_LEN + 1, "%s",
                 json_string_value(json_object_get(task, "task_id")));
    oq_task_job_destroy(job);
    return rc;
}

/* Play the consumer: the result \p status of the current attempt of the call of \p key. */
static oq_result_outcome_t result(sqlite3 *db, const char *key, const char *status,
                                  const char *result_json, char msg_id[OQ_UUID_LEN + 1])
{
    char *cid = text(db, "SELECT call_id FROM calls WHERE idem_key='%s'", key);
    assert_non_null(cid);
    int64_t attempt = num(db, "SELECT attempt FROM calls WHERE call_id='%s'", cid);
    oq_envelope_t env;
    memset(&env, 0, sizeof env);
    env.v = OQ_ENVELOPE_VERSION;
    env.kind = OQ_KIND_TOOL_RESULT;
    if (msg_id && msg_id[0])
        snprintf(env.message_id, sizeof env.message_id, "%s", msg_id);
    else
        oq_id_uuid(env.message_id);
    if (msg_id) snprintf(msg_id, OQ_UUID_LEN + 1, "%s", env.message_id);
    snprintf(env.call_id, sizeof env.call_id, "%s", cid);
    env.attempt = attempt;
    env.created_at = oq_now_ms();
    env.status = (char *)status;
    env.result = result_json ? J(result_json) : NULL;
    env.error = strcmp(status, "failed") == 0
                    ? json_pack("{s:s,s:b}", "code", "declined", "retryable", 0)
                    : NULL;
    oq_error_t err = {0};
    oq_result_outcome_t oc = 0;
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    assert_int_equal(oq_store_apply_result(db, &env, oq_now_ms(), &oc, &err), 0);
    assert_int_equal(oq_db_commit(db, &err), 0);
    json_decref(env.result);
    json_decref(env.error);
    free(cid);
    return oc;
}

static char *task_status(sqlite3 *db, const char *id)
{
    return text(db, "SELECT status FROM tasks WHERE task_id='%s'", id);
}

static void expect(sqlite3 *db, const char *sql_fmt, const char *arg, const char *want)
{
    char *got = text(db, sql_fmt, arg);
    if (!got || strcmp(got, want) != 0)
        fail_msg("%s [%s]: got %s, want %s", sql_fmt, arg, got, want);
    free(got);
}

static void test_db_compensate_in_reverse(void **state)
{
    fx_t *f = *state;
    sqlite3 *db = f->db;
    char id[OQ_TASK_ID_LEN + 1] = "", id2[OQ_TASK_ID_LEN + 1] = "";
    oq_task_outcome_t oc = 0;
    assert_int_equal(submit(db, "order-1", SPEC3, &oc, id), 0);
    assert_int_equal(oc, OQ_TASK_NEW);
    assert_int_equal(strncmp(id, "t_", 2), 0);
    /* the task, its steps, and only the first step's call (with its outbox row) */
    expect(db, "SELECT status FROM tasks WHERE task_id='%s'", id, "running");
    expect(db, "SELECT group_concat(idem_key) FROM calls WHERE tenant='%s'", "default",
           "order-1/charge");
    expect(db, "SELECT count(*) FROM outbox WHERE key IN (SELECT call_id FROM calls WHERE %s)", "1",
           "1");
    /* the same key and body: the same task, nothing written; another body: conflict */
    assert_int_equal(submit(db, "order-1", SPEC3, &oc, id2), 0);
    assert_int_equal(oc, OQ_TASK_REPLAY);
    assert_string_equal(id, id2);
    assert_int_equal(submit(db, "order-1",
                            "{\"steps\":[{\"name\":\"a\",\"tool\":\"p\",\"args\":{}}]}", &oc, NULL),
                     OQ_ECONFLICT);
    assert_int_equal(oc, OQ_TASK_CONFLICT);
    expect(db, "SELECT count(*) FROM tasks WHERE %s", "1", "1");

    /* running changes nothing; succeeded writes step 2 with its arguments resolved */
    assert_int_equal(result(db, "order-1/charge", "running", NULL, NULL), OQ_RESULT_APPLIED);
    expect(db, "SELECT count(*) FROM calls WHERE %s", "1", "1");
    char mid[OQ_UUID_LEN + 1] = "";
    assert_int_equal(
        result(db, "order-1/charge", "succeeded", "{\"object_id\":\"pay_42\",\"amount\":5}", mid),
        OQ_RESULT_APPLIED);
    expect(db, "SELECT args FROM calls WHERE idem_key='%s'", "order-1/ticket",
           "{\"charge\":\"pay_42\",\"note\":\"paid 5 EUR\"}");
    /* the same result message again: a duplicate, nothing else written */
    assert_int_equal(
        result(db, "order-1/charge", "succeeded", "{\"object_id\":\"pay_42\",\"amount\":5}", mid),
        OQ_RESULT_DUPLICATE);
    expect(db, "SELECT count(*) FROM calls WHERE %s", "1", "2");
    assert_int_equal(result(db, "order-1/ticket", "succeeded", "{\"object_id\":\"T-1\"}", NULL),
                     OQ_RESULT_APPLIED);
    expect(db, "SELECT args FROM calls WHERE idem_key='%s'", "order-1/email", "{\"t\":\"T-1\"}");
    /* the third step is declined finally: ticket compensated first, then charge */
    assert_int_equal(result(db, "order-1/email", "failed", NULL, NULL), OQ_RESULT_APPLIED);
    expect(db, "SELECT status FROM tasks WHERE task_id='%s'", id, "compensating");
    expect(db, "SELECT group_concat(idem_key) FROM calls WHERE idem_key LIKE '%s'", "%/compensate",
           "order-1/ticket/compensate");
    assert_int_equal(result(db, "order-1/ticket/compensate", "succeeded", "{}", NULL),
                     OQ_RESULT_APPLIED);
    expect(db, "SELECT args FROM calls WHERE idem_key='%s'", "order-1/charge/compensate",
           "{\"payment\":\"pay_42\"}");
    expect(db, "SELECT status FROM task_steps WHERE idx=1 AND task_id='%s'", id, "compensated");
    assert_int_equal(result(db, "order-1/charge/compensate", "succeeded", "{}", NULL),
                     OQ_RESULT_APPLIED);
    expect(db, "SELECT status FROM tasks WHERE task_id='%s'", id, "compensated");
    expect(db,
           "SELECT group_concat(status) FROM (SELECT status FROM task_steps WHERE task_id='%s' "
           "ORDER BY idx)",
           id, "compensated,compensated,failed");
    /* every call of the task, once each: 3 steps + 2 compensations */
    expect(db, "SELECT count(*) FROM task_calls WHERE task_id='%s'", id, "5");
    expect(db, "SELECT count(*) FROM calls WHERE %s", "1", "5");

    /* the task's JSON */
    json_t *t = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_store_task_get(db, NULL, NULL, "order-1", &t, &err), 0);
    assert_string_equal(json_string_value(json_object_get(t, "status")), "compensated");
    json_t *s0 = json_array_get(json_object_get(t, "steps"), 0);
    assert_string_equal(json_string_value(json_object_get(s0, "object_id")), "pay_42");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(s0, "compensation"), "status")),
        "succeeded");
    json_decref(t);
    assert_int_equal(oq_store_task_get(db, "t_nope", NULL, NULL, &t, &err), OQ_ENOTFOUND);
}

/* The operators' list (`onceq tasks list`, the console): newest first, paged, filtered by
 * status, tenant, task id or key; the counts by status of one tenant or of all. */
static const char *ids_of(const json_t *page, char *buf, size_t cap)
{
    json_t *a = json_object_get(page, "tasks");
    buf[0] = 0;
    for (size_t i = 0; i < json_array_size(a); i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, "%s%s", l ? "," : "",
                 json_string_value(json_object_get(json_array_get(a, i), "idem_key")));
    }
    return buf;
}

static void test_db_operator_list(void **state)
{
    fx_t *f = *state;
    sqlite3 *db = f->db;
    char id[3][OQ_TASK_ID_LEN + 1];
    oq_task_outcome_t oc = 0;
#define ONE_STEP(tenant) "{" tenant "\"steps\":[{\"name\":\"a\",\"tool\":\"echo\",\"args\":{}}]}"
    assert_int_equal(submit(db, "k1", ONE_STEP(""), &oc, id[0]), 0);
    assert_int_equal(submit(db, "k2", ONE_STEP("\"tenant\":\"acme\","), &oc, id[1]), 0);
    assert_int_equal(submit(db, "k3", ONE_STEP(""), &oc, id[2]), 0);
#undef ONE_STEP
    result(db, "k1/a", "succeeded", "{}", NULL);
    oq_dbh_t h = {OQ_BACKEND_SQLITE, db, NULL, 1};
    oq_error_t err = {0};
    json_t *p = NULL;
    char b[256];
    oq_task_query_t q = {0};
    q.limit = 2;
    assert_int_equal(oq_producer_db_tasks(&h, &q, &p, &err), 0);
    assert_string_equal(ids_of(p, b, sizeof b), "k3,k2");
    q.before = json_integer_value(json_object_get(p, "next"));
    assert_true(q.before > 0);
    json_decref(p);
    assert_int_equal(oq_producer_db_tasks(&h, &q, &p, &err), 0);
    assert_string_equal(ids_of(p, b, sizeof b), "k1");
    assert_true(json_is_null(json_object_get(p, "next")));
    json_decref(p);
    oq_task_query_t by_status = {"running", NULL, NULL, NULL, 0, 50};
    assert_int_equal(oq_producer_db_tasks(&h, &by_status, &p, &err), 0);
    assert_string_equal(ids_of(p, b, sizeof b), "k3,k2");
    json_decref(p);
    oq_task_query_t by_tenant = {NULL, "acme", NULL, NULL, 0, 50};
    assert_int_equal(oq_producer_db_tasks(&h, &by_tenant, &p, &err), 0);
    assert_string_equal(ids_of(p, b, sizeof b), "k2");
    json_decref(p);
    /* by id: another tenant's task is not found */
    oq_task_query_t by_id = {NULL, "acme", id[0], NULL, 0, 50};
    assert_int_equal(oq_producer_db_tasks(&h, &by_id, &p, &err), 0);
    assert_string_equal(ids_of(p, b, sizeof b), "");
    json_decref(p);
    by_id.tenant = NULL;
    assert_int_equal(oq_producer_db_tasks(&h, &by_id, &p, &err), 0);
    assert_string_equal(ids_of(p, b, sizeof b), "k1");
    json_decref(p);
    /* by key: in one tenant (its unique index) or in all */
    oq_task_query_t by_key = {NULL, "acme", NULL, "k1", 0, 50};
    assert_int_equal(oq_producer_db_tasks(&h, &by_key, &p, &err), 0);
    assert_string_equal(ids_of(p, b, sizeof b), "");
    json_decref(p);
    by_key.tenant = NULL;
    assert_int_equal(oq_producer_db_tasks(&h, &by_key, &p, &err), 0);
    assert_string_equal(ids_of(p, b, sizeof b), "k1");
    json_decref(p);
    /* counts */
    assert_int_equal(oq_producer_db_task_counts(&h, NULL, &p, &err), 0);
    assert_int_equal(json_integer_value(json_object_get(p, "running")), 2);
    assert_int_equal(json_integer_value(json_object_get(p, "succeeded")), 1);
    json_decref(p);
    assert_int_equal(oq_producer_db_task_counts(&h, "acme", &p, &err), 0);
    assert_int_equal(json_integer_value(json_object_get(p, "running")), 1);
    assert_int_equal(json_integer_value(json_object_get(p, "succeeded")), 0);
    json_decref(p);
    /* the CLI's list: the first page */
    assert_int_equal(oq_store_task_list(db, "succeeded", 10, &p, &err), 0);
    assert_int_equal(json_array_size(p), 1);
    json_decref(p);
}

static void test_db_compensation_budget(void **state)
{
    fx_t *f = *state;
    sqlite3 *db = f->db;
    char id[OQ_TASK_ID_LEN + 1] = "";
    oq_task_outcome_t oc = 0;
    assert_int_equal(submit(db, "o2", SPEC3, &oc, id), 0);
    result(db, "o2/charge", "succeeded", "{\"object_id\":\"p1\",\"amount\":1}", NULL);
    result(db, "o2/ticket", "failed", NULL, NULL); /* step 2 declined: undo step 1 only */
    expect(db, "SELECT status FROM task_steps WHERE idx=2 AND task_id='%s'", id, "skipped");
    oq__producer_store_t s = {db, NULL, NULL};
    oq_error_t err = {0};
    for (int a = 1; a <= OQ_TASK_COMP_ATTEMPTS; a++) {
        char want[8];
        snprintf(want, sizeof want, "%d", a);
        expect(db, "SELECT attempt FROM calls WHERE idem_key='%s'", "o2/charge/compensate", want);
        result(db, "o2/charge/compensate", "failed", NULL, NULL);
        int n = 0;
        assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
        assert_int_equal(oq__task_retry_due(&s, oq_now_ms() - 1000, 0, &n, &err), 0);
        assert_int_equal(n, 0); /* not due before its backoff */
        assert_int_equal(oq__task_retry_due(&s, oq_now_ms() + 3600000, 0, &n, &err), 0);
        assert_int_equal(oq_db_commit(db, &err), 0);
        assert_int_equal(n, a < OQ_TASK_COMP_ATTEMPTS ? 1 : 0);
    }
    /* one call, four attempts (the same effect id at the consumer), then review */
    expect(db, "SELECT count(*) FROM calls WHERE idem_key='%s'", "o2/charge/compensate", "1");
    expect(db, "SELECT status FROM tasks WHERE task_id='%s'", id, "needs_review");
    char *reason = text(db, "SELECT reason FROM tasks WHERE task_id='%s'", id);
    assert_non_null(strstr(reason, "failed 4 times"));
    free(reason);
    expect(db, "SELECT count(*) FROM audit WHERE event='%s'", "task_compensation_retry", "3");
    (void)task_status;
}

static void test_db_compensation_retry_succeeds(void **state)
{
    fx_t *f = *state;
    sqlite3 *db = f->db;
    char id[OQ_TASK_ID_LEN + 1] = "";
    oq_task_outcome_t oc = 0;
    assert_int_equal(submit(db, "o3", SPEC3, &oc, id), 0);
    result(db, "o3/charge", "succeeded", "{\"object_id\":\"p1\",\"amount\":1}", NULL);
    result(db, "o3/ticket", "failed", NULL, NULL);
    oq__producer_store_t s = {db, NULL, NULL};
    oq_error_t err = {0};
    for (int a = 0; a < 2; a++) {
        result(db, "o3/charge/compensate", "failed", NULL, NULL);
        int n = 0;
        assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
        assert_int_equal(oq__task_retry_due(&s, oq_now_ms() + 3600000, 0, &n, &err), 0);
        assert_int_equal(oq_db_commit(db, &err), 0);
        assert_int_equal(n, 1);
    }
    result(db, "o3/charge/compensate", "succeeded", "{}", NULL);
    expect(db, "SELECT status FROM tasks WHERE task_id='%s'", id, "compensated");
    expect(db, "SELECT comp_attempts FROM task_steps WHERE idx=0 AND task_id='%s'", id, "3");
}

static void test_db_bad_reference_at_run(void **state)
{
    fx_t *f = *state;
    sqlite3 *db = f->db;
    char id[OQ_TASK_ID_LEN + 1] = "";
    oq_task_outcome_t oc = 0;
    /* the result lacks what step 2 cites: step 2 fails without a call, step 1 is undone */
    assert_int_equal(submit(db, "o4", SPEC3, &oc, id), 0);
    result(db, "o4/charge", "succeeded", "{\"object_id\":\"p1\"}", NULL);
    expect(db, "SELECT status FROM task_steps WHERE idx=1 AND task_id='%s'", id, "failed");
    expect(db, "SELECT count(*) FROM calls WHERE idem_key='%s'", "o4/ticket", "0");
    expect(db, "SELECT status FROM tasks WHERE task_id='%s'", id, "compensating");
    char *reason = text(db, "SELECT reason FROM tasks WHERE task_id='%s'", id);
    assert_non_null(strstr(reason, "amount"));
    free(reason);
    /* succeeded straight through */
    assert_int_equal(
        submit(db, "o5", "{\"steps\":[{\"name\":\"a\",\"tool\":\"p\",\"args\":{}}]}", &oc, id), 0);
    result(db, "o5/a", "succeeded", "{}", NULL);
    expect(db, "SELECT status FROM tasks WHERE task_id='%s'", id, "succeeded");
}

/* onceq verify's task invariants: clean on an honest run, each kind caught on a tampered one. */
static void test_db_verify(void **state)
{
    fx_t *f = *state;
    sqlite3 *db = f->db;
    char cpath[160], id[OQ_TASK_ID_LEN + 1] = "", id2[OQ_TASK_ID_LEN + 1] = "";
    snprintf(cpath, sizeof cpath, "%s/effects.db", f->dir);
    sqlite3 *cdb = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(cpath, NULL, &cdb, &err), 0);
    assert_int_equal(oq_db_migrate(cdb, oq_migrations_consumer, &err), 0);
    sqlite3_close_v2(cdb);
    oq_task_outcome_t oc = 0;
    assert_int_equal(submit(db, "v1", SPEC3, &oc, id), 0);
    result(db, "v1/charge", "succeeded", "{\"object_id\":\"p\",\"amount\":1}", NULL);
    result(db, "v1/ticket", "succeeded", "{\"object_id\":\"t\"}", NULL);
    result(db, "v1/email", "failed", NULL, NULL);
    result(db, "v1/ticket/compensate", "succeeded", "{}", NULL);
    result(db, "v1/charge/compensate", "succeeded", "{}", NULL);
    assert_int_equal(submit(db, "v2", SPEC3, &oc, id2), 0); /* left running */
    oq_verify_report_t rep;
    oq_verify_opts_t o = {0};
    o.allow_pending = 1;
    assert_int_equal(oq_verify_run(f->path, cpath, &o, &rep, &err), 0);
    for (int k = OQ_V_TASK_STEP_RERUN; k <= OQ_V_TASK_NOT_TERMINAL; k++)
        if (rep.count[k])
            fail_msg("clean run: %s=%lld", oq_violation_name(k), (long long)rep.count[k]);
    oq_verify_report_clear(&rep);
    o.allow_pending = 0; /* drained: a running task is a violation */
    assert_int_equal(oq_verify_run(f->path, cpath, &o, &rep, &err), 0);
    assert_int_equal(rep.count[OQ_V_TASK_NOT_TERMINAL], 1);
    oq_verify_report_clear(&rep);
    /* retention purged a step's and a compensation's calls: not a violation of the task */
    assert_int_equal(sqlite3_exec(db,
                                  "DELETE FROM calls WHERE idem_key IN ('v1/ticket', "
                                  "'v1/ticket/compensate')",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    o.allow_pending = 1;
    assert_int_equal(oq_verify_run(f->path, cpath, &o, &rep, &err), 0);
    for (int k = OQ_V_TASK_STEP_RERUN; k <= OQ_V_TASK_NOT_TERMINAL; k++)
        if (rep.count[k])
            fail_msg("purged calls: %s=%lld", oq_violation_name(k), (long long)rep.count[k]);
    oq_verify_report_clear(&rep);
    /* tamper: a compensation that did not succeed under a compensated task; a second call for
     * one step; a compensation of a step that never succeeded */
    char sql[512];
    snprintf(sql, sizeof sql,
             "UPDATE calls SET state='failed' WHERE idem_key='v1/charge/compensate';"
             "INSERT INTO task_calls VALUES('c_x','%s',0,'step');"
             "UPDATE task_steps SET comp_call_id=(SELECT call_id FROM calls WHERE "
             "idem_key='v1/charge/compensate') WHERE task_id='%s' AND idx=2",
             id, id);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    o.allow_pending = 1;
    assert_int_equal(oq_verify_run(f->path, cpath, &o, &rep, &err), 0);
    /* charge's compensation failed, and the one written for email (that never succeeded) */
    assert_int_equal(rep.count[OQ_V_TASK_FALSE_END], 2);
    assert_int_equal(rep.count[OQ_V_TASK_STEP_RERUN], 1);
    assert_int_equal(rep.count[OQ_V_TASK_COMP_TWICE], 1);
    assert_string_equal(oq_violation_name(OQ_V_TASK_FALSE_END), "task_false_end");
    oq_verify_report_clear(&rep);
}

/* A review ends its transaction through oq_db_commit / oq_db_rollback: with the writer gate on
 * (main sets ONCEQ_DB_GATE=1), a writer on another thread finds the gate free at once after a
 * review that committed and after one that was refused (a raw COMMIT kept it for 250 ms). */
typedef struct {
    const char *path;
    int64_t took_us;
    int rc;
} gate_probe_t;

static void *gate_probe(void *arg)
{
    gate_probe_t *p = arg;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    p->rc = oq_db_open(p->path, NULL, &db, &err);
    int64_t t0 = oq_mono_us();
    if (p->rc == 0) p->rc = oq_db_begin_immediate(db, 2000, &err);
    p->took_us = oq_mono_us() - t0;
    oq_db_rollback(db);
    sqlite3_close_v2(db);
    return NULL;
}

static void probe_gate_free(const char *path)
{
    oq_db_gate_counts_t g0, g1;
    oq_db_gate_counts(&g0);
    gate_probe_t p = {.path = path};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, gate_probe, &p), 0);
    pthread_join(th, NULL);
    oq_db_gate_counts(&g1);
    assert_int_equal(p.rc, 0);
    assert_true(g1.taken > g0.taken); /* the gate is in use in this test */
    assert_int_equal(g1.timeouts, g0.timeouts);
    assert_true(p.took_us < 150000);
}

static void test_db_review_gives_the_gate_back(void **state)
{
    fx_t *f = *state;
    static const char spec[] =
        "{\"steps\":[{\"name\":\"charge\",\"tool\":\"pay\",\"args\":{}},{\"name\":"
        "\"ship\",\"tool\":\"ship\",\"args\":{},\"approval\":true}]}";
    char id[OQ_TASK_ID_LEN + 1] = "";
    oq_task_outcome_t oc = 0;
    oq_error_t err = {0};
    const char *code = NULL;
    assert_int_equal(submit(f->db, "gt1", spec, &oc, id), 0);
    result(f->db, "gt1/charge", "succeeded", "{}", NULL);
    assert_int_equal(oq_store_task_review(f->db, id, 0, "approve", "ada", "ok", NULL, &code, &err),
                     OQ_ECONFLICT);
    probe_gate_free(f->path);
    assert_int_equal(oq_store_task_review(f->db, id, 1, "approve", "ada", "ok", NULL, &code, &err),
                     0);
    probe_gate_free(f->path);
    expect(f->db, "SELECT count(*) FROM calls WHERE idem_key='%s'", "gt1/ship", "1");
}

/* Approval before a step: the task waits with no call written; a stale fence is refused with
 * nothing changed; approve writes the step; reject skips it and compensates what ran. */
static void test_db_approval(void **state)
{
    fx_t *f = *state;
    sqlite3 *db = f->db;
    static const char spec[] =
        "{\"steps\":[{\"name\":\"charge\",\"tool\":\"pay\",\"args\":{},\"compensate\":{\"tool\":"
        "\"refund\",\"args\":{}}},{\"name\":\"ship\",\"tool\":\"ship\",\"args\":{},\"approval\":"
        "true,\"irreversible\":true}]}";
    char id[OQ_TASK_ID_LEN + 1] = "", id2[OQ_TASK_ID_LEN + 1] = "";
    oq_task_outcome_t oc = 0;
    oq_error_t err = {0};
    const char *code = NULL;
    json_t *t = NULL;
    assert_int_equal(submit(db, "ap1", spec, &oc, id), 0);
    result(db, "ap1/charge", "succeeded", "{\"object_id\":\"p1\"}", NULL);
    expect(db, "SELECT status || ' ' || review_fence FROM tasks WHERE task_id='%s'", id,
           "awaiting_approval 1");
    expect(db, "SELECT count(*) FROM calls WHERE idem_key='%s'", "ap1/ship", "0");
    assert_int_equal(oq_store_task_review(db, id, 0, "approve", "ada", "ok", &t, &code, &err),
                     OQ_ECONFLICT);
    assert_string_equal(code, "review_moved");
    assert_null(t);
    assert_int_equal(oq_store_task_review(db, id, 1, "succeeded", "ada", "ok", &t, &code, &err),
                     OQ_ESTATE);
    expect(db, "SELECT count(*) FROM calls WHERE idem_key='%s'", "ap1/ship", "0");
    expect(db, "SELECT count(*) FROM audit WHERE call_id='%s'", id, "0");
    assert_int_equal(oq_store_task_review(db, id, 1, "approve", "ada", "ok", &t, &code, &err), 0);
    assert_string_equal(json_string_value(json_object_get(t, "status")), "running");
    json_decref(t);
    expect(db, "SELECT count(*) FROM calls WHERE idem_key='%s'", "ap1/ship", "1");
    expect(db, "SELECT json_extract(detail,'$.by') FROM audit WHERE call_id='%s'", id, "ada");
    assert_int_equal(oq_store_task_review(db, id, 1, "approve", "ada", "ok", NULL, &code, &err),
                     OQ_ESTATE);
    result(db, "ap1/ship", "succeeded", "{}", NULL);
    expect(db, "SELECT status FROM tasks WHERE task_id='%s'", id, "succeeded");

    /* reject: ship skipped (never written), charge compensated */
    assert_int_equal(submit(db, "ap2", spec, &oc, id2), 0);
    result(db, "ap2/charge", "succeeded", "{\"object_id\":\"p2\"}", NULL);
    assert_int_equal(oq_store_task_review(db, id2, 1, "reject", "bob", "no", NULL, &code, &err), 0);
    expect(db, "SELECT status FROM tasks WHERE task_id='%s'", id2, "compensating");
    expect(db, "SELECT count(*) FROM calls WHERE idem_key='%s'", "ap2/ship", "0");
    expect(db, "SELECT count(*) FROM calls WHERE idem_key='%s'", "ap2/charge/compensate", "1");
    result(db, "ap2/charge/compensate", "succeeded", "{}", NULL);
    expect(db,
           "SELECT status || ' ' || (SELECT group_concat(status) FROM task_steps WHERE "
           "task_id=t.task_id) FROM tasks t WHERE task_id='%s'",
           id2, "compensated compensated,skipped");
    /* approvals are not recoveries; nothing ran twice */
    oq__producer_store_t s = {db, NULL, NULL};
    int64_t op = -1, rerun = -1;
    assert_int_equal(oq__task_store_recovery(&s, &op, &rerun, &err), 0);
    assert_int_equal(op, 0);
    assert_int_equal(rerun, 0);
}

/* libonceq's task submit in the caller's transaction: refused outside one (nothing written),
 * new then replay inside one, another body under the key is idempotency_conflict, a bad
 * reference is bad_reference, and a ROLLBACK leaves no task, call or outbox row. */
static void test_db_submit_in_tx(void **state)
{
    fx_t *f = *state;
    sqlite3 *db = f->db;
    oq_error_t err = {0};
    const char *code = NULL;
    json_t *t = NULL;
    int replayed = -1;
    json_t *body = json_loads("{\"steps\":[{\"name\":\"a\",\"tool\":\"charge\",\"args\":"
                              "{\"amount\":1}},{\"name\":\"b\",\"tool\":\"charge\",\"args\":"
                              "{\"amount\":\"{steps.a.result.charged}\"}}]}",
                              0, NULL);
    assert_non_null(body);
    assert_int_equal(
        oq_producer_task_submit_in_tx(db, "shop", "k1", body, 0, &t, &replayed, &code, &err),
        OQ_ESTATE);
    assert_null(t);
    assert_int_equal(num(db, "SELECT count(*) FROM tasks%s", ""), 0);

    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(
        oq_producer_task_submit_in_tx(db, "shop", "k1", body, 0, &t, &replayed, &code, &err), 0);
    assert_int_equal(replayed, 0);
    assert_string_equal(json_string_value(json_object_get(t, "status")), "running");
    char id[OQ_TASK_ID_LEN + 1];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(t, "task_id")));
    json_decref(t);
    assert_int_equal(
        oq_producer_task_submit_in_tx(db, "shop", "k1", body, 0, &t, &replayed, &code, &err), 0);
    assert_int_equal(replayed, 1);
    assert_string_equal(json_string_value(json_object_get(t, "task_id")), id);
    json_decref(t);
    json_t *other = json_pack("{s:[{s:s,s:s,s:{s:i}}]}", "steps", "name", "a", "tool", "charge",
                              "args", "amount", 2);
    assert_int_equal(
        oq_producer_task_submit_in_tx(db, "shop", "k1", other, 0, &t, &replayed, &code, &err),
        OQ_ECONFLICT);
    assert_string_equal(code, "idempotency_conflict");
    assert_null(t);
    json_t *bad = json_pack("{s:[{s:s,s:s,s:{s:s}}]}", "steps", "name", "a", "tool", "charge",
                            "args", "x", "{steps.z.result}");
    assert_int_equal(
        oq_producer_task_submit_in_tx(db, "shop", "k2", bad, 0, &t, &replayed, &code, &err),
        OQ_EINVAL);
    assert_string_equal(code, "bad_reference");
    assert_int_equal(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(num(db, "SELECT count(*) FROM tasks%s", ""), 1);
    assert_int_equal(num(db, "SELECT count(*) FROM calls WHERE idem_key='k1/a'%s", ""), 1);
    assert_int_equal(num(db, "SELECT count(*) FROM outbox%s", ""), 1);
    assert_int_equal(oq_store_task_get(db, NULL, "shop", "k1", &t, &err), 0);
    assert_string_equal(json_string_value(json_object_get(t, "task_id")), id);
    json_decref(t);

    /* rolled back with the service's rows: nothing of the task remains */
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(
        oq_producer_task_submit_in_tx(db, "shop", "k3", body, 0, &t, &replayed, &code, &err), 0);
    json_decref(t);
    assert_int_equal(sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(num(db, "SELECT count(*) FROM tasks WHERE idem_key='k3'%s", ""), 0);
    assert_int_equal(num(db, "SELECT count(*) FROM calls WHERE idem_key LIKE 'k3/%%'%s", ""), 0);
    assert_int_equal(num(db, "SELECT count(*) FROM outbox%s", ""), 1);
    assert_int_equal(oq_store_task_get(db, NULL, "shop", "k3", &t, &err), OQ_ENOTFOUND);
    json_decref(body);
    json_decref(other);
    json_decref(bad);
}

int main(void)
{
    setenv("ONCEQ_DB_GATE", "1", 1); /* test_db_review_gives_the_gate_back */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_validate_mangled),
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_state_machine),
        cmocka_unit_test_setup_teardown(test_db_compensate_in_reverse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_db_operator_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_db_compensation_budget, setup, teardown),
        cmocka_unit_test_setup_teardown(test_db_compensation_retry_succeeds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_db_bad_reference_at_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_db_verify, setup, teardown),
        cmocka_unit_test_setup_teardown(test_db_approval, setup, teardown),
        cmocka_unit_test_setup_teardown(test_db_review_gives_the_gate_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_db_submit_in_tx, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
