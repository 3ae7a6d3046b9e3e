#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The operator's workflow for what no machine can decide.
#   - A downstream with neither keys nor a lookup loses an answer (it committed, then dropped
#     the connection): the call ends `needs_review` and is never resent. `onceq review list`
#     shows it (age, tool, why), `show` tells its story from both databases, and
#     `review resolve --as committed --ref <id>` moves the producer's call to `succeeded`
#     with that id (one result event, audited, fenced: a second resolution is refused).
#   - A downstream that honours keys but was not declared idempotent and has no lookup: the
#     lost answer goes to review; `--as retry` sends it once more with the same key, and the
#     downstream replays its payment: one effect.
#   - `--as failed` over HTTP on the consumer's admin listener: the call ends `failed`.
#   - Bad input changes nothing (exit 2), an unknown call is exit 4; `onceq verify` is clean.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
RT_VARIANTS='[
  {"name": "blind_drop", "url": "http://127.0.0.1:'$DPORT'/v1/payments",
   "body": {"amount": "{amount}"}, "idempotency_header": null,
   "headers": {"X-Downstream-Fault": "drop-after-commit"}},
  {"base": true, "name": "keyed_undeclared", "idempotent": false, "lookup": null}
]'
rt_tools "$T/tools.json"
MPORT=$(oq_free_port)
PL_CONSUMER_X+=(--tools "$T/tools.json" --lease 3s --recover-every 200ms
    --metrics-listen "127.0.0.1:$MPORT")
pl_start 1
R() { "$ONCEQ_BIN" review "$@" --db "$CDB"; }
F() { rt_cq "SELECT fence FROM executions WHERE call_id='$1'"; } # the review episode

# --- neither keys nor lookup: review, never resent; resolve as committed -----------------------
c1=$(rt_submit blind-1 blind_drop '{"amount":41}')
rt_wait_status blind-1 needs_review 30 || oq_fail "blind-1: $(rt_call blind-1)"
sleep 1.5
[[ $(rt_dstat .requests.post_payment) == 1 ]] || oq_fail "a call with neither keys nor lookup was resent"
[[ $(rt_dstat .ledger.effects) == 1 ]] || oq_fail "ledger: $(rt_dstat .ledger)"
R list >"$T/list.txt" || oq_fail "review list failed"
cat "$T/list.txt"
grep -q "$c1 .*blind_drop .*no_lookup_no_keys" "$T/list.txt" || oq_fail "list: $(cat "$T/list.txt")"
[[ $(R list --json | jq -r '.review[0].call_id') == "$c1" ]] || oq_fail "list --json"
R show "$c1" --producer-db "$PDB" >"$T/show.txt" || oq_fail "review show failed"
cat "$T/show.txt"
for w in "consumer  NEEDS_REVIEW" "producer  needs_review" "consumer  unknown" "producer  running" "submitted"; do
    grep -q "$w" "$T/show.txt" || oq_fail "show lacks '$w'"
done
pid=$(sqlite3 "$DDB" "SELECT id FROM payments ORDER BY seq DESC LIMIT 1") # the dashboard
R resolve "$c1" --fence "$(F "$c1")" --as committed --note "" 2>/dev/null
[[ $? == 2 ]] || oq_fail "empty note accepted"
R resolve "$c1" --fence "$(F "$c1")" --as maybe --note x 2>/dev/null
[[ $? == 2 ]] || oq_fail "--as maybe accepted"
R resolve "$c1" --fence "$(F "$c1")" --as failed --ref "$pid" --note x 2>/dev/null
[[ $? == 2 ]] || oq_fail "--ref with --as failed accepted"
R resolve c_ffffffffffffffff --fence 0 --as failed --note x 2>/dev/null
[[ $? == 4 ]] || oq_fail "unknown call not exit 4"
[[ $(rt_cq "SELECT state FROM executions WHERE call_id='$c1'") == NEEDS_REVIEW ]] || oq_fail "bad input changed the call"
R resolve "$c1" --fence "$(F "$c1")" --as committed --ref "$pid" --note "payment $pid seen in the provider dashboard" --by ada ||
    oq_fail "resolve failed"
rt_wait_status blind-1 succeeded 30 || oq_fail "producer did not move: $(rt_call blind-1)"
[[ $(rt_call blind-1 | jq -r .result.object_id) == "$pid" ]] || oq_fail "object id: $(rt_call blind-1)"
R resolve "$c1" --fence "$(F "$c1")" --as failed --note "again" 2>/dev/null
[[ $? == 2 ]] || oq_fail "a second resolution was not refused"
[[ $(rt_cq "SELECT count(*) FROM outbox WHERE key='$c1' AND json_extract(payload,'\$.status')='succeeded'") == 1 ]] ||
    oq_fail "not exactly one succeeded result event"
