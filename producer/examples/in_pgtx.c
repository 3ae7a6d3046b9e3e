/* SPDX-License-Identifier: Apache-2.0 */
/*
 * example_in_pgtx: the transactional outbox inside a service's own PostgreSQL transaction.
 *
 * The service owns its libpq connection and its business tables (here `shop_orders`). It places
 * an order and asks onceq to charge the customer in ONE transaction: the order row, the call
 * row and the outbox row (schema `onceq`, beside the service's tables) commit together or not at
 * all. The order key is the idempotency key: a retried order is a replay, never a second
 * charge.
 *
 *   example_in_pgtx 'postgresql://user@host/db?passfile=...'   (or a libpq keyword string)
 *
 * Exit 0 when the committed order left exactly one call and the rolled-back one none.
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <onceq/oq_client.h>

static int exec(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok) fprintf(stderr, "%s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

static int place_order(PGconn *c, const char *order_key, int amount, int fail_after_submit)
{
    oq_error_t err = {0};
    oq_call_t call = {0};
    oq_submit_outcome_t outcome;
    json_t *args = json_pack("{s:i,s:s}", "amount", amount, "currency", "EUR");
    int rc = exec(c, "BEGIN");
    if (rc) goto out;

    /* 1. the business write */
    char amt[16];
    snprintf(amt, sizeof amt, "%d", amount);
    const char *pa[] = {order_key, amt};
    PGresult *r = PQexecParams(c, "INSERT INTO shop_orders(order_key, amount) VALUES($1, $2)", 2,
                               NULL, pa, NULL, NULL, 0);
    rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;
    if (rc) fprintf(stderr, "insert order: %s", PQerrorMessage(c));
    PQclear(r);
    if (rc) goto out;

    /* 2. the intent, in the same transaction, keyed by the order */
    oq_submit_req_t req = {.tenant = "shop", .idem_key = order_key, .tool = "charge", .args = args};
    if ((rc = oq_producer_submit_in_pgtx(c, &req, 0, &call, &outcome, &err))) {
        fprintf(stderr, "order %s: %s\n", order_key, err.msg);
        goto out;
    }
    if (fail_after_submit) { /* e.g. out of stock: nothing of this order may remain */
        printf("order %s: business rule failed -> ROLLBACK (call %s vanishes with it)\n", order_key,
               call.call_id);
        exec(c, "ROLLBACK");
        goto out;
    }
    /* 3. one commit makes the order and the charge request durable together */
    if ((rc = exec(c, "COMMIT"))) goto out;
    printf("order %s: committed with call %s (%s, status %s)\n", order_key, call.call_id,
           oq_submit_outcome_name(outcome), call.state);
out:
    if (rc) exec(c, "ROLLBACK");
    oq_call_clear(&call);
    json_decref(args);
    return rc;
}

static long long count(PGconn *c, const char *sql, const char *key)
{
    const char *p[] = {key};
    PGresult *r = PQexecParams(c, sql, key ? 1 : 0, NULL, key ? p : NULL, NULL, NULL, 0);
    long long n = PQresultStatus(r) == PGRES_TUPLES_OK ? atoll(PQgetvalue(r, 0, 0)) : -1;
    PQclear(r);
    return n;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: example_in_pgtx CONNINFO\n");
        return 2;
    }
    oq_error_t err = {0};
    PGconn *c = PQconnectdb(argv[1]);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "connect: %s", PQerrorMessage(c));
        PQfinish(c);
        return 1;
    }
    if (oq_producer_migrate_pg(c, &err) != 0) {
        fprintf(stderr, "migrate: %s\n", err.msg);
        PQfinish(c);
        return 1;
    }
    if (exec(c, "CREATE TABLE IF NOT EXISTS shop_orders(order_key text PRIMARY KEY, amount int)")) {
        PQfinish(c);
        return 1;
    }
    char key_ok[64], key_bad[64];
    struct timespec now;
    timespec_get(&now, TIME_UTC); /* unique order keys run after run */
    long long ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    snprintf(key_ok, sizeof key_ok, "order-%lld", ms);
    snprintf(key_bad, sizeof key_bad, "order-%lld-x", ms);
    int rc = place_order(c, key_ok, 1999, 0);
    rc |= place_order(c, key_bad, 500, 1);
    long long ok_calls = count(c, "SELECT count(*) FROM onceq.calls WHERE idem_key=$1", key_ok);
    long long ok_outbox =
        count(c,
              "SELECT count(*) FROM onceq.outbox o JOIN onceq.calls k ON k.call_id=o.key "
              "WHERE k.idem_key=$1",
              key_ok);
    long long leaked = count(c, "SELECT count(*) FROM onceq.calls WHERE idem_key=$1", key_bad);
    printf("committed order: calls=%lld outbox=%lld; rolled-back order: calls=%lld\n", ok_calls,
           ok_outbox, leaked);
    PQfinish(c);
    return rc || ok_calls != 1 || ok_outbox != 1 || leaked != 0 ? 1 : 0;
}
