#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq up --db-url URL`: the whole pipeline on one PostgreSQL database (a fresh one on the
# test server). PostgreSQL unreachable at start: a clear error, exit 1, no child started (no
# crash loop); a URL holding a password: refused (exit 2) without echoing it. Running: the
# children's command lines hold no database string (they read ONCEQ_DB), no log holds the
# password, submitted calls are stored, published and executed (consumers on PostgreSQL too,
# onceq verify clean over the one database); the database taken away (connections
# refused and terminated): the producer's and the relay's /readyz say unready, and ready again
# once it is back, and no child of onceq up died meanwhile (no crash loop).
# ctest-cost: 40
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
DBN=onceq_it_up
URL=$(oq_pg_fresh_db $DBN)
q() { psql -XAtq "$URL" -c "$1"; }
PASSFILE=$(sed -E 's/.*[?&]passfile=([^&]*).*/\1/' <<<"$URL")
PW=$(head -n1 "$PASSFILE" | cut -d: -f5-)
[[ -n "$PW" ]] || oq_fail "no password in the test cluster's passfile"

# 1. unreachable at start: exit 1 at once, nothing started
DEAD=$(oq_free_port)
set +e
timeout 60 "$ONCEQ_BIN" up --dir "$T/down" --console '' \
    --db-url "postgresql://onceq@127.0.0.1:$DEAD/onceq?connect_timeout=3" >"$T/down.out" 2>&1
rc=$?
set -e
((rc == 1)) || oq_fail "unreachable PostgreSQL: exit $rc, want 1: $(cat "$T/down.out")"
grep -q "cannot connect to PostgreSQL" "$T/down.out" || oq_fail "no clear error: $(cat "$T/down.out")"
[[ ! -e "$T/down/producer.log" && ! -e "$T/down/broker.log" ]] || oq_fail "children were started"

# 2. a password in the string: refused, not echoed
set +e
"$ONCEQ_BIN" up --dir "$T/pw" --db-url "postgresql://onceq:S3cretPw@127.0.0.1:$DEAD/onceq" \
    >"$T/pw.out" 2>&1
rc=$?
set -e
((rc == 2)) || oq_fail "password in --db-url: exit $rc, want 2"
! grep -q S3cretPw "$T/pw.out" || oq_fail "the password was echoed"

# 3. the pipeline on PostgreSQL
PORT=$(oq_free_port)
MB=$(oq_free_port)
oq_spawn up "$ONCEQ_BIN" up --dir "$T/up" --db-url "$URL" --listen "127.0.0.1:$PORT" \
    --consumers 2 --metrics-base-port "$MB" --console ''
oq_wait_for 60 curl -fsS -o /dev/null "http://127.0.0.1:$PORT/healthz" || oq_fail "producer not up: $(cat "$T/up.log")"
oq_wait_for 30 grep -q "database  postgres" "$T/up.log" || oq_fail "up does not say where the state is"
submit() {
    local k code
    for k in "$@"; do
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -X POST \
            "http://127.0.0.1:$PORT/v1/tool-calls" -H "Idempotency-Key: $k" \
            -H 'Content-Type: application/json' -d '{"tool":"charge","args":{"amount":3}}')
        [[ "$code" == 202 || "$code" == 200 ]] || oq_fail "submit $k: HTTP $code"
    done
}
published() { [[ "$(q "SELECT count(*) FROM onceq.outbox WHERE pub_seq IS NOT NULL AND pub_seq <= (SELECT max(published_seq) FROM onceq.relay_lease)")" -ge "$1" ]]; }
submit $(seq -f 'up-%g' 1 20)
[[ "$(q 'SELECT count(*) FROM onceq.calls')" == 20 ]] || oq_fail "calls stored: $(q 'SELECT count(*) FROM onceq.calls')"
oq_wait_for 60 published 20 || oq_fail "not published: $(q 'SELECT count(*) FROM onceq.outbox WHERE pub_seq IS NULL')"
succeeded() { [[ "$(q "SELECT count(*) FROM onceq.calls WHERE state = 'succeeded'")" == "$1" ]]; }
oq_wait_for 90 succeeded 20 || oq_fail "calls: $(q 'SELECT state, count(*) FROM onceq.calls GROUP BY state')"

# no database string on any child's command line, no password in any log
UPPID=$(oq_pid up)
for c in $(pgrep -P "$UPPID"); do
    CMD=$(tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null || true)
    [[ "$CMD" != *postgres* && "$CMD" != *passfile* && "$CMD" != *"$PW"* ]] ||
        oq_fail "a child's command line names the database: $CMD"
done
for f in "$T"/up/*.log "$T/up.log"; do
    ! grep -qF -- "$PW" "$f" || oq_fail "the password is in $f"
done

# 4. the database away: unready; back: ready, nobody restarted
ready() { [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "$1")" == 200 ]]; }
unready() { ! ready "$1"; }
PR=http://127.0.0.1:$PORT/readyz
RR=http://127.0.0.1:$MB/readyz
oq_wait_for 30 ready "$PR" || oq_fail "producer never ready: $(curl -s "$PR")"
oq_wait_for 30 ready "$RR" || oq_fail "relay never ready: $(curl -s "$RR")"
psql -XAtq "$ONCEQ_TEST_PG_URL" -c "ALTER DATABASE $DBN ALLOW_CONNECTIONS false" >/dev/null
psql -XAtq "$ONCEQ_TEST_PG_URL" -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '$DBN'" >/dev/null
oq_log "database $DBN away"
oq_wait_for 20 unready "$PR" || oq_fail "producer /readyz ready with the database away"
oq_wait_for 20 unready "$RR" || oq_fail "relay /readyz ready with the database away: $(curl -s "$RR")"
psql -XAtq "$ONCEQ_TEST_PG_URL" -c "ALTER DATABASE $DBN ALLOW_CONNECTIONS true" >/dev/null
oq_log "database $DBN back"
oq_wait_for 30 ready "$PR" || oq_fail "producer not ready after: $(curl -s "$PR")"
oq_wait_for 30 ready "$RR" || oq_fail "relay not ready after: $(curl -s "$RR")"
submit $(seq -f 'up-b%g' 1 5)
oq_wait_for 60 published 25 || oq_fail "not published after the outage"
oq_wait_for 90 succeeded 25 || oq_fail "after the outage: $(q 'SELECT state, count(*) FROM onceq.calls GROUP BY state')"
# every stage in the one database: verify reads both from it
"$ONCEQ_BIN" verify --producer-db "$URL" --consumer-db "$URL" --json >"$T/verify.json" ||
    oq_fail "verify: $(cat "$T/verify.json")"
[[ $(jq -r '.clean, .calls, .effects' "$T/verify.json" | tr '\n' ' ') == "true 25 25 " ]] ||
    oq_fail "verify: $(cat "$T/verify.json")"
! grep -E "pid=[0-9]+ (exited|killed)" "$T/up.log" || oq_fail "a child of onceq up died (crash loop?)"
oq_kill up TERM
oq_pass "onceq up --db-url: refused when away (exit 1), no secret on argv or in logs, unready while the database is away"
