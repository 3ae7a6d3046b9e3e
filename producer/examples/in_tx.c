/* SPDX-License-Identifier: Apache-2.0 */
/*
 * example_in_tx: the transactional outbox from a service's point of view.
 *
 * A service owns its SQLite connection and its business tables (here `orders`). It places an
 * order and asks onceq to charge the customer in ONE transaction: the order row, the call row
 * and the outbox row commit together or not at all. If the service crashes or rolls back
 * after inserting the order, no charge is ever requested; if it commits, the relay will
 * publish the charge even if the service dies the next instant.
 *
 *   example_in_tx [-v] [db-path]     (default: ./shop.db; -v: onceq's log lines on stdout)
 *
 * Built against an installed libonceq with pkg-config alone:
 *   cc in_tx.c $(pkg-config --cflags --libs libonceq)
 * Then `onceq relay --db shop.db ...` publishes the outbox and `onceq producer --db shop.db`
 * (optional) serves the call's status over HTTP and applies the results.
 *
 * Every value reaches SQL as a bound parameter (sqlite3_bind_*), never formatted into the text.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <onceq/oq_client.h>
#include <onceq/oq_logger.h>

/* Runs one statement with up to two bound text values. @returns an SQLite result code. */
static int exec_bound(sqlite3 *db, const char *sql, const char *a, const char *b)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK && a) rc = sqlite3_bind_text(st, 1, a, -1, SQLITE_TRANSIENT);
    if (rc == SQLITE_OK && b) rc = sqlite3_bind_text(st, 2, b, -1, SQLITE_TRANSIENT);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

static void rollback(sqlite3 *db)
{
    if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

static int place_order(sqlite3 *db, const char *order_key, int amount, int fail_after_submit)
{
    oq_error_t err = {0};
    oq_call_t call = {0};
    oq_submit_outcome_t outcome;
    json_t *args = json_pack("{s:i,s:s}", "amount", amount, "currency", "EUR");
    int rc = 0;
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        snprintf(err.msg, sizeof err.msg, "BEGIN: %s", sqlite3_errmsg(db));
        rc = -1;
        goto out;
    }

    /* 1. the business write: the values are bound, never formatted into the SQL text */
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "INSERT INTO orders(order_key, amount) VALUES(?1, ?2)", -1, &st,
                           NULL) != SQLITE_OK ||
        sqlite3_bind_text(st, 1, order_key, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_bind_int(st, 2, amount) != SQLITE_OK || sqlite3_step(st) != SQLITE_DONE) {
        snprintf(err.msg, sizeof err.msg, "insert order: %s", sqlite3_errmsg(db));
        rc = -1;
    }
    sqlite3_finalize(st);
    if (rc) goto out;

    /* 2. the intent, in the same transaction: the order key is the idempotency key, so a
     *    retried request of this order can never charge twice */
    oq_submit_req_t req = {.tenant = "shop", .idem_key = order_key, .tool = "charge", .args = args};
    rc = oq_producer_submit_in_tx(db, &req, 0, &call, &outcome, &err);
    if (rc) goto out;

    if (fail_after_submit) { /* e.g. stock check failed: nothing of this order may remain */
        printf("order %s: business rule failed -> ROLLBACK (call %s vanishes with it)\n", order_key,
               call.call_id);
        rollback(db);
        goto out;
    }
    /* 3. one commit makes the order and the charge request durable together */
    if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        snprintf(err.msg, sizeof err.msg, "COMMIT: %s", sqlite3_errmsg(db));
        rc = -1;
        goto out;
    }
    printf("order %s: committed with call %s (%s, status %s)\n", order_key, call.call_id,
           oq_submit_outcome_name(outcome), call.state);

    /* 4. a lookup by key, as a status page would do it */
    oq_call_t again = {0};
    if ((rc = oq_store_get_by_key(db, "shop", order_key, &again, &err)) == 0) {
        printf("order %s: lookup by key -> call %s, status %s\n", order_key, again.call_id,
               again.state);
        oq_call_clear(&again);
    }
out:
    if (rc) {
        fprintf(stderr, "order %s: %s\n", order_key, err.msg);
        rollback(db);
    }
    oq_call_clear(&call);
    json_decref(args);
    return rc;
}

static long long count(sqlite3 *db, const char *sql, const char *param)
{
    sqlite3_stmt *st = NULL;
    long long n = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
        (!param || sqlite3_bind_text(st, 1, param, -1, SQLITE_TRANSIENT) == SQLITE_OK) &&
        sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
}

/* onceq's log lines, when asked for with -v (libonceq is silent by default). */
static void print_log(oq_log_level_t level, const char *component, const char *line, size_t len,
                      void *opaque)
{
    (void)level;
    (void)component;
    (void)opaque;
    printf("onceq: %.*s\n", (int)len, line);
}

int main(int argc, char **argv)
{
    int argi = 1;
    if (argi < argc && strcmp(argv[argi], "-v") == 0) {
        oq_log_set_callback(print_log, NULL);
        oq_log_set_level(OQ_LOG_INFO);
        argi++;
    }
    const char *path = argi < argc ? argv[argi] : "shop.db";
    oq_error_t err = {0};
    sqlite3 *db = NULL;
    /* The service's own connection: WAL (the relay reads while the service writes),
     * synchronous=FULL (a committed call survives a power loss), a busy timeout. */
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(db, 5000) != SQLITE_OK ||
        sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL", NULL, NULL, NULL) !=
            SQLITE_OK) {
        fprintf(stderr, "%s: %s\n", path, db ? sqlite3_errmsg(db) : "out of memory");
        sqlite3_close_v2(db);
        return 1;
    }
    if (oq_producer_migrate(db, &err) != 0 ||
        exec_bound(db, "CREATE TABLE IF NOT EXISTS orders(order_key TEXT PRIMARY KEY, amount INT)",
                   NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "%s: %s\n", path, err.code ? err.msg : sqlite3_errmsg(db));
        sqlite3_close_v2(db);
        return 1;
    }
    char key_ok[64], key_bad[64];
    struct timespec now;
    timespec_get(&now, TIME_UTC); /* unique order keys run after run */
    long long ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    snprintf(key_ok, sizeof key_ok, "order-%lld", ms);
    snprintf(key_bad, sizeof key_bad, "order-%lld-x", ms);
    int rc = place_order(db, key_ok, 1999, 0);
    rc |= place_order(db, key_bad, 500, 1);
    long long leaked = count(db, "SELECT count(*) FROM calls WHERE idem_key = ?1", key_bad);
    printf("orders=%lld calls=%lld outbox=%lld; rows of the rolled-back order: %lld\n",
           count(db, "SELECT count(*) FROM orders", NULL),
           count(db, "SELECT count(*) FROM calls", NULL),
           count(db, "SELECT count(*) FROM outbox", NULL), leaked);
    sqlite3_close_v2(db);
    return rc || leaked != 0 ? 1 : 0;
}
