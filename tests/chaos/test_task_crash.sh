#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Tasks under kill -9 (issue 19): a load of 3-step tasks (500, ONCEQ_TASK_CRASH_N) against
# `onceq downstream`, every fifth declined at its third step (so steps 2 and 1 are
# compensated), submitted in six batches; after each batch the producer or the consumer is
# SIGKILLed at a named crash point while the batch runs, and restarted at once:
#   producer.task_after_step_written          inside the transaction writing a step's call
#   producer.task_after_compensation_written  inside the one writing a compensation
#   producer.task_after_checkpoint            after a result's checkpoint, before the commit
#   producer.after_commit_before_reply        between steps: right after a group commit
#   consumer.after_request_sent_before_outcome  inside a step: the request left, no outcome
#   consumer.after_outcome_commit_before_offset inside a step: outcome committed, offset not
# After the drain: every task terminal with the expected end (succeeded, or compensated for
# the declined ones); in the downstream's ledger, where every step and compensation carries a
# reference of its own (t<task>-s<step>, t<task>-u<step>), no reference twice, none missing,
# no declined step's; every step and compensation written once (one task_step audit row per
# call); onceq verify finds no task invariant broken. Negative control: a resume that
# restarts from step 1 with new keys (what an orchestrator without derived keys does) is
# replayed for a few tasks, and the same ledger check must see the duplicates.
# ctest-labels: long
# ctest-cost: 120
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

N=${ONCEQ_TASK_CRASH_N:-500}
rt_start_downstream
RT_VARIANTS='[
  {"base": true, "name": "step", "body": "args"},
  {"base": true, "name": "step_decline", "body": "args",
   "headers": {"X-Downstream-Fault": "decline"}}
]'
rt_tools "$T/tools.json"
PL_CONSUMER_X+=(--tools "$T/tools.json" --retry-base 100ms --lease 3s --recover-every 200ms)
# a restarted producer rejoins its results group fast (the mock cluster waits session - 1 s)
PL_PRODUCER_X=(-X session.timeout.ms=6000)
pl_start 1
URL=http://127.0.0.1:$PORT
led() { sqlite3 -cmd ".timeout 10000" "$DDB" "$1"; }
pq() { sqlite3 -cmd ".timeout 10000" "$PDB" "$1"; }

body() { # task i: 3 steps, each with a reference of its own; every 5th declined at step 3
    local i=$1 last=step
    ((i % 5 == 0)) && last=step_decline
    printf '{"steps":[
 {"name":"s1","tool":"step","args":{"amount":%d,"reference":"t%d-s1"},
  "compensate":{"tool":"step","args":{"amount":"{steps.s1.result.response.amount}","reference":"t%d-u1"}}},
 {"name":"s2","tool":"step","args":{"amount":2,"reference":"t%d-s2 after {steps.s1.object_id}"},
  "compensate":{"tool":"step","args":{"amount":2,"reference":"t%d-u2"}}},
 {"name":"s3","tool":"%s","args":{"amount":3,"reference":"t%d-s3"}}]}' \
        $((100 + i)) "$i" "$i" "$i" "$i" "$last" "$i"
}
for ((i = 1; i <= N; i++)); do body "$i" >"$T/b.$i"; done
SUBMITTED=0
submit_batch() { # the next N/6 tasks (the last batch takes the rest), 8 clients at once
    local from=$((SUBMITTED + 1)) to=$((SUBMITTED + N / 6))
    if ((to > N)) || [[ $1 == last ]]; then to=$N; fi
    seq "$from" "$to" | xargs -P 8 -I{} curl -s -o /dev/null -w '%{http_code}\n' -X POST \
        "$URL/v1/tasks" -H 'Idempotency-Key: load-{}' --data-binary @"$T/b.{}" >>"$T/codes"
    SUBMITTED=$to
}

open_tasks() { pq "SELECT count(*) FROM tasks WHERE status IN ('running','compensating')"; }

