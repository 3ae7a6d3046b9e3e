#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/pg.sh: a private cluster in a folder of its own, started as an unprivileged user on a
# free loopback port; the URL carries no password (libpq reads the passfile it names), no
# password in any process's command line or in the server's log; a second start is a no-op;
# stop ends the postmaster by its pid; a restart reuses the data.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    [[ "${CI:-}" == true ]] && oq_fail "PostgreSQL server binaries missing under CI=true"
    echo "SKIP: needs Debian's postgresql package"
    exit 77
fi
oq_tmpdir
D=$T/pg
chmod 711 "$T" # the server's unprivileged owner must reach D
PG="bash $ONCEQ_SRC/scripts/pg.sh"
oq_on_exit "$PG stop --dir $D >/dev/null 2>&1"
$PG start --dir "$D" 2>"$T/start.err" || { cat "$T/start.err"; oq_fail "pg.sh start"; }
URL=$($PG url --dir "$D")
oq_log "url: $URL"
PASS=$(cut -d: -f5- "$D/pgpass")
[[ -n "$PASS" ]] || oq_fail "no password in the passfile"
[[ "$URL" != *"$PASS"* ]] || oq_fail "the URL carries the password"
[[ "$URL" == postgresql://onceq@127.0.0.1:* ]] || oq_fail "not a loopback URL: $URL"
[[ "$(stat -c %a "$D/pgpass")" == 600 ]] || oq_fail "passfile mode is not 600"
[[ "$(psql -XAt "$URL" -c 'SELECT 40 + 2')" == 42 ]] || oq_fail "cannot connect with the URL"
PID=$($PG pid --dir "$D")
[[ -n "$PID" ]] || oq_fail "no pid"
if [[ $(id -u) -eq 0 ]]; then
    [[ "$(stat -c %U "/proc/$PID")" != root ]] || oq_fail "the server runs as root"
fi
# a wrong password is refused (scram on TCP)
printf '127.0.0.1:%s:*:onceq:wrong\n' "$(cat "$D/port")" >"$T/badpass"
chmod 600 "$T/badpass"
if PGPASSFILE=$T/badpass psql -XAt "${URL%%\?*}" -c 'SELECT 1' >/dev/null 2>&1; then
    oq_fail "a wrong password was accepted"
fi
# the password is in no command line and in no log
for p in $(pgrep -u "$(stat -c %U "/proc/$PID")" postgres || true); do
    ! tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$PASS" || oq_fail "password in pid $p's command line"
done
! grep -rqF -- "$PASS" "$D"/*.log "$T/start.err" || oq_fail "password in a log"
$PG start --dir "$D" 2>/dev/null || oq_fail "a second start failed"
[[ "$($PG pid --dir "$D")" == "$PID" ]] || oq_fail "a second start restarted the server"
psql -XAtq "$URL" -c 'CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)' || oq_fail "write"
$PG stop --dir "$D" 2>/dev/null
! kill -0 "$PID" 2>/dev/null || oq_fail "the postmaster is still running after stop"
$PG status --dir "$D" >/dev/null && oq_fail "status says running after stop"
$PG start --dir "$D" 2>/dev/null || oq_fail "restart"
URL=$($PG url --dir "$D")
[[ "$(psql -XAt "$URL" -c 'SELECT x FROM kept')" == 7 ]] || oq_fail "data lost across a restart"
oq_pass "pg.sh: private cluster, no password on a command line or in a log, stop by pid"
