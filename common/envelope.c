/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Kafka message envelope, version 1: encode, decode, validate.
 *
 * Decoding is strict about what it understands and lenient about what it does not: every known
 * field is type- and value-checked, and each failure names the field ("missing field call_id",
 * "field attempt: expected integer >= 1"), because a consumer sends undecodable messages to the
 * dead-letter topic with this text as the reason. Unknown extra fields are ignored so that a
 * newer producer can add fields without breaking older consumers; a change that older readers
 * must not misread bumps "v", and any v other than 1 is refused with OQ_EVERSION.
 *
 * Decode checks JSON types itself (it has the field names at hand), copies into the struct and
 * then runs oq_envelope_validate(), so hand-built envelopes and decoded ones pass exactly the
 * same value checks. Encoding validates first and then emits the RFC 8785 canonical form: the
 * bytes of an envelope are a pure function of its content, so a republished message is
 * byte-identical to the original. There is one writer (write_envelope): the producer's hot path
 * enters it with args it already holds as canonical text (oq_envelope_encode_canon), everyone
 * else with a tree.
 *
 * The producer's ingest decodes every result message, and a tree per message (jansson's
 * parse, then a walk, then json_dumps of the result for calls.result) was about a tenth of the
 * producer's CPU in the closed-loop e2e run. oq_envelope_decode_result() reads the subset the
 * encoder itself writes with a scanner instead (decode_fast): no whitespace, strings
 * without escapes, integers of at most 15 digits, keys in strictly increasing byte order (so no
 * duplicates), known top-level fields only, error null. In that subset the result object's
 * text is exactly what json_dumps(COMPACT | SORT_KEYS) writes for its tree (jansson sorts keys
 * by bytes and escapes only quotes, backslashes and control characters), so it is kept as
 * text. Anything outside the subset, valid or not, takes oq_envelope_decode(), so the fields
 * and the error codes and messages are those of the one decoder.
 *
 * The consumer's decode of every tool_call (jansson's parse of the whole envelope, then
 * json_dumps of the args for the executions row) was about a quarter of a consumer's main
 * thread in the same run. oq_envelope_decode_call() takes the same scanner: the top-level
 * fields are read in place, only the args object is parsed (the compiled tools read the tree),
 * and its text is kept (json_dumps(args, JSON_COMPACT) writes exactly that text in the subset:
 * keys in their order, the same values).
 *
 * The rules for keys, tenants and tool names live here too (oq_envelope_valid_*): the producer
 * checks a request with the same functions that a consumer applies to the message, so there is
 * one rule, not one per side.
 */
#include "oq_envelope.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ENV_MAX_BYTES (1024 * 1024) /* a Kafka message.max.bytes default is 1 MB as well */

const char *oq_kind_name(oq_kind_t k)
{
    switch (k) {
    case OQ_KIND_TOOL_CALL:
        return "tool_call";
    case OQ_KIND_TOOL_RESULT:
        return "tool_result";
    }
    return "unknown";
}

void oq_envelope_clear(oq_envelope_t *e)
{
    if (!e) return;
    free(e->tenant);
    free(e->idem_key);
    free(e->tool);
    free(e->status);
    free(e->effect_id);
    json_decref(e->args);
    json_decref(e->result);
    json_decref(e->error);
    free(e->result_json);
    free(e->args_json);
    memset(e, 0, sizeof(*e));
}

/* --- value checks shared by decode and validate --------------------------------------------- */

static int is_lower_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static int check_uuid(const char *s)
{
    if (!s || strlen(s) != OQ_UUID_LEN) return 0;
    for (int i = 0; i < OQ_UUID_LEN; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (s[i] != '-') return 0;
        } else if (!is_lower_hex(s[i])) {
            return 0;
        }
    }
    return 1;
}

/* Both call-id formats (oq_call_id_valid): messages in flight from before the longer ids. */
static int check_call_id(const char *s)
{
    return oq_call_id_valid(s);
}

static int check_fingerprint(const char *s)
{
    if (!s || strlen(s) != OQ_FINGERPRINT_LEN) return 0;
    for (int i = 0; i < OQ_FINGERPRINT_LEN; i++)
        if (!is_lower_hex(s[i])) return 0;
    return 1;
}

/* --- names and keys: the one rule for every component (oq_envelope.h) ---------------------- */

