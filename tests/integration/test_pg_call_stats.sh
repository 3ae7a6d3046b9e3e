#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The per-call reconciliation figures agree between the two consumer backends: the scenario of
# test_realtools_call_stats.sh (7 calls: 5 UNKNOWN, 4 resolved by machine by lookup or resend,
# 1 by an operator) runs with the consumers on SQLite, then on a fresh PostgreSQL database
# (PL_CDB), each passing its own checks; the "calls" objects of `onceq stats --consumer-db
# --json` are then equal in every count and rate (the UNKNOWN -> final times are timings, so
# only their number is compared).
# ctest-cost: 40
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
t=test_realtools_call_stats
for b in sqlite pg; do
    cdb=
    [[ $b == pg ]] && cdb=$(oq_pg_fresh_db onceq_it_pg_call_stats)
    oq_log "$t with the consumers on $b"
    env -u T PL_CDB="$cdb" STATS_OUT="$T/$b.json" bash "$ONCEQ_SRC/tests/integration/$t.sh" \
        >"$T/$b.log" 2>&1 || {
        grep -v '^ts=' "$T/$b.log" | tail -30
        oq_fail "$t failed with the consumers on $b"
    }
done
strip='del(.unknown_to_final_ms.p50, .unknown_to_final_ms.p95, .unknown_to_final_ms.p99)'
s=$(jq -cS "$strip" "$T/sqlite.json")
p=$(jq -cS "$strip" "$T/pg.json")
[[ -n "$s" && "$s" == "$p" ]] || oq_fail "SQLite $s vs PostgreSQL $p"
jq -e '.calls == 7 and .unknown == 5 and .unknown_resolved == 4 and .review == 1' \
    "$T/pg.json" >/dev/null || oq_fail "PostgreSQL: $(cat "$T/pg.json")"
oq_pass "per-call figures equal on SQLite and PostgreSQL: $p"
