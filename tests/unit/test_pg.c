/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of common/pg.c: which backend a database setting names (no server needed), the
 * SQLSTATE packing, and on a PostgreSQL server (ONCEQ_TEST_PG_URL, else skipped): the
 * migrations of schema `onceq` (idempotent, the newer-schema guard refuses untouched), errors
 * mapped to oq_error_t (unique violation -> OQ_EEXIST, a serialization failure -> retriable
 * OQ_EBUSY), oq_pg_tx() retrying a serialization failure and reconnecting after its backend was
 * terminated, statements prepared once per session by oq_pg_run() and prepared again after a
 * reconnect (pg_terminate_backend) or a DEALLOCATE (never on a connection not opted in), and a
 * refused connection that neither crashes nor echoes the connection string.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "oq_pg.h"
#include "oq_util.h"
#include "pg_fixture.h"

static char conninfo[2048];

static void test_backend_of(void **state)
{
    (void)state;
    assert_int_equal(oq_backend_of("postgres://u@h/db"), OQ_BACKEND_POSTGRES);
    assert_int_equal(oq_backend_of("postgresql://h:5432/db?sslmode=disable"), OQ_BACKEND_POSTGRES);
    assert_int_equal(oq_backend_of("host=127.0.0.1 dbname=onceq"), OQ_BACKEND_POSTGRES);
    assert_int_equal(oq_backend_of("  dbname = onceq"), OQ_BACKEND_POSTGRES);
    assert_int_equal(oq_backend_of("service=prod"), OQ_BACKEND_POSTGRES);
    assert_int_equal(oq_backend_of("calls.db"), OQ_BACKEND_SQLITE);
    assert_int_equal(oq_backend_of("/var/lib/onceq/calls.db"), OQ_BACKEND_SQLITE);
    assert_int_equal(oq_backend_of("./a=b.db"), OQ_BACKEND_SQLITE);
    assert_int_equal(oq_backend_of("colour=blue.db"), OQ_BACKEND_SQLITE); /* not a libpq key */
    assert_int_equal(oq_backend_of("postgres.db"), OQ_BACKEND_SQLITE);
    assert_int_equal(oq_backend_of(""), OQ_BACKEND_SQLITE);
    assert_int_equal(oq_backend_of(NULL), OQ_BACKEND_SQLITE);
}

static void test_password(void **state)
{
    (void)state;
    assert_true(oq_pg_conninfo_has_password("postgresql://u:pw@h/db"));
    assert_true(oq_pg_conninfo_has_password("host=h password=pw dbname=d"));
    assert_true(oq_pg_conninfo_has_password("postgresql://u@h/db?password=pw"));
    assert_false(oq_pg_conninfo_has_password("postgresql://u@h/db?passfile=/x/pgpass"));
    assert_false(oq_pg_conninfo_has_password("host=h dbname=d"));
    assert_false(oq_pg_conninfo_has_password("not a conninfo ="));
}

static void test_sqlstate(void **state)
{
    (void)state;
    assert_int_equal(oq_pg_sqlstate_code("00000"), 0);
    assert_int_not_equal(oq_pg_sqlstate_code("40001"), oq_pg_sqlstate_code("40P01"));
    /* PostgreSQL's own ERRCODE_UNIQUE_VIOLATION: MAKE_SQLSTATE('2','3','5','0','5') */
    assert_int_equal(oq_pg_sqlstate_code("23505"),
                     2 | (3 << 6) | (5 << 12) | (0 << 18) | (5 << 24));
}

static void test_refused(void **state)
{
    (void)state;
    PGconn *c = NULL;
    oq_error_t err = {0};
    int rc =
        oq_pg_connect("postgresql://secretuser:hunter2@127.0.0.1:1/x?connect_timeout=2", &c, &err);
    assert_int_equal(rc, OQ_EDB);
    assert_true(err.retriable);
    assert_null(c);
    assert_null(strstr(err.msg, "hunter2"));
}

static PGconn *conn(void)
{
    PGconn *c = NULL;
    oq_error_t err = {0};
    if (oq_pg_connect(conninfo, &c, &err)) fail_msg("connect: %s", err.msg);
    return c;
}

