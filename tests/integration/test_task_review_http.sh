#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An operator's decision on a task over HTTP (issue 19 item 4: "onceq review, HTTP and, later,
# the console"): POST /v1/tasks/{task_id}/resolve on a producer with a token file, through the
# whole pipeline (producer, relay, consumer --tools, onceq-downstream), effects counted in the
# downstream's ledger:
#   - refusals change nothing (the task's row, its audit, its calls): no token 401, a tenant's
#     token without the operator role 403, text/plain 415, a bad body 400, an unknown task 404,
#     a decision that does not fit the status 409 not_in_review, a stale fence 409
#     review_moved;
#   - approve (operator token), sent three times at once: one 200, two 409
#     not_awaiting_approval; the waiting step runs once, audited with the operator's name;
#     approving again is 409 not_awaiting_approval, still one call;
#   - reject: the waiting step never runs (no call, no effect), the steps before it are
#     compensated once each in reverse order, the task ends compensated; onceq verify holds.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
RT_VARIANTS='[{"base": true, "name": "refund"}]'
rt_tools "$T/tools.json"
SHOP=tok-shop-0123456789abcdef
OPS=tok-ops-0123456789abcdef0
printf '%s shop\n%s ops operator\n' "$SHOP" "$OPS" >"$T/tokens"
chmod 600 "$T/tokens"
PL_PRODUCER_X+=(--token-file "$T/tokens")
PL_CONSUMER_X+=(--tools "$T/tools.json" --retry-base 100ms --lease 3s --recover-every 200ms)
pl_start 1

URL=http://127.0.0.1:$PORT
task_submit() { # KEY BODY
    curl -s -X POST "$URL/v1/tasks" -H "Authorization: Bearer $SHOP" -H "Idempotency-Key: $1" \
        -H 'Content-Type: application/json' -d "$2"
}
task() { curl -s -H "Authorization: Bearer $SHOP" "$URL/v1/tasks/by-key/$1"; }
task_wait() { # KEY STATUS SECONDS
    local i
    for ((i = 0; i < $3 * 10; i++)); do
        [[ $(task "$1" | jq -r .status) == "$2" ]] && return 0
        sleep 0.1
    done
    return 1
}
# resolve TASK_ID BODY [curl args...]: prints "STATUS CODE" (CODE: the error code, or the
# task's status on 200); the body goes to $T/res.json
resolve() {
    local id=$1 body=$2
    shift 2
    local st
    st=$(curl -s -o "$T/res.json" -w '%{http_code}' -X POST "$URL/v1/tasks/$id/resolve" \
        -H "Content-Type: ${CT:-application/json}" "$@" -d "$body")
    echo "$st $(jq -r '.error.code // .status' "$T/res.json" 2>/dev/null)"
}
OP=(-H "Authorization: Bearer $OPS")
led() { sqlite3 -cmd ".timeout 10000" "$DDB" "$1"; }
pq() { sqlite3 -cmd ".timeout 10000" "$PDB" "$1"; }
effects_of() { led "SELECT count(*) FROM payments WHERE idem_key='$(rt_eid "$1")'"; }
seq_of() { led "SELECT seq FROM payments WHERE idem_key='$(rt_eid "$1")'"; }
calls_of_key() { pq "SELECT count(*) FROM calls WHERE idem_key='$1'"; }
snapshot() { # the task's row, its audit and its steps' calls
    pq "SELECT status, review_fence, updated_at, coalesce(reason,'') FROM tasks WHERE task_id='$1';
        SELECT count(*) FROM audit WHERE call_id='$1';
        SELECT count(*) FROM calls WHERE idem_key LIKE '$2/%'"
}

# --- approve over HTTP, after every refusal has changed nothing -----------------------------------
A='{"steps":[
  {"name":"charge","tool":"pay","args":{"amount":30},
   "compensate":{"tool":"refund","args":{"amount":30}}},
  {"name":"ship","tool":"pay","args":{"amount":31},"approval":true,"irreversible":true}]}'
