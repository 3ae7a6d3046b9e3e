#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 50
# Chaos across the whole pipeline: every process type (producer, relay, consumers) is killed
# with SIGKILL at each of its named crash points (ONCEQ_CRASH_AT, OQ_CRASH_POINT in producer/,
# relay/, consumer/) while calls flow; a supervisor loop below restarts whatever died, armed
# with the next point of its list, until every list is used up. Then the pipeline runs clean
# until drained, and:
#   - every armed crash point actually fired (the process died of SIGKILL there),
#   - `onceq verify --accepted` is clean: every call the client saw accepted is in calls.db and
#     terminal, no duplicate effect, no effect for a conflicting body, nothing re-executed,
#   - effects = succeeded charge + send_email calls.
# The client retries transport errors with the same key (producer crash before the reply), as
# the contract asks. Not covered: relay.cleanup_before_commit (fires only on the 1 h retention
# cleanup).
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

declare -A POINTS=(
    [producer]="producer.after_commit_before_reply@40 producer.after_commit_before_reply@150"
    [relay]="relay.after_lease_acquire@1 relay.after_read_batch@4 relay.after_produce_before_delivery@4 relay.after_delivery_before_mark@4 relay.after_mark_before_commit@4 relay.after_mark_commit@4"
    [consumer-1]="consumer.after_intake_before_commit@4 consumer.after_commit_before_offset@4"
    [consumer-2]="consumer.after_effect_before_commit@4 consumer.in_tool@30"
    [consumer-3]="consumer.after_claim@2"
)
declare -A ARMED=() NEXT=()
FIRED=()
UNEXPECTED=()
# Short leases so a restarted relay / a lapsed execution is taken over in seconds.
RELAY_X=(--lease 1s)
CONS_X=(--lease 3s)

spawn() { # spawn NAME POINT|""
    local name=$1 point=$2 envs=()
    [[ -n "$point" ]] && envs=("ONCEQ_CRASH_AT=$point")
    ARMED[$name]=$point
    case $name in
    producer) pl_spawn_producer "${envs[@]}" ;;
    relay) oq_spawn relay env "${envs[@]}" "$ONCEQ_BIN" relay --db "$PDB" --brokers "$BROKERS" "${RELAY_X[@]}" ;;
    consumer-*)
        oq_spawn "$name" env "${envs[@]}" "$ONCEQ_BIN" consumer --db "$CDB" --group "$PL_GROUP" \
            --brokers "$BROKERS" "${PL_CONSUMER_X[@]}" "${CONS_X[@]}"
        ;;
    esac
}

next_point() { # pops the next point of NAME's list into REPLY ("" when none left)
    local name=$1 list
    read -r -a list <<<"${POINTS[$name]}"
    local i=${NEXT[$name]:-0}
    REPLY=${list[$i]:-}
    NEXT[$name]=$((i + 1))
}

# One supervision pass: reap the dead, record why they died, restart them with the next point.
tick() {
    local name pid rc
    for name in producer relay consumer-1 consumer-2 consumer-3; do
        oq_alive "$name" && continue
        pid=$(oq_pid "$name")
        wait "$pid" 2>/dev/null
        rc=$?
        if [[ $rc == 137 && -n "${ARMED[$name]}" ]]; then
            FIRED+=("${ARMED[$name]}")
            oq_log "$name died at ${ARMED[$name]} (SIGKILL): restarting"
        else
            UNEXPECTED+=("$name:rc=$rc:armed=${ARMED[$name]}")
            oq_log "$name exited rc=$rc (armed: ${ARMED[$name]:-none}): restarting"
        fi
        next_point "$name"
        spawn "$name" "$REPLY"
        [[ $name == producer ]] && { oq_wait_for 20 pl_healthz || oq_log "producer slow to restart"; }
    done
}

all_used() {
    local name list
    for name in "${!POINTS[@]}"; do
        read -r -a list <<<"${POINTS[$name]}"
        [[ -n "${ARMED[$name]}" || ${NEXT[$name]:-0} -lt ${#list[@]} ]] && return 1
    done
    return 0
}

# --- start: broker unarmed; every other process armed with the first point of its list ------
oq_tmpdir
PDB=$T/calls.db CDB=$T/effects.db PORT=$(oq_free_port)
export PDB CDB PORT
oq_start_broker
for name in producer relay consumer-1 consumer-2 consumer-3; do
    next_point "$name"
    spawn "$name" "$REPLY"
done
oq_wait_for 30 pl_healthz || { tick; oq_wait_for 30 pl_healthz || oq_fail "producer not healthy"; }

# --- load in rounds until every crash point is used up (bounded) ----------------------------
touch "$T/accepted"
ROUND=0
DEADLINE=$((SECONDS + ${ONCEQ_CHAOS_SECONDS:-240}))
LOAD=""
while ((SECONDS < DEADLINE)); do
    if [[ -z "$LOAD" ]] || ! kill -0 "$LOAD" 2>/dev/null; then
        if [[ -n "$LOAD" ]]; then
            wait "$LOAD" || oq_fail "load round $ROUND failed: $(tail -n 30 "$T/load.$ROUND.out")"
        fi
        all_used && break
        ROUND=$((ROUND + 1))
        "$(oq_tool oq_e2e_load)" --port "$PORT" --calls 300 --rate 300 --conns 4 \
            --prefix "cp$ROUND" --sleep-ms 5 --dup-every 25 --accepted "$T/accepted" \
            --retry-ms 120000 >"$T/load.$ROUND.out" 2>&1 &
        LOAD=$!
        oq_on_exit "kill $LOAD 2>/dev/null"
    fi
    tick
    sleep 0.2
done
[[ -n "$LOAD" ]] && kill -0 "$LOAD" 2>/dev/null && oq_fail "load still running at the deadline"
all_used || oq_fail "crash points not all used within the deadline; fired: ${FIRED[*]}"
oq_log "all crash points used after $ROUND load rounds; draining"

# --- drain with everything unarmed, then verify ---------------------------------------------
N=$(wc -l <"$T/accepted")
for ((i = 0; i < 240; i++)); do
    tick
    j=$(pl_verify --allow-pending --examples 0 2>/dev/null)
    [[ $(pl_field "$j" pending) == 0 ]] && break
    ((i % 20 == 0)) && oq_log "draining: pending=$(pl_field "$j" pending)"
    sleep 1
done
J=$(pl_verify --accepted "$T/accepted")
rc=$?
echo "$J"
echo "fired: ${FIRED[*]}"
echo "unexpected exits: ${UNEXPECTED[*]:-none}"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc after the crashes"
[[ $(pl_field "$J" duplicates) == 0 ]] || oq_fail "duplicate effects"
[[ $(pl_field "$J" effects) == $(pl_field "$J" expected_effects) ]] || oq_fail "effects mismatch"
for name in "${!POINTS[@]}"; do
    for p in ${POINTS[$name]}; do
        [[ " ${FIRED[*]} " == *" $p "* ]] || oq_fail "crash point $p ($name) never fired"
    done
done
[[ ${#UNEXPECTED[@]} == 0 ]] || oq_fail "processes exited without their crash point: ${UNEXPECTED[*]}"
oq_pass "crash points: ${#FIRED[@]} SIGKILLs across producer/relay/consumers, $N accepted calls, verify clean"
