#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The console's dead letters: with --brokers it lists the DLQ topic as `onceq dlq list --json`
# does (it runs it), and redrives one as `onceq dlq redrive` does: a POST with the CSRF token
# (refused without it, nothing published), by an operator; the redriven copy, still invalid,
# comes back as a dead letter marked as a redrive. A ref that is not PARTITION:OFFSET is 400.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

oq_tmpdir
PDB=$T/calls.db CDB=$T/effects.db PORT=$(oq_free_port)
export PDB CDB PORT
sql() { sqlite3 -cmd ".timeout 5000" "$@"; }
oq_start_broker --partitions 2
oq_spawn producer "$ONCEQ_BIN" producer --db "$PDB" --listen "127.0.0.1:$PORT" \
    --brokers "$BROKERS" --redrive-after 0
pl_wait_healthy 30
BAD=$(curl -sf -X POST "http://127.0.0.1:$PORT/v1/tool-calls" -H "Idempotency-Key: dlq-bad" \
    -d '{"tool":"charge","args":{"amount":1,"currency":"EUR"}}' | jq -r .call_id)
[[ $BAD == c_* ]] || oq_fail "submit failed"
sql "$PDB" "UPDATE outbox SET payload = CAST(replace(CAST(payload AS TEXT), '\"attempt\":1',
            '\"attempt\":0') AS BLOB) WHERE key='$BAD'"
pl_spawn_relay
pl_spawn_consumer 1
oq_wait_for 60 bash -c "[[ \$(sqlite3 -cmd '.timeout 5000' '$CDB' \"SELECT count(*) FROM dlq
    WHERE published_at IS NOT NULL\") == 1 ]]" || oq_fail "no dead letter published"

CPORT=$(oq_free_port)
U=http://127.0.0.1:$CPORT/api
oq_spawn console "$ONCEQ_BIN" console --producer-db "$PDB" --consumer-db "$CDB" \
    --listen "127.0.0.1:$CPORT" --brokers "$BROKERS"
oq_wait_for 15 curl -sf -o /dev/null "$U/me" || oq_fail "console did not come up"
curl -s "$U/dlq" >"$T/d.json"
[[ $(jq '.topic | length' "$T/d.json") == 1 && $(jq -r '.topic[0].key' "$T/d.json") == "$BAD" &&
    $(jq -r '.topic[0].reason' "$T/d.json") == invalid_envelope ]] || oq_fail "DLQ topic: $(cat "$T/d.json")"
"$ONCEQ_BIN" dlq list --json --brokers "$BROKERS" | jq -S 'map(del(.payload))' >"$T/cli.json"
jq -S .topic "$T/d.json" | cmp -s - "$T/cli.json" || oq_fail "differs from onceq dlq list: $(diff <(jq -S .topic "$T/d.json") "$T/cli.json")"
REF=$(jq -r '.topic[0].ref' "$T/d.json")
oq_pass "the DLQ topic listed as onceq dlq list lists it"

code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST "$U/dlq/redrive" -d "{\"ref\":\"$REF\"}")
[[ $code == 403 && $(jq -r .error "$T/r.json") == csrf ]] || oq_fail "redrive without CSRF: HTTP $code $(cat "$T/r.json")"
csrf=$(curl -s "$U/me" | jq -r .csrf)
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST -H "X-CSRF-Token: $csrf" "$U/dlq/redrive" -d '{"ref":"0:1;id"}')
[[ $code == 400 ]] || oq_fail "a bad ref: HTTP $code"
sleep 2
[[ $(curl -s "$U/dlq" | jq '.topic | length') == 1 ]] || oq_fail "a refused redrive published"
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST -H "X-CSRF-Token: $csrf" "$U/dlq/redrive" -d "{\"ref\":\"$REF\"}")
[[ $code == 200 ]] && jq -e '.redriven and (.output | test("^redriven "))' "$T/r.json" >/dev/null ||
    oq_fail "redrive: HTTP $code $(cat "$T/r.json")"
grep -q "msg=\"dlq redrive\" ref=$REF by=console:" "$T/console.log" || oq_fail "redrive not logged with the operator"
twice() { [[ $(curl -s "$U/dlq" | jq '[.topic[] | select(.redrive != null)] | length') == 1 ]]; }
oq_wait_for 60 twice || oq_fail "the redriven copy did not come back: $(curl -s "$U/dlq")"
oq_pass "redrive from the console: refused without CSRF or with a bad ref; done as onceq dlq redrive, logged with the operator"
