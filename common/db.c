/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SQLite helpers shared by every onceq database (calls.db, effects.db).
 *
 * Files: a database this code creates is created owner-only (0600); SQLite gives its -wal and
 * -shm files the same permissions.
 *
 * Durability: every read-write connection runs in WAL mode (verified, not assumed: a database
 * on a file system without shared memory support silently stays in "delete" mode, which we
 * refuse) with synchronous=FULL unless the caller asks for less. Connections are opened with
 * SQLITE_OPEN_NOMUTEX: each one is used by one thread at a time, so SQLite's own mutex is pure
 * overhead.
 *
 * Migrations: the schema/ files are compiled into the binary (cmake/embed_sql.cmake produces
 * oq_sql_files[]); a migration set names them in order and PRAGMA user_version counts how many
 * are applied. The missing tail is applied inside one BEGIN IMMEDIATE transaction, and
 * user_version is re-read after the lock is held, so two processes migrating the same file at
 * once apply each script exactly once. A database with a higher user_version than the set
 * was written by a newer binary and is refused untouched: oq_db_open() checks it for every
 * opener (producer, consumer, relay, purge, the read-only tools) before it writes anything,
 * even the switch to WAL, and oq_db_migrate() checks it again under the write lock.
 *
 * Statement cache: keyed by the address of the SQL text (callers pass string literals), an
 * open-addressing table with linear probing that doubles when half full. Statements are
 * prepared with SQLITE_PREPARE_PERSISTENT and handed out reset with their bindings cleared.
 *
 * Outbox: the statements that write or count the shared outbox table from the producer's and
 * the consumer's side (append in the writer's transaction, retention of delivered rows,
 * counts) are here, once; the relay's reads and watermark live with the relay.
 */
#include "oq_db.h"
#include "dbgate.h"
#include "oq_envelope.h" /* OQ_HDR_MESSAGE_ID, the header the relay adds to each row */
#include "oq_log.h"
#include "oq_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* --- errors ------------------------------------------------------------------------------- */

int oq_db_error(sqlite3 *db, int rc, oq_error_t *err, const char *what)
{
    int primary = rc & 0xff;
    const char *msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED)
        return oq_error_set_retriable(err, OQ_EBUSY, rc, 1, "%s: %s", what ? what : "sqlite", msg);
    return oq_error_set(err, OQ_EDB, rc, "%s: %s", what ? what : "sqlite", msg);
}

/* --- open --------------------------------------------------------------------------------- */

/* Runs a PRAGMA that returns one text row and copies the first column into \p out. */
static int oq__db_pragma_text(sqlite3 *db, const char *sql, char *out, size_t cap, oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(db, rc, err, sql);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        snprintf(out, cap, "%s", t ? (const char *)t : "");
        rc = 0;
    } else if (rc == SQLITE_DONE) {
        out[0] = '\0';
        rc = 0;
    } else {
        rc = oq_db_error(db, rc, err, sql);
    }
    sqlite3_finalize(st);
    return rc;
}

/*
 * Busy handler. SQLite's default one (sqlite3_busy_timeout) sleeps 1, 2, 5, 10, ... up to
 * 100 ms between tries, so a writer that loses one race against another process's short
 * transaction (the relay marking rows, a consumer's batch) waits tens of milliseconds for a
 * lock that was free after a few hundred microseconds: measured here as p99 submit latencies
 * of about 300 ms with three writers on one file. This one retries after 50 us, doubling up
 * to 2 ms, with jitter so competing processes do not retry in lock step. The elapsed time is
 * bounded from below by the schedule (the jitter only lengthens a sleep), so the timeout holds.
 * The timeout in ms travels in the context pointer: no per-connection allocation to free.
 */
static _Atomic uint64_t busy_calls;
/* The deadline of this thread's oq_db_begin_immediate() (oq_mono_us(); 0: none), which the
 * busy handler also keeps: a wait for the writer gate and the busy sleeps after it share one
 * deadline. Already past when the gate's wait used it up: one try, no sleep. */
