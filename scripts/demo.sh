#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The quick-start demo (what `./quickstart` runs): onceq against a real HTTP service that loses
# answers. It starts `onceq-downstream` (a payment service with its own ledger that drops some
# answers after committing the payment: --fault drop-after-commit:RATE, seeded) and `onceq up`
# with examples/tools.json, then tells the story in about 40 lines:
#   1. payments through the tools that honour keys (pay) or can be looked up (pay_by_reference):
#      all succeed, and some of them lost their answer on the way back;
#   2. the timeline of one call that really lost its answer (picked from the consumer's audit,
#      not assumed): the lost answer, UNKNOWN, the lookup, COMMITTED, with the ledger's row;
#   3. pay_blind, a service with neither keys nor lookup: a lost answer goes to `needs_review`
#      (never resent blind); `onceq review list`, then `onceq review resolve --fence ...`;
#   4. the ledger next to the calls: `onceq verify --downstream-db` (one effect per call);
# then stops everything it started, by pid (also on Ctrl-C or an error).
# About 10 s on a quiet machine; every wait has a deadline (30 s for the pipeline to start, 60 s
# for the six payments, 30 s per later call). Exit 0 when the story held and verify is clean.
#
#   scripts/demo.sh [path/to/onceq]
#   env: ONCEQ_BIN (binary), ONCEQ_DEMO_PORT (producer, default 8081), ONCEQ_DEMO_DOWNSTREAM_PORT
#        (default 8090, the port examples/tools.json names; another port gets a rewritten copy),
#        ONCEQ_DEMO_SEED (fault seed, default 25), ONCEQ_DEMO_FAULT_RATE (default 0.25),
#        ONCEQ_DEMO_DIR (default: a temp dir, removed at the end unless ONCEQ_DEMO_KEEP=1),
#        ONCEQ_DEMO_HOLD=1 (keep everything running until Ctrl-C, to look around),
#        ONCEQ_DEMO_PIDFILE (write "name pid" of every process started, children of up too),
#        ONCEQ_DEMO_CONSOLE_PORT (default 8089; see the console spot below).
# (scripts/demo-pipeline.sh is the older demo on the compiled tools: duplicate and conflict.)
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-${ONCEQ_BIN:-$SRC/build/onceq}}
DS_BIN=${ONCEQ_DOWNSTREAM_BIN:-$(dirname "$BIN")/onceq-downstream} # the test service, built beside onceq
PORT=${ONCEQ_DEMO_PORT:-8081}
DSPORT=${ONCEQ_DEMO_DOWNSTREAM_PORT:-8090}
SEED=${ONCEQ_DEMO_SEED:-25}
RATE=${ONCEQ_DEMO_FAULT_RATE:-0.25}
URL=http://127.0.0.1:$PORT
DSURL=http://127.0.0.1:$DSPORT
die() { echo "demo: $*" >&2; exit 1; }
[[ -x "$BIN" ]] || { echo "demo: no onceq binary at $BIN (build first, or pass its path)" >&2; exit 2; }
for c in curl jq sqlite3; do
    command -v $c >/dev/null || { echo "demo: $c is needed (apt-get install $c)" >&2; exit 2; }
done
for u in "$URL" "$DSURL"; do
    if curl -s -o /dev/null --max-time 1 "$u/healthz"; then
        echo "demo: something already answers on $u; set ONCEQ_DEMO_PORT / ONCEQ_DEMO_DOWNSTREAM_PORT" >&2
        exit 2
    fi
done
if [[ -n "${ONCEQ_DEMO_DIR:-}" ]]; then DIR=$ONCEQ_DEMO_DIR; mkdir -p "$DIR"; else DIR=$(mktemp -d /tmp/onceq-demo.XXXXXX); fi
PDB=$DIR/up/calls.db CDB=$DIR/up/effects.db DDB=$DIR/downstream.db
UP_PID="" DS_PID="" CONSOLE_PID="" HOLDING=0

