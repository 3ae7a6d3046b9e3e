#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A broker node is killed with SIGKILL while calls flow, and restarted on its data.
#
# The victim is the node leading most partitions of onceq.tool-calls. With RF 3 and
# min.insync.replicas 2 the two others keep accepting acks=all writes: the controller fences
# the dead node (broker.session.timeout.ms 6 s in the test cluster) and moves its leaderships;
# the relay's idempotent producer and the consumers follow the new leaders. The node is then
# restarted on the same data and catches up. Checks:
#   - leadership really moved: while the node is down it leads no partition, every partition
#     has a leader;
#   - the load generator got every call accepted, and they all reach a terminal state;
#   - `onceq verify --accepted` is clean: nothing accepted is lost, no duplicate effect;
#   - the restarted node rejoins and the topics are fully replicated again;
#   - onceq.tool-calls holds every outbox row (nothing the brokers acknowledged was lost).
#     Copies are allowed there (a relay whose produce timed out may send again) and are
#     counted; the inbox absorbs them, which verify's clean result shows.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/realkafka/lib.sh"

N=${ONCEQ_E2E_CALLS:-3000}
RATE=${ONCEQ_E2E_RATE:-250}
PL_CONSUMER_X+=(--lease 5s)
pl_start 3
oq_wait_for 30 rk_all_led || oq_fail "topics not led"

VICTIM=$(rk_busiest onceq.tool-calls)
[[ "$VICTIM" =~ ^[0-9]+$ ]] || oq_fail "no leader found for onceq.tool-calls"
VPID=$(rk_node_pid "$VICTIM")
[[ -n "$VPID" ]] || oq_fail "node $VICTIM has no pid (ONCEQ_KAFKA_DIR=$ONCEQ_KAFKA_DIR)"
LED=$(rk_led_by "$VICTIM")
oq_log "victim: node $VICTIM (pid $VPID) leads $LED partitions of the onceq topics"
((LED > 0)) || oq_fail "node $VICTIM leads no partition: the fault would prove nothing"

oq_log "submitting $N calls at $RATE/s in the background"
"$(oq_tool oq_e2e_load)" --port "$PORT" --calls "$N" --rate "$RATE" --conns 8 --prefix bk \
    --sleep-ms 5 --accepted "$T/accepted" >"$T/load.out" 2>&1 &
LOAD=$!
oq_on_exit "kill $LOAD 2>/dev/null"
# Whatever happens below, the node is running again when the script ends.
oq_on_exit "oq_kafka_cluster start-node $VICTIM >/dev/null 2>&1"

flowing() {
    local j
    j=$(pl_verify --allow-pending --examples 0 2>/dev/null)
    [[ $(pl_field "$j" effects) -ge $((N / 6)) ]]
}
oq_wait_for 60 flowing || oq_fail "no effects flowing within 60 s"
kill -0 "$LOAD" 2>/dev/null || oq_fail "the load ended before the kill: raise ONCEQ_E2E_CALLS"
oq_log "kill -9 node $VICTIM"
t_kill=$SECONDS
oq_kafka_cluster kill-node "$VICTIM" KILL || oq_fail "kill-node failed"

moved() { [[ $(rk_led_by "$VICTIM") == 0 ]] && rk_all_led; }
oq_wait_for 40 moved || oq_fail "node $VICTIM still leads partitions 40 s after its death"
oq_log "leaders moved off node $VICTIM after $((SECONDS - t_kill)) s"
sleep 3 # calls keep flowing on two nodes
kill -0 "$LOAD" 2>/dev/null || oq_log "note: the load finished while the node was down"

oq_log "restart node $VICTIM on its data"
oq_kafka_cluster restart-node "$VICTIM" || oq_fail "node $VICTIM did not come back"
oq_wait_for 60 rk_fully_replicated || oq_fail "topics under-replicated 60 s after the restart"
oq_log "node $VICTIM back, topics fully replicated $((SECONDS - t_kill)) s after the kill"

wait "$LOAD"
lrc=$?
cat "$T/load.out"
[[ $lrc == 0 ]] || oq_fail "load generator failed (rc=$lrc)"
grep -q "^accepted=$N\$" "$T/load.out" || oq_fail "not all $N calls accepted"

pl_wait_drained 240 "$N" || oq_fail "calls not terminal within 240 s after the restart"
pl_verify_clean --accepted "$T/accepted"

"$(oq_tool oq_relay_check)" --brokers "$BROKERS" --db "$PDB" --topic onceq.tool-calls \
    --timeout-ms 60000 >"$T/check.out" || { cat "$T/check.out"; oq_fail "tool-calls topic check failed"; }
grep '# summary' "$T/check.out"
grep -q ' missing=0 ' "$T/check.out" || oq_fail "tool-calls topic lost acknowledged messages"
dups=$(sed -n 's/.* dups=\([0-9]*\) .*/\1/p' "$T/check.out")
oq_pass "broker kill -9 + restart: leaders moved, verify clean, redeliveries absorbed=$(pl_field "$J" inbox_duplicates), topic copies=$dups"
