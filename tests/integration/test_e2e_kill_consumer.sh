#!/usr/bin/env bash
# kill -9 one of three consumers mid-run (while calls flow), with the others taking over its
# partitions after the rebalance. Redelivery of what the dead worker had committed to its
# database but not yet to Kafka must be absorbed by the inbox: duplicates skipped > 0 is
# observed (inbox `seen` > 1), duplicate effects = 0, nothing lost (`onceq verify` clean,
# every accepted call id present and terminal).
#
# To make the redelivery certain rather than a matter of timing, the victim is also armed with
# ONCEQ_CRASH_AT=consumer.after_commit_before_offset@20: whichever comes first, the external
# kill -9 or that crash point, it dies with work committed to SQLite and not to Kafka.
# ONCEQ_E2E_CALLS (default 3000) calls at ONCEQ_E2E_RATE (default 500) calls/s.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

# Short execution leases: the sleeps the victim held are recovered in seconds, not 30 s.
PL_CONSUMER_X+=(--lease 5s)
N=${ONCEQ_E2E_CALLS:-3000}
RATE=${ONCEQ_E2E_RATE:-500}
pl_start 2
pl_spawn_consumer 3 ONCEQ_CRASH_AT=consumer.after_commit_before_offset@20
# The victim must own partitions before the load starts, or killing it proves nothing (a new
# member waits up to session.timeout.ms for the rebalance on the mock cluster).
victim_assigned() { grep -q 'assigned [1-9]' "$T/consumer-3.log"; }
oq_wait_for 60 victim_assigned || oq_fail "consumer-3 got no partitions within 60 s"

oq_log "submitting $N calls at $RATE/s in the background"
"$(oq_tool oq_e2e_load)" --port "$PORT" --calls "$N" --rate "$RATE" --conns 8 --prefix kc \
    --sleep-ms 5 --accepted "$T/accepted" >"$T/load.out" 2>&1 &
LOAD=$!
oq_on_exit "kill $LOAD 2>/dev/null"

# Let calls flow for a while, then kill.
flowing() {
    local j
    j=$(pl_verify --allow-pending --examples 0 2>/dev/null)
    [[ $(pl_field "$j" effects) -ge $((N / 4)) ]]
}
oq_wait_for 60 flowing || oq_fail "no effects flowing within 60 s"
sleep 1
if oq_alive consumer-3; then
    oq_log "kill -9 consumer-3 pid=$(oq_pid consumer-3)"
    oq_kill consumer-3 KILL
else
    oq_log "consumer-3 already died at its crash point"
fi

wait "$LOAD"
lrc=$?
cat "$T/load.out"
[[ $lrc == 0 ]] || oq_fail "load generator failed (rc=$lrc)"
oq_alive consumer-1 && oq_alive consumer-2 || oq_fail "a surviving consumer died"

pl_wait_drained 240 "$N" || oq_fail "calls not terminal within 240 s after the kill"
J=$(pl_verify --accepted "$T/accepted")
rc=$?
echo "$J"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc"
[[ $(pl_field "$J" duplicates) == 0 ]] || oq_fail "duplicate effects"
[[ $(pl_field "$J" lost) == 0 ]] || oq_fail "lost calls"
[[ $(pl_field "$J" effects) == $(pl_field "$J" expected_effects) ]] || oq_fail "effects mismatch"
red=$(pl_field "$J" inbox_duplicates)
oq_log "redeliveries absorbed by the inbox: $red"
[[ -n "$red" && "$red" -gt 0 ]] || oq_fail "no redelivery observed after kill -9 (inbox_duplicates=$red)"
oq_pass "kill -9 consumer: $red redeliveries absorbed, 0 duplicate effects, nothing lost"
