#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A broker node is frozen with SIGSTOP while calls flow, for longer than the session timeouts
# (broker.session.timeout.ms 6 s in the test cluster, the consumers' session.timeout.ms 6 s),
# then resumed with SIGCONT. Unlike a kill, the node's sockets stay open: clients see no
# disconnect, only requests that are never answered, until their timeouts or the new
# leaders' metadata move them on. The victim is the node leading most partitions of
# onceq.tool-calls. Checks:
#   - while it is frozen, the controller fences it: it leads no partition, all are led;
#   - after SIGCONT the same process (same pid) rejoins, the topics are fully replicated;
#   - every call is accepted and terminal, `onceq verify --accepted` is clean (DSR 0, lost 0);
#   - onceq.tool-calls holds every outbox row (copies counted, absorbed by the inbox).
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/realkafka/lib.sh"

N=${ONCEQ_E2E_CALLS:-4000}
RATE=${ONCEQ_E2E_RATE:-200}
PAUSE_S=${ONCEQ_PAUSE_S:-15}
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
oq_on_exit "kill -CONT $VPID 2>/dev/null"

oq_log "submitting $N calls at $RATE/s in the background"
"$(oq_tool oq_e2e_load)" --port "$PORT" --calls "$N" --rate "$RATE" --conns 8 --prefix bp \
    --sleep-ms 5 --accepted "$T/accepted" >"$T/load.out" 2>&1 &
LOAD=$!
oq_on_exit "kill $LOAD 2>/dev/null"

flowing() {
    local j
    j=$(pl_verify --allow-pending --examples 0 2>/dev/null)
    [[ $(pl_field "$j" effects) -ge $((N / 8)) ]]
}
oq_wait_for 60 flowing || oq_fail "no effects flowing within 60 s"
kill -0 "$LOAD" 2>/dev/null || oq_fail "the load ended before the pause: raise ONCEQ_E2E_CALLS"

RK_BROKERS=$(rk_brokers_without "$VICTIM")
oq_log "SIGSTOP node $VICTIM for ${PAUSE_S} s (helpers now ask $RK_BROKERS)"
t_stop=$SECONDS
oq_kafka_cluster kill-node "$VICTIM" STOP || oq_fail "SIGSTOP failed"
moved() { [[ $(rk_led_by "$VICTIM") == 0 ]] && rk_all_led; }
oq_wait_for "$PAUSE_S" moved || oq_fail "node $VICTIM still leads partitions $((SECONDS - t_stop)) s into its pause"
oq_log "frozen node fenced, leaders moved after $((SECONDS - t_stop)) s"
while ((SECONDS - t_stop < PAUSE_S)); do sleep 0.5; done
kill -0 "$LOAD" 2>/dev/null || oq_log "note: the load finished while the node was frozen"
oq_log "SIGCONT node $VICTIM after $((SECONDS - t_stop)) s"
oq_kafka_cluster kill-node "$VICTIM" CONT || oq_fail "SIGCONT failed"
RK_BROKERS=

oq_kafka_cluster wait-ready --timeout 60 >/dev/null 2>&1 || oq_fail "node $VICTIM did not rejoin within 60 s"
[[ "$(rk_node_pid "$VICTIM")" == "$VPID" ]] || oq_fail "node $VICTIM is not the same process after SIGCONT"
oq_wait_for 60 rk_fully_replicated || oq_fail "topics under-replicated 60 s after SIGCONT"
oq_log "node $VICTIM back (same pid), topics fully replicated $((SECONDS - t_stop)) s after SIGSTOP"

wait "$LOAD"
lrc=$?
cat "$T/load.out"
[[ $lrc == 0 ]] || oq_fail "load generator failed (rc=$lrc)"
grep -q "^accepted=$N\$" "$T/load.out" || oq_fail "not all $N calls accepted"

pl_wait_drained 240 "$N" || oq_fail "calls not terminal within 240 s after SIGCONT"
pl_verify_clean --accepted "$T/accepted"

"$(oq_tool oq_relay_check)" --brokers "$BROKERS" --db "$PDB" --topic onceq.tool-calls \
    --timeout-ms 60000 >"$T/check.out" || { cat "$T/check.out"; oq_fail "tool-calls topic check failed"; }
grep '# summary' "$T/check.out"
grep -q ' missing=0 ' "$T/check.out" || oq_fail "tool-calls topic lost acknowledged messages"
dups=$(sed -n 's/.* dups=\([0-9]*\) .*/\1/p' "$T/check.out")
oq_pass "broker SIGSTOP ${PAUSE_S} s + SIGCONT: leaders moved, verify clean, redeliveries absorbed=$(pl_field "$J" inbox_duplicates), topic copies=$dups"
