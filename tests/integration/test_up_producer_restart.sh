#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 14, item 5: after the producer dies under `onceq up` (kill -9, restarted by up), the
# results come back within seconds. Its results consumer (group onceq-producer) used to wait out
# the dead member's session on the embedded broker (librdkafka's 45 s default: results were
# applied 29-88 s later); up now gives it the consumers' 6 s session. No -X here on purpose:
# the defaults are what is tested.
#
# Under a running load, the producer is killed; once the restarted one answers /healthz, one
# more call must be completed (its result applied) within 15 s, and the whole load drains with
# `onceq verify` clean.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
PORT=$(oq_free_port)
D=$T/up
URL=http://127.0.0.1:$PORT
oq_spawn up "$ONCEQ_BIN" up --dir "$D" --listen "127.0.0.1:$PORT" --consumers 2
healthy() { curl -sf -o /dev/null --max-time 2 "$URL/healthz"; }
oq_wait_for 30 healthy || oq_fail "onceq up not healthy"
child_pid() {
    local p
    for p in $(pgrep -P "$(oq_pid up)"); do
        tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "onceq $1 " && { echo "$p"; return 0; }
    done
    return 1
}
verify() { "$ONCEQ_BIN" verify --producer-db "$D/calls.db" --consumer-db "$D/effects.db" "$@"; }
drained() { verify --examples 0 >/dev/null 2>&1; }
load() { "$(oq_tool oq_e2e_load)" --port "$PORT" --conns 2 --sleep-ms 10 --retry-ms 60000 "$@"; }

# warm up: results flow (the ingest has its partitions)
load --calls 50 --prefix warm >"$T/warm.out" || oq_fail "warm-up load failed: $(cat "$T/warm.out")"
oq_wait_for 90 drained || oq_fail "warm-up not drained: $(verify 2>&1)"

# kill the producer in the middle of a load (the load generator retries until it is back)
oq_spawn load "$(oq_tool oq_e2e_load)" --port "$PORT" --conns 2 --sleep-ms 10 --retry-ms 60000 \
    --calls 300 --prefix during
sleep 1
P1=$(child_pid producer) || oq_fail "no producer child"
kill -9 "$P1"
back() { local p; p=$(child_pid producer) && [[ $p != "$P1" ]] && healthy; }
oq_wait_for 30 back || oq_fail "producer not restarted"
t0=$(date +%s.%N)
"$ONCEQ_BIN" call --url "$URL" --key after-restart --tool charge --args '{"amount":1}' \
    --timeout 90s >"$T/call.out" 2>"$T/call.err" || oq_fail "call after restart: $(tail -3 "$T/call.err")"
t1=$(date +%s.%N)
took=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
oq_log "after the restart, a call completed (result applied) in ${took}s"
[[ $(jq -r .status "$T/call.out") == succeeded ]] || oq_fail "call after restart: $(cat "$T/call.out")"
awk -v t="$took" 'BEGIN{exit !(t < 15)}' || oq_fail "results applied ${took}s after the restart (want < 15 s)"

oq_wait_exit load 120 || oq_fail "the load did not finish: $(tail -5 "$T/load.log")"
oq_wait_for 90 drained || oq_fail "not drained after the restart: $(verify 2>&1)"
verify || oq_fail "verify not clean"
oq_kill up TERM
oq_pass "producer restarted under onceq up: results applied ${took}s later, verify clean"
