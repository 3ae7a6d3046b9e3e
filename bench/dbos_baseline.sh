#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The durable-execution baseline (make bench, 12.): onceq vs a DBOS workflow doing the same
# payment against the same `onceq-downstream`, closed loop with 1 and 32 client threads, same
# run (bench/dbos_baseline.py says how each side is measured).
#
#   bench/dbos_baseline.sh [path/to/onceq]   env: DBOS_VENV (default: BUILD/dbos-venv),
#                                            DBOS_CALLS_1 (1000), DBOS_CALLS_N (2000),
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
. "$ROOT/bench/pay_pipeline.sh"
pay_pipeline_start "$BIN" "$DS"
"$VENV/bin/python" "$ROOT/bench/dbos_baseline.py" --onceq "127.0.0.1:$PORT" \
    --downstream "127.0.0.1:$DPORT" --dir "$T" --calls-1 "${DBOS_CALLS_1:-1000}" \
    --calls-n "${DBOS_CALLS_N:-2000}" --threads "${DBOS_THREADS:-1,32}"
rc=$?
oq_kill up
oq_kill ds
exit $rc
