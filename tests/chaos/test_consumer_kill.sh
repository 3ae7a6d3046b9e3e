#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Three consumers of one group share one effects.db. Mid-run, c2 dies by SIGKILL at the crash
# point consumer.after_commit_before_offset (its batch is committed in SQLite, its offsets are
# not) and c3 is killed with kill -9 from outside. The group rebalances onto c1, which gets the
# uncommitted messages again: the inbox must absorb them (duplicates skipped > 0) and no call
# may get a second effect. Then everything must be terminal, effects = charge + send_email
# calls, fail calls FAILED_FINAL, and no execution left STARTED/UNKNOWN.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"

FEED=$(oq_tool oq_consumer_feed)
N=${ONCEQ_CONSUMER_KILL_CALLS:-6000}
oq_start_broker --partitions 6
DB=$T/effects.db
q() { sqlite3 -cmd ".timeout 10000" "$DB" "$1"; }
COMMON=(--brokers "$BROKERS" --db "$DB" -X session.timeout.ms=6000 --lease 3s --batch 200)

oq_spawn c1 "$ONCEQ_BIN" consumer "${COMMON[@]}" --worker-id c1
oq_spawn c2 env ONCEQ_CRASH_AT=consumer.after_commit_before_offset@3 "$ONCEQ_BIN" consumer "${COMMON[@]}" --worker-id c2
oq_spawn c3 "$ONCEQ_BIN" consumer "${COMMON[@]}" --worker-id c3
assigned() { grep -q "assigned [1-9]" "$T/c1.log" && grep -q "assigned [1-9]" "$T/c2.log" && grep -q "assigned [1-9]" "$T/c3.log"; }
oq_wait_for 40 assigned || oq_log "not every consumer got partitions (rebalance still running); continuing"

"$FEED" --brokers "$BROKERS" --n "$N" --mix >"$T/feed.out" || oq_fail "feed: $(cat "$T/feed.out")"
oq_log "fed $N calls: $(cat "$T/feed.out")"
for ((i = 0; i < 300; i++)); do
    (($(q "SELECT count(*) FROM executions") > N / 5)) && break
    sleep 0.1
done
oq_kill c3 KILL
oq_log "killed c3 with SIGKILL at $(q "SELECT count(*) FROM executions") executions"

terminal() { q "SELECT count(*) FROM executions WHERE state IN ('COMMITTED','FAILED_FINAL','NEEDS_REVIEW')"; }
for ((i = 0; i < 1800; i++)); do
    [[ $(terminal) == "$N" ]] && break
    sleep 0.1
done
[[ $(terminal) == "$N" ]] || oq_fail "only $(terminal)/$N terminal: $(q "SELECT state, count(*) FROM executions GROUP BY 1")"
oq_alive c2 && oq_fail "c2 did not die at its crash point"
oq_wait_exit c2 1
c2rc=$?
oq_log "c2 exit code $c2rc (137 = SIGKILL at the crash point)"

dups=$(q "SELECT coalesce(sum(seen - 1), 0) FROM inbox")
dupeff=$(q "SELECT count(*) FROM (SELECT call_id FROM effects GROUP BY call_id HAVING count(*) > 1)")
eff=$(q "SELECT count(*) FROM effects")
want=$(q "SELECT count(*) FROM executions WHERE tool IN ('charge','send_email')")
oq_log "duplicates skipped=$dups duplicate effects=$dupeff effects=$eff expected=$want"
q "SELECT state, count(*) FROM executions GROUP BY 1" >&2
((dups > 0)) || oq_fail "no redelivery was observed (duplicates skipped = 0)"
[[ $dupeff == 0 ]] || oq_fail "$dupeff calls have more than one effect"
[[ $eff == "$want" && $want == $((N / 2)) ]] || oq_fail "effects $eff != charge+send_email calls $want"
[[ $(q "SELECT count(*) FROM executions") == "$N" ]] || oq_fail "executions != $N"
[[ $(q "SELECT count(*) FROM executions WHERE tool='fail' AND state='FAILED_FINAL'") == $((N / 4)) ]] ||
    oq_fail "fail calls not all FAILED_FINAL"
[[ $(q "SELECT count(*) FROM executions WHERE tool<>'fail' AND state<>'COMMITTED'") == 0 ]] ||
    oq_fail "a succeeding call did not commit"
# a terminal state is never left: no 'started' after a terminal event of the same attempt
bad=$(q "SELECT count(*) FROM audit s WHERE s.event='started' AND EXISTS (SELECT 1 FROM audit t
         WHERE t.call_id=s.call_id AND t.id < s.id AND t.event IN ('committed','failed_final','needs_review'))")
[[ $bad == 0 ]] || oq_fail "$bad executions started again after a terminal state"
oq_kill c1 TERM
oq_pass "kill -9 of 2 of 3 consumers: $N calls terminal, $dups duplicates skipped, 0 duplicate effects"
