#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 90
# Tasks on a PostgreSQL producer (issue 19): producer and relay on ONCEQ_TEST_PG_URL (schema
# onceq, task rows in onceq.tasks / task_steps / task_calls), one consumer (SQLite) with HTTP
# tools against `onceq downstream`, effects counted in the downstream's ledger:
#   - a 3-step task runs to succeeded, each step's effect once in the ledger, a step's
#     arguments citing an earlier result;
#   - a task whose third step is declined: steps 2 and 1 compensated once each, in reverse
#     (ledger seq), the task compensated, the declined step without effect;
#   - a compensation failing twice then succeeding: retried (the due rows of
#     onceq.task_steps) as the same call, attempt 3, one effect;
#   - `onceq call --task` submits and waits for the end (exit 0, succeeded);
#   - a step with "approval": true waits in awaiting_approval with no call; approved over HTTP
#     (POST /v1/tasks/{id}/resolve) it runs once, the decision audited on PostgreSQL;
#   - the operator's CLI on the same database: onceq tasks list / show, onceq inspect t_...,
#     onceq review show t_...; a reject by `onceq review resolve` (a stale fence: exit 9)
#     skips the waiting step (no call) and the charge before it is compensated once;
#   - the same key again: a replay (200, Idempotent-Replayed, the same task); with other steps:
#     422 idempotency_conflict, nothing written; GET by id and by key, the tasks in /stats;
#   - onceq verify (its task checks on the PostgreSQL snapshot) is clean.
# Skipped (77) without ONCEQ_TEST_PG_URL.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_require_pg
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

DBURL=$(oq_pg_fresh_db onceq_it_tasks)
pgq() { psql -XAtq "$DBURL" -c "$1"; }

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
  {"name": "refund_flaky", "url": "http://127.0.0.1:'$FPORT'/refunds", "body": "args"}
]'
rt_tools "$T/tools.json"
PDB=$DBURL CDB=$T/effects.db PORT=$(oq_free_port)
export PDB CDB PORT
PL_CONSUMER_X+=(--tools "$T/tools.json" --retry-base 100ms --lease 3s --recover-every 200ms)
oq_start_broker
pl_spawn_producer
pl_wait_healthy 30
pl_spawn_relay
pl_spawn_consumer 1
oq_wait_for 30 test -s "$CDB" || oq_fail "no consumer database at $CDB"

URL=http://127.0.0.1:$PORT
task_submit() { # KEY BODY -> BODY, then the HTTP status on the last line
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

# --- a 3-step task to succeeded -----------------------------------------------------------------
S='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":1999,"currency":"EUR"},
   "compensate":{"tool":"refund","args":{"amount":"{steps.charge.result.response.amount}"}}},
  {"name":"ticket","tool":"ticket",
   "args":{"amount":"{steps.charge.result.response.amount}","currency":"EUR",
           "reference":"re-{steps.charge.object_id}"}},
  {"name":"receipt","tool":"pay","args":{"amount":3}}]}'
out=$(task_submit ok-1 "$S")
[[ $(tail -1 <<<"$out") == 202 ]] || oq_fail "submit on PostgreSQL: $out"
head -n -1 <<<"$out" | jq -e '(.task_id | startswith("t_")) and .status == "running" and
    (.steps | length) == 3' >/dev/null || oq_fail "202 body: $out"
task_wait ok-1 succeeded 60 || oq_fail "not succeeded: $(task ok-1)"
t=$(task ok-1)
tid=$(jq -r .task_id <<<"$t")
[[ $(jq -r '[.steps[].status] | join(",")' <<<"$t") == succeeded,succeeded,succeeded ]] ||
    oq_fail "step statuses: $t"
for k in 0 1 2; do
    c=$(jq -r ".steps[$k].call_id" <<<"$t")
    [[ $(effects_of "$c") == 1 ]] || oq_fail "step $k (call $c): $(effects_of "$c") effects"
    [[ $(pgq "SELECT state FROM onceq.calls WHERE call_id='$c'") == succeeded ]] ||
        oq_fail "step $k's call on PostgreSQL"
