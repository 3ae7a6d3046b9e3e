/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The consumer's lease clock (oq__consumer_store_now; docs/DESIGN.md "Clocks"): every store
 * connection of one database reads the same clock (the boot's anchor is written once and read
 * by the others); it tracks CLOCK_BOOTTIME, not the wall clock; and a database whose times are
 * ahead of this boot's wall clock (written in an earlier boot, or before a step back) gets an
 * anchor that puts the clock past them, so it never runs backwards.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "consumer_fixture.h"

static void test_shared_and_near_wall(void **state)
{
    fx_t *f = *state;
    int64_t a = oq__consumer_store_now(f->a), b = oq__consumer_store_now(f->b);
    int64_t wall = oq_now_ms();
    assert_true(b - a >= 0 && b - a < 1000); /* one anchor for both connections */
    assert_true(a - wall < 60000 && wall - a < 60000);
    assert_int_equal(q_count(f->a, "SELECT count(*) FROM clock_anchor", NULL), 1);
    /* it moves with CLOCK_BOOTTIME */
    int64_t b0 = oq_boot_ms(), n0 = oq__consumer_store_now(f->a);
    oq_sleep_ms(20, NULL);
    int64_t db = oq_boot_ms() - b0, dn = oq__consumer_store_now(f->a) - n0;
    assert_true(dn - db >= -2 && dn - db <= 2);
}

static void test_never_behind_stored_times(void **state)
{
    fx_t *f = *state;
    oq_error_t err = {0};
    oq_envelope_t e;
    /* an execution written 10 days ahead of this clock (an earlier boot whose clock ran ahead,
     * or the wall clock stepped back since) */
    int64_t ahead = oq__consumer_store_now(f->a) + 10LL * 86400000;
    mk_env(&e, "echo", "{}", 1);
    assert_int_equal(oq__consumer_store_begin(f->a, &err), 0);
    assert_int_equal(oq__exec_plan(f->a, &e, ahead, &err), 0);
    assert_int_equal(oq__consumer_store_commit(f->a, &err), 0);
    oq_envelope_clear(&e);
    /* a new boot: its anchor is not written yet */
    assert_int_equal(
        sqlite3_exec(oq__consumer_store_db(f->a), "DELETE FROM clock_anchor", NULL, NULL, NULL),
        SQLITE_OK);
    oq__consumer_store_t *c = NULL;
    oq_db_opts_t o = {.synchronous = "OFF"};
    assert_int_equal(oq__consumer_store_open(f->path, &o, "worker-c", &c, &err), 0);
    assert_true(oq__consumer_store_now(c) > ahead);
    /* ... and the next connection of this boot reads the same anchor */
    oq__consumer_store_t *d = NULL;
    assert_int_equal(oq__consumer_store_open(f->path, &o, "worker-d", &d, &err), 0);
    int64_t gap = oq__consumer_store_now(d) - oq__consumer_store_now(c);
    assert_true(gap >= 0 && gap < 1000);
    oq__consumer_store_close(c);
    oq__consumer_store_close(d);
}

int main(void)
{
    (void)run_registry_tool; /* (the fixture's, unused here) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_shared_and_near_wall, setup, teardown),
        cmocka_unit_test_setup_teardown(test_never_behind_stored_times, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
