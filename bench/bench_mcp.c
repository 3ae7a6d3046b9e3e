/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq-bench mcp`: tools/call round trips per second through POST /mcp, against the HTTP
 * API's submit + wait (POST /v1/tool-calls, then GET /v1/tool-calls/{id}?wait=30s until the
 * call is terminal) in the same run, on the same pipeline, for the compiled "charge" and an
 * HTTP tool ("pay" against `onceq-downstream`, durable ledger).
 *
 * It starts `onceq up --tools` (embedded broker, producer, relay, consumers) and `onceq
 * downstream` in a scratch directory, warms the pipeline up, then runs closed loops: --conns
 * client threads, each with one keep-alive libcurl connection (and, for /mcp, its own
 * session), each call a new key, timed from the request to the terminal answer. Both paths
 * wait for the same thing (the call's result back at the producer), so the ratio of their
 * rates is the gateway's cost, and the difference of their percentiles its added latency.
 * Paths alternate per tool (HTTP, /mcp, HTTP, /mcp) so that drift on a shared machine hits
 * both; the figures printed are per round and the mean of the two rounds. Then both paths
 * run once more paced at half of the lower closed-loop rate (call i due at i / rate, latency
 * from its send), where the difference of the percentiles is the gateway's own latency
 * rather than queueing. That run interleaves the two paths call by call (even calls HTTP, odd
 * calls /mcp, from the same threads and connections): run one after the other, the two
 * paths saw different moments of a shared machine, and the difference of their p99s (the
 * pipeline's tail, tens of ms) swung by +-10 to +-40 ms from run to run whatever the gateway
 * did. Even interleaved, that tail dominates a p99; so the same calls are also given less the
 * time their answers say (Server-Timing "wait;dur=") they waited for the call to settle: the
 * pipeline's share, on the same waiters for both paths. What is left is the front door's own
 * latency: parse, checks, the durable submit, the wake-up and the answer (and, on the HTTP
 * path, the client's second request, during which the pipeline already runs). Each p99
 * difference comes with its 95 % confidence interval (bootstrap): an interval that holds 0
 * means the two paths are not told apart at that sample size on that machine.
 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "bench.h"
#include "oq_buf.h"
#include "oq_config.h"
#include "oq_util.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static const oq_setting_t mcp_settings[] = {
    {"calls", OQ_SET_INT, "3000", 1, 10000000, NULL, "calls per path, tool and round"},
    {"conns", OQ_SET_INT, "16", 1, 256, NULL, "client threads (one keep-alive connection each)"},
    {"consumers", OQ_SET_INT, "2", 1, 16, NULL,
     "consumer processes (a consumer group of two, as with onceq up --db-url)"},
    {"dir", OQ_SET_STRING, NULL, 1, 1024, NULL,
     "scratch directory (default: a new /tmp/onceq-bench-mcp.XXXXXX, removed afterwards)"},
    {"keep", OQ_SET_BOOL, "false", 0, -1, NULL, "keep the scratch directory"},
    {"onceq", OQ_SET_STRING, NULL, 1, 1024, NULL,
     "the onceq binary to run (default: the onceq next to this program)"},
};

static char exe[PATH_MAX];

static int free_port(void)
{
    return oq__bench_free_port(); /* below the ephemeral range: bench.h */
}

/* Start \p prog (onceq, or a program beside it) with \p args, output to \p log. */
static pid_t spawn_exe(const char *prog, char *const args[], const char *log)
{
    char *argv[32];
    int k = 0;
    argv[k++] = (char *)prog;
    for (int i = 0; args[i] && k < 31; i++)
        argv[k++] = args[i];
    argv[k] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        FILE *f = freopen(log, "a", stdout);
        if (f) dup2(fileno(stdout), 2);
        execv(prog, argv);
        _exit(127);
    }
    return pid;
}

static pid_t spawn(char *const args[], const char *log)
{
    return spawn_exe(exe, args, log);
}

static void stop(pid_t pid)
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

/* --- one client connection -------------------------------------------------------------------*/

typedef struct conn {
    CURL *h;
    oq_buf_t buf;
    char sid[64];
    double wait_ms; /* the last answer's Server-Timing wait (the pipeline's time), -1: none */
} conn_t;

static size_t on_write(char *p, size_t sz, size_t n, void *ud)
{
    conn_t *c = ud;
    size_t k = sz * n;
    return oq_buf_put(&c->buf, p, k) ? 0 : k;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud)
{
    conn_t *c = ud;
    size_t k = sz * n;
    if (k > 16 && strncasecmp(p, "mcp-session-id:", 15) == 0) {
        const char *v = p + 15;
        while (*v == ' ')
            v++;
        size_t l = strcspn(v, "\r\n");
        if (l < sizeof c->sid) {
            memcpy(c->sid, v, l);
            c->sid[l] = '\0';
        }
    } else if (k > 14 && strncasecmp(p, "server-timing:", 14) == 0) {
        char v[128];
        snprintf(v, sizeof v, "%.*s", (int)(k - 14), p + 14);
        const char *d = strstr(v, "wait;dur=");
        if (d) c->wait_ms = strtod(d + 9, NULL);
    }
    return k;
}

/* One request (\p mcp: with the session's headers); the answer's JSON (new reference) or NULL. */
static json_t *req(conn_t *c, int mcp, const char *url, const char *body, const char *key)
{
    struct curl_slist *h = NULL;
    char line[320];
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: application/json, text/event-stream");
    h = curl_slist_append(h, "Expect:");
    if (mcp && c->sid[0]) {
        snprintf(line, sizeof line, "Mcp-Session-Id: %s", c->sid);
        h = curl_slist_append(h, line);
        h = curl_slist_append(h, "MCP-Protocol-Version: 2025-06-18");
    }
    if (key) {
        snprintf(line, sizeof line, "Idempotency-Key: %s", key);
        h = curl_slist_append(h, line);
    }
    c->buf.len = 0;
    c->buf.err = 0;
    c->wait_ms = -1;
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, h);
    if (body) {
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, body);
    } else {
        curl_easy_setopt(c->h, CURLOPT_HTTPGET, 1L);
    }
    CURLcode cc = curl_easy_perform(c->h);
    curl_slist_free_all(h);
    if (cc != CURLE_OK || c->buf.err || !c->buf.p) return NULL;
    return json_loadb(c->buf.p, c->buf.len, 0, NULL);
}

/* --- a closed loop ---------------------------------------------------------------------------*/

typedef struct run {
    int port, mcp, calls, conns; /* mcp: 0 HTTP, 1 /mcp, 2 both, call by call (odd: /mcp) */
    const char *tool, *tag;
    double rate;   /* offered calls/s (0: closed loop) */
    int64_t t0_us; /* start of the run: call i is due at t0 + i / rate */
    int next;      /* next call index (under mu) */
    pthread_mutex_t mu;
    double *lat_ms;  /* per call */
    double *wait_ms; /* per call: the part its answers' Server-Timing says it waited */
    int timed;       /* some answer carried Server-Timing (under mu) */
    int ok, bad;
} run_t;

/* The path of call \p i. */
static int via_mcp(const run_t *r, int i)
{
    return r->mcp == 2 ? i & 1 : r->mcp;
}

static int terminal(const char *s)
{
    return s && (!strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "needs_review"));
}

static void *worker(void *arg)
{
    run_t *r = arg;
    conn_t c;
    memset(&c, 0, sizeof c);
    c.h = curl_easy_init();
    curl_easy_setopt(c.h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c.h, CURLOPT_WRITEDATA, &c);
    curl_easy_setopt(c.h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c.h, CURLOPT_HEADERDATA, &c);
    curl_easy_setopt(c.h, CURLOPT_TIMEOUT_MS, 90000L);
    curl_easy_setopt(c.h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c.h, CURLOPT_TCP_NODELAY, 1L);
    char mcp_url[96], calls_url[96], url[192], body[512];
    snprintf(mcp_url, sizeof mcp_url, "http://127.0.0.1:%d/mcp", r->port);
    snprintf(calls_url, sizeof calls_url, "http://127.0.0.1:%d/v1/tool-calls", r->port);
    if (r->mcp) {
        json_decref(req(&c, 1, mcp_url,
                        "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{"
                        "\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{"
                        "\"name\":\"onceq-bench\",\"version\":\"1\"}}}",
                        NULL));
        json_decref(req(&c, 1, mcp_url,
                        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", NULL));
    }
    for (;;) {
        pthread_mutex_lock(&r->mu);
        int i = r->next < r->calls ? r->next++ : -1;
        pthread_mutex_unlock(&r->mu);
        if (i < 0) break;
        char key[128];
        snprintf(key, sizeof key, "%s-%d", r->tag, i);
        if (r->rate > 0) { /* paced: wait for the call's turn (latency counts from the send) */
            int64_t due = r->t0_us + (int64_t)((double)i * 1e6 / r->rate), now = oq_mono_us();
            if (due > now) oq_sleep_ms((due - now + 999) / 1000, NULL);
        }
        int64_t t0 = oq_mono_us();
        int ok = 0, timed = 0;
        double waited = 0;
        if (via_mcp(r, i)) {
            snprintf(body, sizeof body,
                     "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"tools/call\",\"params\":{"
                     "\"name\":\"%s\",\"arguments\":{\"amount\":%d},\"idempotencyKey\":\"%s\"}}",
                     i + 1, r->tool, 100 + i % 1000, key);
            json_t *a = req(&c, 1, mcp_url, body, NULL);
            if (c.wait_ms >= 0) waited += c.wait_ms, timed = 1;
            ok = json_is_false(json_object_get(json_object_get(a, "result"), "isError"));
            json_decref(a);
        } else {
            snprintf(body, sizeof body, "{\"tool\":\"%s\",\"args\":{\"amount\":%d}}", r->tool,
                     100 + i % 1000);
            json_t *a = req(&c, 0, calls_url, body, key);
            for (int k = 0; a && k < 10; k++) {
                const char *st = json_string_value(json_object_get(a, "status"));
                if (terminal(st)) {
                    ok = !strcmp(st, "succeeded");
                    break;
                }
                snprintf(url, sizeof url, "%s/%s?wait=30s", calls_url,
                         json_string_value(json_object_get(a, "call_id")));
                json_decref(a);
                a = req(&c, 0, url, NULL, NULL);
                if (c.wait_ms >= 0) waited += c.wait_ms, timed = 1;
            }
            json_decref(a);
        }
        r->lat_ms[i] = (double)(oq_mono_us() - t0) / 1000.0;
        r->wait_ms[i] = waited;
        pthread_mutex_lock(&r->mu);
        r->timed |= timed;
        ok ? r->ok++ : r->bad++;
        pthread_mutex_unlock(&r->mu);
    }
    curl_easy_cleanup(c.h);
    oq_buf_free(&c.buf);
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct fig {
    double cps, p50, p99;
    double own_p50, own_p99; /* latency less the Server-Timing wait; own_p50 < 0: no header */
    /* interleaved runs, in the /mcp figures: 95 % bootstrap interval of the p99 difference
     * (/mcp - HTTP), end to end and less the wait */
    double d99_lo, d99_hi, own_d99_lo, own_d99_hi;
    int ok, bad;
} fig_t;

/* Percentiles of \p n latencies (sorted here). */
static void percentiles(double *v, int n, fig_t *f)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    f->p50 = n ? v[(n - 1) / 2] : 0;
    f->p99 = n ? v[(int)((n - 1) * 0.99)] : 0;
}

/* The 95 % confidence interval [\p lo, \p hi] of p99(\p b) - p99(\p a), by bootstrap (both
 * samples resampled with replacement): a p99 difference whose interval holds 0 is not told
 * apart from the noise of a p99 estimated from this many calls. */
static void p99_diff_interval(const double *a, int na, const double *b, int nb, double *lo,
                              double *hi)
{
    enum { ROUNDS = 400 };
    double *d = calloc(ROUNDS, sizeof *d);
    double *x = calloc((size_t)(na > nb ? na : nb), sizeof *x);
    *lo = *hi = 0;
    if (!d || !x || na < 1 || nb < 1) goto out;
    uint64_t rng = 0x9e3779b97f4a7c15ULL; /* fixed: the same run prints the same interval */
    for (int k = 0; k < ROUNDS; k++) {
        double p[2];
        for (int side = 0; side < 2; side++) {
            const double *v = side ? b : a;
            int n = side ? nb : na;
            for (int i = 0; i < n; i++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                x[i] = v[rng % (uint64_t)n];
            }
            qsort(x, (size_t)n, sizeof *x, cmp);
            p[side] = x[(int)((n - 1) * 0.99)];
        }
        d[k] = p[1] - p[0];
    }
    qsort(d, ROUNDS, sizeof *d, cmp);
    *lo = d[ROUNDS / 40];
    *hi = d[ROUNDS - 1 - ROUNDS / 40];
out:
    free(d);
    free(x);
}

/* \p calls calls through path \p mcp (0 HTTP, 1 /mcp, 2 both, call by call); the figures of
 * each path that ran in \p f[0] (HTTP) and \p f[1] (/mcp). */
static void loop(int port, int mcp, const char *tool, const char *tag, int calls, int conns,
                 double rate, fig_t f[2])
{
    run_t r;
    memset(&r, 0, sizeof r);
    r.port = port;
    r.mcp = mcp;
    r.tool = tool;
    r.tag = tag;
    r.calls = calls;
    r.conns = conns;
    r.rate = rate;
    pthread_mutex_init(&r.mu, NULL);
    r.lat_ms = calloc((size_t)calls, sizeof *r.lat_ms);
    r.wait_ms = calloc((size_t)calls, sizeof *r.wait_ms);
    double *own[2] = {calloc((size_t)calls, sizeof(double)), calloc((size_t)calls, sizeof(double))};
    double *lat[2] = {calloc((size_t)calls, sizeof(double)), calloc((size_t)calls, sizeof(double))};
    pthread_t *th = calloc((size_t)conns, sizeof *th);
    int64_t t0 = r.t0_us = oq_mono_us();
    for (int i = 0; i < conns; i++)
        pthread_create(&th[i], NULL, worker, &r);
    for (int i = 0; i < conns; i++)
        pthread_join(th[i], NULL);
    double s = (double)(oq_mono_us() - t0) / 1e6;
    int n[2] = {0, 0};
    memset(f, 0, 2 * sizeof *f);
    for (int i = 0; i < calls; i++) {
        int k = via_mcp(&r, i);
        own[k][n[k]] = r.lat_ms[i] - r.wait_ms[i];
        lat[k][n[k]++] = r.lat_ms[i];
    }
    if (mcp == 2 && n[0] && n[1]) { /* before percentiles() sorts them: order does not matter */
        p99_diff_interval(lat[0], n[0], lat[1], n[1], &f[1].d99_lo, &f[1].d99_hi);
        p99_diff_interval(own[0], n[0], own[1], n[1], &f[1].own_d99_lo, &f[1].own_d99_hi);
    }
    char offered[48] = "";
    if (rate > 0)
        snprintf(offered, sizeof offered, " (offered %.0f/s)", mcp == 2 ? rate / 2 : rate);
    for (int k = 0; k < 2; k++) {
        if (!n[k]) continue;
        f[k].cps = s > 0 ? n[k] / s : 0;
        percentiles(lat[k], n[k], &f[k]);
        fig_t o;
        percentiles(own[k], n[k], &o);
        f[k].own_p50 = r.timed ? o.p50 : -1;
        f[k].own_p99 = r.timed ? o.p99 : -1;
        printf("  %-4s %-6s %6d calls in %6.2f s = %7.0f calls/s%s, p50 %6.2f ms, p99 %7.2f ms%s\n",
               k ? "/mcp" : "HTTP", tool, n[k], s, f[k].cps, offered, f[k].p50, f[k].p99,
               r.bad ? " (some not succeeded!)" : "");
    }
    f[0].ok = f[1].ok = r.ok;
    f[0].bad = f[1].bad = r.bad;
    fflush(stdout);
    free(th);
    free(r.lat_ms);
    free(r.wait_ms);
    free(own[0]);
    free(own[1]);
    free(lat[0]);
    free(lat[1]);
    pthread_mutex_destroy(&r.mu);
}

static int healthy(int port, int tenths)
{
    conn_t c;
    memset(&c, 0, sizeof c);
    c.h = curl_easy_init();
    curl_easy_setopt(c.h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c.h, CURLOPT_WRITEDATA, &c);
    curl_easy_setopt(c.h, CURLOPT_TIMEOUT_MS, 1000L);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/healthz", port);
    curl_easy_setopt(c.h, CURLOPT_URL, url);
    int ok = 0;
    for (int i = 0; i < tenths && !ok; i++) {
        long st = 0;
        ok = curl_easy_perform(c.h) == CURLE_OK &&
             curl_easy_getinfo(c.h, CURLINFO_RESPONSE_CODE, &st) == CURLE_OK && st == 200;
        if (!ok) oq_sleep_ms(100, NULL);
    }
    curl_easy_cleanup(c.h);
    oq_buf_free(&c.buf);
    return ok;
}

int oq__bench_mcp(int argc, char **argv)
{
    const char *usage = "onceq-bench mcp [--calls N] [--conns C] [--consumers N] [--dir DIR] "
                        "[--keep] [--onceq PATH]";
    oq_config_t *cfg = oq_config_new(mcp_settings, sizeof mcp_settings / sizeof mcp_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    int rc = oq_cli_parse(cfg, "onceq-bench", usage, argc, argv);
    if (rc >= 0) {
        oq_config_destroy(cfg);
        return rc;
    }
    rc = OQ_EXIT_FAIL;
    if (oq_config_str(cfg, "onceq")) {
        snprintf(exe, sizeof exe, "%s", oq_config_str(cfg, "onceq"));
    } else {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) *slash = '\0';
        snprintf(exe, sizeof exe, "%s/onceq", slash ? self : ".");
    }
    if (access(exe, X_OK) != 0) {
        fprintf(stderr, "onceq-bench mcp: no onceq binary at %s (build it, or --onceq)\n", exe);
        oq_config_destroy(cfg);
        return OQ_EXIT_USAGE;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char dir[PATH_MAX], tools[PATH_MAX], ledger[PATH_MAX], log[PATH_MAX], dlisten[64], listen[64],
        cons[16];
    int made = 0;
    pid_t ds = -1, up = -1;
    if (oq_config_str(cfg, "dir")) {
        snprintf(dir, sizeof dir, "%s", oq_config_str(cfg, "dir"));
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) goto out;
    } else {
        snprintf(dir, sizeof dir, "/tmp/onceq-bench-mcp.XXXXXX");
        if (!mkdtemp(dir)) goto out;
        made = 1;
    }
    int calls = (int)oq_config_int(cfg, "calls"), conns = (int)oq_config_int(cfg, "conns");
    int dport = free_port(), port = free_port();
    snprintf(dlisten, sizeof dlisten, "127.0.0.1:%d", dport);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(cons, sizeof cons, "%d", (int)oq_config_int(cfg, "consumers"));
    snprintf(tools, sizeof tools, "%s/tools.json", dir);
    snprintf(ledger, sizeof ledger, "%s/downstream.db", dir);
    FILE *f = fopen(tools, "w");
    if (!f) goto out;
    fprintf(f,
            "{\"version\": 1, \"tools\": [{\"name\": \"pay\", \"url\": "
            "\"http://%s/v1/payments\", \"body\": {\"amount\": \"{amount}\", \"reference\": "
            "\"{effect_id}\"}, \"idempotent\": true, \"lookup\": {\"url\": "
            "\"http://%s/v1/payments?idempotency_key={effect_id}\"}}]}\n",
            dlisten, dlisten);
    fclose(f);
    snprintf(log, sizeof log, "%s/downstream.log", dir);
    /* the test service is its own program, next to onceq */
    char dexe[PATH_MAX + 32];
    const char *slash = strrchr(exe, '/');
    snprintf(dexe, sizeof dexe, "%.*sonceq-downstream", slash ? (int)(slash - exe + 1) : 0, exe);
    char *const dargs[] = {"--listen", dlisten, "--db", ledger, NULL};
    ds = spawn_exe(dexe, dargs, log);
    snprintf(log, sizeof log, "%s/up.log", dir);
    char d[PATH_MAX];
    snprintf(d, sizeof d, "%s/up", dir);
    char *const uargs[] = {"up",
                           "--dir",
                           d,
                           "--consumers",
                           cons,
                           "--listen",
                           listen,
                           "--tools",
                           tools,
                           "-X",
                           "session.timeout.ms=6000",
                           "--console", /* none: its fixed default port would collide */
                           "",
                           NULL};
    up = spawn(uargs, log);
    if (ds <= 0 || up <= 0 || !healthy(dport, 150) || !healthy(port, 600)) {
        fprintf(stderr, "onceq-bench mcp: the pipeline did not start (see %s)\n", dir);
        goto out;
    }
    char load[64] = "?";
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (!fgets(load, sizeof load, lf)) snprintf(load, sizeof load, "?");
        load[strcspn(load, "\n")] = '\0';
        fclose(lf);
    }
    printf("onceq up (%s consumers) on %s with `onceq-downstream` on %s; %d client threads, "
           "closed loop, %d calls per path, tool and round; %ld cores, load %s\n",
           cons, listen, dlisten, conns, calls, sysconf(_SC_NPROCESSORS_ONLN), load);
    fig_t w[2];
    loop(port, 0, "charge", "warm-h", 200 < calls ? 200 : calls, conns, 0, w); /* group, caches */
    loop(port, 1, "pay", "warm-m", 200 < calls ? 200 : calls, conns, 0, w);
    const char *tl[2] = {"charge", "pay"};
    for (int t = 0; t < 2; t++) {
        printf("\n== %s (%s) ==\n", tl[t],
               t ? "HTTP tool, onceq-downstream, durable ledger" : "compiled in");
        fig_t h[2], m[2], fg[2];
        for (int round = 0; round < 2; round++) {
            char tag[64];
            snprintf(tag, sizeof tag, "h-%s-%d", tl[t], round);
            loop(port, 0, tl[t], tag, calls, conns, 0, fg);
            h[round] = fg[0];
            snprintf(tag, sizeof tag, "m-%s-%d", tl[t], round);
            loop(port, 1, tl[t], tag, calls, conns, 0, fg);
            m[round] = fg[1];
        }
        double hc = (h[0].cps + h[1].cps) / 2, mc = (m[0].cps + m[1].cps) / 2;
        double d50 = (m[0].p50 + m[1].p50 - h[0].p50 - h[1].p50) / 2;
        double d99 = (m[0].p99 + m[1].p99 - h[0].p99 - h[1].p99) / 2;
        printf("%s: /mcp %.0f calls/s vs HTTP submit + wait %.0f calls/s: ratio %.2f; the "
               "gateway's added latency p50 %+.2f ms, p99 %+.2f ms\n",
               tl[t], mc, hc, hc > 0 ? mc / hc : 0, d50, d99);
        /* At half of the lower closed-loop rate, paced, the two paths interleaved call by call
         * in one run (even calls HTTP, odd calls /mcp, on the same connections): both see the
         * same pipeline at the same moments, so drift between two runs on a shared machine
         * does not enter the difference; latency without queueing. */
        double half = (mc < hc ? mc : hc) / 2;
        char tag[64];
        snprintf(tag, sizeof tag, "x-%s", tl[t]);
        loop(port, 2, tl[t], tag, 2 * calls, conns, half, fg);
        printf("%s at half of capacity (%.0f calls/s offered): interleaved, /mcp p50 "
               "%.2f ms p99 %.2f ms vs HTTP p50 %.2f ms p99 %.2f ms: the gateway's added latency "
               "p50 %+.2f ms, p99 %+.2f ms (95 %% confidence interval of the p99 difference: "
               "%+.2f .. %+.2f ms)\n",
               tl[t], half, fg[1].p50, fg[1].p99, fg[0].p50, fg[0].p99, fg[1].p50 - fg[0].p50,
               fg[1].p99 - fg[0].p99, fg[1].d99_lo, fg[1].d99_hi);
        /* The same calls less the time their answers waited for the call to settle (the
         * producer's Server-Timing: the pipeline's time, the same waiters on both paths): what
         * the front door itself took, without the pipeline's tail of tens of ms. */
        if (fg[1].own_p50 < 0)
            printf("%s at half of capacity, less the wait for the call to settle: this producer "
                   "sends no Server-Timing\n",
                   tl[t]);
        else
            printf("%s at half of capacity, less the wait for the call to settle (Server-Timing): "
                   "/mcp p50 %.2f ms p99 %.2f ms vs HTTP p50 %.2f ms p99 %.2f ms: the gateway's "
                   "added latency p50 %+.2f ms, p99 %+.2f ms (95 %% confidence interval of the p99 "
                   "difference: %+.2f .. %+.2f ms)\n",
                   tl[t], fg[1].own_p50, fg[1].own_p99, fg[0].own_p50, fg[0].own_p99,
                   fg[1].own_p50 - fg[0].own_p50, fg[1].own_p99 - fg[0].own_p99, fg[1].own_d99_lo,
                   fg[1].own_d99_hi);
    }
    rc = OQ_EXIT_OK;
out:
    stop(up);
    stop(ds);
    if (made && !oq_config_int(cfg, "keep")) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "onceq-bench mcp: cannot remove %s\n", dir);
    } else {
        printf("scratch directory kept: %s\n", dir);
    }
    oq_config_destroy(cfg);
    return rc;
}