static _Thread_local int64_t busy_until_us;

uint64_t oq_db_busy_calls(void)
{
    return atomic_load(&busy_calls);
}

static int oq__db_busy_cb(void *ctx, int count)
{
    atomic_fetch_add(&busy_calls, 1);
    if (busy_until_us && oq_mono_us() >= busy_until_us) return 0;
    int64_t timeout_us = (int64_t)(intptr_t)ctx * 1000;
    int64_t nap = 50, spent = 0;
    for (int i = 0; i < count; i++) {
        spent += nap;
        nap = nap * 2 > 2000 ? 2000 : nap * 2;
    }
    if (spent >= timeout_us) return 0;
    unsigned char r;
    oq_random_bytes(&r, 1);
    int64_t us = nap + nap * r / 512; /* [1, 1.5) x nap */
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)us * 1000};
    nanosleep(&ts, NULL);
    return 1;
}

static int set_len(const char *const *set)
{
    int n = 0;
    while (set[n])
        n++;
    return n;
}

int oq_db_check_version(sqlite3 *db, const char *schema, const char *path, oq_error_t *err)
{
    char sql[160];
    sqlite3_stmt *st = NULL;
    int version = 0, has_calls = 0, has_exec = 0, rc;
    if (!schema) schema = "main";
    snprintf(sql, sizeof(sql), "PRAGMA \"%s\".user_version", schema);
    rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        version = sqlite3_column_int(st, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (rc != SQLITE_OK) goto dberr;
    if (version == 0) return 0;
    snprintf(sql, sizeof(sql),
             "SELECT name FROM \"%s\".sqlite_master WHERE type = 'table' AND name IN "
             "('calls', 'executions')",
             schema);
    rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        if (name && strcmp(name, "calls") == 0) has_calls = 1;
        if (name && strcmp(name, "executions") == 0) has_exec = 1;
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) goto dberr;
    int np = set_len(oq_migrations_producer), nc = set_len(oq_migrations_consumer);
    int known = has_calls ? np : has_exec ? nc : (np > nc ? np : nc);
    if (version > known)
        return oq_error_set(err, OQ_EVERSION, 0,
                            "database %s: schema version %d is newer than this binary (%d); "
                            "upgrade onceq (nothing was changed)",
                            path ? path : schema, version, known);
    return 0;
dberr:
    return oq_db_error(db, rc, err, "read the schema version");
}

