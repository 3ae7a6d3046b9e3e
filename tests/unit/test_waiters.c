/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Call waiters (producer/waiters.c, issue 21 item 3): the registry alone (notify fires only
 * the call's waiters, once; the deadline; cancel; wake_all by owner; destroy; thousands of
 * waiters over one timer thread; the ?wait= syntax), then wired into the producer: a result
 * that makes a call terminal wakes its waiter only after the commit (the callback reads the
 * call and sees the terminal state), a `running` result wakes nobody, and a call failed
 * because its message was set aside (dead letter) wakes its waiter too; oq_producer_wait, the
 * blocking form, returns on the result, at its deadline, or at once for a terminal call.
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

#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_producer.h"
#include "oq_waiters.h"

#define ID_A "c_0000000000000000000000000000000a"
#define ID_B "c_0000000000000000000000000000000b"

typedef struct hit {
    pthread_mutex_t mu;
    int n;
    oq_wake_t why;
    int64_t at_us;
    /* producer tests: what the callback read */
    oq_producer_t *p;
    char state[32];
} hit_t;

static void hit_init(hit_t *h)
{
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
}

static void on_fire(oq_waiter_t *w, oq_wake_t why, void *opaque)
{
    hit_t *h = opaque;
    (void)w;
    pthread_mutex_lock(&h->mu);
    h->n++;
    h->why = why;
    h->at_us = oq_mono_us();
    pthread_mutex_unlock(&h->mu);
}

static int hits(hit_t *h)
{
    pthread_mutex_lock(&h->mu);
    int n = h->n;
    pthread_mutex_unlock(&h->mu);
    return n;
}

/* Waits up to \p ms for \p h to have fired \p want times. */
static int wait_hits(hit_t *h, int want, int ms)
{
    for (int i = 0; i < ms / 5 && hits(h) < want; i++)
        usleep(5000);
    return hits(h) == want;
}

static oq_waiters_t *new_ws(void)
{
    oq_waiters_t *ws = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_waiters_new(&ws, &err), 0);
    return ws;
}

static void test_notify_fires_matching_once(void **state)
{
    (void)state;
    oq_waiters_t *ws = new_ws();
    oq_waiter_t wa1, wa2, wb;
    memset(&wa1, 0, sizeof wa1);
    memset(&wa2, 0, sizeof wa2);
    memset(&wb, 0, sizeof wb);
    hit_t a1, a2, b;
    hit_init(&a1);
    hit_init(&a2);
    hit_init(&b);
    int64_t far = oq_mono_us() + 60 * 1000000LL;
    assert_int_equal(oq_waiters_add(ws, &wa1, ID_A, far, on_fire, &a1, NULL, NULL), 0);
    assert_int_equal(oq_waiters_add(ws, &wa2, ID_A, far, on_fire, &a2, NULL, NULL), 0);
    assert_int_equal(oq_waiters_add(ws, &wb, ID_B, far, on_fire, &b, NULL, NULL), 0);
    /* armed twice: refused, nothing changes */
    assert_int_equal(oq_waiters_add(ws, &wb, ID_B, far, on_fire, &b, NULL, NULL), OQ_EINVAL);
    assert_int_equal(oq_waiters_add(ws, &wb, "not-an-id", far, on_fire, &b, NULL, NULL), OQ_EINVAL);
    assert_int_equal(oq_waiters_count(ws), 3);

    assert_int_equal(oq_waiters_notify(ws, ID_A), 2);
    assert_int_equal(a1.n, 1);
    assert_int_equal(a2.n, 1);
    assert_int_equal(a1.why, OQ_WAKE_SETTLED);
    assert_int_equal(b.n, 0);
    assert_int_equal(oq_waiters_notify(ws, ID_A), 0); /* once */
    assert_int_equal(a1.n, 1);
    assert_int_equal(oq_waiters_count(ws), 1);
    /* a fired waiter can be armed again */
    assert_int_equal(oq_waiters_add(ws, &wa1, ID_A, far, on_fire, &a1, NULL, NULL), 0);
    assert_int_equal(oq_waiters_cancel(ws, &wa1), 1);
    assert_int_equal(oq_waiters_cancel(ws, &wa1), 0);
    assert_int_equal(oq_waiters_notify(ws, ID_A), 0);
    assert_int_equal(a1.n, 1);

    oq_waiters_destroy(ws); /* fires b with SHUTDOWN */
    assert_int_equal(b.n, 1);
    assert_int_equal(b.why, OQ_WAKE_SHUTDOWN);
}

