/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Retention by default (issue 14, item 5): `onceq producer` started with no retention flag
 * deletes terminal calls past their key TTL (with their audit and result rows) on its own,
 * soon after start; pending calls stay; `--purge-interval 0` turns it off.
 *
 * The database is prepared through the C API (three calls, two finished by a tool_result, one
 * left pending; key TTL 1 s), then the daemon ($ONCEQ_BIN) runs on it and is stopped by pid.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_producer.h"

static char dir[64], path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/oq_test_retention_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof path, "%s/calls.db", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int64_t num(const char *sql)
{
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    oq_db_opts_t ro = {.readonly = 1};
    assert_int_equal(oq_db_open(path, &ro, &db, &err), 0);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close_v2(db);
    return n;
}

/* Three calls with a 1 s key TTL; "done-1" and "done-2" succeed, "open" stays pending. */
static void prepare(void)
{
    oq_error_t err = {0};
    oq_producer_t *p = NULL;
    oq_producer_opts_t o;
    memset(&o, 0, sizeof o);
    o.key_ttl_ms = 1000;
    assert_int_equal(oq_producer_open(path, &o, &p, &err), 0);
    static const char *const keys[] = {"done-1", "done-2", "open"};
    oq_envelope_t env[2];
    memset(env, 0, sizeof env);
    for (int i = 0; i < 3; i++) {
        json_t *args = json_pack("{s:i}", "amount", i + 1);
        oq_submit_req_t req = {.idem_key = keys[i], .tool = "charge", .args = args};
        oq_call_t c;
        memset(&c, 0, sizeof c);
        assert_int_equal(oq_producer_submit(p, &req, &c, NULL, &err), 0);
        json_decref(args);
        if (i < 2) {
            env[i].v = OQ_ENVELOPE_VERSION;
            env[i].kind = OQ_KIND_TOOL_RESULT;
            oq_id_uuid(env[i].message_id);
            memcpy(env[i].call_id, c.call_id, sizeof env[i].call_id);
            env[i].attempt = 1;
            env[i].created_at = oq_now_ms();
            env[i].status = "succeeded";
        }
        oq_call_clear(&c);
    }
    oq_result_outcome_t oc[2] = {0, 0};
    assert_int_equal(oq_producer_apply_results(p, env, 2, oc, &err), 0);
    assert_int_equal(oc[0], OQ_RESULT_APPLIED);
    assert_int_equal(oc[1], OQ_RESULT_APPLIED);
    oq_producer_close(p);
    assert_int_equal(num("SELECT count(*) FROM calls"), 3);
    assert_int_equal(num("SELECT count(*) FROM result_inbox"), 2);
    usleep(1200 * 1000); /* past the TTL */
}

/* Runs `$ONCEQ_BIN producer --db path --listen 127.0.0.1:0 --key-ttl 1s EXTRA...`. */
static pid_t start_producer(const char *extra)
{
    const char *bin = getenv("ONCEQ_BIN");
    assert_non_null(bin);
    char log[160];
    snprintf(log, sizeof log, "%s/producer.log", dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen(log, "a", stderr);
        (void)f;
        if (extra)
            execl(bin, bin, "producer", "--db", path, "--listen", "127.0.0.1:0", "--key-ttl", "1s",
                  extra, (char *)NULL);
        else
            execl(bin, bin, "producer", "--db", path, "--listen", "127.0.0.1:0", "--key-ttl", "1s",
                  (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void stop(pid_t pid)
{
    kill(pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 100; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) return;
        usleep(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
}

static void test_default_producer_purges(void **state)
{
    (void)state;
    prepare();
    pid_t pid = start_producer(NULL); /* no --purge-interval: the default */
    int gone = 0;
    for (int i = 0; i < 100 && !gone; i++) {
        usleep(100000);
        gone = num("SELECT count(*) FROM calls") == 1;
    }
    stop(pid);
    assert_true(gone);
    assert_int_equal(num("SELECT count(*) FROM calls WHERE idem_key = 'open'"), 1);
    assert_int_equal(num("SELECT count(*) FROM result_inbox"), 0);
    assert_int_equal(num("SELECT count(*) FROM audit WHERE call_id NOT IN "
                         "(SELECT call_id FROM calls)"),
                     0);
}

static void test_purge_interval_zero_keeps_rows(void **state)
{
    (void)state;
    prepare();
    pid_t pid = start_producer("--purge-interval=0");
    usleep(2500 * 1000); /* the default would have purged after about 1 s */
    stop(pid);
    assert_int_equal(num("SELECT count(*) FROM calls"), 3);
}

int main(void)
{
    oq_log_init(OQ_LOG_OFF, OQ_LOG_FMT_LOGFMT, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_default_producer_purges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_purge_interval_zero_keeps_rows, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
