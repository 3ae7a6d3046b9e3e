#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The relay on PostgreSQL never skips a row whose transaction commits late (the classic outbox
# trap: seq is handed out at insert, not at commit). A submit transaction (onceq.submit in SQL)
# takes its seq and stays open for seconds while 300 later submits commit and are published
# (and executed); then it commits: its call must be published and executed too. Pipeline:
# embedded broker, producer and relay on PostgreSQL, one consumer (SQLite effects.db).
# ctest-cost: 40
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
oq_require_pg
oq_tmpdir
URL=$(oq_pg_fresh_db onceq_it_relay_late)
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "migrate"
q() { psql -XAtq "$URL" -c "$1"; }
oq_start_broker
PDB=$URL
CDB=$T/effects.db
PORT=$(oq_free_port)
export PDB CDB PORT
pl_spawn_producer
pl_spawn_relay
pl_spawn_consumer 1
pl_wait_healthy 30

HOLD=${ONCEQ_PG_LATE_HOLD_S:-12}
psql -XAtq "$URL" -c "BEGIN; SELECT call_id FROM onceq.submit('default', 'late-1', 'charge', '{\"amount\":1}'); SELECT pg_sleep($HOLD); COMMIT;" >"$T/late.out" 2>&1 &
LATE=$!
sleep 1
for i in $(seq 1 300); do
    echo "SELECT call_id FROM onceq.submit('default', 'after-$i', 'charge', '{\"amount\":$((i + 1))}');"
done >"$T/after.sql"
psql -XAtq "$URL" -f "$T/after.sql" >/dev/null || oq_fail "later submits"
delivered() {
    q "SELECT count(*) FROM onceq.outbox WHERE pub_seq <= (SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease)"
}
oq_wait_for $((HOLD - 3)) bash -c "[[ \$(psql -XAtq '$URL' -c \"SELECT count(*) FROM onceq.outbox WHERE pub_seq <= (SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease)\") -ge 300 ]]" ||
    oq_fail "the 300 later calls were not published while the early transaction was open: $(delivered)"
kill -0 "$LATE" 2>/dev/null || oq_fail "the early transaction ended too soon (machine too slow?): raise ONCEQ_PG_LATE_HOLD_S"
oq_log "300 later calls published while the early transaction is still open"
wait "$LATE" || { cat "$T/late.out"; oq_fail "the early transaction failed"; }
LATE_ID=$(head -n1 "$T/late.out")
LATE_SEQ=$(q "SELECT seq FROM onceq.outbox WHERE key = '$LATE_ID'")
MIN_AFTER=$(q "SELECT min(o.seq) FROM onceq.outbox o JOIN onceq.calls c ON c.call_id = o.key WHERE c.idem_key LIKE 'after-%'")
oq_log "early call $LATE_ID: seq $LATE_SEQ, later calls from seq $MIN_AFTER"
((LATE_SEQ < MIN_AFTER)) || oq_fail "the early call's seq ($LATE_SEQ) is not below the later ones ($MIN_AFTER): the test proves nothing"
done_all() { [[ "$(q "SELECT count(*) FROM onceq.calls WHERE state = 'succeeded'")" == 301 ]]; }
oq_wait_for 90 done_all ||
    oq_fail "not all 301 calls succeeded: $(q "SELECT state, count(*) FROM onceq.calls GROUP BY state") early: $(q "SELECT state FROM onceq.calls WHERE call_id = '$LATE_ID'")"
[[ "$(sqlite3 "$CDB" "SELECT count(*) FROM effects WHERE call_id = '$LATE_ID'")" == 1 ]] || oq_fail "the early call has no effect"
[[ "$(sqlite3 "$CDB" "SELECT count(*), count(DISTINCT call_id) FROM effects")" == "301|301" ]] || oq_fail "effects: $(sqlite3 "$CDB" "SELECT count(*), count(DISTINCT call_id) FROM effects")"
[[ "$(q "SELECT count(*) FROM onceq.outbox WHERE pub_seq IS NULL")" == 0 ]] || oq_fail "rows left unassigned"
oq_pass "relay on PostgreSQL: a late-committing call (seq $LATE_SEQ < $MIN_AFTER) published and executed"
