/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_group_rewind: rewind a consumer group's committed offsets on one topic to the start of
 * every partition (its low watermark), as an operator's "reset offsets to earliest" would. Every
 * message still in the topic is then delivered to the group again, and the consumers' inbox
 * must absorb all of it (a chaos scenario of the duplicate-delivery class).
 *
 *   oq_group_rewind --brokers B --group G --topic T [--timeout-ms 30000]
 *                   [--session-timeout-ms MS]
 *
 * The group's members should be stopped first. The tool joins the group as its only member
 * (brokers, the mock cluster among them, refuse offset commits from outside a group they know),
 * waits until it is assigned every partition, commits the low watermarks and leaves. Prints
 * "partitions=N" and the offsets committed. Exit 0 when the commit succeeded for every partition, 1
 * otherwise, 2 on bad usage. A test tool: writes to stdout/stderr and exits from main().
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

static int set(rd_kafka_conf_t *conf, const char *k, const char *v)
{
    char errstr[256];
    if (rd_kafka_conf_set(conf, k, v, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
        fprintf(stderr, "%s: %s\n", k, errstr);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *brokers = NULL, *group = NULL, *topic = NULL;
    const char *session_ms = NULL;
    int timeout_ms = 30000, rc = 1;
    static const struct option opts[] = {{"brokers", required_argument, NULL, 'b'},
                                         {"group", required_argument, NULL, 'g'},
                                         {"topic", required_argument, NULL, 't'},
                                         {"timeout-ms", required_argument, NULL, 'T'},
                                         {"session-timeout-ms", required_argument, NULL, 'S'},
                                         {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'b':
            brokers = optarg;
            break;
        case 'g':
            group = optarg;
            break;
        case 't':
            topic = optarg;
            break;
        case 'T':
            timeout_ms = atoi(optarg);
            break;
        case 'S':
            session_ms = optarg;
            break;
        default:
            return 2;
        }
    }
    if (!brokers || !group || !topic || timeout_ms <= 0 || optind != argc) {
        fprintf(stderr, "usage: oq_group_rewind --brokers B --group G --topic T "
                        "[--timeout-ms MS] [--session-timeout-ms MS]\n");
        return 2;
    }
    char errstr[512];
    rd_kafka_t *c = NULL;
    rd_kafka_topic_t *rkt = NULL;
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_topic_partition_list_t *offs = NULL;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (set(conf, "bootstrap.servers", brokers) || set(conf, "group.id", group) ||
        set(conf, "enable.auto.commit", "false") ||
        (session_ms && set(conf, "session.timeout.ms", session_ms))) {
        rd_kafka_conf_destroy(conf);
        return 2;
    }
    c = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    if (!c) {
        fprintf(stderr, "consumer: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
        return 1;
    }
    rkt = rd_kafka_topic_new(c, topic, NULL);
    if (rd_kafka_metadata(c, 0, rkt, &md, timeout_ms) != RD_KAFKA_RESP_ERR_NO_ERROR ||
        md->topic_cnt != 1 || md->topics[0].partition_cnt <= 0) {
        fprintf(stderr, "no metadata for %s\n", topic);
        goto out;
    }
    int np = md->topics[0].partition_cnt;
    offs = rd_kafka_topic_partition_list_new(np);
    for (int p = 0; p < np; p++) {
        int64_t lo = 0, hi = 0;
        rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(c, topic, p, &lo, &hi, timeout_ms);
        if (e) {
            fprintf(stderr, "watermarks of partition %d: %s\n", p, rd_kafka_err2str(e));
            goto out;
        }
        rd_kafka_topic_partition_list_add(offs, topic, p)->offset = lo;
    }
    /* Join: subscribe, poll until every partition is assigned to us (bounded). */
    rd_kafka_poll_set_consumer(c);
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t se = rd_kafka_subscribe(c, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    if (se) {
        fprintf(stderr, "subscribe: %s\n", rd_kafka_err2str(se));
        goto out;
    }
    int assigned = 0;
    for (int waited = 0; waited < timeout_ms && assigned < np; waited += 100) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
        if (m) rd_kafka_message_destroy(m); /* messages are not consumed: offsets stay ours */
        rd_kafka_topic_partition_list_t *as = NULL;
        if (rd_kafka_assignment(c, &as) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            assigned = as->cnt;
            rd_kafka_topic_partition_list_destroy(as);
        }
    }
    if (assigned < np) {
        fprintf(stderr, "assigned %d of %d partitions within %d ms (other members alive?)\n",
                assigned, np, timeout_ms);
        goto out;
    }
    rd_kafka_resp_err_t e = rd_kafka_commit(c, offs, 0);
    if (e) {
        fprintf(stderr, "commit: %s\n", rd_kafka_err2str(e));
        goto out;
    }
    rc = 0;
    for (int i = 0; i < offs->cnt; i++) {
        if (offs->elems[i].err) {
            fprintf(stderr, "partition %d: %s\n", offs->elems[i].partition,
                    rd_kafka_err2str(offs->elems[i].err));
            rc = 1;
        }
    }
    printf("partitions=%d", np);
    for (int i = 0; i < offs->cnt; i++)
        printf(" %d:%lld", offs->elems[i].partition, (long long)offs->elems[i].offset);
    printf("\n");
out:
    if (offs) rd_kafka_topic_partition_list_destroy(offs);
    if (md) rd_kafka_metadata_destroy(md);
    if (rkt) rd_kafka_topic_destroy(rkt);
    if (c) {
        rd_kafka_consumer_close(c);
        rd_kafka_destroy(c);
    }
    return rc;
}
