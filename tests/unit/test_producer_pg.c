/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the producer's group commit on PostgreSQL (ONCEQ_TEST_PG_URL, else skipped):
 * concurrent submitters, some of them on the same keys, through oq_producer_submit(). Every
 * new key gets exactly one call and one outbox row, every repeat of a key is a replay of that
 * call, and the writer really batches: many submits per transaction (distinct xmin of the calls)
 * and far fewer INSERT statements that wrote outbox rows than new calls (a statement-level
 * trigger of the test counts them), i.e. the new calls of a batch go in one round trip.
 *
 * Results: a batch of tool_results applied through the writer (oq_producer_apply_results) on
 * PostgreSQL decides as the rules say (applied, a second result of the same call after the
 * first, duplicate, stale, unknown call; a settling result of a call with a callback_url queues
 * its webhook delivery with the settled call's JSON), and writes its result_inbox rows, call
 * updates and audit rows in a few statements, not one per result (statement-level triggers of
 * the test count the statements that wrote rows); and the read ahead of a batch of results
 * stays an index lookup when the tables grow after the writer's session began (no sequential
 * scan, counted by pg_stat_xact_user_tables on the writer store's connection); and a batch of
 * results that waits for a row lock does not hold up a submit (results have their own writer).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>

#include "oq_envelope.h"
#include "oq_pg.h"
#include "oq_producer.h"
#include "pg_fixture.h"
#include "producer_int.h"

static char conninfo[2048];

#define THREADS 16
#define PER 25 /* unique keys per thread, and as many shared keys */

typedef struct {
    oq_producer_t *p;
    int id, errors, news_dup;
    char dup_ids[PER][64];
} sub_t;

static void *submitter(void *arg)
{
    sub_t *s = arg;
    /* a note with what an array literal quotes or escapes (the batch goes as arrays) */
    json_t *args = json_pack("{s:i,s:s,s:s}", "amount", 1234, "currency", "EUR", "note",
                             "NULL \"q\" \\ {a,b} \xc3\xa9\n");
    char key[64];
    for (int i = 0; i < PER; i++) {
        for (int dup = 0; dup < 2; dup++) {
            if (dup)
                snprintf(key, sizeof key, "dup-%d", i);
            else
                snprintf(key, sizeof key, "k-%d-%d", s->id, i);
            oq_submit_req_t req = {NULL, key, "charge", args, NULL, 0, 0, NULL};
            oq_submit_outcome_t oc;
            oq_call_t call;
            memset(&call, 0, sizeof call);
            oq_error_t err = {0};
            if (oq_producer_submit(s->p, &req, &call, &oc, &err) != 0) {
                fprintf(stderr, "submit %s: %s\n", key, err.msg);
                s->errors++;
                continue;
            }
            if (!dup && oc != OQ_SUBMIT_NEW) s->errors++;
            if (dup) {
                if (oc == OQ_SUBMIT_NEW) s->news_dup++;
                snprintf(s->dup_ids[i], sizeof s->dup_ids[i], "%s", call.call_id);
            }
            oq_call_clear(&call);
        }
    }
    json_decref(args);
    return NULL;
}

static void test_group_commit(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq_producer_t *p = NULL;
    oq_producer_opts_t o;
    memset(&o, 0, sizeof o);
    assert_int_equal(oq_producer_open(conninfo, &o, &p, &err), 0);

    /* the test's own counter of INSERT statements into the outbox */
    PGconn *c = pgfx_connect(conninfo);
    PGresult *r =
        PQexec(c, "CREATE TABLE public.t_outbox_stmts(n bigint NOT NULL);"
                  "INSERT INTO public.t_outbox_stmts VALUES (0);"
                  "CREATE FUNCTION public.t_count() RETURNS trigger LANGUAGE plpgsql AS "
                  "$$BEGIN IF EXISTS (SELECT 1 FROM nt) THEN UPDATE public.t_outbox_stmts "
                  "SET n = n + 1; END IF; RETURN NULL; END$$;"
                  "CREATE TRIGGER t_count AFTER INSERT ON onceq.outbox "
                  "REFERENCING NEW TABLE AS nt "
                  "FOR EACH STATEMENT EXECUTE FUNCTION public.t_count()");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);

    sub_t s[THREADS];
    pthread_t th[THREADS];
    memset(s, 0, sizeof s);
    for (int i = 0; i < THREADS; i++) {
        s[i].p = p;
        s[i].id = i;
        pthread_create(&th[i], NULL, submitter, &s[i]);
    }
    int news_dup = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(s[i].errors, 0);
        news_dup += s[i].news_dup;
    }
    oq_producer_close(p);

    /* one call per shared key, the same for every submitter of it */
    assert_int_equal(news_dup, PER);
    for (int k = 0; k < PER; k++)
        for (int i = 1; i < THREADS; i++)
            assert_string_equal(s[i].dup_ids[k], s[0].dup_ids[k]);
    const int64_t calls = THREADS * PER + PER;
    assert_int_equal(pgfx_one(c, "SELECT count(*) FROM onceq.calls"), calls);
    /* one outbox row per call, keyed by it, with the call's message id */
    assert_int_equal(pgfx_one(c, "SELECT count(*) FROM onceq.outbox o JOIN onceq.calls k ON "
                                 "o.key = k.call_id AND o.message_id = k.message_id"),
                     calls);
    assert_int_equal(pgfx_one(c, "SELECT count(*) FROM onceq.outbox"), calls);
    /* every row's args and key as submitted, byte for byte */
    assert_int_equal(
        pgfx_one(c, "SELECT count(*) FROM onceq.calls WHERE args = "
                    "'{\"amount\":1234,\"currency\":\"EUR\",\"note\":"
                    "\"NULL \\\"q\\\" \\\\ {a,b} \xc3\xa9\\n\"}' AND "
                    "(idem_key LIKE 'k-%' OR idem_key LIKE 'dup-%') AND client_id IS NULL"),
        calls);

    /* batched: many submits per transaction, and per outbox INSERT statement */
    int64_t txs = pgfx_one(c, "SELECT count(DISTINCT xmin::text) FROM onceq.calls");
    int64_t stmts = pgfx_one(c, "SELECT n FROM public.t_outbox_stmts");
    fprintf(stderr, "%lld calls in %lld transactions, %lld outbox INSERT statements\n",
            (long long)calls, (long long)txs, (long long)stmts);
    assert_true(txs * 2 < calls);
    assert_true(stmts * 2 < calls);
    PQfinish(c);
}

