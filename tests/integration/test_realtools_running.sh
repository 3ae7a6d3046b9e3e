#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An outside call tells the producer `running` only when it is still out about a second after
# its request left (or ends in a state that is not final): calls that onceq-downstream answers
# at once cost the producer one result each, as an inline run does (before: `running` and the
# end state, two results per call), while a call the downstream holds 4 s is seen `running`
# before it succeeds. STARTED is still committed before every request leaves (one effect per
# call in the ledger, verify clean).
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
rt_tools "$T/tools.json"
PL_CONSUMER_X+=(--tools "$T/tools.json")
pl_start 1
PCQ() { sqlite3 -cmd ".timeout 10000" "$PDB" "$1"; }

# --- answered at once: no `running` -------------------------------------------------------------
N=20
for i in $(seq 1 $N); do
    rt_submit "fast-$i" pay "{\"amount\":$i}" >/dev/null
done
for i in $(seq 1 $N); do
    rt_wait_status "fast-$i" succeeded 60 || oq_fail "fast-$i: $(rt_call "fast-$i")"
done
ran=$(PCQ "SELECT count(DISTINCT a.call_id) FROM audit a JOIN calls c ON c.call_id = a.call_id
           WHERE a.event = 'running' AND c.idem_key LIKE 'fast-%'")
# Each is answered in milliseconds; a loaded machine may hold a few past the second, not half.
((ran < N / 2)) || oq_fail "$ran of $N calls answered at once were told running: $(PCQ \
    "SELECT event, count(*) FROM audit GROUP BY 1")"
oq_pass "$N calls answered at once: $ran told running (one result each, not two)"

# --- still out after a second: `running`, then the end state ------------------------------------
rt_mode '{"faults":"slow:1","slow_ms":4000}'
rt_submit slow-1 pay '{"amount":7}' >/dev/null
rt_wait_status slow-1 succeeded 60 || oq_fail "slow-1: $(rt_call slow-1)"
rt_mode '{"faults":""}'
order=$(PCQ "SELECT group_concat(event, ' ') FROM (SELECT a.event FROM audit a JOIN calls c
             ON c.call_id = a.call_id WHERE c.idem_key = 'slow-1'
             AND a.event IN ('running', 'succeeded') ORDER BY a.id)")
[[ $order == "running succeeded" ]] || oq_fail "slow-1: producer saw '$order'"
oq_pass "a call held 4 s by the downstream: running, then succeeded"

[[ $(rt_dstat .ledger.effects) == $((N + 1)) && $(rt_dstat .ledger.duplicate_effects) == 0 ]] ||
    oq_fail "ledger: $(rt_dstat .ledger)"
J=$(rt_verify) || oq_fail "verify: $J"
oq_pass "one effect per call in the ledger, verify clean"