stop_pid() { # NAME PID: SIGTERM, wait up to 15 s, then SIGKILL
    kill -0 "$2" 2>/dev/null || return 0
    kill -TERM "$2"
    for ((i = 0; i < 150; i++)); do kill -0 "$2" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$2" 2>/dev/null && { echo "demo: $1 (pid $2) did not stop, SIGKILL" >&2; kill -KILL "$2"; }
    wait "$2" 2>/dev/null
}
cleanup() {
    local rc=$? stopped=""
    trap - EXIT INT TERM
    ((HOLDING)) && rc=0
    [[ -n "$CONSOLE_PID" ]] && { stop_pid "onceq console" "$CONSOLE_PID"; stopped+=" onceq console (pid $CONSOLE_PID),"; }
    [[ -n "$UP_PID" ]] && { stop_pid "onceq up" "$UP_PID"; stopped+=" onceq up and its children (pid $UP_PID),"; }
    [[ -n "$DS_PID" ]] && { stop_pid "onceq-downstream" "$DS_PID"; stopped+=" onceq-downstream (pid $DS_PID),"; }
    [[ -n "$stopped" ]] && echo "== stopped${stopped%,}"
    if [[ -z "${ONCEQ_DEMO_DIR:-}" && "${ONCEQ_DEMO_KEEP:-0}" != 1 ]]; then rm -rf "$DIR"; else echo "   data kept in $DIR"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
pidnote() { [[ -n "${ONCEQ_DEMO_PIDFILE:-}" ]] && echo "$1 $2" >>"$ONCEQ_DEMO_PIDFILE"; return 0; }

# The tools file: examples/tools.json as it is, or aimed at another downstream port.
TOOLS=$SRC/examples/tools.json
if [[ $DSPORT != 8090 ]]; then
    sed "s/127\.0\.0\.1:8090/127.0.0.1:$DSPORT/g" "$TOOLS" >"$DIR/tools.json" || die "cannot write $DIR/tools.json"
    TOOLS=$DIR/tools.json
fi

PCT=$(awk -v r="$RATE" 'BEGIN { printf "%g", r * 100 }')
echo "== onceq-downstream: a payment service that commits, then drops $PCT% of its answers"
echo "   onceq-downstream --listen 127.0.0.1:$DSPORT --fault drop-after-commit:$RATE --seed $SEED"
"$DS_BIN" --listen "127.0.0.1:$DSPORT" --db "$DDB" --fault "drop-after-commit:$RATE" \
    --seed "$SEED" >"$DIR/downstream.log" 2>&1 &
DS_PID=$!
pidnote downstream "$DS_PID"
echo "== onceq up --tools ${TOOLS#"$SRC"/}: broker, producer on $URL, relay, 2 consumers"
"$BIN" up --dir "$DIR/up" --listen "127.0.0.1:$PORT" --consumers 2 --tools "$TOOLS" >"$DIR/up.out" 2>&1 &
UP_PID=$!
pidnote up "$UP_PID"
for ((i = 0; i < 300; i++)); do
    curl -s -o /dev/null --max-time 1 "$URL/healthz" && curl -s -o /dev/null --max-time 1 "$DSURL/healthz" && break
    kill -0 "$DS_PID" 2>/dev/null || { cat "$DIR/downstream.log" >&2; die "onceq-downstream exited"; }
    kill -0 "$UP_PID" 2>/dev/null || { cat "$DIR/up.out" >&2; die "onceq up exited"; }
    sleep 0.1
done
curl -s -o /dev/null --max-time 1 "$URL/healthz" || { cat "$DIR/up.out" >&2; die "producer not healthy after 30 s"; }
if command -v pgrep >/dev/null; then for p in $(pgrep -P "$UP_PID"); do pidnote up-child "$p"; done; fi
# up says "pipeline running" once every consumer has joined its Kafka group (about 3 s on the
# embedded broker); a call made before that waits for it
for ((i = 0; i < 300; i++)); do
    grep -q 'onceq up: pipeline running' "$DIR/up.out" && break
    kill -0 "$UP_PID" 2>/dev/null || { cat "$DIR/up.out" >&2; die "onceq up exited"; }
    sleep 0.1
done

# submit KEY TOOL ARGS: prints the call id
submit() {
    curl -s --max-time 10 -X POST "$URL/v1/tool-calls" -H "Idempotency-Key: $1" \
        -H 'Content-Type: application/json' -d "{\"tool\":\"$2\",\"args\":$3}" | jq -r '.call_id // empty'
}
call() { curl -s --max-time 5 "$URL/v1/tool-calls/by-key/$1"; }
status() { call "$1" | jq -r '.status // empty'; }
# wait_terminal KEY SECONDS: prints the end status (or the last one seen)
wait_terminal() {
    local s=""
    for ((w = 0; w < $2 * 10; w++)); do
        s=$(status "$1")
        case $s in succeeded | failed | needs_review) break ;; esac
        sleep 0.1
    done
    echo "$s"
}
cq() { sqlite3 -cmd ".timeout 10000" "$CDB" "$1"; }
dq() { sqlite3 -cmd ".timeout 10000" "$DDB" "$1"; }

