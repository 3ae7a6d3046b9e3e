#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq verify` reads a producer (and consumer) on PostgreSQL: producer and relay on a fresh
# database of the test server, one consumer on SQLite, 60 calls. verify --producer-db URL is
# clean with every call and effect counted; then a violation made on the PostgreSQL side (a
# call with an effect set to failed) is reported (exit 3, failed_with_effect), so verify reads
# the server, not a copy of its own; the URL's password file is never printed.
# ctest-cost: 25
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
oq_require_pg
oq_tmpdir
URL=$(oq_pg_fresh_db onceq_it_verify)
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "migrate"
q() { psql -XAtq "$URL" -c "$1"; }
oq_start_broker
PDB=$URL
CDB=$T/effects.db
PORT=$(oq_free_port)
export PDB CDB PORT
pl_spawn_producer
pl_spawn_relay
pl_spawn_consumer 1
pl_wait_healthy 30
for i in $(seq 1 60); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -X POST \
        "http://127.0.0.1:$PORT/v1/tool-calls" -H "Idempotency-Key: v-$i" \
        -H 'Content-Type: application/json' -d "{\"tool\":\"charge\",\"args\":{\"amount\":$i}}")
    [[ "$code" == 202 ]] || oq_fail "submit v-$i: HTTP $code"
done
pl_wait_drained 90 60 || oq_fail "not drained: $(q "SELECT state, count(*) FROM onceq.calls GROUP BY state")"
pl_verify_clean --examples 3
[[ $(pl_field "$J" calls) == 60 && $(pl_field "$J" effects) == 60 ]] || oq_fail "counts: $J"
CID=$(q "SELECT call_id FROM onceq.calls ORDER BY call_id LIMIT 1")
q "UPDATE onceq.calls SET state = 'failed' WHERE call_id = '$CID'" >/dev/null
set +e
OUT=$(pl_verify --examples 3)
rc=$?
set -e
echo "$OUT"
((rc == 3)) || oq_fail "a violation in PostgreSQL: verify exit $rc, want 3"
[[ $(jq -r '.by_kind.failed_with_effect' <<<"$OUT") == 1 ]] || oq_fail "failed_with_effect not reported"
grep -q "$CID" <<<"$OUT" || oq_fail "the call is not named"
"$ONCEQ_BIN" verify --producer-db "$URL" --consumer-db "$CDB" >"$T/text.out" 2>&1 || true
! grep -q "passfile\|postgresql://" "$T/text.out" || oq_fail "verify printed the database string: $(head -3 "$T/text.out")"
oq_pass "onceq verify on PostgreSQL: clean run read, a violation made in the server reported"
