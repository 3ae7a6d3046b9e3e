# SPDX-License-Identifier: Apache-2.0
"""A raw JSON-RPC client of onceq's POST /mcp (Streamable HTTP) for tests/integration/test_mcp*.sh.

Usage: mcp_client.py SCENARIO URL [ARGS...]; exits 1 with a message when a check fails.
"""
import http.client
import json
import sqlite3
import sys
import threading
import urllib.parse

FAILS = []


def check(cond, what):
    if not cond:
        print("FAIL:", what, file=sys.stderr)
        sys.exit(1)


class Client:
    def __init__(self, url, token=None, accept="application/json, text/event-stream"):
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.path = u.hostname, u.port, u.path or "/mcp"
        self.token, self.accept = token, accept
        self.session = None
        self.version = None

    def raw(self, body, method="POST", headers=None, session=True):
        h = {"Content-Type": "application/json", "Accept": self.accept}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if session and self.session:
            h["Mcp-Session-Id"] = self.session
        if self.version:
            h["MCP-Protocol-Version"] = self.version
        h.update(headers or {})
        c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        c.request(method, self.path, body=data, headers=h)
        r = c.getresponse()
        text = r.read().decode()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        msg = None
        if text:
            if hdrs.get("content-type", "").startswith("text/event-stream"):
                data = [l[6:] for l in text.splitlines() if l.startswith("data: ")]
                msg = json.loads(data[0])
            else:
                msg = json.loads(text)
        return r.status, hdrs, msg, text

    def rpc(self, method, params=None, id=1, **kw):
        m = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            m["params"] = params
        return self.raw(m, **kw)

    def initialize(self, version="2025-06-18"):
        st, h, m, _ = self.rpc("initialize", {"protocolVersion": version, "capabilities": {},
                                              "clientInfo": {"name": "t", "version": "1"}}, id=0)
        check(st == 200 and "result" in m, f"initialize: {st} {m}")
        self.session = h.get("mcp-session-id")
        check(self.session and len(self.session) == 32, f"no Mcp-Session-Id: {h}")
        self.version = m["result"]["protocolVersion"]
        st, _, _, text = self.raw({"jsonrpc": "2.0", "method": "notifications/initialized"})
        check(st == 202 and text == "", f"notifications/initialized: {st} {text!r}")
        return m["result"]

    def call(self, name, args, id=1, key=None, meta_key=None):
        p = {"name": name, "arguments": args}
        if key is not None:
            p["idempotencyKey"] = key
        if meta_key is not None:
            p["_meta"] = {"io.onceq/idempotency-key": meta_key}
        return self.rpc("tools/call", p, id=id)


def calls_count(db):
    con = sqlite3.connect(db, timeout=10)
    n = con.execute("SELECT count(*) FROM calls").fetchone()[0]
    m = con.execute("SELECT count(*) FROM outbox").fetchone()[0]
    con.close()
    return n, m


def ledger_count(durl, field, value):
    u = urllib.parse.urlsplit(durl)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request("GET", "/v1/payments?" + urllib.parse.urlencode({field: value}))
    r = c.getresponse()
    r.read()
    return int(r.getheader("X-Match-Count") or 0)


def concurrent(fn, n):
    out = [None] * n
    def run(i):
        out[i] = fn(i)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def retries(url, durl, key, reference, n):
    """The same tools/call (pay, same key) n times at once, then once more: every answer the
    same. Prints the payments the downstream's ledger holds for the call: by reference, which
    is onceq's effect id (the tools file's body), or \p reference (the naive server sends the
    arguments as they are) when it is not "-"."""
    cl = Client(url)
    cl.initialize()
    args = {"amount": 5} if reference == "-" else {"amount": 5, "reference": reference}
    answers = concurrent(lambda i: cl.call("pay", args, id=100 + i, key=key), n)
    answers.append(cl.call("pay", args, id=999, key=key))
    res = []
    for st, _, m, _ in answers:
        check(st == 200 and "result" in m, f"tools/call: {st} {m}")
        res.append(json.dumps(m["result"].get("structuredContent"), sort_keys=True))
    last = answers[-1][2]["result"]
    if reference == "-":
        cid = last["_meta"]["io.onceq/call-id"]
        reference = "e_" + cid[2:]
    print(json.dumps({"distinct_answers": len(set(res)), "answer": last,
                      "ledger": ledger_count(durl, "reference", reference)}))


NAIVE_PAYMENTS = None


