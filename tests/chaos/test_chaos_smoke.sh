#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 260
# The chaos matrix's smoke subset: every implemented scenario of chaos/run.py once, with the
# small loads of --smoke, from a fixed seed (ONCEQ_CHAOS_SEED overrides it; the seed is
# printed first). Fails when any run fails its checks (duplicate effect, lost accepted call,
# conflicting body executed, a process that will not restart, integrity_check, the scenario's
# own status-code checks), a negative control (HTTP client changing keys, a false "idempotent"
# declaration against a downstream ignoring keys) shows no duplicates, or the 0.5-minute soak
# sees a daemon's RSS or descriptors grow. Also checks that the
# report (Markdown, JSON) and the SVG chart were written. The full matrix is `make chaos-matrix`.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"

oq_tmpdir
SEED=${ONCEQ_CHAOS_SEED:-20261201}
python3 "$ONCEQ_SRC/chaos/run.py" --smoke --runs 1 --seed "$SEED" --out "$T/results" \
    --build "$ONCEQ_BUILD" --soak-minutes 0.5 || oq_fail "chaos smoke failed (seed $SEED); reproduce: chaos/run.py --smoke --seed $SEED --keep"
for f in report.md report.json recovery.svg; do
    [[ -s "$T/results/$f" ]] || oq_fail "no $f in the results folder"
done
grep -q '<svg' "$T/results/recovery.svg" || oq_fail "recovery.svg is not an SVG"
python3 - "$T/results/report.json" <<'EOF' || oq_fail "report.json: negative control or rows wrong"
import json, sys
r = json.load(open(sys.argv[1]))
rows = {x["scenario"]: x for x in r["rows"]}
assert r["passed"], "report says failed"
for ctl in ("http_proxy_negative", "downstream_negative", "task_crash_negative"):
    assert rows[ctl]["control_duplicates"] > 0, f"{ctl}: the negative control saw no duplicates"
want = {"same_key", "http_proxy", "http_proxy_negative", "crash_points", "duplicate_delivery",
        "rebalance_storm", "worker_stop", "broker_faults", "busy_storm", "downstream_faults",
        "downstream_negative", "retry_payload", "lost_messages", "clock_step", "disk_full",
        "offset_rewind", "review_expiry", "review_fence", "soak", "task_crash",
        "task_crash_negative", "compensation_failure"}
assert want <= set(rows), f"rows missing: {want - set(rows)}"
for name, x in rows.items():
    assert x["duplicate_effects"] == 0 and x["lost"] == 0, name
    if name != "downstream_negative":
        assert x.get("downstream_duplicates", 0) == 0, name
soak = rows["soak"]["details"][0]["soak"]
assert soak and all(p["bounded"] for p in soak), f"soak: {soak}"
EOF
oq_pass "chaos smoke: every scenario once, seed $SEED"
