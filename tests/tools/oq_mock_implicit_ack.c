/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_mock_implicit_ack: shows the embedded broker's Produce-error loss (docs/BROKER-NOTES.md).
 *
 * librdkafka 2.0.2's mock cluster does not check an idempotent producer's sequence numbers
 * unless the producer is transactional, and it stores nothing for a Produce request it
 * answers with an injected error. With more than one request in flight per partition, the
 * request behind the failed one is stored and acknowledged; the client then treats the failed
 * request's messages as "implicitly acked" by that later success and reports them delivered,
 * although they were never written. With max.in.flight=1 no later request can overtake a
 * failed one, and nothing is lost.
 *
 * Each run: an in-process mock cluster (3 brokers, one topic of 6 partitions), a producer with
 * the settings the relay uses (relay/relay.c: idempotence, acks=all, linger.ms=1, no message
 * timeout, gapless guarantee, Nagle off) plus max.in.flight, keyed messages at --rate, and
 * --errors Produce errors pushed on the cluster half way. After the flush a consumer reads
 * every partition to its end; a message reported delivered but absent is LOST. The producer's
 * "implicitly acked" debug lines are counted as the mechanism's fingerprint.
 *
 *   oq_mock_implicit_ack [--runs R] [--messages N] [--rate MSGS_PER_S] [--max-in-flight K]
 *                        [--errors C] [--error NAME] [--require-no-loss]
 *
 * Output: one line per run and a summary, `name=value` words. Exit status: 0; 1 with
 * --require-no-loss when a message was lost, or on a setup failure; 2 on bad usage. The loss
 * is probabilistic (a race between in-flight requests): only its absence is deterministic.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define TOPIC "t"
#define PARTITIONS 6
#define BROKERS 3

typedef struct opts {
    int runs, messages, rate, errors;
    const char *max_in_flight;
    rd_kafka_resp_err_t error;
    int require_no_loss;
} opts_t;

/* Per run: delivery state per message (0 none, 1 ok, 2 error) and times seen in the topic. */
typedef struct run {
    unsigned char *dr;
    int *seen;
    int implicit_acks;
} run_t;

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    run_t *r = opaque;
    (void)rk;
    r->dr[(intptr_t)m->_private] = m->err ? 2 : 1;
}

static void on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)level;
    (void)fac;
    run_t *r = rd_kafka_opaque(rk);
    if (r && strstr(buf, "implicitly acked")) r->implicit_acks++;
}

static int set(rd_kafka_conf_t *c, const char *k, const char *v)
{
    char es[256];
    if (rd_kafka_conf_set(c, k, v, es, sizeof es) == RD_KAFKA_CONF_OK) return 0;
    fprintf(stderr, "oq_mock_implicit_ack: %s=%s: %s\n", k, v, es);
    return -1;
}

/* Produces o->messages keyed messages through \p bootstrap, pushing the errors half way. */
static int produce(const opts_t *o, rd_kafka_mock_cluster_t *mc, const char *bootstrap, run_t *r)
{
    char es[256];
    int ret = -1;
    rd_kafka_t *p = NULL;
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    /* the relay's settings (relay/relay.c), then the one under test */
    if (set(c, "bootstrap.servers", bootstrap) || set(c, "enable.idempotence", "true") ||
        set(c, "acks", "all") || set(c, "linger.ms", "1") || set(c, "message.timeout.ms", "0") ||
        set(c, "enable.gapless.guarantee", "true") || set(c, "socket.nagle.disable", "true") ||
        set(c, "max.in.flight", o->max_in_flight) || set(c, "debug", "eos,msg") ||
        set(c, "log_level", "7")) {
        rd_kafka_conf_destroy(c);
        return -1;
    }
    rd_kafka_conf_set_dr_msg_cb(c, on_delivery);
    rd_kafka_conf_set_log_cb(c, on_log);
    rd_kafka_conf_set_opaque(c, r);
    if (!(p = rd_kafka_new(RD_KAFKA_PRODUCER, c, es, sizeof es))) {
        fprintf(stderr, "oq_mock_implicit_ack: producer: %s\n", es);
        goto out;
    }
    int64_t t0 = mono_us();
    for (int i = 0; i < o->messages; i++) {
        char key[24], val[24];
        if (i == o->messages / 2) {
            rd_kafka_resp_err_t errs[64];
            int n = o->errors < 64 ? o->errors : 64;
            for (int k = 0; k < n; k++)
                errs[k] = o->error;
            rd_kafka_mock_push_request_errors_array(mc, 0 /* Produce */, (size_t)n, errs);
        }
        while (o->rate > 0 && mono_us() < t0 + (int64_t)i * 1000000 / o->rate)
            rd_kafka_poll(p, 1);
        snprintf(key, sizeof key, "k%d", i);
        snprintf(val, sizeof val, "%d", i);
        rd_kafka_resp_err_t e;
        while ((e = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(TOPIC), RD_KAFKA_V_KEY(key, strlen(key)),
                                      RD_KAFKA_V_VALUE(val, strlen(val)),
                                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                      RD_KAFKA_V_OPAQUE((void *)(intptr_t)i), RD_KAFKA_V_END)) ==
               RD_KAFKA_RESP_ERR__QUEUE_FULL)
            rd_kafka_poll(p, 10);
        if (e) {
            fprintf(stderr, "oq_mock_implicit_ack: produce: %s\n", rd_kafka_err2str(e));
            goto out;
        }
        rd_kafka_poll(p, 0);
    }
    if (rd_kafka_flush(p, 60000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "oq_mock_implicit_ack: flush timed out\n");
        goto out;
    }
    ret = 0;
