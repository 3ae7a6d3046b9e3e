#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The per-call reconciliation figures (README, "Metrics": reconciliation success rate per
# UNKNOWN call, manual recovery rate, UNKNOWN -> final p50/p95/p99 with review excluded), read
# from the consumer's rows by GET /stats ("calls"), `onceq stats --consumer-db --json` and the
# onceq_consumer_calls_* gauges of /metrics. Seven calls through the pipeline:
#   - 2 `pay` calls answered normally: never UNKNOWN;
#   - 3 `pay_drop` calls whose answer is dropped after the downstream committed: UNKNOWN, the
#     lookup finds the payment (resolved by machine);
#   - 1 `pay_keyed` call (keys honoured, declared idempotent, no lookup) whose first answer is
#     dropped (a seeded draw): UNKNOWN, resent with the same key (resolved by machine);
#   - 1 `blind_drop` call (neither keys nor lookup): UNKNOWN -> NEEDS_REVIEW, resolved by an
#     operator several seconds later.
# Expected: 7 calls, 5 UNKNOWN, 4 resolved by machine (rate 0.8, per call: the lookups are
# counted once per call), 1 review (manual rate 1/7), the UNKNOWN -> final quantiles over the 4
# machine-resolved calls only (n = 4, p99 below the reviewed call's wait), the same figures
# from every reader and again after the consumer restarted. STATS_OUT=FILE keeps the "calls"
# object of `onceq stats` (test_pg_call_stats.sh compares SQLite and PostgreSQL with it).
# PL_CDB: the consumers' database (a PostgreSQL URL), as in chaos/pipeline.sh.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

REVIEW_WAIT=6 # seconds the reviewed call waits for its operator
rt_start_downstream
RT_VARIANTS='[
  {"base": true, "name": "pay_drop", "headers": {"X-Downstream-Fault": "drop-after-commit"}},
  {"base": true, "name": "pay_keyed", "lookup": null},
  {"name": "blind_drop", "url": "http://127.0.0.1:'$DPORT'/v1/payments",
   "body": {"amount": "{amount}"}, "idempotency_header": null,
   "headers": {"X-Downstream-Fault": "drop-after-commit"}}
]'
rt_tools "$T/tools.json"
MPORT=$(oq_free_port)
PL_CONSUMER_X+=(--tools "$T/tools.json" --lease 3s --recover-every 200ms --retry-base 100ms
    --metrics-listen "127.0.0.1:$MPORT")
pl_start 1
A=http://127.0.0.1:$MPORT

for i in 1 2; do rt_submit "plain-$i" pay "{\"amount\":$((10 + i))}" >/dev/null; done
for i in 1 2 3; do rt_submit "drop-$i" pay_drop "{\"amount\":$((20 + i))}" >/dev/null; done
for k in plain-1 plain-2 drop-1 drop-2 drop-3; do
    rt_wait_status "$k" succeeded 60 || oq_fail "$k: $(rt_call "$k")"
done
# seeded draws (restarted at 0 by the seed): u(1, 0) = 0.034 drops the first answer, u(1, 1) =
# 0.914 lets the resend through
rt_mode '{"faults":"drop-after-commit:0.1","seed":1}'
rt_submit keyed-1 pay_keyed '{"amount":31}' >/dev/null
rt_wait_status keyed-1 succeeded 60 || oq_fail "keyed-1: $(rt_call keyed-1)"
rt_mode '{"faults":""}'
cb=$(rt_submit blind-1 blind_drop '{"amount":41}')
rt_wait_status blind-1 needs_review 60 || oq_fail "blind-1: $(rt_call blind-1)"
sleep "$REVIEW_WAIT"
fence=$(rt_cq "SELECT fence FROM executions WHERE call_id='$cb'")
"$ONCEQ_BIN" review resolve "$cb" --db "$CDB" --fence "$fence" --as committed \
    --note "seen in the dashboard" >/dev/null || oq_fail "review resolve"
rt_wait_status blind-1 succeeded 60 || oq_fail "blind-1 after review: $(rt_call blind-1)"
# the reviewed call's own UNKNOWN -> final time, from its audit
waited=$(rt_cq "SELECT max(ts) - min(ts) FROM audit WHERE call_id='$cb' AND event IN ('unknown', 'committed')")
((waited >= REVIEW_WAIT * 1000)) || oq_fail "reviewed call waited only $waited ms"
# the existing per-lookup figure counts lookups; the new one counts calls
[[ $(rt_cq "SELECT count(*) FROM audit WHERE event='unknown'") -ge 5 ]] || oq_fail "fewer than 5 UNKNOWN rows"

