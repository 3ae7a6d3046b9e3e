#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Tools of kind "mcp" (issue 20, item 5): onceq in front of an upstream MCP server
# (tests/integration/mcp_upstream.py: Streamable HTTP with sessions, SSE answers, a ledger per
# upstream), through the whole pipeline:
#  - the effect id goes as params.idempotencyKey and _meta["io.onceq/idempotency-key"];
#  - a lost answer (the upstream commits, then closes the connection) ends, by the declared
#    class: upstream honouring keys -> resent with the same key, succeeded, ONE effect in its
#    ledger; upstream with a lookup tool -> reconciled (found), succeeded, one effect, sent once;
#    upstream with neither -> needs_review, one effect, never resent;
#  - a tool error (isError) -> failed "tool_error", not retried;
#  - "import": {"mcp": URL} puts the upstream's tools (schemas, annotations) in the catalogue
#    (GET /v1/tools, schema checked at submit) and they run, also for an agent on onceq's own
#    /mcp (retried key: one payment upstream); the upstream's sessions lost
#    (a restart): a 404, a new session, the call goes through;
#  - an import whose upstream is down: the tools file does not load (clear error, exit != 0).
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3) || oq_fail "no python3"

UPORT=$(oq_free_port) || oq_fail "no free port"
U=http://127.0.0.1:$UPORT
oq_spawn upstream "$PY" "$ONCEQ_SRC/tests/integration/mcp_upstream.py" "$UPORT"
oq_wait_for 15 curl -sf -o /dev/null "$U/" || oq_fail "the test upstream did not come up"
cat >"$T/tools.json" <<JSON
{"version": 1, "tools": [
  {"name": "up_keys", "kind": "mcp", "url": "$U/keys/mcp", "tool": "pay", "idempotent": true},
  {"name": "up_lookup", "kind": "mcp", "url": "$U/lookup/mcp", "tool": "pay", "object_id": "/id",
   "lookup": {"tool": "find_payment", "arguments": {"reference": "{effect_id}"},
              "exists": "/id", "settle_ms": 0}},
  {"name": "up_neither", "kind": "mcp", "url": "$U/neither/mcp", "tool": "pay"},
  {"import": {"mcp": "$U/keys/mcp", "prefix": "imp_"}, "idempotent": true}
]}
JSON
PL_PRODUCER_X+=(--tools "$T/tools.json")
PL_CONSUMER_X+=(--tools "$T/tools.json" --lease 3s --recover-every 200ms --retry-base 100ms)
pl_start 1

led() { curl -sf "$U/ledger/$1" | jq -r "$2"; }
# the catalogue: imported tools with their schema and annotations
curl -sf "http://127.0.0.1:$PORT/v1/tools" >"$T/tools.out" || oq_fail "GET /v1/tools"
jq -e '(.tools | map(select(.name == "imp_pay"))[0]) as $t | $t.input_schema.required == ["amount"]
       and $t.annotations.title == "Pay" and ($t.annotations | has("x-unknown") | not)
       and $t.honours_keys' "$T/tools.out" >/dev/null || oq_fail "imported catalogue: $(cat "$T/tools.out")"
out=$(curl -s -X POST "http://127.0.0.1:$PORT/v1/tool-calls" -H 'Idempotency-Key: bad-1' \
    -d '{"tool":"imp_pay","args":{"amount":0}}')
[[ $(jq -r .error.code <<<"$out") == bad_args ]] || oq_fail "imported schema not enforced: $out"

for k in keys lookup neither; do rt_submit "drop-$k" "up_$k" '{"amount":5,"drop":true}' >/dev/null; done
rt_submit imp-1 imp_pay '{"amount":7}' >/dev/null
rt_submit err-1 up_keys '{"amount":-1}' >/dev/null

rt_wait_status drop-keys succeeded 60 || oq_fail "drop-keys: $(rt_call drop-keys)"
cid=$(rt_call drop-keys | jq -r .call_id)
eid=$(rt_eid "$cid")
[[ $(led keys ".by_ref[\"$eid\"]") == 1 ]] || oq_fail "keys: not one effect: $(curl -s "$U/ledger/keys")"
[[ $(led keys "[.effects[] | select(.key == \"$eid\")] | length") == 1 ]] || oq_fail "keys: idempotencyKey not the effect id"
[[ $(rt_call drop-keys | jq -r .result.response.structuredContent.id) == pay_* ]] ||
    oq_fail "keys: result $(rt_call drop-keys)"
path=$(rt_cq "SELECT group_concat(event, ',') FROM (SELECT event FROM audit WHERE call_id='$cid' ORDER BY id)")
[[ $path == *unknown* ]] || oq_fail "keys: the answer was not lost? audit $path"
oq_pass "upstream honouring keys, answer lost: resent with the same key, one effect ($path)"

