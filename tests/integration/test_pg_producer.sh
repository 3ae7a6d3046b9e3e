#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The producer daemon on PostgreSQL (--db URL): 300 concurrent HTTP submits group-committed
# (fewer transactions than submits), each stored once with its outbox row in schema onceq; a
# replay answers the same call, another body is a 422 conflict; /readyz ready; the URL is in no
# log line; the server's connections terminated (pg_terminate_backend) mid-run: the next
# submits succeed on reconnected connections, nothing lost or doubled; PostgreSQL unreachable
# at start: a clear error and exit 1.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
URL=$(oq_pg_fresh_db onceq_it_producer)
q() { psql -XAtq "$URL" -c "$1"; }
PORT=$(oq_free_port)
oq_spawn producer "$ONCEQ_BIN" producer --db "$URL" --listen "127.0.0.1:$PORT"
oq_wait_for 30 curl -fsS "http://127.0.0.1:$PORT/readyz" -o /dev/null || oq_fail "never ready"
api=http://127.0.0.1:$PORT/v1/tool-calls

submit() { # key amount -> status code, body in $T/resp.$1
    curl -s -o "$T/resp.$1" -w '%{http_code}' -X POST "$api" -H "Idempotency-Key: $1" \
        -H 'Content-Type: application/json' -d "{\"tool\":\"charge\",\"args\":{\"amount\":$2}}"
}
export -f submit
export api T
seq 1 300 | xargs -P 24 -I{} bash -c 'code=$(submit k{} {}); [[ $code == 202 ]] || echo "k{} $code" >>"$T/bad"'
[[ ! -s "$T/bad" ]] || { head "$T/bad"; oq_fail "submits refused"; }
[[ "$(q 'SELECT count(*) FROM onceq.calls')" == 300 ]] || oq_fail "calls: $(q 'SELECT count(*) FROM onceq.calls')"
[[ "$(q 'SELECT count(*) FROM onceq.outbox')" == 300 ]] || oq_fail "outbox rows"
[[ "$(q 'SELECT count(DISTINCT key) FROM onceq.outbox')" == 300 ]] || oq_fail "outbox keys"
BATCHES=$(curl -fsS "http://127.0.0.1:$PORT/metrics" | awk '/^onceq_producer_batches_total/ {print $2}')
oq_log "300 submits in $BATCHES transactions"
(( BATCHES < 300 )) || oq_fail "no group commit: $BATCHES transactions for 300 submits"

id1=$(jq -r .call_id "$T/resp.k1")
code=$(submit k1 1)
[[ "$code" == 202 || "$code" == 200 ]] || oq_fail "replay answered $code"
[[ "$(jq -r .call_id "$T/resp.k1")" == "$id1" ]] || oq_fail "replay gave another call"
code=$(submit k1 999)
[[ "$code" == 422 ]] || oq_fail "conflict answered $code"
curl -fsS "$api/$id1" | jq -e '.status == "pending"' >/dev/null || oq_fail "GET by id"
curl -fsS "http://127.0.0.1:$PORT/stats" | jq -e '.calls == 300 and .outbox_pending == 300' \
    >/dev/null || oq_fail "stats: $(curl -fsS "http://127.0.0.1:$PORT/stats")"

# every connection of the producer terminated by the server
n=$(q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname='onceq_it_producer' AND pid<>pg_backend_pid()")
oq_log "terminated $n backends"
(( n >= 2 )) || oq_fail "expected the producer's connections, found $n"
for i in $(seq 301 340); do
    code=$(submit "k$i" "$i")
    [[ "$code" == 202 ]] || echo "k$i $code" >>"$T/bad2"
done
# A submit may be refused while the first statement on a dead connection finds it dead;
# the same key again is always safe. Retry those, then nothing may be missing or doubled.
if [[ -s "$T/bad2" ]]; then
    oq_log "refused right after the kill (retried): $(wc -l <"$T/bad2")"
    while read -r k _; do
        code=$(submit "$k" "${k#k}")
        [[ "$code" == 202 ]] || oq_fail "$k refused again after reconnect: $code"
    done <"$T/bad2"
fi
(( $(wc -l <"$T/bad2" 2>/dev/null || echo 0) <= 2 )) || oq_fail "more than one batch refused after the kill"
[[ "$(q 'SELECT count(*) FROM onceq.calls')" == 340 ]] || oq_fail "calls after reconnect"
[[ "$(q 'SELECT count(*) FROM onceq.outbox')" == 340 ]] || oq_fail "outbox after reconnect"
oq_wait_for 10 curl -fsS "http://127.0.0.1:$PORT/readyz" -o /dev/null || oq_fail "unready after reconnect"

# no line of the producer's log carries the connection string
! grep -F -- "passfile=" "$T/producer.log" >/dev/null || oq_fail "the URL is in the log"
oq_kill producer TERM
oq_wait_exit producer 20 >/dev/null || true

# unreachable at start: clear error, exit 1
BAD="postgresql://onceq@127.0.0.1:$(oq_free_port)/x?connect_timeout=3"
set +e
"$ONCEQ_BIN" producer --db "$BAD" --listen "127.0.0.1:$(oq_free_port)" 2>"$T/bad.err"
rc=$?
set -e
[[ $rc == 1 ]] || oq_fail "unreachable PostgreSQL: exit $rc"
grep -q "cannot connect to PostgreSQL" "$T/bad.err" || oq_fail "no clear error: $(cat "$T/bad.err")"
# a password in the connection string is refused (it would be on the command line)
set +e
"$ONCEQ_BIN" producer --db "postgresql://onceq:secret@127.0.0.1:1/x" --listen "127.0.0.1:$(oq_free_port)" 2>"$T/pw.err"
rc=$?
set -e
[[ $rc == 2 ]] && grep -q passfile "$T/pw.err" || oq_fail "a password in --db was not refused: exit $rc $(cat "$T/pw.err")"
oq_pass "producer on PostgreSQL: group commit, replay/conflict, reconnect, no URL in logs"
