/*
 * The `onceq` binary: a dispatch table over the subcommands in cmds.h. Subcommands are weak
 * symbols while the project grows, so a build without one says so instead of failing to link.
 */
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "oq_log.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *doc;
} oq_cmd_entry_t;

#define OQ_CMD_ENTRY(name, doc) {#name, oq_cmd_##name, doc},
static const oq_cmd_entry_t oq__cmds[] = {OQ_CMDS(OQ_CMD_ENTRY){NULL, NULL, NULL}};

static void oq__usage(FILE *out)
{
    fprintf(out, "onceq %s: effectively-once tool calls over SQLite and Kafka\n\n"
                 "usage: onceq <command> [options]   (onceq <command> --help for its options)\n\n"
                 "commands:\n",
            ONCEQ_VERSION);
    for (const oq_cmd_entry_t *c = oq__cmds; c->name; c++)
        fprintf(out, "  %-12s %s%s\n", c->name, c->doc, c->fn ? "" : " (not in this build)");
    fprintf(out, "\nexit codes: 0 ok, 1 runtime failure, 2 bad usage or invalid input,\n"
                 "            3 invariant violation (verify), 4 not found, 5 idempotency conflict\n"
                 "environment: ONCEQ_LOG_LEVEL=debug|info|warn|error, ONCEQ_LOG_FORMAT=logfmt|json\n");
}

int oq_cmd_parse(oq_config_t *cfg, const char *usage, int argc, char **argv)
{
    oq_error_t err = {0};
    int rc = oq_config_parse_args(cfg, usage, argc, argv, 1, &err);
    if (rc == OQ_EHELP) return OQ_EXIT_OK;
    if (rc != 0) {
        fprintf(stderr, "onceq %s: %s\n(see: onceq %s --help)\n", argv[0], err.msg, argv[0]);
        return OQ_EXIT_USAGE;
    }
    return -1;
}

int main(int argc, char **argv)
{
    oq_log_init(OQ_LOG_INFO, OQ_LOG_FMT_LOGFMT, 1);
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        oq__usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? OQ_EXIT_USAGE : OQ_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("onceq %s\n", ONCEQ_VERSION);
        return OQ_EXIT_OK;
    }
    for (const oq_cmd_entry_t *c = oq__cmds; c->name; c++) {
        if (strcmp(c->name, argv[1]) != 0) continue;
        if (!c->fn) {
            fprintf(stderr, "onceq: command '%s' is not in this build\n", c->name);
            return OQ_EXIT_FAIL;
        }
        return c->fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "onceq: unknown command '%s'\n\n", argv[1]);
    oq__usage(stderr);
    return OQ_EXIT_USAGE;
}
