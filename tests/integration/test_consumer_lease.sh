#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Lease lapse: worker A runs a slow charge (delay_ms 4000, lease 2 s, heartbeat every ~0.7 s)
# and is SIGSTOPped mid-run. Its lease lapses; worker B's recovery turns the execution
# UNKNOWN -> SAFE_RETRY (no effect yet), B claims it (new fence) and commits the one effect.
# A is SIGCONTed: its heartbeat and its finishing write are refused (audit 'lease_lost' by A).
# Exactly one effect, written by B; one 'committed'; the execution stays COMMITTED.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"

FEED=$(oq_tool oq_consumer_feed)
oq_start_broker --partitions 2
DB=$T/effects.db
q() { sqlite3 -cmd ".timeout 10000" "$DB" "$1"; }
q_is() { [[ $(q "$1") == "$2" ]]; }
COMMON=(--brokers "$BROKERS" --db "$DB" -X session.timeout.ms=6000 --lease 2s --recover-every 200ms)

oq_spawn wA "$ONCEQ_BIN" consumer "${COMMON[@]}" --worker-id A
"$FEED" --brokers "$BROKERS" --n 1 --tool charge --args '{"amount":42,"delay_ms":4000}' \
    --save "$T/calls.txt" >/dev/null || oq_fail "feed"
CALL=$(cut -f1 "$T/calls.txt")
oq_wait_for 30 q_is "SELECT state || '/' || lease_owner FROM executions WHERE call_id='$CALL'" "STARTED/A" ||
    oq_fail "A never started the call: $(q "SELECT state, lease_owner FROM executions")"
sleep 0.5
kill -STOP "$(oq_pid wA)"
oq_log "A stopped mid-tool (pid $(oq_pid wA))"
oq_on_exit 'kill -CONT $(oq_pid wA) 2>/dev/null'

oq_spawn wB "$ONCEQ_BIN" consumer "${COMMON[@]}" --worker-id B
oq_wait_for 30 q_is "SELECT state FROM executions WHERE call_id='$CALL'" COMMITTED ||
    oq_fail "B did not take over: $(q "SELECT state, lease_owner, fence FROM executions")"
[[ $(q "SELECT worker FROM effects WHERE call_id='$CALL'") == B ]] || oq_fail "effect not written by B"
oq_log "B committed; resuming A"
kill -CONT "$(oq_pid wA)"
oq_wait_for 20 q_is "SELECT count(*) FROM audit WHERE call_id='$CALL' AND event='lease_lost' AND worker='A'" 1 ||
    oq_fail "A's stale write was not refused/audited: $(q "SELECT event, worker, fence FROM audit WHERE call_id='$CALL' ORDER BY id")"

[[ $(q "SELECT count(*) FROM effects WHERE call_id='$CALL'") == 1 ]] || oq_fail "not exactly one effect"
[[ $(q "SELECT count(*) FROM audit WHERE call_id='$CALL' AND event='committed'") == 1 ]] || oq_fail "committed twice"
[[ $(q "SELECT state FROM executions WHERE call_id='$CALL'") == COMMITTED ]] || oq_fail "terminal state left"
[[ $(q "SELECT count(*) FROM audit WHERE call_id='$CALL' AND event='unknown'") -ge 1 ]] || oq_fail "no UNKNOWN step"
[[ $(q "SELECT count(*) FROM audit WHERE call_id='$CALL' AND event='safe_retry'") -ge 1 ]] || oq_fail "no SAFE_RETRY step"
q "SELECT id, event, worker, fence, detail FROM audit WHERE call_id='$CALL' ORDER BY id" >&2
oq_kill wA TERM
oq_kill wB TERM
oq_pass "lease lapse: one effect (by B), A's stale write refused"
