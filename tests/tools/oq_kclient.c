/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_kclient: a small librdkafka command-line client for the integration tests and the broker
 * benchmark. Two modes:
 *
 *   oq_kclient produce --brokers B --topic T --count N [--key-prefix K] [--size BYTES]
 *                      [--timeout-ms MS] [-X prop=value]...
 *     Produces N messages (key K<i> when --key-prefix is given, else keyless; value "<i>"
 *     padded to BYTES), waits for every delivery report, prints one summary line with the
 *     rate. Exit 0 only if all N were delivered.
 *
 *   oq_kclient consume --brokers B --topic T --group G [--max N] [--timeout-ms MS] [--commit]
 *                      [--quiet] [-X prop=value]...
 *     Joins group G (auto.offset.reset=earliest), prints one line "PARTITION OFFSET KEY" per
 *     message (not with --quiet), and a line "# assignment P,P,..." ("-" when empty) after
 *     every rebalance, so scripts can read the current assignment from the last such line.
 *     Stops after N messages (0: no limit) or MS milliseconds or SIGTERM/SIGINT, then prints
 *     "# summary count=C partitions=P,P,... secs=S rate=R". With --commit the offsets of the
 *     printed messages (and only those) are committed synchronously before leaving the group,
 *     so a restarted consumer resumes right after them. Exit 0 when N was reached (or N is 0),
 *     3 when the time ran out first, 1 on errors, 2 on bad usage.
 *
 * A test tool, not library code: it writes to stdout/stderr directly and exits from main().
 * It deliberately keeps librdkafka's default partition.assignment.strategy (the mock cluster
 * aborts when one group mixes strategies).
 */
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#include "oq_log.h"

#define MAX_PARTITIONS 1024
#define MAX_PROPS 64

typedef struct {
    const char *mode, *brokers, *topic, *group, *key_prefix;
    long count, size, max, timeout_ms;
    int commit, quiet;
    const char *props[MAX_PROPS][2];
    int nprops;
} opts_t;

static volatile sig_atomic_t g_stop;
static long g_delivered, g_failed;
static rd_kafka_resp_err_t g_first_err;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: oq_kclient produce --brokers B --topic T --count N [--key-prefix K]\n"
        "                          [--size BYTES] [--timeout-ms MS] [-X prop=value]...\n"
        "       oq_kclient consume --brokers B --topic T --group G [--max N]\n"
        "                          [--timeout-ms MS] [--commit] [--quiet] [-X prop=value]...\n");
}

static int set_prop(rd_kafka_conf_t *conf, const char *k, const char *v)
{
    char errstr[256];
    if (rd_kafka_conf_set(conf, k, v, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK) {
        fprintf(stderr, "oq_kclient: %s=%s: %s\n", k, v, errstr);
        return -1;
    }
    return 0;
}

/* Conf: bootstrap + \p defaults (NULL-terminated name/value pairs), then the user's -X. */
static rd_kafka_conf_t *make_conf(const opts_t *o, const char *const *defaults)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set_log_cb(conf, oq_log_rdkafka_cb);
    if (set_prop(conf, "bootstrap.servers", o->brokers) ||
        set_prop(conf, "client.id", "oq_kclient"))
        goto fail;
    for (int i = 0; defaults && defaults[i]; i += 2)
        if (set_prop(conf, defaults[i], defaults[i + 1])) goto fail;
    for (int i = 0; i < o->nprops; i++)
        if (set_prop(conf, o->props[i][0], o->props[i][1])) goto fail;
    return conf;
fail:
    rd_kafka_conf_destroy(conf);
    return NULL;
}

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    (void)rk;
    (void)opaque;
    if (m->err) {
        if (!g_failed) g_first_err = m->err;
        g_failed++;
    } else {
        g_delivered++;
    }
}

