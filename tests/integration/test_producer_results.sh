#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Results back into calls.db: `onceq producer --brokers` consumes onceq.tool-results (group
# onceq-producer) from the embedded broker. tool_result envelopes are injected with kcat:
# running, then succeeded three times with the SAME message_id (duplicates), a stale attempt,
# a result for an unknown call and an undecodable message. The call must end succeeded with
# its effect_id, with exactly one audit row per transition; stats must count one effect and
# the duplicates / unknown / undecodable. After a restart of the producer, a redelivered
# duplicate still changes nothing.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
command -v kcat >/dev/null || oq_fail "kcat is required"

oq_start_broker
PORT=$(oq_free_port) || oq_fail "no free port"
DB=$T/calls.db
URL=http://127.0.0.1:$PORT
sql() { sqlite3 "$DB" "$1"; }
start() {
    oq_spawn producer "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT" \
        --brokers "$BROKERS" -X session.timeout.ms=6000
    oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer did not come up"
}
start

BODY=$(curl -s -X POST -H 'Idempotency-Key: r1' --data-binary '{"tool":"charge","args":{"amount":7}}' \
    "$URL/v1/tool-calls")
ID=$(jq -r .call_id <<<"$BODY")
FP=$(jq -r .fingerprint <<<"$BODY")
[[ "$ID" == c_* ]] || oq_fail "submit failed: $BODY"

uuid() { cat /proc/sys/kernel/random/uuid; }
result() { # result MESSAGE_ID CALL_ID STATUS ATTEMPT EFFECT
    local res=null err=null eff=null
    [[ "$3" == succeeded ]] && res='{"charged":7}'
    [[ -n "$5" ]] && eff="\"$5\""
    printf '{"v":1,"kind":"tool_result","message_id":"%s","call_id":"%s","tenant":"default","idem_key":"r1","fingerprint":"%s","tool":"charge","attempt":%d,"created_at":%d,"status":"%s","result":%s,"error":%s,"effect_id":%s}\n' \
        "$1" "$2" "$FP" "$4" "$(date +%s%3N)" "$3" "$res" "$err" "$eff"
}
M_RUN=$(uuid)
M_OK=$(uuid)
{
    result "$M_RUN" "$ID" running 1 ""
    result "$M_OK" "$ID" succeeded 1 e-42
    result "$M_OK" "$ID" succeeded 1 e-42
    result "$(uuid)" "$ID" failed 0 ""                    # attempt 0: invalid envelope
    result "$(uuid)" c_00000000deadbeef succeeded 1 e-x    # unknown call
    echo 'this is not json'
    result "$M_OK" "$ID" succeeded 1 e-42
} >"$T/results.jsonl"
# all with key = call id so they land in one partition, in order
sed "s/^/$ID|/" "$T/results.jsonl" | kcat -P -b "$BROKERS" -t onceq.tool-results -K '|' ||
    oq_fail "kcat produce failed"

ok=0
for i in $(seq 300); do
    S=$(curl -s "$URL/v1/tool-calls/$ID" | jq -r .status)
    if [[ "$S" == succeeded ]] && [[ "$(curl -s "$URL/stats" | jq -r '.results.undecodable')" -ge 2 ]]; then
        ok=1
        break
    fi
    sleep 0.1
done
[[ $ok == 1 ]] || oq_fail "call did not reach succeeded (status $S): $(curl -s "$URL/stats")"
C=$(curl -s "$URL/v1/tool-calls/$ID")
[[ "$(jq -r .effect_id <<<"$C")" == e-42 && "$(jq -r .result.charged <<<"$C")" == 7 ]] ||
    oq_fail "result/effect not stored: $C"
[[ "$(sql "SELECT count(*) FROM audit WHERE call_id='$ID' AND event='running'")" == 1 ]] ||
    oq_fail "running applied more than once"
[[ "$(sql "SELECT count(*) FROM audit WHERE call_id='$ID' AND event='succeeded'")" == 1 ]] ||
    oq_fail "succeeded applied more than once"
S=$(curl -s "$URL/stats")
[[ "$(jq -r .effects <<<"$S")" == 1 ]] || oq_fail "effects != 1: $S"
[[ "$(jq -r .results.duplicate <<<"$S")" == 2 ]] || oq_fail "duplicates not counted: $S"
[[ "$(jq -r .results.unknown_call <<<"$S")" == 1 ]] || oq_fail "unknown call not counted: $S"
[[ "$(jq -r .results.applied <<<"$S")" == 2 ]] || oq_fail "applied != 2: $S"
[[ "$(sql "SELECT count(*) FROM calls")" == 1 ]] || oq_fail "unknown call created a row"
"$ONCEQ_BIN" inspect --db "$DB" "$ID" >"$T/inspect" || oq_fail "inspect failed"
grep -q 'succeeded' "$T/inspect" && grep -q 'running' "$T/inspect" || oq_fail "inspect timeline: $(cat "$T/inspect")"

# restart: offsets were committed after the DB commit; a late duplicate changes nothing
oq_kill producer TERM
start
result "$M_OK" "$ID" succeeded 1 e-42 | sed "s/^/$ID|/" |
    kcat -P -b "$BROKERS" -t onceq.tool-results -K '|' || oq_fail "kcat produce failed"
for i in $(seq 150); do
    [[ "$(curl -s "$URL/stats" | jq -r '.results.duplicate')" -ge 1 ]] && break
    sleep 0.1
done
S=$(curl -s "$URL/stats")
[[ "$(jq -r .results.duplicate <<<"$S")" == 1 && "$(jq -r .results.applied <<<"$S")" == 0 ]] ||
    oq_fail "after restart: expected only the one new duplicate (no reprocessing): $S"
[[ "$(sql "SELECT count(*) FROM audit WHERE call_id='$ID' AND event='succeeded'")" == 1 ]] ||
    oq_fail "duplicate applied after restart"
oq_pass "producer results ingest"
