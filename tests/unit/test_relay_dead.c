/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Dead letters of the relay, against librdkafka's in-process mock cluster: no outbox row can
 * block the rows behind it for ever.
 *
 *  - A row over the relay's message.max.bytes (refused by rd_kafka_producev itself) is set
 *    aside at once: copied into outbox_dead with reason MSG_SIZE_TOO_LARGE, the watermark
 *    passes it, every row behind it reaches the topic, the metric counts it.
 *  - A broker's permanent refusal of a batch (injected MSG_SIZE_TOO_LARGE) does not condemn
 *    the rows of that batch: the first one is sent alone, is delivered, nothing is set aside.
 *  - A row the broker refuses again when it is sent alone is set aside; rows appended after it
 *    are delivered and the watermark passes it.
 *  - A transient error (NOT_LEADER_FOR_PARTITION) sets nothing aside.
 *  - The same on a consumer's effects.db (the result outbox a consumer relays with the same
 *    library): a result too large is set aside, counted under relay="results", and the
 *    results behind it go on.
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
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "oq_config.h"
#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_metrics.h"
#include "oq_relay.h"
#include "oq_util.h"

#define TOPIC "onceq.tool-calls"
#define PRODUCE_API 0 /* Kafka ApiKey of Produce */

static char dir[64], path[128];
static sqlite3 *db;

