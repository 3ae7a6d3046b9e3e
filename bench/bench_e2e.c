/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq-bench e2e`: end-to-end calls/s and latency of the whole pipeline on this host.
 *
 * With --http-tools the same calls then run a second time to an HTTP tool ("pay") against
 * `onceq-downstream` (its own durable ledger, keys honoured, lookup on), and both runs' calls/s
 * and p99 are printed side by side; verify then also reads the downstream's ledger.
 *
 * It runs the real thing as separate processes of the `onceq` binary (the one next to this
 * program, or --onceq): `onceq up` (embedded broker, producer, relay,
 * N consumers, all durable: WAL + synchronous=FULL for accepted data; the relays' progress
 * marks use NORMAL) in a scratch directory, warms the consumer
 * group up (assignment on the mock cluster takes seconds), then offers a fixed load over HTTP
 * (bench/load.c: keep-alive connections, open-loop pacing) and waits until every call of the
 * run is terminal at the producer. Latencies are not sampled by polling: they are read back
 * from the databases afterwards, per call, from the timestamps each stage writes anyway:
 *
 *   calls.created_at        submit committed (producer group commit)
 *   inbox.received_at       first delivery to a consumer
 *   effects.created_at      effect committed (charge / send_email)
 *   calls.updated_at        result applied at the producer (terminal)
 *
 * (the relays keep no per-row publish time: their progress is a watermark), so "where time
 * goes" is the distribution of each hop, and the CPU seconds each process
 * type burnt during the run (from /proc/<pid>/stat) say which one is the bottleneck. All
 * timestamps are unix milliseconds from different processes on one host: hop figures have
 * 1 ms resolution.
 *
 * --db-url URI runs the same pipeline with every stage on PostgreSQL (`onceq up --db-url`,
 * synchronous_commit=on; each run's keys are new: e2e_key()). The
 * drain is watched there; afterwards the rows are copied from one snapshot into calls.db and
 * effects.db of the scratch directory (oq_pg_snapshot, the consumer store's export), so the hop
 * analysis and verify read them as they read SQLite. The pipeline's CPU and bytes written per
 * call, and the PostgreSQL server's (ONCEQ_BENCH_PG_PID), come from /proc (bench/procstat.c).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <netinet/in.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "bench.h"
#include "consumer_store.h"
#include "oq_chaos.h"
#include "oq_config.h"
#include "oq_httpc.h"
#include "oq_load.h"
#include "oq_log.h"
#include "oq_pg.h"
#include "oq_util.h"

/* Paths here are the run directory (the --dir setting, at most 1024 bytes, or a mkdtemp name)
 * plus a short file name, in PATH_MAX buffers: they cannot truncate, but GCC's -O2 range
 * analysis cannot see the setting's bound. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static const oq_setting_t e2e_settings[] = {
    {"calls", OQ_SET_INT, "20000", 1, 10000000, NULL, "calls in the measured run"},
    {"rate", OQ_SET_INT, "6000", 0, 1000000, NULL,
     "offered load in calls/s (0 = closed loop, as fast as the pipeline answers)"},
    {"conns", OQ_SET_INT, "128", 1, 256, NULL, "HTTP keep-alive connections"},
    {"consumers", OQ_SET_INT, "2", 1, 16, NULL,
     "consumer processes (a consumer group of two, as with onceq up --db-url)"},
    {"mix", OQ_SET_STRING, "60,40,0,0,0", 1, 64, NULL,
     "tool weights: charge,send_email,sleep,fail_retryable,fail_final"},
    {"warmup", OQ_SET_INT, "300", 0, 100000, NULL, "calls run (and drained) before measuring"},
    {"drain-timeout", OQ_SET_DURATION, "180s", 1000, 3600000, NULL,
     "give up waiting for terminal states after this"},
    {"dir", OQ_SET_STRING, NULL, 1, 1024, NULL,
     "scratch directory (default: a new /tmp/onceq-bench-e2e.XXXXXX, removed afterwards)"},
    {"keep", OQ_SET_BOOL, "false", 0, -1, NULL, "keep the scratch directory"},
    {"baseline", OQ_SET_BOOL, "true", 0, -1, NULL,
     "first run the same load against the producer alone (same-run baseline)"},
    {"onceq", OQ_SET_STRING, NULL, 1, 1024, NULL,
     "the onceq binary to run (default: the onceq next to this program)"},
    {"http-tools", OQ_SET_BOOL, "false", 0, -1, NULL,
     "after the run with the compiled charge, the same calls to an HTTP tool against `onceq "
     "downstream` (durable ledger), figures side by side"},
    {"tasks", OQ_SET_INT, "0", 0, 1000000, NULL,
     "instead: N 3-step tasks (pay, pay, pay) against `onceq downstream`, then 3N independent "
     "pay calls in the same pipeline: tasks/s, per-step latency, step-to-step gap, CPU per step "
     "against CPU per call"},
    {"task-rate", OQ_SET_INT, "0", 0, 100000, NULL,
     "with --tasks: tasks/s of the open-loop task run (0 = half of the closed-loop capacity "
     "measured first): its step-to-step gap is the figure \"at half of capacity\""},
    {"idle", OQ_SET_DURATION, "5s", 0, 600000, NULL,
     "with --tasks: measure the pipeline's idle CPU for this long (0 = skip): every phase's CPU "
     "is also reported net of it"},
    {"db-url", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "every stage on PostgreSQL (onceq up --db-url): a URI of a fresh database, the password in "
     "a passfile"},
};

/* --db-url, or NULL (SQLite files in the scratch directory). */
static const char *e2e_db_url;

/* The idempotency keys of a run are <phase>.<run>-<i>, <run> this run's start time in hex: a run
 * on a database that earlier runs used (--dir, --db-url) must neither replay their keys (a
 * replayed call is terminal at once: a warm-up that drains before the pipeline is up, figures of
 * calls never executed) nor count their calls. */
static char e2e_run_tag[24];

/* "<phase>.<run>", in one of a few static buffers (the phases of one run fit). */
static const char *e2e_key(const char *phase)
{
    static char bufs[8][48];
    static unsigned next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s.%s", phase, e2e_run_tag);
    return b;
}

/* The LIKE pattern of the keys of \p phase in this run ("<phase>.<run>-%"), as e2e_key(). */
static const char *e2e_like(const char *phase)
{
    static char bufs[4][56];
    static unsigned next;
    char *b = bufs[next++ % 4];
    snprintf(b, sizeof bufs[0], "%s-%%", e2e_key(phase));
    return b;
}

/* The onceq binary the processes run: --onceq, else `onceq` in this program's directory. */
static char e2e_onceq[PATH_MAX];

static int e2e_free_port(void)
{
    return oq__bench_free_port(); /* below the ephemeral range: bench.h */
}

/* CPU seconds (utime + stime) of every child of \p parent, summed per subcommand name. */
#define E2E_CPU_KINDS 8
typedef struct {
    char name[16];
    double cpu;
    int n;
} e2e_cpu_t;

typedef struct {
    int n; /* kinds in k[], at most E2E_CPU_KINDS */
    e2e_cpu_t k[E2E_CPU_KINDS];
} e2e_cpu_set_t;

/* The CPU seconds of \p name in \p s, 0 when absent. */
static double e2e_cpu_of(const e2e_cpu_set_t *s, const char *name)
{
    for (int j = 0; j < s->n && j < E2E_CPU_KINDS; j++)
        if (strcmp(s->k[j].name, name) == 0) return s->k[j].cpu;
    return 0;
}

static void e2e_cpu_sample(pid_t parent, e2e_cpu_set_t *set)
{
    e2e_cpu_t *out = set->k;
    const int max = E2E_CPU_KINDS;
    int n = 0;
    set->n = 0;
    long hz = sysconf(_SC_CLK_TCK);
    DIR *d = opendir("/proc");
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        char path[64], buf[1024];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t r = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[r] = '\0';
        char *rp = strrchr(buf, ')');
        if (!rp) continue;
        int ppid;
        unsigned long ut, st;
        /* fields after ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt
         * cmajflt utime stime */
        if (sscanf(rp + 2, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ppid, &ut, &st) !=
            3)
            continue;
        if (ppid != parent) continue;
        snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
        f = fopen(path, "r");
        if (!f) continue;
        r = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[r] = '\0';
        const char *sub = buf + strlen(buf) + 1; /* argv[1] */
        if ((size_t)(sub - buf) >= r) continue;
        int i;
        for (i = 0; i < n; i++)
            if (strcmp(out[i].name, sub) == 0) break;
        if (i == n) {
            if (n >= max) continue;
            snprintf(out[n].name, sizeof out[n].name, "%s", sub);
            out[n].cpu = 0;
            out[n].n = 0;
            n++;
        }
        out[i].cpu += (double)(ut + st) / (double)hz;
        out[i].n++;
    }
    closedir(d);
    set->n = n;
}

