#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The review API on the consumer's admin listener is guarded (issue 17, item 2):
#  1. without --token-file, a non-loopback --metrics-listen is refused at start (exit 2), and
#     --metrics-only-listen serves /metrics there instead;
#  2. on a loopback listener without tokens, what a web page in a browser on the host can send
#     is refused and changes nothing: a text/plain resolve POST with a foreign Origin (403), the
#     same with a matching Origin but text/plain (415), and a foreign Host (DNS rebinding, 403);
#  3. with --token-file (the producer's format; `operator` as a third word grants the role):
#     no token -> 401, a tenant's token without the role -> 403, an operator token -> the
#     review is listed, shown and resolved (the execution leaves NEEDS_REVIEW).
# Against the code before the fix: the consumer starts on 0.0.0.0, the text/plain POST is
# obeyed, and --token-file is an unknown setting.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
CALL=c_0123456789abcdef0123456789abcdef
OP=op-token-0123456789abcdef
FP=1fbca8171c73d126765936754b934dd397f65bd2c6da0e1a75d6f7a68460a41f
TEN=tenant-token-0123456789abcdef

# --- 1. non-loopback without a token file ------------------------------------------------------
PORT=$(oq_free_port) || oq_fail "no free port"
timeout 20 "$ONCEQ_BIN" consumer --brokers 127.0.0.1:1 --db "$T/x.db" \
    --metrics-listen "0.0.0.0:$PORT" >"$T/nl.log" 2>&1
RC=$?
[[ $RC == 2 ]] || oq_fail "non-loopback --metrics-listen without --token-file: exit $RC, not 2: $(cat "$T/nl.log")"
grep -q 'needs --token-file' "$T/nl.log" || oq_fail "no clear error: $(cat "$T/nl.log")"
[[ ! -e "$T/x.db" ]] || oq_fail "the refused consumer created its database"

# a review row in NEEDS_REVIEW, as a worker would leave it
start_consumer() { # start_consumer NAME PORT [args...]
    local name=$1 port=$2
    shift 2
    oq_spawn "$name" "$ONCEQ_BIN" consumer --brokers 127.0.0.1:1 --db "$T/e.db" --no-relay \
        --metrics-listen "127.0.0.1:$port" "$@"
    oq_wait_for 20 curl -sf "http://127.0.0.1:$port/healthz" || oq_fail "$name did not come up"
}
state() { sqlite3 "$T/e.db" "SELECT state FROM executions WHERE call_id='$CALL'"; }
PORT=$(oq_free_port) || oq_fail "no free port"
MO=$(oq_free_port) || oq_fail "no free port"
start_consumer c1 "$PORT" --metrics-only-listen "0.0.0.0:$MO"
sqlite3 "$T/e.db" "INSERT INTO executions (call_id, tenant, idem_key, fingerprint, tool, args,
    state, attempt, tries, fence, message_id, created_at, updated_at)
    VALUES ('$CALL', 'shop', 'k1', '$FP', 'charge', '{\"amount\":1}', 'NEEDS_REVIEW', 1, 1, 3,
    'm_1', 1, 1)" || oq_fail "cannot insert the review row"
curl -sf "http://127.0.0.1:$MO/metrics" | grep -q '^onceq_build_info' ||
    oq_fail "--metrics-only-listen does not serve /metrics"
CODE=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$MO/v1/review")
[[ "$CODE" == 404 ]] || oq_fail "--metrics-only-listen serves /v1/review: $CODE"

# --- 2. what a browser page can send -----------------------------------------------------------
U=http://127.0.0.1:$PORT
RES='{"as":"committed","fence":3,"ref":"x","note":"from a web page"}'
CODE=$(curl -s -o "$T/b" -w '%{http_code}' -X POST "$U/v1/review/$CALL/resolve" \
    -H 'Content-Type: text/plain' -H 'Origin: http://evil.example' --data-binary "$RES")
[[ "$CODE" == 403 ]] || oq_fail "text/plain POST with a foreign Origin: $CODE $(cat "$T/b")"
CODE=$(curl -s -o "$T/b" -w '%{http_code}' -X POST "$U/v1/review/$CALL/resolve" \
    -H 'Content-Type: text/plain' -H "Origin: http://127.0.0.1:$PORT" --data-binary "$RES")
[[ "$CODE" == 415 ]] || oq_fail "text/plain POST: $CODE $(cat "$T/b")"
[[ "$(jq -r .error.code "$T/b")" == unsupported_media_type ]] || oq_fail "415 body: $(cat "$T/b")"
CODE=$(curl -s -o "$T/b" -w '%{http_code}' -X POST "$U/v1/review/$CALL/resolve" \
    -H 'Content-Type: application/json' -H 'Host: evil.example' --data-binary "$RES")
[[ "$CODE" == 403 ]] || oq_fail "a foreign Host (DNS rebinding): $CODE $(cat "$T/b")"
CODE=$(curl -s -o "$T/b" -w '%{http_code}' -H 'Host: evil.example:80' "$U/v1/review")
[[ "$CODE" == 403 ]] || oq_fail "GET with a foreign Host: $CODE"
[[ "$(state)" == NEEDS_REVIEW ]] || oq_fail "a refused request changed the review: $(state)"
CODE=$(curl -s -o /dev/null -w '%{http_code}' "$U/v1/review")
[[ "$CODE" == 200 ]] || oq_fail "loopback GET without tokens: $CODE"
oq_kill c1

