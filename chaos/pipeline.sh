# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Shell helpers for the pipeline-level tests (tests/integration/test_e2e*.sh,
# tests/chaos/test_e2e*.sh): start broker + producer + relay + N consumers as separate
# processes with tests/integration/lib.sh, load them with oq_e2e_load, wait for the drain and
# read `onceq verify --json`. Source lib.sh first, then this file.
#
#   pl_start [NCONS]          broker, producer (PORT), relay, consumer-1..N; sets PDB CDB PORT
#   pl_spawn_producer [ENV..] (re)start the producer; ENV like ONCEQ_CRASH_AT=x
#   pl_spawn_relay [ENV..]    (re)start the relay
#   pl_spawn_consumer I [ENV..]  (re)start consumer-I
#   pl_wait_healthy [S]       wait for GET /healthz = 200
#   pl_load ARGS...           run oq_e2e_load against PORT (output in $T/load.out, appended)
#   pl_verify [ARGS...]       onceq verify --json on PDB/CDB; prints the JSON, returns its rc
#   pl_field JSON NAME        a top-level number/bool from verify's JSON (jq)
#   pl_wait_drained S [N]     until no call is pending/running (and >= N calls); 1 on timeout
#   pl_verify_clean [ARGS...] pl_verify, printed and kept in J; fails the test unless it exits 0,
#                             clean, no duplicate effect, nothing lost, effects = expected

PL_GROUP=${PL_GROUP:-onceq-workers}
# Fast rebalances on the mock cluster: a member joining a stable group waits
# session.timeout.ms - 1000.
PL_CONSUMER_X=(-X session.timeout.ms=6000)
# Extra arguments of the broker (pl_start), the producer and the relay; empty by default.
PL_BROKER_X=()
PL_PRODUCER_X=()
PL_RELAY_X=()

pl_spawn_producer() {
    oq_spawn producer env "$@" "$ONCEQ_BIN" producer --db "$PDB" --listen "127.0.0.1:$PORT" \
        --brokers "$BROKERS" "${PL_PRODUCER_X[@]}"
}

pl_spawn_relay() {
    oq_spawn relay env "$@" "$ONCEQ_BIN" relay --db "$PDB" --brokers "$BROKERS" "${PL_RELAY_X[@]}"
}

pl_spawn_consumer() {
    local i=$1
    shift
    oq_spawn "consumer-$i" env "$@" "$ONCEQ_BIN" consumer --db "$CDB" --group "$PL_GROUP" \
        --brokers "$BROKERS" "${PL_CONSUMER_X[@]}"
}

pl_healthz() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/healthz"; }

pl_wait_healthy() {
    oq_wait_for "${1:-30}" pl_healthz || oq_fail "producer not healthy on port $PORT"
}

pl_start() {
    local n=${1:-3} i
    oq_tmpdir
    PDB=$T/calls.db
    CDB=${PL_CDB:-$T/effects.db} # PL_CDB: the consumers' database, e.g. a PostgreSQL URL
    PORT=$(oq_free_port)
    export PDB CDB PORT
    oq_start_broker "${PL_BROKER_X[@]}"
    pl_spawn_producer
    pl_spawn_relay
    for ((i = 1; i <= n; i++)); do pl_spawn_consumer "$i"; done
    pl_wait_healthy 30
    # The consumer database is created by the first consumer; verify needs it.
    if [[ "$CDB" == postgres* ]]; then
        oq_wait_for 30 psql -XAtq "$CDB" -c "SELECT 1 FROM onceq.consumer_executions LIMIT 0" ||
            oq_fail "no consumer schema in PostgreSQL"
    else
        oq_wait_for 30 test -s "$CDB" || oq_fail "no consumer database at $CDB"
    fi
}

pl_load() {
    "$(oq_tool oq_e2e_load)" --port "$PORT" "$@" | tee -a "$T/load.out"
    return "${PIPESTATUS[0]}"
}

pl_verify() {
    "$ONCEQ_BIN" verify --producer-db "$PDB" --consumer-db "$CDB" --json "$@"
}

# (a top-level member: by_state.pending, which now differs from the top-level pending once
# calls report `running`, must not be picked up)
pl_field() {
    jq -r --arg k "$2" 'if has($k) then .[$k] else empty end' <<<"$1" 2>/dev/null
}

pl_wait_drained() {
    local timeout=$1 want=${2:-0} i j pend calls
    for ((i = 0; i < timeout * 2; i++)); do
        j=$(pl_verify --allow-pending --examples 0 2>/dev/null)
        pend=$(pl_field "$j" pending)
        calls=$(pl_field "$j" calls)
        if [[ "$pend" == 0 && -n "$calls" && "$calls" -ge "$want" ]]; then
            oq_log "drained: calls=$calls"
            return 0
        fi
        ((i % 20 == 0)) && oq_log "waiting for the drain: calls=${calls:-?} pending=${pend:-?}"
        sleep 0.5
    done
    return 1
}

pl_verify_clean() {
    local rc
    J=$(pl_verify "$@")
    rc=$?
    echo "$J"
    [[ $rc == 0 ]] || oq_fail "onceq verify exit $rc"
    [[ $(pl_field "$J" clean) == true ]] || oq_fail "verify not clean"
    [[ $(pl_field "$J" duplicates) == 0 ]] || oq_fail "duplicate effects"
    [[ $(pl_field "$J" lost) == 0 ]] || oq_fail "lost calls"
    [[ $(pl_field "$J" effects) == $(pl_field "$J" expected_effects) ]] || oq_fail "effects mismatch"
}
