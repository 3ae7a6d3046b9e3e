/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SQLite helpers: durable open (WAL + synchronous=FULL), migrations (fresh, re-run, newer
 * database refused untouched, failing script rolls everything back), the statement cache and
 * the outbox append. Each test works in its own temporary directory.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "oq_db.h"
#include "oq_log.h"
#include "oq_util.h"

typedef struct {
    char dir[64];
    char path[128];
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    if (!f) return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/oq_test_db_XXXXXX");
    if (!mkdtemp(f->dir)) {
        free(f);
        return -1;
    }
    snprintf(f->path, sizeof(f->path), "%s/t.db", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    const char *suffix[] = {"", "-wal", "-shm", "-journal", "-gate"};
    for (size_t i = 0; i < 5; i++) {
        char p[160];
        snprintf(p, sizeof(p), "%s%s", f->path, suffix[i]);
        unlink(p);
    }
    rmdir(f->dir);
    free(f);
    return 0;
}

static int64_t query_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

static void query_text(sqlite3 *db, const char *sql, char *out, size_t cap)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    snprintf(out, cap, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
}

static int set_len(const char *const *set)
{
    int n = 0;
    while (set[n])
        n++;
    return n;
}

static void test_open_defaults(void **state)
{
    fixture_t *f = *state;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(f->path, NULL, &db, &err), 0);
    char mode[16];
    query_text(db, "PRAGMA journal_mode", mode, sizeof(mode));
    assert_string_equal(mode, "wal");
    assert_int_equal(query_int(db, "PRAGMA synchronous"), 2); /* FULL */
    assert_int_equal(query_int(db, "PRAGMA foreign_keys"), 1);
    sqlite3_close_v2(db);

    oq_db_opts_t o = {.synchronous = "normal", .busy_timeout_ms = 250};
    assert_int_equal(oq_db_open(f->path, &o, &db, &err), 0);
    assert_int_equal(query_int(db, "PRAGMA synchronous"), 1);
    /* the busy handler waits about busy_timeout_ms for a lock held elsewhere, then gives up */
    sqlite3 *holder = NULL;
    assert_int_equal(oq_db_open(f->path, NULL, &holder, &err), 0);
    assert_int_equal(sqlite3_exec(holder, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    int64_t t0 = oq_mono_us();
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) & 0xff, SQLITE_BUSY);
    int64_t waited_ms = (oq_mono_us() - t0) / 1000;
    assert_true(waited_ms >= 250);
    assert_true(waited_ms < 3000);
    assert_int_equal(sqlite3_exec(holder, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close_v2(holder);
    sqlite3_close_v2(db);

    /* an in-memory database cannot be WAL: refused, not silently less durable */
    assert_int_equal(oq_db_open(":memory:", NULL, &db, &err), OQ_EDB);
    assert_null(db);
    assert_non_null(strstr(err.msg, "WAL"));

    o.synchronous = "sometimes";
    assert_int_equal(oq_db_open(f->path, &o, &db, &err), OQ_EINVAL);
    assert_null(db);
    assert_non_null(strstr(err.msg, "sometimes"));
}

static void test_open_errors_name_path(void **state)
{
    (void)state;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    const char *p = "/nonexistent-dir-oq/sub/x.db";
    int rc = oq_db_open(p, NULL, &db, &err);
    assert_true(rc == OQ_EIO || rc == OQ_EDB);
    assert_null(db);
    assert_non_null(strstr(err.msg, p));

    /* read-only open of a missing file must not create it */
    fixture_t *f = *state;
    oq_db_opts_t ro = {.readonly = 1};
    rc = oq_db_open(f->path, &ro, &db, &err);
    assert_true(rc < 0);
    assert_int_not_equal(access(f->path, F_OK), 0);
}

static void test_migrate_fresh_and_rerun(void **state)
{
    fixture_t *f = *state;
    const char *const *sets[] = {oq_migrations_producer, oq_migrations_consumer};
    for (size_t k = 0; k < 2; k++) {
        sqlite3 *db = NULL;
        oq_error_t err = {0};
        assert_int_equal(oq_db_open(f->path, NULL, &db, &err), 0);
        assert_int_equal(oq_db_user_version(db), 0);
        assert_int_equal(oq_db_migrate(db, sets[k], &err), 0);
        int n = set_len(sets[k]);
        assert_int_equal(oq_db_user_version(db), n);
        /* the common outbox and lease tables exist in both databases */
        assert_int_equal(query_int(db, "SELECT count(*) FROM sqlite_schema WHERE name IN "
                                       "('outbox','relay_lease')"),
                         2);
        int64_t objects = query_int(db, "SELECT count(*) FROM sqlite_schema");
        /* re-run: no error, nothing changes */
        assert_int_equal(oq_db_migrate(db, sets[k], &err), 0);
        assert_int_equal(oq_db_user_version(db), n);
        assert_int_equal(query_int(db, "SELECT count(*) FROM sqlite_schema"), objects);
        sqlite3_close_v2(db);
        /* and again on a new connection */
        assert_int_equal(oq_db_open(f->path, NULL, &db, &err), 0);
        assert_int_equal(oq_db_migrate(db, sets[k], &err), 0);
        assert_int_equal(oq_db_user_version(db), n);
        sqlite3_close_v2(db);
        teardown(state);
        setup(state);
        f = *state;
    }
}

/* An effects.db from before the watermark migration: rows marked one by one. The upgrade
 * turns the marks into relay_lease.published_seq (everything below the first unmarked row). */
static void test_migrate_outbox_watermark_upgrade(void **state)
{
    fixture_t *f = *state;
    static const char *const before[] = {"common/0001_outbox.sql", "consumer/0001_init.sql", NULL};
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(f->path, NULL, &db, &err), 0);
    assert_int_equal(oq_db_migrate(db, before, &err), 0);
    assert_int_equal(
        oq_db_exec(db,
                   "INSERT INTO outbox(message_id, topic, key, payload, created_at, "
                   "published_at) VALUES ('m1','t','k','p',1,5), ('m2','t','k','p',1,5),"
                   " ('m3','t','k','p',1,NULL), ('m4','t','k','p',1,6), "
                   "('m5','t','k','p',1,NULL);"
                   "INSERT INTO relay_lease(name, owner, fence, expires_at) "
                   "VALUES ('outbox', 'old', 4, 0)",
                   &err),
        0);
    assert_int_equal(oq_db_migrate(db, oq_migrations_consumer, &err), 0);
    assert_int_equal(oq_db_user_version(db), set_len(oq_migrations_consumer));
    /* m4 was published after a gap: it is sent again (a duplicate the inbox absorbs) */
    assert_int_equal(query_int(db, "SELECT published_seq FROM relay_lease"), 2);
    assert_int_equal(query_int(db, "SELECT fence FROM relay_lease"), 4);
    assert_int_equal(query_int(db, "SELECT group_concat(seq) = '3,4,5' FROM outbox_unpublished"),
                     1);
    assert_int_equal(query_int(db, "SELECT count(*) FROM pragma_table_info('outbox') WHERE "
                                   "name = 'published_at'"),
                     0);
    sqlite3_close_v2(db);
}

static void test_migrate_refuses_newer(void **state)
{
    fixture_t *f = *state;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(f->path, NULL, &db, &err), 0);
    assert_int_equal(oq_db_exec(db, "CREATE TABLE keep(x); PRAGMA user_version=99", &err), 0);
    assert_int_equal(oq_db_migrate(db, oq_migrations_producer, &err), OQ_EVERSION);
    char want[160];
    snprintf(want, sizeof(want),
             "database schema version 99 is newer than this binary (%d); upgrade onceq",
             set_len(oq_migrations_producer));
    assert_string_equal(err.msg, want);
    assert_int_equal(oq_db_user_version(db), 99);
    /* untouched: no outbox created, our table still alone, no transaction left open */
    assert_int_equal(query_int(db, "SELECT count(*) FROM sqlite_schema"), 1);
    assert_int_not_equal(sqlite3_get_autocommit(db), 0);
    sqlite3_close_v2(db);
}

