#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# producer/examples/in_pgtx.c on PostgreSQL: an order and its charge call commit together in the
# service's own transaction (exactly one call and one outbox row), a rolled-back order leaves no
# call; run twice on one database (the schema is applied once, the second run adds its own).
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
URL=$(oq_pg_fresh_db onceq_it_in_tx_c)
EX=$(oq_tool example_in_pgtx)
"$EX" "$URL" >"$T/run1.out" 2>&1 || { cat "$T/run1.out"; oq_fail "first run"; }
sleep 0.01
"$EX" "$URL" >"$T/run2.out" 2>&1 || { cat "$T/run2.out"; oq_fail "second run"; }
cat "$T/run1.out" "$T/run2.out"
n() { psql -XAtq "$URL" -c "$1"; }
[[ "$(n 'SELECT count(*) FROM shop_orders')" == 2 ]] || oq_fail "orders"
[[ "$(n 'SELECT count(*) FROM onceq.calls')" == 2 ]] || oq_fail "calls: $(n 'SELECT count(*) FROM onceq.calls')"
[[ "$(n 'SELECT count(*) FROM onceq.outbox')" == 2 ]] || oq_fail "outbox"
[[ "$(n "SELECT count(*) FROM onceq.calls WHERE idem_key LIKE '%-x'")" == 0 ]] || oq_fail "rolled-back call kept"
oq_pass "C in-transaction submit on PostgreSQL: commit one call, rollback none"
