#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# HTTP tools through the whole pipeline (producer, relay, consumer --tools, onceq-downstream):
#   - response lost (the downstream commits, then drops the connection) for a downstream that
#     honours keys and has a lookup (pay) and for one without keys but with a lookup by
#     reference (pay_by_reference): every call ends `succeeded` with the downstream's object
#     id, and the ledger holds exactly one effect per call (the outcome was UNKNOWN, stored,
#     and the lookup found the payment: nothing was resent);
#   - 429 and 503 with Retry-After: retried, and not before Retry-After;
#   - a final 4xx: FAILED_FINAL at once, sent once, never retried;
#   - the producer saw `running` before the end state;
#   - the consumer's metrics and stats count it all: unknown outcomes, reconciliation verdicts
#     and success rate, time from UNKNOWN to resolved, requests by tool and outcome class with
#     their latency, executions by state (RECONCILING included), the review queue.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
RT_VARIANTS='[
  {"base": true, "name": "pay_drop", "headers": {"X-Downstream-Fault": "drop-after-commit"}},
  {"name": "ref_drop", "url": "http://127.0.0.1:'$DPORT'/v1/payments",
   "body": {"amount": "{amount}", "reference": "{effect_id}"}, "idempotency_header": null,
   "headers": {"X-Downstream-Fault": "drop-after-commit"},
   "lookup": {"url": "http://127.0.0.1:'$DPORT'/v1/payments?reference={effect_id}"}}
]'
rt_tools "$T/tools.json"
MPORT=$(oq_free_port)
PL_CONSUMER_X+=(--tools "$T/tools.json" --lease 3s --recover-every 200ms --retry-base 100ms
    --metrics-listen "127.0.0.1:$MPORT")
pl_start 1

# --- response lost --------------------------------------------------------------------------------
N=6
for i in $(seq 1 $N); do
    rt_submit "drop-$i" pay_drop "{\"amount\":$((100 + i))}" >/dev/null
    rt_submit "ref-$i" ref_drop "{\"amount\":$((200 + i))}" >/dev/null
done
for i in $(seq 1 $N); do
    for k in "drop-$i" "ref-$i"; do
        rt_wait_status "$k" succeeded 60 || oq_fail "$k: $(rt_call "$k")"
        call=$(rt_call "$k")
        cid=$(jq -r .call_id <<<"$call")
        oid=$(jq -r .result.object_id <<<"$call")
        [[ $k == drop-* ]] && by=idempotency_key || by=reference
        read -r n lid <<<"$(rt_ledger_by "$by" "$(rt_eid "$cid")")"
        [[ $n == 1 ]] || oq_fail "$k: $n effects in the ledger for $by=$(rt_eid "$cid")"
        [[ $oid == "$lid" && $oid == pay_* ]] || oq_fail "$k: object id $oid, ledger has $lid"
        path=$(rt_cq "SELECT group_concat(event, ',') FROM (SELECT event FROM audit
                      WHERE call_id='$cid' ORDER BY id)")
        [[ $path == started,unknown,reconciling,committed ]] || oq_fail "$k: audit path $path"
    done
done
posts=$(rt_dstat .requests.post_payment)
((posts == 2 * N)) || oq_fail "$((2 * N)) calls reached the downstream as $posts requests (a resend?)"
[[ $(rt_dstat .ledger.duplicate_effects) == 0 ]] || oq_fail "duplicates: $(rt_dstat .ledger)"
oq_pass "response lost, keys + lookup and reference lookup only: $((2 * N)) calls, one effect each, succeeded with the downstream's id"

# --- metrics and stats ---------------------------------------------------------------------------
sleep 2.5 # (gauges from the database are refreshed every 2 s)
curl -sf "http://127.0.0.1:$MPORT/metrics" >"$T/metrics.txt" || oq_fail "no /metrics"
m() { awk -v k="$1" '$1 == k {print $2}' "$T/metrics.txt"; }
for k in 'onceq_consumer_unknown_outcomes_total' \
    'onceq_consumer_reconciliations_total{outcome="found"}' \
    'onceq_consumer_unknown_resolved_seconds_count' \
    'onceq_consumer_downstream_requests_total{tool="pay_drop",class="UNKNOWN"}' \
    'onceq_consumer_downstream_requests_total{tool="pay_drop",class="FOUND"}' \
    'onceq_consumer_downstream_requests_total{tool="ref_drop",class="UNKNOWN"}' \
    'onceq_consumer_downstream_seconds_count{tool="ref_drop"}'; do
    v=$(m "$k")
    [[ -n "$v" ]] && (($(printf '%.0f' "$v") >= N)) || oq_fail "metric $k = '${v}' (want >= $N)"
