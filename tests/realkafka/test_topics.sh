#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq topics` against a real cluster: create (defaults, NAME:PARTITIONS, --retention,
# --validate-only, --if-not-exists), describe (text and JSON, exit 4 for a missing topic),
# delete (waits until gone, so the name can be created again at once), and the broker's
# refusals (replication factor above the number of brokers, a topic that exists) exit 2 and
# change nothing.
set -euo pipefail
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/tests/realkafka/lib.sh"

oq_tmpdir
TP="onceq-topics-test-$$"
O=("$ONCEQ_BIN" topics --brokers "$BROKERS" --timeout 20s)
oq_on_exit "\"$ONCEQ_BIN\" topics delete --if-exists --brokers \"$BROKERS\" $TP.a $TP.b $TP.v >/dev/null 2>&1"
run() { # run WANT_RC CMD-ARGS...: output in $T/out and $T/err
    local want=$1 rc=0
    shift
    "${O[@]}" "$@" >"$T/out" 2>"$T/err" || rc=$?
    [[ $rc == "$want" ]] || { cat "$T/out" "$T/err"; oq_fail "topics $*: exit $rc, want $want"; }
}

run 0 create "$TP.a:3" "$TP.b" --retention 2h --min-insync-replicas 2
cat "$T/out"
grep -q "^created $TP.a partitions=3 replication-factor=3 min.insync.replicas=2 retention.ms=7200000$" "$T/out" ||
    oq_fail "create output for $TP.a"
grep -q "^created $TP.b partitions=6 " "$T/out" || oq_fail "create output for $TP.b"
# created means led: a produce right away must work
echo "k:v" | timeout 30 kcat -P -b "$BROKERS" -t "$TP.a" -K: -X acks=all || oq_fail "produce to the new topic failed"

run 0 describe "$TP.a"
cat "$T/out"
grep -q "^topic $TP.a partitions=3 replication-factor=3 min.insync.replicas=2 retention.ms=7200000 cleanup.policy=delete " "$T/out" ||
    oq_fail "describe text"
[[ $(grep -c "^  partition [0-2] leader=[1-9] replicas=[1-9],[1-9],[1-9] isr=" "$T/out") == 3 ]] ||
    oq_fail "describe: 3 led partitions with 3 replicas expected"
run 0 describe --json "$TP.b"
grep -q "\"name\":\"$TP.b\",\"exists\":true,\"partitions\":6,\"replication_factor\":3" "$T/out" ||
    { cat "$T/out"; oq_fail "describe --json"; }
grep -q '"retention.ms":"7200000"' "$T/out" || oq_fail "describe --json: retention.ms"

run 2 create "$TP.a"
grep -q "already exists" "$T/err" || oq_fail "exists: no clear message"
run 0 create --if-not-exists "$TP.a"
grep -q "^exists $TP.a" "$T/out" || oq_fail "--if-not-exists output"
run 2 create --replication-factor 4 --min-insync-replicas 2 "$TP.v"
cat "$T/err"
run 0 create --validate-only "$TP.v"
grep -q "^valid $TP.v" "$T/out" || oq_fail "--validate-only output"
run 4 describe "$TP.v"
grep -q "^topic $TP.v does not exist" "$T/out" || oq_fail "nothing may have been created by the refused or validate-only requests"
oq_pass "create/describe, refusals exit 2 and create nothing"

run 0 delete "$TP.a" "$TP.b"
grep -q "^deleted $TP.a" "$T/out" || oq_fail "delete output"
run 4 describe "$TP.a"
run 4 delete "$TP.a"
run 0 delete --if-exists "$TP.a"
run 0 create "$TP.a:2"
run 0 describe "$TP.a"
grep -q "^topic $TP.a partitions=2 " "$T/out" || oq_fail "re-created topic is not the new one"
run 0 delete "$TP.a"
oq_pass "delete waits until gone; the name can be created again at once"
