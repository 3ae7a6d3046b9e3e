#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Redrive repairs a LOST CALL MESSAGE. Calls are accepted while no relay runs; then the relay's
# watermark is moved past the first half of the outbox without publishing those rows: the
# relay believes them delivered (what a broker that acknowledges a write it never stored, or a
# topic whose messages were dropped, leaves behind). Then:
#   1. with redrive off (--redrive-after 0) the lost half stays pending however long we wait:
#      resubmitting a key is a replay and writes nothing, so nothing else brings them back;
#   2. the producer restarted with --redrive-after 2s republishes each lost call's message
#      with the SAME message id: every call ends terminal, exactly one effect each, `onceq
#      verify --accepted` clean, onceq_producer_redrives_total and the 'redrive' audit rows
#      account for it, and the consumer's inbox holds each call's original message id once.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

N=20
LOST=10
oq_tmpdir
PDB=$T/calls.db CDB=$T/effects.db PORT=$(oq_free_port)
export PDB CDB PORT
sql() { sqlite3 -cmd ".timeout 5000" "$@"; }
spawn_producer() { # $1 = --redrive-after
    oq_spawn producer "$ONCEQ_BIN" producer --db "$PDB" --listen "127.0.0.1:$PORT" \
        --brokers "$BROKERS" --redrive-after "$1" --redrive-interval 200ms "${PL_CONSUMER_X[@]}"
}

oq_start_broker
spawn_producer 0
pl_wait_healthy 30
pl_load --calls "$N" --conns 2 --mix 1,1,0,0,0 --prefix lost --accepted "$T/accepted" \
    >"$T/load.out" || oq_fail "load failed"
[[ $(sql "$PDB" "SELECT count(*) FROM outbox") == "$N" ]] || oq_fail "expected $N outbox rows"

oq_log "losing the call messages of the first $LOST outbox rows (watermark moved, nothing sent)"
lost_seq=$(sql "$PDB" "SELECT seq FROM outbox ORDER BY seq LIMIT 1 OFFSET $((LOST - 1))")
sql "$PDB" "INSERT INTO relay_lease(name, owner, fence, expires_at, published_seq)
            VALUES ('outbox', 'test:lost', 1, 0, $lost_seq)"
sql "$PDB" "SELECT key || ' ' || message_id FROM outbox WHERE seq <= $lost_seq" >"$T/lost"
[[ $(wc -l <"$T/lost") == "$LOST" ]] || oq_fail "expected $LOST lost rows"

pl_spawn_relay
pl_spawn_consumer 1
oq_wait_for 60 test -s "$CDB" || oq_fail "no consumer database"
# the published half completes ...
oq_wait_for 60 bash -c "[[ \$(sqlite3 -cmd '.timeout 5000' '$PDB' \"SELECT count(*) FROM calls
    WHERE state='succeeded'\") == $((N - LOST)) ]]" || oq_fail "the published half did not finish"
# ... and, with redrive off, the lost half stays pending (the failure this test is about)
sleep 6
pend=$(sql "$PDB" "SELECT count(*) FROM calls WHERE state IN ('pending','running')")
oq_log "redrive off: $pend calls still pending after 6 s"
[[ "$pend" == "$LOST" ]] || oq_fail "expected the $LOST lost calls pending with redrive off, got $pend"

oq_log "producer restarted with --redrive-after 2s"
oq_kill producer
spawn_producer 2s
pl_wait_healthy 30
pl_wait_drained 60 "$N" || oq_fail "lost calls not recovered by the redrive within 60 s"

J=$(pl_verify --accepted "$T/accepted")
rc=$?
echo "$J"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc"
[[ $(pl_field "$J" duplicates) == 0 ]] || oq_fail "duplicate effects"
[[ $(pl_field "$J" effects) == "$N" ]] || oq_fail "effects != $N"
[[ $(sql "$CDB" "SELECT count(*) FROM effects") == "$N" ]] || oq_fail "effects rows != $N"
[[ $(sql "$PDB" "SELECT count(*) FROM calls WHERE state='succeeded'") == "$N" ]] ||
    oq_fail "not every call succeeded"

# the same message ids: the lost calls' original ids reached the consumer, once each
while read -r call mid; do
    [[ $(sql "$CDB" "SELECT count(*) FROM inbox WHERE message_id='$mid' AND call_id='$call'") == 1 ]] ||
        oq_fail "inbox has no row for the original message id $mid of $call"
    [[ $(sql "$PDB" "SELECT count(*) FROM audit WHERE call_id='$call' AND event='redrive'
                     AND json_extract(detail,'$.message_id')='$mid'") -ge 1 ]] ||
        oq_fail "no redrive audit row for $call"
done <"$T/lost"
[[ $(sql "$PDB" "SELECT count(DISTINCT call_id) FROM audit WHERE event='redrive'") == "$LOST" ]] ||
    oq_fail "calls other than the lost ones were redriven"
m=$(curl -sf "http://127.0.0.1:$PORT/metrics" | awk '$1 == "onceq_producer_redrives_total" {print $2}')
oq_log "onceq_producer_redrives_total=$m"
[[ -n "$m" && "$m" -ge "$LOST" ]] || oq_fail "onceq_producer_redrives_total=$m, expected >= $LOST"
grep -q 'redrive: call message published again' "$T/producer.log" || oq_fail "no redrive log line"
oq_pass "lost call messages: $LOST redriven with their original message ids, $N effects, verify clean"
