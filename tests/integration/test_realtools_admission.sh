#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A consumer holds no more outside calls than it can finish inside its lease: with
# --http-inflight 3 and a downstream holding every payment 2 s, at most 2 x 3 = 6 calls are
# STARTED (leased) at any time, whatever the backlog; the other calls wait in Kafka and are
# taken as answers come back. Before the bound, one worker took up to
# four times --http-inflight (12 here) and let their leases tick in its queue. Then every call
# succeeds with one effect.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream
rt_tools "$T/tools.json"
MPORT=$(oq_free_port)
PL_CONSUMER_X+=(--tools "$T/tools.json" --metrics-listen "127.0.0.1:$MPORT" --http-inflight 3)
pl_start 1
N=24
rt_mode '{"faults":"slow:1","slow_ms":2000}'
seq 1 $N | xargs -P 8 -I{} curl -s -o /dev/null -X POST "http://127.0.0.1:$PORT/v1/tool-calls" \
    -H "Idempotency-Key: adm-{}" -d '{"tool":"pay","args":{"amount":{}}}' ||
    oq_fail "submits failed"
# sample 60 times (6 s or more: several rounds of answers): the STARTED rows and the
# consumer's held jobs
max_started=0 max_held=0
for ((i = 0; i < 60; i++)); do
    s=$(rt_cq "SELECT count(*) FROM executions WHERE state = 'STARTED'")
    h=$(curl -sf "http://127.0.0.1:$MPORT/stats" | jq -r '.inflight // 0')
    ((s > max_started)) && max_started=$s
    ((h > max_held)) && max_held=$h
    sleep 0.1
done
oq_log "max STARTED: $max_started, max held: $max_held"
((max_started <= 6)) || oq_fail "$max_started calls STARTED at once (bound: 2 x --http-inflight = 6)"
((max_held <= 6)) || oq_fail "$max_held outside jobs held at once (bound 6)"
rt_mode '{"faults":""}'
for i in $(seq 1 $N); do
    rt_wait_status "adm-$i" succeeded 60 || oq_fail "adm-$i: $(rt_call "adm-$i")"
done
[[ $(rt_dstat .ledger.effects) == "$N" && $(rt_dstat .ledger.duplicate_effects) == 0 ]] ||
    oq_fail "ledger: $(rt_dstat .ledger)"
oq_pass "at most $max_started calls STARTED with --http-inflight 3; $N calls, $N effects"
