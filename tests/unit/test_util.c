/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/util.c: id formats and uniqueness, UUIDv7 layout and time order, clocks, duration
 * and size parsing, and crash points (inert when unset; in forked children, ONCEQ_CRASH_AT
 * kills with SIGKILL at the named point and on the N-th hit with "name@N").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_log.h"
#include "oq_util.h"

static int is_lower_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(a, b);
}

static void test_call_ids(void **state)
{
    (void)state;
    enum { N = 5000 };
    static char ids[N][OQ_CALL_ID_LEN + 1];
    for (int i = 0; i < N; i++) {
        memset(ids[i], 'x', sizeof(ids[i]));
        oq_id_call(ids[i]);
        assert_int_equal(strlen(ids[i]), OQ_CALL_ID_LEN);
        assert_memory_equal(ids[i], "c_", 2);
        assert_true(is_lower_hex(ids[i] + 2, 16));
    }
    qsort(ids, N, sizeof(ids[0]), cmp_str);
    for (int i = 1; i < N; i++)
        assert_string_not_equal(ids[i - 1], ids[i]);
}

static void test_uuid_v7(void **state)
{
    (void)state;
    enum { N = 5000 };
    static char ids[N][OQ_UUID_LEN + 1];
    int64_t before = oq_now_ms();
    for (int i = 0; i < N; i++) {
        oq_id_uuid(ids[i]);
        const char *u = ids[i];
        assert_int_equal(strlen(u), OQ_UUID_LEN);
        assert_true(u[8] == '-' && u[13] == '-' && u[18] == '-' && u[23] == '-');
        assert_true(is_lower_hex(u, 8) && is_lower_hex(u + 9, 4) && is_lower_hex(u + 14, 4) &&
                    is_lower_hex(u + 19, 4) && is_lower_hex(u + 24, 12));
        assert_int_equal(u[14], '7');           /* version 7 */
        assert_non_null(strchr("89ab", u[19])); /* RFC 4122 variant */
    }
    int64_t after = oq_now_ms();
    /* the first 48 bits are the unix ms timestamp */
    char hex[13];
    memcpy(hex, ids[0], 8);
    memcpy(hex + 8, ids[0] + 9, 4);
    hex[12] = '\0';
    int64_t ts = (int64_t)strtoll(hex, NULL, 16);
    assert_true(ts >= before && ts <= after);
    /* time-ordered at ms granularity: ids from a later ms sort after earlier ones */
    for (int i = 1; i < N; i++)
        assert_true(memcmp(ids[i - 1], ids[i], 13) <= 0);
    qsort(ids, N, sizeof(ids[0]), cmp_str);
    for (int i = 1; i < N; i++)
        assert_string_not_equal(ids[i - 1], ids[i]);
}

static void test_time(void **state)
{
    (void)state;
    char out[32];
    oq_time_format(1700000000123, out);
    assert_string_equal(out, "2023-11-14T22:13:20.123Z");
    oq_time_format(0, out);
    assert_string_equal(out, "1970-01-01T00:00:00.000Z");
    oq_time_format(-1, out);
    assert_string_equal(out, "1969-12-31T23:59:59.999Z");
    int64_t a = oq_mono_us();
    oq_sleep_ms(20, NULL);
    int64_t b = oq_mono_us();
    assert_true(b - a >= 19000);
    assert_true(b - a < 2000000);
    assert_true(oq_now_ms() > 1700000000000);
    /* deadlines on the monotonic clock: normalized, and as far ahead as asked (a second and
     * more, and a part of one that carries into tv_sec) */
    const int64_t ahead[] = {0, 1, 999999, 1000000, 1999999, 2500000};
    for (size_t i = 0; i < sizeof ahead / sizeof ahead[0]; i++) {
        struct timespec ts;
        int64_t t0 = oq_mono_us();
        oq_mono_deadline(&ts, ahead[i]);
        int64_t t1 = oq_mono_us();
        assert_true(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000L);
        int64_t at = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
        assert_true(at >= t0 + ahead[i] && at <= t1 + ahead[i]);
    }
    char hex[9];
    oq_hex((const unsigned char *)"\x00\xff\x12\xab", 4, hex);
    assert_string_equal(hex, "00ff12ab");
}

