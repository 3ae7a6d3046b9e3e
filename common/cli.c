/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The parse-or-exit step shared by the subcommands of both command-line programs: settings
 * come from the command's table (oq_config), --help prints that table, and any error is one
 * line naming the program and subcommand, then a pointer to its --help. Every setting is also
 * read from the environment as ONCEQ_<NAME> (flag > environment > file > default). Nothing here
 * exits: the caller returns the code to main().
 */
#include <stdio.h>
#include <string.h>

#include "oq_cli.h"
#include "oq_envelope.h"
#include "oq_log.h"

int oq_cli_parse(oq_config_t *cfg, const char *prog, const char *usage, int argc, char **argv)
{
    oq_error_t err = {0};
    oq_config_use_env(cfg, OQ_CLI_ENV_PREFIX);
    int rc = oq_config_parse_args(cfg, usage, argc, argv, 1, &err);
    if (rc == OQ_EHELP) return OQ_EXIT_OK;
    if (rc != 0) {
        fprintf(stderr, "%s %s: %s\n(see: %s %s --help)\n", prog, argv[0], err.msg, prog, argv[0]);
        return OQ_EXIT_USAGE;
    }
    if (oq_config_has(cfg, "log-level") && oq_config_has(cfg, "log-format"))
        oq_log_init((oq_log_level_t)oq_log_level_parse(oq_config_str(cfg, "log-level")),
                    strcmp(oq_config_str(cfg, "log-format"), "json") == 0 ? OQ_LOG_FMT_JSON
                                                                          : OQ_LOG_FMT_LOGFMT,
                    0);
    return -1;
}

int oq_cli_exit_for(int rc)
{
    switch (rc) {
    case 0:
        return OQ_EXIT_OK;
    case OQ_ENOTFOUND:
        return OQ_EXIT_NOTFOUND;
    case OQ_EINVAL:
    case OQ_ESTATE:
        return OQ_EXIT_USAGE;
    default:
        return OQ_EXIT_FAIL;
    }
}

int oq_cli_dispatch(const char *prog, const oq_cli_cmd_t *cmds, void (*usage)(FILE *out), int argc,
                    char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "help") == 0) { /* help CMD: CMD --help */
        for (const oq_cli_cmd_t *c = cmds; c->name; c++) {
            if (strcmp(c->name, argv[2]) != 0) continue;
            static char help[] = "--help";
            char *sub[] = {argv[2], help, NULL};
            return c->fn(2, sub);
        }
        fprintf(stderr, "%s help: unknown command '%s'\n\n", prog, argv[2]);
        usage(stderr);
        return OQ_EXIT_USAGE;
    }
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? OQ_EXIT_USAGE : OQ_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("%s %s\n", prog, ONCEQ_VERSION);
        return OQ_EXIT_OK;
    }
    for (const oq_cli_cmd_t *c = cmds; c->name; c++)
        if (strcmp(c->name, argv[1]) == 0) return c->fn(argc - 1, argv + 1);
    return -1;
}

int oq_cli_check_topic_prefix(const oq_config_t *cfg, const char *cmd)
{
    oq_error_t err = {0};
    if (oq_topic_prefix_check(oq_config_str(cfg, "topic-prefix"), &err) == 0) return 0;
    fprintf(stderr, "onceq %s: --topic-prefix: %s\n", cmd, err.msg);
    return OQ_EXIT_USAGE;
}
