/* SPDX-License-Identifier: Apache-2.0 */
/*
 * example_task_in_tx: a task (a run of steps) submitted in a service's own transaction.
 *
 * The service places an order and, in ONE transaction on its own SQLite connection, asks onceq
 * for a two-step task under the order's key: charge the card, then email the customer a
 * receipt that cites the charge's id ({steps.charge.result.charge_id}, resolved from the
 * charge's stored result when the email step is written). The order row, the task, its steps
 * and the first step's call with its outbox row commit together or not at all. It then reads
 * the task back by its key, and submits it once more (a replay: nothing written).
 *
 *   example_task_in_tx [db-path] [order-key]   (default: ./shop.db, order-<unix ms>)
 *
 * The steps run once `onceq relay --db shop.db` publishes the outbox and `onceq producer --db
 * shop.db` applies the results (it writes each next step as the previous result arrives);
 * `onceq tasks show --db shop.db --key ORDER --tenant shop` or GET
 * /v1/tasks/by-key/ORDER?tenant=shop then shows it. Built against libonceq alone:
 *   cc task_in_tx.c $(pkg-config --cflags --libs libonceq)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <onceq/oq_client.h>

static void rollback(sqlite3 *db)
{
    if (!sqlite3_get_autocommit(db)) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

/* The order row and the task, in one transaction. @returns 0 or -1 (rolled back). */
static int place_order(sqlite3 *db, const char *order_key, const json_t *body)
{
    oq_error_t err = {0};
    json_t *task = NULL;
    const char *code = NULL;
    int replayed = 0, rc = -1;
    sqlite3_stmt *st = NULL;
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "BEGIN: %s\n", sqlite3_errmsg(db));
        return -1;
    }
    /* 1. the business row (values bound, never formatted into the SQL text) */
    if (sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO orders(order_key, amount) VALUES(?1, 1999)",
                           -1, &st, NULL) != SQLITE_OK ||
        sqlite3_bind_text(st, 1, order_key, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_DONE) {
        fprintf(stderr, "insert order: %s\n", sqlite3_errmsg(db));
        goto out;
    }
    /* 2. the task under the order's key, in the same transaction */
    if (oq_producer_task_submit_in_tx(db, "shop", order_key, body, 0, &task, &replayed, &code,
                                      &err) != 0) {
        fprintf(stderr, "task: %s (%s)\n", err.msg, code ? code : "database error");
        goto out;
    }
    /* 3. one commit: the order and the task's first call become durable together */
    if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "COMMIT: %s\n", sqlite3_errmsg(db));
        goto out;
    }
    printf("order %s: task %s %s (status %s, first call %s)\n", order_key,
           json_string_value(json_object_get(task, "task_id")), replayed ? "replayed" : "new",
           json_string_value(json_object_get(task, "status")),
           json_string_value(
               json_object_get(json_array_get(json_object_get(task, "steps"), 0), "call_id")));
    rc = 0;
out:
    sqlite3_finalize(st);
    if (rc) rollback(db);
    json_decref(task);
    return rc;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "shop.db";
    char key[64];
    if (argc > 2) {
        snprintf(key, sizeof key, "%s", argv[2]);
    } else {
        struct timespec now;
        timespec_get(&now, TIME_UTC);
        snprintf(key, sizeof key, "order-%lld",
                 (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000);
    }
    oq_error_t err = {0};
    sqlite3 *db = NULL;
    /* the service's own connection: WAL, synchronous=FULL, a busy timeout */
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(db, 5000) != SQLITE_OK ||
        sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL", NULL, NULL, NULL) !=
            SQLITE_OK) {
        fprintf(stderr, "%s: %s\n", path, db ? sqlite3_errmsg(db) : "out of memory");
        sqlite3_close_v2(db);
        return 1;
    }
    if (oq_producer_migrate(db, &err) != 0 ||
        sqlite3_exec(db,
                     "CREATE TABLE IF NOT EXISTS orders(order_key TEXT PRIMARY KEY, amount INT)",
                     NULL, NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "%s: %s\n", path, err.code ? err.msg : sqlite3_errmsg(db));
        sqlite3_close_v2(db);
        return 1;
    }
    json_error_t jerr;
    json_t *body = json_loads(
        "{\"steps\": ["
        " {\"name\": \"charge\", \"tool\": \"charge\", \"args\": {\"amount\": 1999}},"
        " {\"name\": \"receipt\", \"tool\": \"send_email\", \"irreversible\": true,"
        "  \"args\": {\"to\": \"ann@example.com\","
        "             \"subject\": \"receipt for charge {steps.charge.result.charge_id}\"}}]}",
        0, &jerr);
    int rc = body ? place_order(db, key, body) : -1;
    if (!rc) rc = place_order(db, key, body); /* the same request again: a replay */
    json_t *t = NULL;
    if (!rc) { /* the task as a status page reads it, by its key */
        if ((rc = oq_store_task_get(db, NULL, "shop", key, &t, &err)) != 0) {
            fprintf(stderr, "lookup: %s\n", err.msg);
        } else {
            char *s = json_dumps(t, JSON_COMPACT);
            printf("lookup by key: %s\n", s ? s : "?");
            free(s);
        }
    }
    json_decref(t);
    json_decref(body);
    sqlite3_close_v2(db);
    return rc ? 1 : 0;
}
