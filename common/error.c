/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Error helpers. Formatting goes into the caller's fixed buffer; nothing here allocates, so
 * errors can be reported from out-of-memory paths too. The name table is part of the public
 * contract (HTTP error bodies and logs carry these names): append, never renumber.
 */
#include "oq_error.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    const char *text;
} codes[OQ__ECOUNT] = {
    {"ok", "success"},
    {"invalid", "invalid argument or input"},
    {"nomem", "out of memory"},
    {"io", "I/O error"},
    {"db", "database error"},
    {"busy", "resource busy, retry"},
    {"not_found", "not found"},
    {"conflict", "idempotency conflict"},
    {"kafka", "Kafka client error"},
    {"too_big", "input over limit"},
    {"version", "unsupported version"},
    {"state", "operation not allowed in this state"},
    {"fenced", "lease lost (fenced)"},
    {"timed_out", "timed out"},
    {"shutdown", "shutting down"},
    {"crypto", "cryptography library error"},
    {"too_deep", "JSON nested too deeply"},
    {"range", "number out of range"},
    {"duplicate_key", "duplicate object key"},
    {"utf8", "invalid UTF-8"},
    {"help", "help printed"},
    {"exists", "already exists"},
};

void oq_error_clear(oq_error_t *err)
{
    if (err) memset(err, 0, sizeof(*err));
}

/* The format attribute lets clang check callers (-Wformat-nonliteral under -Wformat=2). */
static int error_vset(oq_error_t *err, int code, int cause, int retriable, const char *fmt,
                      va_list ap) __attribute__((format(printf, 5, 0)));

static int error_vset(oq_error_t *err, int code, int cause, int retriable, const char *fmt,
                      va_list ap)
{
    if (!err) return code;
    err->code = code;
    err->cause = cause;
    err->retriable = retriable;
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    return code;
}

int oq_error_set(oq_error_t *err, int code, int cause, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = error_vset(err, code, cause, code == OQ_EBUSY || code == OQ_ETIMEDOUT, fmt, ap);
    va_end(ap);
    return rc;
}

int oq_error_set_retriable(oq_error_t *err, int code, int cause, int retriable, const char *fmt,
                           ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = error_vset(err, code, cause, retriable, fmt, ap);
    va_end(ap);
    return rc;
}

const char *oq_error_name(int code)
{
    int i = -code;
    return (i >= 0 && i < OQ__ECOUNT) ? codes[i].name : "unknown";
}

const char *oq_strerror(int code)
{
    int i = -code;
    return (i >= 0 && i < OQ__ECOUNT) ? codes[i].text : "unknown error";
}