done
oid=$(jq -r .steps[0].object_id <<<"$t")
row=$(led "SELECT amount, reference FROM payments WHERE idem_key='$(rt_eid "$(jq -r .steps[1].call_id <<<"$t")")'")
[[ $row == "1999|re-$oid" ]] || oq_fail "ticket reached the downstream as '$row'"
[[ $(pgq "SELECT status || ' ' || (SELECT count(*) FROM onceq.task_steps s WHERE
        s.task_id=t.task_id) || ' ' || (SELECT count(*) FROM onceq.task_calls c WHERE
        c.task_id=t.task_id) FROM onceq.tasks t WHERE idem_key='ok-1'") == "succeeded 3 3" ]] ||
    oq_fail "task rows on PostgreSQL"
code=$(curl -s -o "$T/byid.json" -w '%{http_code}' "$URL/v1/tasks/$tid")
[[ $code == 200 ]] && jq -e --arg k ok-1 '.idem_key == $k and .status == "succeeded"' \
    "$T/byid.json" >/dev/null || oq_fail "GET by id: $code $(cat "$T/byid.json")"
oq_pass "PostgreSQL: a 3-step task succeeded, one effect per step, a cited result (re-$oid)"

# --- the same key: a replay; other steps: 422 ---------------------------------------------------
hdr=$(curl -s -D - -o "$T/replay.json" -X POST "$URL/v1/tasks" -H 'Idempotency-Key: ok-1' \
    -H 'Content-Type: application/json' -d "$S")
grep -q '^HTTP/1.1 200' <<<"$hdr" && grep -qi '^Idempotent-Replayed: true' <<<"$hdr" ||
    oq_fail "replay: $hdr $(cat "$T/replay.json")"
jq -e --arg id "$tid" '.task_id == $id and .status == "succeeded"' "$T/replay.json" >/dev/null ||
    oq_fail "replay body: $(cat "$T/replay.json")"
ncalls=$(pgq "SELECT count(*) FROM onceq.calls")
out=$(task_submit ok-1 '{"steps":[{"name":"charge","tool":"pay","args":{"amount":5}}]}')
[[ $(tail -1 <<<"$out") == 422 ]] && head -n -1 <<<"$out" |
    jq -e '.error.code == "idempotency_conflict"' >/dev/null || oq_fail "other steps: $out"
[[ $(pgq "SELECT count(*) FROM onceq.tasks WHERE idem_key='ok-1'") == 1 &&
    $(pgq "SELECT count(*) FROM onceq.calls") == "$ncalls" ]] || oq_fail "the conflict wrote"
oq_pass "PostgreSQL: the same key again is a replay (200, same task); other steps 422, nothing written"

# --- the third step declined: 2 then 1 compensated, once each -----------------------------------
A='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":1200},
   "compensate":{"tool":"refund","args":{"amount":"{steps.charge.result.response.amount}"}}},
  {"name":"ticket","tool":"ticket","args":{"amount":7,"currency":"EUR","reference":"r-1"},
   "compensate":{"tool":"refund","args":{"amount":7}}},
  {"name":"email","tool":"pay_decline","args":{"amount":5}}]}'
out=$(task_submit comp-1 "$A")
[[ $(tail -1 <<<"$out") == 202 ]] || oq_fail "submit: $out"
task_wait comp-1 compensated 60 || oq_fail "not compensated: $(task comp-1)"
t=$(task comp-1)
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
[[ $(pgq "SELECT count(*) FROM onceq.task_calls WHERE role='compensate' AND task_id='$(jq -r .task_id <<<"$t")'") == 2 ]] ||
    oq_fail "compensation links on PostgreSQL"
oq_pass "PostgreSQL: the third step declined: ticket then charge compensated, one effect each"

# --- a compensation that fails twice, then succeeds: retried (due rows on PostgreSQL) --------
B='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":10},
   "compensate":{"tool":"refund_flaky","args":{"payment":"{steps.charge.object_id}"}}},
  {"name":"boom","tool":"pay_decline","args":{"amount":1}}]}'
task_submit flaky-1 "$B" >/dev/null
task_wait flaky-1 compensated 90 || oq_fail "flaky: $(task flaky-1)"
t=$(task flaky-1)
kb=$(jq -r .steps[0].compensation.call_id <<<"$t")
[[ $(grep -c "^$(rt_eid "$kb") " "$FLOG") == 3 ]] || oq_fail "flaky attempts: $(cat "$FLOG")"
[[ $(grep -c "^$(rt_eid "$kb") 201" "$FLOG") == 1 ]] || oq_fail "flaky effects: $(cat "$FLOG")"
[[ $(jq -r .steps[0].compensation.attempts <<<"$t") == 3 ]] || oq_fail "attempts: $t"
[[ $(pgq "SELECT attempt FROM onceq.calls WHERE call_id='$kb'") == 3 ]] ||
    oq_fail "the compensation is not one call at attempt 3"
oq_pass "PostgreSQL: a compensation failing twice: retried as the same call (attempt 3), one effect"

