/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq topics create|describe|delete`: administration of onceq's Kafka topics through
 * librdkafka's admin API, for a real cluster (the embedded mock broker has no admin API and
 * creates its topics itself).
 *
 * create sends one CreateTopics request for every named topic (default: the three onceq
 * topics) with --partitions, --replication-factor and the topic configs min.insync.replicas
 * and retention.ms, then waits until the metadata of every broker (each asked on its own:
 * brokers apply the cluster's metadata each at its own pace) shows every partition with a
 * leader, so a relay or consumer started next never sees UNKNOWN_TOPIC, whichever broker it
 * asks. Retention follows onceq's rules
 * unless --retention says otherwise: tool-calls keep their messages for the consumer's default
 * inbox retention (7 d; a longer topic retention makes each consumer warn at start-up),
 * tool-results for the producer's default key TTL (24 h); other topics get the broker's
 * default. Bad input (a topic name Kafka refuses, min.insync.replicas above the replication
 * factor) is refused before anything is sent; the broker's own refusals (too few brokers for
 * the replication factor, a bad config) exit 2 too, having changed nothing.
 *
 * describe reads the metadata (partitions, leaders, replicas, in-sync replicas) and
 * DescribeConfigs (min.insync.replicas, retention.ms, cleanup.policy, segment.bytes) of each
 * topic; a topic that does not exist makes it exit 4. delete removes topics and waits until
 * the metadata no longer lists them, so they can be created again at once (the real-Kafka
 * tests recreate the onceq topics between scripts that way). Every wait is bounded by
 * --timeout.
 */
#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "cmds.h"
#include "oq_config.h"
#include "oq_envelope.h"
#include "oq_error.h"
#include "oq_kafka.h"
#include "oq_log.h"
#include "oq_util.h"
#include "oq_json.h"

#define TOPICS_MAX 64
#define DAY_MS (86400LL * 1000)

static const char topics_usage[] =
    "usage: onceq topics create   --brokers B [--partitions 6] [--replication-factor 3]\n"
    "                             [--min-insync-replicas 2] [--retention D] [--if-not-exists]\n"
    "                             [--validate-only] [TOPIC[:PARTITIONS]]...\n"
    "       onceq topics describe --brokers B [--json] [TOPIC]...\n"
    "       onceq topics delete   --brokers B [--if-exists] TOPIC...\n"
    "       (all: [--timeout 30s] [-X kafka.prop=value]...)\n"
    "\n"
    "Creates, describes or deletes Kafka topics with the admin API. Without TOPIC, create and\n"
    "describe act on PREFIX + tool-calls, tool-results and dlq (--topic-prefix, default\n"
    "onceq.: onceq.tool-calls, onceq.tool-results, onceq.dlq); delete needs names.\n"
    "create sets min.insync.replicas and retention.ms on each topic and waits until every\n"
    "partition has a leader. Retention without --retention: tool-calls 7d (the consumer's\n"
    "default --inbox-retention: keep the topic's retention at or below the inbox's),\n"
    "tool-results 24h (the producer's default --key-ttl), other topics the broker's\n"
    "default. Produce with acks=all (onceq's clients do) so min.insync.replicas counts.\n"
    "Exit: 0 ok, 1 broker or network failure, 2 invalid request (nothing changed),\n"
    "4 describe: a topic does not exist.";

static const oq_setting_t topics_settings[] = {
    {"brokers", OQ_SET_STRING, NULL, 1, 4096, NULL, "Kafka bootstrap servers"},
    {"partitions", OQ_SET_INT, "6", 1, 100000, NULL,
     "create: partitions of each topic without :PARTITIONS"},
    {"replication-factor", OQ_SET_INT, "3", 1, 32767, NULL, "create: replicas of each partition"},
    {"min-insync-replicas", OQ_SET_INT, "2", 1, 32767, NULL,
     "create: topic config min.insync.replicas (an acks=all write needs this many replicas)"},
    {"retention", OQ_SET_DURATION, NULL, 1000, 3650LL * DAY_MS, NULL,
     "create: retention.ms of every topic (default: per topic, see above)"},
    {"if-not-exists", OQ_SET_BOOL, "false", 0, -1, NULL,
     "create: a topic that exists already is not an error (its settings are left alone)"},
    {"if-exists", OQ_SET_BOOL, "false", 0, -1, NULL,
     "delete: a topic that does not exist is not an error"},
    {"validate-only", OQ_SET_BOOL, "false", 0, -1, NULL,
     "create: let the brokers check the request, create nothing"},
    {"json", OQ_SET_BOOL, "false", 0, -1, NULL, "describe: one JSON object on stdout"},
    {"timeout", OQ_SET_DURATION, "30s", 100, 600000, NULL,
     "bound on each admin request and on the waits for the metadata"},
    OQ_SETTING_TOPIC_PREFIX,
};

typedef struct {
    const char *name;     /* borrowed from argv or a constant */
    int partitions;       /* create: from NAME:N or --partitions */
    int64_t retention_ms; /* create: 0 = broker default */
} topic_spec_t;

/* Kafka's rule: 1..249 characters of [a-zA-Z0-9._-], not "." or "..". */
static int topic_name_ok(const char *s, size_t n)
{
    if (n < 1 || n > 249 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-') return 0;
    return 1;
}

/* The positional topics of one command into \p out (names borrowed; "NAME:N" is split in
 * \p buf, owned by the caller). Without any, the three onceq topics. */
static int parse_topics(const oq_config_t *cfg, int create, char bufs[][256], topic_spec_t *out,
                        int *n, oq_error_t *err)
{
    static const char *const defaults[] = {OQ_TOPIC_CALLS, OQ_TOPIC_RESULTS, OQ_TOPIC_DLQ};
    const char *prefix = oq_config_str(cfg, "topic-prefix");
    char calls[OQ_TOPIC_NAME_CAP], results[OQ_TOPIC_NAME_CAP];
    oq_topic_name(prefix, OQ_TOPIC_CALLS, calls, sizeof calls);
    oq_topic_name(prefix, OQ_TOPIC_RESULTS, results, sizeof results);
    int np = oq_config_npositional(cfg) - 1;
    int parts = (int)oq_config_int(cfg, "partitions");
    *n = 0;
    if (np > TOPICS_MAX) return oq_error_set(err, OQ_EINVAL, 0, "at most %d topics", TOPICS_MAX);
    for (int i = 0; i < (np > 0 ? np : 3); i++) {
        topic_spec_t *t = &out[(*n)++];
        t->partitions = parts;
        if (np <= 0) {
            t->name = oq_topic_name(prefix, defaults[i], bufs[i], 256);
        } else {
            const char *a = oq_config_positional(cfg, i + 1), *colon = strchr(a, ':');
            size_t len = colon ? (size_t)(colon - a) : strlen(a);
            if (!topic_name_ok(a, len))
                return oq_error_set(err, OQ_EINVAL, 0,
                                    "bad topic name '%.*s' (1-249 of [a-zA-Z0-9._-])",
                                    (int)(len > 249 ? 249 : len), a);
            if (colon) {
                char *end = NULL;
                long p = strtol(colon + 1, &end, 10);
                if (!create || !colon[1] || *end || p < 1 || p > 100000)
                    return oq_error_set(err, OQ_EINVAL, 0, "bad topic '%s': %s", a,
                                        create ? "PARTITIONS must be 1..100000"
                                               : "NAME:PARTITIONS only with create");
                t->partitions = (int)p;
            }
            snprintf(bufs[i], 256, "%.*s", (int)len, a);
            t->name = bufs[i];
        }
        if (oq_config_is_set(cfg, "retention"))
            t->retention_ms = oq_config_int(cfg, "retention");
        else if (strcmp(t->name, calls) == 0)
            t->retention_ms = 7 * DAY_MS;
        else if (strcmp(t->name, results) == 0)
            t->retention_ms = DAY_MS;
        else
            t->retention_ms = 0;
    }
    return 0;
}

/* A Kafka error that means "the request was wrong", not "the cluster failed". */
static int err_is_invalid(rd_kafka_resp_err_t e)
{
    switch (e) {
    case RD_KAFKA_RESP_ERR_INVALID_PARTITIONS:
    case RD_KAFKA_RESP_ERR_INVALID_REPLICATION_FACTOR:
    case RD_KAFKA_RESP_ERR_INVALID_REPLICA_ASSIGNMENT:
    case RD_KAFKA_RESP_ERR_INVALID_CONFIG:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
    case RD_KAFKA_RESP_ERR_INVALID_REQUEST:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
        return 1;
    default:
        return 0;
    }
}

/* The index of the spec named \p name in \p ts (an admin result names its topic), or -1. */
static int spec_index(const topic_spec_t *ts, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(ts[i].name, name) == 0) return i;
    return -1;
}

/* Waits up to \p timeout_ms for the admin result of type \p type on \p q. */
static rd_kafka_event_t *admin_wait(rd_kafka_queue_t *q, rd_kafka_event_type_t type,
                                    int64_t timeout_ms, oq_error_t *err)
{
    int64_t deadline = oq_mono_us() + timeout_ms * 1000;
    for (;;) {
        int64_t left = (deadline - oq_mono_us()) / 1000;
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, left > 0 ? (int)left : 0);
        if (ev && rd_kafka_event_type(ev) == type) {
            if (rd_kafka_event_error(ev)) {
                oq_error_set(err, OQ_EKAFKA, rd_kafka_event_error(ev), "%s",
                             rd_kafka_event_error_string(ev));
                rd_kafka_event_destroy(ev);
                return NULL;
            }
            return ev;
        }
        if (ev) rd_kafka_event_destroy(ev);
        if (left <= 0) {
            oq_error_set(err, OQ_ETIMEDOUT, 0, "no answer from the brokers within %" PRId64 " ms",
                         timeout_ms);
            return NULL;
        }
    }
}

static rd_kafka_AdminOptions_t *admin_options(rd_kafka_t *rk, rd_kafka_admin_op_t op,
                                              int64_t timeout_ms, int validate_only,
                                              oq_error_t *err)
{
    char errstr[256];
    rd_kafka_AdminOptions_t *o = rd_kafka_AdminOptions_new(rk, op);
    if (!o) {
        oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        return NULL;
    }
    if (rd_kafka_AdminOptions_set_request_timeout(o, (int)timeout_ms, errstr, sizeof errstr) ||
        ((op == RD_KAFKA_ADMIN_OP_CREATETOPICS || op == RD_KAFKA_ADMIN_OP_DELETETOPICS) &&
         rd_kafka_AdminOptions_set_operation_timeout(o, (int)timeout_ms, errstr, sizeof errstr)) ||
        (validate_only && rd_kafka_AdminOptions_set_validate_only(o, 1, errstr, sizeof errstr))) {
        oq_error_set(err, OQ_EINVAL, 0, "admin options: %s", errstr);
        rd_kafka_AdminOptions_destroy(o);
        return NULL;
    }
    return o;
}

static const rd_kafka_metadata_topic_t *md_find(const rd_kafka_metadata_t *md, const char *name)
{
    for (int i = 0; i < md->topic_cnt; i++)
        if (strcmp(md->topics[i].topic, name) == 0) return &md->topics[i];
    return NULL;
}

/* The first topic of \p ts (among \p which) that is not yet ready (\p want_present: listed
 * with all its partitions led) or not yet gone in \p md; NULL when none. */
static const char *topics_pending(const rd_kafka_metadata_t *md, const topic_spec_t *ts,
                                  const int *which, int n, int want_present)
{
    for (int i = 0; i < n; i++) {
        if (!which[i]) continue;
        const rd_kafka_metadata_topic_t *t = md_find(md, ts[i].name);
        int ready = t && t->err == 0 && t->partition_cnt > 0;
        for (int p = 0; ready && p < t->partition_cnt; p++)
            if (t->partitions[p].err || t->partitions[p].leader < 0) ready = 0;
        if (want_present ? !ready : t != NULL) return ts[i].name;
    }
    return NULL;
}

/* One metadata request to the broker at \p addr alone: a handle of its own that knows no
 * other broker, so the answer is that broker's view. Returns the pending topic as
 * topics_pending() does, or a reason when the broker did not answer. */
static const char *ask_broker(const oq_config_t *cfg, const char *addr, const topic_spec_t *ts,
                              const int *which, int n, int want_present, int timeout_ms, char *why,
                              size_t whylen)
{
    char errstr[256];
    const char *pending = "no answer";
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_conf_t *conf = oq_kafka_conf_new(OQ_KAFKA_PRODUCER, addr, cfg, NULL);
    rd_kafka_t *rk = conf ? rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr) : NULL;
    if (!rk) {
        if (conf) rd_kafka_conf_destroy(conf);
        return "client creation failed";
    }
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 1, NULL, &md, timeout_ms);
    if (e) {
        snprintf(why, whylen, "%s", rd_kafka_err2str(e));
        pending = why;
    } else {
        pending = topics_pending(md, ts, which, n, want_present);
        rd_kafka_metadata_destroy(md);
    }
    rd_kafka_destroy(rk);
    return pending;
}

/*
 * Waits, bounded by \p timeout_ms, until every topic of \p ts (among \p which) is ready
 * (\p want_present: listed with all its partitions led) or gone (!want_present) in the
 * metadata of EVERY broker. Brokers apply the cluster's metadata each at its own pace: one
 * that answers "created" while another still says "unknown topic" would fail the first
 * client that asks the other (the consumers' retention check did, in the real-Kafka suite).
 * First the cluster's view through \p rk, then each broker's own.
 */
static int wait_metadata(rd_kafka_t *rk, const oq_config_t *cfg, const topic_spec_t *ts,
                         const int *which, int n, int want_present, int64_t timeout_ms,
                         oq_error_t *err)
{
    int64_t deadline = oq_mono_us() + timeout_ms * 1000;
    const char *pending = NULL;
    char addrs[64][300], why[128];
    int naddr = 0, done[64] = {0};
    for (;;) {
        const rd_kafka_metadata_t *md = NULL;
        int64_t left = (deadline - oq_mono_us()) / 1000;
        rd_kafka_resp_err_t e = rd_kafka_metadata(
            rk, 1, NULL, &md, left > 200 ? (int)(left < 5000 ? left : 5000) : 200);
        if (e) {
            pending = rd_kafka_err2str(e);
        } else {
            pending = topics_pending(md, ts, which, n, want_present);
            for (int b = 0; !pending && b < md->broker_cnt && b < 64; b++)
                snprintf(addrs[naddr++], sizeof addrs[0], "%s:%d", md->brokers[b].host,
                         md->brokers[b].port);
            rd_kafka_metadata_destroy(md);
        }
        if (!pending) break;
        if (oq_mono_us() >= deadline) goto timeout;
        oq_sleep_ms(100, NULL);
    }
    for (int left_n = naddr; left_n > 0;) {
        for (int b = 0; b < naddr; b++) {
            if (done[b]) continue;
            int64_t left = (deadline - oq_mono_us()) / 1000;
            const char *p =
                ask_broker(cfg, addrs[b], ts, which, n, want_present,
                           left > 200 ? (int)(left < 3000 ? left : 3000) : 200, why, sizeof why);
            if (!p) {
                done[b] = 1;
                left_n--;
            } else {
                pending = p;
            }
        }
        if (left_n == 0) break;
        if (oq_mono_us() >= deadline) goto timeout;
        oq_sleep_ms(100, NULL);
    }
    return 0;
timeout:
    return oq_error_set(err, OQ_ETIMEDOUT, 0, "%s: not %s on every broker after %" PRId64 " ms",
                        pending, want_present ? "ready (all partitions led)" : "gone", timeout_ms);
}

static int do_create(rd_kafka_t *rk, rd_kafka_queue_t *q, const oq_config_t *cfg,
                     const topic_spec_t *ts, int n, int64_t timeout_ms, oq_error_t *err)
{
    rd_kafka_NewTopic_t *nt[TOPICS_MAX] = {0};
    rd_kafka_AdminOptions_t *opts = NULL;
    rd_kafka_event_t *ev = NULL;
    int rf = (int)oq_config_int(cfg, "replication-factor");
    int isr = (int)oq_config_int(cfg, "min-insync-replicas");
    int validate = (int)oq_config_int(cfg, "validate-only");
    int if_not_exists = (int)oq_config_int(cfg, "if-not-exists");
    int created[TOPICS_MAX] = {0}, ncreated = 0, nbad = 0, invalid = 0;
    char errstr[512], v[32];
    int rc = 0;

    if (isr > rf) {
        rc = oq_error_set(err, OQ_EINVAL, 0,
                          "--min-insync-replicas %d is above --replication-factor %d: no "
                          "acks=all write could ever succeed",
                          isr, rf);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        nt[i] = rd_kafka_NewTopic_new(ts[i].name, ts[i].partitions, rf, errstr, sizeof errstr);
        if (!nt[i]) {
            rc = oq_error_set(err, OQ_EINVAL, 0, "%s: %s", ts[i].name, errstr);
            goto out;
        }
        snprintf(v, sizeof v, "%d", isr);
        rd_kafka_resp_err_t e = rd_kafka_NewTopic_set_config(nt[i], "min.insync.replicas", v);
        if (!e && ts[i].retention_ms > 0) {
            snprintf(v, sizeof v, "%" PRId64, ts[i].retention_ms);
            e = rd_kafka_NewTopic_set_config(nt[i], "retention.ms", v);
        }
        if (e) {
            rc = oq_error_set(err, OQ_EINVAL, e, "%s: %s", ts[i].name, rd_kafka_err2str(e));
            goto out;
        }
    }
    if (!(opts = admin_options(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS, timeout_ms, validate, err))) {
        rc = err ? err->code : OQ_EINVAL;
        goto out;
    }
    rd_kafka_CreateTopics(rk, nt, (size_t)n, opts, q);
    if (!(ev = admin_wait(q, RD_KAFKA_EVENT_CREATETOPICS_RESULT, timeout_ms + 5000, err))) {
        rc = err ? err->code : OQ_EKAFKA;
        goto out;
    }
    size_t nr = 0;
    const rd_kafka_topic_result_t **rs =
        rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &nr);
    for (size_t r = 0; r < nr; r++) {
        const char *name = rd_kafka_topic_result_name(rs[r]);
        rd_kafka_resp_err_t e = rd_kafka_topic_result_error(rs[r]);
        int i = spec_index(ts, n, name);
        if (i < 0) continue;
        if (e == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS && if_not_exists) {
            printf("exists %s (left as it is)\n", name);
            created[i] = 1; /* still wait until it is led */
            continue;
        }
        if (e) {
            const char *es = rd_kafka_topic_result_error_string(rs[r]);
            fprintf(stderr, "onceq topics: create %s: %s\n", name, es ? es : rd_kafka_err2str(e));
            nbad++;
            if (err_is_invalid(e) || e == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) invalid++;
            continue;
        }
        created[i] = 1;
        ncreated++;
        printf("%s %s partitions=%d replication-factor=%d min.insync.replicas=%d "
               "retention.ms=%s\n",
               validate ? "valid" : "created", name, ts[i].partitions, rf, isr,
               ts[i].retention_ms > 0 ? (snprintf(v, sizeof v, "%" PRId64, ts[i].retention_ms), v)
                                      : "broker-default");
    }
    fflush(stdout);
    if (!validate && wait_metadata(rk, cfg, ts, created, n, 1, timeout_ms, err) != 0) {
        rc = err ? err->code : OQ_ETIMEDOUT;
        goto out;
    }
    if (nbad)
        rc = oq_error_set(err, invalid == nbad ? OQ_EINVAL : OQ_EKAFKA, 0,
                          "%d of %d topics not created", nbad, n);
    else if ((int)nr < n)
        rc = oq_error_set(err, OQ_EKAFKA, 0, "the brokers answered for %zu of %d topics", nr, n);
out:
    if (ev) rd_kafka_event_destroy(ev);
    if (opts) rd_kafka_AdminOptions_destroy(opts);
    for (int i = 0; i < n; i++)
        if (nt[i]) rd_kafka_NewTopic_destroy(nt[i]);
    return rc;
}

static int do_delete(rd_kafka_t *rk, rd_kafka_queue_t *q, const oq_config_t *cfg,
                     const topic_spec_t *ts, int n, int64_t timeout_ms, oq_error_t *err)
{
    rd_kafka_DeleteTopic_t *dt[TOPICS_MAX] = {0};
    rd_kafka_AdminOptions_t *opts = NULL;
    rd_kafka_event_t *ev = NULL;
    int if_exists = (int)oq_config_int(cfg, "if-exists");
    int gone[TOPICS_MAX] = {0}, nbad = 0, nmissing = 0, rc = 0;

    for (int i = 0; i < n; i++)
        if (!(dt[i] = rd_kafka_DeleteTopic_new(ts[i].name))) {
            rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            goto out;
        }
    if (!(opts = admin_options(rk, RD_KAFKA_ADMIN_OP_DELETETOPICS, timeout_ms, 0, err))) {
        rc = err ? err->code : OQ_EINVAL;
        goto out;
    }
    rd_kafka_DeleteTopics(rk, dt, (size_t)n, opts, q);
    if (!(ev = admin_wait(q, RD_KAFKA_EVENT_DELETETOPICS_RESULT, timeout_ms + 5000, err))) {
        rc = err ? err->code : OQ_EKAFKA;
        goto out;
    }
    size_t nr = 0;
    const rd_kafka_topic_result_t **rs =
        rd_kafka_DeleteTopics_result_topics(rd_kafka_event_DeleteTopics_result(ev), &nr);
    for (size_t r = 0; r < nr; r++) {
        const char *name = rd_kafka_topic_result_name(rs[r]);
        rd_kafka_resp_err_t e = rd_kafka_topic_result_error(rs[r]);
        int i = spec_index(ts, n, name);
        if (i < 0) continue;
        if (e == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
            printf("absent %s\n", name);
            if (!if_exists) nmissing++;
            continue;
        }
        if (e) {
            const char *es = rd_kafka_topic_result_error_string(rs[r]);
            fprintf(stderr, "onceq topics: delete %s: %s\n", name, es ? es : rd_kafka_err2str(e));
            nbad++;
            continue;
        }
        gone[i] = 1;
        printf("deleted %s\n", name);
    }
    fflush(stdout);
    if (wait_metadata(rk, cfg, ts, gone, n, 0, timeout_ms, err) != 0) {
        rc = err ? err->code : OQ_ETIMEDOUT;
        goto out;
    }
    if (nbad)
        rc = oq_error_set(err, OQ_EKAFKA, 0, "%d of %d topics not deleted", nbad, n);
    else if (nmissing)
        rc = oq_error_set(err, OQ_ENOTFOUND, 0,
                          "%d of %d topics do not exist (--if-exists allows that)", nmissing, n);
out:
    if (ev) rd_kafka_event_destroy(ev);
    if (opts) rd_kafka_AdminOptions_destroy(opts);
    for (int i = 0; i < n; i++)
        if (dt[i]) rd_kafka_DeleteTopic_destroy(dt[i]);
    return rc;
}

static const char *const describe_keys[] = {"min.insync.replicas", "retention.ms", "cleanup.policy",
                                            "segment.bytes"};
#define NKEYS (sizeof describe_keys / sizeof describe_keys[0])

static void print_ids(json_t *arr, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++) {
        if (arr)
            json_array_append_new(arr, json_integer(ids[i]));
        else
            printf("%s%d", i ? "," : "", (int)ids[i]);
    }
}

static int do_describe(rd_kafka_t *rk, rd_kafka_queue_t *q, const oq_config_t *cfg,
                       const topic_spec_t *ts, int n, int64_t timeout_ms, oq_error_t *err)
{
    const rd_kafka_metadata_t *md = NULL;
    rd_kafka_ConfigResource_t *res[TOPICS_MAX] = {0};
    rd_kafka_AdminOptions_t *opts = NULL;
    rd_kafka_event_t *ev = NULL;
    int as_json = (int)oq_config_int(cfg, "json");
    json_t *jtopics = as_json ? json_array() : NULL;
    int nmissing = 0, rc = 0;

    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 1, NULL, &md, (int)timeout_ms);
    if (e) {
        rc = oq_error_set(err, OQ_EKAFKA, e, "metadata: %s", rd_kafka_err2str(e));
        goto out;
    }
    for (int i = 0; i < n; i++)
        if (!(res[i] = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, ts[i].name))) {
            rc = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
            goto out;
        }
    if (!(opts = admin_options(rk, RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS, timeout_ms, 0, err))) {
        rc = err ? err->code : OQ_EINVAL;
        goto out;
    }
    rd_kafka_DescribeConfigs(rk, res, (size_t)n, opts, q);
    if (!(ev = admin_wait(q, RD_KAFKA_EVENT_DESCRIBECONFIGS_RESULT, timeout_ms + 5000, err))) {
        rc = err ? err->code : OQ_EKAFKA;
        goto out;
    }
    size_t nr = 0;
    const rd_kafka_ConfigResource_t **rs =
        rd_kafka_DescribeConfigs_result_resources(rd_kafka_event_DescribeConfigs_result(ev), &nr);

    for (int i = 0; i < n; i++) {
        const rd_kafka_metadata_topic_t *t = md_find(md, ts[i].name);
        if (!t || t->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
            nmissing++;
            if (as_json)
                json_array_append_new(jtopics,
                                      json_pack("{s:s, s:b}", "name", ts[i].name, "exists", 0));
            else
                printf("topic %s does not exist\n", ts[i].name);
            continue;
        }
        const char *vals[NKEYS] = {0};
        for (size_t r = 0; r < nr; r++) {
            if (strcmp(rd_kafka_ConfigResource_name(rs[r]), ts[i].name) != 0 ||
                rd_kafka_ConfigResource_error(rs[r]))
                continue;
            size_t ne = 0;
            const rd_kafka_ConfigEntry_t **es = rd_kafka_ConfigResource_configs(rs[r], &ne);
            for (size_t k = 0; k < ne; k++)
                for (size_t j = 0; j < NKEYS; j++)
                    if (strcmp(rd_kafka_ConfigEntry_name(es[k]), describe_keys[j]) == 0)
                        vals[j] = rd_kafka_ConfigEntry_value(es[k]);
        }
        int rf = t->partition_cnt > 0 ? t->partitions[0].replica_cnt : 0, under = 0;
        for (int p = 0; p < t->partition_cnt; p++)
            if (t->partitions[p].isr_cnt < t->partitions[p].replica_cnt ||
                t->partitions[p].leader < 0)
                under++;
        json_t *jt = NULL, *jparts = NULL, *jcfg = NULL;
        if (as_json) {
            jt = json_pack("{s:s, s:b, s:i, s:i, s:i}", "name", ts[i].name, "exists", 1,
                           "partitions", t->partition_cnt, "replication_factor", rf,
                           "under_replicated", under);
            jcfg = json_object();
            jparts = json_array();
            for (size_t j = 0; j < NKEYS; j++)
                if (vals[j]) json_object_set_new(jcfg, describe_keys[j], json_string(vals[j]));
            json_object_set_new(jt, "configs", jcfg);
            json_object_set_new(jt, "partition_list", jparts);
            json_array_append_new(jtopics, jt);
        } else {
            printf("topic %s partitions=%d replication-factor=%d", ts[i].name, t->partition_cnt,
                   rf);
            for (size_t j = 0; j < NKEYS; j++)
                printf(" %s=%s", describe_keys[j], vals[j] ? vals[j] : "?");
            printf(" under-replicated=%d\n", under);
            if (t->err) printf("  metadata error: %s\n", rd_kafka_err2str(t->err));
        }
        for (int p = 0; p < t->partition_cnt; p++) {
            const rd_kafka_metadata_partition_t *mp = &t->partitions[p];
            if (as_json) {
                json_t *jp =
                    json_pack("{s:i, s:i}", "partition", (int)mp->id, "leader", (int)mp->leader);
                json_t *jr = json_array(), *ji = json_array();
                print_ids(jr, mp->replicas, mp->replica_cnt);
                print_ids(ji, mp->isrs, mp->isr_cnt);
                json_object_set_new(jp, "replicas", jr);
                json_object_set_new(jp, "isr", ji);
                json_array_append_new(jparts, jp);
            } else {
                printf("  partition %d leader=%d replicas=", (int)mp->id, (int)mp->leader);
                print_ids(NULL, mp->replicas, mp->replica_cnt);
                printf(" isr=");
                print_ids(NULL, mp->isrs, mp->isr_cnt);
                printf("\n");
            }
        }
    }
    if (as_json) {
        json_t *root = json_pack("{s:o}", "topics", jtopics);
        jtopics = NULL;
        char *s = root ? oq_json_dumps(root, JSON_COMPACT) : NULL;
        if (s) printf("%s\n", s);
        free(s);
        json_decref(root);
    }
    if (nmissing)
        rc = oq_error_set(err, OQ_ENOTFOUND, 0, "%d of %d topics do not exist", nmissing, n);
out:
    json_decref(jtopics);
    if (ev) rd_kafka_event_destroy(ev);
    if (opts) rd_kafka_AdminOptions_destroy(opts);
    for (int i = 0; i < n; i++)
        if (res[i]) rd_kafka_ConfigResource_destroy(res[i]);
    if (md) rd_kafka_metadata_destroy(md);
    return rc;
}

/**
 * @brief `onceq topics create|describe|delete`.
 * @returns OQ_EXIT_OK; OQ_EXIT_USAGE for bad flags or a request the brokers refused as
 *          invalid (nothing changed); OQ_EXIT_NOTFOUND when describe/delete name a missing
 *          topic; OQ_EXIT_FAIL for broker or network failures.
 */
int oq__cmd_topics(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc, n = 0, rc;
    rd_kafka_t *rk = NULL;
    rd_kafka_queue_t *q = NULL;
    rd_kafka_conf_t *conf = NULL;
    topic_spec_t ts[TOPICS_MAX];
    static char bufs[TOPICS_MAX][256];
    char errstr[512];
    const char *action;

    oq_config_t *cfg =
        oq_config_new(topics_settings, sizeof topics_settings / sizeof topics_settings[0]);
    if (!cfg) {
        fprintf(stderr, "onceq topics: out of memory\n");
        return OQ_EXIT_FAIL;
    }
    if ((prc = oq_cli_parse(cfg, "onceq", topics_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    action = oq_config_npositional(cfg) > 0 ? oq_config_positional(cfg, 0) : "";
    if (strcmp(action, "create") != 0 && strcmp(action, "describe") != 0 &&
        strcmp(action, "delete") != 0) {
        fprintf(stderr, "onceq topics: %s\n(see: onceq topics --help)\n",
                *action ? "the action is create, describe or delete"
                        : "an action is required: create, describe or delete");
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (!oq_config_str(cfg, "brokers")) {
        fprintf(stderr, "onceq topics: --brokers is required\n(see: onceq topics --help)\n");
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (oq_cli_check_topic_prefix(cfg, "topics") != 0) {
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (strcmp(action, "delete") == 0 && oq_config_npositional(cfg) < 2) {
        fprintf(stderr, "onceq topics: delete needs the topic names\n");
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (parse_topics(cfg, strcmp(action, "create") == 0, bufs, ts, &n, &err) != 0) {
        fprintf(stderr, "onceq topics: %s\n", err.msg);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (!(conf = oq_kafka_conf_new(OQ_KAFKA_PRODUCER, oq_config_str(cfg, "brokers"), cfg, &err))) {
        fprintf(stderr, "onceq topics: %s\n", err.msg);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (!(rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr))) {
        fprintf(stderr, "onceq topics: %s\n", errstr);
        goto out;
    }
    conf = NULL; /* owned by rk */
    if (!(q = rd_kafka_queue_new(rk))) goto out;

    int64_t timeout_ms = oq_config_int(cfg, "timeout");
    if (strcmp(action, "create") == 0)
        rc = do_create(rk, q, cfg, ts, n, timeout_ms, &err);
    else if (strcmp(action, "delete") == 0)
        rc = do_delete(rk, q, cfg, ts, n, timeout_ms, &err);
    else
        rc = do_describe(rk, q, cfg, ts, n, timeout_ms, &err);
    if (rc == 0) {
        ret = OQ_EXIT_OK;
    } else {
        fprintf(stderr, "onceq topics %s: %s\n", action, err.msg);
        ret = rc == OQ_EINVAL      ? OQ_EXIT_USAGE
              : rc == OQ_ENOTFOUND ? OQ_EXIT_NOTFOUND
                                   : OQ_EXIT_FAIL;
    }
out:
    if (q) rd_kafka_queue_destroy(q);
    if (rk) rd_kafka_destroy(rk);
    if (conf) rd_kafka_conf_destroy(conf);
    oq_config_destroy(cfg);
    return ret;
}
