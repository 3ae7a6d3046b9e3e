#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Webhooks (issue 21, item 3): 2,000 calls submitted with a callback_url to a receiver that is
# down for the first 20 s, on a pipeline (embedded broker, relay, two consumers, producer with
# its results ingest and webhook sender), and the producer killed -9 twice: once while results
# are applied and their deliveries queued (receiver still down), once while deliveries are
# flowing. The receiver (tests/tools/oq_webhook_check.py) must get every call's delivery:
# distinct call ids == 2,000 after deduplicating by Idempotency-Key, every signature valid
# (clients/python's verify_webhook), copies under one key byte-identical; a tampered body fails
# verification; `onceq verify` clean; no dead delivery; the sender's metrics count them.
# ctest-cost: 40
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
TOOL="$ONCEQ_SRC/tests/tools/oq_webhook_check.py"
N=${ONCEQ_WEBHOOK_CALLS:-2000}

oq_tmpdir
SECRET=whsec_test_5f2b0c1e9a7d4c3b
printf '%s\n' "$SECRET" >"$T/secret"
chmod 600 "$T/secret"
RPORT=$(oq_free_port) || oq_fail "no free port"
CB="http://127.0.0.1:$RPORT/hooks/onceq"
PL_PRODUCER_X=(--webhook-secret-file "$T/secret" --webhook-retry-base 250ms
    --webhook-retry-max 2s --webhook-concurrency 4 --webhook-timeout 5s
    -X session.timeout.ms=6000 --redrive-after 10s --redrive-interval 1s)
pl_start 2
URL=http://127.0.0.1:$PORT
T0=$SECONDS
oq_log "receiver down (port $RPORT): submitting $N calls with callback_url=$CB"
timeout 120 "$PY" "$TOOL" submit --url "$URL" --n "$N" --prefix wh --callback "$CB" \
    >"$T/ids" 2>"$T/submit.err" || oq_fail "submit: $(tail -3 "$T/submit.err")"
[[ $(wc -l <"$T/ids") == "$N" ]] || oq_fail "submit: $(wc -l <"$T/ids") call ids"

settled() {
    curl -sf "$URL/stats" | jq -e --argjson n "$1" \
        '.by_status.succeeded + .by_status.failed >= $n' >/dev/null
}
restart_producer() {
    oq_kill producer KILL
    pl_spawn_producer
    pl_wait_healthy 30
}
# 1. kill -9 while results are applied (deliveries queued in their transactions)
oq_wait_for 90 settled $((N / 4)) || oq_fail "a quarter of the calls not settled in 90 s"
queued=$(sqlite3 "$PDB" "SELECT count(*) FROM webhook_deliveries")
oq_log "kill -9 producer with $queued deliveries queued, none delivered (receiver down)"
restart_producer
# the receiver comes up 20 s after the first submit
while ((SECONDS - T0 < 20)); do sleep 0.5; done
oq_spawn receiver "$PY" "$TOOL" receiver --port "$RPORT" --out "$T/received" --delay-ms 5
oq_log "receiver up after $((SECONDS - T0)) s"
# 2. kill -9 while deliveries flow
got() { [[ -f "$T/received" ]] && (($(wc -l <"$T/received") >= $1)); }
oq_wait_for 90 got $((N / 3)) || oq_fail "fewer than $((N / 3)) deliveries 90 s after the receiver came up"
oq_log "kill -9 producer after $(wc -l <"$T/received") deliveries received"
restart_producer

all_delivered() {
    [[ $(sqlite3 "$PDB" "SELECT count(*) FROM webhook_deliveries WHERE state='delivered'") == "$N" ]]
}
pl_wait_drained 180 "$N" || oq_fail "calls not terminal within 180 s"
oq_wait_for 120 all_delivered || oq_fail "not every delivery delivered: $(sqlite3 "$PDB" \
    "SELECT state, count(*), max(tries) FROM webhook_deliveries GROUP BY state")"
oq_log "all $N delivered $((SECONDS - T0)) s after the first submit"
sqlite3 "$PDB" "SELECT 'tries', max(tries), sum(tries) FROM webhook_deliveries" >&2

R=$("$PY" "$TOOL" check --out "$T/received" --calls "$T/ids" --secret "$SECRET" --src "$ONCEQ_SRC")
rc=$?
echo "$R"
[[ $rc == 0 ]] || oq_fail "receiver check failed"
[[ $(jq -r .distinct_calls <<<"$R") == "$N" ]] || oq_fail "distinct call ids != $N"
[[ $(jq -r .tampered_refused <<<"$R") == true ]] || oq_fail "a tampered body was not refused"

pl_verify_clean --accepted "$T/ids" >"$T/verify.json"
D=$("$ONCEQ_BIN" dlq list --webhooks-db "$PDB")
grep -q "no dead webhook deliveries" <<<"$D" || oq_fail "dead deliveries: $D"
M=$(curl -sf "$URL/metrics")
grep -q '^onceq_webhook_deliveries_total{outcome="delivered"} [1-9]' <<<"$M" ||
    oq_fail "no delivered counter: $(grep onceq_webhook <<<"$M")"
gauge_zero() { curl -sf "$URL/metrics" | grep -q '^onceq_webhook_pending 0$'; }
oq_wait_for 10 gauge_zero || oq_fail "pending gauge: $(curl -sf "$URL/metrics" | grep '^onceq_webhook')"
oq_pass "webhooks: $N calls delivered through a 20 s outage and two kill -9 in $((SECONDS - T0)) s"
