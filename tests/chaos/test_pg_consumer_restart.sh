#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# PostgreSQL killed (immediate shutdown: SIGQUIT to the postmaster, as `pg_ctl stop -m
# immediate`) and restarted under load with the CONSUMERS on it, on a private cluster of this
# test (scripts/pg.sh): producer and relay on SQLite, two consumers on PostgreSQL. Calls flow
# while the server dies and comes back 3 s later. Then: every accepted call terminal, one
# effect per call, nothing lost (`onceq verify` clean, reading the PostgreSQL store), every
# result delivered, both consumers still running (they reconnected; no restart).
# ctest-cost: 25
set -u
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    [[ "${CI:-}" == true ]] && oq_fail "PostgreSQL server binaries missing under CI=true"
    echo "SKIP: needs Debian's postgresql package"
    exit 77
fi
oq_tmpdir
chmod 711 "$T" # the server's unprivileged owner must reach its folder
PGD=$T/pg
PG="bash $ONCEQ_SRC/scripts/pg.sh"
oq_on_exit "$PG stop --dir $PGD >/dev/null 2>&1"
$PG start --dir "$PGD" 2>/dev/null || oq_fail "pg.sh start"
URL=$($PG url --dir "$PGD")
q() { psql -XAtq "$URL" -c "$1"; }
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "migrate"
N=300
PDB=$T/calls.db
CDB=$URL
PORT=$(oq_free_port)
export PDB CDB PORT
PL_CONSUMER_X+=(--lease 5s)
oq_start_broker
pl_spawn_producer
pl_spawn_relay
pl_spawn_consumer 1
pl_spawn_consumer 2
pl_wait_healthy 30

"$(oq_tool oq_e2e_load)" --port "$PORT" --calls "$N" --rate 40 --conns 4 --prefix pgr \
    --accepted "$T/accepted" >"$T/load.out" 2>&1 &
LOAD=$!
oq_on_exit "kill $LOAD 2>/dev/null"
some_done() { [[ "$(q "SELECT count(*) FROM onceq.consumer_executions")" -ge 40 ]]; }
oq_wait_for 60 some_done || oq_fail "no progress before the kill"
PGPID=$($PG pid --dir "$PGD")
oq_log "killing PostgreSQL (pid $PGPID, immediate shutdown) after $(q "SELECT count(*) FROM onceq.consumer_executions") executions"
kill -QUIT "$PGPID"
oq_wait_for 20 bash -c "! kill -0 $PGPID 2>/dev/null" || oq_fail "postmaster did not stop"
sleep 3
$PG start --dir "$PGD" 2>/dev/null || oq_fail "restart"
oq_log "PostgreSQL back"

wait "$LOAD" || oq_fail "load generator failed: $(cat "$T/load.out")"
pl_wait_drained 180 "$N" || oq_fail "calls not terminal within 180 s after the restart"
J=$(pl_verify --accepted "$T/accepted")
rc=$?
echo "$J"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc"
[[ $(pl_field "$J" duplicates) == 0 ]] || oq_fail "duplicate effects"
[[ $(pl_field "$J" lost) == 0 ]] || oq_fail "lost calls"
[[ $(pl_field "$J" effects) == $(pl_field "$J" expected_effects) ]] || oq_fail "effects mismatch"
und=$(q "SELECT count(*) FROM onceq.outbox WHERE pub_seq IS NULL OR pub_seq > (SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease)")
[[ "$und" == 0 ]] || oq_fail "$und result rows never delivered"
for name in consumer-1 consumer-2; do oq_alive "$name" || oq_fail "$name exited"; done
grep -h "rolled back\|reconnected" "$T"/consumer-*.log | head -3 >&2 || true
oq_pass "PostgreSQL killed and restarted under the consumers: $N calls, each executed once, nothing lost"
