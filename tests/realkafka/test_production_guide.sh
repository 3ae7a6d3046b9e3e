#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The production guide, run as written: scripts/production-setup.sh (which README.md quotes
# verbatim: checked here) against an install prefix: the onceq user (systemd-sysusers --root),
# /etc/onceq (shared settings with the brokers for every unit, the producer's listen address,
# the tools file), `onceq topics create`, then the installed units in their start order,
# and a readiness check. Then one call goes through to the end: an HTTP tool `pay` at
# `onceq-downstream` (the tools file reaches the consumers as a credential), submitted with
# `onceq call`, `succeeded`, one payment in the downstream's ledger, `onceq verify` clean.
#
# systemd is not PID 1 here: `systemctl` is tests/integration/unitrun.py, which starts each
# unit's ExecStart= from the installed unit file with its Environment=, EnvironmentFile=,
# LoadCredential= (%d, $CREDENTIALS_DIRECTORY), specifiers and Type=notify readiness, as
# systemd would, but without User= and the sandbox (integration.test_service_units checks
# those with systemd-analyze); /etc/onceq and /var/lib/onceq are moved under the test's
# folder. On real Kafka (ONCEQ_TEST_BROKERS, scripts/test-real-kafka.sh) the script creates
# its topics under a prefix of its own (RF 3); without it the test runs on the embedded
# broker, which makes its topics itself (OQ_CREATE_TOPICS=no: it has no admin API).
# ctest-cost: 70
set -euo pipefail
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
P=$T/prefix
R=$T/root
U=$T/units
cmake --install "$ONCEQ_BUILD" --prefix "$P" >"$T/install.log" 2>&1 ||
    { cat "$T/install.log" >&2; oq_fail "cmake --install failed"; }

# README.md quotes the guide part of the script verbatim.
guide() { sed -n '/^# --- guide begin/,/^# --- guide end/p' "$1"; }
guide "$ONCEQ_SRC/scripts/production-setup.sh" >"$T/guide.script"
guide "$ONCEQ_SRC/README.md" >"$T/guide.readme"
[ -s "$T/guide.script" ] || oq_fail "scripts/production-setup.sh has no guide part"
diff "$T/guide.script" "$T/guide.readme" >"$T/guide.diff" ||
    oq_fail "README.md does not quote scripts/production-setup.sh verbatim:
$(cat "$T/guide.diff")"
oq_pass "README.md quotes the production steps of scripts/production-setup.sh verbatim"

if oq_real_kafka; then
    oq_start_broker # sets BROKERS; the onceq. topics are left alone, the script makes its own
    TP="onceq-prod-$$."
    CREATE=yes
    oq_on_exit "\"$ONCEQ_BIN\" topics delete --if-exists --brokers \"$BROKERS\" ${TP}tool-calls ${TP}tool-results ${TP}dlq >/dev/null 2>&1"
else
    oq_start_broker
    TP=onceq.
    CREATE=no
fi

