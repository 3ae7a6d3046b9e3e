#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SIGTERM while a long tool runs: the worker does not wait for the 6 s sleep; it hands the
# execution back (STARTED -> UNKNOWN -> SAFE_RETRY, audited "abandoned at stop"), commits,
# leaves the group and exits 0 within a few seconds. A restarted worker runs it to COMMITTED.
# Also: a second worker in the group during the run, and a clean exit of both.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"

FEED=$(oq_tool oq_consumer_feed)
oq_start_broker --partitions 2
DB=$T/effects.db
q() { sqlite3 -cmd ".timeout 10000" "$DB" "$1"; }
q_is() { [[ $(q "$1") == "$2" ]]; }
COMMON=(--brokers "$BROKERS" --db "$DB" -X session.timeout.ms=6000)

oq_spawn w1 "$ONCEQ_BIN" consumer "${COMMON[@]}" --worker-id w1
"$FEED" --brokers "$BROKERS" --n 1 --tool sleep --args '{"ms":6000}' --save "$T/calls.txt" >/dev/null ||
    oq_fail "feed"
CALL=$(cut -f1 "$T/calls.txt")
oq_wait_for 30 q_is "SELECT state FROM executions WHERE call_id='$CALL'" STARTED || oq_fail "never started"
t0=$SECONDS
kill -TERM "$(oq_pid w1)"
oq_wait_exit w1 5
rc=$?
[[ $rc == 0 ]] || oq_fail "exit code $rc after SIGTERM (124 = did not exit within 5 s)"
oq_log "w1 exited 0 in $((SECONDS - t0)) s"
[[ $(q "SELECT state FROM executions WHERE call_id='$CALL'") == SAFE_RETRY ]] ||
    oq_fail "abandoned execution not SAFE_RETRY: $(q "SELECT state FROM executions")"
[[ $(q "SELECT count(*) FROM audit WHERE call_id='$CALL' AND event='safe_retry' AND detail LIKE 'abandoned%'") == 1 ]] ||
    oq_fail "no audited hand-back"

oq_spawn w2 "$ONCEQ_BIN" consumer "${COMMON[@]}" --worker-id w2
oq_spawn w3 "$ONCEQ_BIN" consumer "${COMMON[@]}" --worker-id w3
oq_wait_for 30 q_is "SELECT state FROM executions WHERE call_id='$CALL'" COMMITTED ||
    oq_fail "restarted workers did not finish it: $(q "SELECT state, lease_owner FROM executions")"
[[ $(q "SELECT json_extract(result, '\$.slept_ms') FROM executions WHERE call_id='$CALL'") == 6000 ]] ||
    oq_fail "result missing"
for w in w2 w3; do
    kill -TERM "$(oq_pid $w)"
done
for w in w2 w3; do
    oq_wait_exit $w 15
    rc=$?
    [[ $rc == 0 ]] || oq_fail "$w exit code $rc after SIGTERM"
done
oq_pass "SIGTERM mid-tool: exit 0 quickly, execution handed back and finished by another worker"