static int e2e_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double e2e_pct(double *v, int n, double p)
{
    if (n <= 0) return 0;
    return v[(int)((double)(n - 1) * p)];
}

static int e2e_count(sqlite3 *db, const char *sql, const char *prefix, int64_t *out)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK) {
        if (prefix) sqlite3_bind_text(st, 1, prefix, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) *out = sqlite3_column_int64(st, 0);
        rc = rc == SQLITE_ROW ? 0 : -1;
    } else {
        rc = -1;
    }
    sqlite3_finalize(st);
    return rc;
}

/* Wait until every call whose key starts with \p prefix is terminal (and all \p expect exist). */
static int e2e_wait_drained(const char *calls_db, const char *prefix, int64_t expect,
                            int64_t timeout_ms, pid_t up_pid)
{
    int64_t deadline = oq_mono_us() + timeout_ms * 1000;
    char like[64];
    PGconn *pg = NULL;
    snprintf(like, sizeof like, "%s-%%", prefix);
    while (oq_mono_us() < deadline) {
        int st;
        if (waitpid(up_pid, &st, WNOHANG) == up_pid) {
            fprintf(stderr, "bench e2e: onceq up exited during the run\n");
            if (pg) PQfinish(pg);
            return -1;
        }
        sqlite3 *db = NULL;
        int64_t total = -1, open_ = -1;
        if (e2e_db_url) { /* one connection for the whole wait: its cost is the server's CPU */
            PGresult *res = NULL;
            const char *p[1] = {like};
            if (!pg && oq_pg_connect(e2e_db_url, &pg, NULL) != 0) pg = NULL;
            if (pg && oq_pg_query(pg,
                                  "SELECT count(*), count(*) FILTER (WHERE state IN "
                                  "('pending','running')) FROM onceq.calls WHERE idem_key LIKE $1",
                                  1, p, &res, NULL) == 0) {
                total = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
                open_ = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
            } else if (pg) {
                PQfinish(pg);
                pg = NULL;
            }
            PQclear(res);
        } else if (sqlite3_open_v2(calls_db, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
            sqlite3_busy_timeout(db, 2000);
            e2e_count(db, "SELECT count(*) FROM calls WHERE idem_key LIKE ?1", like, &total);
            e2e_count(db,
                      "SELECT count(*) FROM calls WHERE idem_key LIKE ?1 AND state IN "
                      "('pending','running')",
                      like, &open_);
        }
        sqlite3_close_v2(db);
        if (total >= expect && open_ == 0) {
            if (pg) PQfinish(pg);
            return 0;
        }
        oq_sleep_ms(50, NULL);
    }
    if (pg) PQfinish(pg);
    fprintf(stderr, "bench e2e: calls of run '%s' not terminal within the drain timeout\n", prefix);
    return -1;
}

/* Find the onceq binary: \p given, or `onceq` next to /proc/self/exe. 0, or -1 (message). */
static int e2e_find_onceq(const char *given)
{
    if (given) {
        snprintf(e2e_onceq, sizeof e2e_onceq, "%s", given);
    } else {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) return -1;
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) *slash = '\0';
        snprintf(e2e_onceq, sizeof e2e_onceq, "%s/onceq", slash ? self : ".");
    }
    if (access(e2e_onceq, X_OK) != 0) {
        fprintf(stderr, "onceq-bench e2e: no onceq binary at %s (build it, or pass --onceq)\n",
                e2e_onceq);
        return -1;
    }
    return 0;
}

