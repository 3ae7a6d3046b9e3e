#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 60
# The console's Tasks page against a live pipeline (embedded broker, producer, relay, consumer
# with HTTP tools to `onceq-downstream`), with a token file:
#   - a 3-step task of tenant "default" and a 2-step task of tenant "other" run to succeeded;
#   - GET /api/tasks lists both for the operator, newest first, paged (limit, next, before),
#     filtered by status, searched by task id and by key, with the counts by status;
#   - GET /api/tasks/{id} is `onceq inspect --json t_...` (the same function): its 3 steps in
#     order, each succeeded with its call id (whose call page answers) and object id, and the
#     timeline of the steps' calls;
#   - a tenant's token sees its own task only: not listed, not found by id or key, its page 404;
#   - a task whose second step is declined: its page shows the first step's compensation (status,
#     call id) and the compensation's call in the timeline; status=compensated finds it;
#   - bad input: an unknown status or limit is 400;
#   - decisions (POST /api/tasks/{id}/resolve, oq_store_task_review as `onceq review resolve`):
#     refusals (no CSRF token, a tenant's token, bad bodies, not in review, a moved fence, an
#     unknown task) change nothing; reject compensates, audited as console:NAME;
#   - in headless Chromium (tests/integration/console_tasks_browser.py): the tasks page lists
#     the tasks with their counts, a task's page shows its 3 steps with call links that open
#     the call's page; a tenant sees its own task only; the operator approves a task awaiting
#     approval from its page and the step runs once (downstream ledger). Screenshots of each page:
#     $ONCEQ_BUILD/console-tasks-artefacts/.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

for need in /usr/bin/chromium /usr/bin/chromedriver; do
    [[ -x $need ]] || oq_fail "$need missing (./quickstart installs chromium and chromium-driver)"
done
PY=python3 # Debian's python3-selenium is in the system python3, not in a pyenv or venv one
python3 -c 'import selenium' 2>/dev/null || PY=/usr/bin/python3
"$PY" -c 'import selenium' 2>/dev/null || oq_fail "python3-selenium missing (./quickstart installs it)"

rt_start_downstream
RT_VARIANTS='[
  {"base": true, "name": "ticket", "body": "args"},
  {"base": true, "name": "pay_decline", "headers": {"X-Downstream-Fault": "decline"}},
  {"base": true, "name": "refund"}
]'
rt_tools "$T/tools.json"
PL_CONSUMER_X+=(--tools "$T/tools.json" --retry-base 100ms --lease 3s --recover-every 200ms)
pl_start 1

URL=http://127.0.0.1:$PORT
task_submit() { # KEY BODY -> the task id
    curl -s -X POST "$URL/v1/tasks" -H "Idempotency-Key: $1" -H 'Content-Type: application/json' \
        -d "$2" | jq -r .task_id
}
task_wait() { # TENANT KEY STATUS SECONDS
    local i
    for ((i = 0; i < $4 * 10; i++)); do
        [[ $(curl -s "$URL/v1/tasks/by-key/$2?tenant=$1" | jq -r .status) == "$3" ]] && return 0
        sleep 0.1
    done
    return 1
}
A='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":1999,"currency":"EUR"}},
  {"name":"ticket","tool":"ticket","args":{"amount":"{steps.charge.result.response.amount}",
   "currency":"EUR","reference":"re-{steps.charge.object_id}"}},
  {"name":"fee","tool":"pay","args":{"amount":5,"currency":"EUR"}}]}'
B='{"tenant":"other","steps":[
  {"name":"charge","tool":"pay","args":{"amount":7,"currency":"EUR"}},
  {"name":"fee","tool":"pay","args":{"amount":1,"currency":"EUR"}}]}'
ta=$(task_submit console-task-a "$A")
[[ $ta == t_* ]] || oq_fail "task a not submitted: $ta"
task_wait default console-task-a succeeded 60 ||
    oq_fail "task a: $(curl -s "$URL/v1/tasks/by-key/console-task-a")"
tb=$(task_submit console-task-b "$B")
[[ $tb == t_* ]] || oq_fail "task b not submitted: $tb"
task_wait other console-task-b succeeded 60 ||
    oq_fail "task b: $(curl -s "$URL/v1/tasks/by-key/console-task-b?tenant=other")"
oq_pass "two tasks ran: $ta (default, 3 steps), $tb (other, 2 steps)"

OPT=operator-token-0123456789
TT=tenant-default-token-0123
OT=tenant-other-token-01234
printf '%s ops operator\n%s default\n%s other\n' "$OPT" "$TT" "$OT" >"$T/tokens"
chmod 600 "$T/tokens"
CPORT=$(oq_free_port)
U=http://127.0.0.1:$CPORT/
oq_spawn console "$ONCEQ_BIN" console --producer-db "$PDB" --consumer-db "$CDB" \
    --listen "127.0.0.1:$CPORT" --token-file "$T/tokens"
