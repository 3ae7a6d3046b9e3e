/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `onceq fingerprint --tool T [--tenant X]`: print the call fingerprint of the args JSON on
 * stdin: lowercase hex SHA-256 of the RFC 8785 form of {"args":..,"tenant":..,"tool":..},
 * exactly what the producer stores and compares for idempotency conflicts. Clients in other
 * languages use it to check their own implementation.
 *
 * The args must be one JSON object (at most 1 MiB, the same strict parsing as the producer).
 * Prints the 64 hex digits and a newline; invalid input or usage exits 2 with the reason.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"
#include "oq_config.h"
#include "oq_envelope.h"
#include "oq_json.h"

#define FP_MAX_INPUT (1024u * 1024)

static const oq_setting_t fingerprint_settings[] = {
    {"tool", OQ_SET_STRING, NULL, 1, OQ_MAX_NAME_LEN, NULL, "tool name (required)"},
    {"tenant", OQ_SET_STRING, "default", 1, OQ_MAX_NAME_LEN, NULL, "tenant of the call"},
};

static int read_stdin(size_t limit, char **out, size_t *out_len, oq_error_t *err)
{
    size_t cap = limit + 2, n = 0;
    char *buf = malloc(cap);
    if (!buf) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    size_t r;
    while (n < cap && (r = fread(buf + n, 1, cap - n, stdin)) > 0)
        n += r;
    if (ferror(stdin)) {
        free(buf);
        return oq_error_set(err, OQ_EIO, 0, "cannot read standard input");
    }
    if (n > limit) {
        free(buf);
        return oq_error_set(err, OQ_ETOOBIG, 0, "args exceed %zu bytes", limit);
    }
    *out = buf;
    *out_len = n;
    return 0;
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    case JSON_NULL:
        return "null";
    }
    return "unknown";
}

int oq__cmd_fingerprint(int argc, char **argv)
{
    const char *usage =
        "onceq fingerprint --tool T [--tenant X] < args.json\n\n"
        "Prints the call fingerprint (SHA-256 of the RFC 8785 form of\n"
        "{\"args\":ARGS,\"tenant\":X,\"tool\":T}) of the args object on stdin, in lowercase hex.";
    char *in = NULL;
    size_t in_len = 0;
    json_t *args = NULL;
    oq_error_t err = {0};
    oq_config_t *cfg = oq_config_new(fingerprint_settings,
                                     sizeof fingerprint_settings / sizeof fingerprint_settings[0]);
    if (!cfg) return OQ_EXIT_FAIL;
    int rc = oq_cli_parse(cfg, "onceq", usage, argc, argv);
    if (rc >= 0) goto out;
    const char *tool = oq_config_str(cfg, "tool");
    const char *tenant = oq_config_str(cfg, "tenant");
    rc = OQ_EXIT_USAGE;
    if (!tool || oq_config_npositional(cfg) > 0 || oq_config_kafka_count(cfg) > 0) {
        fprintf(stderr, "onceq fingerprint: --tool is required and args are read from stdin\n"
                        "usage: onceq fingerprint --tool T [--tenant X] < args.json\n");
        goto out;
    }
    int r = read_stdin(FP_MAX_INPUT, &in, &in_len, &err);
    if (r == 0) r = oq_json_parse(in, in_len, 0, &args, &err);
    if (r == 0 && !json_is_object(args))
        r = oq_error_set(&err, OQ_EINVAL, 0, "args must be a JSON object, got %s",
                         json_type_name(args));
    char fp[OQ_FINGERPRINT_LEN + 1];
    if (r == 0) r = oq_fingerprint(tenant, tool, args, fp, &err);
    if (r != 0) {
        fprintf(stderr, "onceq fingerprint: %s: %s\n", oq_error_name(r), err.msg);
        rc = (r == OQ_EIO || r == OQ_ENOMEM || r == OQ_ECRYPTO) ? OQ_EXIT_FAIL : OQ_EXIT_USAGE;
        goto out;
    }
    if (printf("%s\n", fp) < 0 || fflush(stdout) != 0) {
        rc = OQ_EXIT_FAIL;
        goto out;
    }
    rc = OQ_EXIT_OK;
out:
    json_decref(args);
    free(in);
    oq_config_destroy(cfg);
    return rc;
}