RUN="demo$(date +%s)"
echo
echo "== 1. six payments: 4 x pay (the service honours Idempotency-Key; lookup by key),"
echo "      2 x pay_by_reference (no key; lookup by the reference onceq sends)"
KEYS=()
for i in 1 2 3 4; do KEYS+=("$RUN-pay-$i"); [[ -n $(submit "$RUN-pay-$i" pay "{\"amount\":$((1000 + i))}") ]] || die "submit failed"; done
for i in 1 2; do KEYS+=("$RUN-ref-$i"); [[ -n $(submit "$RUN-ref-$i" pay_by_reference "{\"amount\":$((2000 + i))}") ]] || die "submit failed"; done
ok=0 deadline=$((SECONDS + 60))
for k in "${KEYS[@]}"; do
    left=$((deadline - SECONDS))
    [[ $(wait_terminal "$k" $((left > 1 ? left : 1))) == succeeded ]] && ok=$((ok + 1))
done
IDS=$(for k in "${KEYS[@]}"; do call "$k" | jq -r .call_id; done | sed "s/.*/'&'/" | paste -sd,)
LOST=$(cq "SELECT count(DISTINCT call_id) FROM audit WHERE event='unknown' AND call_id IN ($IDS)")
echo "   $ok of ${#KEYS[@]} succeeded; $LOST of them lost their answer on the way back"
((ok == ${#KEYS[@]})) || die "not every payment succeeded"
((LOST >= 1)) || die "no answer was lost (seed $SEED, rate $RATE): nothing to show"

# One call that really lost its answer (from the audit), a `pay` one when there is one.
CID=$(cq "SELECT a.call_id FROM audit a JOIN executions e ON e.call_id = a.call_id
          WHERE a.event='unknown' AND a.call_id IN ($IDS) ORDER BY e.tool = 'pay' DESC, a.id LIMIT 1")
J=$("$BIN" inspect "$CID" --db "$PDB" --consumer-db "$CDB" --json) || die "inspect $CID failed"
EID=$(jq -r .call.effect_id <<<"$J")
T0=$(jq -r '.timeline[0].ts' <<<"$J")
echo
echo "== 2. $(jq -r '"\(.call.idem_key | sub("^demo[0-9]+-"; "")) (\(.call.tool))"' <<<"$J"): its answer was lost. Timeline from"
echo "   onceq inspect $CID --consumer-db effects.db  (+ the service's ledger)"
# (rows: ts, rank, from, event, detail; the rank orders rows of the same millisecond by cause:
# the consumer's start, then the service's payment, then what the consumer saw)
{
    jq -r '.timeline[] | [.ts, (if .event == "started" or .from == "producer" then 0 else 2 end),
        .from, .event, (if .from == "consumer" then .detail else "" end)] | @tsv' <<<"$J"
    dq "SELECT created_at, 1, 'service', 'payment written', id || ' (then its answer was dropped)'
        FROM payments WHERE idem_key = '$EID' OR reference = '$EID'" | tr '|' '\t'
} | sort -s -t$'\t' -k1,1n -k2,2n | awk -F'\t' -v t0="$T0" '{
        d = $5; sub(/^try [0-9]+: /, "", d); sub(/: .*\(request sent\)$/, " (request sent)", d)
        if (length(d) > 66) d = substr(d, 1, 63) "..."
        l = sprintf("   %8s  %-8s  %-15s %s", sprintf("+%.3fs", ($1 - t0) / 1000), $3, $4, d)
        sub(/ +$/, "", l); print l }'
N=$(dq "SELECT count(*) FROM payments WHERE idem_key = '$EID' OR reference = '$EID'")
STATE=$(jq -r .consumer.execution.state <<<"$J")
echo "   -> UNKNOWN, settled by a lookup, never resent: $STATE, $N payment in the ledger"
[[ $STATE == COMMITTED && $N == 1 ]] || die "the lost answer was not settled as one payment"

echo
echo "== 3. pay_blind: neither keys nor lookup. A lost answer cannot be settled by a machine"
BKEY="" BCID=""
for i in $(seq 1 10); do
    k="$RUN-blind-$i"
    c=$(submit "$k" pay_blind "{\"amount\":$((3000 + i))}") || die "submit failed"
    s=$(wait_terminal "$k" 30)
    echo "   blind-$i -> $s"
    [[ $s == needs_review ]] && { BKEY=$k BCID=$c BAMOUNT=$((3000 + i)); break; }
    [[ $s == succeeded ]] || die "blind-$i ended $s"
done
[[ -n "$BKEY" ]] || die "no pay_blind answer was lost in 10 calls"
echo "   \$ onceq review list --db effects.db"
"$BIN" review list --db "$CDB" | head -n 2 | cut -c 1-90 | sed 's/ *$//; s/^/   /'
RJ=$("$BIN" review list --db "$CDB" --json | jq -c --arg c "$BCID" '.review[] | select(.call_id == $c)')
FENCE=$(jq -r '.fence // empty' <<<"$RJ")
[[ -n "$FENCE" ]] || die "$BCID is not in the review queue"
echo "   why: $(jq -r .why <<<"$RJ")"
REF=$(dq "SELECT id FROM payments WHERE amount = $BAMOUNT AND idem_key IS NULL AND reference IS NULL")
[[ $(wc -w <<<"$REF") == 1 ]] || die "the ledger has '$REF' for amount $BAMOUNT"
echo "   the operator finds it in the service's ledger ($REF, amount $BAMOUNT) and resolves:"
NOTE="found in the service's ledger"
echo "   \$ onceq review resolve $BCID --fence $FENCE \\"
echo "         --as committed --ref $REF --note \"$NOTE\" --by demo --db effects.db"
"$BIN" review resolve "$BCID" --db "$CDB" --fence "$FENCE" --as committed --ref "$REF" \
    --note "$NOTE" --by demo >"$DIR/resolve.out" 2>&1 ||
    { cat "$DIR/resolve.out" >&2; die "review resolve failed"; }
for ((w = 0; w < 300; w++)); do s=$(status "$BKEY"); [[ $s == needs_review ]] || break; sleep 0.1; done
echo "   blind-${BKEY##*-} -> $s, object id $(call "$BKEY" | jq -r '.result.object_id // "-"')"
[[ $s == succeeded ]] || die "the resolved call ended $s"

echo
echo "== 4. the service's ledger next to the calls: onceq verify --downstream-db downstream.db"
"$BIN" verify --producer-db "$PDB" --consumer-db "$CDB" --downstream-db "$DDB" >"$DIR/verify.out" 2>&1
VRC=$?
grep -E '^(calls|downstream|duplicates|result) ' "$DIR/verify.out" | sed 's/^/   /'
((VRC == 0)) || { cat "$DIR/verify.out" >&2; die "verify exit $VRC"; }

# ---- CONSOLE SPOT (issue 21 item 1) -------------------------------------------------------------
# Lights up by itself once `onceq console` exists (checked at run time): the demo prints its URL,
# serving it from `onceq up` when up already does, else from an `onceq console` it starts (and
# stops with the rest). ONCEQ_DEMO_HOLD=1 keeps it all running to look around.
if "$BIN" console --help >/dev/null 2>&1; then
    CPORT=${ONCEQ_DEMO_CONSOLE_PORT:-8089}
    if ! curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$CPORT/"; then
        "$BIN" console --producer-db "$PDB" --consumer-db "$CDB" --listen "127.0.0.1:$CPORT" \
            >"$DIR/console.log" 2>&1 &
        CONSOLE_PID=$!
        pidnote console "$CONSOLE_PID"
        for ((i = 0; i < 50; i++)); do curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$CPORT/" && break; sleep 0.1; done
    fi
    echo
    echo "== console: http://127.0.0.1:$CPORT/   (ONCEQ_DEMO_HOLD=1 ./quickstart keeps it running)"
fi
# ---- end of the console spot ---------------------------------------------------------------------

if [[ "${ONCEQ_DEMO_HOLD:-0}" == 1 ]]; then
    echo
    echo "== holding: producer $URL, service $DSURL, data in $DIR; Ctrl-C stops everything"
    HOLDING=1
    while :; do sleep 1; done
fi
echo
echo "== every call succeeded with exactly one payment at the service, lost answers included"
exit 0
