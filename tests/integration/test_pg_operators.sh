#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest-cost: 90
# The operators' tools on a PostgreSQL producer database (issue 18 x 21): producer and relay on
# ONCEQ_TEST_PG_URL (schema onceq), one consumer (SQLite) with HTTP tools against `onceq
# downstream`, and every operator flow the SQLite tests run, through the same functions:
#   - `onceq get` by id and by key (unknown: exit 4); `onceq stats` (--json: one document with
#     the relay's lease under "relay"; plain: the relay line);
#   - `onceq inspect --consumer-db` joins the producer's audit (read from PostgreSQL) with the
#     consumer's; unknown call: exit 4;
#   - review: `review show --producer-db URL` shows the producer's side; a stale fence is exit 9
#     from the CLI and 409 review_moved from the console (nothing written); the console's
#     resolve with the episode's fence settles the call on PostgreSQL, audited with the
#     operator's name;
#   - the console (--producer-db URL) over HTTP with curl: the calls page, its filters, search by
#     key and id, paging without a gap or a repeat, a call's timeline, the relay's dead rows as
#     `onceq dlq list --outbox-db URL` lists them, the DLQ topic's dead letter redriven (POST
#     with the CSRF token);
#   - `onceq purge --db URL`: a settled call past its key's expiry goes with its audit, a call
#     in review never does;
#   - a password in the connection string is refused (exit 2) before anything connects, and no
#     log line of the console carries the connection string.
# With OQ_OPS_CONSUMER=pg (test_pg_operators_consumer.sh) the consumer runs on the same PostgreSQL
# database (consumer_* tables) and every --consumer-db / review --db is the connection string:
# the consumer's side (review list/show/resolve, inspect's join, purge --consumer-db) goes
# through the consumer's store on PostgreSQL, the same code path as on SQLite.
# Skipped (77) without ONCEQ_TEST_PG_URL.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_require_pg
. "$ONCEQ_SRC/chaos/pipeline.sh"
. "$ONCEQ_SRC/tests/integration/realtools.sh"

CPG=${OQ_OPS_CONSUMER:-sqlite}
URL=$(oq_pg_fresh_db "onceq_it_operators_$CPG")
q() { psql -XAtq "$URL" -c "$1"; }
"$ONCEQ_BIN" migrate --db "$URL" >/dev/null || oq_fail "migrate"

rt_start_downstream
RT_VARIANTS='[
  {"name": "blind_drop", "url": "http://127.0.0.1:'$DPORT'/v1/payments",
   "body": {"amount": "{amount}"}, "idempotency_header": null,
   "headers": {"X-Downstream-Fault": "drop-after-commit"}}
]'
rt_tools "$T/tools.json"
PDB=$URL CDB=$T/effects.db PORT=$(oq_free_port)
XT=executions AT=audit
cq() { rt_cq "$1"; }
if [[ $CPG == pg ]]; then
    CDB=$URL XT=onceq.consumer_executions AT=onceq.consumer_audit
    cq() { q "$1"; }
fi
export PDB CDB PORT
PL_PRODUCER_X=(--purge-interval 0)
PL_CONSUMER_X+=(--tools "$T/tools.json" --lease 3s --recover-every 200ms)
oq_start_broker
pl_spawn_producer
pl_wait_healthy 30
pl_spawn_relay
pl_spawn_consumer 1

c_ok=$(rt_submit ok-1 pay '{"amount":7,"currency":"EUR","reference":"pg-ops-ok-1"}')
c_rev=$(rt_submit blind-1 blind_drop '{"amount":41}')
c_two=$(rt_submit ok-2 pay '{"amount":8,"currency":"EUR","reference":"pg-ops-ok-2"}')
[[ $c_ok == c_* && $c_rev == c_* && $c_two == c_* ]] || oq_fail "submits: $c_ok $c_rev $c_two"
rt_wait_status ok-1 succeeded 60 || oq_fail "ok-1: $(rt_call ok-1)"
rt_wait_status ok-2 succeeded 60 || oq_fail "ok-2: $(rt_call ok-2)"
rt_wait_status blind-1 needs_review 60 || oq_fail "blind-1: $(rt_call blind-1)"