/* 1..max bytes, each printable ASCII (0x20..0x7e). */
static int printable(const char *s, size_t max)
{
    if (!s) return 0;
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char ch = (unsigned char)s[n];
        if (ch < 0x20 || ch > 0x7e || n >= max) return 0;
    }
    return n > 0;
}

int oq_envelope_valid_key(const char *s)
{
    return printable(s, OQ_MAX_KEY_LEN);
}

int oq_envelope_valid_name(const char *s)
{
    return printable(s, OQ_MAX_NAME_LEN);
}

int oq_envelope_valid_tool(const char *s)
{
    if (!s) return 0;
    size_t n = 0;
    for (; s[n]; n++) {
        char ch = s[n];
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '_' || ch == '.' || ch == ':' || ch == '-';
        if (!ok || n >= OQ_MAX_NAME_LEN) return 0;
    }
    return n > 0;
}

static int check_status(const char *s)
{
    static const char *const ok[] = {"running", "succeeded", "failed", "needs_review"};
    if (!s) return 0;
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        if (strcmp(s, ok[i]) == 0) return 1;
    return 0;
}

static int check_error_obj(const json_t *e, oq_error_t *err)
{
    const json_t *code = json_object_get(e, "code");
    const json_t *msg = json_object_get(e, "message");
    const json_t *retry = json_object_get(e, "retryable");
    if (!code) return oq_error_set(err, OQ_EINVAL, 0, "missing field error.code");
    if (!json_is_string(code))
        return oq_error_set(err, OQ_EINVAL, 0, "field error.code: expected string");
    if (!msg) return oq_error_set(err, OQ_EINVAL, 0, "missing field error.message");
    if (!json_is_string(msg))
        return oq_error_set(err, OQ_EINVAL, 0, "field error.message: expected string");
    if (retry && !json_is_boolean(retry))
        return oq_error_set(err, OQ_EINVAL, 0, "field error.retryable: expected boolean");
    return 0;
}

/* Every check but the tool_call's args (which the caller holds as a tree or as text). */
static int validate_fields(const oq_envelope_t *e, oq_error_t *err)
{
    if (!e) return oq_error_set(err, OQ_EINVAL, 0, "NULL envelope");
    if (e->v != OQ_ENVELOPE_VERSION)
        return oq_error_set(err, OQ_EVERSION, 0, "unknown version %d", e->v);
    if (e->kind != OQ_KIND_TOOL_CALL && e->kind != OQ_KIND_TOOL_RESULT)
        return oq_error_set(err, OQ_EINVAL, 0, "field kind: expected tool_call or tool_result");
    if (!check_uuid(e->message_id))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "field message_id: expected a lowercase UUID (8-4-4-4-12 hex)");
    if (!check_call_id(e->call_id))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "field call_id: expected \"c_\" + 32 (or 16) lowercase hex digits");
    if (!oq_envelope_valid_name(e->tenant))
        return oq_error_set(err, OQ_EINVAL, 0, "field tenant: expected 1..%d printable ASCII bytes",
                            OQ_MAX_NAME_LEN);
    if (!oq_envelope_valid_key(e->idem_key))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "field idem_key: expected 1..%d printable ASCII bytes", OQ_MAX_KEY_LEN);
    if (!check_fingerprint(e->fingerprint))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "field fingerprint: expected 64 lowercase hex digits (SHA-256)");
    if (!oq_envelope_valid_tool(e->tool))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "field tool: expected 1..%d bytes of [A-Za-z0-9_.:-]", OQ_MAX_NAME_LEN);
    if (e->attempt < 1)
        return oq_error_set(err, OQ_EINVAL, 0, "field attempt: expected integer >= 1");
    if (e->created_at < 0)
        return oq_error_set(err, OQ_EINVAL, 0, "field created_at: expected integer >= 0");
    if (e->kind == OQ_KIND_TOOL_CALL) return 0;
    if (!check_status(e->status))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "field status: expected running|succeeded|failed|needs_review");
    if (e->result && !json_is_object(e->result))
        return oq_error_set(err, OQ_EINVAL, 0, "field result: expected object or null");
    if (e->error) {
        if (!json_is_object(e->error))
            return oq_error_set(err, OQ_EINVAL, 0, "field error: expected object or null");
        int rc = check_error_obj(e->error, err);
        if (rc) return rc;
    }
    if (e->effect_id && !oq_utf8_valid(e->effect_id, strlen(e->effect_id)))
        return oq_error_set(err, OQ_EINVAL, 0, "field effect_id: invalid UTF-8");
    return 0;
}

