# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Helpers for the real-Kafka tests (tests/realkafka/test_*.sh). Source tests/integration/lib.sh
# first (and chaos/pipeline.sh where the pipeline runs), then this file. It ends a script that
# has no real cluster to run on (exit 77: skipped; a failure under CI=true).
#
#   rk_leaders TOPIC             "partition leader" lines from `onceq topics describe`
#   rk_leader TOPIC PARTITION    the leader's node id (-1: none)
#   rk_busiest TOPIC             the node id leading most partitions of TOPIC
#   rk_led_by NODE               how many partitions of the onceq topics NODE leads
#   rk_all_led                   true when every partition of the onceq topics has a leader
#   rk_fully_replicated          true when no partition of the onceq topics is under-replicated
#   rk_node_pid NODE             pid of a cluster node (scripts/kafka-cluster.sh pid)
#   rk_brokers_without NODE      the bootstrap list less that node

oq_require_real_kafka
[[ -n "${BROKERS:-}" ]] || { [[ -f "$ONCEQ_TEST_BROKERS" ]] && BROKERS=$(cat "$ONCEQ_TEST_BROKERS") || BROKERS=$ONCEQ_TEST_BROKERS; }

RK_TOPICS=(onceq.tool-calls onceq.tool-results onceq.dlq)

# RK_BROKERS (default BROKERS) is the bootstrap list the helpers ask: a test that pauses a node
# leaves it out, or the metadata request may wait on the paused node.
# A failed describe (a node busy electing, a request timing out) is tried again, 3 times.
rk_describe() {
    local i
    for i in 1 2 3; do
        "$ONCEQ_BIN" topics describe --brokers "${RK_BROKERS:-$BROKERS}" --timeout 10s "$@" \
            2>>"${T:-/tmp}/describe.err" && return 0
        sleep 0.5
    done
    return 1
}

# rk_brokers_without NODE: the cluster's bootstrap list less that node's address.
rk_brokers_without() {
    oq_kafka_cluster bootstrap 2>/dev/null | tr ',' '\n' | sed "${1}d" | paste -sd, -
}

rk_leaders() {
    rk_describe "$1" | sed -n 's/^  partition \([0-9]*\) leader=\(-\{0,1\}[0-9]*\) .*/\1 \2/p'
}

rk_leader() { rk_leaders "$1" | awk -v p="$2" '$1 == p {print $2}'; }

rk_busiest() { rk_leaders "$1" | awk '{n[$2]++} END {b=-1; for (k in n) if (b < 0 || n[k] > n[b]) b=k; print b}'; }

rk_led_by() {
    rk_describe "${RK_TOPICS[@]}" | grep -c "^  partition [0-9]* leader=$1 " || true
}

rk_all_led() {
    local out
    out=$(rk_describe "${RK_TOPICS[@]}") || return 1
    [[ $(grep -c '^  partition ' <<<"$out") -gt 0 ]] && ! grep -q 'leader=-1 ' <<<"$out"
}

rk_fully_replicated() {
    local out
    out=$(rk_describe "${RK_TOPICS[@]}") || return 1
    [[ $(grep -c 'under-replicated=0$' <<<"$out") == "${#RK_TOPICS[@]}" ]]
}

rk_node_pid() { oq_kafka_cluster pid "$1" 2>/dev/null; }
