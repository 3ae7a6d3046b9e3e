#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Consumers on PostgreSQL (`onceq consumer --db postgresql://...`): the producer and relay on
# SQLite, two consumers sharing one PostgreSQL database (schema onceq, consumer_* tables) on the
# embedded broker; their result events go to onceq.outbox and are published by their own
# result relays (one lease holder). One consumer dies by SIGKILL mid-run with a batch committed
# to PostgreSQL and not to Kafka (ONCEQ_CRASH_AT=consumer.after_commit_before_offset@3), then is
# started again; then every connection of the consumers is terminated by the server
# (pg_terminate_backend), twice, while calls flow. At the end `onceq verify` (reading the PostgreSQL store) is clean: every
# accepted call terminal, one effect per call, the redelivery absorbed by the inbox, every
# result delivered (the producer saw it). The connection string is in no log line.
# ctest-cost: 30
set -u
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
oq_require_pg
oq_tmpdir
N=${ONCEQ_PG_CONSUMER_CALLS:-400}
URL=$(oq_pg_fresh_db onceq_it_pg_consumer)
q() { psql -XAtq "$URL" -c "$1"; }
PDB=$T/calls.db
CDB=$URL
PORT=$(oq_free_port)
export PDB CDB PORT
PL_CONSUMER_X+=(--lease 5s)

oq_start_broker
pl_spawn_producer
pl_spawn_relay
pl_spawn_consumer 1
pl_spawn_consumer 2 ONCEQ_CRASH_AT=consumer.after_commit_before_offset@3
pl_wait_healthy 30
victim_assigned() { grep -q 'assigned [1-9]' "$T/consumer-2.log"; }
oq_wait_for 60 victim_assigned || oq_fail "consumer-2 got no partitions within 60 s"
[[ "$(q "SELECT to_regclass('onceq.consumer_executions') IS NOT NULL")" == t ]] ||
    oq_fail "no consumer tables in schema onceq"

oq_log "submitting $N calls"
"$(oq_tool oq_e2e_load)" --port "$PORT" --calls "$N" --rate 60 --conns 4 --prefix pgc \
    --accepted "$T/accepted" >"$T/load.out" 2>&1 &
LOAD=$!
oq_on_exit "kill $LOAD 2>/dev/null"

victim_dead() { ! oq_alive consumer-2; }
oq_wait_for 90 victim_dead || {
    oq_kill consumer-2 KILL
    oq_fail "consumer-2 never reached its crash point"
}
oq_log "consumer-2 died (SIGKILL) with a batch committed to PostgreSQL, not to Kafka"
pl_spawn_consumer 2
# every connection to the database terminated by the server, twice, while calls flow: the
# consumers (and their result relays) reconnect; a batch that met it is rolled back and retried
for k in 1 2; do
    sleep 1
    n=$(q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = 'onceq_it_pg_consumer' AND pid <> pg_backend_pid()")
    oq_log "pg_terminate_backend: $n connections of the consumers terminated"
    ((n >= 2)) || oq_fail "expected the consumers' connections, found $n"
done

wait "$LOAD"
lrc=$?
cat "$T/load.out"
[[ $lrc == 0 ]] || oq_fail "load generator failed (rc=$lrc)"
pl_wait_drained 240 "$N" || oq_fail "calls not terminal within 240 s"
J=$(pl_verify --accepted "$T/accepted")
rc=$?
echo "$J"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc"
[[ $(pl_field "$J" duplicates) == 0 ]] || oq_fail "duplicate effects"
[[ $(pl_field "$J" lost) == 0 ]] || oq_fail "lost calls"
[[ $(pl_field "$J" effects) == $(pl_field "$J" expected_effects) ]] || oq_fail "effects mismatch"
red=$(pl_field "$J" inbox_duplicates)
[[ -n "$red" && "$red" -gt 0 ]] || oq_fail "no redelivery observed after the kill (inbox_duplicates=$red)"
# the rows are where the design says: executions and effects in PostgreSQL, results in the
# shared outbox, every one of them delivered by a result relay
n_eff=$(q "SELECT count(*) FROM onceq.consumer_effects")
n_res=$(q "SELECT count(*) FROM onceq.outbox WHERE topic = 'onceq.tool-results'")
n_und=$(q "SELECT count(*) FROM onceq.outbox WHERE pub_seq IS NULL OR pub_seq > (SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease)")
oq_log "PostgreSQL: effects=$n_eff results=$n_res undelivered=$n_und"
[[ "$n_eff" == "$(pl_field "$J" effects)" ]] || oq_fail "verify read $(pl_field "$J" effects) effects, PostgreSQL holds $n_eff"
((n_res >= N)) || oq_fail "result rows $n_res < $N"
[[ "$n_und" == 0 ]] || oq_fail "$n_und result rows never delivered"
for f in "$T"/consumer-*.log; do
    ! grep -F -- "passfile=" "$f" >/dev/null || oq_fail "the connection string is in $f"
done
# verify reads without migrating, and refuses a schema newer than it knows, changing nothing
q "UPDATE onceq.schema_version SET version = version + 1"
pl_verify >"$T/newer.json" 2>"$T/newer.err"
vrc=$?
q "UPDATE onceq.schema_version SET version = version - 1"
[[ $vrc == 1 ]] && grep -q "newer than this binary" "$T/newer.err" ||
    oq_fail "verify on a newer schema: exit $vrc: $(cat "$T/newer.err")"
# a password on the command line is refused before anything runs
"$ONCEQ_BIN" consumer --db "postgresql://u:secret@127.0.0.1:1/x" --brokers "$BROKERS" 2>"$T/pw.err"
prc=$?
[[ $prc == 2 ]] || oq_fail "a password in --db: exit $prc"
grep -q "passfile" "$T/pw.err" || oq_fail "no clear error: $(cat "$T/pw.err")"
oq_pass "consumers on PostgreSQL: $N calls, kill -9 mid-run, $red redeliveries absorbed, verify clean"
