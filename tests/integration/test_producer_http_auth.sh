#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# API tokens and tenant isolation (issue 14, item 4), against `onceq producer --token-file`:
#  - /v1/ without a token, or with an unknown one, is 401 with WWW-Authenticate: Bearer and
#    writes nothing; a token's tenant is the request's tenant; a different tenant in the body
#    or the query is 403 tenant_mismatch; another tenant's call is 404 with the very body of
#    a call that does not exist; a token given as its SHA-256 (sha256:HEX) works;
#  - /metrics and /stats: --metrics-access token needs a metrics token (an API token is not
#    one); the default (loopback) refuses a client whose address is not loopback;
#    /healthz and /readyz stay open;
#  - SIGHUP reloads the token file; a malformed file on reload keeps the tokens in use; a
#    malformed file at start is a usage error that names the line and never the token;
#  - call ids are "c_" + 32 hex, and a call stored under a 16-hex id of the first format is
#    still served.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir

SHOP=tok-shop-0123456789abcdef
BILL=tok-bill-0123456789abcdef
METR=tok-metrics-0123456789abcdef
BILL_SHA=$(printf '%s' "$BILL" | sha256sum | cut -d' ' -f1)
cat >"$T/tokens" <<EOF
# onceq API tokens: TOKEN TENANT
$SHOP shop

sha256:$BILL_SHA billing
EOF
echo "$METR" >"$T/mtokens"
chmod 600 "$T/tokens" "$T/mtokens"

PORT=$(oq_free_port) || oq_fail "no free port"
DB=$T/calls.db
URL=http://127.0.0.1:$PORT
oq_spawn producer "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT" \
    --token-file "$T/tokens" --metrics-access token --metrics-token-file "$T/mtokens"
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer did not come up"
sql() { sqlite3 "$DB" "$1"; }

# req METHOD PATH TOKEN [BODY] [KEY] -> CODE, BODY, HDRS
req() {
    local m=$1 path=$2 tok=$3 body=${4:-} key=${5:-}
    local a=()
    [[ -n "$tok" ]] && a+=(-H "Authorization: Bearer $tok")
    [[ -n "$key" ]] && a+=(-H "Idempotency-Key: $key")
    [[ -n "$body" ]] && a+=(--data-binary "$body")
    CODE=$(curl -s -o "$T/body" -D "$T/hdrs" -w '%{http_code}' --max-time 10 -X "$m" "${a[@]}" \
        "$URL$path")
    BODY=$(cat "$T/body")
    HDRS=$(tr -d '\r' <"$T/hdrs")
}
expect() { # expect CODE ERRCODE-or-empty what
    [[ "$CODE" == "$1" ]] || oq_fail "$3: expected HTTP $1, got $CODE: $BODY"
    if [[ -n "$2" ]]; then
        [[ "$(jq -r .error.code <<<"$BODY")" == "$2" ]] || oq_fail "$3: expected error $2: $BODY"
    fi
}
CALL='{"tool":"charge","args":{"amount":7}}'

# --- 401 -----------------------------------------------------------------------------------------
req POST /v1/tool-calls "" "$CALL" k1
expect 401 unauthorized "submit without a token"
grep -qi '^WWW-Authenticate: Bearer realm="onceq"$' <<<"$HDRS" || oq_fail "no WWW-Authenticate: $HDRS"
req POST /v1/tool-calls "tok-nobody-0123456789abcdef" "$CALL" k1
expect 401 unauthorized "submit with an unknown token"
grep -qi '^WWW-Authenticate: Bearer .*error="invalid_token"' <<<"$HDRS" ||
    oq_fail "no invalid_token in WWW-Authenticate: $HDRS"
CODE=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Basic $SHOP" -H 'Idempotency-Key: k1' \
    --data-binary "$CALL" "$URL/v1/tool-calls")
