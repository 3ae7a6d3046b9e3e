/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_jschema.h
 * @brief A JSON Schema (draft 2020-12) validator for a documented subset, compiled once and
 *        then used from any thread.
 *
 * Supported (everything else is refused at compile time, with the JSON pointer of the keyword,
 * so a schema is never silently weaker than written):
 *  - validation: type (a name or an array of names; "integer" also accepts 1.0), enum, const,
 *    minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf, minLength, maxLength
 *    (in Unicode code points), pattern (POSIX ERE, see below), minItems, maxItems,
 *    uniqueItems, minProperties, maxProperties, required;
 *  - applicators: properties, additionalProperties (boolean or schema), items, prefixItems,
 *    allOf, anyOf, oneOf, not, $ref (only "#/$defs/NAME", resolved against the root's $defs;
 *    "~0"/"~1" escapes decoded), $defs;
 *  - annotations (no effect on validity): title, description, default, examples, deprecated,
 *    readOnly, writeOnly, $comment, format (never asserted), $id (root only), $schema (root
 *    only, and only the 2020-12 meta-schema URI).
 *  - boolean schemas (true / false) wherever a schema may stand.
 *
 * pattern is a POSIX extended regular expression compiled with regcomp(REG_EXTENDED |
 * REG_NOSUB) in the C library's current locale (bytes in the C locale, which onceq keeps) and
 * searched unanchored, as the spec says (write ^...$ to anchor). A pattern regcomp refuses is
 * refused at compile time, and so are patterns glibc cannot run in bounded time or memory:
 * adjacent quantifiers ("a+*", undefined in POSIX), back-references, a bound over 255,
 * repetitions expanding past 20000 atoms, more than 1024 bytes. ECMA-262 specifics (\d, \w,
 * lookaround, lazy quantifiers) are not POSIX: "\d" is refused by some C libraries and means a
 * literal "d" in others, so write [0-9]. A string holding U+0000 is matched up to it.
 *
 * Equality (enum, const, uniqueItems) is JSON equality: 1 and 1.0 are equal, object member
 * order does not matter. multipleOf is exact on integers; with a non-integer on either side
 * the quotient counts as whole within a relative 1e-9, so 19.99 is a multiple of 0.01 (binary
 * floating point alone says it is not, and so do validators that divide naively).
 *
 * Bounds: compiling stops at 64 levels of nested schemas; a $ref cycle that does not descend
 * into the instance ({"$ref": "#/$defs/a"} with a = {"$ref": "#/$defs/a"}, or through
 * allOf/anyOf/oneOf/not) is refused at compile time; a validation stops after 128 levels of
 * recursion or 10 million steps and then reports a violation (keyword "$limit"), never loops.
 */
#ifndef OQ_JSCHEMA_H
#define OQ_JSCHEMA_H

#include <jansson.h>

#include "oq_error.h"

typedef struct oq_jschema oq_jschema_t;

/** Where and why an instance fails. Filled by oq_jschema_validate; no allocation. */
typedef struct oq_jschema_violation {
    char pointer[512]; /**< JSON pointer into the instance ("" = the whole document); for a
                            missing required property, the pointer the property would have */
    char keyword[32];  /**< the failing keyword ("type", "required", "$limit", ...) */
    char reason[200];  /**< human-readable, e.g. "expected integer, got string" */
} oq_jschema_violation_t;

/**
 * @brief Compile \p schema (borrowed; a deep copy is kept).
 * @returns 0 with \p out set (free with oq_jschema_destroy), OQ_EINVAL with \p err saying
 *          "at POINTER: ..." (the pointer into the schema), or OQ_ENOMEM.
 */
int oq_jschema_compile(const json_t *schema, oq_jschema_t **out, oq_error_t *err);

/** @brief Free; accepts NULL. */
void oq_jschema_destroy(oq_jschema_t *s);

/** @brief The schema as compiled (borrowed, valid while \p s lives). */
const json_t *oq_jschema_source(const oq_jschema_t *s);

/**
 * @brief Validate \p instance against \p s. Thread-safe (\p s is read only).
 * @param v receives the first violation (keywords are checked in a fixed order); may be NULL.
 * @returns 0 when valid, OQ_EINVAL when not (\p v filled).
 */
int oq_jschema_validate(const oq_jschema_t *s, const json_t *instance, oq_jschema_violation_t *v);

/** @brief JSON equality as JSON Schema defines it (1 == 1.0; member order ignored). */
int oq_jschema_equal(const json_t *a, const json_t *b);

#endif
