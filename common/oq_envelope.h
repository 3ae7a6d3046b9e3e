/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_envelope.h
 * @brief The Kafka message envelope, version 1 (documented in schema/envelope.schema.json).
 *
 * tool_call (producer -> consumers, topic onceq.tool-calls):
 *   {"v":1,"kind":"tool_call","message_id","call_id","tenant","idem_key","fingerprint",
 *    "tool","args":{...},"attempt":N,"created_at":unix_ms}
 * tool_result (consumers -> producer, topic onceq.tool-results): the same identity fields
 *   (no "args") plus "status" ("running"|"succeeded"|"failed"|"needs_review"),
 *   "result" (object or null), "error" ({"code","message","retryable"} or null),
 *   "effect_id" (string or null).
 * Kafka key = call_id; header "onceq-message-id" = message_id.
 */
#ifndef OQ_ENVELOPE_H
#define OQ_ENVELOPE_H

#include <jansson.h>
#include <stdint.h>

#include "oq_error.h"
#include "oq_json.h"
#include "oq_util.h"

#define OQ_ENVELOPE_VERSION 1
#define OQ_TOPIC_CALLS "onceq.tool-calls"
#define OQ_TOPIC_RESULTS "onceq.tool-results"
#define OQ_TOPIC_DLQ "onceq.dlq"
/** The default topic prefix: the names above are the topics' logical names, and a deployment
 *  with `--topic-prefix P` uses P + the part after "onceq." (P = "acme.onceq." gives
 *  acme.onceq.tool-calls). Outbox rows keep the logical name; whoever talks to Kafka maps it. */
#define OQ_TOPIC_PREFIX_DEFAULT "onceq."
#define OQ_TOPIC_NAME_CAP 250 /**< Kafka's longest topic name (249) + NUL */
/** The `topic-prefix` row of every settings table whose command talks to Kafka (oq_config.h). */
#define OQ_SETTING_TOPIC_PREFIX                                                                    \
    {                                                                                              \
        "topic-prefix", OQ_SET_STRING, OQ_TOPIC_PREFIX_DEFAULT, 1, 200, NULL,                      \
            "topic names are PREFIX + tool-calls, tool-results, dlq (the same on every component)" \
    }
/** The `kafka-profile` row of every settings table whose clients consume or produce (see
 *  common/kafka.c): `real` (default) sets client defaults for real brokers, `mock` the ones the
 *  embedded broker (librdkafka's mock cluster) needs. `onceq up` passes `mock` to its children
 *  when it runs the embedded broker; the user's -X properties win over either profile. */
#define OQ_SETTING_KAFKA_PROFILE                                                                   \
    {                                                                                              \
        "kafka-profile", OQ_SET_ENUM, "real", 0, -1, "real|mock",                                  \
            "client defaults for real brokers, or for the embedded broker (onceq up sets mock)"    \
    }
#define OQ_HDR_MESSAGE_ID "onceq-message-id"
/* Headers of a dead letter on onceq.dlq (the consumer writes them; `onceq dlq` reads them):
 * the stable reason code (oq_consumer.h lists them), the human-readable detail, and where the
 * message was read (topic, partition and offset, as decimal text). */
#define OQ_HDR_DLQ_REASON "onceq-dlq-reason"
#define OQ_HDR_DLQ_DETAIL "onceq-dlq-detail"
#define OQ_HDR_DLQ_TOPIC "onceq-dlq-origin-topic"
#define OQ_HDR_DLQ_PARTITION "onceq-dlq-origin-partition"
#define OQ_HDR_DLQ_OFFSET "onceq-dlq-origin-offset"
/* Set by `onceq dlq redrive` on a re-published dead letter: "onceq.dlq:PARTITION:OFFSET". */
#define OQ_HDR_REDRIVE "onceq-redrive"
#define OQ_MAX_KEY_LEN 255
#define OQ_MAX_NAME_LEN 128 /**< tool and tenant names */

/*
 * Names and keys: one rule for the whole project (the producer's API and HTTP server, and the
 * envelope codec on both sides of Kafka), so whatever one component accepts every other one
 * accepts too.
 *  - idempotency key: 1..OQ_MAX_KEY_LEN (255) bytes, each printable ASCII 0x20..0x7e (space
 *    included). A control byte (tab, newline, NUL, ...), DEL or any byte >= 0x80 is refused.
 *  - tenant and client_id: 1..OQ_MAX_NAME_LEN (128) bytes of the same printable ASCII.
 *  - tool: 1..OQ_MAX_NAME_LEN bytes of [A-Za-z0-9_.:-].
 * NUL cannot appear inside any of them: a C string ends there, and the JSON parser refuses
 * "\u0000" in strings.
 */

/** @brief Non-zero when \p s is a valid idempotency key (see above); NULL is not. */
int oq_envelope_valid_key(const char *s);
/** @brief Non-zero when \p s is a valid tenant or client_id (see above); NULL is not. */
int oq_envelope_valid_name(const char *s);
/** @brief Non-zero when \p s is a valid tool name (see above); NULL is not. */
int oq_envelope_valid_tool(const char *s);

typedef enum { OQ_KIND_TOOL_CALL = 1, OQ_KIND_TOOL_RESULT = 2 } oq_kind_t;

