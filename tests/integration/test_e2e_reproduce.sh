#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Duplicate injection from outside: after a batch of calls has run to completion, every
# message in onceq.tool-calls is produced 3 more times, byte for byte (tests/tools/
# oq_e2e_dup.c; same key, value and headers), and so is every message in onceq.tool-results.
# The consumers must absorb the 3 extra copies of every call message (inbox seen > 1), the
# producer must absorb the extra results: effects, call count and states stay unchanged and
# `onceq verify` stays clean.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

N=${ONCEQ_E2E_CALLS:-500}
pl_start 2
pl_load --calls "$N" --conns 4 --prefix rp --sleep-ms 5 --accepted "$T/accepted" >"$T/load.out" ||
    oq_fail "load failed: $(cat "$T/load.out")"
pl_wait_drained 120 "$N" || oq_fail "first pass not drained"
J1=$(pl_verify --accepted "$T/accepted") || oq_fail "verify before the injection: $J1"
E1=$(pl_field "$J1" effects)
S1=$(grep -o '"by_state":{[^}]*}' <<<"$J1")
R1=$(pl_field "$J1" inbox_duplicates)
oq_log "before: effects=$E1 $S1 redelivered=$R1"

"$(oq_tool oq_e2e_dup)" --brokers "$BROKERS" --topic onceq.tool-calls --times 3 >"$T/dup.out" ||
    oq_fail "re-producing onceq.tool-calls failed: $(cat "$T/dup.out")"
cat "$T/dup.out"
READ=$(sed -n 's/^read=\([0-9]*\).*/\1/p' "$T/dup.out")
((READ >= N)) || oq_fail "read only $READ call messages back (want >= $N)"
"$(oq_tool oq_e2e_dup)" --brokers "$BROKERS" --topic onceq.tool-results --times 3 >"$T/dupr.out" ||
    oq_fail "re-producing onceq.tool-results failed: $(cat "$T/dupr.out")"
cat "$T/dupr.out"

# Every extra copy must reach a consumer and be counted as a duplicate.
absorbed() {
    local j
    j=$(pl_verify --allow-pending --examples 0 2>/dev/null)
    (($(pl_field "$j" inbox_duplicates) >= R1 + 3 * READ))
}
oq_wait_for 120 absorbed || oq_fail "not all $((3 * READ)) injected copies reached the inbox"
sleep 2
J2=$(pl_verify --accepted "$T/accepted")
rc=$?
echo "$J2"
[[ $rc == 0 ]] || oq_fail "verify after the injection exit $rc"
[[ $(pl_field "$J2" effects) == "$E1" ]] || oq_fail "effects changed: $E1 -> $(pl_field "$J2" effects)"
[[ $(grep -o '"by_state":{[^}]*}' <<<"$J2") == "$S1" ]] || oq_fail "call states changed"
[[ $(pl_field "$J2" duplicates) == 0 ]] || oq_fail "duplicate effects"
oq_pass "3 extra copies of $READ call messages and of every result absorbed; effects unchanged ($E1)"