rt_wait_status drop-lookup succeeded 60 || oq_fail "drop-lookup: $(rt_call drop-lookup)"
cid=$(rt_call drop-lookup | jq -r .call_id)
eid=$(rt_eid "$cid")
[[ $(led lookup ".by_ref[\"$eid\"]") == 1 ]] || oq_fail "lookup: not one effect: $(curl -s "$U/ledger/lookup")"
oid=$(rt_call drop-lookup | jq -r .result.object_id)
[[ $oid == pay_* ]] || oq_fail "lookup: object id $oid"
path=$(rt_cq "SELECT group_concat(event, ',') FROM (SELECT event FROM audit WHERE call_id='$cid' ORDER BY id)")
[[ $path == started,unknown,reconciling,committed ]] || oq_fail "lookup: audit path $path"
oq_pass "upstream with a lookup tool, answer lost: reconciled (found $oid), one effect, sent once"

rt_wait_status drop-neither needs_review 60 || oq_fail "drop-neither: $(rt_call drop-neither)"
cid=$(rt_call drop-neither | jq -r .call_id)
eid=$(rt_eid "$cid")
sleep 2 # nothing may resend it meanwhile
[[ $(led neither ".by_ref[\"$eid\"]") == 1 && $(led neither .pay_requests) == 1 ]] ||
    oq_fail "neither: $(curl -s "$U/ledger/neither")"
oq_pass "upstream with neither, answer lost: needs_review, one effect, never resent"

rt_wait_status err-1 failed 60 || oq_fail "err-1: $(rt_call err-1)"
[[ $(rt_call err-1 | jq -r .error.code) == tool_error ]] || oq_fail "err-1: $(rt_call err-1)"
rt_wait_status imp-1 succeeded 60 || oq_fail "imp-1: $(rt_call imp-1)"
oq_pass "a tool error is failed (tool_error); an imported tool runs"

# an agent through onceq's own /mcp to the imported tool: the upstream's schema in tools/list,
# the upstream's answer in structuredContent.response
MCP=http://127.0.0.1:$PORT/mcp
curl -s -X POST "$MCP" -H 'Content-Type: application/json' -H 'Accept: application/json' \
    -d '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}' \
    -D "$T/h" -o /dev/null || oq_fail "initialize"
SID=$(tr -d '\r' <"$T/h" | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}')
mcp() {
    curl -s -X POST "$MCP" -H 'Content-Type: application/json' -H 'Accept: application/json' \
        -H "Mcp-Session-Id: $SID" -d "$1"
}
mcp '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' | jq -e '.result.tools[] |
    select(.name == "imp_pay") | .inputSchema.required == ["amount"]' >/dev/null ||
    oq_fail "imp_pay not in /mcp tools/list"
out=$(mcp '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"imp_pay",
    "arguments":{"amount":11},"idempotencyKey":"agent-imp-1"}}')
[[ $(jq -r '.result.isError' <<<"$out") == false &&
    $(jq -r '.result.structuredContent.response.structuredContent.amount' <<<"$out") == 11 ]] ||
    oq_fail "agent -> onceq /mcp -> upstream: $out"
again=$(mcp '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"imp_pay",
    "arguments":{"amount":11},"idempotencyKey":"agent-imp-1"}}')
[[ $(jq -cS .result.structuredContent <<<"$again") == "$(jq -cS .result.structuredContent <<<"$out")" ]] ||
    oq_fail "retry: $again, first: $out"
[[ $(led keys '[.effects[] | select(.amount == 11)] | length') == 1 ]] ||
    oq_fail "the retried key made more than one payment upstream: $(curl -s "$U/ledger/keys")"
oq_pass "an agent through onceq's /mcp to an imported upstream tool: its schema listed, one call for a retried key"

# the upstream forgets its sessions (a restart): 404, a new session, then the call
curl -sf -X POST "$U/admin/forget-sessions" >/dev/null || oq_fail "forget sessions"
rt_submit after-restart up_keys '{"amount":3}' >/dev/null
rt_wait_status after-restart succeeded 60 || oq_fail "after-restart: $(rt_call after-restart)"
oq_pass "upstream sessions lost: a new session, the call succeeded"

# an import whose upstream is down: the tools file does not load
DEAD=$(oq_free_port)
sed "s#$U/keys/mcp\", \"prefix#http://127.0.0.1:$DEAD/mcp\", \"prefix#" "$T/tools.json" >"$T/dead.json"
grep -q "$DEAD" "$T/dead.json" || oq_fail "dead.json"
P3=$(oq_free_port)
timeout 30 "$ONCEQ_BIN" producer --db "$T/p3.db" --listen "127.0.0.1:$P3" --tools "$T/dead.json" \
    >"$T/dead.out" 2>&1 && oq_fail "a producer started with an unreachable import"
grep -q "cannot list the tools of http://127.0.0.1:$DEAD/mcp" "$T/dead.out" ||
    oq_fail "no clear error: $(cat "$T/dead.out")"
oq_pass "an import from an upstream that is down: the tools file is not loaded ($(grep -o 'import: cannot[^(]*' "$T/dead.out" | head -1))"
