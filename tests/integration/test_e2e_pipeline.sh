#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End to end with separate processes: embedded broker, producer (HTTP), relay, 3 consumers.
# ONCEQ_E2E_CALLS calls (default 2000; the issue's 10,000 with ONCEQ_E2E_CALLS=10000) of
# mixed tools (charge, send_email, sleep 5 ms, fail retryable, fail final) over HTTP, with
# same-key replays and same-key-other-body conflicts mixed in. Then:
#   - every call is terminal (drained), `onceq verify` is clean (exit 0),
#   - effects = succeeded charge + send_email calls, duplicate effects = 0, DSR = 0,
#   - every call id the client saw accepted is in calls.db,
#   - every fail-final call failed, every charge/send_email call succeeded.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

N=${ONCEQ_E2E_CALLS:-2000}
pl_start 3

oq_log "submitting $N calls"
pl_load --calls "$N" --conns 8 --prefix e2e --sleep-ms 5 --dup-every 50 --conflict-every 97 \
    --accepted "$T/accepted" >"$T/load1.out" || { cat "$T/load1.out"; oq_fail "load generator reported failures"; }
cat "$T/load1.out"
grep -q "^accepted=$N\$" "$T/load1.out" || oq_fail "not all $N calls accepted"
grep -q '^replays_bad=0$' "$T/load1.out" || oq_fail "a same-key replay returned another call"
grep -q '^conflicts_bad=0$' "$T/load1.out" || oq_fail "a same-key conflict was not refused with 422"

pl_wait_drained 240 "$N" || oq_fail "calls not terminal within 240 s"

J=$(pl_verify --accepted "$T/accepted")
rc=$?
echo "$J"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc: $J"
[[ $(pl_field "$J" clean) == true ]] || oq_fail "verify not clean"
[[ $(pl_field "$J" calls) == "$N" ]] || oq_fail "calls != $N"
[[ $(pl_field "$J" duplicates) == 0 ]] || oq_fail "duplicate effects"
[[ $(pl_field "$J" lost) == 0 ]] || oq_fail "lost calls"
eff=$(pl_field "$J" effects)
exp=$(pl_field "$J" expected_effects)
[[ "$eff" == "$exp" ]] || oq_fail "effects ($eff) != succeeded charge+send_email calls ($exp)"
ch=$(sed -n 's/^charge=//p' "$T/load1.out")
em=$(sed -n 's/^send_email=//p' "$T/load1.out")
ff=$(sed -n 's/^fail_final=//p' "$T/load1.out")
[[ "$eff" == $((ch + em)) ]] || oq_fail "effects ($eff) != charge+send_email submitted ($((ch + em)))"
failed=$(grep -o '"failed":[0-9]*' <<<"$J" | head -n1 | cut -d: -f2)
((failed >= ff)) || oq_fail "only $failed failed calls for $ff fail-final submits"

# A second full pass of the same keys and bodies: all replays, nothing new executes.
oq_log "re-submitting the same $N keys: must all be replays"
pl_load --calls "$N" --conns 8 --prefix e2e --sleep-ms 5 >"$T/load2.out" || oq_fail "replay pass failed"
pl_wait_drained 120 "$N" || oq_fail "not drained after the replay pass (retry resets)"
J2=$(pl_verify)
[[ $? == 0 ]] || oq_fail "verify after the replay pass: $J2"
[[ $(pl_field "$J2" effects) == "$eff" ]] || oq_fail "replay pass changed the effects count"
[[ $(pl_field "$J2" calls) == "$N" ]] || oq_fail "replay pass created calls"

oq_pass "e2e: $N calls through 3 consumers, all terminal, effects=$eff, verify clean"
