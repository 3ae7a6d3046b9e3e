#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A relay paused between its lease check and its next read must not publish rows it reads after
# it resumes. The holder stops itself (SIGSTOP, crash point relay.after_lease_check@N!stop) while
# rows keep arriving; we record what was unpublished at that moment, let the lease lapse, let a
# standby take over and publish the rows written since, then resume the old holder. Without a
# lease re-check at read time the old holder reads and publishes a fresh batch of rows that the
# new holder publishes too: duplicates of rows that were never unpublished under a dead holder.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

FILL=$(oq_tool oq_relay_fill)
CHECK=$(oq_tool oq_relay_check)
DBQ=$(oq_tool oq_relay_db)
db_is() { [[ "$("$DBQ" "$1" "$2")" == "$3" ]]; }
proc_state() { awk '{print $3}' "/proc/$1/stat" 2>/dev/null; }
is_stopped() { [[ "$(proc_state "$1")" == T ]]; }

oq_tmpdir
oq_start_broker --partitions 3
DB=$T/calls.db
"$FILL" --db "$DB" --rows 0 >/dev/null
: >"$T/allowed"
relay() { # NAME [env...]
    local name=$1
    shift
    oq_spawn "$name" env "$@" "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS" --lease 2s \
        --owner "$name" --batch-rows 1000
}
# Three pause points: SIGSTOP stops every thread of relayA, and one that is inside a commit then
# (its marks writer, its checkpointer) keeps calls.db's write lock, so no standby could take the
# lease and the run would test nothing. Such a pause is resumed and the next one taken.
relay relayA "ONCEQ_CRASH_AT=relay.after_lease_check@40!stop,relay.after_lease_check@80!stop,relay.after_lease_check@120!stop"
oq_wait_for 10 db_is "$DB" owner relayA || oq_fail "relayA did not take the lease"
oq_spawn filler "$FILL" --db "$DB" --rows 16000 --keys 100 --batch 50 --rate 2000
A=$(oq_pid relayA)
write_lock_free() { sqlite3 -cmd ".timeout 2000" "$DB" "BEGIN IMMEDIATE; ROLLBACK;" >/dev/null 2>&1; }
for pause in 1 2 3; do
    oq_wait_for 20 is_stopped "$A" || oq_fail "relayA never reached its stop point"
    write_lock_free && break
    ((pause < 3)) || oq_fail "relayA held calls.db's write lock at each of its pauses"
    oq_log "relayA paused holding calls.db's write lock (pause $pause): resumed, next pause"
    kill -CONT "$A"
    oq_wait_for 10 eval '! is_stopped "$A"' || oq_fail "relayA did not resume"
done
"$DBQ" "$DB" unmarked-ids >>"$T/allowed"
oq_log "relayA paused after its lease check with $(wc -l <"$T/allowed") rows unpublished"

relay relayB
oq_wait_for 10 db_is "$DB" owner relayB || oq_fail "relayB did not take over the lapsed lease"
sleep 1 # rows written after the pause are published by relayB
kill -CONT "$A"
oq_wait_for 10 grep -q "lease outbox lost" "$T/relayA.log" ||
    oq_fail "resumed relayA did not notice it lost the lease"

oq_wait_exit filler 60 || oq_fail "filler did not finish"
oq_wait_for 60 db_is "$DB" pending 0 || oq_fail "rows still pending"
"$CHECK" --brokers "$BROKERS" --db "$DB" --allowed-dups "$T/allowed" --timeout-ms 60000 \
    >"$T/check.out" || { cat "$T/check.out"; oq_fail "a resumed relay published rows it read after its lease lapsed"; }
oq_log "$(tail -1 "$T/check.out")"
grep -q "total=16000 " "$T/check.out" || oq_fail "expected 16000 rows"
oq_pass "relay paused after its lease check publishes nothing it read after resuming"