int oq_envelope_validate(const oq_envelope_t *e, oq_error_t *err)
{
    int rc = validate_fields(e, err);
    if (rc) return rc;
    if (e->kind == OQ_KIND_TOOL_CALL && !json_is_object(e->args))
        return oq_error_set(err, OQ_EINVAL, 0, "field args: expected object");
    return 0;
}

/* --- decode --------------------------------------------------------------------------------- */

/* Required string field: *out borrows the jansson string. */
static int get_str(const json_t *root, const char *name, const char **out, oq_error_t *err)
{
    const json_t *f = json_object_get(root, name);
    if (!f) return oq_error_set(err, OQ_EINVAL, 0, "missing field %s", name);
    if (!json_is_string(f))
        return oq_error_set(err, OQ_EINVAL, 0, "field %s: expected string", name);
    *out = json_string_value(f);
    return 0;
}

static int get_int(const json_t *root, const char *name, int64_t min, int64_t *out, oq_error_t *err)
{
    const json_t *f = json_object_get(root, name);
    if (!f) return oq_error_set(err, OQ_EINVAL, 0, "missing field %s", name);
    if (!json_is_integer(f) || json_integer_value(f) < min)
        return oq_error_set(err, OQ_EINVAL, 0, "field %s: expected integer >= %lld", name,
                            (long long)min);
    *out = json_integer_value(f);
    return 0;
}

/* Copy a string field into a fixed buffer of \p cap bytes; too long -> validate's message. */
static void copy_fixed(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) n = 0; /* leave empty: validate() reports the field */
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int dup_str(const char *s, char **out, oq_error_t *err)
{
    *out = strdup(s);
    return *out ? 0 : oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
}

static int decode_fields(const json_t *root, oq_envelope_t *e, oq_error_t *err)
{
    int rc;
    const char *s = NULL;
    const json_t *v = json_object_get(root, "v");
    if (!v) return oq_error_set(err, OQ_EINVAL, 0, "missing field v");
    if (!json_is_integer(v)) return oq_error_set(err, OQ_EINVAL, 0, "field v: expected integer 1");
    if (json_integer_value(v) != OQ_ENVELOPE_VERSION)
        return oq_error_set(err, OQ_EVERSION, 0, "unknown version %lld",
                            (long long)json_integer_value(v));
    e->v = OQ_ENVELOPE_VERSION;

    if ((rc = get_str(root, "kind", &s, err))) return rc;
    if (strcmp(s, "tool_call") == 0)
        e->kind = OQ_KIND_TOOL_CALL;
    else if (strcmp(s, "tool_result") == 0)
        e->kind = OQ_KIND_TOOL_RESULT;
    else
        return oq_error_set(
            err, OQ_EINVAL, 0,
            "field kind: unknown kind \"%.40s\" (expected tool_call or tool_result)", s);

    if ((rc = get_str(root, "message_id", &s, err))) return rc;
    copy_fixed(e->message_id, sizeof(e->message_id), s);
    if ((rc = get_str(root, "call_id", &s, err))) return rc;
    copy_fixed(e->call_id, sizeof(e->call_id), s);
    if ((rc = get_str(root, "tenant", &s, err)) || (rc = dup_str(s, &e->tenant, err))) return rc;
    if ((rc = get_str(root, "idem_key", &s, err)) || (rc = dup_str(s, &e->idem_key, err)))
        return rc;
    if ((rc = get_str(root, "fingerprint", &s, err))) return rc;
    copy_fixed(e->fingerprint, sizeof(e->fingerprint), s);
    if ((rc = get_str(root, "tool", &s, err)) || (rc = dup_str(s, &e->tool, err))) return rc;
    if ((rc = get_int(root, "attempt", 1, &e->attempt, err))) return rc;
    if ((rc = get_int(root, "created_at", 0, &e->created_at, err))) return rc;

    if (e->kind == OQ_KIND_TOOL_CALL) {
        json_t *args = json_object_get(root, "args");
        if (!args) return oq_error_set(err, OQ_EINVAL, 0, "missing field args");
        if (!json_is_object(args))
            return oq_error_set(err, OQ_EINVAL, 0, "field args: expected object");
        e->args = json_incref(args);
        return 0;
    }

    if ((rc = get_str(root, "status", &s, err))) return rc;
    if (!check_status(s))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "field status: unknown status \"%.40s\" (expected "
                            "running|succeeded|failed|needs_review)",
                            s);
    if ((rc = dup_str(s, &e->status, err))) return rc;
    /* result, error and effect_id may be absent: absent means null. */
    json_t *f = json_object_get(root, "result");
    if (f && !json_is_null(f)) {
        if (!json_is_object(f))
            return oq_error_set(err, OQ_EINVAL, 0, "field result: expected object or null");
        e->result = json_incref(f);
    }
    f = json_object_get(root, "error");
    if (f && !json_is_null(f)) {
        if (!json_is_object(f))
            return oq_error_set(err, OQ_EINVAL, 0, "field error: expected object or null");
        e->error = json_incref(f);
    }
    f = json_object_get(root, "effect_id");
    if (f && !json_is_null(f)) {
        if (!json_is_string(f))
            return oq_error_set(err, OQ_EINVAL, 0, "field effect_id: expected string or null");
        if ((rc = dup_str(json_string_value(f), &e->effect_id, err))) return rc;
    }
    return 0;
}