# --- get, stats ---------------------------------------------------------------------------------
J=$("$ONCEQ_BIN" get --db "$URL" "$c_ok") || oq_fail "get by id on PostgreSQL"
jq -e --arg id "$c_ok" '.call_id == $id and .status == "succeeded"' <<<"$J" >/dev/null ||
    oq_fail "get: $J"
J=$("$ONCEQ_BIN" get --db "$URL" --key blind-1) || oq_fail "get by key on PostgreSQL"
[[ $(jq -r .call_id <<<"$J") == "$c_rev" ]] || oq_fail "get --key: $J"
"$ONCEQ_BIN" get --db "$URL" c_00000000000000000000000000000000 >/dev/null 2>&1
[[ $? == 4 ]] || oq_fail "get of an unknown call: want exit 4"
"$ONCEQ_BIN" stats --db "$URL" --json >"$T/stats.json" || oq_fail "stats --json on PostgreSQL"
[[ $(jq -s length "$T/stats.json") == 1 ]] || oq_fail "stats --json: not one document"
jq -e '.calls == 3 and .by_status.succeeded == 2 and .by_status.needs_review == 1 and
    .relay.pending == 0 and (.relay.leases | map(select(.name == "outbox" and .holder != null))
    | length) == 1' "$T/stats.json" >/dev/null || oq_fail "stats --json: $(cat "$T/stats.json")"
"$ONCEQ_BIN" stats --db "$URL" | grep -q '^relay: pending=0 .*lease=outbox .*holder=' ||
    oq_fail "plain stats: $("$ONCEQ_BIN" stats --db "$URL" 2>&1)"
oq_pass "get (id, key, unknown: 4) and stats (--json with the relay's lease) on PostgreSQL"

# --- inspect ------------------------------------------------------------------------------------
J=$("$ONCEQ_BIN" inspect --db "$URL" --consumer-db "$CDB" --json "$c_ok") || oq_fail "inspect --json"
jq -e --arg id "$c_ok" '.call.call_id == $id and .consumer.execution.state == "COMMITTED" and
    ([.timeline[] | select(.from == "producer" and (.event == "submitted" or .event == "succeeded"))]
    | length) == 2 and ([.timeline[] | select(.from == "consumer" and .event == "committed")]
    | length) >= 1 and ([.timeline[].ts] as $t | $t == ($t | sort))' <<<"$J" >/dev/null ||
    oq_fail "inspect --json: $J"
"$ONCEQ_BIN" inspect --db "$URL" --consumer-db "$CDB" "$c_ok" >"$T/inspect.txt" || oq_fail "inspect"
grep -q ' producer  succeeded' "$T/inspect.txt" && grep -q '^consumer  COMMITTED' "$T/inspect.txt" ||
    oq_fail "inspect text: $(cat "$T/inspect.txt")"
"$ONCEQ_BIN" inspect --db "$URL" c_00000000000000000000000000000000 >/dev/null 2>&1
[[ $? == 4 ]] || oq_fail "inspect of an unknown call: want exit 4"
oq_pass "inspect joins the producer's audit on PostgreSQL with the consumer's"

# --- review: show with the producer's side, a stale fence refused -------------------------------
F=$(cq "SELECT fence FROM $XT WHERE call_id='$c_rev'")
"$ONCEQ_BIN" review list --db "$CDB" --json |
    jq -e --arg c "$c_rev" --argjson f "$F" '.count == 1 and .review[0].call_id == $c and
    .review[0].fence == $f' >/dev/null || oq_fail "review list --json: $("$ONCEQ_BIN" review list --db "$CDB" --json 2>&1)"
"$ONCEQ_BIN" review show "$c_rev" --db "$CDB" --producer-db "$URL" >"$T/show.txt" ||
    oq_fail "review show --producer-db URL"
grep -q '^producer  needs_review' "$T/show.txt" && grep -q -- "--fence $F" "$T/show.txt" ||
    oq_fail "review show: $(cat "$T/show.txt")"
"$ONCEQ_BIN" review show "$c_rev" --db "$CDB" --producer-db "$URL" --json |
    jq -e '.producer.state == "needs_review" and (.producer.timeline | length) >= 1' >/dev/null ||
    oq_fail "review show --json: no producer side"
