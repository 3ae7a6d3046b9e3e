/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq-bench consumer`: the consumer worker from a pre-filled topic against a raw baseline
 * in the same run, as a ratio.
 *
 * Method. A fresh topic (auto-created by the broker) is filled with --calls tool_call
 * envelopes, alternately charge {amount} and send_email {to, subject}: fast tools that both
 * record an effect (filling is not timed). Then, each in its own fresh consumer group and its
 * own fresh database (WAL, synchronous as --synchronous, default FULL), reading the same
 * messages with the same librdkafka settings and the same poll-batch size:
 *   1. raw: librdkafka consume + one plain INSERT per message (message id, key, partition,
 *      offset, payload) in one transaction per poll batch, then offsets stored and committed
 *      asynchronously, as the worker does;
 *   2. raw-same-rows: the same loop inserting, with plain INSERTs and no reads or logic, the
 *      rows the worker writes per new call of a fast tool (inbox, executions, effects, one
 *      audit row, outbox: 5 rows);
 *   3. onceq: an in-process oq_consumer (envelope decode + validation, inbox dedupe, plan,
 *      conditional claim, tool, effect, fenced finish, result event), with its embedded result
 *      relay unless --no-relay.
 * Each rate is messages / (last commit - first message polled), so group-join time is left out.
 * The three runs are interleaved over --rounds rounds (the machine is shared and noisy) and the
 * medians reported. Target: onceq >= 0.5 x raw. Output: one line per round and one `result`
 * line (key=value) with the medians.
 *
 * --db URI runs the onceq side on PostgreSQL (synchronous_commit=on; the raw baselines stay on
 * SQLite): every onceq table of that database is emptied before each round, so use a database
 * of its own. The onceq side's CPU and bytes written per call (this process, and the server
 * named by ONCEQ_BENCH_PG_PID) come from /proc (bench/procstat.c), summed over the rounds.
 */
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "oq_config.h"
#include "oq_consumer.h"
#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_json.h"
#include "oq_kafka.h"
#include "oq_log.h"
#include "oq_pg.h"
#include "oq_util.h"

static const char bcons_usage[] =
    "usage: onceq-bench consumer --brokers HOST:PORT[,...] [--calls 20000] [--batch 500]\n"
    "                            [--synchronous full] [--dir /tmp] [--no-relay] [-X k=v]...\n"
    "                            [--db postgresql://...]\n"
    "\n"
    "Consumer worker rate from a pre-filled topic vs raw librdkafka consume + batched plain\n"
    "SQLite inserts of the same messages, same run, as a ratio (target >= 0.5).";

static const oq_setting_t bcons_settings[] = {
    {"brokers", OQ_SET_STRING, NULL, 1, 4096, NULL, "Kafka bootstrap servers (onceq broker)"},
    {"calls", OQ_SET_INT, "20000", 1, 10000000, NULL, "tool calls in the topic"},
    {"batch", OQ_SET_INT, "500", 1, 100000, NULL, "poll batch / transaction size (all runs)"},
    {"synchronous", OQ_SET_ENUM, "full", 0, -1, "full|normal|off", "SQLite synchronous"},
    {"dir", OQ_SET_STRING, "/tmp", 1, 1024, NULL, "where the benchmark databases go"},
    {"db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "the onceq side on PostgreSQL: a URI of a database of its own (emptied every round)"},
    {"no-relay", OQ_SET_BOOL, "false", 0, -1, NULL, "run the worker without its result relay"},
    {"rounds", OQ_SET_INT, "3", 1, 100, NULL,
     "rounds of raw, raw-same-rows, onceq (interleaved; medians reported)"},
};

typedef struct {
    const oq_config_t *cfg;
    const char *brokers, *topic, *sync, *dir;
    const char *db; /* PostgreSQL for the onceq side, or NULL */
    long n;
    int batch;
    int round;
    char tag[16];
} bc_t;

static int bc_fill(bc_t *b)
{
    oq_error_t err = {0};
    char errstr[256];
    rd_kafka_conf_t *conf = oq_kafka_conf_new(OQ_KAFKA_PRODUCER, b->brokers, b->cfg, &err);
    if (!conf) return -1;
    oq_kafka_conf_set(conf, "linger.ms", "5", &err);
    oq_kafka_conf_set(conf, "queue.buffering.max.messages", "1000000", &err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!rk) {
        fprintf(stderr, "producer: %s\n", errstr);
        return -1;
    }
    for (long i = 0; i < b->n; i++) {
        oq_envelope_t e;
        char key[40], *payload = NULL;
        size_t len = 0;
        memset(&e, 0, sizeof(e));
        e.v = 1;
        e.kind = OQ_KIND_TOOL_CALL;
        oq_id_uuid(e.message_id);
        oq_id_call(e.call_id);
        snprintf(key, sizeof(key), "bench-%.16s", e.call_id + 2);
        e.tenant = "bench";
        e.idem_key = key;
        e.tool = (i % 2) ? "send_email" : "charge";
        e.args = (i % 2) ? json_pack("{s:s, s:s}", "to", "u@example.com", "subject", "hello")
                         : json_pack("{s:I}", "amount", (json_int_t)(1 + i % 100));
        e.attempt = 1;
        e.created_at = oq_now_ms();
        if (oq_fingerprint(e.tenant, e.tool, e.args, e.fingerprint, &err) ||
            oq_envelope_encode(&e, &payload, &len, &err)) {
            fprintf(stderr, "encode: %s\n", err.msg);
            return -1;
        }
        json_decref(e.args);
        for (;;) {
            rd_kafka_resp_err_t ke = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(b->topic), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                RD_KAFKA_V_KEY(e.call_id, strlen(e.call_id)), RD_KAFKA_V_VALUE(payload, len),
                RD_KAFKA_V_HEADER(OQ_HDR_MESSAGE_ID, e.message_id, (ssize_t)-1), RD_KAFKA_V_END);
            if (!ke) break;
            if (ke != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                fprintf(stderr, "produce: %s\n", rd_kafka_err2str(ke));
                return -1;
            }
            rd_kafka_poll(rk, 10);
        }
        free(payload);
        rd_kafka_poll(rk, 0);
    }
    int left = rd_kafka_flush(rk, 60000) == RD_KAFKA_RESP_ERR_NO_ERROR ? 0 : -1;
    rd_kafka_destroy(rk);
    return left;
}

/* --- raw baselines ----------------------------------------------------------------------- */

static const char raw_schema[] =
    "CREATE TABLE IF NOT EXISTS raw(message_id TEXT PRIMARY KEY, call_id TEXT, "
    "partition INTEGER, offset INTEGER, received_at INTEGER, payload BLOB) WITHOUT ROWID";

/* same_rows = 0: one row per message; 1: the worker's rows with plain INSERTs. */
static int bc_raw(bc_t *b, int same_rows, double *rate)
{
    static const char *const ins_same[] = {
        "INSERT INTO inbox(message_id, call_id, topic, partition, offset, received_at, outcome)"
        " VALUES (?1, ?2, 't', ?3, ?4, ?5, 'planned')",
        "INSERT INTO executions(call_id, tenant, idem_key, fingerprint, tool, args, state, "
        "attempt, tries, fence, result, effect_id, next_attempt_at, message_id, created_at, "
        "updated_at) VALUES (?2, 'bench', ?1, 'f', 'charge', '{\"amount\":1}', 'COMMITTED', 1, "
        "1, 1, '{\"charged\":1}', 'e_' || ?2, ?5, ?1, ?5, ?5)",
        "INSERT INTO effects(effect_id, call_id, tool, amount, detail, attempt, fence, worker, "
        "created_at) VALUES ('e_' || ?2, ?2, 'charge', 1, '{\"charged\":1}', 1, 1, 'w', ?5)",
        "INSERT INTO audit(ts, call_id, event, attempt, fence, worker, detail) VALUES (?5, ?2, "
        "'committed', 1, 1, 'w', 'inline: planned, started, try 1 committed')",
        "INSERT INTO outbox(message_id, topic, key, payload, created_at) VALUES ('r' || ?1, "
        "'onceq.tool-results', ?2, ?6, ?5)",
    };
    static const char ins_raw[] = "INSERT INTO raw(message_id, call_id, partition, offset, "
                                  "received_at, payload) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
    oq_error_t err = {0};
    char path[1100], errstr[256], group[64];
    sqlite3 *db = NULL;
    sqlite3_stmt *st[8] = {0};
    int nst = same_rows ? 5 : 1, rc = -1;
    rd_kafka_t *rk = NULL;
    rd_kafka_message_t **batch = calloc((size_t)b->batch, sizeof(*batch));
    snprintf(path, sizeof(path), "%s/onceq-bench-%s-%d-%s.db", b->dir, b->tag, b->round,
             same_rows ? "same" : "raw");
    oq_db_opts_t o = {.synchronous = b->sync};
    if (!batch || oq_db_open(path, &o, &db, &err)) goto out;
    if (same_rows ? oq_db_migrate(db, oq_migrations_consumer, &err)
                  : oq_db_exec(db, raw_schema, &err))
        goto out;
    /* the same page cache as the worker's connections (consumer/store.c) */
    if (oq_db_exec(db, "PRAGMA cache_size = -32768", &err)) goto out;
    for (int i = 0; i < nst; i++)
        if (sqlite3_prepare_v2(db, same_rows ? ins_same[i] : ins_raw, -1, &st[i], NULL)) {
            fprintf(stderr, "prepare: %s\n", sqlite3_errmsg(db));
            goto out;
        }
    rd_kafka_conf_t *conf = oq_kafka_conf_new(OQ_KAFKA_CONSUMER, b->brokers, b->cfg, &err);
    if (!conf) goto out;
    snprintf(group, sizeof(group), "bench-%s-%s-%d", same_rows ? "same" : "raw", b->tag, b->round);
    oq_kafka_conf_set(conf, "group.id", group, &err);
    oq_kafka_conf_set(conf, "enable.auto.commit", "false", &err);
    oq_kafka_conf_set(conf, "enable.auto.offset.store", "false", &err);
    oq_kafka_conf_set(conf, "auto.offset.reset", "earliest", &err);
    if (!(rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr)))) {
        fprintf(stderr, "consumer: %s\n", errstr);
        goto out;
    }
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(tl, b->topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_subscribe(rk, tl);
    rd_kafka_topic_partition_list_destroy(tl);
    long got = 0;
    int64_t t0 = 0, t1 = 0, deadline = oq_mono_us() + 300 * 1000000LL;
    while (got < b->n && oq_mono_us() < deadline) {
        int nb = 0;
        int64_t tp = oq_mono_us();
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 50);
        while (m) {
            if (m->err) {
                rd_kafka_message_destroy(m);
            } else {
                if (!t0) t0 = tp;
                batch[nb++] = m;
            }
            if (nb >= b->batch) break;
            m = rd_kafka_consumer_poll(rk, 0);
        }
        if (!nb) continue;
        sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        int64_t now = oq_now_ms();
        for (int i = 0; i < nb; i++) {
            m = batch[i];
            const void *hv = NULL;
            size_t hl = 0;
            rd_kafka_headers_t *h = NULL;
            if (rd_kafka_message_headers(m, &h) == 0)
                rd_kafka_header_get_last(h, OQ_HDR_MESSAGE_ID, &hv, &hl);
            for (int k = 0; k < nst; k++) {
                sqlite3_bind_text(st[k], 1, hv ? hv : "", (int)hl, SQLITE_STATIC);
                sqlite3_bind_text(st[k], 2, m->key ? m->key : "", (int)m->key_len, SQLITE_STATIC);
                if (sqlite3_bind_parameter_count(st[k]) >= 3) {
                    sqlite3_bind_int(st[k], 3, m->partition);
                    sqlite3_bind_int64(st[k], 4, m->offset);
                }
                sqlite3_bind_int64(st[k], 5, now);
                if (sqlite3_bind_parameter_count(st[k]) >= 6)
                    sqlite3_bind_blob(st[k], 6, m->payload, (int)m->len, SQLITE_STATIC);
                if (sqlite3_step(st[k]) != SQLITE_DONE) {
                    fprintf(stderr, "insert: %s\n", sqlite3_errmsg(db));
                    goto out;
                }
                sqlite3_reset(st[k]);
            }
        }
        if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) goto out;
        rd_kafka_topic_partition_list_t *offs = rd_kafka_topic_partition_list_new(8);
        for (int i = 0; i < nb; i++) {
            m = batch[i];
            rd_kafka_topic_partition_t *p =
                rd_kafka_topic_partition_list_find(offs, rd_kafka_topic_name(m->rkt), m->partition);
            if (!p)
                p = rd_kafka_topic_partition_list_add(offs, rd_kafka_topic_name(m->rkt),
                                                      m->partition);
            if (m->offset + 1 > p->offset) p->offset = m->offset + 1;
            rd_kafka_message_destroy(m);
        }
        rd_kafka_offsets_store(rk, offs);
        rd_kafka_topic_partition_list_destroy(offs);
        rd_kafka_commit(rk, NULL, 1);
        got += nb;
        t1 = oq_mono_us();
    }
    if (got < b->n) {
        fprintf(stderr, "raw: only %ld of %ld messages within 300 s\n", got, b->n);
        goto out;
    }
    *rate = (double)got / ((double)(t1 - t0) / 1e6);
    rc = 0;
out:
    if (rc && err.msg[0]) fprintf(stderr, "raw: %s\n", err.msg);
    if (rk) {
        rd_kafka_consumer_close(rk);
        rd_kafka_destroy(rk);
    }
    for (int i = 0; i < nst; i++)
        sqlite3_finalize(st[i]);
    if (db) sqlite3_close_v2(db);
    free(batch);
    unlink(path);
    char side[1200];
    snprintf(side, sizeof(side), "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof(side), "%s-shm", path);
    unlink(side);
    return rc;
}

/* --- onceq ------------------------------------------------------------------------------- */

typedef struct {
    oq_consumer_t *c;
    int rc;
} bc_run_t;

static void *bc_thread(void *arg)
{
    bc_run_t *r = arg;
    oq_error_t err = {0};
    r->rc = oq_consumer_run(r->c, 0, &err);
    if (r->rc) fprintf(stderr, "consumer: %s\n", err.msg);
    return NULL;
}

static int bc_onceq(bc_t *b, int no_relay, double *rate, oq_consumer_stats_t *st_out)
{
    oq_error_t err = {0};
    char path[1100], group[64], side[1200];
    oq_consumer_t *c = NULL;
    int rc = -1;
    snprintf(path, sizeof(path), "%s/onceq-bench-%s-%d-onceq.db", b->dir, b->tag, b->round);
    snprintf(group, sizeof(group), "bench-onceq-%s-%d", b->tag, b->round);
    if (b->db) { /* a fresh start on PostgreSQL: every onceq table emptied (the migrations kept) */
        PGconn *pg = NULL;
        if (oq_pg_connect(b->db, &pg, &err) || oq_pg_migrate(pg, &err) ||
            oq_pg_exec(pg,
                       "DO $$DECLARE t text; BEGIN FOR t IN SELECT tablename FROM pg_tables WHERE "
                       "schemaname = 'onceq' AND tablename <> 'schema_version' LOOP EXECUTE "
                       "format('TRUNCATE onceq.%I', t); END LOOP; END$$",
                       &err)) {
            fprintf(stderr, "consumer: postgres: %s\n", err.msg);
            if (pg) PQfinish(pg);
            return -1;
        }
        PQfinish(pg);
    }
    oq_consumer_opts_t o;
    memset(&o, 0, sizeof(o));
    o.db_path = b->db ? b->db : path;
    o.brokers = b->brokers;
    o.group = group;
    o.topic = b->topic;
    o.synchronous = b->sync;
    o.cfg = b->cfg;
    o.batch = b->batch;
    o.runners = 1;
    o.no_relay = no_relay;
    if (oq_consumer_new(&o, &c, &err)) {
        fprintf(stderr, "consumer: %s\n", err.msg);
        return -1;
    }
    bc_run_t run = {.c = c, .rc = 0};
    pthread_t th;
    pthread_create(&th, NULL, bc_thread, &run);
    pthread_setname_np(th, "oq-consumer");
    oq_consumer_stats_t st;
    int64_t deadline = oq_mono_us() + 300 * 1000000LL, t1 = 0;
    for (;;) {
        oq_consumer_get_stats(c, &st);
        if ((long)st.terminal >= b->n) {
            t1 = oq_mono_us();
            break;
        }
        if (oq_mono_us() > deadline) break;
        oq_sleep_ms(1, NULL);
    }
    oq_consumer_stop(c);
    pthread_join(th, NULL);
    if (t1 && st.first_poll_us) {
        *rate = (double)st.terminal / ((double)(t1 - st.first_poll_us) / 1e6);
        *st_out = st;
        rc = 0;
    } else {
        fprintf(stderr, "onceq: only %llu of %ld terminal within 300 s\n",
                (unsigned long long)st.terminal, b->n);
    }
    oq_consumer_destroy(c);
    unlink(path);
    snprintf(side, sizeof(side), "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof(side), "%s-shm", path);
    unlink(side);
    return rc;
}

static double median_of(const double *v, int n)
{
    double t[100];
    for (int i = 0; i < n; i++)
        t[i] = v[i];
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

int oq__bench_consumer(int argc, char **argv)
{
    oq_config_t *cfg =
        oq_config_new(bcons_settings, sizeof(bcons_settings) / sizeof(bcons_settings[0]));
    if (!cfg) return OQ_EXIT_FAIL;
    int rc = oq_cli_parse(cfg, "onceq-bench", bcons_usage, argc, argv);
    if (rc >= 0) goto done;
    if (!oq_config_str(cfg, "brokers")) {
        fprintf(stderr, "onceq-bench consumer: --brokers is required (start `onceq broker`)\n");
        rc = OQ_EXIT_USAGE;
        goto done;
    }
    bc_t b;
    memset(&b, 0, sizeof(b));
    char topic[96];
    unsigned char rnd[4];
    oq_random_bytes(rnd, sizeof(rnd));
    oq_hex(rnd, sizeof(rnd), b.tag);
    snprintf(topic, sizeof(topic), "onceq.bench-consumer-%s", b.tag);
    b.cfg = cfg;
    b.brokers = oq_config_str(cfg, "brokers");
    b.topic = topic;
    b.sync = oq_config_str(cfg, "synchronous");
    b.dir = oq_config_str(cfg, "dir");
    b.n = (long)oq_config_int(cfg, "calls");
    b.batch = (int)oq_config_int(cfg, "batch");
    b.db = oq_config_str(cfg, "db");
    int no_relay = (int)oq_config_int(cfg, "no-relay");
    if (oq_log_threshold < OQ_LOG_WARN) oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 0);

    printf("bench consumer: %ld calls (charge/send_email), batch %d, synchronous=%s, topic %s, "
           "onceq on %s\n",
           b.n, b.batch, b.sync, b.topic, b.db ? "PostgreSQL" : "SQLite");
    fflush(stdout);
    int64_t f0 = oq_mono_us();
    if (bc_fill(&b)) {
        rc = OQ_EXIT_FAIL;
        goto done;
    }
    printf("filled in %.2f s\n", (double)(oq_mono_us() - f0) / 1e6);
    fflush(stdout);
    int rounds = (int)oq_config_int(cfg, "rounds");
    double raws[100], sames[100], onceqs[100], ratios[100], ratios_same[100];
    oq_consumer_stats_t st;
    memset(&st, 0, sizeof(st));
    rc = OQ_EXIT_OK;
    /* Interleaved rounds, each reading the same topic in fresh groups and fresh databases:
     * the machine is shared, so load changes hit all three alike. */
    double cpu = 0, pg_cpu = 0, wb = 0, pg_wb = 0, disk = 0;
    for (int r = 0; r < rounds; r++) {
        b.round = r;
        if (bc_raw(&b, 0, &raws[r]) || bc_raw(&b, 1, &sames[r])) {
            rc = OQ_EXIT_FAIL;
            goto done;
        }
        oq_bench_procs_t me0, me1, pg0, pg1;
        oq__bench_procs(getpid(), 0, &me0);
        oq__bench_procs(oq__bench_pg_pid(), 1, &pg0);
        int64_t disk0 = oq__bench_disk_written();
        if (bc_onceq(&b, no_relay, &onceqs[r], &st)) {
            rc = OQ_EXIT_FAIL;
            goto done;
        }
        oq__bench_procs(getpid(), 0, &me1);
        oq__bench_procs(oq__bench_pg_pid(), 1, &pg1);
        double dd = oq__bench_disk_delta(disk0, oq__bench_disk_written());
        disk = dd >= 0 && disk >= 0 ? disk + dd : -1;
        cpu += me1.cpu_s - me0.cpu_s;
        wb += (double)(me1.write_bytes - me0.write_bytes);
        if (pg1.n) {
            pg_cpu += pg1.cpu_s - pg0.cpu_s;
            pg_wb += (double)(pg1.write_bytes - pg0.write_bytes);
        }
        if (st.effects != (uint64_t)b.n) {
            fprintf(stderr, "bench consumer: effects %llu != calls %ld\n",
                    (unsigned long long)st.effects, b.n);
            rc = OQ_EXIT_FAIL;
        }
        ratios[r] = onceqs[r] / raws[r];
        ratios_same[r] = onceqs[r] / sames[r];
        printf("round %d: raw(1 row/msg) %8.0f msgs/s | raw(worker's 5 rows/msg) %7.0f msgs/s | "
               "onceq %7.0f calls/s | ratio %.2f | ratio vs same rows %.2f\n",
               r + 1, raws[r], sames[r], onceqs[r], ratios[r], ratios_same[r]);
        fflush(stdout);
    }
    double m_raw = median_of(raws, rounds), m_same = median_of(sames, rounds),
           m_onceq = median_of(onceqs, rounds), m_ratio = median_of(ratios, rounds),
           m_ratio_same = median_of(ratios_same, rounds);
    printf("median of %d: raw %.0f msgs/s, raw-same-rows %.0f msgs/s, onceq %.0f calls/s (%s "
           "relay)\n",
           rounds, m_raw, m_same, m_onceq, no_relay ? "no" : "with");
    printf("ratio onceq/raw = %.2f; onceq/raw-same-rows = %.2f (target >= 0.5)\n", m_ratio,
           m_ratio_same);
    double calls = (double)b.n * rounds;
    printf("per call (onceq side, all rounds): this process %.1f us CPU, %.0f bytes written; "
           "PostgreSQL server %.1f us CPU, %.0f bytes written\n",
           cpu * 1e6 / calls, wb / calls, pg_cpu * 1e6 / calls, pg_wb / calls);
    oq__bench_print_disk("call", disk >= 0 ? disk / calls : -1);
    printf("result bench=consumer backend=%s calls=%ld batch=%d synchronous=%s relay=%d rounds=%d "
           "raw_rate=%.0f raw_same_rows_rate=%.0f onceq_rate=%.0f ratio=%.3f ratio_same_rows=%.3f "
           "cpu_us=%.1f write_bytes=%.0f pg_cpu_us=%.1f pg_write_bytes=%.0f disk_bytes=%.0f\n",
           b.db ? "pg" : "sqlite", b.n, b.batch, b.sync, !no_relay, rounds, m_raw, m_same, m_onceq,
           m_ratio, m_ratio_same, cpu * 1e6 / calls, wb / calls, pg_cpu * 1e6 / calls,
           pg_wb / calls, disk >= 0 ? disk / calls : -1);
done:
    oq_config_destroy(cfg);
    return rc;
}
