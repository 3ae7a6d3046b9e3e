/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The relay library in-process, against a broker address that refuses connections
 * (127.0.0.1:1), so no Kafka is needed: option and -X validation, a database without the
 * tables, one holder and one standby on one database, nothing marked while nothing is
 * delivered, no CPU spin while the broker is unreachable, stop() within its timeout with the
 * lease released and the standby taking over at once, metrics registration rules. One test
 * runs against librdkafka's in-process mock cluster: a tiny in-flight window (the watermark's
 * ring full behind unreported rows) still publishes every row once and stores the watermark;
 * and with opts.watch_wal an idle relay wakes on another connection's commit, not its next poll;
 * an idle relay sends at once instead of lingering.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "oq_config.h"
#include "oq_db.h"
#include "oq_log.h"
#include "oq_metrics.h"
#include "oq_relay.h"
#include "oq_util.h"
#include "sync_shim.h"

#define DEAD_BROKER "127.0.0.1:1"

static char dir[64], path[128];
static sqlite3 *db;

static int setup(void **state)
{
    (void)state;
    oq_error_t err = {0};
    snprintf(dir, sizeof(dir), "/tmp/oq_test_relay_lib_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof(path), "%s/calls.db", dir);
    if (oq_db_open(path, NULL, &db, &err) != 0) return -1;
    if (oq_db_migrate(db, oq_migrations_producer, &err) != 0) return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char p[200];
    sqlite3_close_v2(db);
    const char *sfx[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s%s", path, sfx[i]);
        unlink(p);
    }
    rmdir(dir);
    return 0;
}

static void append_rows(int n)
{
    oq_error_t err = {0};
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    for (int i = 0; i < n; i++) {
        char mid[OQ_UUID_LEN + 1], key[16];
        oq_id_uuid(mid);
        snprintf(key, sizeof(key), "k%d", i % 7);
        oq_outbox_row_t row = {.message_id = mid,
                               .topic = "onceq.tool-calls",
                               .key = key,
                               .payload = "{}",
                               .payload_len = 2,
                               .created_at = oq_now_ms()};
        assert_int_equal(oq_outbox_append(db, NULL, &row, &err), 0);
    }
    assert_int_equal(oq_db_commit(db, &err), 0);
}

static int64_t scalar(const char *sql)
{
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static oq_relay_opts_t opts(const char *owner)
{
    oq_relay_opts_t o;
    oq_relay_opts_init(&o);
    o.db_path = path;
    o.brokers = DEAD_BROKER;
    o.owner = owner;
    o.lease_ms = 1000;
    o.stop_timeout_ms = 300;
    return o;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static oq_relay_lease_state_t state_of(oq_relay_t *r)
{
    oq_relay_stats_t s;
    oq_relay_stats(r, &s);
    return s.lease_state;
}

/* Waits up to \p ms for relay \p r to reach lease state \p want. */
static int wait_state(oq_relay_t *r, oq_relay_lease_state_t want, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        if (state_of(r) == want) return 1;
        oq_sleep_ms(10, NULL);
    }
    return state_of(r) == want;
}

static void test_bad_options(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq_relay_opts_t o = opts("x");
    o.db_path = NULL;
    assert_null(oq_relay_new(&o, &err));
    assert_int_equal(err.code, OQ_EINVAL);

    o = opts("x");
    o.lease_ms = 10;
    assert_null(oq_relay_new(&o, &err));
    assert_int_equal(err.code, OQ_EINVAL);

    o = opts("x");
    o.gather_ms = -2; /* -1 is "by backend", below that is an error */
    assert_null(oq_relay_new(&o, &err));
    assert_int_equal(err.code, OQ_EINVAL);

    /* An unknown -X property fails at new(), not later in the thread. */
    oq_config_t *cfg = oq_config_new(NULL, 0);
    assert_non_null(cfg);
    assert_int_equal(oq_config_set_kafka(cfg, "no.such.property", "1", &err), 0);
    o = opts("x");
    o.kafka_cfg = cfg;
    oq_error_clear(&err);
    assert_null(oq_relay_new(&o, &err));
    assert_int_equal(err.code, OQ_EINVAL);
    assert_non_null(strstr(err.msg, "no.such.property"));
    oq_config_destroy(cfg);

    /* A database without the outbox tables. */
    char p[160];
    snprintf(p, sizeof(p), "%s/empty.db", dir);
    o = opts("x");
    o.db_path = p;
    oq_error_clear(&err);
    assert_null(oq_relay_new(&o, &err));
    assert_int_equal(err.code, OQ_EDB);
    const char *sfx[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s/empty.db%s", dir, sfx[i]);
        unlink(p);
    }

    /* NULL-tolerant calls */
    oq_relay_destroy(NULL);
    oq_relay_notify(NULL);
    assert_int_equal(oq_relay_stop(NULL), 0);
}

static void test_holder_standby_unreachable_broker(void **state)
{
    (void)state;
    oq_error_t err = {0};
    append_rows(500);
    oq_relay_opts_t oa = opts("A"), ob = opts("B");
    oq_relay_t *a = oq_relay_new(&oa, &err);
    assert_non_null(a);
    assert_string_equal(oq_relay_owner(a), "A");
    assert_int_equal(oq_relay_start(a, &err), 0);
    assert_int_equal(oq_relay_start(a, &err), OQ_ESTATE);
    assert_true(wait_state(a, OQ_RELAY_HOLDER, 2000));
    oq_relay_t *b = oq_relay_new(&ob, &err);
    assert_non_null(b);
    assert_int_equal(oq_relay_start(b, &err), 0);

    /* The holder produces (into librdkafka's queue) but, with nothing delivered, marks nothing;
     * the standby stays standby; the process does not spin. */
    for (int i = 0; i < 200; i++) {
        oq_relay_stats_t s;
        oq_relay_stats(a, &s);
        if (s.produced >= 500) break;
        oq_sleep_ms(10, NULL);
    }
    double c0 = cpu_s();
    int64_t w0 = oq_mono_us();
    oq_sleep_ms(1000, NULL);
    double cpu = (cpu_s() - c0) / ((double)(oq_mono_us() - w0) / 1e6);
    oq_relay_stats_t sa, sb;
    oq_relay_stats(a, &sa);
    oq_relay_stats(b, &sb);
    assert_int_equal(sa.produced, 500);
    assert_int_equal(sa.inflight, 500);
    assert_int_equal(sa.published, 0);
    assert_int_equal(sa.fence, 1);
    assert_int_equal(sa.pending, 500);
    assert_int_equal(sb.lease_state, OQ_RELAY_STANDBY);
    assert_int_equal(sb.produced, 0);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_unpublished"), 500);
    assert_true(cpu < 0.25); /* two idle relays + librdkafka retrying a refused connection */

    /* stop(): gives up on the in-flight messages after stop_timeout_ms, marks nothing,
     * releases the lease, and the standby takes over at once with fence 2. */
    int64_t t0 = oq_mono_us();
    assert_int_equal(oq_relay_stop(a), 0);
    int64_t stop_ms = (oq_mono_us() - t0) / 1000;
    assert_true(stop_ms < 3000);
    assert_int_equal(state_of(a), OQ_RELAY_STOPPED);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_unpublished"), 500);
    assert_true(wait_state(b, OQ_RELAY_HOLDER, 500)); /* well under the 1000 ms lease */
    oq_relay_stats(b, &sb);
    assert_int_equal(sb.fence, 2);
    assert_int_equal(scalar("SELECT owner = 'B' AND fence = 2 FROM relay_lease"), 1);
    oq_relay_destroy(a);
    oq_relay_destroy(b);
    assert_int_equal(scalar("SELECT expires_at FROM relay_lease"), 0); /* released */
}

static void test_metrics_registration(void **state)
{
    (void)state;
    oq_error_t err = {0};
    oq_metrics_t *m = oq_metrics_new();
    oq_relay_opts_t o = opts("M1");
    o.metrics = m;
    oq_relay_t *r1 = oq_relay_new(&o, &err);
    assert_non_null(r1);
    o.owner = "M2";
    oq_relay_t *r2 = oq_relay_new(&o, &err); /* same labels: shares r1's metrics */
    assert_non_null(r2);
    oq_relay_destroy(r2);
    o.metrics_labels = "relay=\"results\"";
    o.owner = "M3";
    oq_relay_t *r3 = oq_relay_new(&o, &err);
    assert_non_null(r3);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(oq_metrics_render(m, &text, &len), 0);
    assert_non_null(strstr(text, "onceq_relay_pending_rows"));
    assert_non_null(strstr(text, "onceq_relay_published_total"));
    assert_non_null(strstr(text, "onceq_relay_lease_holder"));
    assert_non_null(strstr(text, "relay=\"results\""));
    free(text);
    oq_relay_destroy(r1);
    oq_relay_destroy(r3);
    oq_metrics_destroy(m);
}

/* librdkafka's in-process mock cluster (3 brokers) with onceq.tool-calls; *mrk is the handle
 * that owns it (destroy the cluster first, then the handle). */
static rd_kafka_mock_cluster_t *mock_up(rd_kafka_t **mrk, int partitions, int replicas)
{
    char errstr[256];
    rd_kafka_conf_t *mc = rd_kafka_conf_new();
    rd_kafka_conf_set(mc, "log_level", "0", errstr, sizeof errstr);
    *mrk = rd_kafka_new(RD_KAFKA_PRODUCER, mc, errstr, sizeof errstr);
    assert_non_null(*mrk);
    rd_kafka_mock_cluster_t *mcl = rd_kafka_mock_cluster_new(*mrk, 3);
    assert_non_null(mcl);
    assert_int_equal(rd_kafka_mock_topic_create(mcl, "onceq.tool-calls", partitions, replicas), 0);
    return mcl;
}

static void test_watermark_small_window_mock(void **state)
{
    (void)state;
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk, 6, 3);
    append_rows(300);
    oq_relay_opts_t o = opts("W");
    o.brokers = rd_kafka_mock_cluster_bootstraps(mcl);
    o.max_inflight = 5; /* ring and slots: at most 5 rows without a delivery report */
    o.batch_rows = 3;
    oq_relay_t *r = oq_relay_new(&o, &err);
    assert_non_null(r);
    assert_int_equal(oq_relay_start(r, &err), 0);
    int64_t deadline = oq_mono_us() + 30 * 1000000LL;
    while (oq_mono_us() < deadline &&
           scalar("SELECT COALESCE((SELECT published_seq FROM relay_lease), 0)") < 300)
        oq_sleep_ms(20, NULL);
    assert_int_equal(scalar("SELECT published_seq FROM relay_lease"), 300);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_unpublished"), 0);
    assert_int_equal(oq_relay_stop(r), 0);
    oq_relay_stats_t s;
    oq_relay_stats(r, &s);
    assert_int_equal(s.produced, 300); /* no failure: no row sent twice */
    assert_int_equal(s.published, 300);
    assert_int_equal(s.delivery_errors, 0);
    oq_relay_destroy(r);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

/* Appends one row whose key the relay's (default, consistent) partitioner sends to
 * partition \p want of \p nparts. */
static void append_row_to_partition(rd_kafka_topic_t *rkt, int want, int nparts)
{
    char key[32];
    for (int i = 0;; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        if (rd_kafka_msg_partitioner_consistent_random(rkt, key, strlen(key), nparts, NULL, NULL) ==
            want)
            break;
    }
    char mid[OQ_UUID_LEN + 1];
    oq_id_uuid(mid);
    oq_error_t err = {0};
    oq_outbox_row_t row = {.message_id = mid,
                           .topic = "onceq.tool-calls",
                           .key = key,
                           .payload = "{}",
                           .payload_len = 2,
                           .created_at = oq_now_ms()};
    assert_int_equal(oq_outbox_append(db, NULL, &row, &err), 0);
}

/* The watermark never passes a row without a delivery report: row 1 goes to a partition whose
 * leader answers 2 s late, rows 2..40 to fast partitions and are delivered first. */
static void test_watermark_waits_for_slow_row(void **state)
{
    (void)state;
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk, 4, 1);
    assert_int_equal(rd_kafka_mock_partition_set_leader(mcl, "onceq.tool-calls", 0, 3), 0);
    for (int p = 1; p < 4; p++)
        assert_int_equal(rd_kafka_mock_partition_set_leader(mcl, "onceq.tool-calls", p, 1), 0);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(mrk, "onceq.tool-calls", NULL);
    assert_non_null(rkt);
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    append_row_to_partition(rkt, 0, 4); /* seq 1: the slow one */
    for (int i = 0; i < 39; i++)
        append_row_to_partition(rkt, 1 + i % 3, 4);
    assert_int_equal(oq_db_commit(db, &err), 0);

    assert_int_equal(rd_kafka_mock_broker_set_rtt(mcl, 3, 2000), 0);
    oq_relay_opts_t o = opts("S");
    o.brokers = rd_kafka_mock_cluster_bootstraps(mcl);
    o.lease_ms = 5000;
    oq_relay_t *r = oq_relay_new(&o, &err);
    assert_non_null(r);
    assert_int_equal(oq_relay_start(r, &err), 0);
    /* the 39 fast rows get their reports while row 1 waits for the slow leader */
    int64_t deadline = oq_mono_us() + 30 * 1000000LL;
    int fast_done = 0, checked = 0;
    while (oq_mono_us() < deadline) {
        oq_relay_stats_t s;
        oq_relay_stats(r, &s);
        int64_t wm = scalar("SELECT COALESCE((SELECT published_seq FROM relay_lease), 0)");
        if (s.produced == 40 && s.inflight == 1) {
            fast_done = 1;
            oq_sleep_ms(50, NULL); /* give a wrong watermark time to be stored */
            oq_relay_stats(r, &s);
            wm = scalar("SELECT published_seq FROM relay_lease");
            if (s.inflight == 1) {
                assert_int_equal(wm, 0); /* not past the undelivered row 1 */
                checked = 1;
            }
        }
        if (wm == 40) break;
        oq_sleep_ms(5, NULL);
    }
    assert_true(fast_done);
    assert_true(checked);
    assert_int_equal(scalar("SELECT published_seq FROM relay_lease"), 40);
    assert_int_equal(oq_relay_stop(r), 0);
    oq_relay_destroy(r);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

/* A relay holding its lease on the mock \p mcl, watching the WAL, its poll backing off to
 * \p poll_max_ms. */
static oq_relay_t *watching_relay(rd_kafka_mock_cluster_t *mcl, const char *owner, int poll_max_ms)
{
    oq_error_t err = {0};
    oq_relay_opts_t o = opts(owner);
    o.brokers = rd_kafka_mock_cluster_bootstraps(mcl);
    o.lease_ms = 30000;
    o.poll_max_ms = poll_max_ms;
    o.watch_wal = 1;
    oq_relay_t *r = oq_relay_new(&o, &err);
    assert_non_null(r);
    assert_int_equal(oq_relay_start(r, &err), 0);
    assert_true(wait_state(r, OQ_RELAY_HOLDER, 10000));
    return r;
}

/* Waits (up to 5 s) until \p r has produced one row more than \p before; @returns the ms from
 * \p t0_us. */
static int64_t produced_ms(oq_relay_t *r, uint64_t before, int64_t t0_us)
{
    oq_relay_stats_t s;
    do {
        oq_sleep_ms(2, NULL);
        oq_relay_stats(r, &s);
    } while (s.produced == before && oq_mono_us() - t0_us < 5000000);
    assert_int_equal(s.produced, before + 1);
    return (oq_mono_us() - t0_us) / 1000;
}

/* opts.watch_wal: an idle relay whose poll has backed off to 1 s wakes when another connection
 * commits a row (a write to the WAL), instead of at its next poll. Rows committed at random
 * moments of a 1 s poll would wait 500 ms on average after their commit (30 % of them under
 * 300 ms); with the watch all but a stalled one are produced well under 300 ms after it (the
 * time is taken from the commit's return, so a slow fsync on a loaded machine does not count). */
static void test_wal_watch_wakes_idle_relay(void **state)
{
    (void)state;
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk, 3, 1);
    oq_relay_t *r = watching_relay(mcl, "W", 1000);
    oq_relay_stats_t s;
    int fast = 0, rounds = 8;
    for (int i = 0; i < rounds; i++) {
        oq_sleep_ms(1100 + rand() % 500, NULL); /* idle: the poll backs off to 1 s */
        oq_relay_stats(r, &s);
        uint64_t before = s.produced;
        append_rows(1);
        int64_t ms = produced_ms(r, before, oq_mono_us());
        if (ms < 300) fast++;
        print_message("row %d produced %" PRId64 " ms after its commit\n", i, ms);
    }
    assert_true(fast >= rounds - 1);
    assert_int_equal(oq_relay_stop(r), 0);
    oq_relay_destroy(r);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

/* opts.watch_wal, a commit whose fsync is running (here 40 ms, through sync_shim.h) when the
 * relay drains its write: on the way into its idle wait, after another table's commit woke it
 * and it read nothing, or together with that commit's write inside the wait. No later event
 * announces it (it becomes visible in the -shm). That row must not wait for the relay's
 * backed-off poll (2 s here): it is produced soon after its commit is visible. Without the
 * fix (wal_drain remembering the write) rounds take about 2 s. */
static void test_wal_watch_commit_in_fsync_at_idle(void **state)
{
    (void)state;
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk, 3, 1);
    shim_install(); /* the default VFS from here on: `slow` and the relay's connections */
    sqlite3 *slow = NULL;
    assert_int_equal(sqlite3_open_v2(path, &slow, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(slow, "PRAGMA synchronous=FULL", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE side(x)", NULL, NULL, NULL), SQLITE_OK);
    oq_relay_t *r = watching_relay(mcl, "I", 2000);
    oq_relay_stats_t s;
    int rounds = 6, slow_rounds = 0;
    for (int i = 0; i < rounds; i++) {
        oq_sleep_ms(2200 + rand() % 300, NULL); /* idle: in its first 2 s wait */
        oq_relay_stats(r, &s);
        uint64_t before = s.produced;
        assert_int_equal(sqlite3_exec(db, "INSERT INTO side VALUES(1)", NULL, NULL, NULL),
                         SQLITE_OK);
        char mid[OQ_UUID_LEN + 1];
        oq_id_uuid(mid);
        oq_outbox_row_t row = {.message_id = mid,
                               .topic = "onceq.tool-calls",
                               .key = "k",
                               .payload = "{}",
                               .payload_len = 2,
                               .created_at = oq_now_ms()};
        assert_int_equal(oq_db_begin_immediate(slow, 1000, &err), 0);
        assert_int_equal(oq_outbox_append(slow, NULL, &row, &err), 0);
        t_sync_delay_ms = 40;
        assert_int_equal(oq_db_commit(slow, &err), 0);
        t_sync_delay_ms = 0;
        int64_t ms = produced_ms(r, before, oq_mono_us());
        if (ms >= 700) slow_rounds++; /* 40-130 ms fixed, under load too; ~2 s without */
        print_message("round %d: produced %" PRId64 " ms after its commit returned\n", i, ms);
    }
    assert_int_equal(slow_rounds, 0);
    assert_int_equal(oq_relay_stop(r), 0);
    oq_relay_destroy(r);
    sqlite3_close_v2(slow);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

/* An idle relay sends the first rows after its idle wait at once instead of lingering: with
 * -X linger.ms=4000, a lone row committed to an idle relay is delivered (and its watermark
 * stored) in well under the 4 s a lingering producer would hold it; rows committed while
 * others are in flight keep the linger (the burst below is still published exactly once). */
static void test_idle_relay_sends_without_linger(void **state)
{
    (void)state;
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk, 3, 1);
    oq_config_t *cfg = oq_config_new(NULL, 0);
    assert_non_null(cfg);
    assert_int_equal(oq_config_set_kafka(cfg, "linger.ms", "4000", &err), 0);
    oq_relay_opts_t o = opts("L");
    o.brokers = rd_kafka_mock_cluster_bootstraps(mcl);
    o.kafka_cfg = cfg;
    o.lease_ms = 30000;
    o.stop_timeout_ms = 10000;
    oq_relay_t *r = oq_relay_new(&o, &err);
    assert_non_null(r);
    assert_int_equal(oq_relay_start(r, &err), 0);
    assert_true(wait_state(r, OQ_RELAY_HOLDER, 10000));
    oq_relay_stats_t s;
    for (int i = 0; i < 3; i++) {
        oq_sleep_ms(200, NULL); /* idle */
        oq_relay_stats(r, &s);
        uint64_t before = s.published;
        append_rows(1);
        int64_t t0 = oq_mono_us();
        do {
            oq_sleep_ms(5, NULL);
            oq_relay_stats(r, &s);
        } while (s.published == before && oq_mono_us() - t0 < 10000000);
        int64_t ms = (oq_mono_us() - t0) / 1000;
        print_message("row %d published %" PRId64 " ms after its commit\n", i, ms);
        assert_int_equal(s.published, before + 1);
        assert_true(ms < 2000); /* a lingering producer holds it 4000 ms */
    }
    assert_true(s.idle_sends >= 3);
    append_rows(200); /* a burst, then the relay is idle again: everything once */
    int64_t deadline = oq_mono_us() + 30 * 1000000LL;
    while (oq_mono_us() < deadline &&
           scalar("SELECT COALESCE((SELECT published_seq FROM relay_lease), 0)") < 203)
        oq_sleep_ms(20, NULL);
    assert_int_equal(scalar("SELECT published_seq FROM relay_lease"), 203);
    assert_int_equal(oq_relay_stop(r), 0);
    oq_relay_stats(r, &s);
    assert_int_equal(s.produced, 203);
    assert_int_equal(s.published, 203);
    assert_int_equal(s.delivery_errors, 0);
    oq_relay_destroy(r);
    oq_config_destroy(cfg);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

/* Every one of the n rows published and produced once, no delivery error; then stops and frees
 * the relay and the mock cluster. */
static void published_once_then_down(oq_relay_t *r, rd_kafka_mock_cluster_t *mcl, rd_kafka_t *mrk,
                                     int64_t n)
{
    oq_relay_stats_t s;
    int64_t deadline = oq_mono_us() + 30 * 1000000LL;
    while (oq_mono_us() < deadline &&
           scalar("SELECT COALESCE((SELECT published_seq FROM relay_lease), 0)") < n)
        oq_sleep_ms(20, NULL);
    assert_int_equal(scalar("SELECT published_seq FROM relay_lease"), n);
    assert_int_equal(oq_relay_stop(r), 0);
    oq_relay_stats(r, &s);
    assert_int_equal(s.produced, n);
    assert_int_equal(s.delivery_errors, 0);
    oq_relay_destroy(r);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

/* Partial batches: rows committed one by one while a batch that did not fill is in flight are
 * not read as batches of their own when that batch had at least partial_min_rows rows; they
 * wait for its delivery reports (or partial_wait_ms) and go out together, each exactly once.
 * With a 2 s round trip and partial_wait_ms at 10 s, the relay that read each commit at once
 * (before) had produced all 7 rows within ~200 ms. After a smaller read (a light load) they
 * are read at once, so a lone call never waits for a report (min_rows 16, the default: the
 * relay that waited after every read held them the 2 s). */
static void partial_batch(int min_rows, int held)
{
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk, 3, 1);
    oq_relay_opts_t o = opts("P");
    o.brokers = rd_kafka_mock_cluster_bootstraps(mcl);
    o.lease_ms = 30000;
    o.stop_timeout_ms = 10000;
    o.partial_wait_ms = 10000;
    o.partial_min_rows = min_rows;
    oq_relay_t *r = oq_relay_new(&o, &err);
    assert_non_null(r);
    assert_int_equal(oq_relay_start(r, &err), 0);
    assert_true(wait_state(r, OQ_RELAY_HOLDER, 10000));
    oq_relay_stats_t s;
    append_rows(1); /* warm: producer id and metadata before the round trips grow */
    int64_t deadline = oq_mono_us() + 20 * 1000000LL;
    do {
        oq_sleep_ms(10, NULL);
        oq_relay_stats(r, &s);
    } while (s.published < 1 && oq_mono_us() < deadline);
    assert_int_equal(s.published, 1);
    for (int b = 1; b <= 3; b++)
        assert_int_equal(rd_kafka_mock_broker_set_rtt(mcl, b, 2000), 0);
    append_rows(1); /* a batch of one, in flight for ~2 s */
    deadline = oq_mono_us() + 5 * 1000000LL;
    do {
        oq_sleep_ms(2, NULL);
        oq_relay_stats(r, &s);
    } while (s.produced < 2 && oq_mono_us() < deadline);
    assert_int_equal(s.produced, 2);
    for (int i = 0; i < 5; i++) { /* five commits of one row while it is in flight */
        oq_sleep_ms(30, NULL);
        append_rows(1);
    }
    oq_sleep_ms(100, NULL);
    oq_relay_stats(r, &s);
    print_message("produced %" PRIu64 " inflight %d before the reports\n", s.produced, s.inflight);
    if (held)
        assert_int_equal(s.produced, 2); /* held until the batch in flight is reported */
    else
        assert_int_equal(s.produced, 7); /* read at once, the batch of one still in flight */
    published_once_then_down(r, mcl, mrk, 7);
}

static void test_partial_batch_waits_for_reports(void **state)
{
    (void)state;
    partial_batch(1, 1);
}

static void test_small_batch_does_not_wait(void **state)
{
    (void)state;
    oq_relay_opts_t d;
    oq_relay_opts_init(&d);
    assert_true(d.partial_min_rows > 1);
    partial_batch(d.partial_min_rows, 0);
}

/* Gather: while rows arrive at gather_min_rate or more, reads are spaced gather_ms apart; below
 * that rate the relay reads per commit. 30 commits of one row 20 ms apart (50 rows/s): with
 * gather_ms 300 from 1 row/s the ~600 ms take a handful of reads; with the rate bound above the
 * load, one read per commit (the relay without the spacing read per commit in both cases).
 * Every row is produced and published once either way. */
static uint64_t wait_produced(oq_relay_t *r, uint64_t want, int ms)
{
    oq_relay_stats_t s;
    int64_t deadline = oq_mono_us() + (int64_t)ms * 1000;
    do {
        oq_sleep_ms(2, NULL);
        oq_relay_stats(r, &s);
    } while (s.produced < want && oq_mono_us() < deadline);
    return s.produced;
}

static uint64_t gather_reads(int gather_ms, int min_rate)
{
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk, 3, 1);
    oq_relay_opts_t o = opts("G");
    o.brokers = rd_kafka_mock_cluster_bootstraps(mcl);
    o.lease_ms = 30000;
    o.gather_ms = gather_ms;
    o.gather_min_rate = min_rate;
    oq_relay_t *r = oq_relay_new(&o, &err);
    assert_non_null(r);
    assert_int_equal(oq_relay_start(r, &err), 0);
    assert_true(wait_state(r, OQ_RELAY_HOLDER, 10000));
    append_rows(1);
    assert_int_equal(wait_produced(r, 1, 20000), 1);
    oq_relay_stats_t s0, s;
    oq_relay_stats(r, &s0);
    for (int i = 0; i < 30; i++) {
        oq_sleep_ms(20, NULL);
        append_rows(1);
    }
    oq_relay_stats(r, &s);
    uint64_t reads = s.reads - s0.reads;
    print_message("gather_ms %d min_rate %d: %" PRIu64 " reads for 30 commits\n", gather_ms,
                  min_rate, reads);
    published_once_then_down(r, mcl, mrk, 31);
    return reads;
}

static void test_gather_spaces_reads(void **state)
{
    (void)state;
    assert_true(gather_reads(300, 1) <= 8);
}

static void test_gather_not_below_rate(void **state)
{
    (void)state;
    oq_relay_opts_t d;
    oq_relay_opts_init(&d);
    assert_true(d.gather_ms == -1 && d.gather_min_rate > 50); /* -1: 10 ms SQLite, 5 ms PG */
    assert_true(gather_reads(300, d.gather_min_rate) >= 20);
}

int main(void)
{
    oq_log_init(OQ_LOG_OFF, OQ_LOG_FMT_LOGFMT, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bad_options, setup, teardown),
        cmocka_unit_test_setup_teardown(test_holder_standby_unreachable_broker, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics_registration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watermark_small_window_mock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watermark_waits_for_slow_row, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wal_watch_wakes_idle_relay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wal_watch_commit_in_fsync_at_idle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_relay_sends_without_linger, setup, teardown),
        cmocka_unit_test_setup_teardown(test_partial_batch_waits_for_reports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_batch_does_not_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather_spaces_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather_not_below_rate, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
