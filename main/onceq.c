/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The `onceq` binary: a dispatch table over the subcommands listed in cmds.h, every one of
 * them linked in. Subcommands that moved to another program (the benchmarks, now
 * `onceq-bench`) keep an entry that says where they went, so an old command line fails with
 * a pointer instead of "unknown command".
 */
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "oq_log.h"

#define OQ_CMD_ENTRY(name, doc) {#name, oq__cmd_##name, doc},
static const oq_cli_cmd_t cmds[] = {OQ_CMDS(OQ_CMD_ENTRY){NULL, NULL, NULL}};
#undef OQ_CMD_ENTRY

/* Subcommands that live in another program now. */
static const struct {
    const char *name, *program, *run;
} moved[] = {
    {"bench", "onceq-bench", NULL},
    {"downstream", "onceq-downstream", "onceq-downstream [stats] --db ... (see --help)"},
};

static void usage(FILE *out)
{
    fprintf(out,
            "onceq %s: effectively-once tool calls over SQLite and Kafka\n\n"
            "usage: onceq <command> [options]   (onceq help <command> or onceq <command> --help\n"
            "                                    for its options)\n\n"
            "commands:\n",
            ONCEQ_VERSION);
    for (const oq_cli_cmd_t *c = cmds; c->name; c++)
        fprintf(out, "  %-12s %s\n", c->name, c->doc);
    fprintf(out,
            "\nbenchmarks and the HTTP load generator: the onceq-bench program;\n"
            "the test payment service: the onceq-downstream program\n"
            "exit codes: 0 ok, 1 runtime failure, 2 bad usage or invalid input,\n"
            "            3 invariant violation (verify), 4 not found, 5 idempotency conflict,\n"
            "            6 call failed, 7 call needs review, 8 gave up (call)\n"
            "environment: ONCEQ_LOG_LEVEL=debug|info|warn|error, ONCEQ_LOG_FORMAT=logfmt|json\n");
}

int main(int argc, char **argv)
{
    oq_log_init(OQ_LOG_INFO, OQ_LOG_FMT_LOGFMT, 1);
    int rc = oq_cli_dispatch("onceq", cmds, usage, argc, argv);
    if (rc >= 0) return rc;
    for (size_t i = 0; i < sizeof moved / sizeof moved[0]; i++) {
        if (strcmp(moved[i].name, argv[1]) != 0) continue;
        if (moved[i].run) {
            fprintf(stderr, "onceq %s: moved to the %s program, built next to onceq: run `%s`\n",
                    argv[1], moved[i].program, moved[i].run);
            return OQ_EXIT_USAGE;
        }
        fprintf(stderr,
                "onceq %s: moved to the %s program, built next to onceq: run `%s %s ...` "
                "(%s --help lists them)\n",
                argv[1], moved[i].program, moved[i].program, argc > 2 ? argv[2] : "<name>",
                moved[i].program);
        return OQ_EXIT_USAGE;
    }
    fprintf(stderr, "onceq: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return OQ_EXIT_USAGE;
}
