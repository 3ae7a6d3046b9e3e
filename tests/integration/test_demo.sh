#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The quick-start demo (scripts/demo.sh), run as ./quickstart runs it (bash scripts/demo.sh
# BUILT_BINARY), on free ports:
#   - it exits 0 and tells its story: answers lost, one call's timeline with the service's
#     payment, UNKNOWN, the lookup and COMMITTED; pay_blind in needs_review, listed with its
#     fence, resolved as committed, then succeeded; verify clean with the ledger's count next to
#     the calls; about 40 lines;
#   - the call it shows really lost its answer (its audit has `unknown`), and the ledger holds
#     one payment per call (checked here on the kept databases, not trusted from the output);
#   - every process it started (onceq-downstream, onceq up and up's children: it writes their
#     pids to ONCEQ_DEMO_PIDFILE) is gone when it returns;
#   - a Ctrl-C (SIGINT to its process group) in the middle stops everything too (exit 130).
# ctest-cost: 40
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
command -v pgrep >/dev/null || oq_fail "pgrep (procps) is needed to see up's children"
# whatever a failing demo left behind, by the pids it wrote
oq_on_exit 'for f in "$T"/pids*; do [[ -f $f ]] && while read -r _ p; do kill -KILL "$p" 2>/dev/null; done <"$f"; done'

# all_gone PIDFILE: every pid in it has exited
all_gone() {
    local n p left=""
    while read -r n p; do kill -0 "$p" 2>/dev/null && left+=" $n:$p"; done <"$1"
    [[ -z "$left" ]] || { echo "$left"; return 1; }
}

# --- the demo as ./quickstart runs it -------------------------------------------------------
PORT=$(oq_free_port)
DSPORT=$(oq_free_port)
while [[ $DSPORT == "$PORT" ]]; do DSPORT=$(oq_free_port); done
t0=$SECONDS
ONCEQ_DEMO_PORT=$PORT ONCEQ_DEMO_DOWNSTREAM_PORT=$DSPORT ONCEQ_DEMO_DIR=$T/demo \
    ONCEQ_DEMO_PIDFILE=$T/pids timeout 150 bash "$ONCEQ_SRC/scripts/demo.sh" "$ONCEQ_BIN" \
    >"$T/demo.out" 2>&1
rc=$?
secs=$((SECONDS - t0))
cat "$T/demo.out"
[[ $rc == 0 ]] || oq_fail "demo exit $rc"
oq_log "demo ran in $secs s, $(wc -l <"$T/demo.out") lines"

# the story lines, in order
expect=(
    "drops 25% of its answers"
    "6 of 6 succeeded; [1-9] of them lost their answer"
    "onceq inspect c_[0-9a-f]* --consumer-db effects.db"
    "producer  submitted"
    "service   payment written pay_"
    "consumer  unknown         [a-z_]* (request sent)"
    "consumer  reconciling     lookup 1 sent"
    "consumer  committed       reconciled: found at the downstream, id pay_"
    "UNKNOWN, settled by a lookup, never resent: COMMITTED, 1 payment in the ledger"
    "blind-[0-9]* -> needs_review"
    "AGE .*CALL_ID .*FENCE .*TOOL .*CODE"
    "c_[0-9a-f]* .*pay_blind .*no_lookup_no_keys"
    "why: the downstream neither honours idempotency keys nor offers a lookup"
    "onceq review resolve c_[0-9a-f]* --fence [0-9][0-9]*"
    "--as committed --ref pay_[0-9a-f]* --note"
    "blind-[0-9]* -> succeeded, object id pay_"
    "calls  .*succeeded [0-9]*, failed 0, needs_review 0"
    "downstream  .* \([0-9][0-9]*\) effects for \1 calls, 0 duplicates"
    "result           CLEAN"
    "== stopped onceq up and its children (pid [0-9]*), onceq-downstream (pid [0-9]*)"
)
line=0
for e in "${expect[@]}"; do
    n=$(tail -n +$((line + 1)) "$T/demo.out" | grep -n -m1 -- "$e" | cut -d: -f1)
    [[ -n "$n" ]] || oq_fail "demo output lacks (after line $line): $e"
    line=$((line + n))
