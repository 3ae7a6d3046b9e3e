/* SPDX-License-Identifier: Apache-2.0 */
/*
 * oq_fp_batch: `onceq fingerprint` for many documents at once, for the comparison with the SQL
 * side (tests/integration/test_pg_fingerprint.sh). Reads one JSON text per line on stdin and
 * writes one line per input: the fingerprint (tenant and tool from argv, as `onceq fingerprint
 * --tenant X --tool T`), or "ERR name" with the error's stable name when the C side refuses the
 * document. With --canon, writes the RFC 8785 text of any JSON value instead (`onceq canon`).
 *
 *   oq_fp_batch [--canon] [TENANT TOOL] < docs.jsonl
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oq_json.h"

int main(int argc, char **argv)
{
    int canon = argc > 1 && strcmp(argv[1], "--canon") == 0;
    const char *tenant = argc > 2 && !canon ? argv[1] : "default";
    const char *tool = argc > 2 && !canon ? argv[2] : "t";
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        if (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
        oq_error_t err = {0};
        json_t *v = NULL;
        int rc = oq_json_parse(line, (size_t)n, 0, &v, &err);
        if (rc == 0 && canon) {
            char *out = NULL;
            size_t len = 0;
            rc = oq_jcs_canonicalize(v, &out, &len, &err);
            if (rc == 0) {
                fwrite(out, 1, len, stdout);
                putchar('\n');
                free(out);
            }
        } else if (rc == 0) {
            char fp[OQ_FINGERPRINT_LEN + 1];
            if (!json_is_object(v))
                rc = oq_error_set(&err, OQ_EINVAL, 0, "not an object");
            else if ((rc = oq_fingerprint(tenant, tool, v, fp, &err)) == 0)
                printf("%s\n", fp);
        }
        if (rc) printf("ERR %s\n", oq_error_name(rc));
        json_decref(v);
    }
    free(line);
    return 0;
}
