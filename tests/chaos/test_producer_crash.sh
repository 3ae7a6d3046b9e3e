#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Crash after commit, before the reply: `onceq producer` is SIGKILLed by the crash point
# producer.after_commit_before_reply right after its group commit, so the client never gets an
# answer. After a restart, the client's retry with the same key must return the committed
# call (a replay), and there must be exactly one call and one outbox row for that key. A
# second round crashes on the 3rd batch while 8 clients submit distinct keys: every key that
# got a 2xx is in the database, and every retry after the restart is a replay or new (never a
# duplicate).
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir

PORT=$(oq_free_port) || oq_fail "no free port"
DB=$T/calls.db
URL=http://127.0.0.1:$PORT
sql() { sqlite3 "$DB" "$1"; }

start() { # start [crash-spec]
    if [[ -n "${1:-}" ]]; then
        oq_spawn producer env ONCEQ_CRASH_AT="$1" "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT"
    else
        oq_spawn producer "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT"
    fi
    oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer did not come up"
}

# --- round 1: the very first commit crashes --------------------------------------------------
start producer.after_commit_before_reply
CODE=$(curl -s -o "$T/r1" -w '%{http_code}' --max-time 10 -X POST -H 'Idempotency-Key: crash-1' \
    --data-binary '{"tool":"charge","args":{"amount":42}}' "$URL/v1/tool-calls")
[[ "$CODE" == 000 ]] || oq_fail "expected no answer (crash), got HTTP $CODE"
oq_wait_exit producer 10
RC=$?
[[ $RC == 137 ]] || oq_fail "producer should have died by SIGKILL (137), exit $RC"
grep -q 'producer.after_commit_before_reply' "$T/producer.log" || oq_fail "crash point not logged"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key='crash-1'")" == 1 ]] ||
    oq_fail "the commit before the crash is not durable"
ID=$(sql "SELECT call_id FROM calls WHERE idem_key='crash-1'")

start
CODE=$(curl -s -o "$T/r2" -D "$T/h2" -w '%{http_code}' --max-time 10 -X POST \
    -H 'Idempotency-Key: crash-1' --data-binary '{"args":{"amount":42},"tool":"charge"}' \
    "$URL/v1/tool-calls")
[[ "$CODE" == 202 ]] || oq_fail "retry after restart: HTTP $CODE $(cat "$T/r2")"
grep -qi '^Idempotent-Replayed: true' "$T/h2" || oq_fail "retry after restart was not a replay"
[[ "$(jq -r .call_id "$T/r2")" == "$ID" ]] || oq_fail "retry returned another call"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key='crash-1'")" == 1 &&
    "$(sql "SELECT count(*) FROM outbox WHERE key='$ID'")" == 1 ]] || oq_fail "duplicated rows"
oq_kill producer TERM

# --- round 2: crash on the 3rd batch under concurrent load -------------------------------------
start producer.after_commit_before_reply@3
PIDS=()
for c in $(seq 8); do
    (
        for i in $(seq 20); do
            code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST \
                -H "Idempotency-Key: load-$c-$i" \
                --data-binary "{\"tool\":\"charge\",\"args\":{\"amount\":$i}}" "$URL/v1/tool-calls")
            echo "load-$c-$i $code"
        done
    ) >"$T/load.$c" &
    PIDS+=($!)
done
wait "${PIDS[@]}"
oq_wait_exit producer 10
RC=$?
[[ $RC == 137 ]] || oq_fail "round 2: producer should have crashed, exit $RC"
ACKED=$(cat "$T"/load.* | awk '$2 ~ /^2/ {print $1}')
for k in $ACKED; do
    [[ "$(sql "SELECT count(*) FROM calls WHERE idem_key='$k'")" == 1 ]] ||
        oq_fail "acknowledged key $k is not in the database"
done
start
# every client retries every key (acked or not) with the same key after the restart
for k in $(cat "$T"/load.* | awk '{print $1}'); do
    i=${k##*-}
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST -H "Idempotency-Key: $k" \
        --data-binary "{\"tool\":\"charge\",\"args\":{\"amount\":$i}}" "$URL/v1/tool-calls")
    [[ "$code" == 202 ]] || oq_fail "retry of $k after restart: HTTP $code"
done
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key LIKE 'load-%'")" == 160 ]] ||
    oq_fail "expected 160 calls, got $(sql "SELECT count(*) FROM calls WHERE idem_key LIKE 'load-%'")"
[[ "$(sql "SELECT count(*) FROM outbox")" == "$(sql "SELECT count(*) FROM calls")" ]] ||
    oq_fail "outbox rows != calls"
[[ "$(sql "SELECT count(*) FROM (SELECT key FROM outbox GROUP BY key HAVING count(*)>1)")" == 0 ]] ||
    oq_fail "a call has two outbox rows"
oq_log "acked before the crash: $(wc -w <<<"$ACKED") of 160"
oq_pass "producer crash after commit, before reply"