task_submit happr-1 "$A" >/dev/null
task_wait happr-1 awaiting_approval 60 || oq_fail "not awaiting approval: $(task happr-1)"
t=$(task happr-1)
tid=$(jq -r .task_id <<<"$t")
fence=$(jq -r .fence <<<"$t")
[[ $(calls_of_key happr-1/ship) == 0 ]] || oq_fail "the step waiting for approval has a call"
before=$(snapshot "$tid" happr-1)
ok_body="{\"as\":\"approve\",\"fence\":$fence,\"note\":\"customer confirmed\",\"by\":\"ada\"}"
refuse() { # WANT BODY [curl args...]
    local want=$1 got
    shift
    got=$(resolve "$tid" "$@")
    [[ $got == "$want" ]] || oq_fail "want $want, got $got: $(cat "$T/res.json") (${*})"
    [[ $(snapshot "$tid" happr-1) == "$before" ]] || oq_fail "a refused decision ($want) changed the task"
}
refuse "401 unauthorized" "$ok_body"
refuse "403 forbidden" "$ok_body" -H "Authorization: Bearer $SHOP"
CT=text/plain refuse "415 unsupported_media_type" "$ok_body" "${OP[@]}"
CT='application/json-seq' refuse "415 unsupported_media_type" "$ok_body" "${OP[@]}"
refuse "400 bad_request" '{"as":"approve",' "${OP[@]}"
refuse "400 bad_request" '["approve"]' "${OP[@]}"
refuse "400 bad_request" "{\"as\":\"approve\",\"fence\":$fence,\"by\":\"ada\"}" "${OP[@]}"
refuse "400 bad_request" "{\"as\":\"approve\",\"fence\":\"$fence\",\"note\":\"x\"}" "${OP[@]}"
refuse "400 bad_request" "{\"as\":\"approve\",\"fence\":$fence,\"note\":\"x\",\"ref\":\"r\"}" "${OP[@]}"
refuse "400 bad_request" "{\"as\":\"maybe\",\"fence\":$fence,\"note\":\"x\"}" "${OP[@]}"
refuse "409 not_in_review" "{\"as\":\"compensated\",\"fence\":$fence,\"note\":\"x\"}" "${OP[@]}"
refuse "409 review_moved" "{\"as\":\"approve\",\"fence\":$((fence + 1)),\"note\":\"x\"}" "${OP[@]}"
got=$(resolve t_0123456789abcdef0123456789abcdef "$ok_body" "${OP[@]}")
[[ $got == "404 not_found" ]] || oq_fail "unknown task: $got"
got=$(resolve t_nope "$ok_body" "${OP[@]}")
[[ $got == "404 not_found" ]] || oq_fail "malformed task id: $got"
[[ $(curl -s -o /dev/null -w '%{http_code}' "${OP[@]}" "$URL/v1/tasks/$tid/resolve") == 405 ]] ||
    oq_fail "GET .../resolve is not 405"
[[ $(snapshot "$tid" happr-1) == "$before" ]] || oq_fail "a refusal changed the task"
oq_pass "refusals: 401, 403 (no operator role), 415 x2, 400 x6, 404 x2, 409 not_in_review, 409 review_moved; nothing changed"

# three operators approve at once: the writer serialises them, one wins, two are refused
pids=()
for i in 1 2 3; do
    curl -s -m 30 -o "$T/appr$i.json" -w '%{http_code}\n' -X POST "$URL/v1/tasks/$tid/resolve" \
        -H 'Content-Type: application/json' "${OP[@]}" -d "$ok_body" >"$T/appr$i.code" &
    pids+=($!)
done
wait "${pids[@]}" # by pid: the pipeline's processes are this shell's jobs too
codes=$(for i in 1 2 3; do echo "$(cat "$T/appr$i.code") $(jq -r '.error.code // .status' "$T/appr$i.json")"; done | sort | tr '\n' ,)
[[ $codes == "200 running,409 not_awaiting_approval,409 not_awaiting_approval," ]] ||
    oq_fail "concurrent approvals: $codes"
