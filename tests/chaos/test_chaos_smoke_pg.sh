#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 75
# The chaos smoke subset on PostgreSQL: chaos/run.py --db pg, each run on a fresh database of
# the test server (ONCEQ_TEST_PG_URL) holding every stage (producer, relay, consumers), the
# scenarios that reach the PostgreSQL stores hardest: same_key (one key from 20 clients at
# once), crash_points (kill -9 at named crash points of producer, relay and consumers, under
# load), duplicate_delivery (late acks, every message re-produced), worker_stop (the lease
# holder of a running call SIGSTOPped past its lease) and the negative control http_proxy_negative (a client that changes keys on
# retry must show duplicate effects: the checker is not blind on this backend either). Fails
# when a run fails its checks (onceq verify reads the PostgreSQL stages), the control shows no
# duplicates, or a row is missing. The full matrix on PostgreSQL: make chaos-matrix CHAOS_DB=pg.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
SEED=${ONCEQ_CHAOS_SEED:-20261202}
SC=same_key,http_proxy_negative,crash_points,duplicate_delivery,worker_stop
python3 "$ONCEQ_SRC/chaos/run.py" --db pg --smoke --runs 1 --seed "$SEED" --scenarios "$SC" \
    --out "$T/results" --build "$ONCEQ_BUILD" ||
    oq_fail "chaos smoke on PostgreSQL failed (seed $SEED); reproduce: chaos/run.py --db pg --smoke --scenarios $SC --seed $SEED --keep"
python3 - "$T/results/report.json" "$SC" <<'PY' || oq_fail "report.json: rows or negative control wrong"
import json, sys
r = json.load(open(sys.argv[1]))
rows = {x["scenario"]: x for x in r["rows"]}
assert r["passed"] and r["db"] == "pg", "report says failed, or not on PostgreSQL"
assert set(sys.argv[2].split(",")) <= set(rows), f"rows missing: {set(sys.argv[2].split(',')) - set(rows)}"
assert rows["http_proxy_negative"]["control_duplicates"] > 0, "the negative control saw no duplicates"
assert rows["duplicate_delivery"]["inbox_duplicates"] > 0, "no duplicate delivery absorbed"
for name, x in rows.items():
    assert x["runs"] == 1 and x["duplicate_effects"] == 0 and x["lost"] == 0, name
PY
oq_pass "chaos smoke on PostgreSQL: $SC, seed $SEED"
