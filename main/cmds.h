/**
 * @file cmds.h
 * @brief Subcommands of the `onceq` binary. Each lives in main/cmd_<name>.c as
 *        `int oq_cmd_<name>(int argc, char **argv)` where argv[0] is the subcommand name, and
 *        returns a process exit code (see OQ_EXIT_*). Only main() calls exit().
 */
#ifndef OQ_CMDS_H
#define OQ_CMDS_H

#include "oq_config.h"
#include "oq_error.h"

/* Exit codes (documented in README "Exit codes"). */
#define OQ_EXIT_OK 0
#define OQ_EXIT_FAIL 1      /**< runtime failure (database, broker, I/O) */
#define OQ_EXIT_USAGE 2     /**< bad usage or invalid input; nothing was changed */
#define OQ_EXIT_VIOLATION 3 /**< `verify` found an invariant violation */
#define OQ_EXIT_NOTFOUND 4  /**< `get`/`inspect`: no such call */
#define OQ_EXIT_CONFLICT 5  /**< `submit`/`call`: same key, different body */

#define OQ_CMD_WEAK __attribute__((weak))
#define OQ_CMDS(X)                                                                                 \
    X(broker, "run the embedded Kafka broker (librdkafka mock cluster)")                          \
    X(topics, "create, describe or delete the onceq topics on a real Kafka cluster")              \
    X(producer, "run the producer: HTTP submit API, group commit, results ingest")                \
    X(relay, "run the outbox relay daemon for one database")                                      \
    X(consumer, "run a consumer-group worker (inbox, executions, effects)")                       \
    X(up, "supervise broker + producer + relay + consumers on this host")                         \
    X(submit, "submit one tool call (prints the call JSON)")                                      \
    X(call, "submit over HTTP, retry with the same key, poll to a terminal state")                \
    X(get, "show a call by id or by key")                                                         \
    X(stats, "counts by status, effects, relay status")                                           \
    X(inspect, "audit timeline of one call")                                                      \
    X(purge, "delete expired terminal calls and published outbox rows")                           \
    X(verify, "check the invariants across the producer and consumer databases")                  \
    X(bench, "benchmarks (submit, relay, consumer, e2e)")                                         \
    X(canon, "print the RFC 8785 canonical form of the JSON on stdin")                            \
    X(fingerprint, "print the call fingerprint of the args JSON on stdin")

#define OQ_CMD_DECL(name, doc) int oq_cmd_##name(int argc, char **argv) OQ_CMD_WEAK;
OQ_CMDS(OQ_CMD_DECL)
#undef OQ_CMD_DECL

/**
 * @brief Shared helper for commands: parse settings, handle --help, report errors.
 * @returns -1 to continue, or an exit code to return now (0 after --help, 2 on bad usage).
 */
int oq_cmd_parse(oq_config_t *cfg, const char *usage, int argc, char **argv);

#endif
