/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_json.h
 * @brief Strict JSON parsing, RFC 8785 (JCS) canonicalisation and call fingerprints.
 *
 * Parsing is strict on purpose: a request body must mean the same thing to every parser that
 * will ever read it, so duplicate object keys, invalid UTF-8, integers outside +-2^53 (RFC 8785
 * numbers are IEEE doubles), NaN/Infinity and nesting deeper than a limit are all refused.
 * So are numbers such as 1e20 whose canonical form is an integer literal beyond +-2^53 (every
 * double of magnitude in (2^53, 1e21)): whatever parses has a canonical form that parses again.
 */
#ifndef OQ_JSON_H
#define OQ_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "oq_buf.h"
#include "oq_error.h"

#define OQ_JSON_DEFAULT_MAX_DEPTH 64
#define OQ_FINGERPRINT_LEN 64 /**< SHA-256 as lowercase hex. */

/**
 * @brief Parse \p len bytes of JSON text (any top-level value).
 * @param max_depth maximum nesting of arrays/objects (0 = OQ_JSON_DEFAULT_MAX_DEPTH).
 * @param out receives a new reference on success (caller json_decref()s it).
 * @returns 0, or OQ_EINVAL (syntax), OQ_EUTF8, OQ_EDUPKEY, OQ_ERANGE, OQ_EDEPTH, OQ_ENOMEM,
 *          with a message that names the position where known.
 * @remark The first call wraps jansson's allocator (json_get_alloc_funcs) to detect allocation
 *         failures, which jansson's parser does not report reliably. An application that calls
 *         json_set_alloc_funcs() must do so before this, as jansson already requires.
 */
int oq_json_parse(const char *buf, size_t len, size_t max_depth, json_t **out, oq_error_t *err);

/**
 * @brief RFC 8785 canonical form of \p v.
 * @param out receives a malloc()ed NUL-terminated string (caller free()s), \p out_len its
 *        length (may be NULL).
 * @returns 0, or OQ_ERANGE (NaN/Infinity, integer beyond +-2^53), OQ_EUTF8, OQ_ENOMEM.
 */
int oq_jcs_canonicalize(const json_t *v, char **out, size_t *out_len, oq_error_t *err);

/**
 * @brief Canonicalise \p len bytes of JSON text (parse with oq_json_parse, then JCS).
 * Same ownership and errors as the two functions it combines.
 */
int oq_jcs_canonicalize_text(const char *buf, size_t len, char **out, size_t *out_len,
                             oq_error_t *err);

/**
 * @brief Fingerprint of a call: lowercase hex SHA-256 of the JCS form of
 *        {"args":args,"tenant":tenant,"tool":tool}.
 * @param out 65 bytes, NUL-terminated on success.
 * @returns 0, or an error from canonicalisation, or OQ_ECRYPTO.
 */
int oq_fingerprint(const char *tenant, const char *tool, const json_t *args,
                   char out[OQ_FINGERPRINT_LEN + 1], oq_error_t *err);

/**
 * @brief oq_fingerprint() of args the caller already holds in RFC 8785 form (the text
 *        oq_jcs_canonicalize() wrote): the same digest, without canonicalising them again.
 * @param args_canon \p args_len bytes of canonical JSON, written verbatim (not checked).
 * @returns 0, OQ_EINVAL, OQ_EUTF8 (tenant or tool not UTF-8), OQ_ENOMEM or OQ_ECRYPTO.
 */
int oq_fingerprint_canon(const char *tenant, const char *tool, const char *args_canon,
                         size_t args_len, char out[OQ_FINGERPRINT_LEN + 1], oq_error_t *err);

/** @brief SHA-256 of \p len bytes into \p out (the digest fetched once per process).
 *  @returns 0 or OQ_ECRYPTO. */
int oq_sha256(const void *data, size_t len, unsigned char out[32]);

/** @brief Non-zero when \p s (length \p len) is valid UTF-8 (no surrogates, no overlongs). */
int oq_utf8_valid(const char *s, size_t len);

