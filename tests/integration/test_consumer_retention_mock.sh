#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The consumer's start-up retention check on the embedded mock broker, which has no admin API:
# the consumer must say (info level) that it could not read onceq.tool-calls' retention.ms and
# that keeping --inbox-retention at or above it is the operator's job, must not warn as if it
# knew, and must keep running. The real-Kafka counterpart, which reads the value and warns,
# is tests/realkafka/test_retention_check.sh.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

if oq_real_kafka; then
    echo "SKIP: the mock has no admin API; on real Kafka see tests/realkafka/test_retention_check.sh"
    exit 77
fi
oq_start_broker --partitions 2
oq_spawn consumer "$ONCEQ_BIN" consumer --db "$T/effects.db" --brokers "$BROKERS" \
    --inbox-retention 1m -X session.timeout.ms=6000
said() { grep -q 'could not read retention.ms of topic onceq.tool-calls' "$T/consumer.log"; }
oq_wait_for 30 said || oq_fail "no 'could not read retention.ms' line within 30 s"
grep 'retention.ms' "$T/consumer.log"
grep -q 'keep --inbox-retention (60000 ms) at or above it' "$T/consumer.log" ||
    oq_fail "the line does not name --inbox-retention"
! grep -q 'has retention.ms=' "$T/consumer.log" || oq_fail "warned about a retention it cannot know"
oq_alive consumer || oq_fail "the consumer stopped"
oq_pass "mock broker: retention check reported as the operator's, consumer running"
