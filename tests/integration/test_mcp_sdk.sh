#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The official MCP Python SDK against POST /mcp (issue 20): `pip install mcp` into a venv under
# the build dir (made once, reused), then tests/integration/mcp_sdk_client.py connects over
# Streamable HTTP to a producer of a live pipeline, lists the tools with their schemas and
# calls the compiled "charge" twice with the same _meta key: one call, the same result.
# Without network the test is skipped (77), except under CI=true, where it fails.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
VENV=$ONCEQ_BUILD/mcp-venv
need_sdk() {
    if [[ "${CI:-}" == true ]]; then oq_fail "$1 (CI=true: the MCP SDK is required)"; fi
    echo "SKIP: $1"
    exit 77
}
if ! "$VENV/bin/python" -c 'import mcp.client.streamable_http' 2>/dev/null; then
    python3 -m venv "$VENV" >/dev/null 2>&1 || need_sdk "python3 -m venv failed (python3-venv)"
    timeout 600 "$VENV/bin/pip" install -q mcp >"$ONCEQ_BUILD/mcp-venv.log" 2>&1 ||
        need_sdk "pip install mcp failed: $(tail -3 "$ONCEQ_BUILD/mcp-venv.log")"
fi

PL_PRODUCER_X+=(--tools "$ONCEQ_SRC/examples/tools.json")
pl_start 1
timeout 120 "$VENV/bin/python" "$ONCEQ_SRC/tests/integration/mcp_sdk_client.py" \
    "http://127.0.0.1:$PORT/mcp" >"$T/sdk.json" 2>"$T/sdk.err" ||
    oq_fail "the SDK client failed: $(tail -20 "$T/sdk.err")"
oq_log "SDK: $(jq -c '{server, version, r1, r2, tools: (.tools | keys)}' "$T/sdk.json")"
jq -e '.server == "onceq" and (.version == "2025-11-25" or .version == "2025-06-18")
       and .tools.charge.schema.required == ["amount"] and .tools.charge.idempotent
       and .tools.pay.idempotent
       and .r1.isError == false and .r1 == .r2' "$T/sdk.json" >/dev/null ||
    oq_fail "SDK answers: $(cat "$T/sdk.json")"
[[ $(sqlite3 "$PDB" "SELECT count(*) FROM calls WHERE idem_key='sdk-charge-1'") == 1 ]] ||
    oq_fail "not one call for the key"
oq_pass "the MCP Python SDK lists and calls through /mcp"