static void test_migrate_failure_applies_nothing(void **state)
{
    fixture_t *f = *state;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(f->path, NULL, &db, &err), 0);
    const char *const good[] = {"CREATE TABLE a(x);", NULL};
    assert_int_equal(oq_db_migrate_sql(db, good, &err), 0);
    assert_int_equal(oq_db_user_version(db), 1);

    const char *const bad[] = {"CREATE TABLE a(x);", "CREATE TABLE b(y); CREATE INDEX bi ON b(y);",
                               "CREATE TABLE c(z); INSERT INTO nosuch VALUES (1);", NULL};
    assert_int_equal(oq_db_migrate_sql(db, bad, &err), OQ_EDB);
    assert_non_null(strstr(err.msg, "nosuch"));
    assert_non_null(strstr(err.msg, "migration 3 of 3"));
    assert_int_equal(oq_db_user_version(db), 1);
    assert_int_equal(query_int(db, "SELECT count(*) FROM sqlite_schema WHERE name IN "
                                   "('b','bi','c')"),
                     0);
    assert_int_not_equal(sqlite3_get_autocommit(db), 0); /* rolled back */

    /* a set naming a file that is not embedded */
    const char *const missing[] = {"common/0001_outbox.sql", "nope/9999.sql", NULL};
    assert_int_equal(oq_db_migrate(db, missing, &err), OQ_EINVAL);
    assert_non_null(strstr(err.msg, "nope/9999.sql"));
    sqlite3_close_v2(db);
}

