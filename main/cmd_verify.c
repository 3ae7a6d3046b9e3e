/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq verify --producer-db calls.db --consumer-db effects.db [--downstream-db ledger.db]
 * [--json] [--allow-pending]`: the invariant checker of chaos/verify.c as a command; with the
 * downstream's ledger it also reports the DSR that service's customers see. It only reads
 * (every database is opened read-only), prints the report on stdout, and maps the outcome to
 * the exit code:
 * 0 clean, 3 (OQ_EXIT_VIOLATION) on any violation, 2 on bad usage, 1 when a database cannot
 * be read or is not the kind of database it should be. Either database may be PostgreSQL (a
 * libpq string): it is read from one snapshot (chaos/verify.c).
 */
#include <stdio.h>

#include "cmds.h"
#include "oq_chaos.h"
#include "oq_config.h"
#include "oq_pg.h"

static const oq_setting_t verify_settings[] = {
    {"producer-db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "producer database (calls.db, or a PostgreSQL URI)"},
    {"consumer-db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "consumer database (effects.db, or a PostgreSQL URI)"},
    {"json", OQ_SET_BOOL, "false", 0, -1, NULL, "print the report as one JSON object"},
    {"allow-pending", OQ_SET_BOOL, "false", 0, -1, NULL,
     "report non-terminal calls without counting them as violations (live pipeline)"},
    {"accepted", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "file of call ids a client saw accepted (one per line): each must be in calls.db"},
    {"examples", OQ_SET_INT, "10", 0, 100000, NULL, "examples printed per kind of violation"},
    {"downstream-db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "the ledger of `onceq-downstream` (optional): DSR and duplicates where the effects land"},
};

int oq__cmd_verify(int argc, char **argv)
{
    const char *usage = "onceq verify --producer-db calls.db --consumer-db effects.db "
                        "[--downstream-db ledger.db] [--json] [--allow-pending] [--accepted FILE]";
    oq_config_t *cfg =
        oq_config_new(verify_settings, sizeof verify_settings / sizeof verify_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    int rc = oq_cli_parse(cfg, "onceq", usage, argc, argv);
    if (rc >= 0) goto out;
    const char *pdb = oq_config_str(cfg, "producer-db");
    const char *cdb = oq_config_str(cfg, "consumer-db");
    if (!pdb || !cdb || oq_config_npositional(cfg) > 0) {
        fprintf(stderr, "onceq verify: --producer-db and --consumer-db are required\nusage: %s\n",
                usage);
        rc = OQ_EXIT_USAGE;
        goto out;
    }
    oq_verify_opts_t opts = {
        .allow_pending = (int)oq_config_int(cfg, "allow-pending"),
        .max_examples = (int)oq_config_int(cfg, "examples"),
        .accepted_file = oq_config_str(cfg, "accepted"),
        .downstream_db = oq_config_str(cfg, "downstream-db"),
    };
    if (opts.max_examples == 0) opts.max_examples = -1;
    oq_verify_report_t rep;
    oq_error_t err = {0};
    if (oq_verify_run(pdb, cdb, &opts, &rep, &err) != 0) {
        fprintf(stderr, "onceq verify: %s\n", err.msg);
        rc = OQ_EXIT_FAIL;
        goto out;
    }
    int json = (int)oq_config_int(cfg, "json");
    /* a PostgreSQL string is never printed (it names hosts and a passfile) */
    if (!json)
        printf("onceq verify: producer=%s consumer=%s\n",
               oq_backend_of(pdb) == OQ_BACKEND_POSTGRES ? "postgres" : pdb,
               oq_backend_of(cdb) == OQ_BACKEND_POSTGRES ? "postgres" : cdb);
    if (oq_verify_print(&rep, stdout, json) != 0)
        rc = OQ_EXIT_FAIL;
    else
        rc = rep.violations ? OQ_EXIT_VIOLATION : OQ_EXIT_OK;
    oq_verify_report_clear(&rep);
out:
    oq_config_destroy(cfg);
    return rc;
}
