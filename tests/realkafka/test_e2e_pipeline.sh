#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End to end on a real Kafka cluster (3 KRaft nodes): producer (HTTP), relay, 3 consumers and
# ONCEQ_E2E_CALLS (default 2000) mixed calls with same-key replays and conflicts, as the mock
# run in tests/integration/test_e2e_pipeline.sh. On top of `onceq verify` clean (every
# accepted call terminal, DSR 0, lost 0, effects = succeeded charge + send_email calls):
#   - the topics were created for real: RF 3, min.insync.replicas 2, every partition led;
#   - onceq.tool-calls holds every outbox row of calls.db exactly once, read back from offset
#     0 (a real broker keeps what it acknowledged, and the idempotent producer's retries are
#     deduplicated by the brokers: no fault here, so no copy);
#   - after the run no partition is under-replicated.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/realkafka/lib.sh"

N=${ONCEQ_E2E_CALLS:-2000}
pl_start 3

D=$(rk_describe "${RK_TOPICS[@]}") || oq_fail "topics describe failed"
for t in "${RK_TOPICS[@]}"; do
    grep -q "^topic $t partitions=6 replication-factor=3 min.insync.replicas=2 " <<<"$D" ||
        { echo "$D"; oq_fail "$t: not RF 3 / min.insync.replicas 2"; }
done
rk_all_led || oq_fail "a partition has no leader"

t0=$SECONDS
pl_load --calls "$N" --conns 8 --prefix rke2e --sleep-ms 5 --dup-every 50 --conflict-every 97 \
    --accepted "$T/accepted" >"$T/load1.out" || { cat "$T/load1.out"; oq_fail "load generator reported failures"; }
grep -q "^accepted=$N\$" "$T/load1.out" || oq_fail "not all $N calls accepted"
grep -q '^replays_bad=0$' "$T/load1.out" || oq_fail "a same-key replay returned another call"
grep -q '^conflicts_bad=0$' "$T/load1.out" || oq_fail "a same-key conflict was not refused with 422"
pl_wait_drained 240 "$N" || oq_fail "calls not terminal within 240 s"
oq_log "submit + drain of $N calls: $((SECONDS - t0)) s"

J=$(pl_verify --accepted "$T/accepted")
rc=$?
echo "$J"
[[ $rc == 0 ]] || oq_fail "onceq verify exit $rc: $J"
[[ $(pl_field "$J" clean) == true ]] || oq_fail "verify not clean"
[[ $(pl_field "$J" calls) == "$N" ]] || oq_fail "calls != $N"
[[ $(pl_field "$J" duplicates) == 0 ]] || oq_fail "duplicate effects"
[[ $(pl_field "$J" lost) == 0 ]] || oq_fail "lost calls"
[[ $(pl_field "$J" dsr) == 0.0 || $(pl_field "$J" dsr) == 0 ]] || oq_fail "DSR not 0"
[[ $(pl_field "$J" effects) == $(pl_field "$J" expected_effects) ]] || oq_fail "effects mismatch"

"$(oq_tool oq_relay_check)" --brokers "$BROKERS" --db "$PDB" --topic onceq.tool-calls \
    --max-dups 0 --timeout-ms 60000 >"$T/check.out" || { cat "$T/check.out"; oq_fail "tool-calls topic check failed"; }
grep '# summary' "$T/check.out"
grep -q ' missing=0 dups=0 ' "$T/check.out" || oq_fail "tool-calls topic: missing or duplicate messages"

oq_wait_for 60 rk_fully_replicated || oq_fail "under-replicated partitions 60 s after the run"
oq_pass "real Kafka e2e: $N calls, verify clean, tool-calls topic = outbox exactly once"
