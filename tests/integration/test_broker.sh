#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 30
# `onceq broker` as a real process, with clients in other processes over loopback TCP:
# metadata via kcat, produce/consume, a two-process consumer-group split, an offset resume
# after a restart, and the fault-control channel (down/up, injected Produce errors).
# Bounded waits throughout; every process is killed by pid (lib.sh trap).
set -uo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_tmpdir

KC=$(oq_tool oq_kclient)
[[ -x "$ONCEQ_BIN" ]] || oq_fail "no onceq binary at $ONCEQ_BIN"
[[ -x "$KC" ]] || oq_fail "no oq_kclient at $KC"
TOPIC=onceq.tool-calls
GRP_OPTS=(-X session.timeout.ms=6000 -X heartbeat.interval.ms=500)

# keys KEY of data lines (not "#" lines) in the given consumer outputs
keys() { grep -hv '^#' "$@" | awk '{print $3}'; }
last_assignment() { grep '^# assignment ' "$1" | tail -n 1 | awk '{print $3}'; }

# --- usage --------------------------------------------------------------------------------
"$ONCEQ_BIN" broker --help >"$T/help.txt" 2>&1 || oq_fail "broker --help did not exit 0"
grep -q 'error API ERR' "$T/help.txt" || oq_fail "broker --help does not document the control commands"
rc=0; "$ONCEQ_BIN" broker --no-such-flag >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || oq_fail "bad flag: exit $rc, want 2"
rc=0; "$ONCEQ_BIN" broker --brokers 0 >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || oq_fail "--brokers 0: exit $rc, want 2"
oq_pass "usage: --help 0, bad flag 2, out of bounds 2"

# --- start + metadata ---------------------------------------------------------------------
oq_start_broker
[[ $(tr ',' '\n' <<<"$BROKERS" | grep -c '^127\.0\.0\.1:[0-9]*$') == 3 ]] ||
    oq_fail "bootstrap list is not 3 loopback addresses: $BROKERS"
grep -qx "$BROKERS" "$T/broker.log" || oq_fail "bootstrap list not printed on stdout"
timeout 20 kcat -L -b "$BROKERS" -m 10 >"$T/meta.txt" 2>&1 || oq_fail "kcat -L failed: $(cat "$T/meta.txt")"
grep -q '^ 3 brokers:' "$T/meta.txt" || oq_fail "kcat -L: not 3 brokers: $(cat "$T/meta.txt")"
for t in onceq.tool-calls onceq.tool-results onceq.dlq; do
    grep -q "topic \"$t\" with 6 partitions" "$T/meta.txt" || oq_fail "kcat -L: no $t with 6 partitions"
done
oq_pass "kcat -L: 3 brokers, 3 topics x 6 partitions"

# --- produce 1000 from one process, consume from another ------------------------------------
timeout 60 "$KC" produce --brokers "$BROKERS" --topic $TOPIC --count 1000 --key-prefix k \
    --size 200 >"$T/p1.txt" 2>&1 || oq_fail "produce 1000 failed: $(cat "$T/p1.txt")"
grep -q 'delivered=1000 failed=0' "$T/p1.txt" || oq_fail "produce: $(cat "$T/p1.txt")"
timeout 60 "$KC" consume --brokers "$BROKERS" --topic $TOPIC --group g-all --max 1000 \
    --timeout-ms 30000 "${GRP_OPTS[@]}" >"$T/c-all.txt" 2>"$T/c-all.err" ||
    oq_fail "consume 1000 failed: $(tail -n 3 "$T/c-all.txt" "$T/c-all.err")"
n=$(keys "$T/c-all.txt" | sort -u | wc -l)
[[ $n == 1000 ]] || oq_fail "consumed $n distinct keys, want 1000"
grep -q 'partitions=0,1,2,3,4,5 ' "$T/c-all.txt" || oq_fail "not all partitions seen: $(grep summary "$T/c-all.txt")"
oq_pass "1000 messages produced and consumed by separate processes (all 6 partitions)"

# --- offset resume across a consumer restart -----------------------------------------------
timeout 60 "$KC" consume --brokers "$BROKERS" --topic $TOPIC --group g-resume --max 300 --commit \
    --timeout-ms 30000 "${GRP_OPTS[@]}" >"$T/r1.txt" 2>"$T/r1.err" || oq_fail "resume part 1 failed"
