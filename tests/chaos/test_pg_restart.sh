#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# PostgreSQL killed (immediate shutdown: SIGQUIT to the postmaster, as `pg_ctl stop -m
# immediate`) and restarted under load, on a private cluster of this test (scripts/pg.sh):
# producer and relay on it, one consumer (SQLite). 4 clients submit 200 calls over HTTP, each
# retrying its key until it is accepted; mid-run the server dies and comes back 3 s later.
# Then: every call ends succeeded, one effect per call (none twice), nothing lost, the producer
# and relay still run (no restart), /readyz ready again.
# ctest-cost: 60
set -euo pipefail
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
oq_start_broker
PDB=$URL
CDB=$T/effects.db
PORT=$(oq_free_port)
export PDB CDB PORT
pl_spawn_producer
pl_spawn_relay
pl_spawn_consumer 1
pl_wait_healthy 30

client() { # W: 50 calls, each key retried until accepted (202/200), at most ~60 s
    local w=$1 i code
    for i in $(seq 1 50); do
        for _ in $(seq 1 300); do
            code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST \
                "http://127.0.0.1:$PORT/v1/tool-calls" -H "Idempotency-Key: c$w-$i" \
                -H 'Content-Type: application/json' -d "{\"tool\":\"charge\",\"args\":{\"amount\":$i}}")
            [[ "$code" == 202 || "$code" == 200 ]] && break
            sleep 0.2
        done
        [[ "$code" == 202 || "$code" == 200 ]] || { echo "c$w-$i never accepted ($code)"; return 1; }
        echo "c$w-$i" >>"$T/accepted.$w"
        sleep 0.01
    done
}
for w in 1 2 3 4; do
    client "$w" >"$T/client.$w.out" 2>&1 &
    echo $! >>"$T/clients"
done
oq_wait_for 30 bash -c "[[ \$(cat $T/accepted.* 2>/dev/null | wc -l) -ge 40 ]]" || oq_fail "no progress before the kill"
PGPID=$($PG pid --dir "$PGD")
oq_log "killing PostgreSQL (pid $PGPID, immediate shutdown) after $(cat "$T"/accepted.* | wc -l) accepted"
kill -QUIT "$PGPID"
oq_wait_for 20 bash -c "! kill -0 $PGPID 2>/dev/null" || oq_fail "postmaster did not stop"
sleep 3
$PG start --dir "$PGD" 2>/dev/null || oq_fail "restart"
oq_log "PostgreSQL back"
while read -r p; do wait "$p" || oq_fail "a client gave up: $(cat "$T"/client.*.out)"; done <"$T/clients"
N=$(cat "$T"/accepted.* | sort -u | wc -l)
((N == 200)) || oq_fail "accepted $N of 200"
done_all() { [[ "$(q "SELECT count(*) FROM onceq.calls WHERE state = 'succeeded'")" == 200 ]]; }
oq_wait_for 120 done_all || oq_fail "calls: $(q "SELECT state, count(*) FROM onceq.calls GROUP BY state")"
[[ "$(q 'SELECT count(*) FROM onceq.calls')" == 200 ]] || oq_fail "calls stored: $(q 'SELECT count(*) FROM onceq.calls')"
[[ "$(sqlite3 "$CDB" 'SELECT count(*), count(DISTINCT call_id) FROM effects')" == "200|200" ]] ||
    oq_fail "effects: $(sqlite3 "$CDB" 'SELECT count(*), count(DISTINCT call_id) FROM effects')"
oq_wait_for 20 curl -fsS "http://127.0.0.1:$PORT/readyz" -o /dev/null || oq_fail "not ready after the restart"
for name in producer relay; do oq_alive "$name" || oq_fail "$name exited"; done
oq_pass "PostgreSQL killed and restarted under load: 200 calls, each executed once, nothing lost"
