#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Readiness of the relay and the consumer on their metrics listeners:
#  - /healthz is 200 and /readyz 200 {"status":"ready"} with database, kafka, and the relay's
#    lease (holder) / the consumer's group (assigned) once both run; onceq_ready 1;
#  - every broker down (the embedded broker's `down all`): both go 503 with kafka unreachable,
#    /healthz stays 200 (liveness), onceq_ready 0; `up all`: ready again;
#  - the database not writable (another process holds its write lock for several seconds):
#    both go 503 naming the database, and ready again once the lock is released;
#  - a consumer batch that keeps failing (a trigger refuses its inbox rows): the consumer's
#    "batch" member names it, onceq_consumer_batch_rollbacks_total counts the tries, and the
#    call runs once the fault is gone;
#  - a second relay on the same database is a standby and ready.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

command -v sqlite3 >/dev/null || oq_fail "sqlite3 (the CLI) is needed to hold a write lock"
oq_tmpdir
oq_start_broker
RPORT=$(oq_free_port) || oq_fail "no free port"
R2PORT=$(oq_free_port) || oq_fail "no free port"
CPORT=$(oq_free_port) || oq_fail "no free port"
PPORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn producer "$ONCEQ_BIN" producer --db "$T/calls.db" --listen "127.0.0.1:$PPORT"
oq_wait_for 15 test -s "$T/calls.db" || oq_fail "producer did not create calls.db"
oq_spawn relay "$ONCEQ_BIN" relay --db "$T/calls.db" --brokers "$BROKERS" --lease 2s \
    --metrics-listen "127.0.0.1:$RPORT"
oq_spawn consumer "$ONCEQ_BIN" consumer --db "$T/effects.db" --brokers "$BROKERS" \
    -X session.timeout.ms=6000 --metrics-listen "127.0.0.1:$CPORT"

# readyz PORT: 0 when 200; the body in $T/ready.$PORT, the code in $T/code.$PORT
readyz() {
    curl -s --max-time 3 -o "$T/ready.$1" -w '%{http_code}' "http://127.0.0.1:$1/readyz" \
        >"$T/code.$1" || true
    [[ "$(cat "$T/code.$1")" == 200 ]]
}
unready() { ! readyz "$1" && [[ "$(cat "$T/code.$1")" == 503 ]]; }
field() { jq -r "$2" <"$T/ready.$1"; }
healthy() { curl -sf --max-time 3 "http://127.0.0.1:$1/healthz" >/dev/null; }
ready_gauge() { curl -sf --max-time 3 "http://127.0.0.1:$1/metrics" | grep -q "^onceq_ready $2\$"; }

oq_wait_for 30 readyz "$RPORT" || oq_fail "relay never ready: $(cat "$T/ready.$RPORT")"
oq_wait_for 30 readyz "$CPORT" || oq_fail "consumer never ready: $(cat "$T/ready.$CPORT")"
oq_log "relay: $(cat "$T/ready.$RPORT") consumer: $(cat "$T/ready.$CPORT")"
[[ $(field "$RPORT" .status) == ready && $(field "$RPORT" .database) == ok &&
    $(field "$RPORT" .kafka) == ok && $(field "$RPORT" .lease) == holder* ]] ||
    oq_fail "relay /readyz: $(cat "$T/ready.$RPORT")"
[[ $(field "$CPORT" .status) == ready && $(field "$CPORT" .database) == ok &&
    $(field "$CPORT" .kafka) == ok && $(field "$CPORT" .group) == assigned* ]] ||
    oq_fail "consumer /readyz: $(cat "$T/ready.$CPORT")"
ready_gauge "$RPORT" 1 || oq_fail "relay onceq_ready is not 1"
ready_gauge "$CPORT" 1 || oq_fail "consumer onceq_ready is not 1"

# A standby relay on the same database is ready too.
oq_spawn relay2 "$ONCEQ_BIN" relay --db "$T/calls.db" --brokers "$BROKERS" --lease 2s \
    --metrics-listen "127.0.0.1:$R2PORT"
oq_wait_for 20 readyz "$R2PORT" || oq_fail "standby relay never ready: $(cat "$T/ready.$R2PORT")"
[[ $(field "$R2PORT" .lease) == standby ]] || oq_fail "relay2 not standby: $(cat "$T/ready.$R2PORT")"

# --- the broker goes away ----------------------------------------------------------------------
oq_broker_ctl "down all" >/dev/null || oq_fail "broker ctl down all"
oq_wait_for 20 unready "$RPORT" || oq_fail "relay still ready with every broker down: $(cat "$T/ready.$RPORT")"
oq_wait_for 20 unready "$CPORT" || oq_fail "consumer still ready with every broker down: $(cat "$T/ready.$CPORT")"
oq_log "broker down: relay $(cat "$T/ready.$RPORT") consumer $(cat "$T/ready.$CPORT")"
[[ $(field "$RPORT" .status) == unready && $(field "$RPORT" .kafka) == unreachable* &&
    $(field "$RPORT" .database) == ok ]] || oq_fail "relay unready body: $(cat "$T/ready.$RPORT")"
