#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A burst of requests to one HTTP thread is answered at once (issue 23: the 10 s stall of
# onceq-bench e2e). libmicrohttpd's epoll loop, when one epoll_wait returns its maximum of 128
# events, waits again with the idle timeout before serving any of them; a thread holding 128
# connections whose requests arrive together stalls them all for --idle-timeout (10 s), then
# closes the connections unanswered (common/oq_mhd.h, OQ_MHD_CONNS_PER_THREAD).
# tests/tools/http_burst.py opens 256 connections to the producer, finds from /proc which pool
# thread's epoll set holds each, takes up to 128 of the fullest thread's connections and sends
# a GET /healthz on each while the producer is stopped (SIGSTOP), then continues it: the thread
# sees them all ready at once. Checks: no thread holds more than 125 connections, and every
# request of the burst is answered (none closed, none waiting) within 30 s.
# Before the fix the producer had 2 threads whatever its limits, so one held 128 or more (256
# connections): the burst took 128 of them, waited ~10 s and came back with 20 to 128
# connections closed (4 runs of 4).
# ctest-cost: 5
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir

PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
oq_spawn producer "$ONCEQ_BIN" producer --db "$T/calls.db" --listen "127.0.0.1:$PORT" \
    --max-connections-per-ip 0
oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer did not come up"
grep -o 'msg="listening on [^"]*" threads=[0-9]*' "$T/producer.log" | head -1 >&2

R=$(python3 "$ONCEQ_SRC/tests/tools/http_burst.py" --port "$PORT" --pid "$(oq_pid producer)" \
    --conns 256 --burst 128 --timeout 30) || oq_fail "the burst could not run: $R"
oq_log "burst: $R"
oq_alive producer || oq_fail "the producer died"
[[ "$(jq '.closed + .unanswered' <<<"$R")" == 0 ]] ||
    oq_fail "requests of the burst closed unanswered or still waiting: $R"
[[ "$(jq .answered <<<"$R")" == "$(jq .burst <<<"$R")" ]] || oq_fail "not every request answered: $R"
MAXT=$(jq '.threads | max' <<<"$R")
((MAXT <= 125)) || oq_fail "one HTTP thread holds $MAXT connections (a full epoll batch is 128)"
curl -sf "$URL/healthz" >/dev/null || oq_fail "the producer does not answer after the burst"
oq_pass "a burst to one HTTP thread ($(jq .burst <<<"$R") requests) answered in $(jq .max_s <<<"$R") s; threads hold $(jq -c .threads <<<"$R") connections"
