#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The tool catalogue over HTTP (issue 20, item 1): a producer started with --tools (and one
# with ONCEQ_TOOLS, and one under `onceq up --tools`) serves GET /v1/tools (the file's tools
# with input_schema and annotations, then the compiled ones); a submit naming a tool the catalogue lacks is 400 unknown_tool, arguments
# its input_schema refuses are 400 bad_args with the JSON pointer of the first violation, and
# neither writes anything (no call, no outbox row: nothing will be published, and the key stays
# free for a corrected submit); a good call is accepted. A tools file whose schema uses a
# keyword outside the supported subset stops the producer at start (exit 2, the pointer named).
# Without a catalogue GET /v1/tools is 404 and any tool name is accepted, as before.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir

cat >"$T/tools.json" <<'JSON'
{"version": 1, "tools": [
  {"name": "pay", "description": "Pay an invoice", "url": "http://127.0.0.1:9/pay",
   "idempotent": true, "lookup": {"url": "http://127.0.0.1:9/pay?k={effect_id}"},
   "input_schema": {"type": "object",
     "properties": {"amount": {"type": "integer", "minimum": 1},
                    "currency": {"enum": ["EUR", "USD"]},
                    "lines": {"type": "array", "items": {"type": "object",
                              "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}},
                              "required": ["sku"]}}},
     "required": ["amount", "currency"], "additionalProperties": false},
   "annotations": {"title": "Pay", "destructiveHint": false, "idempotentHint": true}}
]}
JSON

PORT=$(oq_free_port) || oq_fail "no free port"
DB=$T/calls.db
URL=http://127.0.0.1:$PORT
oq_spawn producer "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT" --tools "$T/tools.json"
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer did not come up"

post() { # post KEY BODY -> CODE, BODY
    CODE=$(curl -s -o "$T/body" -w '%{http_code}' --max-time 10 -X POST \
        -H 'Content-Type: application/json' -H "Idempotency-Key: $1" --data-binary "$2" \
        "$URL/v1/tool-calls")
    BODY=$(cat "$T/body")
}
expect() { # expect HTTP ERRCODE-or-empty what
    [[ "$CODE" == "$1" ]] || oq_fail "$3: expected HTTP $1, got $CODE: $BODY"
    if [[ -n "$2" ]]; then
        [[ "$(jq -r .error.code <<<"$BODY")" == "$2" ]] || oq_fail "$3: expected error $2: $BODY"
    fi
}
sql() { sqlite3 "$DB" "$1"; }
nothing_written() {
    [[ "$(sql 'SELECT count(*) FROM calls')" == "$1" && "$(sql 'SELECT count(*) FROM outbox')" == "$1" ]] ||
        oq_fail "$2: calls/outbox rows: $(sql 'SELECT count(*) FROM calls')/$(sql 'SELECT count(*) FROM outbox'), expected $1"
}

# --- GET /v1/tools ------------------------------------------------------------------------------
CODE=$(curl -s -o "$T/tools.out" -w '%{http_code}' "$URL/v1/tools")
[[ "$CODE" == 200 ]] || oq_fail "GET /v1/tools: $CODE $(cat "$T/tools.out")"
jq -e '.tools[0].name == "pay" and .tools[0].description == "Pay an invoice"
       and .tools[0].honours_keys == true and .tools[0].has_lookup == true
       and .tools[0].kind == "http"
       and .tools[0].input_schema.properties.amount.minimum == 1
       and .tools[0].annotations.idempotentHint == true' "$T/tools.out" >/dev/null ||
    oq_fail "pay entry: $(cat "$T/tools.out")"
jq -e '[.tools[].name] == ["pay","charge","send_email","sleep","fail"]
       and (.tools[] | select(.name == "charge") | .kind == "compiled"
            and .input_schema.required == ["amount"])' "$T/tools.out" >/dev/null ||
    oq_fail "tool list: $(cat "$T/tools.out")"
CODE=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$URL/v1/tools")
[[ "$CODE" == 405 ]] || oq_fail "POST /v1/tools: $CODE"

# --- refusals: nothing written ------------------------------------------------------------------
post u1 '{"tool":"refund","args":{"amount":5}}'
expect 400 unknown_tool "unknown tool"
post b1 '{"tool":"pay","args":{"amount":0,"currency":"EUR"}}'
expect 400 bad_args "amount 0"
[[ "$(jq -r .error.pointer <<<"$BODY")" == /amount && "$(jq -r .error.keyword <<<"$BODY")" == minimum ]] ||
    oq_fail "amount 0: pointer/keyword: $BODY"
post b2 '{"tool":"pay","args":{"amount":5}}'
expect 400 bad_args "missing currency"
[[ "$(jq -r .error.pointer <<<"$BODY")" == /currency && "$(jq -r .error.keyword <<<"$BODY")" == required ]] ||
    oq_fail "missing currency: $BODY"
post b3 '{"tool":"pay","args":{"amount":5,"currency":"EUR","lines":[{"sku":"ABC-1"},{"sku":"abc"}]}}'
expect 400 bad_args "bad sku"
[[ "$(jq -r .error.pointer <<<"$BODY")" == /lines/1/sku ]] || oq_fail "bad sku pointer: $BODY"
post b4 '{"tool":"pay","args":{"amount":5,"currency":"EUR","tip":1}}'
expect 400 bad_args "extra field"
[[ "$(jq -r .error.pointer <<<"$BODY")" == /tip ]] || oq_fail "extra field pointer: $BODY"
post b5 '{"tool":"charge","args":{"amount":"5"}}'
expect 400 bad_args "compiled tool schema"
[[ "$(jq -r .error.pointer <<<"$BODY")" == /amount ]] || oq_fail "charge pointer: $BODY"
nothing_written 0 "after refusals"