[[ $(field "$CPORT" .kafka) == unreachable* ]] || oq_fail "consumer unready body: $(cat "$T/ready.$CPORT")"
healthy "$RPORT" || oq_fail "relay /healthz must stay 200 while unready"
healthy "$CPORT" || oq_fail "consumer /healthz must stay 200 while unready"
ready_gauge "$RPORT" 0 || oq_fail "relay onceq_ready is not 0 while unready"
oq_broker_ctl "up all" >/dev/null || oq_fail "broker ctl up all"
oq_wait_for 30 readyz "$RPORT" || oq_fail "relay not ready again after up all: $(cat "$T/ready.$RPORT")"
oq_wait_for 60 readyz "$CPORT" || oq_fail "consumer not ready again after up all: $(cat "$T/ready.$CPORT")"
oq_log "broker up: both ready again"

# --- the database cannot be written ---------------------------------------------------------
# sqlite3 takes the write lock of each database and keeps it for 6 s (two probes in a row find
# it held: a fault, not load).
hold_lock() { printf 'BEGIN IMMEDIATE;\nSELECT 1;\n.system sleep 6\nROLLBACK;\n' | sqlite3 "$1" >/dev/null 2>&1; }
hold_lock "$T/calls.db" &
L1=$!
hold_lock "$T/effects.db" &
L2=$!
oq_on_exit "kill $L1 $L2 2>/dev/null"
# Unready for the database: another check may turn unready first (the consumer's group, while
# its worker waits for the lock), so wait for the database member itself to say so.
db_locked() { unready "$1" && [[ $(field "$1" .database) == locked* ]]; }
oq_wait_for 5 db_locked "$RPORT" || oq_fail "relay /readyz does not name the locked calls.db: $(cat "$T/ready.$RPORT")"
oq_wait_for 5 db_locked "$CPORT" || oq_fail "consumer /readyz does not name the locked effects.db: $(cat "$T/ready.$CPORT")"
oq_log "database locked: relay $(cat "$T/ready.$RPORT") consumer $(cat "$T/ready.$CPORT")"
wait "$L1" "$L2" || true
oq_wait_for 15 readyz "$RPORT" || oq_fail "relay not ready after the lock: $(cat "$T/ready.$RPORT")"
oq_wait_for 40 readyz "$CPORT" || oq_fail "consumer not ready after the lock: $(cat "$T/ready.$CPORT")"

# --- a batch that keeps failing -------------------------------------------------------------
# A fault that does not pass by itself: a trigger added to effects.db refuses every inbox row
# (a lock would not do: the worker waits for it). The batch of the call that arrives then is
# rolled back on every try: /readyz's "batch" member says so once it has failed for a second,
# onceq_consumer_batch_rollbacks_total counts the tries; with the trigger gone the call runs
# and the check passes again.
sqlite3 "$T/effects.db" "CREATE TRIGGER test_fault BEFORE INSERT ON inbox BEGIN SELECT RAISE(ABORT, 'injected fault'); END;" ||
    oq_fail "cannot add the fault's trigger"
CID=$(curl -sf -X POST "http://127.0.0.1:$PPORT/v1/tool-calls" -H 'Idempotency-Key: stall-1' \
    -d '{"tool":"charge","args":{"amount":1}}' | jq -r .call_id) || oq_fail "submit"
batch_failing() { unready "$CPORT" && [[ $(field "$CPORT" .batch) == *"has failed"*"injected fault"* ]]; }
oq_wait_for 20 batch_failing || oq_fail "consumer /readyz does not name the failing batch: $(cat "$T/ready.$CPORT")"
oq_log "batch failing: $(field "$CPORT" .batch)"
rollbacks=$(curl -sf --max-time 3 "http://127.0.0.1:$CPORT/metrics" | awk '/^onceq_consumer_batch_rollbacks_total/ {print $2}')
[[ ${rollbacks%.*} -ge 2 ]] || oq_fail "onceq_consumer_batch_rollbacks_total: '$rollbacks'"
sqlite3 "$T/effects.db" "DROP TRIGGER test_fault;" || oq_fail "cannot drop the fault's trigger"
oq_wait_for 30 readyz "$CPORT" || oq_fail "consumer not ready after the batch passed: $(cat "$T/ready.$CPORT")"
[[ $(field "$CPORT" .batch) == "batches commit" ]] || oq_fail "batch member: $(cat "$T/ready.$CPORT")"
# (this producer reads no results: the consumer's row says the call ran)
call_done() { [[ $(sqlite3 "$T/effects.db" "SELECT state FROM executions WHERE call_id = '$CID'") == COMMITTED ]]; }
oq_wait_for 30 call_done || oq_fail "the call of the failed batch did not run"
grep -q 'msg="batch committed after' "$T/consumer.log" || oq_fail "consumer logged no recovery of the batch"

grep -q 'msg="not ready"' "$T/relay.log" || oq_fail "relay logged no 'not ready' line"
grep -q 'msg="ready"' "$T/consumer.log" || oq_fail "consumer logged no 'ready' line"
oq_pass "relay and consumer /readyz follow the broker, the database and a failing batch; /healthz stays up"
