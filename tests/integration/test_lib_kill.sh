#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The harness itself (lib.sh): oq_kill of a process that ignores SIGTERM waits OQ_KILL_GRACE,
# sends KILL, reaps it and returns 0, and the test goes on; so does oq_kill of a process that
# has already exited with an error. Before, the reaping `wait` returned
# the child's status (137) under `set -e` and ended the calling test there, silently: a slow
# shutdown (integration.test_logs_json on a loaded machine) looked like a failure of whatever
# the test checked next.
set -euo pipefail
. "${ONCEQ_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/integration/lib.sh"

oq_spawn stub sh -c 'trap "" TERM; echo up; sleep 30'
oq_wait_for 5 grep -q up "$T/stub.log" || oq_fail "stub did not start"
pid=$(oq_pid stub)
OQ_KILL_GRACE=1 oq_kill stub
reached=1
kill -0 "$pid" 2>/dev/null && oq_fail "pid $pid still there after oq_kill"
# a process that stops on TERM is not escalated
oq_spawn polite sleep 30
start=$SECONDS
oq_kill polite
((SECONDS - start <= 2)) || oq_fail "oq_kill of a process that obeys TERM took $((SECONDS - start)) s"
# a process that already exited with an error: oq_kill reaps it and returns (before, the
# reaping `wait` returned its status, 3, under `set -e` and ended this test)
oq_spawn failed sh -c 'exit 3'
oq_wait_for 5 bash -c "! kill -0 $(oq_pid failed) 2>/dev/null" || oq_fail "the failing stub did not exit"
oq_kill failed
((reached == 1)) && oq_log "oq_kill escalated to KILL, reaped the stub, reaped a process that had failed, and returned each time; the test went on"
