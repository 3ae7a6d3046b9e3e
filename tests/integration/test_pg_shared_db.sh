#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole pipeline in ONE PostgreSQL database: producer, relay and two consumers all with
# --db on it (schema onceq: the producer's calls/audit/result_inbox beside the consumers'
# consumer_* tables, one shared outbox). Calls and result events go through the same outbox,
# published by whichever of the relays (`onceq relay` and the consumers' result relays) holds
# the one lease 'outbox'. At the end, read in SQL: every call terminal, one effect per call and
# only for succeeded calls of effect tools, no outbox row left undelivered, one lease row, and
# the two stages' audits apart (the producer's rows in onceq.audit, the consumers' in
# onceq.consumer_audit).
# ctest-cost: 40
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
oq_require_pg
oq_tmpdir
N=300
URL=$(oq_pg_fresh_db onceq_it_pg_shared)
q() { psql -XAtq "$URL" -c "$1"; }
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "migrate"
PDB=$URL
CDB=$URL
PORT=$(oq_free_port)
export PDB CDB PORT
oq_start_broker
pl_spawn_producer
pl_spawn_relay
pl_spawn_consumer 1
pl_spawn_consumer 2
pl_wait_healthy 30

"$(oq_tool oq_e2e_load)" --port "$PORT" --calls "$N" --rate 100 --conns 4 --prefix shr \
    --accepted "$T/accepted" >"$T/load.out" 2>&1 || oq_fail "load: $(cat "$T/load.out")"
settled() { [[ "$(q "SELECT count(*) FILTER (WHERE state IN ('succeeded', 'failed')) FROM onceq.calls")" == "$N" ]]; }
oq_wait_for 120 settled || oq_fail "calls: $(q "SELECT state, count(*) FROM onceq.calls GROUP BY state")"

[[ "$(q 'SELECT count(*) FROM onceq.calls')" == "$N" ]] || oq_fail "calls stored"
[[ "$(q 'SELECT count(*) = count(DISTINCT call_id) FROM onceq.consumer_effects')" == t ]] ||
    oq_fail "an effect twice"
missing=$(q "SELECT count(*) FROM onceq.calls c WHERE c.state = 'succeeded' AND c.tool IN ('charge', 'send_email') AND NOT EXISTS (SELECT 1 FROM onceq.consumer_effects e WHERE e.call_id = c.call_id)")
[[ "$missing" == 0 ]] || oq_fail "$missing succeeded calls without their effect"
wrong=$(q "SELECT count(*) FROM onceq.consumer_effects e WHERE NOT EXISTS (SELECT 1 FROM onceq.calls c WHERE c.call_id = e.call_id AND c.state = 'succeeded')")
[[ "$wrong" == 0 ]] || oq_fail "$wrong effects of calls not succeeded"
und=$(q "SELECT count(*) FROM onceq.outbox WHERE pub_seq IS NULL OR pub_seq > (SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease)")
[[ "$und" == 0 ]] || oq_fail "$und outbox rows undelivered"
[[ "$(q "SELECT count(*) FROM onceq.outbox WHERE topic = 'onceq.tool-calls'")" == "$N" ]] || oq_fail "call rows"
((N <= $(q "SELECT count(*) FROM onceq.outbox WHERE topic = 'onceq.tool-results'"))) || oq_fail "result rows"
[[ "$(q 'SELECT count(*) FROM onceq.relay_lease')" == 1 ]] || oq_fail "more than one relay lease: $(q 'SELECT name FROM onceq.relay_lease')"
[[ "$(q 'SELECT count(*) FROM onceq.consumer_audit WHERE call_id IN (SELECT call_id FROM onceq.calls)')" -ge "$N" ]] ||
    oq_fail "consumer audit"
[[ "$(q "SELECT count(*) FROM onceq.audit WHERE event IN ('planned', 'started', 'committed')")" == 0 ]] ||
    oq_fail "consumer audit rows in the producer's audit"
for name in producer relay consumer-1 consumer-2; do oq_alive "$name" || oq_fail "$name exited"; done
oq_pass "one PostgreSQL database for producer, relay and consumers: $N calls, one effect each, every outbox row delivered"
