/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq submit`: one submit through the C API, written directly into --db (the same
 * transaction + group-commit writer as the daemon; it is safe to run while `onceq producer`
 * serves the same file: SQLite serialises the writers). Prints the call JSON on stdout and
 * the outcome (new / replay / retry_reset / conflict) on stderr. To submit over HTTP with
 * retries and polling, use `onceq call`.
 */
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "oq_json.h"
#include "oq_producer.h"
#include "oq_tasks.h"

static const oq_setting_t submit_settings[] = {
    {"db", OQ_SET_STRING, "calls.db", 1, 4096, NULL, "producer database file"},
    {"key", OQ_SET_STRING, NULL, 0, 255, NULL, "idempotency key (required)"},
    {"tool", OQ_SET_STRING, NULL, 0, 128, NULL, "tool name (required)"},
    {"args", OQ_SET_STRING, "{}", 0, 0, NULL, "tool arguments, a JSON object"},
    {"tenant", OQ_SET_STRING, "default", 1, 128, NULL, "tenant (key scope)"},
    {"client-id", OQ_SET_STRING, NULL, 0, 128, NULL, "optional client id"},
    {"seq", OQ_SET_INT, NULL, 0, INT64_MAX, NULL, "optional client sequence number"},
    {"callback-url", OQ_SET_STRING, NULL, 1, 2048, NULL,
     "webhook: POST the call here once it settles (http or https; the producer signs it with "
     "the tenant's secret)"},
    {"key-ttl", OQ_SET_DURATION, "24h", 1000, 365LL * 24 * 3600 * 1000, NULL,
     "retention of the key"},
    {"synchronous", OQ_SET_ENUM, "full", 0, 0, "full|normal|off", "SQLite synchronous level"},
    {"task", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "submit the task in this file ({\"steps\": [...]}) under --key instead of one call; "
     "prints the task JSON"},
};

/* --task: the task file under --key, through the producer's writer (the daemon's rules). */
static int submit_task(oq_producer_t *p, const char *file, const char *key, const char *tenant)
{
    json_error_t je;
    oq_error_t err = {0};
    json_t *body = json_load_file(file, JSON_REJECT_DUPLICATES, &je);
    if (!body) {
        fprintf(stderr, "onceq submit: --task %s: %s\n", file, je.text);
        return OQ_EXIT_USAGE;
    }
    if (tenant && json_is_object(body)) json_object_set_new(body, "tenant", json_string(tenant));
    oq_task_job_t *job = NULL;
    const char *code = NULL;
    int ret = OQ_EXIT_FAIL;
    int rc = oq_task_job_new(NULL, key, body, &job, &code, &err);
    json_decref(body);
    if (rc) {
        fprintf(stderr, "onceq submit: %s: %s\n", code ? code : "error", err.msg);
        return rc == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
    }
    rc = oq_producer_task_submit(p, job, &err);
    oq_task_outcome_t oc = 0;
    const json_t *t = NULL;
    oq_task_job_result(job, &oc, &t, NULL);
    if (rc == OQ_ECONFLICT) {
        fprintf(stderr, "onceq submit: idempotency_conflict: %s\n", err.msg);
        ret = OQ_EXIT_CONFLICT;
    } else if (rc) {
        fprintf(stderr, "onceq submit: %s\n", err.msg);
    } else {
        char *text = oq_json_dumps(t, JSON_INDENT(2));
        if (text) printf("%s\n", text);
        free(text);
        fprintf(stderr, "outcome=%s task_id=%s\n", oc == OQ_TASK_NEW ? "new" : "replay",
                json_string_value(json_object_get(t, "task_id")));
        ret = text ? OQ_EXIT_OK : OQ_EXIT_FAIL;
    }
    oq_task_job_destroy(job);
    return ret;
}

static const char submit_usage[] =
    "usage: onceq submit --db calls.db --key K --tool T [--args JSON] [--tenant X]\n"
    "                    [--callback-url URL]\n"
    "       onceq submit --db calls.db --key K --task FILE [--tenant X]\n"
    "Exit codes: 0 new/replay/retry_reset, 2 invalid input, 5 idempotency conflict.";

int oq__cmd_submit(int argc, char **argv)
{
    oq_error_t err = {0};
    int ret = OQ_EXIT_FAIL, prc;
    oq_producer_t *p = NULL;
    json_t *args = NULL, *out = NULL;
    oq_call_t call = {0};
    oq_config_t *cfg =
        oq_config_new(submit_settings, sizeof submit_settings / sizeof submit_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    if ((prc = oq_cli_parse(cfg, "onceq", submit_usage, argc, argv)) >= 0) {
        ret = prc;
        goto out;
    }
    const char *key = oq_config_str(cfg, "key"), *tool = oq_config_str(cfg, "tool");
    const char *a = oq_config_str(cfg, "args"), *task = oq_config_str(cfg, "task");
    if (!key || (!tool && !task)) {
        fprintf(stderr, "onceq submit: --key and --tool are required\n");
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (oq_json_parse(a, strlen(a), 0, &args, &err) != 0) {
        fprintf(stderr, "onceq submit: --args: %s\n", err.msg);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    oq_producer_opts_t po = {.synchronous = oq_config_str(cfg, "synchronous"),
                             .key_ttl_ms = oq_config_int(cfg, "key-ttl"),
                             .read_conns = 1,
                             .checkpoint_pages = -1};
    if (oq_producer_open(oq_config_str(cfg, "db"), &po, &p, &err) != 0) {
        fprintf(stderr, "onceq submit: %s: %s\n", oq_config_str(cfg, "db"), err.msg);
        goto out;
    }
    if (task) {
        ret = submit_task(p, task, key,
                          oq_config_is_set(cfg, "tenant") ? oq_config_str(cfg, "tenant") : NULL);
        goto out;
    }
    oq_submit_req_t req = {.tenant = oq_config_str(cfg, "tenant"),
                           .idem_key = key,
                           .tool = tool,
                           .args = args,
                           .client_id = oq_config_str(cfg, "client-id"),
                           .callback_url = oq_config_str(cfg, "callback-url")};
    if (oq_config_is_set(cfg, "seq")) {
        req.seq = oq_config_int(cfg, "seq");
        req.has_seq = 1;
    }
    oq_submit_outcome_t oc = 0;
    int rc = oq_producer_submit(p, &req, &call, &oc, &err);
    if (rc == OQ_ECONFLICT) {
        fprintf(stderr, "onceq submit: idempotency_conflict: %s\n", err.msg);
        ret = OQ_EXIT_CONFLICT;
        goto out;
    }
    if (rc) {
        fprintf(stderr, "onceq submit: %s\n", err.msg);
        ret = rc == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
        goto out;
    }
    out = oq_call_to_json(&call);
    char *text = out ? oq_json_dumps(out, JSON_INDENT(2)) : NULL;
    if (!text) goto out;
    printf("%s\n", text);
    free(text);
    fprintf(stderr, "outcome=%s call_id=%s\n", oq_submit_outcome_name(oc), call.call_id);
    ret = OQ_EXIT_OK;
out:
    oq_call_clear(&call);
    json_decref(out);
    json_decref(args);
    oq_producer_close(p);
    oq_config_destroy(cfg);
    return ret;
}