# --- good calls -----------------------------------------------------------------------------------
post g1 '{"tool":"pay","args":{"amount":5,"currency":"EUR","lines":[{"sku":"ABC-1"}]}}'
expect 202 "" "good pay"
[[ "$(jq -r .status <<<"$BODY")" == pending ]] || oq_fail "good pay body: $BODY"
post g2 '{"tool":"charge","args":{"amount":7}}'
expect 202 "" "good charge"
nothing_written 2 "after two good calls"
# the key of a refused submit was not taken: the corrected call is new, not a conflict
post b1 '{"tool":"pay","args":{"amount":1,"currency":"USD"}}'
expect 202 "" "corrected call with a refused key"
nothing_written 3 "after the corrected call"
kill -TERM "$(oq_pid producer)"
oq_wait_exit producer 15 || oq_fail "producer did not stop"

# --- ONCEQ_TOOLS, the environment form -------------------------------------------------------------
PORT2=$(oq_free_port) || oq_fail "no free port"
ONCEQ_TOOLS="$T/tools.json" oq_spawn producer2 "$ONCEQ_BIN" producer --db "$T/calls2.db" \
    --listen "127.0.0.1:$PORT2"
oq_wait_for 15 curl -sf "http://127.0.0.1:$PORT2/healthz" || oq_fail "producer2 did not come up"
curl -s "http://127.0.0.1:$PORT2/v1/tools" | jq -e '.tools[0].name == "pay"' >/dev/null ||
    oq_fail "ONCEQ_TOOLS: no catalogue"
kill -TERM "$(oq_pid producer2)"
oq_wait_exit producer2 15 || oq_fail "producer2 did not stop"

# --- without a catalogue: as before ---------------------------------------------------------------
PORT3=$(oq_free_port) || oq_fail "no free port"
oq_spawn producer3 "$ONCEQ_BIN" producer --db "$T/calls3.db" --listen "127.0.0.1:$PORT3"
oq_wait_for 15 curl -sf "http://127.0.0.1:$PORT3/healthz" || oq_fail "producer3 did not come up"
CODE=$(curl -s -o "$T/body" -w '%{http_code}' "http://127.0.0.1:$PORT3/v1/tools")
[[ "$CODE" == 404 && "$(jq -r .error.code "$T/body")" == not_found ]] ||
    oq_fail "GET /v1/tools without --tools: $CODE $(cat "$T/body")"
CODE=$(curl -s -o "$T/body" -w '%{http_code}' -X POST -H 'Idempotency-Key: x' \
    --data-binary '{"tool":"refund","args":{}}' "http://127.0.0.1:$PORT3/v1/tool-calls")
[[ "$CODE" == 202 ]] || oq_fail "without a catalogue any tool is accepted: $CODE $(cat "$T/body")"
kill -TERM "$(oq_pid producer3)"
oq_wait_exit producer3 15 || oq_fail "producer3 did not stop"

# --- onceq up passes the file to the producer (and the consumers) ---------------------------------
PORT5=$(oq_free_port) || oq_fail "no free port"
oq_spawn up "$ONCEQ_BIN" up --dir "$T/up" --listen "127.0.0.1:$PORT5" --consumers 1 \
    --tools "$T/tools.json"
oq_wait_for 60 curl -sf "http://127.0.0.1:$PORT5/healthz" || oq_fail "onceq up: producer not healthy"
CODE=$(curl -s -o "$T/body" -w '%{http_code}' "http://127.0.0.1:$PORT5/v1/tools")
[[ "$CODE" == 200 ]] && jq -e '.tools[0].name == "pay"' "$T/body" >/dev/null ||
    oq_fail "onceq up --tools: GET /v1/tools: $CODE $(cat "$T/body")"
CODE=$(curl -s -o "$T/body" -w '%{http_code}' -X POST -H 'Idempotency-Key: up-1' \
    --data-binary '{"tool":"pay","args":{"amount":"5","currency":"EUR"}}' \
    "http://127.0.0.1:$PORT5/v1/tool-calls")
[[ "$CODE" == 400 && "$(jq -r .error.pointer "$T/body")" == /amount ]] ||
    oq_fail "onceq up --tools: bad args: $CODE $(cat "$T/body")"
kill -TERM "$(oq_pid up)"
oq_wait_exit up 30 || oq_fail "onceq up did not stop"

# --- a schema outside the subset stops the start ---------------------------------------------------
cat >"$T/bad.json" <<'JSON'
{"tools": [{"name": "pay", "url": "http://127.0.0.1:9/pay",
            "input_schema": {"properties": {"lines": {"contains": {"type": "string"}}}}}]}
JSON
RC=0
"$ONCEQ_BIN" producer --db "$T/calls4.db" --listen "127.0.0.1:$(oq_free_port)" \
    --tools "$T/bad.json" >"$T/bad.out" 2>&1 || RC=$?
[[ $RC == 2 ]] || oq_fail "bad schema: exit $RC: $(cat "$T/bad.out")"
grep -q 'field input_schema: at /properties/lines/contains: keyword "contains" is not supported' \
    "$T/bad.out" || oq_fail "bad schema message: $(cat "$T/bad.out")"
[[ ! -e "$T/calls4.db" ]] || oq_fail "a refused start created calls.db"
oq_pass "tool catalogue over HTTP"
