#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fenced review decisions (issue 17, item 3): a resolution names the review episode it was
# decided on, and is refused when the call left review and came back since.
#   - A downstream that honours keys, undeclared and without a lookup, drops every answer: the
#     call goes to review (fence F1). Operator A resolves `retry`; the resend's answer is
#     dropped too, and the call is back in review with another fence F2.
#   - Operator B, who decided `committed` while looking at the first episode, sends F1: the CLI
#     exits 9 (review moved) and the HTTP API answers 409 review_moved; nothing changes (state,
#     fence, audit, the producer's call). Without a fence: exit 2 / 400.
#   - `review list --json` has the shape of GET /v1/review ({"review":[...],"count":N}) and
#     both show the fence. A resolution with F2 applies: one effect in the ledger, verify clean.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
RT_VARIANTS='[{"base": true, "name": "keyed_undeclared", "idempotent": false, "lookup": null}]'
rt_tools "$T/tools.json"
MPORT=$(oq_free_port)
PL_CONSUMER_X+=(--tools "$T/tools.json" --lease 3s --recover-every 200ms
    --metrics-listen "127.0.0.1:$MPORT")
pl_start 1
A=http://127.0.0.1:$MPORT
R() { "$ONCEQ_BIN" review "$@" --db "$CDB"; }

rt_mode '{"faults":"drop-after-commit:1"}'
c=$(rt_submit fence-1 keyed_undeclared '{"amount":42}')
rt_wait_status fence-1 needs_review 30 || oq_fail "fence-1: $(rt_call fence-1)"

# one shape for the CLI and the HTTP API, with the episode's fence
R list --json >"$T/list.json" || oq_fail "review list --json"
curl -sf "$A/v1/review" >"$T/http.json" || oq_fail "GET /v1/review"
[[ $(jq -c 'keys' "$T/list.json") == "$(jq -c 'keys' "$T/http.json")" ]] ||
    oq_fail "list --json $(cat "$T/list.json") vs GET /v1/review $(cat "$T/http.json")"
[[ $(jq -r .count "$T/list.json") == 1 && $(jq -r '.review[0].call_id' "$T/list.json") == "$c" ]] ||
    oq_fail "list --json: $(cat "$T/list.json")"
f1=$(jq -r '.review[0].fence' "$T/list.json")
[[ $f1 =~ ^[0-9]+$ && $(jq -r '.review[0].fence' "$T/http.json") == "$f1" ]] || oq_fail "fence: $f1"
R list | grep -q "$c  *$f1 " || oq_fail "list does not print the fence: $(R list)"
R show "$c" | grep -q -- "--fence $f1" || oq_fail "show does not print the fence"
oq_pass "review list --json is GET /v1/review's shape; the episode's fence is $f1"

# operator A: retry; the resend is dropped again -> back in review, another episode
R resolve "$c" --as retry --fence "$f1" --note "resend, same key" --by ann >/dev/null ||
    oq_fail "resolve retry"
back() { [[ $(rt_cq "SELECT state || ' ' || (fence <> $f1) FROM executions WHERE call_id='$c'") == "NEEDS_REVIEW 1" ]]; }
oq_wait_for 30 back || oq_fail "not back in review: $(rt_cq "SELECT state, fence FROM executions WHERE call_id='$c'")"
f2=$(rt_cq "SELECT fence FROM executions WHERE call_id='$c'")
rt_wait_status fence-1 needs_review 30 || oq_fail "producer: $(rt_call fence-1)"
audits=$(rt_cq "SELECT count(*) FROM audit WHERE call_id='$c'")

# operator B decided on the first episode: refused, nothing changes
R resolve "$c" --as committed --ref pay_x --fence "$f1" --note "seen in the dashboard" --by bob \
    >"$T/out" 2>"$T/err"
rc=$?
[[ $rc == 9 ]] || oq_fail "stale fence: exit $rc $(cat "$T/out" "$T/err")"
grep -q review_moved "$T/err" || oq_fail "stale fence: $(cat "$T/err")"
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST "$A/v1/review/$c/resolve" \
    -H 'Content-Type: application/json' \
    -d "{\"as\":\"committed\",\"ref\":\"pay_x\",\"note\":\"seen\",\"by\":\"bob\",\"fence\":$f1}")
[[ $code == 409 && $(jq -r .error.code "$T/r.json") == review_moved ]] ||
    oq_fail "stale fence over HTTP: $code $(cat "$T/r.json")"
R resolve "$c" --as committed --note "no fence" 2>/dev/null
[[ $? == 2 ]] || oq_fail "a resolution without --fence was not refused with exit 2"
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST "$A/v1/review/$c/resolve" \
    -H 'Content-Type: application/json' -d '{"as":"committed","note":"no fence"}')
[[ $code == 400 ]] || oq_fail "no fence over HTTP: $code $(cat "$T/r.json")"
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST "$A/v1/review/$c/resolve" \
    -H 'Content-Type: application/json' -d '{"as":"committed","note":"x","fence":"1"}')
[[ $code == 400 ]] || oq_fail "a string fence over HTTP: $code $(cat "$T/r.json")"
[[ $(rt_cq "SELECT state || ' ' || fence FROM executions WHERE call_id='$c'") == "NEEDS_REVIEW $f2" ]] ||
    oq_fail "a refused resolution changed the execution"
[[ $(rt_cq "SELECT count(*) FROM audit WHERE call_id='$c'") == "$audits" ]] || oq_fail "a refused resolution wrote audit rows"
[[ $(rt_cq "SELECT count(*) FROM effects WHERE call_id='$c'") == 0 ]] || oq_fail "a refused resolution wrote an effect"
sleep 1
[[ $(rt_call fence-1 | jq -r .status) == needs_review ]] || oq_fail "producer moved: $(rt_call fence-1)"
oq_pass "a decision on the old episode (fence $f1, now $f2): exit 9 / 409 review_moved, nothing changed"

# the current episode's fence applies
rt_mode '{"faults":""}'
R resolve "$c" --as retry --fence "$f2" --note "the provider honours keys: resend" --by bob >/dev/null ||
    oq_fail "resolve with the current fence"
rt_wait_status fence-1 succeeded 30 || oq_fail "fence-1 after retry: $(rt_call fence-1)"
read -r n lid <<<"$(rt_ledger_by idempotency_key "$(rt_eid "$c")")"
[[ $n == 1 ]] || oq_fail "ledger: $n effects for the key"
J=$(rt_verify)
[[ $? == 0 ]] || oq_fail "verify: $J"
oq_pass "resolved with the current fence: succeeded, one effect in the ledger ($lid), verify clean"