oq_wait_for 15 curl -s -o /dev/null "$U" || oq_fail "console did not come up"
A() { local tok=$1 && shift && curl -s -H "Authorization: Bearer $tok" "$@"; }
code() { local tok=$1 && shift && A "$tok" -o /dev/null -w '%{http_code}' "$@"; }

# --- the list -----------------------------------------------------------------------------------
code=$(curl -s -o /dev/null -w '%{http_code}' "${U}api/tasks")
[[ $code == 401 ]] || oq_fail "tasks without a token: HTTP $code"
l=$(A "$OPT" "${U}api/tasks")
[[ $(jq -r '[.tasks[].task_id] | join(",")' <<<"$l") == "$tb,$ta" ]] ||
    oq_fail "the operator's list (newest first): $l"
jq -e '.supported == true and .counts.succeeded == 2 and .counts.running == 0 and
       .counts.failed == 0' <<<"$l" >/dev/null || oq_fail "counts: $l"
jq -e --arg t "$ta" '.tasks[] | select(.task_id == $t) | .tenant == "default" and
       .idem_key == "console-task-a" and .status == "succeeded" and (.steps | length) == 3' \
    <<<"$l" >/dev/null || oq_fail "task a in the list: $l"
p1=$(A "$OPT" "${U}api/tasks?limit=1")
[[ $(jq -r '.tasks[0].task_id' <<<"$p1") == "$tb" ]] || oq_fail "page 1: $p1"
nx=$(jq -r .next <<<"$p1")
[[ $nx =~ ^[0-9]+$ ]] || oq_fail "no next after page 1: $p1"
p2=$(A "$OPT" "${U}api/tasks?limit=1&before=$nx")
[[ $(jq -r '[.tasks[].task_id] | join(",")' <<<"$p2") == "$ta" && $(jq -r .next <<<"$p2") == null ]] ||
    oq_fail "page 2: $p2"
[[ $(A "$OPT" "${U}api/tasks?status=succeeded" | jq '.tasks | length') == 2 ]] ||
    oq_fail "status=succeeded"
[[ $(A "$OPT" "${U}api/tasks?status=running" | jq '.tasks | length') == 0 ]] || oq_fail "status=running"
[[ $(A "$OPT" "${U}api/tasks?q=$ta" | jq -r '[.tasks[].task_id] | join(",")') == "$ta" ]] ||
    oq_fail "search by task id"
[[ $(A "$OPT" "${U}api/tasks?q=console-task-b" | jq -r '[.tasks[].task_id] | join(",")') == "$tb" ]] ||
    oq_fail "search by key"
[[ $(A "$OPT" "${U}api/tasks?tenant=other" | jq -r '[.tasks[].task_id] | join(",")') == "$tb" ]] ||
    oq_fail "the operator's tenant filter"
[[ $(code "$OPT" "${U}api/tasks?status=bogus") == 400 ]] || oq_fail "an unknown status was accepted"
[[ $(code "$OPT" "${U}api/tasks?limit=0") == 400 ]] || oq_fail "limit=0 was accepted"
oq_pass "the tasks list: newest first, paged, by status, by task id and key, with the counts"

# --- a task's page ------------------------------------------------------------------------------
d=$(A "$OPT" "${U}api/tasks/$ta")
[[ $(jq -r '[.task.steps[].name] | join(",")' <<<"$d") == charge,ticket,fee ]] || oq_fail "steps: $d"
jq -e '[.task.steps[] | .status == "succeeded" and (.call_id | startswith("c_")) and
        .object_id != null] | all' <<<"$d" >/dev/null || oq_fail "steps' status, call id, object id: $d"
jq -e '[.timeline[].step] | unique | sort == ["charge","fee","ticket"]' <<<"$d" >/dev/null ||
    oq_fail "the timeline has not every step: $d"
jq -e '[.timeline[] | select(.event == "submitted")] | length == 3' <<<"$d" >/dev/null ||
    oq_fail "the timeline has not the 3 calls' submits: $d"
cli=$("$ONCEQ_BIN" inspect --db "$PDB" --consumer-db "$CDB" --json "$ta") || oq_fail "onceq inspect $ta"
# the consumer may still add rows after the task's end (its result relay): the producer's rows
same() { jq -S '{task: .task.steps, tl: [.timeline[] | select(.from == "producer") |
                                          [.ts, .step, .role, .event, .call_id]]}'; }
same <<<"$cli" >"$T/cli.json"
same <<<"$d" >"$T/console.json"
diff "$T/cli.json" "$T/console.json" >"$T/diff" ||
    oq_fail "the console's task differs from onceq inspect's: $(cat "$T/diff")"
