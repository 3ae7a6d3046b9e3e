#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 15
# `onceq broker` releases held fetches on time after a Produce (main/cmd_broker.c, "Held
# fetches"): the mock holds an empty fetch for fetch.wait.max.ms but sleeps in whole
# milliseconds, so a fetch due 50 us later was answered up to 1 ms late, and a message produced
# meanwhile waited for it. The broker sees each Produce request's header and, for 1.2 ms, wakes
# its mock thread every --release-us. The check: with a consumer holding fetches, a produce is
# seen (produce_requests) and the shortened sleeps happen (early_wakeups), and every message
# arrives; with --release-us 0 (the negative control) neither counter moves.
# Against a build without the recvmsg() wrapper: produce_requests=0 early_wakeups=0.
set -uo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_tmpdir
KC=$(oq_tool oq_kclient)
[[ -x "$KC" ]] || oq_fail "no oq_kclient at $KC"
if oq_real_kafka; then
    echo "SKIP: the held-fetch release is the embedded broker's"
    exit 77
fi

# run NAME EXTRA...: a broker, a consumer holding 1 ms fetches, 40 messages; its status in $st
# (not run in a $(...) subshell: lib.sh kills by pid what this shell spawned)
run() {
    local name=$1 ctl=$T/$1.ctl boot=$T/$1.boot i
    shift
    oq_spawn "$name" "$ONCEQ_BIN" broker --bootstrap-file "$boot" --control "$ctl" "$@"
    for ((i = 0; i < 150; i++)); do
        [[ -s "$boot" && -p "$ctl" ]] && break
        sleep 0.1
    done
    [[ -s "$boot" ]] || oq_fail "$name did not start"
    oq_spawn "$name-c" "$KC" consume --brokers "$(cat "$boot")" --topic onceq.tool-calls --group g \
        --max 40 --timeout-ms 40000 -X fetch.wait.max.ms=1
    for ((i = 0; i < 300; i++)); do
        grep -q '^# assignment [0-9]' "$T/$name-c.log" 2>/dev/null && break
        sleep 0.1
    done
    grep -q '^# assignment [0-9]' "$T/$name-c.log" || oq_fail "$name: the consumer got no partitions"
    timeout 30 "$KC" produce --brokers "$(cat "$boot")" --topic onceq.tool-calls --count 40 \
        --key-prefix k >"$T/$name-p.txt" 2>&1 || oq_fail "$name: produce failed: $(cat "$T/$name-p.txt")"
    for ((i = 0; i < 300; i++)); do
        oq_alive "$name-c" || break
        sleep 0.1
    done
    [[ $(grep -vc '^#' "$T/$name-c.log") == 40 ]] || oq_fail "$name: consumed $(grep -vc '^#' "$T/$name-c.log") of 40"
    st=$(BROKER_CTL=$ctl oq_broker_ctl status) || oq_fail "$name: status: $st"
}

run on
oq_log "default: $st"
p=$(sed -n 's/.* produce_requests=\([0-9]*\) .*/\1/p' <<<"$st")
w=$(sed -n 's/.* early_wakeups=\([0-9]*\) .*/\1/p' <<<"$st")
[[ $st == *" release_us=100 "* ]] || oq_fail "default release_us is not 100: $st"
((${p:-0} >= 1 && ${w:-0} >= 1)) || oq_fail "no Produce seen or no early wake-up: $st"
oq_pass "default: 40 messages consumed, $p Produce requests seen, $w early wake-ups"

run off --release-us 0
oq_log "off: $st"
[[ $st == *" release_us=0 produce_requests=0 early_wakeups=0 "* ]] ||
    oq_fail "--release-us 0 still counts: $st"
oq_pass "negative control: --release-us 0 consumes the same and neither counter moves"
