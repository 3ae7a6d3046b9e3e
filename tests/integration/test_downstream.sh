#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq-downstream` (the test payment service, a program of its own) driven by the HTTP tool
# executor (consumer/http_tools.c through tests/tools/oq_http_exec_cli): keys honoured -> one effect for
# two calls with the same key; keys ignored -> two effects, and the ledger's duplicate counter
# sees them; drop-after-commit -> UNKNOWN while the ledger has the effect, and the lookup by key
# finds it; a late answer past the client's timeout -> UNKNOWN, effect present; 429 / 503 with
# Retry-After -> RETRYABLE_BEFORE_SEND with retry_after_ms; 500 -> UNKNOWN, nothing committed;
# final 4xx -> FINAL; connection refused (admin down, SIGUSR1/2) -> RETRYABLE_BEFORE_SEND;
# curl's silent resend on a dead kept-alive connection never happens (requests == calls);
# 256 calls in flight from one thread; seeded faults repeat; the ledger survives kill -9; the
# offline `stats` agrees with /ledger/stats; bad flags exit 2; `onceq downstream` (the old
# command) prints where the service went and exits 2.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir

CLI=$(oq_tool oq_http_exec_cli)
[[ -x "$CLI" ]] || oq_fail "missing $CLI"
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
DB=$T/ds.db
TOOLS=$T/tools.json

# The example tools file, aimed at our port, plus variants for the fault cases.
jq --arg u "127.0.0.1:$PORT" '
  .tools |= map(walk(if type == "string" then gsub("127.0.0.1:8090"; $u) else . end))
  | .tools += [
      (.tools[0] | .name = "pay_short" | .timeout_ms = 1000 | .connect_timeout_ms = 500),
      (.tools[0] | .name = "pay_ignored" | .headers = {"X-Downstream-Keys": "ignore"})
    ]' "$ONCEQ_SRC/examples/tools.json" >"$TOOLS" || oq_fail "cannot write $TOOLS"
"$CLI" --tools "$TOOLS" --check >/dev/null || oq_fail "tools file does not load"

start_ds() {
    oq_spawn ds "$ONCEQ_DOWNSTREAM_BIN" --listen "127.0.0.1:$PORT" --db "$DB" --seed 1 "$@"
    oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "downstream did not come up"
}
mode() { curl -sf -X POST "$URL/admin/mode" -d "$1" >/dev/null || oq_fail "admin mode $1"; }
# call TOOL ARGS EFFECT_ID [--lookup] -> one JSON outcome line in $OUT
call() {
    OUT=$("$CLI" --tools "$TOOLS" --tool "$1" --args "$2" --effect-id "$3" ${4:-}) ||
        oq_fail "executor failed: $1 $2 $3 ${4:-}"
}
expect() { # expect CLASS CODE-prefix what
    local cls code
    cls=$(jq -r .class <<<"$OUT")
    code=$(jq -r .code <<<"$OUT")
    [[ "$cls" == "$1" && "$code" == "$2"* ]] || oq_fail "$3: expected $1/$2, got $OUT"
}
effects_for_key() { curl -s -o /dev/null -D - "$URL/v1/payments?idempotency_key=$1" |
    tr -d '\r' | awk -F': ' 'tolower($1)=="x-match-count"{print $2}'; }
stat() { curl -sf "$URL/ledger/stats" | jq -r "$1"; }

start_ds

# --- keys honoured: two calls, one effect ------------------------------------------------------
call pay '{"amount":100}' k-honour
expect SUCCESS status_201 "first call"
ID1=$(jq -r .object_id <<<"$OUT")
[[ "$ID1" == pay_* ]] || oq_fail "no object id: $OUT"
call pay '{"amount":100}' k-honour
expect SUCCESS status_200 "same key again"
[[ "$(jq -r .object_id <<<"$OUT")" == "$ID1" ]] || oq_fail "replay gave another object: $OUT"
[[ "$(effects_for_key k-honour)" == 1 ]] || oq_fail "honoured key has $(effects_for_key k-honour) effects"
oq_pass "key honoured: two calls, one effect ($ID1)"