"$ONCEQ_BIN" review resolve "$c_rev" --db "$CDB" --as committed --fence $((F + 7)) \
    --note stale --by bob >/dev/null 2>"$T/err"
rc=$?
[[ $rc == 9 ]] && grep -q review_moved "$T/err" || oq_fail "stale fence: exit $rc $(cat "$T/err")"
oq_pass "review show merges the producer's side from PostgreSQL; a stale fence is exit 9"

# --- the console on PostgreSQL --------------------------------------------------------------------
# a dead outbox row of the relay, as the relay writes one when Kafka refuses a message for good
q "INSERT INTO onceq.outbox_dead(seq,message_id,topic,key,payload,created_at,reason,detail,dead_at)
   VALUES (999999,'m-dead-1','onceq.tool-calls','c_dead','{\"kind\":\"tool_call\"}',1,
   'MSG_SIZE_TOO_LARGE','too big',2)" || oq_fail "insert a dead row"
# and a message the consumer cannot decode, published by the relay: a DLQ topic dead letter
q "INSERT INTO onceq.outbox(message_id,topic,key,payload,created_at)
   VALUES ('m-garbage-1','onceq.tool-calls','c_garbage','not an envelope',1)" || oq_fail "outbox"
oq_wait_for 60 bash -c "'$ONCEQ_BIN' dlq list --json --brokers '$BROKERS' --timeout 5s 2>/dev/null |
    jq -e 'length == 1' >/dev/null" || oq_fail "no dead letter on the DLQ topic"

"$ONCEQ_BIN" console --producer-db "postgresql://onceq:secret@127.0.0.1:1/x" --listen 127.0.0.1:0 \
    >/dev/null 2>"$T/pw.err"
rc=$?
[[ $rc == 2 ]] && grep -q passfile "$T/pw.err" || oq_fail "console: a password in --producer-db: exit $rc $(cat "$T/pw.err")"
CPORT=$(oq_free_port)
U=http://127.0.0.1:$CPORT/api
oq_spawn console "$ONCEQ_BIN" console --producer-db "$URL" --consumer-db "$CDB" \
    --listen "127.0.0.1:$CPORT" --brokers "$BROKERS"
oq_wait_for 15 curl -sf -o /dev/null "$U/me" || oq_fail "console on PostgreSQL did not come up: $(cat "$T/console.log")"

curl -sf "$U/calls" >"$T/calls.json" || oq_fail "GET /api/calls"
[[ $(jq -c '[.calls[].call_id]' "$T/calls.json") == "$(jq -nc --arg a "$c_two" --arg b "$c_rev" \
    --arg c "$c_ok" '[$a,$b,$c]')" && $(jq .next "$T/calls.json") == null ]] ||
    oq_fail "calls page (newest first): $(cat "$T/calls.json")"
[[ $(curl -sf "$U/calls?status=succeeded" | jq -c '[.calls[].call_id] | sort') == \
    "$(jq -nc --arg a "$c_two" --arg c "$c_ok" '[$a,$c] | sort')" ]] || oq_fail "status filter"
[[ $(curl -sf "$U/calls?status=needs_review&tool=blind_drop" | jq -r '.calls | map(.call_id) | join(",")') == "$c_rev" ]] ||
    oq_fail "status + tool filter"
[[ $(curl -sf "$U/calls?tenant=nobody" | jq '.calls | length') == 0 ]] || oq_fail "tenant filter"
[[ $(curl -sf "$U/calls?q=ok-2" | jq -r '.calls[0].call_id') == "$c_two" ]] || oq_fail "search by key"
[[ $(curl -sf "$U/calls?q=$c_rev" | jq -r '.calls[0].idem_key') == blind-1 ]] || oq_fail "search by id"
now=$(($(date +%s) * 1000))
[[ $(curl -sf "$U/calls?since=$((now - 600000))&until=$now" | jq '.calls | length') == 3 &&
    $(curl -sf "$U/calls?until=$((now - 600000))" | jq '.calls | length') == 0 ]] ||
    oq_fail "time filters"
