/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HTTP client of the command-line tools, a thin layer over one libcurl easy handle.
 *
 * libcurl does the protocol: name resolution (IPv4 and IPv6, `[::1]` literals), TLS with
 * certificate and host-name verification (the system CA store unless a bundle is given),
 * keep-alive between the requests of one client, timeouts. This layer only fixes the policy
 * the callers share: http and https only, no redirects (a POST that is answered with a
 * redirect is the caller's to judge, not to replay elsewhere), answers bounded in size, JSON
 * headers, and one error pattern: 0 whenever the server answered (the status is the caller's
 * decision), a negative OQ_E* code with libcurl's message otherwise, retriable unless
 * retrying cannot help (bad URL, TLS verification failure).
 *
 * `Retry-After` is read from the answer's headers and decoded here, both forms of RFC 9110
 * (delay-seconds, HTTP-date via curl_getdate()), into milliseconds from now, so that "absent"
 * (-1) and "now" (0) stay distinct.
 *
 * Threads: a client is used by one thread at a time; libcurl's global initialisation runs
 * once (pthread_once) before the first client is made.
 */
#include <ctype.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oq_httpc.h"
#include "oq_buf.h"

#define OQ__HTTPC_MAX_BODY (16u << 20)

struct oq_httpc {
    CURL *curl;
    int64_t timeout_ms;
    char *cacert;
    char errbuf[CURL_ERROR_SIZE];
    /* answer being received */
    oq_buf_t body; /* kept between requests: emptied, not freed */
    int too_big;
    int answered; /* the last request got an answer: its headers can be read */
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;

static void global_init(void)
{
    global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

oq_httpc_t *oq_httpc_new(const oq_httpc_opts_t *opts, oq_error_t *err)
{
    pthread_once(&global_once, global_init);
    if (global_rc != CURLE_OK) {
        oq_error_set(err, OQ_EIO, (int)global_rc, "http: libcurl: %s",
                     curl_easy_strerror(global_rc));
        return NULL;
    }
    oq_httpc_t *c = calloc(1, sizeof *c);
    if (!c) goto nomem;
    c->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 5000;
    if (opts && opts->cacert && !(c->cacert = strdup(opts->cacert))) goto nomem;
    if (!(c->curl = curl_easy_init())) goto nomem;
    return c;
nomem:
    oq_httpc_destroy(c);
    oq_error_set(err, OQ_ENOMEM, 0, "http: out of memory");
    return NULL;
}

void oq_httpc_destroy(oq_httpc_t *c)
{
    if (!c) return;
    if (c->curl) curl_easy_cleanup(c->curl);
    free(c->cacert);
    oq_buf_free(&c->body);
    free(c);
}

void oq_httpc_resp_clear(oq_httpc_resp_t *r)
{
    if (!r) return;
    free(r->body);
    memset(r, 0, sizeof *r);
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    oq_httpc_t *c = arg;
    size_t m = size * n;
    if (m >= OQ__HTTPC_MAX_BODY - c->body.len) {
        c->too_big = 1;
        return 0; /* aborts the transfer (CURLE_WRITE_ERROR) */
    }
    return oq_buf_put(&c->body, p, m) ? 0 : m;
}

/* The answer's Retry-After in ms from now: -1 absent or unreadable, 0 for a past date. */
static int64_t retry_after_ms(CURL *curl)
{
    struct curl_header *h = NULL;
    if (curl_easy_header(curl, "Retry-After", 0, CURLH_HEADER, -1, &h) != CURLHE_OK || !h)
        return -1;
    const char *v = h->value;
    while (*v == ' ' || *v == '\t')
        v++;
    if (isdigit((unsigned char)*v)) {
        char *end = NULL;
        long long s = strtoll(v, &end, 10);
        while (*end == ' ' || *end == '\t')
            end++;
        if (*end != '\0' || s < 0) return -1;
        return s > INT64_MAX / 1000 ? INT64_MAX : (int64_t)s * 1000;
    }
    time_t at = curl_getdate(v, NULL); /* HTTP-date */
    if (at == (time_t)-1) return -1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t ms = (int64_t)at * 1000 - ((int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000);
    return ms > 0 ? ms : 0;
}

int oq_httpc_header(oq_httpc_t *c, const char *name, char *out, size_t n)
{
    struct curl_header *h = NULL;
    if (!c->answered || curl_easy_header(c->curl, name, 0, CURLH_HEADER, -1, &h) != CURLHE_OK || !h)
        return OQ_ENOTFOUND;
    size_t len = strlen(h->value);
    if (len >= n) return OQ_ETOOBIG;
    memcpy(out, h->value, len + 1);
    return 0;
}

int oq_httpc_request(oq_httpc_t *c, const char *method, const char *url, const char *const *headers,
                     const char *body, oq_httpc_resp_t *resp, oq_error_t *err)
{
    memset(resp, 0, sizeof *resp);
    resp->retry_after_ms = -1;
    int rc = 0;
    struct curl_slist *hl = NULL, *t;
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0)
        return oq_error_set(err, OQ_EINVAL, 0, "http: %s: only http:// and https:// URLs", url);
    if (!(t = curl_slist_append(hl, "Accept: application/json"))) goto nomem;
    hl = t;
    if (body) {
        if (!(t = curl_slist_append(hl, "Content-Type: application/json"))) goto nomem;
        hl = t;
    }
    for (size_t i = 0; headers && headers[i]; i++) {
        if (!(t = curl_slist_append(hl, headers[i]))) goto nomem;
        hl = t;
    }
    CURL *e = c->curl;
    curl_easy_reset(e); /* options from the previous request go; the connection stays */
    c->body.len = 0;
    c->body.err = 0;
    c->too_big = 0;
    c->answered = 0;
    c->errbuf[0] = '\0';
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)c->timeout_ms);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, c->errbuf);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, c);
    if (c->cacert) curl_easy_setopt(e, CURLOPT_CAINFO, c->cacert);
    if (strcmp(method, "POST") == 0 || body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? strlen(body) : 0));
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "POST") != 0)
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    CURLcode cc = curl_easy_perform(e);
    if (cc != CURLE_OK) {
        const char *why = c->errbuf[0] ? c->errbuf : curl_easy_strerror(cc);
        if (c->too_big)
            rc = oq_error_set(err, OQ_ETOOBIG, (int)cc, "http: %s %s: answer over %u bytes", method,
                              url, OQ__HTTPC_MAX_BODY);
        else if (cc == CURLE_OPERATION_TIMEDOUT)
            rc = oq_error_set(err, OQ_ETIMEDOUT, (int)cc, "http: %s %s: %s", method, url, why);
        else if (cc == CURLE_URL_MALFORMAT || cc == CURLE_UNSUPPORTED_PROTOCOL)
            rc = oq_error_set(err, OQ_EINVAL, (int)cc, "http: %s: %s", url, why);
        else if (cc == CURLE_OUT_OF_MEMORY)
            rc = oq_error_set(err, OQ_ENOMEM, (int)cc, "http: out of memory");
        else
            rc = oq_error_set_retriable(err, OQ_EIO, (int)cc,
                                        cc != CURLE_PEER_FAILED_VERIFICATION &&
                                            cc != CURLE_SSL_CACERT_BADFILE,
                                        "http: %s %s: %s", method, url, why);
        goto out;
    }
    c->answered = 1;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &resp->status);
    resp->retry_after_ms = retry_after_ms(e);
    if (!(resp->body = malloc(c->body.len + 1))) goto nomem;
    if (c->body.len) memcpy(resp->body, c->body.p, c->body.len);
    resp->body[c->body.len] = '\0';
    resp->body_len = c->body.len;
    goto out;
nomem:
    oq_httpc_resp_clear(resp);
    rc = oq_error_set(err, OQ_ENOMEM, 0, "http: out of memory");
out:
    curl_slist_free_all(hl);
    return rc;
}
