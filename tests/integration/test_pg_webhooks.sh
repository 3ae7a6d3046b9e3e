#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Webhooks with the producer on PostgreSQL (issue 21, item 3): the delivery rows are written by
# producer/store_pg.c in the transaction that settles the call, and the sender reads and marks
# them there. A pipeline (embedded broker, relay and producer on one PostgreSQL database, one
# consumer); 300 calls with a callback_url to a receiver that is down for the first 8 s; the
# producer killed -9 while deliveries are queued: every call is delivered (deduplicated by
# Idempotency-Key), every signature verifies, `onceq dlq list --webhooks-db URL` has none dead,
# and the rows in onceq.webhook_deliveries are all delivered.
# ctest-cost: 40
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
TOOL="$ONCEQ_SRC/tests/tools/oq_webhook_check.py"
N=300
DB=$(oq_pg_fresh_db onceq_it_webhooks)
q() { psql -XAtq "$DB" -c "$1"; }
SECRET=whsec_pg_0123456789abcdef
printf '%s\n' "$SECRET" >"$T/secret"
chmod 600 "$T/secret"
PORT=$(oq_free_port) || oq_fail "no free port"
RPORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
oq_start_broker
producer() {
    oq_spawn producer "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT" \
        --brokers "$BROKERS" -X session.timeout.ms=6000 --redrive-after 10s \
        --redrive-interval 1s --webhook-secret-file "$T/secret" --webhook-retry-base 200ms \
        --webhook-retry-max 1s
    oq_wait_for 30 curl -sf -o /dev/null "$URL/readyz" || oq_fail "producer not ready"
}
producer
oq_spawn relay "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS"
oq_spawn consumer "$ONCEQ_BIN" consumer --db "$T/effects.db" --brokers "$BROKERS" \
    -X session.timeout.ms=6000
T0=$SECONDS
timeout 120 "$PY" "$TOOL" submit --url "$URL" --n "$N" --prefix pgwh \
    --callback "http://127.0.0.1:$RPORT/hook" >"$T/ids" 2>"$T/submit.err" ||
    oq_fail "submit: $(tail -3 "$T/submit.err")"
queued() { (($(q "SELECT count(*) FROM onceq.webhook_deliveries") >= $1)); }
oq_wait_for 90 queued $((N / 3)) || oq_fail "fewer than $((N / 3)) deliveries queued in 90 s"
oq_log "kill -9 producer with $(q "SELECT count(*) FROM onceq.webhook_deliveries") deliveries queued"
oq_kill producer KILL
producer
while ((SECONDS - T0 < 8)); do sleep 0.5; done
oq_spawn receiver "$PY" "$TOOL" receiver --port "$RPORT" --out "$T/received"
all_delivered() {
    [[ $(q "SELECT count(*) FROM onceq.webhook_deliveries WHERE state='delivered'") == "$N" ]]
}
oq_wait_for 150 all_delivered || oq_fail "not all delivered: $(q \
    "SELECT state, count(*), max(tries) FROM onceq.webhook_deliveries GROUP BY state")"
oq_log "all $N delivered $((SECONDS - T0)) s after the first submit"
R=$("$PY" "$TOOL" check --out "$T/received" --calls "$T/ids" --secret "$SECRET" --src "$ONCEQ_SRC")
rc=$?
echo "$R"
[[ $rc == 0 ]] || oq_fail "receiver check failed"
D=$("$ONCEQ_BIN" dlq list --webhooks-db "$DB")
grep -q "no dead webhook deliveries in postgres" <<<"$D" || oq_fail "dlq list: $D"
oq_pass "webhooks on PostgreSQL: $N delivered through an 8 s outage and a kill -9"