static void test_deadline(void **state)
{
    (void)state;
    oq_waiters_t *ws = new_ws();
    oq_waiter_t w1, w2, w3;
    memset(&w1, 0, sizeof w1);
    memset(&w2, 0, sizeof w2);
    memset(&w3, 0, sizeof w3);
    hit_t h1, h2, h3;
    hit_init(&h1);
    hit_init(&h2);
    hit_init(&h3);
    int64_t t0 = oq_mono_us();
    /* armed in the order far, near, past: the timer thread must re-plan on each */
    assert_int_equal(oq_waiters_add(ws, &w1, ID_A, t0 + 30 * 1000000LL, on_fire, &h1, NULL, NULL),
                     0);
    assert_int_equal(oq_waiters_add(ws, &w2, ID_A, t0 + 200000, on_fire, &h2, NULL, NULL), 0);
    assert_int_equal(oq_waiters_add(ws, &w3, ID_B, t0 - 1000, on_fire, &h3, NULL, NULL), 0);
    assert_true(wait_hits(&h3, 1, 5000));
    assert_int_equal(h3.why, OQ_WAKE_DEADLINE);
    assert_true(wait_hits(&h2, 1, 10000));
    assert_int_equal(h2.why, OQ_WAKE_DEADLINE);
    assert_true(h2.at_us >= t0 + 200000); /* never early */
    assert_int_equal(hits(&h1), 0);
    assert_int_equal(oq_waiters_count(ws), 1);
    assert_int_equal(oq_waiters_cancel(ws, &w1), 1);
    assert_int_equal(oq_waiters_count(ws), 0);
    oq_waiters_destroy(ws);
    assert_int_equal(hits(&h1), 0);
}

static void test_wake_all_by_owner(void **state)
{
    (void)state;
    oq_waiters_t *ws = new_ws();
    enum { N = 50 };
    oq_waiter_t w[N];
    hit_t h[N];
    int owner_a, owner_b;
    memset(w, 0, sizeof w);
    int64_t far = oq_mono_us() + 60 * 1000000LL;
    for (int i = 0; i < N; i++) {
        hit_init(&h[i]);
        assert_int_equal(oq_waiters_add(ws, &w[i], i % 2 ? ID_A : ID_B, far + i, on_fire, &h[i],
                                        i % 3 ? &owner_a : &owner_b, NULL),
                         0);
    }
    size_t want_a = 0;
    for (int i = 0; i < N; i++)
        want_a += i % 3 != 0;
    assert_int_equal(oq_waiters_wake_all(ws, &owner_a), want_a);
    for (int i = 0; i < N; i++) {
        assert_int_equal(h[i].n, i % 3 ? 1 : 0);
        if (i % 3) assert_int_equal(h[i].why, OQ_WAKE_SHUTDOWN);
    }
    /* the others are still there, by id and by deadline */
    assert_int_equal(oq_waiters_count(ws), N - want_a);
    size_t b_on_a = oq_waiters_notify(ws, ID_A);
    assert_int_equal(b_on_a + oq_waiters_notify(ws, ID_B), N - want_a);
    assert_int_equal(oq_waiters_count(ws), 0);
    oq_waiters_destroy(ws);
}

/* Thousands of waiters, random deadlines and ids, some cancelled: each fires exactly once, by
 * its call or by its deadline, and the heap never loses one. */
