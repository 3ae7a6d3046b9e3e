/* SPDX-License-Identifier: Apache-2.0 */
/*
 * librdkafka configuration shared by producer, relay and consumer. The defaults depend on the
 * brokers, named by the command's `kafka-profile` setting; the user's -X settings are applied
 * last, so they always win over either profile.
 *
 * Profiles. `real` (the default) is for Apache Kafka: consumers fetch with
 * fetch.wait.max.ms=500 (Kafka's and librdkafka's default). A real broker answers a fetch as
 * soon as fetch.min.bytes (1) is there, so the long wait costs no latency; it only bounds how
 * often an idle consumer asks. With 10 ms, an idle pipeline (producer, relay, 2 consumers: 3
 * consumer handles on 3 brokers) sent ~900 empty fetches/s and made a 3-node cluster burn
 * 0.6-0.9 cores more than with no client. `mock` is for the embedded broker (librdkafka's mock
 * cluster), which does not answer a fetch early: it holds an unsatisfied fetch for the whole
 * wait, so 500 ms would add ~250 ms to every idle hop; there consumers use
 * fetch.wait.max.ms=1: a message that arrives while a consumer waits is fetched when the wait
 * ends, 0.5 ms later on average, and a single call crosses two such hops (the call to a
 * consumer, its result to the producer). Measured on `onceq up` (3 mock brokers, 2 consumers,
 * one client thread calling an HTTP tool): 5 ms cost a single call ~4 ms more at p50 than 1 ms;
 * an idle `onceq up` used ~0.12 cores with 5 ms, ~0.15 with 3, ~0.18 with 2, ~0.27 with 1 (each
 * empty fetch costs the client and the mock ~20 us). The wait is a mock-only trade of idle CPU
 * for latency: -X consumer.fetch.wait.max.ms moves it. Those figures are with 3 mock brokers: a
 * consumer handle fetches from every broker leading one of its partitions, so `onceq up` now
 * runs one (--embedded-brokers), and its idle CPU fell from 0.18-0.24 to 0.12-0.13 cores.
 * `onceq up` with the embedded broker and the test harness on it (tests/integration/lib.sh)
 * set `mock`. The rest is the same in both: socket.nagle.disable=true (small requests are
 * not held for an ACK), and the consumers commit stored offsets at most once per
 * OQ_KAFKA_COMMIT_INTERVAL_MS (consumer/worker.c, producer/ingest.c).
 *
 * Request counts. With ONCEQ_KAFKA_STATS_DIR set, every handle built here emits librdkafka's
 * statistics once a second (statistics.interval.ms=1000) and each one is written, whole, to
 * DIR/<pid>-<handle name>.json (a temporary file renamed over the last one, so a reader never
 * sees half of it): cumulative per-broker request counts by type (brokers[].req.Produce,
 * Fetch, OffsetCommit, Metadata ...), messages and bytes. scripts/kafka-bench.sh reads two
 * snapshots around its measured run and prints the requests per call by type. The statistics
 * are served by the handle's poll, so a handle that is never polled for anything else (the
 * readiness probes) polls once per probe. Off (no statistics at all) when the variable is unset.
 *
 * Scoping. A command runs producers and consumers alike (the consumer has a DLQ producer and
 * a result relay, the producer a results consumer), and librdkafka warns (CONFWARN) about a
 * consumer property on a producer handle and the other way round. So a property reaches only
 * the clients it is for: `producer.X` / `consumer.X` name one kind explicitly, and a bare name
 * that librdkafka documents as consumer-only ("C") or producer-only ("P") goes to that kind
 * only. The kinds come from librdkafka's own property table (rd_kafka_conf_properties_show),
 * read once.
 */
#include "oq_kafka.h"
#include "oq_log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int oq_kafka_rebalance_apply(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                             rd_kafka_topic_partition_list_t *parts, const char *component)
{
    int coop = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
    int assign = err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
    if (coop) {
        rd_kafka_error_t *e = assign ? rd_kafka_incremental_assign(rk, parts)
                                     : rd_kafka_incremental_unassign(rk, parts);
        if (e) {
            OQ_LOG_WARN(component, "rebalance: %s", rd_kafka_error_string(e));
            rd_kafka_error_destroy(e);
        }
    } else {
        rd_kafka_resp_err_t e = rd_kafka_assign(rk, assign ? parts : NULL);
        if (e) OQ_LOG_WARN(component, "rebalance: %s", rd_kafka_err2str(e));
    }
    return coop;
}

