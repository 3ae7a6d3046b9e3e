#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# producer/examples/task_in_tx.c (libonceq's oq_producer_task_submit_in_tx and
# oq_store_task_get): an order and a two-step task (charge, then a receipt email citing the
# charge's id) commit together in the service's own SQLite transaction (one task, one first
# call, one outbox row; the same request again is a replay that writes nothing); then a
# pipeline on that very file (producer, relay, consumer) runs the task to succeeded, the
# receipt's subject carrying the charge id, one effect per step.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
oq_tmpdir
EX=$(oq_tool example_task_in_tx)
DB=$T/calls.db # pl_start's producer database
"$EX" "$DB" order-7 >"$T/run.out" 2>&1 || { cat "$T/run.out"; oq_fail "example_task_in_tx"; }
cat "$T/run.out"
grep -q '^order order-7: task t_[0-9a-f]* new (status running' "$T/run.out" &&
    grep -q '^order order-7: task t_[0-9a-f]* replayed' "$T/run.out" &&
    grep -q '^lookup by key: {"task_id":"t_' "$T/run.out" || oq_fail "example output"
q() { sqlite3 -cmd ".timeout 10000" "$DB" "$1"; }
[[ $(q "SELECT count(*) FROM orders") == 1 && $(q "SELECT count(*) FROM tasks") == 1 &&
    $(q "SELECT count(*) FROM calls") == 1 && $(q "SELECT count(*) FROM outbox") == 1 &&
    $(q "SELECT idem_key || ' ' || tenant FROM calls") == "order-7/charge shop" ]] ||
    oq_fail "rows after the example: $(q "SELECT idem_key, tenant, state FROM calls")"
oq_pass "C in-transaction task submit: order + task + first call + outbox row; replay wrote nothing"

pl_start 1
task() { curl -s "http://127.0.0.1:$PORT/v1/tasks/by-key/order-7?tenant=shop"; }
for ((i = 0; i < 600; i++)); do
    [[ $(task | jq -r .status) == succeeded ]] && break
    sleep 0.1
done
t=$(task)
[[ $(jq -r .status <<<"$t") == succeeded ]] || oq_fail "task: $t"
cid=$(jq -r '.steps[0].result.charge_id' <<<"$t")
[[ $cid == e_* ]] || oq_fail "charge result: $t"
[[ $(q "SELECT json_extract(args, '\$.subject') FROM calls WHERE idem_key='order-7/receipt'") == \
    "receipt for charge $cid" ]] || oq_fail "receipt args: $(q "SELECT args FROM calls")"
for k in order-7/charge order-7/receipt; do
    id=$(q "SELECT call_id FROM calls WHERE idem_key='$k'")
    [[ $(sqlite3 -cmd ".timeout 10000" "$CDB" "SELECT count(*) FROM effects WHERE call_id='$id'") == 1 ]] ||
        oq_fail "$k: effects"
done
oq_pass "the task submitted in the service's transaction ran: charge, then the receipt citing $cid, one effect each"
