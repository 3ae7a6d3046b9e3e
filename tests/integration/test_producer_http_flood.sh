#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Connection floods against `onceq producer` (issue 14, item 3). 1,000 connections from
# 127.0.0.1 that each send half a request line (tests/tools/http_flood.py):
#  1. defaults (per-address limit 256, idle timeout 10 s): the connections over the limit are
#     closed at once, /healthz answers a client on another address (127.0.0.2) within 1 s, the
#     refusals are counted in onceq_http_connections_refused_total and logged, the half
#     requests are closed by the idle timeout within 10 s (+ slack), and then the flooding
#     address is served again;
#  2. a global limit (--max-connections 200, no per-address limit, --idle-timeout 2s): the
#     refusals are counted under the global reason, and once the idle timeout closed the half
#     requests /healthz answers again although the flood's sockets stay open.
# Against a build without the limits the metric is missing and the half requests stay open
# for 120 s, so steps 1 and 2 fail.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
command -v python3 >/dev/null || oq_fail "python3 is needed for tests/tools/http_flood.py"
FLOOD="$ONCEQ_SRC/tests/tools/http_flood.py"

metric() { # metric URL_BASE 'name{labels}' -> value (empty when missing)
    curl -s --max-time 5 --interface 127.0.0.2 "$1/metrics" |
        awk -v m="$2" '$1 == m {print $2}'
}
healthz_time() { # healthz_time URL_BASE SOURCE -> "code seconds"
    curl -s -o /dev/null -w '%{http_code} %{time_total}' --max-time 3 --interface "$2" \
        "$1/healthz" || true
}

# --- 1. defaults ------------------------------------------------------------------------------
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
oq_spawn producer "$ONCEQ_BIN" producer --db "$T/a.db" --listen "127.0.0.1:$PORT"
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer did not come up"
curl -sf --max-time 3 --interface 127.0.0.2 "$URL/healthz" >/dev/null ||
    oq_fail "cannot reach the producer from 127.0.0.2 (loopback aliases needed by this test)"

oq_spawn flood1 python3 "$FLOOD" --port "$PORT" --count 1000 --hold 25 --settle \
    --ready-file "$T/f1.ready" --done-file "$T/f1.done" --stop-file "$T/f1.stop"
oq_wait_for 60 test -f "$T/f1.ready" || oq_fail "the flood did not start"
R=$(cat "$T/f1.ready")
oq_log "flood 1: $R"
[[ "$(jq .open <<<"$R")" -le 258 ]] ||
    oq_fail "per-address limit: $(jq .open <<<"$R") half requests held open (limit 256): $R"
[[ "$(jq .closed <<<"$R")" -ge 700 ]] || oq_fail "connections over the limit were not closed: $R"

read -r CODE SECS <<<"$(healthz_time "$URL" 127.0.0.2)"
oq_log "healthz from 127.0.0.2 during the flood: $CODE in ${SECS}s"
[[ "$CODE" == 200 ]] || oq_fail "/healthz from another address during the flood: HTTP $CODE"
awk -v s="$SECS" 'BEGIN {exit !(s < 1.0)}' || oq_fail "/healthz took ${SECS}s during the flood"

REF=$(metric "$URL" 'onceq_http_connections_refused_total{reason="max_connections_per_ip"}')
[[ -n "$REF" ]] || oq_fail "no onceq_http_connections_refused_total metric"
((REF >= 700)) || oq_fail "refused per address: $REF, expected >= 700"
grep -q 'connection refused: max_connections_per_ip reached (client 127.0.0.1)' "$T/producer.log" ||
    oq_fail "no log line for the refused connections"
NLOG=$(grep -c 'connection refused:' "$T/producer.log")
((NLOG <= 5)) || oq_fail "refusals logged $NLOG times in a few seconds (expected rate-limited)"
OPEN=$(metric "$URL" 'onceq_http_connections')
((OPEN >= 250)) || oq_fail "onceq_http_connections=$OPEN while 256 half requests are held"

# the idle timeout (10 s) closes the half requests; the flood only watches
oq_wait_exit flood1 40 || true
D=$(cat "$T/f1.done" 2>/dev/null) || oq_fail "the flood wrote no result"
oq_log "flood 1 done: $D"
[[ "$(jq .closed_later <<<"$D")" == "$(jq .open <<<"$D")" ]] ||
    oq_fail "half requests not closed by the idle timeout: $D"
awk -v s="$(jq .seconds <<<"$D")" 'BEGIN {exit !(s <= 13.0)}' ||
    oq_fail "the idle timeout took $(jq .seconds <<<"$D") s (default 10 s)"
read -r CODE SECS <<<"$(healthz_time "$URL" 127.0.0.1)"
[[ "$CODE" == 200 ]] || oq_fail "the flooding address is not served after the flood: HTTP $CODE"
oq_kill producer

# --- 2. global limit ------------------------------------------------------------------------------
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
oq_spawn producer2 "$ONCEQ_BIN" producer --db "$T/b.db" --listen "127.0.0.1:$PORT" \
    --max-connections 200 --max-connections-per-ip 0 --idle-timeout 2s
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer 2 did not come up"
oq_spawn flood2 python3 "$FLOOD" --port "$PORT" --count 1000 --hold 20 \
    --ready-file "$T/f2.ready" --done-file "$T/f2.done" --stop-file "$T/f2.stop"
oq_wait_for 60 test -f "$T/f2.ready" || oq_fail "flood 2 did not start"
R=$(cat "$T/f2.ready")
oq_log "flood 2: $R"
# 200 slots + the 8 probe slots (--probe-connections), which a flood can take but not keep
(($(jq .open <<<"$R") <= 210)) || oq_fail "global limit: $(jq .open <<<"$R") held open (limit 200 + 8)"
# the flood's sockets stay open; within the idle timeout (+ slack) /healthz answers again
OK=0
for ((i = 0; i < 40; i++)); do
    read -r CODE SECS <<<"$(healthz_time "$URL" 127.0.0.2)"
    if [[ "$CODE" == 200 ]]; then OK=1; break; fi
    sleep 0.1
done
((OK)) || oq_fail "/healthz not answered within 4 s under a flood over the global limit"
REF=$(metric "$URL" 'onceq_http_connections_refused_total{reason="max_connections"}')
[[ -n "$REF" ]] && ((REF >= 700)) || oq_fail "refused by the global limit: '$REF', expected >= 700"
grep -q 'connection refused: max_connections reached' "$T/producer2.log" ||
    oq_fail "no log line for the global limit"
touch "$T/f2.stop"
oq_wait_exit flood2 30 || true
oq_pass "connection limits, idle timeout, refusal metric and log"
