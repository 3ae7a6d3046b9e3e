#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# --topic-prefix: one setting, honoured by every command that talks to Kafka. With
# --topic-prefix acme.onceq. the broker (or, on a real cluster, `onceq topics create`) makes
# acme.onceq.tool-calls, .tool-results and .dlq; producer, relay and consumers use them:
#   - calls flow end to end: `onceq verify` clean, every call terminal;
#   - acme.onceq.tool-calls holds every outbox row exactly once (the rows keep the logical
#     name onceq.tool-calls; the relay maps it), and onceq.tool-calls holds nothing;
#   - results come back through acme.onceq.tool-results (calls end terminal at all);
#   - an undecodable message on acme.onceq.tool-calls lands in acme.onceq.dlq, where
#     `onceq dlq list --topic-prefix` finds it;
#   - a bad prefix is refused with exit 2 by every command that takes it, before it starts.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

PFX=acme.onceq.
oq_tmpdir
for cmd in producer relay consumer broker topics up; do
    extra=()
    [[ $cmd == topics ]] && extra=(describe --brokers 127.0.0.1:1)
    [[ $cmd == relay || $cmd == consumer ]] && extra=(--brokers 127.0.0.1:1 --db "$T/x.db")
    out=$("$ONCEQ_BIN" "$cmd" "${extra[@]}" --topic-prefix 'bad prefix' 2>&1)
    rc=$?
    [[ $rc == 2 ]] || oq_fail "onceq $cmd --topic-prefix 'bad prefix': exit $rc, want 2 ($out)"
    grep -q 'topic-prefix\|topic prefix' <<<"$out" || oq_fail "onceq $cmd: the error does not name the prefix: $out"
done
oq_log "a bad prefix: exit 2 from producer, relay, consumer, broker, topics, up"
[[ ! -e "$T/x.db" ]] || oq_fail "a refused command created its database"

# On a real cluster the unprefixed topics hold what earlier scripts left: delete them, so that
# "nothing reached onceq.tool-calls" can be read off (it has auto.create.topics.enable=false,
# so a client that used the unprefixed name would fail, not create it).
if oq_real_kafka; then
    B0=$(cat "$ONCEQ_TEST_BROKERS" 2>/dev/null || echo "$ONCEQ_TEST_BROKERS")
    "$ONCEQ_BIN" topics delete --if-exists --brokers "$B0" onceq.tool-calls onceq.tool-results \
        onceq.dlq >/dev/null || oq_fail "could not delete the unprefixed topics"
fi
PL_BROKER_X=(--topic-prefix "$PFX")
PL_PRODUCER_X=(--topic-prefix "$PFX")
PL_RELAY_X=(--topic-prefix "$PFX")
PL_CONSUMER_X+=(--topic-prefix "$PFX")
pl_start 2
N=300
pl_load --calls "$N" --conns 4 --prefix tp --accepted "$T/accepted" >/dev/null ||
    oq_fail "load generator reported failures"
pl_wait_drained 120 "$N" || oq_fail "calls not terminal within 120 s (results not coming back?)"
J=$(pl_verify --accepted "$T/accepted")
rc=$?
[[ $rc == 0 && $(pl_field "$J" clean) == true ]] || oq_fail "verify: $J"

"$(oq_tool oq_relay_check)" --brokers "$BROKERS" --db "$PDB" --topic onceq.tool-calls \
    --topic-prefix "$PFX" --max-dups 0 --timeout-ms 30000 >"$T/check.out" ||
    { cat "$T/check.out"; oq_fail "${PFX}tool-calls does not hold the outbox"; }
grep -q ' missing=0 dups=0 ' "$T/check.out" || oq_fail "${PFX}tool-calls: missing or duplicate messages"
n_plain=$(timeout 20 kcat -C -b "$BROKERS" -t onceq.tool-calls -o beginning -e -q 2>/dev/null | wc -l)
[[ "$n_plain" == 0 ]] || oq_fail "onceq.tool-calls got $n_plain messages with the prefix set"
oq_log "$(grep '# summary' "$T/check.out"); onceq.tool-calls: 0 messages"

# An undecodable message goes to PREFIX + dlq.
printf 'not an envelope' | kcat -P -b "$BROKERS" -t "${PFX}tool-calls" -k poison-1 ||
    oq_fail "kcat could not produce to ${PFX}tool-calls"
in_dlq() {
    timeout 10 kcat -C -b "$BROKERS" -t "${PFX}dlq" -o beginning -e -q -f '%k\n' 2>/dev/null |
        grep -q '^poison-1$'
}
oq_wait_for 60 in_dlq || oq_fail "the undecodable message did not reach ${PFX}dlq"
"$ONCEQ_BIN" dlq list --brokers "$BROKERS" --topic-prefix "$PFX" --json >"$T/dlq.json" ||
    oq_fail "onceq dlq list --topic-prefix failed"
jq -e '[.. | objects | select(.key? == "poison-1")] | length == 1' "$T/dlq.json" >/dev/null ||
    { cat "$T/dlq.json"; oq_fail "onceq dlq list --topic-prefix does not show the dead letter"; }
oq_pass "topic prefix $PFX: $N calls verified, the topic holds the outbox exactly once, DLQ under the prefix"
