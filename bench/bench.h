/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file bench.h
 * @brief The benchmarks of the `onceq-bench` program. Each lives in bench/bench_<name>.c as
 *        `int oq__bench_<name>(int argc, char **argv)` (argv[0] is the benchmark name) and
 *        returns a process exit code (OQ_EXIT_* of oq_cli.h).
 */
#ifndef OQ_BENCH_H
#define OQ_BENCH_H

#include "oq_cli.h"

#define OQ_BENCHES(X)                                                                              \
    X(submit, "durable submits/s: group commit vs one-fsync-per-call SQLite loop")                 \
    X(relay, "outbox -> broker rate vs raw librdkafka produce; idle latency")                      \
    X(consumer, "consumer from a pre-filled topic vs raw consume + batched insert")                \
    X(e2e, "end-to-end calls/s and latency at a fixed offered load (runs the onceq binary)")       \
    X(mcp, "tools/call round trips/s through /mcp vs HTTP submit + wait, same run")

#define OQ_BENCH_DECL(name, doc) int oq__bench_##name(int argc, char **argv);
OQ_BENCHES(OQ_BENCH_DECL)
#undef OQ_BENCH_DECL

#endif
