#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Redrive repairs a LOST RESULT MESSAGE. The consumer runs every call (effects committed) with
# its result relay off; then the result relay's watermark in effects.db is moved past the
# first half of the results without publishing them, and the consumer restarts with its relay
# on: those results are "delivered" but never reach the producer (what a broker acknowledging
# a write it never stored leaves behind). Then:
#   1. with redrive off the producer keeps those calls pending: their effects happened, their
#      results are gone, and a resubmit of the key is a replay that writes nothing;
#   2. the producer restarted with --redrive-after 2s publishes each such call's message again
#      (same message id); the consumer's inbox knows the id and the execution is terminal, so
#      it re-emits the result under the result's own message id instead of only counting a
#      duplicate. Every call ends succeeded with still exactly one effect, `onceq verify` is
#      clean, the producer applied the lost results under their original message ids, and
#      onceq_consumer_results_reemitted_total counts the re-emits.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

N=20
LOST=10
oq_tmpdir
PDB=$T/calls.db CDB=$T/effects.db PORT=$(oq_free_port) CMPORT=$(oq_free_port)
export PDB CDB PORT
sql() { sqlite3 -cmd ".timeout 5000" "$@"; }
spawn_producer() { # $1 = --redrive-after
    oq_spawn producer "$ONCEQ_BIN" producer --db "$PDB" --listen "127.0.0.1:$PORT" \
        --brokers "$BROKERS" --redrive-after "$1" --redrive-interval 200ms "${PL_CONSUMER_X[@]}"
}
spawn_consumer() { # extra args
    oq_spawn consumer-1 "$ONCEQ_BIN" consumer --db "$CDB" --group "$PL_GROUP" --brokers "$BROKERS" \
        --metrics-listen "127.0.0.1:$CMPORT" "${PL_CONSUMER_X[@]}" "$@"
}

oq_start_broker
spawn_producer 0
pl_spawn_relay
spawn_consumer --no-relay
pl_wait_healthy 30
pl_load --calls "$N" --conns 2 --mix 1,1,0,0,0 --prefix lostres --accepted "$T/accepted" \
    >"$T/load.out" || oq_fail "load failed"
oq_wait_for 60 bash -c "[[ \$(sqlite3 -cmd '.timeout 5000' '$CDB' \"SELECT count(*) FROM executions
    WHERE state='COMMITTED'\") == $N ]]" || oq_fail "the consumer did not run the $N calls"
oq_kill consumer-1
[[ $(sql "$CDB" "SELECT count(*) FROM outbox") == "$N" ]] || oq_fail "expected $N result rows"
[[ $(sql "$PDB" "SELECT count(*) FROM calls WHERE state='pending'") == "$N" ]] ||
    oq_fail "results reached the producer although the consumer's relay was off"

oq_log "losing the first $LOST results (the result relay's watermark moved, nothing sent)"
lost_seq=$(sql "$CDB" "SELECT seq FROM outbox ORDER BY seq LIMIT 1 OFFSET $((LOST - 1))")
sql "$CDB" "INSERT INTO relay_lease(name, owner, fence, expires_at, published_seq)
            VALUES ('outbox', 'test:lost', 1, 0, $lost_seq)"
sql "$CDB" "SELECT key || ' ' || message_id FROM outbox WHERE seq <= $lost_seq" >"$T/lost"
[[ $(wc -l <"$T/lost") == "$LOST" ]] || oq_fail "expected $LOST lost results"

spawn_consumer
oq_wait_for 60 bash -c "[[ \$(sqlite3 -cmd '.timeout 5000' '$PDB' \"SELECT count(*) FROM calls
    WHERE state='succeeded'\") == $((N - LOST)) ]]" || oq_fail "the published results were not applied"
sleep 6
pend=$(sql "$PDB" "SELECT count(*) FROM calls WHERE state IN ('pending','running')")
oq_log "redrive off: $pend calls still pending after 6 s, their effects already committed"
[[ "$pend" == "$LOST" ]] || oq_fail "expected the $LOST calls with lost results pending, got $pend"

oq_log "producer restarted with --redrive-after 2s"
oq_kill producer
spawn_producer 2s
pl_wait_healthy 30
pl_wait_drained 60 "$N" || oq_fail "lost results not recovered by the redrive within 60 s"

J=$(pl_verify --accepted "$T/accepted")
rc=$?
echo "$J"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc"
[[ $(pl_field "$J" duplicates) == 0 ]] || oq_fail "duplicate effects"
[[ $(pl_field "$J" effects) == "$N" ]] || oq_fail "effects != $N"
[[ $(sql "$CDB" "SELECT count(*) FROM effects") == "$N" ]] || oq_fail "effects rows != $N"
[[ $(sql "$CDB" "SELECT count(*) FROM audit WHERE event IN ('started','committed')") == "$N" ]] ||
    oq_fail "a call ran more than once"
[[ $(sql "$PDB" "SELECT count(*) FROM calls WHERE state='succeeded'") == "$N" ]] ||
    oq_fail "not every call succeeded"
# each lost result reached the producer under its original message id, applied once
while read -r call mid; do
    [[ $(sql "$PDB" "SELECT outcome FROM result_inbox WHERE message_id='$mid' AND call_id='$call'") == applied ]] ||
        oq_fail "result $mid of $call not applied under its original message id"
done <"$T/lost"
m=$(curl -sf "http://127.0.0.1:$CMPORT/metrics" |
    awk '$1 == "onceq_consumer_results_reemitted_total" {print $2}')
oq_log "onceq_consumer_results_reemitted_total=$m"
[[ -n "$m" && "$m" -ge "$LOST" ]] || oq_fail "onceq_consumer_results_reemitted_total=$m, expected >= $LOST"
oq_pass "lost results: $LOST re-emitted under their original ids, $N effects (one each), verify clean"
