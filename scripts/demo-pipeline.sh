#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The demo on the compiled tools (./quickstart's demo before scripts/demo.sh, which runs real
# HTTP tools; kept for its duplicate and conflict): start the whole pipeline with `onceq up`,
# submit a few tool calls over HTTP with curl (including a duplicate: same key + same body ->
# the same call_id, and a conflict: same key + another body -> 422), wait until they are
# terminal, print their end states and the `onceq verify` report, then stop `onceq up` by pid.
# Bounded in time (about 60 s at worst); everything it starts is stopped on exit, also on
# Ctrl-C or an error.
#
#   scripts/demo-pipeline.sh [path/to/onceq]
#   env: ONCEQ_BIN (binary), ONCEQ_DEMO_PORT (default 8081), ONCEQ_DEMO_DIR (default: a temp
#        dir, removed at the end unless ONCEQ_DEMO_KEEP=1)
set -u
BIN=${1:-${ONCEQ_BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/onceq}}
PORT=${ONCEQ_DEMO_PORT:-8081}
URL=http://127.0.0.1:$PORT
[[ -x "$BIN" ]] || { echo "demo: no onceq binary at $BIN (build first, or pass its path)" >&2; exit 2; }
command -v curl >/dev/null || { echo "demo: curl is needed (apt-get install curl)" >&2; exit 2; }
if curl -s -o /dev/null --max-time 1 "$URL/healthz"; then
    echo "demo: something already answers on $URL; set ONCEQ_DEMO_PORT to a free port" >&2
    exit 2
fi
if [[ -n "${ONCEQ_DEMO_DIR:-}" ]]; then DIR=$ONCEQ_DEMO_DIR; mkdir -p "$DIR"; else DIR=$(mktemp -d /tmp/onceq-demo.XXXXXX); fi
UP_PID=""

cleanup() {
    local rc=$?
    if [[ -n "$UP_PID" ]] && kill -0 "$UP_PID" 2>/dev/null; then
        echo "== stopping onceq up (pid $UP_PID)"
        kill -TERM "$UP_PID"
        for ((i = 0; i < 150; i++)); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$UP_PID" 2>/dev/null && kill -KILL "$UP_PID"
        wait "$UP_PID" 2>/dev/null
    fi
    if [[ -z "${ONCEQ_DEMO_DIR:-}" && "${ONCEQ_DEMO_KEEP:-0}" != 1 ]]; then rm -rf "$DIR"; else echo "data kept in $DIR"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== onceq up --dir $DIR --listen 127.0.0.1:$PORT"
"$BIN" up --dir "$DIR" --listen "127.0.0.1:$PORT" --consumers 2 >"$DIR/up.out" 2>&1 &
UP_PID=$!
for ((i = 0; i < 300; i++)); do
    curl -s -o /dev/null --max-time 1 "$URL/healthz" && break
    kill -0 "$UP_PID" 2>/dev/null || { echo "demo: onceq up exited:" >&2; cat "$DIR/up.out" >&2; exit 1; }
    sleep 0.1
done
curl -s -o /dev/null --max-time 1 "$URL/healthz" || { echo "demo: producer not healthy after 30 s" >&2; cat "$DIR/up.out" >&2; exit 1; }
grep -v '^ts=' "$DIR/up.out"

# submit KEY BODY: prints the HTTP status and the body; sets STATUS and BODY.
submit() {
    local out
    out=$(curl -s --max-time 10 -w '\n%{http_code}' -X POST "$URL/v1/tool-calls" \
        -H "Idempotency-Key: $1" -H 'Content-Type: application/json' -d "$2")
    STATUS=${out##*$'\n'}
    BODY=${out%$'\n'*}
    printf '   -> %s %s\n' "$STATUS" "$BODY"
}
field() { grep -o "\"$1\":\"[^\"]*\"" <<<"$2" | head -n1 | cut -d'"' -f4; }

KEYP="demo-$$-$(date +%s)"
declare -a IDS=()
echo
echo "== 1. charge 1250 (key $KEYP-charge)"
submit "$KEYP-charge" '{"tool":"charge","args":{"amount":1250}}'
CHARGE_ID=$(field call_id "$BODY"); IDS+=("$CHARGE_ID")
echo "== 2. send_email (key $KEYP-mail)"
submit "$KEYP-mail" '{"tool":"send_email","args":{"to":"ada@example.com","subject":"receipt"}}'
IDS+=("$(field call_id "$BODY")")
echo "== 3. sleep 300 ms (key $KEYP-sleep)"
submit "$KEYP-sleep" '{"tool":"sleep","args":{"ms":300}}'
IDS+=("$(field call_id "$BODY")")
echo "== 4. fail, not retryable (key $KEYP-fail)"
submit "$KEYP-fail" '{"tool":"fail","args":{"retryable":false}}'
IDS+=("$(field call_id "$BODY")")
echo "== 5. duplicate: charge again with the same key and the same body (keys reordered)"
submit "$KEYP-charge" '{"args":{"amount":1250},"tool":"charge"}'
DUP_ID=$(field call_id "$BODY")
if [[ "$DUP_ID" == "$CHARGE_ID" ]]; then echo "   same call_id $DUP_ID: nothing new was executed"; else echo "   UNEXPECTED: got call_id '$DUP_ID', first was $CHARGE_ID"; fi
echo "== 6. conflict: same key, different amount"
submit "$KEYP-charge" '{"tool":"charge","args":{"amount":9999}}'
[[ "$STATUS" == 422 ]] && echo "   refused with 422 idempotency_conflict: never executed" || echo "   UNEXPECTED status $STATUS"

echo
echo "== waiting for terminal states"
for ((i = 0; i < 200; i++)); do
    open=0
    for id in "${IDS[@]}"; do
        st=$(field status "$(curl -s --max-time 2 "$URL/v1/tool-calls/$id")")
        case $st in succeeded | failed | needs_review) ;; *) open=1 ;; esac
    done
    ((open == 0)) && break
    sleep 0.1
done
for id in "${IDS[@]}"; do
    b=$(curl -s --max-time 2 "$URL/v1/tool-calls/$id")
    printf '   %-20s %-11s %-10s effect=%s\n' "$id" "$(field tool "$b")" "$(field status "$b")" "$(field effect_id "$b")"
done
echo
echo "== GET /stats"
curl -s --max-time 2 "$URL/stats"
echo
echo
echo "== onceq verify --producer-db $DIR/calls.db --consumer-db $DIR/effects.db"
"$BIN" verify --producer-db "$DIR/calls.db" --consumer-db "$DIR/effects.db"
VRC=$?
echo "(exit $VRC: 0 = every invariant holds)"
exit $VRC
