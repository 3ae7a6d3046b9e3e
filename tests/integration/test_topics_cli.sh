#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq topics`: bad input is refused with exit 2 and a clear message before any request is
# sent (no broker is needed: the bootstrap address below has nothing listening), and an
# unreachable cluster is a runtime failure (exit 1) within --timeout. The requests themselves
# are tested on real Kafka (tests/realkafka/test_topics.sh).
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

oq_tmpdir
NOBODY=127.0.0.1:$(oq_free_port)

expect() { # expect RC MESSAGE-REGEX CMD...
    local want=$1 re=$2 rc=0
    shift 2
    timeout 30 "$ONCEQ_BIN" topics "$@" >"$T/out" 2>"$T/err" || rc=$?
    [[ $rc == "$want" ]] || { cat "$T/out" "$T/err"; oq_fail "topics $*: exit $rc, want $want"; }
    grep -Eq -e "$re" "$T/err" || { cat "$T/err"; oq_fail "topics $*: stderr lacks /$re/"; }
}

expect 2 "an action is required" --brokers "$NOBODY"
expect 2 "the action is create, describe or delete" frobnicate --brokers "$NOBODY"
expect 2 "--brokers is required" create
expect 2 "delete needs the topic names" delete --brokers "$NOBODY"
expect 2 "bad topic name 'bad/name'" create --brokers "$NOBODY" bad/name
expect 2 "bad topic name" create --brokers "$NOBODY" ..
expect 2 "PARTITIONS must be 1..100000" create --brokers "$NOBODY" t:0
expect 2 "NAME:PARTITIONS only with create" describe --brokers "$NOBODY" t:3
expect 2 "above --replication-factor 2" create --brokers "$NOBODY" --replication-factor 2 \
    --min-insync-replicas 3
expect 2 "--partitions" create --brokers "$NOBODY" --partitions 0
expect 2 "unknown" create --brokers "$NOBODY" --no-such-setting 1
expect 2 "no.such.property" create --brokers "$NOBODY" -X no.such.property=1
"$ONCEQ_BIN" topics --help | grep -q "min-insync-replicas" || oq_fail "--help lacks the settings"
oq_pass "bad input refused with exit 2"

t0=$SECONDS
expect 1 "." describe --brokers "$NOBODY" --timeout 2s
expect 1 "." create --brokers "$NOBODY" --timeout 2s
((SECONDS - t0 <= 20)) || oq_fail "unreachable cluster: took $((SECONDS - t0)) s with --timeout 2s"
oq_pass "unreachable cluster: exit 1 within the timeout"