static void test_migrate(void **state)
{
    (void)state;
    PGconn *c = conn();
    oq_error_t err = {0};
    int v = -1;
    assert_int_equal(oq_pg_migrate(c, &err), 0);
    assert_int_equal(oq_pg_schema_version(c, &v, &err), 0);
    int n = 0;
    while (oq_migrations_postgres[n])
        n++;
    assert_int_equal(v, n);
    assert_int_equal(oq_pg_migrate(c, &err), 0); /* again: nothing to do */
    /* 0009: outbox pages keep room for the assign's new row versions */
    PGresult *r =
        PQexec(c, "SELECT reloptions::text FROM pg_class WHERE oid = 'onceq.outbox'::regclass");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_non_null(strstr(PQgetvalue(r, 0, 0), "fillfactor=50"));
    PQclear(r);
    /* 0010: the horizon's table names its fence (the version keeps row-lock consumers off) */
    r = PQexec(c, "SELECT obj_description('onceq.consumer_retention'::regclass, 'pg_class')");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_non_null(strstr(PQgetvalue(r, 0, 0), "advisory lock"));
    PQclear(r);
    /* a newer schema is refused untouched */
    assert_int_equal(oq_pg_exec(c, "UPDATE onceq.schema_version SET version = 999", &err), 0);
    assert_int_equal(oq_pg_migrate(c, &err), OQ_EVERSION);
    assert_non_null(strstr(err.msg, "newer"));
    assert_int_equal(oq_pg_schema_version(c, &v, &err), 0);
    assert_int_equal(v, 999);
    char back[96];
    snprintf(back, sizeof back, "UPDATE onceq.schema_version SET version = %d", n);
    assert_int_equal(oq_pg_exec(c, back, &err), 0);
    PQfinish(c);
}

static void test_errors(void **state)
{
    (void)state;
    PGconn *c = conn();
    oq_error_t err = {0};
    assert_int_equal(oq_pg_migrate(c, &err), 0);
    const char *p[] = {"m-err-1"};
    const char *ins = "INSERT INTO onceq.outbox(message_id,topic,key,payload,created_at) "
                      "VALUES($1,'t','k','{}',1)";
    assert_int_equal(oq_pg_cmd(c, ins, 1, p, NULL, &err), 0);
    assert_int_equal(oq_pg_cmd(c, ins, 1, p, NULL, &err), OQ_EEXIST);
    assert_int_equal(err.cause, oq_pg_sqlstate_code("23505"));
    assert_int_equal(oq_pg_exec(c, "DO $$BEGIN RAISE SQLSTATE '40001'; END$$", &err), OQ_EBUSY);
    assert_true(err.retriable);
    assert_int_equal(oq_pg_exec(c, "DO $$BEGIN RAISE SQLSTATE '40P01'; END$$", &err), OQ_EBUSY);
    assert_int_equal(oq_pg_exec(c, "SELECT * FROM onceq.no_such_table", &err), OQ_EDB);
    assert_false(err.retriable);
    PQfinish(c);
}

/* Fails with a serialization failure on its first \p fail runs, then inserts a row. */
typedef struct {
    int runs, fail, kill_first;
} tx_arg_t;

static int tx_body(PGconn *c, void *arg, oq_error_t *err)
{
    tx_arg_t *a = arg;
    a->runs++;
    if (a->kill_first && a->runs == 1) {
        /* another session terminates this one: the next statement finds the connection lost */
        PGconn *k = conn();
        char sql[96];
        snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%d)", PQbackendPID(c));
        oq_pg_exec(k, sql, NULL);
        PQfinish(k);
    }
    if (a->runs <= a->fail) return oq_pg_exec(c, "DO $$BEGIN RAISE SQLSTATE '40001'; END$$", err);
    return oq_pg_exec(c, "INSERT INTO onceq.audit(ts,call_id,event) VALUES(1,'c-tx','tx')", err);
}

static int64_t count_tx(void)
{
    PGconn *c = conn();
    PGresult *r = PQexec(c, "SELECT count(*) FROM onceq.audit WHERE call_id='c-tx'");
    int64_t n = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    PQfinish(c);
    return n;
}

