#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ONCEQ_KAFKA_STATS_DIR (common/kafka.c): every onceq Kafka client handle writes librdkafka's
# statistics once a second to DIR/<pid>-<handle>.json. Under `onceq up` (embedded broker, 1
# consumer) after 20 calls: the producer, relay and consumer processes each have files, whole
# JSON documents (no .tmp left behind once stopped), with per-broker request counts: the
# relay's producer sent Produce requests carrying the 20 calls, the consumer's consumer handle
# fetched them and committed offsets, the producer's results consumer fetched the results.
# These are what scripts/kafka-bench.sh turns into "Kafka requests per call by type".
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
unset ONCEQ_KAFKA_PROFILE
PORT=$(oq_free_port)
D=$T/up
S=$T/stats
mkdir -p "$S"
oq_spawn up env ONCEQ_KAFKA_STATS_DIR="$S" "$ONCEQ_BIN" up --dir "$D" \
    --listen "127.0.0.1:$PORT" --consumers 1
healthy() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/healthz"; }
oq_wait_for 30 healthy || oq_fail "onceq up: producer not healthy"
"$(oq_tool oq_e2e_load)" --port "$PORT" --calls 20 --conns 2 --prefix st \
    --mix 100,0,0,0,0 >"$T/load" 2>&1 || oq_fail "load failed: $(cat "$T/load")"
drained() {
    [[ $(sqlite3 -cmd '.timeout 5000' "$D/calls.db" \
        "SELECT count(*) FROM calls WHERE idem_key LIKE 'st-%' AND state NOT IN ('pending','running')") == 20 ]]
}
oq_wait_for 60 drained || oq_fail "20 calls not terminal"

# kind of onceq process (producer, relay, consumer) of a statistics file, by its pid
kind_of() { local p=${1##*/}; tr '\0' ' ' <"/proc/${p%%-*}/cmdline" 2>/dev/null | awk '{print $2}'; }
# sum over DIR's files of KIND's handles of TYPE of request REQ, read after the next emission
req_sum() {
    local f t=0 v
    for f in "$S"/*.json; do
        [[ $(kind_of "$f") == "$1" ]] || continue
        v=$(jq --arg t "$2" --arg r "$3" 'select(.type == $t) | [.brokers[].req[$r] // 0] | add' "$f") || return 1
        t=$((t + ${v:-0}))
    done
    echo "$t"
}
counted() {
    [[ $(req_sum relay producer Produce) -ge 1 && $(req_sum consumer consumer Fetch) -ge 1 &&
        $(req_sum consumer consumer OffsetCommit) -ge 1 && $(req_sum producer consumer Fetch) -ge 1 ]]
}
oq_wait_for 15 counted || {
    ls -l "$S"
    oq_fail "no request counts: relay Produce $(req_sum relay producer Produce), consumer Fetch $(req_sum consumer consumer Fetch) OffsetCommit $(req_sum consumer consumer OffsetCommit), producer Fetch $(req_sum producer consumer Fetch)"
}
# the relay's producer carried the 20 calls (txmsgs)
msgs=0
for f in "$S"/*.json; do
    [[ $(kind_of "$f") == relay ]] || continue
    msgs=$((msgs + $(jq 'select(.type == "producer") | .txmsgs' "$f")))
done
[[ $msgs -ge 20 ]] || oq_fail "relay's producer statistics count $msgs messages, want >= 20"
oq_kill up
ls "$S"/*.tmp >/dev/null 2>&1 && oq_fail "a statistics file left half written: $(ls "$S")"
for f in "$S"/*.json; do jq -e .brokers "$f" >/dev/null || oq_fail "$f is not a whole statistics document"; done
oq_log "kafka statistics: $(ls "$S" | wc -l) handle files"
oq_pass