typedef struct {
    const char *path;
    int rc;
    char msg[256];
} migrator_t;

static void *migrate_thread(void *arg)
{
    migrator_t *m = arg;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    m->rc = oq_db_open(m->path, NULL, &db, &err);
    if (m->rc == 0) m->rc = oq_db_migrate(db, oq_migrations_consumer, &err);
    snprintf(m->msg, sizeof(m->msg), "%s", err.msg);
    sqlite3_close_v2(db);
    return NULL;
}

/* Several connections migrating one fresh file at once: each script runs exactly once (a
 * second run would fail with "table already exists"), and everyone succeeds. */
static void test_migrate_concurrent(void **state)
{
    fixture_t *f = *state;
    enum { N = 4 };
    pthread_t th[N];
    migrator_t m[N];
    for (int i = 0; i < N; i++) {
        m[i].path = f->path;
        m[i].rc = 99;
        assert_int_equal(pthread_create(&th[i], NULL, migrate_thread, &m[i]), 0);
    }
    /* join all before asserting: a failed assertion must not leave threads running */
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        if (m[i].rc != 0) print_error("migrator %d: %s\n", i, m[i].msg);
        assert_int_equal(m[i].rc, 0);
    }
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(f->path, NULL, &db, &err), 0);
    assert_int_equal(oq_db_user_version(db), set_len(oq_migrations_consumer));
    sqlite3_close_v2(db);
}

static void test_sql_file_lookup(void **state)
{
    (void)state;
    const char *s = oq_sql_file("common/0001_outbox.sql");
    assert_non_null(s);
    assert_non_null(strstr(s, "CREATE TABLE outbox"));
    assert_null(oq_sql_file("common/none.sql"));
    assert_null(oq_sql_file(NULL));
    for (const char *const *p = oq_migrations_producer; *p; p++)
        assert_non_null(oq_sql_file(*p));
    for (const char *const *p = oq_migrations_consumer; *p; p++)
        assert_non_null(oq_sql_file(*p));
}

static const char SQL_ONE[] = "SELECT ?1 + 1";
static const char SQL_TWO[] = "SELECT ?1 * 2";

static void test_stmt_cache(void **state)
{
    fixture_t *f = *state;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(f->path, NULL, &db, &err), 0);
    oq_stmt_cache_t *c = oq_stmt_cache_new(db);
    assert_non_null(c);
    sqlite3_stmt *a = oq_stmt_get(c, SQL_ONE, &err);
    assert_non_null(a);
    sqlite3_bind_int(a, 1, 41);
    assert_int_equal(sqlite3_step(a), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(a, 0), 42);
    /* same pointer -> same statement, reset and with bindings cleared (NULL + 1 = NULL) */
    sqlite3_stmt *a2 = oq_stmt_get(c, SQL_ONE, &err);
    assert_ptr_equal(a, a2);
    assert_int_equal(sqlite3_step(a2), SQLITE_ROW);
    assert_int_equal(sqlite3_column_type(a2, 0), SQLITE_NULL);
    sqlite3_stmt *b = oq_stmt_get(c, SQL_TWO, &err);
    assert_non_null(b);
    assert_ptr_not_equal(a, b);
    /* a different buffer with the same text is a different key */
    char copy[sizeof(SQL_ONE)];
    memcpy(copy, SQL_ONE, sizeof(SQL_ONE));
    sqlite3_stmt *a3 = oq_stmt_get(c, copy, &err);
    assert_non_null(a3);
    assert_ptr_not_equal(a, a3);
    /* many distinct keys force the table to grow; earlier entries survive */
    static char sqls[100][32];
    sqlite3_stmt *st[100];
    for (int i = 0; i < 100; i++) {
        snprintf(sqls[i], sizeof(sqls[i]), "SELECT %d", i);
        st[i] = oq_stmt_get(c, sqls[i], &err);
        assert_non_null(st[i]);
    }
    for (int i = 0; i < 100; i++) {
        assert_ptr_equal(oq_stmt_get(c, sqls[i], &err), st[i]);
        assert_int_equal(sqlite3_step(st[i]), SQLITE_ROW);
        assert_int_equal(sqlite3_column_int(st[i], 0), i);
    }
    assert_ptr_equal(oq_stmt_get(c, SQL_ONE, &err), a);
    /* prepare errors are reported */
    assert_null(oq_stmt_get(c, "SELECT FROM WHERE", &err));
    assert_int_equal(err.code, OQ_EDB);
    oq_stmt_cache_destroy(c);
    oq_stmt_cache_destroy(NULL);
    assert_int_equal(sqlite3_close(db), SQLITE_OK); /* every statement finalized */
}

