#!/usr/bin/env bash
# The client examples (issue 12, item 8): examples/clients/onceq_client.py (Python, standard
# library) and examples/clients/onceq_client.mjs (Node, no dependencies).
#  - fingerprints: both equal `onceq fingerprint` for several args (RFC 8785 number, string
#    and key-order cases, the tests/data/jcs vectors) and tenants; `canon` of both turns every
#    JCS vector into its output byte for byte;
#  - against a pipeline (embedded broker, producer, relay, one consumer): submit and poll to
#    succeeded / failed; the response of the first POST dropped (tests/tools/oq_chaos_proxy.py
#    drop-response) and delayed past the client's timeout (delay): each client retries with
#    the same key and gets the same call; submitting the key again gives the same call_id;
#    another body under the key is exit 5; `onceq verify` finds one effect per call;
#  - a 503 with Retry-After: 1 (a producer whose calls table is briefly renamed): each client
#    waits at least 1 s before the retry, which succeeds.
# Node is required under CI=true (skipped with 77 otherwise when missing).
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
oq_tmpdir

PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3) || oq_fail "no python3"
if ! command -v node >/dev/null; then
    [[ "${CI:-}" == true ]] && oq_fail "node is required (apt-get install nodejs)"
    echo "SKIP: needs node"
    exit 77