/**
 * @brief Makes the C string \p s valid UTF-8 in place: every byte that does not belong to a
 *        valid sequence (a character that a byte limit cut in two, a stray byte) becomes '?'.
 *        Text from outside, once cut to fit a buffer, goes through this before it is stored.
 * @returns how many bytes were replaced (0: it was valid).
 */
size_t oq_utf8_repair(char *s);

/**
 * Canonical JSON written piece by piece, for documents whose members the caller already writes
 * in RFC 8785 order (sorted keys, no whitespace), so no tree has to be built and sorted: the
 * envelope codec uses it. Zero-initialise; every put appends, or returns OQ_ENOMEM / the
 * error of the value and leaves the buffer for oq_jcs_buf_finish() or free(b->p).
 */
typedef oq_buf_t oq_jcs_buf_t;

/** Appends \p n bytes verbatim (punctuation, keys known to need no escaping). */
int oq_jcs_put_raw(oq_jcs_buf_t *b, const char *s, size_t n, oq_error_t *err);
/** Appends \p s as an RFC 8785 string (quoted, escaped); OQ_EUTF8 if not valid UTF-8. */
int oq_jcs_put_string(oq_jcs_buf_t *b, const char *s, oq_error_t *err);
/** As oq_jcs_put_string(), of \p n bytes that need not end in a NUL (a NUL among them is
 *  written escaped). */
int oq_jcs_put_stringn(oq_jcs_buf_t *b, const char *s, size_t n, oq_error_t *err);
/** Appends an integer; OQ_ERANGE beyond +-2^53, as oq_jcs_canonicalize(). */
int oq_jcs_put_int(oq_jcs_buf_t *b, long long i, oq_error_t *err);
/** Appends the canonical form of \p v (as oq_jcs_canonicalize()). */
int oq_jcs_put_value(oq_jcs_buf_t *b, const json_t *v, oq_error_t *err);
/** NUL-terminates and hands the text over (\p out, \p out_len may be NULL); on \p rc != 0 or
 *  failure frees the buffer and returns the error. The buffer is empty afterwards. */
int oq_jcs_buf_finish(oq_jcs_buf_t *b, int rc, char **out, size_t *out_len, oq_error_t *err);

/** Buffer size for oq_jcs_number() ("-1.7976931348623157e+308" and the like, plus NUL). */
#define OQ_JCS_NUMBER_MAX 32

/**
 * @brief Serialise \p d as ECMAScript Number.prototype.toString() does (RFC 8785 section
 *        3.2.2.3): shortest round-trip digits, "-0" as "0", exponent form outside [1e-6, 1e21).
 * @param out receives the NUL-terminated text.
 * @returns 0, or OQ_ERANGE for NaN and +-Infinity.
 */
int oq_jcs_number(double d, char out[OQ_JCS_NUMBER_MAX], oq_error_t *err);

/** Buffer size for oq_json_real_text(). */
#define OQ_JSON_REAL_MAX 40

/**
 * @brief \p x as the shortest "%.*g" text that reads back as \p x, in jansson's form: always
 *        a '.' or an exponent (3.0 is "3.0"), no '+' or leading zeros in the exponent (1e21).
 */
void oq_json_real_text(double x, char out[OQ_JSON_REAL_MAX]);

/**
 * @brief json_dumps() with reals written by oq_json_real_text(): 3.545, not jansson's
 *        3.5449999999999999. The one writer of JSON that people read (command output, HTTP
 *        answers); the layout (\p flags: JSON_INDENT, JSON_COMPACT, JSON_SORT_KEYS, ...) is
 *        jansson's. Canonical forms (fingerprints, bodies sent downstream) are RFC 8785:
 *        oq_jcs_canonicalize().
 * @returns a malloc()ed string (caller free()s), or NULL (out of memory, or a value jansson
 *          cannot write, as json_dumps()).
 */
char *oq_json_dumps(const json_t *v, size_t flags);

#endif
