# SPDX-License-Identifier: Apache-2.0
"""MCP tasks (protocol 2025-11-25) against onceq's /mcp, for tests/integration/test_mcp_tasks.sh.

Usage: mcp_tasks_client.py before URL STATE | after URL STATE. "before" makes a task and writes
its id to STATE; "after" (run once the producer restarted) polls it to its result.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mcp_client import Client, check  # noqa: E402


def init_tasks(url):
    cl = Client(url)
    st, h, m, _ = cl.rpc("initialize", {"protocolVersion": "2025-11-25",
                                        "capabilities": {"tasks": {}},
                                        "clientInfo": {"name": "t", "version": "1"}}, id=0)
    check(st == 200 and m["result"]["protocolVersion"] == "2025-11-25", f"initialize: {m}")
    check(m["result"]["capabilities"].get("tasks", {}).get("requests", {}).get("tools", {})
          .get("call") == {}, f"no tasks.requests.tools.call: {m}")
    cl.session, cl.version = h["mcp-session-id"], "2025-11-25"
    return cl


def result_of(cl, tid, tries=180):  # each try waits up to --mcp-wait
    for i in range(tries):
        st, _, m, _ = cl.rpc("tasks/result", {"taskId": tid}, id=500 + i)
        if "error" in m and m["error"]["data"].get("code") == "running":
            continue
        return m
    check(False, f"tasks/result never settled: {m}")


def main():
    scen, url, state = sys.argv[1], sys.argv[2], sys.argv[3]
    if scen == "before":
        cl = init_tasks(url)
        st, _, m, _ = cl.rpc("tools/list", id=1)
        check(all(t.get("execution") == {"taskSupport": "optional"} for t in m["result"]["tools"]),
              f"taskSupport: {m}")
        # a plain call still running at --mcp-wait names its task
        st, _, m, _ = cl.call("charge", {"amount": 3, "delay_ms": 4000}, key="task-1", id=2)
        r = m["result"]
        tid = r["_meta"]["io.modelcontextprotocol/related-task"]["taskId"]
        check(r["isError"] and r["structuredContent"]["status"] == "running"
              and tid == r["structuredContent"]["call_id"], f"running call: {m}")
        st, _, m, _ = cl.rpc("tasks/get", {"taskId": tid}, id=3)
        t = m["result"]
        check(t["taskId"] == tid and t["status"] == "working" and t["createdAt"].endswith("Z")
              and t["lastUpdatedAt"] and t["pollInterval"] > 0 and "ttl" in t, f"tasks/get: {m}")
        # unknown task; a 2025-06-18 client has no tasks and no related-task
        st, _, m, _ = cl.rpc("tasks/get", {"taskId": "c_" + "0" * 32}, id=4)
        check(m["error"]["code"] == -32602, f"unknown task: {m}")
        old = Client(url)
        old.initialize("2025-06-18")
        st, _, m, _ = old.call("charge", {"amount": 4, "delay_ms": 4000}, key="task-old", id=5)
        check("io.modelcontextprotocol/related-task" not in m["result"]["_meta"], f"old: {m}")
        st, _, m, _ = old.rpc("tasks/get", {"taskId": tid}, id=6)
        check(m["error"]["code"] == -32601, f"tasks/get on 2025-06-18: {m}")
        json.dump({"tid": tid}, open(state, "w"))
        print("before ok", tid)
        return
    tid = json.load(open(state))["tid"]
    cl = init_tasks(url)  # a new session after the restart: the task is the durable call
    m = result_of(cl, tid)
    r = m["result"]
    check(r["isError"] is False and r["structuredContent"]
          and r["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == tid, f"result: {m}")
    st, _, m, _ = cl.rpc("tasks/get", {"taskId": tid}, id=7)
    check(m["result"]["status"] == "completed", f"completed: {m}")
    # a task-augmented tools/call: CreateTaskResult at once, then poll
    st, _, m, _ = cl.rpc("tools/call", {"name": "charge", "arguments": {"amount": 5, "delay_ms": 2000},
                                        "idempotencyKey": "task-2", "task": {"ttl": 60000}}, id=8)
    task = m["result"]["task"]
    check(task["taskId"].startswith("c_") and task["status"] == "working",  # not waited for
          f"CreateTaskResult: {m}")
    for i in range(120):
        st, _, g, _ = cl.rpc("tasks/get", {"taskId": task["taskId"]}, id=100 + i)
        if g["result"]["status"] != "working":
            break
        time.sleep(0.25)
    check(g["result"]["status"] == "completed", f"task-2 never completed: {g}")
    m = result_of(cl, task["taskId"])
    check(m["result"]["isError"] is False, f"task-2 result: {m}")
    print("after ok")


if __name__ == "__main__":
    main()
