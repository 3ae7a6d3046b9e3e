/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of common/pg.c: which backend a database setting names (no server needed), the
 * SQLSTATE packing, and on a PostgreSQL server (ONCEQ_TEST_PG_URL, else skipped): the
 * migrations of schema `onceq` (idempotent, the newer-schema guard refuses untouched), errors
 * mapped to oq_error_t (unique violation -> OQ_EEXIST, a serialization failure -> retriable
 * OQ_EBUSY), oq_pg_tx() retrying a serialization failure and reconnecting after its backend was
 * terminated, statements prepared once per session by oq_pg_run() and prepared again after a
 * reconnect (pg_terminate_backend) or a DEALLOCATE (never on a connection not opted in), and a
 * refused connection that neither crashes nor echoes the connection string; array parameters
 * in the binary format (oq_pg_array_t): their layout and refusals offline, and on the server
 * every element read back as sent (quotes, backslashes, braces, commas, NULLs, the empty string
 * and the empty array, bigint and integer at their limits) and another element type than the
 * statement's refused.
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

/* --- array parameters in the binary format ----------------------------------------------- */

static uint32_t be32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

static void test_array_layout(void **state)
{
    (void)state;
    oq_pg_array_t a;
    const char *p = NULL;
    int len = 0;
    oq_pg_array_init(&a, 't');
    assert_int_equal(oq_pg_array_add(&a, "ab"), 0);
    assert_int_equal(oq_pg_array_add(&a, NULL), 0);
    assert_int_equal(oq_pg_array_end(&a, &p, &len), 0);
    assert_int_equal(len, 20 + 4 + 2 + 4);
    assert_int_equal(be32(p), 1);      /* one dimension */
    assert_int_equal(be32(p + 4), 1);  /* has a NULL */
    assert_int_equal(be32(p + 8), 25); /* text */
    assert_int_equal(be32(p + 12), 2); /* two elements */
    assert_int_equal(be32(p + 16), 1); /* from 1 */
    assert_int_equal(be32(p + 20), 2); /* "ab" */
    assert_memory_equal(p + 24, "ab", 2);
    assert_int_equal(be32(p + 26), 0xffffffffu); /* NULL */
    oq_pg_array_free(&a);

    oq_pg_array_init(&a, 'b'); /* empty: no dimension */
    assert_int_equal(oq_pg_array_end(&a, &p, &len), 0);
    assert_int_equal(len, 12);
    assert_int_equal(be32(p), 0);
    assert_int_equal(be32(p + 8), 20);
    oq_pg_array_free(&a);

    oq_pg_array_init(&a, 'b');
    assert_int_equal(oq_pg_array_add(&a, "-2"), 0);
    assert_int_equal(oq_pg_array_end(&a, &p, &len), 0);
    assert_int_equal(be32(p + 20), 8);
    assert_int_equal(be32(p + 24), 0xffffffffu);
    assert_int_equal(be32(p + 28), 0xfffffffeu);
    oq_pg_array_free(&a);

    /* not a value of the type: refused, and it stays refused */
    const char *bad_b[] = {"", "1x", "9223372036854775808", " 1", "1.0"};
    for (size_t i = 0; i < sizeof bad_b / sizeof *bad_b; i++) {
        oq_pg_array_init(&a, 'b');
        assert_int_equal(oq_pg_array_add(&a, bad_b[i]), OQ_EINVAL);
        assert_int_equal(oq_pg_array_add(&a, "1"), OQ_EINVAL);
        assert_int_equal(oq_pg_array_end(&a, &p, &len), OQ_EINVAL);
        assert_null(p);
        oq_pg_array_free(&a);
    }
    oq_pg_array_init(&a, 'i');
    assert_int_equal(oq_pg_array_add(&a, "2147483648"), OQ_EINVAL);
    oq_pg_array_free(&a);
    oq_pg_array_init(&a, 'o');
    assert_int_equal(oq_pg_array_add(&a, "yes"), OQ_EINVAL);
    oq_pg_array_free(&a);
}

