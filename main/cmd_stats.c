/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq stats`: counts by status, distinct effects reported back, outbox backlog, result
 * inbox size, as one JSON object read from --db (the same numbers as GET /stats), then the
 * relay's status line of the same database, an SQLite file or PostgreSQL. With --json stdout is
 * exactly one JSON document: the same object with the relay's status under "relay"
 * (oq_relay_status_json). With --consumer-db (a file or a PostgreSQL setting) the object also
 * carries "calls": the per-call reconciliation figures read from the consumer's rows
 * (oq_consumer_calls_stats, the same object as the consumer's /stats), and "manual_recovery":
 * calls that went to review plus tasks that needed an operator, over all calls and tasks. "tasks"
 * (always): tasks by status, how compensations ended, steps run again, tasks that needed an
 * operator.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cmds.h"
#include "oq_consumer.h"
#include "oq_dbh.h"
#include "oq_producer.h"
#include "oq_relay.h"
#include "oq_json.h"

static const oq_setting_t stats_settings[] = {
    {"db", OQ_SET_STRING, "calls.db", 1, 4096, NULL,
     "producer database: a file (SQLite) or a postgres:// URI / libpq keyword string"},
    {"consumer-db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "consumer database (effects.db or a PostgreSQL setting): adds \"calls\", the per-call "
     "reconciliation figures"},
    {"json", OQ_SET_BOOL, "false", 0, -1, NULL,
     "print one JSON document (the relay status under \"relay\") instead of JSON + a line"},
};

static const char stats_usage[] =
    "usage: onceq stats [--db calls.db] [--consumer-db effects.db] [--json]";

int oq__cmd_stats(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    oq_dbh_t db = {0};
    json_t *s = NULL;
    oq_config_t *cfg =
        oq_config_new(stats_settings, sizeof stats_settings / sizeof stats_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq", stats_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    oq_db_opts_t o = {NULL, 0, 1};
    if (oq_dbh_open(oq_config_str(cfg, "db"), &o, &db, &err) != 0 ||
        oq_producer_db_stats(&db, &s, &err) != 0) {
        fprintf(stderr, "onceq stats: %s: %s\n", oq_dbh_label(oq_config_str(cfg, "db")), err.msg);
        ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    const char *cdb = oq_config_str(cfg, "consumer-db");
    if (cdb) {
        json_t *calls = NULL;
        if (oq_consumer_calls_stats(cdb, &calls, &err) != 0) {
            fprintf(stderr, "onceq stats: %s: %s\n", oq_dbh_label(cdb), err.msg);
            goto out;
        }
        /* calls and tasks that needed an operator / all calls and tasks (issue 19) */
        json_t *t = json_object_get(s, "tasks");
        json_int_t cr = json_integer_value(json_object_get(calls, "review"));
        json_int_t cn = json_integer_value(json_object_get(calls, "calls"));
        json_int_t to = json_integer_value(json_object_get(t, "needed_operator"));
        json_int_t tn = json_integer_value(json_object_get(t, "total"));
        json_object_set_new(
            s, "manual_recovery",
            json_pack("{s:I,s:I,s:I,s:o}", "calls_review", cr, "tasks_needed_operator", to, "all",
                      cn + tn, "rate",
                      cn + tn ? json_real((double)(cr + to) / (double)(cn + tn)) : json_null()));
        json_object_set_new(s, "calls", calls);
    }
    if (oq_config_int(cfg, "json")) {
        json_t *relay = NULL;
        if (oq_relay_db_status_json(&db, &relay, &err) != 0) {
            fprintf(stderr, "onceq stats: relay status: %s\n", err.msg);
            goto out;
        }
        json_object_set_new(s, "relay", relay);
    }
    char *text = oq_json_dumps(s, JSON_INDENT(2));
    if (!text) goto out;
    printf("%s\n", text);
    free(text);
    if (!oq_config_int(cfg, "json")) {
        /* The relay's view of the same database: pending rows, oldest age, lease holder. */
        char line[512];
        if (oq_relay_db_status_line(&db, line, sizeof line, &err) == 0)
            printf("%s\n", line);
        else
            fprintf(stderr, "onceq stats: relay status: %s\n", err.msg);
    }
    ret = OQ_EXIT_OK;
out:
    json_decref(s);
    oq_dbh_close(&db);
    oq_config_destroy(cfg);
    return ret;
}
