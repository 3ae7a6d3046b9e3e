#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# MCP tasks on /mcp (issue 20, item 3; protocol 2025-11-25), tests/integration/mcp_tasks_client.py
# against a live pipeline with --mcp-wait 1s and the compiled "charge" taking 4 s:
#  - initialize declares tasks.requests.tools.call, tools/list taskSupport "optional";
#  - a plain tools/call of a client that declared tasks, still running at --mcp-wait, names its
#    task (the call id) in _meta["io.modelcontextprotocol/related-task"]; tasks/get: working;
#  - the producer restarts; in a new session tasks/result returns the call's result and
#    tasks/get says completed (the task is the durable call);
#  - a task-augmented tools/call (params.task) gets a CreateTaskResult at once, then completes;
#  - an unknown taskId is -32602; a 2025-06-18 session has no tasks (-32601, no related-task).
set -u
. "$ONCEQ_SRC/tests/integration/lib.sh"
. "$ONCEQ_SRC/chaos/pipeline.sh"
PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3) || oq_fail "no python3"
CLI="$ONCEQ_SRC/tests/integration/mcp_tasks_client.py"

# consumer.session.timeout.ms: the restarted producer rejoins its results group in seconds
PL_PRODUCER_X+=(--tools "$ONCEQ_SRC/examples/tools.json" --mcp-wait 1s -X consumer.session.timeout.ms=6000)
pl_start 1
MCP=http://127.0.0.1:$PORT/mcp
$PY "$CLI" before "$MCP" "$T/state.json" || oq_fail "tasks before the restart"
oq_kill producer
pl_spawn_producer
pl_wait_healthy 30 || oq_fail "the producer did not come back"
$PY "$CLI" after "$MCP" "$T/state.json" || oq_fail "tasks after the restart"
oq_pass "MCP tasks: the task of a running call survives a producer restart; task-augmented calls"
