#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq up` on PostgreSQL starts its console on PostgreSQL too: the database string reaches the
# children in their environment (ONCEQ_DB, as `onceq up --db-url` hands it over), and the console
# child gets ONCEQ_PRODUCER_DB and ONCEQ_CONSUMER_DB, never --producer-db / --consumer-db nor the
# string in its argv; its calls page lists a call of that database; its tasks page says that
# tasks need the SQLite store (200, supported false; a task's page 501) rather than failing.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
URL=$(oq_pg_fresh_db "onceq_it_console_up_$$")
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "onceq migrate"
id=$("$ONCEQ_BIN" submit --db "$URL" --tool pay --key pg-console-up --args '{}' | jq -r .call_id)
[[ $id == c_* ]] || oq_fail "submit into PostgreSQL failed"
PORT=$(oq_free_port)
CPORT=$(oq_free_port)
D=$T/up
oq_spawn up env ONCEQ_DB="$URL" "$ONCEQ_BIN" up --dir "$D" --listen "127.0.0.1:$PORT" \
    --consumers 1 --console "127.0.0.1:$CPORT" -X session.timeout.ms=6000
U=http://127.0.0.1:$CPORT
oq_wait_for 60 curl -sf -o /dev/null "$U/api/me" || oq_fail "console not up: $(cat "$D/console.log" 2>/dev/null)"
[[ $(curl -s "$U/api/calls?q=pg-console-up" | jq -r '.calls[0].call_id') == "$id" ]] ||
    oq_fail "the console does not list $id of PostgreSQL: $(curl -s "$U/api/calls?q=pg-console-up")"
[[ $(curl -s "$U/api/calls/$id" | jq -r .call.call_id) == "$id" ]] || oq_fail "no timeline of $id"
# tasks exist on SQLite only: the tasks page says so rather than failing
curl -s "$U/api/tasks" | jq -e '.supported == false and (.message | contains("tasks need the SQLite store")) and .tasks == []' >/dev/null ||
    oq_fail "the tasks page on PostgreSQL: $(curl -s "$U/api/tasks")"
code=$(curl -s -o "$T/task.json" -w '%{http_code}' "$U/api/tasks/t_00000000000000000000000000000000")
[[ $code == 501 ]] && jq -e '.error == "tasks_unsupported_backend"' "$T/task.json" >/dev/null ||
    oq_fail "a task's page on PostgreSQL: HTTP $code $(cat "$T/task.json")"
cpid=
for p in $(pgrep -P "${OQ_PIDS[up]}"); do
    tr '\0' ' ' <"/proc/$p/cmdline" | grep -q " console " && cpid=$p
done
[[ -n $cpid ]] || oq_fail "no console child found"
args=$(tr '\0' ' ' <"/proc/$cpid/cmdline")
[[ $args != *postgres* && $args != *--producer-db* && $args != *--consumer-db* ]] ||
    oq_fail "the console's argv: $args"
tr '\0' '\n' <"/proc/$cpid/environ" | grep -qx "ONCEQ_PRODUCER_DB=$URL" || oq_fail "no ONCEQ_PRODUCER_DB in the console's environment"
tr '\0' '\n' <"/proc/$cpid/environ" | grep -qx "ONCEQ_CONSUMER_DB=$URL" || oq_fail "no ONCEQ_CONSUMER_DB in the console's environment"
oq_kill up
psql -XAtq "$ONCEQ_TEST_PG_URL" -c "DROP DATABASE IF EXISTS onceq_it_console_up_$$ WITH (FORCE)" >/dev/null 2>&1
oq_pass "onceq up on PostgreSQL: the console reads it from ONCEQ_PRODUCER_DB / ONCEQ_CONSUMER_DB, nothing in argv"
