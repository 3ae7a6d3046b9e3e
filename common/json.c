/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Strict JSON, RFC 8785 (JCS) canonicalisation and call fingerprints.
 *
 * Parsing is jansson with JSON_REJECT_DUPLICATES | JSON_DECODE_ANY and without JSON_ALLOW_NUL,
 * preceded by our own UTF-8 check (so the error names the byte offset) and followed by one walk
 * that enforces the nesting limit and the +-2^53 integer range: RFC 8785 numbers are IEEE
 * doubles, and an integer a double cannot hold would silently change meaning in other clients.
 *
 * Canonicalisation writes into one growable malloc() buffer. Object members are sorted by the
 * UTF-16 code units of their keys, which is not UTF-8 byte order: a character above U+FFFF is
 * a surrogate pair (0xD800..0xDBFF first) and so sorts before U+E000..U+FFFF. Numbers follow
 * ECMAScript Number.prototype.toString: the shortest digit string that round-trips through
 * strtod (found by trying precisions; 15 digits are tried first because for normal doubles a
 * round-tripping 15-digit form, stripped of trailing zeros, is already the shortest), then laid
 * out per ECMA-262 7.1.12.1. Integers up to 2^53 take a direct path, since their decimal form
 * is exact and shortest. Every error path frees what it allocated; the caller's output pointer
 * is only written on success.
 *
 * The fingerprint is SHA-256 of {"args":..,"tenant":..,"tool":..}: those three keys are already
 * in UTF-16 order, so the canonical text is written directly without building a jansson object.
 */
#include "oq_json.h"

#include <errno.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JCS_MAX_SAFE_INT 9007199254740992LL /* 2^53 */
#define JCS_CANON_MAX_DEPTH 2048            /* hand-built values: bound the recursion */

/* --- UTF-8 ---------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..len), or 0 when it is invalid (overlong,
 * surrogate, above U+10FFFF, truncated). *cp receives the code point. */
static size_t utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xC2) return 0; /* continuation byte or overlong 2-byte lead */
    if (c < 0xE0) {
        if (len < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        if (len < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        uint32_t v = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        if (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF)) return 0;
        *cp = v;
        return 3;
    }
    if (c < 0xF5) {
        if (len < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        uint32_t v = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                     ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        if (v < 0x10000 || v > 0x10FFFF) return 0;
        *cp = v;
        return 4;
    }
    return 0;
}

/* Offset of the first invalid byte, or len when all of s is valid UTF-8. */
static size_t utf8_check(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t n = utf8_decode(s + i, len - i, &cp);
        if (n == 0) return i;
        i += n;
    }
    return len;
}

int oq_utf8_valid(const char *s, size_t len)
{
    if (!s) return len == 0;
    return utf8_check(s, len) == len;
}

size_t oq_utf8_repair(char *s)
{
    size_t fixed = 0, len = s ? strlen(s) : 0;
    for (size_t i = 0; i < len; i++) {
        i += utf8_check(s + i, len - i);
        if (i < len) {
            s[i] = '?';
            fixed++;
        }
    }
    return fixed;
}

/* --- jansson allocation failures ----------------------------------------------------------- */

/* jansson 2.14's parser does not report allocation failures reliably: some surface as
 * json_error_unknown or a misleading syntax error, and a failed buffer growth in its lexer
 * silently truncates the token being read (a string or number comes back shorter, and the
 * parse "succeeds"). So on first use we wrap whatever allocator jansson has (default malloc, or
 * one the application installed earlier, as jansson requires) with one that counts failures
 * per thread; a parse during which the count moved reports OQ_ENOMEM and returns nothing. */
static json_malloc_t inner_malloc;
static json_free_t inner_free;
static _Thread_local unsigned long jansson_alloc_failures;
static pthread_once_t counting_once = PTHREAD_ONCE_INIT;

static void *counting_malloc(size_t n)
{
    void *p = inner_malloc(n);
    if (!p) jansson_alloc_failures++;
    return p;
}

static void counting_free(void *p)
{
    inner_free(p);
}

static void counting_install(void)
{
    json_get_alloc_funcs(&inner_malloc, &inner_free);
    if (!inner_malloc || !inner_free) {
        inner_malloc = malloc;
        inner_free = free;
    }
    json_set_alloc_funcs(counting_malloc, counting_free);
}

/* --- parsing -------------------------------------------------------------------------------- */