done
(($(wc -l <"$T/demo.out") <= 45)) || oq_fail "demo output is $(wc -l <"$T/demo.out") lines (want ~40)"
grep -q "console" "$T/demo.out" && ! "$ONCEQ_BIN" console --help >/dev/null 2>&1 &&
    oq_fail "the console URL printed without an onceq console"
oq_pass "demo: exit 0, the story in $(wc -l <"$T/demo.out") lines, $secs s"

# the call shown really lost its answer; one payment per call in the ledger
D=$T/demo
CID=$(grep -o 'onceq inspect c_[0-9a-f]*' "$T/demo.out" | head -n1 | cut -d' ' -f3)
[[ $(sqlite3 "$D/up/effects.db" "SELECT count(*) FROM audit WHERE call_id='$CID' AND event='unknown'") -ge 1 ]] ||
    oq_fail "the call shown ($CID) did not lose its answer"
calls=$(sqlite3 "$D/up/calls.db" "SELECT count(*) FROM calls WHERE state='succeeded'")
all=$(sqlite3 "$D/up/calls.db" "SELECT count(*) FROM calls")
pays=$(sqlite3 "$D/downstream.db" "SELECT count(*) FROM payments")
matched=$(sqlite3 "$D/up/calls.db" "ATTACH '$D/downstream.db' AS ds; SELECT count(DISTINCT p.id)
    FROM calls c JOIN ds.payments p ON p.id = json_extract(c.result, '\$.object_id')")
[[ $calls == "$all" && $calls -ge 7 && $pays == "$calls" && $matched == "$calls" ]] ||
    oq_fail "$calls of $all calls succeeded, $pays payments in the ledger, $matched matched"
oq_pass "the call shown lost its answer ($CID); $pays payments for $calls calls"

# nothing it started is left
grep -q '^up ' "$T/pids" && grep -q '^downstream ' "$T/pids" || oq_fail "pid file: $(cat "$T/pids")"
(($(grep -c '^up-child ' "$T/pids") >= 5)) || oq_fail "up's children not recorded: $(cat "$T/pids")"
left=$(all_gone "$T/pids") || oq_fail "left running after the demo:$left"
oq_pass "every process it started is gone ($(wc -l <"$T/pids") pids)"

# --- Ctrl-C in the middle -------------------------------------------------------------------
# A terminal's Ctrl-C is SIGINT to the foreground process group. The demo runs here in its own
# group (setsid), with SIGINT's default disposition restored (a background job inherits it
# ignored, and bash could not trap it then).
PORT=$(oq_free_port)
DSPORT=$(oq_free_port)
while [[ $DSPORT == "$PORT" ]]; do DSPORT=$(oq_free_port); done
ONCEQ_DEMO_PORT=$PORT ONCEQ_DEMO_DOWNSTREAM_PORT=$DSPORT ONCEQ_DEMO_PIDFILE=$T/pids2 \
    setsid python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execvp("bash", ["bash"] + sys.argv[1:])' "$ONCEQ_SRC/scripts/demo.sh" "$ONCEQ_BIN" \
    >"$T/int.out" 2>&1 </dev/null &
DEMO=$!
up_started() { [[ $(grep -c '^up-child ' "$T/pids2" 2>/dev/null) -ge 5 ]]; }
oq_wait_for 60 up_started || { cat "$T/int.out"; oq_fail "the second demo did not start its pipeline"; }
sleep 1
kill -INT -- "-$DEMO"
for ((i = 0; i < 300; i++)); do kill -0 "$DEMO" 2>/dev/null || break; sleep 0.1; done
kill -0 "$DEMO" 2>/dev/null && oq_fail "the demo did not stop within 30 s of SIGINT"
wait "$DEMO"
rc=$?
cat "$T/int.out"
[[ $rc == 130 ]] || oq_fail "exit $rc after SIGINT (want 130)"
grep -q "== stopped" "$T/int.out" || oq_fail "no stop line after SIGINT"
left=$(all_gone "$T/pids2") || oq_fail "left running after Ctrl-C:$left"
oq_pass "Ctrl-C: exit 130, every process it started is gone ($(wc -l <"$T/pids2") pids)"
