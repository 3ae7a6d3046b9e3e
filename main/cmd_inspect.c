/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq inspect <call_id>`: one call's story. From the producer's database (--db): the call's
 * identity and state, "submitted" (created_at; creation is not an audit row) and every audit
 * row (retry resets, running, terminal states, redrives, results that were not applied). With
 * --consumer-db also the consumer's side (oq_review_show): the execution (state, attempt, tries
 * in this attempt, fence, lease owner and expiry), its effect, and every consumer audit row
 * with the worker and fence that wrote it. Both timelines are merged by time, each row marked
 * with where it comes from. --json prints {"call", "consumer" ({"execution", "effect"} or
 * null), "timeline": [{"ts", "from", "event", "detail", "worker", "attempt", "fence"}]}.
 * --db is an SQLite file or PostgreSQL; the document is oq_inspect_call's on either.
 * Exit codes: 0 found, 4 not found in the producer's database, 1 a database unreadable.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "oq_console.h"
#include "oq_consumer.h"
#include "oq_dbh.h"
#include "oq_producer.h"
#include "oq_util.h"
#include "oq_json.h"

static const oq_setting_t inspect_settings[] = {
    {"db", OQ_SET_STRING, "calls.db", 1, 4096, NULL,
     "producer database: a file (SQLite) or a postgres:// URI / libpq keyword string"},
    {"consumer-db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "consumer database (effects.db, or a postgres:// URI / libpq keyword string): join its "
     "execution, effect and audit"},
    {"json", OQ_SET_BOOL, "false", 0, -1, NULL, "print one JSON document"},
};

static const char inspect_usage[] =
    "usage: onceq inspect [--db calls.db] [--consumer-db effects.db] [--json] <call_id|task_id>\n"
    "Exit codes: 0 found, 4 not found.";

int oq__cmd_inspect(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    oq_dbh_t db = {0};
    oq_call_t c = {0};
    json_t *doc = NULL;
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
    const char *id = oq_config_positional(cfg, 0), *cdb = oq_config_str(cfg, "consumer-db");
    if ((ret = oq__cmd_consumer_db_refused("onceq inspect", cdb)) != 0) goto out;
    if (strncmp(id, "t_", 2) == 0) { /* a task: every step and compensation (cmd_tasks.c) */
        ret = oq__tasks_inspect(oq_config_str(cfg, "db"), cdb, id, (int)oq_config_int(cfg, "json"));
        goto out;
    }
    ret = OQ_EXIT_FAIL;
    oq_db_opts_t o = {NULL, 0, 1};
    if (oq_dbh_open(oq_config_str(cfg, "db"), &o, &db, &err) != 0) {
        fprintf(stderr, "onceq inspect: %s: %s\n", oq_dbh_label(oq_config_str(cfg, "db")), err.msg);
        ret = err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    int rc = oq_producer_db_get(&db, id, &c, &err);
    if (rc == OQ_ENOTFOUND) {
        fprintf(stderr, "onceq inspect: no call %s\n", id);
        ret = OQ_EXIT_NOTFOUND;
        goto out;
    }
    if (rc || (rc = oq_inspect_call(&db, cdb, id, &doc, &err)) != 0) {
        fprintf(stderr, "onceq inspect: %s\n", err.msg);
        goto out;
    }
    json_t *cons = json_object_get(doc, "consumer"), *tl = json_object_get(doc, "timeline");
    if (json_is_null(cons)) cons = NULL;
    if (oq_config_int(cfg, "json")) {
        char *text = oq_json_dumps(doc, JSON_INDENT(2));
        if (!text) goto out;
        printf("%s\n", text);
        free(text);
        ret = OQ_EXIT_OK;
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
    printf("expires   %s\n", ts);
    if (cdb && !cons) printf("consumer  (no execution of this call in %s)\n", oq_dbh_label(cdb));
    if (cons) {
        json_t *x = json_object_get(cons, "execution"), *e = json_object_get(cons, "effect");
        const char *owner = json_string_value(json_object_get(x, "lease_owner"));
        printf("consumer  %s (attempt %lld, tries %lld, fence %lld",
               json_string_value(json_object_get(x, "state")),
               (long long)json_integer_value(json_object_get(x, "attempt")),
               (long long)json_integer_value(json_object_get(x, "tries")),
               (long long)json_integer_value(json_object_get(x, "fence")));
        if (owner) {
            oq_time_format(json_integer_value(json_object_get(x, "lease_until")), ts);
            printf(", lease %s until %s", owner, ts);
        }
        printf(")\n");
        if (json_is_object(e))
            printf("effect    %s by %s%s%s\n", json_string_value(json_object_get(e, "effect_id")),
                   json_string_value(json_object_get(e, "worker"))
                       ? json_string_value(json_object_get(e, "worker"))
                       : "?",
                   json_string_value(json_object_get(e, "downstream_id")) ? ", downstream id " : "",
                   json_string_value(json_object_get(e, "downstream_id"))
                       ? json_string_value(json_object_get(e, "downstream_id"))
                       : "");
    }
    printf("\ntimeline\n");
    for (size_t i = 0; i < json_array_size(tl); i++) {
        json_t *r = json_array_get(tl, i);
        const char *worker = json_string_value(json_object_get(r, "worker"));
        const char *detail = json_string_value(json_object_get(r, "detail"));
        char meta[200] = "";
        oq_time_format(json_integer_value(json_object_get(r, "ts")), ts);
        if (worker)
            snprintf(meta, sizeof meta, " [%s attempt=%lld fence=%lld]", worker,
                     (long long)json_integer_value(json_object_get(r, "attempt")),
                     (long long)json_integer_value(json_object_get(r, "fence")));
        printf("  %s  %-8s  %-18s %s%s\n", ts, json_string_value(json_object_get(r, "from")),
               json_string_value(json_object_get(r, "event")), detail ? detail : "", meta);
    }
    ret = OQ_EXIT_OK;
out:
    json_decref(doc);
    oq_call_clear(&c);
    oq_dbh_close(&db);
    oq_config_destroy(cfg);
    return ret;
}
