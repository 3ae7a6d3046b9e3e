/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq producer`: the producer daemon. Opens calls.db (WAL, synchronous=FULL unless
 * --synchronous says otherwise), starts the group-commit writer, the HTTP API, the results
 * ingest (only with --brokers) and the retention: a purge of expired keys a second after
 * start and then every --purge-interval (5 min by default, 0 turns it off), so the database
 * does not grow without bound unless the operator runs `onceq purge`.
 *
 * The main thread only waits: signal handlers set a flag, the loop wakes every 100 ms to
 * check it, to reload the token files after SIGHUP, to run the periodic purge on its own
 * connection (bounded batches, so the writer never waits long for the lock) and, while the
 * results ingest runs, a redrive pass every --redrive-interval (through the writer: calls
 * with no news for --redrive-after get their message published again with the same message
 * id). SIGTERM/SIGINT drain: stop accepting, answer
 * requests in flight (up to --drain), stop the ingest after its batch, close the writer
 * after its queue, exit 0.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cmds.h"
#include "oq_catalog.h"
#include "oq_config.h"
#include "oq_db.h"
#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_metrics.h"
#include "oq_pg.h"
#include "oq_producer.h"
#include "oq_service.h"
#include "oq_tokens.h"
#include "oq_util.h"

static const oq_setting_t producer_settings[] = {
    OQ_CLI_LOG_SETTINGS,
    {"db", OQ_SET_STRING, "calls.db", 1, 4096, NULL,
     "producer database: a file (SQLite) or a postgres:// URI / libpq keyword string (schema "
     "onceq; keep the password in a passfile)"},
    {"listen", OQ_SET_STRING, "127.0.0.1:8081", 1, 128, NULL, "HTTP listen address host:port"},
    {"brokers", OQ_SET_STRING, NULL, 0, 4096, NULL,
     "Kafka bootstrap servers for the results ingest (off when unset)"},
    {"key-ttl", OQ_SET_DURATION, "24h", 1000, 365LL * 24 * 3600 * 1000, NULL,
     "retention of idempotency keys (expires_at = created_at + key-ttl)"},
    {"max-body", OQ_SET_SIZE, "1MiB", 256, 64LL * 1024 * 1024, NULL, "HTTP request body limit"},
    {"max-message-bytes", OQ_SET_SIZE, "1000000", 1000, 1000000000, NULL,
     "largest Kafka message the relay publishes: keep it equal to the relay's -X "
     "message.max.bytes (librdkafka's default is 1000000); a call whose message would be "
     "larger is refused at submit (413 payload_too_large), nothing written"},
    {"max-depth", OQ_SET_INT, "32", 2, 256, NULL, "JSON nesting limit of a request body"},
    {"threads", OQ_SET_INT, "2", 2, 64, NULL,
     "HTTP worker threads (libmicrohttpd pool), at least: the pool also has one per 120 "
     "connections of --max-connections and --probe-connections (9 with the defaults)"},
    {"max-batch", OQ_SET_INT, "256", 1, 10000, NULL, "group-commit batch cap (submits)"},
    {"commit-delay-us", OQ_SET_INT, "0", -1, 100000, NULL,
     "max wait to grow a group commit: 0 = adaptive, -1 = off"},
    {"checkpoint-pages", OQ_SET_INT, "1000", -1, 1000000, NULL,
     "WAL frames that trigger a background checkpoint (-1 = SQLite's own, inside commits)"},
    {"synchronous", OQ_SET_ENUM, "full", 0, 0, "full|normal|off",
     "SQLite synchronous level (anything but full weakens durability)"},
    {"purge-interval", OQ_SET_DURATION, "5m", 0, 365LL * 24 * 3600 * 1000, NULL,
     "retention: delete terminal calls past --key-ttl (and their audit, results, published "
     "outbox rows) a second after start and then this often; 0 = off (run `onceq purge`)"},
    {"purge-batch", OQ_SET_INT, "500", 1, 100000, NULL, "rows per purge transaction"},
    {"redrive-after", OQ_SET_DURATION, "2m", 0, 365LL * 24 * 3600 * 1000, NULL,
     "publish the message of a call that is not terminal and has had no state change for this "
     "long again, same message id (0 = off; needs --brokers)"},
    {"redrive-interval", OQ_SET_DURATION, "5s", 100, 3600000, NULL,
     "how often to look for calls due for a redrive"},
    {"redrive-batch", OQ_SET_INT, "100", 1, 100000, NULL, "calls looked at per redrive pass"},
    {"drain", OQ_SET_DURATION, "10s", 0, 600000, NULL,
     "on SIGTERM, wait this long for requests in flight"},
    {"metrics-listen", OQ_SET_STRING, NULL, 0, 128, NULL,
     "also serve /metrics on this host:port, open to whoever reaches it (bind it to loopback)"},
    {"max-connections", OQ_SET_INT, "1000", 1, 1000000, NULL,
     "open HTTP connections in all; more are closed at accept (logged, counted)"},
    {"max-connections-per-ip", OQ_SET_INT, "256", 0, 1000000, NULL,
     "open HTTP connections per client address, 0 = no limit (behind a proxy every client "
     "has the proxy's address)"},
    {"idle-timeout", OQ_SET_DURATION, "10s", 1000, 3600000, NULL,
     "close a connection that sent nothing for this long (incomplete request or keep-alive); "
     "a submit waiting for its commit is never timed out"},
    {"request-timeout", OQ_SET_DURATION, "30s", 1000, 3600000, NULL,
     "a request's line, headers and body must arrive within this (from the accept or the end "
     "of the previous request; the idle timeout still applies); a request being answered is "
     "never timed out"},
    {"probe-connections", OQ_SET_INT, "8", 0, 1000, NULL,
     "connections over --max-connections for GET /healthz and /readyz only (taken when no "
     "slow request can be evicted)"},
    {"token-file", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "API tokens, lines 'TOKEN TENANT': /v1/ then needs Authorization: Bearer and the tenant "
     "is the token's (reloaded on SIGHUP)"},
    {"metrics-access", OQ_SET_ENUM, "loopback", 0, 0, "loopback|open|token",
     "who may GET /metrics and /stats: loopback peers, anyone, or --metrics-token-file bearers"},
    {"metrics-token-file", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "tokens for /metrics and /stats, one per line (--metrics-access token; reloaded on "
     "SIGHUP)"},
    {"tools", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "tools file (the consumers' --tools): a submit of a tool it does not list is 400 "
     "unknown_tool, arguments its input_schema refuses are 400 bad_args, GET /v1/tools lists it"},
    {"mcp-wait", OQ_SET_DURATION, "30s", 1, 600000, NULL,
     "POST /mcp: how long a tools/call waits for its call to settle; still running then, it "
     "answers isError with {\"status\":\"running\",\"call_id\"} (retry with the same key)"},
    {"webhook-secret-file", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "webhooks: a file whose first line is the secret that signs the deliveries of tenants "
     "without a webhook_secret= of their own in --token-file (16..512 printable bytes)"},
    {"webhook-concurrency", OQ_SET_INT, "8", 1, 256, NULL,
     "webhooks: deliveries sent at once (threads of the sender)"},
    {"webhook-timeout", OQ_SET_DURATION, "10s", 100, 600000, NULL,
     "webhooks: one try, connect included; no 2xx within it is a failed try"},
    {"webhook-max-tries", OQ_SET_INT, "20", 1, 1000, NULL,
     "webhooks: a delivery is dead (onceq dlq --webhooks-db) after this many tries"},
    {"webhook-max-age", OQ_SET_DURATION, "24h", 1000, 365LL * 24 * 3600 * 1000, NULL,
     "webhooks: ... or when its next try would come later than this after the call settled"},
    {"webhook-retry-base", OQ_SET_DURATION, "1s", 10, 3600000, NULL,
     "webhooks: the delay after the first failed try; it doubles after each (equal jitter)"},
    {"webhook-retry-max", OQ_SET_DURATION, "1h", 10, 24LL * 3600 * 1000, NULL,
     "webhooks: the longest delay between two tries"},
    OQ_SETTING_TOPIC_PREFIX,
    OQ_SETTING_KAFKA_PROFILE,
};

/* The first line of \p path (the webhook secret) into \p out; a file readable by others gets a
 * warning, as a token file does. */
static int read_secret_file(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "onceq producer: --webhook-secret-file %s: cannot read it\n", path);
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        OQ_LOG_WARN("producer", "webhook secret file %s is readable by group or others (mode %03o)",
                    path, (unsigned)(st.st_mode & 0777));
    if (!fgets(out, (int)cap, f)) out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\r\n")] = '\0';
    if (!oq_webhook_secret_valid(out)) {
        fprintf(stderr,
                "onceq producer: --webhook-secret-file %s: its first line must be %d..%d "
                "printable ASCII bytes without spaces\n",
                path, OQ_WEBHOOK_SECRET_MIN_LEN, OQ_WEBHOOK_SECRET_MAX_LEN);
        return -1;
    }
    return 0;
}

static const char producer_usage[] =
    "usage: onceq producer --db calls.db --listen 127.0.0.1:8081 [--brokers B] [-X k=v]...\n"
    "                      [--key-ttl 24h] [--max-body 1MiB] [--max-message-bytes 1000000]\n"
    "                      [--purge-interval 5m] [--tools tools.json]\n"
    "\n"
    "HTTP API: POST /v1/tool-calls (Idempotency-Key header), GET /v1/tool-calls/{id},\n"
    "GET /v1/tool-calls/by-key/{key}?tenant=, GET /v1/tools (with --tools), POST /mcp (MCP "
    "Streamable HTTP: tools/list, tools/call), GET /stats, GET "
    "/metrics, GET /healthz\n"
    "(liveness), GET /readyz (database writable, brokers reachable).\n"
    "Without --brokers the results ingest (topic onceq.tool-results) is off.\n"
    "SIGHUP reloads --token-file and --metrics-token-file; SIGTERM/SIGINT drain and exit.";

static volatile sig_atomic_t producer_stop, producer_hup;

static void on_signal(int sig)
{
    if (sig == SIGHUP)
        producer_hup = 1;
    else
        producer_stop = sig;
}

int oq__cmd_producer(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc = -1;
    oq_producer_t *p = NULL;
    oq_http_t *h = NULL;
    oq_ingest_t *in = NULL;
    oq_webhooks_t *wh = NULL;
    char wsecret[OQ_WEBHOOK_SECRET_MAX_LEN + 2] = "";
    oq_metrics_server_t *ms = NULL;
    sqlite3 *pdb = NULL;
    oq_catalog_t *catalog = NULL;
    oq_metrics_t *metrics = oq_metrics_new();
    if (metrics && oq_metrics_add_process(metrics, "producer") != 0) {
        oq_metrics_destroy(metrics);
        metrics = NULL;
    }
    oq_config_t *cfg =
        oq_config_new(producer_settings, sizeof producer_settings / sizeof producer_settings[0]);
    if (!cfg || !metrics) {
        fprintf(stderr, "onceq producer: out of memory\n");
        goto out;
    }
    if ((prc = oq_cli_parse(cfg, "onceq", producer_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    if (oq_config_npositional(cfg) > 0) {
        fprintf(stderr, "onceq producer: unexpected argument '%s'\n", oq_config_positional(cfg, 0));
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    const char *db = oq_config_str(cfg, "db");
    const char *sync = oq_config_str(cfg, "synchronous");
    const char *brokers = oq_config_str(cfg, "brokers");
    int64_t ttl = oq_config_int(cfg, "key-ttl");
    int64_t purge_every = oq_config_int(cfg, "purge-interval");
    const char *maccess = oq_config_str(cfg, "metrics-access");
    const char *mtokens = oq_config_str(cfg, "metrics-token-file");
    int by_token = strcmp(maccess, "token") == 0;
    if (by_token != (mtokens != NULL)) {
        fprintf(stderr, "onceq producer: %s\n",
                by_token ? "--metrics-access token needs --metrics-token-file"
                         : "--metrics-token-file needs --metrics-access token");
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    const char *prefix = oq_config_str(cfg, "topic-prefix");
    if (oq_cli_check_topic_prefix(cfg, "producer") != 0) {
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    int64_t redrive_after = oq_config_int(cfg, "redrive-after");
    int64_t redrive_every = oq_config_int(cfg, "redrive-interval");

    const char *tools = oq_config_str(cfg, "tools");
    if (tools && oq_catalog_load(tools, &catalog, &err) != 0) {
        fprintf(stderr, "onceq producer: %s\n", err.msg);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (catalog)
        OQ_LOG_INFO("producer", "tool catalogue: %zu tools (%s and the compiled ones)",
                    oq_catalog_size(catalog), tools);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (strcmp(sync, "full") != 0)
        OQ_LOG_WARN("producer", "synchronous=%s: a power loss may lose acknowledged submits", sync);
    oq_producer_opts_t po = {.synchronous = sync,
                             .key_ttl_ms = ttl,
                             .max_batch = (int)oq_config_int(cfg, "max-batch"),
                             .metrics = metrics,
                             .commit_delay_us = (int)oq_config_int(cfg, "commit-delay-us"),
                             .checkpoint_pages = (int)oq_config_int(cfg, "checkpoint-pages"),
                             .max_message_bytes = oq_config_int(cfg, "max-message-bytes"),
                             .redrive_after_ms = redrive_after > 0 ? redrive_after : -1,
                             .topic_prefix = prefix};
    /* A PostgreSQL string may carry a password: it is never printed, and refused here (a
     * command line is visible to every user of the host). */
    int on_pg = oq_backend_of(db) == OQ_BACKEND_POSTGRES;
    if (on_pg && oq_pg_conninfo_has_password(db)) {
        fprintf(stderr, "onceq producer: --db holds a password: put it in a passfile "
                        "(passfile=... in the string, or PGPASSFILE)\n");
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    const char *db_shown = on_pg ? "postgres" : db;
    if (oq_producer_open(db, &po, &p, &err) != 0) {
        fprintf(stderr, "onceq producer: %s: %s\n", db_shown, err.msg);
        goto out;
    }
    if (brokers && *brokers) {
        if (oq_ingest_start(p, brokers, cfg, metrics, &in, &err) != 0) {
            fprintf(stderr, "onceq producer: results ingest: %s\n", err.msg);
            ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
            goto out;
        }
        /* result_inbox rows live as long as their call (key-ttl): a result redelivered after
         * that would find no call and be counted as unknown_call, never applied twice. */
        char results_topic[OQ_TOPIC_NAME_CAP];
        OQ_LOG_INFO("producer",
                    "result dedupe window = key-ttl (%lld ms): keep the retention of %s at or "
                    "below it",
                    (long long)ttl,
                    oq_topic_name(prefix, OQ_TOPIC_RESULTS, results_topic, sizeof results_topic));
    } else {
        OQ_LOG_INFO("producer", "no --brokers: results ingest is off (calls stay pending/running)");
        if (redrive_after > 0)
            OQ_LOG_INFO("producer", "no --brokers: redrive is off too (no call can finish here)");
    }
    /* Webhooks: the sender of the deliveries decide.c queues (producer/webhooks.c). */
    const char *wfile = oq_config_str(cfg, "webhook-secret-file");
    if (wfile && read_secret_file(wfile, wsecret, sizeof wsecret) != 0) {
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    oq_webhooks_opts_t wo = {
        .concurrency = (int)oq_config_int(cfg, "webhook-concurrency"),
        .timeout_ms = oq_config_int(cfg, "webhook-timeout"),
        .max_tries = (int)oq_config_int(cfg, "webhook-max-tries"),
        .max_age_ms = oq_config_int(cfg, "webhook-max-age"),
        .backoff_base_ms = oq_config_int(cfg, "webhook-retry-base"),
        .backoff_max_ms = oq_config_int(cfg, "webhook-retry-max"),
        .secret = wfile ? wsecret : NULL,
        .token_file = oq_config_str(cfg, "token-file"),
        .metrics = metrics,
    };
    if (oq_webhooks_start(p, &wo, &wh, &err) != 0) {
        fprintf(stderr, "onceq producer: webhooks: %s\n", err.msg);
        ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    /* Without results every call would look stuck: redrive only where they are ingested. */
    int redrive_on = in && redrive_after > 0;
    int64_t per_ip = oq_config_int(cfg, "max-connections-per-ip");
    oq_http_opts_t ho = {
        .listen = oq_config_str(cfg, "listen"),
        .max_body = oq_config_int(cfg, "max-body"),
        .threads = (int)oq_config_int(cfg, "threads"),
        .max_depth = (size_t)oq_config_int(cfg, "max-depth"),
        .metrics = metrics,
        .ingest = in,
        .max_conns = (int)oq_config_int(cfg, "max-connections"),
        .max_conns_per_ip = per_ip == 0 ? -1 : (int)per_ip,
        .idle_timeout_ms = (int)oq_config_int(cfg, "idle-timeout"),
        .request_timeout_ms = (int)oq_config_int(cfg, "request-timeout"),
        .probe_slots = oq_config_int(cfg, "probe-connections") == 0
                           ? -1
                           : (int)oq_config_int(cfg, "probe-connections"),
        .token_file = oq_config_str(cfg, "token-file"),
        .metrics_access = by_token                       ? OQ_HTTP_METRICS_TOKEN
                          : strcmp(maccess, "open") == 0 ? OQ_HTTP_METRICS_OPEN
                                                         : OQ_HTTP_METRICS_LOOPBACK,
        .metrics_token_file = mtokens,
        .catalog = catalog,
        .mcp_wait_ms = oq_config_int(cfg, "mcp-wait"),
        .webhooks = wh,
    };
    if (oq_http_start(p, &ho, &h, &err) != 0) {
        fprintf(stderr, "onceq producer: %s\n", err.msg);
        ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    const char *ml = oq_config_str(cfg, "metrics-listen");
    if (ml && *ml && !(ms = oq_metrics_serve(metrics, ml, &err))) {
        fprintf(stderr, "onceq producer: metrics: %s\n", err.msg);
        goto out;
    }
    OQ_LOG_INFO("producer",
                "up db=%s listen=%s key_ttl_ms=%lld purge_interval_ms=%lld max_body=%lld "
                "max_message_bytes=%lld redrive_after_ms=%lld redrive_interval_ms=%lld",
                db_shown, oq_config_str(cfg, "listen"), (long long)ttl, (long long)purge_every,
                (long long)oq_config_int(cfg, "max-body"),
                (long long)oq_config_int(cfg, "max-message-bytes"),
                (long long)(redrive_on ? redrive_after : 0), (long long)redrive_every);

    if (purge_every == 0)
        OQ_LOG_WARN("producer", "retention is off (--purge-interval 0): calls.db grows until "
                                "`onceq purge` runs");
    /* The first purge soon after start (a restart catches up at once), then every interval. */
    oq_service_ready("serving HTTP");
    int64_t next_purge = oq_mono_us() + 1000 * 1000;
    int64_t next_redrive = oq_mono_us() + redrive_every * 1000;
    while (!producer_stop) {
        oq_sleep_ms(100, NULL);
        oq_service_watchdog();
        if (redrive_on && oq_mono_us() >= next_redrive) {
            oq_redrive_stats_t rs = {0, 0, 0};
            int more = 1;
            /* full batches mean more are due: go on (each pass is one short item) */
            for (int i = 0; more && i < 100 && !producer_stop; i++) {
                int batch = (int)oq_config_int(cfg, "redrive-batch");
                if (oq_producer_redrive(p, batch, &rs, &err) != 0) {
                    OQ_LOG_WARN("producer", "redrive: %s", err.msg);
                    break;
                }
                more = rs.redriven + rs.waiting + rs.deferred >= batch;
            }
            next_redrive = oq_mono_us() + redrive_every * 1000;
        }
        if (producer_hup) {
            producer_hup = 0;
            if (oq_http_reload(h, &err) != 0)
                OQ_LOG_ERROR("producer", "SIGHUP: %s; the tokens in use are kept", err.msg);
            else if (oq_webhooks_reload(wh, &err) != 0)
                OQ_LOG_ERROR("producer", "SIGHUP: webhooks: %s; the secrets in use are kept",
                             err.msg);
        }
        if (purge_every > 0 && oq_mono_us() >= next_purge) {
            next_purge = oq_mono_us() + purge_every * 1000;
            oq_purge_stats_t ps = {0};
            if (on_pg) {
                if (oq_producer_purge(p, oq_now_ms(), ttl, (int)oq_config_int(cfg, "purge-batch"),
                                      &ps, &err) != 0)
                    OQ_LOG_WARN("producer", "purge: %s", err.msg);
                continue;
            }
            if (!pdb) {
                oq_db_opts_t dbo = {sync, 0, 0};
                if (oq_db_open(db, &dbo, &pdb, &err) != 0) {
                    OQ_LOG_ERROR("producer", "purge: %s", err.msg);
                    continue;
                }
            }
            if (oq_store_purge(pdb, oq_now_ms(), ttl, (int)oq_config_int(cfg, "purge-batch"), &ps,
                               &err) != 0)
                OQ_LOG_WARN("producer", "purge: %s", err.msg);
            else if (ps.calls || ps.outbox || ps.result_inbox || ps.dead)
                OQ_LOG_INFO("producer",
                            "purged calls=%lld outbox=%lld audit=%lld result_inbox=%lld "
                            "dead_letters=%lld",
                            (long long)ps.calls, (long long)ps.outbox, (long long)ps.audit,
                            (long long)ps.result_inbox, (long long)ps.dead);
        }
    }
    oq_service_stopping();
    OQ_LOG_INFO("producer", "signal %d: draining", (int)producer_stop);
    ret = OQ_EXIT_OK;
out:
    oq_http_stop(h, cfg ? (int)oq_config_int(cfg, "drain") : 0);
    if (ms) oq_metrics_serve_stop(ms);
    oq_ingest_stop(in);
    oq_webhooks_stop(wh); /* before the writer it records its tries through */
    oq_producer_close(p);
    oq_catalog_destroy(catalog); /* after the HTTP server, which borrowed it */
    if (pdb) sqlite3_close_v2(pdb);
    oq_metrics_destroy(metrics);
    if (cfg) oq_config_destroy(cfg);
    if (ret == OQ_EXIT_OK && prc < 0) OQ_LOG_INFO("producer", "stopped"); /* not after --help */
    return ret;
}
