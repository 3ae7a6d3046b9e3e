/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_mcp.h
 * @brief The producer's MCP gateway (POST /mcp): JSON-RPC 2.0 over MCP's Streamable HTTP
 *        transport, sessions, and tools/call as an effectively-once onceq call. No HTTP
 *        library here: producer/http.c reads the request, hands the body over, queues the
 *        submit job this module prepared, waits with the call waiters and sends the answer.
 *
 * Thread-safety: an oq_mcp_t may be used from any thread; an oq_mcp_call_t by one at a time.
 */
#ifndef OQ_MCP_H
#define OQ_MCP_H

#include <stddef.h>
#include <stdint.h>

#include "oq_error.h"
#include "oq_producer.h"

struct oq_catalog;

/** Default --mcp-wait: how long a tools/call waits for its call to settle, in ms. */
#define OQ_MCP_WAIT_DEFAULT_MS 30000
/** Mcp-Session-Id: 32 lowercase hex digits. */
#define OQ_MCP_SID_LEN 32

typedef struct oq_mcp oq_mcp_t;
typedef struct oq_mcp_call oq_mcp_call_t;

/** What http.c read from the request (each NULL when absent). */
typedef struct oq_mcp_in {
    const char *session; /**< Mcp-Session-Id */
    const char *proto;   /**< MCP-Protocol-Version */
    const char *accept;  /**< Accept */
    const char *origin;  /**< Origin */
    const char *host;    /**< Host */
    const char *tenant;  /**< the bearer token's tenant; NULL without authentication */
} oq_mcp_in_t;

/** An answer to send. */
typedef struct oq_mcp_out {
    unsigned status;                  /**< HTTP status */
    char *body;                       /**< malloc()ed, NUL-terminated; NULL: no body */
    const char *ctype;                /**< Content-Type of the body */
    char session[OQ_MCP_SID_LEN + 1]; /**< Mcp-Session-Id to send; "" none */
    const char *allow;                /**< Allow header (405), or NULL */
} oq_mcp_out_t;

/**
 * @brief New gateway over \p catalog (borrowed; NULL: no tool list, any tool name accepted as
 *        on POST /v1/tool-calls), tools/call waiting up to \p wait_ms (<= 0: the default).
 */
int oq_mcp_new(const struct oq_catalog *catalog, int64_t wait_ms, oq_mcp_t **out, oq_error_t *err);
void oq_mcp_destroy(oq_mcp_t *m);
int64_t oq_mcp_wait_ms(const oq_mcp_t *m);

/**
 * @brief A POST /mcp with body \p body.
 * @returns 0 with \p out filled (send it); 1 with \p call set: queue its submit job
 *          (oq_mcp_call_job), then oq_mcp_call_submitted(); 2 with \p call set (tasks/get,
 *          tasks/result): read the call oq_mcp_call_task() names (after waiting for it to
 *          settle, up to --mcp-wait, when it says so), then oq_mcp_call_answer().
 */
int oq_mcp_post(oq_mcp_t *m, const oq_mcp_in_t *in, const char *body, size_t len, size_t max_depth,
                oq_mcp_call_t **call, oq_mcp_out_t *out);

/** @brief DELETE /mcp: end the session named in \p in (200), 400 without one, 404 unknown. */
void oq_mcp_delete(oq_mcp_t *m, const oq_mcp_in_t *in, oq_mcp_out_t *out);

/** @brief The call's prepared submit (owned by \p c). */
oq_submit_job_t *oq_mcp_call_job(oq_mcp_call_t *c);

/**
 * @brief The submit job finished (\p refused: it was never queued).
 * @returns 0 with \p out filled, or 1: the call \p call_id is not terminal, wait for it and
 *          answer with oq_mcp_call_answer().
 */
int oq_mcp_call_submitted(oq_mcp_call_t *c, int refused, oq_mcp_out_t *out,
                          char call_id[OQ_CALL_ID_LEN + 1]);

/** @brief The call a tasks/get or tasks/result asks about; \p wait: 1 to wait for it to
 *         settle first (tasks/result). */
const char *oq_mcp_call_task(const oq_mcp_call_t *c, int *wait);

/** @brief The answer for \p call as read after the wait (\p rc: the read's return code). */
void oq_mcp_call_answer(oq_mcp_call_t *c, int rc, const oq_call_t *call, oq_mcp_out_t *out);

void oq_mcp_call_free(oq_mcp_call_t *c);

#endif
