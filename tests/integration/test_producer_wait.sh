#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Completion without polling (issue 21, item 3): GET /v1/tool-calls/{id}?wait= and
# GET /v1/tool-calls/by-key/{key}?wait= answer as soon as the call is terminal, or at the
# deadline with the call as it stands. A producer with its results ingest on the embedded
# broker; results are injected with kcat (tests/tools/oq_longpoll_check.py does the clients):
#  - latency: a client waiting with ?wait=30s is not answered before the result, and is
#    answered within 500 ms of the moment a concurrent poller sees the terminal state;
#  - deadline: ?wait=2s on a pending call answers 200 pending after 2 s (by id and by key);
#    malformed or out-of-range waits are 400 bad_request; a terminal call answers at once;
#  - submit and wait: POST /v1/tool-calls?wait= answers when the call is terminal (200 with the
#    result), a settled replay at once, 202 pending at the deadline, a bad wait 400 (no write);
#  - many: 500 concurrent waiting clients (one connection each) are all answered with the
#    terminal call; the producer's thread count does not grow with them;
#  - onceq call and the client packages (clients/python, clients/typescript) wait by long poll:
#    a call that takes ~3 s costs each at most 3 status requests (they polled before);
#  - shutdown: 100 clients waiting when the producer gets SIGTERM are answered (200 pending)
#    and the producer exits 0.
# ctest-cost: 40
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
command -v kcat >/dev/null || oq_fail "kcat is required"
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3

oq_start_broker
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
start() {
    oq_spawn producer "$ONCEQ_BIN" producer --db "$T/calls.db" --listen "127.0.0.1:$PORT" \
        --brokers "$BROKERS" -X session.timeout.ms=6000 --max-connections 2000 \
        --max-connections-per-ip 0
    oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer did not come up"
    oq_wait_for 30 curl -sf -o /dev/null "$URL/readyz" || oq_fail "producer not ready"
}
check() { # check STEP [ARGS]: run one step, keep its figures
    timeout 200 "$PY" "$ONCEQ_SRC/tests/tools/oq_longpoll_check.py" "$1" --url "$URL" \
        --brokers "$BROKERS" --pid "$(oq_pid producer)" "${@:2}" >"$T/$1.out" 2>&1
    local rc=$?
    cat "$T/$1.out"
    [[ $rc == 0 ]] || oq_fail "step $1 failed"
}
start
check latency
check deadline
check submitwait
check many --clients 500
check call --onceq "$ONCEQ_BIN"
check call --client py --src "$ONCEQ_SRC"
if command -v node >/dev/null; then
    check call --client js --src "$ONCEQ_SRC"
else
    [[ "${CI:-}" == true ]] && oq_fail "node is required (apt-get install nodejs)"
    oq_log "no node: the Node example client is not checked"
fi
check shutdown --clients 100
oq_wait_exit producer 20
RC=$?
[[ "$RC" == 0 ]] || oq_fail "producer exit code $RC after SIGTERM with waiting clients"
grep -q 'waiting requests answered' "$T/producer.log" || oq_fail "no shutdown log line"
oq_pass "producer long poll (?wait=)"