int oq_db_open(const char *path, const oq_db_opts_t *opts, sqlite3 **out, oq_error_t *err)
{
    static const char *const levels[] = {"OFF", "NORMAL", "FULL", "EXTRA"};
    const char *sync = (opts && opts->synchronous) ? opts->synchronous : "FULL";
    int busy_ms = (opts && opts->busy_timeout_ms > 0) ? opts->busy_timeout_ms : 5000;
    int readonly = opts ? opts->readonly : 0;
    sqlite3 *db = NULL;
    int rc;
    char buf[64];

    *out = NULL;
    const char *level = NULL;
    for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
        if (strcasecmp(sync, levels[i]) == 0) level = levels[i];
    if (!level)
        return oq_error_set(err, OQ_EINVAL, 0,
                            "database %s: synchronous must be full, normal, extra or off, got '%s'",
                            path, sync);

    int flags = SQLITE_OPEN_NOMUTEX |
                (readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    /* A new database file is created here, owner-only (0600, minus the umask), instead of by
     * SQLite with 0644: it holds every call's arguments. SQLite gives the -wal and -shm files
     * the database file's permissions, so they follow. An existing file keeps its mode. */
    if (!readonly && path[0] && strcmp(path, ":memory:") != 0) {
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0)
            close(fd);
        else if (errno != EEXIST)
            return oq_error_set(err, OQ_EIO, errno, "cannot create database %s: %s", path,
                                strerror(errno));
    }
    rc = sqlite3_open_v2(path, &db, flags, NULL);
    if (rc != SQLITE_OK) {
        int code = (rc & 0xff) == SQLITE_CANTOPEN ? OQ_EIO : OQ_EDB;
        oq_error_set(err, code, rc, "cannot open database %s: %s", path,
                     db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        rc = code;
        goto fail;
    }
    sqlite3_extended_result_codes(db, 1);
    sqlite3_busy_handler(db, oq__db_busy_cb, (void *)(intptr_t)busy_ms);

    /* The schema-version guard, before anything below may write (the switch to WAL does). */
    rc = oq_db_check_version(db, NULL, path, err);
    if (rc != 0) goto prefix_fail;

    if (readonly) {
        rc = oq__db_pragma_text(db, "PRAGMA journal_mode", buf, sizeof(buf), err);
    } else {
        /* WAL is persistent: usually the file is in WAL already and nothing needs a lock.
         * Switching a fresh file needs an exclusive lock and SQLite reports a conflict with
         * another connection doing the same as an immediate SQLITE_BUSY, without its busy
         * handler, so retry that for up to the busy timeout (processes often start together
         * on a new database). */
        int64_t deadline = oq_mono_us() + (int64_t)busy_ms * 1000, nap = 1;
        rc = oq__db_pragma_text(db, "PRAGMA journal_mode", buf, sizeof(buf), err);
        while (rc == 0 && strcasecmp(buf, "wal") != 0) {
            rc = oq__db_pragma_text(db, "PRAGMA journal_mode=WAL", buf, sizeof(buf), err);
            if (rc == 0 || rc != OQ_EBUSY || oq_mono_us() >= deadline) break;
            oq_sleep_ms(nap, NULL);
            if (nap < 32) nap *= 2;
            rc = 0;
            buf[0] = '\0';
        }
        if (rc == 0 && strcasecmp(buf, "wal") != 0)
            rc = oq_error_set(err, OQ_EDB, 0,
                              "database %s: cannot enable WAL (journal_mode is '%s')", path, buf);
    }
    if (rc != 0) goto prefix_fail;

    char sql[64];
    snprintf(sql, sizeof(sql), "PRAGMA synchronous=%s", level);
    rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, "PRAGMA foreign_keys=ON", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        rc = oq_db_error(db, rc, err, "configure");
        goto prefix_fail;
    }
    if (!readonly) oq__dbgate_attach(db);
    *out = db;
    return 0;

prefix_fail:
    if (err && strncmp(err->msg, "database ", 9) != 0) {
        char tmp[sizeof(err->msg)];
        snprintf(tmp, sizeof(tmp), "%s", err->msg);
        oq_error_set_retriable(err, err->code, err->cause, err->retriable, "database %s: %s", path,
                               tmp);
    }
fail:
    sqlite3_close_v2(db);
    return rc;
}

/* --- migrations --------------------------------------------------------------------------- */

const char *oq_sql_file(const char *name)
{
    if (!name) return NULL;
    for (const oq_sql_file_t *f = oq_sql_files; f->name; f++)
        if (strcmp(f->name, name) == 0) return f->sql;
    return NULL;
}

int oq_db_user_version(sqlite3 *db)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(db, rc, NULL, "user_version");
    rc = sqlite3_step(st);
    int v =
        rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : oq_db_error(db, rc, NULL, "user_version");
    sqlite3_finalize(st);
    return v;
}

