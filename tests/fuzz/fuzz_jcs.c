/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target for the strict parser and the RFC 8785 canonicaliser.
 *
 * Properties checked on every input that parses: the canonical form parses again, its
 * canonical form is the same bytes (idempotence), it is valid UTF-8 and the fingerprint of the
 * value equals the fingerprint of its re-parsed canonical form. Independently, the first 8
 * bytes are read as an IEEE double: its ECMAScript form must read back (strtod) as the same
 * double, or be refused as NaN/Infinity. Any violation aborts, which libFuzzer reports.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "oq_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_number(const uint8_t *data, size_t size)
{
    if (size < 8) return;
    double d;
    memcpy(&d, data, sizeof(d));
    char out[OQ_JCS_NUMBER_MAX];
    int rc = oq_jcs_number(d, out, NULL);
    if (!isfinite(d)) {
        if (rc != OQ_ERANGE) abort();
        return;
    }
    if (rc != 0 || strlen(out) >= OQ_JCS_NUMBER_MAX) abort();
    double back = strtod(out, NULL);
    if (back != d) abort();
    /* ECMAScript never prints a leading '+', a trailing '.', or "-0" */
    size_t n = strlen(out);
    if (out[0] == '+' || out[n - 1] == '.' || strcmp(out, "-0") == 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_number(data, size);

    const char *text = (const char *)data;
    json_t *v = NULL;
    if (oq_json_parse(text, size, 0, &v, NULL) != 0) return 0;

    char *c1 = NULL, *c2 = NULL;
    size_t l1 = 0, l2 = 0;
    json_t *v2 = NULL;
    int rc = oq_jcs_canonicalize(v, &c1, &l1, NULL);
    if (rc != 0) abort(); /* whatever oq_json_parse accepts must canonicalise */
    if (!oq_utf8_valid(c1, l1) || strlen(c1) != l1) abort();
    if (oq_json_parse(c1, l1, 0, &v2, NULL) != 0) abort();
    if (oq_jcs_canonicalize(v2, &c2, &l2, NULL) != 0) abort();
    if (l1 != l2 || memcmp(c1, c2, l1) != 0) abort();

    char f1[OQ_FINGERPRINT_LEN + 1], f2[OQ_FINGERPRINT_LEN + 1];
    if (oq_fingerprint("t", "tool", v, f1, NULL) != 0) abort();
    if (oq_fingerprint("t", "tool", v2, f2, NULL) != 0) abort();
    if (strcmp(f1, f2) != 0) abort();

    free(c1);
    free(c2);
    json_decref(v);
    json_decref(v2);
    return 0;
}