static void test_array_roundtrip(void **state)
{
    (void)state;
    oq_error_t err = {0};
    PGconn *c = NULL;
    assert_int_equal(oq_pg_connect(conninfo, &c, &err), 0);
    assert_int_equal(oq_pg_prepared(c, &err), 0);
    const char *texts[] = {"plain",
                           "a\"quoted\" one",
                           "back\\slash",
                           "{braces},commas",
                           "",
                           NULL,
                           "NULL",
                           "\xc3\xa9t\xc3\xa9 \xe2\x82\xac",
                           " spaced "};
    const int nt = (int)(sizeof texts / sizeof *texts);
    const char *bigs[] = {"0", "-9223372036854775808", "9223372036854775807", NULL, "42"};
    const char *ints[] = {"-2147483648", "2147483647", "7", NULL, "0"};
    const char *bools[] = {"t", "f", NULL, "true", "0"};
    const char *want_bools[] = {"t", "f", NULL, "t", "f"};
    oq_pg_array_t a[4];
    const char *p[4];
    int len[4], fmt[4] = {1, 1, 1, 1};
    oq_pg_array_init(&a[0], 't');
    for (int i = 0; i < nt; i++)
        assert_int_equal(oq_pg_array_add(&a[0], texts[i]), 0);
    oq_pg_array_init(&a[1], 'b');
    oq_pg_array_init(&a[2], 'i');
    oq_pg_array_init(&a[3], 'o');
    for (int i = 0; i < 5; i++) {
        assert_int_equal(oq_pg_array_add(&a[1], bigs[i]), 0);
        assert_int_equal(oq_pg_array_add(&a[2], ints[i]), 0);
        assert_int_equal(oq_pg_array_add(&a[3], bools[i]), 0);
    }
    for (int j = 0; j < 4; j++)
        assert_int_equal(oq_pg_array_end(&a[j], &p[j], &len[j]), 0);
    PGresult *r = NULL;
    static const char texts_sql[] = "SELECT x FROM unnest($1::text[]) WITH ORDINALITY AS u(x, i) "
                                    "ORDER BY i";
    assert_int_equal(oq_pg_run_bin(c, texts_sql, 1, p, len, fmt, &r, &err), 0);
    assert_int_equal(PQntuples(r), nt);
    for (int i = 0; i < nt; i++) {
        if (!texts[i]) {
            assert_true(PQgetisnull(r, i, 0));
            continue;
        }
        assert_false(PQgetisnull(r, i, 0));
        assert_string_equal(PQgetvalue(r, i, 0), texts[i]);
    }
    PQclear(r);
    static const char typed_sql[] = "SELECT b, n, o FROM unnest($1::bigint[], $2::integer[], "
                                    "$3::boolean[]) WITH ORDINALITY AS u(b, n, o, i) ORDER BY i";
    for (int run = 0; run < 7; run++) { /* prepared: past the generic plan's sixth run too */
        assert_int_equal(oq_pg_run_bin(c, typed_sql, 3, p + 1, len + 1, fmt, &r, &err), 0);
        assert_int_equal(PQntuples(r), 5);
        for (int i = 0; i < 5; i++) {
            const char *want[] = {bigs[i], ints[i], want_bools[i]};
            for (int k = 0; k < 3; k++) {
                if (!want[k])
                    assert_true(PQgetisnull(r, i, k));
                else
                    assert_string_equal(PQgetvalue(r, i, k), want[k]);
            }
        }
        PQclear(r);
    }
    /* the empty array */
    oq_pg_array_t e;
    const char *ep;
    int el;
    oq_pg_array_init(&e, 't');
    assert_int_equal(oq_pg_array_end(&e, &ep, &el), 0);
    assert_int_equal(oq_pg_run_bin(c, "SELECT cardinality($1::text[])", 1, &ep, &el, fmt, &r, &err),
                     0);
    assert_string_equal(PQgetvalue(r, 0, 0), "0");
    PQclear(r);
    /* an element type other than the statement's cast: refused by the server, as an error */
    assert_int_not_equal(
        oq_pg_run_bin(c, "SELECT cardinality($1::text[])", 1, p + 1, len + 1, fmt, &r, &err), 0);
    assert_null(r);
    assert_non_null(strstr(err.msg, "array element type 20 (bigint) instead of expected 25"));
    oq_pg_array_free(&e);
    for (int j = 0; j < 4; j++)
        oq_pg_array_free(&a[j]);
    PQfinish(c);
}

int main(void)
{
    const struct CMUnitTest offline[] = {
        cmocka_unit_test(test_backend_of),   cmocka_unit_test(test_sqlstate),
        cmocka_unit_test(test_password),     cmocka_unit_test(test_refused),
        cmocka_unit_test(test_array_layout),
    };
    int rc = cmocka_run_group_tests_name("pg_offline", offline, NULL, NULL);
    if (rc) return rc;
    pgfx_available(1);
    pgfx_fresh_db("onceq_test_pg", conninfo, sizeof conninfo);
    const struct CMUnitTest online[] = {
        cmocka_unit_test(test_migrate),         cmocka_unit_test(test_errors),
        cmocka_unit_test(test_tx_retry),        cmocka_unit_test(test_prepared),
        cmocka_unit_test(test_array_roundtrip),
    };
    return cmocka_run_group_tests_name("pg", online, NULL, NULL);
}