int oq_db_migrate_sql(sqlite3 *db, const char *const *sql_texts, oq_error_t *err)
{
    int n = 0, v, rc;
    while (sql_texts[n])
        n++;

    v = oq_db_user_version(db);
    if (v < 0) return oq_db_error(db, sqlite3_errcode(db), err, "read user_version");
    if (v > n) goto newer;
    if (v == n) return 0;

    rc = oq_db_begin_immediate(db, 30000, err);
    if (rc != 0) return rc;
    v = oq_db_user_version(db); /* another process may have migrated while we waited */
    if (v < 0) {
        rc = oq_db_error(db, sqlite3_errcode(db), err, "read user_version");
        goto out;
    }
    if (v > n) {
        oq_db_rollback(db);
        goto newer;
    }
    for (int i = v; i < n; i++) {
        char *emsg = NULL;
        rc = sqlite3_exec(db, sql_texts[i], NULL, NULL, &emsg);
        if (rc != SQLITE_OK) {
            int primary = rc & 0xff;
            oq_error_set_retriable(err, primary == SQLITE_BUSY ? OQ_EBUSY : OQ_EDB, rc,
                                   primary == SQLITE_BUSY, "migration %d of %d failed: %s", i + 1,
                                   n, emsg ? emsg : sqlite3_errstr(rc));
            rc = primary == SQLITE_BUSY ? OQ_EBUSY : OQ_EDB;
            sqlite3_free(emsg);
            goto out;
        }
    }
    char sql[64];
    snprintf(sql, sizeof(sql), "PRAGMA user_version=%d", n);
    rc = oq_db_exec(db, sql, err);
    if (rc == 0) rc = oq_db_commit(db, err);
    if (rc == 0) OQ_LOG_INFO("db", "migrated schema from version %d to %d", v, n);
out:
    if (rc != 0) oq_db_rollback(db);
    return rc;
newer:
    return oq_error_set(err, OQ_EVERSION, 0,
                        "database schema version %d is newer than this binary (%d); upgrade onceq",
                        v, n);
}

int oq_db_migrate(sqlite3 *db, const char *const *set, oq_error_t *err)
{
    size_t n = 0;
    while (set[n])
        n++;
    const char **texts = calloc(n + 1, sizeof(*texts));
    if (!texts) return oq_error_set(err, OQ_ENOMEM, 0, "migrate: out of memory");
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        texts[i] = oq_sql_file(set[i]);
        if (!texts[i]) {
            rc = oq_error_set(err, OQ_EINVAL, 0, "migration %s is not embedded in this binary",
                              set[i]);
            goto out;
        }
    }
    rc = oq_db_migrate_sql(db, texts, err);
out:
    free(texts);
    return rc;
}

/* --- transactions ------------------------------------------------------------------------- */

int oq_db_exec(sqlite3 *db, const char *sql, oq_error_t *err)
{
    int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    if (rc == SQLITE_OK) return 0;
    char what[80];
    snprintf(what, sizeof(what), "%.60s%s", sql, strlen(sql) > 60 ? "..." : "");
    return oq_db_error(db, rc, err, what);
}

/* Time this process spent taking SQLite's write lock (BEGIN IMMEDIATE, busy waits included). */
static _Atomic int64_t lock_wait_us;

int64_t oq_db_lock_wait_us(void)
{
    return atomic_load(&lock_wait_us);
}

int oq_db_begin_immediate(sqlite3 *db, int timeout_ms, oq_error_t *err)
{
    int64_t t0 = oq_mono_us();
    int64_t deadline = t0 + (int64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000;
    int64_t sleep_ms = 1;
    int gate = oq__dbgate_enter(db, deadline);
    for (;;) {
        busy_until_us = gate < 0 ? 1 : deadline;
        int rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        busy_until_us = 0;
        atomic_fetch_add(&lock_wait_us, oq_mono_us() - t0);
        t0 = oq_mono_us();
        if (rc == SQLITE_OK) return 0;
        int primary = rc & 0xff;
        if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) || oq_mono_us() >= deadline) {
            if (sqlite3_get_autocommit(db)) oq__dbgate_leave(db);
            return oq_db_error(db, rc, err, "BEGIN IMMEDIATE");
        }
        oq_sleep_ms(sleep_ms, NULL);
        if (sleep_ms < 16) sleep_ms *= 2;
    }
}

int oq_db_commit(sqlite3 *db, oq_error_t *err)
{
    int rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc == SQLITE_OK) {
        oq__dbgate_leave(db);
        return 0;
    }
    rc = oq_db_error(db, rc, err, "COMMIT");
    if (sqlite3_get_autocommit(db)) oq__dbgate_leave(db); /* it ended anyway */
    return rc;
}