task_wait happr-1 succeeded 60 || oq_fail "approved task: $(task happr-1)"
t=$(task happr-1)
[[ $(effects_of "$(jq -r .steps[1].call_id <<<"$t")") == 1 ]] || oq_fail "ship effects"
[[ $(effects_of "$(jq -r .steps[0].call_id <<<"$t")") == 1 ]] || oq_fail "charge effects"
aud=$(pq "SELECT json_extract(detail,'\$.by') || '|' || json_extract(detail,'\$.as') || '|' ||
          json_extract(detail,'\$.step') || '|' || json_extract(detail,'\$.note')
          FROM audit WHERE call_id='$tid' AND event='task_review'")
[[ $aud == "ada (http, token ops)|approve|ship|customer confirmed" ]] ||
    oq_fail "audit: $(pq "SELECT * FROM audit WHERE call_id='$tid'")"
got=$(resolve "$tid" "$ok_body" "${OP[@]}")
[[ $got == "409 not_awaiting_approval" ]] || oq_fail "approving again: $got"
[[ $(calls_of_key happr-1/ship) == 1 ]] || oq_fail "ship calls: $(calls_of_key happr-1/ship)"
[[ $(pq "SELECT count(*) FROM audit WHERE call_id='$tid' AND event='task_review'") == 1 ]] ||
    oq_fail "a second approval was audited"
oq_pass "approve over HTTP: 3 at once -> one 200, two 409; the step ran once (ledger), audited as ada (http, token ops); again: 409"

# --- reject over HTTP: compensations in reverse, the step never runs ------------------------------
B='{"steps":[
  {"name":"a","tool":"pay","args":{"amount":40},"compensate":{"tool":"refund","args":{"amount":40}}},
  {"name":"b","tool":"pay","args":{"amount":41},"compensate":{"tool":"refund","args":{"amount":41}}},
  {"name":"c","tool":"pay","args":{"amount":42},"approval":true,"irreversible":true}]}'
task_submit hrej-1 "$B" >/dev/null
task_wait hrej-1 awaiting_approval 60 || oq_fail "hrej-1 not awaiting: $(task hrej-1)"
t=$(task hrej-1)
tid=$(jq -r .task_id <<<"$t")
got=$(resolve "$tid" "{\"as\":\"reject\",\"fence\":$(jq -r .fence <<<"$t"),\"note\":\"fraud suspected\"}" "${OP[@]}")
[[ $got == "200 compensating" ]] || oq_fail "reject: $got $(cat "$T/res.json")"
task_wait hrej-1 compensated 60 || oq_fail "rejected task: $(task hrej-1)"
t=$(task hrej-1)
[[ $(jq -r '[.steps[].status] | join(",")' <<<"$t") == compensated,compensated,skipped ]] ||
    oq_fail "rejected steps: $t"
jq -e '.reason | contains("rejected by ops (http)")' <<<"$t" >/dev/null || oq_fail "reason: $t"
[[ $(calls_of_key hrej-1/c) == 0 ]] && jq -e '.steps[2].call_id == null' <<<"$t" >/dev/null ||
    oq_fail "the rejected step has a call"
[[ $(led "SELECT count(*) FROM payments WHERE amount=42") == 0 ]] || oq_fail "the rejected step ran"
ka=$(jq -r .steps[0].compensation.call_id <<<"$t")
kb=$(jq -r .steps[1].compensation.call_id <<<"$t")
[[ $(effects_of "$ka") == 1 && $(effects_of "$kb") == 1 ]] || oq_fail "compensation effects"
(($(seq_of "$kb") < $(seq_of "$ka"))) || oq_fail "compensations not in reverse order"
oq_pass "reject over HTTP: step c never ran (ledger), b then a compensated once each"

pl_verify >"$T/verify.json"
jq -e '.by_kind | (.task_step_rerun + .task_comp_twice + .task_false_end + .task_not_terminal) == 0' \
    "$T/verify.json" >/dev/null || oq_fail "verify: $(cat "$T/verify.json")"
oq_pass "onceq verify: no task invariant broken"
