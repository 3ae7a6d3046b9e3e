/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file http_tools.h
 * @brief Internal: declarative HTTP tools (the `--tools FILE` format) and the executor that
 *        calls them with libcurl's multi interface, classifying every outcome for the
 *        execution protocol (docs/DESIGN.md, "Calling downstream services").
 *
 * The tools file is JSON (parsed strictly: duplicate keys, bad UTF-8 and unknown fields are
 * errors); examples/tools.json documents every field. common/catalog.c (oq_catalog.h) parses
 * the file and each tool's catalogue part (name, description, "input_schema": a JSON Schema,
 * "annotations": MCP hints, the field names); this parser reads the HTTP fields of the same
 * objects. In short:
 *
 *     {"version": 1, "tools": [ {
 *        "name": "pay", "method": "POST",
 *        "url": "http://127.0.0.1:8090/v1/payments",         // {placeholders} URL-encoded
 *        "body": "args" | "none" | <JSON template>,             // "{x}" keeps x's JSON type
 *        "headers": {"X-Order": "{order_id}",                    // a template, as the URL
 *                    "Authorization": {"env": "PAY_TOKEN", "prefix": "Bearer "},
 *                    "X-Api-Key": {"file": "/run/credentials/onceq/pay.key"}},
 *        "ca_file": "ca.pem", "client_cert": "c.pem", "client_key": "k.pem",  // https only
 *        "idempotency_header": "Idempotency-Key",               // null: no key sent
 *        "idempotent": true,               // the downstream honours the key (resend is safe)
 *        "connect_timeout_ms": 2000, "timeout_ms": 10000,
 *        "object_id": "/id",                // JSON pointer, or a dotted path "data.id"
 *        "success": ["2xx"], "final": ["4xx"], "retryable": [429, "503:retry-after"],
 *        "lookup": {"url": ".../v1/payments?idempotency_key={effect_id}",
 *                   "found": [200], "absent": [404], "object_id": "/id", "exists": null,
 *                   "settle_ms": 10000}
 *     } ] }
 *
 * Placeholders: `{effect_id}` (the effect id, the value of the idempotency header; the old
 * name `{idem_key}` still works, with a warning at load), `{tool}`, and `{name}` for a
 * top-level argument `name` (strings as they are, numbers and booleans as JSON text; objects
 * and arrays are refused). `{name?}` makes an argument optional: empty text in a URL or a
 * header, member left out in a body template. In a body template a string that is exactly
 * one placeholder is replaced by the JSON value (type kept), `"{args}"` by the whole argument
 * object. A header value is a template too (not URL-encoded; a value that would hold a
 * control character is refused as bad arguments, never sent); `{args}` there is a load error.
 *
 * Secrets: a header value `{"env": "NAME"}` or `{"file": "PATH"}` (optional `"prefix"`, e.g.
 * "Bearer ") is read once, at load, and sent as it is (never expanded); an unset or empty
 * variable, an unreadable or empty file, or a value with a control character is a load error
 * that names the tool, the header and the variable or file, never the value. `ca_file`,
 * `client_cert` and `client_key` (PEM files, checked readable at load) set the CA bundle that
 * verifies the downstream (instead of the system's) and the client certificate of mutual TLS,
 * for the call and its lookup; they need https:// URLs.
 *
 * Status rules: an integer (429), a class ("4xx") or an integer that counts only when the
 * answer carries Retry-After ("503:retry-after"). The most specific rule wins (code with
 * Retry-After, then code, then class); the same rule in two lists is a load error. A status
 * no rule covers is UNKNOWN for a call (a lookup: UNDECIDED): it may have been processed.
 */
#ifndef OQ_CONSUMER_HTTP_TOOLS_H
#define OQ_CONSUMER_HTTP_TOOLS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "oq_error.h"

/** Outcome classes. Calls end in the first four, lookups in the last three. */
typedef enum oq__http_class {
    OQ__HTTP_SUCCESS = 1, /**< declared success status: the effect happened */
    OQ__HTTP_FINAL,       /**< declared final refusal (or bad arguments, never sent) */
    OQ__HTTP_RETRYABLE,   /**< not sent, or refused before processing: resend is safe */
    OQ__HTTP_UNKNOWN,     /**< sent, no definite answer: reconcile, never resend blind */
    OQ__HTTP_FOUND,       /**< lookup: the downstream has the operation */
    OQ__HTTP_ABSENT,      /**< lookup: the downstream confirms it does not */
    OQ__HTTP_UNDECIDED    /**< lookup: no definite answer */
} oq__http_class_t;

/** @brief Stable upper-case name of a class ("SUCCESS", ...). */
const char *oq__http_class_name(oq__http_class_t c);

#define OQ__HTTP_MAX_RULES 32

/** One status rule of a list (success / final / retryable, or found / absent). */
typedef struct oq__http_rule {
    int lo, hi;           /**< statuses lo..hi (a code: lo == hi; "4xx": 400..499) */
    int need_retry_after; /**< counts only when the answer has a Retry-After header */
    oq__http_class_t cls; /**< the class this rule gives */
} oq__http_rule_t;

enum { OQ__HTTP_BODY_NONE = 0, OQ__HTTP_BODY_ARGS, OQ__HTTP_BODY_TEMPLATE };

/** What a header line's value is: a template (expanded per request) or a secret read at load
 *  (sent as it is, wiped when the tools set is freed). */
enum { OQ__HTTP_HDR_TEMPLATE = 0, OQ__HTTP_HDR_SECRET };

/** One request shape (the call, or its lookup). All members owned by the tools set. */
typedef struct oq__http_request {
    char *method;               /**< "GET", "POST", "PUT", "PATCH", "DELETE" */
    char *url;                  /**< template */
    int body_mode;              /**< OQ__HTTP_BODY_* */
    json_t *body;               /**< OQ__HTTP_BODY_TEMPLATE: the template */
    char **headers;             /**< "Name: value" lines (templates not expanded) */
    unsigned char *header_kind; /**< per line: OQ__HTTP_HDR_* */
    size_t nheaders;
    int64_t connect_timeout_ms; /**< default 2000 */
    int64_t timeout_ms;         /**< total, from the start of the transfer; default 10000 */
    char *object_id;            /**< path of the downstream object id in the answer, or NULL */
    char *exists;               /**< lookup only: path that must be non-null for FOUND */
    oq__http_rule_t rules[OQ__HTTP_MAX_RULES];
    size_t nrules;
} oq__http_request_t;

/** One declared tool. */
typedef struct oq__http_tool {
    char *name;
    oq__http_request_t call;
    char *idem_header; /**< header carrying effect_id; NULL when none is sent */
    int idempotent;    /**< declared: the downstream honours idem_header */
    int has_lookup;
    oq__http_request_t lookup;
    int64_t settle_ms; /**< lookup.settle_ms: a "not found" is trusted only this long after the
                            request was sent, unless the tool is idempotent (default: the
                            call's timeout_ms) */
    char *ca_file;     /**< https: CA bundle (PEM) verifying the downstream, or NULL (system) */
    char *client_cert; /**< https: client certificate (PEM) for mutual TLS, or NULL */
    char *client_key;  /**< https: its private key (PEM), or NULL (in client_cert) */
    struct oq__mcp_tool *mcp; /**< kind "mcp" (consumer/mcp_tools.h), or NULL */
} oq__http_tool_t;

/** A loaded tools file. */
typedef struct oq__http_tools {
    oq__http_tool_t *tools;
    size_t n;
    struct oq_catalog *catalog; /**< the file's catalogue (names, schemas), owned */
    int nwarnings;              /**< warnings logged while parsing (deprecated names) */
} oq__http_tools_t;

/**
 * @brief Parse a tools file from \p len bytes of \p text; \p origin names it in errors.
 *        Secret header values (`{"env": ...}`, `{"file": ...}`) are read here, and the TLS
 *        files are checked readable; deprecated names are logged as warnings.
 * @returns 0 with \p out set (free with oq__http_tools_destroy), or OQ_EINVAL with \p err
 *          naming the file, the line and column (syntax) or the tool and the field.
 */
int oq__http_tools_parse(const char *text, size_t len, const char *origin, oq__http_tools_t **out,
                         oq_error_t *err);

/** @brief Read and parse the file \p path (as oq__http_tools_parse; OQ_EIO if unreadable). */
int oq__http_tools_load(const char *path, oq__http_tools_t **out, oq_error_t *err);

/** @brief Free a tools set; accepts NULL. Tools must outlive the transfers that use them. */
void oq__http_tools_destroy(oq__http_tools_t *t);

/** @brief The longest timeout_ms of any request (call or lookup) of \p t; 0 for NULL or none. */
int64_t oq__http_tools_max_timeout(const oq__http_tools_t *t);

/** @brief The tool named \p name, or NULL. */
const oq__http_tool_t *oq__http_tools_find(const oq__http_tools_t *t, const char *name);

/* --- expansion (exposed for tests) ------------------------------------------------------- */

/**
 * @brief Expand a URL template: placeholders from \p args (URL-encoded) and \p effect_id.
 * @param out malloc()ed (caller free()s).
 * @returns 0, or OQ_EINVAL (missing or non-scalar argument; \p err names it).
 */
int oq__http_expand_url(const char *tmpl, const char *tool, const json_t *args,
                        const char *effect_id, char **out, oq_error_t *err);

/**
 * @brief The request body of \p req for \p args: NULL for BODY_NONE, the canonical (RFC
 *        8785) JSON of args for BODY_ARGS, the expanded template otherwise. The same inputs
 *        always give the same bytes, so a resend carries the identical body.
 * @param out malloc()ed text or NULL (caller free()s).
 */
int oq__http_build_body(const oq__http_request_t *req, const char *tool, const json_t *args,
                        const char *effect_id, char **out, size_t *out_len, oq_error_t *err);

/**
 * @brief Read the value at \p path (JSON pointer "/a/0/b" or dotted "a.0.b") of \p doc.
 * @returns a borrowed value, or NULL.
 */
const json_t *oq__http_json_path(const json_t *doc, const char *path);

/* --- classification (pure; exposed for the table-driven tests) --------------------------- */

/** What is known about one finished transfer. */
typedef struct oq__http_facts {
    int is_lookup;
    int curl_code; /**< CURLcode of the transfer (0: CURLE_OK) */
    int sent;      /**< the whole request was written to the socket */
    long status;   /**< HTTP status of the final response, 0 when none */
    int complete;  /**< the response was received to its end */
    int has_retry_after;
    int64_t retry_after_ms; /**< from Retry-After (seconds or HTTP date), -1 when absent */
} oq__http_facts_t;

/**
 * @brief Classify \p f under the rules of \p req (the call or the lookup of a tool).
 * @param code receives a stable reason code ("ok", "status_503", "connect_failed",
 *        "timeout_after_send", ...).
 */
oq__http_class_t oq__http_classify(const oq__http_request_t *req, const oq__http_facts_t *f,
                                   char code[48]);

/* --- executor ----------------------------------------------------------------------------- */

/** A finished call or lookup, passed to the callback. Pointers are valid during it only. */
typedef struct oq__http_outcome {
    oq__http_class_t cls;
    const char *code;    /**< reason code (see oq__http_classify) */
    const char *message; /**< human-readable detail */
    long status;         /**< HTTP status, 0 when none */
    int curl_code;
    int sent;
    int abandoned;          /**< not an answer: given up because the executor was draining or
                                 closing (code "abandoned"; RETRYABLE / UNKNOWN / UNDECIDED) */
    int64_t retry_after_ms; /**< -1 when the answer gave none */
    const char *object_id;  /**< SUCCESS / FOUND: the downstream's id, or NULL if unreadable */
    const char *body;       /**< the answer's body (at most max_response bytes), or NULL */
    size_t body_len;
    int64_t body_bytes; /**< the body's length as it arrived (more than body_len when
                             max_response cut it); 0 when unknown (body_len counts then) */
    int parsed;         /**< 1: \p doc is \p body parsed once for every reader (see doc) */
    const json_t *doc;  /**< when parsed: the body as JSON (object or array; duplicate keys
                             refused), or NULL when it is not such JSON; borrowed (take a
                             reference to keep it: reference counts are atomic). Only
                             bodies up to OQ__HTTP_PARSE_MAX are parsed, never an "mcp" tool's */
    int64_t elapsed_us; /**< from submit to completion */
    const char *effect_id;
    const oq__http_tool_t *tool;
} oq__http_outcome_t;

/** Answers up to this many bytes are parsed once by the executor (oq__http_outcome_t.doc). */
#define OQ__HTTP_PARSE_MAX (64 * 1024)

typedef void (*oq__http_cb)(const oq__http_outcome_t *o, void *ctx);

typedef struct oq__http_exec_opts {
    int max_inflight;        /**< transfers running at once (default 1024); more wait queued,
                                  their timeouts start when they leave the queue */
    int64_t max_response;    /**< bytes of an answer kept (default 1 MiB; the rest is read
                                  and dropped) */
    int64_t max_conn_age_ms; /**< do not reuse a connection idle longer (default 20000): stay
                                  below the downstream's keep-alive timeout */
} oq__http_exec_opts_t;

typedef struct oq__http_exec oq__http_exec_t;

/** @brief New executor (\p opts may be NULL). @returns NULL with \p err filled on failure. */
oq__http_exec_t *oq__http_exec_new(const oq__http_exec_opts_t *opts, oq_error_t *err);

/**
 * @brief Abort what is still running and free \p x; accepts NULL. Every submitted request
 *        not yet called back is called back now, classified as sent or not
 *        (code "abandoned"): UNKNOWN/UNDECIDED when it may have been sent.
 * @locality the polling thread.
 */
void oq__http_exec_destroy(oq__http_exec_t *x);

/**
 * @brief Queue a call of \p tool with \p args (a JSON object) and the idempotency key
 *        \p effect_id. \p cb runs exactly once, from oq__http_exec_poll() or destroy(); bad
 *        arguments end there too, as FINAL "bad_args" (nothing is sent).
 * @remark Thread-safe: any thread may submit; \p tool must outlive the callback; \p args and
 *         \p effect_id are copied.
 * @returns 0, or OQ_EINVAL (NULL input) / OQ_ENOMEM / OQ_ESHUTDOWN, and then no callback.
 */
int oq__http_exec_submit(oq__http_exec_t *x, const oq__http_tool_t *tool, const json_t *args,
                         const char *effect_id, oq__http_cb cb, void *ctx, oq_error_t *err);

/**
 * @brief As submit, for the tool's lookup; the callback gets FOUND / ABSENT / UNDECIDED.
 * @returns also OQ_ESTATE when the tool declares no lookup.
 */
int oq__http_exec_lookup(oq__http_exec_t *x, const oq__http_tool_t *tool, const json_t *args,
                         const char *effect_id, oq__http_cb cb, void *ctx, oq_error_t *err);

/**
 * @brief Drive all transfers: wait up to \p timeout_ms for network activity (or
 *        oq__http_exec_wakeup), make progress, and run the callbacks of finished ones.
 * @returns the number of callbacks run, or a negative OQ_E* code.
 * @locality one thread (the polling thread); callbacks run on it and may submit.
 */
int oq__http_exec_poll(oq__http_exec_t *x, int timeout_ms, oq_error_t *err);

/** @brief Make a poll() in progress return early. Thread-safe. */
void oq__http_exec_wakeup(oq__http_exec_t *x);

/** @brief Requests submitted and not yet called back. Thread-safe. */
int oq__http_exec_pending(oq__http_exec_t *x);

/**
 * @brief epoll_ctl calls made so far on the sockets of the executor's connections (a
 *        kept-alive connection stays registered between its transfers: about none per request
 *        once the connections are open). @locality the polling thread (tests, figures).
 */
uint64_t oq__http_exec_epoll_ctls(const oq__http_exec_t *x);

/**
 * @brief Start no new transfer from now on: the running ones go on to their answer or their
 *        timeout; every request not started yet (queued, or submitted later) is called back at
 *        the next poll as not sent, "abandoned" (RETRYABLE; a lookup UNDECIDED). The worker's
 *        drain at stop. Thread-safe.
 */
void oq__http_exec_drain(oq__http_exec_t *x);

#endif
