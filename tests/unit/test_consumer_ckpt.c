/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A consumer worker's connections to effects.db never checkpoint in their commits: the worker
 * runs a background checkpointer (common/oq_ckpt.h) and attaches the batch transaction's, the
 * heartbeat's and the runners' connections to it. Before, SQLite's auto-checkpoint copied the
 * WAL and fsynced effects.db inside the commit that took the WAL past 1000 frames (a lone
 * call's result waited for it). The worker is built on a broker that does not answer (nothing
 * here talks to Kafka); sync_shim.h counts the database-file syncs of the test's thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "sync_shim.h"
#include "worker_int.h"

static void commit_many(oq__consumer_store_t *s, int n)
{
    sqlite3 *db = oq__consumer_store_db(s);
    assert_non_null(db);
    for (int i = 0; i < n; i++) {
        assert_int_equal(oq__consumer_store_begin(s, NULL), 0);
        assert_int_equal(sqlite3_exec(db,
                                      "INSERT INTO audit(ts, call_id, event, detail) VALUES "
                                      "(1, hex(randomblob(16)), 'test', hex(randomblob(300))),"
                                      "(1, hex(randomblob(16)), 'test', hex(randomblob(300)))",
                                      NULL, NULL, NULL),
                         SQLITE_OK);
        assert_int_equal(oq__consumer_store_commit(s, NULL), 0);
    }
}

static void test_worker_commits_never_checkpoint(void **state)
{
    (void)state;
    shim_install();
    char dir[] = "/tmp/oq-test-consumer-ckpt.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/effects.db", dir);
    oq_consumer_opts_t o;
    memset(&o, 0, sizeof o);
    o.db_path = path;
    o.brokers = "127.0.0.1:1"; /* nothing listens: the worker never polls here */
    o.synchronous = "normal";  /* commits sync nothing, checkpoints sync effects.db */
    o.runners = 1;
    o.no_relay = 1;
    oq_consumer_t *c = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_consumer_new(&o, &c, &err), 0);
    assert_non_null(c->ckpt);
    t_watch = 1;
    t_syncs = 0;
    /* well past SQLite's 1000-frame auto-checkpoint, on each kind of connection */
    commit_many(c->store, 700);
    commit_many(c->hb_store, 300);
    commit_many(c->runners[0].store, 300);
    int syncs = t_syncs;
    t_watch = 0;
    if (syncs != 0) fail_msg("%d syncs of effects.db inside the worker's commits", syncs);
    oq_ckpt_stats_t st;
    oq_ckpt_stats(c->ckpt, &st);
    assert_true(st.commits >= 1300);
    /* the background thread copies it: a pass ran (bounded wait: 10 s) */
    for (int i = 0; i < 200 && st.passes == 0; i++) {
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
        oq_ckpt_stats(c->ckpt, &st);
    }
    assert_true(st.passes > 0);
    oq_consumer_destroy(c);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_commits_never_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