static void test_many(void **state)
{
    (void)state;
    oq_waiters_t *ws = new_ws();
    enum { N = 5000, IDS = 97 };
    oq_waiter_t *w = calloc(N, sizeof *w);
    hit_t *h = calloc(N, sizeof *h);
    assert_non_null(w);
    assert_non_null(h);
    char ids[IDS][OQ_CALL_ID_LEN + 1];
    for (int k = 0; k < IDS; k++)
        snprintf(ids[k], sizeof ids[k], "c_%032x", k + 1);
    srand(7);
    int64_t t0 = oq_mono_us();
    for (int i = 0; i < N; i++) {
        hit_init(&h[i]);
        /* a third expire within 0.3 s, the rest in a minute */
        int64_t dl = t0 + (i % 3 == 0 ? rand() % 300000 : 60 * 1000000LL + rand() % 1000);
        assert_int_equal(oq_waiters_add(ws, &w[i], ids[i % IDS], dl, on_fire, &h[i], NULL, NULL),
                         0);
    }
    int cancelled = 0;
    for (int i = 1; i < N; i += 7)
        cancelled += oq_waiters_cancel(ws, &w[i]);
    usleep(600000);
    size_t notified = 0;
    for (int k = 0; k < IDS; k++)
        notified += oq_waiters_notify(ws, ids[k]);
    assert_int_equal(oq_waiters_count(ws), 0);
    int fired = 0, by_deadline = 0;
    for (int i = 0; i < N; i++) {
        assert_true(hits(&h[i]) <= 1);
        fired += hits(&h[i]);
        by_deadline += h[i].n && h[i].why == OQ_WAKE_DEADLINE;
    }
    assert_int_equal(fired + cancelled, N);
    assert_int_equal((size_t)fired, notified + (size_t)by_deadline);
    assert_true(by_deadline > 0);
    oq_waiters_destroy(ws);
    free(w);
    free(h);
}

static void test_wait_parse(void **state)
{
    (void)state;
    int64_t ms = -1;
    assert_int_equal(oq_wait_parse("30s", OQ_WAIT_MAX_MS, &ms), 0);
    assert_int_equal(ms, 30000);
    assert_int_equal(oq_wait_parse("500ms", OQ_WAIT_MAX_MS, &ms), 0);
    assert_int_equal(ms, 500);
    assert_int_equal(oq_wait_parse("1m", OQ_WAIT_MAX_MS, &ms), 0);
    assert_int_equal(ms, 60000);
    assert_int_equal(oq_wait_parse("25", OQ_WAIT_MAX_MS, &ms), 0);
    assert_int_equal(ms, 25000);
    assert_int_equal(oq_wait_parse("0", OQ_WAIT_MAX_MS, &ms), 0);
    assert_int_equal(ms, 0);
    assert_int_equal(oq_wait_parse("60000ms", OQ_WAIT_MAX_MS, &ms), 0);
    assert_int_equal(oq_wait_parse("61s", OQ_WAIT_MAX_MS, &ms), OQ_ERANGE);
    assert_int_equal(oq_wait_parse("2m", OQ_WAIT_MAX_MS, &ms), OQ_ERANGE);
    assert_int_equal(oq_wait_parse("99999999999999999999", OQ_WAIT_MAX_MS, &ms), OQ_ERANGE);
    const char *bad[] = {"",    "s",  "-1", "+1",  "1.5s", " 1s", "1s ",
                         "1 s", "1h", "1S", "abc", "1ms2", "0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(oq_wait_parse(bad[i], OQ_WAIT_MAX_MS, &ms), OQ_EINVAL);
    assert_int_equal(oq_wait_parse(NULL, OQ_WAIT_MAX_MS, &ms), OQ_EINVAL);
}

/* --- wired into the producer --------------------------------------------------------------*/

typedef struct pfx {
    char dir[64];
    char path[128];
    oq_producer_t *p;
} pfx_t;

static int psetup(void **state)
{
    pfx_t *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/oq-test-waiters.XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/calls.db", f->dir);
    oq_error_t err = {0};
    if (oq_producer_open(f->path, NULL, &f->p, &err) != 0) return -1;
    *state = f;
    return 0;
}

static int pteardown(void **state)
{
    pfx_t *f = *state;
    oq_producer_close(f->p);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0) return -1;
    free(f);
    return 0;
}

