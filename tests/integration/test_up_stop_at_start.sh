#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq up` stopped while it is still starting its children (a Ctrl-C right after the
# command): every round sends SIGTERM at a different moment of the start-up (0 to 280 ms after
# the launch, covering the broker's start, the wait for its address and the other children's
# forks) and requires the supervisor to exit 0 within 5 s (or 143 when the TERM came before
# it had its handlers, and so before any child), with no child needing the KILL, none left
# behind and no error logged. Before, a TERM that reached a child between its fork and its exec ran the
# supervisor's inherited handler (which only sets a flag in the child's copy) and was lost:
# that child ran on until the KILL after --stop-timeout (10 s), and a stop during the wait for
# the broker's address logged "no bootstrap address ... after the wait" as an error.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_tmpdir
unset ONCEQ_KAFKA_PROFILE

ROUNDS=${ROUNDS:-15}
for ((i = 0; i < ROUNDS; i++)); do
    delay_ms=$((i * 20))
    port=$(oq_free_port)
    oq_spawn "up$i" "$ONCEQ_BIN" up --dir "$T/d$i" --listen "127.0.0.1:$port" --consumers 2 \
        --console ''
    sleep "$(printf '0.%03d' "$delay_ms")"
    start=$EPOCHREALTIME
    kill -TERM "$(oq_pid "up$i")"
    rc=0
    oq_wait_exit "up$i" 5 || rc=$?
    took=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.2f", b - a}')
    ((rc != 124)) || oq_fail "round $i (TERM ${delay_ms} ms after the launch): onceq up still running 5 s after SIGTERM: $(grep -h 'did not stop\|stopping' "$T/up$i.log" | tail -3)"
    # 143: the TERM came before the supervisor had its handlers, so before any child
    if ((rc == 143)) && grep -q 'msg="started' "$T/up$i.log"; then
        oq_fail "round $i: killed by the TERM after starting children: $(tail -5 "$T/up$i.log")"
    fi
    ((rc == 0 || rc == 143)) || oq_fail "round $i (TERM ${delay_ms} ms after the launch): exit $rc: $(tail -5 "$T/up$i.log")"
    if pgrep -f -- "--dir $T/d$i( |\$)" >/dev/null; then
        oq_fail "round $i: processes left behind: $(pgrep -af -- "--dir $T/d$i")"
    fi
    if grep -q 'did not stop in time' "$T/up$i.log"; then
        oq_fail "round $i: a child needed the KILL: $(grep -h 'did not stop' "$T/up$i.log")"
    fi
    if grep -q 'level=error' "$T/up$i.log"; then
        oq_fail "round $i: an error logged for a stop: $(grep -h 'level=error' "$T/up$i.log")"
    fi
    oq_log "round $i: TERM ${delay_ms} ms after the launch, stopped in $took s"
done
oq_pass "onceq up stopped within 5 s with exit 0 wherever in its start-up the TERM came ($ROUNDS rounds)"
