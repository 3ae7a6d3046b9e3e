/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_client.h
 * @brief The producer's client side, for a service that submits tool calls in its own SQLite
 *        transaction: the intent (a call row and an outbox row) commits or rolls back with
 *        the service's business rows. Installed as <onceq/oq_client.h>; what libonceq
 *        exports (with <onceq/oq_error.h> and <onceq/oq_logger.h>), and nothing else.
 *
 * The service owns its connection: open it read-write in WAL mode (`PRAGMA
 * journal_mode=WAL`, so `onceq relay --db` reads the outbox while the service writes) with
 * `PRAGMA synchronous=FULL` (an acknowledged call survives a power loss) and a busy timeout;
 * call oq_producer_migrate() once; then per request `BEGIN IMMEDIATE`, its own writes,
 * oq_producer_submit_in_tx(), `COMMIT`. `onceq relay --db <file>` publishes the outbox;
 * `onceq producer --db <file> --brokers B` (optional) ingests the results and serves the
 * calls over HTTP. The connection is the caller's: libonceq never opens another one, starts
 * no thread, and is silent unless a log callback is set (oq_logger.h).
 *
 * Semantics (docs/DESIGN.md "Data flow", step 1), for one (tenant, idem_key):
 *  - new key                          -> OQ_SUBMIT_NEW: a `pending` call and an outbox row;
 *  - same key, same fingerprint       -> OQ_SUBMIT_REPLAY: the original call, nothing written;
 *  - same key, different fingerprint  -> OQ_SUBMIT_CONFLICT (return OQ_ECONFLICT), nothing written;
 *  - same key + fingerprint, call `failed` with error.retryable=true
 *                                     -> OQ_SUBMIT_RETRY_RESET: back to `pending`, attempt+1,
 *                                        a new outbox row (new message_id, same call_id).
 * A key whose call is terminal and past expires_at (created_at + key_ttl) is a new call.
 *
 * Thread-safety: every function works on the connection it is given; use a connection from
 * one thread at a time (SQLite's rule).
 */
#ifndef OQ_CLIENT_H
#define OQ_CLIENT_H

#include <jansson.h>
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "oq_error.h"

/* The two lengths repeat the definitions of oq_util.h and oq_json.h (an identical
 * redefinition is allowed; a different one fails the build of every file that includes both). */
#define OQ_CALL_ID_LEN 34     /**< "c_" + 32 lowercase hex */
#define OQ_FINGERPRINT_LEN 64 /**< SHA-256 as lowercase hex */

#define OQ_DEFAULT_TENANT "default"
#define OQ_DEFAULT_KEY_TTL_MS (24LL * 3600 * 1000)
/** librdkafka's default message.max.bytes: the largest message the relay publishes unless its
 *  `-X message.max.bytes` says otherwise. */
#define OQ_DEFAULT_MAX_MESSAGE_BYTES 1000000
/** Longest callback_url accepted (bytes; the same definition as oq_envelope.h). */
#define OQ_MAX_CALLBACK_URL_LEN 2048

typedef enum {
    OQ_SUBMIT_NEW = 1,
    OQ_SUBMIT_REPLAY = 2,
    OQ_SUBMIT_CONFLICT = 3,
    OQ_SUBMIT_RETRY_RESET = 4
} oq_submit_outcome_t;

/** @brief "new" / "replay" / "conflict" / "retry_reset". */
const char *oq_submit_outcome_name(oq_submit_outcome_t o);

/** A submit request. All fields borrowed for the duration of the call. */
typedef struct oq_submit_req {
    const char *tenant;    /**< NULL or "" = "default"; 1..128 printable ASCII bytes */
    const char *idem_key;  /**< 1..255 printable ASCII bytes (0x20..0x7e: space included) */
    const char *tool;      /**< 1..128 bytes, [A-Za-z0-9_.:-] */
    const json_t *args;    /**< a JSON object */
    const char *client_id; /**< optional; 1..128 printable ASCII bytes
                                (the rules: oq_envelope_valid_key / _name / _tool) */
    int64_t seq;           /**< optional client sequence number, used when has_seq */
    int has_seq;
    const char *callback_url; /**< optional webhook: the settled call is POSTed here
                                   (oq_callback_url_check: http or https, at most
                                   OQ_MAX_CALLBACK_URL_LEN bytes); kept with the call, not
                                   part of the fingerprint, a replay keeps the first one */
} oq_submit_req_t;

/** One call row. Strings are owned by the struct; release with oq_call_clear(). */
typedef struct oq_call {
    char call_id[OQ_CALL_ID_LEN + 1];
    char fingerprint[OQ_FINGERPRINT_LEN + 1];
    char state[16]; /**< pending|running|succeeded|failed|needs_review */
    char *tenant;
    char *idem_key;
    char *tool;
    char *args;      /**< canonical JSON text */
    char *result;    /**< JSON text or NULL */
    char *error;     /**< JSON text {"code","message","retryable"} or NULL */
    char *effect_id; /**< NULL until a result reported one */
    char *client_id; /**< NULL when not given */
    int64_t attempt;
    int64_t seq;
    int has_seq;
    int64_t created_at, updated_at, expires_at; /**< unix ms */
    char *callback_url;                         /**< NULL when the call has no webhook */
} oq_call_t;

/** @brief Free the strings \p c owns and zero it; safe on a zeroed struct. */
void oq_call_clear(oq_call_t *c);

/** @brief Non-zero for succeeded / failed / needs_review. */
int oq_call_state_terminal(const char *state);

/**
 * @brief The call as the compact JSON text of the HTTP API and the CLI: call_id, tenant,
 *        idem_key, fingerprint, tool, args, status, attempt, result, error, effect_id,
 *        client_id, seq, created_at/updated_at/expires_at (RFC 3339), callback_url, query_url.
 *        The one writer of a call's JSON (no intermediate jansson objects: the HTTP hot
 *        path).
 * @param out malloc()ed NUL-terminated text (caller free()s).
 * @returns 0, OQ_ENOMEM, or OQ_EUTF8 (a string of \p c that is not UTF-8).
 */
int oq_call_render(const oq_call_t *c, char **out, size_t *out_len);

/**
 * @brief The same object as oq_call_render() writes, as a jansson tree (its text parsed).
 * @returns a new reference, or NULL when rendering or parsing failed.
 */
json_t *oq_call_to_json(const oq_call_t *c);

/**
 * @brief Create or upgrade the producer tables (calls, outbox, audit, ...) in the caller's
 *        \p db, in one BEGIN IMMEDIATE transaction of its own (call it outside a transaction).
 * @returns 0; OQ_EVERSION (nothing changed) when \p db was written by a newer onceq;
 *          OQ_EBUSY, OQ_EDB.
 */
int oq_producer_migrate(sqlite3 *db, oq_error_t *err);

/**
 * @brief Submit inside the caller's own open write transaction on the caller's connection,
 *        so business rows and the intent commit (or roll back) together.
 * @remark \p db must hold an open write transaction (BEGIN IMMEDIATE) and carry the producer
 *         schema (oq_producer_migrate). Nothing is committed here. A conflict writes nothing.
 * @param key_ttl_ms 0 = 24 h.
 * @param call receives the call (the original one on a replay or conflict); may be NULL.
 * @param outcome receives the outcome (also on conflict); may be NULL.
 * @returns 0 for new / replay / retry-reset, OQ_ECONFLICT for a conflict, OQ_EINVAL for a bad
 *          request, OQ_ETOOBIG when the call's message would be larger than
 *          OQ_DEFAULT_MAX_MESSAGE_BYTES (the relay's default), OQ_ESTATE without an open
 *          transaction (nothing written in each case), OQ_EBUSY/OQ_EDB (roll back; retrying
 *          with the same key is safe).
 */
int oq_producer_submit_in_tx(sqlite3 *db, const oq_submit_req_t *req, int64_t key_ttl_ms,
                             oq_call_t *call, oq_submit_outcome_t *outcome, oq_error_t *err);

/* --- lookups on the caller's connection ---------------------------------------------------- */

/** @brief The call \p call_id (\p out: release with oq_call_clear).
 *  @returns 0, OQ_ENOTFOUND, OQ_EDB. */
int oq_store_get(sqlite3 *db, const char *call_id, oq_call_t *out, oq_error_t *err);
/** @brief The call of (\p tenant, \p idem_key); \p tenant NULL = "default".
 *  @returns 0, OQ_ENOTFOUND, OQ_EDB. */
int oq_store_get_by_key(sqlite3 *db, const char *tenant, const char *idem_key, oq_call_t *out,
                        oq_error_t *err);

/* --- tasks on the caller's connection ------------------------------------------------------ */

/**
 * @brief Submit a task (README "Tasks": a run of steps, each an ordinary call with the derived
 *        key KEY/STEP) inside the caller's own open write transaction: the task, its steps and
 *        its first step's call with its outbox row commit (or roll back) with the service's
 *        rows. Later steps are written by `onceq producer --db` on the same file as results
 *        arrive (the task runs only where a producer applies results).
 * @remark \p db must hold an open write transaction (BEGIN IMMEDIATE) and carry the producer
 *         schema (oq_producer_migrate). Nothing is committed here. SQLite only.
 * @param tenant NULL = the body's "tenant", else "default"; when both are given they must agree.
 * @param body the request {"tenant"?, "steps": [{"name", "tool", "args", "compensate"?,
 *        "irreversible"?, "approval"?}, ...]}, as POST /v1/tasks takes it; borrowed.
 * @param key_ttl_ms the steps' calls' key TTL; 0 = 24 h.
 * @param task receives the task as committed would read it (the same JSON as GET
 *        /v1/tasks/{id}; owned: json_decref), the existing task on a replay; may be NULL.
 * @param replayed set to 1 when the key already had this very task (nothing written); may be
 *        NULL.
 * @param code on error, the stable code of POST /v1/tasks: bad_request, bad_task,
 *        bad_reference, invalid_idempotency_key, tenant_mismatch, idempotency_conflict (NULL
 *        for a database error). May be NULL.
 * @returns 0 (new or replay); OQ_EINVAL (bad request), OQ_ECONFLICT (the key has another
 *          task), OQ_ESTATE (no open transaction): nothing written in each case; OQ_EBUSY /
 *          OQ_EDB / OQ_ENOMEM: roll back (retrying with the same key is safe).
 */
int oq_producer_task_submit_in_tx(sqlite3 *db, const char *tenant, const char *idem_key,
                                  const json_t *body, int64_t key_ttl_ms, json_t **task,
                                  int *replayed, const char **code, oq_error_t *err);

/**
 * @brief The task \p task_id, or of (\p tenant, \p idem_key) when \p task_id is NULL, as the
 *        JSON of GET /v1/tasks/{id} (*out owned: json_decref), read on the caller's connection.
 * @returns 0, OQ_ENOTFOUND, OQ_EDB.
 */
int oq_store_task_get(sqlite3 *db, const char *task_id, const char *tenant, const char *idem_key,
                      json_t **out, oq_error_t *err);

/* --- dead letters ------------------------------------------------------------------------- */

/**
 * @brief Fail the calls whose message the relay set aside (outbox_dead rows not handled yet,
 *        at most \p max): each becomes a tool_result `failed` with error
 *        {"code":"unpublishable","message":...,"retryable":false} applied by the same rules
 *        as a consumer's result (audited, deduplicated by the dead
 *        message's id, a stale attempt or a terminal call is left alone), and the row is marked
 *        handled. `onceq producer --db` on the same file does this by itself about once a
 *        second; a service that runs only `onceq relay` on its database calls this.
 * @remark Runs in the caller's open write transaction; commits nothing.
 * @param failed receives the number of calls moved to `failed`; may be NULL.
 * @param handled receives the number of rows handled; may be NULL.
 * @returns 0, OQ_EBUSY, OQ_EDB, OQ_ENOMEM.
 */
int oq_store_fail_dead_letters(sqlite3 *db, int64_t now_ms, int max, int *failed, int *handled,
                               oq_error_t *err);

/* --- PostgreSQL: the caller's own libpq connection ------------------------------------------ */

struct pg_conn; /* libpq's PGconn: include <libpq-fe.h> to have one */

/**
 * @brief oq_producer_submit_in_tx() on PostgreSQL: inside the caller's own open transaction on
 *        the caller's own libpq connection (BEGIN issued by the caller), so the service's rows
 *        and the call with its outbox row commit or roll back together.
 * @remark \p conn must carry schema `onceq` (oq_producer_migrate_pg, or `onceq migrate --db
 *         URL`) and be inside a transaction block. Nothing is committed here. A conflict writes
 *         nothing; an error leaves the transaction aborted (the caller rolls back, as after any
 *         failed statement on PostgreSQL). Statements are unnamed: the connection's prepared
 *         statements and settings are left as found.
 * @returns as oq_producer_submit_in_tx().
 */
int oq_producer_submit_in_pgtx(struct pg_conn *conn, const oq_submit_req_t *req, int64_t key_ttl_ms,
                               oq_call_t *call, oq_submit_outcome_t *outcome, oq_error_t *err);

/** @brief Apply the migrations of schema `onceq` on the caller's PostgreSQL connection (in a
 *  transaction of its own: call it outside one). @returns 0, OQ_EVERSION, OQ_EDB. */
int oq_producer_migrate_pg(struct pg_conn *conn, oq_error_t *err);

#endif