/* A statement-level counter of the test: statements that wrote rows into \p table by \p op. */
static void count_stmts(PGconn *c, const char *name, const char *table, const char *op)
{
    char sql[1024];
    snprintf(sql, sizeof sql,
             "CREATE TABLE public.t_%s(n bigint NOT NULL); INSERT INTO public.t_%s VALUES (0);"
             "CREATE FUNCTION public.t_%s() RETURNS trigger LANGUAGE plpgsql AS "
             "$$BEGIN IF EXISTS (SELECT 1 FROM nt) THEN UPDATE public.t_%s SET n = n + 1; "
             "END IF; RETURN NULL; END$$;"
             "CREATE TRIGGER t_%s AFTER %s ON %s REFERENCING NEW TABLE AS nt "
             "FOR EACH STATEMENT EXECUTE FUNCTION public.t_%s()",
             name, name, name, name, name, op, table, name);
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) fprintf(stderr, "%s", PQerrorMessage(c));
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
}

#define RN 30 /* calls that get results */

static void result_env(oq_envelope_t *e, const char *call_id, int64_t attempt, const char *status)
{
    memset(e, 0, sizeof *e);
    e->kind = OQ_KIND_TOOL_RESULT;
    oq_id_uuid(e->message_id);
    snprintf(e->call_id, sizeof e->call_id, "%.*s", (int)(sizeof e->call_id - 1), call_id);
    e->attempt = attempt;
    e->status = (char *)status;
}