[[ $(rt_cq "SELECT worker FROM audit WHERE call_id='$c1' AND event='review_resolved'") == review:ada ]] ||
    oq_fail "resolution not audited with the operator"
oq_pass "no keys, no lookup: needs_review, not resent; resolved as committed -> succeeded with $pid"

# --- keys honoured but undeclared, no lookup: resolve as retry -> one more send, same key ------
rt_mode '{"faults":"drop-after-commit:1"}'
c2=$(rt_submit keyed-1 keyed_undeclared '{"amount":42}')
rt_wait_status keyed-1 needs_review 30 || oq_fail "keyed-1: $(rt_call keyed-1)"
rt_mode '{"faults":""}'
posts=$(rt_dstat .requests.post_payment)
R resolve "$c2" --fence "$(F "$c2")" --as retry --note "the provider honours keys: resend" || oq_fail "resolve retry"
rt_wait_status keyed-1 succeeded 30 || oq_fail "keyed-1 after retry: $(rt_call keyed-1)"
(($(rt_dstat .requests.post_payment) == posts + 1)) || oq_fail "retry did not send exactly once more"
read -r n lid <<<"$(rt_ledger_by idempotency_key "$(rt_eid "$c2")")"
[[ $n == 1 && $(rt_call keyed-1 | jq -r .result.object_id) == "$lid" ]] ||
    oq_fail "retry: $n effects, object id $(rt_call keyed-1 | jq -r .result.object_id) vs $lid"
oq_pass "resolved as retry: sent once more with the same key, replayed by the downstream, one effect"

# --- over HTTP: list, show, resolve as failed ----------------------------------------------------
c3=$(rt_submit blind-2 blind_drop '{"amount":43}')
rt_wait_status blind-2 needs_review 30 || oq_fail "blind-2: $(rt_call blind-2)"
A=http://127.0.0.1:$MPORT
[[ $(curl -sf "$A/v1/review" | jq -r '.review[0].call_id') == "$c3" ]] || oq_fail "GET /v1/review: $(curl -s "$A/v1/review")"
[[ $(curl -sf "$A/v1/review/$c3" | jq -r .execution.state) == NEEDS_REVIEW ]] || oq_fail "GET /v1/review/id"
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST -H "Content-Type: application/json" "$A/v1/review/$c3/resolve" -d "{\"as\":\"failed\",\"fence\":$(F "$c3")}")
[[ $code == 400 ]] || oq_fail "no note: HTTP $code $(cat "$T/r.json")"
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST -H "Content-Type: application/json" "$A/v1/review/$c3/resolve" -d "{\"as\":\"failed\",\"note\":\"x\",\"extra\":1,\"fence\":$(F "$c3")}")
[[ $code == 400 ]] || oq_fail "unknown member: HTTP $code"
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST -H "Content-Type: application/json" "$A/v1/review/$c3/resolve" \
    -d "{\"as\":\"failed\",\"note\":\"no payment at the provider\",\"by\":\"bob\",\"fence\":$(F "$c3")}")
[[ $code == 200 ]] || oq_fail "resolve over http: HTTP $code $(cat "$T/r.json")"
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST -H "Content-Type: application/json" "$A/v1/review/$c3/resolve" -d "{\"as\":\"failed\",\"note\":\"x\",\"fence\":$(F "$c3")}")
[[ $code == 409 ]] || oq_fail "second resolve over http: HTTP $code"
rt_wait_status blind-2 failed 30 || oq_fail "blind-2: $(rt_call blind-2)"
[[ $(rt_call blind-2 | jq -r .error.code) == resolved_failed ]] || oq_fail "error: $(rt_call blind-2)"
[[ $(curl -sf "$A/v1/review" | jq -r .count) == 0 ]] || oq_fail "queue not empty"
curl -sf "$A/stats" | jq -e '.review.queue == 0 and .reconciliation.none >= 3' >/dev/null ||
    oq_fail "stats: $(curl -s "$A/stats")"
oq_pass "over HTTP: list, show, resolve as failed (400 / 409 on bad or repeated input)"

J=$(rt_verify)
[[ $? == 0 ]] || oq_fail "verify: $J"
oq_pass "verify clean after the resolutions"