[[ "$CODE" == 401 ]] || oq_fail "Basic scheme accepted: $CODE"
[[ "$(sql 'SELECT count(*) FROM calls')" == 0 ]] || oq_fail "a refused request wrote a call"

# --- the token's tenant ---------------------------------------------------------------------------
req POST /v1/tool-calls "$SHOP" "$CALL" k1
expect 202 "" "submit with the shop token"
SHOP_ID=$(jq -r .call_id <<<"$BODY")
[[ "$(jq -r .tenant <<<"$BODY")" == shop ]] || oq_fail "tenant is not the token's: $BODY"
[[ "$SHOP_ID" =~ ^c_[0-9a-f]{32}$ ]] || oq_fail "call id format: $SHOP_ID"
req POST /v1/tool-calls "$SHOP" '{"tool":"charge","tenant":"shop","args":{"amount":7}}' k1
expect 202 "" "same tenant named in the body"
[[ "$(jq -r .call_id <<<"$BODY")" == "$SHOP_ID" ]] || oq_fail "body tenant = token tenant is another call"
req POST /v1/tool-calls "$SHOP" '{"tool":"charge","tenant":"billing","args":{"amount":7}}' k2
expect 403 tenant_mismatch "another tenant in the body"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key='k2'")" == 0 ]] || oq_fail "403 wrote a call"
req POST /v1/tool-calls "$BILL" "$CALL" k1
expect 202 "" "submit with the billing token (sha256 form in the file)"
BILL_ID=$(jq -r .call_id <<<"$BODY")
[[ "$(jq -r .tenant <<<"$BODY")" == billing && "$BILL_ID" != "$SHOP_ID" ]] ||
    oq_fail "billing's k1 is not its own call: $BODY"

# --- reads: another tenant's call is exactly "not found" ----------------------------------------
req GET "/v1/tool-calls/$SHOP_ID" "$SHOP"
expect 200 "" "own call"
req GET "/v1/tool-calls/$SHOP_ID" "$BILL"
expect 404 not_found "another tenant's call"
OTHER=$BODY
req GET "/v1/tool-calls/c_0123456789abcdef0123456789abcdef" "$BILL"
expect 404 not_found "a call that does not exist"
[[ "$OTHER" == "$BODY" ]] || oq_fail "404 bodies differ: '$OTHER' vs '$BODY'"
req GET "/v1/tool-calls/$SHOP_ID" ""
expect 401 unauthorized "read without a token"
req GET /v1/tool-calls/by-key/k1 "$BILL"
expect 200 "" "by-key in the token's tenant"
[[ "$(jq -r .call_id <<<"$BODY")" == "$BILL_ID" ]] || oq_fail "by-key gave another tenant's call"
req GET "/v1/tool-calls/by-key/k1?tenant=shop" "$BILL"
expect 403 tenant_mismatch "by-key with another tenant in the query"
req GET "/v1/tool-calls/by-key/k1?tenant=billing" "$BILL"
expect 200 "" "by-key naming the token's own tenant"

# --- /metrics, /stats, /healthz, /readyz --------------------------------------------------------
for p in /metrics /stats; do
    req GET $p ""
    expect 401 unauthorized "$p without a token"
    req GET $p "$SHOP"
    expect 401 unauthorized "$p with an API token"
    req GET $p "$METR"
    expect 200 "" "$p with the metrics token"
done
req GET /healthz ""
expect 200 "" "/healthz is open"
req GET /readyz ""
expect 200 "" "/readyz is open"
curl -s -H "Authorization: Bearer $METR" "$URL/metrics" |
    awk '$1 == "onceq_http_auth_failures_total" {exit !($2 >= 8)}' ||
    oq_fail "onceq_http_auth_failures_total did not count the 401s"