# Units are killed by pid (each leads its own session) before the lib's cleanup.
stop_units() {
    local f pid
    for f in "$U"/*.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        kill -TERM -- "-$pid" 2>/dev/null || true
    done
    for _ in $(seq 1 100); do
        local alive=0
        for f in "$U"/*.pid; do [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && return 0
        sleep 0.1
    done
    for f in "$U"/*.pid; do [ -f "$f" ] && kill -KILL -- "-$(cat "$f")" 2>/dev/null; done
    return 0
}
oq_on_exit stop_units

DPORT=$(oq_free_port)
oq_spawn downstream "$ONCEQ_DOWNSTREAM_BIN" --listen "127.0.0.1:$DPORT" --db "$T/downstream.db"
oq_wait_for 20 curl -sf "http://127.0.0.1:$DPORT/healthz" -o /dev/null ||
    oq_fail "downstream did not start"
# The tools file: examples/tools.json's `pay` (keys honoured, lookup by key) at this port.
jq --arg p "$DPORT" '{version: 1, tools: [.tools[] | select(.name == "pay")
    | .url |= sub("8090"; $p) | .lookup.url |= sub("8090"; $p)]}' \
    "$ONCEQ_SRC/examples/tools.json" >"$T/tools.json"

PORT=$(oq_free_port)
mkdir -p "$R/etc"
if command -v systemd-sysusers >/dev/null; then
    SYSUSERS="systemd-sysusers --root=$R"
else
    SYSUSERS=true
    echo "NOTE: systemd-sysusers not found: the user step is not run"
fi
run_guide() {
    env OQ_PREFIX="$P" OQ_BROKERS="$BROKERS" OQ_TOOLS="$T/tools.json" OQ_CONSUMERS=2 \
        OQ_LISTEN="127.0.0.1:$PORT" OQ_TOPIC_PREFIX="$TP" OQ_CREATE_TOPICS="$CREATE" \
        OQ_ETC="$R/etc/onceq" SYSUSERS="$SYSUSERS" \
        SYSTEMCTL="python3 $ONCEQ_SRC/tests/integration/unitrun.py" \
        UNITRUN_DIR="$U" UNITRUN_ROOT="$R" UNITRUN_PATH="$P/lib/systemd/system" \
        timeout 300 bash "$ONCEQ_SRC/scripts/production-setup.sh"
}
run_guide >"$T/setup.out" 2>&1 || {
    cat "$T/setup.out" >&2
    for f in "$U"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }; done
    oq_fail "scripts/production-setup.sh failed"
}
cat "$T/setup.out"
export UNITRUN_DIR=$U UNITRUN_ROOT=$R
for u in onceq-producer onceq-relay onceq-consumer@1 onceq-consumer@2; do
    python3 "$ONCEQ_SRC/tests/integration/unitrun.py" is-active "$u.service" ||
        oq_fail "$u.service is not running: $(tail -5 "$U/$u.service.log")"
done
[ "$SYSUSERS" = true ] || grep -q '^onceq:' "$R/etc/passwd" || oq_fail "no onceq user"
for f in onceq.env onceq-producer.env tools.json; do
    [ "$(stat -c %a "$R/etc/onceq/$f")" = 600 ] || oq_fail "/etc/onceq/$f is not 0600"
done
grep -qx "ONCEQ_BROKERS=$BROKERS" "$R/etc/onceq/onceq.env" || oq_fail "onceq.env lacks the brokers"
grep -q 'http_tools=1' "$U/onceq-consumer@1.service.log" ||
    oq_fail "consumer 1 did not load the tools credential: $(grep 'worker started' "$U/onceq-consumer@1.service.log")"
[ "$(stat -c %a "$U/credentials/onceq-consumer@1.service/tools.json")" = 400 ] ||
    oq_fail "the credential copy is not 0400"
if [ "$CREATE" = yes ]; then
    "$ONCEQ_BIN" topics describe --brokers "$BROKERS" --topic-prefix "$TP" >"$T/topics.out" ||
        oq_fail "the script's topics do not exist"
    grep -c "^topic ${TP}" "$T/topics.out" | grep -qx 3 || oq_fail "not 3 topics: $(cat "$T/topics.out")"
fi
oq_pass "production-setup.sh: user, 0600 settings, topics, producer -> relay -> consumer@1,2 ready; the consumers read the tools file as a credential"

# One call to the end.
KEY="prod-guide-$$"
"$P/bin/onceq" call --url "http://127.0.0.1:$PORT" --key "$KEY" --tool pay \
    --args '{"amount":1999,"currency":"EUR"}' --timeout 120s >"$T/call.out" 2>"$T/call.err" ||
    { cat "$T/call.out" "$T/call.err" >&2; oq_fail "onceq call did not end in succeeded"; }
jq -e '.status == "succeeded" and (.effect_id | length > 0)' "$T/call.out" >/dev/null ||
    oq_fail "call: $(cat "$T/call.out")"
"$P/bin/onceq" verify --producer-db "$R/var/lib/onceq/calls.db" \
    --consumer-db "$R/var/lib/onceq/effects.db" --downstream-db "$T/downstream.db" \
    >"$T/verify.out" 2>&1 || { cat "$T/verify.out" >&2; oq_fail "onceq verify failed"; }
oq_pass "a pay call through the installed units: succeeded (results read back by the producer), verify clean with the downstream's ledger"

# Run twice: the same outcome, nothing created again.
run_guide >"$T/setup2.out" 2>&1 || { cat "$T/setup2.out" >&2; oq_fail "a second run failed"; }
"$P/bin/onceq" call --url "http://127.0.0.1:$PORT" --key "$KEY" --tool pay \
    --args '{"amount":1999,"currency":"EUR"}' --timeout 60s >"$T/call2.out" 2>"$T/call2.err" ||
    oq_fail "the replay failed: $(cat "$T/call2.out")"
[ "$(jq -r .call_id "$T/call2.out")" = "$(jq -r .call_id "$T/call.out")" ] ||
    oq_fail "the replay is another call"
oq_pass "a second run of the script changes nothing; the same key is the same call"

# Backup while running (README "Backup and restore"), then a restore of effects.db.
V=$R/var/lib/onceq
CID=$(jq -r .call_id "$T/call.out")
umask 077
sqlite3 "$V/calls.db" ".backup $T/calls-copy.db" || oq_fail "sqlite3 .backup of a live calls.db"
sqlite3 "$V/effects.db" "VACUUM INTO '$T/effects-copy.db'" || oq_fail "VACUUM INTO of a live effects.db"
umask 022
[ "$(sqlite3 "$T/calls-copy.db" 'PRAGMA integrity_check')" = ok ] || oq_fail "calls copy damaged"
[ "$(sqlite3 "$T/effects-copy.db" 'PRAGMA integrity_check')" = ok ] || oq_fail "effects copy damaged"
[ "$(sqlite3 "$T/calls-copy.db" "SELECT state FROM calls WHERE call_id = '$CID'")" = succeeded ] ||
    oq_fail "the calls copy lacks the call"
[ "$(sqlite3 "$T/effects-copy.db" "SELECT count(*) FROM effects WHERE call_id = '$CID'")" = 1 ] ||
    oq_fail "the effects copy lacks the effect"
[ ! -e "$T/effects-copy.db-wal" ] && [ "$(stat -c %a "$T/effects-copy.db")" = 600 ] ||
    oq_fail "the copy is not one owner-only file"
for u in onceq-consumer@2 onceq-consumer@1; do
    python3 "$ONCEQ_SRC/tests/integration/unitrun.py" stop "$u.service"
done
mkdir "$T/damaged"
mv "$V/effects.db" "$V"/effects.db-* "$T/damaged/" 2>/dev/null || true
cp "$T/effects-copy.db" "$V/effects.db"
python3 "$ONCEQ_SRC/tests/integration/unitrun.py" start onceq-consumer@1.service \
    onceq-consumer@2.service >/dev/null || oq_fail "consumers did not start on the restored copy"
"$P/bin/onceq" call --url "http://127.0.0.1:$PORT" --key "$KEY-2" --tool pay \
    --args '{"amount":500,"currency":"EUR"}' --timeout 120s >"$T/call3.out" 2>"$T/call3.err" ||
    { cat "$T/call3.out" "$T/call3.err" >&2; oq_fail "a call after the restore failed"; }
"$P/bin/onceq" verify --producer-db "$V/calls.db" --consumer-db "$V/effects.db" \
    --downstream-db "$T/downstream.db" >"$T/verify2.out" 2>&1 ||
    { cat "$T/verify2.out" >&2; oq_fail "onceq verify after the restore failed"; }
oq_pass "backups of the live databases (.backup, VACUUM INTO: whole, 0600), effects.db restored from its copy, the next call succeeds, verify clean"

for u in onceq-consumer@2 onceq-consumer@1 onceq-relay onceq-producer; do
    python3 "$ONCEQ_SRC/tests/integration/unitrun.py" stop "$u.service"
done
oq_pass "units stopped with SIGTERM"
