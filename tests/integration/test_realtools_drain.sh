#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SIGTERM while an HTTP request is in flight: the consumer drains. A tool with neither keys nor
# a lookup (its lost answer could only go to review) calls a downstream that holds the request
# 7 s before it acts and answers; the tool's timeout is 20 s, so the default --drain (the
# longest timeout in the tools file, at most 60 s) is 20 s.
#   1. SIGTERM right after the request arrived downstream: the answer comes 6-8 s after the
#      signal, inside the drain; the execution ends COMMITTED (not needs_review), the worker
#      exits 0 once it is written, and the call ends `succeeded` with one payment.
#      (Before --drain the worker gave every request 5 s: this call went to review.)
#   2. --drain 1s: the same request is abandoned after 1 s, UNKNOWN, and with neither keys nor
#      a lookup the call goes to `needs_review` and is never resent (what --drain bounds).
#   3. Nothing new starts after SIGTERM: with --http-inflight 1 a second call waits in the
#      queue behind a held one; at SIGTERM the held one commits within the drain, the queued
#      one is never sent (handed back, SAFE_RETRY) and runs once after the restart.
# onceq verify is clean over the three databases.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

rt_start_downstream --slow 7s
RT_VARIANTS='[
  {"name": "blind_slow", "url": "http://127.0.0.1:'$DPORT'/v1/payments",
   "body": {"amount": "{amount}"}, "idempotency_header": null, "timeout_ms": 20000,
   "headers": {"X-Downstream-Fault": "slow"}}
]'
rt_tools "$T/tools.json"
BASE_X=("${PL_CONSUMER_X[@]}")
PL_CONSUMER_X+=(--tools "$T/tools.json")
pl_start 1

# SIGTERM consumer-1 as soon as request number $1 reached the downstream; sets secs to the
# seconds the worker took to exit and fails unless it exited 0.
term_when_sent() {
    oq_wait_for 30 rt_at_least "$1" rt_dstat .requests.post_payment || oq_fail "request $1 never sent"
    local t0=$SECONDS rc
    kill -TERM "$(oq_pid consumer-1)"
    oq_wait_exit consumer-1 60
    rc=$?
    [[ $rc == 0 ]] || oq_fail "exit code $rc after SIGTERM"
    secs=$((SECONDS - t0))
}
state_of() { rt_cq "SELECT state FROM executions WHERE call_id='$1'"; }

# --- 1. the answer arrives within the default drain: committed --------------------------------
c1=$(rt_submit drain-1 blind_slow '{"amount":51}')
term_when_sent 1
oq_log "drain-1: worker exited ${secs}s after SIGTERM: $(state_of "$c1")"
((secs >= 5)) || oq_fail "exited after ${secs}s: it did not wait for the answer"
[[ $(state_of "$c1") == COMMITTED ]] ||
    oq_fail "drain-1: $(state_of "$c1") (the answer 6-8 s after SIGTERM was not committed)"
[[ $(rt_cq "SELECT count(*) FROM audit WHERE call_id='$c1' AND event IN ('unknown','needs_review')") == 0 ]] ||
    oq_fail "drain-1 went through unknown/review"
# how many times a consumer-1 process has got as far as its worker (its SIGTERM handler is set
# before that): a SIGTERM sent earlier meets a process still starting up
started() { grep -c 'msg="worker started"' "$T/consumer-1.log"; }
restarted() { (($(started) > n0)); }
n0=$(started)
pl_spawn_consumer 1 # publishes the result, if the old worker's result relay did not already
rt_wait_status drain-1 succeeded 30 || oq_fail "drain-1: $(rt_call drain-1)"
[[ $(rt_dstat .ledger.effects) == 1 ]] || oq_fail "ledger: $(rt_dstat .ledger)"

# --- 2. a drain shorter than the answer: abandoned, to review, never resent -------------------
oq_wait_for 30 restarted || oq_fail "the new consumer-1 did not start"
kill -TERM "$(oq_pid consumer-1)"
oq_wait_exit consumer-1 60 || oq_fail "consumer-1 did not stop"
PL_CONSUMER_X=("${BASE_X[@]}" --tools "$T/tools.json" --drain 1s --recover-every 200ms)
pl_spawn_consumer 1
c2=$(rt_submit drain-2 blind_slow '{"amount":52}')
term_when_sent 2
oq_log "drain-2: worker exited ${secs}s after SIGTERM: $(state_of "$c2")"
((secs < 6)) || oq_fail "--drain 1s: exited only after ${secs}s"
[[ $(state_of "$c2") == UNKNOWN ]] || oq_fail "drain-2: $(state_of "$c2") (expected UNKNOWN)"
pl_spawn_consumer 1
rt_wait_status drain-2 needs_review 30 || oq_fail "drain-2: $(rt_call drain-2)"
sleep 7 # the held request lands downstream meanwhile
[[ $(rt_dstat .requests.post_payment) == 2 ]] || oq_fail "resent: $(rt_dstat .requests)"
[[ $(rt_dstat .ledger.effects) == 2 ]] || oq_fail "ledger: $(rt_dstat .ledger)"
[[ $(rt_dstat .ledger.duplicate_effects) == 0 ]] || oq_fail "duplicates: $(rt_dstat .ledger)"
# --- 3. nothing new starts after SIGTERM -------------------------------------------------------
# one request at a time (--http-inflight 1): the second call waits in the queue while the first
# is held; at SIGTERM the first may answer within the drain, the second is never sent (handed
# back, not run) and runs after the restart
kill -TERM "$(oq_pid consumer-1)"
oq_wait_exit consumer-1 60 || oq_fail "consumer-1 did not stop"
PL_CONSUMER_X=("${BASE_X[@]}" --tools "$T/tools.json" --http-inflight 1)
pl_spawn_consumer 1
c3=$(rt_submit drain-3 blind_slow '{"amount":53}')
oq_wait_for 30 rt_at_least 3 rt_dstat .requests.post_payment || oq_fail "drain-3 never sent"
c4=$(rt_submit drain-4 blind_slow '{"amount":54}')
oq_wait_for 30 rt_at_least 1 rt_cq "SELECT count(*) FROM executions WHERE call_id='$c4' AND state='STARTED'" ||
    oq_fail "drain-4 not queued: $(state_of "$c4")"
term_when_sent 3
oq_log "drain-3/4: worker exited ${secs}s after SIGTERM: $(state_of "$c3") / $(state_of "$c4")"
[[ $(state_of "$c3") == COMMITTED ]] || oq_fail "drain-3: $(state_of "$c3")"
[[ $(rt_dstat .requests.post_payment) == 3 ]] || oq_fail "a queued request started after SIGTERM"
[[ $(state_of "$c4") == SAFE_RETRY ]] || oq_fail "drain-4: $(state_of "$c4") (expected handed back)"
pl_spawn_consumer 1
rt_wait_status drain-3 succeeded 30 || oq_fail "drain-3: $(rt_call drain-3)"
rt_wait_status drain-4 succeeded 30 || oq_fail "drain-4: $(rt_call drain-4)"
[[ $(rt_dstat .ledger.effects) == 4 ]] || oq_fail "ledger: $(rt_dstat .ledger)"

J=$(rt_verify)
[[ $? == 0 ]] || oq_fail "verify: $J"
oq_pass "SIGTERM with a request in flight: its answer 7 s later committed within the default drain; --drain 1s abandons it to review; a queued request is not started"
