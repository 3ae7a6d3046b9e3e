/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_catalog.h
 * @brief The tool catalogue: which tools exist, what their arguments must look like, and what
 *        a caller may rely on (keys honoured, lookup offered). Read from the tools file by the
 *        producer (to refuse an unknown tool or bad arguments before anything is written, and
 *        to serve GET /v1/tools) and by the consumer (whose HTTP tools parser, in
 *        consumer/http_tools.c, builds on this one: one parser for one file).
 *
 * The catalogue holds the tools of the file, in file order, followed by the tools compiled
 * into onceq (charge, send_email, sleep, fail: their schemas live here, their code in
 * consumer/tools.c). Per tool of the file it reads `name`, `description`, `input_schema` (a
 * JSON Schema, the subset of oq_jschema.h, compiled at load), `annotations` (MCP's: title,
 * readOnlyHint, destructiveHint, idempotentHint, openWorldHint), `idempotent` and whether a
 * `lookup` is declared; it checks every field name of a tool against the whole format (the
 * HTTP fields are checked in depth by the consumer only: the producer never reads secrets).
 * A tool without input_schema accepts any argument object.
 *
 * A loaded catalogue is read only: any thread may use it.
 */
#ifndef OQ_CATALOG_H
#define OQ_CATALOG_H

#include <jansson.h>
#include <stddef.h>

#include "oq_error.h"
#include "oq_jschema.h"

typedef struct oq_catalog oq_catalog_t;

/**
 * @brief Parse a tools file from \p len bytes of \p text; \p origin names it in errors.
 * @returns 0 with \p out set (free with oq_catalog_destroy), or OQ_EINVAL with \p err naming
 *          the file and the line and column (syntax) or the tool and the field (and, for a
 *          schema, the JSON pointer of the refused keyword), or OQ_ENOMEM.
 */
int oq_catalog_parse(const char *text, size_t len, const char *origin, oq_catalog_t **out,
                     oq_error_t *err);

/** @brief Read and parse the file \p path (OQ_EIO unreadable, OQ_ETOOBIG over 16 MiB). */
int oq_catalog_load(const char *path, oq_catalog_t **out, oq_error_t *err);

/** @brief Free; accepts NULL. */
void oq_catalog_destroy(oq_catalog_t *c);

/** @brief Non-zero when \p tool is in the catalogue (declared in the file or compiled in). */
int oq_catalog_has(const oq_catalog_t *c, const char *tool);

/**
 * @brief Check a call's arguments before it is accepted.
 * @param v receives the first violation of the tool's input_schema; may be NULL.
 * @returns 0 (known tool, \p args valid), OQ_ENOTFOUND (no such tool), OQ_EINVAL (\p args
 *          violate the schema, \p v filled; \p args not an object is a violation at "").
 */
int oq_catalog_check(const oq_catalog_t *c, const char *tool, const json_t *args,
                     oq_jschema_violation_t *v);

/**
 * @brief The catalogue as a JSON array, one object per tool: name, description ("" when none),
 *        input_schema (as written; {"type":"object"} when none), annotations (as written; {}
 *        when none), honours_keys (the downstream honours the idempotency key: "idempotent"
 *        of an HTTP tool; true for compiled tools, which run under onceq's own effect
 *        ledger), has_lookup, kind ("http" or "compiled").
 * @returns a new reference, or NULL when out of memory.
 */
json_t *oq_catalog_list(const oq_catalog_t *c);

/** @brief Number of tools (file and compiled). */
size_t oq_catalog_size(const oq_catalog_t *c);

/* --- for consumer/http_tools.c ----------------------------------------------------------- */

/** @brief Number of tools declared in the file (the first ones of the catalogue). */
size_t oq__catalog_nfile(const oq_catalog_t *c);

/** @brief The JSON object that declared file tool \p i (borrowed; lives as long as \p c). */
const json_t *oq__catalog_file_tool(const oq_catalog_t *c, size_t i);

/**
 * @brief Read the whole file \p path (at most 16 MiB).
 * @param out malloc()ed bytes, NUL-terminated (caller free()s); \p len their count.
 */
int oq__catalog_read_file(const char *path, char **out, size_t *len, oq_error_t *err);

#endif