# --- keys ignored: two calls, two effects, counted as a duplicate ------------------------------
call pay_ignored '{"amount":100}' k-ignored
expect SUCCESS status_201 "ignored key, first"
A=$(jq -r .object_id <<<"$OUT")
call pay_ignored '{"amount":100}' k-ignored
expect SUCCESS status_201 "ignored key, second"
[[ "$(jq -r .object_id <<<"$OUT")" != "$A" ]] || oq_fail "ignored key replayed"
[[ "$(effects_for_key k-ignored)" == 2 ]] || oq_fail "ignored key: expected 2 effects"
[[ "$(stat .ledger.duplicate_effects)" == 1 ]] || oq_fail "duplicate counter: $(stat .ledger)"
[[ "$(stat '.ledger.keys.top_duplicates[0].key')" == k-ignored ]] ||
    oq_fail "top duplicates: $(stat .ledger.keys)"
oq_pass "key ignored: two effects, the duplicate counter sees one duplicate"

# --- drop after commit: UNKNOWN, the ledger has it, the lookup finds it ------------------------
mode '{"faults":"drop-after-commit:1"}'
call pay '{"amount":7}' k-drop
expect UNKNOWN closed_without_answer "drop-after-commit"
[[ "$(jq -r .sent <<<"$OUT")" == true ]] || oq_fail "dropped reply not marked sent: $OUT"
mode '{"faults":""}'
[[ "$(effects_for_key k-drop)" == 1 ]] || oq_fail "drop-after-commit: effect not in the ledger"
call pay '{"amount":7}' k-drop --lookup
expect FOUND status_200 "lookup by key"
[[ "$(jq -r .object_id <<<"$OUT")" == pay_* ]] || oq_fail "lookup gave no object id: $OUT"
call pay '{"amount":7}' k-never --lookup
expect ABSENT status_404 "lookup of an unknown key"
call pay_by_reference '{"amount":7}' k-drop --lookup
expect FOUND status_200 "lookup by reference (the effect id travels as the reference)"
mode '{"lookup":"off"}'
call pay '{"amount":7}' k-drop --lookup
expect UNDECIDED undeclared_status_501 "lookup switched off"
mode '{"lookup":"on"}'
oq_pass "drop-after-commit -> UNKNOWN, effect in the ledger, lookup FOUND; ABSENT and UNDECIDED"

# --- late answer past the client's timeout ------------------------------------------------------
mode '{"faults":"late-after-commit:1","late_ms":2500}'
call pay_short '{"amount":8}' k-late
expect UNKNOWN timeout_after_send "late-after-commit"
mode '{"faults":""}'
[[ "$(effects_for_key k-late)" == 1 ]] || oq_fail "late-after-commit: effect not in the ledger"
oq_pass "late answer -> UNKNOWN (timeout after send), effect committed"

# --- refusals before commit ---------------------------------------------------------------------
before=$(stat .ledger.effects)
mode '{"faults":"429:1","retry_after_s":2}'
call pay '{"amount":9}' k-429
expect RETRYABLE_BEFORE_SEND status_429 "429"
[[ "$(jq -r .retry_after_ms <<<"$OUT")" == 2000 ]] || oq_fail "429 without retry_after: $OUT"
mode '{"faults":"503:1","retry_after_s":1}'
call pay '{"amount":9}' k-503
expect RETRYABLE_BEFORE_SEND status_503 "503 + Retry-After"
[[ "$(jq -r .retry_after_ms <<<"$OUT")" == 1000 ]] || oq_fail "503 without retry_after: $OUT"
mode '{"faults":"500:1"}'
call pay '{"amount":9}' k-500
expect UNKNOWN undeclared_status_500 "undeclared 500"
mode '{"faults":"decline:1"}'
call pay '{"amount":9}' k-402
expect FINAL status_402 "declined"
mode '{"faults":""}'
call pay '{"amount":-1}' k-400
expect FINAL status_400 "bad amount"
call pay '{}' k-badargs
expect FINAL bad_args "missing template argument"
[[ "$(jq -r .sent <<<"$OUT")" == false ]] || oq_fail "bad args were sent: $OUT"
[[ "$(stat .ledger.effects)" == "$before" ]] || oq_fail "a refused request left an effect"
oq_pass "429/503 -> RETRYABLE_BEFORE_SEND with retry_after; 500 -> UNKNOWN; 4xx -> FINAL; nothing committed"

