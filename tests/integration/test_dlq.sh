#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Dead letters end to end, with `onceq dlq` only (no SQL against Kafka, no Kafka tool):
#   - a call whose envelope is damaged in the outbox before the relay runs (attempt 0: the
#     consumer cannot decode it) lands in onceq.dlq with the headers: reason code, detail,
#     origin topic/partition/offset, message id;
#   - `dlq list` / `dlq show` show it (text and JSON, the bytes with --payload);
#   - `dlq redrive` of the unchanged bytes is a dead letter again (a redrive marked as such);
#   - the repaired envelope (--payload-file, same message id) redriven twice goes through the
#     inbox once: the call succeeds with one effect, the second copy is a duplicate, `onceq
#     verify` is clean;
#   - refused, nothing published: a dead letter without an origin, a repair that changes the
#     message id or does not decode; an unknown ref is exit 4; the relay's dead outbox rows
#     list (empty) from the database;
#   - bash completion offers the command.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

KC=$(oq_tool oq_kclient)
oq_tmpdir
PDB=$T/calls.db CDB=$T/effects.db PORT=$(oq_free_port)
export PDB CDB PORT
sql() { sqlite3 -cmd ".timeout 5000" "$@"; }
dlq() { "$ONCEQ_BIN" dlq "$@" --brokers "$BROKERS"; }

oq_start_broker --partitions 2
# no redrive by the producer: the repair below must be the only way the call gets through
oq_spawn producer "$ONCEQ_BIN" producer --db "$PDB" --listen "127.0.0.1:$PORT" \
    --brokers "$BROKERS" --redrive-after 0 "${PL_CONSUMER_X[@]}"
pl_wait_healthy 30
submit() { # KEY AMOUNT -> call id
    curl -sf -X POST "http://127.0.0.1:$PORT/v1/tool-calls" -H "Idempotency-Key: $1" \
        -H 'Content-Type: application/json' \
        -d "{\"tool\":\"charge\",\"args\":{\"amount\":$2,\"currency\":\"EUR\"}}" | jq -r .call_id
}
BAD=$(submit dlq-bad 4242)
GOOD=$(submit dlq-good 1)
[[ $BAD == c_* && $GOOD == c_* ]] || oq_fail "submit failed: '$BAD' '$GOOD'"
MID=$(sql "$PDB" "SELECT message_id FROM outbox WHERE key='$BAD'")
# the damage: attempt 0, which no consumer accepts
sql "$PDB" "UPDATE outbox SET payload = CAST(replace(CAST(payload AS TEXT), '\"attempt\":1',
            '\"attempt\":0') AS BLOB) WHERE key='$BAD'"
sql "$PDB" "SELECT CAST(payload AS TEXT) FROM outbox WHERE key='$BAD'" | grep -q '"attempt":0' ||
    oq_fail "could not damage the outbox row"

pl_spawn_relay
pl_spawn_consumer 1
oq_wait_for 60 bash -c "[[ \$(sqlite3 -cmd '.timeout 5000' '$PDB' \"SELECT state FROM calls
    WHERE call_id='$GOOD'\") == succeeded ]]" || oq_fail "the good call did not succeed"
oq_wait_for 30 bash -c "[[ \$(sqlite3 -cmd '.timeout 5000' '$CDB' \"SELECT count(*) FROM dlq
    WHERE published_at IS NOT NULL\") == 1 ]]" || oq_fail "no dead letter published"

# --- list and show ---------------------------------------------------------------------------
L=$(dlq list --json) || oq_fail "dlq list --json failed"
jq -e 'length == 1' <<<"$L" >/dev/null || oq_fail "dlq list: not one dead letter: $L"
jq -e --arg m "$MID" '.[0] | .reason == "invalid_envelope" and .message_id == $m and
    .origin.topic == "onceq.tool-calls" and .origin.partition >= 0 and .origin.offset >= 0 and
    (.detail | test("attempt")) and .redrive == null' <<<"$L" >/dev/null ||
    oq_fail "dlq list: wrong fields: $L"
REF=$(jq -r '.[0].ref' <<<"$L")
OP=$(jq -r '.[0].origin.partition' <<<"$L") OO=$(jq -r '.[0].origin.offset' <<<"$L")
# the origin is where the consumer read it: the inbox row of the message id says the same
[[ $(sql "$CDB" "SELECT partition || ':' || offset FROM inbox WHERE message_id='$MID'") == "$OP:$OO" ]] ||
    oq_fail "origin $OP:$OO differs from the inbox row"
dlq list >"$T/list.txt" || oq_fail "dlq list failed"
grep -q "^$REF .*invalid_envelope .*onceq.tool-calls:$OP:$OO .*$MID" "$T/list.txt" ||
    oq_fail "dlq list text: $(cat "$T/list.txt")"
S=$(dlq show "$REF" --json) || oq_fail "dlq show --json failed"
for h in onceq-dlq-reason onceq-dlq-detail onceq-dlq-origin-topic onceq-dlq-origin-partition \
    onceq-dlq-origin-offset onceq-message-id; do
    jq -e --arg h "$h" '[.headers[][0]] | index($h) != null' <<<"$S" >/dev/null ||
        oq_fail "dlq show: header $h missing: $S"
done
jq -e --arg c "$BAD" '.key == $c and (.payload | fromjson | .attempt == 0)' <<<"$S" >/dev/null ||
    oq_fail "dlq show: key or payload wrong: $S"
dlq show "$REF" | grep -q "^origin      onceq.tool-calls partition $OP offset $OO" ||
    oq_fail "dlq show text: $(dlq show "$REF")"