static int do_produce(const opts_t *o)
{
    char errstr[512], key[128];
    int ret = 1;
    rd_kafka_conf_t *conf = make_conf(o, NULL);
    if (!conf) return 2;
    rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!rk) {
        fprintf(stderr, "oq_kclient: rd_kafka_new: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
        return 1;
    }
    char *val = malloc((size_t)o->size + 32);
    if (!val) goto out;
    memset(val, 'x', (size_t)o->size + 32);

    double t0 = now_s(), deadline = t0 + (double)o->timeout_ms / 1000.0;
    long i;
    for (i = 0; i < o->count && !g_stop; i++) {
        int vn = snprintf(val, 32, "%ld", i);
        val[vn] = o->size > vn ? 'x' : '\0';
        size_t vlen = (size_t)(o->size > vn ? o->size : vn);
        size_t klen = 0;
        if (o->key_prefix) klen = (size_t)snprintf(key, sizeof(key), "%s%ld", o->key_prefix, i);
        for (;;) {
            rd_kafka_resp_err_t e =
                rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(o->topic), RD_KAFKA_V_VALUE(val, vlen),
                                  RD_KAFKA_V_KEY(o->key_prefix ? key : NULL, klen),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
            if (!e) break;
            if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL || now_s() > deadline || g_stop) {
                fprintf(stderr, "oq_kclient: produce #%ld: %s\n", i, rd_kafka_err2str(e));
                goto flush;
            }
            rd_kafka_poll(rk, 10);
        }
        rd_kafka_poll(rk, 0);
    }
flush:;
    long produced = i;
    while (g_delivered + g_failed < produced && !g_stop && now_s() < deadline)
        rd_kafka_flush(rk, 100);
    double secs = now_s() - t0;
    printf("produced=%ld delivered=%ld failed=%ld size=%ld secs=%.3f rate=%.0f msgs/s "
           "%.1f MB/s%s%s\n",
           produced, g_delivered, g_failed, o->size, secs, secs > 0 ? g_delivered / secs : 0.0,
           secs > 0 ? (double)g_delivered * (double)o->size / secs / 1e6 : 0.0,
           g_failed ? " first_error=" : "", g_failed ? rd_kafka_err2name(g_first_err) : "");
    fflush(stdout);
    ret = (g_delivered == o->count) ? 0 : 1;
out:
    free(val);
    rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_destroy(rk);
    return ret;
}

/* Print the current assignment as "# assignment 0,1,2" ("-" if empty). */
static void print_assignment(rd_kafka_t *rk)
{
    rd_kafka_topic_partition_list_t *a = NULL;
    char line[8192];
    size_t n = 0;
    line[0] = '\0';
    if (rd_kafka_assignment(rk, &a) == RD_KAFKA_RESP_ERR_NO_ERROR && a) {
        /* sort by partition for stable output */
        rd_kafka_topic_partition_list_sort(a, NULL, NULL);
        for (int i = 0; i < a->cnt && n < sizeof(line) - 16; i++)
            n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%d", n ? "," : "",
                                  a->elems[i].partition);
    }
    printf("# assignment %s\n", n ? line : "-");
    fflush(stdout);
    if (a) rd_kafka_topic_partition_list_destroy(a);
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    const opts_t *o = opaque;
    int coop = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        if (coop) {
            rd_kafka_error_t *e = rd_kafka_incremental_assign(rk, parts);
            if (e) rd_kafka_error_destroy(e);
        } else {
            rd_kafka_assign(rk, parts);
        }
    } else {
        /* Best effort: the mock rejects commits during a rebalance. */
        if (o->commit) rd_kafka_commit(rk, NULL, 0);
        if (coop) {
            rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, parts);
            if (e) rd_kafka_error_destroy(e);
        } else {
            rd_kafka_assign(rk, NULL);
        }
    }
    print_assignment(rk);
}

