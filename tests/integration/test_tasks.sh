#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Tasks (issue 19) through the whole pipeline (producer, relay, consumer --tools, `onceq
# downstream`, and a flaky refund service), effects counted in the downstream's ledger:
#   - a 3-step task whose third step is declined finally: steps 2 and 1 compensated once each,
#     in that order (ledger seq); the task `compensated`; the declined step has no effect;
#   - step arguments citing an earlier result reach the downstream with the right value and
#     type (a whole-string reference stays an integer, an embedded one is spliced as text);
#   - a compensation that fails twice then succeeds: three attempts of ONE call (one effect id),
#     one effect, the task `compensated`;
#   - a compensation that always fails: `needs_review` after its budget, with the reason;
#   - the same task submitted 20 times concurrently: one task, one effect per step;
#   - the same key with another body: 422 idempotency_conflict; a reference to a later step:
#     400 bad_reference, nothing written.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

FPORT=$(oq_free_port) || oq_fail "no free port"
FLOG=$T/flaky.log
: >"$FLOG"
oq_spawn flaky python3 "$ONCEQ_SRC/tests/integration/flaky_downstream.py" "$FPORT" 2 "$FLOG"
oq_wait_for 15 curl -sf "http://127.0.0.1:$FPORT/healthz" || oq_fail "flaky service not up"
rt_start_downstream
RT_VARIANTS='[
  {"base": true, "name": "ticket", "body": "args"},
  {"base": true, "name": "pay_decline", "headers": {"X-Downstream-Fault": "decline"}},
  {"base": true, "name": "refund"},
  {"base": true, "name": "refund_never", "headers": {"X-Downstream-Fault": "decline"}},
  {"name": "refund_flaky", "url": "http://127.0.0.1:'$FPORT'/refunds", "body": "args"},
  {"base": true, "name": "pay_drop", "headers": {"X-Downstream-Fault": "drop-after-commit"}}
]'
rt_tools "$T/tools.json"
PL_CONSUMER_X+=(--tools "$T/tools.json" --retry-base 100ms --lease 3s --recover-every 200ms)
pl_start 1

URL=http://127.0.0.1:$PORT
task_submit() { # KEY BODY -> "HTTP_STATUS BODY"
    curl -s -w '\n%{http_code}' -X POST "$URL/v1/tasks" -H "Idempotency-Key: $1" \
        -H 'Content-Type: application/json' -d "$2"
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
effects_of() { led "SELECT count(*) FROM payments WHERE idem_key='$(rt_eid "$1")'"; }
seq_of() { led "SELECT seq FROM payments WHERE idem_key='$(rt_eid "$1")'"; }

# --- a 3-step task, third step declined: 2 then 1 compensated, once each ------------------------
A='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":1999,"currency":"EUR"},
   "compensate":{"tool":"refund","args":{"amount":"{steps.charge.result.response.amount}"}}},
  {"name":"ticket","tool":"ticket",
   "args":{"amount":"{steps.charge.result.response.amount}","currency":"EUR",
           "reference":"re-{steps.charge.object_id}"},
   "compensate":{"tool":"refund","args":{"amount":1}}},
  {"name":"email","tool":"pay_decline","args":{"amount":5}}]}'
out=$(task_submit order-1 "$A")
[[ $(tail -1 <<<"$out") == 202 ]] || oq_fail "submit: $out"
head -n -1 <<<"$out" | jq -e '.task_id | startswith("t_")' >/dev/null || oq_fail "no task id: $out"
head -n -1 <<<"$out" | jq -e '.status == "running" and (.steps | length) == 3' >/dev/null ||
    oq_fail "202 body: $out"
task_wait order-1 compensated 60 || oq_fail "not compensated: $(task order-1)"
t=$(task order-1)
[[ $(jq -r '[.steps[].status] | join(",")' <<<"$t") == compensated,compensated,failed ]] ||
    oq_fail "step statuses: $t"
c1=$(jq -r .steps[0].call_id <<<"$t")
c2=$(jq -r .steps[1].call_id <<<"$t")
c3=$(jq -r .steps[2].call_id <<<"$t")
k1=$(jq -r .steps[0].compensation.call_id <<<"$t")
k2=$(jq -r .steps[1].compensation.call_id <<<"$t")
for c in "$c1" "$c2" "$k1" "$k2"; do
    [[ $(effects_of "$c") == 1 ]] || oq_fail "call $c: $(effects_of "$c") effects in the ledger"