/* The callback reads the call: it must see what woke it (committed before the notify). */
static void on_fire_read(oq_waiter_t *w, oq_wake_t why, void *opaque)
{
    hit_t *h = opaque;
    oq_call_t c;
    memset(&c, 0, sizeof c);
    if (oq_producer_get(h->p, w->call_id, &c, NULL) == 0)
        snprintf(h->state, sizeof h->state, "%s", c.state);
    oq_call_clear(&c);
    on_fire(w, why, opaque);
}

static void submit(pfx_t *f, const char *key, oq_call_t *call)
{
    oq_error_t err = {0};
    json_t *args = json_pack("{s:i}", "amount", 1);
    oq_submit_req_t req = {.idem_key = key, .tool = "charge", .args = args};
    memset(call, 0, sizeof *call);
    assert_int_equal(oq_producer_submit(f->p, &req, call, NULL, &err), 0);
    json_decref(args);
}

static void result(pfx_t *f, const oq_call_t *call, const char *status, const char *msg_id)
{
    oq_envelope_t env;
    memset(&env, 0, sizeof env);
    env.v = OQ_ENVELOPE_VERSION;
    env.kind = OQ_KIND_TOOL_RESULT;
    snprintf(env.message_id, sizeof env.message_id, "%s", msg_id);
    snprintf(env.call_id, sizeof env.call_id, "%s", call->call_id);
    env.attempt = call->attempt;
    env.created_at = oq_now_ms();
    env.status = (char *)status;
    oq_result_outcome_t oc = 0;
    oq_error_t err = {0};
    assert_int_equal(oq_producer_apply_results(f->p, &env, 1, &oc, &err), 0);
    assert_int_equal(oc, OQ_RESULT_APPLIED);
}

static void test_producer_result_wakes_after_commit(void **state)
{
    pfx_t *f = *state;
    oq_call_t c;
    submit(f, "w1", &c);
    oq_waiters_t *ws = oq_producer_waiters(f->p);
    assert_non_null(ws);
    oq_waiter_t w;
    memset(&w, 0, sizeof w);
    hit_t h;
    hit_init(&h);
    h.p = f->p;
    assert_int_equal(oq_waiters_add(ws, &w, c.call_id, oq_mono_us() + 30 * 1000000LL, on_fire_read,
                                    &h, NULL, NULL),
                     0);
    result(f, &c, "running", "00000000-0000-4000-8000-000000000001");
    assert_int_equal(hits(&h), 0); /* not terminal: nobody woken */
    result(f, &c, "succeeded", "00000000-0000-4000-8000-000000000002");
    /* apply_results returned after the commit and the notify */
    assert_int_equal(hits(&h), 1);
    assert_int_equal(h.why, OQ_WAKE_SETTLED);
    assert_string_equal(h.state, "succeeded");
    oq_call_clear(&c);
}

static void test_producer_dead_letter_wakes(void **state)
{
    pfx_t *f = *state;
    oq_call_t c;
    submit(f, "w2", &c);
    oq_waiter_t w;
    memset(&w, 0, sizeof w);
    hit_t h;
    hit_init(&h);
    h.p = f->p;
    assert_int_equal(oq_waiters_add(oq_producer_waiters(f->p), &w, c.call_id,
                                    oq_mono_us() + 30 * 1000000LL, on_fire_read, &h, NULL, NULL),
                     0);
    /* play the relay: its message set aside; the writer fails the call within about a second */
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(f->path, NULL, &db, &err), 0);
    assert_int_equal(
        oq_db_exec(db,
                   "INSERT INTO outbox_dead(seq,message_id,topic,key,payload,created_at,reason,"
                   "detail,dead_at) SELECT seq,message_id,topic,key,payload,created_at,"
                   "'MSG_SIZE_TOO_LARGE','too large',1 FROM outbox",
                   &err),
        0);
    sqlite3_close_v2(db);
    assert_true(wait_hits(&h, 1, 10000));
    assert_int_equal(h.why, OQ_WAKE_SETTLED);
    assert_string_equal(h.state, "failed");
    oq_call_clear(&c);
}

