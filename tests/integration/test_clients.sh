#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The client packages (issue 21, item 5): clients/python (the `onceq` package, standard library
# only) and clients/typescript (the `onceq` npm package, no dependencies), each run by its own
# test command against a live pipeline (embedded broker, producer, relay, one consumer):
#  - Python: installed into a fresh venv (`python3 -m venv --without-pip`, the package copied
#    into its site-packages as pip lays it out; pyproject.toml checked with tomllib), then
#    `python -m unittest discover clients/python/tests` from outside the source tree, so the
#    installed package is the one tested;
#  - TypeScript: `npm test` in clients/typescript (node --test), `npm pack --dry-run` (the
#    package's files include the .d.ts), `tsc -p` when a TypeScript compiler is on PATH and
#    `mypy --strict` on the Python package when mypy is;
#  - each suite: webhook signature vector (computed with openssl) and a tampered body, typed
#    errors, retries of 503 + Retry-After / 429 / 500 against a stub, the wait loop against a
#    server that holds or ignores ?wait=; live: call to succeeded and failed, get / by key,
#    a 422 conflict, a retry with the same key after a dropped response and after a timeout
#    (tests/tools/oq_chaos_proxy.py), a long-poll wait; tasks (test_live_tasks.py,
#    live_tasks.test.js): a task to succeeded with a step citing an earlier result, read back
#    by id and key, replayed, 422, 400 bad_reference; a failed step compensated; a step
#    awaiting approval approved over HTTP (stale fence 409 review_moved, again 409
#    not_awaiting_approval); waitTask's timeout;
#  - then this script: every key the suites used has one call in calls.db, every succeeded
#    call one effect, `onceq verify` clean; the fingerprints of both packages equal
#    `onceq fingerprint` and their `canon` the JCS vectors byte for byte.
# Under CI=true a missing node, npm or venv support fails the run (otherwise: skipped, 77).
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
oq_tmpdir

PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3) || oq_fail "no python3"
missing() {
    [[ "${CI:-}" == true ]] && oq_fail "$1 is required under CI=true ($2)"
    echo "SKIP: needs $1"
    exit 77
}
command -v node >/dev/null || missing node "apt-get install nodejs"
command -v npm >/dev/null || missing npm "apt-get install npm"
"$PY" -m venv --without-pip "$T/venv" >"$T/venv.log" 2>&1 || missing "python3 -m venv" "apt-get install python3-venv: $(tail -3 "$T/venv.log")"
PYSRC=$ONCEQ_SRC/clients/python
TSSRC=$ONCEQ_SRC/clients/typescript

# --- the Python package, installed into the venv -------------------------------------------------
# `pip install` would need the venv's pip (ensurepip: a minute on a loaded machine) and `wheel`
# (not bundled) to build offline: the venv is made without pip and the pure-Python package is
# installed as pip lays it out (the package directory in site-packages); the pyproject.toml
# that pip would read is checked with tomllib.
VPY=$T/venv/bin/python
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || oq_fail "venv: no site-packages"
cp -r "$PYSRC/src/onceq" "$SITE/onceq" || oq_fail "install into $SITE"
"$VPY" - "$PYSRC/pyproject.toml" <<'PY' || oq_fail "clients/python/pyproject.toml is not what pip needs"
import sys
try:
    import tomllib
except ImportError:  # Python < 3.11: no TOML reader in the standard library
    sys.exit(0)
with open(sys.argv[1], "rb") as f:
    t = tomllib.load(f)
p = t["project"]
assert p["name"] == "onceq" and p["version"] and p["requires-python"], p
assert p.get("dependencies", []) == [], "runtime dependencies: %r" % p["dependencies"]
assert t["build-system"]["build-backend"] == "setuptools.build_meta", t["build-system"]
assert t["tool"]["setuptools"]["packages"]["find"]["where"] == ["src"]
assert "py.typed" in t["tool"]["setuptools"]["package-data"]["onceq"]
PY
WHERE=$(cd "$T" && "$VPY" -c 'import onceq, os; print(os.path.dirname(onceq.__file__))') ||
    oq_fail "the installed package does not import"
[[ $WHERE == "$T/venv/"* ]] || oq_fail "onceq imported from $WHERE, not the venv"
[[ -f $WHERE/py.typed ]] || oq_fail "py.typed is not installed"
oq_log "python: onceq installed into a venv ($WHERE)"

client() { # client py|js fingerprint|canon ARGS...
    local which=$1
    shift
    if [[ $which == py ]]; then (cd "$T" && timeout 60 "$VPY" -m onceq "$@"); else timeout 60 node "$TSSRC/src/cli.js" "$@"; fi
}

