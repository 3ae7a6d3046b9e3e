/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq get <call_id>` / `onceq get --key K [--tenant X]`: print one call as JSON, read
 * straight from --db, an SQLite file or PostgreSQL (read-only connection; safe while the
 * daemon runs).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cmds.h"
#include "oq_dbh.h"
#include "oq_producer.h"
#include "oq_json.h"

static const oq_setting_t get_settings[] = {
    {"db", OQ_SET_STRING, "calls.db", 1, 4096, NULL,
     "producer database: a file (SQLite) or a postgres:// URI / libpq keyword string"},
    {"key", OQ_SET_STRING, NULL, 0, 255, NULL, "look up by idempotency key instead of id"},
    {"tenant", OQ_SET_STRING, "default", 1, 128, NULL, "tenant of --key"},
};

static const char get_usage[] = "usage: onceq get [--db calls.db] <call_id>\n"
                                "       onceq get [--db calls.db] --key K [--tenant X]\n"
                                "Exit codes: 0 found, 4 not found.";

int oq__cmd_get(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    oq_dbh_t db = {0};
    oq_call_t call = {0};
    oq_config_t *cfg = oq_config_new(get_settings, sizeof get_settings / sizeof get_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq", get_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    const char *key = oq_config_str(cfg, "key");
    if ((!key) == (oq_config_npositional(cfg) != 1)) {
        fprintf(stderr, "%s\n", get_usage);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    oq_db_opts_t o = {NULL, 0, 1};
    if (oq_dbh_open(oq_config_str(cfg, "db"), &o, &db, &err) != 0) {
        fprintf(stderr, "onceq get: %s: %s\n", oq_dbh_label(oq_config_str(cfg, "db")), err.msg);
        ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    int rc = key ? oq_producer_db_get_by_key(&db, oq_config_str(cfg, "tenant"), key, &call, &err)
                 : oq_producer_db_get(&db, oq_config_positional(cfg, 0), &call, &err);
    if (rc == OQ_ENOTFOUND) {
        fprintf(stderr, "onceq get: not found\n");
        ret = OQ_EXIT_NOTFOUND;
        goto out;
    }
    if (rc) {
        fprintf(stderr, "onceq get: %s\n", err.msg);
        goto out;
    }
    json_t *j = oq_call_to_json(&call);
    char *text = j ? oq_json_dumps(j, JSON_INDENT(2)) : NULL;
    json_decref(j);
    if (!text) goto out;
    printf("%s\n", text);
    free(text);
    ret = OQ_EXIT_OK;
out:
    oq_call_clear(&call);
    oq_dbh_close(&db);
    oq_config_destroy(cfg);
    return ret;
}
