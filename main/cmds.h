/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file cmds.h
 * @brief Subcommands of the `onceq` binary. Each lives in main/cmd_<name>.c as
 *        `int oq__cmd_<name>(int argc, char **argv)` where argv[0] is the subcommand name, and
 *        returns a process exit code (OQ_EXIT_* of oq_cli.h). Only main() calls exit().
 *
 * The list holds what a deployment runs and operates; benchmarks and the load generator are
 * the separate `onceq-bench` program (bench/), the test payment service the `onceq-downstream`
 * program (downstream/cmd/).
 */
#ifndef OQ_CMDS_H
#define OQ_CMDS_H

#include "oq_cli.h"
#include "oq_config.h"
#include "oq_error.h"
#include "oq_pg.h"

#include <stdio.h>

#define OQ_CMDS(X)                                                                                 \
    X(broker, "run the embedded Kafka broker (librdkafka mock cluster)")                           \
    X(topics, "create, describe or delete the onceq topics on a real Kafka cluster")               \
    X(producer, "run the producer: HTTP submit API, group commit, results ingest")                 \
    X(relay, "run the outbox relay daemon for one database")                                       \
    X(consumer, "run a consumer-group worker (inbox, executions, effects)")                        \
    X(up, "supervise broker + producer + relay + consumers on this host")                          \
    X(submit, "submit one tool call (prints the call JSON)")                                       \
    X(call, "submit over HTTP(S), retry with the same key, poll to a terminal state")              \
    X(tasks, "list and show tasks, runs of steps (POST /v1/tasks)")                                \
    X(get, "show a call by id or by key")                                                          \
    X(stats, "counts by status, effects, relay status")                                            \
    X(inspect, "audit timeline of one call")                                                       \
    X(dlq, "list, show and redrive dead letters (onceq.dlq, and the relay's outbox_dead)")         \
    X(purge, "delete expired terminal calls and published outbox rows")                            \
    X(migrate, "apply the schema migrations of a database (SQLite file or PostgreSQL URL)")        \
    X(verify, "check the invariants across the producer and consumer databases")                   \
    X(review, "list, show and resolve the calls no machine could decide (NEEDS_REVIEW)")           \
    X(console, "the operators' web console: calls, timelines, review, dead letters, charts")       \
    X(canon, "print the RFC 8785 canonical form of the JSON on stdin")                             \
    X(fingerprint, "print the call fingerprint of the args JSON on stdin")                         \
    X(completion, "print a bash completion script (onceq completion bash)")

/** `onceq inspect` on a task id (main/cmd_tasks.c): every step's and compensation's timeline,
 *  merged. @returns an exit code. */
int oq__tasks_inspect(const char *db_path, const char *consumer_db, const char *task_id,
                      int as_json);

#define OQ_CMD_DECL(name, doc) int oq__cmd_##name(int argc, char **argv);
OQ_CMDS(OQ_CMD_DECL)
#undef OQ_CMD_DECL

/**
 * A consumer database given as a PostgreSQL connection string that holds a password: refused
 * (exit 2, one line on stderr naming \p cmd, the string never echoed), as oq_dbh_open() refuses
 * a producer's: a command line is visible to every user of the host.
 * @returns 0 when \p setting (may be NULL: none) is usable.
 */
static inline int oq__cmd_consumer_db_refused(const char *cmd, const char *setting)
{
    if (!setting || oq_backend_of(setting) != OQ_BACKEND_POSTGRES ||
        !oq_pg_conninfo_has_password(setting))
        return 0;
    fprintf(stderr,
            "%s: the consumer database's connection string holds a password: put it in a "
            "passfile (passfile=... in the string, or PGPASSFILE)\n",
            cmd);
    return OQ_EXIT_USAGE;
}

#endif