static void test_results_batched(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq_producer_t *p = NULL;
    oq_producer_opts_t o;
    memset(&o, 0, sizeof o);
    assert_int_equal(oq_producer_open(conninfo, &o, &p, &err), 0);
    PGconn *c = pgfx_connect(conninfo);

    /* RN calls, the first with a callback_url */
    char ids[RN][OQ_CALL_ID_LEN + 1];
    json_t *args = json_pack("{s:i}", "amount", 1);
    for (int i = 0; i < RN; i++) {
        char key[32];
        snprintf(key, sizeof key, "res-%d", i);
        oq_submit_req_t req = {NULL, key, "charge", args,
                               NULL, 0,   0,        i == 0 ? "http://127.0.0.1:9/hook" : NULL};
        oq_submit_outcome_t oc;
        oq_call_t call;
        memset(&call, 0, sizeof call);
        assert_int_equal(oq_producer_submit(p, &req, &call, &oc, &err), 0);
        assert_int_equal(oc, OQ_SUBMIT_NEW);
        snprintf(ids[i], sizeof ids[i], "%s", call.call_id);
        oq_call_clear(&call);
    }
    json_decref(args);
    count_stmts(c, "inbox", "onceq.result_inbox", "INSERT");
    count_stmts(c, "upd", "onceq.calls", "UPDATE");
    count_stmts(c, "aud", "onceq.audit", "INSERT");

    /* one batch: running then succeeded, adjacent for the first half of the calls, all the
     * running ones first for the second half; then a duplicate, a stale attempt, an unknown
     * call */
    enum { N = 2 * RN + 3 };
    oq_envelope_t envs[N];
    json_t *res[RN];
    char eff[RN][32];
    int k = 0;
    for (int i = 0; i < RN / 2; i++) {
        result_env(&envs[k++], ids[i], 1, "running");
        result_env(&envs[k++], ids[i], 1, "succeeded");
    }
    for (int i = RN / 2; i < RN; i++)
        result_env(&envs[k++], ids[i], 1, "running");
    for (int i = RN / 2; i < RN; i++)
        result_env(&envs[k++], ids[i], 1, "succeeded");
    for (int j = 0; j < k; j++)
        if (strcmp(envs[j].status, "succeeded") == 0) {
            int i = 0;
            while (strcmp(ids[i], envs[j].call_id) != 0)
                i++;
            res[i] = json_pack("{s:i}", "i", i);
            envs[j].result = res[i];
            snprintf(eff[i], sizeof eff[i], "eff-%d", i);
            envs[j].effect_id = eff[i];
        }
    envs[k] = envs[1]; /* the first call's succeeded again: a duplicate */
    k++;
    result_env(&envs[k++], ids[1], 2, "failed"); /* an attempt ahead of the call */
    char unknown[OQ_CALL_ID_LEN + 1];
    oq_id_call(unknown);
    result_env(&envs[k++], unknown, 1, "succeeded");
    assert_int_equal(k, N);
    oq_result_outcome_t oc[N];
    assert_int_equal(oq_producer_apply_results(p, envs, N, oc, &err), 0);
    oq_producer_close(p);
    for (int j = 0; j < 2 * RN; j++)
        assert_int_equal(oc[j], OQ_RESULT_APPLIED);
    assert_int_equal(oc[2 * RN], OQ_RESULT_DUPLICATE);
    assert_int_equal(oc[2 * RN + 1], OQ_RESULT_STALE);
    assert_int_equal(oc[2 * RN + 2], OQ_RESULT_UNKNOWN_CALL);
    for (int i = 0; i < RN; i++)
        json_decref(res[i]);

    /* every call succeeded with its result and effect id, settled, its key expiring */
    for (int i = 0; i < RN; i++) {
        char sql[4096];
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM onceq.calls WHERE call_id='%s' AND state='succeeded' "
                 "AND result='{\"i\":%d}' AND error IS NULL AND effect_id='eff-%d' AND "
                 "settled_at IS NOT NULL AND next_redrive_at IS NULL AND "
                 "expires_at > created_at",
                 ids[i], i, i);
        assert_int_equal(pgfx_one(c, sql), 1);
        /* its audit after the submit: running, then succeeded */
        snprintf(sql, sizeof sql,
                 "SELECT count(*) FROM (SELECT string_agg(event, ',' ORDER BY id) e FROM "
                 "onceq.audit WHERE call_id='%s' AND event IN ('running','succeeded')) x "
                 "WHERE e='running,succeeded'",
                 ids[i]);
        assert_int_equal(pgfx_one(c, sql), 1);
    }
    /* the stale one audited, the unknown one only claimed, the duplicate nothing */
    assert_int_equal(pgfx_one(c, "SELECT count(*) FROM onceq.audit WHERE event='result_ignored'"),
                     1);
    assert_int_equal(pgfx_one(c, "SELECT count(*) FROM onceq.result_inbox"), 2 * RN + 2);
    assert_int_equal(pgfx_one(c, "SELECT count(*) FROM onceq.result_inbox WHERE outcome='applied'"),
                     2 * RN);
    /* the callback call's delivery, with the settled call */
    char sql[4096];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM onceq.webhook_deliveries WHERE call_id='%s' AND "
             "body LIKE '%%\"status\":\"succeeded\"%%'",
             ids[0]);
    assert_int_equal(pgfx_one(c, sql), 1);
    assert_int_equal(pgfx_one(c, "SELECT count(*) FROM onceq.webhook_deliveries"), 1);

    /* and few statements: not one per result */
    int64_t ni = pgfx_one(c, "SELECT n FROM public.t_inbox");
    int64_t nu = pgfx_one(c, "SELECT n FROM public.t_upd");
    int64_t na = pgfx_one(c, "SELECT n FROM public.t_aud");
    fprintf(stderr,
            "%d results: %lld result_inbox INSERT, %lld calls UPDATE, %lld audit INSERT "
            "statements\n",
            N, (long long)ni, (long long)nu, (long long)na);
    assert_true(ni <= 4);
    assert_true(nu <= 4);
    assert_true(na <= 6);
    PQfinish(c);
}

