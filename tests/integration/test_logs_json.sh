#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# JSON logs (--log-format json, or ONCEQ_LOG_FORMAT=json) of a whole `onceq up` pipeline under
# a little load:
#  - every line of every child's log (broker, producer, relay, consumers) and of up's own
#    stderr is one JSON object that jq parses, with ts, level, pid, component and msg;
#  - fields are real members, not text in msg: the relay's lease line has owner (a string) and
#    fence (a number), the consumers' "running" lines call_id, tool and fence; no msg carries
#    owner=, fence= or call_id= inside its text;
#  - no CONFWARN at warn level (session.timeout.ms reaches consumers only; the relay's
#    enable.gapless.guarantee is explained once at info);
#  - `onceq up -X` reaches the children in DIR/kafka.conf (mode 0600), not in their argv, and
#    --metrics-base-port serves the relay's and each consumer's /metrics and /readyz.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

command -v jq >/dev/null || oq_fail "jq is needed"
oq_tmpdir
D=$T/up
PORT=$(oq_free_port) || oq_fail "no free port"
BASE=$(oq_free_port) || oq_fail "no free port"
MARK=not-in-argv-$RANDOM
# --log-level debug: the consumers log each run with its call_id and fence. up passes both
# log settings to its children (as ONCEQ_LOG_FORMAT / ONCEQ_LOG_LEVEL, the same settings).
oq_spawn up "$ONCEQ_BIN" up --log-format json --log-level debug --dir "$D" \
    --consumers 2 --listen "127.0.0.1:$PORT" --metrics-base-port "$BASE" \
    -X "client.id=$MARK" -X consumer.heartbeat.interval.ms=500
# oq_spawn writes stdout and stderr to one file; up's stdout is its banner, so the JSON check
# of up's own log reads the lines that start with '{'.
oq_wait_for 30 grep -q 'stop      kill -TERM' "$T/up.log" || oq_fail "onceq up did not start"
URL=http://127.0.0.1:$PORT
oq_wait_for 30 curl -sf -o /dev/null "$URL/readyz" || oq_fail "producer never ready"
ready() { curl -sf -o /dev/null --max-time 3 "http://127.0.0.1:$1/readyz"; }
for p in "$BASE" $((BASE + 1)) $((BASE + 2)); do
    oq_wait_for 40 ready "$p" || oq_fail "metrics listener $p (relay, consumer-1, consumer-2) never ready"
done
oq_wait_for 30 grep -q "metrics   http://127.0.0.1:$BASE/metrics  relay" "$T/up.log" || oq_fail "banner lacks the relay's metrics"

# Configuration by file: the marker is in kafka.conf (0600), in no child's command line.
[[ $(stat -c %a "$D/kafka.conf") == 600 ]] || oq_fail "kafka.conf mode $(stat -c %a "$D/kafka.conf")"
grep -q "client.id=$MARK" "$D/kafka.conf" || oq_fail "kafka.conf lacks the -X property"
for pid in $(pgrep -P "$(oq_pid up)"); do
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$MARK" && oq_fail "pid $pid has the -X value in its argv"
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- ' -X ' && oq_fail "pid $pid has -X in its argv"
done

for i in $(seq 1 20); do
    curl -sf -o /dev/null -X POST -H "Idempotency-Key: j-$i" "$URL/v1/tool-calls" \
        -d "{\"tool\":\"charge\",\"args\":{\"amount\":$i}}" || oq_fail "submit $i"
done
for i in 1 2 3; do # blocking tools go to the runners, which log each run
    curl -sf -o /dev/null -X POST -H "Idempotency-Key: s-$i" "$URL/v1/tool-calls" \
        -d '{"tool":"sleep","args":{"ms":5}}' || oq_fail "submit sleep $i"
done
curl -s -o /dev/null -X POST -H "Idempotency-Key: j-1" "$URL/v1/tool-calls" -d '{"tool":"charge","args":{"amount":99}}'
done23() { [[ $(curl -sf "$URL/metrics" | awk '$1 == "onceq_producer_calls{status=\"succeeded\"}" {print $2}') == 23 ]]; }
oq_wait_for 30 done23 || oq_fail "23 calls did not succeed"
oq_kill up

# Every line of every log parses as one JSON object with the base members.
LOGS=("$D"/broker.log "$D"/producer.log "$D"/relay.log "$D"/consumer-1.log "$D"/consumer-2.log)
grep '^{' "$T/up.log" >"$T/up.json" || oq_fail "up wrote no JSON log line"
for f in "${LOGS[@]}" "$T/up.json"; do
    [[ -s $f ]] || oq_fail "$f is empty"
    # the broker prints its bootstrap list on stdout (a plain line, by design): leave it out
    grep -v '^127\.0\.0\.1:' "$f" >"$f.lines" || true
    jq -R 'fromjson | select((.ts | type) == "string" and (.level | type) == "string" and
        (.pid | type) == "number" and (.component | type) == "string" and
        (.msg | type) == "string") | 1' "$f.lines" >"$f.ok" ||
        oq_fail "$f: a line is not JSON or lacks ts/level/pid/component/msg"
    (($(wc -l <"$f.ok") == $(wc -l <"$f.lines"))) ||
        oq_fail "$f: $(($(wc -l <"$f.lines") - $(wc -l <"$f.ok"))) line(s) without the base members"
    bad=$(jq -R -r 'fromjson | select(.msg | test("(^| )(owner|fence|call_id)=")) | .msg' "$f.lines" | head -3)
    [[ -z $bad ]] || oq_fail "$f: fields packed inside msg: $bad"
    warn=$(jq -R -r 'fromjson | select(.level == "warn" and (.msg | test("CONFWARN"))) | .msg' "$f.lines" | head -3)
    [[ -z $warn ]] || oq_fail "$f: CONFWARN at warn: $warn"
done
oq_log "$(cat "${LOGS[@]/%/.lines}" "$T/up.json" | wc -l) JSON lines parsed"
# has FILE... JQ-CONDITION: some line satisfies the condition
has() {
    local cond=${*: -1}
    cat "${@:1:$#-1}" | jq -R -n -e "[inputs | fromjson | select($cond)] | length > 0" >/dev/null
}
has "$D/relay.log.lines" '.msg == "lease outbox acquired" and (.owner | type) == "string" and
    (.fence | type) == "number"' ||
    oq_fail "relay: no lease line with owner and fence members"
has "$D/consumer-1.log.lines" "$D/consumer-2.log.lines" '.msg == "running" and
    (.call_id | test("^c_")) and .tool == "sleep" and (.fence | type) == "number"' ||
    oq_fail "consumers: no run line with call_id, tool and fence"
has "$D/producer.log.lines" '.msg == "result applied" and (.call_id | test("^c_")) and
    .status == "succeeded"' || oq_fail "producer: no result line with call_id and status"
n=$(cat "$D/relay.log.lines" "$D/consumer-1.log.lines" | jq -R -r 'fromjson | select(.msg | test("gapless")) | .level' | sort -u)
[[ $n == info ]] || oq_fail "the gapless note is not said at info (levels: $n)"
oq_pass "JSON logs of broker, producer, relay, consumers and up parse line by line with structured fields"
