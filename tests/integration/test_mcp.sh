#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The MCP gateway (issue 20, items 2-4): POST /mcp on the producer, raw JSON-RPC from
# tests/integration/mcp_client.py against a live pipeline (broker, producer, relay, consumer,
# `onceq-downstream` behind the HTTP tool "pay"; the compiled "charge").
#  - transport: initialize (version negotiation, Mcp-Session-Id), notifications 202, session
#    required (400) and known (404), MCP-Protocol-Version checked, a foreign Origin 403,
#    -32700/-32600 (batches)/-32601, GET 405, SSE framing, DELETE ends a session;
#  - tools/list from the catalogue (inputSchema, idempotentHint), refusals (-32602 with the
#    pointer) writing nothing, the _meta key, the derived key (session + request id),
#    idempotency_conflict;
#  - the same tools/call with the same idempotencyKey 20 times at once and once more after
#    the result: one payment in the downstream's ledger, every answer the same. Negative
#    control: a naive MCP server (mcp_client.py naive) forwarding the same retries straight to
#    the downstream makes a payment per retry;
#  - an answer that waited for its call carries Server-Timing "wait;dur=<ms>", a replay none;
#  - a call still running at --mcp-wait answers isError {"status":"running","call_id"}, and
#    bearer tokens apply to /mcp (a second producer without brokers, with a token file).
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3) || oq_fail "no python3"
CLI="$ONCEQ_SRC/tests/integration/mcp_client.py"

rt_start_downstream
rt_tools "$T/tools.json" '.tools[0].input_schema = {"type": "object",
  "properties": {"amount": {"type": "integer", "minimum": 1}}, "required": ["amount"]}'
PL_PRODUCER_X+=(--tools "$T/tools.json" --mcp-wait 60s)
PL_CONSUMER_X+=(--tools "$T/tools.json")
pl_start 1
MCP=http://127.0.0.1:$PORT/mcp

$PY "$CLI" retries "$MCP" "$DURL" agent-pay-1 - 20 >"$T/once.json" || oq_fail "retries through onceq"
oq_log "through onceq: $(cat "$T/once.json")"
jq -e '.distinct_answers == 1 and .ledger == 1 and .answer.isError == false' "$T/once.json" >/dev/null ||
    oq_fail "through onceq: not one effect and one answer: $(cat "$T/once.json")"
# a different-arguments retry of the same key
curl -s -X POST "$MCP" -H 'Content-Type: application/json' -H 'Accept: application/json' \
    -d '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}' \
    -D "$T/h" -o /dev/null || oq_fail "initialize by curl"
