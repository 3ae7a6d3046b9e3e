#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# onceq.fingerprint / onceq.jcs in SQL equal the C fingerprint byte for byte: the RFC 8785
# vectors (tests/data/jcs) and 10,000 random documents (seed ONCEQ_FP_SEED, default 8785) given
# as the same JSON text to both sides, each fingerprinted alike or refused by both
# (tests/integration/pg_fingerprint.py, with Debian's python3-psycopg2).
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
/usr/bin/python3 -c 'import psycopg2' 2>/dev/null || {
    [[ "${CI:-}" == true ]] && oq_fail "python3-psycopg2 missing under CI=true"
    echo "SKIP: needs python3-psycopg2"
    exit 77
}
URL=$(oq_pg_fresh_db onceq_it_fingerprint)
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "migrate"
/usr/bin/python3 "$ONCEQ_SRC/tests/integration/pg_fingerprint.py" "$URL" "$ONCEQ_TESTDATA" \
    "$(oq_tool oq_fp_batch)" "${ONCEQ_FP_DOCS:-10000}" "${ONCEQ_FP_SEED:-8785}" ||
    oq_fail "SQL and C fingerprints differ"
oq_pass "SQL fingerprint = C fingerprint"
