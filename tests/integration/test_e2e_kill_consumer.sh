#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kill -9 one of three consumers mid-run (while calls flow), with the others taking over its
# partitions after the rebalance. Redelivery of what the dead worker had committed to its
# database but not yet to Kafka must be absorbed by the inbox: duplicates skipped > 0 is
# observed (inbox `seen` > 1), duplicate effects = 0, nothing lost (`onceq verify` clean,
# every accepted call id present and terminal).
#
# To make the redelivery certain rather than a matter of timing, the victim is armed with
# ONCEQ_CRASH_AT=consumer.after_commit_before_offset@5: it kills itself (SIGKILL) on its fifth
# batch with the batch committed to SQLite and not to Kafka. The script waits for that death
# (bounded); a kill -9 from outside between two batches would leave nothing committed-but-not-
# acknowledged, so no redelivery could be required of it (on a real cluster, whose fetches
# bring larger batches, the victim often had not reached its crash point when a timed outside
# kill came). If the crash point has not fired after 60 s, the script kills it from outside and
# fails: the test then proved nothing.
# ONCEQ_E2E_CALLS (default 3000) calls at ONCEQ_E2E_RATE (default 500) calls/s.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

# Short execution leases: the sleeps the victim held are recovered in seconds, not 30 s.
PL_CONSUMER_X+=(--lease 5s)
N=${ONCEQ_E2E_CALLS:-3000}
RATE=${ONCEQ_E2E_RATE:-500}
pl_start 2
pl_spawn_consumer 3 ONCEQ_CRASH_AT=consumer.after_commit_before_offset@5
# The victim must own partitions before the load starts, or killing it proves nothing (a new
# member waits up to session.timeout.ms for the rebalance on the mock cluster).
victim_assigned() { grep -q 'assigned [1-9]' "$T/consumer-3.log"; }
oq_wait_for 60 victim_assigned || oq_fail "consumer-3 got no partitions within 60 s"

oq_log "submitting $N calls at $RATE/s in the background"
"$(oq_tool oq_e2e_load)" --port "$PORT" --calls "$N" --rate "$RATE" --conns 8 --prefix kc \
    --sleep-ms 5 --accepted "$T/accepted" >"$T/load.out" 2>&1 &
LOAD=$!
oq_on_exit "kill $LOAD 2>/dev/null"

# Calls flow; the victim dies at its crash point while they do.
victim_dead() { ! oq_alive consumer-3; }
if oq_wait_for 60 victim_dead; then
    oq_log "consumer-3 died (SIGKILL) at its crash point consumer.after_commit_before_offset"
else
    oq_log "kill -9 consumer-3 pid=$(oq_pid consumer-3): its crash point did not fire in 60 s"
    oq_kill consumer-3 KILL
    oq_fail "consumer-3 never reached its crash point (no batch of its own committed 5 times)"
fi
pl_verify --allow-pending --examples 0 >"$T/at-kill.json" 2>/dev/null
oq_log "at the kill: $(cat "$T/at-kill.json" | head -c 200)"

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