int oq_envelope_decode(const char *buf, size_t len, oq_envelope_t *e, oq_error_t *err)
{
    if (!e) return oq_error_set(err, OQ_EINVAL, 0, "NULL envelope");
    memset(e, 0, sizeof(*e));
    if (len > ENV_MAX_BYTES)
        return oq_error_set(err, OQ_ETOOBIG, 0, "envelope of %zu bytes exceeds the %d-byte limit",
                            len, ENV_MAX_BYTES);
    json_t *root = NULL;
    int rc = oq_json_parse(buf, len, 0, &root, err);
    if (rc) return rc;
    if (!json_is_object(root)) {
        rc = oq_error_set(err, OQ_EINVAL, 0, "envelope: expected a JSON object");
        goto out;
    }
    if ((rc = decode_fields(root, e, err))) goto out;
    rc = oq_envelope_validate(e, err);
out:
    if (rc) oq_envelope_clear(e);
    json_decref(root);
    return rc;
}

/* --- the fast paths (file comment) ----------------------------------------------------------- */

#define FAST_MAX_DEPTH 32 /* deeper: the tree decoder (its limit is OQ_JSON_DEFAULT_MAX_DEPTH) */

typedef struct fast_scan {
    const char *p, *end;
} fast_scan_t;

/* A string without escapes or control bytes: its content [*s, *s + *n). 0: not in the subset. */
static int fast_string(fast_scan_t *sc, const char **s, size_t *n)
{
    if (sc->p >= sc->end || *sc->p != '"') return 0;
    const char *q = sc->p + 1;
    while (q < sc->end && *q != '"') {
        unsigned char c = (unsigned char)*q;
        if (c == '\\' || c < 0x20) return 0;
        q++;
    }
    if (q >= sc->end) return 0;
    *s = sc->p + 1;
    *n = (size_t)(q - *s);
    sc->p = q + 1;
    return 1;
}

/* An integer as json_dumps writes it: -?(0|[1-9][0-9]*), not -0, at most 15 digits (inside
 * the +-2^53 that oq_json_parse accepts), not followed by a fraction or an exponent. */
static int fast_int(fast_scan_t *sc, int64_t *out)
{
    const char *q = sc->p;
    int neg = 0;
    if (q < sc->end && *q == '-') {
        neg = 1;
        q++;
    }
    const char *d = q;
    int64_t v = 0;
    while (q < sc->end && *q >= '0' && *q <= '9') {
        if (q - d < 16) v = v * 10 + (*q - '0'); /* past 15 digits it is refused below */
        q++;
    }
    size_t nd = (size_t)(q - d);
    if (nd == 0 || nd > 15 || (nd > 1 && *d == '0') || (neg && v == 0)) return 0;
    if (q < sc->end && (*q == '.' || *q == 'e' || *q == 'E')) return 0;
    *out = neg ? -v : v;
    sc->p = q;
    return 1;
}

