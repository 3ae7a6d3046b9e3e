#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Tasks, an operator's hand (issue 19 items 4 and 5), through the whole pipeline (producer,
# relay, consumer --tools, `onceq downstream`), effects counted in the downstream's ledger:
#   - approval: a step with "approval": true waits in awaiting_approval, no call written; a
#     stale --fence is refused (exit 9), nothing changed; `review resolve --as approve` runs the
#     step once; the decision is audited with the operator's name; approving again: exit 2;
#   - rejection: the waiting step never runs (no call, no effect), the steps before it are
#     compensated in reverse order, once each;
#   - review of a task in needs_review (a compensation past its budget): `review show` prints
#     the fence and the timeline; retry-compensation makes a new attempt of the same call with a
#     fresh budget (a new episode: the old fence is refused after it); `--as compensated`
#     settles it, audited; onceq verify holds;
#   - the task metrics on /metrics and in onceq stats --json: tasks by status (awaiting_approval
#     too), compensation success rate, steps run again (0), tasks that needed an operator and
#     the manual recovery rate of calls and tasks.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
RT_VARIANTS='[
  {"base": true, "name": "pay_decline", "headers": {"X-Downstream-Fault": "decline"}},
  {"base": true, "name": "refund"},
  {"base": true, "name": "refund_never", "headers": {"X-Downstream-Fault": "decline"}}
]'
rt_tools "$T/tools.json"
PL_CONSUMER_X+=(--tools "$T/tools.json" --retry-base 100ms --lease 3s --recover-every 200ms)
pl_start 1

URL=http://127.0.0.1:$PORT
task_submit() { # KEY BODY
    curl -s -X POST "$URL/v1/tasks" -H "Idempotency-Key: $1" -H 'Content-Type: application/json' \
        -d "$2"
}
task() { curl -s "$URL/v1/tasks/by-key/$1"; }
task_wait() { # KEY STATUS SECONDS
    local i
    for ((i = 0; i < $3 * 10; i++)); do
        [[ $(task "$1" | jq -r .status) == "$2" ]] && return 0
        sleep 0.1
    done
    return 1
}
led() { sqlite3 -cmd ".timeout 10000" "$DDB" "$1"; }
pq() { sqlite3 -cmd ".timeout 10000" "$PDB" "$1"; }
effects_of() { led "SELECT count(*) FROM payments WHERE idem_key='$(rt_eid "$1")'"; }
seq_of() { led "SELECT seq FROM payments WHERE idem_key='$(rt_eid "$1")'"; }
calls_of_key() { pq "SELECT count(*) FROM calls WHERE idem_key='$1'"; }
review() { "$ONCEQ_BIN" review "$@" --producer-db "$PDB"; }

# --- approval: approve -> the irreversible step runs once ---------------------------------------
A='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":30},
   "compensate":{"tool":"refund","args":{"amount":30}}},
  {"name":"ship","tool":"pay","args":{"amount":31},"approval":true,"irreversible":true}]}'
task_submit appr-1 "$A" >/dev/null
task_wait appr-1 awaiting_approval 60 || oq_fail "not awaiting approval: $(task appr-1)"
t=$(task appr-1)
tid=$(jq -r .task_id <<<"$t")
fence=$(jq -r .fence <<<"$t")
[[ $(jq -r '[.steps[].status] | join(",")' <<<"$t") == succeeded,pending ]] || oq_fail "steps: $t"
jq -e '.steps[1].approval == true and (.reason | contains("approval"))' <<<"$t" >/dev/null ||
    oq_fail "awaiting: $t"
[[ $(calls_of_key appr-1/ship) == 0 ]] || oq_fail "the step waiting for approval has a call"
metric() { curl -sf "$URL/metrics" | awk -v k="$1" '$1 == k {print $2}'; }
[[ $(metric 'onceq_producer_tasks{status="awaiting_approval"}') == 1 ]] ||
    oq_fail "metrics: $(curl -s "$URL/metrics" | grep onceq_producer_tasks)"
review show "$tid" >"$T/show1.out" || oq_fail "review show $tid"
grep -q "status    awaiting_approval (fence $fence)" "$T/show1.out" ||
    oq_fail "review show: $(cat "$T/show1.out")"
before=$(pq "SELECT status, review_fence, updated_at FROM tasks WHERE task_id='$tid'")
review resolve "$tid" --as approve --fence $((fence + 1)) --note "looks fine" --by ada \
    >/dev/null 2>"$T/stale.err"
rc=$?
[[ $rc == 9 ]] && grep -q review_moved "$T/stale.err" ||
    oq_fail "stale fence: exit $rc $(cat "$T/stale.err")"
[[ $(pq "SELECT status, review_fence, updated_at FROM tasks WHERE task_id='$tid'") == "$before" &&
    $(calls_of_key appr-1/ship) == 0 &&
    $(pq "SELECT count(*) FROM audit WHERE call_id='$tid'") == 0 ]] ||
    oq_fail "a stale approval changed something"
