/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq review list|show|resolve`: the operator's workflow for executions no machine could
 * decide (NEEDS_REVIEW: an outside call whose answer was lost, at a downstream with neither
 * idempotency keys nor a lookup, or whose lookup kept failing).
 *
 *   onceq review list    [--db effects.db] [--json] [--limit N]
 *   onceq review show    <call_id> [--db effects.db] [--producer-db calls.db] [--json]
 *   onceq review resolve <call_id> --as committed|failed|retry --fence N [--ref DOWNSTREAM_ID]
 *                        --note TEXT [--by NAME] [--db effects.db]
 *
 * The rules live in the consumer library (oq_review_*, consumer/review.c); this file parses,
 * prints, and maps errors to exit codes: 0 ok, 2 bad usage or a call that is not in review
 * (nothing written), 4 no such call, 9 the review moved (--fence is not the episode's any
 * more: nothing written), 1 anything else. `list --json` prints what GET /v1/review answers,
 * {"review": [...], "count": N}. `show` merges the timelines of both
 * databases by time when --producer-db is given, each row marked with where it comes from.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmds.h"
#include "oq_consumer.h"
#include "oq_db.h"
#include "oq_dbh.h"
#include "oq_producer.h"
#include "oq_util.h"
#include "oq_json.h"
#include "oq_tasks.h"

static const oq_setting_t review_settings[] = {
    {"db", OQ_SET_STRING, "effects.db", 1, 4096, NULL,
     "consumer database: a file (SQLite) or a postgres:// URI / libpq keyword string"},
    {"producer-db", OQ_SET_STRING, NULL, 1, 4096, NULL,
     "show: the producer database (a file, or a postgres:// URI / libpq keyword string), to "
     "merge its timeline of the call; a task (t_...): its database (default calls.db)"},
    {"json", OQ_SET_BOOL, "false", 0, -1, NULL, "print JSON"},
    {"limit", OQ_SET_INT, "1000", 1, 10000, NULL, "list: at most this many"},
    {"as", OQ_SET_ENUM, NULL, 0, -1,
     "committed|failed|retry|approve|reject|compensated|succeeded|retry-compensation",
     "resolve: the decision (a call: committed|failed|retry; a task awaiting approval: "
     "approve|reject; a task in needs_review: compensated|succeeded|retry-compensation)"},
    {"ref", OQ_SET_STRING, NULL, 1, 255, NULL,
     "resolve --as committed: the downstream's id of what it did"},
    {"note", OQ_SET_STRING, NULL, 1, 1000, NULL, "resolve: why (required, audited)"},
    {"by", OQ_SET_STRING, NULL, 1, 100, NULL, "resolve: who decides (default $USER)"},
    {"fence", OQ_SET_INT, NULL, 0, INT64_MAX, NULL,
     "resolve: the review episode decided on (the FENCE that list/show print; required)"},
};

/* The review moved: the call left review and came back since the decision was made. */
#define EXIT_REVIEW_MOVED 9

static const char review_usage[] =
    "usage: onceq review list    [--db effects.db] [--json] [--limit N]\n"
    "       onceq review show    <call_id> [--db effects.db] [--producer-db calls.db] [--json]\n"
    "       onceq review resolve <call_id> --as committed|failed|retry --fence N\n"
    "                            [--ref DOWNSTREAM_ID] --note TEXT [--by NAME] [--db effects.db]\n"
    "       onceq review show    <task_id> [--producer-db calls.db] [--db effects.db] [--json]\n"
    "       onceq review resolve <task_id> --as approve|reject|compensated|succeeded|\n"
    "                            retry-compensation --fence N --note TEXT [--by NAME]\n"
    "                            [--producer-db calls.db]\n"
    "Exit codes: 0 ok, 2 bad usage or not in review (nothing written), 4 no such call,\n"
    "9 review moved (the call left review and came back: --fence is stale, nothing written).";

static void print_json(json_t *v)
{
    char *t = oq_json_dumps(v, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (t) puts(t);
    free(t);
}

static void age_text(double s, char out[32])
{
    if (s < 120)
        snprintf(out, 32, "%.0fs", s);
    else if (s < 7200)
        snprintf(out, 32, "%.0fm", s / 60);
    else if (s < 172800)
        snprintf(out, 32, "%.1fh", s / 3600);
    else
        snprintf(out, 32, "%.1fd", s / 86400);
}

static int do_list(const oq_config_t *cfg)
{
    oq_error_t err = {0};
    json_t *a = NULL;
    int rc = oq_review_list(oq_config_str(cfg, "db"), (int)oq_config_int(cfg, "limit"), &a, &err);
    if (rc) {
        fprintf(stderr, "onceq review list: %s\n", err.msg);
        return oq_cli_exit_for(rc);
    }
    if (oq_config_int(cfg, "json")) {
        json_t *o = json_pack("{s:O, s:I}", "review", a, "count", (json_int_t)json_array_size(a));
        if (o) print_json(o);
        json_decref(o);
    } else if (json_array_size(a) == 0) {
        printf("nothing to review\n");
    } else {
        size_t i;
        json_t *r;
        printf("%-7s %-34s %-6s %-20s %-20s %s\n", "AGE", "CALL_ID", "FENCE", "TOOL", "CODE",
               "WHY");
        json_array_foreach(a, i, r)
        {
            char age[32];
            age_text(json_real_value(json_object_get(r, "age_s")), age);
            const char *tool = json_string_value(json_object_get(r, "tool"));
            const char *code = json_string_value(json_object_get(r, "code"));
            const char *why = json_string_value(json_object_get(r, "why"));
            printf("%-7s %-34s %-6lld %-20s %-20s %s\n", age,
                   json_string_value(json_object_get(r, "call_id")),
                   (long long)json_integer_value(json_object_get(r, "fence")), tool ? tool : "-",
                   code ? code : "-", why ? why : "-");
        }
        printf("%zu call(s) waiting for a decision: onceq review show <call_id>, then onceq "
               "review resolve <call_id> --fence FENCE --as committed|failed|retry --note ...\n",
               json_array_size(a));
    }
    json_decref(a);
    return OQ_EXIT_OK;
}

/* One timeline row, from either database. */
typedef struct {
    int64_t ts;
    const char *from, *event, *detail, *worker;
} tl_row_t;

static int tl_cmp(const void *a, const void *b)
{
    const tl_row_t *x = a, *y = b;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return 0;
}

static int do_show(const oq_config_t *cfg, const char *call_id)
{
    oq_error_t err = {0};
    json_t *o = NULL;
    oq_dbh_t pdb = {0};
    oq_call_t pc = {0};
    oq_audit_row_t *prow = NULL;
    size_t pn = 0;
    tl_row_t *rows = NULL;
    int ret = OQ_EXIT_FAIL, have_call = 0;
    int rc = oq_review_show(oq_config_str(cfg, "db"), call_id, &o, &err);
    if (rc) {
        fprintf(stderr, "onceq review show: %s\n", err.msg);
        return oq_cli_exit_for(rc);
    }
    const char *pdb_path = oq_config_str(cfg, "producer-db");
    if (pdb_path) {
        oq_db_opts_t po = {NULL, 0, 1};
        if (oq_dbh_open(pdb_path, &po, &pdb, &err) != 0) {
            fprintf(stderr, "onceq review show: %s: %s\n", oq_dbh_label(pdb_path), err.msg);
            if (err.code == OQ_EINVAL) ret = OQ_EXIT_USAGE;
            goto out;
        }
        rc = oq_producer_db_get(&pdb, call_id, &pc, &err);
        if (rc == 0) {
            have_call = 1;
            if (oq_producer_db_audit(&pdb, call_id, &prow, &pn, &err) != 0) {
                fprintf(stderr, "onceq review show: %s\n", err.msg);
                goto out;
            }
        } else if (rc != OQ_ENOTFOUND) {
            fprintf(stderr, "onceq review show: %s\n", err.msg);
            goto out;
        }
    }
    if (oq_config_int(cfg, "json")) {
        if (have_call) {
            json_t *p = json_pack("{s:s, s:I, s:s*, s:s*, s:[]}", "state", pc.state, "attempt",
                                  (json_int_t)pc.attempt, "result", pc.result, "error", pc.error,
                                  "timeline");
            for (size_t i = 0; p && i < pn; i++)
                json_array_append_new(json_object_get(p, "timeline"),
                                      json_pack("{s:I, s:s, s:s*}", "ts", (json_int_t)prow[i].ts,
                                                "event", prow[i].event, "detail", prow[i].detail));
            json_object_set_new(o, "producer", p);
        }
        print_json(o);
        ret = OQ_EXIT_OK;
        goto out;
    }
    json_t *x = json_object_get(o, "execution"), *e = json_object_get(o, "effect");
    json_t *tl = json_object_get(o, "timeline");
    char *args = oq_json_dumps(json_object_get(x, "args"), JSON_COMPACT);
    char *error = oq_json_dumps(json_object_get(x, "error"), JSON_COMPACT | JSON_ENCODE_ANY);
    printf("call      %s\ntool      %s\nargs      %s\n", call_id,
           json_string_value(json_object_get(x, "tool")), args ? args : "?");
    printf("consumer  %s (attempt %lld, tries %lld, fence %lld)\n",
           json_string_value(json_object_get(x, "state")),
           (long long)json_integer_value(json_object_get(x, "attempt")),
           (long long)json_integer_value(json_object_get(x, "tries")),
           (long long)json_integer_value(json_object_get(x, "fence")));
    if (strcmp(json_string_value(json_object_get(x, "state")), "NEEDS_REVIEW") == 0)
        printf("resolve   onceq review resolve %s --fence %lld --as committed|failed|retry "
               "--note ...\n",
               call_id, (long long)json_integer_value(json_object_get(x, "fence")));
    if (json_string_value(json_object_get(x, "effect_id")))
        printf("effect id %s (the idempotency key, when the tool sends one)\n",
               json_string_value(json_object_get(x, "effect_id")));
    if (!json_is_null(json_object_get(x, "error"))) printf("why       %s\n", error ? error : "");
    if (json_is_object(e))
        printf("effect    %s (downstream id %s)\n",
               json_string_value(json_object_get(e, "effect_id")),
               json_string_value(json_object_get(e, "downstream_id"))
                   ? json_string_value(json_object_get(e, "downstream_id"))
                   : "-");
    if (have_call)
        printf("producer  %s (attempt %lld)\n", pc.state, (long long)pc.attempt);
    else if (pdb_path)
        printf("producer  (no such call in %s)\n", oq_dbh_label(pdb_path));
    free(args);
    free(error);

    size_t nc = json_array_size(tl), n = 0;
    rows = calloc(nc + pn + 1, sizeof(*rows));
    if (!rows) goto out;
    if (have_call) rows[n++] = (tl_row_t){pc.created_at, "producer", "submitted", NULL, NULL};
    for (size_t i = 0; i < pn; i++)
        rows[n++] = (tl_row_t){prow[i].ts, "producer", prow[i].event, prow[i].detail, NULL};
    for (size_t i = 0; i < nc; i++) {
        json_t *r = json_array_get(tl, i);
        rows[n++] = (tl_row_t){json_integer_value(json_object_get(r, "ts")), "consumer",
                               json_string_value(json_object_get(r, "event")),
                               json_string_value(json_object_get(r, "detail")),
                               json_string_value(json_object_get(r, "worker"))};
    }
    qsort(rows, n, sizeof(*rows), tl_cmp); /* (stable enough: each source is in order) */
    printf("\ntimeline\n");
    for (size_t i = 0; i < n; i++) {
        char ts[32];
        oq_time_format(rows[i].ts, ts);
        printf("  %s  %-8s  %-16s %s%s%s%s\n", ts, rows[i].from, rows[i].event,
               rows[i].detail ? rows[i].detail : "", rows[i].worker ? " [" : "",
               rows[i].worker ? rows[i].worker : "", rows[i].worker ? "]" : "");
    }
    ret = OQ_EXIT_OK;
out:
    free(rows);
    oq_audit_free(prow, pn);
    oq_call_clear(&pc);
    oq_dbh_close(&pdb);
    json_decref(o);
    return ret;
}

static int do_resolve(const oq_config_t *cfg, const char *call_id)
{
    oq_error_t err = {0};
    json_t *o = NULL;
    const char *by = oq_config_str(cfg, "by");
    if (!by) by = getenv("USER");
    if (!oq_config_str(cfg, "as") || !oq_config_str(cfg, "note") ||
        !oq_config_is_set(cfg, "fence")) {
        fprintf(stderr,
                "onceq review resolve: --as, --fence and --note are required (the fence: "
                "onceq review list or show)\n%s\n",
                review_usage);
        return OQ_EXIT_USAGE;
    }
    int rc = oq_review_resolve(oq_config_str(cfg, "db"), call_id, oq_config_str(cfg, "as"),
                               oq_config_str(cfg, "ref"), oq_config_str(cfg, "note"), by,
                               oq_config_int(cfg, "fence"), &o, &err);
    if (rc) {
        fprintf(stderr, "onceq review resolve: %s\n", err.msg);
        return rc == OQ_EFENCED ? EXIT_REVIEW_MOVED : oq_cli_exit_for(rc);
    }
    print_json(o);
    json_decref(o);
    return OQ_EXIT_OK;
}

/* --- tasks (t_...): their rows are in calls.db (producer/tasks.c has the rules) ------------- */

static const char *task_db(const oq_config_t *cfg)
{
    const char *p = oq_config_str(cfg, "producer-db");
    return p ? p : "calls.db";
}

/* The producer's database of the tasks: an SQLite calls.db (migrated first when written) or
 * PostgreSQL (oq_dbh_open: schema onceq as the daemons migrated it). */
static int open_task_db(const oq_config_t *cfg, int readonly, oq_dbh_t *h)
{
    oq_error_t err = {0};
    oq_db_opts_t o = {NULL, 0, readonly};
    const char *path = task_db(cfg);
    if (oq_dbh_open(path, &o, h, &err) != 0 ||
        (!readonly && h->db && oq_db_migrate(h->db, oq_migrations_producer, &err) != 0)) {
        fprintf(stderr, "onceq review: %s: %s\n", oq_dbh_label(path), err.msg);
        oq_dbh_close(h);
        return err.code == OQ_EINVAL ? OQ_EXIT_USAGE : OQ_EXIT_FAIL;
    }
    return OQ_EXIT_OK;
}

/* The task, its fence and what may be decided, its operators' decisions, then the timeline of
 * every step and compensation across both databases (onceq inspect on the task). */
static int do_show_task(const oq_config_t *cfg, const char *task_id)
{
    oq_dbh_t db = {0};
    json_t *t = NULL;
    oq_audit_row_t *rows = NULL;
    size_t n = 0;
    oq_error_t err = {0};
    int ret = open_task_db(cfg, 1, &db);
    if (ret) return ret;
    int rc = oq_producer_db_task_get(&db, task_id, NULL, NULL, &t, &err);
    if (!rc) rc = oq_producer_db_audit(&db, task_id, &rows, &n, &err);
    if (rc) {
        fprintf(stderr, "onceq review show: %s: %s\n", task_id, err.msg);
        ret = rc == OQ_ENOTFOUND ? OQ_EXIT_NOTFOUND : OQ_EXIT_FAIL;
        goto out;
    }
    const char *st = json_string_value(json_object_get(t, "status"));
    long long fence = (long long)json_integer_value(json_object_get(t, "fence"));
    if (oq_config_int(cfg, "json")) {
        json_t *dec = json_array();
        for (size_t i = 0; dec && i < n; i++)
            json_array_append_new(
                dec, json_pack("{s:I,s:s,s:o}", "ts", (json_int_t)rows[i].ts, "event",
                               rows[i].event, "detail",
                               rows[i].detail ? json_loads(rows[i].detail, JSON_DECODE_ANY, NULL)
                                              : json_null()));
        json_object_set_new(t, "decisions", dec ? dec : json_array());
        print_json(t);
        ret = OQ_EXIT_OK;
        goto out;
    }
    const char *why = json_string_value(json_object_get(t, "reason"));
    printf("task      %s\nstatus    %s (fence %lld)\n", task_id, st, fence);
    if (why) printf("why       %s\n", why);
    if (strcmp(st, "awaiting_approval") == 0)
        printf("resolve   onceq review resolve %s --fence %lld --as approve|reject --note ...\n",
               task_id, fence);
    else if (strcmp(st, "needs_review") == 0)
        printf("resolve   onceq review resolve %s --fence %lld --as "
               "compensated|succeeded|retry-compensation --note ...\n",
               task_id, fence);
    for (size_t i = 0; i < n; i++) {
        char ts[32];
        oq_time_format(rows[i].ts, ts);
        printf("decision  %s  %s %s\n", ts, rows[i].event, rows[i].detail ? rows[i].detail : "");
    }
    printf("\n");
    fflush(stdout);
    const char *cdb = oq_config_str(cfg, "db");
    if (cdb && access(cdb, F_OK) != 0) cdb = NULL; /* the consumer's side, when at hand */
    ret = oq__tasks_inspect(task_db(cfg), cdb, task_id, 0);
out:
    oq_audit_free(rows, n);
    json_decref(t);
    oq_dbh_close(&db);
    return ret;
}

static int do_resolve_task(const oq_config_t *cfg, const char *task_id)
{
    const char *by = oq_config_str(cfg, "by");
    if (!by) by = getenv("USER");
    if (!by) by = "operator";
    const char *as = oq_config_str(cfg, "as");
    if (!as || !oq_config_str(cfg, "note") || !oq_config_is_set(cfg, "fence") ||
        oq_config_str(cfg, "ref")) {
        fprintf(stderr,
                "onceq review resolve: a task takes --as, --fence and --note (no --ref; the fence: "
                "onceq review show %s)\n%s\n",
                task_id, review_usage);
        return OQ_EXIT_USAGE;
    }
    oq_dbh_t db = {0};
    int ret = open_task_db(cfg, 0, &db);
    if (ret) return ret;
    oq_error_t err = {0};
    json_t *t = NULL;
    const char *code = NULL;
    int rc = oq_producer_db_task_review(&db, task_id, oq_config_int(cfg, "fence"), as, by,
                                        oq_config_str(cfg, "note"), &t, &code, &err);
    oq_dbh_close(&db);
    if (rc) {
        fprintf(stderr, "onceq review resolve: %s (%s)\n", err.msg, code ? code : "error");
        return rc == OQ_ECONFLICT ? EXIT_REVIEW_MOVED : oq_cli_exit_for(rc);
    }
    print_json(t);
    json_decref(t);
    return OQ_EXIT_OK;
}

int oq__cmd_review(int argc, char **argv)
{
    int ret;
    if (argc < 2 || argv[1][0] == '-') {
        int help = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
        if (!help) {
            fprintf(stderr, "%s\n", review_usage);
            return OQ_EXIT_USAGE;
        }
        /* the usage and the settings table, as every command prints them */
        oq_config_t *hcfg =
            oq_config_new(review_settings, sizeof review_settings / sizeof review_settings[0]);
        if (!hcfg) return OQ_EXIT_FAIL;
        char *hargv[] = {argv[0], argv[1], NULL};
        ret = oq_cli_parse(hcfg, "onceq", review_usage, 2, hargv);
        oq_config_destroy(hcfg);
        return ret < 0 ? OQ_EXIT_OK : ret;
    }
    const char *action = argv[1];
    int list = strcmp(action, "list") == 0, show = strcmp(action, "show") == 0;
    int resolve = strcmp(action, "resolve") == 0;
    if (!list && !show && !resolve) {
        fprintf(stderr, "onceq review: unknown action '%s'\n%s\n", action, review_usage);
        return OQ_EXIT_USAGE;
    }
    oq_config_t *cfg =
        oq_config_new(review_settings, sizeof review_settings / sizeof review_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    int prc = oq_cli_parse(cfg, "onceq review", review_usage, argc - 1, argv + 1);
    if (prc >= 0) {
        ret = prc;
        goto out;
    }
    int npos = oq_config_npositional(cfg);
    if ((list && npos != 0) || (!list && npos != 1)) {
        fprintf(stderr, "onceq review %s: %s\n%s\n", action,
                list ? "takes no call_id" : "takes one call_id", review_usage);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (!resolve && (oq_config_is_set(cfg, "as") || oq_config_is_set(cfg, "note") ||
                     oq_config_is_set(cfg, "ref") || oq_config_is_set(cfg, "fence"))) {
        fprintf(stderr, "onceq review %s: --as, --fence, --ref and --note go with resolve\n",
                action);
        ret = OQ_EXIT_USAGE;
        goto out;
    }
    if (!list && strncmp(oq_config_positional(cfg, 0), "t_", 2) == 0) { /* a task */
        ret = show ? do_show_task(cfg, oq_config_positional(cfg, 0))
                   : do_resolve_task(cfg, oq_config_positional(cfg, 0));
        goto out;
    }
    if ((ret = oq__cmd_consumer_db_refused("onceq review", oq_config_str(cfg, "db"))) != 0)
        goto out;
    if (list)
        ret = do_list(cfg);
    else if (show)
        ret = do_show(cfg, oq_config_positional(cfg, 0));
    else
        ret = do_resolve(cfg, oq_config_positional(cfg, 0));
out:
    oq_config_destroy(cfg);
    return ret;
}
