#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The real-Kafka suite: fetches Apache Kafka (scripts/kafka-fetch.sh), starts a fresh 3-node
# KRaft cluster in a temporary folder (scripts/kafka-cluster.sh), runs the chosen tests one
# after the other against it (ONCEQ_TEST_BROKERS / ONCEQ_KAFKA_DIR), and stops every node by
# pid, also on failure or Ctrl-C.
#
#   scripts/test-real-kafka.sh [--build DIR] [--tests REGEX] [--keep]
#
#   --build DIR    build folder with onceq and the test tools (default: $BUILD_DIR or ./build)
#   --tests REGEX  ctest -R selection (default: $ONCEQ_REALKAFKA_TESTS or the list below)
#   --keep         keep the cluster's folder (node logs) after the run
#
# One cluster serves the whole run: each script deletes and recreates the onceq topics when it
# starts (tests/integration/lib.sh), which drops what an earlier script left in them and the
# consumer-group offsets on them, at a cost of about a second instead of a cluster start
# (~15 s) per script. Scripts therefore run one at a time (-j1).
# Needs Java 17+, Maven 3 (the first fetch) and kcat. Exit: ctest's status; 1 when the cluster
# cannot be fetched or started.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The default list: the real-Kafka tests plus the integration and chaos scripts whose claims
# matter most on a real cluster (consumer killed mid-run, every message re-produced with kcat,
# the relay killed at each crash point, the relay's topic read back, results ingest, a topic
# prefix).
DEFAULT_TESTS='^(realkafka\..*|integration\.test_e2e_kill_consumer|integration\.test_e2e_reproduce|chaos\.test_relay_crash|integration\.test_relay_basic|integration\.test_producer_results|integration\.test_consumer_flow|integration\.test_topic_prefix)$'

build=${BUILD_DIR:-$src/build}
tests=${ONCEQ_REALKAFKA_TESTS:-$DEFAULT_TESTS}
keep=0
while [[ $# -gt 0 ]]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e '/SPDX-License-Identifier/d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
done
[[ "$build" == /* ]] || build=$PWD/$build
[[ -x "$build/onceq" ]] || { echo "test-real-kafka: no onceq binary in $build (build first)" >&2; exit 1; }

say() { echo "==> real Kafka: $*"; }
t0=$SECONDS
for tool in java mvn kcat; do
    command -v "$tool" >/dev/null || { echo "test-real-kafka: $tool is not installed" >&2; exit 1; }
done

say "fetching Apache Kafka $(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$src/kafka/pom.xml") (Maven, cached outside the source tree)"
"$src/scripts/kafka-fetch.sh" >/dev/null

work=$(mktemp -d "${TMPDIR:-/tmp}/onceq-realkafka.XXXXXX")
cluster() { "$src/scripts/kafka-cluster.sh" "$@" --dir "$work/cluster"; }
finish() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -f "$work/cluster/cluster.env" ]]; then
        say "brokers' CPU time and memory at the end of the run:"
        local i pid
        for i in 1 2 3; do
            pid=$(cluster pid "$i" 2>/dev/null || true)
            [[ -n "$pid" ]] || continue
            ps -o pid=,rss=,time= -p "$pid" | awk -v n="$i" '{printf "    node %s pid %s: RSS %.0f MiB, CPU time %s\n", n, $1, $2 / 1024, $3}'
        done
        say "stopping the cluster (by pid)"
        cluster stop || true
    fi
    if [[ $keep == 1 ]]; then
        say "kept $work (node logs in cluster/node-*/node.log)"
    else
        rm -rf "$work"
    fi
    say "done in $((SECONDS - t0)) s, exit $rc"
    exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "starting a 3-node KRaft cluster in $work/cluster"
cluster start --nodes 3 --bootstrap-file "$work/bootstrap" >/dev/null
say "cluster up at $(cat "$work/bootstrap") after $((SECONDS - t0)) s; running: $tests"
cd "$build"
rc=0
ONCEQ_TEST_BROKERS=$work/bootstrap ONCEQ_KAFKA_DIR=$work/cluster \
    ctest --output-on-failure -j 1 --timeout 600 -R "$tests" || rc=$?
exit "$rc"
