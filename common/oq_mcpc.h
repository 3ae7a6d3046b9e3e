/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_mcpc.h
 * @brief Internal: a minimal synchronous MCP client (Streamable HTTP, JSON-RPC over POST) for
 *        what onceq asks an upstream MCP server outside the call path: `initialize` (the
 *        session of a tool of kind "mcp", consumer/mcp_tools.c) and `tools/list` (the tools
 *        file's `"import": {"mcp": URL}`, common/catalog.c). The calls themselves go through
 *        the consumer's HTTP executor; their answers are read with oq__mcpc_answer().
 */
#ifndef OQ_MCPC_H
#define OQ_MCPC_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "oq_error.h"

/** The protocol version onceq asks an upstream for. */
#define OQ_MCPC_VERSION "2025-06-18"
/** Room for an Mcp-Session-Id (visible ASCII, bounded here). */
#define OQ_MCPC_SID_MAX 256

/**
 * @brief The JSON-RPC response whose id is \p id in an answer \p body of \p len bytes: a JSON
 *        object, or an SSE stream (`data:` lines of `message` events), as Streamable HTTP
 *        allows either. @returns a new reference, or NULL when the answer holds none.
 */
json_t *oq__mcpc_answer(const char *body, size_t len, const json_t *id);

/**
 * @brief `initialize` then `notifications/initialized` with the upstream at \p url.
 * @param headers NULL-terminated "Name: value" lines to add (credentials), or NULL.
 * @param sid receives the session id the upstream gave ("" for a stateless upstream).
 * @returns 0; OQ_EIO (unreachable, or no valid answer: \p err says which), OQ_ETIMEDOUT.
 */
int oq__mcpc_initialize(const char *url, const char *const *headers, int64_t timeout_ms,
                        char sid[OQ_MCPC_SID_MAX], oq_error_t *err);

/**
 * @brief The upstream's whole `tools/list` (every page), in a session of its own that is
 *        closed after. @param tools receives a new array of Tool objects.
 * @returns 0, or OQ_EIO / OQ_ETIMEDOUT with \p err naming \p url.
 */
int oq__mcpc_list_tools(const char *url, int64_t timeout_ms, json_t **tools, oq_error_t *err);

#endif