static int fast_lit(fast_scan_t *sc, const char *lit, size_t n)
{
    if ((size_t)(sc->end - sc->p) < n || memcmp(sc->p, lit, n) != 0) return 0;
    sc->p += n;
    return 1;
}

/* Keys in strictly increasing byte order: jansson's JSON_SORT_KEYS order, and no duplicate. */
static int fast_key_after(const char *a, size_t an, const char *b, size_t bn)
{
    int c = memcmp(a, b, an < bn ? an : bn);
    return c < 0 || (c == 0 && an < bn);
}

static int fast_value(fast_scan_t *sc, int depth);

/* An object ('{' at sc->p) or an array ('[') whose members are all in the subset. */
static int fast_container(fast_scan_t *sc, int depth)
{
    if (depth > FAST_MAX_DEPTH) return 0;
    const int obj = *sc->p == '{';
    const char close = obj ? '}' : ']';
    sc->p++;
    if (sc->p < sc->end && *sc->p == close) {
        sc->p++;
        return 1;
    }
    const char *prev = NULL;
    size_t prevn = 0;
    for (;;) {
        if (obj) {
            const char *k;
            size_t kn;
            if (!fast_string(sc, &k, &kn)) return 0;
            if (prev && !fast_key_after(prev, prevn, k, kn)) return 0;
            prev = k;
            prevn = kn;
            if (sc->p >= sc->end || *sc->p != ':') return 0;
            sc->p++;
        }
        if (!fast_value(sc, depth)) return 0;
        if (sc->p < sc->end && *sc->p == ',') {
            sc->p++;
            continue;
        }
        if (sc->p < sc->end && *sc->p == close) {
            sc->p++;
            return 1;
        }
        return 0;
    }
}

static int fast_value(fast_scan_t *sc, int depth)
{
    const char *s;
    size_t n;
    int64_t i;
    if (sc->p >= sc->end) return 0;
    switch (*sc->p) {
    case '{':
    case '[':
        return fast_container(sc, depth + 1);
    case '"':
        return fast_string(sc, &s, &n);
    case 't':
        return fast_lit(sc, "true", 4);
    case 'f':
        return fast_lit(sc, "false", 5);
    case 'n':
        return fast_lit(sc, "null", 4);
    default:
        return fast_int(sc, &i);
    }
}

enum {
    F_V = 1 << 0,
    F_KIND = 1 << 1,
    F_MESSAGE_ID = 1 << 2,
    F_CALL_ID = 1 << 3,
    F_TENANT = 1 << 4,
    F_IDEM_KEY = 1 << 5,
    F_FINGERPRINT = 1 << 6,
    F_TOOL = 1 << 7,
    F_ATTEMPT = 1 << 8,
    F_CREATED_AT = 1 << 9,
    F_STATUS = 1 << 10, /* tool_result */
    F_ARGS = 1 << 11,   /* tool_call */
    F_COMMON = (1 << 10) - 1
};

/* A string field copied into a fixed buffer of \p cap bytes (too long: not in the subset, so
 * that the tree decoder reports it). */
static int fast_fixed(fast_scan_t *sc, char *dst, size_t cap)
{
    const char *s;
    size_t n;
    if (!fast_string(sc, &s, &n) || n >= cap) return 0;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return 1;
}

static int fast_dup(fast_scan_t *sc, char **out)
{
    const char *s;
    size_t n;
    if (*out || !fast_string(sc, &s, &n)) return 0;
    return (*out = strndup(s, n)) != NULL;
}

/* The subset's envelope of \p kind into \p e (validated; file comment). 0: not in the subset,
 * not of that kind, not valid, or out of memory: \p e is cleared and the caller decodes with the
 * tree. */