# paging one call at a time: every call once, in order, then no next
seen=() before=
for _ in 1 2 3 4 5; do
    P=$(curl -sf "$U/calls?limit=1${before:+&before=$before}") || oq_fail "page"
    seen+=($(jq -r '.calls[].call_id' <<<"$P"))
    before=$(jq -r .next <<<"$P")
    [[ $before == null ]] && break
done
[[ "${seen[*]}" == "$c_two $c_rev $c_ok" ]] || oq_fail "paging: ${seen[*]}"
J=$(curl -sf "$U/calls/$c_ok") || oq_fail "GET /api/calls/ID"
diff <(jq -S . <<<"$J") <("$ONCEQ_BIN" inspect --db "$URL" --consumer-db "$CDB" --json "$c_ok" | jq -S .) ||
    oq_fail "the call page differs from onceq inspect --json"
[[ $(curl -s -o /dev/null -w '%{http_code}' "$U/calls/c_00000000000000000000000000000000") == 404 ]] ||
    oq_fail "unknown call: want 404"
oq_pass "console on PostgreSQL: calls page, filters, search, paging, timeline = onceq inspect"

# the producer marks a dead row handled (its call failed as unpublishable) when it next looks:
# compare the two listings once that has happened, not across it
handled() { [[ $(q "SELECT handled_at IS NOT NULL FROM onceq.outbox_dead WHERE seq=999999") == t ]]; }
oq_wait_for 30 handled || oq_fail "the producer never handled the dead row"
curl -sf "$U/dlq" >"$T/d.json" || oq_fail "GET /api/dlq"
"$ONCEQ_BIN" dlq list --outbox-db "$URL" --json | jq -S 'map(del(.payload))' >"$T/rows.json" ||
    oq_fail "dlq list --outbox-db URL"
jq -S .outbox_dead "$T/d.json" | cmp -s - "$T/rows.json" || oq_fail "dead rows: $(diff <(jq -S .outbox_dead "$T/d.json") "$T/rows.json")"
jq -e '.[0].seq == 999999 and .[0].reason == "MSG_SIZE_TOO_LARGE"' \
    "$T/rows.json" >/dev/null || oq_fail "dead row: $(cat "$T/rows.json")"
"$ONCEQ_BIN" dlq show 999999 --outbox-db "$URL" | grep -q '^reason      MSG_SIZE_TOO_LARGE' ||
    oq_fail "dlq show SEQ --outbox-db URL"
[[ $(jq '.topic | length' "$T/d.json") == 1 ]] || oq_fail "DLQ topic: $(cat "$T/d.json")"
REF=$(jq -r '.topic[0].ref' "$T/d.json")
csrf=$(curl -sf "$U/me" | jq -r .csrf)
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$U/dlq/redrive" -d "{\"ref\":\"$REF\"}")
[[ $code == 403 ]] || oq_fail "redrive without CSRF: $code"
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST -H "X-CSRF-Token: $csrf" "$U/dlq/redrive" \
    -d "{\"ref\":\"$REF\"}")
[[ $code == 200 ]] || oq_fail "redrive: $code $(cat "$T/r.json")"
twice() { [[ $(curl -s "$U/dlq" | jq '[.topic[] | select(.redrive != null)] | length') == 1 ]]; }
oq_wait_for 60 twice || oq_fail "the redriven copy did not come back: $(curl -s "$U/dlq")"
oq_pass "dead letters: the relay's rows on PostgreSQL as onceq dlq lists them; a DLQ redrive from the console"

# resolve from the console: a stale fence is 409 and writes nothing; the episode's fence settles
audits=$(cq "SELECT count(*) FROM $AT WHERE call_id='$c_rev'")
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST -H "X-CSRF-Token: $csrf" \
    "$U/review/$c_rev/resolve" -d "{\"as\":\"committed\",\"ref\":\"pay_x\",\"note\":\"seen\",\"fence\":$((F + 7))}")
[[ $code == 409 && $(jq -r .error "$T/r.json") == review_moved ]] || oq_fail "stale fence: $code $(cat "$T/r.json")"
[[ $(cq "SELECT count(*) FROM $AT WHERE call_id='$c_rev'") == "$audits" ]] || oq_fail "a refused resolve wrote audit"
code=$(curl -s -o "$T/r.json" -w '%{http_code}' -X POST -H "X-CSRF-Token: $csrf" \
    "$U/review/$c_rev/resolve" -d "{\"as\":\"committed\",\"ref\":\"pay_x\",\"note\":\"seen in the ledger\",\"fence\":$F}")