int oq_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value, oq_error_t *err)
{
    char errstr[256];
    if (rd_kafka_conf_set(conf, name, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
        return oq_error_set(err, OQ_EINVAL, 0, "kafka setting %s: %s", name, errstr);
    return 0;
}

/* --- property kinds -------------------------------------------------------------------------- */

typedef struct {
    char name[64];
    char kind; /* 'C', 'P' or '*' */
} prop_kind_t;

static prop_kind_t *kinds;
static size_t nkinds;
static pthread_once_t kinds_once = PTHREAD_ONCE_INIT;

/* Rows of the table look like "session.timeout.ms    |  C  | 1 .. 3600000 | ...". */
static void kinds_load(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return;
    rd_kafka_conf_properties_show(f);
    fclose(f);
    size_t cap = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char name[64], kind[8];
        if (sscanf(line, "%63s | %7s |", name, kind) != 2 || strlen(kind) != 1 ||
            !strchr("CP*", kind[0]))
            continue;
        if (nkinds == cap) {
            size_t ncap = cap ? cap * 2 : 256;
            prop_kind_t *nk = realloc(kinds, ncap * sizeof(*nk));
            if (!nk) break;
            kinds = nk;
            cap = ncap;
        }
        snprintf(kinds[nkinds].name, sizeof kinds[nkinds].name, "%s", name);
        kinds[nkinds++].kind = kind[0];
    }
    free(text);
}

static char prop_kind(const char *name)
{
    pthread_once(&kinds_once, kinds_load);
    for (size_t i = 0; i < nkinds; i++)
        if (strcmp(kinds[i].name, name) == 0) return kinds[i].kind;
    return '*'; /* unknown: let librdkafka judge it */
}

const char *oq_kafka_prop_for(oq_kafka_role_t role, const char *name)
{
    if (strncmp(name, "producer.", 9) == 0) return role == OQ_KAFKA_PRODUCER ? name + 9 : NULL;
    if (strncmp(name, "consumer.", 9) == 0) return role == OQ_KAFKA_CONSUMER ? name + 9 : NULL;
    char k = prop_kind(name);
    if ((k == 'C' && role != OQ_KAFKA_CONSUMER) || (k == 'P' && role != OQ_KAFKA_PRODUCER))
        return NULL;
    return name;
}

int oq_kafka_conf_apply(rd_kafka_conf_t *conf, oq_kafka_role_t role, const oq_config_t *cfg,
                        oq_error_t *err)
{
    int n = cfg ? oq_config_kafka_count(cfg) : 0;
    for (int i = 0; i < n; i++) {
        const char *name, *value;
        oq_config_kafka_get(cfg, i, &name, &value);
        const char *prop = oq_kafka_prop_for(role, name);
        if (!prop) continue; /* for the other kind of client */
        char errstr[256];
        if (rd_kafka_conf_set(conf, prop, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
            return oq_error_set(err, OQ_EINVAL, 0, "kafka property %s: %s", name, errstr);
    }
    return 0;
}

/* --- statistics (ONCEQ_KAFKA_STATS_DIR) ------------------------------------------------------ */

static int stats_cb(rd_kafka_t *rk, char *json, size_t len, void *opaque)
{
    (void)opaque;
    const char *dir = getenv("ONCEQ_KAFKA_STATS_DIR");
    if (!dir || !*dir) return 0;
    char name[256], path[4096], tmp[4200];
    snprintf(name, sizeof name, "%s", rd_kafka_name(rk)); /* "<client.id>#producer-1" */
    for (char *p = name; *p; p++)
        if (*p == '/') *p = '_'; /* a client.id (the consumer's worker id) is not a path */
    snprintf(path, sizeof path, "%s/%ld-%s.json", dir, (long)getpid(), name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return 0;
    int ok = fwrite(json, 1, len, f) == len;
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) unlink(tmp);
    return 0; /* librdkafka frees json */
}

static int stats_enable(rd_kafka_conf_t *conf, oq_error_t *err)
{
    const char *dir = getenv("ONCEQ_KAFKA_STATS_DIR");
    if (!dir || !*dir) return 0;
    if (oq_kafka_conf_set(conf, "statistics.interval.ms", "1000", err) != 0) return -1;
    rd_kafka_conf_set_stats_cb(conf, stats_cb);
    return 0;
}

int oq_kafka_profile_mock(const oq_config_t *cfg)
{
    if (!cfg || !oq_config_has(cfg, "kafka-profile")) return 0;
    const char *p = oq_config_str(cfg, "kafka-profile");
    return p && strcmp(p, "mock") == 0;
}

rd_kafka_conf_t *oq_kafka_conf_new(oq_kafka_role_t role, const char *brokers,
                                   const oq_config_t *cfg, oq_error_t *err)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (!conf) {
        oq_error_set(err, OQ_ENOMEM, 0, "rd_kafka_conf_new failed");
        return NULL;
    }
    rd_kafka_conf_set_log_cb(conf, oq_log_rdkafka_cb);
    if ((brokers && oq_kafka_conf_set(conf, "bootstrap.servers", brokers, err) != 0) ||
        (role == OQ_KAFKA_CONSUMER &&
         oq_kafka_conf_set(conf, "fetch.wait.max.ms", oq_kafka_profile_mock(cfg) ? "1" : "500",
                           err) != 0) ||
        oq_kafka_conf_set(conf, "socket.nagle.disable", "true", err) != 0 ||
        stats_enable(conf, err) != 0 || oq_kafka_conf_apply(conf, role, cfg, err) != 0) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    return conf;
}