static void test_producer_close_wakes(void **state)
{
    pfx_t *f = *state;
    oq_call_t c;
    submit(f, "w3", &c);
    oq_waiter_t w;
    memset(&w, 0, sizeof w);
    hit_t h;
    hit_init(&h);
    assert_int_equal(oq_waiters_add(oq_producer_waiters(f->p), &w, c.call_id,
                                    oq_mono_us() + 30 * 1000000LL, on_fire, &h, NULL, NULL),
                     0);
    oq_producer_close(f->p);
    f->p = NULL;
    assert_int_equal(h.n, 1);
    assert_int_equal(h.why, OQ_WAKE_SHUTDOWN);
    oq_call_clear(&c);
}

typedef struct later {
    pfx_t *f;
    oq_call_t *call;
    int delay_ms;
} later_t;

static void *apply_later(void *arg)
{
    later_t *l = arg;
    usleep((useconds_t)l->delay_ms * 1000);
    result(l->f, l->call, "failed", "00000000-0000-4000-8000-000000000003");
    return NULL;
}

/* oq_producer_wait: the blocking form. Times out with the call as it stands, returns once a
 * result made it terminal (not at the deadline), answers a terminal call at once. */
static void test_producer_wait_blocking(void **state)
{
    pfx_t *f = *state;
    oq_call_t c, got;
    oq_error_t err = {0};
    submit(f, "w4", &c);
    int64_t t0 = oq_mono_us();
    memset(&got, 0, sizeof got);
    assert_int_equal(oq_producer_wait(f->p, c.call_id, 300, &got, &err), 0);
    assert_true(oq_mono_us() - t0 >= 300000);
    assert_string_equal(got.state, "pending");
    oq_call_clear(&got);

    later_t l = {f, &c, 300};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, apply_later, &l), 0);
    t0 = oq_mono_us();
    assert_int_equal(oq_producer_wait(f->p, c.call_id, 30000, &got, &err), 0);
    int64_t took = oq_mono_us() - t0;
    pthread_join(th, NULL);
    assert_string_equal(got.state, "failed");
    assert_true(took < 20 * 1000000LL); /* woken by the result, not by the 30 s deadline */
    oq_call_clear(&got);

    t0 = oq_mono_us();
    assert_int_equal(oq_producer_wait(f->p, c.call_id, 30000, &got, &err), 0);
    assert_true(oq_mono_us() - t0 < 5 * 1000000LL);
    assert_string_equal(got.state, "failed");
    oq_call_clear(&got);
    assert_int_equal(oq_producer_wait(f->p, "c_00000000000000000000000000000001", 1000, &got, &err),
                     OQ_ENOTFOUND);
    assert_int_equal(oq_waiters_count(oq_producer_waiters(f->p)), 0);
    oq_call_clear(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_notify_fires_matching_once),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_wake_all_by_owner),
        cmocka_unit_test(test_many),
        cmocka_unit_test(test_wait_parse),
        cmocka_unit_test_setup_teardown(test_producer_result_wakes_after_commit, psetup, pteardown),
        cmocka_unit_test_setup_teardown(test_producer_dead_letter_wakes, psetup, pteardown),
        cmocka_unit_test_setup_teardown(test_producer_close_wakes, psetup, pteardown),
        cmocka_unit_test_setup_teardown(test_producer_wait_blocking, psetup, pteardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