# --- SIGHUP reload ---------------------------------------------------------------------------------
SHOP2=tok-shop-second-0123456789
printf '%s shop\nsha256:%s billing\n' "$SHOP2" "$BILL_SHA" >"$T/tokens.new"
mv "$T/tokens.new" "$T/tokens"
N0=$(grep -c 'tokens loaded' "$T/producer.log")
reloaded() { (($(grep -c 'tokens loaded' "$T/producer.log") > N0)); }
kill -HUP "$(oq_pid producer)"
oq_wait_for 10 reloaded || oq_fail "no reload after SIGHUP"
req GET "/v1/tool-calls/$SHOP_ID" "$SHOP"
expect 401 unauthorized "a token removed by the reload"
req GET "/v1/tool-calls/$SHOP_ID" "$SHOP2"
expect 200 "" "a token added by the reload"
echo "this line is not a token" >"$T/tokens"
kill -HUP "$(oq_pid producer)"
oq_wait_for 10 grep -q 'SIGHUP: .*tokens in use are kept' "$T/producer.log" ||
    oq_fail "a malformed file on reload was not reported"
grep -q 'this line is not a token\|not-a-token' "$T/producer.log" && oq_fail "the log shows the file's text"
req GET "/v1/tool-calls/$SHOP_ID" "$SHOP2"
expect 200 "" "tokens kept after a failed reload"

# --- a call id of the first format (16 hex) is still served ------------------------------------
sql "UPDATE calls SET call_id='c_00000000deadbeef' WHERE call_id='$BILL_ID'"
req GET /v1/tool-calls/c_00000000deadbeef "$BILL"
expect 200 "" "a 16-hex call id of the first format"
[[ "$(jq -r .idem_key <<<"$BODY")" == k1 ]] || oq_fail "old-format id read: $BODY"

# --- start-up errors ---------------------------------------------------------------------------
printf '%s shop\nshort billing\n' "$SHOP" >"$T/bad-tokens"
"$ONCEQ_BIN" producer --db "$T/bad.db" --listen "127.0.0.1:$(oq_free_port)" \
    --token-file "$T/bad-tokens" >"$T/bad.out" 2>&1
RC=$?
[[ $RC == 2 ]] || oq_fail "malformed token file at start: exit $RC (expected 2): $(cat "$T/bad.out")"
grep -q "bad-tokens line 2" "$T/bad.out" || oq_fail "the error does not name the line: $(cat "$T/bad.out")"
grep -q "$SHOP\|short" "$T/bad.out" && oq_fail "the error shows a token: $(cat "$T/bad.out")"
"$ONCEQ_BIN" producer --db "$T/bad.db" --metrics-access token >"$T/bad.out" 2>&1
[[ $? == 2 ]] || oq_fail "--metrics-access token without a token file was accepted"
oq_kill producer

# --- default metrics access: loopback peers only ----------------------------------------------------
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
oq_spawn producer2 "$ONCEQ_BIN" producer --db "$T/open.db" --listen "127.0.0.1:$PORT"
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer 2 did not come up"
req GET /stats ""
expect 200 "" "/stats from loopback"
# a client whose source is a local non-loopback address (the server still listens on loopback)
SRC=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9.]+$' | grep -v '^127\.' | head -n1)
if [[ -n "$SRC" ]] && curl -sf --max-time 3 --interface "$SRC" "$URL/healthz" >/dev/null; then
    for p in /stats /metrics; do
        CODE=$(curl -s -o "$T/body" -w '%{http_code}' --max-time 3 --interface "$SRC" "$URL$p")
        [[ "$CODE" == 403 && "$(jq -r .error.code <"$T/body")" == forbidden ]] ||
            oq_fail "$p from non-loopback $SRC: HTTP $CODE $(cat "$T/body")"
    done
else
    oq_log "no local non-loopback address reaches 127.0.0.1: the refusal branch is not exercised"
fi
# without tokens /v1/ stays open (the default)
req POST /v1/tool-calls "" "$CALL" k1
expect 202 "" "no token file: no authentication"
oq_pass "tokens, tenant isolation, metrics access, reload, call-id formats"
