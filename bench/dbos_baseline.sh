#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The durable-execution baseline (make bench, 12.): onceq vs a DBOS workflow doing the same
# payment against the same `onceq-downstream`, closed loop with 1 and 32 client threads, same
# run (bench/dbos_baseline.py says how each side is measured).
#
#   bench/dbos_baseline.sh [path/to/onceq]   env: DBOS_VENV (default: BUILD/dbos-venv),
#                                            DBOS_CALLS_1 (300), DBOS_CALLS_N (2000),
#                                            DBOS_THREADS (1,32: the client thread counts)
#
# Python's `dbos` package comes from PyPI into a venv under the build directory (python3 -m
# venv), made once; without python3-venv or PyPI the benchmark is skipped with a note.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-${ONCEQ_BIN:-$ROOT/build/onceq}}
BUILD=$(dirname "$BIN")
DS=${ONCEQ_DOWNSTREAM_BIN:-$BUILD/onceq-downstream}
export ONCEQ_SRC=$ROOT
. "$ROOT/tests/integration/lib.sh"
VENV=${DBOS_VENV:-$BUILD/dbos-venv}
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import dbos' 2>/dev/null; then
    if ! python3 -m venv "$VENV" >/dev/null 2>&1 || ! "$VENV/bin/pip" install -q dbos >/dev/null 2>&1; then
        echo "  skipped: cannot make a venv with the dbos package from PyPI in $VENV"
        exit 0
    fi
fi
oq_tmpdir
DPORT=$(oq_free_port) && PORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn ds "$DS" --listen "127.0.0.1:$DPORT" --db "$T/downstream.db"
oq_wait_for 15 curl -sf -o /dev/null "http://127.0.0.1:$DPORT/healthz" || oq_fail "downstream did not start"
jq --arg u "127.0.0.1:$DPORT" '.tools |= [.[0] | walk(if type == "string" then gsub("127.0.0.1:8090"; $u) else . end)]' \
    "$ROOT/examples/tools.json" >"$T/tools.json" || oq_fail "tools file"
oq_spawn up "$BIN" up --dir "$T/up" --listen "127.0.0.1:$PORT" --tools "$T/tools.json"
oq_wait_for 30 curl -sf -o /dev/null "http://127.0.0.1:$PORT/readyz" || oq_fail "onceq up did not get ready"
# Ready is not settled: the embedded broker makes a consumer that joins a group wait
# session.timeout.ms - 1 s, and the rebalance it then causes would stall the calls of the
# measured run. Wait (up to 30 s) until every consumer has been assigned its partitions.
for _ in $(seq 300); do
    n=$(ls "$T"/up/consumer-*.log 2>/dev/null | wc -l)
    a=$(grep -l 'msg="assigned' "$T"/up/consumer-*.log 2>/dev/null | wc -l)
    [[ $n -gt 0 && $a -ge $n ]] && break
    sleep 0.1
done
"$VENV/bin/python" "$ROOT/bench/dbos_baseline.py" --onceq "127.0.0.1:$PORT" \
    --downstream "127.0.0.1:$DPORT" --dir "$T" --calls-1 "${DBOS_CALLS_1:-300}" \
    --calls-n "${DBOS_CALLS_N:-2000}" --threads "${DBOS_THREADS:-1,32}"
rc=$?
oq_kill up
oq_kill ds
exit $rc
