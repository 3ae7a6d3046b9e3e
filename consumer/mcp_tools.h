/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file mcp_tools.h
 * @brief Internal: tools of kind "mcp" (consumer/mcp_tools.c): a tool that forwards the call to
 *        a `tools/call` of an upstream MCP server, over the HTTP tools' executor. Not part of
 *        the public API.
 *
 * In the tools file (examples/tools.json):
 *
 *     {"name": "pay", "kind": "mcp", "url": "http://127.0.0.1:9000/mcp",
 *      "tool": "make_payment",          // the upstream's name (default: name)
 *      "idempotent": true,              // the upstream honours idempotencyKey: resend is safe
 *      "headers": {"Authorization": {"env": "UP_TOKEN", "prefix": "Bearer "}},
 *      "object_id": "/id",              // in the result's structuredContent
 *      "timeout_ms": 10000, "connect_timeout_ms": 2000,
 *      "lookup": {"tool": "find_payment", "arguments": {"reference": "{effect_id}"},
 *                 "exists": "/id", "object_id": "/id", "settle_ms": 10000}}
 *
 * The effect id goes as `params.idempotencyKey`, as `params._meta["io.onceq/idempotency-key"]`
 * and as the JSON-RPC id (and an Idempotency-Key header). The answer classes are the HTTP
 * tools' ones (http_tools.h), refined by what the JSON-RPC answer says: see mcp_tools.c.
 */
#ifndef OQ_CONSUMER_MCP_TOOLS_H
#define OQ_CONSUMER_MCP_TOOLS_H

#include <jansson.h>

#include "dispatch.h"
#include "http_tools.h"
#include "oq_error.h"

typedef struct oq__mcp_tool oq__mcp_tool_t;

/**
 * @brief Translate the tools-file object \p o of kind "mcp" into the HTTP tool objects the
 *        HTTP parser reads: \p call (the tools/call request) and \p lookup (a tool object whose
 *        call is the lookup's tools/call; NULL when none). New references.
 * @param field, why on error: the field at fault and what is wrong (for the parser's message).
 * @returns 0, or OQ_EINVAL / OQ_ENOMEM.
 */
int oq__mcp_tool_translate(const json_t *o, json_t **call, json_t **lookup, const char **field,
                           char *why, size_t why_cap);

/**
 * @brief Finish the parsed tool \p t (its call parsed from the translation, \p lookup_req the
 *        call request of the parsed lookup object, moved into t->lookup): keep the answer paths
 *        of \p o, add the session header. Sets t->mcp.
 * @returns 0 or OQ_ENOMEM.
 */
int oq__mcp_tool_bind(oq__http_tool_t *t, const json_t *o, oq__http_request_t *lookup_req,
                      oq_error_t *err);

/** @brief Free the MCP part of a tool; accepts NULL. */
void oq__mcp_tool_free(oq__mcp_tool_t *m);

/**
 * @brief Before a request of \p t is handed to the executor: open the upstream session when
 *        there is none (initialize; bounded by the tool's connect timeout and 5 s, at most
 *        once a second while the upstream is down; a failure only logs: the request is sent
 *        anyway and classified as usual).
 * @locality the dispatcher thread (the only one that reads the tool's header lines).
 */
void oq__mcp_before_send(const oq__http_tool_t *t);

/** An MCP tool's answer, refined from the JSON-RPC response (oq__mcp_refine). */
typedef struct oq__mcp_answer {
    oq__http_outcome_t h; /**< the HTTP outcome as the JSON-RPC answer says it: class, code,
                               message, object id, and the body (the CallToolResult) */
    char code[48];
    char message[256];
    char object_id[256];
    char *body; /**< owned (oq__mcp_answer_clear) */
} oq__mcp_answer_t;

/**
 * @brief Refine \p o, the HTTP outcome of a request of the "mcp" tool \p t (a call, or its
 *        lookup when \p lookup), from the JSON-RPC response in its body, into \p a: the classes
 *        stay the HTTP tools' ones, and oq__outcome_from_http (execution.c) says what they
 *        mean, as for any outside answer. A tool of another kind: \p a->h is \p o unchanged.
 *        Release with oq__mcp_answer_clear. @locality the dispatcher thread.
 */
void oq__mcp_refine(const oq__http_tool_t *t, int lookup, const oq__http_outcome_t *o,
                    oq__mcp_answer_t *a);

/** @brief Free what \p a owns; accepts NULL. */
void oq__mcp_answer_clear(oq__mcp_answer_t *a);

#endif