typedef struct {
    oq_producer_t *p;
    oq_envelope_t *envs;
    oq_result_outcome_t *oc;
    int tries, rc;
} apply_t;

static void *applier(void *arg)
{
    apply_t *a = arg;
    oq_error_t err = {0};
    /* as the ingest does: a database failure retries the same batch */
    for (a->tries = 1; a->tries <= 5; a->tries++)
        if ((a->rc = oq_producer_apply_results(a->p, a->envs, 2, a->oc, &err)) == 0) break;
    return NULL;
}

/* Another producer claims a message id of the batch after this one read result_inbox ahead
 * (its transaction still open while the batch runs): the batch's write fails, nothing of it
 * holds, and the batch again decides the message a duplicate and applies the other result. */
static void test_results_claimed_meanwhile(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq_producer_t *p = NULL;
    oq_producer_opts_t o;
    memset(&o, 0, sizeof o);
    assert_int_equal(oq_producer_open(conninfo, &o, &p, &err), 0);
    char ids[2][OQ_CALL_ID_LEN + 1];
    json_t *args = json_pack("{s:i}", "amount", 2);
    for (int i = 0; i < 2; i++) {
        char key[32];
        snprintf(key, sizeof key, "meanwhile-%d", i);
        oq_submit_req_t req = {NULL, key, "charge", args, NULL, 0, 0, NULL};
        oq_submit_outcome_t oc;
        oq_call_t call;
        memset(&call, 0, sizeof call);
        assert_int_equal(oq_producer_submit(p, &req, &call, &oc, &err), 0);
        snprintf(ids[i], sizeof ids[i], "%s", call.call_id);
        oq_call_clear(&call);
    }
    json_decref(args);
    oq_envelope_t envs[2];
    result_env(&envs[0], ids[0], 1, "succeeded");
    result_env(&envs[1], ids[1], 1, "succeeded");

    /* the other producer: its claim of envs[0]'s message id, not committed yet */
    PGconn *x = pgfx_connect(conninfo);
    char sql[1024];
    snprintf(sql, sizeof sql,
             "BEGIN; INSERT INTO onceq.result_inbox(message_id,call_id,status,outcome,"
             "received_at) VALUES ('%s','%s','succeeded','applied',1)",
             envs[0].message_id, ids[0]);
    PGresult *r = PQexec(x, sql);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);

    oq_result_outcome_t oc[2] = {0, 0};
    apply_t a = {p, envs, oc, 0, -1};
    pthread_t th;
    pthread_create(&th, NULL, applier, &a);
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL); /* whether the batch waits on the claim by then or not, same end */
    r = PQexec(x, "COMMIT");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    pthread_join(th, NULL);
    oq_producer_close(p);
    fprintf(stderr, "claimed meanwhile: applied after %d tries\n", a.tries);
    assert_int_equal(a.rc, 0);
    assert_int_equal(oc[0], OQ_RESULT_DUPLICATE);
    assert_int_equal(oc[1], OQ_RESULT_APPLIED);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM onceq.calls WHERE call_id='%s' AND "
             "state='pending'",
             ids[0]);
    assert_int_equal(pgfx_one(x, sql), 1);
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM onceq.calls WHERE call_id='%s' AND "
             "state='succeeded'",
             ids[1]);
    assert_int_equal(pgfx_one(x, sql), 1);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM onceq.result_inbox WHERE message_id='%s'",
             envs[1].message_id);
    assert_int_equal(pgfx_one(x, sql), 1);
    PQfinish(x);
}