# --- fingerprints and canonical forms -----------------------------------------------------------
CASES=(
    '{"amount":1999,"currency":"EUR"}'
    '{}'
    '{"n":[1,1.0,-0.0,0.1,1e21,1e-7,1e-6,5e-324,1.7976931348623157e308,333333333.33333329,4.35,9007199254740992,-9007199254740992,2e-3,1E30,-1.5e-7,1e300,123e-20]}'
    '{"s":"\u0001\u001f\u007f\"\\/\b\f\n\r\t","e":"\u00e9\ud83d\ude02\ufb33 A\u030a"}'
    '{"\ue000":1,"\ud83d\ude02":2,"a":3,"A":4,"":5,"\u00e9":6,"10":7,"1":8}'
    '{"a":{"z":[{"y":null,"x":true}],"b":false},"deep":[[[[{"k":[]}]]]]}'
)
i=0
for c in "${CASES[@]}"; do printf '%s' "$c" >"$T/case.$((i++))"; done
for f in "$ONCEQ_TESTDATA"/jcs/input/*.json; do
    n=$(basename "$f" .json)
    if [[ $n == arrays ]]; then { printf '{"v":'; cat "$f"; printf '}'; } >"$T/case.$n"; else cp "$f" "$T/case.$n"; fi
done
# one process per package computes every case (a process start per case is a minute and a
# half on a loaded machine); each line: file TAB tenant
: >"$T/fp.list"
: >"$T/fp.want"
for f in "$T"/case.*; do
    for tenant in default shop "tenant with spaces"; do
        printf '%s\t%s\n' "$f" "$tenant" >>"$T/fp.list"
        "$ONCEQ_BIN" fingerprint --tool charge --tenant "$tenant" <"$f" >>"$T/fp.want" ||
            oq_fail "onceq fingerprint refused $(cat "$f")"
    done
done
NFP=$(wc -l <"$T/fp.want")
(cd "$T" && "$VPY" -c '
import sys, onceq
for line in open(sys.argv[1], encoding="utf-8"):
    path, tenant = line.rstrip("\n").split("\t")
    args = onceq.parse_strict(open(path, encoding="utf-8").read())
    print(onceq.fingerprint(tenant, "charge", args))
' "$T/fp.list") >"$T/fp.py" || oq_fail "python fingerprints failed"
node --input-type=module -e "
import { readFileSync } from 'node:fs';
import { fingerprint } from '$TSSRC/src/index.js';
for (const line of readFileSync(process.argv[1], 'utf8').split('\n').filter(Boolean)) {
  const [path, tenant] = line.split('\t');
  console.log(fingerprint(tenant, 'charge', JSON.parse(readFileSync(path, 'utf8'))));
}" "$T/fp.list" >"$T/fp.js" || oq_fail "typescript fingerprints failed"
for w in py js; do
    cmp -s "$T/fp.want" "$T/fp.$w" ||
        oq_fail "$w fingerprints differ from onceq fingerprint: $(paste "$T/fp.list" "$T/fp.want" "$T/fp.$w" | awk -F'\t' '$3 != $4')"
done
for f in "$ONCEQ_TESTDATA"/jcs/input/*.json; do
    n=$(basename "$f")
    for w in py js; do
        client "$w" canon <"$f" >"$T/canon.$w" || oq_fail "$w canon failed on $n"
        cmp -s "$T/canon.$w" "$ONCEQ_TESTDATA/jcs/output/$n" ||
            oq_fail "$w canon of $n: $(cat "$T/canon.$w") expected $(cat "$ONCEQ_TESTDATA/jcs/output/$n")"
    done
done
# what onceq refuses, the clients refuse (exit 2), rather than fingerprint something else
for bad in '{"a":1e20}' '{"a":9007199254740993}'; do
    for w in py js; do
        [[ $w == js && $bad == *9007199254740993* ]] && continue # JSON.parse rounds it first
        printf '%s' "$bad" | client "$w" fingerprint --tool charge >/dev/null 2>&1
        [[ $? == 2 ]] || oq_fail "$w fingerprint accepted $bad"
    done
done
printf '{"a":1,"a":2}' | client py fingerprint --tool charge >/dev/null 2>&1
[[ $? == 2 ]] || oq_fail "py fingerprint accepted a duplicate member"
oq_log "fingerprints: $NFP cases x 2 packages equal onceq fingerprint; JCS vectors canonical"

# --- the webhook vector the suites hard-code is HMAC-SHA256 as openssl computes it ---------------
VEC=$(printf '1700000000.{"call_id":"c_1","status":"succeeded"}' | openssl dgst -sha256 -hmac whsec_test | awk '{print $NF}')
for f in "$PYSRC/tests/test_unit.py" "$TSSRC/test/unit.test.js"; do
    grep -q "t=1700000000,v1=$VEC" "$f" || oq_fail "$f does not carry the openssl vector $VEC"
done

# --- both suites against the pipeline -------------------------------------------------------------
pl_start 1
export ONCEQ_TEST_URL=http://127.0.0.1:$PORT ONCEQ_TEST_PROXY=$ONCEQ_SRC/tests/tools/oq_chaos_proxy.py
export ONCEQ_TEST_PYTHON=$PY ONCEQ_TEST_KEYS_OUT=$T/keys
: >"$T/keys"
unset ONCEQ_TOKEN ONCEQ_URL

S=$SECONDS
(cd "$T" && timeout 240 "$VPY" -m unittest discover -v -s "$PYSRC/tests" -t "$PYSRC/tests") \
    >"$T/py-tests.log" 2>&1 || oq_fail "python tests: $(grep -E '^(FAIL|ERROR):' "$T/py-tests.log"; tail -40 "$T/py-tests.log")"
grep -q 'skipped' "$T/py-tests.log" && oq_fail "python tests skipped some: $(grep skipped "$T/py-tests.log")"
PY_S=$((SECONDS - S))
oq_log "python: $(grep -E '^Ran ' "$T/py-tests.log") in ${PY_S} s"

S=$SECONDS
(cd "$TSSRC" && timeout 240 npm test --silent) >"$T/js-tests.log" 2>&1 ||
    oq_fail "typescript tests: $(tail -40 "$T/js-tests.log"; grep -E -A12 '^not ok' "$T/js-tests.log")"
grep -q '^# skipped 0' "$T/js-tests.log" || oq_fail "typescript tests skipped some: $(grep '^# ' "$T/js-tests.log")"
JS_S=$((SECONDS - S))
oq_log "typescript: $(grep -E '^# (tests|pass|fail) ' "$T/js-tests.log" | tr '\n' ' ')in ${JS_S} s"
(cd "$TSSRC" && npm pack --dry-run --json 2>/dev/null) >"$T/pack.json" || oq_fail "npm pack --dry-run"
for f in src/index.js src/index.d.ts package.json README.md; do
    jq -e --arg f "$f" '.[0].files | map(.path) | index($f)' "$T/pack.json" >/dev/null ||
        oq_fail "npm pack leaves out $f"
done
MYPY=$(command -v mypy || true)
if [[ -n $MYPY ]]; then
    "$MYPY" --strict "$PYSRC/src/onceq" >"$T/mypy.log" 2>&1 || oq_fail "mypy --strict: $(cat "$T/mypy.log")"
    oq_log "python: mypy --strict clean ($("$MYPY" --version))"
else
    oq_log "python: no mypy on PATH, the type hints are not checked"
fi
TSC=$(command -v tsc || true)
if [[ -n $TSC ]]; then
    (cd "$TSSRC" && "$TSC" -p tsconfig.json) >"$T/tsc.log" 2>&1 || oq_fail "tsc: $(cat "$T/tsc.log")"
    oq_log "typescript: the declarations compile with $("$TSC" --version)"
else
    oq_log "typescript: no tsc on PATH, the declarations are not compiled (npm i -g typescript)"
fi

# --- one call per key, one effect per succeeded call ------------------------------------------------
N=$(wc -l <"$T/keys")
[[ $(grep -c '^py-' "$T/keys") -ge 7 && $(grep -c '^js-' "$T/keys") -ge 6 ]] ||
    oq_fail "the suites did not record their live calls: $(cat "$T/keys")"
# each suite's tasks: 8 calls (ok 2, comp 3, approval 2, slow 1), every task final
for w in py js; do
    [[ $(grep -c "^$w-task-" "$T/keys") == 8 ]] ||
        oq_fail "$w: the task calls recorded: $(grep "^$w-task-" "$T/keys")"
    [[ $(sqlite3 "$PDB" "SELECT count(*) FROM tasks WHERE idem_key LIKE '$w-task-%'
                         AND status IN ('succeeded','compensated')") == 4 ]] ||
        oq_fail "$w tasks: $(sqlite3 "$PDB" "SELECT idem_key, status FROM tasks")"
done
oq_wait_for 30 bash -c "[[ \$(sqlite3 '$PDB' \"SELECT count(*) FROM calls WHERE state IN ('pending','running')\") == 0 ]]" ||
    oq_fail "calls still in flight"
while read -r key id; do
    C=$(sqlite3 "$PDB" "SELECT count(*) FROM calls WHERE idem_key='$key'")
    [[ $C == 1 ]] || oq_fail "key $key: $C calls"
    [[ $(sqlite3 "$PDB" "SELECT call_id FROM calls WHERE idem_key='$key'") == "$id" ]] ||
        oq_fail "key $key: the call is not $id"
    ST=$(sqlite3 "$PDB" "SELECT state FROM calls WHERE idem_key='$key'")
    E=$(sqlite3 "$CDB" "SELECT count(*) FROM effects WHERE call_id='$id'")
    if [[ $ST == succeeded ]]; then [[ $E == 1 ]] || oq_fail "key $key ($id): $E effects"; fi
done <"$T/keys"
# and no call the suites did not record (a retry under another key would be one)
ALL=$(sqlite3 "$PDB" "SELECT count(*) FROM calls")
[[ $ALL == "$N" ]] || oq_fail "$ALL calls in calls.db for $N keys: $(sqlite3 "$PDB" "SELECT idem_key FROM calls")"
J=$(pl_verify) || oq_fail "onceq verify: $J"
[[ $(pl_field "$J" duplicates) == 0 && $(pl_field "$J" clean) == true ]] || oq_fail "onceq verify: $J"
oq_log "verify: $(jq -c '{calls,effects,expected_effects,duplicates,dsr,clean}' <<<"$J" 2>/dev/null)"
oq_pass "client packages: python ${PY_S} s, typescript ${JS_S} s; $N keys one call each; fingerprints ($NFP cases); webhook vector"
