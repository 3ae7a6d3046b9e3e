#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 5
# `onceq broker` sets TCP_NODELAY on every connection its mock brokers accept (main/cmd_broker.c,
# "Nagle"): without it a small response written behind an unacknowledged one waited for the
# client's delayed ACK, up to 40 ms, and the relays' delivery reports came back tens of ms late.
# The check reads the option on the broker's own sockets (pidfd_getfd, tests/tools/sock_nodelay.py);
# a negative control runs the same check against a server that leaves Nagle on and must see it.
# Against a build without the accept() wrapper: accepted 3, nodelay 0. --nagle: nodelay 0.
set -uo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_tmpdir
CHK="$ONCEQ_SRC/tests/tools/sock_nodelay.py"

# check NAME PORTS ACCEPTED NODELAY WHAT: our connections to PORTS, as process NAME sees them
check() {
    local rc=0 r
    r=$(python3 "$CHK" --pid "$(oq_pid "$1")" --ports "$2" 2>"$T/chk.err") || rc=$?
    if ((rc == 77)); then
        # CI runs as root, where the copy is always allowed: a skip there would hide the check
        [[ "${CI:-}" == true ]] && oq_fail "cannot read another process's sockets under CI: $(cat "$T/chk.err")"
        echo "SKIP: cannot read another process's sockets here: $(cat "$T/chk.err")"
        exit 77
    fi
    ((rc == 0)) || oq_fail "sock_nodelay.py against $1 failed ($rc): $(cat "$T/chk.err")"
    oq_log "$1: $r"
    [[ "$(jq .accepted <<<"$r")" == "$3" && "$(jq .nodelay <<<"$r")" == "$4" ]] ||
        oq_fail "$5: $r (want accepted $3, nodelay $4)"
    oq_pass "$5"
}
ports() { tr ',' '\n' | sed 's/.*://' | paste -sd,; }

oq_start_broker --brokers 3
check broker "$(ports <<<"$BROKERS")" 3 3 "the embedded broker's accepted connections have TCP_NODELAY"

# --nagle leaves them as librdkafka's mock does
oq_spawn broker2 "$ONCEQ_BIN" broker --nagle --brokers 2 --bootstrap-file "$T/bootstrap2"
oq_wait_for 15 test -s "$T/bootstrap2" || oq_fail "broker --nagle did not start"
check broker2 "$(ports <"$T/bootstrap2")" 2 0 "broker --nagle leaves Nagle on"

# negative control: a server that accepts without TCP_NODELAY is seen as such
oq_spawn plain python3 "$CHK" --serve
oq_wait_for 10 test -s "$T/plain.log" || oq_fail "the plain server did not start"
PORT=$(head -n 1 "$T/plain.log" | jq -r .port)
check plain "$PORT,$PORT" 2 0 "negative control: a server with Nagle on reads as nodelay 0"
