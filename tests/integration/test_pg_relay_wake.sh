#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The relay on PostgreSQL wakes on LISTEN/NOTIFY, not at its next poll. An idle relay waits on
# its LISTEN connection's socket (relay/relay.c, note_wait), so a commit of another connection
# is read when its NOTIFY arrives. The relay runs with --poll-max 1s, where polling alone
# notices a commit only after tens to hundreds of ms; ten submits in SQL (onceq.submit, each
# its own transaction, 300 ms apart) must each end an idle wait by a NOTIFY: the relay's
# `stopped` line counts them (notify_wakes) and the test wants at least 8. It prints the
# publish latency the relay measured (onceq_relay_publish_latency_seconds). Fails on a relay
# that only polls: notify_wakes is 0 (or absent).
# ctest-cost: 15
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
URL=$(oq_pg_fresh_db onceq_it_relay_wake)
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "migrate"
q() { psql -XAtq "$URL" -c "$1"; }
oq_start_broker
MPORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn relay "$ONCEQ_BIN" relay --db "$URL" --brokers "$BROKERS" --poll-max 1s \
    --metrics-listen "127.0.0.1:$MPORT"
oq_wait_for 30 curl -sf -o /dev/null "http://127.0.0.1:$MPORT/readyz" || oq_fail "relay never ready"
published() { q "SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease"; }
sleep 1 # idle: the relay's poll backoff has grown to --poll-max
for i in $(seq 1 10); do
    q "SELECT call_id FROM onceq.submit('default', 'wake-$i', 'charge', '{\"amount\":$i}')" >/dev/null ||
        oq_fail "submit $i"
    sleep 0.3
done
oq_wait_for 20 bash -c "[[ \$(psql -XAtq '$URL' -c 'SELECT count(*) FROM onceq.outbox WHERE pub_seq <= (SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease)') -ge 10 ]]" ||
    oq_fail "the 10 rows were not all published (watermark $(published))"
lat=$(curl -sf "http://127.0.0.1:$MPORT/metrics" | awk '/^onceq_relay_publish_latency_seconds_(sum|count)/ {print $2}' | paste -sd' ')
oq_kill relay
line=$(grep 'msg="stopped"' "$T/relay.log" | tail -n1)
[[ -n $line ]] || oq_fail "no stopped line in the relay's log"
wakes=$(grep -o 'notify_wakes=[0-9]*' <<<"$line" | cut -d= -f2 || true)
oq_log "relay: ${line#*msg=}"
oq_log "publish latency (sum count): $lat"
[[ -n $wakes ]] || oq_fail "the relay's stopped line has no notify_wakes"
((wakes >= 8)) || oq_fail "only $wakes of 10 idle commits woke the relay by NOTIFY"
oq_pass "relay on PostgreSQL: $wakes of 10 idle commits woke it by NOTIFY (poll-max 1s)"