void oq_db_rollback(sqlite3 *db)
{
    if (!db) return;
    if (!sqlite3_get_autocommit(db)) {
        int rc = sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        if (rc != SQLITE_OK) OQ_LOG_WARN("db", "ROLLBACK failed: %s", sqlite3_errmsg(db));
    }
    oq__dbgate_leave(db);
}

/* --- statement cache ---------------------------------------------------------------------- */

typedef struct {
    const char *sql;
    sqlite3_stmt *stmt;
} oq__stmt_slot_t;

struct oq_stmt_cache {
    sqlite3 *db;
    oq__stmt_slot_t *slots;
    size_t cap; /* power of two */
    size_t used;
};

static size_t oq__ptr_hash(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

oq_stmt_cache_t *oq_stmt_cache_new(sqlite3 *db)
{
    oq_stmt_cache_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->db = db;
    c->cap = 32;
    c->slots = calloc(c->cap, sizeof(*c->slots));
    if (!c->slots) {
        free(c);
        return NULL;
    }
    return c;
}

void oq_stmt_cache_destroy(oq_stmt_cache_t *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->cap; i++)
        if (c->slots[i].stmt) sqlite3_finalize(c->slots[i].stmt);
    free(c->slots);
    free(c);
}

static oq__stmt_slot_t *oq__stmt_find(oq__stmt_slot_t *slots, size_t cap, const char *sql)
{
    size_t i = oq__ptr_hash(sql) & (cap - 1);
    while (slots[i].sql && slots[i].sql != sql)
        i = (i + 1) & (cap - 1);
    return &slots[i];
}

static int oq__stmt_grow(oq_stmt_cache_t *c)
{
    size_t ncap = c->cap * 2;
    oq__stmt_slot_t *ns = calloc(ncap, sizeof(*ns));
    if (!ns) return OQ_ENOMEM;
    for (size_t i = 0; i < c->cap; i++)
        if (c->slots[i].sql) *oq__stmt_find(ns, ncap, c->slots[i].sql) = c->slots[i];
    free(c->slots);
    c->slots = ns;
    c->cap = ncap;
    return 0;
}

sqlite3_stmt *oq_stmt_get(oq_stmt_cache_t *c, const char *sql, oq_error_t *err)
{
    oq__stmt_slot_t *s = oq__stmt_find(c->slots, c->cap, sql);
    if (s->sql) {
        sqlite3_reset(s->stmt);
        sqlite3_clear_bindings(s->stmt);
        return s->stmt;
    }
    if ((c->used + 1) * 2 > c->cap) {
        if (oq__stmt_grow(c) != 0) {
            oq_error_set(err, OQ_ENOMEM, 0, "statement cache: out of memory");
            return NULL;
        }
        s = oq__stmt_find(c->slots, c->cap, sql);
    }
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL);
    if (rc != SQLITE_OK) {
        char what[96];
        snprintf(what, sizeof(what), "prepare '%.60s%s'", sql, strlen(sql) > 60 ? "..." : "");
        oq_db_error(c->db, rc, err, what);
        sqlite3_finalize(st);
        return NULL;
    }
    s->sql = sql;
    s->stmt = st;
    c->used++;
    return st;
}

/* --- outbox ------------------------------------------------------------------------------- */

/* librdkafka's RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD: the varints of a v2 record at their widest
 * (length 5, attributes 1, timestamp delta 10, offset delta 5, key length 5, value length 5,
 * header count 5). */
#define OQ__RECORD_V2_MAX_OVERHEAD 36
/* A header's name and value lengths, as varints at their widest. */
#define OQ__HEADER_VARINTS 10

size_t oq_outbox_wire_size(size_t key_len, size_t payload_len, size_t message_id_len)
{
    return OQ__RECORD_V2_MAX_OVERHEAD + key_len + payload_len + OQ__HEADER_VARINTS +
           strlen(OQ_HDR_MESSAGE_ID) + message_id_len;
}