grep -q '^# committed' "$T/r1.txt" || oq_fail "resume part 1 did not commit"
[[ $(keys "$T/r1.txt" | wc -l) == 300 ]] || oq_fail "resume part 1 read $(keys "$T/r1.txt" | wc -l), want 300"
timeout 60 "$KC" consume --brokers "$BROKERS" --topic $TOPIC --group g-resume --max 700 --commit \
    --timeout-ms 30000 "${GRP_OPTS[@]}" >"$T/r2.txt" 2>"$T/r2.err" ||
    oq_fail "resume part 2 did not get 700 messages: $(grep summary "$T/r2.txt")"
dups=$(keys "$T/r1.txt" "$T/r2.txt" | sort | uniq -d | wc -l)
[[ $dups == 0 ]] || oq_fail "restarted consumer re-read $dups committed messages"
[[ $(keys "$T/r1.txt" "$T/r2.txt" | sort -u | wc -l) == 1000 ]] || oq_fail "resume: union is not 1000"
# and nothing is left: a third run of the group finds no message in 8 s
rc=0
timeout 60 "$KC" consume --brokers "$BROKERS" --topic $TOPIC --group g-resume --max 1 \
    --timeout-ms 8000 "${GRP_OPTS[@]}" >"$T/r3.txt" 2>&1 || rc=$?
[[ $rc == 3 && $(keys "$T/r3.txt" | wc -l) == 0 ]] || oq_fail "third run found messages (rc=$rc)"
oq_pass "offset resume: 300 committed, restart read exactly the other 700"

# --- two consumer processes of one group split the partitions ------------------------------
for c in ca cb; do
    oq_spawn "$c" "$KC" consume --brokers "$BROKERS" --topic $TOPIC --group g-split --max 0 \
        --timeout-ms 60000 "${GRP_OPTS[@]}"
done
split_ok() {
    local a b
    a=$(last_assignment "$T/ca.log")
    b=$(last_assignment "$T/cb.log")
    [[ -n "$a" && -n "$b" && "$a" != - && "$b" != - ]] || return 1
    # disjoint and union = 0..5
    [[ $(tr ',' '\n' <<<"$a,$b" | sort -n | tr '\n' ' ') == "0 1 2 3 4 5 " ]]
}
oq_wait_for 45 split_ok || oq_fail "no disjoint split of 6 partitions within 45 s: ca=$(last_assignment "$T/ca.log") cb=$(last_assignment "$T/cb.log")"
split="$(last_assignment "$T/ca.log") | $(last_assignment "$T/cb.log")"
oq_kill ca
oq_kill cb
oq_pass "two consumers of one group split the 6 partitions: $split"

# --- fault control ---------------------------------------------------------------------------
oq_broker_ctl "no-such-command" >/dev/null && oq_fail "unknown command acked ok"
oq_broker_ctl "error Produce NO_SUCH_ERROR 1" >/dev/null && oq_fail "unknown error name acked ok"
oq_broker_ctl "down 9" >/dev/null && oq_fail "down 9 (no such broker) acked ok"
# Pin leaders so that every broker leads two partitions: partition p -> broker p%3+1.
for p in 0 1 2 3 4 5; do
    oq_broker_ctl "leader $TOPIC $p $((p % 3 + 1))" >/dev/null || oq_fail "leader $p failed"
done
timeout 20 kcat -L -b "$BROKERS" -t $TOPIC >"$T/meta2.txt" 2>&1 || oq_fail "kcat -L failed"
grep -q 'partition 5, leader 3,' "$T/meta2.txt" || oq_fail "leader command not visible: $(cat "$T/meta2.txt")"

# down 1 blocks partition 0 (led by broker 1); up 1 lets the same producer finish.
oq_broker_ctl "down 1" >/dev/null || oq_fail "down 1 failed"
oq_broker_ctl "status" | grep -q 'down=1 ' || oq_fail "status does not show broker 1 down"
oq_spawn pdown "$KC" produce --brokers "$BROKERS" --topic $TOPIC --count 300 --key-prefix d \
    --timeout-ms 40000
sleep 3
oq_alive pdown || oq_fail "producer finished while the leader of partition 0 was down: $(cat "$T/pdown.log")"
oq_broker_ctl "up 1" >/dev/null || oq_fail "up 1 failed"
rc=0; oq_wait_exit pdown 40 || rc=$?
[[ $rc == 0 ]] || oq_fail "producer after up 1: exit $rc: $(cat "$T/pdown.log")"
grep -q 'delivered=300 failed=0' "$T/pdown.log" || oq_fail "after up 1: $(cat "$T/pdown.log")"
oq_pass "down 1 held partition 0's deliveries; after up 1 all 300 were delivered"

