#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Answers that are legal but that a canonical JSON writer cannot write as they are, from a real
# service through the real executor (tests/integration/odd_downstream.py): an integer past
# 2^53, one past 64 bits, a text/plain body, and a 402 whose message a byte limit cuts inside
# a character; and two the result cannot keep: 100,000 bytes, and a body that is not UTF-8
# (its "response_omitted" says so, with the size). Each call settles (the successes with one effect and the answer's exact text in
# result.response_text, the refusal failed with valid UTF-8), and an ordinary call queued
# behind them still runs: the worker did not stop. Before the fix the first answer failed the
# consumer's batch transaction on every try and nothing behind it ever ran.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

OPORT=$(oq_free_port) || oq_fail "no free port"
OLOG=$T/odd.log
: >"$OLOG"
oq_spawn odd python3 "$ONCEQ_SRC/tests/integration/odd_downstream.py" "$OPORT" "$OLOG"
oq_wait_for 15 curl -sf "http://127.0.0.1:$OPORT/healthz" || oq_fail "odd service not up"
rt_start_downstream
odd() { echo '{"name": "'"$1"'", "url": "http://127.0.0.1:'"$OPORT"'/'"$1"'", "body": "args", "object_id": "/id", "idempotent": true}'; }
RT_VARIANTS="[$(odd big64), $(odd big128), $(odd plain), $(odd decline), $(odd large), $(odd latin1)]"
rt_tools "$T/tools.json"
PL_CONSUMER_X+=(--tools "$T/tools.json" --lease 3s --recover-every 200ms)
pl_start 1

for t in big64 big128 plain decline large latin1; do rt_submit "odd-$t" "$t" '{"amount":1}' >/dev/null; done
rt_submit after pay '{"amount":2}' >/dev/null
for t in big64 big128 plain large latin1; do
    rt_wait_status "odd-$t" succeeded 60 || oq_fail "odd-$t: $(rt_call "odd-$t")"
done
rt_wait_status odd-decline failed 60 || oq_fail "odd-decline: $(rt_call odd-decline)"
rt_wait_status after succeeded 60 || oq_fail "the call behind them did not run: $(rt_call after)"

# the answers' exact text, the status, the object id where the answer could be read
want() { [[ $(rt_call "odd-$1" | jq -r "$2") == "$3" ]] || oq_fail "odd-$1: $2 is not $3: $(rt_call "odd-$1")"; }
want big64 .result.response_text '{"id":"p_big64","seq":9007199254740993}'
want big64 .result.http_status 201
want big64 .result.object_id p_big64
want big128 .result.response_text '{"id":"p_big128","seq":123456789012345678901234567890}'
want plain .result.response_text paid
want plain .result.http_status 200
want large .result.object_id p_large
want large '.result | has("response") or has("response_text")' false
want large .result.response_omitted.bytes 100000
want large .result.response_omitted.reason "larger than 65536 bytes"
want latin1 .result.response_omitted.bytes 31
want latin1 .result.response_omitted.reason "not UTF-8"
msg=$(rt_call odd-decline | jq -r .error.message)
[[ $msg == "HTTP 402: a€€€"* ]] || oq_fail "decline message: $msg"
iconv -f UTF-8 -t UTF-8 <<<"$msg" >/dev/null || oq_fail "decline message is not UTF-8: $msg"
# one request, so one effect, per success; the refusal none
for t in big64 big128 plain decline large latin1; do
    n=$(grep -c "^/$t " "$OLOG")
    [[ $n == 1 ]] || oq_fail "$t: $n requests: $(cat "$OLOG")"
done
[[ $(rt_cq "SELECT count(*) FROM effects") == 6 ]] || oq_fail "effects: $(rt_cq 'SELECT call_id, tool FROM effects')"
J=$(pl_verify) # (the odd service keeps no ledger verify reads)
[[ $? == 0 ]] || oq_fail "verify: $J"
[[ $(rt_dstat .ledger.effects) == 1 ]] || oq_fail "pay: $(rt_dstat .ledger)"
oq_pass "awkward answers settled (big integers and plain text kept as response_text, a cut message repaired, a large and a Latin-1 answer named as omitted); the call behind them ran; verify clean"
