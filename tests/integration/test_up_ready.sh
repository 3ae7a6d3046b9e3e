#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq up` says "pipeline running" only once a call runs through: the producer serves HTTP and
# every Kafka consumer it started (both consumers, the producer's results consumer) has joined
# its group. Before, it said so right after forking its children, and a call made then waited
# about 3 s for the embedded broker's coordinator to form the groups (the demo's first call:
# "+2.684s consumer started"). Checked here:
#   1. the first call, made the moment the line appears, is answered in under 1.5 s (it took
#      about 3 s when the line came at once), and up's own service manager (a datagram socket
#      standing in for systemd's NOTIFY_SOCKET) gets READY=1 after the line, not before;
#      DIR/notify.sock is gone with the line (unread, a full socket would block a child's
#      next notification);
#   2. with Kafka unreachable, the line still comes after --ready-wait, naming who has not
#      joined, and messages sent to DIR/notify.sock by a process that is not one of up's
#      children change nothing (the kernel's SO_PASSCRED pid is checked).
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_tmpdir
unset ONCEQ_KAFKA_PROFILE
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }

# up's own "service manager": records each datagram with the time it came
cat >"$T/manager.py" <<'EOF'
import os, socket, sys, time
path, out = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(1.0)
end = time.time() + 60
with open(out, "a", buffering=1) as f:
    while time.time() < end:
        try:
            m = s.recv(4096).decode()
        except socket.timeout:
            continue
        f.write("%.3f %s\n" % (time.time(), m.replace("\n", " | ")))
EOF
oq_spawn manager python3 "$T/manager.py" "$T/manager.sock" "$T/manager.msgs"
oq_wait_for 10 test -S "$T/manager.sock" || oq_fail "the stand-in manager did not bind"

# 1. the line, then at once one call end to end
PORT=$(oq_free_port)
NOTIFY_SOCKET="$T/manager.sock" oq_spawn up "$ONCEQ_BIN" up --dir "$T/d" \
    --listen "127.0.0.1:$PORT" --consumers 2 --console ''
oq_wait_for 30 grep -q 'onceq up: pipeline running' "$T/up.log" ||
    oq_fail "no 'pipeline running' line within 30 s"
said=$EPOCHREALTIME
start=$EPOCHREALTIME
body=$(curl -s --max-time 20 -X POST "http://127.0.0.1:$PORT/v1/tool-calls?wait=15s" \
    -H 'Idempotency-Key: first-call' -H 'Content-Type: application/json' \
    -d '{"tool":"charge","args":{"amount":100,"currency":"EUR","customer":"c-1"}}') ||
    oq_fail "the first call failed: $body"
took=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f", b - a}')
grep -q '"status":"succeeded"' <<<"$body" || oq_fail "first call not succeeded: $body"
awk -v t="$took" 'BEGIN {exit !(t < 1.5)}' ||
    oq_fail "the first call after 'pipeline running' took $took s (the groups were not formed)"
# the socket goes with the line: kept, it would fill (10 datagrams) and block a child's next
# rebalance callback in its send
[[ ! -e "$T/d/notify.sock" ]] || oq_fail "DIR/notify.sock still there after the line"
grep -q 'every consumer in its group after' "$T/up.log" ||
    oq_fail "no readiness note: $(grep 'pipeline running' "$T/up.log")"
oq_wait_for 5 grep -q 'READY=1' "$T/manager.msgs" || oq_fail "up's manager got no READY=1"
ready_at=$(awk '/READY=1/ {print $1; exit}' "$T/manager.msgs")
awk -v r="$ready_at" -v s="$said" 'BEGIN {exit !(r <= s + 1 && r >= s - 1)}' ||
    oq_fail "READY=1 at $ready_at, the line at $said: not together"
grep -q 'STATUS=pipeline running' "$T/manager.msgs" ||
    oq_fail "READY=1 without its status: $(cat "$T/manager.msgs")"
oq_log "first call after the line: $took s; manager: $(cut -c1-120 "$T/manager.msgs")"
kill -TERM "$(oq_pid up)"
oq_wait_exit up 30 || oq_fail "onceq up did not exit 0 on TERM"

# 2. Kafka unreachable: said after --ready-wait anyway, and forged messages do not count
DEAD=$(oq_free_port)
PORT2=$(oq_free_port)
oq_spawn up2 "$ONCEQ_BIN" up --dir "$T/d2" --listen "127.0.0.1:$PORT2" --consumers 2 \
    --console '' --brokers "127.0.0.1:$DEAD" --ready-wait 3s
oq_wait_for 10 test -S "$T/d2/notify.sock" || oq_fail "no DIR/notify.sock"
for ((i = 0; i < 5; i++)); do # a stranger claims every child's readiness
    python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.sendto(b"READY=1\nX_ONCEQ_GROUP=joined", sys.argv[1])' \
        "$T/d2/notify.sock" 2>/dev/null || true
    sleep 0.2
done
oq_wait_for 15 grep -q 'onceq up: pipeline running' "$T/up2.log" ||
    oq_fail "no 'pipeline running' line after --ready-wait 3s"
line=$(grep 'onceq up: pipeline running' "$T/up2.log")
for who in 'producer (not yet in its results group)' 'consumer-1 (not yet in its group)' \
    'consumer-2 (not yet in its group)'; do
    grep -qF "$who" <<<"$line" || oq_fail "the line does not name $who: $line"
done
grep -q 'waiting for the Kafka consumers to join their groups' "$T/up2.log" ||
    oq_fail "no progress line while waiting"
kill -TERM "$(oq_pid up2)"
oq_wait_exit up2 30 || oq_fail "onceq up (Kafka unreachable) did not exit 0 on TERM"
[[ ! -e "$T/d2/notify.sock" ]] || oq_fail "DIR/notify.sock left behind"
oq_pass "onceq up says 'pipeline running' when a call runs (first call $took s), READY=1 with it; after --ready-wait it names who has not joined; strangers' messages ignored"