for c in $(jq -r '.task.steps[].call_id' <<<"$d"); do
    [[ $(A "$TT" "${U}api/calls/$c" | jq -r .call.call_id) == "$c" ]] || oq_fail "step call $c's page"
done
oq_pass "a task's page: 3 steps in order with call ids and object ids, the timeline as onceq inspect"

# --- tenants ------------------------------------------------------------------------------------
[[ $(A "$TT" "${U}api/tasks" | jq -r '[.tasks[].task_id] | join(",")') == "$ta" ]] ||
    oq_fail "tenant default's list"
[[ $(A "$TT" "${U}api/tasks" | jq .counts.succeeded) == 1 ]] || oq_fail "tenant default's counts"
[[ $(A "$OT" "${U}api/tasks" | jq -r '[.tasks[].task_id] | join(",")') == "$tb" ]] ||
    oq_fail "tenant other's list"
[[ $(code "$OT" "${U}api/tasks/$ta") == 404 ]] || oq_fail "tenant other sees task a's page"
[[ $(A "$OT" "${U}api/tasks?q=$ta" | jq '.tasks | length') == 0 ]] || oq_fail "tenant other finds task a by id"
[[ $(A "$OT" "${U}api/tasks?q=console-task-a" | jq '.tasks | length') == 0 ]] ||
    oq_fail "tenant other finds task a by key"
[[ $(A "$OT" "${U}api/tasks?tenant=default" | jq -r '[.tasks[].task_id] | join(",")') == "$tb" ]] ||
    oq_fail "a tenant's tenant= filter widened its view"
[[ $(code "$TT" "${U}api/tasks/$ta") == 200 ]] || oq_fail "tenant default cannot see its own task"
oq_pass "a tenant's token sees its own tasks only (list, search, page, counts)"

# --- compensations ------------------------------------------------------------------------------
C='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":30,"currency":"EUR"},
   "compensate":{"tool":"refund","args":{"amount":30}}},
  {"name":"boom","tool":"pay_decline","args":{"amount":1}}]}'
tc=$(task_submit console-task-c "$C")
[[ $tc == t_* ]] || oq_fail "task c not submitted: $tc"
task_wait default console-task-c compensated 60 ||
    oq_fail "task c: $(curl -s "$URL/v1/tasks/by-key/console-task-c")"
d=$(A "$OPT" "${U}api/tasks/$tc")
jq -e '.task.steps[0].status == "compensated" and .task.steps[0].compensation.status == "succeeded"
       and (.task.steps[0].compensation.call_id | startswith("c_")) and
       .task.steps[1].status == "failed"' <<<"$d" >/dev/null || oq_fail "task c's steps: $d"
jq -e --arg k "$(jq -r .task.steps[0].compensation.call_id <<<"$d")" \
    '[.timeline[] | select(.role == "compensate") | .call_id] | unique == [$k]' <<<"$d" >/dev/null ||
    oq_fail "task c's timeline has not its compensation's call: $d"
[[ $(A "$TT" "${U}api/tasks?status=compensated" | jq -r '[.tasks[].task_id] | join(",")') == "$tc" ]] ||
    oq_fail "status=compensated"
[[ $(A "$TT" "${U}api/tasks" | jq .counts.compensated) == 1 ]] || oq_fail "counts.compensated"
oq_pass "a compensated task's page: the compensation's status and call id, its rows in the timeline"

# --- an operator's decisions (the same oq_store_task_review as `onceq review resolve t_...`) ------
led() { sqlite3 -cmd ".timeout 10000" "$DDB" "$1"; }
pq() { sqlite3 -cmd ".timeout 10000" "$PDB" "$1"; }
snapshot() { # the task's row, its audit and its steps' calls
    pq "SELECT status, review_fence, updated_at FROM tasks WHERE task_id='$1';
        SELECT count(*) FROM audit WHERE call_id='$1';
        SELECT count(*) FROM calls WHERE idem_key LIKE '$2/%'"
}
D='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":50,"currency":"EUR"}},
  {"name":"ship","tool":"pay","args":{"amount":51,"currency":"EUR"},"approval":true}]}'
E='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":60,"currency":"EUR"},
   "compensate":{"tool":"refund","args":{"amount":60}}},
  {"name":"ship","tool":"pay","args":{"amount":61,"currency":"EUR"},"approval":true}]}'
