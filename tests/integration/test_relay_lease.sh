#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two relays on one database (lease 2 s) while rows keep arriving:
#  1. only the lease holder publishes (the standby's published counter stays 0);
#  2. kill -9 the holder: the standby takes over within the lease (+ its 200 ms poll), not
#     before about half of it, with fence + 1, and publishes the rest;
#  3. SIGSTOP the new holder past its lease: a third relay takes over; after SIGCONT the old
#     holder finds itself fenced ("lease outbox lost") and commits no mark at all;
#  4. at the end nothing is lost, per-key order holds, and every duplicate is of a row that
#     was unmarked when a holder was killed or stopped.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

FILL=$(oq_tool oq_relay_fill)
CHECK=$(oq_tool oq_relay_check)
DBQ=$(oq_tool oq_relay_db)
db_is() { [[ "$("$DBQ" "$1" "$2")" == "$3" ]]; }
metric() { curl -fsS "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {print $2}'; }
now_ms() { date +%s%3N; }

oq_tmpdir
oq_start_broker --partitions 6
DB=$T/calls.db
"$FILL" --db "$DB" --rows 0 >/dev/null
: >"$T/allowed"
PA=$(oq_free_port)
PB=$(oq_free_port)
export ONCEQ_LOG_LEVEL=debug # every committed mark logs "watermark advanced"
relay() { # NAME PORT
    oq_spawn "$1" "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS" --lease 2s --owner "$1" \
        --batch-rows 200 --metrics-listen "127.0.0.1:$2"
}
relay relayA "$PA"
oq_wait_for 10 db_is "$DB" owner relayA || oq_fail "relayA did not take the lease"
relay relayB "$PB"
oq_spawn filler "$FILL" --db "$DB" --rows 30000 --keys 200 --batch 50 --rate 2000
sleep 3

# 1. only the holder publishes
pa=$(metric "$PA" onceq_relay_published_total)
pb=$(metric "$PB" onceq_relay_published_total)
hb=$(metric "$PB" onceq_relay_lease_holder)
oq_log "published: relayA=$pa relayB=$pb (relayB holder=$hb)"
((pa > 0)) || oq_fail "holder relayA published nothing"
[[ "$pb" == 0 && "$hb" == 0 ]] || oq_fail "standby relayB published ($pb) or holds the lease ($hb)"
grep -q "lease outbox acquired" "$T/relayB.log" && oq_fail "standby logged a lease acquisition"
fence1=$("$DBQ" "$DB" fence)

# 2. kill -9 the holder: hand-over within the lease
kill -KILL "$(oq_pid relayA)"
t0=$(now_ms)
oq_wait_exit relayA 5 || true
"$DBQ" "$DB" unmarked-ids >>"$T/allowed"
oq_wait_for 10 db_is "$DB" owner relayB || oq_fail "relayB did not take over within 10 s"
t1=$(now_ms)
handover=$((t1 - t0))
fence2=$("$DBQ" "$DB" fence)
oq_log "hand-over after kill -9: ${handover} ms (lease 2000 ms), fence $fence1 -> $fence2"
((handover <= 2600)) || oq_fail "hand-over took ${handover} ms, lease is 2000 ms"
((handover >= 1000)) || oq_fail "hand-over after ${handover} ms: the lease was stolen early"
((fence2 == fence1 + 1)) || oq_fail "fence did not advance by one"
sleep 1
pb=$(metric "$PB" onceq_relay_published_total)
((pb > 0)) || oq_fail "relayB holds the lease but publishes nothing"

# 3. SIGSTOP the holder past its lease, a third relay takes over, SIGCONT: fenced, no mark
# A Produce round trip of 150 ms keeps deliveries in flight when relayB is paused, so after
# SIGCONT it receives delivery reports and tries to mark them: the fenced path.
PC=$(oq_free_port)
relay relayC "$PC"
oq_broker_ctl "rtt all 150" || oq_fail "ctl rtt"
sleep 0.5
taken=0
for attempt in 1 2 3; do
    kill -STOP "$(oq_pid relayB)"
    marks_before=$(grep -c "watermark advanced" "$T/relayB.log" || true)
    "$DBQ" "$DB" unmarked-ids >>"$T/allowed"
    if oq_wait_for 6 db_is "$DB" owner relayC; then
        taken=1
        break
    fi
    # SQLite itself: a process frozen inside a write transaction (a mark's COMMIT) holds the
    # database lock, and no lease can take it back. Let it finish and pause it again.
    oq_log "attempt $attempt: relayB was frozen holding the SQLite write lock; retrying"
    kill -CONT "$(oq_pid relayB)"
    sleep 1
done
((taken)) || { kill -CONT "$(oq_pid relayB)"; oq_fail "relayC did not take over"; }
fence3=$("$DBQ" "$DB" fence)
sleep 1
kill -CONT "$(oq_pid relayB)"
oq_wait_for 10 grep -q "lease outbox lost" "$T/relayB.log" || oq_fail "resumed relayB did not notice it was fenced"
sleep 2
marks_after=$(grep -c "watermark advanced" "$T/relayB.log" || true)
oq_log "relayB marks: $marks_before before SIGSTOP, $marks_after after SIGCONT; fence now $fence3"
[[ "$marks_after" == "$marks_before" ]] || oq_fail "fenced relayB committed marks after SIGCONT"
[[ "$("$DBQ" "$DB" fence)" == "$fence3" ]] || oq_fail "lease changed hands again after SIGCONT"
[[ "$(metric "$PB" onceq_relay_lease_holder)" == 0 ]] || oq_fail "relayB still thinks it holds the lease"
oq_broker_ctl "rtt all 0" || oq_fail "ctl rtt"
((fence3 > fence2)) || oq_fail "fence did not advance on the SIGSTOP take-over"

# 4. everything arrives
oq_wait_exit filler 60 || oq_fail "filler did not finish"
oq_wait_for 60 db_is "$DB" pending 0 || oq_fail "rows still pending"
"$CHECK" --brokers "$BROKERS" --db "$DB" --allowed-dups "$T/allowed" --timeout-ms 60000 \
    >"$T/check.out" || { cat "$T/check.out"; oq_fail "topic check failed"; }
oq_log "$(cat "$T/check.out")"
grep -q "total=30000 " "$T/check.out" || oq_fail "expected 30000 rows"
oq_pass "relay lease: one publisher, hand-over in ${handover} ms, fenced holder marks nothing"
