/*
 * `onceq bench <what>`: benchmark dispatcher. Each benchmark lives in main/bench_<what>.c and
 * measures onceq side by side with a baseline in the same run (plain SQLite loop, raw
 * librdkafka produce/consume), because these machines are shared and noisy: ratios from one
 * run mean more than absolute figures from different runs.
 */
#include <stdio.h>
#include <string.h>

#include "cmds.h"

int oq_bench_submit(int argc, char **argv) OQ_CMD_WEAK;
int oq_bench_relay(int argc, char **argv) OQ_CMD_WEAK;
int oq_bench_consumer(int argc, char **argv) OQ_CMD_WEAK;
int oq_bench_e2e(int argc, char **argv) OQ_CMD_WEAK;

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *doc;
} oq__benches[] = {
    {"submit", oq_bench_submit, "durable submits/s: group commit vs one-fsync-per-call SQLite loop"},
    {"relay", oq_bench_relay, "outbox -> broker rate vs raw librdkafka produce; idle latency"},
    {"consumer", oq_bench_consumer, "consumer from a pre-filled topic vs raw consume + batched insert"},
    {"e2e", oq_bench_e2e, "end-to-end calls/s and latency at a fixed offered load"},
};

int oq_cmd_bench(int argc, char **argv)
{
    size_t n = sizeof(oq__benches) / sizeof(oq__benches[0]);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        FILE *out = argc < 2 ? stderr : stdout;
        fprintf(out, "usage: onceq bench <benchmark> [options]   (onceq bench <benchmark> --help)\n\n");
        for (size_t i = 0; i < n; i++)
            fprintf(out, "  %-10s %s%s\n", oq__benches[i].name, oq__benches[i].doc,
                    oq__benches[i].fn ? "" : " (not in this build)");
        return argc < 2 ? OQ_EXIT_USAGE : OQ_EXIT_OK;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], oq__benches[i].name) != 0) continue;
        if (!oq__benches[i].fn) {
            fprintf(stderr, "onceq bench: '%s' is not in this build\n", argv[1]);
            return OQ_EXIT_FAIL;
        }
        return oq__benches[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "onceq bench: unknown benchmark '%s' (see onceq bench --help)\n", argv[1]);
    return OQ_EXIT_USAGE;
}
