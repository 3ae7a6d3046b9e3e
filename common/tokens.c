/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tokens.c: bearer-token files (oq_tokens.h), moved here from the producer's HTTP server so
 * that the consumer's review API reads the very same format with the very same code.
 *
 * Only SHA-256 digests are kept; the line buffer is wiped after each token is read, and
 * errors name the file and the line, never a token. A presented token is hashed and compared
 * with every entry with CRYPTO_memcmp (no early exit), so the time taken says nothing about
 * which entry matched or how closely.
 */
#include "oq_tokens.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "oq_log.h"

void oq_tokens_free(oq_token_table_t *t)
{
    if (!t) return;
    OPENSSL_cleanse(t->v, t->n * sizeof *t->v);
    free(t->v);
    for (size_t i = 0; i < t->nhooks; i++) {
        free(t->hooks[i].callback_url);
        if (t->hooks[i].secret) OPENSSL_cleanse(t->hooks[i].secret, strlen(t->hooks[i].secret));
        free(t->hooks[i].secret);
    }
    free(t->hooks);
    free(t);
}

int oq_webhook_secret_valid(const char *s)
{
    size_t n = strlen(s);
    if (n < OQ_WEBHOOK_SECRET_MIN_LEN || n > OQ_WEBHOOK_SECRET_MAX_LEN) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f) return 0;
    return 1;
}

const oq_tenant_hook_t *oq_tokens_hook(const oq_token_table_t *t, const char *tenant)
{
    for (size_t i = 0; t && tenant && i < t->nhooks; i++)
        if (strcmp(t->hooks[i].tenant, tenant) == 0) return &t->hooks[i];
    return NULL;
}

/* The webhook settings of \p tenant (callback_url=, webhook_secret= on a line of it): a tenant
 * may give them on any of its lines, once each; the same word with another value on another
 * line of the tenant is refused (which one would hold?). */
static int add_hook(oq_token_table_t *t, const char *tenant, const char *url, const char *secret,
                    const char *path, int lineno, oq_error_t *err)
{
    oq_error_t uerr = {0};
    if (url && oq_callback_url_check(url, &uerr) != 0)
        return oq_error_set(err, OQ_EINVAL, 0, "token file %s line %d: %s", path, lineno, uerr.msg);
    if (secret && !oq_webhook_secret_valid(secret))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "token file %s line %d: a webhook_secret is %d..%d printable ASCII "
                            "bytes without spaces",
                            path, lineno, OQ_WEBHOOK_SECRET_MIN_LEN, OQ_WEBHOOK_SECRET_MAX_LEN);
    oq_tenant_hook_t *h = (oq_tenant_hook_t *)oq_tokens_hook(t, tenant);
    if (!h) {
        oq_tenant_hook_t *nv = realloc(t->hooks, (t->nhooks + 1) * sizeof *nv);
        if (!nv) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
        t->hooks = nv;
        h = &t->hooks[t->nhooks++];
        memset(h, 0, sizeof *h);
        snprintf(h->tenant, sizeof h->tenant, "%s", tenant);
    }
    if ((url && h->callback_url && strcmp(url, h->callback_url) != 0) ||
        (secret && h->secret && strcmp(secret, h->secret) != 0))
        return oq_error_set(err, OQ_EINVAL, 0,
                            "token file %s line %d: tenant %s has another %s on an earlier line",
                            path, lineno, tenant, url ? "callback_url" : "webhook_secret");
    if (url && !h->callback_url && !(h->callback_url = strdup(url)))
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (secret && !h->secret && !(h->secret = strdup(secret)))
        return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    return 0;
}

static int token_digest(const char *tok, size_t len, unsigned char out[32])
{
    unsigned int n = 0;
    return EVP_Digest(tok, len, out, &n, EVP_sha256(), NULL) == 1 && n == 32 ? 0 : -1;
}

