#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `onceq call`, the well-behaved client, against a real producer and against a scripted server
# (tests/tools/oq_http_stub): one key for every retry; a Retry-After (seconds, or an HTTP-date)
# is waited out, for the submit and for the polling; a Retry-After past the --timeout budget
# makes it give up at once instead of sleeping; https with a CA bundle, and a refused
# certificate is not retried; IPv6 (http://[::1]:port). A bearer token from --token-file or
# ONCEQ_TOKEN (never from argv) reaches a producer with --token-file, on the submit and the
# polls; the outcomes have their own exit codes: 6 failed, 7 needs_review, 8 gave up.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
oq_tmpdir
STUB=$(oq_tool oq_http_stub)
N=0

# stub SCRIPT [ARGS...]: start a scripted server; sets SURL (base URL without scheme/host) and
# SLOG (its request log).
stub() {
    local script=$1
    shift
    N=$((N + 1))
    SLOG=$T/stub$N.requests
    oq_spawn "stub$N" "$STUB" --script "$script" --log "$SLOG" "$@"
    oq_wait_for 10 grep -q '^port=' "$T/stub$N.log" || oq_fail "stub $N did not start"
    SPORT=$(sed -n 's/^port=//p' "$T/stub$N.log" | head -1)
}
# gap I J: ms between requests I and J (1-based) of $SLOG
gap() { awk -v i="$1" -v j="$2" 'NR==i{a=$1} NR==j{b=$1} END{print b-a}' "$SLOG"; }
call() { "$ONCEQ_BIN" call --tool charge --args '{"amount":1}' --backoff 1ms --max-backoff 1ms "$@"; }

# --- a real producer: accepted, then the same command is a replay of the same call ----------
PORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn producer "$ONCEQ_BIN" producer --db "$T/calls.db" --listen "127.0.0.1:$PORT"
oq_wait_for 15 curl -sf "http://127.0.0.1:$PORT/healthz" || oq_fail "producer did not come up"
call --url "http://127.0.0.1:$PORT/" --key real-1 --no-wait >"$T/c1.out" 2>"$T/c1.err" ||
    oq_fail "call to the producer: $(cat "$T/c1.err")"
grep -q '^accepted call_id=' "$T/c1.err" || oq_fail "first call not accepted: $(cat "$T/c1.err")"
ID1=$(jq -r .call_id "$T/c1.out")
call --url "http://127.0.0.1:$PORT" --key real-1 --no-wait >"$T/c2.out" 2>"$T/c2.err" ||
    oq_fail "replay: $(cat "$T/c2.err")"
grep -q "^replayed call_id=$ID1 " "$T/c2.err" || oq_fail "not a replay of $ID1: $(cat "$T/c2.err")"
call --url "http://127.0.0.1:$PORT" --key real-1 --args '{"amount":2}' --no-wait 2>"$T/c3.err"
[[ $? == 5 ]] || oq_fail "conflicting body: want exit 5: $(cat "$T/c3.err")"
oq_kill producer

# --- Retry-After in seconds: waited out, the key never changes --------------------------------
stub "503:ra=1,202"
call --url "http://127.0.0.1:$SPORT" --key ra-1 --no-wait >/dev/null 2>"$T/ra1.err" ||
    oq_fail "Retry-After 1: $(cat "$T/ra1.err")"
[[ $(wc -l <"$SLOG") == 2 ]] || oq_fail "Retry-After 1: want 2 requests: $(cat "$SLOG")"
[[ $(awk '{print $4}' "$SLOG" | sort -u) == ra-1 ]] || oq_fail "the key changed: $(cat "$SLOG")"
((($(gap 1 2)) >= 950)) || oq_fail "Retry-After 1 not waited out: gap $(gap 1 2) ms"

# --- Retry-After as an HTTP-date (2 s ahead, 1 s resolution: at least ~1 s) ------------------
stub "503:ra=date+2,202"
call --url "http://127.0.0.1:$SPORT" --key ra-2 --no-wait >/dev/null 2>"$T/ra2.err" ||
    oq_fail "Retry-After date: $(cat "$T/ra2.err")"
((($(gap 1 2)) >= 900)) || oq_fail "Retry-After date not waited out: gap $(gap 1 2) ms"

# --- Retry-After while polling: 202 pending, then 503 Retry-After 1, then 200 succeeded ------
stub "202,503:ra=1,200"
call --url "http://127.0.0.1:$SPORT" --key ra-3 --poll-interval 20ms >"$T/ra3.out" \
    2>"$T/ra3.err" || oq_fail "poll with Retry-After: $(cat "$T/ra3.err")"