static const char oq__outbox_insert_sql[] =
    "INSERT INTO outbox(message_id, topic, key, payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5)";

int oq_outbox_append(sqlite3 *db, oq_stmt_cache_t *cache, const oq_outbox_row_t *row,
                     oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    int rc;
    if (!row || !row->message_id || !row->topic || !row->key || !row->payload)
        return oq_error_set(err, OQ_EINVAL, 0, "outbox append: missing field");
    if (cache) {
        st = oq_stmt_get(cache, oq__outbox_insert_sql, err);
        if (!st) return err ? err->code : OQ_EDB;
    } else {
        rc = sqlite3_prepare_v2(db, oq__outbox_insert_sql, -1, &st, NULL);
        if (rc != SQLITE_OK) return oq_db_error(db, rc, err, "outbox append: prepare");
    }
    /* The payload is JSON: bound as text so SQLite's json functions work on it in ad-hoc
     * queries; readers use sqlite3_column_blob/bytes, which return the same bytes. */
    if ((rc = sqlite3_bind_text(st, 1, row->message_id, -1, SQLITE_STATIC)) != SQLITE_OK ||
        (rc = sqlite3_bind_text(st, 2, row->topic, -1, SQLITE_STATIC)) != SQLITE_OK ||
        (rc = sqlite3_bind_text(st, 3, row->key, -1, SQLITE_STATIC)) != SQLITE_OK ||
        (rc = sqlite3_bind_text64(st, 4, row->payload, (sqlite3_uint64)row->payload_len,
                                  SQLITE_STATIC, SQLITE_UTF8)) != SQLITE_OK ||
        (rc = sqlite3_bind_int64(st, 5, row->created_at)) != SQLITE_OK) {
        rc = oq_db_error(db, rc, err, "outbox append: bind");
        goto out;
    }
    rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        rc = 0;
    } else {
        char what[96];
        snprintf(what, sizeof(what), "outbox append %.40s", row->message_id);
        rc = oq_db_error(db, rc, err, what);
    }
out:
    if (cache) {
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
    } else {
        sqlite3_finalize(st);
    }
    return rc;
}

/* The relay's publish watermark: rows with seq at or below it were delivered
 * (schema/common/0002_outbox_watermark.sql). */
#define OUTBOX_WATERMARK "(SELECT COALESCE(max(published_seq), 0) FROM relay_lease)"

/* Looks at the oldest ?2 published rows only (bounded work however many young rows there are)
 * and deletes those created before ?1. */
static const char outbox_purge_sql[] =
    "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE seq <= " OUTBOX_WATERMARK
    " ORDER BY seq LIMIT ?2) AND created_at < ?1";
static const char outbox_count_sql[] =
    "SELECT (SELECT count(*) FROM outbox WHERE seq > " OUTBOX_WATERMARK
    "), (SELECT count(*) FROM outbox)";

int oq_outbox_purge_published(sqlite3 *db, int64_t cutoff_ms, int limit, int64_t *deleted,
                              oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, outbox_purge_sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(db, rc, err, "outbox purge: prepare");
    sqlite3_bind_int64(st, 1, cutoff_ms);
    sqlite3_bind_int(st, 2, limit);
    rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        rc = 0;
        if (deleted) *deleted = sqlite3_changes(db);
    } else {
        rc = oq_db_error(db, rc, err, "outbox purge");
    }
    sqlite3_finalize(st);
    return rc;
}

int oq_outbox_count(sqlite3 *db, int64_t *pending, int64_t *total, oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, outbox_count_sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return oq_db_error(db, rc, err, "outbox count: prepare");
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        rc = 0;
        if (pending) *pending = sqlite3_column_int64(st, 0);
        if (total) *total = sqlite3_column_int64(st, 1);
    } else {
        rc = oq_db_error(db, rc, err, "outbox count");
    }
    sqlite3_finalize(st);
    return rc;
}

/* --- outbox: republish -------------------------------------------------------------------- */