# --- 3. tokens ---------------------------------------------------------------------------------
printf '# TOKEN TENANT [operator]\n%s ops operator\n%s shop\n' "$OP" "$TEN" >"$T/tokens"
chmod 600 "$T/tokens"
PORT=$(oq_free_port) || oq_fail "no free port"
U=http://127.0.0.1:$PORT
start_consumer c2 "$PORT" --token-file "$T/tokens"
H=(-H 'Content-Type: application/json')
CODE=$(curl -s -o "$T/b" -w '%{http_code}' -D "$T/h" "$U/v1/review")
[[ "$CODE" == 401 ]] || oq_fail "no token: $CODE $(cat "$T/b")"
grep -qi '^WWW-Authenticate: Bearer' "$T/h" || oq_fail "401 without WWW-Authenticate"
CODE=$(curl -s -o "$T/b" -w '%{http_code}' -X POST "${H[@]}" --data-binary "$RES" \
    "$U/v1/review/$CALL/resolve")
[[ "$CODE" == 401 ]] || oq_fail "resolve without a token: $CODE"
CODE=$(curl -s -o "$T/b" -w '%{http_code}' -H "Authorization: Bearer nope-nope-nope-nope-1" \
    "$U/v1/review")
[[ "$CODE" == 401 ]] || oq_fail "unknown token: $CODE"
CODE=$(curl -s -o "$T/b" -w '%{http_code}' -X POST "${H[@]}" -H "Authorization: Bearer $TEN" \
    --data-binary "$RES" "$U/v1/review/$CALL/resolve")
[[ "$CODE" == 403 && "$(jq -r .error.code "$T/b")" == forbidden ]] ||
    oq_fail "a tenant token without the operator role: $CODE $(cat "$T/b")"
CODE=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TEN" "$U/stats")
[[ "$CODE" == 403 ]] || oq_fail "/stats with a tenant token: $CODE"
[[ "$(state)" == NEEDS_REVIEW ]] || oq_fail "a refused request changed the review: $(state)"
CODE=$(curl -s -o /dev/null -w '%{http_code}' "$U/metrics")
[[ "$CODE" == 200 ]] || oq_fail "/metrics is not open: $CODE"
A=(-H "Authorization: Bearer $OP")
curl -s -o "$T/v_401" "$U/v1/review"
curl -s -o "$T/v_403" -H "Authorization: Bearer $TEN" "$U/v1/review"
curl -s -o "$T/v_415" -X POST "${A[@]}" --data-binary "$RES" "$U/v1/review/$CALL/resolve"
curl -sf -o "$T/v_list" "${A[@]}" "$U/v1/review" || oq_fail "operator list failed"
N=$(jq .count "$T/v_list")
[[ "$N" == 1 ]] || oq_fail "operator list: count $N"
curl -sf -o "$T/v_show" "${A[@]}" "$U/v1/review/$CALL" || oq_fail "operator show failed"
CODE=$(curl -s -o "$T/v_resolve" -w '%{http_code}' -X POST "${H[@]}" "${A[@]}" \
    --data-binary "$RES" "$U/v1/review/$CALL/resolve")
[[ "$CODE" == 200 ]] || oq_fail "operator resolve: $CODE $(cat "$T/v_resolve")"
[[ "$(state)" == COMMITTED ]] || oq_fail "after the operator's resolve: $(state)"
curl -s -o "$T/v_409" -X POST "${H[@]}" "${A[@]}" --data-binary "$RES" \
    "$U/v1/review/$CALL/resolve"
# the bodies against docs/openapi.yaml's review schemas
/usr/bin/python3 - "$ONCEQ_SRC/docs/openapi.yaml" "$T" <<'PY' || oq_fail "a review body does not match docs/openapi.yaml"
import json, sys, yaml, jsonschema
doc = yaml.safe_load(open(sys.argv[1]))
res = jsonschema.RefResolver.from_schema(doc)
def check(name, ref, code=None):
    body = json.load(open(sys.argv[2] + "/" + name))
    jsonschema.Draft202012Validator({"$ref": ref}, resolver=res).validate(body)
    if code:
        assert body["error"]["code"] == code, (name, body)
check("v_list", "#/components/schemas/ReviewList")
check("v_show", "#/components/schemas/ReviewShow")
check("v_resolve", "#/components/schemas/ResolveResult")
for n, c in (("v_401", "unauthorized"), ("v_403", "forbidden"), ("v_415", "unsupported_media_type"),
             ("v_409", "not_in_review")):
    check(n, "#/components/schemas/ReviewError", c)
PY
oq_kill c2

# a non-loopback address with a token file starts
PORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn c3 "$ONCEQ_BIN" consumer --brokers 127.0.0.1:1 --db "$T/e.db" --no-relay \
    --metrics-listen "0.0.0.0:$PORT" --token-file "$T/tokens"
oq_wait_for 20 curl -sf "http://127.0.0.1:$PORT/healthz" ||
    oq_fail "non-loopback with --token-file did not come up"
CODE=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/v1/review")
[[ "$CODE" == 401 ]] || oq_fail "non-loopback listener without a token: $CODE"
oq_pass "review API: loopback rule, Origin/Content-Type/Host checks, operator tokens"
