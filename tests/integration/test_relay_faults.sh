#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Relay under broker faults while rows keep arriving.
#  A. Default relay (message.timeout.ms=0, gapless; max.in.flight=1, see below): injected Produce errors
#     (NOT_LEADER_FOR_PARTITION), a partition leader moved, broker 1 down
#     for 2 s, then every broker down for 3 s. librdkafka retries in order: nothing lost, first
#     copies in per-key order, and the relay does not spin while the brokers are down.
#  B. Relay with -X message.timeout.ms=1000 and every broker down for 5 s: deliveries really
#     fail, so the relay must drain, rewind to the first failed row and re-publish, with clear
#     log lines. Nothing lost; last copies in per-key order (with a finite timeout that is the
#     documented guarantee: librdkafka may let a later message overtake a timed-out one).
#  C. Injected OUT_OF_ORDER_SEQUENCE_NUMBER: a fatal idempotent-producer error. The relay must
#     purge and rebuild the producer and re-send from the first undelivered row: nothing lost,
#     first copies in per-key order.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

FILL=$(oq_tool oq_relay_fill)
CHECK=$(oq_tool oq_relay_check)
DBQ=$(oq_tool oq_relay_db)
db_is() { [[ "$("$DBQ" "$1" "$2")" == "$3" ]]; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

oq_tmpdir
oq_start_broker --brokers 3 --partitions 6 --topics relay.faults.b,relay.faults.c

# --- A ---------------------------------------------------------------------------------------
DB=$T/a.db
"$FILL" --db "$DB" --rows 0 >/dev/null # create + migrate
# max.in.flight=1: on the embedded broker an injected Produce error with more than one request
# in flight per partition can make librdkafka report as delivered a message the mock never
# stored (an "implicit ack" after a later request's success; docs/BROKER-NOTES.md, "Produce
# errors lose acknowledged messages"). A real broker refuses the later request instead. With 5
# in flight this phase lost 8 of 20,000 rows in one CI run (its only failure on record), all
# produced at the moment of the injection; with 1 the mock loses nothing, so a loss here is
# the relay's.
oq_spawn relay "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS" --lease 2s --batch-rows 200 \
    -X reconnect.backoff.max.ms=500 -X max.in.flight=1
oq_spawn filler "$FILL" --db "$DB" --rows 20000 --keys 300 --batch 50 --rate 2500
sleep 1
oq_log "A: retriable faults"
oq_broker_ctl "error Produce NOT_LEADER_FOR_PARTITION 5" || oq_fail "ctl error"
oq_broker_ctl "leader onceq.tool-calls 0 2" || oq_fail "ctl leader"
sleep 0.5
oq_broker_ctl "down 1" || oq_fail "ctl down"
sleep 2
oq_broker_ctl "up 1" || oq_fail "ctl up"
sleep 1
RPID=$(oq_pid relay)
c0=$(cpu_ticks "$RPID")
oq_broker_ctl "down all" || oq_fail "ctl down all"
sleep 3
c1=$(cpu_ticks "$RPID")
oq_broker_ctl "up all" || oq_fail "ctl up all"
cpu=$((c1 - c0))
oq_log "A: relay CPU during the 3 s outage: $cpu ticks (100/s)"
((cpu < 150)) || oq_fail "relay used $cpu ticks of CPU in 3 s of outage: spinning?"
oq_wait_exit filler 60 || oq_fail "filler did not finish"
oq_wait_for 90 db_is "$DB" pending 0 || oq_fail "A: rows still pending: $("$DBQ" "$DB" pending)"
oq_alive relay || oq_fail "relay died"
grep -q "kafka error" "$T/relay.log" || oq_fail "A: the outage left no log line"
"$CHECK" --brokers "$BROKERS" --db "$DB" --timeout-ms 60000 >"$T/checkA.out" ||
    { cat "$T/checkA.out"; oq_fail "A: topic check failed"; }
oq_log "A: $(cat "$T/checkA.out")"
grep -q "total=20000 " "$T/checkA.out" || oq_fail "A: expected 20000 rows"
oq_kill relay TERM

# --- B ---------------------------------------------------------------------------------------
DB=$T/b.db
"$FILL" --db "$DB" --rows 0 --topic relay.faults.b >/dev/null
oq_spawn relayb "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS" --lease 2s --batch-rows 200 \
    -X message.timeout.ms=1000 -X reconnect.backoff.max.ms=500
oq_spawn fillerb "$FILL" --db "$DB" --rows 10000 --keys 300 --batch 50 --rate 2500 --topic relay.faults.b
sleep 1.5
oq_log "B: all brokers down for 5 s, message.timeout.ms=1000"
oq_broker_ctl "down all" || oq_fail "ctl down all"
sleep 5
oq_broker_ctl "up all" || oq_fail "ctl up all"
oq_wait_exit fillerb 60 || oq_fail "filler did not finish"
oq_wait_for 90 db_is "$DB" pending 0 || oq_fail "B: rows still pending: $("$DBQ" "$DB" pending)"
oq_alive relayb || oq_fail "relay died"
grep -q "delivery failed" "$T/relayb.log" || oq_fail "B: no delivery failure logged"
grep -q "re-publishing from seq=" "$T/relayb.log" || oq_fail "B: no rewind happened"
"$CHECK" --brokers "$BROKERS" --db "$DB" --topic relay.faults.b --order last --timeout-ms 60000 \
    >"$T/checkB.out" || { cat "$T/checkB.out"; oq_fail "B: topic check failed"; }
oq_log "B: $(cat "$T/checkB.out")"
grep -q "total=10000 " "$T/checkB.out" || oq_fail "B: expected 10000 rows"
oq_kill relayb TERM

# --- C ---------------------------------------------------------------------------------------
DB=$T/c.db
"$FILL" --db "$DB" --rows 0 --topic relay.faults.c >/dev/null
oq_spawn relayc "$ONCEQ_BIN" relay --db "$DB" --brokers "$BROKERS" --lease 2s --batch-rows 200
oq_spawn fillerc "$FILL" --db "$DB" --rows 6000 --keys 100 --batch 50 --rate 3000 --topic relay.faults.c
sleep 0.7
oq_log "C: fatal producer error (OUT_OF_ORDER_SEQUENCE_NUMBER)"
oq_broker_ctl "error Produce OUT_OF_ORDER_SEQUENCE_NUMBER 2" || oq_fail "ctl error"
oq_wait_exit fillerc 60 || oq_fail "filler did not finish"
oq_wait_for 60 db_is "$DB" pending 0 || oq_fail "C: rows still pending: $("$DBQ" "$DB" pending)"
oq_alive relayc || oq_fail "relay died"
grep -q "recreating the producer" "$T/relayc.log" || oq_fail "C: no fatal error / producer rebuild seen"
"$CHECK" --brokers "$BROKERS" --db "$DB" --topic relay.faults.c --timeout-ms 60000 \
    >"$T/checkC.out" || { cat "$T/checkC.out"; oq_fail "C: topic check failed"; }
oq_log "C: $(cat "$T/checkC.out")"
grep -q "total=6000 " "$T/checkC.out" || oq_fail "C: expected 6000 rows"
oq_kill relayc TERM
oq_pass "relay faults: recovered, nothing lost, order kept"
