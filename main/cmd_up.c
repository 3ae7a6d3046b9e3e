/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq up`: a small process supervisor for a whole pipeline on one host.
 *
 * It runs children of this very binary (/proc/self/exe) with fork + execv, never a shell: the
 * embedded broker (unless --brokers names an external cluster), the producer (HTTP API), the
 * relay of the producer's outbox and N consumer-group workers. Each child writes its stdout and
 * stderr to DIR/<name>.log (appended, so restarts keep history) and gets PR_SET_PDEATHSIG, so a
 * supervisor killed with -9 does not leave orphans serving stale ports.
 *
 * The main loop reaps children with waitpid(WNOHANG) and restarts one that died, with an
 * exponential backoff (250 ms doubling to 30 s, reset after a child stayed up for 30 s). The
 * embedded broker is the exception that forces a wider restart: librdkafka's mock cluster keeps
 * topics and offsets in memory and serves on random ports, so when it dies every other child
 * is stopped, the broker restarted, the new bootstrap address read, and the others started
 * again against it. Nothing is lost by that (outboxes are durable and consumers dedupe through
 * their inbox), but committed offsets are, so messages already consumed may be redelivered and
 * absorbed as duplicates.
 *
 * With --db-url every stage runs on one PostgreSQL database (schema onceq) instead of the two
 * SQLite files. The string reaches the children through their environment (ONCEQ_DB), never
 * their argv, and is never printed: a string holding a password is refused (it belongs in a
 * passfile: `passfile=` in the URI or PGPASSFILE, which the children inherit). The server is
 * probed and migrated before any child starts, so a database that is away at start is one
 * clear error and exit 1, not children dying and restarting in a loop; once running, the
 * children ride out an outage on their own and their /readyz say unready meanwhile.
 *
 * "pipeline running" is said once a call would run through: the producer serves HTTP and every
 * Kafka consumer started here (the consumers', the producer's results consumer) has been given
 * its share of its group. Until then a call is accepted but waits for the group to form: about
 * 3 s on the embedded broker, whose coordinator holds a group's first JoinGroup that long. The
 * children say so in systemd's notify protocol (common/service.c: READY=1 from the producer,
 * X_ONCEQ_GROUP=joined from each rebalance) to a datagram socket of the supervisor's own,
 * DIR/notify.sock, named in their NOTIFY_SOCKET; SO_PASSCRED has the kernel attach each
 * sender's pid, and only a current child's messages count. After --ready-wait it is said
 * anyway, naming who has not joined. Under a service manager of its own, `onceq up` then sends
 * READY=1 to that manager's socket.
 *
 * SIGHUP is passed to the producer (it reloads its token files). SIGTERM / SIGINT stop the
 * pipeline in dependency order: consumers, relay and producer first
 * (TERM, wait up to --stop-timeout, then KILL), the broker last. Signal handlers only set flags;
 * all work happens in the loop.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmds.h"
#include "oq_config.h"
#include "oq_consumer.h"
#include "oq_envelope.h"
#include "oq_log.h"
#include "oq_metrics.h"
#include "oq_pg.h"
#include "oq_service.h"
#include "oq_util.h"

#define UP_MAX_CHILDREN 40
#define UP_MAX_ARGS 64

static const oq_setting_t up_settings[] = {
    OQ_CLI_LOG_SETTINGS,
    {"dir", OQ_SET_STRING, "./onceq-data", 1, PATH_MAX - 64, NULL,
     "data directory: calls.db, effects.db, bootstrap file and one log per child"},
    {"db-url", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "PostgreSQL for every stage (postgres:// URI or libpq keyword string, schema onceq) "
     "instead of DIR/calls.db and DIR/effects.db; the password in a passfile (passfile= or "
     "PGPASSFILE), never in the string; reaches the children as ONCEQ_DB, never on argv"},
    {"consumers", OQ_SET_INT, "0", 0, 32, NULL,
     "number of consumer-group workers (0: one on SQLite, where they would share one "
     "effects.db whose writes take turns; two with --db-url)"},
    {"listen", OQ_SET_STRING, "127.0.0.1:8081", 1, 128, NULL, "producer HTTP listen address"},
    {"brokers", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "external Kafka bootstrap servers (default: run the embedded broker)"},
    {"embedded-brokers", OQ_SET_INT, "1", 1, 16, NULL,
     "brokers in the embedded cluster (each idle consumer fetches from every broker that "
     "leads one of its partitions, so more cost idle CPU and carry nothing more: one process)"},
    {"group", OQ_SET_STRING, "onceq-workers", 1, 255, NULL, "consumer group id"},
    OQ_SETTING_TOPIC_PREFIX,
    OQ_SETTING_KAFKA_PROFILE,
    {"stop-timeout", OQ_SET_DURATION, "10s", 100, 600000, NULL,
     "how long to wait for children after SIGTERM before SIGKILL (consumers: at least their "
     "--drain + 10s)"},
    {"broker-wait", OQ_SET_DURATION, "20s", 100, 600000, NULL,
     "how long to wait for the embedded broker's bootstrap file"},
    {"ready-wait", OQ_SET_DURATION, "60s", 0, 3600000, NULL,
     "how long to wait for the producer to serve and every consumer to join its Kafka group "
     "before saying \"pipeline running\" anyway, naming who has not (0 = say it at once)"},
    /* Passed to the producer when given; unset, the producer's defaults apply. */
    {"max-connections", OQ_SET_INT, NULL, 1, 1000000, NULL,
     "producer: open HTTP connections in all (producer default 1000)"},
    {"max-connections-per-ip", OQ_SET_INT, NULL, 0, 1000000, NULL,
     "producer: open HTTP connections per client address, 0 = no limit (default 256)"},
    {"idle-timeout", OQ_SET_DURATION, NULL, 1000, 3600000, NULL,
     "producer: close a connection idle this long (default 10s)"},
    {"request-timeout", OQ_SET_DURATION, NULL, 1000, 3600000, NULL,
     "producer: a request's line, headers and body must arrive within this (default 30s)"},
    {"probe-connections", OQ_SET_INT, NULL, 0, 1000, NULL,
     "producer: connections over --max-connections for /healthz and /readyz only (default 8)"},
    {"mcp-wait", OQ_SET_DURATION, NULL, 1, 600000, NULL,
     "producer: how long a tools/call on POST /mcp waits for its call (default 30s)"},
    {"token-file", OQ_SET_STRING, NULL, 1, PATH_MAX - 1, NULL,
     "producer: API tokens, lines 'TOKEN TENANT' (default: no authentication); SIGHUP to "
     "onceq up reloads it"},
    {"metrics-access", OQ_SET_ENUM, NULL, 0, 0, "loopback|open|token",
     "producer: who may GET /metrics and /stats (default loopback)"},
    {"metrics-token-file", OQ_SET_STRING, NULL, 1, PATH_MAX - 1, NULL,
     "producer: tokens for /metrics and /stats (with --metrics-access token)"},
    {"webhook-secret-file", OQ_SET_STRING, NULL, 1, PATH_MAX - 1, NULL,
     "producer: the secret that signs webhook deliveries of tenants without their own"},
    {"redrive-after", OQ_SET_DURATION, "2m", 0, 365LL * 24 * 3600 * 1000, NULL,
     "producer: publish the message of a call with no state change for this long again (0 = "
     "off)"},
    {"redrive-interval", OQ_SET_DURATION, "5s", 100, 3600000, NULL,
     "producer: how often to look for calls due for a redrive"},
    {"tools", OQ_SET_STRING, NULL, 1, PATH_MAX - 1, NULL,
     "tools file: passed to every consumer (HTTP tools) and to the producer (tool catalogue: "
     "unknown tools and bad arguments refused at submit); checked before anything starts"},
    {"drain", OQ_SET_DURATION, NULL, 0, 600000, NULL,
     "consumers: at stop, how long HTTP requests in flight may still answer and commit "
     "(default: the longest timeout in the tools file, at most 60s)"},
    {"metrics-base-port", OQ_SET_INT, "0", 0, 65000, NULL,
     "serve the relay's /metrics, /healthz and /readyz on 127.0.0.1:PORT and consumer-K's on "
     "PORT+K (0 = off; the producer's are on --listen)"},
    {"console", OQ_SET_STRING, "127.0.0.1:8089", 0, 128, NULL,
     "onceq console's listen address (\"\" = no console); it takes --token-file too"},
};

/* The producer settings that onceq up passes through when the user gave them (numbers first,
 * durations passed as milliseconds, then strings). */
#define UP_PASS_N 10
#define UP_PASS_NUMBERS 6 /* the first six are numbers, the rest strings */
static const char *const up_producer_pass[UP_PASS_N] = {
    "max-connections",    "max-connections-per-ip", "idle-timeout",
    "request-timeout",    "probe-connections",      "mcp-wait",
    "token-file",         "metrics-access",         "metrics-token-file",
    "webhook-secret-file"};

typedef enum { UP_BROKER = 0, UP_PRODUCER, UP_RELAY, UP_CONSUMER, UP_CONSOLE } up_kind_t;

typedef struct {
    up_kind_t kind;
    char name[32];         /* "broker", "producer", "relay", "consumer-1" */
    pid_t pid;             /* 0 when not running */
    int64_t started_us;    /* oq_mono_us() at the last start */
    int64_t restart_at_us; /* when a dead child may be started again (0: now) */
    int64_t backoff_ms;
    int restarts;
    int said_ready; /* READY=1 since the last start (the producer: it serves HTTP) */
    int joined;     /* X_ONCEQ_GROUP=joined since the last start: its consumer has partitions */
} up_child_t;

typedef struct {
    const oq_config_t *cfg;
    char exe[PATH_MAX];
    char dir[PATH_MAX];
    char bootstrap_file[PATH_MAX];
    char calls_db[PATH_MAX];
    char effects_db[PATH_MAX];
    char tools[PATH_MAX]; /* absolute path of --tools, or "" */
    char brokers[4096];
    char nbrokers[16];                            /* --embedded-brokers, for the broker's argv */
    char redrive_after[32], redrive_interval[32]; /* "<ms>ms", for the producer's argv */
    char drain[32];                               /* "<ms>ms" for the consumers' argv, or "" */
    int embedded;
    int on_pg; /* --db-url: the children read ONCEQ_DB (the console ONCEQ_PRODUCER_DB/CONSUMER_DB)
                */
    up_child_t kids[UP_MAX_CHILDREN];
    int nkids;
    char pass[UP_PASS_N][PATH_MAX + 32]; /* producer arguments passed through */
    char kafka_conf[PATH_MAX];           /* DIR/kafka.conf: the clients' Kafka properties */
    char metrics_listen[UP_MAX_CHILDREN][32];
    char console_metrics[UP_MAX_CHILDREN * 48]; /* the console's --metrics-url list */
    int nfd;                                    /* DIR/notify.sock, or -1: no waiting */
    char notify_path[PATH_MAX];
    char outer_notify[PATH_MAX]; /* up's own manager's NOTIFY_SOCKET, or "" */
    int64_t wait_from_us;        /* when the children were (re)started */
    int running_said;            /* "pipeline running" printed since then */
    int waiting_said;
    int outer_told;
} up_t;

static volatile sig_atomic_t up_stop_sig, up_hup;

static void up_on_signal(int sig)
{
    if (sig == SIGHUP)
        up_hup = 1;
    else
        up_stop_sig = sig;
}

static int up_path(char *out, size_t n, const char *dir, const char *file)
{
    int w = snprintf(out, n, "%s/%s", dir, file);
    return (w < 0 || (size_t)w >= n) ? -1 : 0;
}

/* The PostgreSQL database of every stage, which `onceq up --db-url` hands to its children in
 * their environment as ONCEQ_DB; NULL on SQLite. The console reads its two databases from
 * ONCEQ_PRODUCER_DB and ONCEQ_CONSUMER_DB (set to it in up_spawn): never a password, nor even
 * the string, in argv, where ps shows it. */
static const char *up_pg_url(void)
{
    const char *u = getenv("ONCEQ_DB");
    return u && oq_backend_of(u) == OQ_BACKEND_POSTGRES ? u : NULL;
}

/* Build the argv of one child. Strings in \p argv point into \p up or are literals. */
static int up_build_argv(up_t *up, const up_child_t *k, char **argv)
{
    int n = 0;
    argv[n++] = up->exe;
    switch (k->kind) {
    case UP_BROKER:
        argv[n++] = "broker";
        argv[n++] = "--bootstrap-file";
        argv[n++] = up->bootstrap_file;
        argv[n++] = "--brokers";
        argv[n++] = up->nbrokers;
        break;
    case UP_PRODUCER:
        argv[n++] = "producer";
        if (!up->on_pg) {
            argv[n++] = "--db";
            argv[n++] = up->calls_db;
        }
        argv[n++] = "--listen";
        argv[n++] = (char *)oq_config_str(up->cfg, "listen");
        argv[n++] = "--brokers";
        argv[n++] = up->brokers;
        for (size_t i = 0; i < sizeof up_producer_pass / sizeof up_producer_pass[0]; i++) {
            const char *name = up_producer_pass[i];
            if (!oq_config_is_set(up->cfg, name)) continue;
            if (i >= UP_PASS_NUMBERS)
                snprintf(up->pass[i], sizeof up->pass[i], "--%s=%s", name,
                         oq_config_str(up->cfg, name));
            else
                snprintf(up->pass[i], sizeof up->pass[i], "--%s=%lld", name,
                         (long long)oq_config_int(up->cfg, name));
            argv[n++] = up->pass[i];
        }
        /* The two message limits stay tied: the relay's -X message.max.bytes is also the
         * producer's limit at submit. */
        for (int i = 0; i < oq_config_kafka_count(up->cfg); i++) {
            const char *name, *value;
            oq_config_kafka_get(up->cfg, i, &name, &value);
            if (strcmp(name, "message.max.bytes") == 0) {
                argv[n++] = "--max-message-bytes";
                argv[n++] = (char *)value;
                break;
            }
        }
        snprintf(up->redrive_after, sizeof up->redrive_after, "%lldms",
                 (long long)oq_config_int(up->cfg, "redrive-after"));
        snprintf(up->redrive_interval, sizeof up->redrive_interval, "%lldms",
                 (long long)oq_config_int(up->cfg, "redrive-interval"));
        argv[n++] = "--redrive-after";
        argv[n++] = up->redrive_after;
        argv[n++] = "--redrive-interval";
        argv[n++] = up->redrive_interval;
        if (up->tools[0]) { /* the same catalogue as the consumers: unknown tools refused early */
            argv[n++] = "--tools";
            argv[n++] = up->tools;
        }
        break;
    case UP_RELAY:
        argv[n++] = "relay";
        if (!up->on_pg) {
            argv[n++] = "--db";
            argv[n++] = up->calls_db;
        }
        argv[n++] = "--brokers";
        argv[n++] = up->brokers;
        break;
    case UP_CONSUMER:
        argv[n++] = "consumer";
        if (!up->on_pg) {
            argv[n++] = "--db";
            argv[n++] = up->effects_db;
        }
        argv[n++] = "--group";
        argv[n++] = (char *)oq_config_str(up->cfg, "group");
        argv[n++] = "--brokers";
        argv[n++] = up->brokers;
        if (up->tools[0]) {
            argv[n++] = "--tools";
            argv[n++] = up->tools;
        }
        if (up->drain[0]) {
            argv[n++] = "--drain";
            argv[n++] = up->drain;
        }
        break;
    case UP_CONSOLE: /* no Kafka client of its own (onceq dlq is): none of the options below */
        argv[n++] = "console";
        if (!up_pg_url()) { /* on PostgreSQL: ONCEQ_PRODUCER_DB / ONCEQ_CONSUMER_DB (up_spawn) */
            argv[n++] = "--producer-db";
            argv[n++] = up->calls_db;
            argv[n++] = "--consumer-db";
            argv[n++] = up->effects_db;
        }
        argv[n++] = "--listen";
        argv[n++] = (char *)oq_config_str(up->cfg, "console");
        if (oq_config_str(up->cfg, "token-file")) {
            argv[n++] = "--token-file";
            argv[n++] = (char *)oq_config_str(up->cfg, "token-file");
        }
        argv[n++] = "--metrics-url";
        argv[n++] = up->console_metrics;
        argv[n++] = "--brokers"; /* the DLQ topic */
        argv[n++] = up->brokers;
        if (oq_config_is_set(up->cfg, "topic-prefix")) {
            argv[n++] = "--topic-prefix";
            argv[n++] = (char *)oq_config_str(up->cfg, "topic-prefix");
        }
        argv[n] = NULL;
        return n;
    }
    /* One topic prefix for every child: the broker creates, the others use the same names. */
    if (oq_config_is_set(up->cfg, "topic-prefix")) {
        argv[n++] = "--topic-prefix";
        argv[n++] = (char *)oq_config_str(up->cfg, "topic-prefix");
    }
    /* The clients' defaults follow the brokers: the embedded broker's (common/kafka.c) unless
     * the user chose a profile; the user's -X still win over either. */
    if (k->kind != UP_BROKER) {
        argv[n++] = "--kafka-profile";
        argv[n++] = oq_config_is_set(up->cfg, "kafka-profile")
                        ? (char *)oq_config_str(up->cfg, "kafka-profile")
                        : (up->embedded ? "mock" : "real");
    }
    /* Kafka properties reach every client through DIR/kafka.conf (owner-only), never argv,
     * where other users of the host could read a sasl.password; the broker takes none. */
    if (k->kind != UP_BROKER) {
        argv[n++] = "-F";
        argv[n++] = up->kafka_conf;
    }
    int base = (int)oq_config_int(up->cfg, "metrics-base-port");
    int slot = (int)(k - up->kids);
    if (base > 0 && (k->kind == UP_RELAY || k->kind == UP_CONSUMER)) {
        /* the relay on BASE, consumer-K on BASE+K (slot 3 is consumer-1) */
        snprintf(up->metrics_listen[slot], sizeof up->metrics_listen[slot], "127.0.0.1:%d",
                 base + (k->kind == UP_RELAY ? 0 : slot - 2));
        argv[n++] = "--metrics-listen";
        argv[n++] = up->metrics_listen[slot];
    }
    argv[n] = NULL;
    return n;
}

static int up_spawn(up_t *up, up_child_t *k)
{
    char *argv[UP_MAX_ARGS + 1];
    char logpath[PATH_MAX];
    char fname[64];
    up_build_argv(up, k, argv);
    snprintf(fname, sizeof fname, "%s.log", k->name);
    if (up_path(logpath, sizeof logpath, up->dir, fname) != 0) return -1;
    /* owner-only: the logs carry call ids, keys and error details */
    int logfd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) {
        OQ_LOG_ERROR("up", "open %s: %s", logpath, strerror(errno));
        return -1;
    }
    if (k->kind == UP_CONSOLE && up_pg_url() &&
        (setenv("ONCEQ_PRODUCER_DB", up_pg_url(), 1) ||
         setenv("ONCEQ_CONSUMER_DB", up_pg_url(), 1))) {
        close(logfd);
        return -1;
    }
    pid_t parent = getpid();
    /* TERM and INT stay blocked across the fork: until the child has put their default action
     * back, a TERM sent to it would run the supervisor's handler, inherited, which only sets a
     * flag in the child's copy of this process. The TERM was lost and the child ran on until
     * the KILL after --stop-timeout (a stop right after `onceq up` started took 10 s: the
     * supervisor signals a broker it has just forked). Blocked, the signal stays pending and
     * the default action takes it when the child unblocks. */
    sigset_t stops, old;
    sigemptyset(&stops);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGINT);
    sigprocmask(SIG_BLOCK, &stops, &old);
    pid_t pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        OQ_LOG_ERROR("up", "fork: %s", strerror(errno));
        close(logfd);
        return -1;
    }
    if (pid == 0) {
        /* Child: only async-signal-safe calls until execv. Default actions first, then the
         * mask cleared: a TERM already pending ends the child here. */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        /* Own process group: a terminal's Ctrl-C reaches only the supervisor, which then
         * stops the children in order. PDEATHSIG covers a supervisor killed with -9. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) {
            dup2(devnull, 0);
            if (devnull > 2) close(devnull);
        }
        dup2(logfd, 1);
        dup2(logfd, 2);
        execv(up->exe, argv);
        _exit(127);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(logfd);
    k->pid = pid;
    k->started_us = oq_mono_us();
    k->said_ready = k->joined = 0;
    OQ_LOG_INFO("up", "started %s pid=%d restarts=%d log=%s", k->name, (int)pid, k->restarts,
                logpath);
    return 0;
}

/* Wait for \p pid with a bound; returns 1 when reaped, 0 when still running. */
static int up_wait_pid(pid_t pid, int64_t timeout_ms)
{
    int64_t deadline = oq_mono_us() + timeout_ms * 1000;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD)) return 1;
        if (oq_mono_us() >= deadline) return 0;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* TERM every running child of the selected kinds, wait for all of them, KILL leftovers. A
 * consumer's drain (its HTTP requests in flight answering) gets its full time plus 10 s. */
static void up_stop_kinds(up_t *up, int brokers, int64_t timeout_ms)
{
    int64_t drain = oq_config_is_set(up->cfg, "drain") ? oq_config_int(up->cfg, "drain")
                    : up->tools[0]                     ? 60000
                                                       : 0;
    if (!brokers && drain > 0 && timeout_ms < drain + 10000) timeout_ms = drain + 10000;
    for (int i = 0; i < up->nkids; i++) {
        up_child_t *k = &up->kids[i];
        if (k->pid <= 0 || (k->kind == UP_BROKER) != brokers) continue;
        kill(k->pid, SIGTERM);
    }
    int64_t deadline = oq_mono_us() + timeout_ms * 1000;
    for (int i = 0; i < up->nkids; i++) {
        up_child_t *k = &up->kids[i];
        if (k->pid <= 0 || (k->kind == UP_BROKER) != brokers) continue;
        int64_t left = (deadline - oq_mono_us()) / 1000;
        if (!up_wait_pid(k->pid, left > 0 ? left : 0)) {
            OQ_LOG_WARN("up", "%s pid=%d did not stop in time: SIGKILL", k->name, (int)k->pid);
            kill(k->pid, SIGKILL);
            up_wait_pid(k->pid, 5000);
        } else {
            OQ_LOG_INFO("up", "stopped %s pid=%d", k->name, (int)k->pid);
        }
        k->pid = 0;
    }
}

/* Writes DIR/kafka.conf (0600, replaced atomically): the Kafka properties of every client, as
 * kcat-style lines. The mock cluster makes a member that joins a stable group wait
 * session.timeout.ms - 1 s: with librdkafka's 45 s default a restarted consumer idles for 44 s,
 * and so does the producer's results consumer (results were applied 29-88 s after a producer
 * restart). On the embedded broker the file starts with 6 s; the user's -X lines come after it
 * and win (the last value counts). session.timeout.ms is a consumer property: the relay's and
 * the other producers never apply it (common/kafka.c). */
static int up_write_kafka_conf(up_t *up)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", up->kafka_conf);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        fprintf(stderr, "onceq up: %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "# written by onceq up: the Kafka properties of its children (-X)\n");
    if (up->embedded) fprintf(f, "session.timeout.ms=6000\n");
    for (int i = 0; i < oq_config_kafka_count(up->cfg); i++) {
        const char *name, *value;
        oq_config_kafka_get(up->cfg, i, &name, &value);
        fprintf(f, "kafka.%s=%s\n", name, value);
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0 ||
        rename(tmp, up->kafka_conf) != 0) {
        fprintf(stderr, "onceq up: %s: %s\n", up->kafka_conf, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Start the embedded broker and wait until it has written its bootstrap address. @returns 0,
 * 1 when a stop signal came first (the caller stops what runs, as on any stop), or -1. */
static int up_start_broker(up_t *up, up_child_t *k)
{
    unlink(up->bootstrap_file);
    if (up_spawn(up, k) != 0) return -1;
    int64_t deadline = oq_mono_us() + oq_config_int(up->cfg, "broker-wait") * 1000;
    while (oq_mono_us() < deadline && !up_stop_sig) {
        FILE *f = fopen(up->bootstrap_file, "r");
        if (f) {
            char line[4096] = "";
            int ok = fgets(line, sizeof line, f) != NULL;
            fclose(f);
            line[strcspn(line, "\r\n \t")] = '\0';
            if (ok && line[0]) {
                snprintf(up->brokers, sizeof up->brokers, "%s", line);
                return 0;
            }
        }
        int st;
        if (waitpid(k->pid, &st, WNOHANG) == k->pid) {
            OQ_LOG_ERROR("up", "broker exited before writing %s (see %s/broker.log)",
                         up->bootstrap_file, up->dir);
            k->pid = 0;
            return -1;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (up_stop_sig) return 1; /* stopped while the broker started: not a failure */
    OQ_LOG_ERROR("up", "no bootstrap address in %s after the wait", up->bootstrap_file);
    return -1;
}

static void up_print_where(const up_t *up, const char *note)
{
    printf("onceq up: pipeline running%s\n", note ? note : "");
    printf("  http      http://%s  (POST /v1/tool-calls, GET /v1/tool-calls/{id}, /stats, "
           "/metrics, /healthz, /readyz)\n",
           oq_config_str(up->cfg, "listen"));
    printf("  brokers   %s%s\n", up->brokers, up->embedded ? " (embedded, in memory)" : "");
    if (up->embedded) printf("  bootstrap %s\n", up->bootstrap_file);
    if (up->on_pg) { /* never the string itself: it names hosts and a passfile */
        printf("  database  postgres (schema onceq; every stage; the children read ONCEQ_DB)\n");
    } else {
        printf("  calls db  %s\n", up->calls_db);
        printf("  effects   %s\n", up->effects_db);
    }
    printf("  logs      %s/<name>.log\n", up->dir);
    for (int i = 0; i < up->nkids; i++)
        if (up->metrics_listen[i][0])
            printf("  metrics   http://%s/metrics  %s (/healthz, /readyz)\n", up->metrics_listen[i],
                   up->kids[i].name);
    const char *cl = oq_config_str(up->cfg, "console");
    if (cl && cl[0])
        printf("  console   http://%s/  (onceq console: calls, timelines, review, charts)\n", cl);
    for (int i = 0; i < up->nkids; i++)
        if (up->kids[i].pid > 0) printf("  pid %-7d %s\n", (int)up->kids[i].pid, up->kids[i].name);
    printf("  stop      kill -TERM %d  (or Ctrl-C)\n", (int)getpid());
    fflush(stdout);
}

/* A child died: schedule its restart with backoff. */
static void up_schedule(up_child_t *k, int status)
{
    int64_t now = oq_mono_us();
    if (now - k->started_us > 30 * 1000 * 1000) k->backoff_ms = 0;
    k->backoff_ms = k->backoff_ms ? k->backoff_ms * 2 : 250;
    if (k->backoff_ms > 30000) k->backoff_ms = 30000;
    k->restart_at_us = now + k->backoff_ms * 1000;
    if (WIFSIGNALED(status))
        OQ_LOG_WARN("up", "%s pid=%d killed by signal %d; restart in %lld ms", k->name, (int)k->pid,
                    WTERMSIG(status), (long long)k->backoff_ms);
    else
        OQ_LOG_WARN("up", "%s pid=%d exited with %d; restart in %lld ms", k->name, (int)k->pid,
                    WEXITSTATUS(status), (long long)k->backoff_ms);
    k->pid = 0;
}

static int up_notify_open(up_t *up);

/* The embedded broker died: everything connected to it lost topics and offsets. */
static int up_restart_all(up_t *up)
{
    OQ_LOG_WARN("up", "embedded broker died: the mock cluster lost all topics and offsets; "
                      "restarting it and every other child");
    up_stop_kinds(up, 0, oq_config_int(up->cfg, "stop-timeout"));
    up_child_t *b = &up->kids[0];
    b->restarts++;
    if (up_start_broker(up, b) != 0) return -1;
    if (up->nfd < 0) up_notify_open(up); /* "pipeline running" again once they have joined */
    up->wait_from_us = oq_mono_us();
    up->running_said = up->waiting_said = 0;
    for (int i = 1; i < up->nkids; i++) {
        up->kids[i].restarts++;
        if (up_spawn(up, &up->kids[i]) != 0) return -1;
    }
    OQ_LOG_INFO("up", "pipeline restarted brokers=%s", up->brokers);
    return 0;
}

/* --db-url: refuse a password in the string, then connect once and apply the migrations, so
 * a server that is away (or a schema newer than this binary) stops `onceq up` before any child
 * starts. The string is never printed; libpq's messages name host and port, not the password.
 * Returns an OQ_EXIT_* code. */
static int up_check_db(const char *url)
{
    if (oq_backend_of(url) != OQ_BACKEND_POSTGRES) {
        fprintf(stderr, "onceq up: --db-url must be a postgres:// or postgresql:// URI or a libpq "
                        "keyword string (SQLite is the default: DIR/calls.db, DIR/effects.db)\n");
        return OQ_EXIT_USAGE;
    }
    if (oq_pg_conninfo_has_password(url)) {
        fprintf(stderr, "onceq up: --db-url holds a password: put it in a passfile (passfile=... "
                        "in the string, or PGPASSFILE)\n");
        return OQ_EXIT_USAGE;
    }
    PGconn *c = NULL;
    oq_error_t err = {0};
    int version = 0;
    int rc = oq_pg_connect(url, &c, &err);
    if (rc != 0) {
        fprintf(stderr, "onceq up: %s\n", err.msg);
    } else if ((rc = oq_pg_migrate(c, &err)) != 0 ||
               (rc = oq_pg_schema_version(c, &version, &err)) != 0) {
        fprintf(stderr, "onceq up: PostgreSQL schema onceq: %s\n", err.msg);
    } else {
        OQ_LOG_INFO("up", "db=postgres schema=onceq version=%d", version);
    }
    if (c) PQfinish(c);
    return rc == 0 ? OQ_EXIT_OK : OQ_EXIT_FAIL;
}

/*
 * Before any child starts: can the addresses the children will listen on be bound? A child
 * that cannot bind exits and would be restarted with backoff for ever, while up prints a URL
 * that some other process answers (a second `onceq up` on the default console port, say). So
 * an address in use is one clear error and exit 1 here. The same SO_REUSEADDR as the servers
 * (libmicrohttpd sets it), so a port left in TIME_WAIT by a previous run is not refused.
 * A port taken between this check and the child's bind still ends in the child's restarts.
 */
/* --consumers, 0 resolved: on SQLite every consumer of the host writes DIR/effects.db, one
 * transaction at a time, so a second process adds contention, threads and idle fetches, not
 * throughput (docs/SCALING.md, "Writers of one file hand the lock over": 32 client threads
 * through an HTTP tool, 1,427-1,446 payments/s with one against 1,296-1,348 with two); on
 * PostgreSQL consumers write rows, not one file, and two stay the default. */
static int up_consumers(oq_config_t *cfg)
{
    int n = (int)oq_config_int(cfg, "consumers");
    if (n > 0) return n;
    const char *db_url = oq_config_str(cfg, "db-url");
    return db_url && *db_url ? 2 : 1;
}

static int up_check_listen(const char *flag, const char *listen, const char *hint)
{
    char host[64];
    int port = 0;
    oq_error_t err = {0};
    if (oq_parse_listen(listen, host, &port, &err) != 0) {
        fprintf(stderr, "onceq up: --%s %s: %s\n", flag, listen, err.msg);
        return OQ_EXIT_USAGE;
    }
    if (port == 0) return OQ_EXIT_OK; /* any free port: nothing to check */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return OQ_EXIT_OK; /* the child says why */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return OQ_EXIT_OK;
    int one = 1, rc = OQ_EXIT_OK;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 &&
        (errno == EADDRINUSE || errno == EADDRNOTAVAIL || errno == EACCES)) {
        if (hint) /* NULL: the caller says what happens instead */
            fprintf(stderr, "onceq up: --%s: %s: %s (another onceq up or another server? %s)\n",
                    flag, listen, strerror(errno), hint);
        rc = OQ_EXIT_FAIL;
    }
    close(fd);
    return rc;
}

static int up_check_ports(oq_config_t *cfg)
{
    int rc = up_check_listen("listen", oq_config_str(cfg, "listen"),
                             "choose another with --listen HOST:PORT");
    const char *cl = oq_config_str(cfg, "console");
    if (rc == OQ_EXIT_OK && cl && cl[0] && oq_config_is_set(cfg, "console")) {
        rc = up_check_listen("console", cl,
                             "choose another with --console HOST:PORT, or --console \"\" for none");
    } else if (rc == OQ_EXIT_OK && cl && cl[0] &&
               up_check_listen("console", cl, NULL) == OQ_EXIT_FAIL) {
        /* The default console's port is taken (a second pipeline on this host): the console is
         * an extra, so this pipeline runs without one and says so; one asked for is an error. */
        fprintf(stderr,
                "onceq up: no console: %s is in use (another onceq up?); --console HOST:PORT "
                "starts one elsewhere\n",
                cl);
        oq_config_set(cfg, "console", "", NULL);
    }
    /* the relay on BASE, consumer-K on BASE+K */
    int base = (int)oq_config_int(cfg, "metrics-base-port");
    int nc = up_consumers(cfg);
    for (int i = 0; rc == OQ_EXIT_OK && base > 0 && i <= nc; i++) {
        char addr[32];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", base + i);
        rc = up_check_listen("metrics-base-port", addr,
                             "choose another base with --metrics-base-port P (P to P+consumers)");
    }
    return rc;
}

/* --- readiness: what the children say (see the top of the file) --------------------------- */

/* DIR/notify.sock, named in the children's NOTIFY_SOCKET. Returns the socket, or -1 when the
 * children cannot notify (a build without libsystemd) or the socket cannot be had: then
 * "pipeline running" is said at once, as before. */
static int up_notify_open(up_t *up)
{
    up->nfd = -1;
    if (!oq_service_can_notify() || oq_config_int(up->cfg, "ready-wait") == 0) return -1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (up_path(up->notify_path, sizeof up->notify_path, up->dir, "notify.sock") != 0 ||
        strlen(up->notify_path) >= sizeof a.sun_path) {
        OQ_LOG_INFO("up", "--dir is too long for a socket path: \"pipeline running\" is said "
                          "without waiting for the consumers to join their groups");
        up->notify_path[0] = '\0';
        return -1;
    }
    memcpy(a.sun_path, up->notify_path, strlen(up->notify_path) + 1);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    unlink(up->notify_path); /* a previous run's */
    mode_t um = umask(0077); /* only this user may send to it */
    int bound = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    umask(um);
    if (!bound || setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0 ||
        setenv("NOTIFY_SOCKET", up->notify_path, 1) != 0) {
        OQ_LOG_WARN("up", "notify socket %s: %s: \"pipeline running\" is said without waiting",
                    up->notify_path, strerror(errno));
        if (fd >= 0) close(fd);
        if (bound) unlink(up->notify_path);
        up->notify_path[0] = '\0';
        return -1;
    }
    return up->nfd = fd;
}

/* Closed (and unlinked) once "pipeline running" is said: a child that notifies later (a
 * rebalance, a restart) gets ENOENT at once. Kept open, the socket would fill (10 datagrams,
 * net.unix.max_dgram_qlen) unless read, and a full one blocks the sender: a consumer in its
 * rebalance callback. */
static void up_notify_close(up_t *up)
{
    if (up->nfd >= 0) close(up->nfd);
    if (up->notify_path[0]) unlink(up->notify_path);
    up->nfd = -1;
    up->notify_path[0] = '\0';
}

/* Take every message waiting on the socket; a line counts only from a current child. */
static void up_notify_read(up_t *up)
{
    char buf[1024];
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(struct ucred))];
    } ctl;
    for (;;) {
        struct iovec iov = {buf, sizeof buf - 1};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl, .msg_controllen = sizeof ctl};
        ssize_t n = recvmsg(up->nfd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0) return; /* EAGAIN: nothing more */
        buf[n] = '\0';
        pid_t from = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
                struct ucred cr;
                memcpy(&cr, CMSG_DATA(c), sizeof cr);
                from = cr.pid;
            }
        up_child_t *k = NULL;
        for (int i = 0; from > 0 && i < up->nkids; i++)
            if (up->kids[i].pid == from) k = &up->kids[i];
        if (!k) continue;
        for (char *line = buf, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            if ((nl = strchr(line, '\n'))) *nl = '\0';
            if (strcmp(line, "READY=1") == 0) k->said_ready = 1;
            if (strcmp(line, "X_ONCEQ_GROUP=joined") == 0) k->joined = 1;
        }
    }
}

/* Who a call still waits for, as "name (not yet what), ..." in \p out and as bare names in
 * \p names: "" when nobody. */
static void up_not_ready(const up_t *up, char *out, size_t cap, char *names, size_t ncap)
{
    size_t w = 0, nw = 0;
    out[0] = names[0] = '\0';
    for (int i = 0; i < up->nkids && w < cap && nw < ncap; i++) {
        const up_child_t *k = &up->kids[i];
        const char *what = NULL;
        if (k->kind == UP_PRODUCER && !k->said_ready)
            what = "serving HTTP";
        else if ((k->kind == UP_PRODUCER || k->kind == UP_CONSUMER) && !k->joined)
            what = k->kind == UP_PRODUCER ? "in its results group" : "in its group";
        if (!what) continue;
        int r = snprintf(out + w, cap - w, "%s%s (not yet %s)", w ? ", " : "", k->name, what);
        int q = snprintf(names + nw, ncap - nw, "%s%s", nw ? ", " : "", k->name);
        if (r < 0 || q < 0) break;
        w += (size_t)r;
        nw += (size_t)q;
    }
}

/* Tell up's own service manager, if it has one, that the pipeline runs. */
static void up_tell_outer(up_t *up, const char *status)
{
    if (up->outer_told || !up->outer_notify[0]) return;
    up->outer_told = 1;
    const char *mine = getenv("NOTIFY_SOCKET");
    char keep[PATH_MAX];
    snprintf(keep, sizeof keep, "%s", mine ? mine : "");
    setenv("NOTIFY_SOCKET", up->outer_notify, 1);
    oq_service_ready(status);
    if (keep[0])
        setenv("NOTIFY_SOCKET", keep, 1);
    else
        unsetenv("NOTIFY_SOCKET");
}

/* Say "pipeline running" once the children have said what a call needs, or after
 * --ready-wait naming who has not; before that, once, that it waits. */
static void up_check_running(up_t *up)
{
    if (up->running_said) return;
    char missing[1024] = "", names[512] = "";
    if (up->nfd >= 0) {
        up_notify_read(up);
        up_not_ready(up, missing, sizeof missing, names, sizeof names);
    }
    int64_t waited_ms = (oq_mono_us() - up->wait_from_us) / 1000;
    char note[sizeof missing + PATH_MAX + 160];
    if (!missing[0]) {
        if (up->nfd >= 0)
            snprintf(note, sizeof note, " (every consumer in its group after %.1f s)",
                     (double)waited_ms / 1000.0);
        else
            note[0] = '\0';
    } else if (waited_ms >= oq_config_int(up->cfg, "ready-wait")) {
        snprintf(note, sizeof note,
                 ", but after %.0f s still waiting for %s: calls are accepted and wait for "
                 "them (see %s/<name>.log)",
                 (double)waited_ms / 1000.0, missing, up->dir);
        OQ_LOG_WARN("up", "after %lld ms still waiting for %s", (long long)waited_ms, missing);
    } else {
        if (!up->waiting_said && waited_ms >= 1000) {
            printf("onceq up: waiting for the Kafka consumers to join their groups (%s%s)\n", names,
                   up->embedded ? "; about 3 s on the embedded broker" : "");
            fflush(stdout);
            up->waiting_said = 1;
        }
        return;
    }
    up->running_said = 1;
    up_notify_close(up);
    up_print_where(up, note);
    up_tell_outer(up, missing[0] ? "pipeline running; some consumers not in their groups yet"
                                 : "pipeline running");
}

int oq__cmd_up(int argc, char **argv)
{
    const char *usage =
        "onceq up [--dir DIR] [--consumers N] [--listen HOST:PORT] [--brokers B] [-X k=v]...\n"
        "         [--tools tools.json] [--db-url postgresql://USER@HOST/DB?passfile=F]\n"
        "\n"
        "Runs the whole pipeline on this host as child processes: the embedded broker (unless\n"
        "--brokers; --embedded-brokers N mock brokers, default 1), the producer (HTTP on\n"
        "--listen, DIR/calls.db), its relay, and N consumers (group --group, DIR/effects.db).\n"
        "Each child logs to DIR/<name>.log. A child that dies is restarted with backoff\n"
        "(250 ms doubling to 30 s); if the embedded broker dies, all topics and offsets are\n"
        "gone, so every child is restarted against a new broker.\n"
        "--db-url puts every stage on one PostgreSQL database (schema onceq, migrated here first;\n"
        "unreachable at start: exit 1); the password belongs in a passfile, never the string.\n"
        "-X properties go to every Kafka client, in DIR/kafka.conf (mode 0600; passed with -F,\n"
        "never on a command line). --metrics-base-port P serves the relay's /metrics, /healthz\n"
        "and /readyz on 127.0.0.1:P and consumer-K's on P+K. The producer's HTTP limits and\n"
        "tokens pass through (--max-connections, --token-file, ...: see onceq producer --help).\n"
        "'pipeline running' is printed once the producer serves HTTP and every Kafka consumer\n"
        "has joined its group (about 3 s on the embedded broker; after --ready-wait it is\n"
        "printed anyway, naming who has not), with READY=1 to a service manager of up's own.\n"
        "SIGHUP is passed to the producer (token reload). SIGTERM/SIGINT stop the children\n"
        "(broker last) and exit 0.";
    oq_config_t *cfg = oq_config_new(up_settings, sizeof up_settings / sizeof up_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    int rc = oq_cli_parse(cfg, "onceq", usage, argc, argv);
    if (rc >= 0) {
        oq_config_destroy(cfg);
        return rc;
    }
    rc = OQ_EXIT_FAIL;
    up_t *up = calloc(1, sizeof *up);
    if (!up) goto out;
    up->cfg = cfg;
    up->nfd = -1;
    /* the children log as up does: they read the same variables */
    setenv("ONCEQ_LOG_LEVEL", oq_config_str(cfg, "log-level"), 1);
    setenv("ONCEQ_LOG_FORMAT", oq_config_str(cfg, "log-format"), 1);

    ssize_t n = readlink("/proc/self/exe", up->exe, sizeof up->exe - 1);
    if (n <= 0) {
        fprintf(stderr, "onceq up: readlink /proc/self/exe: %s\n", strerror(errno));
        goto out;
    }
    up->exe[n] = '\0';
    if (oq_cli_check_topic_prefix(cfg, "up") != 0) {
        rc = OQ_EXIT_USAGE;
        goto out;
    }
    const char *ext = oq_config_str(cfg, "brokers");
    up->embedded = ext == NULL || !ext[0];
    if (!up->embedded && oq_config_is_set(cfg, "embedded-brokers")) {
        fprintf(stderr, "onceq up: --embedded-brokers is for the embedded broker; --brokers "
                        "names an external cluster\n");
        rc = OQ_EXIT_USAGE;
        goto out;
    }
    if ((rc = up_check_ports(cfg)) != OQ_EXIT_OK) goto out;
    rc = OQ_EXIT_FAIL;
    const char *dir = oq_config_str(cfg, "dir");
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "onceq up: mkdir %s: %s\n", dir, strerror(errno));
        goto out;
    }
    if (!realpath(dir, up->dir)) {
        fprintf(stderr, "onceq up: %s: %s\n", dir, strerror(errno));
        goto out;
    }
    if (up_path(up->bootstrap_file, PATH_MAX, up->dir, "bootstrap") ||
        up_path(up->kafka_conf, PATH_MAX, up->dir, "kafka.conf") ||
        up_path(up->calls_db, PATH_MAX, up->dir, "calls.db") ||
        up_path(up->effects_db, PATH_MAX, up->dir, "effects.db")) {
        fprintf(stderr, "onceq up: --dir is too long\n");
        rc = OQ_EXIT_USAGE;
        goto out;
    }
    const char *tools = oq_config_str(cfg, "tools");
    if (tools) {
        oq_error_t terr = {0};
        if (!realpath(tools, up->tools)) {
            fprintf(stderr, "onceq up: --tools %s: %s\n", tools, strerror(errno));
            rc = OQ_EXIT_USAGE;
            goto out;
        }
        if (oq_consumer_check_tools(up->tools, &terr) != 0) {
            fprintf(stderr, "onceq up: %s\n", terr.msg);
            rc = OQ_EXIT_USAGE;
            goto out;
        }
    }
    if (oq_config_is_set(cfg, "drain"))
        snprintf(up->drain, sizeof up->drain, "%lldms", (long long)oq_config_int(cfg, "drain"));
    if (!up->embedded) snprintf(up->brokers, sizeof up->brokers, "%s", ext);
    snprintf(up->nbrokers, sizeof up->nbrokers, "%lld",
             (long long)oq_config_int(cfg, "embedded-brokers"));
    if (up_write_kafka_conf(up) != 0) goto out;
    const char *db_url = oq_config_str(cfg, "db-url");
    if (db_url && db_url[0]) {
        if ((rc = up_check_db(db_url)) != OQ_EXIT_OK) goto out;
        rc = OQ_EXIT_FAIL;
        /* inherited by every child; only the producer, relay and consumers have --db */
        if (setenv("ONCEQ_DB", db_url, 1) != 0) goto out;
        up->on_pg = 1;
    }

    /* The child table: broker (slot 0, maybe unused), producer, relay, consumers. */
    up->kids[0] = (up_child_t){.kind = UP_BROKER, .name = "broker"};
    up->kids[1] = (up_child_t){.kind = UP_PRODUCER, .name = "producer"};
    up->kids[2] = (up_child_t){.kind = UP_RELAY, .name = "relay"};
    up->nkids = 3;
    int nc = up_consumers(cfg);
    for (int i = 0; i < nc && up->nkids < UP_MAX_CHILDREN; i++) {
        up_child_t *k = &up->kids[up->nkids++];
        *k = (up_child_t){.kind = UP_CONSUMER};
        snprintf(k->name, sizeof k->name, "consumer-%d", i + 1);
    }
    const char *console_listen = oq_config_str(cfg, "console");
    if (console_listen && console_listen[0] && up->nkids < UP_MAX_CHILDREN) {
        /* the daemons' /metrics for its charts: the producer's, then those of --metrics-base-port
         */
        int base = (int)oq_config_int(cfg, "metrics-base-port"), w;
        w = snprintf(up->console_metrics, sizeof up->console_metrics, "http://%s/metrics",
                     oq_config_str(cfg, "listen"));
        for (int i = 2;
             base > 0 && i < up->nkids && w > 0 && (size_t)w < sizeof up->console_metrics; i++)
            w += snprintf(up->console_metrics + w, sizeof up->console_metrics - (size_t)w,
                          ",http://127.0.0.1:%d/metrics", base + i - 2);
        up->kids[up->nkids++] = (up_child_t){.kind = UP_CONSOLE, .name = "console"};
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = up_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int br = up->embedded && !up_stop_sig ? up_start_broker(up, &up->kids[0]) : 0;
    if (br < 0) goto stop;
    const char *outer = getenv("NOTIFY_SOCKET"); /* up's own manager's, before ours replaces it */
    snprintf(up->outer_notify, sizeof up->outer_notify, "%s", outer ? outer : "");
    up_notify_open(up);
    up->wait_from_us = oq_mono_us();
    for (int i = 1; i < up->nkids && !up_stop_sig; i++)
        if (up_spawn(up, &up->kids[i]) != 0) goto stop;

    while (!up_stop_sig) {
        int st;
        pid_t pid;
        int broker_died = 0;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
            for (int i = 0; i < up->nkids; i++) {
                if (up->kids[i].pid != pid) continue;
                if (up->kids[i].kind == UP_BROKER) broker_died = 1;
                up_schedule(&up->kids[i], st);
            }
        }
        if (broker_died && up->embedded) {
            if (up_restart_all(up) != 0) goto stop;
            continue;
        }
        up_check_running(up);
        if (up_hup) { /* the producer reloads its token files */
            up_hup = 0;
            for (int i = 0; i < up->nkids; i++)
                if (up->kids[i].kind == UP_PRODUCER && up->kids[i].pid > 0) {
                    kill(up->kids[i].pid, SIGHUP);
                    OQ_LOG_INFO("up", "SIGHUP passed to %s pid=%d", up->kids[i].name,
                                (int)up->kids[i].pid);
                }
        }
        int64_t now = oq_mono_us();
        for (int i = 0; i < up->nkids; i++) {
            up_child_t *k = &up->kids[i];
            if (k->pid != 0 || (k->kind == UP_BROKER && !up->embedded)) continue;
            if (now < k->restart_at_us) continue;
            k->restarts++;
            if (up_spawn(up, k) != 0) k->restart_at_us = now + 1000 * 1000;
        }
        if (up->nfd >= 0) { /* woken by a child's word, or after 50 ms */
            struct pollfd pf = {.fd = up->nfd, .events = POLLIN};
            poll(&pf, 1, 50);
        } else {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (up_stop_sig) OQ_LOG_INFO("up", "signal %d: stopping children", (int)up_stop_sig);
    rc = OQ_EXIT_OK;
stop:
    up_stop_kinds(up, 0, oq_config_int(cfg, "stop-timeout"));
    up_stop_kinds(up, 1, oq_config_int(cfg, "stop-timeout"));
    if (rc == OQ_EXIT_OK) printf("onceq up: stopped\n");
out:
    if (up) up_notify_close(up);
    free(up);
    oq_config_destroy(cfg);
    return rc;
}
