#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq-bench mcp` stays usable (a short run, not a measurement): onceq up + onceq-downstream,
# closed loops through /mcp and through POST /v1/tool-calls + wait, for the compiled charge
# and the HTTP tool pay, closed and paced at half of that rate; every call succeeds and the
# figures are printed.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
BENCH=${ONCEQ_BENCH_BIN:-$(dirname "$ONCEQ_BIN")/onceq-bench}
[[ -x "$BENCH" ]] || oq_fail "no onceq-bench at $BENCH"
"$BENCH" --help | grep -q '^  mcp ' || oq_fail "onceq-bench --help lacks mcp"
timeout 240 "$BENCH" mcp --onceq "$ONCEQ_BIN" --calls 60 --conns 4 --dir "$T/run" >"$T/out" 2>&1
rc=$?
cat "$T/out" >&2
[[ $rc == 0 ]] || oq_fail "onceq-bench mcp exit $rc"
grep -q "not succeeded" "$T/out" && oq_fail "some calls did not succeed"
for t in charge pay; do
    grep -Eq "^$t: /mcp [0-9]+ calls/s vs HTTP submit \+ wait [0-9]+ calls/s: ratio [0-9.]+; the gateway's added latency p50 [-+][0-9.]+ ms, p99 [-+][0-9.]+ ms" "$T/out" ||
        oq_fail "no figures for $t"
    grep -Eq "^$t at half of capacity \([0-9]+ calls/s offered\): .* added latency p50 [-+][0-9.]+ ms, p99 [-+][0-9.]+ ms" "$T/out" ||
        oq_fail "no half-capacity figures for $t"
done
oq_pass "onceq-bench mcp: /mcp vs HTTP submit + wait, compiled and HTTP tools"