out:
    if (p) rd_kafka_destroy(p);
    return ret;
}

/* Reads every partition from the beginning to its end into r->seen. */
static int read_back(const opts_t *o, const char *bootstrap, run_t *r)
{
    char es[256];
    int ret = -1, eofs = 0;
    rd_kafka_t *k = NULL;
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    if (set(c, "bootstrap.servers", bootstrap) || set(c, "group.id", "oq-mock-implicit-ack") ||
        set(c, "enable.partition.eof", "true") || set(c, "enable.auto.commit", "false")) {
        rd_kafka_conf_destroy(c);
        return -1;
    }
    if (!(k = rd_kafka_new(RD_KAFKA_CONSUMER, c, es, sizeof es))) {
        fprintf(stderr, "oq_mock_implicit_ack: consumer: %s\n", es);
        goto out;
    }
    rd_kafka_topic_partition_list_t *tl = rd_kafka_topic_partition_list_new(PARTITIONS);
    for (int i = 0; i < PARTITIONS; i++)
        rd_kafka_topic_partition_list_add(tl, TOPIC, i)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(k, tl);
    rd_kafka_topic_partition_list_destroy(tl);
    for (int64_t end = mono_us() + 30000000; eofs < PARTITIONS && mono_us() < end;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(k, 100);
        if (!m) continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            eofs++;
        } else if (!m->err && m->len > 0 && m->len < 24) {
            char v[24];
            memcpy(v, m->payload, m->len);
            v[m->len] = '\0';
            int i = atoi(v);
            if (i >= 0 && i < o->messages) r->seen[i]++;
        }
        rd_kafka_message_destroy(m);
    }
    if (eofs < PARTITIONS)
        fprintf(stderr, "oq_mock_implicit_ack: only %d of %d partitions read to the end\n", eofs,
                PARTITIONS);
    else
        ret = 0;
    rd_kafka_consumer_close(k);
out:
    if (k) rd_kafka_destroy(k);
    return ret;
}

/* One run; *lost, *drerr, *dup receive its counts (r->implicit_acks the debug lines). */
static int one_run(const opts_t *o, run_t *r, int *lost, int *drerr, int *dup)
{
    char es[256];
    int ret = -1;
    rd_kafka_mock_cluster_t *mc = NULL;
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    memset(r->dr, 0, (size_t)o->messages);
    memset(r->seen, 0, sizeof(int) * (size_t)o->messages);
    r->implicit_acks = 0;
    set(c, "log_level", "0");
    rd_kafka_t *host = rd_kafka_new(RD_KAFKA_PRODUCER, c, es, sizeof es);
    if (!host) {
        fprintf(stderr, "oq_mock_implicit_ack: mock host: %s\n", es);
        return -1;
    }
    if (!(mc = rd_kafka_mock_cluster_new(host, BROKERS)) ||
        rd_kafka_mock_topic_create(mc, TOPIC, PARTITIONS, BROKERS) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "oq_mock_implicit_ack: mock cluster failed\n");
        goto out;
    }
    const char *bootstrap = rd_kafka_mock_cluster_bootstraps(mc);
    if (produce(o, mc, bootstrap, r) != 0 || read_back(o, bootstrap, r) != 0) goto out;
    *lost = *drerr = *dup = 0;
    for (int i = 0; i < o->messages; i++) {
        *lost += r->dr[i] == 1 && r->seen[i] == 0;
        *drerr += r->dr[i] == 2;
        *dup += r->seen[i] > 1 ? r->seen[i] - 1 : 0;
    }
    ret = 0;