td=$(task_submit console-task-d "$D")
te=$(task_submit console-task-e "$E")
[[ $td == t_* && $te == t_* ]] || oq_fail "tasks d, e not submitted: $td $te"
task_wait default console-task-d awaiting_approval 60 || oq_fail "task d: $(A "$OPT" "${U}api/tasks/$td")"
task_wait default console-task-e awaiting_approval 60 || oq_fail "task e: $(A "$OPT" "${U}api/tasks/$te")"
fence=$(A "$OPT" "${U}api/tasks/$te" | jq -r .task.fence)
[[ $fence =~ ^[0-9]+$ ]] || oq_fail "task e's page has no fence"
OCSRF=$(A "$OPT" "${U}api/me" | jq -r .csrf)
TCSRF=$(A "$TT" "${U}api/me" | jq -r .csrf)
decide() { # TOKEN CSRF TASK BODY: prints "STATUS CODE"
    local st
    st=$(A "$1" -o "$T/dec.json" -w '%{http_code}' -X POST "${U}api/tasks/$3/resolve" \
        -H 'Content-Type: application/json' -H "X-CSRF-Token: $2" -d "$4")
    echo "$st $(jq -r '.error // .status' "$T/dec.json" 2>/dev/null)"
}
before=$(snapshot "$te" console-task-e)
ok="{\"as\":\"reject\",\"fence\":$fence,\"note\":\"customer cancelled\"}"
for want_body in "403 csrf|$OPT|wrong|$ok" "403 forbidden|$TT|$TCSRF|$ok" \
    "400 bad_request|$OPT|$OCSRF|{\"as\":\"reject\"}" \
    "400 bad_request|$OPT|$OCSRF|{\"as\":\"maybe\",\"fence\":$fence,\"note\":\"x\"}" \
    "409 not_in_review|$OPT|$OCSRF|{\"as\":\"compensated\",\"fence\":$fence,\"note\":\"x\"}" \
    "409 review_moved|$OPT|$OCSRF|{\"as\":\"reject\",\"fence\":$((fence + 1)),\"note\":\"x\"}"; do
    IFS='|' read -r want tok csrf body <<<"$want_body"
    got=$(decide "$tok" "$csrf" "$te" "$body")
    [[ $got == "$want" ]] || oq_fail "decision $body with token ${tok:0:6}: $got, want $want"
done
got=$(decide "$OPT" "$OCSRF" t_0123456789abcdef0123456789abcdef "$ok")
[[ $got == "404 not_found" ]] || oq_fail "unknown task: $got"
[[ $(snapshot "$te" console-task-e) == "$before" ]] || oq_fail "a refused decision changed task e"
got=$(decide "$OPT" "$OCSRF" "$te" "$ok")
[[ $got == "200 compensating" || $got == "200 compensated" ]] || oq_fail "reject task e: $got"
task_wait default console-task-e compensated 60 || oq_fail "task e after reject: $(A "$OPT" "${U}api/tasks/$te")"
[[ $(pq "SELECT count(*) FROM calls WHERE idem_key='console-task-e/ship'") == 0 ]] ||
    oq_fail "the rejected step has a call"
[[ $(pq "SELECT json_extract(detail,'\$.by') || '|' || json_extract(detail,'\$.as')
         FROM audit WHERE call_id='$te' AND event='task_review'") == "console:ops|reject" ]] ||
    oq_fail "task e's audit: $(pq "SELECT * FROM audit WHERE call_id='$te'")"
got=$(decide "$OPT" "$OCSRF" "$te" "$ok")
[[ $got == "409 not_awaiting_approval" ]] || oq_fail "rejecting again: $got"
oq_pass "decisions over the console's API: refusals (csrf, tenant, 400 x2, 409 x2, 404) change nothing; reject compensates, audited as console:ops"

# --- the pages in the browser -------------------------------------------------------------------
ART=$ONCEQ_BUILD/console-tasks-artefacts
rm -rf "$ART"
timeout 240 "$PY" "$ONCEQ_SRC/tests/integration/console_tasks_browser.py" "$U" "$ART" "$OPT" \
    "$TT" "$ta" "$tb" 3 "$td" || oq_fail "browser checks failed"
for p in tasks task tenant-tasks task-approval task-approved; do
    [[ -s $ART/$p.png ]] || oq_fail "no screenshot $p.png"
done
task_wait default console-task-d succeeded 60 || oq_fail "task d after approval: $(A "$OPT" "${U}api/tasks/$td")"
ship=$(A "$OPT" "${U}api/tasks/$td" | jq -r '.task.steps[1].call_id')
[[ $(led "SELECT count(*) FROM payments WHERE idem_key='$(rt_eid "$ship")'") == 1 ]] ||
    oq_fail "the approved step's payments in the downstream's ledger"
[[ $(pq "SELECT json_extract(detail,'\$.by') || '|' || json_extract(detail,'\$.as')
         FROM audit WHERE call_id='$td' AND event='task_review'") == "console:ops|approve" ]] ||
    oq_fail "task d's audit: $(pq "SELECT * FROM audit WHERE call_id='$td'")"
oq_pass "approved from the task's page: the step ran once (downstream ledger), audited as console:ops"
oq_pass "in Chromium: the tasks page, a task's page with its 3 steps' call links, a tenant's view (screenshots in $ART)"