static int decode_fast(const char *buf, size_t len, oq_envelope_t *e, oq_kind_t kind)
{
    const int call = kind == OQ_KIND_TOOL_CALL;
    fast_scan_t sc = {buf, buf + len};
    unsigned seen = 0;
    const char *prev = NULL;
    size_t prevn = 0;
    int64_t iv;
    if (len > ENV_MAX_BYTES || !oq_utf8_valid(buf, len) || len < 2 || buf[0] != '{') return 0;
    sc.p++;
    for (;;) {
        const char *k, *start;
        size_t kn;
        if (!fast_string(&sc, &k, &kn)) goto no;
        if (prev && !fast_key_after(prev, prevn, k, kn)) goto no;
        prev = k;
        prevn = kn;
        if (sc.p >= sc.end || *sc.p++ != ':') goto no;
#define KEY(lit) (kn == sizeof(lit) - 1 && memcmp(k, lit, kn) == 0)
        if (KEY("v")) {
            if (!fast_int(&sc, &iv) || iv != OQ_ENVELOPE_VERSION) goto no;
            e->v = OQ_ENVELOPE_VERSION;
            seen |= F_V;
        } else if (KEY("kind")) {
            const char *s;
            size_t n;
            const char *want = call ? "tool_call" : "tool_result";
            if (!fast_string(&sc, &s, &n) || n != strlen(want) || memcmp(s, want, n) != 0) goto no;
            e->kind = kind;
            seen |= F_KIND;
        } else if (KEY("message_id")) {
            if (!fast_fixed(&sc, e->message_id, sizeof e->message_id)) goto no;
            seen |= F_MESSAGE_ID;
        } else if (KEY("call_id")) {
            if (!fast_fixed(&sc, e->call_id, sizeof e->call_id)) goto no;
            seen |= F_CALL_ID;
        } else if (KEY("fingerprint")) {
            if (!fast_fixed(&sc, e->fingerprint, sizeof e->fingerprint)) goto no;
            seen |= F_FINGERPRINT;
        } else if (KEY("tenant")) {
            if (!fast_dup(&sc, &e->tenant)) goto no;
            seen |= F_TENANT;
        } else if (KEY("idem_key")) {
            if (!fast_dup(&sc, &e->idem_key)) goto no;
            seen |= F_IDEM_KEY;
        } else if (KEY("tool")) {
            if (!fast_dup(&sc, &e->tool)) goto no;
            seen |= F_TOOL;
        } else if (KEY("attempt")) {
            if (!fast_int(&sc, &e->attempt)) goto no;
            seen |= F_ATTEMPT;
        } else if (KEY("created_at")) {
            if (!fast_int(&sc, &e->created_at)) goto no;
            seen |= F_CREATED_AT;
        } else if (KEY("args") && call) {
            /* kept as text and as a tree: json_dumps(args, JSON_COMPACT) of the tree writes
             * this very text (keys in their order, the subset's values as they are) */
            start = sc.p;
            if (sc.p >= sc.end || *sc.p != '{' || !fast_container(&sc, 1)) goto no;
            size_t an = (size_t)(sc.p - start);
            if (!(e->args_json = strndup(start, an)) ||
                oq_json_parse(start, an, 0, &e->args, NULL) != 0)
                goto no;
            seen |= F_ARGS;
        } else if (call) {
            goto no; /* a result's fields, or unknown ones: the tree decoder */
        } else if (KEY("status")) {
            if (!fast_dup(&sc, &e->status)) goto no;
            seen |= F_STATUS;
        } else if (KEY("effect_id")) {
            if (!fast_lit(&sc, "null", 4) && !fast_dup(&sc, &e->effect_id)) goto no;
        } else if (KEY("error")) {
            if (!fast_lit(&sc, "null", 4)) goto no; /* an error object: check_error_obj's tree */
        } else if (KEY("result")) {
            if (!fast_lit(&sc, "null", 4)) {
                start = sc.p;
                if (sc.p >= sc.end || *sc.p != '{' || !fast_container(&sc, 1)) goto no;
                if (!(e->result_json = strndup(start, (size_t)(sc.p - start)))) goto no;
            }
        } else {
            goto no; /* unknown fields: the tree decoder ignores them */
        }
#undef KEY
        if (sc.p < sc.end && *sc.p == ',') {
            sc.p++;
            continue;
        }
        if (sc.p + 1 == sc.end && *sc.p == '}') break;
        goto no;
    }
    if (seen != (F_COMMON | (call ? F_ARGS : F_STATUS)) || (!call && !check_status(e->status)) ||
        oq_envelope_validate(e, NULL) != 0)
        goto no;
    return 1;
no:
    oq_envelope_clear(e);
    return 0;
}

int oq_envelope_decode_result(const char *buf, size_t len, oq_envelope_t *e, oq_error_t *err)
{
    if (!e) return oq_error_set(err, OQ_EINVAL, 0, "NULL envelope");
    memset(e, 0, sizeof(*e));
    if (buf && decode_fast(buf, len, e, OQ_KIND_TOOL_RESULT)) return 0;
    return oq_envelope_decode(buf, len, e, err);
}