review resolve "$tid" --as approve --fence "$fence" --note "customer confirmed" --by ada \
    >"$T/appr.out" 2>"$T/appr.err" || oq_fail "approve: $(cat "$T/appr.err")"
task_wait appr-1 succeeded 60 || oq_fail "approved task: $(task appr-1)"
t=$(task appr-1)
[[ $(effects_of "$(jq -r .steps[1].call_id <<<"$t")") == 1 ]] || oq_fail "ship effects"
[[ $(effects_of "$(jq -r .steps[0].call_id <<<"$t")") == 1 ]] || oq_fail "charge effects"
aud=$(pq "SELECT json_extract(detail,'\$.by') || ' ' || json_extract(detail,'\$.as') || ' ' ||
          json_extract(detail,'\$.step') FROM audit WHERE call_id='$tid' AND event='task_review'")
[[ $aud == "ada approve ship" ]] || oq_fail "audit: $(pq "SELECT * FROM audit WHERE call_id='$tid'")"
review resolve "$tid" --as approve --fence "$fence" --note again --by bob >/dev/null 2>&1
[[ $? == 2 ]] || oq_fail "approving a running/finished task: not exit 2"
[[ $(calls_of_key appr-1/ship) == 1 ]] || oq_fail "ship calls"
oq_pass "approval: waits with no call; stale fence exit 9, nothing changed; approve runs it once, audited"

# --- rejection: compensations in reverse, the step never runs -----------------------------------
B='{"steps":[
  {"name":"a","tool":"pay","args":{"amount":40},"compensate":{"tool":"refund","args":{"amount":40}}},
  {"name":"b","tool":"pay","args":{"amount":41},"compensate":{"tool":"refund","args":{"amount":41}}},
  {"name":"c","tool":"pay","args":{"amount":42},"approval":true,"irreversible":true}]}'
task_submit rej-1 "$B" >/dev/null
task_wait rej-1 awaiting_approval 60 || oq_fail "rej-1 not awaiting: $(task rej-1)"
t=$(task rej-1)
tid=$(jq -r .task_id <<<"$t")
review resolve "$tid" --as reject --fence "$(jq -r .fence <<<"$t")" --note "fraud suspected" \
    --by ada >/dev/null 2>"$T/rej.err" || oq_fail "reject: $(cat "$T/rej.err")"
task_wait rej-1 compensated 60 || oq_fail "rejected task: $(task rej-1)"
t=$(task rej-1)
[[ $(jq -r '[.steps[].status] | join(",")' <<<"$t") == compensated,compensated,skipped ]] ||
    oq_fail "rejected steps: $t"
jq -e '.reason | contains("rejected by ada")' <<<"$t" >/dev/null || oq_fail "reason: $t"
[[ $(calls_of_key rej-1/c) == 0 ]] && jq -e '.steps[2].call_id == null' <<<"$t" >/dev/null ||
    oq_fail "the rejected step has a call"
[[ $(led "SELECT count(*) FROM payments WHERE amount=42") == 0 ]] || oq_fail "the rejected step ran"
ka=$(jq -r .steps[0].compensation.call_id <<<"$t")
kb=$(jq -r .steps[1].compensation.call_id <<<"$t")
[[ $(effects_of "$ka") == 1 && $(effects_of "$kb") == 1 ]] || oq_fail "compensation effects"
(($(seq_of "$kb") < $(seq_of "$ka"))) || oq_fail "compensations not in reverse order"
oq_pass "rejection: step c never ran, b then a compensated once each"

# --- review of a task in needs_review: retry-compensation, then compensated ---------------------
C='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":50},
   "compensate":{"tool":"refund_never","args":{"amount":50}}},
  {"name":"boom","tool":"pay_decline","args":{"amount":1}}]}'
task_submit rev-1 "$C" >/dev/null
task_wait rev-1 needs_review 90 || oq_fail "rev-1: $(task rev-1)"
t=$(task rev-1)
tid=$(jq -r .task_id <<<"$t")
f1=$(jq -r .fence <<<"$t")
kc=$(jq -r .steps[0].compensation.call_id <<<"$t")
review show "$tid" >"$T/show2.out" || oq_fail "review show $tid"
grep -q "status    needs_review (fence $f1)" "$T/show2.out" &&
    grep -q "retry-compensation" "$T/show2.out" && grep -q compensate "$T/show2.out" ||
    oq_fail "review show: $(cat "$T/show2.out")"
review resolve "$tid" --as compensated --fence $((f1 - 1)) --note x --by ada >/dev/null 2>&1
[[ $? == 9 && $(task rev-1 | jq -r .status) == needs_review ]] || oq_fail "stale fence on review"
review resolve "$tid" --as approve --fence "$f1" --note x --by ada >/dev/null 2>&1
[[ $? == 2 ]] || oq_fail "approve of a task in needs_review: not exit 2"
tries=$(pq "SELECT count(*) FROM audit WHERE call_id='$kc' AND event='task_compensation_retry'")
review resolve "$tid" --as retry-compensation --fence "$f1" --note "provider back" --by ada \
    >/dev/null 2>"$T/retry.err" || oq_fail "retry-compensation: $(cat "$T/retry.err")"
