/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq broker`: the embedded default Kafka broker, librdkafka's mock cluster serving the real
 * Kafka protocol on random loopback ports, plus a fault-control channel for the chaos suite.
 *
 * Design. The mock cluster lives inside a plain producer handle of this process
 * (rd_kafka_mock_cluster_new); its brokers run on librdkafka's own threads, so this file only
 * creates the topics, publishes the bootstrap list (stdout, and atomically to --bootstrap-file
 * through tmp + rename so a reader never sees half a line), then sits in one poll() loop that
 * reads control commands and watches a signal flag. Signal handlers only set that flag: the mock
 * API is not async-signal-safe, so every mock call happens in the main loop. The mock API is
 * experimental (rdkafka_mock.h) and must stay in this file: no library code depends on it.
 *
 * Control channel. A FIFO at --control (default `<bootstrap-file>.ctl`), created by the broker
 * and removed at exit. Write one command per line, e.g. `echo "down 2" > "$CTL"`. The broker
 * opens the FIFO O_RDWR so it holds a writer itself: a client closing its end never produces
 * EOF, and poll() never spins on POLLHUP. A FIFO has no reply path, so every command's outcome
 * is logged (component broker) and appended as one line to `<control>.log` ("ok down 2",
 * "err unknown command 'x'"), which scripts poll for the ack (tests/integration/lib.sh:
 * oq_broker_ctl). Commands are listed in broker_usage below.
 *
 * Nagle. The mock does not set TCP_NODELAY on the connections it accepts (librdkafka 2.0.2,
 * rdkafka_mock.c), so a small response written while an earlier one on the same connection is
 * unacknowledged waits for the client's delayed ACK: up to 40 ms on Linux. That is what a
 * producer with several requests in flight (the relays, up to 5 with idempotence) met on every
 * busy connection: its delivery reports came back tens of ms after the consumers could fetch
 * the messages. A real broker sets TCP_NODELAY (Kafka's SocketServer). This file therefore
 * defines accept(): librdkafka's call resolves to it (the executable's definition comes first
 * in symbol lookup), and it sets TCP_NODELAY on what the real accept() returns, in `onceq
 * broker` only (broker_nodelay), unless --nagle. The delays had also been batching the whole
 * pipeline (fewer, fuller requests and transactions), so without them a CPU-bound closed loop
 * carries fewer calls: docs/SCALING.md, "Nagle in the embedded broker", has both sides.
 *
 * Held fetches. The mock answers a fetch with no data after its MaxWait (fetch.wait.max.ms: 1
 * ms for onceq's clients on the embedded broker, common/kafka.c), never earlier, and its IO
 * thread sleeps in poll() for the next timer rounded up to whole milliseconds. So a held fetch
 * due 50 us after the thread last woke was answered about 1 ms late, and a message produced
 * meanwhile waited for that answer and the next fetch: a call crosses two such hops (to a
 * consumer, and its result back). This file therefore also defines poll() and recvmsg(), which
 * act only in the mock's IO thread (named rdk:mock) and only with --release-us > 0: recvmsg()
 * sees each request's 12-byte header, which the mock reads on its own, and notes each Produce
 * (ApiKey 0); for 1.2 ms after a Produce that came after a millisecond without one, poll()
 * sleeps at most --release-us (100 us) at a time instead of a whole millisecond, so the
 * fetches held at that moment (due within 1 ms: the mock profile's wait) come back on time and
 * the consumers fetch the new message. Under steady traffic the mock is woken by its sockets
 * anyway, and an idle broker (no Produce) sleeps as before: the idle pipeline's CPU did not move
 * (0.26 cores for `onceq up` either way), where a first version that woke every 250 us whenever
 * a timer was due within 2 ms cost it 0.07 cores more, and one that shortened the sleeps for
 * 2.5 ms after every Produce made a closed loop ~3 % slower (the consumers' held fetches,
 * released on time, came round more often). One client thread calling an HTTP tool through
 * `onceq up` (bench/dbos_baseline.sh, 300 calls): p50 5.8 -> 4.5-4.9 ms; a closed loop
 * carried the same calls/s with the same broker CPU (docs/SCALING.md, "The mock's held
 * fetches"). The broker's stop line reports both counters. `status` counts the Produce
 * requests seen and the shortened sleeps that ended with nothing to do (early_wakeups);
 * tests/integration/test_broker_release.sh reads both, with --release-us 0 as its control.
 *
 * What the mock does not do: retention is ~5 MiB per partition in
 * memory, nothing survives a restart, no broker-side dedupe for idempotent producers, no
 * transactions, slow rebalances, no admin API (so topics are created here).
 */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "cmds.h"
#include "oq_config.h"
#include "oq_envelope.h"
#include "oq_error.h"
#include "oq_log.h"

#define OQ_BROKER_MAX 16
#define OQ_CTL_LINE_MAX 1024

static const char broker_usage[] =
    "usage: onceq broker [--brokers N] [--partitions N] [--bootstrap-file PATH]\n"
    "                    [--control PATH] [--topics a,b:12,...] [-X kafka.prop=value]\n"
    "\n"
    "Runs librdkafka's mock Kafka cluster on random 127.0.0.1 ports with the topics\n"
    "PREFIX + tool-calls, tool-results and dlq (--topic-prefix, default onceq.; --partitions\n"
    "each, replication\n"
    "min(3, brokers)) plus --topics (NAME or NAME:PARTITIONS). Prints the bootstrap list on\n"
    "stdout and writes it atomically to --bootstrap-file. Stops on SIGTERM/SIGINT (exit 0).\n"
    "In-memory only: about 5 MiB retained per partition, nothing survives a restart.\n"
    "\n"
    "Fault control: a FIFO at --control (default <bootstrap-file>.ctl), one command a line;\n"
    "each outcome is appended as one line (\"ok ...\" / \"err ...\") to <control>.log:\n"
    "  down N | down all          broker N refuses connections (no leader change)\n"
    "  up N | up all              accept connections again\n"
    "  rtt N|all MS               add MS of round-trip delay to broker N\n"
    "  error API ERR [COUNT]      the next COUNT (default 1) API requests fail with ERR,\n"
    "                             e.g. error Produce NOT_LEADER_FOR_PARTITION 5\n"
    "  error_rtt N API ERR MS [COUNT]  broker N answers the next COUNT API requests with ERR\n"
    "                             (NO_ERROR allowed) after MS ms: a Produce delay above\n"
    "                             socket.timeout.ms makes real duplicates\n"
    "  leader TOPIC PARTITION N   move the partition's leader to broker N (-1: none)\n"
    "  topic_error TOPIC ERR      Metadata for TOPIC reports ERR (NO_ERROR clears)\n"
    "  coordinator group|transaction KEY N   pin a coordinator to broker N\n"
    "  clear                      drop pending request errors, all brokers up, rtt 0\n"
    "  status                     one line: brokers down, rtt, per-broker pending\n"
    "                             error_rtt Produce entries, the held-fetch release\n"
    "                             (release_us, produce_requests, early_wakeups), bootstrap\n"
    "API: Produce Fetch ListOffsets Metadata OffsetCommit OffsetFetch FindCoordinator\n"
    "JoinGroup Heartbeat LeaveGroup SyncGroup DescribeGroups ListGroups ApiVersions\n"
    "InitProducerId AddPartitionsToTxn AddOffsetsToTxn EndTxn TxnOffsetCommit, or a number.\n"
    "ERR: a librdkafka error name without RD_KAFKA_RESP_ERR_ (e.g. REQUEST_TIMED_OUT,\n"
    "_TRANSPORT to disconnect), or a number.";

static const oq_setting_t broker_settings[] = {
    {"brokers", OQ_SET_INT, "3", 1, OQ_BROKER_MAX, NULL, "number of mock brokers (ids 1..N)"},
    {"partitions", OQ_SET_INT, "6", 1, 1024, NULL, "partitions of each onceq topic"},
    {"bootstrap-file", OQ_SET_STRING, NULL, 0, 4096, NULL,
     "write the bootstrap list here (tmp + rename)"},
    {"control", OQ_SET_STRING, NULL, 0, 4096, NULL,
     "control FIFO path (default <bootstrap-file>.ctl; none without either)"},
    {"topics", OQ_SET_STRING, NULL, 0, 65536, NULL,
     "extra topics, comma-separated NAME or NAME:PARTITIONS"},
    {"release-us", OQ_SET_INT, "100", 0, 1000, NULL,
     "for 1.2 ms after a Produce that follows 1 ms without one, release held fetches at most "
     "this many microseconds "
     "late, not up to 1 ms later (0: librdkafka's own rounding)"},
    {"nagle", OQ_SET_BOOL, "false", 0, -1, NULL,
     "leave Nagle on the accepted connections, as librdkafka's mock does (slower responses "
     "under load; for comparisons with figures taken that way)"},
    OQ_SETTING_TOPIC_PREFIX,
};

static volatile sig_atomic_t broker_stop;

/* --- libc calls of librdkafka's, wrapped (file comment, "Nagle" and "Held fetches") ----------- */

/* The definition of \p name that this executable's wrapper stands in front of (RTLD_NEXT: libc,
 * or a sanitizer's interceptor), looked up once into \p slot and copied to \p fn (ISO C has no
 * object-to-function pointer cast). -1 with errno ENOSYS if there is none. */
static int next_symbol(_Atomic(void *) *slot, const char *name, void *fn, size_t fn_size)
{
    void *sym = atomic_load(slot);
    if (!sym && (sym = dlsym(RTLD_NEXT, name))) atomic_store(slot, sym);
    if (!sym) {
        errno = ENOSYS;
        return -1;
    }
    memcpy(fn, &sym, fn_size);
    return 0;
}

typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*poll_fn)(struct pollfd *, nfds_t, int);
typedef ssize_t (*recvmsg_fn)(int, struct msghdr *, int);
static _Atomic(void *) real_accept, real_poll, real_recvmsg;
static atomic_int broker_nodelay;    /* set by oq__cmd_broker: other subcommands are untouched */
static atomic_int broker_release_us; /* 0: off; set by oq__cmd_broker only */
static _Thread_local signed char in_mock = -1;         /* this thread is the mock's IO thread */
static _Thread_local int64_t produce_at_us;            /* the mock thread's last Produce request */
static _Thread_local int64_t release_until_us;         /* shortened sleeps until then */
static atomic_ulong release_produces, release_wakeups; /* for `status` */

/* Shortened sleeps last this long (a held fetch is due at most MaxWait, 1 ms here, after it
 * came), from a Produce that follows OQ_RELEASE_QUIET_US without one. */
#define OQ_RELEASE_WINDOW_US 1200
#define OQ_RELEASE_QUIET_US 1000

/* TCP_NODELAY on what the mock accepts ("Nagle"). */
int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    accept_fn f;
    if (next_symbol(&real_accept, "accept", &f, sizeof(f)) != 0) return -1;
    int s = f(fd, addr, len);
    if (s >= 0 && atomic_load(&broker_nodelay)) {
        int on = 1, type = 0;
        socklen_t tl = sizeof(type);
        /* Best effort: a socket that is not TCP (or refuses) keeps its default. */
        if (getsockopt(s, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM)
            (void)setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    }
    return s;
}

static int64_t mono_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

/* The mock's IO thread names itself rdk:mock before its first poll. */
static int is_mock_thread(void)
{
    if (in_mock < 0) {
        char name[17] = {0};
        in_mock = prctl(PR_GET_NAME, name) == 0 && strcmp(name, "rdk:mock") == 0;
    }
    return in_mock;
}

/* Held fetches released on time after a Produce ("Held fetches"). */
int poll(struct pollfd *fds, nfds_t n, int timeout)
{
    poll_fn f;
    if (next_symbol(&real_poll, "poll", &f, sizeof(f)) != 0) return -1;
    int tick = atomic_load_explicit(&broker_release_us, memory_order_relaxed);
    if (tick > 0 && timeout > 0 && is_mock_thread() && mono_us() < release_until_us) {
        /* Wake at most `tick` later than a timer due in under a millisecond, which the
         * mock's own timeout (rounded up to whole milliseconds) would sleep past. A wake-up
         * with nothing due is one more turn of its loop. */
        if ((int64_t)timeout * 1000 > tick) {
            struct timespec ts = {0, (long)tick * 1000L};
            int r = ppoll(fds, n, &ts, NULL);
            if (r == 0) atomic_fetch_add_explicit(&release_wakeups, 1, memory_order_relaxed);
            return r;
        }
    }
    return f(fds, n, timeout);
}

/* Notes the mock thread's Produce requests for poll() ("Held fetches"). */
ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
    recvmsg_fn f;
    if (next_symbol(&real_recvmsg, "recvmsg", &f, sizeof(f)) != 0) return -1;
    ssize_t r = f(fd, msg, flags);
    /* The mock reads each request's 12-byte header (size, ApiKey, ApiVersion, CorrId) on its
     * own; ApiKey 0 is Produce. Any other read pattern leaves the release off: no harm. */
    if (r == 12 && atomic_load_explicit(&broker_release_us, memory_order_relaxed) > 0 &&
        msg->msg_iovlen >= 1 && msg->msg_iov[0].iov_len >= 12 && is_mock_thread()) {
        const unsigned char *h = msg->msg_iov[0].iov_base;
        if (h[4] == 0 && h[5] == 0) {
            int64_t now = mono_us();
            if (now - produce_at_us >= OQ_RELEASE_QUIET_US)
                release_until_us = now + OQ_RELEASE_WINDOW_US;
            produce_at_us = now;
            atomic_fetch_add_explicit(&release_produces, 1, memory_order_relaxed);
        }
    }
    return r;
}

static void broker_on_signal(int sig)
{
    broker_stop = sig;
}

/* Kafka protocol API keys (the RD_KAFKAP_* values are not in librdkafka's public headers). */
static const struct {
    const char *name;
    int16_t key;
} apis[] = {
    {"Produce", 0},
    {"Fetch", 1},
    {"ListOffsets", 2},
    {"Metadata", 3},
    {"OffsetCommit", 8},
    {"OffsetFetch", 9},
    {"FindCoordinator", 10},
    {"JoinGroup", 11},
    {"Heartbeat", 12},
    {"LeaveGroup", 13},
    {"SyncGroup", 14},
    {"DescribeGroups", 15},
    {"ListGroups", 16},
    {"SaslHandshake", 17},
    {"ApiVersions", 18},
    {"CreateTopics", 19},
    {"DeleteTopics", 20},
    {"DeleteRecords", 21},
    {"InitProducerId", 22},
    {"OffsetForLeaderEpoch", 23},
    {"AddPartitionsToTxn", 24},
    {"AddOffsetsToTxn", 25},
    {"EndTxn", 26},
    {"TxnOffsetCommit", 28},
};
#define OQ__API_KEY_MAX 70 /* clear sweeps 0..this */

typedef struct {
    rd_kafka_t *rk;
    rd_kafka_mock_cluster_t *mc;
    int nbrokers;
    const char *bootstraps;
    int down[OQ_BROKER_MAX + 1];
    int rtt[OQ_BROKER_MAX + 1];
    int ack_fd; /* <control>.log, O_APPEND; -1 without a control channel */
} broker_t;

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    if (!s || !*s) return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int api_key(const char *s, int16_t *out)
{
    long v;
    for (size_t i = 0; i < sizeof(apis) / sizeof(apis[0]); i++) {
        if (strcasecmp(s, apis[i].name) == 0) {
            *out = apis[i].key;
            return 0;
        }
    }
    if (parse_long(s, 0, OQ__API_KEY_MAX, &v) == 0) {
        *out = (int16_t)v;
        return 0;
    }
    return -1;
}

/* Error by name, scanning librdkafka's own table so every code it knows is accepted. */
static int err_code(const char *s, rd_kafka_resp_err_t *out)
{
    const struct rd_kafka_err_desc *descs;
    size_t n;
    long v;
    if (strncasecmp(s, "RD_KAFKA_RESP_ERR_", 18) == 0) s += 18;
    if (strcasecmp(s, "NO_ERROR") == 0 || strcmp(s, "0") == 0) {
        *out = RD_KAFKA_RESP_ERR_NO_ERROR;
        return 0;
    }
    rd_kafka_get_err_descs(&descs, &n);
    for (size_t i = 0; i < n; i++) {
        if (descs[i].name && strcasecmp(descs[i].name, s) == 0) {
            *out = descs[i].code;
            return 0;
        }
    }
    if (parse_long(s, -200, 200, &v) == 0) {
        *out = (rd_kafka_resp_err_t)v;
        return 0;
    }
    return -1;
}

/* Broker id 1..N, or "all"/-1 for every broker. */
static int broker_id(const broker_t *b, const char *s, int32_t *out)
{
    long v;
    if (s && (strcasecmp(s, "all") == 0 || strcmp(s, "-1") == 0)) {
        *out = -1;
        return 0;
    }
    if (parse_long(s, 1, b->nbrokers, &v) != 0) return -1;
    *out = (int32_t)v;
    return 0;
}

/* One ack line: logged, and appended to <control>.log with a single write(2). */
static void ctl_ack(broker_t *b, int ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void ctl_ack(broker_t *b, int ok, const char *fmt, ...)
{
    char line[OQ_CTL_LINE_MAX + 512];
    int n = snprintf(line, sizeof(line), "%s ", ok ? "ok" : "err");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (ok)
        OQ_LOG_INFO("broker", "control: %s", line);
    else
        OQ_LOG_WARN("broker", "control: %s", line);
    if (b->ack_fd >= 0) {
        size_t len = strlen(line);
        line[len++] = '\n';
        if (write(b->ack_fd, line, len) != (ssize_t)len)
            OQ_LOG_WARN("broker", "control: ack write failed: %s", strerror(errno));
    }
}

static void set_down(broker_t *b, int32_t id, int down)
{
    for (int i = 1; i <= b->nbrokers; i++)
        if (id == -1 || id == i) b->down[i] = down;
}

static void ctl_status(broker_t *b)
{
    char downs[128] = "", rtts[256] = "";
    size_t dl = 0, rl = 0;
    for (int i = 1; i <= b->nbrokers; i++) {
        if (b->down[i] && dl < sizeof(downs) - 8)
            dl += (size_t)snprintf(downs + dl, sizeof(downs) - dl, "%s%d", dl ? "," : "", i);
        if (rl < sizeof(rtts) - 24)
            rl += (size_t)snprintf(rtts + rl, sizeof(rtts) - rl, "%s%d:%d", rl ? "," : "", i,
                                   b->rtt[i]);
    }
    /* Pending per-broker (error_rtt) Produce errors: lets scripts see they were consumed. */
    char pend[256] = "";
    size_t pl = 0;
    for (int i = 1; i <= b->nbrokers && pl < sizeof(pend) - 32; i++) {
        size_t cnt = 0;
        if (rd_kafka_mock_broker_error_stack_cnt(b->mc, i, 0 /* Produce */, &cnt)) cnt = 0;
        pl += (size_t)snprintf(pend + pl, sizeof(pend) - pl, "%s%d:%zu", pl ? "," : "", i, cnt);
    }
    ctl_ack(b, 1,
            "status brokers=%d down=%s rtt_ms=%s pending_produce=%s release_us=%d "
            "produce_requests=%lu early_wakeups=%lu bootstrap=%s",
            b->nbrokers, dl ? downs : "none", rtts, pend, atomic_load(&broker_release_us),
            atomic_load(&release_produces), atomic_load(&release_wakeups), b->bootstraps);
}

/* Execute one command line (already stripped of its newline). */
static void ctl_command(broker_t *b, char *line)
{
    char *argv[8], *save = NULL, *tok;
    int argc = 0;
    char orig[OQ_CTL_LINE_MAX];
    rd_kafka_resp_err_t kerr = RD_KAFKA_RESP_ERR_NO_ERROR, code;
    int32_t id;
    int16_t api;
    long v, count;

    snprintf(orig, sizeof(orig), "%s", line);
    for (tok = strtok_r(line, " \t\r", &save); tok && argc < 8;
         tok = strtok_r(NULL, " \t\r", &save))
        argv[argc++] = tok;
    if (argc == 0 || argv[0][0] == '#') return;
    if (tok) {
        ctl_ack(b, 0, "too many arguments: %s", orig);
        return;
    }
    const char *cmd = argv[0];

    if ((strcmp(cmd, "down") == 0 || strcmp(cmd, "up") == 0) && argc == 2) {
        int down = cmd[0] == 'd';
        if (broker_id(b, argv[1], &id) != 0) goto bad_broker;
        kerr = down ? rd_kafka_mock_broker_set_down(b->mc, id)
                    : rd_kafka_mock_broker_set_up(b->mc, id);
        if (kerr) goto kafka_err;
        set_down(b, id, down);
        ctl_ack(b, 1, "%s", orig);
    } else if (strcmp(cmd, "rtt") == 0 && argc == 3) {
        if (broker_id(b, argv[1], &id) != 0) goto bad_broker;
        if (parse_long(argv[2], 0, 600000, &v) != 0) {
            ctl_ack(b, 0, "bad rtt (0..600000 ms): %s", orig);
            return;
        }
        if ((kerr = rd_kafka_mock_broker_set_rtt(b->mc, id, (int)v))) goto kafka_err;
        for (int i = 1; i <= b->nbrokers; i++)
            if (id == -1 || id == i) b->rtt[i] = (int)v;
        ctl_ack(b, 1, "%s", orig);
    } else if (strcmp(cmd, "error") == 0 && (argc == 3 || argc == 4)) {
        count = 1;
        if (api_key(argv[1], &api) != 0) goto bad_api;
        if (err_code(argv[2], &code) != 0) goto bad_err;
        if (argc == 4 && parse_long(argv[3], 1, 100000, &count) != 0) {
            ctl_ack(b, 0, "bad count (1..100000): %s", orig);
            return;
        }
        rd_kafka_resp_err_t *errs = malloc(sizeof(*errs) * (size_t)count);
        if (!errs) {
            ctl_ack(b, 0, "out of memory: %s", orig);
            return;
        }
        for (long i = 0; i < count; i++)
            errs[i] = code;
        rd_kafka_mock_push_request_errors_array(b->mc, api, (size_t)count, errs);
        free(errs);
        ctl_ack(b, 1, "%s", orig);
    } else if (strcmp(cmd, "error_rtt") == 0 && (argc == 5 || argc == 6)) {
        count = 1;
        if (broker_id(b, argv[1], &id) != 0 || id == -1) goto bad_broker;
        if (api_key(argv[2], &api) != 0) goto bad_api;
        if (err_code(argv[3], &code) != 0) goto bad_err;
        if (parse_long(argv[4], 0, 600000, &v) != 0) {
            ctl_ack(b, 0, "bad rtt (0..600000 ms): %s", orig);
            return;
        }
        if (argc == 6 && parse_long(argv[5], 1, 10000, &count) != 0) {
            ctl_ack(b, 0, "bad count (1..10000): %s", orig);
            return;
        }
        for (long i = 0; i < count && !kerr; i++)
            kerr = rd_kafka_mock_broker_push_request_error_rtts(b->mc, id, api, 1, code, (int)v);
        if (kerr) goto kafka_err;
        ctl_ack(b, 1, "%s", orig);
    } else if (strcmp(cmd, "leader") == 0 && argc == 4) {
        if (parse_long(argv[2], 0, 1 << 20, &v) != 0) {
            ctl_ack(b, 0, "bad partition: %s", orig);
            return;
        }
        if (broker_id(b, argv[3], &id) != 0) goto bad_broker;
        if ((kerr = rd_kafka_mock_partition_set_leader(b->mc, argv[1], (int32_t)v, id)))
            goto kafka_err;
        ctl_ack(b, 1, "%s", orig);
    } else if (strcmp(cmd, "topic_error") == 0 && argc == 3) {
        if (err_code(argv[2], &code) != 0) goto bad_err;
        rd_kafka_mock_topic_set_error(b->mc, argv[1], code);
        ctl_ack(b, 1, "%s", orig);
    } else if (strcmp(cmd, "coordinator") == 0 && argc == 4) {
        if (strcmp(argv[1], "group") != 0 && strcmp(argv[1], "transaction") != 0) {
            ctl_ack(b, 0, "coordinator type must be group or transaction: %s", orig);
            return;
        }
        if (broker_id(b, argv[3], &id) != 0 || id == -1) goto bad_broker;
        if ((kerr = rd_kafka_mock_coordinator_set(b->mc, argv[1], argv[2], id))) goto kafka_err;
        ctl_ack(b, 1, "%s", orig);
    } else if (strcmp(cmd, "clear") == 0 && argc == 1) {
        for (int16_t k = 0; k <= OQ__API_KEY_MAX; k++)
            rd_kafka_mock_clear_request_errors(b->mc, k);
        rd_kafka_mock_broker_set_up(b->mc, -1);
        rd_kafka_mock_broker_set_rtt(b->mc, -1, 0);
        set_down(b, -1, 0);
        for (int i = 1; i <= b->nbrokers; i++)
            b->rtt[i] = 0;
        ctl_ack(b, 1, "clear");
    } else if (strcmp(cmd, "status") == 0 && argc == 1) {
        ctl_status(b);
    } else {
        ctl_ack(b, 0, "unknown command or wrong arguments: %s (see onceq broker --help)", orig);
    }
    return;

bad_broker:
    ctl_ack(b, 0, "bad broker id (1..%d%s): %s", b->nbrokers,
            strcmp(cmd, "error_rtt") == 0 || strcmp(cmd, "coordinator") == 0 ? "" : " or all",
            orig);
    return;
bad_api:
    ctl_ack(b, 0, "unknown API name: %s", orig);
    return;
bad_err:
    ctl_ack(b, 0, "unknown error name: %s", orig);
    return;
kafka_err:
    ctl_ack(b, 0, "%s: %s", rd_kafka_err2name(kerr), orig);
}

/* Write \p text + '\n' to \p path through a temporary file and rename(2). */
static int write_atomic(const char *path, const char *text, oq_error_t *err)
{
    char tmp[4200];
    int rc = 0, fd;
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= sizeof(tmp))
        return oq_error_set(err, OQ_EINVAL, 0, "bootstrap file path too long");
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return oq_error_set(err, OQ_EIO, errno, "open %s: %s", tmp, strerror(errno));
    size_t len = strlen(text);
    if (write(fd, text, len) != (ssize_t)len || write(fd, "\n", 1) != 1) {
        rc = oq_error_set(err, OQ_EIO, errno, "write %s: %s", tmp, strerror(errno));
        close(fd);
        goto out;
    }
    if (close(fd) != 0) {
        rc = oq_error_set(err, OQ_EIO, errno, "close %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, path) != 0)
        rc = oq_error_set(err, OQ_EIO, errno, "rename %s -> %s: %s", tmp, path, strerror(errno));
out:
    if (rc) unlink(tmp);
    return rc;
}

/* Create the FIFO (replacing a stale FIFO, never a regular file) and open it O_RDWR. */
static int control_open(const char *path, int *fd_out, int *ack_fd_out, oq_error_t *err)
{
    struct stat st;
    char logpath[4200];
    if (lstat(path, &st) == 0) {
        if (!S_ISFIFO(st.st_mode))
            return oq_error_set(err, OQ_EIO, EEXIST, "control path %s exists and is not a FIFO",
                                path);
        unlink(path);
    }
    if ((size_t)snprintf(logpath, sizeof(logpath), "%s.log", path) >= sizeof(logpath))
        return oq_error_set(err, OQ_EINVAL, 0, "control path too long");
    if (mkfifo(path, 0600) != 0)
        return oq_error_set(err, OQ_EIO, errno, "mkfifo %s: %s", path, strerror(errno));
    /* O_RDWR: we are a writer too, so the read end never sees EOF when clients close. */
    int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return oq_error_set(err, OQ_EIO, errno, "open %s: %s", path, strerror(errno));
    int afd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (afd < 0) {
        int e = errno;
        close(fd);
        return oq_error_set(err, OQ_EIO, e, "open %s: %s", logpath, strerror(e));
    }
    *fd_out = fd;
    *ack_fd_out = afd;
    return 0;
}

/* Create one topic; \p spec is NAME or NAME:PARTITIONS. */
static int topic_create(broker_t *b, const char *spec, int partitions, int repl, oq_error_t *err)
{
    char name[256];
    long v = partitions;
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    if (len == 0 || len >= sizeof(name))
        return oq_error_set(err, OQ_EINVAL, 0, "bad topic name in --topics: '%s'", spec);
    memcpy(name, spec, len);
    name[len] = '\0';
    if (colon && parse_long(colon + 1, 1, 1024, &v) != 0)
        return oq_error_set(err, OQ_EINVAL, 0, "bad partition count in --topics: '%s'", spec);
    rd_kafka_resp_err_t kerr = rd_kafka_mock_topic_create(b->mc, name, (int)v, repl);
    if (kerr)
        return oq_error_set(err, OQ_EKAFKA, kerr, "create topic %s: %s", name,
                            rd_kafka_err2str(kerr));
    OQ_LOG_INFO("broker", "topic %s partitions=%ld replication=%d", name, v, repl);
    return 0;
}

/* Line assembly for the control FIFO. */
typedef struct {
    char buf[OQ_CTL_LINE_MAX];
    size_t used;
    int discarding; /* inside an over-long line: drop bytes up to the next newline */
} ctl_buf_t;

/* Read what is available on the FIFO; run each complete line. */
static void control_read(broker_t *b, int fd, ctl_buf_t *cb)
{
    for (;;) {
        ssize_t n = read(fd, cb->buf + cb->used, sizeof(cb->buf) - 1 - cb->used);
        if (n <= 0) {
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                OQ_LOG_WARN("broker", "control: read: %s", strerror(errno));
            return;
        }
        cb->used += (size_t)n;
        char *start = cb->buf, *end = cb->buf + cb->used, *nl;
        while ((nl = memchr(start, '\n', (size_t)(end - start)))) {
            *nl = '\0';
            if (cb->discarding)
                cb->discarding = 0; /* the tail of an over-long line */
            else
                ctl_command(b, start);
            start = nl + 1;
        }
        cb->used = (size_t)(end - start);
        if (cb->discarding) {
            cb->used = 0;
        } else if (cb->used == sizeof(cb->buf) - 1) {
            ctl_ack(b, 0, "line too long (max %d bytes)", OQ_CTL_LINE_MAX - 2);
            cb->used = 0;
            cb->discarding = 1;
        } else {
            memmove(cb->buf, start, cb->used);
        }
    }
}

/**
 * @brief `onceq broker`: run the embedded mock Kafka cluster until SIGTERM/SIGINT.
 * @returns OQ_EXIT_OK after a clean stop, OQ_EXIT_USAGE on bad flags, OQ_EXIT_FAIL when the
 *          cluster, a topic, the bootstrap file or the control FIFO cannot be set up.
 */
int oq__cmd_broker(int argc, char **argv)
{
    oq_error_t err = {0};
    broker_t b = {.ack_fd = -1};
    int ret = OQ_EXIT_FAIL, ctl_fd = -1, prc;
    char ctl_default[4200];
    static ctl_buf_t ctl_buf;
    const char *bootstrap_file, *ctl_path = NULL, *extra;
    rd_kafka_conf_t *conf = NULL;
    char errstr[512];
    struct sigaction sa, old_term, old_int;
    int sig_installed = 0, wrote_bootstrap = 0;

    oq_config_t *cfg =
        oq_config_new(broker_settings, sizeof(broker_settings) / sizeof(broker_settings[0]));
    if (!cfg) {
        fprintf(stderr, "onceq broker: out of memory\n");
        return OQ_EXIT_FAIL;
    }
    if ((prc = oq_cli_parse(cfg, "onceq", broker_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    if (oq_config_npositional(cfg) > 0) {
        fprintf(stderr, "onceq broker: unexpected argument '%s'\n(see: onceq broker --help)\n",
                oq_config_positional(cfg, 0));
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    b.nbrokers = (int)oq_config_int(cfg, "brokers");
    int partitions = (int)oq_config_int(cfg, "partitions");
    int repl = b.nbrokers < 3 ? b.nbrokers : 3;
    bootstrap_file = oq_config_str(cfg, "bootstrap-file");
    if (bootstrap_file && !*bootstrap_file) bootstrap_file = NULL;
    ctl_path = oq_config_str(cfg, "control");
    if (ctl_path && !*ctl_path) ctl_path = NULL;
    if (!ctl_path && bootstrap_file) {
        if ((size_t)snprintf(ctl_default, sizeof(ctl_default), "%s.ctl", bootstrap_file) >=
            sizeof(ctl_default)) {
            fprintf(stderr, "onceq broker: --bootstrap-file path too long\n");
            ret = OQ_EXIT_USAGE;
            goto out;
        }
        ctl_path = ctl_default;
    }
    const char *prefix = oq_config_str(cfg, "topic-prefix");
    if (oq_cli_check_topic_prefix(cfg, "broker") != 0) {
        ret = OQ_EXIT_USAGE;
        goto out;
    }

    /* Signals first, so a TERM during start-up still ends in a clean teardown. */
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = broker_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: poll() returns EINTR at once */
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
    signal(SIGPIPE, SIG_IGN);
    sig_installed = 1;

    /* The mock cluster needs a host handle for book-keeping; a plain producer does. */
    /* Not oq_kafka_conf_new(): its consumer defaults only draw warnings on this handle. */
    if (!(conf = rd_kafka_conf_new())) goto out;
    rd_kafka_conf_set_log_cb(conf, oq_log_rdkafka_cb);
    if (oq_config_apply_kafka(cfg, conf, &err) != 0) {
        fprintf(stderr, "onceq broker: %s\n", err.msg);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    b.rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (!b.rk) {
        OQ_LOG_ERROR("broker", "rd_kafka_new: %s", errstr);
        rd_kafka_conf_destroy(conf);
        goto out;
    }
    conf = NULL; /* owned by b.rk now */
    atomic_store(&broker_nodelay, !oq_config_int(cfg, "nagle"));
    atomic_store(&broker_release_us, (int)oq_config_int(cfg, "release-us"));
    b.mc = rd_kafka_mock_cluster_new(b.rk, b.nbrokers);
    if (!b.mc) {
        OQ_LOG_ERROR("broker", "rd_kafka_mock_cluster_new(%d) failed", b.nbrokers);
        goto out;
    }
    b.bootstraps = rd_kafka_mock_cluster_bootstraps(b.mc);

    static const char *const base_topics[] = {OQ_TOPIC_CALLS, OQ_TOPIC_RESULTS, OQ_TOPIC_DLQ};
    for (size_t i = 0; i < 3; i++) {
        char name[OQ_TOPIC_NAME_CAP];
        oq_topic_name(prefix, base_topics[i], name, sizeof name);
        if (topic_create(&b, name, partitions, repl, &err) != 0) goto fail;
    }
    extra = oq_config_str(cfg, "topics");
    if (extra && *extra) {
        char *copy = strdup(extra), *save = NULL, *t;
        if (!copy) goto out;
        for (t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            while (isspace((unsigned char)*t))
                t++;
            if (!*t) continue;
            if (topic_create(&b, t, partitions, repl, &err) != 0) {
                free(copy);
                ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
                fprintf(stderr, "onceq broker: %s\n", err.msg);
                goto out;
            }
        }
        free(copy);
    }

    /* The control channel exists before the bootstrap file: the file means "ready". */
    if (ctl_path && control_open(ctl_path, &ctl_fd, &b.ack_fd, &err) != 0) goto fail;
    if (bootstrap_file) {
        if (write_atomic(bootstrap_file, b.bootstraps, &err) != 0) goto fail;
        wrote_bootstrap = 1;
    }
    printf("%s\n", b.bootstraps);
    fflush(stdout);
    OQ_LOG_INFO("broker", "ready bootstrap=%s brokers=%d partitions=%d control=%s", b.bootstraps,
                b.nbrokers, partitions, ctl_path ? ctl_path : "none");

    while (!broker_stop) {
        struct pollfd pfd = {.fd = ctl_fd, .events = POLLIN};
        int n = poll(&pfd, ctl_fd >= 0 ? 1 : 0, 200);
        if (n < 0 && errno != EINTR) {
            OQ_LOG_ERROR("broker", "poll: %s", strerror(errno));
            goto out;
        }
        if (n > 0 && (pfd.revents & POLLIN)) control_read(&b, ctl_fd, &ctl_buf);
    }
    OQ_LOG_INFO("broker", "signal %d: stopping produce_requests=%lu early_wakeups=%lu",
                (int)broker_stop, atomic_load(&release_produces), atomic_load(&release_wakeups));
    ret = OQ_EXIT_OK;
    goto out;

fail:
    OQ_LOG_ERROR("broker", "%s", err.msg);
    ret = OQ_EXIT_FAIL;
out:
    if (ctl_fd >= 0) {
        close(ctl_fd);
        unlink(ctl_path);
    }
    if (b.ack_fd >= 0) close(b.ack_fd);
    if (wrote_bootstrap) unlink(bootstrap_file);
    if (b.mc) rd_kafka_mock_cluster_destroy(b.mc);
    if (b.rk) rd_kafka_destroy(b.rk);
    if (conf) rd_kafka_conf_destroy(conf);
    if (sig_installed) {
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
    }
    oq_config_destroy(cfg);
    return ret;
}