out:
    if (mc) rd_kafka_mock_cluster_destroy(mc);
    rd_kafka_destroy(host);
    return ret;
}

static void usage(void)
{
    fprintf(stderr, "usage: oq_mock_implicit_ack [--runs R] [--messages N] [--rate MSGS_PER_S]\n"
                    "       [--max-in-flight K] [--errors C] [--error NAME] [--require-no-loss]\n");
}

static int error_by_name(const char *name, rd_kafka_resp_err_t *out)
{
    const struct rd_kafka_err_desc *d;
    size_t n;
    rd_kafka_get_err_descs(&d, &n);
    for (size_t i = 0; i < n; i++)
        if (d[i].name && strcmp(d[i].name, name) == 0) {
            *out = d[i].code;
            return 0;
        }
    return -1;
}

int main(int argc, char **argv)
{
    opts_t o = {.runs = 5,
                .messages = 2000,
                .rate = 2000,
                .errors = 5,
                .max_in_flight = "5",
                .error = RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION};
    static const struct option longopts[] = {{"runs", required_argument, NULL, 'R'},
                                             {"messages", required_argument, NULL, 'n'},
                                             {"rate", required_argument, NULL, 'r'},
                                             {"max-in-flight", required_argument, NULL, 'k'},
                                             {"errors", required_argument, NULL, 'c'},
                                             {"error", required_argument, NULL, 'e'},
                                             {"require-no-loss", no_argument, NULL, 'z'},
                                             {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (ch) {
        case 'R':
            o.runs = atoi(optarg);
            break;
        case 'n':
            o.messages = atoi(optarg);
            break;
        case 'r':
            o.rate = atoi(optarg);
            break;
        case 'k':
            o.max_in_flight = optarg;
            break;
        case 'c':
            o.errors = atoi(optarg);
            break;
        case 'e':
            if (error_by_name(optarg, &o.error) != 0) {
                fprintf(stderr, "oq_mock_implicit_ack: unknown error name %s\n", optarg);
                return 2;
            }
            break;
        case 'z':
            o.require_no_loss = 1;
            break;
        default:
            usage();
            return 2;
        }
    }
    if (optind != argc || o.runs < 1 || o.messages < 2 || o.rate < 0 || o.errors < 1 ||
        atoi(o.max_in_flight) < 1) {
        usage();
        return 2;
    }
    run_t r = {calloc((size_t)o.messages, 1), calloc((size_t)o.messages, sizeof(int)), 0};
    int runs_lost = 0, lost_total = 0, iack_total = 0, drerr_total = 0, dup_total = 0, rc = 0;
    if (!r.dr || !r.seen) {
        fprintf(stderr, "oq_mock_implicit_ack: out of memory\n");
        rc = 1;
        goto out;
    }
    for (int i = 0; i < o.runs; i++) {
        int lost = 0, drerr = 0, dup = 0;
        if (one_run(&o, &r, &lost, &drerr, &dup) != 0) {
            rc = 1;
            goto out;
        }
        printf("run=%d max_in_flight=%s lost=%d delivery_errors=%d duplicates=%d "
               "implicit_acks=%d\n",
               i, o.max_in_flight, lost, drerr, dup, r.implicit_acks);
        fflush(stdout);
        runs_lost += lost > 0;
        lost_total += lost;
        iack_total += r.implicit_acks;
        drerr_total += drerr;
        dup_total += dup;
    }
    printf("summary max_in_flight=%s runs=%d runs_with_loss=%d lost=%d implicit_acks=%d "
           "delivery_errors=%d duplicates=%d\n",
           o.max_in_flight, o.runs, runs_lost, lost_total, iack_total, drerr_total, dup_total);
    if (o.require_no_loss && lost_total > 0) rc = 1;
out:
    free(r.dr);
    free(r.seen);
    return rc;
}
