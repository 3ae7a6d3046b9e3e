#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The host clock steps (+2 h, then back) while HTTP tools are in flight: nothing is done twice,
# nothing goes to review, nothing hangs. Two consumers run under libfaketime (CLOCK_REALTIME
# read from one file that the test rewrites mid-run, as an NTP step or an operator's `date -s`
# moves it for every process of the host; CLOCK_MONOTONIC and CLOCK_BOOTTIME keep running);
# the downstream, another host, keeps the real clock. Two tools, both without idempotency keys,
# every request held 4 s by the downstream before it acts and answers (the "slow" fault),
# inside the tools' 10 s timeout, so every call succeeds at once when clocks behave:
#   ref_slow    keys ignored, lookup by reference, settle_ms 10 s;
#   blind_slow  neither keys nor lookup.
# Round 1 steps the consumers' clock +2 h while the requests are held, and back 1.5 s later. A
# lease kept in wall time lapses at once: the other worker takes the calls over; blind_slow
# goes to review (the holder's answer is refused), and ref_slow's lookup, which finds nothing
# yet, looks 2 h older than settle_ms: it is trusted, the call is resent, and the held request
# lands too: two payments. Round 2 steps it -2 h and forward again (deadlines written during
# the excursion look 2 h away, or 2 h past). Every call must end `succeeded` with exactly one
# payment, no `needs_review`, no duplicate in the ledger, a consumer's /readyz still 200, and
# `onceq verify` clean.
# (The excursions are short on purpose: glibc's C11 cnd_timedwait, which librdkafka waits
# with, does not go through libfaketime, while its deadlines come from the faked
# timespec_get: with the clock ahead, librdkafka's idle waits last as long as the offset and
# a consumer drops out of its group. No real host has that skew between the two.)
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

FTLIB=
for f in /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 \
    /usr/lib/*/faketime/libfaketimeMT.so.1 /usr/lib/faketime/libfaketimeMT.so.1; do
    [[ -e $f ]] && FTLIB=$f && break
done
if [[ -z $FTLIB ]]; then
    [[ "${CI:-}" == true ]] && oq_fail "libfaketime is required (apt-get install faketime)"
    echo "SKIP: libfaketime not installed (apt-get install faketime)"
    exit 77
fi
CLOCK=$T/faketime.rc
echo "+0" >"$CLOCK"
# every consumer reads CLOCK_REALTIME through the file; CLOCK_MONOTONIC/BOOTTIME stay real
pl_spawn_consumer() {
    local i=$1
    shift
    oq_spawn "consumer-$i" env LD_PRELOAD="$FTLIB" FAKETIME_TIMESTAMP_FILE="$CLOCK" \
        FAKETIME_NO_CACHE=1 FAKETIME_DONT_FAKE_MONOTONIC=1 "$@" "$ONCEQ_BIN" consumer \
        --db "$CDB" --group "$PL_GROUP" --brokers "$BROKERS" "${PL_CONSUMER_X[@]}"
}

rt_start_downstream --slow 4s
RT_VARIANTS='[
  {"name": "ref_slow", "url": "http://127.0.0.1:'$DPORT'/v1/payments",
   "body": {"amount": "{amount}", "reference": "{effect_id}"}, "idempotency_header": null,
   "idempotent": false, "timeout_ms": 10000, "headers": {"X-Downstream-Fault": "slow"},
   "lookup": {"url": "http://127.0.0.1:'$DPORT'/v1/payments?reference={effect_id}",
              "found": [200], "absent": [404], "settle_ms": 10000}},
  {"name": "blind_slow", "url": "http://127.0.0.1:'$DPORT'/v1/payments",
   "body": {"amount": "{amount}", "reference": "{effect_id}"}, "idempotency_header": null,
   "timeout_ms": 10000, "headers": {"X-Downstream-Fault": "slow"}}
]'
rt_tools "$T/tools.json"
PL_CONSUMER_X+=(--tools "$T/tools.json" --recover-every 200ms)
pl_start 1
MPORT=$(oq_free_port)
pl_spawn_consumer 2 ONCEQ_METRICS_LISTEN="127.0.0.1:$MPORT"
ready() { [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://127.0.0.1:$MPORT/readyz") == 200 ]]; }
oq_wait_for 30 ready || oq_fail "consumer-2 never ready"

set_clock() { echo "$1" >"$CLOCK.new" && mv "$CLOCK.new" "$CLOCK"; }
N=4 # calls per tool and round
sent=0
round() {
    local r=$1 step=$2 i
    for ((i = 1; i <= N; i++)); do
        rt_submit "r$r-ref-$i" ref_slow "{\"amount\":$((r * 100 + i))}" >/dev/null
        rt_submit "r$r-blind-$i" blind_slow "{\"amount\":$((r * 100 + 50 + i))}" >/dev/null
    done
    sent=$((sent + 2 * N))
    # the step comes while the requests are held downstream (4 s; libfaketime reads the file
    # on every call: FAKETIME_NO_CACHE)
    oq_wait_for 30 rt_at_least "$sent" rt_cq "SELECT count(*) FROM audit WHERE event='started'" ||
        oq_fail "round $r: not started: $(rt_cq "SELECT state, count(*) FROM executions GROUP BY 1")"
    sleep 0.3
    set_clock "$step"
    oq_log "round $r: $((2 * N)) requests held downstream; the consumers' clock is now $step"
    sleep 1.5 # (recovery runs every 200 ms)
    set_clock +0
    oq_log "round $r: the consumers' clock is back to the real time"
    for ((i = 1; i <= N; i++)); do
        for k in "r$r-ref-$i" "r$r-blind-$i"; do
            rt_wait_status "$k" succeeded 40 || oq_fail "$k: $(rt_call "$k" | jq -c '{status, error}')"
        done
    done
}
round 1 +2h
round 2 -2h
sleep 5 # a resend would land meanwhile (held 4 s)
# the readiness prober waits on the monotonic clock: a step back does not stall it (its
# answer would go stale after 5 s and /readyz say 503)
ready || oq_fail "consumer-2 not ready after the step back: $(curl -s "http://127.0.0.1:$MPORT/readyz")"

for k in $(rt_cq "SELECT call_id FROM executions"); do
    read -r n _ <<<"$(rt_ledger_by reference "$(rt_eid "$k")")"
    [[ $n == 1 ]] || oq_fail "$k: $n payments in the ledger"
done
[[ $(rt_cq "SELECT count(*) FROM audit WHERE event='needs_review'") == 0 ]] ||
    oq_fail "calls went to review: $(rt_cq "SELECT call_id, detail FROM audit WHERE event='needs_review'")"
oq_log "ledger: $(rt_dstat .ledger | jq -c .)"
[[ $(rt_dstat .ledger.effects) == $((4 * N)) ]] || oq_fail "ledger: $(rt_dstat .ledger)"
[[ $(rt_dstat .ledger.duplicate_effects) == 0 ]] || oq_fail "duplicates: $(rt_dstat .ledger)"
J=$(rt_verify)
[[ $? == 0 ]] || oq_fail "verify: $J"
[[ $(pl_field "$J" clean) == true ]] || oq_fail "verify not clean: $J"
oq_pass "clock stepped +2 h and back under HTTP load: $((4 * N)) calls, one payment each, no review, verify clean"