fi
CLI_PY=$ONCEQ_SRC/examples/clients/onceq_client.py
CLI_JS=$ONCEQ_SRC/examples/clients/onceq_client.mjs
PROXY=$ONCEQ_SRC/tests/tools/oq_chaos_proxy.py
client() { # client py|js ARGS...
    local which=$1
    shift
    if [[ $which == py ]]; then timeout 60 "$PY" "$CLI_PY" "$@"; else timeout 60 node "$CLI_JS" "$@"; fi
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
NFP=0
for f in "$T"/case.*; do
    for tenant in default shop "tenant with spaces"; do
        want=$("$ONCEQ_BIN" fingerprint --tool charge --tenant "$tenant" <"$f") ||
            oq_fail "onceq fingerprint refused $(cat "$f")"
        for w in py js; do
            got=$(client "$w" fingerprint --tool charge --tenant "$tenant" <"$f") ||
                oq_fail "$w fingerprint failed on $(cat "$f")"
            [[ "$got" == "$want" ]] ||
                oq_fail "$w fingerprint of $(cat "$f") (tenant $tenant): $got, onceq: $want"
        done
        NFP=$((NFP + 1))
    done
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
oq_log "fingerprints: $NFP cases x 2 clients equal onceq fingerprint; JCS vectors canonical"

# --- against the pipeline -------------------------------------------------------------------------
pl_start 1
URL=http://127.0.0.1:$PORT
PPORT=$(oq_free_port) || oq_fail "no free port"
proxy() { # proxy MODE CLIENT: faults exactly the first request it gets
    local name=proxy-$1-$2 i
    oq_spawn "$name" "$PY" "$PROXY" --listen "$PPORT" --upstream "$PORT" --modes "$1" \
        --rate 1 --max-faults 1 --delay-ms 2500
    for ((i = 0; i < 100; i++)); do
        grep -q '^listening' "$T/$name.log" 2>/dev/null && return 0
        oq_alive "$name" || break
        sleep 0.1
    done
    oq_fail "the proxy did not start listening"
}
field() { jq -r ".$2" <<<"$1"; }
declare -A IDS=()

for w in py js; do
    OUT=$(client "$w" submit --url "$URL" --key "$w-ok" --tool charge --args '{"amount":5}' \
        2>"$T/$w-ok.err") || oq_fail "$w submit: $(cat "$T/$w-ok.err")"
    [[ $(field "$OUT" status) == succeeded ]] || oq_fail "$w submit did not end succeeded: $OUT"
    IDS[$w-ok]=$(field "$OUT" call_id)

    OUT=$(client "$w" submit --url "$URL" --key "$w-fail" --tool fail --args '{}' \
        2>"$T/$w-fail.err") || oq_fail "$w submit fail: $(cat "$T/$w-fail.err")"
    [[ $(field "$OUT" status) == failed && $(field "$OUT" error.code) == tool_failed ]] ||
        oq_fail "$w fail tool: $OUT"

    client "$w" submit --url "$URL" --key "$w-ok" --tool charge --args '{"amount":6}' \
        >/dev/null 2>"$T/$w-conflict.err"
    RC=$?
    [[ $RC == 5 ]] || oq_fail "$w conflict: exit $RC, expected 5: $(cat "$T/$w-conflict.err")"

    for mode in drop-response delay; do
        key="$w-$mode"
        proxy "$mode" "$w"
        OUT=$(client "$w" submit --url "http://127.0.0.1:$PPORT" --key "$key" --tool charge \
            --args '{"amount":7,"memo":"caf\u00e9 \ud83d\ude02","rate":0.1}' --timeout 1 --tries 6 \
            2>"$T/$key.err") || oq_fail "$w through $mode: $(cat "$T/$key.err")"
        cat "$T/$key.err" >&2
        grep -q "fault 1 mode=$mode" "$T/proxy-$mode-$w.log" || oq_fail "the proxy did not fault ($mode)"
        grep -q 'attempt 1 failed' "$T/$key.err" || oq_fail "$w: no retry after $mode: $(cat "$T/$key.err")"
        if [[ $mode == delay ]]; then
            grep -q 'attempt 1 failed (timeout' "$T/$key.err" || oq_fail "$w: the delay was not a timeout"
        fi
        grep -q 'accepted .* (replay)' "$T/$key.err" ||
            oq_fail "$w: the retry after $mode was not a replay of the first attempt"
        [[ $(field "$OUT" status) == succeeded ]] || oq_fail "$w through $mode: $OUT"
        IDS[$key]=$(field "$OUT" call_id)
        oq_kill "proxy-$mode-$w"
        # the same key again, directly: the same call
        AGAIN=$(client "$w" submit --url "$URL" --key "$key" --tool charge \
            --args '{"rate":0.1,"memo":"caf\u00e9 \ud83d\ude02","amount":7.0}' 2>/dev/null) ||
            oq_fail "$w resubmit of $key"
        [[ $(field "$AGAIN" call_id) == "${IDS[$key]}" ]] ||
            oq_fail "$w: $key resubmitted is another call: $AGAIN vs ${IDS[$key]}"
    done
done

for k in "${!IDS[@]}"; do
    N=$(sqlite3 "$PDB" "SELECT count(*) FROM calls WHERE idem_key='$k'")
    [[ $N == 1 ]] || oq_fail "key $k: $N calls"
    E=$(sqlite3 "$CDB" "SELECT count(*) FROM effects WHERE call_id='${IDS[$k]}'")
    [[ $E == 1 ]] || oq_fail "key $k (${IDS[$k]}): $E effects"
done
J=$(pl_verify) || oq_fail "onceq verify: $J"
[[ $(pl_field "$J" duplicates) == 0 && $(pl_field "$J" clean) == true ]] || oq_fail "onceq verify: $J"
oq_log "verify: $(jq -c '{calls,effects,expected_effects,duplicates,dsr,clean}' <<<"$J" 2>/dev/null)"

# --- 503 + Retry-After ----------------------------------------------------------------------------
FPORT=$(oq_free_port) || oq_fail "no free port"
FDB=$T/fault.db
oq_spawn producer-fault "$ONCEQ_BIN" producer --db "$FDB" --listen "127.0.0.1:$FPORT"
oq_wait_for 15 curl -sf "http://127.0.0.1:$FPORT/healthz" || oq_fail "fault producer did not come up"
for w in py js; do
    sqlite3 "$FDB" "ALTER TABLE calls RENAME TO calls_away" || oq_fail "rename"
    client "$w" submit --url "http://127.0.0.1:$FPORT" --key "$w-503" --tool charge \
        --args '{"amount":8}' --no-wait --tries 8 >"$T/$w-503.out" 2>"$T/$w-503.err" &
    CPID=$!
    oq_on_exit "kill $CPID 2>/dev/null"
    oq_wait_for 20 grep -q 'attempt 1 failed (HTTP 503' "$T/$w-503.err" ||
        { kill "$CPID"; oq_fail "$w: no 503 seen: $(cat "$T/$w-503.err")"; }
    sqlite3 "$FDB" "ALTER TABLE calls_away RENAME TO calls" || oq_fail "rename back"
    wait "$CPID"
    RC=$?
    cat "$T/$w-503.err" >&2
    [[ $RC == 0 ]] || oq_fail "$w after a 503: exit $RC: $(cat "$T/$w-503.err")"
    WAIT=$(grep -m1 -o 'retrying in [0-9.]* s' "$T/$w-503.err" | awk '{print $3}')
    awk -v w="$WAIT" 'BEGIN { exit !(w >= 1.0) }' ||
        oq_fail "$w waited ${WAIT:-?} s after a 503 with Retry-After: 1"
    [[ $(jq -r .status "$T/$w-503.out") == pending ]] || oq_fail "$w 503 then: $(cat "$T/$w-503.out")"
done
oq_pass "client examples: fingerprints ($NFP cases), poll to terminal, retries after a dropped response, a timeout and a 503 (Retry-After), one effect per key"