[[ $(jq -r .status "$T/ra3.out") == succeeded ]] || oq_fail "poll result: $(cat "$T/ra3.out")"
[[ $(awk 'NR>1{print $2}' "$SLOG" | sort -u) == GET ]] || oq_fail "polls: $(cat "$SLOG")"
((($(gap 2 3)) >= 950)) || oq_fail "poll Retry-After not waited out: gap $(gap 2 3) ms"

# --- a Retry-After past the --timeout budget: give up now, do not sleep -----------------------
stub "503:ra=120"
t0=$SECONDS
call --url "http://127.0.0.1:$SPORT" --key ra-4 --no-wait --timeout 3s 2>"$T/ra4.err"
rc=$?
[[ $rc == 8 ]] || oq_fail "Retry-After past the budget: want exit 8 (gave up), got $rc"
((SECONDS - t0 <= 2)) || oq_fail "gave up only after $((SECONDS - t0)) s"
grep -q "past --timeout" "$T/ra4.err" || oq_fail "no give-up message: $(cat "$T/ra4.err")"
[[ $(wc -l <"$SLOG") == 1 ]] || oq_fail "retried past the budget: $(cat "$SLOG")"

# --- the outcomes have distinct exit codes ------------------------------------------------------
stub "202,200:st=failed"
call --url "http://127.0.0.1:$SPORT" --key ex-6 --poll-interval 20ms >/dev/null 2>"$T/ex6.err"
rc=$?
[[ $rc == 6 ]] || oq_fail "call ended failed: want exit 6, got $rc: $(cat "$T/ex6.err")"
stub "202,200:st=needs_review"
call --url "http://127.0.0.1:$SPORT" --key ex-7 --poll-interval 20ms >/dev/null 2>"$T/ex7.err"
rc=$?
[[ $rc == 7 ]] || oq_fail "call ended needs_review: want exit 7, got $rc: $(cat "$T/ex7.err")"
stub "503"
call --url "http://127.0.0.1:$SPORT" --key ex-8 --retry-budget 2 >/dev/null 2>"$T/ex8.err"
rc=$?
[[ $rc == 8 ]] || oq_fail "retry budget spent: want exit 8, got $rc: $(cat "$T/ex8.err")"
[[ $(wc -l <"$SLOG") == 3 ]] || oq_fail "retry budget 2: want 3 requests: $(cat "$SLOG")"
stub "202"
call --url "http://127.0.0.1:$SPORT" --key ex-8b --poll-interval 50ms --timeout 1s >"$T/ex8b.out" \
    2>"$T/ex8b.err"
rc=$?
[[ $rc == 8 ]] || oq_fail "still pending after --timeout: want exit 8, got $rc: $(cat "$T/ex8b.err")"
[[ $(jq -r .status "$T/ex8b.out") == pending ]] || oq_fail "gave up: last call $(cat "$T/ex8b.out")"
"$ONCEQ_BIN" call --help | grep -q "6 the call failed, 7 the call needs review" ||
    oq_fail "call --help does not document the exit codes"
oq_pass "exit codes: 6 failed, 7 needs_review, 8 gave up (budget, --timeout)"

# --- a bearer token: --token-file or ONCEQ_TOKEN, on the submit and every poll ----------------
TOKEN=tok-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s shop\n' "$TOKEN" >"$T/tokens"
printf '%s\n' "$TOKEN" >"$T/client.token"
chmod 600 "$T/tokens" "$T/client.token"
PORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn producer2 "$ONCEQ_BIN" producer --db "$T/calls2.db" --listen "127.0.0.1:$PORT" \
    --token-file "$T/tokens"
oq_wait_for 15 curl -sf "http://127.0.0.1:$PORT/healthz" || oq_fail "producer did not come up"
call --url "http://127.0.0.1:$PORT" --key tok-0 --no-wait 2>"$T/tok0.err"
rc=$?
[[ $rc == 2 ]] || oq_fail "no token against --token-file: want exit 2 (401), got $rc"
grep -q "HTTP 401" "$T/tok0.err" || oq_fail "no token: $(cat "$T/tok0.err")"
call --url "http://127.0.0.1:$PORT" --key tok-1 --no-wait --token-file "$T/client.token" \
    >"$T/tok1.out" 2>"$T/tok1.err" || oq_fail "--token-file: $(cat "$T/tok1.err")"
[[ $(jq -r .tenant "$T/tok1.out") == shop ]] || oq_fail "--token-file: $(cat "$T/tok1.out")"
ONCEQ_TOKEN=$TOKEN call --url "http://127.0.0.1:$PORT" --key tok-1 --no-wait >/dev/null \
    2>"$T/tok2.err" || oq_fail "ONCEQ_TOKEN: $(cat "$T/tok2.err")"
