#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Service units and sd_notify: the installed systemd units pass `systemd-analyze verify`
# (skipped, with a message, where systemd-analyze is missing) and carry the hardening and
# notify settings (system call filter, ProtectProc, ProcSubset, RemoveIPC, PrivateMounts, no
# restart loop on exit 2, the consumer's tools file as a credential through ONCEQ_TOOLS);
# `systemd-analyze security --offline=true` rates each unit's exposure at most 2.0; a
# configuration error does exit 2 (what RestartPreventExitStatus=2 relies on); metrics need no
# /proc/stat (hidden by ProcSubset=pid); `onceq producer`, `onceq relay` and `onceq consumer` under a fake
# NOTIFY_SOCKET (a python3 datagram listener) send READY=1 once serving, WATCHDOG=1 pings at
# half of WATCHDOG_USEC, and STOPPING=1 on SIGTERM. Without NOTIFY_SOCKET nothing is sent.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
P=$T/prefix
cmake --install "$ONCEQ_BUILD" --prefix "$P" >"$T/install.log" 2>&1 ||
    { cat "$T/install.log" >&2; oq_fail "cmake --install failed"; }
U=$P/lib/systemd/system
for u in onceq-producer.service onceq-relay.service onceq-consumer@.service; do
    [ -f "$U/$u" ] || oq_fail "unit not installed: $u"
    for opt in Type=notify WatchdogSec= NoNewPrivileges=yes ProtectSystem=strict \
        StateDirectory=onceq PrivateTmp=yes "EnvironmentFile=-/etc/onceq/%N.env" \
        "ExecStart=$P/bin/onceq "; do
        grep -q -- "^$opt" "$U/$u" || oq_fail "$u lacks $opt"
    done
done
oq_pass "units installed with Type=notify, WatchdogSec, hardening, EnvironmentFile, ExecStart in the prefix"
for u in onceq-producer.service onceq-relay.service onceq-consumer@.service; do
    for opt in SystemCallFilter=@system-service ProtectProc=invisible ProcSubset=pid \
        RemoveIPC=yes PrivateMounts=yes RestartPreventExitStatus=2 \
        "EnvironmentFile=-/etc/onceq/onceq.env"; do
        grep -qx -- "$opt" "$U/$u" || oq_fail "$u lacks $opt"
    done
done
C=$U/onceq-consumer@.service
grep -qx 'LoadCredential=tools.json:/etc/onceq/tools.json' "$C" ||
    oq_fail "the consumer unit does not load /etc/onceq/tools.json as a credential"
grep -q '^Environment=.* ONCEQ_TOOLS=%d/tools.json' "$C" ||
    oq_fail "the consumer unit does not point ONCEQ_TOOLS at the credential"
oq_pass "units: @system-service filter, ProtectProc, ProcSubset, RemoveIPC, PrivateMounts, RestartPreventExitStatus=2, onceq.env; consumer tools via LoadCredential + ONCEQ_TOOLS"

# RestartPreventExitStatus=2 relies on a configuration error exiting 2.
"$ONCEQ_BIN" consumer --db "$T/cfg.db" --brokers 127.0.0.1:1 --tools "$T/missing.json" \
    >/dev/null 2>&1
[ $? -eq 2 ] || oq_fail "a missing tools file does not exit 2"
ONCEQ_KEY_TTL=bogus "$ONCEQ_BIN" producer --db "$T/cfg.db" >/dev/null 2>&1
[ $? -eq 2 ] || oq_fail "a bad ONCEQ_KEY_TTL does not exit 2"
oq_pass "configuration errors (missing tools file, bad environment value) exit 2"

if command -v systemd-analyze >/dev/null; then
    levels=
    cp "$U/onceq-consumer@.service" "$U/onceq-consumer@1.service"
    (cd "$U" && systemd-analyze verify ./onceq-producer.service ./onceq-relay.service \
        ./onceq-consumer@1.service) >"$T/verify.log" 2>&1 ||
        { cat "$T/verify.log" >&2; oq_fail "systemd-analyze verify failed"; }
    for u in onceq-producer.service onceq-relay.service onceq-consumer@1.service; do
        (cd "$U" && systemd-analyze security --offline=true "./$u") >"$T/sec.log" 2>&1
        level=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$T/sec.log")
        [ -n "$level" ] || { cat "$T/sec.log" >&2; oq_fail "$u: no exposure level"; }
        awk -v l="$level" 'BEGIN { exit !(l <= 2.0) }' ||
            { grep '✗' "$T/sec.log" >&2; oq_fail "$u: exposure $level, above 2.0"; }
        levels="$levels $u=$level"
    done
    rm -f "$U/onceq-consumer@1.service"
    oq_pass "systemd-analyze verify: producer, relay, consumer@1; security exposure:$levels (at most 2.0)"
else
    echo "SKIP: systemd-analyze not found: the units are not verified"
fi

if ! "$ONCEQ_BIN" producer --help >/dev/null 2>&1 || ! nm "$ONCEQ_BIN" | grep -q sd_notify; then
    echo "SKIP: onceq built without libsystemd (ONCEQ_SYSTEMD=OFF): no sd_notify to check"
    exit 0