[[ $code == 200 ]] || oq_fail "resolve: $code $(cat "$T/r.json")"
rt_wait_status blind-1 succeeded 30 || oq_fail "blind-1 after the resolve: $(rt_call blind-1)"
J=$(curl -sf "$U/calls/$c_rev")
jq -e '.call.status == "succeeded" and ([.timeline[] | select(.from == "consumer" and
    .event == "review_resolved" and (.worker | startswith("review:console:")))] | length) == 1 and
    ([.timeline[] | select(.from == "producer" and .event == "succeeded")] | length) == 1' \
    <<<"$J" >/dev/null || oq_fail "the resolution's audit: $J"
! grep -qE 'passfile=|postgres(ql)?://' "$T/console.log" || oq_fail "the connection string is in the console's log"
oq_pass "resolve from the console: 409 review_moved on a stale fence; the fence's episode settles the call on PostgreSQL, audited as console:NAME"

# --- purge ----------------------------------------------------------------------------------------
q "UPDATE onceq.calls SET expires_at = 1 WHERE call_id IN ('$c_ok')" || oq_fail "expire ok-1"
c_new=$(rt_submit held-1 blind_drop '{"amount":5}')
rt_wait_status held-1 needs_review 60 || oq_fail "held-1: $(rt_call held-1)"
q "UPDATE onceq.calls SET expires_at = 1 WHERE call_id = '$c_new'" || oq_fail "expire held-1"
P=$("$ONCEQ_BIN" purge --db "$URL" --key-ttl 1h) || oq_fail "purge --db URL"
jq -e '.calls == 1 and .audit >= 1' <<<"$P" >/dev/null || oq_fail "purge: $P"
"$ONCEQ_BIN" get --db "$URL" "$c_ok" >/dev/null 2>&1
[[ $? == 4 ]] || oq_fail "the purged call is still there"
[[ $(q "SELECT count(*) FROM onceq.audit WHERE call_id='$c_ok'") == 0 ]] || oq_fail "its audit stayed"
"$ONCEQ_BIN" get --db "$URL" "$c_new" | jq -e '.status == "needs_review"' >/dev/null ||
    oq_fail "a call in review was purged"
P=$("$ONCEQ_BIN" purge --consumer-db "$CDB" --retention 1s --inbox-retention 1s) ||
    oq_fail "purge --consumer-db"
jq -e '.consumer_db == true and .executions >= 1' <<<"$P" >/dev/null || oq_fail "purge --consumer-db: $P"
[[ $(cq "SELECT count(*) FROM $XT WHERE call_id='$c_two'") == 0 &&
    $(cq "SELECT state FROM $XT WHERE call_id='$c_new'") == NEEDS_REVIEW ]] ||
    oq_fail "consumer purge: settled execution kept or the one in review deleted"
oq_pass "purge on PostgreSQL: the expired settled call and its audit go, a call in review stays (consumer: $CPG)"

# --- bad settings ---------------------------------------------------------------------------------
for cmd in "get --db postgresql://onceq:secret@127.0.0.1:1/x $c_two" \
    "stats --db postgresql://onceq:secret@127.0.0.1:1/x" \
    "dlq list --outbox-db postgresql://onceq:secret@127.0.0.1:1/x" \
    "inspect --db $URL --consumer-db postgresql://onceq:secret@127.0.0.1:1/x $c_two" \
    "review list --db postgresql://onceq:secret@127.0.0.1:1/x"; do
    # shellcheck disable=SC2086
    "$ONCEQ_BIN" $cmd >/dev/null 2>"$T/pw.err"
    rc=$?
    [[ $rc == 2 ]] && grep -q passfile "$T/pw.err" && ! grep -q secret "$T/pw.err" ||
        oq_fail "onceq $cmd: exit $rc $(cat "$T/pw.err")"
done
oq_pass "a password in a connection string is refused (exit 2) and never echoed"
