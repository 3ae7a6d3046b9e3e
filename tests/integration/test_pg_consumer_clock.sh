#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Consumer leases on PostgreSQL are decided on the database server's clock, not the host's:
# workers on several hosts share the executions and not a clock. The worker's lease steps
# (tests/tools/oq_pg_lease: plan, claim, recover, through consumer/execution.c) run as on three
# hosts, two of them with their wall clock skewed by an hour (Debian faketime):
#  - a worker one hour AHEAD runs recovery while another worker holds a live 30 s lease: the
#    lease is not seen as lapsed, the execution stays STARTED with its fence (no steal);
#  - a worker one hour AHEAD claims with a 3 s lease: the lease it writes ends ~3 s after the
#    server's now, not an hour later (it cannot keep the execution for an hour), and a worker
#    with a true clock takes it over once those 3 s passed on the server;
#  - a worker one hour BEHIND claims with a 30 s lease: its lease is live on the server's
#    clock (not already lapsed), so a true-clock recovery leaves it alone.
# ctest-cost: 15
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
oq_faketime_lib >/dev/null || exit $? # skips without libfaketime (fails under CI)
URL=$(oq_pg_fresh_db onceq_it_pg_consumer_clock)
q() { psql -XAtq "$URL" -c "$1"; }
T_LEASE=$(oq_tool oq_pg_lease)
ahead() { oq_faketime +1h "$T_LEASE" "$URL" "$@"; }
behind() { oq_faketime -1h "$T_LEASE" "$URL" "$@"; }
true_clock() { "$T_LEASE" "$URL" "$@"; }
# the skew is real: faketime moves the wall clock of the process it runs
skew=$(($(oq_faketime +1h date +%s) - $(date +%s)))
((skew > 3500)) || oq_fail "faketime did not skew the clock ($skew s)"
# lease_until - the server's now, in ms
left() { q "SELECT lease_until - (extract(epoch from clock_timestamp()) * 1000)::bigint FROM onceq.consumer_executions WHERE call_id = '$1'"; }
state() { q "SELECT state || ' ' || fence FROM onceq.consumer_executions WHERE call_id = '$1'"; }

# 1. a live lease held by a true-clock worker; a worker an hour ahead runs recovery
C1=$(true_clock plan)
F1=$(true_clock claim "$C1" 30000)
ahead recover
[[ "$(state "$C1")" == "STARTED $F1" ]] ||
    oq_fail "a worker one hour ahead took a live lease over: $(state "$C1") (was STARTED $F1)"
oq_log "ahead recovery left the live lease alone ($(left "$C1") ms left)"

# 2. a worker an hour ahead claims for 3 s: the lease ends 3 s after the server's now
C2=$(true_clock plan)
F2=$(ahead claim "$C2" 3000)
L2=$(left "$C2")
oq_log "ahead claim: lease ends ${L2} ms after the server's now"
((L2 > 0 && L2 <= 10000)) || oq_fail "a worker one hour ahead wrote a lease ending ${L2} ms after the server's now (wanted ~3000)"

# 3. a worker an hour behind claims for 30 s: live on the server's clock
C3=$(true_clock plan)
F3=$(behind claim "$C3" 30000)
L3=$(left "$C3")
oq_log "behind claim: lease ends ${L3} ms after the server's now"
((L3 > 20000 && L3 <= 35000)) || oq_fail "a worker one hour behind wrote a lease ending ${L3} ms after the server's now (wanted ~30000)"

# 4. once 3 s passed on the server, a true-clock worker recovers C2 (and leaves C3 alone)
sleep 4
true_clock recover
[[ "$(state "$C2")" != "STARTED $F2" ]] || oq_fail "the ahead worker's lapsed lease was not recovered"
[[ "$(state "$C3")" == "STARTED $F3" ]] || oq_fail "the behind worker's live lease was taken: $(state "$C3")"
[[ "$(state "$C1")" == "STARTED $F1" ]] || oq_fail "the live lease was taken: $(state "$C1")"
oq_pass "consumer leases on the server's clock: a worker one hour ahead or behind neither steals nor keeps a lease"