int oq_envelope_decode_call(const char *buf, size_t len, oq_envelope_t *e, oq_error_t *err)
{
    if (!e) return oq_error_set(err, OQ_EINVAL, 0, "NULL envelope");
    memset(e, 0, sizeof(*e));
    if (buf && decode_fast(buf, len, e, OQ_KIND_TOOL_CALL)) return 0;
    return oq_envelope_decode(buf, len, e, err);
}

/* --- encode --------------------------------------------------------------------------------- */

/* Appends ,"key": (keys here are plain ASCII: no escaping). */
#define PUT_KEY(lit) (rc = rc ? rc : oq_jcs_put_raw(&b, lit, sizeof(lit) - 1, err))
#define PUT(call) (rc = rc ? rc : (call))

/*
 * The one envelope writer. The envelope is written straight in RFC 8785 form: its members in
 * sorted key order (the order below is the UTF-16 order of the ASCII keys), the nested args /
 * result / error canonicalised on their own. This is byte for byte what canonicalising the
 * whole object gives (tests/unit/test_envelope.c checks it), without building and sorting a
 * tree per message. The object member (a tool_call's args, a tool_result's result) comes either
 * from the tree (e->args, e->result) or, when \p canon is not NULL, as text already in canonical
 * form, written verbatim (the producer's hot path: the args were canonicalised once, for the
 * fingerprint and the calls row; the consumer's: a result written once, for its rows and this
 * message). \p e has been validated.
 */
static int write_envelope(const oq_envelope_t *e, const char *canon, size_t canon_len, char **out,
                          size_t *out_len, oq_error_t *err)
{
    oq_jcs_buf_t b = {0};
    int rc = 0;
    const int call = e->kind == OQ_KIND_TOOL_CALL;
    if (call) {
        PUT_KEY("{\"args\":");
        PUT(canon ? oq_jcs_put_raw(&b, canon, canon_len, err) : oq_jcs_put_value(&b, e->args, err));
        PUT_KEY(",\"attempt\":");
    } else {
        PUT_KEY("{\"attempt\":");
    }
    PUT(oq_jcs_put_int(&b, e->attempt, err));
    PUT_KEY(",\"call_id\":");
    PUT(oq_jcs_put_string(&b, e->call_id, err));
    PUT_KEY(",\"created_at\":");
    PUT(oq_jcs_put_int(&b, e->created_at, err));
    if (!call) {
        PUT_KEY(",\"effect_id\":");
        PUT(e->effect_id ? oq_jcs_put_string(&b, e->effect_id, err)
                         : oq_jcs_put_raw(&b, "null", 4, err));
        PUT_KEY(",\"error\":");
        PUT(e->error ? oq_jcs_put_value(&b, e->error, err) : oq_jcs_put_raw(&b, "null", 4, err));
    }
    PUT_KEY(",\"fingerprint\":");
    PUT(oq_jcs_put_string(&b, e->fingerprint, err));
    PUT_KEY(",\"idem_key\":");
    PUT(oq_jcs_put_string(&b, e->idem_key, err));
    PUT_KEY(",\"kind\":");
    PUT(oq_jcs_put_string(&b, oq_kind_name(e->kind), err));
    PUT_KEY(",\"message_id\":");
    PUT(oq_jcs_put_string(&b, e->message_id, err));
    if (!call) {
        PUT_KEY(",\"result\":");
        PUT(canon       ? oq_jcs_put_raw(&b, canon, canon_len, err)
            : e->result ? oq_jcs_put_value(&b, e->result, err)
                        : oq_jcs_put_raw(&b, "null", 4, err));
        PUT_KEY(",\"status\":");
        PUT(oq_jcs_put_string(&b, e->status, err));
    }
    PUT_KEY(",\"tenant\":");
    PUT(oq_jcs_put_string(&b, e->tenant, err));
    PUT_KEY(",\"tool\":");
    PUT(oq_jcs_put_string(&b, e->tool, err));
    PUT_KEY(",\"v\":");
    PUT(oq_jcs_put_int(&b, e->v, err));
    PUT_KEY("}");
    return oq_jcs_buf_finish(&b, rc, out, out_len, err);
}

