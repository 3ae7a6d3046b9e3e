#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# onceq.submit(...) in SQL: the Python example (examples/clients/submit_in_pg_tx.py: commit one
# call, rollback none, replay, conflict as an integrity error); the SQL and the C producer agree
# on keys (a call made in SQL is a replay for the HTTP API with the same args in another key
# order and number form, and the other way round); the outbox row SQL writes is the C envelope
# (canonical JSON, the fields a consumer checks); two sessions submitting one key at once make
# one call (the second waits for the first's commit, then replays).
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
/usr/bin/python3 -c 'import psycopg2' 2>/dev/null || {
    [[ "${CI:-}" == true ]] && oq_fail "python3-psycopg2 missing under CI=true"
    echo "SKIP: needs python3-psycopg2"
    exit 77
}
URL=$(oq_pg_fresh_db onceq_it_submit_sql)
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "migrate"
q() { psql -XAtq "$URL" -c "$1"; }

/usr/bin/python3 "$ONCEQ_SRC/examples/clients/submit_in_pg_tx.py" "$URL" || oq_fail "Python example"

# SQL first, then HTTP with the same request written differently
read -r SQL_ID SQL_OUT < <(q "SELECT call_id, outcome FROM onceq.submit('default', 'x-1', 'charge', '{\"b\":[1,2.5,1e21],\"a\":\"\u00e9\n\"}')" | tr '|' ' ')
[[ "$SQL_OUT" == new ]] || oq_fail "SQL submit: $SQL_OUT"
PORT=$(oq_free_port)
oq_spawn producer "$ONCEQ_BIN" producer --db "$URL" --listen "127.0.0.1:$PORT"
oq_wait_for 30 curl -fsS "http://127.0.0.1:$PORT/readyz" -o /dev/null || oq_fail "never ready"
api=http://127.0.0.1:$PORT/v1/tool-calls
curl -s -o "$T/r1" -X POST "$api" -H 'Idempotency-Key: x-1' -H 'Content-Type: application/json' \
    -d '{"tool":"charge","args":{"a":"\u00e9\n","b":[1.0,2.50,1E21]}}'
[[ "$(jq -r .call_id "$T/r1")" == "$SQL_ID" ]] || oq_fail "HTTP did not replay the SQL call: $(cat "$T/r1")"
# HTTP first, then SQL
curl -s -o "$T/r2" -X POST "$api" -H 'Idempotency-Key: y-1' -H 'Content-Type: application/json' \
    -d '{"tool":"charge","args":{"amount":0.1,"nested":{"z":[true,null],"\ud83d\ude02":"x","\ue000":1}}}'
HTTP_ID=$(jq -r .call_id "$T/r2")
read -r ID2 OUT2 < <(q "SELECT call_id, outcome FROM onceq.submit('default', 'y-1', 'charge', '{\"nested\":{\"\ue000\":1,\"\ud83d\ude02\":\"x\",\"z\":[true,null]},\"amount\":1e-1}')" | tr '|' ' ')
[[ "$ID2" == "$HTTP_ID" && "$OUT2" == replay ]] || oq_fail "SQL did not replay the HTTP call: $ID2 $OUT2"
oq_kill producer TERM

# the outbox row written in SQL is the C envelope
P=$(q "SELECT payload FROM onceq.outbox WHERE key = '$SQL_ID'")
[[ "$(printf '%s\n' "$P" | "$(oq_tool oq_fp_batch)" --canon)" == "$P" ]] || oq_fail "payload not canonical: $P"
FP=$(q "SELECT fingerprint FROM onceq.calls WHERE call_id = '$SQL_ID'")
MID=$(q "SELECT message_id FROM onceq.outbox WHERE key = '$SQL_ID'")
printf '%s' "$P" | jq -e --arg id "$SQL_ID" --arg fp "$FP" --arg mid "$MID" \
    '.v == 1 and .kind == "tool_call" and .attempt == 1 and .call_id == $id and .fingerprint == $fp
     and .message_id == $mid and .tenant == "default" and .idem_key == "x-1" and .tool == "charge"
     and (.created_at | type) == "number" and (keys | length) == 11' >/dev/null ||
    oq_fail "payload fields: $P"
[[ "$SQL_ID" =~ ^c_[0-9a-f]{32}$ ]] || oq_fail "call id form: $SQL_ID"
[[ "$MID" =~ ^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$ ]] || oq_fail "message id form: $MID"
# a C-side check of the same payload as a consumer reads it: the C fingerprint of its args
ARGS=$(printf '%s' "$P" | jq -c .args)
[[ "$(printf '%s\n' "$ARGS" | "$(oq_tool oq_fp_batch)" default charge)" == "$FP" ]] || oq_fail "fingerprint of the payload's args"

# two sessions, one key, at once: one call
psql -XAtq "$URL" -c "BEGIN; SELECT * FROM onceq.submit('default','race-1','charge','{\"n\":1}'); SELECT pg_sleep(2); COMMIT;" >"$T/a.out" &
A=$!
sleep 0.5
q "SELECT outcome FROM onceq.submit('default','race-1','charge','{\"n\":1}')" >"$T/b.out"
wait $A
grep -q "|new|" "$T/a.out" || oq_fail "first session: $(cat "$T/a.out")"
[[ "$(cat "$T/b.out")" == replay ]] || oq_fail "second session: $(cat "$T/b.out")"
[[ "$(q "SELECT count(*) FROM onceq.calls WHERE idem_key='race-1'")" == 1 ]] || oq_fail "race: calls"
[[ "$(q "SELECT count(*) FROM onceq.outbox o JOIN onceq.calls c ON c.call_id=o.key WHERE c.idem_key='race-1'")" == 1 ]] || oq_fail "race: outbox"
oq_pass "onceq.submit in SQL: Python example, C parity, envelope, concurrent key"
