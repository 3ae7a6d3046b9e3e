#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# /metrics of the producer, the relay and two consumers on one effects.db, scraped before and
# after a little load, checked with Prometheus' own text parser (python3-prometheus-client,
# Debian's; tests/integration/check_metrics.py): the exposition parses; counters and only
# counters end in _total and never go down; onceq_build_info{version,component} and the
# standard process_* metrics are there; calls by status (needs_review included) are in the
# producer's /metrics; lag has topic/partition labels and dead letters a reason; the gauges
# read from the shared effects.db come from exactly one of the two consumers.
# Without the parser the test is skipped (exit 77), under CI=true it fails.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

# Debian's python (the PATH python3 may be another one, without Debian's packages).
PY=/usr/bin/python3
if ! [[ -x $PY ]] || ! "$PY" -c 'import prometheus_client.parser' 2>/dev/null; then
    [[ "${CI:-}" == true ]] && oq_fail "the Prometheus parser is missing: apt-get install python3-prometheus-client"
    echo "SKIP: no Prometheus text parser (apt-get install python3-prometheus-client)"
    exit 77
fi
CHECK=$ONCEQ_SRC/tests/integration/check_metrics.py

oq_tmpdir
oq_start_broker
PPORT=$(oq_free_port) || oq_fail "no free port"
RPORT=$(oq_free_port) || oq_fail "no free port"
C1PORT=$(oq_free_port) || oq_fail "no free port"
C2PORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn producer "$ONCEQ_BIN" producer --db "$T/calls.db" --listen "127.0.0.1:$PPORT" \
    --brokers "$BROKERS" -X session.timeout.ms=6000
oq_wait_for 15 curl -sf "http://127.0.0.1:$PPORT/healthz" || oq_fail "producer did not come up"
oq_spawn relay "$ONCEQ_BIN" relay --db "$T/calls.db" --brokers "$BROKERS" \
    --metrics-listen "127.0.0.1:$RPORT"
for i in 1 2; do
    port=C${i}PORT
    oq_spawn "c$i" "$ONCEQ_BIN" consumer --db "$T/effects.db" --brokers "$BROKERS" \
        -X session.timeout.ms=6000 --metrics-listen "127.0.0.1:${!port}" --worker-id "w$i"
done
ready() { curl -sf -o /dev/null --max-time 3 "http://127.0.0.1:$1/readyz"; }
for p in "$RPORT" "$C1PORT" "$C2PORT"; do
    oq_wait_for 40 ready "$p" || oq_fail "port $p never ready"
done

submit() { # N calls of charge from index $1
    local i
    for ((i = $1; i < $1 + $2; i++)); do
        curl -sf -o /dev/null --max-time 10 -X POST -H "Idempotency-Key: m-$i" \
            "http://127.0.0.1:$PPORT/v1/tool-calls" -d "{\"tool\":\"charge\",\"args\":{\"amount\":$((i + 1))}}" ||
            oq_fail "submit $i failed"
    done
}
succeeded() {
    curl -sf "http://127.0.0.1:$PPORT/metrics" | grep -q "^onceq_producer_calls{status=\"succeeded\"} $1\$"
}
scrape() { # scrape SUFFIX
    curl -sf --max-time 5 "http://127.0.0.1:$PPORT/metrics" >"$T/producer.$1.prom" || oq_fail "producer /metrics"
    curl -sf --max-time 5 "http://127.0.0.1:$RPORT/metrics" >"$T/relay.$1.prom" || oq_fail "relay /metrics"
    curl -sf --max-time 5 "http://127.0.0.1:$C1PORT/metrics" >"$T/c1.$1.prom" || oq_fail "c1 /metrics"
    curl -sf --max-time 5 "http://127.0.0.1:$C2PORT/metrics" >"$T/c2.$1.prom" || oq_fail "c2 /metrics"
}

submit 0 10
oq_wait_for 30 succeeded 10 || oq_fail "10 calls did not succeed: $(curl -s "http://127.0.0.1:$PPORT/metrics" | grep onceq_producer_calls)"
sleep 2.5 # the consumers refresh their database gauges every 2 s
scrape a
submit 10 20
oq_wait_for 30 succeeded 30 || oq_fail "30 calls did not succeed"
sleep 2.5
scrape b

"$PY" "$CHECK" producer "$T/producer.a.prom" "$T/producer.b.prom" \
    'onceq_producer_calls{status}' onceq_producer_submits_total onceq_producer_writer_cpu_seconds_total \
    'onceq_producer_writer_seconds_total{work}' onceq_producer_results_lag_seconds_count \
    onceq_producer_outbox_pending onceq_http_responses_total ||
    oq_fail "producer metrics"
"$PY" "$CHECK" relay "$T/relay.a.prom" "$T/relay.b.prom" onceq_relay_published_total \
    onceq_relay_pending_rows onceq_ready 'onceq_relay_dead_letters_total{reason}' ||
    oq_fail "relay metrics"
for i in 1 2; do
    "$PY" "$CHECK" consumer "$T/c$i.a.prom" "$T/c$i.b.prom" onceq_consumer_consumed_total \
        'onceq_consumer_dlq_total{reason}' onceq_ready || oq_fail "consumer $i metrics"
done
cat "$T/c1.b.prom" "$T/c2.b.prom" | grep -q '^onceq_consumer_lag{topic="onceq.tool-calls",partition="[0-9]*"} ' ||
    oq_fail "no consumer exports lag per partition"
grep -q '^onceq_producer_calls{status="needs_review"} 0$' "$T/producer.b.prom" ||
    oq_fail "calls by status lacks needs_review"
grep -q '^onceq_producer_calls{status="succeeded"} 30$' "$T/producer.b.prom" ||
    oq_fail "calls by status: $(grep onceq_producer_calls "$T/producer.b.prom")"
# the shared effects.db: one worker exports its gauges, and they count every execution once
n=$(cat "$T/c1.b.prom" "$T/c2.b.prom" | grep -c '^onceq_consumer_executions{state="COMMITTED"} ' || true)
((n == 1)) || oq_fail "onceq_consumer_executions exported by $n workers (want 1)"
[[ $(cat "$T/c1.b.prom" "$T/c2.b.prom" | awk '$1 == "onceq_consumer_executions{state=\"COMMITTED\"}" {print $2}') == 30 ]] ||
    oq_fail "COMMITTED executions gauge is not 30"
n=$(cat "$T/c1.b.prom" "$T/c2.b.prom" | grep -c '^onceq_consumer_review_queue ' || true)
((n == 1)) || oq_fail "onceq_consumer_review_queue exported by $n workers (want 1)"
oq_pass "producer, relay and consumer /metrics parse; _total counters grow; build_info, process_*, calls by status, lag by partition"
