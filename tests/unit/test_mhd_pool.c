/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The libmicrohttpd pool sizing of common/mhd.c (issue 23, the 10 s stall of onceq-bench e2e):
 * a pool thread must never hold 126 connections, because with its listening socket and its
 * wake-up descriptor it could then fill libmicrohttpd's batch of 128 epoll events, after which
 * libmicrohttpd waits up to the idle timeout before serving them (common/oq_mhd.h).
 *  - the connection limit given to libmicrohttpd, which it splits evenly between the threads
 *    (the first threads take one more each for the remainder), leaves every thread at most
 *    125, for the producer's guard and the listeners' (before the fix: 2,018 per thread for
 *    the producer's 1,000 + 8 on two threads);
 *  - the pool holds the guard's connections with that share: enough threads (9 for the
 *    producer's defaults), never fewer than asked, at most OQ_MHD_MAX_THREADS.
 * The stall itself, on a running producer: integration.test_http_burst.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "oq_mhd.h"

static oq_mhd_guard_t *guard(unsigned max_conns, unsigned probe_slots)
{
    oq_mhd_guard_opts_t o;
    memset(&o, 0, sizeof o);
    o.component = "test";
    o.max_conns = max_conns;
    o.probe_slots = probe_slots;
    oq_error_t err = {0};
    oq_mhd_guard_t *g = oq_mhd_guard_new(&o, NULL, &err);
    assert_non_null(g);
    return g;
}

static void test_limit_per_thread(void **state)
{
    (void)state;
    /* the producer's defaults, the relays' and consumers' listeners, a small and a big one */
    const unsigned cases[][2] = {
        {1000, 8}, {OQ_MHD_ADMIN_CONNS, OQ_MHD_ADMIN_PROBE_SLOTS}, {10, 0}, {5000, 100}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        oq_mhd_guard_t *g = guard(cases[i][0], cases[i][1]);
        for (unsigned t = 1; t <= OQ_MHD_MAX_THREADS; t++) {
            unsigned limit = oq_mhd_guard_mhd_limit(g, t);
            unsigned per_thread = (limit + t - 1) / t;
            if (per_thread > 125)
                fail_msg("guard %u+%u, %u threads: limit %u, %u connections on one thread",
                         cases[i][0], cases[i][1], t, limit, per_thread);
        }
        oq_mhd_guard_destroy(g);
    }
    /* the listeners (one thread) still let in every slot of their guard */
    oq_mhd_guard_t *g = guard(OQ_MHD_ADMIN_CONNS, OQ_MHD_ADMIN_PROBE_SLOTS);
    assert_true(oq_mhd_guard_mhd_limit(g, 1) >= OQ_MHD_ADMIN_CONNS + OQ_MHD_ADMIN_PROBE_SLOTS + 1);
    oq_mhd_guard_destroy(g);
}

static void test_pool_threads(void **state)
{
    (void)state;
    assert_int_equal(oq_mhd_pool_threads(1000 + 8, 2), 9); /* the producer's defaults */
    assert_int_equal(oq_mhd_pool_threads(72, 2), 2);
    assert_int_equal(oq_mhd_pool_threads(72, 5), 5);
    assert_int_equal(oq_mhd_pool_threads(1000000, 2), OQ_MHD_MAX_THREADS);
    for (unsigned conns = 1; conns <= 20000; conns += 7) {
        for (unsigned min = 1; min <= 4; min++) {
            unsigned t = oq_mhd_pool_threads(conns, min);
            assert_true(t >= min && t <= OQ_MHD_MAX_THREADS);
            if (t < OQ_MHD_MAX_THREADS) assert_true(oq_mhd_pool_room(t) >= conns);
            if (t > min) assert_true(oq_mhd_pool_room(t - 1) < conns); /* no thread too many */
            /* the room leaves the guard's overshoot (one per thread) and 16 closing */
            assert_true(oq_mhd_pool_room(t) + t + 16 <= t * OQ_MHD_CONNS_PER_THREAD);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limit_per_thread),
        cmocka_unit_test(test_pool_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