static void test_outbox_append(void **state)
{
    fixture_t *f = *state;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(f->path, NULL, &db, &err), 0);
    assert_int_equal(oq_db_migrate(db, oq_migrations_producer, &err), 0);
    oq_stmt_cache_t *c = oq_stmt_cache_new(db);
#define OQ_T_PAYLOAD "{\"v\":1,\"x\":\"a\\u0000b\"}"
    const char payload[] = OQ_T_PAYLOAD "trailing-not-included";
    oq_outbox_row_t row = {.message_id = "m-1",
                           .topic = "onceq.tool-calls",
                           .key = "c_0123456789abcdef",
                           .payload = payload,
                           .payload_len = sizeof(OQ_T_PAYLOAD) - 1,
                           .created_at = 1700000000123};
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    assert_int_equal(oq_outbox_append(db, c, &row, &err), 0);
    row.message_id = "m-2";
    assert_int_equal(oq_outbox_append(db, NULL, &row, &err), 0); /* uncached path */
    assert_int_equal(oq_db_commit(db, &err), 0);

    assert_int_equal(query_int(db, "SELECT count(*) FROM outbox"), 2);
    assert_int_equal(query_int(db, "SELECT length(payload) FROM outbox WHERE message_id='m-1'"),
                     sizeof(OQ_T_PAYLOAD) - 1);
    assert_int_equal(query_int(db, "SELECT created_at FROM outbox WHERE message_id='m-1'"),
                     1700000000123);
    assert_int_equal(query_int(db, "SELECT count(*) FROM outbox_unpublished WHERE seq=1"), 1);
    char k[64];
    query_text(db, "SELECT key || '|' || topic FROM outbox WHERE seq=2", k, sizeof(k));
    assert_string_equal(k, "c_0123456789abcdef|onceq.tool-calls");
    query_text(db, "SELECT payload FROM outbox WHERE seq=1", k, sizeof(k));
    assert_string_equal(k, OQ_T_PAYLOAD);

    /* duplicate message_id: a (non-retriable) constraint error, and the row is not added */
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    oq_error_clear(&err);
    row.message_id = "m-1";
    assert_int_equal(oq_outbox_append(db, c, &row, &err), OQ_EDB);
    assert_int_equal(err.cause, SQLITE_CONSTRAINT_UNIQUE);
    assert_int_equal(err.retriable, 0);
    oq_db_rollback(db);
    oq_db_rollback(db); /* no transaction: harmless */
    assert_int_equal(query_int(db, "SELECT count(*) FROM outbox"), 2);

    /* missing fields are rejected before touching SQLite */
    row.topic = NULL;
    assert_int_equal(oq_outbox_append(db, c, &row, &err), OQ_EINVAL);
    oq_stmt_cache_destroy(c);
    sqlite3_close_v2(db);
}