/* Sequential scans of onceq.\p table that \p c's session has not reported yet
 * (pg_stat_xact_user_tables: since PostgreSQL 15 its earlier transactions' counts too, until the
 * next flush, which flush_scans() forces). */
static int64_t xact_seq_scans(PGconn *c, const char *table)
{
    const char *pr[] = {table};
    PGresult *r = PQexecParams(c,
                               "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE "
                               "schemaname = 'onceq' AND relname = $1",
                               1, NULL, pr, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(r), 1);
    int64_t v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

/* Sets each of the \p n calls \p cid succeeded in \p s's open transaction (queued behind the
 * read ahead, written by oq__producer_store_results_done). */
static void set_results(oq__producer_store_t *s, char (*cid)[40], int n)
{
    oq_error_t err = {0};
    for (int i = 0; i < n; i++) {
        oq__producer_result_t res = {.call_id = cid[i],
                                     .state = "succeeded",
                                     .result = "{}",
                                     .updated_at = 2,
                                     .settled = 1,
                                     .expires_at = 3};
        assert_int_equal(oq__producer_store_set_result(s, &res, &err), 0);
    }
}

/* The one number \p sql answers on \p c. */
static int64_t q_i64(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    int64_t v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

static void flush_scans(PGconn *c)
{
    PQclear(PQexec(c, "SELECT pg_stat_force_next_flush()"));
    PQclear(PQexec(c, "SELECT 1")); /* the flush ran when the session went idle before it */
}

/* The read ahead of a batch of results (the calls it names, which of its message ids
 * result_inbox holds) and the write behind it (the calls updated by a join on their ids) stay
 * index lookups when the tables grow after the writer's session began. Both are prepared: a
 * prepared statement keeps the generic plan it chose while `calls` was small, a sequential scan
 * unless the transaction plans without them (OQ_PG_INDEX_PLANS), for the session: every batch
 * of results then read the whole table (14 ms a batch at 5,000 calls under `onceq-bench e2e`).
 * The writer's store on a connection of the test's own, opted in to prepared statements as the
 * writer's is. */
static void test_results_read_follows_table_growth(void **state)
{
    (void)state;
    enum { W = 8, B = 30 };
    oq_error_t err = {0};
    PGconn *c = NULL, *x = PQconnectdb(conninfo);
    assert_int_equal(PQstatus(x), CONNECTION_OK);
    assert_int_equal(oq_pg_connect(conninfo, &c, &err), 0);
    assert_int_equal(oq_pg_prepared(c, &err), 0);
    oq__producer_store_t s = {NULL, NULL, c};
    PQclear(PQexec(x, "DELETE FROM onceq.calls WHERE call_id LIKE 'g-%'"));
    PGresult *r = PQexec(x, "INSERT INTO onceq.calls(call_id, idem_key, fingerprint, tool, args, "
                            "created_at, updated_at, expires_at) SELECT 'g-' || g, 'g-' || g, "
                            "'f', 'charge', '{}', 1, 1, 1 FROM generate_series(100000, 100239) g");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    /* batches of 30 results while the tables are small (as at a pipeline's start), read ahead,
     * applied and rolled back: a prepared statement's plan is the generic one from the sixth on */
    static oq_envelope_t envs[B];
    static char cid[B][40];
    for (int w = 0; w < W; w++) {
        for (int i = 0; i < B; i++) {
            snprintf(cid[i], sizeof cid[i], "g-%d", 100000 + w * B + i);
            result_env(&envs[i], cid[i], 1, "succeeded");
        }
        assert_int_equal(oq__producer_store_begin(&s, 1000, &err), 0);
        assert_int_equal(oq__producer_store_results_ahead(&s, envs, B, &err), 0);
        set_results(&s, cid, B);
        assert_int_equal(oq__producer_store_results_done(&s, &err), 0);
        oq__producer_store_rollback(&s);
    }
    /* then the tables grow (another connection: the session's plans are not told) */
    r = PQexec(x, "INSERT INTO onceq.calls(call_id, idem_key, fingerprint, tool, args, "
                  "created_at, updated_at, expires_at) SELECT 'g-' || g, 'g-' || g, "
                  "'f', 'charge', '{}', 1, 1, 1 FROM generate_series(1, 20000) g; "
                  "INSERT INTO onceq.result_inbox(message_id, call_id, status, outcome, "
                  "received_at) SELECT 'gm-' || g, 'g-' || g, 'succeeded', 'applied', 1 "
                  "FROM generate_series(1, 20000) g");
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
    for (int i = 0; i < B; i++) {
        snprintf(cid[i], sizeof cid[i], "g-%d", 1 + i * 97);
        result_env(&envs[i], cid[i], 1, "succeeded");
    }
    flush_scans(c);
    int64_t calls = -xact_seq_scans(c, "calls"), inbox = -xact_seq_scans(c, "result_inbox");
    assert_int_equal(oq__producer_store_begin(&s, 1000, &err), 0);
    assert_int_equal(oq__producer_store_results_ahead(&s, envs, B, &err), 0);
    calls += xact_seq_scans(c, "calls");
    inbox += xact_seq_scans(c, "result_inbox");
    int64_t written = -xact_seq_scans(c, "calls");
    set_results(&s, cid, B);
    assert_int_equal(oq__producer_store_results_done(&s, &err), 0);
    written += xact_seq_scans(c, "calls");
    int64_t updated = q_i64(c, "SELECT count(*) FROM onceq.calls WHERE call_id LIKE 'g-%' AND "
                               "state = 'succeeded'");
    oq__producer_store_rollback(&s);
    print_message("sequential scans in the results' read ahead: calls %lld, result_inbox %lld; "
                  "in their write: calls %lld (%lld calls updated)\n",
                  (long long)calls, (long long)inbox, (long long)written, (long long)updated);
    assert_int_equal(calls, 0);
    assert_int_equal(inbox, 0);
    assert_int_equal(written, 0);
    assert_int_equal(updated, B);
    PQclear(PQexec(x, "DELETE FROM onceq.result_inbox WHERE message_id LIKE 'gm-%'; DELETE FROM "
                      "onceq.calls WHERE call_id LIKE 'g-%'"));
    PQfinish(c);
    PQfinish(x);
}

typedef struct {
    oq_producer_t *p;
    const char *key;
    volatile int done;
    int rc;
} submit_t;

static void *submit_one(void *arg)
{
    submit_t *a = arg;
    oq_error_t err = {0};
    json_t *args = json_pack("{s:i}", "amount", 3);
    oq_submit_req_t req = {NULL, a->key, "charge", args, NULL, 0, 0, NULL};
    oq_submit_outcome_t oc;
    oq_call_t call;
    memset(&call, 0, sizeof call);
    a->rc = oq_producer_submit(a->p, &req, &call, &oc, &err);
    oq_call_clear(&call);
    json_decref(args);
    a->done = 1;
    return NULL;
}

/* The batches of results have a writer of their own on PostgreSQL: a batch of results that
 * waits (here for a row lock another transaction holds on its call) does not hold up submits.
 * With one writer for both, the submit queued behind the waiting batch until the lock went. */
static void test_submits_not_behind_results(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq_producer_t *p = NULL;
    oq_producer_opts_t o;
    memset(&o, 0, sizeof o);
    assert_int_equal(oq_producer_open(conninfo, &o, &p, &err), 0);
    json_t *args = json_pack("{s:i}", "amount", 1);
    oq_submit_req_t req = {NULL, "held-1", "charge", args, NULL, 0, 0, NULL};
    oq_submit_outcome_t soc;
    oq_call_t call;
    memset(&call, 0, sizeof call);
    assert_int_equal(oq_producer_submit(p, &req, &call, &soc, &err), 0);
    json_decref(args);
    /* another transaction holds the call's row */
    PGconn *x = pgfx_connect(conninfo);
    const char *pr[] = {call.call_id};
    PQclear(PQexec(x, "BEGIN"));
    PGresult *r = PQexecParams(x, "SELECT 1 FROM onceq.calls WHERE call_id = $1 FOR UPDATE", 1,
                               NULL, pr, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    PQclear(r);
    /* its result: the batch reads ahead, then waits for the row at its write */
    oq_envelope_t envs[2];
    oq_result_outcome_t oc[2];
    result_env(&envs[0], call.call_id, 1, "running");
    result_env(&envs[1], call.call_id, 1, "succeeded");
    apply_t a = {p, envs, oc, 0, -1};
    pthread_t ta, ts;
    assert_int_equal(pthread_create(&ta, NULL, applier, &a), 0);
    usleep(300000);
    /* a new call meanwhile: answered while the row is still held */
    submit_t sb = {p, "held-2", 0, -1};
    assert_int_equal(pthread_create(&ts, NULL, submit_one, &sb), 0);
    for (int i = 0; i < 300 && !sb.done; i++) /* 30 s at most */
        usleep(100000);
    int answered = sb.done;
    print_message("submit answered while a batch of results waited: %s\n", answered ? "yes" : "no");
    PQclear(PQexec(x, "ROLLBACK"));
    pthread_join(ts, NULL);
    pthread_join(ta, NULL);
    assert_true(answered);
    assert_int_equal(sb.rc, 0);
    assert_int_equal(a.rc, 0);
    assert_int_equal(oc[0], OQ_RESULT_APPLIED);
    assert_int_equal(oc[1], OQ_RESULT_APPLIED);
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM onceq.calls WHERE call_id='%s' AND state='succeeded'",
             call.call_id);
    assert_int_equal(pgfx_one(x, sql), 1);
    oq_call_clear(&call);
    oq_producer_close(p);
    PQfinish(x);
}

int main(void)
{
    pgfx_available(1);
    pgfx_fresh_db("onceq_test_producer_pg", conninfo, sizeof conninfo);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_commit),
        cmocka_unit_test(test_results_batched),
        cmocka_unit_test(test_results_claimed_meanwhile),
        cmocka_unit_test(test_results_read_follows_table_growth),
        cmocka_unit_test(test_submits_not_behind_results),
    };
    return cmocka_run_group_tests_name("producer_pg", tests, NULL, NULL);
}
