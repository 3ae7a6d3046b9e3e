/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq console`: the operators' web console (console/oq_console.h). This file parses the
 * flags, starts the server, prints its URL on stdout (one line, "onceq console: http://...",
 * so `onceq up` and scripts can find it) and waits for SIGTERM / SIGINT.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmds.h"
#include "oq_dbh.h"
#include "oq_console.h"
#include "oq_envelope.h"
#include "oq_log.h"

#define MAX_METRICS_URLS 16

static const oq_setting_t console_settings[] = {
    OQ_CLI_LOG_SETTINGS,
    {"producer-db", OQ_SET_STRING, "calls.db", 1, 4096, NULL,
     "the producer's database: a file (SQLite) or a postgres:// URI / libpq keyword string"},
    {"consumer-db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "the consumers' database (effects.db, or a postgres:// URI / libpq keyword string): "
     "timelines' consumer side and the review queue"},
    {"listen", OQ_SET_STRING, "127.0.0.1:8089", 1, 128, NULL,
     "HOST:PORT (port 0: any free port); a non-loopback HOST needs --token-file"},
    {"token-file", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "bearer tokens, the producer's format (TOKEN TENANT [operator]): every request then "
     "needs one; a tenant sees its own calls, an operator all, and only an operator acts"},
    {"metrics-url", OQ_SET_STRING, "", 0, 8192, NULL,
     "comma-separated /metrics URLs of the daemons (producer, consumers), for the charts"},
    {"brokers", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "Kafka bootstrap servers: the DLQ topic's dead letters, listed and redriven by onceq dlq"},
    OQ_SETTING_TOPIC_PREFIX,
};

static const char console_usage[] =
    "usage: onceq console [--producer-db calls.db] [--consumer-db effects.db]\n"
    "                     [--listen 127.0.0.1:8089] [--token-file FILE]\n"
    "                     [--metrics-url http://127.0.0.1:8081/metrics,...]\n"
    "                     [--brokers B [--topic-prefix P]]\n"
    "Pages: calls (filters, search by key or id), a call's timeline, the review queue with\n"
    "resolve, the relay's dead rows, live charts from the daemons' /metrics.";

static volatile sig_atomic_t console_stop;

static void on_signal(int sig)
{
    console_stop = sig;
}

int oq__cmd_console(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    oq_console_t *c = NULL;
    char *urls = NULL;
    const char *mv[MAX_METRICS_URLS];
    size_t nm = 0;
    oq_config_t *cfg =
        oq_config_new(console_settings, sizeof console_settings / sizeof console_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq", console_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    if (oq_config_npositional(cfg) != 0) {
        fprintf(stderr, "%s\n", console_usage);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (!(urls = strdup(oq_config_str(cfg, "metrics-url")))) goto out;
    char exe[PATH_MAX];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (el <= 0) {
        fprintf(stderr, "onceq console: readlink /proc/self/exe: %s\n", strerror(errno));
        goto out;
    }
    exe[el] = 0;
    char *save = NULL;
    for (char *u = strtok_r(urls, ",", &save); u; u = strtok_r(NULL, ",", &save)) {
        if (nm == MAX_METRICS_URLS ||
            (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0)) {
            fprintf(stderr, "onceq console: --metrics-url: at most %d http(s):// URLs\n",
                    MAX_METRICS_URLS);
            ret = OQ_EXIT_USAGE;
            goto out;
        }
        mv[nm++] = u;
    }
    const char *user = getenv("USER");
    oq_console_opts_t o = {
        .producer_db = oq_config_str(cfg, "producer-db"),
        .consumer_db = oq_config_str(cfg, "consumer-db"),
        .listen = oq_config_str(cfg, "listen"),
        .token_file = oq_config_str(cfg, "token-file"),
        .metrics_urls = mv,
        .n_metrics_urls = nm,
        .local_operator = user && user[0] ? user : "local",
        .brokers = oq_config_str(cfg, "brokers"),
        .topic_prefix =
            oq_config_is_set(cfg, "topic-prefix") ? oq_config_str(cfg, "topic-prefix") : NULL,
        .self_exe = exe,
    };
    if ((ret = oq__cmd_consumer_db_refused("onceq console", o.consumer_db)) != 0) goto out;
    ret = OQ_EXIT_FAIL;
    int pg = oq_backend_of(o.producer_db) == OQ_BACKEND_POSTGRES;
    if (pg) {
        /* a PostgreSQL producer database: reachable, migrated, no password in the string;
         * told now rather than at the first page */
        oq_dbh_t h;
        oq_db_opts_t ro = {NULL, 0, 1};
        if (oq_dbh_open(o.producer_db, &ro, &h, &err) != 0) {
            fprintf(stderr, "onceq console: --producer-db: %s\n", err.msg);
            ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
            goto out;
        }
        oq_dbh_close(&h);
    }
    int cpg = o.consumer_db && oq_backend_of(o.consumer_db) == OQ_BACKEND_POSTGRES;
    if ((!pg && access(o.producer_db, R_OK) != 0) ||
        (o.consumer_db && !cpg && access(o.consumer_db, R_OK) != 0)) {
        fprintf(stderr, "onceq console: %s: cannot read\n",
                !pg && access(o.producer_db, R_OK) != 0 ? o.producer_db : o.consumer_db);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (oq_console_start(&o, &c, &err) != 0) {
        fprintf(stderr, "onceq console: %s\n", err.msg);
        ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    char host[160];
    const char *colon = strrchr(o.listen, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - o.listen), o.listen);
    printf("onceq console: http://%s:%d/\n", host, oq_console_port(c));
    fflush(stdout);
    OQ_LOG_INFO("console", "listening url=http://%s:%d/ tokens=%s", host, oq_console_port(c),
                o.token_file ? "on" : "off");
    while (!console_stop)
        pause();
    OQ_LOG_INFO("console", "signal %d: stopping", (int)console_stop);
    ret = OQ_EXIT_OK;
out:
    oq_console_stop(c);
    free(urls);
    oq_config_destroy(cfg);
    return ret;
}