fi

# listen NAME: a datagram socket $T/NAME.sock; every message is appended to $T/NAME.msgs
listen() {
    oq_spawn "$1-listener" python3 -u -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print("listening", flush=True)
with open(sys.argv[2], "a") as out:
    while True:
        m = s.recv(4096).decode()
        out.write(m.replace("\n", " ") + "\n")
        out.flush()
' "$T/$1.sock" "$T/$1.msgs"
    oq_wait_for 10 test -S "$T/$1.sock" || oq_fail "$1 listener did not start"
}
# check NAME: READY=1 first, then at least two WATCHDOG=1 (at 400 ms / 2), then STOPPING=1
check() {
    local name=$1
    oq_wait_for 20 grep -q 'READY=1' "$T/$name.msgs" || oq_fail "$name: no READY=1"
    oq_wait_for 10 sh -c "[ \$(grep -c '^WATCHDOG=1' '$T/$name.msgs') -ge 3 ]" ||
        oq_fail "$name: fewer than 3 WATCHDOG=1 pings: $(cat "$T/$name.msgs")"
    head -1 "$T/$name.msgs" | grep -q '^READY=1 STATUS=' || oq_fail "$name: READY=1 not first"
}

oq_start_broker
listen producer
PORT=$(oq_free_port)
oq_spawn producer env NOTIFY_SOCKET="$T/producer.sock" WATCHDOG_USEC=400000 \
    "$ONCEQ_BIN" producer --db "$T/calls.db" --listen "127.0.0.1:$PORT"
check producer
curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null || oq_fail "producer: READY=1 before serving"
oq_kill producer TERM
oq_wait_for 5 grep -q 'STOPPING=1' "$T/producer.msgs" || oq_fail "producer: no STOPPING=1"
oq_pass "producer: READY=1 (serving HTTP), WATCHDOG=1 every ~200 ms, STOPPING=1 on SIGTERM"

listen relay
oq_spawn relay env NOTIFY_SOCKET="$T/relay.sock" WATCHDOG_USEC=400000 \
    "$ONCEQ_BIN" relay --db "$T/calls.db" --brokers "$BROKERS"
check relay
oq_kill relay TERM
oq_wait_for 5 grep -q 'STOPPING=1' "$T/relay.msgs" || oq_fail "relay: no STOPPING=1"
oq_pass "relay: READY=1, WATCHDOG=1, STOPPING=1"

listen consumer
oq_spawn consumer env NOTIFY_SOCKET="$T/consumer.sock" WATCHDOG_USEC=400000 \
    "$ONCEQ_BIN" consumer --db "$T/effects.db" --brokers "$BROKERS"
check consumer
oq_kill consumer TERM
oq_pass "consumer: READY=1, WATCHDOG=1 (watchdog thread)"

# Without WATCHDOG_USEC: READY=1 only; without NOTIFY_SOCKET the producer runs as before.
listen quiet
oq_spawn quiet env NOTIFY_SOCKET="$T/quiet.sock" "$ONCEQ_BIN" producer --db "$T/calls.db" \
    --listen "127.0.0.1:$(oq_free_port)"
oq_wait_for 20 grep -q 'READY=1' "$T/quiet.msgs" || oq_fail "quiet: no READY=1"
sleep 0.5
grep -q WATCHDOG "$T/quiet.msgs" && oq_fail "WATCHDOG=1 sent without WATCHDOG_USEC"
oq_kill quiet TERM
oq_pass "no watchdog pings without WATCHDOG_USEC"

# ProcSubset=pid leaves /proc/self but hides /proc/stat: process_start_time_seconds must not
# depend on it. /proc/stat is hidden here with a private mount namespace (needs root and
# unshare; skipped otherwise).
if unshare -m sh -c 'mount --bind /dev/null /proc/stat' 2>/dev/null; then
    MP=$(oq_free_port)
    oq_spawn hidden unshare -m sh -c 'mount --bind /dev/null /proc/stat && exec "$0" "$@"' \
        "$ONCEQ_BIN" relay --db "$T/calls.db" --brokers "$BROKERS" --metrics-listen "127.0.0.1:$MP"
    oq_wait_for 20 curl -sf "http://127.0.0.1:$MP/metrics" -o "$T/hidden.metrics" ||
        oq_fail "relay with /proc/stat hidden: no /metrics"
    start=$(awk '$1 == "process_start_time_seconds" {printf "%d", $2}' "$T/hidden.metrics")
    now=$(date +%s)
    [ -n "$start" ] && [ $((now - start)) -ge 0 ] && [ $((now - start)) -lt 120 ] ||
        oq_fail "process_start_time_seconds=$start with /proc/stat hidden (now $now)"
    oq_kill hidden TERM
    oq_pass "process_start_time_seconds is right with /proc/stat hidden (ProcSubset=pid)"
else
    echo "SKIP: cannot hide /proc/stat here (unshare -m needs root): ProcSubset=pid not simulated"
fi
