#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq up` as a supervisor: it starts broker + producer + relay + 2 consumers, prints where
# everything is, serves calls end to end; a child killed with -9 is restarted (new pid) and the
# pipeline keeps working; a killed embedded broker makes it restart every child against the new
# broker; SIGTERM stops every child and exits 0, leaving no process behind. Then the older demo
# on the compiled tools (scripts/demo-pipeline.sh) runs against a fresh `onceq up` and must
# finish with verify clean.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
unset ONCEQ_KAFKA_PROFILE # up chooses its children's client defaults itself
PORT=$(oq_free_port)
D=$T/up
oq_spawn up "$ONCEQ_BIN" up --dir "$D" --listen "127.0.0.1:$PORT" --consumers 2 \
    -X session.timeout.ms=6000
healthy() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/healthz"; }
oq_wait_for 30 healthy || oq_fail "onceq up: producer not healthy"
oq_wait_for 10 grep -q 'stop      kill -TERM' "$T/up.log" || oq_fail "no 'where everything is' banner"
for w in "http://127.0.0.1:$PORT" "$D/calls.db" "$D/effects.db" "$D/bootstrap"; do
    grep -qF "$w" "$T/up.log" || oq_fail "banner does not mention $w"
done

# pid of up's child running subcommand $1 (newest first)
child_pid() {
    local p
    for p in $(pgrep -P "$(oq_pid up)"); do
        tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "onceq $1 " && { echo "$p"; return 0; }
    done
    return 1
}
verify() { "$ONCEQ_BIN" verify --producer-db "$D/calls.db" --consumer-db "$D/effects.db" "$@"; }
load() { "$(oq_tool oq_e2e_load)" --port "$PORT" --conns 4 --sleep-ms 5 --retry-ms 60000 "$@"; }
drained() { verify --examples 0 >/dev/null 2>&1; }

# the embedded broker's client defaults reach every client child (docs/BROKER-NOTES.md)
for kind in producer relay consumer; do
    p=$(child_pid "$kind") || oq_fail "no $kind child of onceq up"
    tr '\0' ' ' <"/proc/$p/cmdline" | grep -q -- '--kafka-profile mock ' ||
        oq_fail "$kind not started with --kafka-profile mock: $(tr '\0' ' ' <"/proc/$p/cmdline")"
done

# one mock broker unless --embedded-brokers says more (each broker leading a consumer's
# partitions is one more idle fetch a millisecond: docs/SCALING.md, "One embedded broker")
p=$(child_pid broker) || oq_fail "no broker child of onceq up"
tr '\0' ' ' <"/proc/$p/cmdline" | grep -q -- '--brokers 1 ' ||
    oq_fail "broker not started with --brokers 1: $(tr '\0' ' ' <"/proc/$p/cmdline")"
[[ $(tr ',' '\n' <"$D/bootstrap" | grep -c .) -eq 1 ]] || oq_fail "bootstrap lists other than one broker: $(cat "$D/bootstrap")"
rc=0
"$ONCEQ_BIN" up --dir "$T/x" --brokers 127.0.0.1:1 --embedded-brokers 3 2>"$T/x.err" || rc=$?
[[ $rc -eq 2 ]] && grep -q 'embedded-brokers is for the embedded broker' "$T/x.err" ||
    oq_fail "--embedded-brokers with --brokers: rc $rc, $(cat "$T/x.err")"
[[ ! -e $T/x ]] || oq_fail "a refused up made its directory"

load --calls 200 --prefix up1 >"$T/l1" || oq_fail "load 1 failed: $(cat "$T/l1")"
oq_wait_for 60 drained || oq_fail "first batch not drained: $(verify)"

C1=$(child_pid consumer) || oq_fail "no consumer child of onceq up"
kill -9 "$C1"
restarted() { local p; p=$(child_pid consumer) && [[ $(pgrep -P "$(oq_pid up)" | wc -l) -ge 5 ]] && ! kill -0 "$C1" 2>/dev/null; }
oq_wait_for 15 restarted || oq_fail "killed consumer $C1 not restarted"
grep -q "killed by signal 9" "$T/up.log" || oq_fail "up did not log the death"
load --calls 200 --prefix up2 >"$T/l2" || oq_fail "load 2 failed"
oq_wait_for 90 drained || oq_fail "second batch not drained after consumer restart: $(verify)"

B1=$(child_pid broker) || oq_fail "no broker child"
P1=$(child_pid producer)
kill -9 "$B1"
newbroker() { local b p; b=$(child_pid broker) && p=$(child_pid producer) && [[ $b != "$B1" && $p != "$P1" ]] && healthy; }
oq_wait_for 60 newbroker || oq_fail "broker death did not restart the pipeline"
load --calls 200 --prefix up3 >"$T/l3" || oq_fail "load 3 failed"
oq_wait_for 120 drained || oq_fail "third batch not drained after broker restart: $(verify)"
verify || oq_fail "verify not clean"

KIDS=$(pgrep -P "$(oq_pid up)" | tr '\n' ' ')
kill -TERM "$(oq_pid up)"
oq_wait_exit up 30
urc=$?
[[ $urc == 0 ]] || oq_fail "onceq up exit $urc after SIGTERM (want 0)"
for k in $KIDS; do kill -0 "$k" 2>/dev/null && oq_fail "child $k survived onceq up's SIGTERM"; done
grep -q "onceq up: stopped" "$T/up.log" || oq_fail "no clean stop message"

# The demo on the compiled tools, bounded.
DPORT=$(oq_free_port)
ONCEQ_DEMO_PORT=$DPORT ONCEQ_DEMO_DIR=$T/demo timeout 120 bash "$ONCEQ_SRC/scripts/demo-pipeline.sh" "$ONCEQ_BIN" >"$T/demo.out" 2>&1
drc=$?
cat "$T/demo.out" | grep -v '^ts='
[[ $drc == 0 ]] || oq_fail "demo exit $drc"
grep -q "refused with 422" "$T/demo.out" || oq_fail "demo: conflict not refused"
grep -q "same call_id" "$T/demo.out" || oq_fail "demo: duplicate did not return the same call"
grep -q "result           CLEAN" "$T/demo.out" || oq_fail "demo: verify not clean"
oq_pass "onceq up supervises, restarts, stops cleanly; demo runs"