SID=$(tr -d '\r' <"$T/h" | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}')
[[ ${#SID} == 32 ]] || oq_fail "no session id: $(cat "$T/h")"
OUT=$(curl -s -X POST "$MCP" -H 'Content-Type: application/json' -H 'Accept: application/json' \
    -H "Mcp-Session-Id: $SID" -d '{"jsonrpc":"2.0","id":5,"method":"tools/call","params":
    {"name":"pay","arguments":{"amount":6},"idempotencyKey":"agent-pay-1"}}')
[[ $(jq -r .error.data.code <<<"$OUT") == idempotency_conflict ]] || oq_fail "conflict: $OUT"
[[ $(rt_dstat .effects_committed) == 1 ]] || oq_fail "ledger after the conflict: $(curl -s "$DURL/ledger/stats")"
# Server-Timing: an answer that waited for the call to settle says how long (the pipeline's
# time, which onceq-bench mcp subtracts to see the gateway's own latency); a replay of a
# settled call did not wait and says nothing
mcall() { # mcall KEY AMOUNT: tools/call of pay, headers to $T/mh, body to stdout
    curl -s -X POST "$MCP" -H 'Content-Type: application/json' -H 'Accept: application/json' \
        -H "Mcp-Session-Id: $SID" -D "$T/mh" -d '{"jsonrpc":"2.0","id":7,"method":"tools/call",
        "params":{"name":"pay","arguments":{"amount":'"$2"'},"idempotencyKey":"'"$1"'"}}'
}
OUT=$(mcall timing-1 7)
[[ $(jq -r .result.isError <<<"$OUT") == false ]] || oq_fail "tools/call timing-1: $OUT"
grep -Eiq '^server-timing: wait;dur=[0-9]+\.[0-9]{3}' "$T/mh" || oq_fail "no Server-Timing on a tools/call that waited: $(cat "$T/mh")"
OUT=$(mcall timing-1 7)
[[ $(jq -r .result.isError <<<"$OUT") == false ]] || oq_fail "tools/call timing-1 again: $OUT"
grep -qi '^server-timing:' "$T/mh" && oq_fail "Server-Timing on a replay that did not wait: $(cat "$T/mh")"

$PY "$CLI" protocol "$MCP" "$PDB" "$DURL" || oq_fail "protocol checks"
oq_log "protocol checks passed"

# negative control: a naive MCP server in front of the same downstream
NPORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn naive "$PY" "$CLI" naive "$NPORT" "$DURL"
oq_wait_for 15 curl -s -o /dev/null "http://127.0.0.1:$NPORT/" || oq_fail "naive server down"
$PY "$CLI" retries "http://127.0.0.1:$NPORT/mcp" "$DURL" agent-pay-1 naive-1 20 >"$T/naive.json" ||
    oq_fail "retries through the naive server"
oq_log "through a naive server: $(jq -c '{distinct_answers, ledger}' "$T/naive.json")"
jq -e '.ledger > 1' "$T/naive.json" >/dev/null ||
    oq_fail "negative control: the naive server made no duplicate: $(cat "$T/naive.json")"

# --mcp-wait and tokens: a producer with no relay (nothing runs), a token file
P2=$(oq_free_port) || oq_fail "no free port"
printf '%s acme\n%s other\n' tok-acme-0123456789abcdef tok-other-0123456789abcdef >"$T/tokens"
oq_spawn producer2 "$ONCEQ_BIN" producer --db "$T/p2.db" --listen "127.0.0.1:$P2" \
    --tools "$T/tools.json" --mcp-wait 1s --token-file "$T/tokens"
oq_wait_for 15 curl -sf "http://127.0.0.1:$P2/healthz" || oq_fail "producer2 did not come up"
$PY "$CLI" running "http://127.0.0.1:$P2/mcp" tok-acme-0123456789abcdef || oq_fail "running at --mcp-wait"
# GET ?wait= of a call that cannot settle here (no relay): the deadline's answer says it waited
AUTH='Authorization: Bearer tok-acme-0123456789abcdef'
CID=$(curl -s -X POST "http://127.0.0.1:$P2/v1/tool-calls" -H "$AUTH" -H 'Content-Type: application/json' \
    -H 'Idempotency-Key: timing-2' -d '{"tool":"pay","args":{"amount":8}}' | jq -r .call_id)
ST=$(curl -s -H "$AUTH" -D "$T/gh" -o "$T/gb" -w '%{http_code}' "http://127.0.0.1:$P2/v1/tool-calls/$CID?wait=1s")
[[ $ST == 200 && $(jq -r .status "$T/gb") == pending ]] || oq_fail "GET ?wait=1s: $ST $(cat "$T/gb")"
DUR=$(tr -d '\r' <"$T/gh" | awk -F'dur=' 'tolower($0) ~ /^server-timing: wait;dur=/{print $2}')
[[ -n $DUR ]] && awk -v d="$DUR" 'BEGIN{exit !(d >= 900 && d < 60000)}' ||
    oq_fail "GET ?wait=1s: no Server-Timing wait of about 1000 ms: $(cat "$T/gh")"
$PY "$CLI" auth "http://127.0.0.1:$P2/mcp" tok-acme-0123456789abcdef tok-other-0123456789abcdef ||
    oq_fail "tokens on /mcp"
[[ $(sqlite3 "$T/p2.db" "SELECT tenant FROM calls WHERE idem_key='slow-1'") == acme ]] ||
    oq_fail "the call of a token's session is not in its tenant"
oq_pass "mcp gateway"
