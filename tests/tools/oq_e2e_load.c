/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_e2e_load: HTTP load generator for the end-to-end tests (a thin CLI over oq_load_run() in
 * bench/load.c). It submits calls "<prefix>-<i>" for i in [first, first+calls) with a
 * deterministic mix of tools, retrying transport errors / 429 / 5xx with the same key and body,
 * and prints one `name=value` per line so shell scripts can read the figures without jq.
 *
 *   oq_e2e_load --port P --calls N [--first F] [--conns C] [--rate R] [--prefix K]
 *               [--mix charge,send_email,sleep,fail_retryable,fail_final] [--sleep-ms MS]
 *               [--dup-every N] [--conflict-every N] [--accepted FILE] [--retry-ms MS]
 *               [--hot-key]   (every call is call F: one key and one body, N times)
 *
 * Exit status: 0 when every call was accepted and every replay/conflict probe answered as the
 * contract says, 1 otherwise, 2 on bad usage.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_load.h"
#include "oq_log.h"

static void usage(void)
{
    fprintf(stderr,
            "usage: oq_e2e_load --port P --calls N [--host H] [--first F] [--conns C] [--rate R]\n"
            "       [--prefix K] [--mix c,e,s,fr,ff] [--sleep-ms MS] [--dup-every N]\n"
            "       [--conflict-every N] [--accepted FILE] [--retry-ms MS] [--hot-key]\n");
}

int main(int argc, char **argv)
{
    oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 1);
    oq_load_opts_t o;
    memset(&o, 0, sizeof o);
    const char *accepted = NULL;
    static const struct option opts[] = {{"host", required_argument, NULL, 'h'},
                                         {"port", required_argument, NULL, 'p'},
                                         {"calls", required_argument, NULL, 'n'},
                                         {"first", required_argument, NULL, 'f'},
                                         {"conns", required_argument, NULL, 'c'},
                                         {"rate", required_argument, NULL, 'r'},
                                         {"prefix", required_argument, NULL, 'k'},
                                         {"mix", required_argument, NULL, 'm'},
                                         {"sleep-ms", required_argument, NULL, 's'},
                                         {"dup-every", required_argument, NULL, 'd'},
                                         {"conflict-every", required_argument, NULL, 'x'},
                                         {"accepted", required_argument, NULL, 'a'},
                                         {"retry-ms", required_argument, NULL, 't'},
                                         {"hot-key", no_argument, NULL, 'H'},
                                         {NULL, 0, NULL, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'h':
            o.host = optarg;
            break;
        case 'p':
            o.port = atoi(optarg);
            break;
        case 'n':
            o.calls = atoll(optarg);
            break;
        case 'f':
            o.first = atoll(optarg);
            break;
        case 'c':
            o.conns = atoi(optarg);
            break;
        case 'r':
            o.rate = atof(optarg);
            break;
        case 'k':
            o.key_prefix = optarg;
            break;
        case 'm':
            if (sscanf(optarg, "%d,%d,%d,%d,%d", &o.mix[0], &o.mix[1], &o.mix[2], &o.mix[3],
                       &o.mix[4]) != 5) {
                usage();
                return 2;
            }
            break;
        case 's':
            o.sleep_ms = atoi(optarg);
            break;
        case 'd':
            o.dup_every = atoi(optarg);
            break;
        case 'x':
            o.conflict_every = atoi(optarg);
            break;
        case 'a':
            accepted = optarg;
            break;
        case 't':
            o.retry_ms = atoll(optarg);
            break;
        case 'H':
            o.hot_key = 1;
            break;
        default:
            usage();
            return 2;
        }
    }
    if (o.port <= 0 || o.calls <= 0 || optind != argc) {
        usage();
        return 2;
    }
    if (accepted) {
        o.accepted = fopen(accepted, "a");
        if (!o.accepted) {
            perror(accepted);
            return 2;
        }
    }
    oq_load_result_t r;
    oq_error_t err = {0};
    int rc = oq_load_run(&o, &r, &err);
    if (o.accepted) fclose(o.accepted);
    if (rc != 0) {
        fprintf(stderr, "oq_e2e_load: %s\n", err.msg);
        return 1;
    }
    printf("calls=%lld\naccepted=%lld\nfailed=%lld\n", (long long)o.calls, (long long)r.accepted,
           (long long)r.failed);
    printf("charge=%lld\nsend_email=%lld\nsleep=%lld\nfail_retryable=%lld\nfail_final=%lld\n",
           (long long)r.by_tool[0], (long long)r.by_tool[1], (long long)r.by_tool[2],
           (long long)r.by_tool[3], (long long)r.by_tool[4]);
    printf("replays_ok=%lld\nreplays_bad=%lld\nconflicts_ok=%lld\nconflicts_bad=%lld\n",
           (long long)r.replays_ok, (long long)r.replays_bad, (long long)r.conflicts_ok,
           (long long)r.conflicts_bad);
    printf("retries=%lld\nelapsed_s=%.3f\nrate=%.1f\n", (long long)r.retries, r.elapsed_s,
           r.elapsed_s > 0 ? (double)r.accepted / r.elapsed_s : 0.0);
    printf("submit_p50_ms=%.2f\nsubmit_p99_ms=%.2f\nsubmit_max_ms=%.2f\n", r.p50_ms, r.p99_ms,
           r.max_ms);
    int ok = r.accepted == o.calls && r.failed == 0 && r.replays_bad == 0 && r.conflicts_bad == 0;
    return ok ? 0 : 1;
}