done
[[ $(effects_of "$c3") == 0 ]] || oq_fail "the declined step left an effect"
(($(seq_of "$k2") < $(seq_of "$k1"))) || oq_fail "compensations not in reverse order"
(($(seq_of "$c2") < $(seq_of "$k2"))) || oq_fail "a compensation before its step"
oq_pass "3 steps, the third declined: ticket then charge compensated, one effect each"

# --- arguments citing an earlier result ---------------------------------------------------------
oid=$(jq -r .steps[0].object_id <<<"$t")
[[ $oid == pay_* ]] || oq_fail "charge object id $oid"
row=$(led "SELECT amount, reference, json_type(request, '\$.amount') FROM payments
           WHERE idem_key='$(rt_eid "$c2")'")
[[ $row == "1999|re-$oid|integer" ]] || oq_fail "ticket reached the downstream as '$row'"
[[ $(led "SELECT amount FROM payments WHERE idem_key='$(rt_eid "$k1")'") == 1999 ]] ||
    oq_fail "refund amount"
oq_pass "cited results reached the downstream: amount 1999 (an integer), reference re-$oid"

# --- a compensation that fails twice, then succeeds ---------------------------------------------
B='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":10},
   "compensate":{"tool":"refund_flaky","args":{"payment":"{steps.charge.object_id}"}}},
  {"name":"boom","tool":"pay_decline","args":{"amount":1}}]}'
task_submit order-2 "$B" >/dev/null
task_wait order-2 compensated 60 || oq_fail "flaky: $(task order-2)"
t=$(task order-2)
kb=$(jq -r .steps[0].compensation.call_id <<<"$t")
[[ $(grep -c "^$(rt_eid "$kb") " "$FLOG") == 3 ]] || oq_fail "flaky attempts: $(cat "$FLOG")"
[[ $(grep -c "^$(rt_eid "$kb") 201" "$FLOG") == 1 ]] || oq_fail "flaky effects: $(cat "$FLOG")"
[[ $(jq -r .steps[0].compensation.attempts <<<"$t") == 3 ]] || oq_fail "attempts: $t"
oq_pass "a compensation failing twice: retried as the same call, one effect, compensated"

# --- a compensation that always fails: needs_review ---------------------------------------------
C='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":11},
   "compensate":{"tool":"refund_never","args":{"amount":11}}},
  {"name":"boom","tool":"pay_decline","args":{"amount":1}}]}'
task_submit order-3 "$C" >/dev/null
task_wait order-3 needs_review 90 || oq_fail "never: $(task order-3)"
t=$(task order-3)
jq -e '.reason | contains("compensation of step charge failed 4 times")' <<<"$t" >/dev/null ||
    oq_fail "reason: $t"
[[ $(jq -r .steps[0].status <<<"$t") == needs_review ]] || oq_fail "step status: $t"
[[ $(effects_of "$(jq -r .steps[0].call_id <<<"$t")") == 1 ]] || oq_fail "charge effects"
oq_pass "a compensation that always fails: needs_review ($(jq -r .reason <<<"$t"))"

# --- the same task 20 times at once: one task ---------------------------------------------------
D='{"steps":[{"name":"a","tool":"pay","args":{"amount":7}},{"name":"b","tool":"pay","args":{"amount":"{steps.a.result.response.amount}"}}]}'
pids=()
for i in $(seq 1 20); do
    task_submit conc-1 "$D" >"$T/conc.$i" &
    pids+=($!)
done
wait "${pids[@]}" # (not a bare wait: the pipeline's processes are children too)
ids=$(for i in $(seq 1 20); do head -n -1 "$T/conc.$i" | jq -r .task_id; done | sort -u)
codes=$(for i in $(seq 1 20); do
    tail -1 "$T/conc.$i"
    echo
done | sort -u | tr '\n' ' ')
[[ $(wc -l <<<"$ids") == 1 && $ids == t_* ]] || oq_fail "20 submits gave task ids: $ids"
# 202 (new, or replayed in flight) or 200 (replayed once finished: the steps may be that fast)
[[ $codes == "202 " || $codes == "200 202 " ]] || oq_fail "status codes $codes"
[[ $(sqlite3 -cmd ".timeout 10000" "$PDB" "SELECT count(*) FROM tasks WHERE idem_key='conc-1'") == 1 ]] ||
    oq_fail "tasks rows"
