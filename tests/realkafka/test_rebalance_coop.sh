#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# test_rebalance.sh with every consumer on partition.assignment.strategy=cooperative-sticky:
# incremental rebalances, where a join or a leave revokes only the partitions that move (the
# others keep flowing), through the consumer's incremental_assign/unassign path.
export ONCEQ_RK_ASSIGNMENT=cooperative-sticky
export ONCEQ_RK_SEED=${ONCEQ_RK_SEED:-777}
exec bash "$ONCEQ_SRC/tests/realkafka/test_rebalance.sh"
