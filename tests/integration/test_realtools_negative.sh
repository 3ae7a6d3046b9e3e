#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A negative control: what the protocol prevents is visible when its premise is false. A tool
# declared "idempotent" (so a lost answer is settled by resending with the same key) against a
# downstream that in truth ignores keys, with half the replies dropped after commit: the
# resends make duplicates, and the downstream's ledger (and `onceq verify --downstream-db`,
# which reads it) shows them. The same calls against a downstream that honours keys, in the
# same run, make none: the checker sees the difference the declaration makes.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
RT_VARIANTS='[
  {"base": true, "name": "liar", "lookup": null, "headers": {"X-Downstream-Keys": "ignore"}},
  {"base": true, "name": "honest", "lookup": null}
]'
rt_tools "$T/tools.json"
PL_CONSUMER_X+=(--tools "$T/tools.json" --lease 3s --recover-every 200ms --max-attempts 8)
pl_start 1
rt_mode '{"faults":"drop-after-commit:0.5","seed":7}'
N=12
for i in $(seq 1 $N); do
    rt_submit "liar-$i" liar '{"amount":3}' >/dev/null
    rt_submit "honest-$i" honest '{"amount":4}' >/dev/null
done
done_all() {
    local k s
    for k in $(seq 1 $N); do
        for s in liar honest; do
            [[ $(rt_call "$s-$k" | jq -r .status) =~ ^(succeeded|needs_review)$ ]] || return 1
        done
    done
}
oq_wait_for 90 done_all || oq_fail "not all calls settled"
rt_mode '{"faults":""}'
count() { # TOOL: "effects calls" in the ledger for that tool's keys
    local tot=0 k cid n
    for k in $(seq 1 $N); do
        cid=$(rt_call "$1-$k" | jq -r .call_id)
        read -r n _ <<<"$(rt_ledger_by idempotency_key "$(rt_eid "$cid")")"
        tot=$((tot + n))
    done
    echo "$tot"
}
liar=$(count liar)
honest=$(count honest)
unknown=$(rt_cq "SELECT count(*) FROM audit a JOIN executions x USING (call_id) WHERE x.tool='liar' AND a.event='unknown'")
oq_log "liar: $liar effects for $N calls ($unknown unknown outcomes resent); honest: $honest effects for $N calls"
((unknown > 0)) || oq_fail "no reply was dropped: the control proves nothing"
((liar > N)) || oq_fail "the false declaration made no duplicates ($liar effects for $N calls)"
((honest == N)) || oq_fail "keys honoured, yet $honest effects for $N calls"
((liar - N == $(rt_dstat .ledger.duplicate_effects))) || oq_fail "ledger duplicate counter: $(rt_dstat .ledger)"
J=$(rt_verify --allow-pending)
rc=$?
[[ $rc == 3 ]] || oq_fail "verify did not fail on the duplicates (exit $rc): $J"
[[ $(jq -r .by_kind.downstream_dup <<<"$J") == $((liar - N)) ]] || oq_fail "verify: $(jq -c '{by_kind,downstream}' <<<"$J")"
jq -e '.downstream.dsr > 0 and (.examples | map(select(.kind == "downstream_dup")) | length) > 0' <<<"$J" >/dev/null ||
    oq_fail "verify's downstream view: $(jq -c '{downstream,examples}' <<<"$J")"
oq_pass "negative control: a false 'idempotent' declaration shows $((liar - N)) duplicate effects in the ledger (verify exit 3, downstream DSR $(jq -r .downstream.dsr <<<"$J")); honoured keys none"