t=$(task rev-1)
[[ $(jq -r .status <<<"$t") == compensating || $(jq -r .status <<<"$t") == needs_review ]] ||
    oq_fail "after retry: $t"
# refund_never declines again: a fresh budget of 4 attempts spent, needs_review once more
for ((i = 0; i < 900; i++)); do
    t=$(task rev-1)
    [[ $(jq -r .status <<<"$t") == needs_review && $(jq -r .fence <<<"$t") -gt $f1 ]] && break
    sleep 0.1
done
f2=$(jq -r .fence <<<"$t")
((f2 > f1)) || oq_fail "no new episode after the retry: $t"
n=$(pq "SELECT count(*) FROM audit WHERE call_id='$kc' AND event='task_compensation_retry'")
[[ $n == $((tries + 4)) ]] ||
    oq_fail "retry attempts: $(pq "SELECT event, detail FROM audit WHERE call_id='$kc'")"
[[ $(pq "SELECT count(*) FROM calls WHERE idem_key='rev-1/charge/compensate'") == 1 ]] ||
    oq_fail "the retry wrote another call"
review resolve "$tid" --as compensated --fence "$f1" --note "old look" --by bob >/dev/null 2>&1
[[ $? == 9 ]] || oq_fail "a decision on the first episode was not refused"
review resolve "$tid" --as compensated --fence "$f2" --note "refunded by hand, ticket 77" \
    --by ada >/dev/null 2>"$T/res.err" || oq_fail "resolve compensated: $(cat "$T/res.err")"
t=$(task rev-1)
[[ $(jq -r .status <<<"$t") == compensated ]] &&
    jq -e '.reason | contains("resolved compensated by ada")' <<<"$t" >/dev/null ||
    oq_fail "resolved: $t"
aud=$(pq "SELECT group_concat(json_extract(detail,'\$.as'), ',') FROM audit WHERE call_id='$tid'")
[[ $aud == retry-compensation,compensated ]] || oq_fail "task audit: $(pq "SELECT * FROM audit WHERE call_id='$tid'")"
review show "$tid" --json | jq -e '.status == "compensated" and (.decisions | length) == 2' \
    >/dev/null || oq_fail "review show --json"
oq_pass "task review: stale fence 9, retry-compensation (4 more attempts, one call), compensated by ada"

pl_verify >"$T/verify.json"
jq -e '.by_kind | (.task_step_rerun + .task_comp_twice + .task_false_end + .task_not_terminal) == 0' \
    "$T/verify.json" >/dev/null || oq_fail "verify: $(cat "$T/verify.json")"
oq_pass "onceq verify: no task invariant broken"

# --- the task metrics: /metrics and onceq stats --json ------------------------------------------
# three tasks: appr-1 succeeded, rej-1 compensated (2 compensations), rev-1 compensated by an
# operator (its compensation ended needs_review): 2/3 compensations ok, 1/3 tasks needed one
curl -sf "$URL/metrics" >"$T/metrics.txt" || oq_fail "no /metrics"
mv_() { awk -v k="$1" '$1 == k {print $2}' "$T/metrics.txt"; }
near() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a - b < 0.001 && b - a < 0.001) }'; }
[[ $(mv_ 'onceq_producer_tasks{status="awaiting_approval"}') == 0 &&
    $(mv_ onceq_producer_task_steps_rerun) == 0 && $(mv_ onceq_producer_tasks_needed_operator) == 1 ]] &&
    near "$(mv_ onceq_producer_task_compensation_success_ratio)" 0.6667 &&
    near "$(mv_ onceq_producer_tasks_manual_recovery_ratio)" 0.3333 ||
    oq_fail "task metrics: $(grep -E 'onceq_producer_task' "$T/metrics.txt")"
"$ONCEQ_BIN" stats --json --db "$PDB" --consumer-db "$CDB" >"$T/stats.json" || oq_fail "stats"
jq -e '.tasks | .total == 3 and .by_status.compensated == 2 and .by_status.succeeded == 1
       and .compensations == {"compensated": 2, "needs_review": 1} and .steps_rerun == 0
       and .needed_operator == 1' "$T/stats.json" >/dev/null || oq_fail "stats: $(cat "$T/stats.json")"
jq -e '.manual_recovery | .tasks_needed_operator == 1 and .all > 3
       and (.rate - ((.calls_review + 1) / .all) | fabs) < 0.0001' "$T/stats.json" >/dev/null ||
    oq_fail "manual recovery: $(jq -c .calls "$T/stats.json")"
near "$(jq .tasks.compensation_success_rate "$T/stats.json")" 0.6667 ||
    oq_fail "compensation success rate: $(jq -c .tasks "$T/stats.json")"
oq_pass "task metrics: by status, compensation success 2/3, 0 steps re-run, manual recovery 1/3 tasks"
