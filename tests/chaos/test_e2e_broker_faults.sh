#!/usr/bin/env bash
# Broker faults across the whole pipeline, driven through the embedded broker's control FIFO
# while calls flow:
#   1. delayed Produce responses (error_rtt ... NO_ERROR 2500 ms) longer than the clients'
#      request timeout (1 s here): librdkafka re-sends and the mock cluster, which has no
#      broker-side dedupe, stores REAL duplicate messages on both topics;
#   2. NOT_LEADER_FOR_PARTITION errors on Produce, and a partition leader moved;
#   3. one broker down for 3 s, then up.
# Afterwards: drained, `onceq verify --accepted` clean, no duplicate effect, effects = succeeded
# charge + send_email, and the duplicates really reached the consumers (inbox seen > 1).
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
pl_spawn_producer
oq_spawn relay "$ONCEQ_BIN" relay --db "$PDB" --brokers "$BROKERS" "${FAST_TIMEOUT[@]}"
for i in 1 2 3; do pl_spawn_consumer "$i"; done
pl_wait_healthy 30
oq_wait_for 30 test -s "$CDB" || oq_fail "no consumer database"

"$(oq_tool oq_e2e_load)" --port "$PORT" --calls "$N" --rate 150 --conns 4 --prefix bf \
    --sleep-ms 5 --accepted "$T/accepted" --retry-ms 120000 >"$T/load.out" 2>&1 &
LOAD=$!
oq_on_exit "kill $LOAD 2>/dev/null"

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
oq_pass "broker faults: $red duplicate deliveries absorbed, 0 duplicate effects, verify clean"
