/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq tasks list|show`: the tasks of a producer database (issue 19), an SQLite file or
 * PostgreSQL (oq_dbh_open), read on a connection of their own (safe while the daemon runs). list:
 * newest first, one line each (task id, status, steps done / all, key, reason), or --json the array
 * of task objects. show: the task JSON of GET /v1/tasks/{id} (by id, or --key K [--tenant X]).
 *
 * oq__tasks_inspect is `onceq inspect` on a task id: one timeline of every step and every
 * compensation across both databases (oq_inspect_task, console/inspect.c: the document the
 * console's task page shows), printed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "oq_console.h"
#include "oq_db.h"
#include "oq_dbh.h"
#include "oq_json.h"
#include "oq_tasks.h"
#include "oq_util.h"

static const oq_setting_t tasks_settings[] = {
    {"db", OQ_SET_STRING, "calls.db", 1, 4096, NULL,
     "producer database: a file, or a PostgreSQL connection string (no password: a passfile)"},
    {"status", OQ_SET_STRING, NULL, 1, 32, NULL, "list: only tasks in this status"},
    {"limit", OQ_SET_INT, "50", 1, 10000, NULL, "list: at most this many (newest first)"},
    {"key", OQ_SET_STRING, NULL, 1, 255, NULL, "show: the task of this idempotency key"},
    {"tenant", OQ_SET_STRING, NULL, 1, 128, NULL, "show --key: its tenant (default: default)"},
    {"json", OQ_SET_BOOL, "false", 0, -1, NULL, "list: print the JSON array"},
};

static const char tasks_usage[] =
    "usage: onceq tasks list [--db calls.db] [--status S] [--limit N] [--json]\n"
    "       onceq tasks show [--db calls.db] <task_id> | --key K [--tenant X]\n"
    "Exit codes: 0 ok, 2 bad usage, 4 no such task.";

static int print_json(const json_t *v)
{
    char *text = oq_json_dumps(v, JSON_INDENT(2));
    if (!text) return OQ_EXIT_FAIL;
    printf("%s\n", text);
    free(text);
    return OQ_EXIT_OK;
}

static const char *jstr(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

int oq__cmd_tasks(int argc, char **argv)
{
    int ret = OQ_EXIT_FAIL;
    const char *action = argc >= 2 ? argv[1] : "";
    int list = strcmp(action, "list") == 0, show = strcmp(action, "show") == 0;
    oq_config_t *cfg =
        oq_config_new(tasks_settings, sizeof tasks_settings / sizeof tasks_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    if (!list && !show) {
        int help = strcmp(action, "--help") == 0 || strcmp(action, "-h") == 0;
        if (help) {
            char *hargv[] = {argv[0], argv[1], NULL};
            int prc = oq_cli_parse(cfg, "onceq", tasks_usage, 2, hargv);
            oq_config_destroy(cfg);
            return prc < 0 ? OQ_EXIT_OK : prc;
        }
        fprintf(stderr, "%s\n", tasks_usage);
        oq_config_destroy(cfg);
        return OQ_EXIT_USAGE;
    }
    oq_dbh_t h = {0};
    json_t *doc = NULL;
    oq_error_t err = {0};
    int prc = oq_cli_parse(cfg, "onceq tasks", tasks_usage, argc - 1, argv + 1);
    if (prc >= 0) {
        ret = prc;
        goto out;
    }
    int npos = oq_config_npositional(cfg);
    const char *key = oq_config_str(cfg, "key");
    if ((list && npos != 0) || (show && npos + (key ? 1 : 0) != 1)) {
        fprintf(stderr, "%s\n", tasks_usage);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    oq_db_opts_t o = {NULL, 0, 1};
    if (oq_dbh_open(oq_config_str(cfg, "db"), &o, &h, &err) != 0) {
        fprintf(stderr, "onceq tasks: %s: %s\n", oq_dbh_label(oq_config_str(cfg, "db")), err.msg);
        if (err.code == OQ_EINVAL) ret = OQ_EXIT_USAGE;
        goto out;
    }
    int rc;
    if (list) {
        oq_task_query_t q = {0};
        q.status = oq_config_str(cfg, "status");
        q.limit = (int)oq_config_int(cfg, "limit");
        json_t *page = NULL;
        rc = oq_producer_db_tasks(&h, &q, &page, &err);
        if (!rc) doc = json_incref(json_object_get(page, "tasks"));
        json_decref(page);
    } else {
        rc = oq_producer_db_task_get(&h, key ? NULL : oq_config_positional(cfg, 0),
                                     oq_config_str(cfg, "tenant"), key, &doc, &err);
    }
    if (rc == OQ_ENOTFOUND) {
        fprintf(stderr, "onceq tasks show: no such task\n");
        ret = OQ_EXIT_NOTFOUND;
        goto out;
    }
    if (rc) {
        fprintf(stderr, "onceq tasks: %s\n", err.msg);
        goto out;
    }
    if (show || oq_config_int(cfg, "json")) {
        ret = print_json(doc);
        goto out;
    }
    printf("%-34s  %-13s  %-5s  %-24s  %s\n", "TASK", "STATUS", "STEPS", "KEY", "REASON");
    for (size_t i = 0; i < json_array_size(doc); i++) {
        json_t *t = json_array_get(doc, i), *steps = json_object_get(t, "steps");
        size_t done = 0;
        for (size_t k = 0; k < json_array_size(steps); k++)
            done += strcmp(jstr(json_array_get(steps, k), "status"), "succeeded") == 0;
        printf("%-34s  %-13s  %2zu/%-2zu  %-24s  %s\n", jstr(t, "task_id"), jstr(t, "status"), done,
               json_array_size(steps), jstr(t, "idem_key"), jstr(t, "reason"));
    }
    ret = OQ_EXIT_OK;
out:
    json_decref(doc);
    oq_dbh_close(&h);
    oq_config_destroy(cfg);
    return ret;
}

int oq__tasks_inspect(const char *db_path, const char *cdb, const char *task_id, int as_json)
{
    oq_dbh_t h = {0};
    json_t *doc = NULL;
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL;
    oq_db_opts_t o = {NULL, 0, 1};
    if (oq_dbh_open(db_path, &o, &h, &err) != 0) {
        fprintf(stderr, "onceq inspect: %s: %s\n", oq_dbh_label(db_path), err.msg);
        goto out;
    }
    int rc = oq_inspect_task(&h, cdb, task_id, &doc, &err);
    if (rc == OQ_ENOTFOUND) {
        fprintf(stderr, "onceq inspect: no task %s\n", task_id);
        ret = OQ_EXIT_NOTFOUND;
        goto out;
    }
    if (rc) {
        fprintf(stderr, "onceq inspect: %s\n", err.msg);
        goto out;
    }
    if (as_json) {
        ret = print_json(doc);
        goto out;
    }
    json_t *task = json_object_get(doc, "task"), *tl = json_object_get(doc, "timeline");
    json_t *steps = json_object_get(task, "steps");
    printf("task      %s\ntenant    %s\nkey       %s\nstatus    %s\n", jstr(task, "task_id"),
           jstr(task, "tenant"), jstr(task, "idem_key"), jstr(task, "status"));
    if (*jstr(task, "reason")) printf("reason    %s\n", jstr(task, "reason"));
    for (size_t i = 0; i < json_array_size(steps); i++) {
        json_t *s = json_array_get(steps, i), *c = json_object_get(s, "compensation");
        printf("step %-4zu %-16s %-13s %s", i + 1, jstr(s, "name"), jstr(s, "status"),
               jstr(s, "call_id"));
        if (json_is_object(c))
            printf("  compensation %s (%lld attempts) %s", jstr(c, "status"),
                   (long long)json_integer_value(json_object_get(c, "attempts")),
                   jstr(c, "call_id"));
        printf("\n");
    }
    printf("\ntimeline\n");
    for (size_t i = 0; i < json_array_size(tl); i++) {
        json_t *r = json_array_get(tl, i);
        char ts[32];
        oq_time_format(json_integer_value(json_object_get(r, "ts")), ts);
        const char *detail = jstr(r, "detail");
        printf("  %s  %-12s %-10s %-8s  %-18s %s\n", ts, jstr(r, "step"), jstr(r, "role"),
               jstr(r, "from"), jstr(r, "event"), detail);
    }
    ret = OQ_EXIT_OK;
out:
    json_decref(doc);
    oq_dbh_close(&h);
    return ret;
}
