#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Unsettled calls never expire (issue 17, item 1). A call in needs_review waits for an
# operator; its key must not expire under it, or a same-key resubmit runs the operation again.
#   - A tool with neither keys nor lookup whose answers are dropped: the call goes to review
#     (one charge in the downstream's ledger). The producer runs with --key-ttl 2s and purges
#     every second.
#   - Past the key's TTL the call is still there; a same-key resubmit gets the SAME call back
#     (needs_review), nothing is sent: still one charge. `onceq purge --key-ttl 1s` deletes
#     nothing.
#   - The review resolved afterwards still applies (the producer's call succeeds with the
#     operator's reference), and from then on the key's retention runs: expires_at = the
#     moment it settled + key_ttl. verify (with the ledger) is clean.
# On the code before the fix the resubmit made a new call and a second charge.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
RT_VARIANTS='[
  {"name": "blind_drop", "url": "http://127.0.0.1:'$DPORT'/v1/payments",
   "body": {"amount": "{amount}"}, "idempotency_header": null,
   "headers": {"X-Downstream-Fault": "drop-after-commit"}}
]'
rt_tools "$T/tools.json"
PL_PRODUCER_X+=(--key-ttl 2s --purge-interval 1s)
PL_CONSUMER_X+=(--tools "$T/tools.json" --lease 3s --recover-every 200ms)
pl_start 1

c1=$(rt_submit order-7 blind_drop '{"amount":70}')
rt_wait_status order-7 needs_review 30 || oq_fail "order-7: $(rt_call order-7)"
[[ $(rt_dstat .ledger.effects) == 1 ]] || oq_fail "ledger: $(rt_dstat .ledger)"

sleep 4 # twice the key's TTL, several purge passes
[[ $(rt_call order-7 | jq -r '.call_id + " " + .status') == "$c1 needs_review" ]] ||
    oq_fail "the unresolved call expired: $(rt_call order-7)"
c2=$(rt_submit order-7 blind_drop '{"amount":70}')
[[ $c2 == "$c1" ]] || oq_fail "a same-key resubmit past the TTL made a new call $c2 (was $c1)"
sleep 2 # what a second call would need to reach the downstream
charges=$(rt_dstat .ledger.effects)
[[ $charges == 1 && $(rt_dstat .requests.post_payment) == 1 ]] ||
    oq_fail "charges in the ledger: $charges, requests: $(rt_dstat .requests.post_payment)"
"$ONCEQ_BIN" purge --db "$PDB" --key-ttl 1s >"$T/purge.json" || oq_fail "onceq purge"
[[ $(jq -r .calls "$T/purge.json") == 0 ]] || oq_fail "purge deleted calls: $(cat "$T/purge.json")"
[[ $(rt_call order-7 | jq -r .call_id) == "$c1" ]] || oq_fail "purged: $(rt_call order-7)"
oq_pass "past the key's TTL: same call back, not purged, one charge in the ledger"

pid=$(sqlite3 "$DDB" "SELECT id FROM payments ORDER BY seq DESC LIMIT 1")
fence=$("$ONCEQ_BIN" review list --db "$CDB" --json | jq -r '.review[0].fence')
"$ONCEQ_BIN" review resolve "$c1" --db "$CDB" --fence "$fence" --as committed --ref "$pid" \
    --note "payment $pid seen in the provider dashboard" --by ada >/dev/null || oq_fail "resolve"
rt_wait_status order-7 succeeded 30 || oq_fail "the resolution did not apply: $(rt_call order-7)"
[[ $(rt_call order-7 | jq -r '.call_id + " " + .result.object_id') == "$c1 $pid" ]] ||
    oq_fail "resolved call: $(rt_call order-7)"
grep -q "unknown call" "$T/producer.log" && oq_fail "a result was dropped as unknown call"
# the key's retention counts from now (settled), not from the submit
read -r upd exp <<<"$(sqlite3 -separator " " "$PDB" "SELECT updated_at, expires_at FROM calls WHERE call_id='$c1'")"
((exp - upd == 2000)) || oq_fail "expires_at $exp is not settled ($upd) + 2 s"
[[ $(rt_dstat .ledger.effects) == 1 ]] || oq_fail "ledger after the resolution: $(rt_dstat .ledger)"
J=$(rt_verify)
[[ $? == 0 ]] || oq_fail "verify: $J"
oq_pass "the review resolved afterwards applied; retention from settling; verify clean"
