/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_e2e_dup: duplicate injection from outside the pipeline. Reads every message currently in
 * a topic (all partitions, from the low to the high watermark, by assign() under a throwaway
 * group id that never joins, so no consumer group is disturbed) and produces each one again --times
 * times, byte for byte: same key (hence same partition), same value (hence same envelope
 * message_id), same headers. This is what a misbehaving upstream, a mirror or an operator replaying
 * a topic would do; the consumer's inbox must absorb all of it.
 *
 *   oq_e2e_dup --brokers B --topic T [--times 3] [--timeout-ms 30000]
 *
 * Prints "read=N produced=M". Exit 0 when everything read was re-produced and delivered,
 * 1 otherwise, 2 on bad usage. A test tool: writes to stdout/stderr and exits from main().
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "oq_log.h"
#include "oq_util.h"

typedef struct {
    void *key, *val;
    size_t klen, vlen;
    rd_kafka_headers_t *hdrs;
} dup_msg_t;

static int dup_delivered, dup_failed;

static void dup_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    if (m->err)
        dup_failed++;
    else
        dup_delivered++;
}

int main(int argc, char **argv)
{
    oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 1);
    const char *brokers = NULL, *topic = NULL;
    int times = 3, timeout_ms = 30000;
    static const struct option opts[] = {{"brokers", required_argument, NULL, 'b'},
                                         {"topic", required_argument, NULL, 't'},
                                         {"times", required_argument, NULL, 'n'},
                                         {"timeout-ms", required_argument, NULL, 'T'},
                                         {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'b':
            brokers = optarg;
            break;
        case 't':
            topic = optarg;
            break;
        case 'n':
            times = atoi(optarg);
            break;
        case 'T':
            timeout_ms = atoi(optarg);
            break;
        default:
            return 2;
        }
    }
    if (!brokers || !topic || times < 1 || optind != argc) {
        fprintf(stderr, "usage: oq_e2e_dup --brokers B --topic T [--times N] [--timeout-ms MS]\n");
        return 2;
    }
    char errstr[512];
    rd_kafka_conf_t *cc = rd_kafka_conf_new();
    rd_kafka_conf_set(cc, "bootstrap.servers", brokers, errstr, sizeof errstr);
    rd_kafka_conf_set(cc, "enable.partition.eof", "true", errstr, sizeof errstr);
    /* consumer_poll needs a group.id; assign() never joins it, and nothing is committed. */
    char gid[64];
    snprintf(gid, sizeof gid, "oq-e2e-dup-%lld", (long long)oq_now_ms());
    rd_kafka_conf_set(cc, "group.id", gid, errstr, sizeof errstr);
    rd_kafka_conf_set(cc, "enable.auto.commit", "false", errstr, sizeof errstr);
    rd_kafka_conf_set(cc, "fetch.wait.max.ms", "10", errstr, sizeof errstr);
    rd_kafka_t *c = rd_kafka_new(RD_KAFKA_CONSUMER, cc, errstr, sizeof errstr);
    if (!c) {
        fprintf(stderr, "consumer: %s\n", errstr);
        return 1;
    }
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(c, topic, NULL);
    const rd_kafka_metadata_t *md = NULL;
    if (rd_kafka_metadata(c, 0, rkt, &md, 10000) != RD_KAFKA_RESP_ERR_NO_ERROR ||
        md->topic_cnt != 1 || md->topics[0].partition_cnt <= 0) {
        fprintf(stderr, "no metadata for %s\n", topic);
        return 1;
    }
    int np = md->topics[0].partition_cnt;
    rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);

    rd_kafka_topic_partition_list_t *as = rd_kafka_topic_partition_list_new(np);
    int64_t *hi = calloc((size_t)np, sizeof *hi);
    char *done = calloc((size_t)np, 1);
    if (!hi || !done) return 1;
    int open = 0;
    for (int p = 0; p < np; p++) {
        int64_t l = 0, h = 0;
        if (rd_kafka_query_watermark_offsets(c, topic, p, &l, &h, 10000)) {
            fprintf(stderr, "watermarks of partition %d failed\n", p);
            return 1;
        }
        hi[p] = h;
        if (h > l) {
            rd_kafka_topic_partition_list_add(as, topic, p)->offset = l;
            open++;
        }
    }
    rd_kafka_assign(c, as);
    rd_kafka_topic_partition_list_destroy(as);

    dup_msg_t *msgs = NULL;
    size_t n = 0, cap = 0;
    int64_t deadline = oq_mono_us() + (int64_t)timeout_ms * 1000;
    while (open > 0 && oq_mono_us() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (!m) continue;
        int part = m->partition;
        if (part < 0 || part >= np) {
            rd_kafka_message_destroy(m);
            continue;
        }
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            if (m->offset >= hi[part] && !done[part]) {
                done[part] = 1;
                open--;
            }
        } else if (!m->err && m->offset < hi[part]) {
            if (n == cap) {
                cap = cap ? cap * 2 : 1024;
                msgs = realloc(msgs, cap * sizeof *msgs);
                if (!msgs) return 1;
            }
            dup_msg_t *d = &msgs[n++];
            memset(d, 0, sizeof *d);
            d->klen = m->key_len;
            d->vlen = m->len;
            d->key = malloc(d->klen + 1);
            d->val = malloc(d->vlen + 1);
            if (m->key_len) memcpy(d->key, m->key, m->key_len);
            if (m->len) memcpy(d->val, m->payload, m->len);
            rd_kafka_headers_t *h = NULL;
            if (rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR && h)
                d->hdrs = rd_kafka_headers_copy(h);
            if (m->offset + 1 >= hi[part] && !done[part]) {
                done[part] = 1;
                open--;
            }
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    if (open > 0) {
        fprintf(stderr, "timed out reading %s (%d partitions not finished)\n", topic, open);
        return 1;
    }

    rd_kafka_conf_t *pc = rd_kafka_conf_new();
    rd_kafka_conf_set(pc, "bootstrap.servers", brokers, errstr, sizeof errstr);
    rd_kafka_conf_set(pc, "linger.ms", "5", errstr, sizeof errstr);
    rd_kafka_conf_set_dr_msg_cb(pc, dup_dr);
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, pc, errstr, sizeof errstr);
    if (!p) {
        fprintf(stderr, "producer: %s\n", errstr);
        return 1;
    }
    int produced = 0;
    for (int r = 0; r < times; r++) {
        for (size_t i = 0; i < n; i++) {
            rd_kafka_headers_t *h = msgs[i].hdrs ? rd_kafka_headers_copy(msgs[i].hdrs) : NULL;
            rd_kafka_resp_err_t e;
            do {
                e = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic),
                                      RD_KAFKA_V_KEY(msgs[i].key, msgs[i].klen),
                                      RD_KAFKA_V_VALUE(msgs[i].val, msgs[i].vlen),
                                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                      RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
                if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) rd_kafka_poll(p, 50);
            } while (e == RD_KAFKA_RESP_ERR__QUEUE_FULL);
            if (e) {
                if (h) rd_kafka_headers_destroy(h);
                dup_failed++;
            } else {
                produced++;
            }
            rd_kafka_poll(p, 0);
        }
    }
    rd_kafka_flush(p, timeout_ms);
    rd_kafka_destroy(p);
    printf("read=%zu produced=%d delivered=%d failed=%d\n", n, produced, dup_delivered, dup_failed);
    for (size_t i = 0; i < n; i++) {
        free(msgs[i].key);
        free(msgs[i].val);
        if (msgs[i].hdrs) rd_kafka_headers_destroy(msgs[i].hdrs);
    }
    free(msgs);
    free(hi);
    free(done);
    return (dup_failed == 0 && dup_delivered == produced && n > 0) ? 0 : 1;
}
