# SPDX-License-Identifier: Apache-2.0
"""An agent-like MCP client for tests/integration/test_mcp_chaos.sh: raw JSON-RPC over
Streamable HTTP (one request per connection, as through tests/tools/oq_chaos_proxy.py), every
tools/call retried with the same idempotencyKey until an answer arrives.

Usage: mcp_chaos_client.py URL DOWNSTREAM_URL N PREFIX onceq|naive
Prints {"keys", "retries", "per_key": {key: payments in the downstream's ledger}, "total"}.
Against onceq a key's payments are found by reference = the call's effect id (the tools file's
body); against the naive server by reference = the key (it forwards the arguments as they are).
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse

from mcp_client import ledger_count


def post(url, msg, session=None, timeout=90):
    u = urllib.parse.urlsplit(url)
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "Connection": "close"}
    if session:
        h["Mcp-Session-Id"] = session
        h["MCP-Protocol-Version"] = "2025-06-18"
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        c.request("POST", u.path, body=json.dumps(msg), headers=h)
        r = c.getresponse()
        text = r.read().decode()
        return r.status, r.getheader("Mcp-Session-Id"), json.loads(text) if text else None
    finally:
        c.close()


def main():
    url, durl, n, prefix, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    retries = [0]
    lock = threading.Lock()

    def again():
        with lock:
            retries[0] += 1
        time.sleep(0.05)

    session = None
    for _ in range(100):  # an agent opens its session again when the answer is lost
        try:
            st, sid, m = post(url, {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                               "clientInfo": {"name": "agent", "version": "1"}}})
            if st == 200 and sid:
                session = sid
                break
        except (OSError, http.client.HTTPException, ValueError):
            pass
        again()
    assert session, "no session"
    answers = {}
    todo = list(range(n))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            key = f"{prefix}-{i}"
            args = {"amount": 100 + i}
            if mode == "naive":
                args["reference"] = key
            for attempt in range(200):
                try:
                    st, _, m = post(url, {"jsonrpc": "2.0", "id": 1000 * i + attempt,
                                          "method": "tools/call",
                                          "params": {"name": "pay", "arguments": args,
                                                     "idempotencyKey": key}}, session)
                except (OSError, http.client.HTTPException, ValueError):
                    again()
                    continue
                r = (m or {}).get("result")
                if st == 200 and r and not r.get("isError"):
                    with lock:
                        answers[key] = r
                    break
                again()  # running at --mcp-wait, or refused: ask again with the same key

    ts = [threading.Thread(target=worker) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    per_key = {}
    for i in range(n):
        key = f"{prefix}-{i}"
        if mode == "naive":
            ref = key
        else:
            a = answers.get(key)
            ref = "e_" + a["_meta"]["io.onceq/call-id"][2:] if a else None
        per_key[key] = ledger_count(durl, "reference", ref) if ref else -1
    print(json.dumps({"keys": n, "answered": len(answers), "retries": retries[0],
                      "per_key": per_key, "total": sum(v for v in per_key.values() if v > 0)}))


if __name__ == "__main__":
    main()
