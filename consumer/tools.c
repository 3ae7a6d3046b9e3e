/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tools registry and the built-in tools.
 *
 * A tool is a plain function: it validates its own arguments (a bad argument is a final
 * failure with code "bad_args" and a message naming the field, never a crash), does its work
 * passing `effect_id` downstream as the idempotency key, and reports a result object and
 * whether an effect row must be recorded. The worker records the effect, the state and the
 * result event in one transaction; a tool never touches the database.
 *
 * Blocking tools (`blocks_ms` > 0 for their arguments) run on runner threads outside the write
 * transaction; they sleep in short slices and return OQ_TOOL_ABANDONED when the worker stops,
 * so a shutdown never waits for a ten-second sleep. The test knobs on charge (`delay_ms`,
 * `fail_times`) simulate a slow or flaky payment API with the same effect semantics.
 */
#include <stdio.h>
#include <string.h>

#include "oq_consumer.h"
#include "oq_util.h"

#define MAX_SLEEP_MS 10000

static int bad_args(oq_tool_out_t *out, const char *message)
{
    snprintf(out->code, sizeof(out->code), "bad_args");
    snprintf(out->message, sizeof(out->message), "%s", message);
    return OQ_TOOL_BADARGS;
}

/* Optional integer argument within [lo, hi]; absent -> *v unchanged. */
static int opt_int(const json_t *args, const char *name, int64_t lo, int64_t hi, int64_t *v)
{
    const json_t *f = json_object_get(args, name);
    if (!f) return 0;
    if (!json_is_integer(f)) return -1;
    json_int_t i = json_integer_value(f);
    if (i < lo || i > hi) return -1;
    *v = (int64_t)i;
    return 0;
}

/* Sleeps \p ms in 20 ms slices; returns -1 when asked to stop first. */
static int sleep_sliced(int64_t ms, volatile int *stop)
{
    int64_t end = oq_mono_us() + ms * 1000;
    for (;;) {
        if (stop && *stop) return -1;
        int64_t left = (end - oq_mono_us()) / 1000;
        if (left <= 0) return 0;
        oq_sleep_ms(left < 20 ? left : 20, NULL);
    }
}

/* charge {amount:int>0, currency?:string, delay_ms?:0..10000, fail_times?:0..100} */
static int charge_check(const json_t *args, int64_t *amount, int64_t *delay, int64_t *fails,
                        oq_tool_out_t *out)
{
    const json_t *a = json_object_get(args, "amount");
    if (!a) return bad_args(out, "missing field amount");
    if (!json_is_integer(a) || json_integer_value(a) <= 0)
        return bad_args(out, "field amount: expected integer > 0");
    *amount = (int64_t)json_integer_value(a);
    const json_t *c = json_object_get(args, "currency");
    if (c && !json_is_string(c)) return bad_args(out, "field currency: expected string");
    if (opt_int(args, "delay_ms", 0, MAX_SLEEP_MS, delay))
        return bad_args(out, "field delay_ms: expected integer 0..10000");
    if (opt_int(args, "fail_times", 0, 100, fails))
        return bad_args(out, "field fail_times: expected integer 0..100");
    return OQ_TOOL_OK;
}

static int charge(const oq_tool_call_t *call, oq_tool_out_t *out)
{
    int64_t amount = 0, delay = 0, fails = 0;
    int rc = charge_check(call->args, &amount, &delay, &fails, out);
    if (rc) return rc;
    if (delay > 0 && sleep_sliced(delay, call->stop)) return OQ_TOOL_ABANDONED;
    if (call->try_no <= fails) {
        snprintf(out->code, sizeof(out->code), "downstream_unavailable");
        snprintf(out->message, sizeof(out->message), "payment API unavailable (try %lld of %lld)",
                 (long long)call->try_no, (long long)fails + 1);
        out->retryable = 1;
        return OQ_TOOL_FAIL;
    }
    /* A real implementation calls the payment API here with Idempotency-Key = effect_id. */
    const json_t *cur = json_object_get(call->args, "currency");
    out->result = json_pack("{s:I, s:s, s:s}", "charged", (json_int_t)amount, "currency",
                            cur ? json_string_value(cur) : "EUR", "charge_id", call->effect_id);
    out->has_effect = 1;
    out->amount = amount;
    return OQ_TOOL_OK;
}

static int64_t charge_blocks(const json_t *args)
{
    int64_t d = 0;
    if (opt_int(args, "delay_ms", 0, MAX_SLEEP_MS, &d)) return 0;
    return d;
}

