/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_http_exec_cli: drives the HTTP tool executor (consumer/http_tools.h) from scripts.
 *
 *   oq_http_exec_cli --tools F --check
 *       parse the tools file; print "ok: N tools" or the error (exit 2)
 *   oq_http_exec_cli --tools F --tool NAME [--args JSON] [--effect-id ID] [--lookup]
 *       one call (or lookup); prints its outcome as one JSON line
 *   oq_http_exec_cli --tools F --tool NAME [--args JSON] --count N --inflight C [--prefix P]
 *       N calls with effect ids P-0 .. P-(N-1), keeping C in flight from this one thread (a
 *       callback submits the next call); prints a JSON summary: outcomes by class, the
 *       largest number in flight seen, calls/s and latency percentiles (submit to callback)
 *
 * Exit: 0 when every outcome was delivered (whatever its class), 1 on a runtime failure,
 * 2 on bad usage or a bad tools file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_tools.h"
#include "oq_json.h"
#include "oq_util.h"

typedef struct run {
    oq__http_exec_t *x;
    const oq__http_tool_t *tool;
    json_t *args;
    const char *prefix;
    int count, inflight, submitted, done, max_pending;
    int by_class[8];
    int64_t *lat_us;
    int single;
    json_t *last;
} run_t;

static void on_done(const oq__http_outcome_t *o, void *ctx);

static int submit_next(run_t *r)
{
    char id[160];
    oq_error_t err = {0};
    snprintf(id, sizeof id, "%s-%d", r->prefix, r->submitted);
    r->submitted++;
    if (oq__http_exec_submit(r->x, r->tool, r->args, id, on_done, r, &err) != 0) {
        fprintf(stderr, "submit: %s\n", err.msg);
        return -1;
    }
    int p = oq__http_exec_pending(r->x);
    if (p > r->max_pending) r->max_pending = p;
    return 0;
}

