#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The console's dead webhook deliveries (issue 21): a receiver that always answers 500 makes
# every delivery dead; the dead-letters route lists them as `onceq dlq list --webhooks-db`
# does, with the pending and dead counts; a tenant's token sees its own deliveries only; a
# call's page carries its deliveries (state, tries, last status). A redrive without the CSRF
# token, or by a tenant, is refused and changes nothing; with it, by an operator, it goes
# through oq_webhooks_redrive (the function of `onceq dlq redrive --webhooks-db`), is audited on
# the call with the operator's name, and the delivery is delivered once the receiver is fixed.
# ctest-cost: 60
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
TOOL="$ONCEQ_SRC/tests/tools/oq_webhook_check.py"
TRIES=2

oq_tmpdir
printf '%s\n' whsec_console_webhooks_0123456789 >"$T/secret"
chmod 600 "$T/secret"
RPORT=$(oq_free_port) || oq_fail "no free port"
echo 500 >"$T/status"
PL_PRODUCER_X=(--webhook-secret-file "$T/secret" --webhook-max-tries "$TRIES"
    --webhook-retry-base 100ms --webhook-retry-max 300ms)
pl_start 1
oq_spawn receiver "$PY" "$TOOL" receiver --port "$RPORT" --out "$T/received" \
    --status-file "$T/status"
oq_wait_for 10 curl -s -o /dev/null "http://127.0.0.1:$RPORT/" || true
for t in acme other; do
    n=2
    [[ $t == other ]] && n=1
    timeout 60 "$PY" "$TOOL" submit --url "http://127.0.0.1:$PORT" --n $n --prefix "$t" \
        --tenant "$t" --callback "http://127.0.0.1:$RPORT/hook" >"$T/ids.$t" 2>"$T/submit.err" ||
        oq_fail "submit: $(tail -3 "$T/submit.err")"
done
dead_count() { "$ONCEQ_BIN" dlq list --webhooks-db "$PDB" --json | jq length; }
all_dead() { [[ $(dead_count) == 3 ]]; }
oq_wait_for 90 all_dead || oq_fail "not 3 dead deliveries: $(dead_count)"

OPT=operator-token-0123456789
AT=tenant-acme-token-0123456
OT=tenant-other-token-01234
printf '%s ops operator\n%s acme\n%s other\n' "$OPT" "$AT" "$OT" >"$T/tokens"
chmod 600 "$T/tokens"
CPORT=$(oq_free_port)
U=http://127.0.0.1:$CPORT/api
oq_spawn console "$ONCEQ_BIN" console --producer-db "$PDB" --consumer-db "$CDB" \
    --listen "127.0.0.1:$CPORT" --token-file "$T/tokens"
A() { local tok=$1; shift; curl -s -H "Authorization: Bearer $tok" "$@"; }
oq_wait_for 15 A "$OPT" -f -o /dev/null "$U/me" || oq_fail "console did not come up"

# --- the list, the counts, the tenants ---------------------------------------------------------
A "$OPT" "$U/webhooks" >"$T/w.json"
[[ $(jq '.dead | length' "$T/w.json") == 3 && $(jq .dead_count "$T/w.json") == 3 &&
    $(jq .pending "$T/w.json") == 0 ]] || oq_fail "operator's list: $(cat "$T/w.json")"
jq -e --argjson t $TRIES 'all(.dead[]; .tries == $t and .last_status == 500 and
    (.url | endswith("/hook")) and (.call_id | startswith("c_")) and .created_at > 0)' \
    "$T/w.json" >/dev/null || oq_fail "a delivery's fields: $(cat "$T/w.json")"
"$ONCEQ_BIN" dlq list --webhooks-db "$PDB" --json | jq -S . >"$T/cli.json"
jq -S .dead "$T/w.json" | cmp -s - "$T/cli.json" ||
    oq_fail "differs from onceq dlq list --webhooks-db: $(diff <(jq -S .dead "$T/w.json") "$T/cli.json")"