/* fork + execv of \p exe with \p args (argv[1..]), output appended to \p log. */
static pid_t e2e_spawn_exe(char *exe, char *const args[], const char *log)
{
    char *argv[32];
    int k = 0;
    argv[k++] = exe;
    for (int i = 0; args[i] && k < 31; i++)
        argv[k++] = args[i];
    argv[k] = NULL;
    fflush(stdout); /* or the child's freopen() writes our buffered lines a second time */
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        /* The bench owns these processes: if the bench dies, they get SIGTERM. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        FILE *f = freopen(log, "a", stdout);
        if (f) dup2(fileno(stdout), 2);
        execv(exe, argv);
        _exit(127);
    }
    return pid;
}

/* The onceq binary with \p args. */
static pid_t e2e_spawn(char *const args[], const char *log)
{
    return e2e_spawn_exe(e2e_onceq, args, log);
}

static pid_t e2e_start_up(const char *dir, int port, int consumers, const char *tools)
{
    char listen[64], cons[16], log[PATH_MAX], d[PATH_MAX];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(cons, sizeof cons, "%d", consumers);
    snprintf(log, sizeof log, "%s/up.log", dir);
    snprintf(d, sizeof d, "%s", dir);
    /* Fast group formation on the mock cluster: a member joining a stable group waits
     * session.timeout.ms - 1000 (librdkafka default 45 s). */
    char t[PATH_MAX];
    snprintf(t, sizeof t, "%s", tools ? tools : "");
    char url[4200];
    snprintf(url, sizeof url, "%s", e2e_db_url ? e2e_db_url : "");
    /* no console: its fixed default port would collide with another run's */
    char *args[18] = {"up",          "--dir", d,
                      "--consumers", cons,    "--listen",
                      listen,        "-X",    "session.timeout.ms=6000",
                      "--console",   ""};
    int n = 11;
    if (tools) {
        args[n++] = "--tools";
        args[n++] = t;
    }
    if (e2e_db_url) { /* no password in it: onceq up refuses one (a passfile holds it) */
        args[n++] = "--db-url";
        args[n++] = url;
    }
    args[n] = NULL;
    return e2e_spawn(args, log);
}

/* After a start that failed: the last lines of up's and the producer's logs on stderr, so a
 * failure in a test that then removes \p dir can still be read. */
static void e2e_tail_logs(const char *dir)
{
    static const char *const names[] = {"up.log", "producer.log"};
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
        char path[PATH_MAX + 16], line[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[n]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        long keep[20] = {0};
        int k = 0;
        for (long at = ftell(f); fgets(line, sizeof line, f); at = ftell(f))
            keep[k++ % 20] = at;
        fprintf(stderr, "---- last lines of %s ----\n", path);
        fseek(f, keep[k > 20 ? k % 20 : 0], SEEK_SET);
        while (fgets(line, sizeof line, f))
            fputs(line, stderr);
        fclose(f);
    }
}

static int e2e_healthy(int port, int tenths)
{
    oq_httpc_opts_t ho = {.timeout_ms = 1000};
    oq_httpc_t *http = oq_httpc_new(&ho, NULL);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/healthz", port);
    int ok = 0;
    for (int i = 0; http && i < tenths && !ok; i++) {
        oq_httpc_resp_t r;
        ok = oq_httpc_request(http, "GET", url, NULL, NULL, &r, NULL) == 0 && r.status == 200;
        oq_httpc_resp_clear(&r);
        if (!ok) oq_sleep_ms(100, NULL);
    }
    oq_httpc_destroy(http);
    return ok;
}

static void e2e_stop_up(pid_t pid);

/*
 * Same-run baseline: the producer alone (its own broker, no relay, no consumers, no results
 * flowing back into calls.db) under the same load. The ratio to the full pipeline says how
 * much the other writers of the same host (relay marks and result applies on calls.db, the
 * consumers' transactions, their CPU) cost the submit path.
 */
static int e2e_baseline(const char *dir, const oq_load_opts_t *lo_in, oq_load_result_t *r)
{
    char bs[PATH_MAX], db[PATH_MAX], log[PATH_MAX], listen[64], brokers[4096] = "";
    snprintf(bs, sizeof bs, "%s/base-bootstrap", dir);
    snprintf(db, sizeof db, "%s/base-calls.db", dir);
    snprintf(log, sizeof log, "%s/base.log", dir);
    int port = e2e_free_port();
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    /* One mock broker, as `onceq up` runs by default (--embedded-brokers). */
    char *const bargs[] = {"broker", "--bootstrap-file", bs, "--brokers", "1", NULL};
    pid_t broker = e2e_spawn(bargs, log), prod = -1;
    int rc = -1;
    for (int i = 0; i < 200 && !brokers[0]; i++) {
        FILE *f = fopen(bs, "r");
        if (f) {
            if (!fgets(brokers, sizeof brokers, f)) brokers[0] = '\0';
            brokers[strcspn(brokers, "\r\n")] = '\0';
            fclose(f);
        }
        if (!brokers[0]) oq_sleep_ms(50, NULL);
    }
    if (!brokers[0]) goto out;
    char *const pargs[] = {"producer",        "--db", db,  "--listen", listen, "--brokers", brokers,
                           "--kafka-profile", "mock", NULL}; /* as up's */
    prod = e2e_spawn(pargs, log);
    if (prod <= 0 || !e2e_healthy(port, 300)) goto out;
    oq_load_opts_t lo = *lo_in;
    lo.port = port;
    lo.key_prefix = e2e_key("base");
    oq_error_t err = {0};
    rc = oq_load_run(&lo, r, &err);
out:
    e2e_stop_up(prod);
    e2e_stop_up(broker);
    return rc;
}

static void e2e_stop_up(pid_t pid)
{
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 300; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return;
        oq_sleep_ms(100, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Per-hop latencies of the measured calls, read from both databases. */
typedef struct e2e_figures e2e_figures_t;
static void e2e_figures_set(e2e_figures_t *fig, double cps, double p50, double p99);

static int e2e_analyse(const char *dir, const char *prefix, int64_t offered_calls,
                       e2e_figures_t *fig)
{
    char pdb[PATH_MAX], curi[PATH_MAX + 32];
    snprintf(pdb, sizeof pdb, "%s/calls.db", dir);
    snprintf(curi, sizeof curi, "%s/effects.db", dir);
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int rc = -1;
    enum { H_E2E, H_DELIVER, H_EXEC, H_BACK, H__N };
    static const char *const hname[H__N] = {
        "end to end (submit committed -> result applied)",
        "  submit committed -> consumer received",
        "  received -> effect committed (consumer tx)",
        "  effect committed -> result applied at producer",
    };
    double *h[H__N] = {0};
    int hn[H__N] = {0};
    double *all = NULL;
    int nall = 0;
    if (sqlite3_open_v2(pdb, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) goto out;
    sqlite3_busy_timeout(db, 5000);
    if (sqlite3_prepare_v2(db, "ATTACH DATABASE ?1 AS c", -1, &st, NULL) != SQLITE_OK) goto out;
    sqlite3_bind_text(st, 1, curi, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) goto out;
    sqlite3_finalize(st);
    st = NULL;
    for (int i = 0; i < H__N; i++) {
        h[i] = calloc((size_t)offered_calls + 1, sizeof(double));
        if (!h[i]) goto out;
    }
    all = calloc((size_t)offered_calls + 1, sizeof(double));
    if (!all) goto out;
    char like[64];
    snprintf(like, sizeof like, "%s-%%", prefix);
    /* Per-call first receipt, aggregated once into a keyed temp table (the inbox has no
     * index on call_id: a correlated subquery would scan it once per call). */
    static const char *const prep[] = {
        "CREATE TEMP TABLE h_in(k TEXT PRIMARY KEY, t INTEGER) WITHOUT ROWID",
        "INSERT INTO h_in SELECT call_id, min(received_at) FROM c.inbox WHERE call_id NOTNULL "
        "GROUP BY call_id",
    };
    for (size_t i = 0; i < sizeof prep / sizeof prep[0]; i++) {
        if (sqlite3_exec(db, prep[i], NULL, NULL, NULL) != SQLITE_OK) {
            fprintf(stderr, "bench e2e: analysis: %s\n", sqlite3_errmsg(db));
            goto out;
        }
    }
    /* One row per measured call; hop timestamps may be NULL (e.g. no effect for a sleep). */
    const char *sql =
        "SELECT p.tool, p.created_at, p.updated_at, NULL, i.t, e.created_at, NULL"
        " FROM main.calls p LEFT JOIN temp.h_in i ON i.k = p.call_id"
        " LEFT JOIN c.effects e ON e.call_id = p.call_id"
        " WHERE p.idem_key LIKE ?1 AND p.state IN ('succeeded','failed','needs_review')";
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        fprintf(stderr, "bench e2e: analysis query: %s\n", sqlite3_errmsg(db));
        goto out;
    }
    sqlite3_bind_text(st, 1, like, -1, SQLITE_STATIC);
    int64_t tmin = INT64_MAX, tmax = 0, n = 0;
    while (sqlite3_step(st) == SQLITE_ROW && n < offered_calls) {
        int64_t t0 = sqlite3_column_int64(st, 1), t5 = sqlite3_column_int64(st, 2);
        int has[4];
        int64_t t[4];
        for (int k = 0; k < 4; k++) {
            has[k] = sqlite3_column_type(st, 3 + k) != SQLITE_NULL;
            t[k] = sqlite3_column_int64(st, 3 + k);
        }
        if (t0 < tmin) tmin = t0;
        if (t5 > tmax) tmax = t5;
        all[nall++] = (double)(t5 - t0);
        n++;
        if (!has[2]) continue; /* hop breakdown only for effectful calls */
        h[H_E2E][hn[H_E2E]++] = (double)(t5 - t0);
        if (has[1]) h[H_DELIVER][hn[H_DELIVER]++] = (double)(t[1] - t0);
        if (has[1]) h[H_EXEC][hn[H_EXEC]++] = (double)(t[2] - t[1]);
        h[H_BACK][hn[H_BACK]++] = (double)(t5 - t[2]);
    }
    double span = tmax > tmin ? (double)(tmax - tmin) / 1000.0 : 0;
    printf("\nend-to-end (from the databases):\n");
    printf("  terminal calls       %lld of %lld\n", (long long)n, (long long)offered_calls);
    printf("  first submit -> last result applied: %.2f s => %.0f calls/s end to end\n", span,
           span > 0 ? (double)n / span : 0);
    qsort(all, (size_t)nall, sizeof *all, e2e_cmp);
    printf("  all calls latency    p50 %.0f ms  p90 %.0f ms  p99 %.0f ms  max %.0f ms\n",
           e2e_pct(all, nall, 0.5), e2e_pct(all, nall, 0.9), e2e_pct(all, nall, 0.99),
           e2e_pct(all, nall, 1.0));
    e2e_figures_set(fig, span > 0 ? (double)n / span : 0, e2e_pct(all, nall, 0.5),
                    e2e_pct(all, nall, 0.99));
    printf("\nwhere time goes (effectful calls, ms; hop timestamps have 1 ms resolution):\n");
    printf("  %-52s %7s %7s %7s %7s\n", "hop", "n", "p50", "p99", "max");
    for (int i = 0; i < H__N; i++) {
        qsort(h[i], (size_t)hn[i], sizeof(double), e2e_cmp);
        printf("  %-52s %7d %7.0f %7.0f %7.0f\n", hname[i], hn[i], e2e_pct(h[i], hn[i], 0.5),
               e2e_pct(h[i], hn[i], 0.99), e2e_pct(h[i], hn[i], 1.0));
    }
    rc = n == offered_calls ? 0 : -1;
out:
    sqlite3_finalize(st);
    sqlite3_close_v2(db);
    for (int i = 0; i < H__N; i++)
        free(h[i]);
    free(all);
    return rc;
}

static void e2e_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[PATH_MAX];
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            e2e_rmdir(p); /* the HTTP run's subdirectory */
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* What one measured pipeline achieved. */
struct e2e_figures {
    double calls_per_s, p50_ms, p99_ms, ds_dsr;
    double cpu_us, write_bytes;       /* per call: the pipeline's processes */
    double pg_cpu_us, pg_write_bytes; /* per call: the PostgreSQL server */
    double disk_bytes;                /* per call: written to the disks, machine-wide (-1: ?) */
};

/* --db-url: the producer's and the consumer's rows from PostgreSQL into DIR/calls.db and
 * DIR/effects.db, so the analysis and verify read them as SQLite files. */
static int e2e_export(const char *dir, oq_error_t *err)
{
    char p[PATH_MAX + 16], c[PATH_MAX + 16];
    snprintf(p, sizeof p, "%s/calls.db", dir);
    snprintf(c, sizeof c, "%s/effects.db", dir);
    unlink(p);
    unlink(c);
    sqlite3 *db = NULL;
    PGconn *pg = NULL;
    static const char *const t[] = {"onceq.calls", "onceq.audit"}, *const n[] = {"calls", "audit"};
    int rc = sqlite3_open_v2(p, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK
                 ? oq_error_set(err, OQ_EIO, 0, "%s: cannot create", p)
                 : 0;
    if (!rc) sqlite3_exec(db, "PRAGMA journal_mode=OFF; BEGIN", NULL, NULL, NULL);
    if (!rc) rc = oq_pg_connect(e2e_db_url, &pg, err);
    if (!rc) rc = oq_pg_snapshot(pg, t, n, 2, db, err);
    if (!rc && sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        rc = oq_error_set(err, OQ_EIO, 0, "%s: %s", p, sqlite3_errmsg(db));
    if (pg) PQfinish(pg);
    if (db) sqlite3_close_v2(db);
    if (!rc) rc = oq__consumer_store_export(e2e_db_url, c, err);
    return rc;
}

static void e2e_figures_set(e2e_figures_t *fig, double cps, double p50, double p99)
{
    fig->calls_per_s = cps;
    fig->p50_ms = p50;
    fig->p99_ms = p99;
}

/*
 * One measured pipeline in \p dir: `onceq up` (with the tools file \p tools, or none), warm-up,
 * the measured load \p lo_in, drain, CPU, hop analysis, verify (over the downstream's ledger
 * \p ledger too, when given; the CPU of the downstream's process \p ds too, when > 0).
 * @returns an exit code; \p fig receives the figures.
 */
static int e2e_pipeline(const oq_config_t *cfg, const char *dir, const oq_load_opts_t *lo_in,
                        const char *tools, const char *ledger, pid_t ds,
                        const oq_load_result_t *base, e2e_figures_t *fig)
{
    int rc = OQ_EXIT_FAIL;
    pid_t up = -1;
    oq_load_opts_t lo = *lo_in;
    char calls_db[PATH_MAX + 16];
    snprintf(calls_db, sizeof calls_db, "%s/calls.db", dir);
    int64_t bench_t0 = oq_mono_us();
    int port = e2e_free_port();
    int consumers = (int)oq_config_int(cfg, "consumers");
    up = e2e_start_up(dir, port, consumers, tools);
    if (up <= 0 || port <= 0) goto out;
    printf("onceq-bench e2e: onceq up pid=%d dir=%s http=127.0.0.1:%d consumers=%d "
           "(durable: WAL + synchronous=FULL for accepted data)\n",
           (int)up, dir, port, consumers);
    fflush(stdout);
    if (!e2e_healthy(port, 300)) {
        fprintf(stderr, "onceq-bench e2e: producer not healthy after 30 s (see %s/up.log)\n", dir);
        e2e_tail_logs(dir);
        goto out;
    }
    lo.host = "127.0.0.1";
    lo.port = port;
    lo.conns = (int)oq_config_int(cfg, "conns");
    int64_t drain = oq_config_int(cfg, "drain-timeout");
    oq_load_result_t r;
    oq_error_t err = {0};
    int64_t warm = oq_config_int(cfg, "warmup");
    if (warm > 0) {
        lo.calls = warm;
        lo.rate = 0;
        lo.key_prefix = e2e_key("warm");
        if (oq_load_run(&lo, &r, &err) != 0 || r.accepted != warm) {
            fprintf(stderr, "onceq-bench e2e: warm-up failed: %s\n", err.msg);
            goto out;
        }
        if (e2e_wait_drained(calls_db, e2e_key("warm"), warm, drain, up) != 0) goto out;
        printf("warm-up: %lld calls drained (%.1f s after start)\n", (long long)warm,
               (double)(oq_mono_us() - bench_t0) / 1e6);
        fflush(stdout);
    }
    e2e_cpu_set_t cpu0, cpu1;
    e2e_cpu_sample(up, &cpu0);
    oq_bench_procs_t pl0, pl1, pg0, pg1, ds0, ds1;
    oq__bench_procs(up, 1, &pl0);
    oq__bench_procs(oq__bench_pg_pid(), 1, &pg0);
    oq__bench_procs(ds, 0, &ds0);
    int64_t disk0 = oq__bench_disk_written();
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    lo.calls = oq_config_int(cfg, "calls");
    lo.rate = (double)oq_config_int(cfg, "rate");
    lo.key_prefix = e2e_key("run");
    int64_t t0 = oq_mono_us();
    if (oq_load_run(&lo, &r, &err) != 0) {
        fprintf(stderr, "onceq-bench e2e: load: %s\n", err.msg);
        goto out;
    }
    char offered[32] = "max";
    if (lo.rate > 0) snprintf(offered, sizeof offered, "%.0f/s", lo.rate);
    printf("submit: %lld calls offered at %s, %lld accepted in %.2f s (%.0f/s), submit latency "
           "p50 %.2f ms p99 %.2f ms, retries %lld\n",
           (long long)lo.calls, offered, (long long)r.accepted, r.elapsed_s,
           r.elapsed_s > 0 ? r.accepted / r.elapsed_s : 0, r.p50_ms, r.p99_ms,
           (long long)r.retries);
    if (e2e_wait_drained(calls_db, e2e_key("run"), r.accepted, drain, up) != 0) goto out;
    double wall = (double)(oq_mono_us() - t0) / 1e6;
    e2e_cpu_sample(up, &cpu1);
    oq__bench_procs(up, 1, &pl1);
    oq__bench_procs(oq__bench_pg_pid(), 1, &pg1);
    oq__bench_procs(ds, 0, &ds1);
    int64_t disk1 = oq__bench_disk_written();
    getrusage(RUSAGE_SELF, &ru1);
    double self_cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
                      (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
                      (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6 +
                      (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    printf("drained: all %lld calls terminal %.2f s after the first submit\n",
           (long long)r.accepted, wall);
    printf("\nCPU seconds during the run (2 cores = %.1f s available):\n", 2 * wall);
    for (int i = 0; i < cpu1.n && i < E2E_CPU_KINDS; i++) {
        const e2e_cpu_t *k = &cpu1.k[i];
        double used = k->cpu - e2e_cpu_of(&cpu0, k->name);
        printf("  %-10s x%d  %6.2f s  (%.0f%% of one core)\n", k->name, k->n, used,
               100.0 * used / wall);
    }
    printf("  %-10s x1  %6.2f s  (%.0f%% of one core; this process: HTTP client threads)\n", "load",
           self_cpu, 100.0 * self_cpu / wall);
    double pg_cpu = pg1.n ? pg1.cpu_s - pg0.cpu_s : 0;
    double pg_wb = pg1.n ? (double)(pg1.write_bytes - pg0.write_bytes) : 0;
    if (pg1.n)
        printf("  %-10s x%d  %6.2f s  (%.0f%% of one core; the PostgreSQL server)\n", "postgres",
               pg1.n, pg_cpu, 100.0 * pg_cpu / wall);
    double ncalls = r.accepted > 0 ? (double)r.accepted : 1;
    if (ds1.n) /* the service the HTTP tool calls: not part of the pipeline's figures */
        printf("  %-10s x1  %6.2f s  (%.0f%% of one core; onceq-downstream, %.0f us per call, "
               "%.0f bytes written per call)\n",
               "downstream", ds1.cpu_s - ds0.cpu_s, 100.0 * (ds1.cpu_s - ds0.cpu_s) / wall,
               (ds1.cpu_s - ds0.cpu_s) * 1e6 / ncalls,
               (double)(ds1.write_bytes - ds0.write_bytes) / ncalls);
    double pl_cpu = pl1.cpu_s - pl0.cpu_s, pl_wb = (double)(pl1.write_bytes - pl0.write_bytes);
    printf("per call: pipeline processes %.0f us CPU, %.0f bytes written; PostgreSQL server %.0f "
           "us CPU, %.0f bytes written%s\n",
           pl_cpu * 1e6 / ncalls, pl_wb / ncalls, pg_cpu * 1e6 / ncalls, pg_wb / ncalls,
           pg1.n ? "" : " (not measured)");
    double dd = oq__bench_disk_delta(disk0, disk1);
    fig->disk_bytes = dd >= 0 ? dd / ncalls : -1;
    oq__bench_print_disk("call", fig->disk_bytes);
    fig->cpu_us = pl_cpu * 1e6 / ncalls;
    fig->write_bytes = pl_wb / ncalls;
    fig->pg_cpu_us = pg_cpu * 1e6 / ncalls;
    fig->pg_write_bytes = pg_wb / ncalls;
    e2e_stop_up(up);
    up = -1;
    if (e2e_db_url && e2e_export(dir, &err) != 0) {
        fprintf(stderr, "onceq-bench e2e: copying the PostgreSQL rows: %s\n", err.msg);
        goto out;
    }
    if (e2e_analyse(dir, e2e_key("run"), r.accepted, fig) != 0) {
        fprintf(stderr, "onceq-bench e2e: analysis incomplete\n");
        goto out;
    }
    oq_verify_report_t rep;
    char cdb[PATH_MAX + 16];
    snprintf(cdb, sizeof cdb, "%s/effects.db", dir);
    oq_verify_opts_t vo = {.downstream_db = ledger};
    if (oq_verify_run(calls_db, cdb, &vo, &rep, &err) == 0) {
        printf("\nverify: calls %lld, effects %lld, duplicates %lld, lost %lld, DSR %.6f, %s\n",
               (long long)rep.calls, (long long)rep.effects, (long long)rep.duplicates,
               (long long)rep.lost, rep.dsr, rep.violations ? "VIOLATIONS" : "clean");
        if (rep.has_downstream)
            printf("verify, downstream ledger: %lld effects for %lld calls, %lld duplicates, "
                   "DSR %.6f\n",
                   (long long)rep.ds_effects, (long long)rep.ds_calls, (long long)rep.ds_duplicates,
                   rep.ds_dsr);
        fig->ds_dsr = rep.ds_dsr;
        rc = rep.violations ? OQ_EXIT_VIOLATION : OQ_EXIT_OK;
        if (base && base->elapsed_s > 0 && wall > 0)
            printf("ratio: end-to-end calls/s / producer-alone submits/s = %.2f\n",
                   ((double)r.accepted / wall) / ((double)base->accepted / base->elapsed_s));
        oq_verify_report_clear(&rep);
    } else {
        fprintf(stderr, "verify: %s\n", err.msg);
    }
out:
    e2e_stop_up(up);
    return rc;
}

/*
 * The same measured pipeline with an HTTP tool: `onceq-downstream` (durable ledger, keys
 * honoured, lookup on) in \p dir, a tools file declaring "pay" against it, the load's charge
 * share sent to "pay", and verify over the ledger.
 */
static int e2e_http(const oq_config_t *cfg, const char *dir, const oq_load_opts_t *lo,
                    e2e_figures_t *fig)
{
    char ledger[PATH_MAX], tools[PATH_MAX], log[PATH_MAX], listen[64];
    int port = e2e_free_port(), rc = OQ_EXIT_FAIL;
    snprintf(ledger, sizeof ledger, "%s/downstream.db", dir);
    snprintf(tools, sizeof tools, "%s/tools.json", dir);
    snprintf(log, sizeof log, "%s/downstream.log", dir);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    FILE *f = fopen(tools, "w");
    if (!f) {
        fprintf(stderr, "onceq-bench e2e: %s: %s\n", tools, strerror(errno));
        return rc;
    }
    fprintf(f,
            "{\"version\": 1, \"tools\": [{\"name\": \"pay\", \"url\": "
            "\"http://%s/v1/payments\", \"body\": {\"amount\": \"{amount}\", \"reference\": "
            "\"{effect_id}\"}, \"idempotent\": true, \"lookup\": {\"url\": "
            "\"http://%s/v1/payments?idempotency_key={effect_id}\"}}]}\n",
            listen, listen);
    fclose(f);
    /* the test service is its own program, next to onceq */
    char dexe[PATH_MAX + 32];
    const char *slash = strrchr(e2e_onceq, '/');
    snprintf(dexe, sizeof dexe, "%.*sonceq-downstream", slash ? (int)(slash - e2e_onceq + 1) : 0,
             e2e_onceq);
    char *const dargs[] = {"--listen", listen, "--db", ledger, NULL};
    pid_t ds = access(dexe, X_OK) == 0 ? e2e_spawn_exe(dexe, dargs, log) : -1;
    if (ds <= 0 || !e2e_healthy(port, 150)) {
        fprintf(stderr, "onceq-bench e2e: %s did not start (see %s)\n", dexe, log);
        goto out;
    }
    printf("onceq-downstream pid=%d on %s, ledger %s (synchronous=FULL)\n", (int)ds, listen,
           ledger);
    rc = e2e_pipeline(cfg, dir, lo, tools, ledger, ds, NULL, fig);
out:
    e2e_stop_up(ds);
    return rc;
}

/* --- --tasks: 3-step tasks against three independent calls --------------------------------- */

/* \p sql's first column over calls.db (effects.db of the same directory attached as c) as
 * sorted doubles (*v owned), *n of them. ?1 in \p sql is this run's task keys (LIKE), ?2 its
 * independent calls' keys. */
static int e2e_column(const char *calls_db, const char *sql, double **v, int *n)
{
    char attach[PATH_MAX + 64];
    const char *slash = strrchr(calls_db, '/');
    snprintf(attach, sizeof attach, "ATTACH DATABASE '%.*seffects.db' AS c",
             slash ? (int)(slash - calls_db + 1) : 0, calls_db);
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int cap = 0;
    *v = NULL;
    *n = 0;
    if (sqlite3_open_v2(calls_db, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK ||
        sqlite3_exec(db, attach, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        sqlite3_close_v2(db);
        return -1;
    }
    int np = sqlite3_bind_parameter_count(st);
    if (np >= 1) sqlite3_bind_text(st, 1, e2e_like("task"), -1, SQLITE_TRANSIENT);
    if (np >= 2) sqlite3_bind_text(st, 2, e2e_like("ind"), -1, SQLITE_TRANSIENT);
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (*n == cap) {
            double *nv = realloc(*v, (size_t)(cap = cap ? 2 * cap : 1024) * sizeof *nv);
            if (!nv) break;
            *v = nv;
        }
        (*v)[(*n)++] = sqlite3_column_double(st, 0);
    }
    sqlite3_finalize(st);
    sqlite3_close_v2(db);
    if (*n) qsort(*v, (size_t)*n, sizeof **v, e2e_cmp);
    return 0;
}

/* Print \p sql's distribution; its p50 and p99 in *p50, *p99 when given (0 without rows). */
static void e2e_print_dist2(const char *calls_db, const char *what, const char *sql, double *p50,
                            double *p99)
{
    double *v = NULL;
    int n = 0;
    if (p50) *p50 = 0;
    if (p99) *p99 = 0;
    if (e2e_column(calls_db, sql, &v, &n) == 0 && n > 0) {
        printf("  %-28s n=%-6d p50 %6.1f ms  p99 %6.1f ms\n", what, n, e2e_pct(v, n, 0.5),
               e2e_pct(v, n, 0.99));
        if (p50) *p50 = e2e_pct(v, n, 0.5);
        if (p99) *p99 = e2e_pct(v, n, 0.99);
    } else {
        printf("  %-28s (no rows)\n", what);
    }
    free(v);
}

static void e2e_print_dist(const char *calls_db, const char *what, const char *sql)
{
    e2e_print_dist2(calls_db, what, sql, NULL, NULL);
}

/* Pipeline processes' CPU seconds (children of \p up) now. */
static double e2e_pl_cpu(pid_t up)
{
    oq_bench_procs_t p;
    oq__bench_procs(up, 1, &p);
    return p.cpu_s;
}

/* One measured phase: \p n steps (task phases) or calls, their wall time and the pipeline's CPU
 * seconds from the first submit to the last terminal state. */
typedef struct {
    double wall_s, cpu_s, submit_s; /* submit_s: task phases, until the last 202 */
    int64_t n;
    e2e_cpu_set_t k0, k1; /* per process kind, at the start and at the end */
} e2e_phase_t;

/* CPU us per step or call of process kind \p name in \p ph (raw). */
static double e2e_us_kind(const e2e_phase_t *ph, const char *name)
{
    return ph->n ? (e2e_cpu_of(&ph->k1, name) - e2e_cpu_of(&ph->k0, name)) * 1e6 / (double)ph->n
                 : 0;
}

/* CPU us per step or call of \p ph: raw, and net of \p idle_cps (the pipeline's CPU seconds per
 * second at rest, times the phase's wall time). */
static double e2e_us_raw(const e2e_phase_t *ph)
{
    return ph->n ? ph->cpu_s * 1e6 / (double)ph->n : 0;
}

static double e2e_us_net(const e2e_phase_t *ph, double idle_cps)
{
    return ph->n ? (ph->cpu_s - idle_cps * ph->wall_s) * 1e6 / (double)ph->n : 0;
}

/* One submitter of e2e_task_phase(): tasks k, k + nth, ... on its own connection. */
typedef struct {
    int port, k, nth;
    const char *prefix;
    int64_t ntasks, t0;
    double rate;
    int failed;
} e2e_tsub_t;

static void *e2e_tsub_main(void *arg)
{
    e2e_tsub_t *a = arg;
    char url[96], key[64], hdr[96];
    static const char body[] =
        "{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{\"amount\":1}},"
        "{\"name\":\"b\",\"tool\":\"pay\",\"args\":{\"amount\":2}},"
        "{\"name\":\"c\",\"tool\":\"pay\",\"args\":{\"amount\":3}}]}";
    oq_error_t err = {0};
    oq_httpc_t *hc = oq_httpc_new(NULL, &err);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/tasks", a->port);
    for (int64_t i = a->k; hc && i < a->ntasks && !a->failed; i += a->nth) {
        if (a->rate > 0) { /* open loop: task i is due at t0 + i/rate, late ones go at once */
            int64_t due = a->t0 + (int64_t)((double)i * 1e6 / a->rate), now = oq_mono_us();
            if (due > now + 1000) oq_sleep_ms((due - now) / 1000, NULL);
        }
        snprintf(key, sizeof key, "%s-%lld", a->prefix, (long long)i);
        snprintf(hdr, sizeof hdr, "Idempotency-Key: %s", key);
        const char *const h[] = {hdr, NULL};
        oq_httpc_resp_t resp = {0};
        int hr = oq_httpc_request(hc, "POST", url, h, body, &resp, &err);
        long status = resp.status;
        oq_httpc_resp_clear(&resp);
        if (hr || (status != 202 && status != 200)) {
            fprintf(stderr, "onceq-bench e2e: task %s: %s (HTTP %ld)\n", key, hr ? err.msg : "",
                    status);
            a->failed = 1;
        }
    }
    if (!hc) a->failed = 1;
    return NULL;
}

/* \p ntasks 3-step tasks keyed \p prefix-<i> from \p nth submitters (one connection each; a
 * submit answers 202 once the task and its first step are committed): back to back (\p rate 0,
 * the pipeline's capacity) or open loop at \p rate tasks/s in all, then drained. 0, or -1
 * (message). */
static int e2e_task_phase(int port, int nth, const char *prefix, int64_t ntasks, double rate,
                          const char *calls_db, int64_t drain, pid_t up, e2e_phase_t *ph)
{
    e2e_tsub_t a[16];
    pthread_t th[16];
    int started = 0, failed = 0;
    if (nth < 1) nth = 1;
    if (nth > 16) nth = 16;
    e2e_cpu_sample(up, &ph->k0);
    double c0 = e2e_pl_cpu(up);
    int64_t t0 = oq_mono_us();
    for (int k = 0; k < nth; k++) {
        a[k] = (e2e_tsub_t){.port = port,
                            .k = k,
                            .nth = nth,
                            .prefix = prefix,
                            .ntasks = ntasks,
                            .t0 = t0,
                            .rate = rate};
        if (pthread_create(&th[k], NULL, e2e_tsub_main, &a[k]) != 0) {
            failed = 1;
            break;
        }
        started++;
    }
    for (int k = 0; k < started; k++) {
        pthread_join(th[k], NULL);
        failed |= a[k].failed;
    }
    if (failed) return -1;
    ph->submit_s = (double)(oq_mono_us() - t0) / 1e6;
    if (e2e_wait_drained(calls_db, prefix, 3 * ntasks, drain, up) != 0) return -1;
    ph->wall_s = (double)(oq_mono_us() - t0) / 1e6;
    ph->cpu_s = e2e_pl_cpu(up) - c0;
    e2e_cpu_sample(up, &ph->k1);
    ph->n = 3 * ntasks;
    return 0;
}

/* \p n independent calls keyed \p prefix-<i> through \p lo_in's connections, closed loop (\p rate
 * 0) or at \p rate calls/s, then drained. 0, or -1 (message). */
static int e2e_call_phase(const oq_load_opts_t *lo_in, const char *prefix, int64_t n, double rate,
                          const char *calls_db, int64_t drain, pid_t up, e2e_phase_t *ph)
{
    oq_load_opts_t lo = *lo_in;
    oq_load_result_t r;
    oq_error_t err = {0};
    lo.calls = n;
    lo.key_prefix = prefix;
    lo.rate = rate;
    e2e_cpu_sample(up, &ph->k0);
    double c0 = e2e_pl_cpu(up);
    int64_t t0 = oq_mono_us();
    if (oq_load_run(&lo, &r, &err) != 0 || e2e_wait_drained(calls_db, prefix, n, drain, up) != 0) {
        fprintf(stderr, "onceq-bench e2e: independent calls (%s): %s\n", prefix, err.msg);
        return -1;
    }
    ph->wall_s = (double)(oq_mono_us() - t0) / 1e6;
    ph->cpu_s = e2e_pl_cpu(up) - c0;
    e2e_cpu_sample(up, &ph->k1);
    ph->n = n;
    return 0;
}

/* The step-to-step gap of the tasks keyed \p prefix-<i>: a step's result applied at the
 * producer -> the next step's effect committed at the consumer. */
static void e2e_gap(const char *calls_db, const char *prefix, double *p50, double *p99)
{
    char sql[512], what[64];
    snprintf(sql, sizeof sql,
             "SELECT e.created_at - p.updated_at FROM task_steps a JOIN task_steps b ON "
             "b.task_id=a.task_id AND b.idx=a.idx+1 JOIN calls p ON p.call_id=a.call_id "
             "JOIN c.effects e ON e.call_id=b.call_id WHERE p.idem_key LIKE '%s-%%'",
             prefix);
    snprintf(what, sizeof what, "result -> next effect (%s)", prefix);
    e2e_print_dist2(calls_db, what, sql, p50, p99);
}

static int e2e_tasks(const oq_config_t *cfg, const char *dir, int64_t ntasks)
{
    char ledger[PATH_MAX], tools[PATH_MAX], log[PATH_MAX], listen[64], calls_db[PATH_MAX];
    int dport = e2e_free_port(), port = e2e_free_port(), rc = OQ_EXIT_FAIL;
    pid_t ds = -1, up = -1;
    oq_error_t err = {0};
    snprintf(ledger, sizeof ledger, "%s/downstream.db", dir);
    snprintf(tools, sizeof tools, "%s/tools.json", dir);
    snprintf(log, sizeof log, "%s/downstream.log", dir);
    snprintf(calls_db, sizeof calls_db, "%s/calls.db", dir);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", dport);
    FILE *f = fopen(tools, "w");
    if (!f) {
        fprintf(stderr, "onceq-bench e2e: %s: %s\n", tools, strerror(errno));
        return rc;
    }
    fprintf(f,
            "{\"version\": 1, \"tools\": [{\"name\": \"pay\", \"url\": "
            "\"http://%s/v1/payments\", \"body\": {\"amount\": \"{amount}\", \"reference\": "
            "\"{effect_id}\"}, \"idempotent\": true, \"lookup\": {\"url\": "
            "\"http://%s/v1/payments?idempotency_key={effect_id}\"}}]}\n",
            listen, listen);
    fclose(f);
    char dexe[PATH_MAX + 32];
    const char *slash = strrchr(e2e_onceq, '/');
    snprintf(dexe, sizeof dexe, "%.*sonceq-downstream", slash ? (int)(slash - e2e_onceq + 1) : 0,
             e2e_onceq);
    char *const dargs[] = {"--listen", listen, "--db", ledger, NULL};
    ds = access(dexe, X_OK) == 0 ? e2e_spawn_exe(dexe, dargs, log) : -1;
    if (ds <= 0 || !e2e_healthy(dport, 150)) {
        fprintf(stderr, "onceq-bench e2e: %s did not start (see %s)\n", dexe, log);
        goto out;
    }
    int consumers = (int)oq_config_int(cfg, "consumers");
    up = e2e_start_up(dir, port, consumers, tools);
    if (up <= 0 || !e2e_healthy(port, 300)) {
        fprintf(stderr, "onceq-bench e2e: producer not healthy (see %s/up.log)\n", dir);
        e2e_tail_logs(dir);
        goto out;
    }
    printf("onceq-bench e2e --tasks: onceq up pid=%d dir=%s, onceq-downstream pid=%d on %s\n",
           (int)up, dir, (int)ds, listen);
    int64_t drain = oq_config_int(cfg, "drain-timeout");
    oq_load_opts_t lo;
    memset(&lo, 0, sizeof lo);
    lo.host = "127.0.0.1";
    lo.port = port;
    lo.conns = (int)oq_config_int(cfg, "conns");
    lo.mix[OQ_LOAD_CHARGE] = 1;
    lo.charge_tool = "pay";
    oq_load_result_t r;
    int64_t warm = oq_config_int(cfg, "warmup");
    if (warm > 0) {
        lo.calls = warm;
        lo.key_prefix = e2e_key("warm");
        if (oq_load_run(&lo, &r, &err) != 0 ||
            e2e_wait_drained(calls_db, e2e_key("warm"), warm, drain, up) != 0) {
            fprintf(stderr, "onceq-bench e2e: warm-up failed %s\n", err.msg);
            goto out;
        }
    }
    /* The pipeline at rest (after the warm-up's tail): its daemons poll, so it costs CPU per
     * second whatever runs; a slower phase pays more of it per step. */
    double idle_cps = 0, idle_s = (double)oq_config_int(cfg, "idle") / 1000.0;
    if (idle_s > 0) {
        oq_sleep_ms(1000, NULL);
        double c0 = e2e_pl_cpu(up);
        int64_t t0 = oq_mono_us();
        oq_sleep_ms((int64_t)(idle_s * 1000), NULL);
        idle_cps = (e2e_pl_cpu(up) - c0) / ((double)(oq_mono_us() - t0) / 1e6);
    }
    int tconns = lo.conns < 8 ? lo.conns : 8; /* task submitters */
    /* 1. tasks back to back: the capacity; 2. as many independent calls, closed loop (the old
     * comparison) and 3. open loop at the steps/s the tasks reached (both phases last about as
     * long); 4. tasks open loop at --task-rate (default half of 1.'s capacity): the step-to-step
     * gap there; 5. independent calls at that run's steps/s */
    e2e_phase_t tph, iph, irph, toph, ioph;
    if (e2e_task_phase(port, tconns, e2e_key("task"), ntasks, 0, calls_db, drain, up, &tph) != 0)
        goto out;
    double tw = tph.wall_s, steps_ps = tw > 0 ? (double)tph.n / tw : 0;
    if (e2e_call_phase(&lo, e2e_key("ind"), 3 * ntasks, 0, calls_db, drain, up, &iph) != 0 ||
        e2e_call_phase(&lo, e2e_key("indr"), 3 * ntasks, steps_ps, calls_db, drain, up, &irph) != 0)
        goto out;
    double task_rate = (double)oq_config_int(cfg, "task-rate");
    if (task_rate <= 0) task_rate = tw > 0 ? (double)ntasks / tw / 2 : 1;
    if (e2e_task_phase(port, tconns, e2e_key("otask"), ntasks, task_rate, calls_db, drain, up,
                       &toph) != 0 ||
        e2e_call_phase(&lo, e2e_key("oind"), 3 * ntasks, 3 * task_rate, calls_db, drain, up,
                       &ioph) != 0)
        goto out;
    double iw = iph.wall_s;
    int64_t ok = -1, ook = -1;
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(calls_db, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        e2e_count(db, "SELECT count(*) FROM tasks WHERE idem_key LIKE ?1 AND status='succeeded'",
                  e2e_like("task"), &ok);
        e2e_count(db, "SELECT count(*) FROM tasks WHERE idem_key LIKE ?1 AND status='succeeded'",
                  e2e_like("otask"), &ook);
    }
    sqlite3_close_v2(db);
    printf("\ntasks: %lld of %lld succeeded in %.2f s = %.1f tasks/s (%.1f steps/s); submitted "
           "from %d connections in %.2f s\n",
           (long long)ok, (long long)ntasks, tw, tw > 0 ? ntasks / tw : 0, steps_ps, tconns,
           tph.submit_s);
    printf("independent calls: %lld in %.2f s = %.1f calls/s\n", (long long)(3 * ntasks), iw,
           iw > 0 ? 3 * ntasks / iw : 0);
    static const char *const step_sql[3] = {
        "SELECT c.updated_at - c.created_at FROM task_steps s JOIN calls c ON c.call_id=s.call_id "
        "WHERE s.idx=0 AND c.idem_key LIKE ?1",
        "SELECT c.updated_at - c.created_at FROM task_steps s JOIN calls c ON c.call_id=s.call_id "
        "WHERE s.idx=1 AND c.idem_key LIKE ?1",
        "SELECT c.updated_at - c.created_at FROM task_steps s JOIN calls c ON c.call_id=s.call_id "
        "WHERE s.idx=2 AND c.idem_key LIKE ?1"};
    printf("latency (calls.db timestamps: written -> result applied):\n");
    e2e_print_dist(calls_db, "step a", step_sql[0]);
    e2e_print_dist(calls_db, "step b", step_sql[1]);
    e2e_print_dist(calls_db, "step c", step_sql[2]);
    /* the next call is written in the transaction that applies the previous result: 0 ms at
     * the producer by construction; what an observer sees is the hop from that result to the
     * next step's effect (relay, Kafka, consumer, downstream) */
    e2e_print_dist(calls_db, "result -> next call written",
                   "SELECT n.created_at - p.updated_at FROM task_steps a JOIN task_steps b ON "
                   "b.task_id=a.task_id AND b.idx=a.idx+1 JOIN calls p ON p.call_id=a.call_id "
                   "JOIN calls n ON n.call_id=b.call_id WHERE p.idem_key LIKE ?1");
    e2e_print_dist(calls_db, "result -> next effect",
                   "SELECT e.created_at - p.updated_at FROM task_steps a JOIN task_steps b ON "
                   "b.task_id=a.task_id AND b.idx=a.idx+1 JOIN calls p ON p.call_id=a.call_id "
                   "JOIN c.effects e ON e.call_id=b.call_id WHERE p.idem_key LIKE ?1");
    e2e_print_dist(calls_db, "whole task",
                   "SELECT max(c.updated_at) - min(c.created_at) FROM task_steps s JOIN calls c "
                   "ON c.call_id=s.call_id WHERE c.idem_key LIKE ?1 GROUP BY s.task_id");
    e2e_print_dist(calls_db, "independent call",
                   "SELECT updated_at - created_at FROM calls WHERE idem_key LIKE ?2");
    double per_step = e2e_us_raw(&tph), per_call = e2e_us_raw(&iph);
    printf("CPU of the pipeline processes: %.0f us per task step, %.0f us per independent call "
           "(%.2fx)\n",
           per_step, per_call, per_call > 0 ? per_step / per_call : 0);
    printf("\nidle: the pipeline at rest costs %.0f ms CPU per second (over %.1f s)\n",
           idle_cps * 1e3, idle_s);
    printf("  %-44s %8s %8s %10s %10s\n", "phase", "wall s", "per s", "us raw", "us net");
    const struct {
        const char *what;
        const e2e_phase_t *ph;
    } rows[] = {
        {"tasks, back to back (per step)", &tph},
        {"independent calls, closed loop", &iph},
        {"independent calls, at the tasks' steps/s", &irph},
        {"tasks, open loop (per step)", &toph},
        {"independent calls, at that run's steps/s", &ioph},
    };
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        printf("  %-44s %8.2f %8.1f %10.0f %10.0f\n", rows[k].what, rows[k].ph->wall_s,
               rows[k].ph->wall_s > 0 ? (double)rows[k].ph->n / rows[k].ph->wall_s : 0,
               e2e_us_raw(rows[k].ph), e2e_us_net(rows[k].ph, idle_cps));
    /* where a step's CPU goes against a call's at the same rate, process by process */
    printf("  CPU us per step/call by process (raw): %-10s %10s %10s %10s %10s\n", "process",
           "tasks", "calls", "tasks open", "calls open");
    for (int k = 0; k < toph.k1.n && k < E2E_CPU_KINDS; k++) {
        const char *nm = toph.k1.k[k].name;
        printf("  %39s %-10s %10.0f %10.0f %10.0f %10.0f\n", "", nm, e2e_us_kind(&tph, nm),
               e2e_us_kind(&irph, nm), e2e_us_kind(&toph, nm), e2e_us_kind(&ioph, nm));
    }
    double ratio_rate = e2e_us_raw(&irph) > 0 ? e2e_us_raw(&tph) / e2e_us_raw(&irph) : 0,
           ratio_net = e2e_us_net(&irph, idle_cps) > 0
                           ? e2e_us_net(&tph, idle_cps) / e2e_us_net(&irph, idle_cps)
                           : 0,
           ratio_half = e2e_us_net(&ioph, idle_cps) > 0
                            ? e2e_us_net(&toph, idle_cps) / e2e_us_net(&ioph, idle_cps)
                            : 0;
    printf("cost of a task step against an independent call at the same rate: %.2fx raw, %.2fx "
           "net of idle; at %.1f tasks/s: %.2fx net of idle\n",
           ratio_rate, ratio_net, task_rate, ratio_half);
    double g50 = 0, g99 = 0;
    printf("open-loop tasks: %lld of %lld succeeded at %.1f tasks/s offered\n", (long long)ook,
           (long long)ntasks, task_rate);
    e2e_gap(calls_db, e2e_key("otask"), &g50, &g99);
    printf("result bench=e2e-tasks tasks=%lld tasks_per_s=%.1f cpu_us_per_step=%.0f "
           "cpu_us_per_call=%.0f cost_ratio=%.2f idle_cpu_ms_per_s=%.0f cost_ratio_same_rate=%.2f "
           "cost_ratio_net=%.2f task_rate=%.1f cost_ratio_half_net=%.2f gap_half_p50_ms=%.1f "
           "gap_half_p99_ms=%.1f\n",
           (long long)ntasks, tw > 0 ? ntasks / tw : 0, per_step, per_call,
           per_call > 0 ? per_step / per_call : 0, idle_cps * 1e3, ratio_rate, ratio_net, task_rate,
           ratio_half, g50, g99);
    if (ook != ntasks) ok = -1;
    rc = ok == ntasks ? OQ_EXIT_OK : OQ_EXIT_FAIL;
out:
    e2e_stop_up(up);
    e2e_stop_up(ds);
    return rc;
}

int oq__bench_e2e(int argc, char **argv)
{
    const char *usage = "onceq-bench e2e [--calls N] [--rate R] [--conns C] [--consumers N] "
                        "[--mix c,e,s,fr,ff] [--dir DIR] [--keep] [--onceq PATH] [--http-tools] "
                        "[--tasks N [--task-rate R] [--idle D]]";
    oq_config_t *cfg = oq_config_new(e2e_settings, sizeof e2e_settings / sizeof e2e_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    int rc = oq_cli_parse(cfg, "onceq-bench", usage, argc, argv);
    if (rc >= 0) {
        oq_config_destroy(cfg);
        return rc;
    }
    rc = OQ_EXIT_FAIL;
    e2e_db_url = oq_config_str(cfg, "db-url");
    snprintf(e2e_run_tag, sizeof e2e_run_tag, "%llx", (unsigned long long)oq_now_ms());
    if (e2e_find_onceq(oq_config_str(cfg, "onceq")) != 0) {
        oq_config_destroy(cfg);
        return OQ_EXIT_USAGE;
    }
    char dir[PATH_MAX];
    int made_dir = 0;
    oq_load_opts_t lo;
    memset(&lo, 0, sizeof lo);
    if (sscanf(oq_config_str(cfg, "mix"), "%d,%d,%d,%d,%d", &lo.mix[0], &lo.mix[1], &lo.mix[2],
               &lo.mix[3], &lo.mix[4]) != 5) {
        fprintf(stderr, "onceq-bench e2e: --mix needs five comma-separated weights\n");
        oq_config_destroy(cfg);
        return OQ_EXIT_USAGE;
    }
    if (oq_config_str(cfg, "dir")) {
        snprintf(dir, sizeof dir, "%s", oq_config_str(cfg, "dir"));
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "onceq-bench e2e: mkdir %s: %s\n", dir, strerror(errno));
            goto out;
        }
    } else {
        snprintf(dir, sizeof dir, "/tmp/onceq-bench-e2e.XXXXXX");
        if (!mkdtemp(dir)) {
            fprintf(stderr, "onceq-bench e2e: mkdtemp: %s\n", strerror(errno));
            goto out;
        }
        made_dir = 1;
    }
    if (oq_config_int(cfg, "tasks") > 0) {
        if (e2e_db_url) {
            fprintf(stderr,
                    "onceq-bench e2e: --tasks runs on SQLite only (not yet with --db-url)\n");
            rc = OQ_EXIT_USAGE;
        } else {
            rc = e2e_tasks(cfg, dir, oq_config_int(cfg, "tasks"));
        }
        goto out;
    }
    lo.conns = (int)oq_config_int(cfg, "conns");
    lo.calls = oq_config_int(cfg, "calls");
    lo.rate = (double)oq_config_int(cfg, "rate");
    oq_load_result_t base;
    memset(&base, 0, sizeof base);
    int have_base = 0;
    if (oq_config_int(cfg, "baseline")) {
        if (e2e_baseline(dir, &lo, &base) == 0) {
            have_base = 1;
            printf("baseline: producer alone (no relay/consumers/results), same load: %lld "
                   "accepted in %.2f s = %.0f submits/s, p50 %.2f ms p99 %.2f ms\n",
                   (long long)base.accepted, base.elapsed_s,
                   base.elapsed_s > 0 ? base.accepted / base.elapsed_s : 0, base.p50_ms,
                   base.p99_ms);
            fflush(stdout);
        } else {
            printf("baseline: failed (see %s/base.log)\n", dir);
        }
    }
    e2e_figures_t inproc, http;
    memset(&inproc, 0, sizeof inproc);
    memset(&http, 0, sizeof http);
    int with_http = (int)oq_config_int(cfg, "http-tools");
    if (with_http && e2e_db_url) { /* the second run would meet the first one's keys */
        fprintf(stderr, "onceq-bench e2e: --http-tools runs on SQLite only (not with --db-url)\n");
        rc = OQ_EXIT_USAGE;
        goto out;
    }
    if (with_http) { /* the same calls, once to a compiled tool, once to an HTTP one */
        memset(lo.mix, 0, sizeof lo.mix);
        lo.mix[OQ_LOAD_CHARGE] = 1;
    }
    printf("\n== %s ==\n", with_http ? "in-process tool (charge, compiled in)" : "pipeline");
    rc = e2e_pipeline(cfg, dir, &lo, NULL, NULL, -1, have_base ? &base : NULL, &inproc);
    if (rc == OQ_EXIT_OK)
        printf("result bench=e2e backend=%s calls_per_s=%.0f p50_ms=%.1f p99_ms=%.1f cpu_us=%.0f "
               "write_bytes=%.0f pg_cpu_us=%.0f pg_write_bytes=%.0f disk_bytes=%.0f\n",
               e2e_db_url ? "pg" : "sqlite", inproc.calls_per_s, inproc.p50_ms, inproc.p99_ms,
               inproc.cpu_us, inproc.write_bytes, inproc.pg_cpu_us, inproc.pg_write_bytes,
               inproc.disk_bytes);
    if (rc == OQ_EXIT_OK && with_http) {
        char hdir[PATH_MAX];
        snprintf(hdir, sizeof hdir, "%s/http", dir);
        if (mkdir(hdir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "onceq-bench e2e: mkdir %s: %s\n", hdir, strerror(errno));
            rc = OQ_EXIT_FAIL;
            goto out;
        }
        printf("\n== HTTP tool (pay: onceq-downstream, keys honoured + lookup, durable ledger) "
               "==\n");
        lo.charge_tool = "pay";
        rc = e2e_http(cfg, hdir, &lo, &http);
        if (rc == OQ_EXIT_OK)
            printf("\nsame run: in-process charge %.0f calls/s, p50 %.0f ms, p99 %.0f ms | HTTP "
                   "pay via onceq-downstream %.0f calls/s, p50 %.0f ms, p99 %.0f ms (%.2fx the "
                   "calls/s), downstream DSR %.6f\n",
                   inproc.calls_per_s, inproc.p50_ms, inproc.p99_ms, http.calls_per_s, http.p50_ms,
                   http.p99_ms, inproc.calls_per_s > 0 ? http.calls_per_s / inproc.calls_per_s : 0,
                   http.ds_dsr);
    }
out:
    if (made_dir && !oq_config_int(cfg, "keep"))
        e2e_rmdir(dir);
    else
        printf("kept %s\n", dir);
    oq_config_destroy(cfg);
    return rc;
}
