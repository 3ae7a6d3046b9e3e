#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The HTTP-tool scenarios of the SQLite consumer, again with the consumers on PostgreSQL
# (PL_CDB: chaos/pipeline.sh and realtools.sh read it), each on a fresh database:
#   test_realtools_sigstop  a lease holder SIGSTOPped with requests in flight: the other worker
#                           takes over by the fence, the stopped one writes nothing on waking;
#   test_realtools_lost     answers lost after the downstream committed: reconciled by lookup,
#                           never a second payment;
#   test_review_fence       review decisions fenced by their episode.
# Each must pass as on SQLite (one payment per call, verify clean).
# ctest-cost: 50
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
for t in test_realtools_sigstop test_realtools_lost test_review_fence; do
    PL_CDB=$(oq_pg_fresh_db "onceq_it_pgrt_${t#test_}")
    oq_log "$t with the consumers on PostgreSQL"
    env -u T PL_CDB="$PL_CDB" bash "$ONCEQ_SRC/tests/integration/$t.sh" >"$T/$t.log" 2>&1 || {
        grep -v '^ts=' "$T/$t.log" | tail -30
        oq_fail "$t failed with the consumers on PostgreSQL"
    }
done
oq_pass "HTTP-tool scenarios (SIGSTOP takeover, lost answers, fenced review) with the consumers on PostgreSQL"
