#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq up` starts `onceq console` (--console HOST:PORT, default 127.0.0.1:8089) and prints
# its URL; the console reads the pipeline's calls.db and effects.db and charts the producer's
# /metrics; `--console ""` starts none. SIGTERM stops it with the rest.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
PORT=$(oq_free_port)
CPORT=$(oq_free_port)
D=$T/up
oq_spawn up "$ONCEQ_BIN" up --dir "$D" --listen "127.0.0.1:$PORT" --consumers 1 \
    --console "127.0.0.1:$CPORT" -X session.timeout.ms=6000
healthy() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/healthz"; }
oq_wait_for 30 healthy || oq_fail "onceq up: producer not healthy"
oq_wait_for 10 grep -q 'stop      kill -TERM' "$T/up.log" || oq_fail "no banner"
oq_wait_for 30 grep -qF "console   http://127.0.0.1:$CPORT/" "$T/up.log" || oq_fail "the banner does not give the console's URL"
U=http://127.0.0.1:$CPORT
oq_wait_for 30 curl -sf -o /dev/null "$U/api/me" || oq_fail "console not up: $(cat "$D/console.log")"
id=$(curl -s -X POST "http://127.0.0.1:$PORT/v1/tool-calls" -H 'Idempotency-Key: up-console-1' \
    -d '{"tool":"echo","args":{"x":1}}' | jq -r .call_id)
[[ $id == c_* ]] || oq_fail "submit failed"
[[ $(curl -s "$U/api/calls?q=up-console-1" | jq -r '.calls[0].call_id') == "$id" ]] || oq_fail "the console does not list $id"
[[ $(curl -s "$U/api/me" | jq .metrics) == 1 ]] || oq_fail "the console has not the producer's /metrics"
curl -sf "$U/api/metrics/0" | grep -q '^onceq_producer_calls' || oq_fail "the producer's metrics through the console"
curl -sf "$U/" | grep -q '<title>onceq console</title>' || oq_fail "no page"
oq_pass "onceq up: console at $U (calls.db, effects.db, the producer's /metrics)"
# A second `onceq up` on the same console (or producer) address is one clear error, at once,
# and starts nothing: before, its console restarted with backoff for ever while the banner gave
# the first pipeline's console as its own.
D2=$T/up2
PORT2=$(oq_free_port)
timeout 20 "$ONCEQ_BIN" up --dir "$D2" --listen "127.0.0.1:$PORT2" --consumers 1 \
    --console "127.0.0.1:$CPORT" >"$T/up2.log" 2>&1
rc=$?
[[ $rc == 1 ]] || oq_fail "second up on a console address in use: exit $rc, want 1: $(tail -3 "$T/up2.log")"
grep -q -- "--console: 127.0.0.1:$CPORT: Address already in use" "$T/up2.log" || oq_fail "no clear error: $(cat "$T/up2.log")"
[[ ! -e $D2 ]] || oq_fail "second up created $D2"
timeout 20 "$ONCEQ_BIN" up --dir "$D2" --listen "127.0.0.1:$PORT" --consumers 1 --console "" \
    >"$T/up3.log" 2>&1
rc=$?
[[ $rc == 1 ]] && grep -q -- "--listen: 127.0.0.1:$PORT: Address already in use" "$T/up3.log" ||
    oq_fail "second up on the producer's address in use: exit $rc: $(tail -3 "$T/up3.log")"
oq_pass "a second onceq up on an address in use: exit 1 with the address, nothing started"
oq_kill up
pgrep -f "onceq console --producer-db $D/calls.db" >/dev/null && oq_fail "console left running"
oq_pass "SIGTERM to onceq up stops the console"
