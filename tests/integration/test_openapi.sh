#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The HTTP contract (issue 12, item 8): docs/openapi.yaml checked against running producers by
# tests/tools/oq_openapi_check.py. Three producers on loopback:
#  - main: a pipeline (embedded broker, relay, one consumer), so calls reach real terminal
#    states (succeeded, failed) and their results validate; also the 403 of /metrics and /stats
#    from a local address that is not loopback;
#  - auth: --token-file, --metrics-access token, --max-message-bytes 1000 (401, 403
#    tenant_mismatch, the 413 of a message too large for Kafka);
#  - fault: its calls table renamed for a moment (every 503, /readyz unready), then restored;
#    it also has --tools (a tool "pay" with an input_schema): GET /v1/tools, and the 400s
#    unknown_tool and bad_args of the catalogue.
# The checker fails when a response does not validate, a required header is missing, a status
# is not documented, an undocumented method is not 405 with the right Allow, or a documented
# (operation, status, error code) was never produced.
# Needs Debian's python3 with python3-yaml and python3-jsonschema (./quickstart installs them):
# without them the test fails under CI=true and is skipped (77) otherwise.
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
oq_tmpdir

PY=/usr/bin/python3
if ! [[ -x $PY ]] || ! "$PY" -c 'import yaml, jsonschema' 2>/dev/null; then
    [[ "${CI:-}" == true ]] &&
        oq_fail "$PY with yaml and jsonschema is required (apt-get install python3-yaml python3-jsonschema)"
    echo "SKIP: needs $PY with python3-yaml and python3-jsonschema"
    exit 77
fi

TOK=tok-shop-0123456789abcdef
MTOK=tok-metrics-0123456789abcdef
printf '%s shop\n' "$TOK" >"$T/tokens"
printf '%s\n' "$MTOK" >"$T/mtokens"
chmod 600 "$T/tokens" "$T/mtokens"

pl_start 1
MAIN=http://127.0.0.1:$PORT
APORT=$(oq_free_port) || oq_fail "no free port"
oq_spawn producer-auth "$ONCEQ_BIN" producer --db "$T/auth.db" --listen "127.0.0.1:$APORT" \
    --token-file "$T/tokens" --metrics-access token --metrics-token-file "$T/mtokens" \
    --max-message-bytes 1000
FPORT=$(oq_free_port) || oq_fail "no free port"
cat >"$T/tools.json" <<'JSON'
{"tools": [{"name": "pay", "url": "http://127.0.0.1:9/pay", "description": "Pay",
            "input_schema": {"type": "object", "required": ["amount"],
                             "properties": {"amount": {"type": "integer", "minimum": 1}}},
            "annotations": {"title": "Pay", "idempotentHint": true}}]}
JSON
oq_spawn producer-fault "$ONCEQ_BIN" producer --db "$T/fault.db" --listen "127.0.0.1:$FPORT" \
    --tools "$T/tools.json"
oq_wait_for 15 curl -sf "http://127.0.0.1:$APORT/healthz" || oq_fail "auth producer did not come up"
oq_wait_for 15 curl -sf "http://127.0.0.1:$FPORT/healthz" || oq_fail "fault producer did not come up"
ready() { curl -sf -o /dev/null "$1/readyz"; }
oq_wait_for 30 ready "$MAIN" || oq_fail "pipeline producer not ready: $(curl -s "$MAIN/readyz")"

# a local source address that is not loopback and reaches 127.0.0.1 (for the 403s)
SRC=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9.]+$' | grep -v '^127\.' | head -n1)
if [[ -n "$SRC" ]] && ! curl -sf --max-time 3 --interface "$SRC" "$MAIN/healthz" >/dev/null; then
    SRC=
fi
[[ -n "$SRC" ]] || oq_log "no local non-loopback address: the 403 forbidden responses cannot be produced"

SPEC=${ONCEQ_OPENAPI_SPEC:-$ONCEQ_SRC/docs/openapi.yaml}
timeout 240 "$PY" "$ONCEQ_SRC/tests/tools/oq_openapi_check.py" --spec "$SPEC" \
    --main "$MAIN" --auth "http://127.0.0.1:$APORT" --fault "http://127.0.0.1:$FPORT" \
    --fault-db "$T/fault.db" --api-token "$TOK" --metrics-token "$MTOK" --non-loopback "$SRC" \
    >"$T/check.out" 2>&1
RC=$?
cat "$T/check.out"
[[ $RC == 0 ]] || oq_fail "the server does not match $SPEC (checker exit $RC)"
grep -q '^requests=' "$T/check.out" || oq_fail "the checker printed no summary"

# one effect per call in the pipeline
J=$(pl_verify --allow-pending) || oq_fail "onceq verify: $J"
oq_pass "OpenAPI contract: $(grep '^requests=' "$T/check.out")"