/* RFC 6750 b64token: 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=" */
static int b64token_valid(const char *t, size_t n)
{
    size_t i = 0;
    for (; i < n; i++) {
        char c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/'))
            break;
    }
    if (i == 0) return 0;
    for (; i < n; i++)
        if (t[i] != '=') return 0;
    return 1;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The digest of one token-file entry: a token, or "sha256:" + its digest in hex. */
static int parse_token(const char *tok, size_t n, unsigned char digest[32])
{
    if (strncmp(tok, "sha256:", 7) == 0) {
        if (n != 7 + 64) return -1;
        for (int i = 0; i < 32; i++) {
            int hi = hex_value(tok[7 + 2 * i]), lo = hex_value(tok[8 + 2 * i]);
            if (hi < 0 || lo < 0) return -1;
            digest[i] = (unsigned char)(hi << 4 | lo);
        }
        return 0;
    }
    if (n < OQ_TOKEN_MIN_LEN || n > OQ_TOKEN_MAX_LEN || !b64token_valid(tok, n)) return -1;
    return token_digest(tok, n, digest);
}

/*
 * Read a token file: lines "TOKEN TENANT [operator] [callback_url=URL] [webhook_secret=SECRET]"
 * (\p with_tenant) or "TOKEN", blank lines and lines
 * starting with '#' ignored. TOKEN is an RFC 6750 b64token of 16..512 characters, or
 * "sha256:" + 64 lowercase hex digits (the digest of the token, so the file need not hold the
 * secret itself). Errors name the file and the line, never a token.
 */
int oq_tokens_load(const char *path, int with_tenant, oq_token_table_t **out, oq_error_t *err)
{
    int ret = 0;
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    oq_token_table_t *t = calloc(1, sizeof *t);
    size_t tcap = 0;
    FILE *f = NULL;
    if (!t) return oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
    if (!(f = fopen(path, "r"))) {
        ret = oq_error_set(err, OQ_EIO, errno, "token file %s: %s", path, strerror(errno));
        goto out;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        OQ_LOG_WARN("tokens", "token file %s is readable by group or others (mode %03o)", path,
                    (unsigned)(st.st_mode & 0777));
    ssize_t got;
    while ((got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        char *save = NULL;
        char *tok = strtok_r(line, " \t\r\n", &save);
        if (!tok || tok[0] == '#') continue;
        char *tenant = strtok_r(NULL, " \t\r\n", &save);
        int is_operator = 0, bad_word = 0;
        const char *url = NULL, *secret = NULL;
        for (char *w; tenant && (w = strtok_r(NULL, " \t\r\n", &save));) {
            if (!with_tenant || bad_word) {
                bad_word = 1;
            } else if (strcmp(w, "operator") == 0 && !is_operator) {
                is_operator = 1;
            } else if (strncmp(w, "callback_url=", 13) == 0 && !url) {
                url = w + 13;
            } else if (strncmp(w, "webhook_secret=", 15) == 0 && !secret) {
                secret = w + 15;
            } else {
                bad_word = 1;
            }
        }
        if ((with_tenant && (!tenant || bad_word)) || (!with_tenant && tenant)) {
            ret =
                oq_error_set(err, OQ_EINVAL, 0, "token file %s line %d: expected %s", path, lineno,
                             with_tenant ? "TOKEN TENANT [operator] [callback_url=URL] "
                                           "[webhook_secret=SECRET]"
                                         : "TOKEN");
            goto out;
        }
        if (with_tenant && !oq_envelope_valid_name(tenant)) {
            ret = oq_error_set(err, OQ_EINVAL, 0,
                               "token file %s line %d: the tenant must be 1..%d printable ASCII "
                               "bytes",
                               path, lineno, OQ_MAX_NAME_LEN);
            goto out;
        }
        if ((url || secret) && (ret = add_hook(t, tenant, url, secret, path, lineno, err)))
            goto out;
        oq_token_entry_t e;
        memset(&e, 0, sizeof e);
        size_t n = strlen(tok);
        int bad = parse_token(tok, n, e.digest);
        OPENSSL_cleanse(tok, n);
        if (bad) {
            ret = oq_error_set(err, OQ_EINVAL, 0,
                               "token file %s line %d: a token is %d..%d characters of A-Z a-z "
                               "0-9 - . _ ~ + / (then optional '='), or sha256: + 64 lowercase hex",
                               path, lineno, OQ_TOKEN_MIN_LEN, OQ_TOKEN_MAX_LEN);
            goto out;
        }
        if (with_tenant) snprintf(e.tenant, sizeof e.tenant, "%s", tenant);
        if (is_operator) e.roles |= OQ_TOKEN_ROLE_OPERATOR;
        for (size_t i = 0; i < t->n; i++)
            if (memcmp(t->v[i].digest, e.digest, 32) == 0) {
                ret = oq_error_set(err, OQ_EINVAL, 0, "token file %s line %d: a token listed twice",
                                   path, lineno);
                goto out;
            }
        if (t->n == tcap) {
            size_t ncap = tcap ? 2 * tcap : 8;
            oq_token_entry_t *nv = realloc(t->v, ncap * sizeof *nv);
            if (!nv) {
                ret = oq_error_set(err, OQ_ENOMEM, 0, "out of memory");
                goto out;
            }
            t->v = nv;
            tcap = ncap;
        }
        t->v[t->n++] = e;
    }
    if (ferror(f)) ret = oq_error_set(err, OQ_EIO, errno, "token file %s: read error", path);
out:
    if (line) OPENSSL_cleanse(line, cap);
    free(line);
    if (f) fclose(f);
    if (ret) {
        oq_tokens_free(t);
        return ret;
    }
    *out = t;
    return 0;
}

/* Index of the entry whose digest is that of \p tok, or -1. Every entry is compared, each in
 * constant time, so the time taken says nothing about which entry matched or how closely. */
long oq_tokens_find(const oq_token_table_t *t, const char *tok, size_t len)
{
    unsigned char d[32];
    if (!t || token_digest(tok, len, d) != 0) return -1;
    long found = -1;
    for (size_t i = 0; i < t->n; i++)
        if (CRYPTO_memcmp(t->v[i].digest, d, 32) == 0) found = (long)i;
    return found;
}

int oq_tokens_bearer(const char *v, size_t vlen, const char **tok, size_t *n)
{
    if (!v || strlen(v) != vlen) return -1; /* a NUL would cut the token */
    if (vlen < 7 || strncasecmp(v, "Bearer", 6) != 0 || (v[6] != ' ' && v[6] != '\t')) return -1;
    const char *t = v + 6;
    while (*t == ' ' || *t == '\t')
        t++;
    size_t len = strlen(t);
    while (len && (t[len - 1] == ' ' || t[len - 1] == '\t'))
        len--;
    if (len == 0 || len > OQ_TOKEN_MAX_LEN || !b64token_valid(t, len)) return -1;
    *tok = t;
    *n = len;
    return 0;
}