/* *zero_real is set when the tree holds a real equal to 0 (see check_underflow). */
/* RFC 8785 numbers are IEEE doubles: an integer beyond +-2^53 has no exact canonical form. */
static int safe_int(json_int_t i, oq_error_t *err)
{
    if (i <= JCS_MAX_SAFE_INT && i >= -JCS_MAX_SAFE_INT) return 1;
    oq_error_set(err, OQ_ERANGE, 0,
                 "integer %lld is outside +-2^53; RFC 8785 numbers are IEEE doubles", (long long)i);
    return 0;
}

static int json_walk(const json_t *v, size_t depth, size_t max_depth, int *zero_real,
                     oq_error_t *err)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        if (depth + 1 > max_depth)
            return oq_error_set(err, OQ_EDEPTH, 0, "JSON nested deeper than %zu levels", max_depth);
        const char *key;
        size_t klen;
        json_t *m;
        json_object_keylen_foreach((json_t *)v, key, klen, m)
        {
            int rc = json_walk(m, depth + 1, max_depth, zero_real, err);
            if (rc) return rc;
        }
        (void)key;
        (void)klen;
        return 0;
    }
    case JSON_ARRAY: {
        if (depth + 1 > max_depth)
            return oq_error_set(err, OQ_EDEPTH, 0, "JSON nested deeper than %zu levels", max_depth);
        size_t n = json_array_size(v);
        for (size_t i = 0; i < n; i++) {
            int rc = json_walk(json_array_get(v, i), depth + 1, max_depth, zero_real, err);
            if (rc) return rc;
        }
        return 0;
    }
    case JSON_INTEGER: {
        json_int_t i = json_integer_value(v);
        if (!safe_int(i, err)) return OQ_ERANGE;
        return 0;
    }
    case JSON_REAL: {
        /* Every double of magnitude in (2^53, 1e21) is integral, and RFC 8785 writes it as an
         * integer literal ("1e20" -> "100000000000000000000") that this parser, like any int64
         * parser, would then refuse or read differently. Refuse it here, so that whatever we
         * accept has a canonical form we accept again. */
        double d = fabs(json_real_value(v));
        if (d == 0.0) *zero_real = 1;
        if (d > (double)JCS_MAX_SAFE_INT && d < 1e21) {
            char num[OQ_JCS_NUMBER_MAX];
            oq_jcs_number(json_real_value(v), num, NULL);
            return oq_error_set(err, OQ_ERANGE, 0,
                                "number %s is an integer outside +-2^53; RFC 8785 numbers are "
                                "IEEE doubles and would print it as an integer",
                                num);
        }
        return 0;
    }
    default:
        return 0;
    }
}