static void test_busy_is_retriable(void **state)
{
    fixture_t *f = *state;
    sqlite3 *a = NULL, *b = NULL;
    oq_error_t err = {0};
    oq_db_opts_t o = {.busy_timeout_ms = 1};
    assert_int_equal(oq_db_open(f->path, &o, &a, &err), 0);
    assert_int_equal(oq_db_open(f->path, &o, &b, &err), 0);
    assert_int_equal(oq_db_begin_immediate(a, 100, &err), 0);
    int64_t t0 = (int64_t)time(NULL);
    assert_int_equal(oq_db_begin_immediate(b, 150, &err), OQ_EBUSY);
    assert_int_equal(err.retriable, 1);
    assert_true((int64_t)time(NULL) - t0 < 5);
    assert_int_equal(oq_db_exec(b, "CREATE TABLE t(x)", &err), OQ_EBUSY);
    assert_int_equal(oq_db_commit(a, &err), 0);
    assert_int_equal(oq_db_begin_immediate(b, 100, &err), 0);
    assert_int_equal(oq_db_exec(b, "CREATE TABLE t(x)", &err), 0);
    assert_int_equal(oq_db_commit(b, &err), 0);
    /* a syntax error is OQ_EDB, not retriable */
    assert_int_equal(oq_db_exec(a, "CREATE TABLE", &err), OQ_EDB);
    assert_int_equal(err.retriable, 0);
    sqlite3_close_v2(a);
    sqlite3_close_v2(b);
}

/* --- the writer gate (common/dbgate.c) ------------------------------------------------------ */

typedef struct {
    const char *path;
    int64_t commit_from_us; /* set just before the holder's COMMIT */
    int ready;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} holder_t;

static void *hold_then_commit(void *arg)
{
    holder_t *h = arg;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    if (oq_db_open(h->path, NULL, &db, &err) != 0) return NULL;
    if (oq_db_begin_immediate(db, 1000, &err) == 0) {
        oq_db_exec(db, "INSERT INTO t VALUES(1)", &err);
        pthread_mutex_lock(&h->mu);
        h->ready = 1;
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
        oq_sleep_ms(40, NULL);
        h->commit_from_us = oq_mono_us();
        oq_db_commit(db, &err);
    }
    sqlite3_close_v2(db);
    return NULL;
}

static sqlite3 *open_with_table(const char *path)
{
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    assert_int_equal(oq_db_open(path, NULL, &db, &err), 0);
    assert_int_equal(oq_db_exec(db, "CREATE TABLE IF NOT EXISTS t(x)", &err), 0);
    return db;
}

/* A writer that finds another thread's transaction open waits on the gate and starts right
 * after that COMMIT: SQLite's busy handler never runs. */
static void test_gate_hands_over_between_threads(void **state)
{
    fixture_t *f = *state;
    sqlite3 *db = open_with_table(f->path);
    char gp[160];
    snprintf(gp, sizeof gp, "%s-gate", f->path);
    struct stat st;
    assert_int_equal(stat(gp, &st), 0);
    assert_int_equal(st.st_mode & 077, 0); /* owner-only, like the database */
    for (int round = 0; round < 3; round++) {
        holder_t h = {
            .path = f->path, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, hold_then_commit, &h), 0);
        pthread_mutex_lock(&h.mu);
        while (!h.ready)
            pthread_cond_wait(&h.cv, &h.mu);
        pthread_mutex_unlock(&h.mu);
        uint64_t busy0 = oq_db_busy_calls();
        oq_db_gate_counts_t g0, g1;
        oq_db_gate_counts(&g0);
        oq_error_t err = {0};
        assert_int_equal(oq_db_begin_immediate(db, 5000, &err), 0);
        int64_t got_us = oq_mono_us();
        oq_db_gate_counts(&g1);
        assert_int_equal(oq_db_busy_calls(), busy0);
        assert_true(g1.waited > g0.waited);
        assert_true(h.commit_from_us > 0 && got_us >= h.commit_from_us);
        assert_int_equal(oq_db_exec(db, "INSERT INTO t VALUES(2)", &err), 0);
        assert_int_equal(oq_db_commit(db, &err), 0);
        pthread_join(t, NULL);
    }
    assert_int_equal(query_int(db, "SELECT count(*) FROM t"), 6);
    /* a failed BEGIN and a rollback give the gate back too */
    oq_error_t err = {0};
    assert_int_equal(oq_db_begin_immediate(db, 100, &err), 0);
    oq_db_rollback(db);
    assert_int_equal(oq_db_begin_immediate(db, 100, &err), 0);
    assert_int_equal(oq_db_commit(db, &err), 0);
    sqlite3_close_v2(db);
}

/* A child process holding the write transaction (gate taken), then: commit (the parent gets it
 * without the busy handler), or die by SIGKILL (the parent gets it, the dead owner counted), or
 * stay stopped (the parent's BEGIN gives up at its deadline with OQ_EBUSY, as without a gate). */
