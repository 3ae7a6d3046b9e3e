/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file bench.h
 * @brief The benchmarks of the `onceq-bench` program. Each lives in bench/bench_<name>.c as
 *        `int oq__bench_<name>(int argc, char **argv)` (argv[0] is the benchmark name) and
 *        returns a process exit code (OQ_EXIT_* of oq_cli.h).
 */
#ifndef OQ_BENCH_H
#define OQ_BENCH_H

#include <stdint.h>

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

/** CPU seconds and bytes written to storage of a set of processes (bench/procstat.c). */
typedef struct oq_bench_procs {
    double cpu_s;
    int64_t write_bytes;
    int n; /**< processes found */
} oq_bench_procs_t;

/** @brief Sample process \p root, and every child of it when \p with_children. */
void oq__bench_procs(long root, int with_children, oq_bench_procs_t *out);

/** @brief The PostgreSQL postmaster to account for (ONCEQ_BENCH_PG_PID), or 0. */
long oq__bench_pg_pid(void);

/**
 * @brief Bytes written to this machine's disks so far, by every process (the sectors written
 *        of each /sys/block device that is a device of its own, not a loop, zram or
 *        device-mapper one), or -1 when /sys/block cannot be read. The figure that reaches the
 *        disk: /proc/PID/io's write_bytes counts a whole page-cache folio each time a clean one
 *        is dirtied, which on kernels with large folios (ext4 from 6.16) is up to 256 KB for
 *        an 8 KB write, e.g. a WAL page written again after an fsync (bench/procstat.c).
 */
int64_t oq__bench_disk_written(void);

/** @brief The bytes written between two oq__bench_disk_written() readings, or -1 when either
 *  is unknown. */
double oq__bench_disk_delta(int64_t before, int64_t after);

/** @brief Prints "per WHAT: N bytes reached the disks ..." for \p bytes a unit, when known
 *  (>= 0): the one wording of the disk figure for every benchmark. */
void oq__bench_print_disk(const char *what, double bytes);

/**
 * @brief A loopback TCP port free now, for a server a benchmark starts, or -1. Chosen below
 *        the kernel's ephemeral range (as the tests' oq_free_port): a port the kernel picked
 *        for bind(0) could be handed out again, between our check and the server's bind, to
 *        another listener (the embedded broker's) or to an outgoing connection, and the
 *        server then failed to start (a benchmark's "producer not healthy after 30 s").
 */
int oq__bench_free_port(void);

#endif
