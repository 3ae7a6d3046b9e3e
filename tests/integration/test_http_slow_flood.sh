#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Slow clients do not starve health checks (issue 17, item 4). tests/tools/http_flood.py opens
# connections from five loopback addresses (127.0.0.2..6), each sending a request line and then
# one header line every 4 s: libmicrohttpd's idle timeout never fires on them.
#  1. producer: 1,000 such connections (200 per address, under the per-address limit of 256)
#     fill --max-connections 1000. /healthz and /readyz, polled from 127.0.0.1 twice a second
#     throughout, answer 200 every time (the oldest slow request is evicted for them), and the
#     request deadline (--request-timeout 12s here) closes every slow request by ~13 s;
#  2. a consumer's admin listener (64 slots): 100 such connections; /healthz and /readyz answer
#     throughout, and the listener's fixed 10 s request deadline closes the slow requests.
# Before the fix every slot stays held for as long as the clients trickle, and every probe is
# refused (producer) or hangs unaccepted (admin listener).
# ctest-cost: 45
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
FLOOD="$ONCEQ_SRC/tests/tools/http_flood.py"
SRCS=127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5,127.0.0.6
for a in ${SRCS//,/ }; do
    python3 -c "import socket,sys; s=socket.socket(); s.bind(('$a',0))" 2>/dev/null ||
        oq_fail "cannot bind $a (loopback aliases needed by this test)"
done

# poll URL_BASE SECONDS NAME: /healthz and /readyz in turn every 0.5 s from 127.0.0.1;
# writes "total failed" to $T/NAME.poll and every failure to $T/NAME.fail
poll() {
    local base=$1 secs=$2 name=$3 n=0 bad=0 end=$((SECONDS + $2)) path code
    : >"$T/$name.fail"
    while ((SECONDS < end)); do
        for path in healthz readyz; do
            code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 --interface 127.0.0.1 \
                "$base/$path") || true
            n=$((n + 1))
            if [[ "$code" != 200 ]]; then
                bad=$((bad + 1))
                echo "$(date +%T) /$path -> $code" >>"$T/$name.fail"
            fi
            sleep 0.25
        done
    done
    echo "$n $bad" >"$T/$name.poll"
}

check_flood() { # check_flood NAME EXPECT_OPEN_MIN DEADLINE_S
    local d
    d=$(cat "$T/$1.done" 2>/dev/null) || oq_fail "$1: the flood wrote no result"
    oq_log "$1 done: $d"
    (($(jq .open <<<"$d") >= $2)) || oq_fail "$1: only $(jq .open <<<"$d") slow connections held"
    read -r N BAD <"$T/$1.poll"
    oq_log "$1: $N probes, $BAD failed"
    ((N >= 20)) || oq_fail "$1: only $N probes ran"
    ((BAD == 0)) || oq_fail "$1: $BAD of $N probes failed: $(head -3 "$T/$1.fail" | tr '\n' ' ')"
    [[ "$(jq .closed_later <<<"$d")" == "$(jq .open <<<"$d")" ]] ||
        oq_fail "$1: slow requests still open at the end (request deadline): $d"
    awk -v s="$(jq .seconds <<<"$d")" -v m="$3" 'BEGIN {exit !(s <= m)}' ||
        oq_fail "$1: the last slow request closed after $(jq .seconds <<<"$d") s (limit $3 s)"
}

# --- 1. producer ----------------------------------------------------------------------------------
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
oq_spawn producer "$ONCEQ_BIN" producer --db "$T/calls.db" --listen "127.0.0.1:$PORT" \
    --request-timeout 12s
oq_wait_for 15 curl -sf "$URL/readyz" || oq_fail "producer did not come up"
oq_spawn flood1 python3 "$FLOOD" --port "$PORT" --count 1000 --sources "$SRCS" --trickle 4 \
    --hold 25 --ready-file "$T/p.ready" --done-file "$T/p.done"
oq_wait_for 30 test -f "$T/p.ready" || oq_fail "the flood did not start"
oq_log "producer flood: $(cat "$T/p.ready")"
poll "$URL" 16 p
oq_wait_exit flood1 20 || true
check_flood p 950 18
grep -q 'msg="slow requests closed"' "$T/producer.log" || oq_fail "no log line for the slow requests"
M=$(curl -s "$URL/metrics" | awk '$1 ~ /^onceq_http_requests_closed_total/ {s += $2} END {print s+0}')
((M >= 950)) || oq_fail "onceq_http_requests_closed_total: $M"
oq_kill producer

# --- 2. a consumer's admin listener ---------------------------------------------------------------
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
oq_spawn consumer "$ONCEQ_BIN" consumer --brokers 127.0.0.1:1 --db "$T/e.db" --no-relay \
    --metrics-listen "127.0.0.1:$PORT"
oq_wait_for 20 curl -sf "$URL/healthz" || oq_fail "consumer did not come up"
oq_spawn flood2 python3 "$FLOOD" --port "$PORT" --count 100 --sources "$SRCS" --trickle 4 \
    --hold 22 --ready-file "$T/c.ready" --done-file "$T/c.done"
oq_wait_for 30 test -f "$T/c.ready" || oq_fail "the flood did not start"
oq_log "admin flood: $(cat "$T/c.ready")"
# /readyz is 503 here (no broker): the poll counts any answer but a refusal or a hang
poll_any() {
    local base=$1 end=$((SECONDS + $2)) n=0 bad=0 code path
    : >"$T/c.fail"
    while ((SECONDS < end)); do
        for path in healthz readyz; do
            code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 --interface 127.0.0.1 \
                "$base/$path") || true
            n=$((n + 1))
            if [[ "$path" == healthz && "$code" != 200 ]] ||
                [[ "$path" == readyz && "$code" != 200 && "$code" != 503 ]]; then
                bad=$((bad + 1))
                echo "$(date +%T) /$path -> $code" >>"$T/c.fail"
            fi
            sleep 0.25
        done
    done
    echo "$n $bad" >"$T/c.poll"
}
poll_any "$URL" 14
oq_wait_exit flood2 20 || true
check_flood c 64 15
oq_pass "slow clients: health and readiness probes answered throughout; slow requests closed"