/* A writer that commits and at once begins again (a consumer's batch loop) does not take the
 * gate back from a writer waiting for it: the unlock wakes the waiter, and the holder lets it
 * go first. Three spinning threads keep both cores busy, as the JVMs of a Kafka cluster did,
 * so the woken waiter does not run at once; without the hand-over the holder re-took the free
 * mutex 15-40 times in a row during one wait (real Kafka: waits met the 250 ms cap). */
typedef struct {
    const char *path;
    _Atomic int stop, rounds;
} looper_t;

static void *commit_loop(void *arg)
{
    looper_t *l = arg;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    if (oq_db_open(l->path, NULL, &db, &err) != 0) return NULL;
    for (int i = 0; i < 400 && !atomic_load(&l->stop); i++) { /* at most 400 x 5 ms */
        if (oq_db_begin_immediate(db, 5000, &err) != 0) break;
        oq_db_exec(db, "INSERT INTO t VALUES(7)", &err);
        oq_sleep_ms(5, NULL);
        oq_db_commit(db, &err);
        atomic_fetch_add(&l->rounds, 1);
    }
    sqlite3_close_v2(db);
    return NULL;
}

static void *spin(void *arg) /* a busy core, as on a host the JVMs share (at most 3 s) */
{
    looper_t *l = arg;
    int64_t end = oq_mono_us() + 3000000;
    while (!atomic_load(&l->stop) && oq_mono_us() < end) {
    }
    return NULL;
}

static void test_gate_is_fair_to_a_waiter(void **state)
{
    fixture_t *f = *state;
    sqlite3 *db = open_with_table(f->path);
    looper_t l = {.path = f->path};
    pthread_t t, sp[3];
    assert_int_equal(pthread_create(&t, NULL, commit_loop, &l), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&sp[i], NULL, spin, &l), 0);
    while (atomic_load(&l.rounds) < 2)
        oq_sleep_ms(1, NULL);
    oq_db_gate_counts_t g0, g1;
    oq_db_gate_counts(&g0);
    int most = 0;                  /* the holder's commits during one wait, at most */
    for (int k = 0; k < 10; k++) { /* ten waits, each behind a holder that loops */
        oq_error_t err = {0};
        int r0 = atomic_load(&l.rounds);
        int64_t t0 = oq_mono_us();
        assert_int_equal(oq_db_begin_immediate(db, 5000, &err), 0);
        int64_t waited = oq_mono_us() - t0;
        if (atomic_load(&l.rounds) - r0 > most) most = atomic_load(&l.rounds) - r0;
        assert_int_equal(oq_db_exec(db, "INSERT INTO t VALUES(8)", &err), 0);
        assert_int_equal(oq_db_commit(db, &err), 0);
        assert_true(waited < 200000); /* about one of the holder's 5 ms transactions, not the cap */
        oq_sleep_ms(2, NULL);
    }
    oq_db_gate_counts(&g1);
    atomic_store(&l.stop, 1);
    pthread_join(t, NULL);
    for (int i = 0; i < 3; i++)
        pthread_join(sp[i], NULL);
    assert_true(most <= 2); /* the holder went first at most twice, never round after round */
    assert_int_equal(g1.timeouts, g0.timeouts);
    assert_true(g1.handoffs > g0.handoffs);
    assert_true(atomic_load(&l.rounds) > 2); /* and the holder went on too */
    assert_int_equal(query_int(db, "SELECT count(*) FROM t WHERE x = 8"), 10);
    sqlite3_close_v2(db);
}

static pid_t child_holding(const char *path, int mode, int *rfd)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        sqlite3 *db = NULL;
        oq_error_t err = {0};
        if (oq_db_open(path, NULL, &db, &err) != 0 || oq_db_begin_immediate(db, 2000, &err) != 0)
            _exit(2);
        oq_db_exec(db, "INSERT INTO t VALUES(3)", &err);
        if (write(p[1], "h", 1) != 1) _exit(3);
        if (mode == 0) {
            oq_sleep_ms(40, NULL);
            _exit(oq_db_commit(db, &err) == 0 ? 0 : 4);
        }
        for (;;)
            pause();
    }
    close(p[1]);
    char c;
    assert_int_equal(read(p[0], &c, 1), 1);
    *rfd = p[0];
    return pid;
}

