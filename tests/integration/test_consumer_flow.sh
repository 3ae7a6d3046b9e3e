#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Consumer worker with real processes on the embedded broker (no producer: tool_call
# envelopes are produced straight into onceq.tool-calls by oq_consumer_feed):
#   - retry with backoff then success (charge fail_times=2: 3 tries, 2 failed_retryable,
#     growing gaps, one effect each),
#   - retry exhaustion -> FAILED_FINAL with a failed result (fail retryable, max-attempts 3),
#   - bad args -> FAILED_FINAL bad_args, no effect,
#   - poison messages -> dlq table + onceq.dlq topic with a reason header; the partition
#     they sit in continues (every call after them is terminal),
#   - every message re-produced 3 extra times from outside -> effects unchanged,
#     duplicates skipped counted (inbox + /metrics),
#   - results published to onceq.tool-results by the embedded relay,
#   - SIGTERM -> exit 0.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"

FEED=$(oq_tool oq_consumer_feed)
KC=$(oq_tool oq_kclient)
oq_start_broker --partitions 4
DB=$T/effects.db
q() { sqlite3 -cmd ".timeout 10000" "$DB" "$1"; }
# q_is SQL VALUE: true when the query prints VALUE (for oq_wait_for, which re-runs it)
q_is() { [[ $(q "$1") == "$2" ]]; }
MPORT=$(oq_free_port)
oq_spawn c1 "$ONCEQ_BIN" consumer --brokers "$BROKERS" --db "$DB" -X session.timeout.ms=6000 \
    --lease 5s --max-attempts 3 --retry-base 150ms --retry-max 2s \
    --metrics-listen "127.0.0.1:$MPORT" --worker-id w1

"$FEED" --brokers "$BROKERS" --n 20 --tool charge --args '{"amount":7,"fail_times":2}' \
    --save "$T/calls.txt" >/dev/null || oq_fail "feed retry calls"
"$FEED" --brokers "$BROKERS" --n 5 --tool fail --args '{"retryable":true}' \
    --save "$T/calls.txt" >/dev/null || oq_fail "feed fail calls"
"$FEED" --brokers "$BROKERS" --n 5 --tool charge --args '{"amount":-1}' \
    --save "$T/calls.txt" >/dev/null || oq_fail "feed bad-args calls"
# poison interleaved with good calls; all poison has key "poison" (one partition)
"$FEED" --brokers "$BROKERS" --n 30 --tool send_email --args '{"to":"a@example.com","subject":"s"}' \
    --poison 6 --save "$T/calls.txt" >/dev/null || oq_fail "feed email + poison"
N=60

done_count() { q "SELECT count(*) FROM executions WHERE state IN ('COMMITTED','FAILED_FINAL','NEEDS_REVIEW')"; }
for ((i = 0; i < 600; i++)); do
    [[ $(done_count) == "$N" ]] && break
    sleep 0.1
done
[[ $(done_count) == "$N" ]] || oq_fail "only $(done_count)/$N executions terminal"
oq_log "all $N executions terminal"

# retry then success
[[ $(q "SELECT count(*) FROM executions WHERE tool='charge' AND state='COMMITTED' AND tries=3") == 20 ]] ||
    oq_fail "flaky charges: not 20 committed on try 3: $(q "SELECT state, tries, count(*) FROM executions WHERE tool='charge' GROUP BY 1,2")"
[[ $(q "SELECT count(*) FROM audit a JOIN executions x USING(call_id) WHERE x.tool='charge' AND x.tries=3 AND a.event='failed_retryable'") == 40 ]] ||
    oq_fail "expected 2 failed_retryable audits per flaky charge"
# backoff with full jitter: the wait before try 3 (the 2nd "started": try 1 ran inline) is
# uniform in [0, 150 ms * 2): over 20 calls
# its mean is about 150 ms (far above 60) and none waits past 300 ms (plus generous scheduling
# slack on a loaded machine)
gaps=$(q "WITH s AS (SELECT call_id, ts, row_number() OVER (PARTITION BY call_id ORDER BY id) n
             FROM audit a WHERE event='started' AND EXISTS (SELECT 1 FROM executions x
             WHERE x.call_id = a.call_id AND x.tool='charge' AND x.tries=3))
          SELECT CAST(avg(b.ts - a.ts) AS INTEGER) || ' ' || max(b.ts - a.ts) FROM s a JOIN s b
          ON a.call_id=b.call_id AND b.n=a.n+1 AND b.n=2")
read -r avggap maxgap <<<"$gaps"
((avggap >= 60 && maxgap < 300 + 1500)) || oq_fail "retry gaps before try 3: avg ${avggap} ms, max ${maxgap} ms"
# exhaustion
[[ $(q "SELECT count(*) FROM executions WHERE tool='fail' AND state='FAILED_FINAL' AND tries=3") == 5 ]] ||
    oq_fail "retryable failures not exhausted after 3 tries"
# bad args
[[ $(q "SELECT count(*) FROM executions WHERE state='FAILED_FINAL' AND json_extract(error,'\$.code')='bad_args'") == 5 ]] ||
    oq_fail "bad args not FAILED_FINAL bad_args"
