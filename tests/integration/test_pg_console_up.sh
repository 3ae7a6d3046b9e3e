#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq up` on PostgreSQL starts its console on PostgreSQL too: the database string reaches the
# children in their environment (ONCEQ_DB, as `onceq up --db-url` hands it over), and the console
# child gets ONCEQ_PRODUCER_DB and ONCEQ_CONSUMER_DB, never --producer-db / --consumer-db nor the
# string in its argv; its calls page lists a call of that database; its tasks page lists a task
# of that database and shows that task's page (its step's call in the timeline), and an
# operator's decision on it from the console is refused or written on PostgreSQL.
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
# a task in PostgreSQL (its row written here: this `up` runs its producer on its own calls.db),
# whose step is the call above: the tasks page lists it with the counts, its page shows it
tid=t_0123456789abcdef0123456789abcdef
psql -XAtq "$URL" -c "INSERT INTO onceq.tasks(task_id,tenant,idem_key,fingerprint,spec,status,
    created_at,updated_at) VALUES('$tid','default','pg-console-task','f',
    '{\"steps\":[{\"name\":\"a\",\"tool\":\"pay\",\"args\":{}}]}','running',1,1);
    INSERT INTO onceq.task_steps(task_id,idx,name,status,call_id) VALUES('$tid',0,'a','running','$id');
    INSERT INTO onceq.task_calls VALUES('$id','$tid',0,'step')" >/dev/null || oq_fail "task rows"
curl -s "$U/api/tasks" | jq -e --arg id "$tid" '.supported and .tasks[0].task_id == $id and
    .counts.running == 1' >/dev/null ||
    oq_fail "the tasks page on PostgreSQL: $(curl -s "$U/api/tasks")"
code=$(curl -s -o "$T/task.json" -w '%{http_code}' "$U/api/tasks/$tid")
[[ $code == 200 ]] && jq -e --arg id "$tid" --arg c "$id" '.task.task_id == $id and
    .task.steps[0].call_id == $c and (.timeline | length) > 0' "$T/task.json" >/dev/null ||
    oq_fail "a task's page on PostgreSQL: HTTP $code $(cat "$T/task.json")"
code=$(curl -s -o /dev/null -w '%{http_code}' "$U/api/tasks/t_00000000000000000000000000000000")
[[ $code == 404 ]] || oq_fail "an unknown task's page on PostgreSQL: HTTP $code"
# an operator's decision on that task, on PostgreSQL (loopback, no tokens: the local user is
# the operator; the CSRF token from /api/me): refused while it runs, nothing written; once in
# review, settled as succeeded and audited with the console's operator
csrf=$(curl -s "$U/api/me" | jq -r .csrf)
decide() { # BODY: prints "STATUS CODE-OR-TASK-STATUS"
    local st
    st=$(curl -s -o "$T/dec.json" -w '%{http_code}' -X POST "$U/api/tasks/$tid/resolve" \
        -H 'Content-Type: application/json' -H "X-CSRF-Token: $csrf" -d "$1")
    echo "$st $(jq -r '.error // .status' "$T/dec.json")"
}
audits() { psql -XAtq "$URL" -c "SELECT count(*) FROM onceq.audit WHERE call_id='$tid'"; }
a0=$(audits)
got=$(decide '{"as":"approve","fence":0,"note":"x"}')
[[ $got == "409 not_awaiting_approval" ]] || oq_fail "approving a running task on PostgreSQL: $got"
[[ $(audits) == "$a0" ]] || oq_fail "a refused decision was audited"
psql -XAtq "$URL" -c "UPDATE onceq.tasks SET status='needs_review', review_fence=review_fence+1
    WHERE task_id='$tid'" >/dev/null || oq_fail "task into review"
fence=$(curl -s "$U/api/tasks/$tid" | jq -r .task.fence)
got=$(decide "{\"as\":\"succeeded\",\"fence\":$fence,\"note\":\"settled by hand\"}")
[[ $got == "200 succeeded" ]] || oq_fail "settling a task in review on PostgreSQL: $got"
[[ $(psql -XAtq "$URL" -c "SELECT status FROM onceq.tasks WHERE task_id='$tid'") == succeeded ]] ||
    oq_fail "the task's row after the decision"
psql -XAtq "$URL" -c "SELECT detail FROM onceq.audit WHERE call_id='$tid' AND event='task_review'" |
    grep -q '"by": *"console:' || oq_fail "the decision's audit on PostgreSQL"
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