static int setup(void **state)
{
    (void)state;
    oq_error_t err = {0};
    snprintf(dir, sizeof(dir), "/tmp/oq_test_relay_dead_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof(path), "%s/calls.db", dir);
    if (oq_db_open(path, NULL, &db, &err) != 0) return -1;
    if (oq_db_migrate(db, oq_migrations_producer, &err) != 0) return -1;
    return 0;
}

/* As setup(), with the consumer's migration set (effects.db). */
static int setup_consumer(void **state)
{
    (void)state;
    oq_error_t err = {0};
    snprintf(dir, sizeof(dir), "/tmp/oq_test_relay_dead_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof(path), "%s/effects.db", dir);
    if (oq_db_open(path, NULL, &db, &err) != 0) return -1;
    if (oq_db_migrate(db, oq_migrations_consumer, &err) != 0) return -1;
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

/* Appends one row with a payload of \p size bytes; its message id into \p mid (may be NULL). */
static void append_row(size_t size, char *mid_out)
{
    oq_error_t err = {0};
    char mid[OQ_UUID_LEN + 1];
    oq_id_uuid(mid);
    char *payload = malloc(size + 1);
    assert_non_null(payload);
    memset(payload, 'x', size);
    payload[size] = '\0';
    oq_outbox_row_t row = {.message_id = mid,
                           .topic = TOPIC,
                           .key = "c_0000000000000001",
                           .payload = payload,
                           .payload_len = size,
                           .created_at = oq_now_ms()};
    assert_int_equal(oq_outbox_append(db, NULL, &row, &err), 0);
    free(payload);
    if (mid_out) memcpy(mid_out, mid, sizeof(mid));
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

static int64_t watermark(void)
{
    return scalar("SELECT COALESCE((SELECT published_seq FROM relay_lease), 0)");
}

/* Waits up to \p s seconds for the stored watermark to reach \p want. */
static int wait_watermark(int64_t want, int s)
{
    int64_t deadline = oq_mono_us() + (int64_t)s * 1000000;
    while (oq_mono_us() < deadline) {
        if (watermark() >= want) return 1;
        oq_sleep_ms(20, NULL);
    }
    return watermark() >= want;
}

static rd_kafka_mock_cluster_t *mock_up(rd_kafka_t **mrk)
{
    char errstr[256];
    rd_kafka_conf_t *mc = rd_kafka_conf_new();
    rd_kafka_conf_set(mc, "log_level", "0", errstr, sizeof errstr);
    *mrk = rd_kafka_new(RD_KAFKA_PRODUCER, mc, errstr, sizeof errstr);
    assert_non_null(*mrk);
    rd_kafka_mock_cluster_t *mcl = rd_kafka_mock_cluster_new(*mrk, 1);
    assert_non_null(mcl);
    assert_int_equal(rd_kafka_mock_topic_create(mcl, TOPIC, 1, 1), 0);
    return mcl;
}

static oq_relay_t *relay_start(const char *brokers, const oq_config_t *cfg, oq_metrics_t *m)
{
    oq_error_t err = {0};
    oq_relay_opts_t o;
    oq_relay_opts_init(&o);
    o.db_path = path;
    o.brokers = brokers;
    o.owner = "dead-test";
    o.lease_ms = 5000;
    o.stop_timeout_ms = 2000;
    o.kafka_cfg = cfg;
    o.metrics = m;
    oq_relay_t *r = oq_relay_new(&o, &err);
    if (!r) print_error("relay: %s\n", err.msg);
    assert_non_null(r);
    assert_int_equal(oq_relay_start(r, &err), 0);
    return r;
}

/* Reads the whole topic (one partition) from the start; returns the number of messages and
 * whether one carries \p mid in its onceq-message-id header. */
static int consume_all(const char *brokers, int want, const char *mid, int *seen_mid)
{
    char errstr[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", brokers, errstr, sizeof errstr);
    rd_kafka_conf_set(c, "log_level", "0", errstr, sizeof errstr);
    rd_kafka_conf_set(c, "group.id", "dead-test-reader", errstr, sizeof errstr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, errstr, sizeof errstr);
    assert_non_null(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, TOPIC, 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    assert_int_equal(rd_kafka_assign(rk, l), 0);
    rd_kafka_topic_partition_list_destroy(l);
    int n = 0;
    *seen_mid = 0;
    int64_t deadline = oq_mono_us() + 15 * 1000000LL;
    while (n < want && oq_mono_us() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) continue;
        if (!m->err) {
            n++;
            rd_kafka_headers_t *h = NULL;
            const void *v;
            size_t vn;
            if (rd_kafka_message_headers(m, &h) == 0 &&
                rd_kafka_header_get_last(h, OQ_HDR_MESSAGE_ID, &v, &vn) == 0 && vn == strlen(mid) &&
                memcmp(v, mid, vn) == 0)
                *seen_mid = 1;
        }
        rd_kafka_message_destroy(m);
    }
    /* anything more would show up within a short extra wait */
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 300);
    if (m) {
        if (!m->err) n++;
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return n;
}

static void test_too_large_row_set_aside(void **state)
{
    (void)state;
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk);
    const char *brokers = rd_kafka_mock_cluster_bootstraps(mcl);
    char big_mid[OQ_UUID_LEN + 1];
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    for (int i = 0; i < 5; i++)
        append_row(100, NULL);
    append_row(30000, big_mid); /* seq 6: over message.max.bytes=20000 below */
    for (int i = 0; i < 5; i++)
        append_row(100, NULL);
    assert_int_equal(oq_db_commit(db, &err), 0);

    oq_config_t *cfg = oq_config_new(NULL, 0);
    assert_non_null(cfg);
    assert_int_equal(oq_config_set_kafka(cfg, "message.max.bytes", "20000", &err), 0);
    oq_metrics_t *m = oq_metrics_new();
    assert_non_null(m);
    oq_relay_t *r = relay_start(brokers, cfg, m);
    assert_true(wait_watermark(11, 30));
    assert_int_equal(watermark(), 11);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_unpublished"), 0);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_dead"), 1);
    assert_int_equal(scalar("SELECT seq FROM outbox_dead"), 6);
    assert_int_equal(scalar("SELECT reason = 'MSG_SIZE_TOO_LARGE' AND handled_at IS NULL AND "
                            "length(payload) = 30000 AND detail LIKE '%message.max.bytes=20000%' "
                            "FROM outbox_dead"),
                     1);
    char q[160];
    snprintf(q, sizeof q, "SELECT message_id = '%s' FROM outbox_dead", big_mid);
    assert_int_equal(scalar(q), 1);
    assert_int_equal(oq_relay_stop(r), 0);
    oq_relay_stats_t s;
    oq_relay_stats(r, &s);
    assert_int_equal(s.dead_letters, 1);
    assert_int_equal(s.published, 10);

    char *text = NULL;
    size_t len = 0;
    assert_int_equal(oq_metrics_render(m, &text, &len), 0);
    assert_non_null(
        strstr(text, "onceq_relay_dead_letters_total{reason=\"MSG_SIZE_TOO_LARGE\"} 1"));
    free(text);

    /* the rows behind it reached the topic; the big one did not */
    int seen = 0;
    assert_int_equal(consume_all(brokers, 10, big_mid, &seen), 10);
    assert_false(seen);

    /* the status line shows it */
    char line[512];
    assert_int_equal(oq_relay_status_line(db, line, sizeof line, &err), 0);
    assert_non_null(strstr(line, " dead=1"));

    oq_relay_destroy(r);
    oq_metrics_destroy(m);
    oq_config_destroy(cfg);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

/* The broker refuses one batch for good: its rows are innocent until one fails alone. */
static void test_batch_refusal_sets_nothing_aside(void **state)
{
    (void)state;
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk);
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    for (int i = 0; i < 20; i++)
        append_row(100, NULL);
    assert_int_equal(oq_db_commit(db, &err), 0);
    rd_kafka_mock_push_request_errors(mcl, PRODUCE_API, 1, RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
    oq_relay_t *r = relay_start(rd_kafka_mock_cluster_bootstraps(mcl), NULL, NULL);
    assert_true(wait_watermark(20, 30));
    assert_int_equal(oq_relay_stop(r), 0);
    oq_relay_stats_t s;
    oq_relay_stats(r, &s);
    assert_true(s.delivery_errors >= 1); /* the refusal happened */
    assert_int_equal(s.dead_letters, 0);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_dead"), 0);
    oq_relay_destroy(r);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

/* The broker refuses the row for good, in its batch and alone: it is set aside, and rows
 * committed after it are delivered past it. */
static void test_refused_alone_set_aside(void **state)
{
    (void)state;
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk);
    char bad_mid[OQ_UUID_LEN + 1];
    append_row(100, bad_mid); /* seq 1, alone: one Produce request, then one for the probe */
    rd_kafka_mock_push_request_errors(mcl, PRODUCE_API, 2, RD_KAFKA_RESP_ERR_INVALID_RECORD,
                                      RD_KAFKA_RESP_ERR_INVALID_RECORD);
    oq_metrics_t *m = oq_metrics_new();
    assert_non_null(m);
    oq_relay_t *r = relay_start(rd_kafka_mock_cluster_bootstraps(mcl), NULL, m);
    assert_true(wait_watermark(1, 30));
    assert_int_equal(scalar("SELECT count(*) FROM outbox_dead WHERE seq = 1 AND "
                            "reason = 'INVALID_RECORD' AND detail LIKE '%sent alone%'"),
                     1);
    char q[160];
    snprintf(q, sizeof q, "SELECT message_id = '%s' FROM outbox_dead", bad_mid);
    assert_int_equal(scalar(q), 1);
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    for (int i = 0; i < 10; i++)
        append_row(100, NULL);
    assert_int_equal(oq_db_commit(db, &err), 0);
    assert_true(wait_watermark(11, 30));
    assert_int_equal(oq_relay_stop(r), 0);
    oq_relay_stats_t s;
    oq_relay_stats(r, &s);
    assert_int_equal(s.dead_letters, 1);
    assert_int_equal(s.published, 10);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_dead"), 1);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(oq_metrics_render(m, &text, &len), 0);
    assert_non_null(strstr(text, "onceq_relay_dead_letters_total{reason=\"INVALID_RECORD\"} 1"));
    free(text);
    oq_relay_destroy(r);
    oq_metrics_destroy(m);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

/* A retriable error keeps the rewind path: nothing is set aside, everything is delivered. */
static void test_transient_error_sets_nothing_aside(void **state)
{
    (void)state;
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk);
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    for (int i = 0; i < 20; i++)
        append_row(100, NULL);
    assert_int_equal(oq_db_commit(db, &err), 0);
    rd_kafka_mock_push_request_errors(
        mcl, PRODUCE_API, 3, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION);
    oq_relay_t *r = relay_start(rd_kafka_mock_cluster_bootstraps(mcl), NULL, NULL);
    assert_true(wait_watermark(20, 30));
    assert_int_equal(oq_relay_stop(r), 0);
    oq_relay_stats_t s;
    oq_relay_stats(r, &s);
    assert_int_equal(s.dead_letters, 0);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_dead"), 0);
    oq_relay_destroy(r);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

static void test_consumer_result_set_aside(void **state)
{
    (void)state;
    oq_error_t err = {0};
    rd_kafka_t *mrk = NULL;
    rd_kafka_mock_cluster_t *mcl = mock_up(&mrk);
    assert_int_equal(rd_kafka_mock_topic_create(mcl, "onceq.tool-results", 1, 1), 0);
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    for (int i = 0; i < 3; i++) {
        char mid[OQ_UUID_LEN + 1];
        oq_id_uuid(mid);
        size_t size = i == 1 ? 30000 : 100;
        char *payload = malloc(size);
        assert_non_null(payload);
        memset(payload, 'r', size);
        oq_outbox_row_t row = {.message_id = mid,
                               .topic = "onceq.tool-results",
                               .key = "c_0000000000000002",
                               .payload = payload,
                               .payload_len = size,
                               .created_at = oq_now_ms()};
        assert_int_equal(oq_outbox_append(db, NULL, &row, &err), 0);
        free(payload);
    }
    assert_int_equal(oq_db_commit(db, &err), 0);
    oq_config_t *cfg = oq_config_new(NULL, 0);
    assert_non_null(cfg);
    assert_int_equal(oq_config_set_kafka(cfg, "message.max.bytes", "20000", &err), 0);
    oq_metrics_t *m = oq_metrics_new();
    assert_non_null(m);
    oq_relay_opts_t o;
    oq_relay_opts_init(&o);
    o.db_path = path;
    o.brokers = rd_kafka_mock_cluster_bootstraps(mcl);
    o.owner = "consumer-worker";
    o.kafka_cfg = cfg;
    o.metrics = m;
    o.metrics_labels = "relay=\"results\"";
    oq_relay_t *r = oq_relay_new(&o, &err);
    assert_non_null(r);
    assert_int_equal(oq_relay_start(r, &err), 0);
    assert_true(wait_watermark(3, 30));
    assert_int_equal(oq_relay_stop(r), 0);
    assert_int_equal(scalar("SELECT count(*) FROM outbox_dead WHERE seq = 2 AND topic = "
                            "'onceq.tool-results' AND reason = 'MSG_SIZE_TOO_LARGE'"),
                     1);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(oq_metrics_render(m, &text, &len), 0);
    assert_non_null(strstr(
        text, "onceq_relay_dead_letters_total{relay=\"results\",reason=\"MSG_SIZE_TOO_LARGE\"} 1"));
    free(text);
    oq_relay_destroy(r);
    oq_metrics_destroy(m);
    oq_config_destroy(cfg);
    rd_kafka_mock_cluster_destroy(mcl);
    rd_kafka_destroy(mrk);
}

int main(void)
{
    oq_log_init(getenv("ONCEQ_TEST_LOG") ? OQ_LOG_DEBUG : OQ_LOG_OFF, OQ_LOG_FMT_LOGFMT, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_too_large_row_set_aside, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_refusal_sets_nothing_aside, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_alone_set_aside, setup, teardown),
        cmocka_unit_test_setup_teardown(test_transient_error_sets_nothing_aside, setup, teardown),
        cmocka_unit_test_setup_teardown(test_consumer_result_set_aside, setup_consumer, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
