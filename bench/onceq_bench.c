/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq-bench <what>`: the benchmark program, kept out of the `onceq` binary that
 * deployments run. Each benchmark lives in bench/bench_<what>.c and measures onceq side by
 * side with a baseline in the same run (plain SQLite loop, raw librdkafka produce/consume),
 * because these machines are shared and noisy: ratios from one run mean more than absolute
 * figures from different runs. submit, relay and consumer drive the libraries in this
 * process; e2e runs the real `onceq` binary (the one next to this program unless --onceq
 * says otherwise) and loads it over HTTP with the load generator of bench/load.c.
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "oq_log.h"

#define OQ_BENCH_ENTRY(name, doc) {#name, oq__bench_##name, doc},
static const oq_cli_cmd_t benches[] = {OQ_BENCHES(OQ_BENCH_ENTRY){NULL, NULL, NULL}};
#undef OQ_BENCH_ENTRY

static void usage(FILE *out)
{
    fprintf(out,
            "onceq-bench %s: benchmarks of onceq, each with a same-run baseline\n\n"
            "usage: onceq-bench <benchmark> [options]   (onceq-bench <benchmark> --help)\n\n"
            "benchmarks:\n",
            ONCEQ_VERSION);
    for (const oq_cli_cmd_t *b = benches; b->name; b++)
        fprintf(out, "  %-10s %s\n", b->name, b->doc);
    fprintf(out, "\nbench/run.sh (make bench) runs them all with the sizes of the README table.\n");
}

int main(int argc, char **argv)
{
    oq_log_init(OQ_LOG_INFO, OQ_LOG_FMT_LOGFMT, 1);
    int rc = oq_cli_dispatch("onceq-bench", benches, usage, argc, argv);
    if (rc >= 0) return rc;
    fprintf(stderr, "onceq-bench: unknown benchmark '%s'\n\n", argv[1]);
    usage(stderr);
    return OQ_EXIT_USAGE;
}
