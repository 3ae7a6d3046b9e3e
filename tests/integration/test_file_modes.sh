#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 14, item 5: databases, their -wal/-shm/-gate files and the logs of `onceq up`'s children are
# created owner-only (0600; the data directory 0700), under the usual umask 022, instead of
# 0644. (The embedded broker's bootstrap address file stays readable: kcat users read it.)
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
export ONCEQ_DB_GATE=1 # the writer gates (an option) are files beside the databases too
umask 022

mode_is() { # FILE WANT
    local m
    m=$(stat -c %a "$1" 2>/dev/null) || oq_fail "missing $1"
    [[ $m == "$2" ]] || oq_fail "$1 has mode $m, want $2"
}

# a database created by a command (and its WAL files, while a connection has them open)
"$ONCEQ_BIN" submit --db "$T/a.db" --key k1 --tool charge --args '{"amount":1}' >/dev/null 2>&1 ||
    oq_fail "submit failed"
mode_is "$T/a.db" 600
mode_is "$T/a.db-gate" 600 # the writer gate (docs/DESIGN.md, "Writers of one SQLite file")
for f in "$T"/a.db-wal "$T"/a.db-shm; do [[ -e $f ]] && mode_is "$f" 600; done

# onceq up: both databases, their WAL files, every child's log, the directory
PORT=$(oq_free_port)
D=$T/up
oq_spawn up "$ONCEQ_BIN" up --dir "$D" --listen "127.0.0.1:$PORT" --consumers 1 \
    -X session.timeout.ms=6000
oq_wait_for 30 curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/healthz" ||
    oq_fail "onceq up not healthy"
"$ONCEQ_BIN" call --url "http://127.0.0.1:$PORT" --key m1 --tool charge --args '{"amount":1}' \
    --timeout 60s >/dev/null 2>"$T/call.err" || oq_fail "call: $(tail -3 "$T/call.err")"
mode_is "$D" 700
n=0
for f in "$D"/calls.db "$D"/calls.db-wal "$D"/calls.db-shm "$D"/calls.db-gate "$D"/effects.db \
    "$D"/effects.db-wal "$D"/effects.db-shm "$D"/effects.db-gate "$D"/broker.log "$D"/producer.log "$D"/relay.log "$D"/consumer-1.log; do
    mode_is "$f" 600
    n=$((n + 1))
done
oq_log "$n files checked under $D: $(ls -l "$D" | tail -n +2 | awk '{print $1, $NF}' | tr '\n' ' ')"
((n >= 12)) || oq_fail "expected at least 12 files under $D, saw $n"
oq_kill up TERM
oq_pass "databases, WAL files, writer gates and logs are created 0600"
