/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq-downstream`: run the test payment service (downstream/oq_downstream.h), or with the
 * positional word `stats`, print the statistics of a ledger file as JSON and exit. A program of
 * its own, built beside onceq and onceq-bench, so that a test service is not part of what a
 * deployment runs (`onceq downstream` only points here, exit 2).
 *
 * The main thread only waits: SIGTERM/SIGINT stop (answer requests in flight, up to --drain),
 * SIGUSR1 stops listening (connections refused) until SIGUSR2, and every 20 ms it applies the
 * down/up requests of the admin API (oq_downstream_tick).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_cli.h"
#include "oq_config.h"
#include "oq_downstream.h"
#include "oq_log.h"
#include "oq_util.h"
#include "oq_json.h"

static const oq_setting_t downstream_settings[] = {
    {"listen", OQ_SET_STRING, "127.0.0.1:8090", 1, 128, NULL,
     "HTTP listen address host:port (port 0: any free port, logged)"},
    {"db", OQ_SET_STRING, "downstream.db", 1, 4096, NULL, "ledger database file"},
    {"keys", OQ_SET_ENUM, "honour", 0, 0, "honour|ignore",
     "honour the Idempotency-Key header, or ignore it (every request is a new payment)"},
    {"lookup", OQ_SET_ENUM, "on", 0, 0, "on|off",
     "offer GET /v1/payments?reference=|?idempotency_key= (off: 501)"},
    {"fault", OQ_SET_STRING, "", 0, 255, NULL,
     "injected faults with probabilities, e.g. drop-after-commit:0.2,429:0.1 (kinds: "
     "drop-after-commit late-after-commit drop-before-commit 500 503 429 decline slow)"},
    {"seed", OQ_SET_INT, "0", 0, INT64_MAX, NULL, "fault generator seed (0: random, logged)"},
    {"slow", OQ_SET_DURATION, "2s", 1, 600000, NULL, "delay of the slow fault"},
    {"late", OQ_SET_DURATION, "5s", 1, 600000, NULL,
     "delay of late-after-commit (make it longer than the client's timeout)"},
    {"retry-after", OQ_SET_DURATION, "1s", 1000, 86400000, NULL,
     "Retry-After sent with 429 and 503 (whole seconds)"},
    {"threads", OQ_SET_INT, "2", 1, 64, NULL,
     "HTTP worker threads (libmicrohttpd pool), at least: the pool also has one per 120 of its "
     "1,000 connections (9)"},
    {"max-batch", OQ_SET_INT, "256", 1, 10000, NULL,
     "payments per ledger transaction (group commit; 1 = one commit per payment)"},
    {"synchronous", OQ_SET_ENUM, "full", 0, 0, "full|normal|off",
     "SQLite synchronous level of the ledger (anything but full weakens durability)"},
    {"max-body", OQ_SET_SIZE, "64k", 256, 16LL * 1024 * 1024, NULL, "request body limit"},
    {"drain", OQ_SET_DURATION, "5s", 0, 600000, NULL,
     "on SIGTERM, wait this long for requests in flight"},
    {"top", OQ_SET_INT, "20", 0, 100000, NULL,
     "stats: how many duplicated keys / references to list"},
};

static const char downstream_usage[] =
    "usage: onceq-downstream --listen 127.0.0.1:8090 --db downstream.db [--keys honour|ignore]\n"
    "                        [--lookup on|off] [--fault KIND:P,...] [--seed N]\n"
    "       onceq-downstream stats --db downstream.db [--top 20]\n"
    "\n"
    "A payment service with its own SQLite ledger and switchable faults, to test against.\n"
    "POST /v1/payments (Idempotency-Key; body {\"amount\":int,\"currency\":\"EUR\",\n"
    "\"reference\":\"...\"}), GET /v1/payments/{id}, GET /v1/payments?reference=R,\n"
    "GET /v1/payments?idempotency_key=K, GET /ledger/stats, GET|POST /admin/mode,\n"
    "POST /admin/down {\"ms\":N}, GET /healthz, GET /metrics.\n"
    "Per request: X-Downstream-Fault: KIND|none, X-Downstream-Keys: honour|ignore,\n"
    "X-Downstream-Lookup: on|off, X-Downstream-Delay-Ms: N, X-Downstream-Retry-After: S.\n"
    "Signals: SIGUSR1 stops listening (connections refused), SIGUSR2 listens again.\n"
    "`stats` prints the ledger's effects, duplicates (keys or references with more than one\n"
    "effect) and DSR = duplicate effects / logical calls, as JSON.";

static volatile sig_atomic_t ds_stop, ds_down, ds_up;

static void on_signal(int sig)
{
    if (sig == SIGUSR1)
        ds_down = 1;
    else if (sig == SIGUSR2)
        ds_up = 1;
    else
        ds_stop = sig;
}

static int run_stats(oq_config_t *cfg)
{
    oq_error_t err = {0};
    json_t *s = NULL;
    const char *db = oq_config_str(cfg, "db");
    if (oq_downstream_ledger_stats(db, (int)oq_config_int(cfg, "top"), &s, &err) != 0) {
        fprintf(stderr, "onceq-downstream stats: %s: %s\n", db, err.msg);
        return err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
    }
    char *text = oq_json_dumps(s, JSON_INDENT(2));
    json_decref(s);
    if (!text) return OQ_EXIT_FAIL;
    printf("%s\n", text);
    free(text);
    return OQ_EXIT_OK;
}

int main(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    oq_downstream_t *d = NULL;
    oq_log_init(OQ_LOG_INFO, OQ_LOG_FMT_LOGFMT, 1);
    oq_config_t *cfg = oq_config_new(downstream_settings,
                                     sizeof downstream_settings / sizeof downstream_settings[0]);
    if (!cfg) {
        fprintf(stderr, "onceq-downstream: out of memory\n");
        return OQ_EXIT_FAIL;
    }
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("onceq-downstream %s\n", ONCEQ_VERSION);
        ret = OQ_EXIT_OK;
        goto out;
    }
    oq_config_use_env(cfg, OQ_CLI_ENV_PREFIX);
    if ((prc = oq_config_parse_args(cfg, downstream_usage, argc, argv, 1, &err)) != 0) {
        if (prc == OQ_EHELP) {
            ret = OQ_EXIT_OK;
        } else {
            fprintf(stderr, "onceq-downstream: %s\n(see: onceq-downstream --help)\n", err.msg);
            ret = OQ_EXIT_USAGE;
        }
        goto out;
    }
    if (oq_config_npositional(cfg) > 0) {
        if (oq_config_npositional(cfg) == 1 && strcmp(oq_config_positional(cfg, 0), "stats") == 0) {
            ret = run_stats(cfg);
        } else {
            fprintf(stderr, "onceq-downstream: unexpected argument '%s' (only 'stats')\n",
                    oq_config_positional(cfg, oq_config_npositional(cfg) > 1 ? 1 : 0));
            ret = OQ_EXIT_USAGE;
        }
        goto out;
    }
    const char *faults = oq_config_str(cfg, "fault");
    if (oq_downstream_check_faults(faults, &err) != 0) {
        fprintf(stderr, "onceq-downstream: --fault: %s\n", err.msg);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    const char *sync = oq_config_str(cfg, "synchronous");
    if (strcmp(sync, "full") != 0)
        OQ_LOG_WARN("downstream", "synchronous=%s: a power loss may lose committed payments", sync);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    oq_downstream_opts_t o = {
        .listen = oq_config_str(cfg, "listen"),
        .db = oq_config_str(cfg, "db"),
        .synchronous = sync,
        .keys_ignore = strcmp(oq_config_str(cfg, "keys"), "ignore") == 0,
        .lookup_off = strcmp(oq_config_str(cfg, "lookup"), "off") == 0,
        .faults = faults,
        .seed = (uint64_t)oq_config_int(cfg, "seed"),
        .slow_ms = oq_config_int(cfg, "slow"),
        .late_ms = oq_config_int(cfg, "late"),
        .retry_after_s = (int)((oq_config_int(cfg, "retry-after") + 999) / 1000),
        .threads = (int)oq_config_int(cfg, "threads"),
        .max_batch = (int)oq_config_int(cfg, "max-batch"),
        .max_body = oq_config_int(cfg, "max-body"),
    };
    if (oq_downstream_start(&o, &d, &err) != 0) {
        fprintf(stderr, "onceq-downstream: %s\n", err.msg);
        ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    while (!ds_stop) {
        if (ds_down) {
            ds_down = 0;
            oq_downstream_set_down(d, 0);
        }
        if (ds_up) {
            ds_up = 0;
            oq_downstream_set_down(d, -1);
        }
        oq_downstream_tick(d);
        oq_sleep_ms(20, NULL);
    }
    OQ_LOG_INFO("downstream", "signal %d: stopping", (int)ds_stop);
    ret = OQ_EXIT_OK;
out:
    oq_downstream_stop(d, cfg ? (int)oq_config_int(cfg, "drain") : 0);
    oq_config_destroy(cfg);
    return ret;
}
