/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_consumer_feed: produces tool_call envelopes straight into onceq.tool-calls, the way the
 * producer's relay would (key = call_id, header onceq-message-id), for the consumer tests and
 * the consumer benchmark.
 *
 *   oq_consumer_feed --brokers B [--topic T] [--n N] [--tool NAME] [--args JSON] [--mix]
 *                    [--repeat R] [--poison P] [--save FILE] [--replay FILE] [--tenant T]
 *                    [-X prop=value]...
 *
 *   --n N        N new calls (unique call_id, idem_key, message_id) with --tool/--args
 *                (default charge {"amount":5}); --mix cycles charge, send_email, sleep 1 ms
 *                and fail {retryable:false}.
 *   --repeat R   produce every message R extra times (same bytes and message id).
 *   --poison P   also P poison messages: alternately garbage bytes and a JSON envelope with a
 *                missing field, interleaved with the calls.
 *   --save FILE  append every produced call as one line "call_id<TAB>envelope" to FILE.
 *   --replay F   re-produce the envelopes saved in F (R+1 times with --repeat R) instead.
 * Waits for every delivery report; prints "produced=N calls=C poison=P"; exit 0 only if all
 * were delivered. A test tool: prints and exits directly.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "oq_envelope.h"
#include "oq_json.h"
#include "oq_util.h"

static long g_delivered, g_failed;

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    if (m->err) {
        g_failed++;
        fprintf(stderr, "delivery failed: %s\n", rd_kafka_err2str(m->err));
    } else {
        g_delivered++;
    }
}

static int produce(rd_kafka_t *rk, const char *topic, const char *key, const char *mid,
                   const char *payload, size_t len)
{
    for (int tries = 0; tries < 1000; tries++) {
        rd_kafka_resp_err_t e = rd_kafka_producev(
            rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
            RD_KAFKA_V_KEY(key, key ? strlen(key) : 0), RD_KAFKA_V_VALUE((void *)payload, len),
            RD_KAFKA_V_HEADER(OQ_HDR_MESSAGE_ID, mid, (mid ? -1 : 0)), RD_KAFKA_V_END);
        if (!e) return 0;
        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            fprintf(stderr, "produce: %s\n", rd_kafka_err2str(e));
            return -1;
        }
        rd_kafka_poll(rk, 10);
    }
    return -1;
}