/* send_email {to:string with '@', subject:string} */
static int send_email(const oq_tool_call_t *call, oq_tool_out_t *out)
{
    const json_t *to = json_object_get(call->args, "to");
    const json_t *subject = json_object_get(call->args, "subject");
    if (!to) return bad_args(out, "missing field to");
    if (!json_is_string(to) || !strchr(json_string_value(to), '@') || json_string_length(to) > 254)
        return bad_args(out, "field to: expected an email address (<= 254 bytes)");
    if (!subject) return bad_args(out, "missing field subject");
    if (!json_is_string(subject) || json_string_length(subject) > 998)
        return bad_args(out, "field subject: expected string (<= 998 bytes)");
    /* A real implementation hands the mail to its provider with Message-ID = effect_id. */
    out->result =
        json_pack("{s:s, s:s}", "sent_to", json_string_value(to), "message_id", call->effect_id);
    out->has_effect = 1;
    snprintf(out->recipient, sizeof(out->recipient), "%s", json_string_value(to));
    return OQ_TOOL_OK;
}

/* sleep {ms:0..10000}: a long execution with no side effect. */
static int sleep_tool(const oq_tool_call_t *call, oq_tool_out_t *out)
{
    int64_t ms = -1;
    if (!json_object_get(call->args, "ms")) return bad_args(out, "missing field ms");
    if (opt_int(call->args, "ms", 0, MAX_SLEEP_MS, &ms))
        return bad_args(out, "field ms: expected integer 0..10000");
    if (sleep_sliced(ms, call->stop)) return OQ_TOOL_ABANDONED;
    out->result = json_pack("{s:I}", "slept_ms", (json_int_t)ms);
    return OQ_TOOL_OK;
}

static int64_t sleep_blocks(const json_t *args)
{
    int64_t ms = 0;
    if (opt_int(args, "ms", 0, MAX_SLEEP_MS, &ms)) return 0;
    return ms;
}

/* fail {retryable:bool}: always fails (retryable ones are retried, then fail final). */
static int fail_tool(const oq_tool_call_t *call, oq_tool_out_t *out)
{
    const json_t *r = json_object_get(call->args, "retryable");
    if (r && !json_is_boolean(r)) return bad_args(out, "field retryable: expected boolean");
    out->retryable = r && json_is_true(r);
    snprintf(out->code, sizeof(out->code), "tool_failed");
    snprintf(out->message, sizeof(out->message), "failed on request (%s)",
             out->retryable ? "retryable" : "not retryable");
    return OQ_TOOL_FAIL;
}

/* The registry: one line per tool. */
static const oq_tool_t registry[] = {
    {"charge", charge, charge_blocks},
    {"send_email", send_email, NULL},
    {"sleep", sleep_tool, sleep_blocks},
    {"fail", fail_tool, NULL},
};

const oq_tool_t *oq_tool_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof(registry) / sizeof(registry[0]); i++)
        if (strcmp(registry[i].name, name) == 0) return &registry[i];
    return NULL;
}

int64_t oq_tool_blocks(const oq_tool_t *tool, const json_t *args)
{
    if (!tool || !tool->blocks_ms || !json_is_object(args)) return 0;
    return tool->blocks_ms(args);
}

void oq_tool_out_clear(oq_tool_out_t *out)
{
    if (!out) return;
    json_decref(out->result);
    memset(out, 0, sizeof(*out));
}

int oq_tool_invoke(const oq_tool_t *tool, const oq_tool_call_t *call, oq_tool_out_t *out)
{
    if (!tool) {
        snprintf(out->code, sizeof(out->code), "unknown_tool");
        snprintf(out->message, sizeof(out->message), "no tool named '%.200s'",
                 call->tool ? call->tool : "");
        return OQ_TOOL_BADARGS;
    }
    if (!json_is_object(call->args)) return bad_args(out, "field args: expected object");
    OQ_CRASH_POINT("consumer.in_tool");
    int rc = tool->run(call, out);
    if (rc == OQ_TOOL_OK && out->result && !json_is_object(out->result)) {
        json_t *wrapped = json_pack("{s:o}", "value", out->result);
        out->result = wrapped;
    }
    if (rc != OQ_TOOL_OK && rc != OQ_TOOL_FAIL && rc != OQ_TOOL_BADARGS &&
        rc != OQ_TOOL_ABANDONED) {
        snprintf(out->code, sizeof(out->code), "tool_failed");
        snprintf(out->message, sizeof(out->message), "tool returned unknown code %d", rc);
        rc = OQ_TOOL_FAIL;
    }
    return rc;
}
