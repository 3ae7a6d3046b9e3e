#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A worker SIGSTOPped in the middle of a request, past its lease; another worker takes the call
# over through reconciliation; the first resumes and its late answer is refused by the fence.
# Worker A sends two calls while the downstream holds requests 4 s before acting ("slow"):
#   pay               keys honoured + lookup: B's lookup finds nothing yet, the tool honours
#                     keys, so B resends with the same key; A's request lands later and is
#                     replayed by the downstream: one effect;
#   pay_by_reference  no keys, lookup by reference: B's "not found" comes before the settle time
#                     (the request's 5 s timeout), so it is not trusted; B asks again after it,
#                     finds A's payment: one effect, no resend.
# Then A is resumed: its outcome writes are refused ('lease_lost' by A), nothing changes.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
rt_tools "$T/tools.json"
COMMON=(--tools "$T/tools.json" --lease 2s --recover-every 200ms)
PL_CONSUMER_X+=("${COMMON[@]}" --worker-id A)
pl_start 1
rt_mode '{"faults":"slow:1","slow_ms":4000}'
c1=$(rt_submit stop-keys pay '{"amount":11}')
c2=$(rt_submit stop-ref pay_by_reference '{"amount":12}')
oq_wait_for 30 rt_at_least 2 rt_dstat .requests.post_payment || oq_fail "A sent nothing"
kill -STOP "$(oq_pid consumer-1)"
oq_on_exit 'kill -CONT $(oq_pid consumer-1) 2>/dev/null'
rt_mode '{"faults":""}'
oq_log "A stopped with two requests held by the downstream"
[[ $(rt_cq "SELECT group_concat(state || '/' || lease_owner) FROM executions") == STARTED/A,STARTED/A ]] ||
    oq_fail "not both started by A: $(rt_cq "SELECT call_id, state, lease_owner FROM executions")"

PL_CONSUMER_X=(-X session.timeout.ms=6000 "${COMMON[@]}" --worker-id B)
pl_spawn_consumer 2
rt_wait_status stop-keys succeeded 30 || oq_fail "stop-keys: $(rt_call stop-keys)"
rt_wait_status stop-ref succeeded 30 || oq_fail "stop-ref: $(rt_call stop-ref)"
# the call's story without redeliveries the inbox skipped (a Kafka redelivery may land anywhere)
ev() { rt_cq "SELECT group_concat(event || '@' || worker, ',') FROM (SELECT event, worker FROM audit WHERE call_id='$1' AND event <> 'duplicate_skipped' ORDER BY id)"; }
oq_log "keys: $(ev "$c1")"
oq_log "ref:  $(ev "$c2")"
[[ $(ev "$c1") == *"safe_retry@B,started@B,committed@B"* ]] || oq_fail "keys: B did not resend: $(ev "$c1")"
[[ $(ev "$c2") != *started@B* && $(ev "$c2") == *committed@B ]] || oq_fail "ref: resent or not found: $(ev "$c2")"
[[ $(rt_cq "SELECT count(*) FROM audit WHERE call_id='$c2' AND event='unknown' AND detail LIKE '%settle%'") -ge 1 ]] ||
    oq_fail "ref: the early 'not found' was not held back: $(ev "$c2")"

kill -CONT "$(oq_pid consumer-1)"
oq_log "A resumed"
oq_wait_for 30 rt_at_least 2 rt_cq "SELECT count(*) FROM audit WHERE event='lease_lost' AND worker='A'" ||
    oq_fail "A's late answers were not refused: $(ev "$c1") / $(ev "$c2")"
sleep 1
for k in stop-keys stop-ref; do
    cid=$(rt_call "$k" | jq -r .call_id)
    [[ $k == stop-keys ]] && by=idempotency_key || by=reference
    read -r n lid <<<"$(rt_ledger_by "$by" "$(rt_eid "$cid")")"
    [[ $n == 1 ]] || oq_fail "$k: $n effects in the ledger"
    [[ $(rt_call "$k" | jq -r .result.object_id) == "$lid" ]] || oq_fail "$k: object id differs"
    [[ $(rt_cq "SELECT state FROM executions WHERE call_id='$cid'") == COMMITTED ]] || oq_fail "$k moved"
    [[ $(rt_cq "SELECT count(*) FROM effects WHERE call_id='$cid'") == 1 ]] || oq_fail "$k: local effects"
done
[[ $(rt_dstat .ledger.duplicate_effects) == 0 ]] || oq_fail "duplicates: $(rt_dstat .ledger)"
J=$(rt_verify)
[[ $? == 0 ]] || oq_fail "verify: $J"
oq_pass "SIGSTOP past the lease: B took over (resend by key; lookup after the settle time), A's late answers refused, one effect each"
