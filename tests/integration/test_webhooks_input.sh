#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Webhooks (issue 21, item 3), bad input: a submit whose callback_url is not an http(s) URL
# with a host (another scheme, no host, user:password@, a space, over 2048 bytes, not a string)
# is 400 invalid_callback_url, and one whose tenant has no secret to sign with is 400
# webhook_secret_missing; nothing is written (no call, no key, no delivery). The tenant-wide
# callback_url of the token file applies when a submit names none; a replay with another
# callback_url keeps the first (the URL is not part of the fingerprint). `onceq submit
# --callback-url` refuses a bad URL (exit 2) and a token file with a bad callback_url= or two
# secrets for one tenant stops the producer at start (exit 2).
# ctest-cost: 15
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
PORT=$(oq_free_port) || oq_fail "no free port"
URL=http://127.0.0.1:$PORT
DB=$T/calls.db
start() {
    oq_spawn producer "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT" "$@"
    oq_wait_for 15 curl -sf "$URL/healthz" || oq_fail "producer did not come up"
}
# post KEY TOKEN BODY: prints "STATUS CODE" (CODE: the error code, or the call's callback_url)
post() {
    local auth=()
    [[ -n $2 ]] && auth=(-H "Authorization: Bearer $2")
    curl -s -o "$T/body" -w '%{http_code}' -X POST "$URL/v1/tool-calls" \
        -H "Idempotency-Key: $1" "${auth[@]}" -H 'Content-Type: application/json' -d "$3"
    printf ' %s\n' "$(jq -r '.error.code // .callback_url' "$T/body")"
}
calls() { sqlite3 "$DB" "SELECT count(*) FROM calls"; }

# 1. no secret anywhere: a callback cannot be signed
start
r=$(post k0 "" '{"tool":"charge","args":{},"callback_url":"http://127.0.0.1:9/h"}')
[[ $r == "400 webhook_secret_missing" ]] || oq_fail "no secret: $r"
[[ $(calls) == 0 ]] || oq_fail "a call was written"
oq_kill producer TERM

# 2. a default secret and a token file: tenant acme has a default callback_url
printf 'whsec_input_0123456789abcdef\n' >"$T/secret"
chmod 600 "$T/secret"
cat >"$T/tokens" <<TOK
acme-token-0123456789abcdef acme callback_url=http://127.0.0.1:9/acme webhook_secret=whsec_acme_0123456789ab
bare-token-0123456789abcdef bare
TOK
chmod 600 "$T/tokens"
start --webhook-secret-file "$T/secret" --token-file "$T/tokens"
LONG="http://127.0.0.1:9/$(head -c 2100 /dev/zero | tr '\0' a)"
i=0
for cb in '"ftp://127.0.0.1/h"' '"http://"' '"http:///path"' '"http://u:p@127.0.0.1/h"' \
    '"http://127.0.0.1/a b"' '"http://127.0.0.1/h#frag"' '"127.0.0.1/h"' '""' 42 null \
    "\"$LONG\""; do
    i=$((i + 1))
    r=$(post "bad-$i" bare-token-0123456789abcdef "{\"tool\":\"charge\",\"args\":{},\"callback_url\":$cb}")
    [[ $r == "400 invalid_callback_url" ]] || oq_fail "callback_url ${cb:0:40}: $r (want 400 invalid_callback_url)"
    code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer bare-token-0123456789abcdef' \
        "$URL/v1/tool-calls/by-key/bad-$i")
    [[ $code == 404 ]] || oq_fail "bad-$i: the key exists after a refusal ($code)"
done
[[ $(calls) == 0 ]] || oq_fail "calls written by refused submits: $(calls)"
[[ $(sqlite3 "$DB" "SELECT count(*) FROM webhook_deliveries") == 0 ]] || oq_fail "deliveries written"
oq_log "$i bad callback_url values refused with 400 invalid_callback_url, nothing written"

# the tenant's default applies; an explicit one wins
r=$(post a1 acme-token-0123456789abcdef '{"tool":"charge","args":{"amount":1}}')
[[ $r == "202 http://127.0.0.1:9/acme" ]] || oq_fail "tenant default: $r"
r=$(post a2 acme-token-0123456789abcdef \
    '{"tool":"charge","args":{"amount":1},"callback_url":"https://hooks.example.com/x?y=1"}')
[[ $r == "202 https://hooks.example.com/x?y=1" ]] || oq_fail "explicit: $r"
# bare has no secret of its own: the default secret signs
r=$(post b1 bare-token-0123456789abcdef \
    '{"tool":"charge","args":{"amount":2},"callback_url":"http://127.0.0.1:9/b"}')
[[ $r == "202 http://127.0.0.1:9/b" ]] || oq_fail "bare: $r"
# a replay with another callback_url: the same call, the first URL kept
r=$(post b1 bare-token-0123456789abcdef \
    '{"tool":"charge","args":{"amount":2},"callback_url":"http://127.0.0.1:9/other"}')
[[ $r == "202 http://127.0.0.1:9/b" ]] || oq_fail "replay: $r"
[[ $(calls) == 3 ]] || oq_fail "calls: $(calls)"
oq_kill producer TERM

# 3. onceq submit (the C API) refuses a bad URL; a good one is stored
"$ONCEQ_BIN" submit --db "$DB" --key s1 --tool charge --callback-url ftp://x/y >/dev/null 2>"$T/err"
[[ $? == 2 ]] || oq_fail "onceq submit --callback-url ftp://: exit code"
grep -q "http or https" "$T/err" || oq_fail "onceq submit: $(cat "$T/err")"
[[ $(calls) == 3 ]] || oq_fail "onceq submit wrote a call"
"$ONCEQ_BIN" submit --db "$DB" --key s2 --tool charge --callback-url http://127.0.0.1:9/s \
    >"$T/s2.json" 2>/dev/null || oq_fail "onceq submit --callback-url"
[[ $(jq -r .callback_url "$T/s2.json") == http://127.0.0.1:9/s ]] || oq_fail "s2: $(cat "$T/s2.json")"

# 4. a bad token file stops the producer at start
for bad in "t-0123456789abcdefgh acme callback_url=ftp://x/y" \
    "t-0123456789abcdefgh acme webhook_secret=short" \
    $'t-0123456789abcdefgh acme webhook_secret=whsec_one_0123456789\nu-0123456789abcdefgh acme webhook_secret=whsec_two_0123456789'; do
    printf '%s\n' "$bad" >"$T/badtokens"
    chmod 600 "$T/badtokens"
    timeout 20 "$ONCEQ_BIN" producer --db "$DB" --listen "127.0.0.1:$PORT" \
        --token-file "$T/badtokens" >"$T/bad.log" 2>&1
    rc=$?
    [[ $rc == 2 ]] || oq_fail "token file '${bad:0:50}': exit $rc (want 2): $(tail -2 "$T/bad.log")"
done
oq_pass "webhooks: bad callback_url refused with its code, nothing written"
