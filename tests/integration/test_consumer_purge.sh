#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Bounded consumer storage (issue 17, item 7): settled executions, their effects and audit rows
# are purged, and a message of a purged call that comes again is never executed.
#   - 60 calls run to the end; `onceq purge --consumer-db --retention 2s --inbox-retention 2s`
#     past that deletes every execution, effect, audit and inbox row (the consumer still runs).
#   - Every call message is then produced again, byte for byte (as a topic replayed from an old
#     offset or a producer's redrive would): no inbox row and no execution knows them any more,
#     but they were created before the retention horizon the purge raised, so each is
#     dead-lettered `expired` and nothing executes: no execution, no effect, no `started`.
#   - A message created after the horizon still runs (a new call), and the daemon's own settings
#     are checked: --retention below --inbox-retention is raised to it (logged at start).
# On the code before: `onceq purge` has no --consumer-db and deletes nothing of effects.db.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"

N=60
PL_CONSUMER_X+=(--retention 1m --inbox-retention 2m)
pl_start 1
cq() { sqlite3 -cmd ".timeout 10000" "$CDB" "$1"; }
pl_load --calls "$N" --conns 4 --prefix pg --mix 1,1,0,0,1 >"$T/load.out" ||
    oq_fail "load failed: $(cat "$T/load.out")"
pl_wait_drained 60 "$N" || oq_fail "not drained"
grep -q "inbox_retention_ms=120000 retention_ms=120000" "$T/consumer-1.log" ||
    oq_fail "--retention below --inbox-retention not raised: $(grep 'worker started' "$T/consumer-1.log")"
E=$(cq "SELECT count(*) FROM effects")
X=$(cq "SELECT count(*) FROM executions")
((X == N && E > 0)) || oq_fail "before: executions=$X effects=$E"
oq_log "before the purge: executions=$X effects=$E audit=$(cq "SELECT count(*) FROM audit")"

sleep 3 # every row settled more than 2 s ago
"$ONCEQ_BIN" purge --consumer-db "$CDB" --retention 2s --inbox-retention 2s >"$T/purge.json" ||
    oq_fail "onceq purge --consumer-db: $(cat "$T/purge.json")"
cat "$T/purge.json"
[[ $(jq -r .executions "$T/purge.json") == "$N" && $(jq -r .effects "$T/purge.json") == "$E" ]] ||
    oq_fail "purge: $(cat "$T/purge.json")"
for t in executions effects audit inbox; do
    [[ $(cq "SELECT count(*) FROM $t") == 0 ]] || oq_fail "$t not purged: $(cq "SELECT count(*) FROM $t")"
done
H=$(cq "SELECT horizon FROM retention WHERE name='executions'")
[[ -n $H ]] || oq_fail "no horizon"
oq_pass "purged: $N executions, $E effects, their audit and inbox rows; horizon $H"

"$(oq_tool oq_e2e_dup)" --brokers "$BROKERS" --topic onceq.tool-calls --times 1 >"$T/dup.out" ||
    oq_fail "re-producing onceq.tool-calls failed: $(cat "$T/dup.out")"
READ=$(sed -n 's/^read=\([0-9]*\).*/\1/p' "$T/dup.out")
((READ >= N)) || oq_fail "read only $READ call messages back"
arrived() { (($(cq "SELECT count(*) FROM inbox") >= READ)); } # every copy reached the intake
oq_wait_for 60 arrived || oq_fail "the copies did not arrive: inbox=$(cq "SELECT count(*) FROM inbox")"
sleep 1
[[ $(cq "SELECT count(*) FROM executions") == 0 && $(cq "SELECT count(*) FROM effects") == 0 ]] ||
    oq_fail "a purged call ran again: executions=$(cq "SELECT count(*) FROM executions") effects=$(cq "SELECT count(*) FROM effects")"
[[ $(cq "SELECT count(*) FROM dlq WHERE code='expired'") == "$READ" ]] ||
    oq_fail "not every copy dead-lettered expired: $(cq "SELECT code, count(*) FROM dlq GROUP BY code")"
[[ $(cq "SELECT count(*) FROM audit WHERE event IN ('planned','started','committed')") == 0 ]] ||
    oq_fail "a purged call was planned or started again"
oq_pass "$READ messages of purged calls redelivered: all dead-lettered expired, none executed"

# a call submitted after the horizon is a new call and runs
pl_load --calls 5 --conns 1 --prefix pg-after --mix 1,0,0,0,0 >"$T/load2.out" || oq_fail "second load"
ran() { (($(cq "SELECT count(*) FROM executions WHERE state='COMMITTED'") == 5)); }
oq_wait_for 60 ran || oq_fail "new calls after the purge did not run: $(cq "SELECT state, count(*) FROM executions GROUP BY state")"
oq_pass "calls created after the horizon run as usual"
