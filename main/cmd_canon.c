/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq canon`: print the RFC 8785 (JCS) canonical form of the JSON text on stdin, for users
 * whose clients are written in other languages and want to check their own canonicaliser or
 * compute fingerprints themselves.
 *
 * The whole of stdin is read (up to 16 MiB) and parsed with the same strict rules as the
 * producer (duplicate keys, invalid UTF-8, integers beyond +-2^53, NaN/Infinity and nesting
 * deeper than 64 are refused), so what this prints is exactly what onceq hashes. The output
 * has no trailing newline, like the RFC's test vectors: `onceq canon < in | sha256sum` hashes
 * the canonical bytes and nothing else. Invalid input prints
 * `onceq canon: <error name>: <message>` on stderr and exits 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "oq_buf.h"
#include "oq_config.h"
#include "oq_json.h"

#define CANON_MAX_INPUT (16u * 1024 * 1024)

/* Read all of \p f into a malloc()ed buffer. Returns 0, OQ_ETOOBIG past \p limit, OQ_EIO. */
static int read_all(FILE *f, size_t limit, char **out, size_t *out_len, oq_error_t *err)
{
    oq_buf_t b = {0};
    int rc = oq_buf_read(&b, f, limit);
    if (rc == 0 && !(*out = oq_buf_take(&b, out_len))) rc = OQ_ENOMEM;
    oq_buf_free(&b);
    if (rc == OQ_EIO) return oq_error_set(err, OQ_EIO, 0, "cannot read standard input");
    if (rc == OQ_ETOOBIG) return oq_error_set(err, OQ_ETOOBIG, 0, "input exceeds %zu bytes", limit);
    if (rc) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    return 0;
}

int oq__cmd_canon(int argc, char **argv)
{
    const char *usage =
        "onceq canon < in.json\n\n"
        "Prints the RFC 8785 canonical form of the JSON text on stdin (at most 16 MiB), with no\n"
        "trailing newline. Strict: duplicate keys, invalid UTF-8, integers beyond +-2^53,\n"
        "NaN/Infinity and nesting deeper than 64 are refused (exit 2).";
    char *in = NULL, *out = NULL;
    size_t in_len = 0, out_len = 0;
    oq_error_t err = {0};
    oq_config_t *cfg = oq_config_new(NULL, 0);
    if (!cfg) return OQ_EXIT_FAIL;
    int rc = oq_cli_parse(cfg, "onceq", usage, argc, argv);
    if (rc >= 0) goto out;
    if (oq_config_npositional(cfg) > 0 || oq_config_kafka_count(cfg) > 0) {
        fprintf(stderr, "onceq canon: takes no arguments (JSON is read from stdin)\n");
        rc = OQ_EXIT_USAGE;
        goto out;
    }
    int r = read_all(stdin, CANON_MAX_INPUT, &in, &in_len, &err);
    if (r == 0) r = oq_jcs_canonicalize_text(in, in_len, &out, &out_len, &err);
    if (r != 0) {
        fprintf(stderr, "onceq canon: %s: %s\n", oq_error_name(r), err.msg);
        rc = (r == OQ_EIO || r == OQ_ENOMEM) ? OQ_EXIT_FAIL : OQ_EXIT_USAGE;
        goto out;
    }
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout) != 0) {
        fprintf(stderr, "onceq canon: io: cannot write standard output\n");
        rc = OQ_EXIT_FAIL;
        goto out;
    }
    rc = OQ_EXIT_OK;
out:
    free(in);
    free(out);
    oq_config_destroy(cfg);
    return rc;
}