static void test_tx_retry(void **state)
{
    (void)state;
    oq_pg_t p;
    oq_error_t err = {0};
    assert_int_equal(oq_pg_open(&p, conninfo, &err), 0);
    assert_int_equal(oq_pg_migrate(p.conn, &err), 0);
    assert_int_equal(oq_pg_exec(p.conn, "DELETE FROM onceq.audit WHERE call_id='c-tx'", &err), 0);
    tx_arg_t a = {0, 2, 0};
    assert_int_equal(oq_pg_tx(&p, 5, tx_body, &a, &err), 0);
    assert_int_equal(a.runs, 3);
    assert_int_equal(count_tx(), 1);
    /* out of tries: the error, nothing written */
    tx_arg_t b = {0, 10, 0};
    assert_int_equal(oq_pg_tx(&p, 3, tx_body, &b, &err), OQ_EBUSY);
    assert_int_equal(b.runs, 3);
    assert_int_equal(count_tx(), 1);
    /* the connection killed mid-transaction: reconnected, run again, one row */
    tx_arg_t k = {0, 0, 1};
    assert_int_equal(oq_pg_tx(&p, 3, tx_body, &k, &err), 0);
    assert_int_equal(k.runs, 2);
    assert_int_equal(count_tx(), 2);
    oq_pg_close(&p);
}

/* How many statements onceq prepared in \p c's own session. */
static int64_t prepared_count(PGconn *c)
{
    PGresult *r = PQexec(c, "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'oq_s%'");
    int64_t n = PQresultStatus(r) == PGRES_TUPLES_OK ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : -1;
    PQclear(r);
    return n;
}

static const char PLUS_ONE[] = "SELECT $1::int + 1";
static const char TIMES_TWO[] = "SELECT $1::int * 2";

/* Runs \p sql with parameter "20" through oq_pg_run(); its one value, or -1. */
static int64_t run_one(PGconn *c, const char *sql, oq_error_t *err)
{
    const char *p[] = {"20"};
    PGresult *r = NULL;
    if (oq_pg_run(c, sql, 1, p, &r, err) != 0) return -1;
    int64_t v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

static void test_prepared(void **state)
{
    (void)state;
    oq_error_t err = {0};
    PGconn *c = NULL, *plain = NULL;
    assert_int_equal(oq_pg_connect(conninfo, &c, &err), 0);
    assert_int_equal(oq_pg_prepared(c, &err), 0);
    assert_int_equal(oq_pg_prepared(c, &err), 0); /* twice: harmless */
    assert_int_equal(run_one(c, PLUS_ONE, &err), 21);
    assert_int_equal(run_one(c, PLUS_ONE, &err), 21);
    assert_int_equal(run_one(c, TIMES_TWO, &err), 40);
    assert_int_equal(prepared_count(c), 2); /* once per statement, not per run */

    /* the backend terminated: the next run fails as a lost connection (retriable); after the
     * reconnect every statement is prepared again in the new session */
    PGconn *k = conn();
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT pg_terminate_backend(%d)", PQbackendPID(c));
    PQclear(PQexec(k, sql));
    PQfinish(k);
    for (int i = 0; i < 100 && run_one(c, PLUS_ONE, &err) != -1; i++) /* until it is gone */
        oq_sleep_ms(20, NULL);
    assert_true(err.retriable);
    assert_true(oq_pg_lost(c, &err));
    PQreset(c);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    assert_int_equal(run_one(c, PLUS_ONE, &err), 21);
    assert_int_equal(run_one(c, TIMES_TWO, &err), 40);
    assert_int_equal(prepared_count(c), 2);

    /* the session forgot them (DEALLOCATE ALL): prepared again outside a transaction */
    PQclear(PQexec(c, "DEALLOCATE ALL"));
    assert_int_equal(run_one(c, TIMES_TWO, &err), 40);
    assert_int_equal(prepared_count(c), 1);

    /* a connection not opted in (a caller's) is left as found: parsed, nothing prepared */
    assert_int_equal(oq_pg_connect(conninfo, &plain, &err), 0);
    assert_int_equal(run_one(plain, PLUS_ONE, &err), 21);
    assert_int_equal(prepared_count(plain), 0);
    PQfinish(plain);
    PQfinish(c);
}

int main(void)
{
    const struct CMUnitTest offline[] = {
        cmocka_unit_test(test_backend_of),
        cmocka_unit_test(test_sqlstate),
        cmocka_unit_test(test_password),
        cmocka_unit_test(test_refused),
    };
    int rc = cmocka_run_group_tests_name("pg_offline", offline, NULL, NULL);
    if (rc) return rc;
    pgfx_available(1);
    pgfx_fresh_db("onceq_test_pg", conninfo, sizeof conninfo);
    const struct CMUnitTest online[] = {
        cmocka_unit_test(test_migrate),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_tx_retry),
        cmocka_unit_test(test_prepared),
    };
    return cmocka_run_group_tests_name("pg", online, NULL, NULL);
}
