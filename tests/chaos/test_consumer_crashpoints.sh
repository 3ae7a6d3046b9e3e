#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kill -9 at each consumer crash point, then recovery by a fresh worker on the same database:
# every call ends terminal, charge/send_email calls have exactly one effect each, and nothing
# started again after a terminal state. Each round uses its own topic, group and database.
#   consumer.after_intake_before_commit  batch written, not committed (rolled back, redelivered)
#   consumer.in_tool                     inline tool and runner tool runs
#   consumer.after_effect_before_commit  effect + terminal written, not committed
#   consumer.after_commit_before_offset  committed, offsets not (redelivery -> inbox)
#   consumer.after_claim                 runner: STARTED committed, tool not run (lease lapses)
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"

FEED=$(oq_tool oq_consumer_feed)
oq_start_broker --partitions 3
POINTS=(consumer.after_intake_before_commit consumer.in_tool@4 consumer.after_effect_before_commit@2
    consumer.after_commit_before_offset consumer.after_claim@2)
round=0
for point in "${POINTS[@]}"; do
    round=$((round + 1))
    DB=$T/effects-$round.db
    TOPIC=onceq.crash-$round
    q() { sqlite3 -cmd ".timeout 10000" "$DB" "$1"; }
    COMMON=(--brokers "$BROKERS" --db "$DB" --topic "$TOPIC" --group "crash-$round"
        -X session.timeout.ms=6000 --lease 2s --recover-every 200ms --batch 5 --no-relay)
    "$FEED" --brokers "$BROKERS" --topic "$TOPIC" --n 8 --tool charge --args '{"amount":3,"delay_ms":30}' >/dev/null &&
        "$FEED" --brokers "$BROKERS" --topic "$TOPIC" --n 8 --tool charge --args '{"amount":4}' >/dev/null &&
        "$FEED" --brokers "$BROKERS" --topic "$TOPIC" --n 8 --tool send_email --args '{"to":"x@y.z","subject":"s"}' >/dev/null ||
        oq_fail "feed round $round"
    N=24
    oq_spawn "a$round" env ONCEQ_CRASH_AT="$point" "$ONCEQ_BIN" consumer "${COMMON[@]}" --worker-id "a$round"
    oq_wait_exit "a$round" 40
    rc=$?
    [[ $rc == 137 ]] || oq_fail "round $round ($point): worker exit $rc, expected 137 (SIGKILL at the crash point)"
    oq_log "round $round: $point fired; restarting"
    oq_spawn "b$round" "$ONCEQ_BIN" consumer "${COMMON[@]}" --worker-id "b$round"
    terminal() { q "SELECT count(*) FROM executions WHERE state IN ('COMMITTED','FAILED_FINAL','NEEDS_REVIEW')"; }
    for ((i = 0; i < 400; i++)); do
        [[ $(terminal) == "$N" ]] && break
        sleep 0.1
    done
    [[ $(terminal) == "$N" ]] || oq_fail "round $round ($point): $(terminal)/$N terminal: $(q "SELECT state, count(*) FROM executions GROUP BY 1")"
    [[ $(q "SELECT count(*) FROM effects") == "$N" ]] || oq_fail "round $round ($point): effects $(q 'SELECT count(*) FROM effects') != $N"
    [[ $(q "SELECT count(*) FROM executions WHERE state='COMMITTED'") == "$N" ]] || oq_fail "round $round: not all committed"
    bad=$(q "SELECT count(*) FROM audit s WHERE s.event='started' AND EXISTS (SELECT 1 FROM audit t
             WHERE t.call_id=s.call_id AND t.id < s.id AND t.event IN ('committed','failed_final','needs_review'))")
    [[ $bad == 0 ]] || oq_fail "round $round: started after terminal"
    oq_log "round $round ok: $(q "SELECT group_concat(event || '=' || n) FROM (SELECT event, count(*) n FROM audit GROUP BY 1)")"
    oq_kill "b$round" TERM
done
oq_pass "crash points: ${#POINTS[@]} rounds, each recovered with exactly one effect per call"
