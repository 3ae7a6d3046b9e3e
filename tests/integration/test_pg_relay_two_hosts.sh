#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two relays on one PostgreSQL outbox as on two hosts whose clocks disagree (relay A runs 45 s
# ahead under faketime: leases are decided on the server's clock, so this changes nothing),
# while 8 writers commit 800 submits out of seq order (onceq.submit, random delays before
# COMMIT). The lease holder is SIGSTOPped past its 2 s lease: the other takes over with
# fence + 1; resumed, the stopped one is fenced. At the end: every call's message is on the
# topic (nothing skipped), every row delivered and numbered once, no call stored twice.
# ctest-cost: 40
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
FTLIB=$(oq_faketime_lib) || exit $? # skips without libfaketime (fails under CI)
URL=$(oq_pg_fresh_db onceq_it_relay_two)
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "migrate"
q() { psql -XAtq "$URL" -c "$1"; }
oq_start_broker --partitions 6
oq_spawn relay-a env LD_PRELOAD="$FTLIB" FAKETIME=+45s FAKETIME_NO_CACHE=1 \
    FAKETIME_DONT_FAKE_MONOTONIC=1 "$ONCEQ_BIN" relay --db "$URL" --brokers "$BROKERS" --lease 2s \
    --owner host-a
oq_spawn relay-b "$ONCEQ_BIN" relay --db "$URL" --brokers "$BROKERS" --lease 2s --owner host-b

for w in $(seq 1 8); do
    for i in $(seq 1 100); do
        echo "BEGIN; SELECT 1 FROM onceq.submit('default', 'w$w-$i', 'charge', '{\"n\":$i}'); SELECT pg_sleep(random() * 0.05); COMMIT;"
    done >"$T/w$w.sql"
    psql -XAtq "$URL" -f "$T/w$w.sql" >/dev/null 2>"$T/w$w.err" &
    echo $! >>"$T/writers"
done
oq_wait_for 20 bash -c "[[ -n \$(psql -XAtq '$URL' -c \"SELECT owner FROM onceq.relay_lease WHERE expires_at > clock_timestamp()\") ]]" ||
    oq_fail "no relay took the lease"
sleep 1
HOLDER=$(q "SELECT owner FROM onceq.relay_lease")
FENCE0=$(q "SELECT fence FROM onceq.relay_lease")
case "$HOLDER" in host-a) STOPPED=relay-a OTHER=host-b ;; host-b) STOPPED=relay-b OTHER=host-a ;; *) oq_fail "holder $HOLDER" ;; esac
SPID=$(oq_pid "$STOPPED")
RPID=$SPID # env execs the relay in place (libfaketime is preloaded, no wrapper process)
oq_log "holder $HOLDER (fence $FENCE0): SIGSTOP pid $RPID for 5 s"
kill -STOP "$RPID"
oq_wait_for 10 bash -c "[[ \$(psql -XAtq '$URL' -c 'SELECT owner FROM onceq.relay_lease') == $OTHER ]]" ||
    { kill -CONT "$RPID"; oq_fail "the standby did not take over"; }
FENCE1=$(q "SELECT fence FROM onceq.relay_lease")
((FENCE1 == FENCE0 + 1)) || { kill -CONT "$RPID"; oq_fail "fence $FENCE0 -> $FENCE1"; }
sleep 3
kill -CONT "$RPID"
oq_log "taken over by $OTHER (fence $FENCE1); $STOPPED resumed"
while read -r p; do wait "$p" || oq_fail "a writer failed: $(cat "$T"/w*.err)"; done <"$T/writers"
[[ "$(q 'SELECT count(*) FROM onceq.calls')" == 800 ]] || oq_fail "calls: $(q 'SELECT count(*) FROM onceq.calls')"
delivered_all() {
    [[ "$(q "SELECT count(*) FROM onceq.outbox WHERE pub_seq IS NULL OR pub_seq > (SELECT max(published_seq) FROM onceq.relay_lease)")" == 0 ]]
}
oq_wait_for 60 delivered_all || oq_fail "not all rows delivered: $(q "SELECT count(*) FROM onceq.outbox WHERE pub_seq IS NULL")"
[[ "$(q 'SELECT count(*), count(DISTINCT pub_seq), count(DISTINCT message_id) FROM onceq.outbox')" == "800|800|800" ]] ||
    oq_fail "outbox rows: $(q 'SELECT count(*), count(DISTINCT pub_seq), count(DISTINCT message_id) FROM onceq.outbox')"
timeout 60 "$(oq_tool oq_kclient)" consume --brokers "$BROKERS" --topic onceq.tool-calls \
    --group check --max 0 --timeout-ms 15000 >"$T/topic.txt" 2>/dev/null || true
awk '!/^#/ {print $3}' "$T/topic.txt" | sort -u >"$T/keys.txt"
q "SELECT call_id FROM onceq.calls ORDER BY 1" >"$T/calls.txt"
MISSING=$(comm -13 "$T/keys.txt" "$T/calls.txt" | wc -l)
TOTAL=$(grep -vc '^#' "$T/topic.txt" || true)
oq_log "topic: $TOTAL messages, $(wc -l <"$T/keys.txt") distinct calls, missing $MISSING"
((MISSING == 0)) || oq_fail "$MISSING calls never published"
grep -q "lost" "$T/$STOPPED.log" || oq_fail "the resumed relay did not report its lease lost"
oq_pass "two relays on PostgreSQL: takeover at fence $FENCE1, 800 out-of-order commits, none skipped"
