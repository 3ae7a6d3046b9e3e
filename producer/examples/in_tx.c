/*
 * example_in_tx: the transactional outbox from a service's point of view.
 *
 * A service owns its SQLite connection and its business tables (here `orders`). It places an
 * order and asks onceq to charge the customer in ONE transaction: the order row, the call row
 * and the outbox row commit together or not at all. If the service crashes or rolls back
 * after inserting the order, no charge is ever requested; if it commits, the relay will
 * publish the charge even if the service dies the next instant.
 *
 *   example_in_tx [db-path]     (default: ./shop.db)
 *
 * Then `onceq relay --db shop.db ...` publishes the outbox and `onceq producer --db shop.db`
 * (optional) serves the call's status over HTTP.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "oq_db.h"
#include "oq_producer.h"

static int place_order(sqlite3 *db, const char *order_key, int amount, int fail_after_submit)
{
    oq_error_t err = {0};
    oq_call_t call = {0};
    oq_submit_outcome_t outcome;
    json_t *args = json_pack("{s:i,s:s}", "amount", amount, "currency", "EUR");
    int rc = oq_db_begin_immediate(db, 5000, &err);
    if (rc) goto out;

    /* 1. the business write */
    char sql[160];
    snprintf(sql, sizeof sql, "INSERT INTO orders(order_key, amount) VALUES('%s', %d)", order_key,
             amount);
    if ((rc = oq_db_exec(db, sql, &err))) goto out;

    /* 2. the intent, in the same transaction: the order key is the idempotency key, so a
     *    retried request of this order can never charge twice */
    oq_submit_req_t req = {.tenant = "shop", .idem_key = order_key, .tool = "charge", .args = args};
    rc = oq_producer_submit_in_tx(db, &req, 0, &call, &outcome, &err);
    if (rc) goto out;

    if (fail_after_submit) { /* e.g. stock check failed: nothing of this order may remain */
        printf("order %s: business rule failed -> ROLLBACK (call %s vanishes with it)\n", order_key,
               call.call_id);
        oq_db_rollback(db);
        goto out;
    }
    /* 3. one commit makes the order and the charge request durable together */
    if ((rc = oq_db_commit(db, &err))) goto out;
    printf("order %s: committed with call %s (%s, status %s)\n", order_key, call.call_id,
           oq_submit_outcome_name(outcome), call.state);
out:
    if (rc) {
        fprintf(stderr, "order %s: %s\n", order_key, err.msg);
        oq_db_rollback(db);
    }
    oq_call_clear(&call);
    json_decref(args);
    return rc;
}

static long long count(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    long long n = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return n;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "shop.db";
    oq_error_t err = {0};
    sqlite3 *db = NULL;
    if (oq_db_open(path, NULL, &db, &err) != 0 || oq_producer_migrate(db, &err) != 0 ||
        oq_db_exec(db, "CREATE TABLE IF NOT EXISTS orders(order_key TEXT PRIMARY KEY, amount INT)",
                   &err) != 0) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
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
    char sql[200];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM calls WHERE idem_key='%s'", key_bad);
    long long leaked = count(db, sql);
    printf("orders=%lld calls=%lld outbox=%lld; rows of the rolled-back order: %lld\n",
           count(db, "SELECT count(*) FROM orders"), count(db, "SELECT count(*) FROM calls"),
           count(db, "SELECT count(*) FROM outbox"), leaked);
    sqlite3_close_v2(db);
    return rc || leaked != 0 ? 1 : 0;
}