# effects: 20 charges + 30 emails, one each
[[ $(q "SELECT count(*) FROM effects") == 50 ]] || oq_fail "effects $(q 'SELECT count(*) FROM effects') != 50"
[[ $(q "SELECT count(*) FROM (SELECT call_id FROM effects GROUP BY call_id HAVING count(*) > 1)") == 0 ]] ||
    oq_fail "duplicate effects"
# poison -> dlq
[[ $(q "SELECT count(*) FROM dlq") == 6 ]] || oq_fail "dlq rows $(q 'SELECT count(*) FROM dlq') != 6"
[[ $(q "SELECT count(*) FROM inbox WHERE outcome='dlq'") == 6 ]] || oq_fail "inbox dlq outcome"
oq_wait_for 15 q_is 'SELECT count(*) FROM dlq WHERE published_at IS NULL' 0 ||
    oq_fail "dead letters not published"
"$KC" consume --brokers "$BROKERS" --topic onceq.dlq --group dlq-check --max 6 --timeout-ms 20000 \
    -X session.timeout.ms=6000 >"$T/dlq.out" 2>"$T/dlq.err" || { cat "$T/dlq.err"; oq_fail "onceq.dlq does not hold 6 messages"; }
# results: one per terminal execution, all published by the embedded relay
oq_wait_for 20 q_is 'SELECT count(*) FROM outbox_unpublished' 0 ||
    oq_fail "results not published"
[[ $(q "SELECT count(DISTINCT key) FROM outbox WHERE topic='onceq.tool-results'") == "$N" ]] ||
    oq_fail "not one result per call"

# re-produce every call 3 extra times (4 copies each): nothing new may happen
eff0=$(q "SELECT count(*) FROM effects")
audit_started0=$(q "SELECT count(*) FROM audit WHERE event='started'")
"$FEED" --brokers "$BROKERS" --replay "$T/calls.txt" --repeat 3 >/dev/null || oq_fail "replay feed"
want=$((N * 4))
for ((i = 0; i < 600; i++)); do
    [[ $(q "SELECT sum(seen - 1) FROM inbox WHERE outcome <> 'dlq'") -ge $want ]] && break
    sleep 0.1
done
dups=$(q "SELECT sum(seen - 1) FROM inbox WHERE outcome <> 'dlq'")
((dups >= want)) || oq_fail "duplicates seen $dups < $want"
[[ $(q "SELECT count(*) FROM effects") == "$eff0" ]] || oq_fail "re-produced messages changed effects"
[[ $(q "SELECT count(*) FROM audit WHERE event='started'") == "$audit_started0" ]] ||
    oq_fail "re-produced messages started executions"
metric=$(curl -sf "http://127.0.0.1:$MPORT/metrics" | awk '/^onceq_consumer_duplicates_skipped_total/ {print $2}')
[[ -n "$metric" ]] && (($(printf '%.0f' "$metric") >= want)) || oq_fail "duplicates metric '$metric' < $want"
M=$(curl -sf "http://127.0.0.1:$MPORT/metrics")
grep -q 'onceq_consumer_executions{state="COMMITTED"}' <<<"$M" || oq_fail "executions by state metric missing"
[[ $(awk '/^onceq_consumer_dlq_total/ {s += $2} END {printf "%.0f", s}' <<<"$M") == 6 ]] ||
    oq_fail "dlq metric (sum over reasons) != 6"
[[ $(awk '/^onceq_consumer_effects_total/ {printf "%.0f", $2}' <<<"$M") == 50 ]] || oq_fail "effects metric != 50"
# attempts histogram: 20 flaky charges + 5 exhausted failures ended on try 3
[[ $(awk '/^onceq_consumer_attempts_bucket\{le="2"\}/ {printf "%.0f", $2}' <<<"$M") == 35 ]] ||
    oq_fail "attempts histogram: $(grep onceq_consumer_attempts_bucket <<<"$M" | head -3)"
grep -q '^onceq_consumer_processing_seconds_count' <<<"$M" || oq_fail "latency histogram missing"
# The lag comes from the watermarks librdkafka caches from fetch responses: on a real broker
# (fetch.wait.max.ms=500 with the real profile) they may follow the last message by a fetch.
lag_series() {
    curl -sf "http://127.0.0.1:$MPORT/metrics" |
        grep -q '^onceq_consumer_lag{topic="onceq.tool-calls",partition="[0-9]*"} '
}
oq_wait_for 10 lag_series || oq_fail "lag gauge (per partition) missing"

oq_kill c1 TERM
oq_wait_exit c1 1
rc=$?
[[ $rc == 0 ]] || oq_fail "consumer exit code $rc after SIGTERM"
grep -q 'msg="exit" consumed=' "$T/c1.log" || oq_fail "no clean exit line"
oq_pass "consumer flow: retry/backoff, exhaustion, bad args, DLQ, 3x re-produce absorbed ($dups duplicates), clean SIGTERM"
