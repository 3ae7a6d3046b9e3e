#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Tasks on a PostgreSQL producer (issue 19): its store has no task rows yet, so POST /v1/tasks
# is refused with 501 tasks_unsupported_backend and nothing is written; the producer keeps
# serving (calls are accepted, /readyz ready), and GET /v1/tasks/... answers 404.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"
oq_require_pg
oq_tmpdir
URL=$(oq_pg_fresh_db onceq_it_tasks)
PORT=$(oq_free_port)
oq_spawn producer "$ONCEQ_BIN" producer --db "$URL" --listen "127.0.0.1:$PORT"
oq_wait_for 30 curl -fsS "http://127.0.0.1:$PORT/readyz" -o /dev/null || oq_fail "never ready"
api=http://127.0.0.1:$PORT
code=$(curl -s -o "$T/r" -w '%{http_code}' -X POST "$api/v1/tasks" -H 'Idempotency-Key: t1' \
    -d '{"steps":[{"name":"a","tool":"charge","args":{"amount":1}}]}')
[[ $code == 501 ]] && jq -e '.error.code == "tasks_unsupported_backend"' "$T/r" >/dev/null ||
    oq_fail "task on PostgreSQL: HTTP $code $(cat "$T/r")"
[[ $(psql -XAtq "$URL" -c "SELECT count(*) FROM onceq.calls") == 0 ]] || oq_fail "a call was written"
code=$(curl -s -o /dev/null -w '%{http_code}' "$api/v1/tasks/by-key/t1")
[[ $code == 404 ]] || oq_fail "GET a task on PostgreSQL: $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$api/v1/tool-calls" \
    -H 'Idempotency-Key: c1' -d '{"tool":"charge","args":{"amount":1}}')
[[ $code == 202 ]] || oq_fail "a call after the refused task: $code"
oq_alive producer || oq_fail "producer died"
oq_pass "PostgreSQL producer: a task is refused with 501 tasks_unsupported_backend, nothing written, calls still served"