# crash_round WHO POINT N: respawn WHO armed to die at the N-th POINT, wait for the kill (or
# for the load to end first), respawn it clean.
crash_round() {
    local who=$1 point=$2 nth=$3 rc
    if [[ $who == producer ]]; then
        oq_kill producer TERM
        pl_spawn_producer ONCEQ_CRASH_AT="$point@$nth"
    else
        oq_kill consumer-1 TERM
        pl_spawn_consumer 1 ONCEQ_CRASH_AT="$point@$nth"
    fi
    local name=$who
    [[ $who == consumer ]] && name=consumer-1
    oq_wait_exit "$name" 90
    rc=$?
    if [[ $rc == 137 ]]; then
        oq_log "crash: $name killed at $point (#$nth), $(open_tasks) tasks open"
        FIRED=$((FIRED + 1))
    elif [[ $rc == 124 ]]; then
        oq_log "crash: $point not reached in 90 s ($(open_tasks) open): stopping it"
        oq_kill "$name" TERM
    else
        oq_fail "$name exited $rc (not the crash point's SIGKILL)"
    fi
    if [[ $who == producer ]]; then
        pl_spawn_producer
        pl_wait_healthy 30
    else
        pl_spawn_consumer 1
    fi
}
FIRED=0
# each round: a sixth of the load submitted, then a process killed while it runs
submit_batch 1 && crash_round producer producer.task_after_step_written 20
submit_batch 2 && crash_round consumer consumer.after_request_sent_before_outcome 20
submit_batch 3 && crash_round producer producer.task_after_checkpoint 20
submit_batch 4 && crash_round consumer consumer.after_outcome_commit_before_offset 10
submit_batch 5 && crash_round producer producer.after_commit_before_reply 10
submit_batch last && crash_round producer producer.task_after_compensation_written 3
[[ $(sort -u "$T/codes" | tr '\n' ' ') == "202 " ]] || oq_fail "submits: $(sort "$T/codes" | uniq -c)"
[[ $(pq "SELECT count(*) FROM tasks") == "$N" ]] || oq_fail "tasks rows"
((FIRED == 6)) || oq_fail "only $FIRED of 6 crash points fired"

# --- drain ------------------------------------------------------------------------------------
for ((i = 0; i < 3000; i++)); do
    [[ $(open_tasks) == 0 ]] && break
    sleep 0.1
done
[[ $(open_tasks) == 0 ]] || oq_fail "$(open_tasks) tasks not terminal after the drain: $(pq "SELECT task_id, status, reason FROM tasks WHERE status IN ('running','compensating') LIMIT 3")"
want_c=$((N / 5))
[[ $(pq "SELECT count(*) FROM tasks WHERE status='succeeded'") == $((N - want_c)) &&
    $(pq "SELECT count(*) FROM tasks WHERE status='compensated'") == "$want_c" ]] ||
    oq_fail "task ends: $(pq "SELECT status, count(*) FROM tasks GROUP BY status")"
oq_pass "after $FIRED kills: all $N tasks terminal ($((N - want_c)) succeeded, $want_c compensated)"

# --- the ledger: each step and compensation once --------------------------------------------------
ledger_dups() { led "SELECT count(*) FROM (SELECT reference FROM payments GROUP BY reference HAVING count(*) > 1)"; }
[[ $(ledger_dups) == 0 ]] || oq_fail "references twice in the ledger: $(led "SELECT reference, count(*) FROM payments GROUP BY reference HAVING count(*) > 1 LIMIT 5")"
# (s2's reference carries s1's object id after it: count by prefix)
want=$(((N - want_c) * 3 + want_c * 4))
[[ $(led "SELECT count(*) FROM payments") == "$want" ]] ||
    oq_fail "ledger rows $(led "SELECT count(*) FROM payments"), want $want"
[[ $(led "SELECT count(*) FROM payments WHERE reference LIKE 't%-s3' AND CAST(substr(reference, 2, instr(reference, '-') - 2) AS INTEGER) % 5 = 0") == 0 ]] ||
    oq_fail "a declined step has an effect"
[[ $(pq "SELECT count(*) FROM (SELECT call_id FROM audit WHERE event='task_step' GROUP BY call_id HAVING count(*) > 1)") == 0 ]] ||
    oq_fail "a step or compensation written twice"
# calls: 3 steps per task (a declined one too) + 2 compensations per compensated task
want_calls=$((N * 3 + want_c * 2))
[[ $(pq "SELECT count(*) FROM task_calls") == "$want_calls" ]] ||
    oq_fail "task_calls $(pq "SELECT count(*) FROM task_calls"), want $want_calls"
pl_verify --downstream-db "$DDB" >"$T/verify.json"
jq -e '.by_kind | (.task_step_rerun + .task_comp_twice + .task_false_end + .task_not_terminal
        + .dup_effect + .downstream_dup + .reexecuted + .terminal_left) == 0' "$T/verify.json" \
    >/dev/null || oq_fail "verify: $(cat "$T/verify.json")"
oq_pass "ledger: $want effects, each step and compensation once, no declined step; verify clean"

# --- negative control: a resume from step 1 with new keys ----------------------------------------
for i in 1 2 3 4 6; do
    curl -s -o /dev/null -X POST "$URL/v1/tool-calls" -H "Idempotency-Key: naive-resume-$i" \
        -d "{\"tool\":\"step\",\"args\":{\"amount\":$((100 + i)),\"reference\":\"t$i-s1\"}}"
done
for ((i = 0; i < 600; i++)); do
    (($(ledger_dups) >= 5)) && break
    sleep 0.1
done
(($(ledger_dups) >= 5)) || oq_fail "negative control: a restart from step 1 left $(ledger_dups) duplicates (the check is blind)"
oq_pass "negative control: a resume from step 1 with new keys shows $(ledger_dups) duplicated steps"