static int is_number_char(char c)
{
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* jansson reads numbers with strtod and refuses only overflow: a literal such as 1e-400
 * underflows to 0 and would be accepted as a 0 the client never sent (its fingerprint equal to
 * that of 0). Refuse it as overflow is refused. Called only when the tree holds a real 0, so
 * ordinary documents never pay for this second pass: it finds the number tokens of the text
 * (already parsed, so well formed: outside strings only numbers hold digits, '-' or '+') and
 * refuses one that has a non-zero digit before its exponent and still reads as 0. */
static int check_underflow(const char *buf, size_t len, oq_error_t *err)
{
    size_t i = 0;
    while (i < len) {
        char c = buf[i];
        if (c == '"') {
            for (i++; i < len && buf[i] != '"'; i++)
                if (buf[i] == '\\') i++;
            i++;
            continue;
        }
        if (c != '-' && (c < '0' || c > '9')) {
            i++;
            continue;
        }
        size_t start = i;
        int nonzero = 0, exp = 0;
        for (; i < len && is_number_char(buf[i]); i++) {
            if (buf[i] == 'e' || buf[i] == 'E') exp = 1;
            if (!exp && buf[i] >= '1' && buf[i] <= '9') nonzero = 1;
        }
        if (!nonzero) continue;
        size_t n = i - start;
        char small[64], *tok = n < sizeof small ? small : malloc(n + 1);
        if (!tok) return oq_error_set(err, OQ_ENOMEM, ENOMEM, "out of memory");
        memcpy(tok, buf + start, n);
        tok[n] = '\0';
        double d = strtod(tok, NULL);
        if (tok != small) free(tok);
        if (d == 0.0)
            return oq_error_set(err, OQ_ERANGE, 0,
                                "number %.*s%s at byte %zu is too small for an IEEE double and "
                                "would read as 0",
                                (int)(n > 40 ? 40 : n), buf + start, n > 40 ? "..." : "", start);
    }
    return 0;
}

int oq_json_parse(const char *buf, size_t len, size_t max_depth, json_t **out, oq_error_t *err)
{
    if (!out || (!buf && len)) return oq_error_set(err, OQ_EINVAL, 0, "invalid arguments");
    *out = NULL;
    if (max_depth == 0) max_depth = OQ_JSON_DEFAULT_MAX_DEPTH;
    if (!buf) buf = "";
    size_t bad = utf8_check(buf, len);
    if (bad != len)
        return oq_error_set(err, OQ_EUTF8, 0, "invalid UTF-8 at byte %zu (0x%02x)", bad,
                            (unsigned)(unsigned char)buf[bad]);

    json_error_t jerr;
    /* Some early failures (allocation in the lexer set-up) return without setting an error;
     * json_error_code() then reads the last text byte, so it must start as 0 ("unknown"). */
    memset(&jerr, 0, sizeof(jerr));
    pthread_once(&counting_once, counting_install);
    unsigned long failures_before = jansson_alloc_failures;
    json_t *v = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (v && jansson_alloc_failures != failures_before) { /* possibly truncated tokens */
        json_decref(v);
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory parsing %zu bytes of JSON", len);
    }
    if (!v) {
        int code;
        switch (json_error_code(&jerr)) {
        case json_error_duplicate_key:
            code = OQ_EDUPKEY;
            break;
        case json_error_invalid_utf8:
            code = OQ_EUTF8;
            break;
        case json_error_numeric_overflow:
            code = OQ_ERANGE;
            break;
        case json_error_stack_overflow:
            code = OQ_EDEPTH;
            break;
        case json_error_out_of_memory:
            code = OQ_ENOMEM;
            break;
        default:
            code = OQ_EINVAL;
            break;
        }
        if (jansson_alloc_failures != failures_before) code = OQ_ENOMEM;
        if (code == OQ_ENOMEM)
            return oq_error_set(err, OQ_ENOMEM, 0, "out of memory parsing %zu bytes of JSON", len);
        return oq_error_set(err, code, 0, "line %d column %d (byte %d): %s", jerr.line, jerr.column,
                            jerr.position, jerr.text);
    }
    int zero_real = 0;
    int rc = json_walk(v, 0, max_depth, &zero_real, err);
    if (rc == 0 && zero_real) rc = check_underflow(buf, len, err);
    if (rc) {
        json_decref(v);
        return rc;
    }
    *out = v;
    return 0;
}

/* --- output buffer -------------------------------------------------------------------------- */

typedef oq_jcs_buf_t jbuf_t;

static int jb_reserve(jbuf_t *b, size_t extra, oq_error_t *err)
{
    if (b->cap - b->len > extra) return 0; /* always keep room for the final NUL */
    int rc = oq_buf_reserve(b, extra);
    if (rc == OQ_ERANGE) return oq_error_set(err, OQ_ENOMEM, 0, "output too large");
    if (rc)
        return oq_error_set(err, OQ_ENOMEM, ENOMEM, "out of memory (%zu bytes)", b->len + extra);
    return 0;
}

static int jb_put(jbuf_t *b, const char *s, size_t n, oq_error_t *err)
{
    if (jb_reserve(b, n, err)) return OQ_ENOMEM;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static int jb_putc(jbuf_t *b, char c, oq_error_t *err)
{
    if (b->cap - b->len <= 1 && jb_reserve(b, 1, err)) return OQ_ENOMEM;
    b->p[b->len++] = c;
    return 0;
}

/* --- numbers -------------------------------------------------------------------------------- */

/* Decimal form of an integer with |i| <= 2^53 (exact, hence the ECMAScript form); returns the
 * length. Cheaper than snprintf on the hot path of integer-heavy args. */
static size_t jcs_int(long long i, char *out)
{
    char tmp[24];
    size_t n = 0, len = 0;
    unsigned long long u = i < 0 ? 0ULL - (unsigned long long)i : (unsigned long long)i;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (i < 0) out[len++] = '-';
    while (n)
        out[len++] = tmp[--n];
    out[len] = '\0';
    return len;
}

int oq_jcs_number(double d, char out[OQ_JCS_NUMBER_MAX], oq_error_t *err)
{
    if (!isfinite(d)) {
        out[0] = '\0';
        return oq_error_set(err, OQ_ERANGE, 0, "%s is not a JSON number (RFC 8785)",
                            isnan(d) ? "NaN" : "Infinity");
    }
    if (d == 0) { /* also -0 */
        memcpy(out, "0", 2);
        return 0;
    }
    if (fabs(d) <= (double)JCS_MAX_SAFE_INT && d == (double)(long long)d) {
        jcs_int((long long)d, out);
        return 0;
    }

    /* Shortest round-trip digits. %.*e yields the correctly rounded (closest) digits. */
    char tmp[40];
    int p = fabs(d) >= 2.2250738585072014e-308 ? 15 : 1; /* subnormals: fewer real digits */
    for (; p <= 17; p++) {
        snprintf(tmp, sizeof(tmp), "%.*e", p - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp = [-]D[.DDD]e(+|-)XX */
    const char *s = tmp;
    int neg = 0;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    char digits[20];
    int k = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9') digits[k++] = *s;
    while (k > 1 && digits[k - 1] == '0')
        k--;
    int e10 = (int)strtol(s + 1, NULL, 10);
    int n = e10 + 1; /* value = 0.DIGITS x 10^n */

    char *o = out;
    if (neg) *o++ = '-';
    if (k <= n && n <= 21) {
        memcpy(o, digits, (size_t)k);
        o += k;
        for (int i = 0; i < n - k; i++)
            *o++ = '0';
    } else if (0 < n && n <= 21) {
        memcpy(o, digits, (size_t)n);
        o += n;
        *o++ = '.';
        memcpy(o, digits + n, (size_t)(k - n));
        o += k - n;
    } else if (-6 < n && n <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -n; i++)
            *o++ = '0';
        memcpy(o, digits, (size_t)k);
        o += k;
    } else {
        *o++ = digits[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(k - 1));
            o += k - 1;
        }
        int x = n - 1;
        o += snprintf(o, 8, "e%c%d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    }
    *o = '\0';
    return 0;
}

/* --- strings -------------------------------------------------------------------------------- */

static int jcs_string(jbuf_t *b, const char *str, size_t len, oq_error_t *err)
{
    size_t bad = utf8_check(str, len);
    if (bad != len)
        return oq_error_set(err, OQ_EUTF8, 0, "string has invalid UTF-8 at byte %zu", bad);
    /* Worst case every byte becomes \u00XX: reserve once, then write without checks. */
    if (len > (SIZE_MAX - 2) / 6) return oq_error_set(err, OQ_ENOMEM, 0, "string too large");
    if (jb_reserve(b, 6 * len + 2, err)) return OQ_ENOMEM;
    static const char hex[] = "0123456789abcdef";
    char *o = b->p + b->len;
    *o++ = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)str[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"':
            *o++ = '"';
            break;
        case '\\':
            *o++ = '\\';
            break;
        case '\b':
            *o++ = 'b';
            break;
        case '\f':
            *o++ = 'f';
            break;
        case '\n':
            *o++ = 'n';
            break;
        case '\r':
            *o++ = 'r';
            break;
        case '\t':
            *o++ = 't';
            break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
            break;
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
    return 0;
}

/* --- objects -------------------------------------------------------------------------------- */

typedef struct jmember {
    const char *key;
    size_t klen;
    const json_t *value;
} jmember_t;

/* Sort key of a code point in UTF-16 code-unit order: BMP characters compare by value, others
 * by their surrogate pair (high surrogate 0xD800.. first), hence before U+E000..U+FFFF. */
static uint32_t utf16_order(uint32_t cp)
{
    if (cp < 0x10000) return cp << 16;
    cp -= 0x10000;
    return ((0xD800 + (cp >> 10)) << 16) | (0xDC00 + (cp & 0x3FF));
}

static int utf16_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    if (i == n) return alen < blen ? -1 : alen > blen;
    /* Back up to the start of the character holding the first difference: the bytes before i
     * are equal, so it starts at the same offset in both keys. */
    while (i > 0 && ((unsigned char)a[i] & 0xC0) == 0x80)
        i--;
    uint32_t ca = 0, cb = 0;
    if (!utf8_decode((const unsigned char *)a + i, alen - i, &ca)) ca = (unsigned char)a[i];
    if (!utf8_decode((const unsigned char *)b + i, blen - i, &cb)) cb = (unsigned char)b[i];
    uint32_t oa = utf16_order(ca), ob = utf16_order(cb);
    return oa < ob ? -1 : oa > ob;
}

static int member_cmp(const void *x, const void *y)
{
    const jmember_t *a = x, *b = y;
    return utf16_cmp(a->key, a->klen, b->key, b->klen);
}

static int jcs_value(jbuf_t *b, const json_t *v, size_t depth, oq_error_t *err);

static int jcs_object(jbuf_t *b, const json_t *obj, size_t depth, oq_error_t *err)
{
    size_t n = json_object_size(obj);
    if (n == 0) return jb_put(b, "{}", 2, err);
    jmember_t small[16];
    jmember_t *m = small;
    int rc = 0;
    if (n > sizeof(small) / sizeof(small[0])) {
        m = malloc(n * sizeof(*m));
        if (!m) return oq_error_set(err, OQ_ENOMEM, ENOMEM, "out of memory (%zu members)", n);
    }
    size_t i = 0;
    for (void *it = json_object_iter((json_t *)obj); it && i < n;
         it = json_object_iter_next((json_t *)obj, it)) {
        m[i].key = json_object_iter_key(it);
        m[i].klen = json_object_iter_key_len(it);
        m[i].value = json_object_iter_value(it);
        if (!oq_utf8_valid(m[i].key, m[i].klen)) {
            rc = oq_error_set(err, OQ_EUTF8, 0, "object key has invalid UTF-8");
            goto out;
        }
        i++;
    }
    n = i;
    if (n > 1) qsort(m, n, sizeof(*m), member_cmp);
    if ((rc = jb_putc(b, '{', err))) goto out;
    for (i = 0; i < n; i++) {
        if (i && (rc = jb_putc(b, ',', err))) goto out;
        if ((rc = jcs_string(b, m[i].key, m[i].klen, err))) goto out;
        if ((rc = jb_putc(b, ':', err))) goto out;
        if ((rc = jcs_value(b, m[i].value, depth + 1, err))) goto out;
    }
    rc = jb_putc(b, '}', err);
out:
    if (m != small) free(m);
    return rc;
}

static int jcs_value(jbuf_t *b, const json_t *v, size_t depth, oq_error_t *err)
{
    if (!v) return oq_error_set(err, OQ_EINVAL, 0, "NULL JSON value");
    if (depth > JCS_CANON_MAX_DEPTH)
        return oq_error_set(err, OQ_EDEPTH, 0, "JSON nested deeper than %d levels",
                            JCS_CANON_MAX_DEPTH);
    char num[OQ_JCS_NUMBER_MAX];
    int rc;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return jcs_object(b, v, depth, err);
    case JSON_ARRAY: {
        if ((rc = jb_putc(b, '[', err))) return rc;
        size_t n = json_array_size(v);
        for (size_t i = 0; i < n; i++) {
            if (i && (rc = jb_putc(b, ',', err))) return rc;
            if ((rc = jcs_value(b, json_array_get(v, i), depth + 1, err))) return rc;
        }
        return jb_putc(b, ']', err);
    }
    case JSON_STRING:
        return jcs_string(b, json_string_value(v), json_string_length(v), err);
    case JSON_INTEGER: {
        json_int_t i = json_integer_value(v);
        if (!safe_int(i, err)) return OQ_ERANGE;
        return jb_put(b, num, jcs_int((long long)i, num), err);
    }
    case JSON_REAL:
        if ((rc = oq_jcs_number(json_real_value(v), num, err))) return rc;
        return jb_put(b, num, strlen(num), err);
    case JSON_TRUE:
        return jb_put(b, "true", 4, err);
    case JSON_FALSE:
        return jb_put(b, "false", 5, err);
    case JSON_NULL:
        return jb_put(b, "null", 4, err);
    }
    return oq_error_set(err, OQ_EINVAL, 0, "unknown JSON type");
}

int oq_jcs_canonicalize(const json_t *v, char **out, size_t *out_len, oq_error_t *err)
{
    if (!out) return oq_error_set(err, OQ_EINVAL, 0, "invalid arguments");
    jbuf_t b = {0};
    return oq_jcs_buf_finish(&b, jcs_value(&b, v, 0, err), out, out_len, err);
}

/* --- piecewise writer (oq_json.h) ----------------------------------------------------------- */

int oq_jcs_put_raw(oq_jcs_buf_t *b, const char *s, size_t n, oq_error_t *err)
{
    return jb_put(b, s, n, err);
}

int oq_jcs_put_string(oq_jcs_buf_t *b, const char *s, oq_error_t *err)
{
    if (!s) return oq_error_set(err, OQ_EINVAL, 0, "NULL string");
    return jcs_string(b, s, strlen(s), err);
}

int oq_jcs_put_stringn(oq_jcs_buf_t *b, const char *s, size_t n, oq_error_t *err)
{
    if (!s) return oq_error_set(err, OQ_EINVAL, 0, "NULL string");
    return jcs_string(b, s, n, err);
}

int oq_jcs_put_int(oq_jcs_buf_t *b, long long i, oq_error_t *err)
{
    char num[24];
    if (i > JCS_MAX_SAFE_INT || i < -JCS_MAX_SAFE_INT)
        return oq_error_set(err, OQ_ERANGE, 0,
                            "integer %lld is outside +-2^53; RFC 8785 numbers are IEEE doubles", i);
    return jb_put(b, num, jcs_int(i, num), err);
}

int oq_jcs_put_value(oq_jcs_buf_t *b, const json_t *v, oq_error_t *err)
{
    return jcs_value(b, v, 0, err);
}

int oq_jcs_buf_finish(oq_jcs_buf_t *b, int rc, char **out, size_t *out_len, oq_error_t *err)
{
    if (rc == 0 && !out) rc = oq_error_set(err, OQ_EINVAL, 0, "invalid arguments");
    if (rc == 0) rc = jb_reserve(b, 1, err);
    if (rc) {
        free(b->p);
    } else {
        b->p[b->len] = '\0';
        *out = b->p;
        if (out_len) *out_len = b->len;
    }
    b->p = NULL;
    b->len = b->cap = 0;
    b->err = 0;
    return rc;
}

int oq_jcs_canonicalize_text(const char *buf, size_t len, char **out, size_t *out_len,
                             oq_error_t *err)
{
    json_t *v = NULL;
    int rc = oq_json_parse(buf, len, 0, &v, err);
    if (rc) return rc;
    rc = oq_jcs_canonicalize(v, out, out_len, err);
    json_decref(v);
    return rc;
}

/* --- fingerprint ---------------------------------------------------------------------------- */

/* OpenSSL 3 looks the digest up on every EVP_sha256() use (about half the cost of hashing a
 * small text); fetch it once per process. The reference is deliberately never released. */
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static const EVP_MD *sha256_md;

static void sha256_init(void)
{
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
#endif
    if (!sha256_md) sha256_md = EVP_sha256();
}

int oq_sha256(const void *data, size_t len, unsigned char out[32])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    pthread_once(&sha256_once, sha256_init);
    if (!sha256_md || EVP_Digest(data, len, md, &mdlen, sha256_md, NULL) != 1 || mdlen != 32)
        return OQ_ECRYPTO;
    memcpy(out, md, 32);
    return 0;
}

/* The one fingerprint writer: SHA-256 of {"args":…,"tenant":…,"tool":…} ("args" < "tenant" <
 * "tool" in UTF-16 order, so this is the canonical member order), the args given either as a
 * tree (canonicalised here) or as text already in RFC 8785 form (written verbatim). */
static int fingerprint(const char *tenant, const char *tool, const json_t *args,
                       const char *args_canon, size_t args_len, char out[OQ_FINGERPRINT_LEN + 1],
                       oq_error_t *err)
{
    if (!tenant || !tool || (!args && !args_canon) || !out)
        return oq_error_set(err, OQ_EINVAL, 0, "fingerprint needs tenant, tool and args");
    jbuf_t b = {0};
    int rc;
    if ((rc = jb_put(&b, "{\"args\":", 8, err))) goto out;
    if ((rc = args ? jcs_value(&b, args, 1, err) : jb_put(&b, args_canon, args_len, err))) goto out;
    if ((rc = jb_put(&b, ",\"tenant\":", 10, err))) goto out;
    if ((rc = jcs_string(&b, tenant, strlen(tenant), err))) goto out;
    if ((rc = jb_put(&b, ",\"tool\":", 8, err))) goto out;
    if ((rc = jcs_string(&b, tool, strlen(tool), err))) goto out;
    if ((rc = jb_putc(&b, '}', err))) goto out;

    unsigned char md[32];
    if (oq_sha256(b.p, b.len, md) != 0) {
        rc = oq_error_set(err, OQ_ECRYPTO, 0, "EVP_Digest(SHA-256) failed");
        goto out;
    }
    static const char hex[] = "0123456789abcdef";
    for (unsigned int i = 0; i < 32; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[OQ_FINGERPRINT_LEN] = '\0';
out:
    free(b.p);
    return rc;
}

int oq_fingerprint(const char *tenant, const char *tool, const json_t *args,
                   char out[OQ_FINGERPRINT_LEN + 1], oq_error_t *err)
{
    if (!args) return oq_error_set(err, OQ_EINVAL, 0, "fingerprint needs tenant, tool and args");
    return fingerprint(tenant, tool, args, NULL, 0, out, err);
}

int oq_fingerprint_canon(const char *tenant, const char *tool, const char *args_canon,
                         size_t args_len, char out[OQ_FINGERPRINT_LEN + 1], oq_error_t *err)
{
    if (!args_canon)
        return oq_error_set(err, OQ_EINVAL, 0, "fingerprint needs tenant, tool and args");
    return fingerprint(tenant, tool, NULL, args_canon, args_len, out, err);
}

/* --- output --------------------------------------------------------------------------------
 * jansson writes a real with "%.17g" (JSON_REAL_PRECISION(0)), which round-trips but shows
 * the binary noise of most decimals: 3.545 comes out as 3.5449999999999999. oq_json_dumps()
 * keeps jansson's layout (indentation, key order, escaping) and rewrites only the reals, as
 * the shortest "%.*g" text that reads back as the same double, in jansson's form (a '.' or an
 * exponent always present, no '+' or leading zeros in the exponent). It finds the reals in
 * jansson's output stream: json_dump_callback() emits a real as one chunk, and a string as
 * a lone '"', its content (never a lone '"': a quote inside is written escaped) and a lone
 * '"', so outside strings a chunk that starts like a number and holds '.', 'e' or 'E' is a
 * real (an integer has none of them). */

typedef struct dump_buf {
    oq_buf_t b;
    int in_string;
} dump_buf_t;

static int dump_put(dump_buf_t *d, const char *s, size_t n)
{
    return oq_buf_put(&d->b, s, n) ? -1 : 0;
}

void oq_json_real_text(double x, char out[OQ_JSON_REAL_MAX])
{
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(out, OQ_JSON_REAL_MAX, "%.*g", prec, x);
        if (strtod(out, NULL) == x) break;
    }
    char *e = strchr(out, 'e');
    int x10 = e ? atoi(e + 1) : 0;
    if (e && x10 >= -4 && x10 < 17) { /* positional, as "%.17g" would be: 100.0, not 1e2 */
        snprintf(out, OQ_JSON_REAL_MAX, "%.*g", x10 + 1 > prec ? x10 + 1 : prec, x);
        e = strchr(out, 'e');
    }
    if (e) { /* "1e+21" -> "1e21", "1e-05" -> "1e-5" */
        char *d = e + 1, *s = e + 1;
        if (*s == '+')
            s++;
        else if (*s == '-')
            *d++ = *s++;
        while (*s == '0' && s[1])
            s++;
        memmove(d, s, strlen(s) + 1);
    } else if (!strchr(out, '.') && strspn(out, "-0123456789") == strlen(out)) {
        strcat(out, ".0"); /* still a real when read back */
    }
}

static int dump_chunk(const char *buf, size_t size, void *data)
{
    dump_buf_t *d = data;
    if (size == 1 && buf[0] == '"') {
        d->in_string = !d->in_string;
        return dump_put(d, buf, 1);
    }
    if (!d->in_string && size > 0 && size < 64 &&
        (buf[0] == '-' || (buf[0] >= '0' && buf[0] <= '9')) &&
        (memchr(buf, '.', size) || memchr(buf, 'e', size) || memchr(buf, 'E', size))) {
        char in[64], num[OQ_JSON_REAL_MAX];
        memcpy(in, buf, size);
        in[size] = '\0';
        oq_json_real_text(strtod(in, NULL), num);
        return dump_put(d, num, strlen(num));
    }
    return dump_put(d, buf, size);
}

char *oq_json_dumps(const json_t *v, size_t flags)
{
    dump_buf_t d = {0};
    if (json_dump_callback(v, dump_chunk, &d, flags) != 0 || !d.b.p) {
        oq_buf_free(&d.b);
        return NULL;
    }
    return oq_buf_take(&d.b, NULL);
}
