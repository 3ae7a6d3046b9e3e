#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The benchmark program stays usable: `onceq bench` points at onceq-bench (exit 2), and a short
# `onceq-bench e2e` runs the onceq binary next to it (onceq up, load over HTTP, drain, hop
# table, verify) end to end and reports a clean verify.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
BENCH=${ONCEQ_BENCH_BIN:-$(dirname "$ONCEQ_BIN")/onceq-bench}
[[ -x "$BENCH" ]] || oq_fail "no onceq-bench at $BENCH"

"$ONCEQ_BIN" bench e2e --calls 10 >"$T/old.out" 2>&1
rc=$?
[[ $rc == 2 ]] || oq_fail "onceq bench: want exit 2, got $rc"
grep -q "onceq-bench e2e" "$T/old.out" || oq_fail "onceq bench does not point at onceq-bench: $(cat "$T/old.out")"
"$BENCH" --help | grep -q '^  e2e ' || oq_fail "onceq-bench --help lacks e2e"
"$BENCH" nope 2>/dev/null
[[ $? == 2 ]] || oq_fail "unknown benchmark: want exit 2"
"$BENCH" e2e --onceq "$T/missing" --calls 10 2>/dev/null
[[ $? == 2 ]] || oq_fail "missing onceq binary: want exit 2"

ONCEQ_LOG_LEVEL=error timeout 150 "$BENCH" e2e --calls 600 --rate 2000 --conns 16 --warmup 50 \
    --no-baseline --dir "$T/e2e" >"$T/e2e.out" 2>&1
rc=$?
cat "$T/e2e.out"
[[ $rc == 0 ]] || oq_fail "onceq-bench e2e exit $rc"
grep -q "^submit: 600 calls offered at 2000/s, 600 accepted" "$T/e2e.out" || oq_fail "not all calls accepted"
grep -q "^verify: .* clean$" "$T/e2e.out" || oq_fail "verify not clean"
grep -qE "^  load +x1 " "$T/e2e.out" || oq_fail "no CPU line for the load generator"

# --http-tools: the same calls to an HTTP tool against onceq-downstream, side by side
ONCEQ_LOG_LEVEL=error timeout 150 "$BENCH" e2e --calls 300 --rate 0 --conns 16 --warmup 20 \
    --no-baseline --http-tools --dir "$T/e2e-http" >"$T/http.out" 2>&1
rc=$?
grep -v '^ts=' "$T/http.out" | tail -4
[[ $rc == 0 ]] || oq_fail "onceq-bench e2e --http-tools exit $rc: $(tail -20 "$T/http.out")"
grep -q "^verify, downstream ledger: 320 effects for 320 calls, 0 duplicates" "$T/http.out" ||
    oq_fail "no clean downstream verify"
grep -qE "^same run: in-process charge [0-9]+ calls/s.* HTTP pay via onceq-downstream [0-9]+ calls/s" \
    "$T/http.out" || oq_fail "no side-by-side figures"
oq_pass "onceq bench points at onceq-bench; onceq-bench e2e runs onceq end to end, also with HTTP tools"
