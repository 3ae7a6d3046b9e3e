#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Input the producer must refuse rather than reinterpret (issue 17, items 5 and 9a), from a raw
# socket client (tests/tools/http_raw.py) where curl would not send the bytes:
#  - POST /v1/tool-calls?tenant=X: 400 bad_request, nothing written (the submit's tenant is in
#    its body; the query was ignored and the call landed in "default");
#  - %00 in a path or a query value: refused, never cut there (by-key/k1%00zz read k1's call,
#    ?tenant=default%00x read the tenant "default");
#  - a NUL inside a header value (Idempotency-Key, another header, the bearer token): 400
#    bad_request, nothing written. libmicrohttpd 0.9.75 (Debian 12) cuts such a value at the NUL
#    and reports the cut length; `nul\0A` was stored as the key `nul` and `Bearer T\0junk`
#    authenticated as T.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
RAW="python3 $ONCEQ_SRC/tests/tools/http_raw.py"
PORT=$(oq_free_port) || oq_fail "no free port"
DB=$T/calls.db
oq_spawn producer "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT"
oq_wait_for 15 curl -sf "http://127.0.0.1:$PORT/healthz" || oq_fail "producer did not come up"
sql() { sqlite3 "$DB" "$1"; }
CALL='{"tool":"charge","args":{"amount":1}}'
JSON='Content-Type: application/json'

expect() { # expect "CODE BODY" CODE ERRCODE what
    local code=${1%% *} body=${1#* }
    [[ "$code" == "$2" ]] || oq_fail "$4: expected HTTP $2, got: $1"
    [[ -z "$3" || "$(jq -r .error.code <<<"$body")" == "$3" ]] || oq_fail "$4: expected $3: $1"
}

# --- ?tenant= on a submit ----------------------------------------------------------------------
R=$($RAW "$PORT" POST '/v1/tool-calls?tenant=shop' --header 'Idempotency-Key: q1' \
    --header "$JSON" --body "$CALL")
expect "$R" 400 bad_request "?tenant= on a POST"
R=$($RAW "$PORT" POST '/v1/tool-calls?tenant=default' --header 'Idempotency-Key: q2' \
    --header "$JSON" --body "$CALL")
expect "$R" 400 bad_request "?tenant=default on a POST"
[[ "$(sql "SELECT count(*) FROM calls")" == 0 ]] || oq_fail "a refused ?tenant= wrote a call"

# --- %00 in a path or a query --------------------------------------------------------------------
R=$($RAW "$PORT" POST /v1/tool-calls --header 'Idempotency-Key: k1' --header "$JSON" --body "$CALL")
expect "$R" 202 "" "a plain submit"
R=$($RAW "$PORT" GET '/v1/tool-calls/by-key/k1%00zz')
expect "$R" 400 invalid_idempotency_key "by-key/k1%00zz"
R=$($RAW "$PORT" GET '/v1/tool-calls/by-key/k1?tenant=default%00x')
expect "$R" 400 bad_request "?tenant=default%00x"
R=$($RAW "$PORT" GET '/v1/tool-calls/by-key/k1')
expect "$R" 200 "" "by-key/k1 itself"

# --- NUL inside a header value ------------------------------------------------------------------
# libmicrohttpd 0.9.75 cuts the value at the NUL itself; the guard (common/mhd.c) finds the rest
R=$($RAW "$PORT" POST /v1/tool-calls --header 'Idempotency-Key: nul\0A' --header "$JSON" \
    --body "$CALL")
expect "$R" 400 bad_request "a NUL inside Idempotency-Key"
R=$($RAW "$PORT" POST /v1/tool-calls --header 'Idempotency-Key: nul' --header "$JSON" \
    --header 'X-Trace: a\0b' --body "$CALL")
expect "$R" 400 bad_request "a NUL inside another header"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key LIKE 'nul%'")" == 0 ]] ||
    oq_fail "a refused NUL key wrote a call: $(sql "SELECT hex(idem_key) FROM calls")"
R=$($RAW "$PORT" POST /v1/tool-calls --header 'Idempotency-Key: nul' --header "$JSON" \
    --body "$CALL")
expect "$R" 202 "" "the key nul itself"
oq_kill producer

# a bearer token cut at a NUL is not the token
TOKEN=input-test-token-0123456789
printf '%s shop\n' "$TOKEN" >"$T/tokens"
chmod 600 "$T/tokens"
PORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn producer2 "$ONCEQ_BIN" producer --db "$T/b.db" --listen "127.0.0.1:$PORT" \
    --token-file "$T/tokens"
oq_wait_for 15 curl -sf "http://127.0.0.1:$PORT/healthz" || oq_fail "producer 2 did not come up"
R=$($RAW "$PORT" POST /v1/tool-calls --header "Authorization: Bearer $TOKEN\\0junk" \
    --header 'Idempotency-Key: t1' --header "$JSON" --body "$CALL")
expect "$R" 400 bad_request "a NUL inside the bearer token"
R=$($RAW "$PORT" POST /v1/tool-calls --header "Authorization: Bearer $TOKEN" \
    --header 'Idempotency-Key: t1' --header "$JSON" --body "$CALL")
expect "$R" 202 "" "the token itself"
oq_pass "?tenant= on a submit, %00 in paths and queries, NUL in header values: refused"
