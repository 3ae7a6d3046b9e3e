#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Relay crash points: for each named point, a relay is SIGKILLed there (ONCEQ_CRASH_AT), then a
# fresh relay publishes the rest. Checks: the kill really happened (exit 137); nothing is lost
# (every message_id on the topic); per-key order kept; every duplicate is of a row that was
# still unmarked when the relay died (delivered-but-unmarked); when the crash sits between
# delivery and commit of the mark, duplicates actually appear (the scenario is real). A crash
# inside the retention DELETE rolls back: no row vanishes, and the next relay finishes it.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

FILL=$(oq_tool oq_relay_fill)
CHECK=$(oq_tool oq_relay_check)
DBQ=$(oq_tool oq_relay_db)
db_is() { [[ "$("$DBQ" "$1" "$2")" == "$3" ]]; }

POINTS=(
    relay.after_lease_acquire
    relay.after_read_batch@3
    relay.after_produce_before_delivery@3
    relay.after_delivery_before_mark@3
    relay.after_mark_before_commit@3
    relay.after_mark_commit@3
)
topics=""
for i in "${!POINTS[@]}"; do topics+="${topics:+,}relay.crash.$i"; done
oq_tmpdir
oq_start_broker --partitions 6 --topics "$topics"

for i in "${!POINTS[@]}"; do
    P=${POINTS[$i]}
    DB=$T/crash$i.db
    TOPIC=relay.crash.$i
    : >"$T/allowed$i"
    # Rows trickle in (as from a producer), so every crash point is reached many times.
    "$FILL" --db "$DB" --rows 0 >/dev/null || oq_fail "fill"
    oq_spawn "fill$i" "$FILL" --db "$DB" --rows 3000 --keys 100 --topic "$TOPIC" --batch 30 --rate 1500
    oq_spawn "crash$i" env ONCEQ_CRASH_AT="$P" "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS" \
        --lease 1s --batch-rows 200
    rc=0
    oq_wait_exit "crash$i" 30 || rc=$?
    [[ $rc == 137 ]] || oq_fail "$P: relay exit code $rc, expected 137 (SIGKILL at the crash point)"
    grep -q "crash point ${P%@*} reached" "$T/crash$i.log" || oq_fail "$P: no crash log line"
    "$DBQ" "$DB" unmarked-ids >"$T/allowed$i"
    left=$(wc -l <"$T/allowed$i")
    oq_log "$P: killed with $left rows unmarked"

    oq_spawn "after$i" "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS" --lease 1s --batch-rows 200
    oq_wait_exit "fill$i" 30 || oq_fail "$P: filler did not finish"
    oq_wait_for 60 db_is "$DB" pending 0 || oq_fail "$P: rows still pending after restart"
    oq_kill "after$i" TERM
    "$CHECK" --brokers "$BROKERS" --db "$DB" --topic "$TOPIC" --allowed-dups "$T/allowed$i" \
        --timeout-ms 30000 >"$T/check$i.out" || { cat "$T/check$i.out"; oq_fail "$P: topic check failed"; }
    summary=$(cat "$T/check$i.out")
    oq_log "$P: $summary"
    dups=$(sed -n 's/.* dups=\([0-9]*\) .*/\1/p' "$T/check$i.out")
    case "$P" in
    relay.after_delivery_before_mark* | relay.after_mark_before_commit*)
        ((dups > 0)) || oq_fail "$P: expected re-published duplicates of delivered-but-unmarked rows"
        ;;
    relay.after_mark_commit* | relay.after_lease_acquire | relay.after_read_batch*)
        # Everything marked or nothing produced at the kill: nothing may be sent twice, except
        # rows of later batches already in flight (they are unmarked, hence allowed above).
        ;;
    esac
done

# Retention DELETE killed before COMMIT: rolled back, then finished by the next relay.
DB=$T/crash0.db
before=$("$DBQ" "$DB" total)
oq_spawn cleanup_crash env ONCEQ_CRASH_AT=relay.cleanup_before_commit "$ONCEQ_BIN" relay \
    --db "$DB" --brokers "$BROKERS" --lease 1s --retention 1ms --cleanup-batch 1000
rc=0
oq_wait_exit cleanup_crash 30 || rc=$?
[[ $rc == 137 ]] || oq_fail "cleanup crash: exit code $rc"
after=$("$DBQ" "$DB" total)
[[ "$after" == "$before" ]] || oq_fail "cleanup crash: rows changed from $before to $after"
oq_spawn cleanup_ok "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS" --lease 1s --retention 1ms \
    --cleanup-batch 1000
oq_wait_for 30 db_is "$DB" total 0 || oq_fail "cleanup after restart did not finish"
oq_kill cleanup_ok TERM
oq_pass "relay crash points: nothing lost, order kept, duplicates only of unmarked rows"
