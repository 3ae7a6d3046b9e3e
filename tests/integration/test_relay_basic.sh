#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Relay, happy path: 10,000 outbox rows over 500 keys reach the topic, every message_id exactly
# once (no faults here, so no duplicates either), key/value/header intact and per-key order
# kept (read back with oq_relay_check); metrics and the status line report it; SIGTERM exits 0
# and releases the lease; a restarted relay with a short --retention deletes published rows.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

FILL=$(oq_tool oq_relay_fill)
CHECK=$(oq_tool oq_relay_check)
DBQ=$(oq_tool oq_relay_db)
db_is() { [[ "$("$DBQ" "$1" "$2")" == "$3" ]]; }

oq_tmpdir
oq_start_broker --partitions 12
DB=$T/calls.db
"$FILL" --db "$DB" --rows 10000 --keys 500 >/dev/null || oq_fail "fill failed"

PORT=$(oq_free_port)
oq_spawn relay "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS" --lease 2s \
    --metrics-listen "127.0.0.1:$PORT"
oq_wait_for 60 db_is "$DB" pending 0 || oq_fail "rows still pending after 60 s: $("$DBQ" "$DB" pending)"
oq_log "all 10000 rows marked published"

"$CHECK" --brokers "$BROKERS" --db "$DB" --max-dups 0 --timeout-ms 30000 >"$T/check.out" ||
    { cat "$T/check.out"; oq_fail "topic check failed"; }
cat "$T/check.out"
grep -q "total=10000 received=10000 distinct=10000 missing=0 dups=0" "$T/check.out" ||
    oq_fail "unexpected check summary"

# Metrics (Prometheus text) and the status line.
curl -fsS "http://127.0.0.1:$PORT/metrics" >"$T/metrics.txt" || oq_fail "metrics endpoint"
grep -Eq '^onceq_relay_published_total(\{[^}]*\})? 10000$' "$T/metrics.txt" || oq_fail "published_total"
oq_wait_for 5 bash -c "curl -fsS http://127.0.0.1:$PORT/metrics | grep -Eq '^onceq_relay_pending_rows(\{[^}]*\})? 0$'" ||
    oq_fail "pending_rows gauge"
grep -Eq '^onceq_relay_lease_holder(\{[^}]*\})? 1$' "$T/metrics.txt" || oq_fail "lease_holder gauge"
grep -q '^onceq_relay_publish_latency_seconds_bucket' "$T/metrics.txt" || oq_fail "latency histogram"
grep -q '^onceq_relay_oldest_pending_age_seconds' "$T/metrics.txt" || oq_fail "oldest age gauge"
STATUS=$("$DBQ" "$DB" status)
oq_log "status: $STATUS"
[[ "$STATUS" == *"pending=0"* && "$STATUS" == *"published=10000"* && "$STATUS" == *"fence=1"* &&
    "$STATUS" == *"expires_in="* ]] || oq_fail "status line: $STATUS"

# A new commit while idle is published promptly (coarse check: process start-up included).
"$FILL" --db "$DB" --rows 1 >/dev/null
oq_wait_for 5 db_is "$DB" pending 0 || oq_fail "idle relay did not publish a new row within 5 s"

# SIGTERM: exit 0, lease released.
kill -TERM "$(oq_pid relay)"
rc=0
oq_wait_exit relay 15 || rc=$?
[[ $rc == 0 ]] || oq_fail "relay exit code $rc after SIGTERM"
STATUS=$("$DBQ" "$DB" status)
[[ "$STATUS" == *"holder=none"* ]] || oq_fail "lease not released: $STATUS"
grep -q "lease outbox released" "$T/relay.log" || oq_fail "no release log line"

# Retention: a relay with --retention 1s deletes the published rows in bounded batches.
oq_spawn relay2 "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS" --retention 1s --cleanup-batch 500
oq_wait_for 30 db_is "$DB" total 0 || oq_fail "retention did not delete published rows: total=$("$DBQ" "$DB" total)"
"$FILL" --db "$DB" --rows 5 >/dev/null
oq_wait_for 10 db_is "$DB" pending 0 || oq_fail "rows after cleanup not published"
oq_kill relay2 TERM
oq_pass "relay basic: 10000 rows once each, order kept, metrics, status, SIGTERM, retention"
