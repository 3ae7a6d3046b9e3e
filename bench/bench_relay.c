/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq-bench relay`: outbox-to-broker throughput of the relay against raw librdkafka
 * production of the same payloads to the same broker, in the same run, plus the idle relay's
 * commit-to-published latency.
 *
 * Method. A fresh database (under --dir) is filled with --rows outbox rows of about --size
 * bytes over --keys keys (not timed). Then:
 *   1. raw: one idempotent producer (the relay's settings: enable.idempotence, acks=all,
 *      linger.ms=1) produces the same keys, payloads and message-id headers from memory, and
 *      the time from the first produce to the last delivery report gives the raw rate;
 *   2. relay: an in-process oq_relay on the database; the time from start to every row being
 *      marked published (delivery report received *and* the mark committed) gives its rate;
 *   3. latency: with the relay idle, --samples times: commit one row from another connection,
 *      then wait until the relay has produced it (it noticed the commit) and marked it. The first
 * half rely on PRAGMA data_version polling alone, the second half also call oq_relay_notify()
 * (in-process fast path). Between samples a random 20-60 ms pause lets the relay back off to its
 * idle cap.
 *   4. idle CPU: process CPU time over one second with the relay idle.
 * The broker address comes from --brokers (run `onceq broker --partitions 64` for 1M rows:
 * the mock keeps ~5 MiB per partition, evicting older data, which does not affect the rates).
 * Output: human-readable lines and one final `result` line with every figure (key=value).
 */
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "oq_config.h"
#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_kafka.h"
#include "oq_log.h"
#include "oq_relay.h"
#include "oq_util.h"

static const char bench_relay_usage[] =
    "usage: onceq-bench relay --brokers HOST:PORT[,...] [--rows 1000000] [--size 300]\n"
    "                         [--keys 10000] [--topic onceq.tool-calls] [--samples 200]\n"
    "                         [--dir /tmp] [-X kafka.prop=value]...\n"
    "\n"
    "Relay throughput from a pre-filled outbox vs raw librdkafka produce of the same payloads\n"
    "to the same broker (both idempotent, acks=all), and the idle relay's commit-to-published\n"
    "latency p50/p99. Target: relay >= 0.5x raw.";

static const oq_setting_t bench_relay_settings[] = {
    {"brokers", OQ_SET_STRING, NULL, 1, 4096, NULL, "Kafka bootstrap servers (onceq broker)"},
    {"rows", OQ_SET_INT, "1000000", 1, 100000000, NULL, "outbox rows to publish"},
    {"size", OQ_SET_INT, "300", 32, 1000000, NULL, "payload bytes per row"},
    {"keys", OQ_SET_INT, "10000", 1, 100000000, NULL, "distinct Kafka keys (call ids)"},
    {"topic", OQ_SET_STRING, "onceq.tool-calls", 1, 249, NULL, "topic"},
    {"samples", OQ_SET_INT, "200", 0, 100000, NULL, "idle latency samples"},
    {"batch-rows", OQ_SET_INT, "1000", 1, 100000, NULL, "relay batch rows"},
    {"max-inflight", OQ_SET_INT, "50000", 1, 1000000, NULL, "relay max in-flight messages"},
    {"dir", OQ_SET_STRING, "/tmp", 1, 1024, NULL, "where to create the benchmark database"},
    {"synchronous", OQ_SET_ENUM, "normal", 0, -1, "full|normal|off",
     "SQLite synchronous level of the relay's own writes (as onceq relay)"},
    {"keep", OQ_SET_BOOL, "false", 0, -1, NULL, "keep the benchmark database"},
};

/* Deterministic row content shared by the fill and the raw producer. */
static void bench_row(long i, long keys, int size, char *key, size_t keycap, char *payload)
{
    snprintf(key, keycap, "c_%016lx", (unsigned long)(i % keys) * 2654435761UL);
    int n = snprintf(payload, (size_t)size + 64,
                     "{\"v\":1,\"kind\":\"tool_call\",\"tool\":\"charge\",\"i\":%ld,\"pad\":\"", i);
    while (n < size - 2)
        payload[n++] = 'x';
    payload[n++] = '"';
    payload[n++] = '}';
    payload[n] = '\0';
}

/* Append row \p i (bench_row's key and payload, a new message id) to the outbox. */
static int bench_append(sqlite3 *db, oq_stmt_cache_t *cache, const char *topic, long i, long keys,
                        int size, char *payload, oq_error_t *err)
{
    char key[40], mid[OQ_UUID_LEN + 1];
    bench_row(i, keys, size, key, sizeof(key), payload);
    oq_id_uuid(mid);
    oq_outbox_row_t row = {.message_id = mid,
                           .topic = topic,
                           .key = key,
                           .payload = payload,
                           .payload_len = strlen(payload),
                           .created_at = oq_now_ms()};
    return oq_outbox_append(db, cache, &row, err);
}

static int bench_fill(const char *path, long rows, long keys, int size, const char *topic)
{
    oq_error_t err = {0};
    sqlite3 *db = NULL;
    oq_db_opts_t o = {.synchronous = "OFF"};
    int rc = 1;
    char *payload = malloc((size_t)size + 64);
    if (!payload) return 1;
    if (oq_db_open(path, &o, &db, &err) != 0 || oq_db_migrate(db, oq_migrations_producer, &err)) {
        fprintf(stderr, "bench relay: %s\n", err.msg);
        goto out;
    }
    oq_stmt_cache_t *cache = oq_stmt_cache_new(db);
    for (long i = 0; i < rows;) {
        if (oq_db_begin_immediate(db, 5000, &err) != 0) goto fail;
        long end = i + 50000 < rows ? i + 50000 : rows;
        for (; i < end; i++)
            if (bench_append(db, cache, topic, i, keys, size, payload, &err) != 0) goto fail;
        if (oq_db_commit(db, &err) != 0) goto fail;
    }
    oq_stmt_cache_destroy(cache);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "bench relay: fill: %s\n", err.msg);
    oq_stmt_cache_destroy(cache);
out:
    if (db) sqlite3_close_v2(db);
    free(payload);
    return rc;
}

static long raw_delivered, raw_failed;

static void raw_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    if (m->err)
        raw_failed++;
    else
        raw_delivered++;
}

/* Raw baseline: @returns elapsed seconds, or -1. */
static double bench_raw(const oq_config_t *cfg, long rows, long keys, int size, const char *topic)
{
    oq_error_t err = {0};
    char errstr[512];
    rd_kafka_conf_t *conf =
        oq_kafka_conf_new(OQ_KAFKA_PRODUCER, oq_config_str(cfg, "brokers"), cfg, &err);
    if (!conf || oq_kafka_conf_set(conf, "enable.idempotence", "true", &err) ||
        oq_kafka_conf_set(conf, "acks", "all", &err) ||
        oq_kafka_conf_set(conf, "linger.ms", "1", &err) ||
        oq_kafka_conf_set(conf, "queue.buffering.max.messages", "200000", &err)) {
        fprintf(stderr, "bench relay: %s\n", err.msg);
        if (conf) rd_kafka_conf_destroy(conf);
        return -1;
    }
    rd_kafka_conf_set_dr_msg_cb(conf, raw_dr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!rk) {
        fprintf(stderr, "bench relay: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
        return -1;
    }
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
    char *payload = malloc((size_t)size + 64);
    /* warm-up: metadata and producer id, not timed */
    raw_delivered = raw_failed = 0;
    rd_kafka_producev(rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_VALUE("warmup", 6),
                      RD_KAFKA_V_KEY("w", 1), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                      RD_KAFKA_V_END);
    rd_kafka_flush(rk, 10000);
    raw_delivered = raw_failed = 0;
    int64_t t0 = oq_mono_us();
    for (long i = 0; i < rows; i++) {
        char key[40], mid[OQ_UUID_LEN + 1];
        bench_row(i, keys, size, key, sizeof(key), payload);
        oq_id_uuid(mid);
        for (;;) {
            rd_kafka_resp_err_t e = rd_kafka_producev(
                rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                RD_KAFKA_V_KEY(key, strlen(key)), RD_KAFKA_V_VALUE(payload, strlen(payload)),
                RD_KAFKA_V_HEADER(OQ_HDR_MESSAGE_ID, mid, OQ_UUID_LEN), RD_KAFKA_V_END);
            if (e == RD_KAFKA_RESP_ERR_NO_ERROR) break;
            if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                fprintf(stderr, "bench relay: raw produce: %s\n", rd_kafka_err2str(e));
                goto fail;
            }
            rd_kafka_poll(rk, 10);
            if (oq_mono_us() - t0 > 600LL * 1000000) {
                fprintf(stderr, "bench relay: raw produce stalled (broker down?)\n");
                goto fail;
            }
        }
        rd_kafka_poll(rk, 0);
    }
    while (raw_delivered + raw_failed < rows && rd_kafka_outq_len(rk) > 0) {
        rd_kafka_poll(rk, 50);
        if (oq_mono_us() - t0 > 600LL * 1000000) {
            fprintf(stderr, "bench relay: raw produce stalled (broker down?)\n");
            goto fail;
        }
    }
    double secs = (double)(oq_mono_us() - t0) / 1e6;
    if (raw_failed) fprintf(stderr, "bench relay: raw: %ld deliveries failed\n", raw_failed);
    free(payload);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return secs;
fail:
    free(payload);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    return -1;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, int n, double p)
{
    if (n <= 0) return 0;
    int i = (int)ceil(p * n) - 1;
    if (i < 0) i = 0;
    if (i >= n) i = n - 1;
    return v[i];
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Commit one row; wait until the relay produced it (*notice_ms: it noticed the commit) and
 * marked it. @returns the commit-to-published ms, or -1 on timeout/error. */
static double latency_sample(sqlite3 *db, oq_relay_t *relay, int notify, long i, int size,
                             const char *topic, char *payload, double *notice_ms)
{
    oq_error_t err = {0};
    oq_relay_stats_t s;
    oq_relay_stats(relay, &s);
    uint64_t before = s.published, produced_before = s.produced;
    *notice_ms = -1;
    if (oq_db_begin_immediate(db, 5000, &err) ||
        bench_append(db, NULL, topic, i, 1000, size, payload, &err) || oq_db_commit(db, &err)) {
        fprintf(stderr, "bench relay: latency insert: %s\n", err.msg);
        return -1;
    }
    int64_t t0 = oq_mono_us();
    if (notify) oq_relay_notify(relay);
    while (oq_mono_us() - t0 < 5000000) {
        oq_relay_stats(relay, &s);
        if (*notice_ms < 0 && s.produced > produced_before)
            *notice_ms = (double)(oq_mono_us() - t0) / 1000.0;
        if (s.published > before) {
            double ms = (double)(oq_mono_us() - t0) / 1000.0;
            if (*notice_ms < 0) *notice_ms = ms;
            return ms;
        }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

int oq__bench_relay(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    oq_relay_t *relay = NULL;
    sqlite3 *db = NULL;
    double *lat = NULL;
    char dir[1100] = "", path[1200] = "";
    char *payload = NULL;
    oq_config_t *cfg = oq_config_new(bench_relay_settings, sizeof(bench_relay_settings) /
                                                               sizeof(bench_relay_settings[0]));
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq-bench", bench_relay_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    if (!oq_config_str(cfg, "brokers")) {
        fprintf(stderr, "onceq-bench relay: --brokers is required (start `onceq broker "
                        "--partitions 64`)\n");
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    long rows = (long)oq_config_int(cfg, "rows"), keys = (long)oq_config_int(cfg, "keys");
    int size = (int)oq_config_int(cfg, "size"), samples = (int)oq_config_int(cfg, "samples");
    const char *topic = oq_config_str(cfg, "topic");
    payload = malloc((size_t)size + 64);
    lat = calloc((size_t)samples + 1, sizeof(double));
    if (!payload || !lat) goto out;

    snprintf(dir, sizeof(dir), "%s/onceq-bench-relay.XXXXXX", oq_config_str(cfg, "dir"));
    if (!mkdtemp(dir)) {
        fprintf(stderr, "bench relay: mkdtemp %s failed\n", dir);
        dir[0] = '\0';
        goto out;
    }
    snprintf(path, sizeof(path), "%s/calls.db", dir);
    printf("bench relay: rows=%ld size=%d keys=%ld topic=%s db=%s\n", rows, size, keys, topic,
           path);
    fflush(stdout);
    int64_t tf = oq_mono_us();
    if (bench_fill(path, rows, keys, size, topic) != 0) goto out;
    printf("fill: %.2f s (not timed)\n", (double)(oq_mono_us() - tf) / 1e6);
    fflush(stdout);

    double rc0 = cpu_s();
    double raw_s = bench_raw(cfg, rows, keys, size, topic);
    double raw_cpu = cpu_s() - rc0;
    if (raw_s <= 0) goto out;
    double raw_rate = (double)rows / raw_s;
    printf("raw librdkafka produce: %ld msgs in %.2f s = %.0f msgs/s (cpu %.2f s)\n", rows, raw_s,
           raw_rate, raw_cpu);
    fflush(stdout);

    oq_relay_opts_t o;
    oq_relay_opts_init(&o);
    o.db_path = path;
    o.brokers = oq_config_str(cfg, "brokers");
    o.kafka_cfg = cfg;
    o.batch_rows = (int)oq_config_int(cfg, "batch-rows");
    o.max_inflight = (int)oq_config_int(cfg, "max-inflight");
    o.owner = "bench";
    o.db_synchronous = oq_config_str(cfg, "synchronous");
    relay = oq_relay_new(&o, &err);
    if (!relay) {
        fprintf(stderr, "bench relay: %s\n", err.msg);
        goto out;
    }
    double cpu0 = cpu_s();
    int64_t t0 = oq_mono_us();
    if (oq_relay_start(relay, &err) != 0) {
        fprintf(stderr, "bench relay: %s\n", err.msg);
        goto out;
    }
    oq_relay_stats_t s;
    for (;;) {
        oq_relay_stats(relay, &s);
        if (s.published >= (uint64_t)rows) break;
        if (oq_mono_us() - t0 > 600LL * 1000000) {
            fprintf(stderr,
                    "bench relay: relay did not finish within 600 s (published %" PRIu64 ")\n",
                    s.published);
            goto out;
        }
        oq_sleep_ms(2, NULL);
    }
    double relay_s = (double)(oq_mono_us() - t0) / 1e6;
    double relay_cpu = cpu_s() - cpu0;
    double relay_rate = (double)rows / relay_s;
    printf("relay (read + produce + delivery + mark): %ld rows in %.2f s = %.0f rows/s "
           "(cpu %.2f s; produced=%" PRIu64 " errors=%" PRIu64 ")\n",
           rows, relay_s, relay_rate, relay_cpu, s.produced, s.delivery_errors);
    printf("ratio relay/raw: %.2f (target >= 0.5)\n", relay_rate / raw_rate);
    fflush(stdout);

    /* idle CPU */
    oq_sleep_ms(300, NULL);
    double c0 = cpu_s();
    int64_t w0 = oq_mono_us();
    oq_sleep_ms(1000, NULL);
    double idle_cpu = (cpu_s() - c0) / ((double)(oq_mono_us() - w0) / 1e6) * 100.0;
    printf("idle relay process CPU: %.2f%% of one core\n", idle_cpu);

    /* latency */
    oq_db_opts_t dbo = {0};
    if (oq_db_open(path, &dbo, &db, &err) != 0) {
        fprintf(stderr, "bench relay: %s\n", err.msg);
        goto out;
    }
    int half = samples / 2, nl[2] = {0, 0};
    double p50[2] = {0}, p99[2] = {0}, mx[2] = {0}, n50[2] = {0}, n99[2] = {0};
    double *notice = calloc((size_t)samples + 1, sizeof(double));
    if (!notice) goto out;
    for (int mode = 0; mode < 2; mode++) {
        int n = mode == 0 ? samples - half : half, k = 0;
        for (int i = 0; i < n; i++) {
            unsigned char r;
            oq_random_bytes(&r, 1);
            oq_sleep_ms(20 + r % 41, NULL);
            double nms;
            double ms = latency_sample(db, relay, mode, rows + i, size, topic, payload, &nms);
            if (ms < 0) {
                fprintf(stderr, "bench relay: a latency sample timed out\n");
                free(notice);
                goto out;
            }
            notice[k] = nms;
            lat[k++] = ms;
        }
        qsort(notice, (size_t)k, sizeof(double), cmp_d);
        n50[mode] = pct(notice, k, 0.50);
        n99[mode] = pct(notice, k, 0.99);
        qsort(lat, (size_t)k, sizeof(double), cmp_d);
        nl[mode] = k;
        p50[mode] = pct(lat, k, 0.50);
        p99[mode] = pct(lat, k, 0.99);
        mx[mode] = k ? lat[k - 1] : 0;
        printf("idle commit->produced (noticed) (%s): n=%d p50=%.2f ms p99=%.2f ms\n",
               mode == 0 ? "data_version polling" : "with oq_relay_notify", k, n50[mode],
               n99[mode]);
        printf("idle commit->published latency (%s): n=%d p50=%.2f ms p99=%.2f ms max=%.2f ms\n",
               mode == 0 ? "data_version polling" : "with oq_relay_notify", k, p50[mode], p99[mode],
               mx[mode]);
    }
    free(notice);
    printf("result bench=relay rows=%ld size=%d keys=%ld raw_rate=%.0f relay_rate=%.0f ratio=%.2f "
           "idle_cpu_pct=%.2f notice_poll_p50_ms=%.2f notice_poll_p99_ms=%.2f "
           "lat_poll_p50_ms=%.2f lat_poll_p99_ms=%.2f lat_notify_p50_ms=%.2f "
           "lat_notify_p99_ms=%.2f raw_cpu_s=%.2f relay_cpu_s=%.2f\n",
           rows, size, keys, raw_rate, relay_rate, relay_rate / raw_rate, idle_cpu, n50[0], n99[0],
           p50[0], p99[0], p50[1], p99[1], raw_cpu, relay_cpu);
    (void)nl;
    ret = OQ_EXIT_OK;
out:
    oq_relay_destroy(relay);
    if (db) sqlite3_close_v2(db);
    if (dir[0] && !oq_config_int(cfg, "keep")) {
        char p[1300];
        const char *sfx[] = {"", "-wal", "-shm"};
        for (int i = 0; i < 3; i++) {
            snprintf(p, sizeof(p), "%s%s", path, sfx[i]);
            unlink(p);
        }
        rmdir(dir);
    }
    free(payload);
    free(lat);
    oq_config_destroy(cfg);
    return ret;
}
