#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq-bench e2e --tasks` stays usable (a short run, not a measurement): onceq up +
# onceq-downstream, tasks back to back, independent calls closed loop and at the tasks' steps/s,
# tasks open loop at --task-rate, calls at that rate; every task succeeds, and the fair figures
# (idle CPU, CPU per step/call raw and net of it, the step-to-step gap at that rate) are printed.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
BENCH=${ONCEQ_BENCH_BIN:-$(dirname "$ONCEQ_BIN")/onceq-bench}
[[ -x "$BENCH" ]] || oq_fail "no onceq-bench at $BENCH"
timeout 240 "$BENCH" e2e --onceq "$ONCEQ_BIN" --tasks 20 --warmup 10 --task-rate 10 --idle 1s \
    --conns 4 --consumers 1 --dir "$T/run" >"$T/out" 2>&1
rc=$?
cat "$T/out" >&2
[[ $rc == 0 ]] || oq_fail "onceq-bench e2e --tasks exit $rc"
grep -q "^tasks: 20 of 20 succeeded" "$T/out" || oq_fail "not every back-to-back task succeeded"
grep -q "^open-loop tasks: 20 of 20 succeeded at 10.0 tasks/s offered" "$T/out" ||
    oq_fail "not every open-loop task succeeded"
grep -Eq "^idle: the pipeline at rest costs [0-9]+ ms CPU per second" "$T/out" ||
    oq_fail "no idle CPU figure"
grep -Eq "^  independent calls, at the tasks' steps/s +[0-9.]+ +[0-9.]+ +-?[0-9]+ +-?[0-9]+$" \
    "$T/out" || oq_fail "no same-rate phase of independent calls"
grep -Eq "^result bench=e2e-tasks .* cost_ratio_same_rate=[0-9.]+ cost_ratio_net=-?[0-9.]+ task_rate=10.0 cost_ratio_half_net=-?[0-9.]+ gap_half_p50_ms=[0-9.]+ gap_half_p99_ms=[0-9.]+$" \
    "$T/out" || oq_fail "no fair figures on the result line"
oq_pass "onceq-bench e2e --tasks: capacity, same-rate and half-capacity figures"