# --- onceq call --task: submit, wait for the end -------------------------------------------------
printf '%s' '{"steps":[{"name":"a","tool":"pay","args":{"amount":4}},{"name":"b","tool":"pay","args":{"amount":"{steps.a.result.response.amount}"}}]}' >"$T/task.json"
"$ONCEQ_BIN" call --url "$URL" --key cli-1 --task "$T/task.json" >"$T/call.json" ||
    oq_fail "onceq call --task: exit $? $(cat "$T/call.json")"
jq -e '.status == "succeeded"' "$T/call.json" >/dev/null || oq_fail "onceq call --task: $(cat "$T/call.json")"
oq_pass "PostgreSQL: onceq call --task waited for the task's end (succeeded, exit 0)"

# --- a step waiting for approval, approved over HTTP --------------------------------------------
P='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":30},
   "compensate":{"tool":"refund","args":{"amount":30}}},
  {"name":"ship","tool":"pay","args":{"amount":31},"approval":true,"irreversible":true}]}'
task_submit appr-1 "$P" >/dev/null
task_wait appr-1 awaiting_approval 60 || oq_fail "not awaiting approval: $(task appr-1)"
t=$(task appr-1)
aid=$(jq -r .task_id <<<"$t")
fence=$(jq -r .fence <<<"$t")
[[ $(pgq "SELECT count(*) FROM onceq.calls WHERE idem_key='appr-1/ship'") == 0 ]] ||
    oq_fail "the step waiting for approval has a call"
resolve() { # BODY -> "STATUS CODE-or-task-status"
    local st
    st=$(curl -s -o "$T/res.json" -w '%{http_code}' -X POST "$URL/v1/tasks/$aid/resolve" \
        -H 'Content-Type: application/json' -d "$1")
    echo "$st $(jq -r '.error.code // .status' "$T/res.json" 2>/dev/null)"
}
got=$(resolve "{\"as\":\"approve\",\"fence\":$((fence + 1)),\"note\":\"x\",\"by\":\"ada\"}")
[[ $got == "409 review_moved" ]] || oq_fail "a stale fence: $got"
body="{\"as\":\"approve\",\"fence\":$fence,\"note\":\"customer confirmed\",\"by\":\"ada\"}"
got=$(resolve "$body")
[[ $got == "200 running" ]] || oq_fail "approve: $got $(cat "$T/res.json")"
got=$(resolve "$body")
[[ $got == "409 not_awaiting_approval" ]] || oq_fail "approve again: $got"
task_wait appr-1 succeeded 60 || oq_fail "approved task: $(task appr-1)"
ship=$(task appr-1 | jq -r .steps[1].call_id)
[[ $(effects_of "$ship") == 1 ]] || oq_fail "the approved step: $(effects_of "$ship") effects"
[[ $(pgq "SELECT count(*) FROM onceq.calls WHERE idem_key='appr-1/ship'") == 1 ]] ||
    oq_fail "the approved step has more than one call"
pgq "SELECT detail FROM onceq.audit WHERE call_id='$aid' AND event='task_review'" |
    jq -e '.as == "approve" and (.by | startswith("ada"))' >/dev/null ||
    oq_fail "the decision's audit: $(pgq "SELECT detail FROM onceq.audit WHERE call_id='$aid'")"
oq_pass "PostgreSQL: a step approved over HTTP ran once (a stale fence 409, a second approve 409)"

# --- the operator's CLI on PostgreSQL: list, show, inspect, review show / resolve (reject) -------
"$ONCEQ_BIN" tasks list --db "$DBURL" --json >"$T/list.json" || oq_fail "onceq tasks list"
jq -e 'length == 5 and .[0].idem_key == "appr-1" and .[4].idem_key == "ok-1"' "$T/list.json" \
    >/dev/null || oq_fail "tasks list: $(jq -c '[.[].idem_key]' "$T/list.json")"
[[ $("$ONCEQ_BIN" tasks list --db "$DBURL" --status compensated --json | jq -r '[.[].idem_key] | join(",")') == flaky-1,comp-1 ]] ||
    oq_fail "tasks list --status compensated"
[[ $("$ONCEQ_BIN" tasks show --db "$DBURL" --key ok-1 | jq -r .task_id) == "$tid" ]] ||
    oq_fail "tasks show --key"
"$ONCEQ_BIN" tasks show --db "$DBURL" t_0123456789abcdef0123456789abcdef >/dev/null 2>&1
[[ $? == 4 ]] || oq_fail "tasks show of an unknown task: not exit 4"
"$ONCEQ_BIN" inspect --db "$DBURL" --consumer-db "$CDB" --json "$tid" >"$T/insp.json" ||
    oq_fail "onceq inspect $tid"
