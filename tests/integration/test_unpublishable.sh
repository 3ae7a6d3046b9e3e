#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-labels: chaos
# Issue 14, item 1: a body just under --max-body must not stop the pipeline.
#  A. `onceq up` with its defaults (the issue's reproduction): a ~1,000,000-byte body is
#     refused at submit with 413 payload_too_large naming both sizes, nothing is written, and a
#     small call right behind it succeeds.
#  B. The producer's limit raised on purpose (--max-message-bytes 2000000) while the relay keeps
#     librdkafka's message.max.bytes=1000000: the big call is accepted (202), the relay sets its
#     row aside (outbox_dead, onceq_relay_dead_letters_total, a WARN line, `onceq stats`
#     dead=1), the producer fails the call with error code "unpublishable" (retryable false,
#     audited), a small call committed behind it succeeds, and `onceq verify` is clean.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir

# The issue's body: {"tool":"charge","args":{"amount":1,"pad":"PPP...(999,700)"}}
{
    printf '{"tool":"charge","args":{"amount":1,"pad":"'
    head -c 999700 /dev/zero | tr '\0' P
    printf '"}}'
} >"$T/big.json"
oq_log "big body: $(wc -c <"$T/big.json") bytes"

post_big() { # URL KEY -> prints the HTTP code, body in $T/big.out
    curl -s -o "$T/big.out" -w '%{http_code}' --max-time 20 -H "Idempotency-Key: $2" \
        -H 'Content-Type: application/json' --data-binary @"$T/big.json" "$1/v1/tool-calls"
}
small() { # URL KEY
    "$ONCEQ_BIN" call --url "$1" --key "$2" --tool charge --args '{"amount":1}' --timeout 60s
}

# --- A: onceq up, defaults -------------------------------------------------------------------
PORT=$(oq_free_port)
URL=http://127.0.0.1:$PORT
oq_spawn up "$ONCEQ_BIN" up --dir "$T/up" --listen "127.0.0.1:$PORT" --consumers 1 \
    -X session.timeout.ms=6000
oq_wait_for 30 curl -sf -o /dev/null --max-time 2 "$URL/healthz" || oq_fail "onceq up not healthy"
code=$(post_big "$URL" big-1)
oq_log "A: big body -> $code $(head -c 300 "$T/big.out")"
[[ $code == 413 ]] || oq_fail "A: big body answered $code, want 413"
[[ $(jq -r .error.code "$T/big.out") == payload_too_large ]] || oq_fail "A: code $(cat "$T/big.out")"
jq -r .error.message "$T/big.out" | grep -q "over the 1000000 bytes the relay can publish" ||
    oq_fail "A: message does not name the limit: $(cat "$T/big.out")"
"$ONCEQ_BIN" get --db "$T/up/calls.db" --key big-1 >/dev/null 2>&1
[[ $? == 4 ]] || oq_fail "A: the refused call was written"
small "$URL" small-1 >"$T/a_small.out" 2>"$T/a_small.err" ||
    oq_fail "A: the small call behind it did not succeed: $(tail -3 "$T/a_small.err")"
[[ $(jq -r .status "$T/a_small.out") == succeeded ]] || oq_fail "A: small call $(cat "$T/a_small.out")"
oq_kill up TERM

# --- B: producer limit raised on purpose, relay at the default -------------------------------
oq_start_broker
PDB=$T/calls.db
CDB=$T/effects.db
PORT=$(oq_free_port)
MPORT=$(oq_free_port)
URL=http://127.0.0.1:$PORT
oq_spawn producer "$ONCEQ_BIN" producer --db "$PDB" --listen "127.0.0.1:$PORT" \
    --brokers "$BROKERS" --max-message-bytes 2000000
oq_spawn relay "$ONCEQ_BIN" relay --db "$PDB" --brokers "$BROKERS" \
    --metrics-listen "127.0.0.1:$MPORT"
oq_spawn consumer "$ONCEQ_BIN" consumer --db "$CDB" --brokers "$BROKERS" \
    -X session.timeout.ms=6000