check_calls() { # JSON WHERE
    jq -e --argjson w "$waited" '
        .calls == 7 and .unknown == 5 and .unknown_resolved == 4 and .review == 1
        and .unknown_pending == 0
        and .reconciliation_success_rate == 0.8
        and (.manual_recovery_rate - 1/7 | fabs) < 1e-9
        and .unknown_to_final_ms.n == 4
        and .unknown_to_final_ms.p50 > 0
        and .unknown_to_final_ms.p50 <= .unknown_to_final_ms.p95
        and .unknown_to_final_ms.p95 <= .unknown_to_final_ms.p99
        and .unknown_to_final_ms.p99 < $w' <<<"$1" >/dev/null ||
        oq_fail "$2: calls figures: $1 (reviewed call waited $waited ms)"
}

live=$(curl -sf "$A/stats" | jq -cS .calls)
check_calls "$live" "GET /stats"
oq_pass "GET /stats: 5 of 7 calls went UNKNOWN, 4 resolved by machine (0.8), 1 to review (1/7), UNKNOWN -> final over 4 calls, p99 $(jq .unknown_to_final_ms.p99 <<<"$live") ms < the reviewed $waited ms"

# /metrics: the same figures as gauges (refreshed from the rows by the exporting worker)
gauges_ok() {
    curl -sf "$A/metrics" >"$T/m2.prom" || return 1
    grep -qx 'onceq_consumer_calls_unknown 5' "$T/m2.prom" &&
        grep -qx 'onceq_consumer_calls_unknown_resolved 4' "$T/m2.prom" &&
        grep -qx 'onceq_consumer_calls_review 1' "$T/m2.prom"
}
curl -sf "$A/metrics" >"$T/m1.prom"
oq_wait_for 40 gauges_ok || oq_fail "gauges: $(grep onceq_consumer_calls "$T/m2.prom")"
grep onceq_consumer_calls "$T/m2.prom"
awk '$1=="onceq_consumer_calls_reconciliation_success_ratio" {exit !($2 == 0.8)}' "$T/m2.prom" ||
    oq_fail "success ratio gauge"
awk '$1=="onceq_consumer_calls_manual_recovery_ratio" {exit !($2 > 0.1428 && $2 < 0.1429)}' "$T/m2.prom" ||
    oq_fail "manual recovery ratio gauge"
awk -v w="$waited" '$1=="onceq_consumer_calls_unknown_to_final_seconds{quantile=\"0.99\"}" {f=1; exit !($2 > 0 && $2 * 1000 < w)} END {if (!f) exit 1}' "$T/m2.prom" ||
    oq_fail "p99 gauge includes the reviewed call, or is missing"
if python3 -c 'import prometheus_client' 2>/dev/null; then
    python3 "$ONCEQ_SRC/tests/integration/check_metrics.py" consumer "$T/m1.prom" "$T/m2.prom" \
        onceq_consumer_calls_unknown onceq_consumer_calls_unknown_resolved \
        onceq_consumer_calls_review onceq_consumer_calls_reconciliation_success_ratio \
        onceq_consumer_calls_manual_recovery_ratio \
        'onceq_consumer_calls_unknown_to_final_seconds{quantile}' || oq_fail "metrics format"
fi
oq_pass "/metrics: onceq_consumer_calls_* gauges agree, p99 excludes the reviewed call"

# durable: the consumer restarts (its in-memory counters start from zero), the figures stay
oq_kill consumer-1
pl_spawn_consumer 1
oq_wait_for 30 curl -sf -o /dev/null "$A/stats" || oq_fail "consumer did not come back"
again=$(curl -sf "$A/stats" | jq -cS .calls)
[[ "$again" == "$live" ]] || oq_fail "after a restart /stats calls: $again (before: $live)"
[[ $(curl -sf "$A/stats" | jq .reconciliation.found) == 0 ]] || oq_fail "in-memory counters did not restart"
oq_kill consumer-1
"$ONCEQ_BIN" stats --db "$PDB" --consumer-db "$CDB" --json >"$T/stats.json" || oq_fail "onceq stats --consumer-db"
cli=$(jq -cS .calls "$T/stats.json")
[[ "$cli" == "$live" ]] || oq_fail "onceq stats calls: $cli vs /stats: $live"
[[ -z "${STATS_OUT:-}" ]] || echo "$cli" >"$STATS_OUT"
oq_pass "after a restart and from \`onceq stats --consumer-db --json\`: the same figures"

# bad input: a missing consumer database is an error and is not created
"$ONCEQ_BIN" stats --db "$PDB" --consumer-db "$T/none.db" --json >/dev/null 2>"$T/err.txt"
rc=$?
[[ $rc != 0 && ! -e "$T/none.db" ]] || oq_fail "missing consumer db: rc $rc"
grep -q "no consumer database" "$T/err.txt" || oq_fail "error: $(cat "$T/err.txt")"
oq_pass "a missing --consumer-db is an error (exit $rc), nothing created"
