#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The consumer's start-up retention check against a real broker's DescribeConfigs. The inbox
# must remember a message id at least as long as the topic keeps the message, so a consumer
# whose --inbox-retention is shorter than onceq.tool-calls' retention.ms logs a warning that
# names both numbers; one whose inbox outlives the topic's retention does not (it logs the
# comparison at debug level). Four cases, each a fresh consumer (own group and database):
#   topic 7d  (onceq topics create default) / inbox 1m        -> warning
#   topic 7d                                / inbox 7d default -> no warning
#   topic 30m (--retention 30m)             / inbox 1h        -> no warning
#   topic 30m                               / inbox 10m       -> warning
# The embedded mock broker has no admin API: there the consumer logs that the check is the
# operator's (tests/integration/test_consumer_retention_mock.sh).
set -euo pipefail
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/tests/realkafka/lib.sh"

oq_start_broker
WARN_RE='level=warn .*topic onceq.tool-calls has retention.ms='
CASE=0

# run_case INBOX_RETENTION|default EXPECT(warn|ok) TOPIC_RETENTION_MS
run_case() {
    local inbox=$1 expect=$2 tret=$3 name args=()
    CASE=$((CASE + 1))
    name=consumer-$CASE
    [[ $inbox == default ]] || args=(--inbox-retention "$inbox")
    oq_spawn "$name" env ONCEQ_LOG_LEVEL=debug "$ONCEQ_BIN" consumer --db "$T/e$CASE.db" \
        --group "retention-$CASE" --brokers "$BROKERS" -X session.timeout.ms=6000 "${args[@]}"
    decided() { grep -Eq 'retention.ms=[0-9-]+ <= inbox retention|has retention.ms=|could not read retention.ms' "$T/$name.log"; }
    oq_wait_for 30 decided || oq_fail "case $CASE: the consumer logged no retention decision in 30 s"
    oq_kill "$name" TERM
    grep -E 'retention' "$T/$name.log" | grep -v 'component=rdkafka' | tail -n 2 || true
    if grep -q 'could not read retention.ms' "$T/$name.log"; then
        oq_fail "case $CASE: the check could not read retention.ms from a real broker"
    fi
    case $expect in
    warn)
        grep -Eq "$WARN_RE$tret but the inbox forgets message ids after" "$T/$name.log" ||
            oq_fail "case $CASE: no warning for topic retention $tret ms > inbox $inbox"
        ;;
    ok)
        ! grep -Eq "$WARN_RE" "$T/$name.log" || oq_fail "case $CASE: warning although the inbox ($inbox) outlives the topic ($tret ms)"
        grep -Eq "retention.ms=$tret <= inbox retention" "$T/$name.log" ||
            oq_fail "case $CASE: no debug line comparing $tret ms with the inbox retention"
        ;;
    esac
    oq_log "case $CASE: topic retention.ms=$tret, inbox ${inbox}: $expect as expected"
}

"$ONCEQ_BIN" topics describe --brokers "$BROKERS" onceq.tool-calls | grep -q 'retention.ms=604800000 ' ||
    oq_fail "onceq.tool-calls was not created with retention.ms=604800000 (7 d)"
run_case 1m warn 604800000
run_case default ok 604800000

"$ONCEQ_BIN" topics delete --brokers "$BROKERS" onceq.tool-calls >/dev/null || oq_fail "delete failed"
"$ONCEQ_BIN" topics create --brokers "$BROKERS" --retention 30m onceq.tool-calls >/dev/null ||
    oq_fail "create --retention 30m failed"
run_case 1h ok 1800000
run_case 10m warn 1800000
oq_pass "retention check on real Kafka: warns exactly when --inbox-retention < topic retention.ms"
