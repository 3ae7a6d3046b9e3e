/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for the JSON Schema subset (common/jschema.c).
 *
 * Input: a schema and an instance, two JSON texts separated by the first NUL byte (no NUL: the
 * input is the schema and validated against itself). Every schema either compiles or is
 * refused with OQ_EINVAL and an "at ..." message; a compiled one validates any instance to 0
 * or OQ_EINVAL, twice the same way, in bounded time (the step and depth limits), and a
 * violation's pointer is "" or starts with '/', and pointer, keyword and reason are valid
 * UTF-8 (the HTTP API puts them in JSON). Any violation aborts, which libFuzzer reports.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "oq_jschema.h"
#include "oq_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void utf8_ok(const char *s)
{
    json_t *j = json_string(s); /* NULL when not UTF-8 */
    if (!j) abort();
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    const char *nul = memchr(p, 0, size);
    size_t slen = nul ? (size_t)(nul - p) : size;
    json_t *schema = NULL, *inst = NULL;
    if (oq_json_parse(p, slen, 64, &schema, NULL) != 0) return 0;
    if (nul) {
        if (oq_json_parse(nul + 1, size - slen - 1, 64, &inst, NULL) != 0) {
            json_decref(schema);
            return 0;
        }
    } else {
        inst = json_incref(schema);
    }
    oq_jschema_t *s = NULL;
    oq_error_t err = {0};
    int rc = oq_jschema_compile(schema, &s, &err);
    if (rc != 0) {
        if (rc != OQ_EINVAL || s || err.msg[0] == 0) abort();
        utf8_ok(err.msg);
    } else {
        oq_jschema_violation_t v1, v2;
        int r1 = oq_jschema_validate(s, inst, &v1), r2 = oq_jschema_validate(s, inst, &v2);
        if (r1 != r2 || (r1 != 0 && r1 != OQ_EINVAL)) abort();
        if (r1) {
            if (v1.pointer[0] && v1.pointer[0] != '/') abort();
            if (strcmp(v1.pointer, v2.pointer) || strcmp(v1.keyword, v2.keyword)) abort();
            utf8_ok(v1.pointer);
            utf8_ok(v1.keyword);
            utf8_ok(v1.reason);
        }
        oq_jschema_destroy(s);
    }
    json_decref(schema);
    json_decref(inst);
    return 0;
}
