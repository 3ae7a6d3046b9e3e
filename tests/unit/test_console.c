/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The console's reads: oq_store_list (the calls pages: order, keyset paging, filters, key and
 * id search across and within tenants, time ranges, bad input) and oq_inspect_doc (one call's
 * story, as `onceq inspect --json` prints it). Rows are written with SQL into a calls.db that
 * the producer's migrations created, with known tenants, states and creation times.
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

#include "oq_console.h"
#include "oq_db.h"
#include "oq_producer.h"

#define N 100
#define T0 1790000000000LL

typedef struct fx {
    char dir[64], path[128];
    sqlite3 *db;
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof *f);
    oq_error_t err = {0};
    oq_producer_t *p = NULL;
    snprintf(f->dir, sizeof f->dir, "/tmp/oq-test-console.XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->path, sizeof f->path, "%s/calls.db", f->dir);
    if (oq_producer_open(f->path, NULL, &p, &err) != 0) return -1;
    oq_producer_close(p);
    if (oq_db_open(f->path, NULL, &f->db, &err) != 0) return -1;
    /* call i: tenant t(i%3), key k-i (k-1 also in every tenant), tool tool(i%2), created T0+i s;
     * the last 5 pending, every 10th failed, the rest succeeded */
    char sql[1024];
    snprintf(sql, sizeof sql,
             "WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM i WHERE n < %d) "
             "INSERT INTO calls (call_id, tenant, idem_key, fingerprint, tool, args, state, "
             "attempt, created_at, updated_at, expires_at) SELECT printf('c_%%032x', n), "
             "'t' || (n %% 3), 'k-' || n, 'f', 'tool' || (n %% 2), '{}', CASE WHEN n > %d THEN "
             "'pending' WHEN n %% 10 = 0 THEN 'failed' ELSE 'succeeded' END, 1, %lld + n * 1000, "
             "%lld + n * 1000, %lld FROM i;"
             "INSERT INTO calls (call_id, tenant, idem_key, fingerprint, tool, args, state, "
             "attempt, created_at, updated_at, expires_at) VALUES "
             "('c_ffff0000000000000000000000000002', 't2', 'k-1', 'f', 'tool1', '{}', "
             "'succeeded', 1, 1, 1, %lld)",
             N, N - 5, T0, T0, T0 * 2, T0 * 2);
    if (sqlite3_exec(f->db, sql, NULL, NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "%s\n", sqlite3_errmsg(f->db));
        return -1;
    }
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

static json_t *list(fx_t *f, const oq_call_query_t *q)
{
    oq_error_t err = {0};
    json_t *out = NULL;
    assert_int_equal(oq_store_list(f->db, q, &out, &err), 0);
    return out;
}

static const char *field(json_t *page, size_t i, const char *k)
{
    return json_string_value(json_object_get(json_array_get(json_object_get(page, "calls"), i), k));
}

static size_t ncalls(json_t *page)
{
    return json_array_size(json_object_get(page, "calls"));
}

static void test_pages_newest_first(void **state)
{
    fx_t *f = *state;
    oq_call_query_t q = {.limit = 7};
    size_t seen = 0;
    char prev[64] = "c_~";
    for (int pages = 0; pages < 50; pages++) {
        json_t *p = list(f, &q);
        for (size_t i = 0; i < ncalls(p); i++) {
            /* call ids were inserted in increasing order, the extra one last */
            const char *id = field(p, i, "call_id");
            assert_true(strcmp(id, prev) < 0);
            snprintf(prev, sizeof prev, "%s", id);
            seen++;
        }
        json_t *next = json_object_get(p, "next");
        if (json_is_null(next)) {
            json_decref(p);
            break;
        }
        q.before = json_integer_value(next);
        json_decref(p);
    }
    assert_int_equal(seen, N + 1); /* every call once */
}

static void test_filters(void **state)
{
    fx_t *f = *state;
    oq_call_query_t q = {.limit = 500, .state = "failed"};
    json_t *p = list(f, &q);
    assert_int_equal(ncalls(p), 9); /* 10, 20 .. 90: 100 is pending */
    assert_string_equal(field(p, 0, "status"), "failed");
    json_decref(p);
    q.state = "pending";
    p = list(f, &q);
    assert_int_equal(ncalls(p), 5);
    json_decref(p);
    q = (oq_call_query_t){.limit = 500, .tenant = "t1", .tool = "tool1"};
    p = list(f, &q);
    for (size_t i = 0; i < ncalls(p); i++) {
        assert_string_equal(field(p, i, "tenant"), "t1");
        assert_string_equal(field(p, i, "tool"), "tool1");
    }
    assert_int_equal(ncalls(p), 17); /* n odd and n % 3 == 1, n <= 100 */
    json_decref(p);
    /* a time range: calls 10..20 */
    q = (oq_call_query_t){.limit = 500, .since_ms = T0 + 10000, .until_ms = T0 + 20000};
    p = list(f, &q);
    assert_int_equal(ncalls(p), 11);
    assert_string_equal(field(p, 0, "idem_key"), "k-20");
    assert_string_equal(field(p, 10, "idem_key"), "k-10");
    json_decref(p);
}

static void test_search(void **state)
{
    fx_t *f = *state;
    oq_call_query_t q = {.limit = 50, .idem_key = "k-1"}; /* in t1 and t2 */
    json_t *p = list(f, &q);
    assert_int_equal(ncalls(p), 2);
    json_decref(p);
    q.tenant = "t2";
    p = list(f, &q);
    assert_int_equal(ncalls(p), 1);
    assert_string_equal(field(p, 0, "call_id"), "c_ffff0000000000000000000000000002");
    json_decref(p);
    q = (oq_call_query_t){.limit = 50, .call_id = "c_00000000000000000000000000000004"};
    p = list(f, &q);
    assert_int_equal(ncalls(p), 1);
    json_decref(p);
    q.tenant = "t0"; /* call 4 is t1's: another tenant finds nothing */
    p = list(f, &q);
    assert_int_equal(ncalls(p), 0);
    json_decref(p);
}

static void test_bad_input(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    json_t *out = NULL;
    oq_call_query_t q = {.limit = 0};
    assert_int_equal(oq_store_list(f->db, &q, &out, &err), OQ_EINVAL);
    q.limit = 501;
    assert_int_equal(oq_store_list(f->db, &q, &out, &err), OQ_EINVAL);
    assert_null(out);
}

static void test_inspect_doc(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    json_t *doc = NULL;
    assert_int_equal(oq_inspect_doc(f->db, NULL, "c_0000000000000000000000000000ffff", &doc, &err),
                     OQ_ENOTFOUND);
    assert_int_equal(oq_inspect_doc(f->db, NULL, "c_00000000000000000000000000000004", &doc, &err),
                     0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(doc, "call"), "idem_key")), "k-4");
    assert_true(json_is_null(json_object_get(doc, "consumer")));
    json_t *t0 = json_array_get(json_object_get(doc, "timeline"), 0);
    assert_string_equal(json_string_value(json_object_get(t0, "event")), "submitted");
    assert_string_equal(json_string_value(json_object_get(t0, "from")), "producer");
    json_decref(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pages_newest_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_filters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_search, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inspect_doc, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