dlq show "$REF" --payload >"$T/bad.json" || oq_fail "dlq show --payload failed"
jq -e '.attempt == 0' "$T/bad.json" >/dev/null || oq_fail "--payload is not the message bytes"
oq_log "dead letter $REF of $BAD (message id $MID) listed and shown"

# --- refusals (nothing published) ------------------------------------------------------------
dlq show 0:999999 >/dev/null 2>&1
[[ $? == 4 ]] || oq_fail "dlq show of an unknown ref: want exit 4"
dlq show nonsense >/dev/null 2>&1
[[ $? == 2 ]] || oq_fail "dlq show of a bad ref: want exit 2"
jq -c '.message_id = "00000000-0000-4000-8000-000000000000" | .attempt = 1' "$T/bad.json" >"$T/other-id.json"
dlq redrive "$REF" --payload-file "$T/other-id.json" >/dev/null 2>"$T/err1"
[[ $? == 2 ]] && grep -q "keep it" "$T/err1" || oq_fail "a repair with another message id: $(cat "$T/err1")"
dlq redrive "$REF" --payload-file "$T/bad.json" >/dev/null 2>"$T/err2"
[[ $? == 2 ]] && grep -q "does not decode" "$T/err2" || oq_fail "an undecodable repair: $(cat "$T/err2")"
# a message on the DLQ topic that no consumer wrote: no origin headers
"$KC" produce --brokers "$BROKERS" --topic onceq.dlq --count 1 >/dev/null || oq_fail "produce stray"
L2=$(dlq list --json)
STRAY=$(jq -r '.[] | select(.origin == null) | .ref' <<<"$L2")
[[ -n $STRAY ]] || oq_fail "the stray message is not listed: $L2"
dlq redrive "$STRAY" >/dev/null 2>"$T/err3"
[[ $? == 2 ]] && grep -q "origin unknown" "$T/err3" || oq_fail "redrive without origin: $(cat "$T/err3")"
"$ONCEQ_BIN" dlq list --outbox-db "$PDB" | grep -q "no dead outbox rows" || oq_fail "outbox_dead list"
[[ $("$ONCEQ_BIN" dlq list --outbox-db "$PDB" --json | jq length) == 0 ]] || oq_fail "outbox_dead json"

# --- redrive the unchanged bytes: still invalid, a dead letter again --------------------------
dlq redrive "$REF" >"$T/r0.out" || oq_fail "redrive of the original bytes failed"
grep -q "^redriven onceq.dlq:$REF -> onceq.tool-calls .*message id $MID, original bytes" "$T/r0.out" ||
    oq_fail "redrive output: $(cat "$T/r0.out")"
oq_wait_for 30 bash -c "[[ \$('$ONCEQ_BIN' dlq list --brokers '$BROKERS' --json |
    jq '[.[] | select(.redrive != null)] | length') == 1 ]]" ||
    oq_fail "the still-invalid redrive is not a dead letter again"
[[ $(sql "$CDB" "SELECT count(*) FROM executions WHERE call_id='$BAD'") == 0 ]] ||
    oq_fail "the invalid message was executed"

# --- the repair, redriven twice: through the inbox once --------------------------------------
jq -c '.attempt = 1' "$T/bad.json" >"$T/fixed.json"
dlq redrive "$REF" --payload-file "$T/fixed.json" >"$T/r1.out" || oq_fail "redrive 1: $(cat "$T/r1.out")"
dlq redrive "$REF" --payload-file "$T/fixed.json" >"$T/r2.out" || oq_fail "redrive 2 failed"
grep -q "repaired bytes from --payload-file" "$T/r2.out" || oq_fail "redrive output: $(cat "$T/r2.out")"
oq_wait_for 60 bash -c "[[ \$(sqlite3 -cmd '.timeout 5000' '$PDB' \"SELECT state FROM calls
    WHERE call_id='$BAD'\") == succeeded ]]" || oq_fail "the redriven call did not succeed"
# four deliveries of the message id: the poison, the unchanged redrive, two repaired copies
oq_wait_for 30 bash -c "[[ \$(sqlite3 -cmd '.timeout 5000' '$CDB' \"SELECT seen FROM inbox
    WHERE message_id='$MID'\") == 4 ]]" ||
    oq_fail "inbox seen=$(sql "$CDB" "SELECT seen FROM inbox WHERE message_id='$MID'"), want 4"
[[ $(sql "$CDB" "SELECT count(*) FROM effects WHERE call_id='$BAD'") == 1 ]] || oq_fail "effects != 1"
[[ $(sql "$CDB" "SELECT count(*) FROM audit WHERE call_id='$BAD' AND event='dlq_redriven'") == 1 ]] ||
    oq_fail "no single dlq_redriven audit row"
[[ $(sql "$CDB" "SELECT count(*) FROM audit WHERE call_id='$BAD' AND event='duplicate_skipped'") -ge 1 ]] ||
    oq_fail "the second repaired copy was not skipped as a duplicate"
# the dead letters stay in the topic (a log): three, one of them the stray
[[ $(dlq list --json | jq length) == 3 ]] || oq_fail "dlq list after the redrives: $(dlq list)"

J=$(pl_verify)
rc=$?
echo "$J"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc"
[[ $(pl_field "$J" duplicates) == 0 && $(pl_field "$J" effects) == 2 ]] || oq_fail "verify counts"

"$ONCEQ_BIN" completion bash | grep -q " dlq" || oq_fail "completion: no dlq command"
oq_pass "dlq: headers, list/show, still-invalid redrive dead-lettered again, repaired redrive twice executed once, refusals"
