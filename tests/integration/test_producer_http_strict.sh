#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Strict HTTP input and readiness (issue 14, item 5, the HTTP parts), against `onceq producer`:
#  - two Idempotency-Key headers: 400 invalid_idempotency_key (not the first one silently);
#  - a key that ends with a space (or, in the quoted form, begins or ends with one): 400
#    invalid_idempotency_key; spaces before the value are not part of it (HTTP), so
#    "Idempotency-Key:   lead" is the key "lead";
#  - an empty tenant in the body or in ?tenant=: 400 bad_request (not silently "default");
#  - an HTTP/1.1 request without Host, or with two: 400; HTTP/1.0 without Host is served;
#  - 1e-400 in a body: 400 bad_request (it would read as 0); 0.0 is fine;
#  - /readyz: 200 on a writable database; 503 naming the cause when calls.db is read-only
#    (every submit would be 503) while /healthz stays 200; 503 when the results ingest's
#    brokers do not answer, 200 once they do.
# Nothing refused writes a row.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir

PORT=$(oq_free_port) || oq_fail "no free port"
DB=$T/calls.db
URL=http://127.0.0.1:$PORT
oq_spawn producer "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT"
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer did not come up"
sql() { sqlite3 "$DB" "$1"; }
CALL='{"tool":"charge","args":{"amount":1}}'

# post BODY [curl args...] -> CODE, BODY
post() {
    local body=$1
    shift
    CODE=$(curl -s -o "$T/body" -w '%{http_code}' --max-time 10 -X POST "$@" \
        --data-binary "$body" "$URL/v1/tool-calls")
    BODY=$(cat "$T/body")
}
expect() { # expect CODE ERRCODE-or-empty what
    [[ "$CODE" == "$1" ]] || oq_fail "$3: expected HTTP $1, got $CODE: $BODY"
    if [[ -n "$2" ]]; then
        [[ "$(jq -r .error.code <<<"$BODY")" == "$2" ]] || oq_fail "$3: expected error $2: $BODY"
    fi
}

# --- Idempotency-Key ----------------------------------------------------------------------------
post "$CALL" -H 'Idempotency-Key: dup-a' -H 'Idempotency-Key: dup-b'
expect 400 invalid_idempotency_key "two Idempotency-Key headers"
post "$CALL" -H 'Idempotency-Key: trail  '
expect 400 invalid_idempotency_key "a key ending with spaces"
post "$CALL" -H 'Idempotency-Key: " quoted"'
expect 400 invalid_idempotency_key "a quoted key beginning with a space"
post "$CALL" -H 'Idempotency-Key: "quoted "'
expect 400 invalid_idempotency_key "a quoted key ending with a space"
post "$CALL" -H 'Idempotency-Key: in side'
expect 202 "" "a space inside a key is fine"
post "$CALL" -H 'Idempotency-Key:    lead'
expect 202 "" "spaces before the header value"
[[ "$(jq -r .idem_key <<<"$BODY")" == lead ]] || oq_fail "leading spaces kept: $BODY"
post "$CALL" -H 'Idempotency-Key: lead'
expect 202 "" "the same key without the spaces"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key='lead'")" == 1 ]] ||
    oq_fail "'   lead' and 'lead' are two calls"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key LIKE 'dup%' OR idem_key LIKE '%trail%' OR idem_key LIKE '%quoted%'")" == 0 ]] ||
    oq_fail "a refused key wrote a row"

# --- tenants ----------------------------------------------------------------------------------------
post '{"tool":"charge","tenant":"","args":{"amount":1}}' -H 'Idempotency-Key: empty-tenant'
expect 400 bad_request "an empty tenant"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key='empty-tenant'")" == 0 ]] ||
    oq_fail "an empty tenant wrote a call"
CODE=$(curl -s -o "$T/body" -w '%{http_code}' "$URL/v1/tool-calls/by-key/lead?tenant=")
BODY=$(cat "$T/body")
expect 400 bad_request "an empty ?tenant="
CODE=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/tool-calls/by-key/lead")
[[ "$CODE" == 200 ]] || oq_fail "by-key without tenant (default): $CODE"

# --- Host ---------------------------------------------------------------------------------------------
CODE=$(curl -s -o "$T/body" -w '%{http_code}' -H 'Host:' "$URL/healthz")
BODY=$(cat "$T/body")
expect 400 bad_request "HTTP/1.1 without Host"
post "$CALL" -H 'Host:' -H 'Idempotency-Key: no-host'
expect 400 bad_request "HTTP/1.1 submit without Host"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key='no-host'")" == 0 ]] || oq_fail "no-Host submit wrote"
# curl sends one Host whatever it is given: write this request by hand
raw_status() { # raw_status REQUEST-TEXT -> the status code of the answer
    timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "%b" "$2" >&3 && head -n1 <&3' \
        _ "$PORT" "$1" | awk '{print $2}'
}
CODE=$(raw_status 'GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n')
BODY="(raw request)"
expect 400 "" "two Host headers"
CODE=$(raw_status 'GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n')
expect 200 "" "one Host header (raw request)"
CODE=$(curl -s -o /dev/null -w '%{http_code}' -0 -H 'Host:' "$URL/healthz")
[[ "$CODE" == 200 ]] || oq_fail "HTTP/1.0 without Host: $CODE"

