#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The operator's read-only views of a live pipeline (broker, producer, relay, one consumer):
#   - `onceq stats --json`: stdout is exactly one JSON document (jq), with the relay's status
#     (lease held) under "relay" and the calls by status; plain `onceq stats` keeps its line;
#   - `onceq inspect <call_id> --consumer-db`: one timeline joining the producer's audit
#     (submitted, succeeded) and the consumer's (a retried charge: failed_retryable,
#     started, committed, each with its worker, attempt and fence), the execution's tries and
#     fence; text and --json; an unknown call is exit 4.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

oq_tmpdir
PDB=$T/calls.db CDB=$T/effects.db PORT=$(oq_free_port)
export PDB CDB PORT
oq_start_broker
pl_spawn_producer
pl_wait_healthy 30
pl_spawn_relay
oq_spawn consumer-1 "$ONCEQ_BIN" consumer --db "$CDB" --brokers "$BROKERS" --worker-id w-inspect \
    --retry-base 50ms --retry-max 200ms "${PL_CONSUMER_X[@]}"
ID=$(curl -sf -X POST "http://127.0.0.1:$PORT/v1/tool-calls" -H 'Idempotency-Key: inspect-1' \
    -H 'Content-Type: application/json' -d '{"tool":"charge","args":{"amount":7,"fail_times":1}}' |
    jq -r .call_id)
[[ $ID == c_* ]] || oq_fail "submit failed"
oq_wait_for 60 bash -c "[[ \$('$ONCEQ_BIN' get --db '$PDB' '$ID' | jq -r .status) == succeeded ]]" ||
    oq_fail "the call did not succeed"

# --- stats --json ----------------------------------------------------------------------------
"$ONCEQ_BIN" stats --db "$PDB" --json >"$T/stats.json" || oq_fail "stats --json failed"
jq -e . "$T/stats.json" >/dev/null || oq_fail "stats --json is not JSON: $(cat "$T/stats.json")"
[[ $(jq -s length "$T/stats.json") == 1 ]] || oq_fail "stats --json: more than one document"
jq -e '.calls == 1 and .by_status.succeeded == 1 and (.relay.pending | type) == "number" and
    (.relay.leases | map(select(.name == "outbox" and .holder != null)) | length) == 1' \
    "$T/stats.json" >/dev/null || oq_fail "stats --json fields: $(cat "$T/stats.json")"
"$ONCEQ_BIN" stats --db "$PDB" | grep -q '^relay: pending=' || oq_fail "plain stats lost its line"

# --- inspect ---------------------------------------------------------------------------------
J=$("$ONCEQ_BIN" inspect --db "$PDB" --consumer-db "$CDB" --json "$ID") || oq_fail "inspect --json failed"
jq -e --arg id "$ID" '.call.call_id == $id and .call.status == "succeeded" and
    .consumer.execution.state == "COMMITTED" and .consumer.execution.tries == 2 and
    .consumer.execution.fence >= 1 and .consumer.effect.effect_id != null' <<<"$J" >/dev/null ||
    oq_fail "inspect --json: call/execution: $J"
for ev in submitted succeeded; do
    jq -e --arg e "$ev" '[.timeline[] | select(.from == "producer" and .event == $e)] | length >= 1' \
        <<<"$J" >/dev/null || oq_fail "inspect: no producer '$ev' row: $J"
done
for ev in failed_retryable started committed; do
    jq -e --arg e "$ev" '[.timeline[] | select(.from == "consumer" and .event == $e and
        .worker == "w-inspect" and .fence != null and .attempt == 1)] | length >= 1' \
        <<<"$J" >/dev/null || oq_fail "inspect: no consumer '$ev' row with worker/fence: $J"
done
jq -e '[.timeline[].ts] as $t | $t == ($t | sort)' <<<"$J" >/dev/null || oq_fail "timeline not by time"
"$ONCEQ_BIN" inspect --db "$PDB" --consumer-db "$CDB" "$ID" >"$T/inspect.txt" || oq_fail "inspect failed"
grep -q '^consumer  COMMITTED (attempt 1, tries 2, fence ' "$T/inspect.txt" &&
    grep -q ' producer  succeeded' "$T/inspect.txt" &&
    grep -q ' consumer  committed .*\[w-inspect attempt=1 fence=' "$T/inspect.txt" ||
    oq_fail "inspect text: $(cat "$T/inspect.txt")"
"$ONCEQ_BIN" inspect --db "$PDB" --consumer-db "$CDB" c_00000000000000000000000000000000 2>/dev/null
[[ $? == 4 ]] || oq_fail "inspect of an unknown call: want exit 4"
oq_pass "stats --json one document; inspect joins the producer's and the consumer's audit"