# --- connection refused -------------------------------------------------------------------------
curl -sf -X POST "$URL/admin/down" -d '{"ms":0}' >/dev/null || oq_fail "admin down"
oq_wait_for 10 bash -c "! curl -s -o /dev/null $URL/healthz" || oq_fail "still accepting"
call pay '{"amount":10}' k-down
expect RETRYABLE_BEFORE_SEND connect_failed "connection refused"
[[ "$(jq -r .sent <<<"$OUT")" == false ]] || oq_fail "refused connection marked sent: $OUT"
kill -USR2 "$(oq_pid ds)"
oq_wait_for 10 curl -sf "$URL/healthz" || oq_fail "did not listen again after SIGUSR2"
kill -USR1 "$(oq_pid ds)"
oq_wait_for 10 bash -c "! curl -s -o /dev/null $URL/healthz" || oq_fail "SIGUSR1 did not stop listening"
call pay '{"amount":10}' k-down
expect RETRYABLE_BEFORE_SEND connect_failed "connection refused (SIGUSR1)"
kill -USR2 "$(oq_pid ds)"
oq_wait_for 10 curl -sf "$URL/healthz" || oq_fail "did not listen again"
call pay '{"amount":10}' k-down
expect SUCCESS status_201 "after coming back"
oq_pass "connection refused -> RETRYABLE_BEFORE_SEND (not sent); back up -> SUCCESS"

# --- no silent resend on a dead kept-alive connection -------------------------------------------
# Keys ignored and half the replies dropped, 40 calls in sequence on one executor (its
# connections are reused): libcurl would resend a request whose reused connection died without
# an answer; the executor must not, so the service sees exactly one request per call.
req0=$(stat .requests.post_payment)
eff0=$(stat .ledger.effects)
mode '{"keys":"ignore","faults":"drop-after-commit:0.5","seed":11}'
"$CLI" --tools "$TOOLS" --tool pay --args '{"amount":1}' --count 40 --inflight 1 --prefix reuse \
    >"$T/reuse.json" || oq_fail "sequential run failed"
mode '{"keys":"honour","faults":""}'
unknown=$(jq -r '.by_class.UNKNOWN // 0' "$T/reuse.json")
req1=$(stat .requests.post_payment)
eff1=$(stat .ledger.effects)
((unknown > 0)) || oq_fail "no dropped replies in the sequential run: $(cat "$T/reuse.json")"
((req1 - req0 == 40)) || oq_fail "40 calls reached the service as $((req1 - req0)) requests"
((eff1 - eff0 == 40)) || oq_fail "40 calls made $((eff1 - eff0)) effects"
oq_pass "no silent resend: 40 calls ($unknown UNKNOWN) = 40 requests = 40 effects"

# --- negative control: a key-ignoring service declared idempotent shows duplicates --------------
dup0=$(stat .ledger.duplicate_effects)
mode '{"keys":"ignore","faults":"drop-after-commit:1"}'
call pay '{"amount":3}' k-neg
expect UNKNOWN closed_without_answer "negative control, first send"
mode '{"faults":""}'
call pay '{"amount":3}' k-neg # "safe by declaration" resend with the same key
expect SUCCESS status_201 "negative control, resend"
mode '{"keys":"honour"}'
[[ "$(effects_for_key k-neg)" == 2 ]] || oq_fail "negative control: expected 2 effects"
(($(stat .ledger.duplicate_effects) == dup0 + 1)) || oq_fail "negative control: duplicate not counted"
oq_pass "negative control: a false 'idempotent' declaration shows up as a duplicate in the ledger"

# --- 256 in flight from one thread -------------------------------------------------------------
eff0=$(stat .ledger.effects)
dup0=$(stat .ledger.duplicate_effects)
"$CLI" --tools "$TOOLS" --tool pay --args '{"amount":1}' --count 3000 --inflight 256 \
    --prefix par >"$T/par.json" || oq_fail "parallel run failed"