static int do_consume(opts_t *o)
{
    char errstr[512];
    int ret = 1;
    static unsigned char seen[MAX_PARTITIONS];
    static const char *const defaults[] = {"auto.offset.reset",
                                           "earliest",
                                           "enable.auto.commit",
                                           "false",
                                           "enable.auto.offset.store",
                                           "false",
                                           "fetch.wait.max.ms",
                                           "10",
                                           NULL};
    char gid[512];
    snprintf(gid, sizeof(gid), "%s", o->group);
    rd_kafka_conf_t *conf = make_conf(o, defaults);
    if (!conf) return 2;
    if (set_prop(conf, "group.id", gid)) {
        rd_kafka_conf_destroy(conf);
        return 2;
    }
    rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
    rd_kafka_conf_set_opaque(conf, o);

    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
    if (!rk) {
        fprintf(stderr, "oq_kclient: rd_kafka_new: %s\n", errstr);
        rd_kafka_conf_destroy(conf);
        return 1;
    }
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, o->topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(rk, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    if (e) {
        fprintf(stderr, "oq_kclient: subscribe: %s\n", rd_kafka_err2str(e));
        goto out;
    }

    long count = 0;
    double t0 = now_s(), deadline = t0 + (double)o->timeout_ms / 1000.0, first = 0, last = 0;
    while (!g_stop && (o->max == 0 || count < o->max) && now_s() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (!m) continue;
        if (m->err) {
            if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                fprintf(stderr, "oq_kclient: consume: %s\n", rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            continue;
        }
        last = now_s();
        if (!count) first = last;
        count++;
        if (m->partition >= 0 && m->partition < MAX_PARTITIONS) seen[m->partition] = 1;
        if (!o->quiet)
            printf("%d %lld %.*s\n", (int)m->partition, (long long)m->offset,
                   m->key ? (int)m->key_len : 1, m->key ? (const char *)m->key : "-");
        if (o->commit) rd_kafka_offset_store(m->rkt, m->partition, m->offset);
        rd_kafka_message_destroy(m);
    }
    int reached = o->max == 0 || count >= o->max;
    if (o->commit && count) {
        e = rd_kafka_commit(rk, NULL, 0);
        if (e && e != RD_KAFKA_RESP_ERR__NO_OFFSET) {
            fprintf(stderr, "oq_kclient: commit: %s\n", rd_kafka_err2str(e));
            reached = -1;
        } else {
            printf("# committed\n");
        }
    }
    char parts[8192];
    size_t n = 0;
    for (int p = 0; p < MAX_PARTITIONS && n < sizeof(parts) - 16; p++)
        if (seen[p]) n += (size_t)snprintf(parts + n, sizeof(parts) - n, "%s%d", n ? "," : "", p);
    double secs = last - first;
    printf("# summary count=%ld partitions=%s secs=%.3f rate=%.0f\n", count, n ? parts : "-", secs,
           secs > 0 ? (double)(count - 1) / secs : 0.0);
    fflush(stdout);
    ret = reached < 0 ? 1 : reached ? 0 : 3;
out:
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return ret;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    opts_t o = {.count = 0, .size = 100, .max = 0, .timeout_ms = 30000};
    static const struct option lopts[] = {{"brokers", required_argument, 0, 'b'},
                                          {"topic", required_argument, 0, 't'},
                                          {"group", required_argument, 0, 'g'},
                                          {"count", required_argument, 0, 'n'},
                                          {"key-prefix", required_argument, 0, 'k'},
                                          {"size", required_argument, 0, 's'},
                                          {"max", required_argument, 0, 'm'},
                                          {"timeout-ms", required_argument, 0, 'T'},
                                          {"commit", no_argument, 0, 'c'},
                                          {"quiet", no_argument, 0, 'q'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;

    oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 1);
    if (argc < 2 || (strcmp(argv[1], "produce") != 0 && strcmp(argv[1], "consume") != 0)) {
        usage(argc >= 2 && strcmp(argv[1], "--help") == 0 ? stdout : stderr);
        return argc >= 2 && strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    o.mode = argv[1];
    optind = 2;
    while ((c = getopt_long(argc, argv, "b:t:g:X:h", lopts, NULL)) != -1) {
        switch (c) {
        case 'b':
            o.brokers = optarg;
            break;
        case 't':
            o.topic = optarg;
            break;
        case 'g':
            o.group = optarg;
            break;
        case 'k':
            o.key_prefix = optarg;
            break;
        case 'c':
            o.commit = 1;
            break;
        case 'q':
            o.quiet = 1;
            break;
        case 'n':
            if (parse_long(optarg, 1, 100000000, &o.count)) goto bad;
            break;
        case 's':
            if (parse_long(optarg, 0, 10 * 1024 * 1024, &o.size)) goto bad;
            break;
        case 'm':
            if (parse_long(optarg, 0, 100000000, &o.max)) goto bad;
            break;
        case 'T':
            if (parse_long(optarg, 1, 3600000, &o.timeout_ms)) goto bad;
            break;
        case 'X': {
            char *eq = strchr(optarg, '=');
            if (!eq || o.nprops >= MAX_PROPS) goto bad;
            *eq = '\0';
            o.props[o.nprops][0] = optarg;
            o.props[o.nprops][1] = eq + 1;
            o.nprops++;
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            goto bad;
        }
    }
    if (optind != argc || !o.brokers || !o.topic) goto bad;
    if (strcmp(o.mode, "produce") == 0 && o.count <= 0) goto bad;
    if (strcmp(o.mode, "consume") == 0 && !o.group) goto bad;

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    return strcmp(o.mode, "produce") == 0 ? do_produce(&o) : do_consume(&o);
bad:
    usage(stderr);
    return 2;
}