task_wait conc-1 succeeded 60 || oq_fail "conc: $(task conc-1)"
t=$(task conc-1)
for k in 0 1; do
    [[ $(effects_of "$(jq -r .steps[$k].call_id <<<"$t")") == 1 ]] || oq_fail "conc step $k effects"
done
out=$(task_submit conc-1 "$D")
[[ $(tail -1 <<<"$out") == 200 ]] || oq_fail "replay of a finished task: $out"
oq_pass "20 concurrent submits: one task $ids, one effect per step; a replay once finished is 200"

# --- refusals -----------------------------------------------------------------------------------
out=$(task_submit conc-1 "$A")
[[ $(tail -1 <<<"$out") == 422 ]] && grep -q idempotency_conflict <<<"$out" || oq_fail "conflict: $out"
before=$(sqlite3 "$PDB" "SELECT count(*) FROM tasks")
out=$(task_submit bad-1 '{"steps":[{"name":"a","tool":"pay","args":{"x":"{steps.b.result}"}},{"name":"b","tool":"pay","args":{}}]}')
[[ $(tail -1 <<<"$out") == 400 ]] && grep -q bad_reference <<<"$out" || oq_fail "bad ref: $out"
out=$(task_submit bad-2 '{"steps":[{"name":"a","tool":"pay","args":{},"irreversible":true},{"name":"b","tool":"pay","args":{},"compensate":{"tool":"refund","args":{}}}]}')
[[ $(tail -1 <<<"$out") == 400 ]] && grep -q bad_task <<<"$out" || oq_fail "bad task: $out"
[[ $(sqlite3 "$PDB" "SELECT count(*) FROM tasks") == "$before" ]] || oq_fail "a refusal wrote"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/tasks/t_00000000000000000000000000000000") == 404 ]] ||
    oq_fail "unknown task not 404"
oq_pass "conflict 422, bad_reference and bad_task 400 with nothing written, unknown task 404"

# --- UNKNOWN in the middle step: reconciled before step 3 starts -----------------------------
E='{"steps":[
  {"name":"a","tool":"pay","args":{"amount":21}},
  {"name":"b","tool":"pay_drop","args":{"amount":22}},
  {"name":"c","tool":"pay","args":{"amount":"{steps.b.result.response.amount}"}}]}'
task_submit unk-1 "$E" >/dev/null
task_wait unk-1 succeeded 60 || oq_fail "unknown middle step: $(task unk-1)"
t=$(task unk-1)
cb=$(jq -r .steps[1].call_id <<<"$t")
cc=$(jq -r .steps[2].call_id <<<"$t")
path=$(rt_cq "SELECT group_concat(event, ',') FROM (SELECT event FROM audit WHERE call_id='$cb' ORDER BY id)")
[[ $path == started,unknown,reconciling,committed ]] || oq_fail "step b's consumer path: $path"
[[ $(effects_of "$cb") == 1 && $(effects_of "$cc") == 1 ]] || oq_fail "unknown: effects"
pq() { sqlite3 -cmd ".timeout 10000" "$PDB" "$1"; }
b_done=$(pq "SELECT ts FROM audit WHERE call_id='$cb' AND event='succeeded'")
c_made=$(pq "SELECT created_at FROM calls WHERE call_id='$cc'")
((c_made >= b_done)) || oq_fail "step c written ($c_made) before b settled ($b_done)"
[[ $(jq -r .steps[2].result.response.amount <<<"$t") == 22 ]] || oq_fail "step c amount"
oq_pass "UNKNOWN middle step (answer dropped): reconciled by lookup, step c written only after"

# --- the CLI: onceq call --task (waits for the end), submit --task, tasks list|show, inspect -----
printf '%s\n' "$D" >"$T/task-ok.json"
printf '%s\n' "$B" >"$T/task-undo.json"
"$ONCEQ_BIN" call --url "$URL" --key cli-1 --task "$T/task-ok.json" --timeout 60s \
    >"$T/cli1.out" 2>"$T/cli1.err"
rc=$?
[[ $rc == 0 ]] && jq -e '.status == "succeeded"' "$T/cli1.out" >/dev/null ||
    oq_fail "onceq call --task: exit $rc $(cat "$T/cli1.out" "$T/cli1.err")"
