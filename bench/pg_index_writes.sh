#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The hot path's writes on PostgreSQL with the indexes before and after migration 0007
# (docs/SCALING.md, "Index entries per call"): on a database migrated by onceq (version >= 7),
# alternately with the old index set (calls_settled, calls_effect, calls_expires whole,
# outbox_pub_seq_key whole) and the new one, times in one rolled-back transaction the statements
# a run writes for 20,000 calls: the calls INSERT, the settling UPDATE, 40,000 outbox rows and
# the relay's numbering of them. Prints the median (min) ms of each, per index set. Leaves the
# new index set in place. Not part of `make bench` (it changes the schema's indexes while it runs:
# use a database of its own).
#
#   bench/pg_index_writes.sh URL [ROUNDS]       e.g. URL from scripts/pg.sh url + a fresh dbname
set -euo pipefail
DB=${1:?usage: bench/pg_index_writes.sh URL [ROUNDS]}
ROUNDS=${2:-8}
old="DROP INDEX IF EXISTS onceq.calls_expires; CREATE INDEX calls_expires ON onceq.calls (expires_at);
CREATE INDEX IF NOT EXISTS calls_settled ON onceq.calls (state) WHERE state <> 'pending';
CREATE INDEX IF NOT EXISTS calls_effect ON onceq.calls (effect_id) WHERE effect_id IS NOT NULL;
DROP INDEX IF EXISTS onceq.outbox_pub_seq_key;
CREATE UNIQUE INDEX outbox_pub_seq_key ON onceq.outbox (pub_seq);"
new="DROP INDEX IF EXISTS onceq.calls_expires;
CREATE INDEX calls_expires ON onceq.calls (expires_at) WHERE state IN ('succeeded', 'failed');
DROP INDEX IF EXISTS onceq.calls_settled; DROP INDEX IF EXISTS onceq.calls_effect;
DROP INDEX IF EXISTS onceq.outbox_pub_seq_key;
CREATE UNIQUE INDEX outbox_pub_seq_key ON onceq.outbox (pub_seq) WHERE pub_seq IS NOT NULL;"
run='\timing on
BEGIN;
INSERT INTO onceq.calls(call_id, idem_key, fingerprint, tool, args, created_at, updated_at,
  expires_at) SELECT '"'c_'"' || lpad(g::text, 10, '"'0'"') || md5(g::text), '"'k'"' || md5(g::text),
  md5(g::text), '"'echo'"', '"'{\"a\":1}'"', 1, 1, 100 + g FROM generate_series(1, 20000) g;
UPDATE onceq.calls SET state = '"'succeeded'"', result = '"'{\"ok\":true}'"',
  effect_id = '"'e_'"' || md5(call_id), updated_at = 2, settled_at = 2, expires_at = expires_at + 1000;
INSERT INTO onceq.outbox(message_id, topic, key, payload, created_at) SELECT '"'m-'"' || md5(g::text),
  '"'onceq.tool-calls'"', '"'c_'"' || g, '"'{}'"', 1 FROM generate_series(1, 40000) g;
UPDATE onceq.outbox SET pub_seq = nextval('"'onceq.outbox_pub_seq'"');
ROLLBACK;'
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((i = 0; i < ROUNDS; i++)); do
    for v in old new; do
        if [[ $v == old ]]; then psql -XAtq "$DB" -c "$old" >/dev/null; else psql -XAtq "$DB" -c "$new" >/dev/null; fi
        psql -XAtq "$DB" -c "VACUUM onceq.calls" -c "VACUUM onceq.outbox"
        echo "$v $(psql -Xq "$DB" <<<"$run" | awk '/^Time/ {printf "%s ", $2}')" >>"$out"
    done
done
python3 - "$out" <<'PY'
import statistics, sys
rows = {"old": [], "new": []}
for line in open(sys.argv[1]):
    f = line.split()
    rows[f[0]].append([float(x) for x in f[1:]])
names = ["calls INSERT 20,000", "calls settling UPDATE 20,000", "outbox INSERT 40,000",
         "outbox assign UPDATE 40,000"]
tot = {"old": 0.0, "new": 0.0}
for i, n in enumerate(names, 1):
    cell = {}
    for v in ("old", "new"):
        xs = [r[i] for r in rows[v]]
        cell[v] = f"{statistics.median(xs):.0f} ({min(xs):.0f})"
        tot[v] += statistics.median(xs)
    print(f"{n}: old {cell['old']} ms, new {cell['new']} ms")
print(f"per call: old {tot['old'] * 1000 / 20000:.1f} us, new {tot['new'] * 1000 / 20000:.1f} us")
PY