int oq_envelope_encode(const oq_envelope_t *e, char **out, size_t *out_len, oq_error_t *err)
{
    if (!out) return oq_error_set(err, OQ_EINVAL, 0, "invalid arguments");
    if (oq_envelope_validate(e, err)) {
        if (err) err->code = OQ_EINVAL;
        return OQ_EINVAL;
    }
    return write_envelope(e, NULL, 0, out, out_len, err);
}

int oq_envelope_encode_canon(const oq_envelope_t *e, const char *canon, size_t len, char **out,
                             size_t *out_len, oq_error_t *err)
{
    if (!out) return oq_error_set(err, OQ_EINVAL, 0, "invalid arguments");
    const int call = e && e->kind == OQ_KIND_TOOL_CALL;
    if (!e || (call && !canon) || (canon && (len < 2 || canon[0] != '{' || canon[len - 1] != '}')))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "encode_canon: the args or the result as a canonical object expected");
    /* every check but the member given as text: a result's error still is a tree */
    const oq_envelope_t *v = e;
    oq_envelope_t r;
    if (!call) {
        r = *e;
        r.result = NULL;
        v = &r;
    }
    if (call ? validate_fields(v, err) : oq_envelope_validate(v, err)) {
        if (err) err->code = OQ_EINVAL;
        return OQ_EINVAL;
    }
    return write_envelope(e, canon, len, out, out_len, err);
}

#undef PUT
#undef PUT_KEY

/* --- topic names ------------------------------------------------------------------------------ */

int oq_topic_prefix_check(const char *prefix, oq_error_t *err)
{
    size_t n = prefix ? strlen(prefix) : 0;
    if (n == 0 || n > 200) return oq_error_set(err, OQ_EINVAL, 0, "1 to 200 characters expected");
    if (strcmp(prefix, ".") == 0 || strcmp(prefix, "..") == 0)
        return oq_error_set(err, OQ_EINVAL, 0, "'%s' is not a valid prefix", prefix);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)prefix[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return oq_error_set(err, OQ_EINVAL, 0, "character %zu is not one of [A-Za-z0-9._-]",
                                i + 1);
    }
    return 0;
}

const char *oq_topic_name(const char *prefix, const char *logical, char *out, size_t cap)
{
    static const char base[] = OQ_TOPIC_PREFIX_DEFAULT;
    const size_t bl = sizeof base - 1;
    if (!prefix || !*prefix || strncmp(logical, base, bl) != 0)
        snprintf(out, cap, "%s", logical);
    else
        snprintf(out, cap, "%s%s", prefix, logical + bl);
    return out;
}

/* A webhook's URL: http or https, a host, at most OQ_MAX_CALLBACK_URL_LEN bytes of printable
 * ASCII without spaces (RFC 3986's characters; anything else must be percent-encoded), no
 * user:password@ (a secret in a URL ends up in logs and in the call's JSON). */
int oq_callback_url_check(const char *url, oq_error_t *err)
{
    size_t n = strlen(url);
    if (n == 0 || n > OQ_MAX_CALLBACK_URL_LEN)
        return oq_error_set(err, OQ_EINVAL, 0, "callback_url must be 1-%d bytes",
                            OQ_MAX_CALLBACK_URL_LEN);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)url[i] <= 0x20 || (unsigned char)url[i] >= 0x7f)
            return oq_error_set(err, OQ_EINVAL, 0,
                                "callback_url: byte %zu is a space, a control or a non-ASCII "
                                "byte (percent-encode it)",
                                i);
    size_t scheme = strncasecmp(url, "http://", 7) == 0    ? 7
                    : strncasecmp(url, "https://", 8) == 0 ? 8
                                                           : 0;
    if (!scheme)
        return oq_error_set(err, OQ_EINVAL, 0, "callback_url must be an http or https URL");
    const char *host = url + scheme;
    size_t hlen = strcspn(host, "/?#");
    if (hlen == 0 || host[0] == ':')
        return oq_error_set(err, OQ_EINVAL, 0, "callback_url has no host");
    if (memchr(host, '@', hlen))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "callback_url must not carry user:password@ (it would be stored and "
                            "shown with the call)");
    if (memchr(url, '#', n))
        return oq_error_set(err, OQ_EINVAL, 0, "callback_url must not have a #fragment");
    return 0;
}
