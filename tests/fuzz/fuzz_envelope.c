/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for the envelope decoder.
 *
 * Every input either decodes or is refused with a negative OQ_E* code and a message; a decoded
 * envelope must validate, encode, decode again to the same content, and encode to the same
 * bytes (the encoding is canonical); a tool_call encoded from its canonical args text
 * (oq_envelope_encode_canon, the producer's path), and a tool_result from its result's text
 * (the consumer's), must give those bytes too. Any violation
 * aborts, which libFuzzer reports.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "oq_envelope.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    oq_envelope_t e, e2;
    oq_error_t err = {0};
    int rc = oq_envelope_decode((const char *)data, size, &e, &err);
    if (rc != 0) {
        if (rc > 0 || err.code != rc || err.msg[0] == '\0') abort();
        if (e.tenant || e.args || e.tool) abort(); /* left cleared */
        return 0;
    }
    if (oq_envelope_validate(&e, NULL) != 0) abort();
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    if (oq_envelope_encode(&e, &a, &la, NULL) != 0) abort();
    if (oq_envelope_decode(a, la, &e2, NULL) != 0) abort();
    if (oq_envelope_encode(&e2, &b, &lb, NULL) != 0) abort();
    if (la != lb || memcmp(a, b, la) != 0) abort();
    if (e.kind != e2.kind || strcmp(e.call_id, e2.call_id) != 0 ||
        strcmp(e.message_id, e2.message_id) != 0 || strcmp(e.tenant, e2.tenant) != 0 ||
        strcmp(e.idem_key, e2.idem_key) != 0 || e.attempt != e2.attempt ||
        e.created_at != e2.created_at)
        abort();
    /* Same meaning, compared canonically: jansson keeps 1.0 as a real and 1 as an integer, so
     * json_equal() would call the canonical round trip of {"amount":1.0} a change. */
    if (e.kind == OQ_KIND_TOOL_CALL || e.result) {
        const json_t *m = e.kind == OQ_KIND_TOOL_CALL ? e.args : e.result;
        const json_t *m2 = e.kind == OQ_KIND_TOOL_CALL ? e2.args : e2.result;
        char *ca = NULL, *cb = NULL, *c = NULL;
        size_t lca = 0, lc = 0;
        if (oq_jcs_canonicalize(m, &ca, &lca, NULL) != 0 ||
            oq_jcs_canonicalize(m2, &cb, NULL, NULL) != 0 || strcmp(ca, cb) != 0)
            abort();
        if (oq_envelope_encode_canon(&e, ca, lca, &c, &lc, NULL) != 0 || lc != la ||
            memcmp(a, c, la) != 0)
            abort();
        free(ca);
        free(cb);
        free(c);
    }
    free(a);
    free(b);
    oq_envelope_clear(&e);
    oq_envelope_clear(&e2);
    return 0;
}
