#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Consumers joining and leaving while calls flow, on a real Kafka cluster (3 KRaft nodes):
# consumer-1 runs throughout; every 1-2 s one more consumer joins (up to 4 in the group) or a
# random extra one leaves, by TERM (a clean leave: it finishes its batch, commits and leaves
# the group) or by kill -9 (its partitions wait for its session timeout, 6 s, and what it had
# committed to SQLite but not to Kafka is redelivered to the new owner). Then the load ends
# and the pipeline drains. Checks:
#   - the group really rebalanced: assignments beyond the first ones, and revocations of live
#     members seen;
#   - `onceq verify` clean: every accepted call terminal, DSR 0, lost 0, one effect per
#     effectful succeeded call.
#
# ONCEQ_RK_ASSIGNMENT selects the consumers' partition.assignment.strategy (default: librdkafka's
# own default, range+roundrobin, an eager protocol that revokes every partition of every member
# on each change). test_rebalance_coop.sh runs this script with cooperative-sticky, where only
# the partitions that move are revoked (the consumer's rebalance callback handles both).
# ONCEQ_E2E_CALLS (default 4500) calls at ONCEQ_E2E_RATE (default 250) calls/s.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/realkafka/lib.sh"

N=${ONCEQ_E2E_CALLS:-4500}
RATE=${ONCEQ_E2E_RATE:-250}
STRATEGY=${ONCEQ_RK_ASSIGNMENT:-}
PL_CONSUMER_X+=(--lease 5s)
[[ -n "$STRATEGY" ]] && PL_CONSUMER_X+=(-X "partition.assignment.strategy=$STRATEGY")
pl_start 1
assigned1() { grep -q 'assigned [1-9]' "$T/consumer-1.log"; }
oq_wait_for 60 assigned1 || oq_fail "consumer-1 got no partitions within 60 s"

oq_log "submitting $N calls at $RATE/s in the background (assignment: ${STRATEGY:-default})"
"$(oq_tool oq_e2e_load)" --port "$PORT" --calls "$N" --rate "$RATE" --conns 8 --prefix rb \
    --sleep-ms 5 --accepted "$T/accepted" >"$T/load.out" 2>&1 &
LOAD=$!
oq_on_exit "kill $LOAD 2>/dev/null"

# The membership changes: a fixed pseudo-random sequence (bash's RANDOM seeded), at most 8.
RANDOM=${ONCEQ_RK_SEED:-4242}
changes=0 joins=0 leaves=0 kills=0 next=2
alive_extras() {
    local i
    for i in 2 3 4 5 6 7 8 9 10; do oq_alive "consumer-$i" && echo "consumer-$i"; done
}
for ((step = 0; step < 8; step++)); do
    sleep $((1 + RANDOM % 2))
    kill -0 "$LOAD" 2>/dev/null || break
    mapfile -t extras < <(alive_extras)
    if ((${#extras[@]} < 3 && (${#extras[@]} == 0 || RANDOM % 2 == 0))); then
        pl_spawn_consumer "$next"
        next=$((next + 1))
        joins=$((joins + 1))
    else
        victim=${extras[RANDOM % ${#extras[@]}]}
        if ((RANDOM % 2)); then
            oq_log "TERM $victim (leaves the group cleanly)"
            oq_kill "$victim" TERM
        else
            oq_log "kill -9 $victim"
            oq_kill "$victim" KILL
            kills=$((kills + 1))
        fi
        leaves=$((leaves + 1))
    fi
    changes=$((changes + 1))
done
oq_log "membership changes while calls flowed: $changes ($joins joins, $leaves leaves, $kills by kill -9)"
((joins >= 2 && leaves >= 1)) || oq_fail "too few membership changes before the load ended ($joins joins, $leaves leaves): lower ONCEQ_E2E_RATE or raise ONCEQ_E2E_CALLS"

wait "$LOAD"
lrc=$?
cat "$T/load.out"
[[ $lrc == 0 ]] || oq_fail "load generator failed (rc=$lrc)"
grep -q "^accepted=$N\$" "$T/load.out" || oq_fail "not all $N calls accepted"
oq_alive consumer-1 || oq_fail "consumer-1 died"

pl_wait_drained 240 "$N" || oq_fail "calls not terminal within 240 s after the load"
pl_verify_clean --accepted "$T/accepted"

assigns=$(cat "$T"/consumer-*.log | grep -c 'assigned [0-9]* partition' || true)
revokes=$(cat "$T"/consumer-*.log | grep -c 'msg="revoking' || true)
oq_log "rebalances seen in the consumers' logs: $assigns assignments, $revokes revocations"
# Changes that come while a rebalance is under way join it, so there are fewer rebalances
# than changes; what must hold is that live members were rebalanced, more than once.
((assigns >= 2)) || oq_fail "only $assigns assignment(s) for $changes membership changes"
((revokes >= 1)) || oq_fail "no revocation seen: the group never rebalanced a live member"
if [[ "$STRATEGY" == cooperative-sticky ]]; then
    grep -q 'COOPERATIVE\|incremental' "$T"/consumer-1.log ||
        oq_log "note: consumer-1's log does not name the protocol"
fi
oq_pass "rebalances under load (${STRATEGY:-default}): $changes changes, $assigns assignments, verify clean, redeliveries absorbed=$(pl_field "$J" inbox_duplicates)"
