/*
 * `onceq inspect <call_id>`: a human-readable timeline of one call: the call's identity and
 * current state, then "submitted" (created_at; creation is not an audit row) and every audit
 * row in order (retry resets, running, terminal states, results that were not applied).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cmds.h"
#include "oq_db.h"
#include "oq_producer.h"
#include "oq_util.h"

static const oq_setting_t inspect_settings[] = {
    {"db", OQ_SET_STRING, "calls.db", 1, 4096, NULL, "producer database file"},
};

static const char inspect_usage[] = "usage: onceq inspect [--db calls.db] <call_id>\n"
                                    "Exit codes: 0 found, 4 not found.";

int oq__cmd_inspect(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    sqlite3 *db = NULL;
    oq_call_t c = {0};
    oq_audit_row_t *rows = NULL;
    size_t n = 0;
    char ts[32];
    oq_config_t *cfg =
        oq_config_new(inspect_settings, sizeof inspect_settings / sizeof inspect_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq", inspect_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    if (oq_config_npositional(cfg) != 1) {
        fprintf(stderr, "%s\n", inspect_usage);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    const char *id = oq_config_positional(cfg, 0);
    oq_db_opts_t o = {NULL, 0, 1};
    if (oq_db_open(oq_config_str(cfg, "db"), &o, &db, &err) != 0) {
        fprintf(stderr, "onceq inspect: %s: %s\n", oq_config_str(cfg, "db"), err.msg);
        goto out;
    }
    int rc = oq_store_get(db, id, &c, &err);
    if (rc == OQ_ENOTFOUND) {
        fprintf(stderr, "onceq inspect: no call %s\n", id);
        ret = OQ_EXIT_NOTFOUND;
        goto out;
    }
    if (rc || oq_store_audit(db, id, &rows, &n, &err) != 0) {
        fprintf(stderr, "onceq inspect: %s\n", err.msg);
        goto out;
    }
    printf("call      %s\n", c.call_id);
    printf("tenant    %s\nkey       %s\ntool      %s\nargs      %s\n", c.tenant, c.idem_key, c.tool,
           c.args);
    printf("status    %s (attempt %lld)\n", c.state, (long long)c.attempt);
    if (c.effect_id) printf("effect    %s\n", c.effect_id);
    if (c.result) printf("result    %s\n", c.result);
    if (c.error) printf("error     %s\n", c.error);
    oq_time_format(c.expires_at, ts);
    printf("expires   %s\n\ntimeline\n", ts);
    oq_time_format(c.created_at, ts);
    printf("  %s  %-14s\n", ts, "submitted");
    for (size_t i = 0; i < n; i++) {
        oq_time_format(rows[i].ts, ts);
        printf("  %s  %-14s %s\n", ts, rows[i].event, rows[i].detail ? rows[i].detail : "");
    }
    ret = OQ_EXIT_OK;
out:
    oq_audit_free(rows, n);
    oq_call_clear(&c);
    if (db) sqlite3_close_v2(db);
    oq_config_destroy(cfg);
    return ret;
}