A "$AT" "$U/webhooks" >"$T/wa.json"
[[ $(jq '.dead | length' "$T/wa.json") == 2 && $(jq '[.dead[] | select(.tenant != "acme")] |
    length' "$T/wa.json") == 0 && $(jq .pending "$T/wa.json") == null ]] ||
    oq_fail "tenant acme's list: $(cat "$T/wa.json")"
OID=$(jq -r '.dead[] | select(.tenant == "other") | .delivery_id' "$T/w.json")
OCALL=$(jq -r '.dead[] | select(.tenant == "other") | .call_id' "$T/w.json")
grep -q "$OID" "$T/wa.json" && oq_fail "tenant acme sees other's delivery"
code=$(A "$AT" -o /dev/null -w '%{http_code}' "$U/calls/$OCALL")
[[ $code == 404 ]] || oq_fail "tenant acme read other's call: HTTP $code"
oq_pass "dead deliveries listed as onceq dlq list --webhooks-db lists them, with counts; a tenant sees its own only"

# --- a call's page -----------------------------------------------------------------------------
ID=$(jq -r '.dead[] | select(.tenant == "acme") | .delivery_id' "$T/w.json" | head -1)
CALL=$(jq -r --arg id "$ID" '.dead[] | select(.delivery_id == $id) | .call_id' "$T/w.json")
A "$AT" "$U/calls/$CALL" >"$T/c.json"
jq -e --arg id "$ID" --argjson t $TRIES '.webhooks | length == 1 and .[0].delivery_id == $id and
    .[0].state == "dead" and .[0].tries == $t and .[0].last_status == 500' "$T/c.json" \
    >/dev/null || oq_fail "the call's webhooks: $(jq -c .webhooks "$T/c.json")"
oq_pass "a call's page shows its deliveries (state, tries, last status)"

# --- redrive -----------------------------------------------------------------------------------
echo 200 >"$T/status"
R() { A "$1" -o "$T/r.json" -w '%{http_code}' -X POST "${@:2}" "$U/webhooks/redrive" -d "{\"delivery_id\":\"$ID\"}"; }
code=$(R "$OPT")
[[ $code == 403 && $(jq -r .error "$T/r.json") == csrf ]] || oq_fail "redrive without CSRF: HTTP $code $(cat "$T/r.json")"
code=$(R "$OPT" -H "X-CSRF-Token: $(printf '0%.0s' {1..64})")
[[ $code == 403 ]] || oq_fail "redrive with a wrong CSRF token: HTTP $code"
acsrf=$(A "$AT" "$U/me" | jq -r .csrf)
code=$(R "$AT" -H "X-CSRF-Token: $acsrf")
[[ $code == 403 && $(jq -r .error "$T/r.json") == forbidden ]] || oq_fail "a tenant redrove: HTTP $code"
code=$(A "$OPT" -o /dev/null -w '%{http_code}' -X POST -H "X-CSRF-Token: $(A "$OPT" "$U/me" | jq -r .csrf)" \
    "$U/webhooks/redrive" -d '{"delivery_id":"all"}')
[[ $code == 400 ]] || oq_fail "delivery_id all: HTTP $code"
sleep 2
[[ $(dead_count) == 3 ]] || oq_fail "a refused redrive changed something: $(dead_count) dead"
[[ $(sqlite3 "$PDB" "SELECT count(*) FROM audit WHERE event='webhook_redriven'") == 0 ]] ||
    oq_fail "a refused redrive was audited"
csrf=$(A "$OPT" "$U/me" | jq -r .csrf)
code=$(R "$OPT" -H "X-CSRF-Token: $csrf")
[[ $code == 200 && $(jq -r .delivery_id "$T/r.json") == "$ID" ]] || oq_fail "redrive: HTTP $code $(cat "$T/r.json")"
ok_for() { jq -r 'select(.status == 200) | .key' "$T/received" | grep -qx "$1"; }
oq_wait_for 30 ok_for "$ID" || oq_fail "$ID not delivered after its redrive"
delivered() { [[ $(sqlite3 "$PDB" "SELECT state FROM webhook_deliveries WHERE delivery_id='$ID'") == delivered ]]; }
oq_wait_for 15 delivered || oq_fail "not marked delivered"
[[ $(dead_count) == 2 ]] || oq_fail "dead after the redrive: $(dead_count)"
a=$(sqlite3 "$PDB" "SELECT call_id, json_extract(detail, '\$.by'), json_extract(detail, '\$.delivery_id')
    FROM audit WHERE event='webhook_redriven'")
[[ $a == "$CALL|console:ops|$ID" ]] || oq_fail "audit: '$a'"
A "$OPT" "$U/calls/$CALL" >"$T/c.json"
jq -e '(.webhooks[0].state == "delivered") and ([.timeline[] | select(.event == "webhook_redriven")]
    | length == 1)' "$T/c.json" >/dev/null || oq_fail "the call's page after: $(cat "$T/c.json")"
code=$(R "$OPT" -H "X-CSRF-Token: $csrf")
[[ $code == 404 ]] || oq_fail "a second redrive of a delivered delivery: HTTP $code"
grep -q "delivery_id=$ID by=console:ops" "$T/console.log" || oq_fail "redrive not logged with the operator"
oq_pass "redrive from the console: refused without CSRF or by a tenant; done by oq_webhooks_redrive, audited with the operator, delivered"

# --- the page, in headless Chromium --------------------------------------------------------------
ID2=$(jq -r --arg id "$ID" '.dead[] | select(.tenant == "acme" and .delivery_id != $id) |
    .delivery_id' "$T/w.json")
ART=$ONCEQ_BUILD/console-webhooks-artefacts # test_console empties console-artefacts
mkdir -p "$ART"
timeout 180 "$PY" "$ONCEQ_SRC/tests/integration/console_webhooks_browser.py" \
    "http://127.0.0.1:$CPORT/" "$ART" "$OPT" "$AT" "$ID2" "$OID" || oq_fail "browser checks failed"
oq_wait_for 30 ok_for "$ID2" || oq_fail "$ID2 not delivered after its redrive from the page"
for p in dlq-webhooks dlq-webhooks-redriven tenant-dlq-webhooks; do
    [[ -s $ART/$p.png ]] || oq_fail "no screenshot $p.png"
done
oq_pass "browser: a tenant sees its own dead deliveries; the operator redrives one from the page (delivered); screenshots in $ART"
