#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Broker faults across the whole pipeline, driven through the embedded broker's control FIFO
# while calls flow (200 calls/s for 10 s):
#   0. NOT_LEADER_FOR_PARTITION x5 on Produce alone: the reproduction of issue 14 item 2. The
#      mock cluster then stores nothing for the failed requests but acknowledges the ones
#      behind them, and the idempotent producer reports the failed ones delivered
#      (docs/BROKER-NOTES.md): about one run in five lost a call or a result message for good.
#      The producer's redrive (--redrive-after 5s here) publishes such a call's message again
#      with the same message id, and the consumer re-emits a lost result, so every call ends;
#   1. delayed Produce responses (error_rtt ... NO_ERROR 2500 ms) longer than the clients'
#      request timeout (1 s here): librdkafka re-sends and the mock cluster, which has no
#      broker-side dedupe, stores REAL duplicate messages on both topics;
#   2. NOT_LEADER_FOR_PARTITION errors on Produce, and a partition leader moved;
#   3. one broker down for 3 s, then up.
# Afterwards: drained, `onceq verify --accepted` clean, no duplicate effect, effects = succeeded
# charge + send_email, and the duplicates really reached the consumers (inbox seen > 1). The
# redrives (onceq_producer_redrives_total) and consumer re-emits are reported.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

N=${ONCEQ_E2E_CALLS:-2000}
FAST_TIMEOUT=(-X socket.timeout.ms=1000 -X request.timeout.ms=1000)
PL_CONSUMER_X+=("${FAST_TIMEOUT[@]}")

oq_tmpdir
PDB=$T/calls.db CDB=$T/effects.db PORT=$(oq_free_port)
export PDB CDB PORT
oq_start_broker
oq_spawn producer "$ONCEQ_BIN" producer --db "$PDB" --listen "127.0.0.1:$PORT" --brokers "$BROKERS" \
    --redrive-after 5s --redrive-interval 500ms
oq_spawn relay "$ONCEQ_BIN" relay --db "$PDB" --brokers "$BROKERS" "${FAST_TIMEOUT[@]}"
for i in 1 2 3; do pl_spawn_consumer "$i"; done
pl_wait_healthy 30
oq_wait_for 30 test -s "$CDB" || oq_fail "no consumer database"

"$(oq_tool oq_e2e_load)" --port "$PORT" --calls "$N" --rate 200 --conns 4 --prefix bf \
    --sleep-ms 5 --accepted "$T/accepted" --retry-ms 120000 >"$T/load.out" 2>&1 &
LOAD=$!
oq_on_exit "kill $LOAD 2>/dev/null"

sleep 1
oq_log "fault 0: NOT_LEADER_FOR_PARTITION x5 on Produce (issue 14 item 2)"
oq_broker_ctl "error Produce NOT_LEADER_FOR_PARTITION 5" || oq_fail "broker ctl error"
sleep 2
oq_log "fault 1: delayed Produce responses (duplicates)"
for b in 1 2 3; do oq_broker_ctl "error_rtt $b Produce NO_ERROR 2500 3" || oq_fail "broker ctl error_rtt"; done
sleep 4
oq_log "fault 2: NOT_LEADER_FOR_PARTITION on Produce, leader move"
oq_broker_ctl "error Produce NOT_LEADER_FOR_PARTITION 5" || oq_fail "broker ctl error"
oq_broker_ctl "leader onceq.tool-calls 0 2" || oq_fail "broker ctl leader"
sleep 2
oq_log "fault 3: broker 1 down for 3 s"
oq_broker_ctl "down 1" || oq_fail "broker ctl down"
sleep 3
oq_broker_ctl "up 1" || oq_fail "broker ctl up"
oq_broker_ctl "status"
oq_log "faults done; waiting for the load"

wait "$LOAD"
lrc=$?
cat "$T/load.out"
[[ $lrc == 0 ]] || oq_fail "load failed (rc=$lrc)"
for p in producer relay consumer-1 consumer-2 consumer-3; do oq_alive "$p" || oq_fail "$p died"; done
pl_wait_drained 240 "$N" || oq_fail "not drained after the faults"
J=$(pl_verify --accepted "$T/accepted")
rc=$?
echo "$J"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc"
[[ $(pl_field "$J" duplicates) == 0 ]] || oq_fail "duplicate effects"
[[ $(pl_field "$J" effects) == $(pl_field "$J" expected_effects) ]] || oq_fail "effects mismatch"
red=$(pl_field "$J" inbox_duplicates)
oq_log "duplicate deliveries absorbed by the consumer inbox: $red"
[[ -n "$red" && "$red" -gt 0 ]] || oq_fail "the delayed Produce responses made no duplicate reach a consumer"
redrives=$(curl -sf "http://127.0.0.1:$PORT/metrics" | awk '$1 == "onceq_producer_redrives_total" {print $2}')
reemits=$(sqlite3 -cmd ".timeout 5000" "$CDB" \
    "SELECT count(*) FROM audit WHERE event='duplicate_skipped' AND detail LIKE '%result re-emitted'")
# a call whose message reached the consumers only after its first redrive: its first copy
# was lost (or was still unread when the redrive came)
late=$(sqlite3 -cmd ".timeout 5000" "$CDB" "ATTACH '$PDB' AS p;
    SELECT count(*) FROM (SELECT a.call_id, min(a.ts) AS t FROM p.audit a
        WHERE a.event='redrive' GROUP BY a.call_id) r
    JOIN inbox i ON i.call_id = r.call_id WHERE i.received_at >= r.t")
oq_log "calls redriven by the producer: ${redrives:-?} (first reached a consumer only after the redrive: $late); results re-emitted by the consumers: $reemits"
oq_pass "broker faults: $red duplicate deliveries absorbed, ${redrives:-?} redrives ($late first delivered by one), $reemits re-emits, 0 duplicate effects, verify clean"
