#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The producer's HTTP API against a real `onceq producer` on a random loopback port: status
# codes and headers of new / replay / conflict, every error path (missing or bad key, bad
# JSON, bad types, unknown field, 413 at 5 MB, invalid UTF-8, nesting), fingerprint invariance
# (key order, whitespace, 1 vs 1.0), tenant scoping, GETs, /stats, /metrics, keep-alive, a
# delayed response retried with the same key, and a clean SIGTERM. Rows are checked in SQLite.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir

PORT=$(oq_free_port) || oq_fail "no free port"
DB=$T/calls.db
URL=http://127.0.0.1:$PORT
oq_spawn producer "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT"
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer did not come up"

# post KEY BODY [extra curl args...] -> sets CODE, BODY (response), HDRS
post() {
    local key=$1 body=$2
    shift 2
    local hk=()
    [[ -n "$key" ]] && hk=(-H "Idempotency-Key: $key")
    CODE=$(curl -s -o "$T/body" -D "$T/hdrs" -w '%{http_code}' --max-time 10 -X POST \
        -H 'Content-Type: application/json' "${hk[@]}" --data-binary "$body" "$@" \
        "$URL/v1/tool-calls")
    BODY=$(cat "$T/body")
    HDRS=$(tr -d '\r' <"$T/hdrs")
}
expect() { # expect CODE ERRCODE-or-empty what
    [[ "$CODE" == "$1" ]] || oq_fail "$3: expected HTTP $1, got $CODE: $BODY"
    if [[ -n "$2" ]]; then
        [[ "$(jq -r .error.code <<<"$BODY")" == "$2" ]] || oq_fail "$3: expected error $2: $BODY"
    fi
}
sql() { sqlite3 "$DB" "$1"; }

# --- new, replay, conflict ------------------------------------------------------------------
post k1 '{"tool":"charge","args":{"amount":5,"currency":"EUR"}}'
expect 202 "" "new call"
ID=$(jq -r .call_id <<<"$BODY")
[[ "$ID" == c_* ]] || oq_fail "no call_id: $BODY"
grep -qi "^Location: /v1/tool-calls/$ID\$" <<<"$HDRS" || oq_fail "no Location: $HDRS"
for f in call_id tenant idem_key fingerprint tool args status attempt result error created_at updated_at query_url; do
    jq -e "has(\"$f\")" <<<"$BODY" >/dev/null || oq_fail "call JSON lacks $f: $BODY"
done
[[ "$(jq -r .tenant <<<"$BODY")" == default && "$(jq -r .status <<<"$BODY")" == pending ]] ||
    oq_fail "bad defaults: $BODY"
FP=$(jq -r .fingerprint <<<"$BODY")

# replay with other key order, whitespace and 5.0 for 5: same fingerprint, same call, 202 in flight
post k1 $'{ "args" : { "currency":"EUR", "amount" : 5.0 },\n "tool":"charge" }'
expect 202 "" "in-flight replay"
[[ "$(jq -r .call_id <<<"$BODY")" == "$ID" ]] || oq_fail "replay changed call_id: $BODY"
[[ "$(jq -r .fingerprint <<<"$BODY")" == "$FP" ]] || oq_fail "fingerprint not invariant"
grep -qi '^Idempotent-Replayed: true$' <<<"$HDRS" || oq_fail "no Idempotent-Replayed: $HDRS"
post k1 '{"tool":"charge","args":{"amount":6,"currency":"EUR"}}'
expect 422 idempotency_conflict "conflict"
[[ "$(sql 'SELECT count(*) FROM calls')" == 1 && "$(sql 'SELECT count(*) FROM outbox')" == 1 ]] ||
    oq_fail "replay/conflict wrote rows"

# finished call: 200 + Idempotent-Replayed (state set directly, as the results ingest would)
sql "UPDATE calls SET state='succeeded', result='{\"ok\":true}' WHERE call_id='$ID'"
post k1 '{"tool":"charge","args":{"amount":5,"currency":"EUR"}}'
expect 200 "" "finished replay"
grep -qi '^Idempotent-Replayed: true$' <<<"$HDRS" || oq_fail "no Idempotent-Replayed on 200"
[[ "$(jq -r .status <<<"$BODY")" == succeeded && "$(jq -r .result.ok <<<"$BODY")" == true ]] ||
    oq_fail "finished replay body: $BODY"
# quoted key form of the IETF draft is the same key
post '"k1"' '{"tool":"charge","args":{"amount":5,"currency":"EUR"}}'
expect 200 "" "quoted key"

# --- tenants ----------------------------------------------------------------------------------
post tk '{"tool":"charge","tenant":"t1","args":{"amount":1}}'
expect 202 "" "tenant t1"
A=$(jq -r .call_id <<<"$BODY")
post tk '{"tool":"charge","tenant":"t2","args":{"amount":1}}'
expect 202 "" "tenant t2"
B=$(jq -r .call_id <<<"$BODY")
[[ "$A" != "$B" ]] || oq_fail "same key in two tenants gave one call"
C=$(curl -s "$URL/v1/tool-calls/by-key/tk?tenant=t2" | jq -r .call_id)
[[ "$C" == "$B" ]] || oq_fail "by-key tenant lookup: $C != $B"
C=$(curl -s "$URL/v1/tool-calls/$A" | jq -r .tenant)
[[ "$C" == t1 ]] || oq_fail "get by id tenant: $C"
CODE=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/tool-calls/by-key/tk")
[[ "$CODE" == 404 ]] || oq_fail "by-key in default tenant should be 404, got $CODE"