def naive(port, durl):
    """A naive MCP server: each tools/call goes straight to the downstream, no key."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            m = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if "id" not in m:
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if m["method"] == "initialize":
                r = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}},
                     "serverInfo": {"name": "naive", "version": "0"}}
            else:
                u = urllib.parse.urlsplit(durl)
                c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
                c.request("POST", "/v1/payments", body=json.dumps(m["params"]["arguments"]),
                          headers={"Content-Type": "application/json"})
                pay = json.loads(c.getresponse().read())
                r = {"content": [{"type": "text", "text": json.dumps(pay)}],
                     "structuredContent": pay, "isError": False}
            body = json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Mcp-Session-Id", "a" * 32)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class S(ThreadingHTTPServer):
        request_queue_size = 128  # 20 clients at once: the default backlog of 5 refuses some
        daemon_threads = True

    S(("127.0.0.1", port), H).serve_forever()


def main():
    scen, url = sys.argv[1], sys.argv[2]
    if scen == "naive":
        naive(int(url), sys.argv[3])
        return
    if scen == "retries":
        retries(url, sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
        return
    if scen == "running":  # a producer without relay: nothing runs; --mcp-wait is short
        cl = Client(url, token=sys.argv[3] if len(sys.argv) > 3 else None)
        cl.initialize()
        st, _, m, _ = cl.call("charge", {"amount": 3}, key="slow-1")
        r = m["result"]
        check(r["isError"] is True and r["structuredContent"]["status"] == "running"
              and r["structuredContent"]["call_id"].startswith("c_")
              and "same" in r["content"][0]["text"], f"running: {m}")
        st, _, m2, _ = cl.call("charge", {"amount": 3}, key="slow-1", id=2)
        check(m2["result"]["structuredContent"] == r["structuredContent"], f"running again: {m2}")
        print("running ok")
        return
    if scen == "auth":
        good, other = sys.argv[3], sys.argv[4]
        cl = Client(url)
        st, h, m, _ = cl.rpc("initialize", {"protocolVersion": "2025-06-18"})
        check(st == 401, f"no token: {st} {m}")
        cl = Client(url, token="x" * 20)
        st, h, m, _ = cl.rpc("initialize", {"protocolVersion": "2025-06-18"})
        check(st == 401, f"unknown token: {st} {m}")
        cl = Client(url, token=good)
        cl.initialize()
        st, _, m, _ = cl.rpc("ping", id=5)
        check(st == 200 and m["result"] == {}, f"ping with token: {st} {m}")
        cl.token = other  # another tenant's token on this session: as unknown
        st, _, m, _ = cl.rpc("ping", id=6)
        check(st == 404, f"session of another tenant: {st} {m}")
        print("auth ok")
        return
    check(scen == "protocol", "unknown scenario")
    db, durl = sys.argv[3], sys.argv[4]
    cl = Client(url)
    # --- transport and lifecycle
    st, h, m, _ = cl.rpc("initialize", {"protocolVersion": "2099-01-01"})
    check(st == 200 and m["result"]["protocolVersion"] == "2025-11-25", f"latest: {m}")
    res = cl.initialize("2025-06-18")
    check(res["protocolVersion"] == "2025-06-18" and res["serverInfo"]["name"] == "onceq"
          and res["serverInfo"]["version"] and res["capabilities"]["tools"] == {"listChanged": False},
          f"initialize result: {res}")
    st, _, m, _ = cl.rpc("ping", id=2, session=False)
    check(st == 400, f"no session: {st} {m}")
    st, _, m, _ = cl.rpc("ping", id=2, headers={"Mcp-Session-Id": "0" * 32})
    check(st == 404, f"unknown session: {st} {m}")
    st, _, m, _ = cl.rpc("ping", id=2, headers={"MCP-Protocol-Version": "1999-01-01"})
    check(st == 400, f"bad protocol version: {st} {m}")
    st, _, m, _ = cl.rpc("ping", id=2, headers={"Origin": "http://evil.example"})
    check(st == 403, f"foreign Origin: {st} {m}")
    st, _, m, _ = cl.rpc("ping", id=2, headers={"Origin": "http://localhost:3000"})
    check(st == 200 and m["result"] == {}, f"ping with a loopback Origin: {st} {m}")
    st, _, m, _ = cl.raw('{"jsonrpc":"2.0","id":1,"method":')
    check(st == 400 and m["error"]["code"] == -32700 and m["id"] is None, f"parse error: {m}")
    st, _, m, _ = cl.raw([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
    check(st == 400 and m["error"]["code"] == -32600, f"batch: {st} {m}")
    st, _, m, _ = cl.raw({"jsonrpc": "1.0", "id": 1, "method": "ping"})
    check(m["error"]["code"] == -32600, f"jsonrpc 1.0: {st} {m}")
    st, _, m, _ = cl.rpc("resources/list", id=3)
    check(st == 200 and m["error"]["code"] == -32601 and m["id"] == 3, f"no method: {m}")
    st, h, m, _ = cl.raw(None, method="GET")
    check(st == 405 and "POST" in h.get("allow", ""), f"GET /mcp: {st} {h}")
    # --- tools/list
    st, _, m, _ = cl.rpc("tools/list", id=4)
    tools = {t["name"]: t for t in m["result"]["tools"]}
    check("pay" in tools and "charge" in tools, f"tools/list: {m}")
    check(tools["pay"]["inputSchema"]["properties"]["amount"]["minimum"] == 1
          and all(t["annotations"]["idempotentHint"] is True for t in tools.values())
          and all(t["inputSchema"].get("type") == "object" for t in tools.values()),
          f"tools/list entries: {tools}")
    # --- refusals: -32602, nothing written
    before = calls_count(db)
    st, _, m, _ = cl.call("refund", {"amount": 1}, key="r-1")
    check(m["error"]["code"] == -32602 and m["error"]["data"]["code"] == "unknown_tool",
          f"unknown tool: {m}")
    st, _, m, _ = cl.call("pay", {"amount": 0}, key="r-2")
    check(m["error"]["code"] == -32602 and m["error"]["data"]["code"] == "bad_args"
          and m["error"]["data"]["pointer"] == "/amount", f"bad args: {m}")
    st, _, m, _ = cl.call("pay", {"amount": 5}, key=" spaced ")
    check(m["error"]["code"] == -32602, f"bad key: {m}")
    st, _, m, _ = cl.rpc("tools/call", {"arguments": {}}, id=9)
    check(m["error"]["code"] == -32602, f"no name: {m}")
    check(calls_count(db) == before, f"refusals wrote rows: {before} -> {calls_count(db)}")
    # --- a compiled tool, the _meta key, the conflict
    st, _, m, _ = cl.call("charge", {"amount": 7}, meta_key="meta-charge-1", id=10)
    r = m["result"]
    check(r["isError"] is False and isinstance(r["structuredContent"], dict)
          and json.loads(r["content"][0]["text"]) == r["structuredContent"],
          f"charge: {m}")
    cid = r["_meta"]["io.onceq/call-id"]
    st, _, m2, _ = cl.call("charge", {"amount": 7}, meta_key="meta-charge-1", id=11)
    check(m2["result"] == r, f"charge replay differs: {m2} vs {m}")
    st, _, m, _ = cl.call("charge", {"amount": 8}, meta_key="meta-charge-1", id=12)
    check("error" in m and m["error"]["data"]["code"] == "idempotency_conflict", f"conflict: {m}")
    con = sqlite3.connect(db, timeout=10)
    row = con.execute("SELECT call_id FROM calls WHERE idem_key='meta-charge-1'").fetchall()
    con.close()
    check(row == [(cid,)], f"_meta key not the call's key: {row} {cid}")
    # --- derived key: session + request id
    st, _, a, _ = cl.call("charge", {"amount": 9}, id=77)
    st, _, b, _ = cl.call("charge", {"amount": 9}, id=77)
    check(a["result"]["_meta"] == b["result"]["_meta"], f"derived key, same session: {a} {b}")
    cl2 = Client(url)
    cl2.initialize("2025-11-25")
    st, _, c, _ = cl2.call("charge", {"amount": 9}, id=77)
    check(c["result"]["_meta"] != a["result"]["_meta"], f"derived key across sessions: {a} {c}")
    # --- SSE framing for a client that accepts only text/event-stream
    sse = Client(url, accept="text/event-stream")
    sse.session, sse.version = cl.session, cl.version
    st, h, m, text = sse.rpc("ping", id=20)
    check(st == 200 and h["content-type"].startswith("text/event-stream")
          and text.startswith("event: message\ndata: ") and m["result"] == {}, f"SSE: {h} {text!r}")
    st, _, m, _ = Client(url, accept="text/html").rpc("ping")
    check(st == 406, f"Accept text/html: {st}")
    # --- DELETE ends the session
    st, _, _, _ = cl2.raw(None, method="DELETE")
    check(st == 200, f"DELETE: {st}")
    st, _, m, _ = cl2.rpc("ping", id=21)
    check(st == 404, f"ping after DELETE: {st} {m}")
    print("protocol ok")


if __name__ == "__main__":
    main()