oq_wait_for 30 curl -sf -o /dev/null --max-time 2 "$URL/healthz" || oq_fail "B: producer not healthy"
code=$(post_big "$URL" big-2)
[[ $code == 202 ]] || oq_fail "B: big body answered $code, want 202: $(head -c 300 "$T/big.out")"
BIG=$(jq -r .call_id "$T/big.out")
oq_log "B: big call $BIG accepted"
small "$URL" small-2 >"$T/b_small.out" 2>"$T/b_small.err" ||
    oq_fail "B: the small call behind the big one did not succeed: $(tail -3 "$T/b_small.err")"
[[ $(jq -r .status "$T/b_small.out") == succeeded ]] || oq_fail "B: small call $(cat "$T/b_small.out")"

big_failed() {
    "$ONCEQ_BIN" get --db "$PDB" "$BIG" >"$T/big_get.out" 2>/dev/null &&
        [[ $(jq -r .status "$T/big_get.out") == failed ]]
}
oq_wait_for 30 big_failed || oq_fail "B: big call not failed: $(cat "$T/big_get.out")"
[[ $(jq -r .error.code "$T/big_get.out") == unpublishable ]] || oq_fail "B: $(cat "$T/big_get.out")"
[[ $(jq -r .error.retryable "$T/big_get.out") == false ]] || oq_fail "B: retryable: $(cat "$T/big_get.out")"
jq -r .error.message "$T/big_get.out" | grep -q MSG_SIZE_TOO_LARGE ||
    oq_fail "B: the error does not say why: $(jq -r .error.message "$T/big_get.out")"
"$ONCEQ_BIN" inspect --db "$PDB" "$BIG" | grep -q unpublishable || oq_fail "B: not audited"
grep -q "dead letter: outbox seq=1 message_id=.* key=$BIG set aside (MSG_SIZE_TOO_LARGE" \
    "$T/relay.log" || oq_fail "B: no dead-letter line in the relay log"
curl -s "http://127.0.0.1:$MPORT/metrics" | grep -q \
    '^onceq_relay_dead_letters_total{reason="MSG_SIZE_TOO_LARGE"} 1$' || oq_fail "B: metric"
"$ONCEQ_BIN" stats --db "$PDB" | grep -q ' dead=1' || oq_fail "B: stats: $("$ONCEQ_BIN" stats --db "$PDB")"
# the operator's view of the set-aside row: onceq dlq --outbox-db
D=$("$ONCEQ_BIN" dlq list --outbox-db "$PDB" --json) || oq_fail "B: dlq list --outbox-db failed"
jq -e --arg k "$BIG" 'length == 1 and .[0].key == $k and .[0].reason == "MSG_SIZE_TOO_LARGE" and
    .[0].seq == 1' <<<"$D" >/dev/null || oq_fail "B: dlq list --outbox-db: $D"
"$ONCEQ_BIN" dlq show 1 --outbox-db "$PDB" | grep -q '^reason      MSG_SIZE_TOO_LARGE' ||
    oq_fail "B: dlq show --outbox-db: $("$ONCEQ_BIN" dlq show 1 --outbox-db "$PDB")"
"$ONCEQ_BIN" dlq redrive 1 --outbox-db "$PDB" 2>/dev/null
[[ $? == 2 ]] || oq_fail "B: a redrive of an outbox_dead row must be refused (exit 2)"
# resubmitting the same request is a replay of the final failure
code=$(post_big "$URL" big-2)
[[ $code == 200 && $(jq -r .status "$T/big.out") == failed ]] ||
    oq_fail "B: resubmit answered $code $(head -c 300 "$T/big.out")"

"$ONCEQ_BIN" verify --producer-db "$PDB" --consumer-db "$CDB" >"$T/verify.out" 2>&1 ||
    oq_fail "B: verify: $(cat "$T/verify.out")"
grep -q "CLEAN" "$T/verify.out" || oq_fail "B: verify not clean: $(cat "$T/verify.out")"
oq_pass "a too-large call is refused at submit (413), or set aside and failed; the pipeline goes on"
