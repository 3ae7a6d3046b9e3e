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
$PY "$CLI" auth "http://127.0.0.1:$P2/mcp" tok-acme-0123456789abcdef tok-other-0123456789abcdef ||
    oq_fail "tokens on /mcp"
[[ $(sqlite3 "$T/p2.db" "SELECT tenant FROM calls WHERE idem_key='slow-1'") == acme ]] ||
    oq_fail "the call of a token's session is not in its tenant"
oq_pass "mcp gateway"