static void on_done(const oq__http_outcome_t *o, void *ctx)
{
    run_t *r = ctx;
    if (r->lat_us) r->lat_us[r->done] = o->elapsed_us;
    r->done++;
    if ((int)o->cls < 8) r->by_class[o->cls]++;
    if (r->single) {
        json_decref(r->last);
        r->last =
            json_pack("{s:s,s:s,s:s,s:i,s:i,s:b,s:I,s:s?,s:I,s:s?}", "class",
                      oq__http_class_name(o->cls), "code", o->code, "message", o->message, "status",
                      (int)o->status, "curl_code", o->curl_code, "sent", o->sent, "retry_after_ms",
                      (json_int_t)o->retry_after_ms, "object_id", o->object_id, "elapsed_us",
                      (json_int_t)o->elapsed_us, "effect_id", o->effect_id);
        return;
    }
    if (r->submitted < r->count) submit_next(r);
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *tools_path = NULL, *tool_name = NULL, *args_text = "{}", *effect_id = "eff-1";
    const char *prefix = "bench";
    int check = 0, lookup = 0, count = 0, inflight = 1, ret = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--check") == 0) {
            check = 1;
        } else if (strcmp(a, "--lookup") == 0) {
            lookup = 1;
        } else if (v && strcmp(a, "--tools") == 0) {
            tools_path = v, i++;
        } else if (v && strcmp(a, "--tool") == 0) {
            tool_name = v, i++;
        } else if (v && strcmp(a, "--args") == 0) {
            args_text = v, i++;
        } else if (v && strcmp(a, "--effect-id") == 0) {
            effect_id = v, i++;
        } else if (v && strcmp(a, "--prefix") == 0) {
            prefix = v, i++;
        } else if (v && strcmp(a, "--count") == 0) {
            count = atoi(v), i++;
        } else if (v && strcmp(a, "--inflight") == 0) {
            inflight = atoi(v), i++;
        } else {
            fprintf(stderr, "usage: oq_http_exec_cli --tools F [--check | --tool NAME [--args "
                            "JSON] [--effect-id ID] [--lookup] [--count N --inflight C "
                            "--prefix P]]\n");
            return 2;
        }
    }
    if (!tools_path || (!check && !tool_name) || inflight < 1 || count < 0) {
        fprintf(stderr, "oq_http_exec_cli: --tools and --tool are required (see the source)\n");
        return 2;
    }
    oq_error_t err = {0};
    oq__http_tools_t *tools = NULL;
    run_t r;
    memset(&r, 0, sizeof r);
    if (oq__http_tools_load(tools_path, &tools, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    if (check) {
        printf("ok: %zu tools\n", tools->n);
        oq__http_tools_destroy(tools);
        return 0;
    }
    r.tool = oq__http_tools_find(tools, tool_name);
    if (!r.tool) {
        fprintf(stderr, "no tool %s in %s\n", tool_name, tools_path);
        ret = 2;
        goto out;
    }
    if (oq_json_parse(args_text, strlen(args_text), 32, &r.args, &err) != 0) {
        fprintf(stderr, "--args: %s\n", err.msg);
        ret = 2;
        goto out;
    }
    oq__http_exec_opts_t xo = {inflight > 1024 ? inflight : 1024, 0, 0};
    if (!(r.x = oq__http_exec_new(&xo, &err))) {
        fprintf(stderr, "%s\n", err.msg);
        goto out;
    }
    if (count == 0) { /* one call or lookup */
        r.single = 1;
        r.count = 1;
        int rc = lookup ? oq__http_exec_lookup(r.x, r.tool, r.args, effect_id, on_done, &r, &err)
                        : oq__http_exec_submit(r.x, r.tool, r.args, effect_id, on_done, &r, &err);
        if (rc != 0) {
            fprintf(stderr, "submit: %s\n", err.msg);
            goto out;
        }
        while (r.done < 1)
            if (oq__http_exec_poll(r.x, 1000, &err) < 0) {
                fprintf(stderr, "poll: %s\n", err.msg);
                goto out;
            }
        char *text = json_dumps(r.last, JSON_COMPACT);
        printf("%s\n", text ? text : "null");
        free(text);
        ret = 0;
        goto out;
    }
    r.count = count;
    r.inflight = inflight;
    r.prefix = prefix;
    if (!(r.lat_us = calloc((size_t)count, sizeof *r.lat_us))) goto out;
    int64_t t0 = oq_mono_us();
    while (r.submitted < count && r.submitted < inflight)
        if (submit_next(&r) != 0) goto out;
    while (r.done < count)
        if (oq__http_exec_poll(r.x, 1000, &err) < 0) {
            fprintf(stderr, "poll: %s\n", err.msg);
            goto out;
        }
    double secs = (double)(oq_mono_us() - t0) / 1e6;
    qsort(r.lat_us, (size_t)count, sizeof *r.lat_us, cmp64);
#define PCT(p) ((double)r.lat_us[(size_t)((double)(count - 1) * (p))] / 1000.0)
    json_t *cls = json_object();
    for (int c = OQ__HTTP_SUCCESS; c <= OQ__HTTP_UNDECIDED; c++)
        if (r.by_class[c])
            json_object_set_new(cls, oq__http_class_name((oq__http_class_t)c),
                                json_integer(r.by_class[c]));
    json_t *s = json_pack("{s:i,s:i,s:o,s:i,s:f,s:f,s:f,s:f,s:f}", "count", count, "inflight",
                          inflight, "by_class", cls, "max_in_flight", r.max_pending, "seconds",
                          secs, "calls_per_s", (double)count / secs, "p50_ms", PCT(0.50), "p99_ms",
                          PCT(0.99), "max_ms", PCT(1.0));
    char *text = json_dumps(s, JSON_COMPACT);
    printf("%s\n", text ? text : "null");
    free(text);
    json_decref(s);
    ret = 0;
out:
    oq__http_exec_destroy(r.x);
    json_decref(r.args);
    json_decref(r.last);
    free(r.lat_us);
    oq__http_tools_destroy(tools);
    return ret;
}