int main(int argc, char **argv)
{
    const char *brokers = NULL, *topic = OQ_TOPIC_CALLS, *tool = "charge",
               *args_s = "{\"amount\":5}", *save = NULL, *replay = NULL, *tenant = "t1";
    long n = 0, repeat = 0, poison = 0;
    int mix = 0;
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    static const struct option lo[] = {
        {"brokers", 1, 0, 'b'}, {"topic", 1, 0, 't'},  {"n", 1, 0, 'n'},      {"tool", 1, 0, 'T'},
        {"args", 1, 0, 'a'},    {"mix", 0, 0, 'm'},    {"repeat", 1, 0, 'r'}, {"poison", 1, 0, 'p'},
        {"save", 1, 0, 's'},    {"replay", 1, 0, 'R'}, {"tenant", 1, 0, 'e'}, {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "X:", lo, NULL)) != -1) {
        switch (ch) {
        case 'b':
            brokers = optarg;
            break;
        case 't':
            topic = optarg;
            break;
        case 'n':
            n = atol(optarg);
            break;
        case 'T':
            tool = optarg;
            break;
        case 'a':
            args_s = optarg;
            break;
        case 'm':
            mix = 1;
            break;
        case 'r':
            repeat = atol(optarg);
            break;
        case 'p':
            poison = atol(optarg);
            break;
        case 's':
            save = optarg;
            break;
        case 'R':
            replay = optarg;
            break;
        case 'e':
            tenant = optarg;
            break;
        case 'X': {
            char *eq = strchr(optarg, '=');
            if (!eq) return 2;
            *eq = '\0';
            if (rd_kafka_conf_set(conf, optarg, eq + 1, errstr, sizeof(errstr))) {
                fprintf(stderr, "%s\n", errstr);
                return 2;
            }
            break;
        }
        default:
            fprintf(stderr, "usage: see the comment atop tests/tools/oq_consumer_feed.c\n");
            return 2;
        }
    }
    if (!brokers) {
        fprintf(stderr, "--brokers is required\n");
        return 2;
    }
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers, errstr, sizeof(errstr));
    rd_kafka_conf_set(conf, "linger.ms", "5", errstr, sizeof(errstr));
    rd_kafka_conf_set(conf, "queue.buffering.max.messages", "500000", errstr, sizeof(errstr));
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!rk) {
        fprintf(stderr, "producer: %s\n", errstr);
        return 1;
    }
    long produced = 0, calls = 0, npoison = 0;
    int rc = 0;
    if (replay) {
        FILE *f = fopen(replay, "r");
        if (!f) {
            perror(replay);
            return 1;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        while ((len = getline(&line, &cap, f)) > 0) {
            if (line[len - 1] == '\n') line[--len] = '\0';
            char *tab = strchr(line, '\t');
            if (!tab) continue;
            *tab = '\0';
            const char *payload = tab + 1;
            json_t *j = json_loads(payload, 0, NULL);
            const char *mid = j ? json_string_value(json_object_get(j, "message_id")) : NULL;
            for (long r = 0; r <= repeat && rc == 0; r++) {
                rc = produce(rk, topic, line, mid, payload, strlen(payload));
                produced++;
            }
            json_decref(j);
            calls++;
            rd_kafka_poll(rk, 0);
        }
        free(line);
        fclose(f);
    } else {
        FILE *sf = save ? fopen(save, "a") : NULL;
        if (save && !sf) {
            perror(save);
            return 1;
        }
        long every = poison > 0 ? (n / poison > 0 ? n / poison : 1) : 0;
        for (long i = 0; i < n && rc == 0; i++) {
            oq_envelope_t e;
            oq_error_t err = {0};
            char key[64];
            memset(&e, 0, sizeof(e));
            e.v = 1;
            e.kind = OQ_KIND_TOOL_CALL;
            oq_id_uuid(e.message_id);
            oq_id_call(e.call_id);
            snprintf(key, sizeof(key), "k-%.16s", e.call_id + 2);
            e.tenant = (char *)tenant;
            e.idem_key = key;
            const char *t = tool, *a = args_s;
            if (mix) {
                static const char *const tools[][2] = {
                    {"charge", "{\"amount\":5}"},
                    {"send_email", "{\"to\":\"u@example.com\",\"subject\":\"hi\"}"},
                    {"sleep", "{\"ms\":1}"},
                    {"fail", "{\"retryable\":false}"}};
                t = tools[i % 4][0];
                a = tools[i % 4][1];
            }
            e.tool = (char *)t;
            e.args = json_loads(a, 0, NULL);
            e.attempt = 1;
            e.created_at = oq_now_ms();
            char *payload = NULL;
            size_t len = 0;
            if (!e.args || oq_fingerprint(e.tenant, e.tool, e.args, e.fingerprint, &err) ||
                oq_envelope_encode(&e, &payload, &len, &err)) {
                fprintf(stderr, "encode: %s\n", err.msg);
                return 2;
            }
            for (long r = 0; r <= repeat && rc == 0; r++) {
                rc = produce(rk, topic, e.call_id, e.message_id, payload, len);
                produced++;
            }
            if (sf) fprintf(sf, "%s\t%s\n", e.call_id, payload);
            calls++;
            free(payload);
            json_decref(e.args);
            if (every && i % every == every / 2 && npoison < poison) {
                char garbage[64];
                snprintf(garbage, sizeof(garbage), "\x01not json %ld", i);
                const char *bad = (npoison % 2 == 0)
                                      ? garbage
                                      : "{\"v\":1,\"kind\":\"tool_call\",\"tool\":\"charge\"}";
                rc = produce(rk, topic, "poison", NULL, bad, strlen(bad));
                produced++;
                npoison++;
            }
            rd_kafka_poll(rk, 0);
        }
        if (sf) fclose(sf);
    }
    rd_kafka_flush(rk, 30000);
    rd_kafka_destroy(rk);
    printf("produced=%ld calls=%ld poison=%ld delivered=%ld failed=%ld\n", produced, calls, npoison,
           g_delivered, g_failed);
    return (rc == 0 && g_delivered == produced && g_failed == 0) ? 0 : 1;
}