grep -q "^replayed call_id=" "$T/tok2.err" || oq_fail "ONCEQ_TOKEN: $(cat "$T/tok2.err")"
# the polls carry it too: wait until --timeout on a pending call, every GET answered 200
ONCEQ_TOKEN=$TOKEN call --url "http://127.0.0.1:$PORT" --key tok-2 --poll-interval 100ms \
    --timeout 1s >"$T/tok3.out" 2>"$T/tok3.err"
rc=$?
[[ $rc == 8 && $(jq -r .tenant "$T/tok3.out") == shop ]] ||
    oq_fail "polls with ONCEQ_TOKEN: exit $rc: $(cat "$T/tok3.err")"
oq_kill producer2
stub "202"
ONCEQ_TOKEN=$TOKEN call --url "http://127.0.0.1:$SPORT" --key tok-3 --poll-interval 20ms \
    --timeout 1s >/dev/null 2>&1
[[ $(awk '{print $5}' "$SLOG" | sort -u) == "Bearer_$TOKEN" ]] ||
    oq_fail "not every request carried the token: $(cat "$SLOG")"
(($(wc -l <"$SLOG") >= 2)) || oq_fail "no poll: $(cat "$SLOG")"
"$ONCEQ_BIN" call --url "http://127.0.0.1:1" --key x --tool charge --token "$TOKEN" 2>"$T/argv.err"
[[ $? == 2 ]] && grep -q "unknown setting" "$T/argv.err" || oq_fail "a token on argv was taken"
"$ONCEQ_BIN" call --url "http://127.0.0.1:1" --key x --tool charge --token-file "$T/nope" \
    2>"$T/nofile.err"
[[ $? == 2 ]] || oq_fail "missing --token-file: want exit 2"
printf 'bad token\n' >"$T/bad.token"
"$ONCEQ_BIN" call --url "http://127.0.0.1:1" --key x --tool charge --token-file "$T/bad.token" \
    2>"$T/badtok.err"
[[ $? == 2 ]] || oq_fail "a malformed token: want exit 2"
grep -q "bad token" "$T/badtok.err" && oq_fail "the token was printed: $(cat "$T/badtok.err")"
oq_pass "bearer token: --token-file and ONCEQ_TOKEN, submit and polls; never on argv"

# --- https with a CA bundle; an unverifiable certificate is not retried -----------------------
if openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" -keyout "$T/key.pem" \
    -out "$T/cert.pem" >/dev/null 2>&1; then
    stub "202" --tls-cert "$T/cert.pem" --tls-key "$T/key.pem"
    call --url "https://127.0.0.1:$SPORT" --key tls-1 --no-wait --cacert "$T/cert.pem" \
        >/dev/null 2>"$T/tls1.err" || oq_fail "https: $(cat "$T/tls1.err")"
    t0=$SECONDS
    call --url "https://127.0.0.1:$SPORT" --key tls-2 --no-wait --retry-budget 5 \
        --backoff 1s --max-backoff 1s 2>"$T/tls2.err"
    rc=$?
    [[ $rc == 1 ]] || oq_fail "untrusted certificate: want exit 1, got $rc"
    ((SECONDS - t0 <= 1)) || oq_fail "an untrusted certificate was retried"
    grep -q "retry" "$T/tls2.err" && oq_fail "untrusted certificate retried: $(cat "$T/tls2.err")"
    [[ $(grep -c tls- "$SLOG") == 1 ]] || oq_fail "https requests: $(cat "$SLOG")"
else
    oq_log "openssl cannot make a test certificate: https not checked"
fi

# --- IPv6 -------------------------------------------------------------------------------------
if ip -6 addr show lo 2>/dev/null | grep -q '::1'; then
    stub "202" --ipv6
    call --url "http://[::1]:$SPORT" --key v6-1 --no-wait >/dev/null 2>"$T/v6.err" ||
        oq_fail "IPv6: $(cat "$T/v6.err")"
    [[ $(wc -l <"$SLOG") == 1 ]] || oq_fail "IPv6 requests: $(cat "$SLOG")"
else
    oq_log "no IPv6 loopback: IPv6 not checked"
fi

# --- bad usage changes nothing ----------------------------------------------------------------
"$ONCEQ_BIN" call --url "ftp://127.0.0.1:1" --key x --tool charge 2>/dev/null
[[ $? == 2 ]] || oq_fail "ftp:// URL: want exit 2"
"$ONCEQ_BIN" call --url "http://127.0.0.1:1" --key $'a\r\nX-Injected: 1' --tool charge 2>/dev/null
[[ $? == 2 ]] || oq_fail "control characters in the key: want exit 2"
oq_pass "onceq call: one key, Retry-After (seconds, date, polling, budget), https, IPv6"
