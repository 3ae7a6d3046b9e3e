/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq relay`: the outbox relay daemon for one database (relay/oq_relay.h does the work).
 *
 * The process runs one relay, optionally serves its Prometheus metrics, and waits for
 * SIGTERM/SIGINT. The signal handler only sets a flag; the main thread polls it every 50 ms and
 * then calls oq_relay_stop(), which waits for in-flight deliveries, marks what was delivered
 * and releases the lease, so a standby relay takes over at once instead of after the lease.
 *
 * Start-up order under `onceq up`: the producer migrates calls.db, so the relay may start
 * before the tables exist; it waits up to --wait-db for them instead of failing at once.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "oq_pg.h"
#include "oq_service.h"
#include "oq_config.h"
#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_metrics.h"
#include "oq_ready.h"
#include "oq_relay.h"
#include "oq_util.h"

static const char relay_usage[] =
    "usage: onceq relay --db calls.db --brokers HOST:PORT[,...] [-X kafka.prop=value]...\n"
    "                   [--lease 5s] [--batch-rows N] [--retention 1h]\n"
    "                   [--metrics-listen 127.0.0.1:PORT]\n"
    "\n"
    "Publishes the database's outbox to Kafka (key = call_id, header onceq-message-id) with an\n"
    "idempotent producer, marks rows published from delivery reports, deletes published rows\n"
    "after --retention. Several relays may run on one database: the lease holder publishes,\n"
    "the others stand by and take over when its lease lapses. SIGTERM/SIGINT: flush in-flight\n"
    "deliveries, mark them, release the lease, exit 0.";

static const oq_setting_t relay_settings[] = {
    OQ_CLI_LOG_SETTINGS,
    {"db", OQ_SET_STRING, NULL, 1, 4096, NULL, "database with the outbox (calls.db, effects.db)"},
    {"brokers", OQ_SET_STRING, NULL, 1, 4096, NULL, "Kafka bootstrap servers"},
    {"lease", OQ_SET_DURATION, "5s", 100, 3600000, NULL,
     "lease duration; a standby takes over this long after the holder stops renewing"},
    {"lease-name", OQ_SET_STRING, "outbox", 1, 255, NULL, "relay_lease row name"},
    {"owner", OQ_SET_STRING, NULL, 1, 255, NULL, "lease owner id (default host:pid:random)"},
    {"batch-rows", OQ_SET_INT, "1000", 1, 100000, NULL,
     "rows per read batch (a mark transaction takes what was delivered meanwhile)"},
    {"batch-bytes", OQ_SET_SIZE, "1MiB", 1, 1073741824, NULL, "payload bytes per read batch"},
    {"max-inflight", OQ_SET_INT, "50000", 1, 1000000, NULL,
     "messages produced but not yet acknowledged"},
    {"retention", OQ_SET_DURATION, "1h", 0, 315360000000LL, NULL,
     "delete published rows older than this (0: never)"},
    {"cleanup-batch", OQ_SET_INT, "1000", 1, 1000000, NULL, "rows per retention DELETE"},
    {"poll-max", OQ_SET_DURATION, "5ms", 1, 1000, NULL,
     "idle: longest wait between PRAGMA data_version checks"},
    {"gather", OQ_SET_DURATION, NULL, 0, 1000, NULL,
     "while rows arrive at --gather-min-rate or more, read at most this often, so each "
     "Produce request carries more messages (default 10ms on SQLite, 5ms on PostgreSQL; 0: "
     "read per commit at any rate)"},
    {"gather-min-rate", OQ_SET_INT, "5000", 0, 10000000, NULL,
     "rows per second (a moving average) from which --gather applies"},
    {"stop-timeout", OQ_SET_DURATION, "10s", 0, 600000, NULL,
     "on SIGTERM, how long to wait for in-flight deliveries"},
    {"synchronous", OQ_SET_ENUM, "normal", 0, -1, "full|normal|off",
     "SQLite synchronous level of the relay's own writes (marks, lease, retention deletes): "
     "a mark lost in a power failure only republishes a row, which the inbox absorbs"},
    {"metrics-listen", OQ_SET_STRING, NULL, 1, 128, NULL,
     "serve GET /metrics, /healthz and /readyz on HOST:PORT (a bare PORT means "
     "127.0.0.1:PORT); default off"},
    {"wait-db", OQ_SET_DURATION, "30s", 0, 3600000, NULL,
     "wait this long for the database tables to appear (the producer migrates them)"},
    OQ_SETTING_TOPIC_PREFIX,
    OQ_SETTING_KAFKA_PROFILE,
};

static volatile sig_atomic_t relay_sig;

typedef struct {
    oq_relay_t *relay;
    int64_t lease_ms;
} relay_ready_t;

/* Readiness of the lease: holder or standby are both fine while the lease loop still reads the
 * lease; a loop that has not read it for two lease periods is stuck (database or thread). */
static int check_lease(void *arg, char *out, size_t cap)
{
    relay_ready_t *rr = arg;
    oq_relay_stats_t st;
    oq_relay_stats(rr->relay, &st);
    int64_t now = oq_now_ms(), limit = rr->lease_ms * 2 > 3000 ? rr->lease_ms * 2 : 3000;
    if (st.lease_state == OQ_RELAY_STOPPED) {
        snprintf(out, cap, "stopped");
        return OQ_ESHUTDOWN;
    }
    if (!st.lease_checked_ms) {
        snprintf(out, cap, "starting: the lease was not read yet");
        return OQ_ESTATE;
    }
    if (now - st.lease_checked_ms > limit) {
        snprintf(out, cap, "stalled: the lease was not read for %lld ms",
                 (long long)(now - st.lease_checked_ms));
        return OQ_ETIMEDOUT;
    }
    if (st.lease_state == OQ_RELAY_HOLDER)
        snprintf(out, cap, "holder fence=%lld", (long long)st.fence);
    else
        snprintf(out, cap, "standby");
    return 0;
}

static void relay_on_signal(int sig)
{
    relay_sig = sig;
}

/**
 * @brief `onceq relay`: run one outbox relay until SIGTERM/SIGINT.
 * @returns OQ_EXIT_OK after a clean stop, OQ_EXIT_USAGE on bad flags or Kafka settings,
 *          OQ_EXIT_FAIL when the database or the metrics listener cannot be set up.
 */
int oq__cmd_relay(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    oq_metrics_t *metrics = NULL;
    oq_metrics_server_t *server = NULL;
    oq_relay_t *relay = NULL;
    oq_ready_t *ready = NULL;
    relay_ready_t rr = {0};
    struct sigaction sa, old_term, old_int;
    int sig_installed = 0;

    oq_config_t *cfg =
        oq_config_new(relay_settings, sizeof(relay_settings) / sizeof(relay_settings[0]));
    if (!cfg) {
        fprintf(stderr, "onceq relay: out of memory\n");
        return OQ_EXIT_FAIL;
    }
    if ((prc = oq_cli_parse(cfg, "onceq", relay_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    if (oq_config_npositional(cfg) > 0 || !oq_config_str(cfg, "db") ||
        !oq_config_str(cfg, "brokers")) {
        fprintf(stderr, "onceq relay: %s\n(see: onceq relay --help)\n",
                oq_config_npositional(cfg) > 0 ? "unexpected argument"
                                               : "--db and --brokers are required");
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (oq_backend_of(oq_config_str(cfg, "db")) == OQ_BACKEND_POSTGRES &&
        oq_pg_conninfo_has_password(oq_config_str(cfg, "db"))) {
        fprintf(stderr, "onceq relay: --db holds a password: put it in a passfile (passfile=... "
                        "in the string, or PGPASSFILE)\n");
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (oq_cli_check_topic_prefix(cfg, "relay") != 0) {
        ret = OQ_EXIT_USAGE;
        goto out;
    }

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = relay_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
    signal(SIGPIPE, SIG_IGN);
    sig_installed = 1;

    oq_relay_opts_t o;
    oq_relay_opts_init(&o);
    o.db_path = oq_config_str(cfg, "db");
    o.brokers = oq_config_str(cfg, "brokers");
    o.kafka_cfg = cfg;
    o.lease_name = oq_config_str(cfg, "lease-name");
    o.owner = oq_config_str(cfg, "owner");
    o.lease_ms = oq_config_int(cfg, "lease");
    o.batch_rows = (int)oq_config_int(cfg, "batch-rows");
    o.batch_bytes = oq_config_int(cfg, "batch-bytes");
    o.max_inflight = (int)oq_config_int(cfg, "max-inflight");
    o.retention_ms = oq_config_int(cfg, "retention");
    o.cleanup_batch = (int)oq_config_int(cfg, "cleanup-batch");
    o.poll_max_ms = (int)oq_config_int(cfg, "poll-max");
    if (oq_config_is_set(cfg, "gather")) o.gather_ms = (int)oq_config_int(cfg, "gather");
    o.gather_min_rate = (int)oq_config_int(cfg, "gather-min-rate");
    o.watch_wal = 1; /* the writer is another process: it cannot oq_relay_notify() us */
    o.stop_timeout_ms = oq_config_int(cfg, "stop-timeout");
    o.db_synchronous = oq_config_str(cfg, "synchronous");
    o.topic_prefix = oq_config_str(cfg, "topic-prefix");

    const char *listen = oq_config_str(cfg, "metrics-listen");
    char listen_buf[160];
    if (listen) {
        if (!strchr(listen, ':')) {
            snprintf(listen_buf, sizeof(listen_buf), "127.0.0.1:%s", listen);
            listen = listen_buf;
        }
        metrics = oq_metrics_new();
        if (!metrics || oq_metrics_add_process(metrics, "relay") != 0) {
            fprintf(stderr, "onceq relay: out of memory\n");
            goto out;
        }
        o.metrics = metrics;
    }

    int64_t wait_until = oq_mono_us() + oq_config_int(cfg, "wait-db") * 1000;
    for (int attempt = 0;; attempt++) {
        oq_error_clear(&err);
        relay = oq_relay_new(&o, &err);
        if (relay) break;
        if (err.code != OQ_EDB || oq_mono_us() >= wait_until || relay_sig) {
            fprintf(stderr, "onceq relay: %s\n", err.msg);
            ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
            goto out;
        }
        if (attempt == 0) OQ_LOG_INFO("relay", "waiting for the database: %s", err.msg);
        /* A failed new() may have registered some metrics: start from a clean registry. */
        if (metrics) {
            oq_metrics_destroy(metrics);
            metrics = oq_metrics_new();
            if (!metrics || oq_metrics_add_process(metrics, "relay") != 0) goto out;
            o.metrics = metrics;
        }
        oq_sleep_ms(200, NULL);
    }
    if (listen) { /* GET /readyz: calls.db writable, the brokers answer, the lease loop runs */
        rr.relay = relay;
        rr.lease_ms = o.lease_ms;
        if (!(ready = oq_ready_new("relay", metrics)) || oq_ready_add_db(ready, o.db_path) != 0 ||
            oq_ready_add(ready, "lease", check_lease, &rr) != 0) {
            fprintf(stderr, "onceq relay: out of memory\n");
            goto out;
        }
        if (oq_ready_add_kafka(ready, o.brokers, cfg, &err) != 0) {
            fprintf(stderr, "onceq relay: readiness: %s\n", err.msg);
            goto out;
        }
        server = oq_metrics_serve_ready(metrics, listen, ready, &err);
        if (!server) {
            fprintf(stderr, "onceq relay: metrics listener %s: %s\n", listen, err.msg);
            goto out;
        }
    }
    if (oq_relay_start(relay, &err) != 0) {
        fprintf(stderr, "onceq relay: %s\n", err.msg);
        goto out;
    }
    if (ready && oq_ready_start(ready, &err) != 0) {
        fprintf(stderr, "onceq relay: readiness: %s\n", err.msg);
        goto out;
    }
    oq_service_ready("relay running (lease: active or standby)");
    while (!relay_sig) {
        oq_sleep_ms(50, NULL);
        oq_service_watchdog();
    }
    oq_service_stopping();
    OQ_LOG_INFO("relay", "signal %d: stopping (flushing in-flight deliveries)", (int)relay_sig);
    oq_relay_stop(relay);
    ret = OQ_EXIT_OK;
out:
    oq_metrics_serve_stop(server);
    oq_ready_destroy(ready);
    oq_relay_destroy(relay);
    oq_metrics_destroy(metrics);
    oq_config_destroy(cfg);
    if (sig_installed) {
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
    }
    return ret;
}