/** Decoded envelope. Strings are owned by the struct; free with oq_envelope_clear(). */
typedef struct oq_envelope {
    int v;
    oq_kind_t kind;
    char message_id[OQ_UUID_LEN + 1];
    char call_id[OQ_CALL_ID_LEN + 1];
    char *tenant;
    char *idem_key;
    char fingerprint[OQ_FINGERPRINT_LEN + 1];
    char *tool;
    int64_t attempt;    /**< >= 1 */
    int64_t created_at; /**< unix ms */
    json_t *args;       /**< tool_call: object (owned reference) */
    char *status;       /**< tool_result: running|succeeded|failed|needs_review */
    json_t *result;     /**< tool_result: object or NULL */
    json_t *error;      /**< tool_result: {"code","message","retryable"} or NULL */
    char *effect_id;    /**< tool_result: may be NULL */
    /** tool_result, set only by oq_envelope_decode_result()'s fast path (result is NULL then):
     *  the result object as the text json_dumps(result, JSON_COMPACT | JSON_SORT_KEYS) writes,
     *  the form calls.result stores. oq_envelope_encode() does not read it. */
    char *result_json;
    /** tool_call, set only by oq_envelope_decode_call()'s fast path (args is set too): the args
     *  object as the text json_dumps(args, JSON_COMPACT) writes for it. oq_envelope_encode()
     *  does not read it. */
    char *args_json;
} oq_envelope_t;

/** @brief Free what \p e owns and zero it (safe on a zeroed or already-cleared struct). */
void oq_envelope_clear(oq_envelope_t *e);

/**
 * @brief Encode \p e as compact JSON.
 * @param out malloc()ed NUL-terminated text; caller free()s.
 * @returns 0, OQ_EINVAL when \p e does not validate, OQ_ENOMEM.
 */
int oq_envelope_encode(const oq_envelope_t *e, char **out, size_t *out_len, oq_error_t *err);

/**
 * @brief oq_envelope_encode() of an envelope whose object member the caller already holds in
 *        RFC 8785 form (the text oq_jcs_canonicalize() wrote for an object): a tool_call's
 *        args, or a tool_result's result. The same bytes, written by the same encoder, without
 *        walking a tree. That member's tree (\p e->args, \p e->result) is not used.
 * @param canon \p len bytes, written verbatim (only its braces are checked); required for a
 *        tool_call, NULL for a result of null.
 * @returns as oq_envelope_encode().
 */
int oq_envelope_encode_canon(const oq_envelope_t *e, const char *canon, size_t len, char **out,
                             size_t *out_len, oq_error_t *err);

/**
 * @brief Decode and validate \p len bytes. On success \p e is filled (caller clears it); on
 *        failure \p e is left cleared and \p err names the offending field ("missing field
 *        call_id", "field attempt: expected integer >= 1", "unknown version 2", ...).
 * @returns 0, OQ_EINVAL, OQ_EVERSION, OQ_ETOOBIG, or a JSON parse error.
 */
int oq_envelope_decode(const char *buf, size_t len, oq_envelope_t *e, oq_error_t *err);

/**
 * @brief oq_envelope_decode() of a message expected to be a tool_result, for the producer's
 *        ingest: the same outcome (the same fields, or the same error), but a message in the
 *        subset the RFC 8785 encoder writes (no whitespace, no escapes, integers only, keys in
 *        byte order, error null) is read by a scanner without building a tree, and its result
 *        object is kept as text in \p e->result_json (e->result NULL): that text is then
 *        byte for byte what json_dumps(result, JSON_COMPACT | JSON_SORT_KEYS) would write. Any
 *        other input goes through oq_envelope_decode().
 */
int oq_envelope_decode_result(const char *buf, size_t len, oq_envelope_t *e, oq_error_t *err);

/**
 * @brief The same for a message expected to be a tool_call, for the consumer: in the subset,
 *        the top-level fields are scanned and only the args object is parsed into a tree
 *        (\p e->args), its text kept as well (\p e->args_json, byte for byte what
 *        json_dumps(args, JSON_COMPACT) writes). Any other input goes through
 *        oq_envelope_decode() (a tool_result there too).
 */
int oq_envelope_decode_call(const char *buf, size_t len, oq_envelope_t *e, oq_error_t *err);

/** @brief Validate a decoded or hand-built envelope (the same checks decode applies). */
int oq_envelope_validate(const oq_envelope_t *e, oq_error_t *err);

/** @brief "tool_call" / "tool_result". */
const char *oq_kind_name(oq_kind_t k);

/**
 * @brief Check a topic prefix: 1..200 bytes of [A-Za-z0-9._-] (the characters Kafka allows in
 *        a topic name), not "." or "..". @returns 0 or OQ_EINVAL with a message naming it.
 */
int oq_topic_prefix_check(const char *prefix, oq_error_t *err);

/**
 * @brief The physical name of \p logical under \p prefix: a name starting with "onceq." gets
 *        \p prefix in place of "onceq."; any other name is returned unchanged. \p prefix NULL
 *        or "" means the default (the name unchanged). Writes into \p out (cap bytes, at least
 *        OQ_TOPIC_NAME_CAP) and returns it; a result that does not fit is truncated (the
 *        prefix check keeps every onceq name under Kafka's limit).
 */
const char *oq_topic_name(const char *prefix, const char *logical, char *out, size_t cap);

/** Longest callback_url (webhook URL) accepted, in bytes (repeated in oq_client.h). */
#define OQ_MAX_CALLBACK_URL_LEN 2048

/**
 * @brief Is \p url a webhook URL onceq accepts (a submit's callback_url, a tenant's in the
 *        token file)? http:// or https:// with a host, 1 to OQ_MAX_CALLBACK_URL_LEN bytes of
 *        printable ASCII without spaces, no user:password@, no #fragment. The one rule.
 * @returns 0 or OQ_EINVAL with \p err saying why.
 */
int oq_callback_url_check(const char *url, oq_error_t *err);

#endif
