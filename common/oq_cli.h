/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_cli.h
 * @brief What the command-line programs (`onceq`, `onceq-bench`) share: exit codes and the
 *        parse-or-exit step of every subcommand.
 */
#ifndef OQ_CLI_H
#define OQ_CLI_H

#include <stdio.h>

#include "oq_config.h"

/* Exit codes (documented in README "Exit codes"). */
#define OQ_EXIT_OK 0
#define OQ_EXIT_FAIL 1        /**< runtime failure (database, broker, I/O) */
#define OQ_EXIT_USAGE 2       /**< bad usage or invalid input; nothing was changed */
#define OQ_EXIT_VIOLATION 3   /**< `verify` found an invariant violation */
#define OQ_EXIT_NOTFOUND 4    /**< `get`/`inspect`: no such call */
#define OQ_EXIT_CONFLICT 5    /**< `submit`/`call`: same key, different body */
#define OQ_EXIT_CALL_FAILED 6 /**< `call`: the call ended `failed` (the tool failed) */
#define OQ_EXIT_CALL_REVIEW 7 /**< `call`: the call ended `needs_review` (an operator decides) */
#define OQ_EXIT_GAVE_UP 8     /**< `call`: retry budget or --timeout spent, call not terminal */

/**
 * The daemons' log settings, one table row each: `--log-level`, `--log-format`, also read as
 * ONCEQ_LOG_LEVEL / ONCEQ_LOG_FORMAT (the logger's own variables) and from -F files.
 * oq_cli_parse() applies them when the table has them.
 */
#define OQ_CLI_LOG_SETTINGS                                                                        \
    {"log-level",                                                                                  \
     OQ_SET_ENUM,                                                                                  \
     "info",                                                                                       \
     0,                                                                                            \
     -1,                                                                                           \
     "debug|info|warn|error|off",                                                                  \
     "log threshold (lines on stderr)"},                                                           \
    {                                                                                              \
        "log-format", OQ_SET_ENUM, "logfmt", 0, -1, "logfmt|json",                                 \
            "log lines as logfmt or as JSON objects (one per line)"                                \
    }

/** @brief The exit code of a command that failed with \p rc (an OQ_E* code, 0 = ok): not
 *         found -> 4, invalid input or a state that forbids it -> 2, anything else -> 1. */
int oq_cli_exit_for(int rc);

/** One subcommand of a program: its name, entry point (argv[0] is the name) and summary. */
typedef struct oq_cli_cmd {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *doc;
} oq_cli_cmd_t;

/**
 * @brief The main() of a program of subcommands (\p cmds ends with a NULL name): no argument
 *        prints \p usage on stderr (exit 2); -h, --help or help prints it on stdout (exit 0);
 *        `help CMD` runs CMD's entry point as `CMD --help` (an unknown CMD: usage on stderr,
 *        exit 2); --version or version prints "PROG VERSION"; a known name runs its entry point
 * with argv + 1 and returns its exit code.
 * @returns that exit code, or -1 for an unknown name (the caller says what to do instead).
 */
int oq_cli_dispatch(const char *prog, const oq_cli_cmd_t *cmds, void (*usage)(FILE *out), int argc,
                    char **argv);

/** @brief Check the command's --topic-prefix (the OQ_SETTING_TOPIC_PREFIX row); on a bad one
 *         print "onceq CMD: --topic-prefix: why" on stderr. @returns 0, or OQ_EXIT_USAGE. */
int oq_cli_check_topic_prefix(const oq_config_t *cfg, const char *cmd);

/** Environment prefix of the settings: `--key-ttl` is also read as ONCEQ_KEY_TTL. */
#define OQ_CLI_ENV_PREFIX "ONCEQ_"

/**
 * @brief Parse a subcommand's arguments into \p cfg, print help for --help, report bad usage
 *        on stderr as "<prog> <argv[0]>: <message>". Settings are also read from the
 *        environment (OQ_CLI_ENV_PREFIX + NAME); flag > environment > file > default.
 * @param prog the program name ("onceq", "onceq-bench"); argv[0] is the subcommand name.
 * @returns -1 to go on, or the exit code to return now (OQ_EXIT_OK after --help,
 *          OQ_EXIT_USAGE on bad usage).
 */
int oq_cli_parse(oq_config_t *cfg, const char *prog, const char *usage, int argc, char **argv);

#endif