/* The row of a message id and whether the relay's watermark passed it. */
static const char outbox_find_sql[] = "SELECT seq, topic, key, payload, seq <= " OUTBOX_WATERMARK
                                      " FROM outbox WHERE message_id = ?1";
static const char outbox_delete_sql[] = "DELETE FROM outbox WHERE seq = ?1";

static sqlite3_stmt *outbox_stmt(sqlite3 *db, oq_stmt_cache_t *cache, const char *sql,
                                 oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    if (cache) return oq_stmt_get(cache, sql, err);
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) {
        oq_db_error(db, rc, err, "outbox republish: prepare");
        return NULL;
    }
    return st;
}

static void outbox_stmt_done(oq_stmt_cache_t *cache, sqlite3_stmt *st)
{
    if (!st) return;
    if (cache) {
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
    } else {
        sqlite3_finalize(st);
    }
}

/*
 * One row per message id stays the rule (the outbox's UNIQUE(message_id), which the relay and
 * the retention rely on: a row is one pending or one done publication). Republishing a
 * delivered message therefore moves its row: read it, delete it, append the same bytes with a
 * fresh seq. Rows at or below the watermark are never read again by the relay, so deleting
 * one cannot race with a publication in flight; rows above it are left alone.
 */
int oq_outbox_republish(sqlite3 *db, oq_stmt_cache_t *cache, const oq_outbox_row_t *row,
                        oq_outbox_republish_t *what, oq_error_t *err)
{
    sqlite3_stmt *st = NULL;
    char *topic = NULL, *key = NULL, *payload = NULL;
    int64_t seq = 0;
    size_t len = 0;
    int rc, found = 0, delivered = 0;
    if (!row || !row->message_id || !row->topic || !row->key || !row->payload || !what)
        return oq_error_set(err, OQ_EINVAL, 0, "outbox republish: missing field");
    if (!(st = outbox_stmt(db, cache, outbox_find_sql, err))) return err ? err->code : OQ_EDB;
    sqlite3_bind_text(st, 1, row->message_id, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        found = 1;
        seq = sqlite3_column_int64(st, 0);
        delivered = sqlite3_column_int(st, 4) != 0;
        if (delivered) {
            const char *t = (const char *)sqlite3_column_text(st, 1);
            const char *k = (const char *)sqlite3_column_text(st, 2);
            const void *p = sqlite3_column_blob(st, 3);
            len = (size_t)sqlite3_column_bytes(st, 3);
            topic = t ? strdup(t) : NULL;
            key = k ? strdup(k) : NULL;
            payload = malloc(len + 1);
            if (payload && len) memcpy(payload, p, len);
            if (!topic || !key || !payload) {
                rc = oq_error_set(err, OQ_ENOMEM, 0, "outbox republish: out of memory");
                goto out;
            }
        }
        rc = 0;
    } else if (rc == SQLITE_DONE) {
        rc = 0;
    } else {
        rc = oq_db_error(db, rc, err, "outbox republish: find");
        goto out;
    }
    outbox_stmt_done(cache, st);
    st = NULL;

    if (found && !delivered) {
        *what = OQ_OUTBOX_PENDING;
        goto out;
    }
    if (!found) {
        if ((rc = oq_outbox_append(db, cache, row, err)) == 0) *what = OQ_OUTBOX_APPENDED;
        goto out;
    }
    if (!(st = outbox_stmt(db, cache, outbox_delete_sql, err))) {
        rc = err ? err->code : OQ_EDB;
        goto out;
    }
    sqlite3_bind_int64(st, 1, seq);
    if ((rc = sqlite3_step(st)) != SQLITE_DONE) {
        rc = oq_db_error(db, rc, err, "outbox republish: delete");
        goto out;
    }
    oq_outbox_row_t again = {row->message_id, topic, key, payload, len, row->created_at};
    if ((rc = oq_outbox_append(db, cache, &again, err)) == 0) *what = OQ_OUTBOX_REQUEUED;
out:
    outbox_stmt_done(cache, st);
    free(topic);
    free(key);
    free(payload);
    return rc;
}