# A cluster-wide injected error reaches clients: a non-retriable one fails the delivery.
oq_broker_ctl "error Produce TOPIC_AUTHORIZATION_FAILED 1" >/dev/null || oq_fail "error command failed"
rc=0
timeout 30 "$KC" produce --brokers "$BROKERS" --topic $TOPIC --count 1 --key-prefix e \
    >"$T/e1.txt" 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q 'first_error=TOPIC_AUTHORIZATION_FAILED' "$T/e1.txt" ||
    oq_fail "injected TOPIC_AUTHORIZATION_FAILED not seen by the producer: $(cat "$T/e1.txt")"
# NOT_LEADER_FOR_PARTITION x3 (retriable): the producer retries through them.
oq_broker_ctl "error Produce NOT_LEADER_FOR_PARTITION 3" >/dev/null || oq_fail "error command failed"
timeout 40 "$KC" produce --brokers "$BROKERS" --topic $TOPIC --count 200 --key-prefix f \
    >"$T/e3.txt" 2>&1 || oq_fail "produce through 3 injected errors failed: $(cat "$T/e3.txt")"
grep -q 'delivered=200 failed=0' "$T/e3.txt" || oq_fail "after errors: $(cat "$T/e3.txt")"
# Per-broker errors (error_rtt) are counted by status: one NOT_LEADER on each broker, all of
# them consumed by a 200-message produce (keys cover every partition, so every leader).
for b in 1 2 3; do
    oq_broker_ctl "error_rtt $b Produce NOT_LEADER_FOR_PARTITION 50" >/dev/null || oq_fail "error_rtt $b failed"
done
oq_broker_ctl "status" | grep -q 'pending_produce=1:1,2:1,3:1 ' || oq_fail "status: $(oq_broker_ctl status)"
timeout 40 "$KC" produce --brokers "$BROKERS" --topic $TOPIC --count 200 --key-prefix g \
    >"$T/e4.txt" 2>&1 || oq_fail "produce through per-broker errors failed: $(cat "$T/e4.txt")"
grep -q 'delivered=200 failed=0' "$T/e4.txt" || oq_fail "after per-broker errors: $(cat "$T/e4.txt")"
st=$(oq_broker_ctl "status")
grep -q 'pending_produce=1:0,2:0,3:0 ' <<<"$st" || oq_fail "per-broker errors not consumed: $st"
oq_broker_ctl "clear" >/dev/null || oq_fail "clear failed"
oq_pass "injected Produce errors: a fatal one fails the delivery, NOT_LEADER x3 (cluster) and x1 per broker are retried through"

# --- clean stop --------------------------------------------------------------------------------
kill -TERM "$(oq_pid broker)"
rc=0; oq_wait_exit broker 15 || rc=$?
[[ $rc == 0 ]] || oq_fail "broker exit code after SIGTERM: $rc"
[[ ! -e "$T/bootstrap" && ! -e "$BROKER_CTL" ]] || oq_fail "bootstrap file or FIFO left behind"
oq_pass "broker stopped on SIGTERM with exit 0 (total ${SECONDS}s)"

# --- a second broker: 1 broker, 2 partitions, an extra topic, an explicit control path --------
oq_start_broker --brokers 1 --partitions 2 --topics "extra.topic:4" --control "$T/ctl2.fifo"

timeout 20 kcat -L -b "$BROKERS" >"$T/meta3.txt" 2>&1 || oq_fail "kcat -L (second broker) failed"
grep -q '^ 1 brokers:' "$T/meta3.txt" || oq_fail "second broker: not 1 broker"
grep -q 'topic "onceq.dlq" with 2 partitions' "$T/meta3.txt" || oq_fail "second broker: --partitions 2 ignored"
grep -q 'topic "extra.topic" with 4 partitions' "$T/meta3.txt" || oq_fail "second broker: --topics ignored"
oq_broker_ctl "status" | grep -q '^ok status brokers=1 ' || oq_fail "second broker: control at --control path"
oq_kill broker
oq_pass "--brokers 1 --partitions 2 --topics extra.topic:4 --control PATH (total ${SECONDS}s)"