oq_log "256 in flight: $(cat "$T/par.json")"
[[ "$(jq -r '.by_class.SUCCESS' "$T/par.json")" == 3000 ]] || oq_fail "not all succeeded: $(cat "$T/par.json")"
[[ "$(jq -r .max_in_flight "$T/par.json")" == 256 ]] || oq_fail "never 256 in flight: $(cat "$T/par.json")"
(($(stat .ledger.effects) - eff0 == 3000)) || oq_fail "3000 calls, $(($(stat .ledger.effects) - eff0)) effects"
(($(stat .ledger.duplicate_effects) == dup0)) || oq_fail "duplicates in the parallel run"
oq_pass "256 calls in flight from one thread: 3000 SUCCESS, 3000 effects"

# --- seeded faults repeat -----------------------------------------------------------------------
pattern() {
    mode '{"keys":"ignore","faults":"429:0.5","seed":42}'
    local i s=
    for i in $(seq 1 16); do
        s+=$(curl -s -o /dev/null -w '%{http_code},' -X POST "$URL/v1/payments" -d '{"amount":1}')
    done
    mode '{"keys":"honour","faults":""}'
    echo "$s"
}
p1=$(pattern)
p2=$(pattern)
[[ "$p1" == "$p2" && "$p1" == *429* && "$p1" == *201* ]] || oq_fail "seeded faults differ: $p1 / $p2"
oq_pass "seeded faults repeat: $p1"

# --- durability and the offline stats -----------------------------------------------------------
online=$(curl -sf "$URL/ledger/stats" | jq -c '.ledger | {effects, logical_calls, duplicate_effects}')
oq_kill ds KILL
offline=$("$ONCEQ_DOWNSTREAM_BIN" stats --db "$DB" | jq -c '{effects, logical_calls, duplicate_effects}') ||
    oq_fail "offline stats failed"
[[ "$online" == "$offline" ]] || oq_fail "stats after kill -9 differ: online $online offline $offline"
jq -e '.dsr > 0' <<<"$("$ONCEQ_DOWNSTREAM_BIN" stats --db "$DB")" >/dev/null || oq_fail "no DSR"
oq_pass "ledger survives kill -9; offline stats = online stats: $offline"

# --- bad usage ----------------------------------------------------------------------------------
"$ONCEQ_DOWNSTREAM_BIN" --fault bogus:1 --db "$T/x.db" 2>"$T/err"
[[ $? == 2 ]] && grep -q "unknown fault 'bogus'" "$T/err" || oq_fail "--fault bogus: $(cat "$T/err")"
"$ONCEQ_DOWNSTREAM_BIN" --fault 429:0.7,503:0.7 --db "$T/x.db" 2>"$T/err"
[[ $? == 2 ]] && grep -q "sum to" "$T/err" || oq_fail "--fault sum: $(cat "$T/err")"
"$ONCEQ_DOWNSTREAM_BIN" --keys maybe 2>/dev/null
[[ $? == 2 ]] || oq_fail "--keys maybe accepted"
sqlite3 "$T/other.db" 'CREATE TABLE t(x)'
"$ONCEQ_DOWNSTREAM_BIN" stats --db "$T/other.db" 2>"$T/err"
[[ $? == 2 ]] && grep -q "not a downstream ledger" "$T/err" || oq_fail "stats on a non-ledger: $(cat "$T/err")"
"$ONCEQ_DOWNSTREAM_BIN" stats --db "$T/missing.db" 2>/dev/null
[[ $? == 1 ]] || oq_fail "stats on a missing file did not fail"
[[ ! -e "$T/x.db" ]] || oq_fail "a refused start created its ledger"
oq_pass "bad flags and bad files exit with clear errors"

# --- the old command points at the program ------------------------------------------------------
"$ONCEQ_BIN" downstream stats --db "$DB" >"$T/out" 2>"$T/err"
rc=$?
[[ $rc == 2 && ! -s "$T/out" && $(wc -l <"$T/err") == 1 ]] &&
    grep -q "moved to the onceq-downstream program" "$T/err" ||
    oq_fail "onceq downstream: exit $rc, stdout '$(cat "$T/out")', stderr '$(cat "$T/err")'"
"$ONCEQ_BIN" --help | grep -qE '^  downstream ' && oq_fail "onceq --help still lists downstream"
oq_pass "onceq downstream: one line pointing at onceq-downstream, exit 2"