# --- error paths ------------------------------------------------------------------------------
post "" '{"tool":"charge","args":{}}'
expect 400 missing_idempotency_key "missing key"
post "$(printf 'x%.0s' {1..256})" '{"tool":"charge","args":{}}'
expect 400 invalid_idempotency_key "256-byte key"
post "$(printf 'y%.0s' {1..255})" '{"tool":"charge","args":{}}'
expect 202 "" "255-byte key"
post e1 '{"tool":"charge","args":{'
expect 400 bad_request "bad JSON"
post e2 '{"tool":5,"args":{}}'
expect 400 bad_request "tool not a string"
post e3 '{"tool":"charge","args":[1]}'
expect 400 bad_request "args not an object"
post e4 '{"tool":"charge"}'
expect 400 bad_request "missing args"
post e5 '{"tool":"charge","args":{},"bogus":1}'
expect 400 bad_request "unknown field"
post e6 '{"tool":"charge","args":{"a":1,"a":2}}'
expect 400 bad_request "duplicate key"
post e7 "{\"tool\":\"charge\",\"args\":{\"d\":$(printf '[%.0s' {1..100})1$(printf ']%.0s' {1..100})}}"
expect 400 bad_request "nesting depth"
printf '{"tool":"charge","args":{"s":"\xc3\x28"}}' >"$T/badutf8"
post e8 "@$T/badutf8"
expect 400 bad_request "invalid UTF-8"
head -c 5000000 /dev/zero | tr '\0' 'a' >"$T/big"
post e9 "@$T/big"
expect 413 payload_too_large "5 MB body"
post e10 "@$T/big" -H 'Transfer-Encoding: chunked'
[[ "$CODE" == 413 || "$CODE" == 000 ]] || oq_fail "5 MB chunked body: HTTP $CODE"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key LIKE 'e%'")" == 0 ]] || oq_fail "errors wrote rows"
curl -sf "$URL/healthz" >/dev/null || oq_fail "server stopped serving after bad requests"
CODE=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/tool-calls/c_0000000000000000")
[[ "$CODE" == 404 ]] || oq_fail "unknown call: $CODE"
CODE=$(curl -s -o /dev/null -w '%{http_code}' "$URL/nope")
[[ "$CODE" == 404 ]] || oq_fail "unknown path: $CODE"
CODE=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$URL/v1/tool-calls/$A")
[[ "$CODE" == 405 ]] || oq_fail "DELETE: $CODE"

# --- stats, metrics, keep-alive ----------------------------------------------------------------
S=$(curl -s "$URL/stats")
N=$(sql 'SELECT count(*) FROM calls')
[[ "$(jq -r .calls <<<"$S")" == "$N" && "$(jq -r .by_status.succeeded <<<"$S")" == 1 ]] ||
    oq_fail "stats: $S (calls in db: $N)"
jq -e 'has("effects")' <<<"$S" >/dev/null || oq_fail "stats lacks effects: $S"
curl -s "$URL/metrics" | grep -q '^onceq_producer_submits_total{outcome="new"} ' ||
    oq_fail "metrics lack submits_total"
curl -sv "$URL/healthz" "$URL/stats" 2>&1 >/dev/null | grep -qi 're-using existing connection' ||
    oq_fail "keep-alive: second request did not reuse the connection"

# --- delayed response, then a retry with the same key: one call --------------------------------
# Another writer holds the lock for 3 s; the client gives up after 1 s and retries.
(echo "BEGIN IMMEDIATE;"; sleep 3; echo "COMMIT;") | sqlite3 "$DB" &
LOCKPID=$!
oq_on_exit "kill $LOCKPID 2>/dev/null"
sleep 0.3
post slow '{"tool":"charge","args":{"amount":3}}' --max-time 1
[[ "$CODE" == 000 ]] || oq_fail "expected a client timeout while the lock is held, got $CODE"
wait $LOCKPID
post slow '{"tool":"charge","args":{"amount":3}}'
[[ "$CODE" == 202 ]] || oq_fail "retry after delayed response: $CODE $BODY"
grep -qi '^Idempotent-Replayed: true$' <<<"$HDRS" || oq_fail "retry was not a replay: $HDRS"
[[ "$(sql "SELECT count(*) FROM calls WHERE idem_key='slow'")" == 1 ]] || oq_fail "duplicate call"
[[ "$(sql "SELECT count(*) FROM outbox o JOIN calls c ON o.key=c.call_id WHERE c.idem_key='slow'")" == 1 ]] ||
    oq_fail "duplicate outbox row"

# --- concurrent same key over HTTP: one call_id -------------------------------------------------
CPIDS=()
for i in $(seq 16); do
    curl -s --max-time 10 -X POST -H 'Idempotency-Key: conc' \
        --data-binary '{"tool":"charge","args":{"amount":2}}' "$URL/v1/tool-calls" >"$T/conc.$i" &
    CPIDS+=($!)
done
wait "${CPIDS[@]}"
U=$(cat "$T"/conc.* | jq -r .call_id | sort -u | wc -l)
[[ "$U" == 1 ]] || oq_fail "16 concurrent same-key submits gave $U call ids"

# --- SIGTERM: clean exit ----------------------------------------------------------------------
kill -TERM "$(oq_pid producer)"
oq_wait_exit producer 15
RC=$?
[[ $RC == 0 ]] || oq_fail "producer exit code after SIGTERM: $RC"
oq_pass "producer HTTP API"