static void test_parse_duration(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        int64_t ms;
    } ok[] = {{"0", 0},        {"250", 250},    {"250ms", 250},    {"30s", 30000},
              {"1.5s", 1500},  {"5m", 300000},  {"24h", 86400000}, {"1d", 86400000},
              {"2H", 7200000}, {"10 s", 10000}, {".5s", 500}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        int64_t v = -1;
        assert_int_equal(oq_parse_duration_ms(ok[i].in, &v), 0);
        assert_int_equal(v, ok[i].ms);
    }
    static const char *const bad[] = {"",    "s",   "-1s",   "1w",  "abc",   "1.2.3s",
                                      "nan", "inf", "0x10",  "1e3", "5 sec", " 5s",
                                      "+5s", ".s",  "1e400", NULL};
    for (size_t i = 0; bad[i]; i++) {
        int64_t v = 77;
        assert_int_equal(oq_parse_duration_ms(bad[i], &v), OQ_EINVAL);
        assert_int_equal(v, 77);
    }
    int64_t v;
    assert_int_equal(oq_parse_duration_ms(NULL, &v), OQ_EINVAL);
    assert_int_equal(oq_parse_duration_ms("999999999999999999999d", &v), OQ_EINVAL);
}

static void test_parse_size(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        int64_t n;
    } ok[] = {{"0", 0},           {"1048576", 1048576}, {"64k", 65536},
              {"64KiB", 65536},   {"64kb", 64000},      {"1MiB", 1048576},
              {"5MB", 5000000},   {"1m", 1048576},      {"2GiB", 2147483648},
              {"1g", 1073741824}, {"512b", 512},        {"1.5KiB", 1536}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        int64_t v = -1;
        assert_int_equal(oq_parse_size(ok[i].in, &v), 0);
        assert_int_equal(v, ok[i].n);
    }
    static const char *const bad[] = {"", "-1", "1TB", "MiB", "nan", "1 0", "0x1000", NULL};
    for (size_t i = 0; bad[i]; i++) {
        int64_t v = 77;
        assert_int_equal(oq_parse_size(bad[i], &v), OQ_EINVAL);
        assert_int_equal(v, 77);
    }
}

/* Runs \p fn in a child with ONCEQ_CRASH_AT=\p spec; returns the wait status. The child writes
 * how many points it passed to a pipe, so the parent knows where it died. */
static int run_child(const char *spec, int hits, const char *point, int *passed)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        if (spec)
            setenv("ONCEQ_CRASH_AT", spec, 1);
        else
            unsetenv("ONCEQ_CRASH_AT");
        oq__crash_armed = -1; /* re-read the environment, as a fresh process would */
        for (int i = 0; i < hits; i++) {
            OQ_CRASH_POINT("other.point");
            OQ_CRASH_POINT(point);
            unsigned char b = 1;
            if (write(fds[1], &b, 1) != 1) _exit(3);
        }
        _exit(0);
    }
    close(fds[1]);
    int n = 0;
    unsigned char b;
    while (read(fds[0], &b, 1) == 1)
        n++;
    close(fds[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    *passed = n;
    return status;
}

static void test_crash_points(void **state)
{
    (void)state;
    int passed, st;
    /* unset: nothing happens, in this process too */
    OQ_CRASH_POINT("x.y");
    st = run_child(NULL, 5, "x.y", &passed);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(passed, 5);
    /* another point armed: x.y is untouched */
    st = run_child("a.b", 5, "x.y", &passed);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(passed, 5);
    /* armed: first hit kills with SIGKILL */
    st = run_child("x.y", 5, "x.y", &passed);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGKILL);
    assert_int_equal(passed, 0);
    /* @3: survives two hits, dies on the third */
    st = run_child("x.y@3", 5, "x.y", &passed);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGKILL);
    assert_int_equal(passed, 2);
    /* a list; hits of another listed point do not count toward x.y@3 */
    st = run_child("other.point@100,x.y@3", 5, "x.y", &passed);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(passed, 2);
    /* a name that is only a prefix does not match */
    st = run_child("x.y.z,x", 5, "x.y", &passed);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(passed, 5);
}

int main(void)
{
    oq_log_init(OQ_LOG_OFF, OQ_LOG_FMT_LOGFMT, 0);
    unsetenv("ONCEQ_CRASH_AT");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_call_ids),   cmocka_unit_test(test_uuid_v7),
        cmocka_unit_test(test_time),       cmocka_unit_test(test_parse_duration),
        cmocka_unit_test(test_parse_size), cmocka_unit_test(test_crash_points),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
