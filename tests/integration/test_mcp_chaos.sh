#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# /mcp through the chaos proxy (issue 20): tests/tools/oq_chaos_proxy.py drops 30 % of the
# responses (the request reaches the producer, the answer never reaches the client), and an
# agent-like client (mcp_chaos_client.py: raw JSON-RPC, 30 keys, 4 at a time) retries every
# tools/call with the same idempotencyKey until it gets an answer. Through onceq: every key
# answered, ONE payment per key in the downstream's ledger. Negative control: the same client
# through the same proxy in front of a naive MCP server (mcp_client.py naive: tools/call goes
# straight to the downstream, no key) leaves duplicate payments.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3) || oq_fail "no python3"
CLI="$ONCEQ_SRC/tests/integration/mcp_chaos_client.py"
PROXY="$ONCEQ_SRC/tests/tools/oq_chaos_proxy.py"
N=30

rt_start_downstream
rt_tools "$T/tools.json"
PL_PRODUCER_X+=(--tools "$T/tools.json" --mcp-wait 20s)
PL_CONSUMER_X+=(--tools "$T/tools.json")
pl_start 1

XP=$(oq_free_port) || oq_fail "no free port"
oq_spawn proxy "$PY" "$PROXY" --listen "$XP" --upstream "$PORT" --modes drop-response \
    --rate 0.3 --seed 20
oq_wait_for 15 bash -c "exec 3<>/dev/tcp/127.0.0.1/$XP" || oq_fail "proxy not listening"
PYTHONPATH="$ONCEQ_SRC/tests/integration" timeout 240 $PY "$CLI" "http://127.0.0.1:$XP/mcp" \
    "$DURL" "$N" agent onceq >"$T/once.json" || oq_fail "the client through onceq failed"
oq_log "through onceq: $(jq -c '{keys, answered, retries, total}' "$T/once.json")"
jq -e --argjson n "$N" '.answered == $n and .retries > 0 and ([.per_key[]] | all(. == 1))
    and .total == $n' "$T/once.json" >/dev/null || oq_fail "through onceq: $(cat "$T/once.json")"
# every payment the downstream holds (a retry that became a new call would add one)
[[ $(rt_dstat .ledger.effects) == "$N" && $(rt_dstat .ledger.duplicate_effects) == 0 ]] ||
    oq_fail "not $N payments: $(rt_dstat .ledger)"
oq_pass "30 % of responses dropped: $N keys, $(jq .retries "$T/once.json") retries, one payment per key"

NPORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn naive "$PY" "$ONCEQ_SRC/tests/integration/mcp_client.py" naive "$NPORT" "$DURL"
oq_wait_for 15 curl -s -o /dev/null "http://127.0.0.1:$NPORT/" || oq_fail "naive server down"
NXP=$(oq_free_port) || oq_fail "no free port"
oq_spawn proxy2 "$PY" "$PROXY" --listen "$NXP" --upstream "$NPORT" --modes drop-response \
    --rate 0.3 --seed 20
oq_wait_for 15 bash -c "exec 3<>/dev/tcp/127.0.0.1/$NXP" || oq_fail "proxy2 not listening"
PYTHONPATH="$ONCEQ_SRC/tests/integration" timeout 240 $PY "$CLI" "http://127.0.0.1:$NXP/mcp" \
    "$DURL" "$N" naive naive >"$T/naive.json" || oq_fail "the client through the naive server failed"
oq_log "through a naive server: $(jq -c '{keys, answered, retries, total}' "$T/naive.json")"
jq -e --argjson n "$N" '.total > $n' "$T/naive.json" >/dev/null ||
    oq_fail "negative control: no duplicate through the naive server: $(cat "$T/naive.json")"
oq_pass "negative control: a naive MCP server behind the same proxy made $(jq '.total' "$T/naive.json") payments for $N keys"