# --- number underflow -----------------------------------------------------------------------------------
post '{"tool":"charge","args":{"amount":1,"rate":1e-400}}' -H 'Idempotency-Key: tiny'
expect 400 bad_request "1e-400"
[[ "$(jq -r .error.message <<<"$BODY")" == *"too small"* ]] || oq_fail "1e-400 message: $BODY"
post '{"tool":"charge","args":{"amount":1,"rate":0.0}}' -H 'Idempotency-Key: zero'
expect 202 "" "0.0"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key='tiny'")" == 0 ]] || oq_fail "1e-400 wrote a call"

# --- /readyz --------------------------------------------------------------------------------------------
CODE=$(curl -s -o "$T/body" -w '%{http_code}' "$URL/readyz")
R=$(cat "$T/body")
[[ "$CODE" == 200 && "$(jq -r .status <<<"$R")" == ready && "$(jq -r .database <<<"$R")" == ok ]] ||
    oq_fail "/readyz on a writable database: $CODE $R"
curl -s "$URL/metrics" | grep -q '^onceq_http_ready 1$' || oq_fail "onceq_http_ready is not 1"
oq_kill producer

# A read-only calls.db: the producer starts and answers /healthz, but no submit can commit.
# Root writes read-only files anyway, so as root the producer runs as nobody.
RO=$T/ro
mkdir -p "$RO"
for f in "$DB" "$DB-wal" "$DB-shm"; do [[ -f "$f" ]] && cp "$f" "$RO/"; done
RUN=()
if [[ $(id -u) == 0 ]]; then
    command -v setpriv >/dev/null || oq_fail "setpriv is needed to run a producer as nobody"
    chmod 755 "$T"
    chmod 777 "$RO"
    chown -R nobody "$RO"
    RUN=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
fi
chmod 444 "$RO/calls.db"
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
oq_spawn producer_ro "${RUN[@]}" "$ONCEQ_BIN" producer --db "$RO/calls.db" --listen "127.0.0.1:$PORT"
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer on a read-only file did not come up"
post "$CALL" -H 'Idempotency-Key: ro-1'
[[ "$CODE" == 503 ]] || oq_fail "a submit into a read-only database: HTTP $CODE (expected 503): $BODY"
unready() {
    curl -s -o "$T/body" -w '%{http_code}' "$URL/readyz" >"$T/code"
    [[ "$(cat "$T/code")" == 503 ]]
}
oq_wait_for 5 unready || oq_fail "/readyz on a read-only database: $(cat "$T/code") $(cat "$T/body")"
R=$(cat "$T/body")
oq_log "/readyz read-only: $R"
[[ "$(jq -r .status <<<"$R")" == unready && "$(jq -r .database <<<"$R")" == *read-only* ]] ||
    oq_fail "/readyz does not name the cause: $R"
curl -sf "$URL/healthz" >/dev/null || oq_fail "/healthz must stay 200 (liveness)"
grep -qE 'msg="not ready( yet)?" database="read-only' "$T/producer_ro.log" || oq_fail "no log line for unready"
oq_kill producer_ro

# The results ingest's brokers do not answer: unready; a broker that answers: ready.
DEAD=$(oq_free_port) || oq_fail "no free port"
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
oq_spawn producer_k "$ONCEQ_BIN" producer --db "$T/k.db" --listen "127.0.0.1:$PORT" \
    --brokers "127.0.0.1:$DEAD"
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer with a dead broker did not come up"
kafka_down() { unready && [[ "$(jq -r .kafka <"$T/body")" == unreachable* ]]; }
oq_wait_for 10 kafka_down || oq_fail "/readyz with no broker: $(cat "$T/code") $(cat "$T/body")"
R=$(cat "$T/body")
oq_log "/readyz no broker: $R"
[[ "$(jq -r .kafka <<<"$R")" == unreachable* && "$(jq -r .database <<<"$R")" == ok ]] ||
    oq_fail "/readyz with no broker: $R"
oq_kill producer_k
oq_start_broker
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
oq_spawn producer_k2 "$ONCEQ_BIN" producer --db "$T/k.db" --listen "127.0.0.1:$PORT" \
    --brokers "$BROKERS"
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer with a broker did not come up"
ready() { [[ "$(curl -s -o "$T/body" -w '%{http_code}' "$URL/readyz")" == 200 ]]; }
oq_wait_for 15 ready || oq_fail "/readyz with a live broker: $(cat "$T/body")"
[[ "$(jq -r .kafka <"$T/body")" == ok ]] || oq_fail "/readyz kafka: $(cat "$T/body")"
oq_pass "strict keys, tenants, Host, number underflow, /readyz"
