/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the producer's group commit on PostgreSQL (ONCEQ_TEST_PG_URL, else skipped):
 * concurrent submitters, some of them on the same keys, through oq_producer_submit(). Every
 * new key gets exactly one call and one outbox row, every repeat of a key is a replay of that
 * call, and the writer really batches: many submits per transaction (distinct xmin of the calls)
 * and far fewer INSERT statements that wrote outbox rows than new calls (a statement-level
 * trigger of the test counts them), i.e. the new calls of a batch go in one round trip.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>

#include "oq_producer.h"
#include "pg_fixture.h"

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
    json_t *args = json_pack("{s:i,s:s}", "amount", 1234, "currency", "EUR");
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

static int64_t one(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) fprintf(stderr, "%s: %s", sql, PQerrorMessage(c));
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    int64_t v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
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
    PGconn *c = PQconnectdb(conninfo);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
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
    assert_int_equal(one(c, "SELECT count(*) FROM onceq.calls"), calls);
    /* one outbox row per call, keyed by it, with the call's message id */
    assert_int_equal(one(c, "SELECT count(*) FROM onceq.outbox o JOIN onceq.calls k ON "
                            "o.key = k.call_id AND o.message_id = k.message_id"),
                     calls);
    assert_int_equal(one(c, "SELECT count(*) FROM onceq.outbox"), calls);

    /* batched: many submits per transaction, and per outbox INSERT statement */
    int64_t txs = one(c, "SELECT count(DISTINCT xmin::text) FROM onceq.calls");
    int64_t stmts = one(c, "SELECT n FROM public.t_outbox_stmts");
    fprintf(stderr, "%lld calls in %lld transactions, %lld outbox INSERT statements\n",
            (long long)calls, (long long)txs, (long long)stmts);
    assert_true(txs * 2 < calls);
    assert_true(stmts * 2 < calls);
    PQfinish(c);
}

int main(void)
{
    pgfx_available(1);
    pgfx_fresh_db("onceq_test_producer_pg", conninfo, sizeof conninfo);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_commit),
    };
    return cmocka_run_group_tests_name("producer_pg", tests, NULL, NULL);
}
