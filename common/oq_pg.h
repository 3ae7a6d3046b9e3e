/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file oq_pg.h
 * @brief PostgreSQL helpers (libpq): which backend a database setting names, connecting,
 *        errors as oq_error_t, retry of serialization failures and deadlocks, reconnect after
 *        a lost connection, the embedded migrations of schema `onceq` and their newer-schema
 *        guard. The SQLite counterpart is oq_db.h.
 *
 * Every object of onceq lives in the schema `onceq` (so it sits beside a service's own tables
 * in the service's database); statements name it explicitly and never change a caller's
 * search_path. A database setting is a file path (SQLite) or a libpq connection string:
 * a `postgres://` / `postgresql://` URI or a keyword string ("host=... dbname=..."). A password
 * belongs in a passfile (`passfile=` in the string, or PGPASSFILE), never on a command line.
 */
#ifndef OQ_PG_H
#define OQ_PG_H

#include <libpq-fe.h>
#include <stdint.h>

#include "oq_buf.h"
#include "oq_error.h"

/** What a database setting names. */
typedef enum {
    OQ_BACKEND_SQLITE = 1,  /**< a file path */
    OQ_BACKEND_POSTGRES = 2 /**< a libpq URI or keyword string */
} oq_backend_t;

/**
 * @brief The backend \p setting names: a `postgres://` or `postgresql://` URI, or a string
 *        whose first word is `keyword=` with a keyword libpq knows (host, dbname, port, user,
 *        service, ...), is PostgreSQL; anything else (NULL included) is an SQLite file path.
 */
oq_backend_t oq_backend_of(const char *setting);

/**
 * @brief Non-zero when \p conninfo (URI or keyword string) carries a password. The commands
 *        refuse such a --db: a command line is visible to every user of the host (ps); the
 *        password belongs in a passfile (`passfile=` in the string, or PGPASSFILE).
 */
int oq_pg_conninfo_has_password(const char *conninfo);

/** SQLSTATE "40001" as an int (PostgreSQL's MAKE_SQLSTATE), the cause in an oq_error_t. */
int oq_pg_sqlstate_code(const char *sqlstate);

/**
 * @brief Fill \p err from a failed result \p res (may be NULL: the connection's message).
 * Mapping: 40001 serialization_failure, 40P01 deadlock_detected, 55P03 lock_not_available ->
 * OQ_EBUSY (retriable); 23505 unique_violation -> OQ_EEXIST; a lost connection (class 08,
 * 57P01..57P03, or CONNECTION_BAD) -> OQ_EDB retriable; 57014 query_canceled -> OQ_ETIMEDOUT;
 * anything else OQ_EDB. cause = oq_pg_sqlstate_code() of the SQLSTATE.
 * @returns the code.
 */
int oq_pg_error(PGconn *c, const PGresult *res, oq_error_t *err, const char *what);

/** @brief Non-zero when \p err says the connection was lost (reconnect and retry). */
int oq_pg_lost(PGconn *c, const oq_error_t *err);

/**
 * @brief Leave pipeline mode once every statement's results were read: drains what is left
 *        (the sync's result, or what a broken pipeline left) and exits the mode.
 * @returns 0; -1 when the pipeline could not be closed, and the session was reset (PQreset: a
 *          new session, its transaction, settings and prepared statements gone).
 */
int oq_pg_pipeline_end(PGconn *c);

/**
 * @brief Connect to \p conninfo (URI or keyword string). The session gets
 *        synchronous_commit=on (accepted data is durable at commit) and an application_name.
 * @returns 0 and *out (close with PQfinish), or OQ_EDB (retriable: the server may come up)
 *          with the server's message; the connection string is never echoed (it may hold a
 *          password).
 */
int oq_pg_connect(const char *conninfo, PGconn **out, oq_error_t *err);

/**
 * The statement that makes a transaction plan without sequential scans and without JIT
 * (enable_seqscan and jit off until its end), sent after BEGIN by the writers whose statements
 * all look rows up by key (the producer's, the consumer's batch). It lets their reads and writes
 * by key array be prepared: PostgreSQL gives a prepared statement a generic plan from its sixth
 * run on, chosen for its table as it is then, and keeps it; a sequential scan chosen while the
 * table was small would then read the whole table every time as it grows. With sequential scans
 * off the plan is an index lookup at any size, and nothing is planned again per batch. A table
 * with no usable index is still read (the setting only makes a sequential scan the last
 * choice), but its plan then costs more than jit_above_cost: JIT compiled every statement that
 * reads such a table (the consumer's republish, through relay_lease: 173 ms each instead of a
 * fraction of one), hence jit off as well, which a key lookup never needs.
 */
#define OQ_PG_INDEX_PLANS                                                                          \
    "SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"

/** @brief Run \p sql (no parameters, any number of statements, no rows kept). */
int oq_pg_exec(PGconn *c, const char *sql, oq_error_t *err);

/**
 * @brief Wake the relay after commit on this session (schema/postgres/0008): the outbox
 *        trigger leaves its NOTIFY out (a NOTIFY holds a cluster-wide lock through its
 *        transaction's WAL flush, so NOTIFYing commits never share an fsync), and whoever
 *        commits outbox rows on this session calls oq_pg_commit_wake(). Again after a
 *        reconnect: a session that has not said it keeps the trigger's NOTIFY, as before.
 */
int oq_pg_wake_after(PGconn *c, oq_error_t *err);

/**
 * @brief COMMIT, then onceq.wake() (a NOTIFY in a transaction of its own that does not wait for
 *        the flush), in one round trip. Returns the COMMIT's outcome, as oq_pg_exec(c,
 *        "COMMIT") with a rolled-back transaction an error; the wake-up's failure is logged at
 *        debug and costs the relay one poll.
 */
int oq_pg_commit_wake(PGconn *c, oq_error_t *err);

/**
 * @brief Run \p sql with \p n text parameters (NULL = SQL NULL) and keep the result.
 * @returns 0 and *out (PQclear it) when the statement succeeded (rows or none), else the code
 *          of oq_pg_error() and *out = NULL.
 */
int oq_pg_query(PGconn *c, const char *sql, int n, const char *const *params, PGresult **out,
                oq_error_t *err);

/** @brief As oq_pg_query() for a statement whose rows are not needed; *affected = rows
 *         changed (may be NULL). */
int oq_pg_cmd(PGconn *c, const char *sql, int n, const char *const *params, int64_t *affected,
              oq_error_t *err);

/**
 * @brief Opt connection \p c in to prepared statements: from now on oq_pg_run() prepares each
 *        statement once per session on it (named oq_s0.. by the address of its SQL literal) and
 *        then only executes it. The set is attached to \p c (libpq instance data): PQreset()
 *        empties it (a new session has nothing prepared), PQfinish() frees it; a statement the
 *        server no longer knows (SQLSTATE 26000) outside a transaction is prepared again. Only
 *        for onceq's own connections: a caller's connection is never opted in (its session
 *        is left as found). Calling it twice is harmless.
 */
int oq_pg_prepared(PGconn *c, oq_error_t *err);

/**
 * @brief As oq_pg_query(); on a connection opted in by oq_pg_prepared() it runs \p sql as a
 *        statement prepared once per session (\p sql must then be a string literal: its
 *        address names it). At most 64 statements per connection are prepared, the rest parsed.
 */
int oq_pg_run(PGconn *c, const char *sql, int n, const char *const *params, PGresult **out,
              oq_error_t *err);

/**
 * @brief The name of \p sql as a statement prepared in \p c's session (prepared now, with a
 *        round trip, on its first use), for a caller that sends it itself (PQsendQueryPrepared
 *        in pipeline mode). \p name is "" when \p c is not opted in (oq_pg_prepared) or its
 *        set is full: send \p sql unprepared then. Not in pipeline mode.
 */
int oq_pg_stmt_name(PGconn *c, const char *sql, int n, char name[16], oq_error_t *err);

/**
 * @brief As oq_pg_run(), with parameter i sent in binary when \p fmts[i] is 1 (\p lens[i]
 *        bytes; oq_pg_array_t builds such a parameter). \p lens and \p fmts may be NULL: all
 *        text, as oq_pg_run().
 */
int oq_pg_run_bin(PGconn *c, const char *sql, int n, const char *const *params, const int *lens,
                  const int *fmts, PGresult **out, oq_error_t *err);

/**
 * A one-dimensional array parameter in PostgreSQL's binary format, for the stores' batches
 * (`unnest($1::text[], ...)`, `= ANY($1::text[])`). Sent as text, an array literal is quoted
 * here and parsed character by character by the server's array_in: 10 % of the server's CPU in
 * the closed loop (docs/SCALING.md, "Arrays in the binary format"); in this form the server
 * copies each element as it comes. Elements are added in their text form, converted here to the
 * element type's binary form: \p type 't' text, 'b' bigint, 'i' integer, 'o' boolean ("t" or
 * "f"). The type must be the one the statement casts the parameter to (`$1::bigint[]` is 'b'):
 * the server refuses another ("binary data has array element type 20 (bigint) instead of
 * expected 25 (text)").
 */
typedef struct oq_pg_array {
    oq_buf_t b; /**< header, then the elements */
    char type;  /**< 't', 'b', 'i' or 'o' */
    int32_t n;  /**< elements so far */
    int nulls;  /**< 1 once a NULL was added */
    int bad;    /**< OQ_EINVAL once an element was not of the type (sticky) */
} oq_pg_array_t;

/** Parameter formats for a statement whose parameters are all binary (at most OQ_PG_BIN_MAX). */
#define OQ_PG_BIN_MAX 32
extern const int oq_pg_bin[OQ_PG_BIN_MAX];

/** @brief Starts an empty array of \p type (see oq_pg_array_t). */
void oq_pg_array_init(oq_pg_array_t *a, char type);
/** @brief Adds \p v (its text form; NULL: an SQL NULL). @returns 0, OQ_EINVAL when \p v is not
 *         a value of the type (a bigint out of range, a boolean other than t/f/true/false/1/0),
 *         or OQ_ENOMEM; sticky, as oq_buf_t. */
int oq_pg_array_add(oq_pg_array_t *a, const char *v);
/** @brief The parameter: \p *p and \p *len (owned by \p a until oq_pg_array_free). @returns 0
 *         or the first failure of an add (then *p is NULL). */
int oq_pg_array_end(oq_pg_array_t *a, const char **p, int *len);
/** @brief Frees the bytes. */
void oq_pg_array_free(oq_pg_array_t *a);

/** @brief As oq_pg_cmd() through oq_pg_run(). */
int oq_pg_run_cmd(PGconn *c, const char *sql, int n, const char *const *params, int64_t *affected,
                  oq_error_t *err);

/** A connection that reconnects: the string is kept (owned) to connect again. */
typedef struct oq_pg {
    PGconn *conn;   /**< NULL while disconnected */
    char *conninfo; /**< owned */
} oq_pg_t;

/** @brief Connect \p p to \p conninfo (copied). On failure p->conn stays NULL, p is usable. */
int oq_pg_open(oq_pg_t *p, const char *conninfo, oq_error_t *err);
/** @brief Close and free \p p's connection and string (p itself is the caller's). */
void oq_pg_close(oq_pg_t *p);

/**
 * @brief Run \p fn in a transaction (BEGIN ... COMMIT) on \p p, retried up to \p tries times
 *        when it fails retriably: a serialization failure or deadlock (rolled back, retried
 *        after a short jittered sleep) or a lost connection (reconnected first). \p fn must
 *        leave nothing behind in memory that a retry would duplicate: it is run again from the
 *        start. A connection lost during COMMIT leaves the outcome unknown; the retry runs \p fn
 *        again, so \p fn must be idempotent in the database (onceq's writes are: keys, message
 *        ids and fences make a second run a replay).
 * @returns fn's result, or the error of the last try.
 */
int oq_pg_tx(oq_pg_t *p, int tries, int (*fn)(PGconn *c, void *arg, oq_error_t *err), void *arg,
             oq_error_t *err);

/** The embedded migrations of schema `onceq` (NULL-terminated names under schema/). */
extern const char *const oq_migrations_postgres[];

/**
 * @brief Apply the missing migrations of schema `onceq` in one transaction, serialized across
 *        processes by an advisory lock. onceq.schema_version holds how many are applied; a
 *        database with more than this binary knows is refused untouched (OQ_EVERSION).
 */
int oq_pg_migrate(PGconn *c, oq_error_t *err);

/** @brief The applied version (0 when schema `onceq` has none) into *version. */
int oq_pg_schema_version(PGconn *c, int *version, oq_error_t *err);

struct sqlite3;

/**
 * @brief Copy PostgreSQL tables into an SQLite database, for readers written over SQLite
 *        (onceq verify): table \p tables[i] (such as "onceq.calls") becomes table \p names[i]
 *        of \p dst with the same column names (integers and booleans as INTEGER, floating and
 *        numeric as REAL, the rest as TEXT the way PostgreSQL prints it). Every table is read
 *        in one REPEATABLE READ READ ONLY transaction: one snapshot. A table that does not
 *        exist is left out (the reader then finds it missing). The caller owns \p dst and its
 *        transaction.
 */
int oq_pg_snapshot(PGconn *c, const char *const *tables, const char *const *names, int n,
                   struct sqlite3 *dst, oq_error_t *err);

#endif
