#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The transactional outbox from Python: an order and its charge call commit together inside the
service's own PostgreSQL transaction, through the SQL function onceq.submit (schema `onceq`,
applied once with `onceq migrate --db URL`). Needs only psycopg2 (Debian python3-psycopg2).

    submit_in_pg_tx.py 'postgresql://user@host/db?passfile=...'

Shows: commit leaves exactly one call, rollback none; the same order again is a replay of the
same call; the same key with other arguments raises an integrity error (SQLSTATE 23505,
message `idempotency_conflict: ...`) and the transaction cannot commit. Exit 0 when all hold.
"""
import sys
import time

import psycopg2
import psycopg2.errors


def place_order(conn, order_key, amount, fail=False):
    """One transaction: the business row and the intent. Returns (call_id, outcome, status)."""
    with conn:  # commits on success, rolls back on an exception
        with conn.cursor() as cur:
            cur.execute("INSERT INTO py_orders(order_key, amount) VALUES (%s, %s) "
                        "ON CONFLICT DO NOTHING", (order_key, amount))
            cur.execute("SELECT * FROM onceq.submit(%s, %s, %s, %s::jsonb)",
                        ("shop", order_key, "charge",
                         '{"amount": %d, "currency": "EUR"}' % amount))
            row = cur.fetchone()
            if fail:
                raise RuntimeError("out of stock")  # the whole transaction rolls back
            return row


def count(conn, sql, *args):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchone()[0]


def main():
    conn = psycopg2.connect(sys.argv[1])
    with conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS py_orders(order_key text PRIMARY KEY, amount int)")
    key = "py-order-%d" % int(time.time() * 1000)

    call_id, outcome, status = place_order(conn, key, 1999)
    print("order %s: committed, call %s (%s, %s)" % (key, call_id, outcome, status))
    assert outcome == "new" and status == "pending"

    again = place_order(conn, key, 1999)  # a retried request: the same call
    print("order %s again: call %s (%s)" % (key, again[0], again[1]))
    assert again[0] == call_id and again[1] == "replay"

    try:
        place_order(conn, key + "-x", 500, fail=True)
    except RuntimeError as e:
        print("order %s-x: %s -> rolled back" % (key, e))

    try:
        place_order(conn, key, 1)  # the same key, other arguments
        raise AssertionError("a conflict was accepted")
    except psycopg2.errors.UniqueViolation as e:  # an IntegrityError
        print("order %s with other args: %s" % (key, str(e).splitlines()[0]))
        assert str(e).startswith("idempotency_conflict")

    calls = count(conn, "SELECT count(*) FROM onceq.calls WHERE idem_key = %s", key)
    outbox = count(conn, "SELECT count(*) FROM onceq.outbox WHERE key = %s", call_id)
    leaked = count(conn, "SELECT count(*) FROM onceq.calls WHERE idem_key = %s", key + "-x")
    orders = count(conn, "SELECT count(*) FROM py_orders WHERE order_key LIKE %s", key + "%")
    print("calls=%d outbox=%d rolled-back calls=%d orders=%d" % (calls, outbox, leaked, orders))
    assert (calls, outbox, leaked, orders) == (1, 1, 0, 1)
    conn.close()


if __name__ == "__main__":
    main()
