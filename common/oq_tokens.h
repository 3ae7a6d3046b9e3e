/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_tokens.h
 * @brief Bearer-token files: the one parser of the producer's API tokens, its metrics tokens
 *        and the consumer's review API tokens (common/tokens.c).
 *
 * A file has one entry a line, blank lines and lines starting with '#' ignored:
 *
 *     TOKEN TENANT [operator] [callback_url=URL] [webhook_secret=SECRET]
 *                                  (a tenant file: the producer's --token-file, the consumer's)
 *     TOKEN                        (a file without tenants: --metrics-token-file)
 *
 * TOKEN is an RFC 6750 b64token of 16..512 characters, or "sha256:" + 64 lowercase hex digits
 * (the token's digest, so the file need not hold the secret). The optional third word grants a
 * role: `operator` may use the consumers' review API and the producer's task decisions (POST
 * /v1/tasks/{id}/resolve); a line without it is a tenant's token
 * only, as in files written before roles existed. Only SHA-256 digests are kept in memory.
 * `callback_url=` and `webhook_secret=` are the tenant's webhook settings (the producer's: its
 * default callback URL, and the secret its deliveries are signed with), on any one line of the
 * tenant (or repeated with the same value); the secret is kept as written (HMAC needs it).
 */
#ifndef OQ_TOKENS_H
#define OQ_TOKENS_H

#include <stddef.h>

#include "oq_envelope.h"
#include "oq_error.h"

#define OQ_TOKEN_MIN_LEN 16
#define OQ_TOKEN_MAX_LEN 512
#define OQ_TOKEN_ROLE_OPERATOR 1u /**< the consumers' review API, the producer's task decisions */

/** One entry: the token's digest, its tenant and its roles. */
typedef struct oq_token_entry {
    unsigned char digest[32];
    char tenant[OQ_MAX_NAME_LEN + 1]; /**< "" in a file without tenants */
    unsigned roles;                   /**< OQ_TOKEN_ROLE_* bits */
} oq_token_entry_t;

/** A tenant's webhook settings (callback_url=, webhook_secret=): strings owned, NULL when not
 *  given. */
typedef struct oq_tenant_hook {
    char tenant[OQ_MAX_NAME_LEN + 1];
    char *callback_url;
    char *secret;
} oq_tenant_hook_t;

typedef struct oq_token_table {
    oq_token_entry_t *v;
    size_t n;
    oq_tenant_hook_t *hooks; /**< one per tenant that has webhook settings */
    size_t nhooks;
} oq_token_table_t;

#define OQ_WEBHOOK_SECRET_MIN_LEN 16
#define OQ_WEBHOOK_SECRET_MAX_LEN 512

/** @brief The webhook settings of \p tenant in \p t, or NULL (also for t NULL). */
const oq_tenant_hook_t *oq_tokens_hook(const oq_token_table_t *t, const char *tenant);

/** @brief Non-zero when \p s may be a webhook secret: 16..512 printable ASCII bytes, no
 *  space. */
int oq_webhook_secret_valid(const char *s);

/**
 * @brief Read the token file \p path (lines "TOKEN TENANT [operator] [callback_url=URL]
 *        [webhook_secret=SECRET]" when \p with_tenant, else "TOKEN"). Warns when the file
 *        is readable by group or others.
 * @param out receives a new table (free with oq_tokens_free).
 * @returns 0, or OQ_EIO / OQ_EINVAL / OQ_ENOMEM with \p err naming the file and line, never a
 *          token.
 */
int oq_tokens_load(const char *path, int with_tenant, oq_token_table_t **out, oq_error_t *err);

/** @brief Free a table (its digests wiped first); accepts NULL. */
void oq_tokens_free(oq_token_table_t *t);

/**
 * @brief Index of the entry whose digest is that of \p tok (\p len bytes), or -1. Every entry
 *        is compared, each in constant time: the time says nothing about which one matched.
 */
long oq_tokens_find(const oq_token_table_t *t, const char *tok, size_t len);

/**
 * @brief The token of an Authorization header value \p v of \p vlen bytes ("Bearer <token>",
 *        the scheme in any case, spaces or tabs around the token).
 * @returns 0 with \p tok / \p n pointing into \p v, or -1 when it is not a bearer b64token
 *          (also when \p v holds a NUL before \p vlen).
 */
int oq_tokens_bearer(const char *v, size_t vlen, const char **tok, size_t *n);

#endif
