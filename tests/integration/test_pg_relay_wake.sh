#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The relay on PostgreSQL wakes on LISTEN/NOTIFY, not at its next poll. An idle relay waits on
# its LISTEN connection's socket (relay/relay.c, note_wait), so a commit of another connection
# is read when its NOTIFY arrives. The relay runs with --poll-max 1s, where polling alone
# notices a commit only after tens to hundreds of ms; ten submits in SQL (onceq.submit, each
# its own transaction, 300 ms apart) must each end an idle wait by a NOTIFY: the relay's
# `stopped` line counts them (notify_wakes) and the test wants at least 8 (16 with the
# producer's ten below). It prints the
# publish latency the relay measured (onceq_relay_publish_latency_seconds). Fails on a relay
# that only polls: notify_wakes is 0 (or absent).
# ctest-cost: 20
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

# onceq's own writers wake the relay after their commit (schema/postgres/0008): ten submits
# through a producer, 300 ms apart, must each be announced by onceq.wake() ('wake'), none by
# the trigger from inside the durable commit ('outbox': the NOTIFY that serialized commits),
# and must each end an idle wait of the relay as well.
/usr/bin/python3 -c 'import psycopg2' 2>/dev/null || oq_fail "python3-psycopg2 missing (apt-get install python3-psycopg2)"
cat >"$T/listen.py" <<'PY'
import select, sys, time
import psycopg2
c = psycopg2.connect(sys.argv[1])
c.autocommit = True
c.cursor().execute("LISTEN onceq_outbox")
open(sys.argv[2], "w").close()
end = time.time() + 30
with open(sys.argv[2], "a", buffering=1) as f:
    while time.time() < end:
        if select.select([c], [], [], 0.5)[0]:
            c.poll()
            while c.notifies:
                f.write(c.notifies.pop(0).payload + "\n")
PY
oq_spawn listener /usr/bin/python3 "$T/listen.py" "$URL" "$T/notes"
oq_wait_for 10 test -f "$T/notes" || oq_fail "the listener did not start"
PPORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn producer "$ONCEQ_BIN" producer --db "$URL" --brokers "$BROKERS" --listen "127.0.0.1:$PPORT"
oq_wait_for 30 curl -sf -o /dev/null "http://127.0.0.1:$PPORT/healthz" || oq_fail "producer never healthy"
sleep 1
for i in $(seq 1 10); do
    curl -sf -o /dev/null -X POST "http://127.0.0.1:$PPORT/v1/tool-calls" -H "Idempotency-Key: http-$i" \
        -d "{\"tool\":\"charge\",\"args\":{\"amount\":$i}}" || oq_fail "HTTP submit $i"
    sleep 0.3
done
oq_wait_for 20 bash -c "[[ \$(psql -XAtq '$URL' -c 'SELECT count(*) FROM onceq.outbox WHERE pub_seq <= (SELECT COALESCE(max(published_seq), 0) FROM onceq.relay_lease)') -ge 20 ]]" ||
    oq_fail "the 10 HTTP submits were not all published (watermark $(published))"
sleep 0.5
by_wake=$(grep -c '^wake$' "$T/notes" || true)
by_trigger=$(grep -c '^outbox$' "$T/notes" || true)
oq_log "notifications while the producer submitted: $by_wake by onceq.wake(), $by_trigger by the trigger"
((by_wake >= 10)) || oq_fail "only $by_wake wake-ups after the producer's 10 commits"
((by_trigger == 0)) || oq_fail "$by_trigger NOTIFYs from inside the producer's durable commits"
oq_kill producer
oq_kill listener

lat=$(curl -sf "http://127.0.0.1:$MPORT/metrics" | awk '/^onceq_relay_publish_latency_seconds_(sum|count)/ {print $2}' | paste -sd' ')
oq_kill relay
line=$(grep 'msg="stopped"' "$T/relay.log" | tail -n1)
[[ -n $line ]] || oq_fail "no stopped line in the relay's log"
wakes=$(grep -o 'notify_wakes=[0-9]*' <<<"$line" | cut -d= -f2 || true)
oq_log "relay: ${line#*msg=}"
oq_log "publish latency (sum count): $lat"
[[ -n $wakes ]] || oq_fail "the relay's stopped line has no notify_wakes"
((wakes >= 16)) || oq_fail "only $wakes of 20 idle commits woke the relay by NOTIFY"
oq_pass "relay on PostgreSQL: $wakes of 20 idle commits woke it by NOTIFY (poll-max 1s); the producer's 10 by onceq.wake() after the commit, none from inside it"