jq -e '.task.status == "succeeded" and ([.timeline[].step] | unique | length) == 3' \
    "$T/insp.json" >/dev/null || oq_fail "inspect: $(jq -c '.timeline | length' "$T/insp.json")"
task_submit rej-1 "$P" >/dev/null
task_wait rej-1 awaiting_approval 60 || oq_fail "rej-1 not awaiting approval: $(task rej-1)"
rid=$(task rej-1 | jq -r .task_id)
"$ONCEQ_BIN" review show "$rid" --producer-db "$DBURL" --json >"$T/rshow.json" ||
    oq_fail "review show $rid"
rfence=$(jq -r .fence "$T/rshow.json")
[[ $(jq -r .status "$T/rshow.json") == awaiting_approval ]] || oq_fail "review show: $(cat "$T/rshow.json")"
"$ONCEQ_BIN" review resolve "$rid" --producer-db "$DBURL" --fence $((rfence + 1)) --as reject \
    --note late --by bob >/dev/null 2>&1
[[ $? == 9 ]] || oq_fail "a stale fence from the CLI: not exit 9"
"$ONCEQ_BIN" review resolve "$rid" --producer-db "$DBURL" --fence "$rfence" --as reject \
    --note "customer cancelled" --by bob >"$T/rej.json" || oq_fail "review resolve --as reject"
task_wait rej-1 compensated 60 || oq_fail "rejected task: $(task rej-1)"
t=$(task rej-1)
[[ $(jq -r '[.steps[].status] | join(",")' <<<"$t") == compensated,skipped ]] || oq_fail "rej-1 steps: $t"
[[ $(effects_of "$(jq -r .steps[0].compensation.call_id <<<"$t")") == 1 &&
    $(pgq "SELECT count(*) FROM onceq.calls WHERE idem_key='rej-1/ship'") == 0 ]] ||
    oq_fail "reject: the charge not refunded once, or the rejected step has a call"
oq_pass "PostgreSQL: onceq tasks list/show, inspect, review show; a reject from the CLI compensated (stale fence: exit 9)"

# --- the counts, and onceq verify ---------------------------------------------------------------
st=$(curl -s "$URL/stats")
jq -e '.tasks.total == 6 and .tasks.by_status.succeeded == 3 and
    .tasks.by_status.compensated == 3 and .tasks.compensations.compensated == 4' <<<"$st" \
    >/dev/null || oq_fail "stats: $(jq -c .tasks <<<"$st")"
curl -sf "$URL/metrics" >"$T/metrics.txt" || oq_fail "no /metrics"
mv_() { awk -v k="$1" '$1 == k {print $2}' "$T/metrics.txt"; }
[[ $(mv_ 'onceq_producer_tasks{status="succeeded"}') == 3 &&
    $(mv_ 'onceq_producer_tasks{status="compensated"}') == 3 &&
    $(mv_ 'onceq_producer_task_compensations{outcome="compensated"}') == 4 &&
    $(mv_ onceq_producer_task_steps_rerun) == 0 ]] ||
    oq_fail "task metrics: $(grep -E 'onceq_producer_task' "$T/metrics.txt")"
pl_wait_drained 60 || oq_fail "not drained"
J=$(pl_verify) || oq_fail "onceq verify: $J"
jq -e '.clean and .duplicates == 0 and .lost == 0 and .violations == 0 and .calls == 17 and
    (.by_kind | .task_step_rerun + .task_comp_twice + .task_false_end + .task_not_terminal
     == 0)' <<<"$J" >/dev/null || oq_fail "verify: $J"
# with the ledger: no effect twice; the one effect it lacks is the refund the flaky service made
J=$(rt_verify --examples 5)
jq -e --arg k "$kb" '.by_kind.downstream_dup == 0 and .by_kind.downstream_missing == 1 and
    .examples[0].call_id == $k' <<<"$J" >/dev/null || oq_fail "verify with the ledger: $J"
# the task checks read the PostgreSQL tables: a step written as a second call is caught
pgq "INSERT INTO onceq.task_calls VALUES('c_00000000000000000000000000000000','$tid',0,'step')"
J=$(pl_verify --examples 0)
jq -e '.by_kind.task_step_rerun == 1' <<<"$J" >/dev/null || oq_fail "verify missed a re-run step: $J"
pgq "DELETE FROM onceq.task_calls WHERE call_id='c_00000000000000000000000000000000'"
oq_alive producer || oq_fail "producer died"
oq_pass "PostgreSQL: task counts in /stats and /metrics; onceq verify clean, its task checks on the snapshot"
