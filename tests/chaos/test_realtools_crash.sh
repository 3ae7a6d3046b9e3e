#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 40
# kill -9 of a consumer at the two crash points of outside calls, under load (calls keep
# arriving while it dies and while its successor recovers), against `onceq-downstream`:
#   consumer.after_request_sent_before_outcome  the request left (the downstream may have done
#       it), nothing recorded: the STARTED row's lease lapses -> UNKNOWN -> lookup
#   consumer.after_outcome_commit_before_offset the outcome is durable, the Kafka offsets are
#       not: the messages come again and are absorbed by the inbox / the execution's state
# Half the calls go to a downstream that honours keys (pay), half to one that only offers a
# lookup by reference (pay_by_reference). Afterwards: every call succeeded, and the
# downstream's own ledger holds exactly one effect per call (DSR 0 where the customer sees it).
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
rt_tools "$T/tools.json"
PL_CONSUMER_X+=(--tools "$T/tools.json" --lease 2s --recover-every 200ms --batch 8)
pl_start 1

submit_many() { # PREFIX N: N calls, alternating tools, 8 at a time
    seq 1 "$2" | xargs -P 8 -I{} bash -c '
        if (( {} % 2 )); then t=pay; else t=pay_by_reference; fi
        curl -s -o /dev/null -X POST "http://127.0.0.1:'"$PORT"'/v1/tool-calls" \
            -H "Idempotency-Key: '"$1"'-{}" -d "{\"tool\":\"$t\",\"args\":{\"amount\":{}}}"'
}

N=40
round=0
for point in consumer.after_request_sent_before_outcome@12 consumer.after_outcome_commit_before_offset@2; do
    round=$((round + 1))
    oq_kill consumer-1 TERM
    pl_spawn_consumer 1 ONCEQ_CRASH_AT="$point"
    submit_many "r$round" "$N" &
    loader=$!
    oq_wait_exit consumer-1 90
    rc=$?
    [[ $rc == 137 ]] || oq_fail "round $round ($point): consumer exit $rc, expected 137"
    oq_log "round $round: $point fired; a new consumer takes over while calls still arrive"
    pl_spawn_consumer 1
    wait "$loader"
    for i in $(seq 1 $N); do
        rt_wait_status "r$round-$i" succeeded 90 || oq_fail "r$round-$i: $(rt_call "r$round-$i")"
        call=$(rt_call "r$round-$i")
        cid=$(jq -r .call_id <<<"$call")
        ((i % 2)) && by=idempotency_key || by=reference
        read -r n lid <<<"$(rt_ledger_by "$by" "$(rt_eid "$cid")")"
        [[ $n == 1 ]] || oq_fail "round $round: r$round-$i has $n effects in the ledger"
        [[ $(jq -r .result.object_id <<<"$call") == "$lid" ]] || oq_fail "r$round-$i: object id differs: $call / $lid"
    done
    oq_log "round $round: $(rt_cq "SELECT group_concat(event || '=' || n) FROM (SELECT event, count(*) n
        FROM audit WHERE event IN ('unknown','reconciling','lease_lost','duplicate_skipped') GROUP BY 1)")"
done
[[ $(rt_dstat .ledger.duplicate_effects) == 0 ]] || oq_fail "ledger duplicates: $(rt_dstat .ledger)"
[[ $(rt_dstat .ledger.logical_calls) == $((2 * N)) ]] || oq_fail "ledger: $(rt_dstat .ledger)"
J=$(rt_verify)
[[ $? == 0 ]] || oq_fail "verify: $J"
oq_pass "kill -9 at both outside-call crash points under load: $((2 * N)) calls, one downstream effect each"
