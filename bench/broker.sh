#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Broker throughput over loopback: oq_kclient (librdkafka) against `onceq broker`.
#
#   bench/broker.sh [COUNT [SIZE [PARTITIONS]]]     defaults 200000 200 64
#   env: ONCEQ_BUILD (build dir with onceq and oq_kclient), ONCEQ_SRC
#
# Produces COUNT x SIZE-byte messages keyless, then keyed (key "k<i>"), each into its own
# topic of PARTITIONS partitions, and consumes each topic with one group consumer (--quiet).
# The mock keeps only ~5 MiB per partition: keep COUNT*SIZE/PARTITIONS well below that,
# or the consumer sees evicted offsets. That needs the messages spread evenly: librdkafka's
# sticky partitioner (keyless messages, sticky.partitioning.linger.ms 10 ms by default) put
# 22,000-24,000 of 200,000 into one partition of 64 (about 6 MB with record overhead), the
# mock evicted the oldest, and the consumer stopped short in most runs. Keyless messages are
# therefore spread one by one (sticky.partitioning.linger.ms=0): at most ~3,300 a partition.
set -uo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/.." && pwd)}/tests/integration/lib.sh"

N=${1:-200000}
SIZE=${2:-200}
PARTS=${3:-64}
KC=$(oq_tool oq_kclient)
per_part=$((N * SIZE / PARTS))
((per_part < 4 * 1024 * 1024)) || oq_fail "$N x $SIZE B over $PARTS partitions is $per_part B each: above the mock's ~5 MiB retention"

oq_start_broker --topics "bench.keyless:$PARTS,bench.keyed:$PARTS"
echo "onceq broker: 3 brokers, $N x $SIZE B, $PARTS partitions; $(nproc) cores"
for mode in keyless keyed; do
    keyopt=(-X sticky.partitioning.linger.ms=0)
    [[ $mode == keyed ]] && keyopt=(--key-prefix k)
    out=$("$KC" produce --brokers "$BROKERS" --topic "bench.$mode" --count "$N" --size "$SIZE" \
        "${keyopt[@]}" -X linger.ms=5 --timeout-ms 120000) || oq_fail "produce: $out"
    echo "produce $mode: $out"
    # The mock's group coordinator can revoke a fresh assignment mid-consume (a SyncGroup
    # race of the mock): the consumer then stops short. Retry with a new group. A good try takes about a second here, so a try that stalls gives up after 20 s
    # (with 120 s, three stalled tries cost 6 minutes of `make bench`).
    for try in 1 2 3; do
        out=$("$KC" consume --brokers "$BROKERS" --topic "bench.$mode" --group "bench-$mode-$try" \
            --max "$N" --quiet --timeout-ms 20000 -X session.timeout.ms=6000) && break
        echo "consume $mode: try $try stopped short (mock rebalance race), retrying" >&2
        ((try < 3)) || oq_fail "consume: $out"
    done
    echo "consume $mode: $(grep summary <<<"$out" | sed 's/partitions=[^ ]* //')"
done
