/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The operators' functions on a producer database (oq_producer_db_*, oq_relay_db_*: what
 * `onceq get/stats/inspect/purge/dlq` and `onceq console` call), on both backends with the
 * same test bodies: once on a temporary SQLite file, once on PostgreSQL (a fresh database on
 * ONCEQ_TEST_PG_URL; skipped, exit 77, without it, failed under CI=true).
 *
 * Covered: paging newest first walks every call exactly once at any page size, also across two
 * calls whose ids share a position (one millisecond and the same 12 random bits: PostgreSQL's
 * positions are the ids' first 60 bits); filters by state, tool, tenant and creation time; a
 * key searched in every tenant; get, audit and stats on the handle; the relay's dead rows and
 * status (its lease) on the handle; purge through the handle keeps a call in review. Opening a
 * PostgreSQL handle: a password in the string is refused before anything connects, a database
 * without schema onceq is "not found" (the tools never migrate it), a newer schema is refused.
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

#include "oq_dbh.h"
#include "oq_pg.h"
#include "oq_relay.h"
#include "pg_fixture.h"
#include "producer_int.h"

typedef struct {
    char dir[64];
    oq_dbh_t h;
    oq__producer_store_t s;
} fx_t;

static char pg_conninfo[2048];

static int setup_sqlite(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    oq_error_t err = {0};
    snprintf(f->dir, sizeof f->dir, "/tmp/oq-pops-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    char path[128];
    snprintf(path, sizeof path, "%s/calls.db", f->dir);
    oq_db_opts_t o = {.synchronous = "OFF"};
    assert_int_equal(oq_dbh_open(path, &o, &f->h, &err), 0);
    assert_int_equal(oq_producer_migrate(f->h.db, &err), 0);
    f->s = oq__producer_store_of(&f->h);
    *state = f;
    return 0;
}

static int setup_pg(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    oq_error_t err = {0};
    PGconn *c = NULL;
    assert_int_equal(oq_pg_connect(pg_conninfo, &c, &err), 0);
    assert_int_equal(oq_pg_migrate(c, &err), 0);
    assert_int_equal(oq_pg_exec(c,
                                "TRUNCATE onceq.calls, onceq.outbox, onceq.audit, "
                                "onceq.result_inbox, onceq.outbox_dead, onceq.relay_lease",
                                &err),
                     0);
    PQfinish(c);
    assert_int_equal(oq_dbh_open(pg_conninfo, NULL, &f->h, &err), 0);
    assert_int_equal(f->h.backend, OQ_BACKEND_POSTGRES);
    f->s = oq__producer_store_of(&f->h);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    oq_dbh_close(&f->h);
    if (f->dir[0]) {
        char cmdline[160];
        snprintf(cmdline, sizeof cmdline, "rm -rf %s", f->dir);
        if (system(cmdline) != 0) fprintf(stderr, "cleanup of %s failed\n", f->dir);
    }
    free(f);
    return 0;
}

/* Calls in creation order (ids ascending, created_at ascending). ids[3] and ids[4] share their
 * first 15 hex digits: one millisecond and the same 12 random bits (make_ids). */
#define NCALLS 7
static char ids[NCALLS][40];
static const char *const tools[NCALLS] = {"pay", "ship", "pay", "pay", "ship", "pay", "mail"};
static const char *const tenants[NCALLS] = {"a", "b", "a", "a", "b", "b", "b"};

static int64_t created(int i)
{
    static const int at[NCALLS] = {1, 2, 3, 4, 4, 5, 6};
    return 1700000000000LL + (int64_t)at[i] * 1000;
}

/* ids as the producer draws them: 48 bits of the creation millisecond, then random bits */
static void make_ids(void)
{
    static const char *const rnd[NCALLS] = {"aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb",
                                            "cccccccccccccccccccc", "ddd00000000000000000",
                                            "ddd11111111111111111", "eeeeeeeeeeeeeeeeeeee",
                                            "ffffffffffffffffffff"};
    for (int i = 0; i < NCALLS; i++)
        snprintf(ids[i], sizeof ids[i], "c_%012llx%s", (long long)created(i), rnd[i]);
}

static void fill(fx_t *f)
{
    oq_error_t err = {0};
    assert_int_equal(oq__producer_store_begin(&f->s, 5000, &err), 0);
    for (int i = 0; i < NCALLS; i++) {
        char key[32], mid[40];
        snprintf(key, sizeof key, "k%d", i % 6); /* k0 in tenants a and b */
        snprintf(mid, sizeof mid, "00000000-0000-4000-8000-%012d", i);
        oq__producer_new_call_t c = {
            .call_id = ids[i],
            .tenant = tenants[i],
            .idem_key = key,
            .fingerprint = "0000000000000000000000000000000000000000000000000000000000000000",
            .tool = tools[i],
            .args = "{}",
            .args_len = 2,
            .created_at = created(i),
            .expires_at = created(i) + 86400000,
            .message_id = mid,
            .payload = "{}",
            .payload_len = 2,
        };
        oq__producer_insert_t r = 0;
        assert_int_equal(oq__producer_store_insert_call(&f->s, &c, &r, &err), 0);
        assert_int_equal(r, OQ__INSERT_NEW);
    }
    oq__producer_result_t done = {ids[1], "succeeded", "{}", NULL, "e1", created(1) + 5, 1, 1};
    oq__producer_result_t rev = {ids[4], "needs_review", NULL, NULL, NULL, created(4) + 5, 1, 0};
    assert_int_equal(oq__producer_store_set_result(&f->s, &done, &err), 0);
    assert_int_equal(oq__producer_store_set_result(&f->s, &rev, &err), 0);
    assert_int_equal(
        oq__producer_store_audit_add(&f->s, created(1) + 5, ids[1], "succeeded", "{\"x\":1}", &err),
        0);
    assert_int_equal(oq__producer_store_commit(&f->s, &err), 0);
}

/* The ids of a page, newest first, and its next. */
static void page(fx_t *f, const oq_call_query_t *q, char out[NCALLS + 2][40], size_t *n,
                 int64_t *next)
{
    oq_error_t err = {0};
    json_t *doc = NULL;
    assert_int_equal(oq_producer_db_list(&f->h, q, &doc, &err), 0);
    json_t *a = json_object_get(doc, "calls");
    *n = json_array_size(a);
    assert_true(*n <= NCALLS);
    for (size_t i = 0; i < *n; i++)
        snprintf(out[i], 40, "%s",
                 json_string_value(json_object_get(json_array_get(a, i), "call_id")));
    json_t *nx = json_object_get(doc, "next");
    *next = json_is_integer(nx) ? json_integer_value(nx) : 0;
    json_decref(doc);
}

static void test_paging(void **state)
{
    fx_t *f = *state;
    fill(f);
    for (int limit = 1; limit <= NCALLS + 1; limit++) {
        char seen[NCALLS * 2][40];
        size_t total = 0;
        int64_t before = 0;
        for (int pages = 0; pages < 3 * NCALLS; pages++) {
            oq_call_query_t q = {.before = before, .limit = limit};
            char got[NCALLS + 2][40];
            size_t n = 0;
            int64_t next = 0;
            page(f, &q, got, &n, &next);
            for (size_t i = 0; i < n; i++) {
                assert_true(total < NCALLS);
                memcpy(seen[total++], got[i], 40);
            }
            if (!next) break;
            before = next;
        }
        assert_int_equal(total, NCALLS); /* nothing skipped, nothing twice ... */
        for (size_t i = 0; i < total; i++)
            assert_string_equal(seen[i], ids[NCALLS - 1 - i]); /* ... newest first */
    }
}

static void test_filters(void **state)
{
    fx_t *f = *state;
    char got[NCALLS + 2][40];
    size_t n = 0;
    int64_t next = 0;
    fill(f);
    oq_call_query_t q1 = {.state = "needs_review", .limit = 50};
    page(f, &q1, got, &n, &next);
    assert_int_equal(n, 1);
    assert_string_equal(got[0], ids[4]);
    oq_call_query_t q2 = {.state = "pending", .tool = "pay", .tenant = "a", .limit = 50};
    page(f, &q2, got, &n, &next);
    assert_int_equal(n, 3);
    assert_string_equal(got[0], ids[3]);
    assert_string_equal(got[2], ids[0]);
    oq_call_query_t q3 = {.since_ms = created(2), .until_ms = created(4), .limit = 50};
    page(f, &q3, got, &n, &next);
    assert_int_equal(n, 3);
    assert_string_equal(got[0], ids[4]);
    assert_string_equal(got[2], ids[2]);
    oq_call_query_t q4 = {.idem_key = "k0", .limit = 50}; /* every tenant */
    page(f, &q4, got, &n, &next);
    assert_int_equal(n, 2);
    oq_call_query_t q5 = {.call_id = ids[5], .tenant = "a", .limit = 50}; /* not a's */
    page(f, &q5, got, &n, &next);
    assert_int_equal(n, 0);
    oq_call_query_t q6 = {.tool = "nothing", .limit = 50};
    page(f, &q6, got, &n, &next);
    assert_int_equal(n, 0);
    assert_int_equal(next, 0);
}

static void test_get_audit_stats_purge(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_call_t c;
    fill(f);
    assert_int_equal(oq_producer_db_get(&f->h, ids[1], &c, &err), 0);
    assert_string_equal(c.state, "succeeded");
    oq_call_clear(&c);
    assert_int_equal(oq_producer_db_get_by_key(&f->h, "b", "k4", &c, &err), 0);
    assert_string_equal(c.call_id, ids[4]);
    oq_call_clear(&c);
    assert_int_equal(oq_producer_db_get(&f->h, "c_00000000000000000000000000000000", &c, &err),
                     OQ_ENOTFOUND);
    oq_audit_row_t *rows = NULL;
    size_t n = 0;
    assert_int_equal(oq_producer_db_audit(&f->h, ids[1], &rows, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(rows[0].event, "succeeded");
    oq_audit_free(rows, n);
    json_t *st = NULL;
    assert_int_equal(oq_producer_db_stats(&f->h, &st, &err), 0);
    assert_int_equal(json_integer_value(json_object_get(st, "calls")), NCALLS);
    json_t *by = json_object_get(st, "by_status");
    assert_int_equal(json_integer_value(json_object_get(by, "needs_review")), 1);
    assert_int_equal(json_integer_value(json_object_get(by, "pending")), NCALLS - 2);
    json_decref(st);
    /* everything expired: only the settled call goes */
    oq_purge_stats_t ps = {0};
    assert_int_equal(
        oq_producer_db_purge(&f->h, created(NCALLS - 1) + 2 * 86400000LL, 1000, 100, &ps, &err), 0);
    assert_int_equal(ps.calls, 1);
    assert_int_equal(ps.audit, 1);
    assert_int_equal(oq_producer_db_get(&f->h, ids[1], &c, &err), OQ_ENOTFOUND);
    assert_int_equal(oq_producer_db_get(&f->h, ids[4], &c, &err), 0);
    assert_string_equal(c.state, "needs_review");
    oq_call_clear(&c);
}

static void test_relay_views(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    json_t *a = NULL, *st = NULL;
    char line[512];
    const char *sql =
        f->h.pg ? "INSERT INTO onceq.outbox_dead(seq,message_id,topic,key,payload,created_at,"
                  "reason,detail,dead_at) VALUES (7,'m7','onceq.tool-calls','c_x','{}',1,"
                  "'MSG_SIZE_TOO_LARGE',NULL,2)"
                : "INSERT INTO outbox_dead(seq,message_id,topic,key,payload,created_at,reason,"
                  "detail,dead_at) VALUES (7,'m7','onceq.tool-calls','c_x','{}',1,"
                  "'MSG_SIZE_TOO_LARGE',NULL,2)";
    assert_int_equal(f->h.pg ? oq_pg_exec(f->h.pg, sql, &err) : oq_db_exec(f->h.db, sql, &err), 0);
    assert_int_equal(oq_relay_db_dead_list(&f->h, 0, 10, &a, &err), 0);
    assert_int_equal(json_array_size(a), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(a, 0), "seq")), 7);
    assert_string_equal(json_string_value(json_object_get(json_array_get(a, 0), "reason")),
                        "MSG_SIZE_TOO_LARGE");
    assert_true(json_is_null(json_object_get(json_array_get(a, 0), "handled_at")));
    json_decref(a);
    assert_int_equal(oq_relay_db_dead_list(&f->h, 8, 10, &a, &err), 0);
    assert_int_equal(json_array_size(a), 0);
    json_decref(a);
    assert_int_equal(oq_relay_db_status_json(&f->h, &st, &err), 0);
    assert_int_equal(json_integer_value(json_object_get(st, "dead")), 1);
    assert_int_equal(json_integer_value(json_object_get(st, "pending")), 0);
    json_decref(st);
    assert_int_equal(oq_relay_db_status_line(&f->h, line, sizeof line, &err), 0);
    assert_non_null(strstr(line, "relay: pending=0"));
    assert_non_null(strstr(line, "dead=1"));
}

static char bare_conninfo[2048];

static void test_dbh_open_pg(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq_dbh_t h;
    assert_int_equal(oq_dbh_open("postgresql://onceq:secret@127.0.0.1:1/x", NULL, &h, &err),
                     OQ_EINVAL);
    assert_null(strstr(err.msg, "secret"));
    assert_non_null(strstr(err.msg, "passfile"));
    assert_null(h.pg);
    assert_int_equal(oq_dbh_open(bare_conninfo, NULL, &h, &err), OQ_ENOTFOUND);
    assert_non_null(strstr(err.msg, "onceq migrate"));
    assert_null(h.pg);
    PGconn *c = NULL;
    assert_int_equal(oq_pg_connect(bare_conninfo, &c, &err), 0);
    assert_int_equal(oq_pg_migrate(c, &err), 0);
    assert_int_equal(oq_pg_exec(c, "UPDATE onceq.schema_version SET version = 99", &err), 0);
    PQfinish(c);
    assert_int_equal(oq_dbh_open(bare_conninfo, NULL, &h, &err), OQ_EVERSION);
    assert_null(h.pg);
    oq_db_opts_t ro = {.readonly = 1};
    assert_int_equal(oq_dbh_open(pg_conninfo, &ro, &h, &err), 0);
    assert_int_not_equal(oq_pg_exec(h.pg, "DELETE FROM onceq.calls", &err), 0); /* read-only */
    oq_dbh_close(&h);
    assert_string_equal(oq_dbh_label("postgresql://u@h/d?passfile=/p"), "PostgreSQL");
    assert_string_equal(oq_dbh_label("calls.db"), "calls.db");
}

#define BOTH(setup)                                                                                \
    {                                                                                              \
        cmocka_unit_test_setup_teardown(test_paging, setup, teardown),                             \
            cmocka_unit_test_setup_teardown(test_filters, setup, teardown),                        \
            cmocka_unit_test_setup_teardown(test_get_audit_stats_purge, setup, teardown),          \
            cmocka_unit_test_setup_teardown(test_relay_views, setup, teardown),                    \
    }

int main(void)
{
    make_ids();
    const struct CMUnitTest sqlite_tests[] = BOTH(setup_sqlite);
    int rc = cmocka_run_group_tests_name("producer_ops_sqlite", sqlite_tests, NULL, NULL);
    if (rc) return rc;
    pgfx_available(1);
    pgfx_fresh_db("onceq_test_producer_ops", pg_conninfo, sizeof pg_conninfo);
    const struct CMUnitTest pg_tests[] = BOTH(setup_pg);
    if ((rc = cmocka_run_group_tests_name("producer_ops_postgres", pg_tests, NULL, NULL)))
        return rc;
    pgfx_fresh_db("onceq_test_producer_ops_bare", bare_conninfo, sizeof bare_conninfo);
    const struct CMUnitTest dbh_tests[] = {cmocka_unit_test(test_dbh_open_pg)};
    return cmocka_run_group_tests_name("dbh_postgres", dbh_tests, NULL, NULL);
}
