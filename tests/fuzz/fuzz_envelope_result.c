/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for the fast decoders, the producer's of results (oq_envelope_decode_result)
 * and the consumer's of calls (oq_envelope_decode_call), against the one general decoder
 * (oq_envelope_decode): for every input each gives the same return code, error code and
 * message, and on success the same fields, the same calls.result text (the scanner's kept text,
 * or the tree dumped as decide.c dumps it) and the same args text (the kept text, or the tree
 * dumped as the consumer's executions row stores it). The scanner is hand-written
 * for speed over a subset of JSON (common/envelope.c says why); this is what keeps it honest
 * outside the cases test_envelope lists. Any difference aborts, which libFuzzer reports.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "oq_envelope.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a && b && strcmp(a, b) == 0);
}

static int same_json(const json_t *a, const json_t *b)
{
    return (a == NULL && b == NULL) || (a && b && json_equal(a, b));
}

static void check(const char *buf, size_t size, int call)
{
    oq_envelope_t a, b;
    oq_error_t ea = {0}, eb = {0};
    int ra = oq_envelope_decode(buf, size, &a, &ea);
    int rb = call ? oq_envelope_decode_call(buf, size, &b, &eb)
                  : oq_envelope_decode_result(buf, size, &b, &eb);
    if (ra != rb || ea.code != eb.code || strcmp(ea.msg, eb.msg) != 0) abort();
    if (ra != 0) {
        if (b.tenant || b.result_json || b.result || b.status || b.args || b.args_json)
            abort(); /* left cleared */
        return;
    }
    if (a.v != b.v || a.kind != b.kind || strcmp(a.message_id, b.message_id) != 0 ||
        strcmp(a.call_id, b.call_id) != 0 || !same_str(a.tenant, b.tenant) ||
        !same_str(a.idem_key, b.idem_key) || strcmp(a.fingerprint, b.fingerprint) != 0 ||
        !same_str(a.tool, b.tool) || a.attempt != b.attempt || a.created_at != b.created_at ||
        !same_str(a.status, b.status) || !same_str(a.effect_id, b.effect_id) ||
        !same_json(a.args, b.args) || !same_json(a.error, b.error))
        abort();
    if (b.result_json && b.result) abort(); /* the fast path keeps text only */
    char *ta = a.result ? json_dumps(a.result, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    char *tb = b.result_json ? strdup(b.result_json)
               : b.result    ? json_dumps(b.result, JSON_COMPACT | JSON_SORT_KEYS)
                             : NULL;
    if (!same_str(ta, tb)) abort();
    free(ta);
    free(tb);
    if (call ? b.result_json != NULL : b.args_json != NULL) abort();
    if (b.args_json) { /* and the tree beside it (same_json above) */
        char *t = a.args ? json_dumps(a.args, JSON_COMPACT) : NULL;
        if (!same_str(t, b.args_json)) abort();
        free(t);
    }
    oq_envelope_clear(&a);
    oq_envelope_clear(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check((const char *)data, size, 0);
    check((const char *)data, size, 1);
    return 0;
}