"$ONCEQ_BIN" call --url "$URL" --key cli-2 --task "$T/task-undo.json" --timeout 60s \
    >"$T/cli2.out" 2>"$T/cli2.err"
rc=$?
[[ $rc == 6 ]] && jq -e '.status == "compensated"' "$T/cli2.out" >/dev/null ||
    oq_fail "onceq call --task (compensated): exit $rc $(cat "$T/cli2.out" "$T/cli2.err")"
"$ONCEQ_BIN" submit --db "$PDB" --key cli-3 --task "$T/task-ok.json" >"$T/cli3.out" 2>"$T/cli3.err" ||
    oq_fail "onceq submit --task: $(cat "$T/cli3.err")"
grep -q 'outcome=new task_id=t_' "$T/cli3.err" || oq_fail "submit --task: $(cat "$T/cli3.err")"
task_wait cli-3 succeeded 60 || oq_fail "cli-3: $(task cli-3)"
"$ONCEQ_BIN" tasks list --db "$PDB" >"$T/list.out" || oq_fail "tasks list"
grep -E '^t_[0-9a-f]{32} +succeeded +2/2 +cli-1 ' "$T/list.out" >/dev/null ||
    oq_fail "tasks list: $(cat "$T/list.out")"
[[ $("$ONCEQ_BIN" tasks list --db "$PDB" --status needs_review --json | jq -r '.[].idem_key') == order-3 ]] ||
    oq_fail "tasks list --status needs_review"
"$ONCEQ_BIN" tasks show --db "$PDB" --key cli-2 | jq -e '.status == "compensated"' >/dev/null ||
    oq_fail "tasks show --key"
"$ONCEQ_BIN" tasks show --db "$PDB" t_00000000000000000000000000000000 2>/dev/null
[[ $? == 4 ]] || oq_fail "tasks show of an unknown task: not exit 4"
tid=$(jq -r .task_id "$T/cli2.out")
"$ONCEQ_BIN" inspect --db "$PDB" --consumer-db "$CDB" --json "$tid" >"$T/insp.json" ||
    oq_fail "inspect $tid"
jq -e '[.timeline[] | select(.role == "compensate" and .from == "consumer")] | length > 0' \
    "$T/insp.json" >/dev/null || oq_fail "inspect: no consumer rows of the compensation"
jq -e '[.timeline[] | .step] | unique == ["boom", "charge"]' "$T/insp.json" >/dev/null ||
    oq_fail "inspect: steps $(jq -c '[.timeline[].step] | unique' "$T/insp.json")"
"$ONCEQ_BIN" inspect --db "$PDB" "$tid" | grep -q 'task_compensation_retry' ||
    oq_fail "inspect (text): no compensation retry in the timeline"
oq_pass "CLI: call --task waits (0 succeeded, 6 compensated), submit --task, tasks list|show, inspect on a task"

# --- onceq verify: the task invariants hold on everything above ---------------------------------
pl_verify >"$T/verify.json"
jq -e '.by_kind | (.task_step_rerun + .task_comp_twice + .task_false_end + .task_not_terminal) == 0' \
    "$T/verify.json" >/dev/null || oq_fail "verify: $(cat "$T/verify.json")"
jq -e '.by_kind | (.dup_effect + .reexecuted + .terminal_left + .not_terminal) == 0' \
    "$T/verify.json" >/dev/null || oq_fail "verify: $(cat "$T/verify.json")"
oq_pass "onceq verify: no task invariant broken, every task terminal"

# --- metrics: tasks by status, compensations by how they ended ---------------------------------
curl -sf "$URL/metrics" >"$T/metrics.txt" || oq_fail "no /metrics"
mv_() { awk -v k="$1" '$1 == k {print $2}' "$T/metrics.txt"; }
[[ $(mv_ 'onceq_producer_tasks{status="needs_review"}') == 1 &&
    $(mv_ 'onceq_producer_tasks{status="running"}') == 0 &&
    $(mv_ 'onceq_producer_tasks{status="compensated"}') == $(sqlite3 "$PDB" "SELECT count(*) FROM tasks WHERE status='compensated'") &&
    $(mv_ 'onceq_producer_task_compensations{outcome="needs_review"}') == 1 ]] ||
    oq_fail "task metrics: $(grep -E 'onceq_producer_task' "$T/metrics.txt")"
oq_pass "metrics: onceq_producer_tasks{status}, onceq_producer_task_compensations{outcome}"
