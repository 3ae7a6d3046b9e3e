/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_http_stub: a scripted HTTP(S) server for the client tests (`onceq call`). It answers the
 * requests it gets, in arrival order, with the steps of --script, and logs each request, so a
 * test can check what a client sent, how often and when, against answers a real producer
 * cannot be made to give on demand (503 with a Retry-After in seconds or as an HTTP-date).
 *
 *   oq_http_stub --script STEPS --log FILE [--ipv6] [--tls-cert PEM --tls-key PEM]
 *
 * STEPS is a comma-separated list of STATUS[:ra=N|:ra=date+N][:st=STATE]: the status, and
 * optionally a Retry-After of N seconds or of the HTTP-date N seconds from now; the last step
 * repeats. Bodies are fixed by the status: 200 `{"call_id":"c_stub","status":"succeeded",...}`,
 * 202 the same with "pending" (`:st=STATE` puts another call status there, e.g. failed or
 * needs_review), anything else an error object. It binds 127.0.0.1 (::1 with --ipv6) on a
 * free port, prints `port=N` on stdout once it listens, serves until SIGTERM, and writes to
 * the log one line per request: `<unix ms> <method> <url> <Idempotency-Key|-> <Authorization|->`
 * (the Authorization value with its spaces as '_').
 */
#include <arpa/inet.h>
#include <getopt.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "oq_util.h"

#define MAX_STEPS 32

typedef struct {
    int status;
    int ra;      /* Retry-After seconds; -1 none */
    int ra_date; /* send it as an HTTP-date */
    char st[32]; /* the call status in a 200/202 body; "" for the default */
} step_t;

static step_t steps[MAX_STEPS];
static int nsteps, next_step;
static FILE *reqlog;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static volatile sig_atomic_t stop;

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

static int parse_script(const char *s)
{
    char *copy = strdup(s), *save = NULL;
    if (!copy) return -1;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (nsteps == MAX_STEPS) break;
        step_t *st = &steps[nsteps++];
        st->status = atoi(tok);
        st->ra = -1;
        const char *ra = strstr(tok, ":ra=");
        if (ra) {
            ra += 4;
            st->ra_date = strncmp(ra, "date+", 5) == 0;
            st->ra = atoi(st->ra_date ? ra + 5 : ra);
        }
        const char *cs = strstr(tok, ":st=");
        if (cs) {
            snprintf(st->st, sizeof st->st, "%s", cs + 4);
            char *colon = strchr(st->st, ':');
            if (colon) *colon = '\0';
        }
        if (st->status < 100 || st->status > 599) nsteps = 0;
    }
    free(copy);
    return nsteps > 0 ? 0 : -1;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **ctx)
{
    static int started;
    (void)cls;
    (void)version;
    (void)upload;
    if (*ctx == NULL) { /* headers only: wait for the body */
        *ctx = &started;
        return MHD_YES;
    }
    if (*upload_size) { /* the body: ignored */
        *upload_size = 0;
        return MHD_YES;
    }
    const char *key = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Idempotency-Key");
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    char authw[600];
    snprintf(authw, sizeof authw, "%s", auth ? auth : "-");
    for (char *c = authw; *c; c++)
        if (*c == ' ') *c = '_';
    pthread_mutex_lock(&mu);
    step_t st = steps[next_step < nsteps ? next_step : nsteps - 1];
    next_step++;
    fprintf(reqlog, "%lld %s %s %s %s\n", (long long)oq_now_ms(), method, url, key ? key : "-",
            authw);
    fflush(reqlog);
    pthread_mutex_unlock(&mu);
    char body[256];
    if (st.status == 200 || st.status == 202)
        snprintf(body, sizeof body,
                 "{\"call_id\":\"c_stub\",\"status\":\"%s\",\"attempt\":1,\"tool\":\"charge\"}",
                 st.st[0]           ? st.st
                 : st.status == 200 ? "succeeded"
                                    : "pending");
    else
        snprintf(body, sizeof body, "{\"error\":{\"code\":\"stub\",\"message\":\"status %d\"}}",
                 st.status);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (st.ra >= 0) {
        char v[64];
        if (st.ra_date) {
            time_t at = time(NULL) + st.ra;
            struct tm tm;
            gmtime_r(&at, &tm);
            strftime(v, sizeof v, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        } else {
            snprintf(v, sizeof v, "%d", st.ra);
        }
        MHD_add_response_header(r, "Retry-After", v);
    }
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)st.status, r);
    MHD_destroy_response(r);
    return ret;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *buf = calloc(1, 65536);
    size_t n = buf ? fread(buf, 1, 65535, f) : 0;
    fclose(f);
    if (buf && n == 0) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

int main(int argc, char **argv)
{
    const char *script = NULL, *log = NULL, *cert = NULL, *key = NULL;
    int ipv6 = 0;
    static const struct option opts[] = {
        {"script", required_argument, NULL, 's'},  {"log", required_argument, NULL, 'l'},
        {"ipv6", no_argument, NULL, '6'},          {"tls-cert", required_argument, NULL, 'c'},
        {"tls-key", required_argument, NULL, 'k'}, {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 's':
            script = optarg;
            break;
        case 'l':
            log = optarg;
            break;
        case '6':
            ipv6 = 1;
            break;
        case 'c':
            cert = optarg;
            break;
        case 'k':
            key = optarg;
            break;
        default:
            return 2;
        }
    }
    if (!script || !log || parse_script(script) != 0 || (!cert != !key)) {
        fprintf(stderr, "usage: oq_http_stub --script 503:ra=1,202 --log FILE [--ipv6] "
                        "[--tls-cert PEM --tls-key PEM]\n");
        return 2;
    }
    if (!(reqlog = fopen(log, "a"))) {
        perror(log);
        return 2;
    }
    char *cert_pem = cert ? slurp(cert) : NULL, *key_pem = key ? slurp(key) : NULL;
    if (cert && (!cert_pem || !key_pem)) {
        fprintf(stderr, "oq_http_stub: cannot read the TLS certificate or key\n");
        return 2;
    }
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_loopback;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ipv6) flags |= MHD_USE_IPv6;
    if (cert) flags |= MHD_USE_TLS;
    struct MHD_Daemon *d;
    if (cert)
        d = MHD_start_daemon(flags, 0, NULL, NULL, handler, NULL, MHD_OPTION_SOCK_ADDR,
                             ipv6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4,
                             MHD_OPTION_HTTPS_MEM_CERT, cert_pem, MHD_OPTION_HTTPS_MEM_KEY, key_pem,
                             MHD_OPTION_END);
    else
        d = MHD_start_daemon(flags, 0, NULL, NULL, handler, NULL, MHD_OPTION_SOCK_ADDR,
                             ipv6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4,
                             MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "oq_http_stub: cannot start the server\n");
        return 1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("port=%u\n", info ? (unsigned)info->port : 0u);
    fflush(stdout);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    while (!stop)
        usleep(50 * 1000);
    MHD_stop_daemon(d);
    fclose(reqlog);
    free(cert_pem);
    free(key_pem);
    return 0;
}