static void test_gate_across_processes(void **state)
{
    fixture_t *f = *state;
    sqlite3 *db = open_with_table(f->path);
    oq_error_t err = {0};
    int fd, st;

    /* 1. the holder commits: handed over, no busy wait */
    pid_t pid = child_holding(f->path, 0, &fd);
    uint64_t busy0 = oq_db_busy_calls();
    assert_int_equal(oq_db_begin_immediate(db, 5000, &err), 0);
    assert_int_equal(oq_db_busy_calls(), busy0);
    assert_int_equal(query_int(db, "SELECT count(*) FROM t"), 1); /* the child's row */
    assert_int_equal(oq_db_commit(db, &err), 0);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(fd);

    /* 2. the holder is killed: its transaction is gone, the gate is taken again */
    oq_db_gate_counts_t g0, g1;
    oq_db_gate_counts(&g0);
    pid = child_holding(f->path, 1, &fd);
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    int64_t t0 = oq_mono_us();
    assert_int_equal(oq_db_begin_immediate(db, 5000, &err), 0);
    assert_true(oq_mono_us() - t0 < 2000000);
    oq_db_gate_counts(&g1);
    assert_int_equal(g1.owner_dead, g0.owner_dead + 1);
    assert_int_equal(query_int(db, "SELECT count(*) FROM t"), 1); /* its row rolled back */
    assert_int_equal(oq_db_commit(db, &err), 0);
    close(fd);

    /* 2b. the holder is stopped while it waits for a writer outside the gate, so it holds the
     * gate but not SQLite's lock: once that writer is gone, the next one waits for the gate at
     * most 250 ms and then takes SQLite's lock (not the whole 5 s deadline) */
    sqlite3 *raw = NULL;
    assert_int_equal(sqlite3_open(f->path, &raw), SQLITE_OK);
    assert_int_equal(sqlite3_exec(raw, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    int p2[2];
    assert_int_equal(pipe(p2), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p2[0]);
        sqlite3 *c = NULL;
        oq_error_t e2 = {0};
        if (oq_db_open(f->path, NULL, &c, &e2) != 0) _exit(2);
        if (write(p2[1], "o", 1) != 1) _exit(3);
        oq_db_begin_immediate(c, 30000, &e2); /* takes the gate, waits for raw's lock */
        for (;;)
            pause();
    }
    close(p2[1]);
    char c2;
    assert_int_equal(read(p2[0], &c2, 1), 1);
    close(p2[0]);
    oq_sleep_ms(150, NULL); /* it took the gate and sleeps in the busy handler */
    kill(pid, SIGSTOP);
    sqlite3_exec(raw, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(raw);
    t0 = oq_mono_us();
    int rc2 = oq_db_begin_immediate(db, 5000, &err);
    int64_t took2 = oq_mono_us() - t0;
    if (rc2 == 0) oq_db_rollback(db);
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(rc2, 0);
    assert_true(took2 < 1500000);

    /* 3. the holder is stopped: the wait ends at the caller's deadline (the gate's wait, then
     * one try with a 1 ms busy timeout), OQ_EBUSY, retriable */
    sqlite3 *quick = NULL;
    oq_db_opts_t q = {.busy_timeout_ms = 1};
    assert_int_equal(oq_db_open(f->path, &q, &quick, &err), 0);
    pid = child_holding(f->path, 1, &fd);
    kill(pid, SIGSTOP);
    oq_db_gate_counts(&g0);
    t0 = oq_mono_us();
    int rc = oq_db_begin_immediate(quick, 200, &err);
    int64_t took = oq_mono_us() - t0;
    oq_db_gate_counts(&g1);
    kill(pid, SIGKILL); /* before any assertion: a failed one must not leave it stopped */
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_int_equal(rc, OQ_EBUSY);
    assert_int_equal(err.retriable, 1);
    assert_true(took >= 150000 && took < 3000000);
    assert_int_equal(g1.timeouts, g0.timeouts + 1);
    sqlite3_close_v2(quick);
    assert_int_equal(oq_db_begin_immediate(db, 5000, &err), 0);
    assert_int_equal(oq_db_commit(db, &err), 0);
    close(fd);
    sqlite3_close_v2(db);
}

typedef struct {
    const char *path;
    int rc;
} waiter_arg_t;

static void *begin_and_commit(void *arg)
{
    waiter_arg_t *w = arg;
    sqlite3 *db = NULL;
    oq_error_t err = {0};
    w->rc = -1;
    if (oq_db_open(w->path, NULL, &db, &err) != 0) return NULL;
    w->rc = oq_db_begin_immediate(db, 5000, &err);
    if (w->rc == 0) w->rc = oq_db_commit(db, &err);
    sqlite3_close_v2(db);
    return NULL;
}

/* A writer outside the gate (the sqlite3 shell) holds the lock; a gated writer waits for it
 * while holding the gate. A third writer's deadline (300 ms) must still hold: its wait for the
 * gate (250 ms at most) and the busy handler's sleeps after it share that deadline (the
 * connection's own busy timeout is 5 s). The readiness checks rely on it (test_readyz). */
static void test_gate_keeps_the_deadline(void **state)
{
    fixture_t *f = *state;
    sqlite3 *db = open_with_table(f->path), *raw = NULL;
    assert_int_equal(sqlite3_open(f->path, &raw), SQLITE_OK);
    assert_int_equal(sqlite3_exec(raw, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    waiter_arg_t w = {.path = f->path};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, begin_and_commit, &w), 0);
    oq_sleep_ms(100, NULL); /* it holds the gate and sleeps in the busy handler */
    oq_error_t err = {0};
    int64_t t0 = oq_mono_us();
    int rc = oq_db_begin_immediate(db, 300, &err);
    int64_t took = oq_mono_us() - t0;
    sqlite3_exec(raw, "ROLLBACK", NULL, NULL, NULL);
    pthread_join(t, NULL);
    assert_int_equal(rc, OQ_EBUSY);
    assert_true(took >= 250000 && took < 1500000);
    assert_int_equal(w.rc, 0); /* the gated writer got the lock once the shell let go */
    assert_int_equal(oq_db_begin_immediate(db, 1000, &err), 0);
    assert_int_equal(oq_db_commit(db, &err), 0);
    sqlite3_close(raw);
    sqlite3_close_v2(db);
}

/* No gate where none is wanted (a read-only connection) or none can be made (its path is taken
 * by a folder): writes work as before, through SQLite's own lock. */
static void test_gate_absent_is_harmless(void **state)
{
    fixture_t *f = *state;
    char rp[160], gp[176];
    snprintf(rp, sizeof rp, "%s/r.db", f->dir);
    sqlite3 *raw = NULL;
    assert_int_equal(sqlite3_open(rp, &raw), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(raw, "PRAGMA journal_mode=WAL; CREATE TABLE t(x)", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(raw);
    sqlite3 *ro = NULL;
    oq_error_t err = {0};
    oq_db_opts_t o = {.readonly = 1};
    assert_int_equal(oq_db_open(rp, &o, &ro, &err), 0);
    snprintf(gp, sizeof gp, "%s-gate", rp);
    struct stat st;
    assert_int_equal(stat(gp, &st), -1); /* a reader makes no gate */
    sqlite3_close_v2(ro);

    assert_int_equal(mkdir(gp, 0700), 0); /* the gate's path is taken */
    sqlite3 *a = NULL, *b = NULL;
    oq_db_opts_t q = {.busy_timeout_ms = 1};
    assert_int_equal(oq_db_open(rp, &q, &a, &err), 0);
    assert_int_equal(oq_db_open(rp, &q, &b, &err), 0);
    assert_int_equal(oq_db_begin_immediate(a, 100, &err), 0);
    assert_int_equal(oq_db_begin_immediate(b, 50, &err), OQ_EBUSY);
    assert_int_equal(oq_db_exec(a, "INSERT INTO t VALUES(1)", &err), 0);
    assert_int_equal(oq_db_commit(a, &err), 0);
    assert_int_equal(oq_db_begin_immediate(b, 100, &err), 0);
    assert_int_equal(query_int(b, "SELECT count(*) FROM t"), 1);
    assert_int_equal(oq_db_commit(b, &err), 0);
    sqlite3_close_v2(a);
    sqlite3_close_v2(b);
    rmdir(gp);
    const char *suffix[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < 3; i++) {
        char p[176];
        snprintf(p, sizeof p, "%s%s", rp, suffix[i]);
        unlink(p);
    }
}

int main(void)
{
    setenv("ONCEQ_DB_GATE", "1", 1); /* the writer gate is an option; these tests turn it on */
    oq_log_init(OQ_LOG_WARN, OQ_LOG_FMT_LOGFMT, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors_name_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_fresh_and_rerun, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_outbox_watermark_upgrade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_refuses_newer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_failure_applies_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_concurrent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_file_lookup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stmt_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_outbox_append, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_is_retriable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gate_hands_over_between_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gate_is_fair_to_a_waiter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gate_across_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gate_keeps_the_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gate_absent_is_harmless, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
