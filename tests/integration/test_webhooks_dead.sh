#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Webhooks (issue 21, item 3), the budget and the operator's redrive: a receiver that always
# answers 500 gets each delivery exactly --webhook-max-tries times (with backoff), after which
# the deliveries are dead: `onceq dlq list --webhooks-db` lists them (and show tells the last
# status), the sender's metrics count them. Once the receiver is fixed, `onceq dlq redrive ID`
# and `redrive all` give them a fresh budget and each is delivered once more, same
# Idempotency-Key and body, signature valid; a redrive of a delivery that is not dead is
# refused (exit 4).
# ctest-cost: 40
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
TOOL="$ONCEQ_SRC/tests/tools/oq_webhook_check.py"
N=5
TRIES=3

oq_tmpdir
SECRET=whsec_dead_letters_0123456789
printf '%s\n' "$SECRET" >"$T/secret"
chmod 600 "$T/secret"
RPORT=$(oq_free_port) || oq_fail "no free port"
echo 500 >"$T/status"
PL_PRODUCER_X=(--webhook-secret-file "$T/secret" --webhook-max-tries "$TRIES"
    --webhook-retry-base 100ms --webhook-retry-max 300ms -X session.timeout.ms=6000)
pl_start 1
URL=http://127.0.0.1:$PORT
oq_spawn receiver "$PY" "$TOOL" receiver --port "$RPORT" --out "$T/received" \
    --status-file "$T/status"
oq_wait_for 10 curl -s -o /dev/null "http://127.0.0.1:$RPORT/" || true
timeout 60 "$PY" "$TOOL" submit --url "$URL" --n "$N" --prefix dead \
    --callback "http://127.0.0.1:$RPORT/hook" >"$T/ids" 2>"$T/submit.err" ||
    oq_fail "submit: $(tail -3 "$T/submit.err")"

dead_count() { "$ONCEQ_BIN" dlq list --webhooks-db "$PDB" --json | jq length; }
all_dead() { [[ $(dead_count) == "$N" ]]; }
oq_wait_for 90 all_dead || oq_fail "not $N dead deliveries after 90 s: $(dead_count); $(sqlite3 \
    "$PDB" "SELECT state, tries, last_status FROM webhook_deliveries")"
L=$("$ONCEQ_BIN" dlq list --webhooks-db "$PDB")
echo "$L"
grep -q "$N dead webhook deliveries" <<<"$L" || oq_fail "dlq list: $L"
# exactly TRIES tries each, every one answered 500
per_key=$(jq -r .key "$T/received" | sort | uniq -c | awk '{print $1}' | sort -u)
[[ "$per_key" == "$TRIES" ]] || oq_fail "tries per delivery: $per_key (want $TRIES)"
[[ $(jq -r .status "$T/received" | sort -u) == 500 ]] || oq_fail "a try was not answered 500"
ID=$("$ONCEQ_BIN" dlq list --webhooks-db "$PDB" --json | jq -r '.[0].delivery_id')
S=$("$ONCEQ_BIN" dlq show "$ID" --webhooks-db "$PDB")
echo "$S"
grep -q "$ID (dead)" <<<"$S" || oq_fail "dlq show: $S"
grep -q "last status 500" <<<"$S" || oq_fail "dlq show: no last status 500"
grep -q "^tries *$TRIES" <<<"$S" || oq_fail "dlq show: tries"
dead_metric() {
    curl -sf "$URL/metrics" | grep -q "^onceq_webhook_deliveries_total{outcome=\"dead\"} $N"
}
oq_wait_for 10 dead_metric || oq_fail "metrics: $(curl -sf "$URL/metrics" | grep onceq_webhook)"
curl -sf "$URL/metrics" | grep -q "^onceq_webhook_dead $N" || sleep 2
curl -sf "$URL/metrics" | grep -q "^onceq_webhook_dead $N" || oq_fail "dead gauge"

# the receiver is fixed: redrive one, then all
echo 200 >"$T/status"
"$ONCEQ_BIN" dlq redrive "$ID" --webhooks-db "$PDB" || oq_fail "redrive $ID"
ok_for() { jq -r 'select(.status == 200) | .key' "$T/received" | grep -qx "$1"; }
oq_wait_for 30 ok_for "$ID" || oq_fail "$ID not delivered after its redrive"
[[ $(dead_count) == $((N - 1)) ]] || oq_fail "dead after one redrive: $(dead_count)"
"$ONCEQ_BIN" dlq redrive "$ID" --webhooks-db "$PDB"
[[ $? == 4 ]] || oq_fail "a redrive of a delivery that is not dead must exit 4"
"$ONCEQ_BIN" dlq redrive all --webhooks-db "$PDB" || oq_fail "redrive all"
all_ok() {
    [[ $(jq -r 'select(.status == 200) | .key' "$T/received" | sort -u | wc -l) == "$N" ]]
}
oq_wait_for 30 all_ok || oq_fail "not every delivery delivered after the redrive"
[[ $(dead_count) == 0 ]] || oq_fail "dead deliveries left: $(dead_count)"
[[ $(sqlite3 "$PDB" "SELECT count(*) FROM webhook_deliveries WHERE state='delivered'") == "$N" ]] ||
    oq_fail "not $N delivered rows"
R=$("$PY" "$TOOL" check --out "$T/received" --calls "$T/ids" --secret "$SECRET" --src "$ONCEQ_SRC")
rc=$?
echo "$R"
[[ $rc == 0 ]] || oq_fail "receiver check failed"
oq_pass "webhooks: dead after $TRIES tries, listed by onceq dlq, delivered after redrive"