done
[[ $(m 'onceq_consumer_reconciliation_success_ratio') == 1 ]] || oq_fail "success ratio $(m 'onceq_consumer_reconciliation_success_ratio')"
for k in 'onceq_consumer_executions{state="RECONCILING"}' 'onceq_consumer_executions{state="UNKNOWN"}' \
    'onceq_consumer_executions{state="NEEDS_REVIEW"}' onceq_consumer_review_queue \
    onceq_consumer_review_oldest_seconds; do
    [[ $(m "$k") == 0 ]] || oq_fail "metric $k = '$(m "$k")' (want 0)"
done
[[ $(m 'onceq_consumer_executions{state="COMMITTED"}') == $((2 * N)) ]] || oq_fail "committed gauge"
S=$(curl -sf "http://127.0.0.1:$MPORT/stats") || oq_fail "no /stats"
jq -e --argjson n "$N" '.reconciliation.found >= 2 * $n and .reconciliation.success_rate == 1
    and .reconciliation.unknown_to_resolved_ms.n >= 2 * $n
    and .reconciliation.unknown_to_resolved_ms.p99 >= .reconciliation.unknown_to_resolved_ms.p50
    and .downstream.pay_drop.by_class.UNKNOWN == $n and .downstream.pay_drop.latency_ms.p99 > 0
    and .review.queue == 0 and .executions.COMMITTED == 2 * $n and .unknown >= 2 * $n' <<<"$S" >/dev/null ||
    oq_fail "stats: $S"
oq_pass "metrics and stats: unknown outcomes, verdicts (success rate 1), UNKNOWN -> resolved p50/p99, per-tool classes and latency"

# --- 429 / 503 with Retry-After: honoured and retried -----------------------------------------
for f in 429 503; do
    rt_mode "{\"faults\":\"$f:1\",\"retry_after_s\":2}"
    cid=$(rt_submit "ra-$f" pay '{"amount":9}')
    oq_wait_for 20 rt_at_least 1 rt_cq "SELECT count(*) FROM audit WHERE call_id='$cid' AND event='failed_retryable'" ||
        oq_fail "$f: no retryable failure: $(rt_cq "SELECT event, detail FROM audit WHERE call_id='$cid'")"
    rt_mode '{"faults":""}'
    rt_wait_status "ra-$f" succeeded 30 || oq_fail "ra-$f: $(rt_call "ra-$f")"
    gap=$(rt_cq "WITH s AS (SELECT ts, row_number() OVER (ORDER BY id) n FROM audit
                 WHERE call_id='$cid' AND event='started') SELECT b.ts - a.ts FROM s a JOIN s b
                 ON b.n = a.n + 1 AND a.n = 1")
    ((gap >= 2000)) || oq_fail "$f: retried after $gap ms, before Retry-After (2 s)"
    read -r n _ <<<"$(rt_ledger_by idempotency_key "$(rt_eid "$cid")")"
    [[ $n == 1 ]] || oq_fail "$f: $n effects"
    oq_log "$f + Retry-After 2 s: retried after $gap ms, succeeded"
done
oq_pass "429 and 503 with Retry-After: retried no earlier than Retry-After, one effect each"

# --- a final 4xx is not retried ----------------------------------------------------------------
before=$(rt_dstat .requests.post_payment)
cid=$(rt_submit "bad-amount" pay '{"amount":-5}')
rt_wait_status bad-amount failed 30 || oq_fail "bad-amount: $(rt_call bad-amount)"
[[ $(rt_call bad-amount | jq -r .error.code) == status_400 ]] || oq_fail "error: $(rt_call bad-amount)"
sleep 1
[[ $(rt_cq "SELECT count(*) FROM audit WHERE call_id='$cid' AND event='started'") == 1 ]] ||
    oq_fail "a final refusal was retried"
(($(rt_dstat .requests.post_payment) == before + 1)) || oq_fail "sent more than once"
oq_pass "final 4xx: failed at once (status_400), sent once"

# --- the producer saw running ------------------------------------------------------------------
PCQ() { sqlite3 -cmd ".timeout 10000" "$PDB" "$1"; }
[[ $(PCQ "SELECT count(DISTINCT call_id) FROM audit WHERE event='running'") -ge $((2 * N)) ]] ||
    oq_fail "running not applied: $(PCQ "SELECT event, count(*) FROM audit GROUP BY 1")"
bad=$(PCQ "SELECT count(*) FROM audit r JOIN audit t ON r.call_id = t.call_id AND r.id > t.id
           WHERE r.event = 'running' AND t.event IN ('succeeded','failed','needs_review')")
[[ $bad == 0 ]] || oq_fail "running after a terminal state"
oq_pass "producer: pending -> running -> terminal, never back"

J=$(rt_verify)
[[ $? == 0 ]] || oq_fail "verify: $J"
[[ $(jq -r '.downstream.duplicates' <<<"$J") == 0 && $(jq -r '.downstream.effects' <<<"$J") -ge $((2 * N + 2)) ]] ||
    oq_fail "verify's downstream view: $(jq -c .downstream <<<"$J")"
oq_pass "verify with the downstream ledger: clean, downstream DSR $(jq -r .downstream.dsr <<<"$J")"
