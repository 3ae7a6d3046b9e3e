# SPDX-License-Identifier: Apache-2.0
"""A small MCP server (Streamable HTTP) with a ledger, the upstream of tests/integration/test_mcp_upstream.sh.

Usage: mcp_upstream.py PORT. One process, three upstreams by path, each with its own ledger:
  /keys/mcp     honours params.idempotencyKey: a key seen before returns the first result
  /lookup/mcp   ignores keys, records _meta["io.onceq/idempotency-key"] as the payment's
                reference and offers the read-only tool find_payment {reference}
  /neither/mcp  ignores keys, no lookup
Sessions are required (initialize gives an Mcp-Session-Id; a request without one is 400, an
unknown one 404); /keys answers in SSE, the others in JSON. Tool pay {amount, drop}: amount < 1
is a tool error (isError); drop: true commits the payment and then closes the connection
without an answer, the first time a reference is seen (a lost answer).
GET /ledger/<upstream> -> {"effects": [...], "pay_requests": n, "by_ref": {ref: count}}.
POST /admin/forget-sessions drops every session (the upstream restarted).
"""
import json
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATE = {u: {"effects": [], "pay_requests": 0, "by_key": {}, "dropped": set()}
         for u in ("keys", "lookup", "neither")}
SESSIONS = set()
PAY_SCHEMA = {"type": "object", "properties": {"amount": {"type": "integer", "minimum": 1},
                                               "drop": {"type": "boolean"}},
              "required": ["amount"]}


def tools(up):
    t = [{"name": "pay", "description": "Pay an amount.", "inputSchema": PAY_SCHEMA,
          "annotations": {"title": "Pay", "destructiveHint": False, "idempotentHint": up == "keys",
                          "x-unknown": 1}}]
    if up == "lookup":
        t.append({"name": "find_payment", "description": "Find a payment by reference.",
                  "inputSchema": {"type": "object", "properties": {"reference": {"type": "string"}}},
                  "annotations": {"readOnlyHint": True}})
    return t


def call(up, params):
    """(result, drop)"""
    st = STATE[up]
    name, args = params.get("name"), params.get("arguments") or {}
    ref = (params.get("_meta") or {}).get("io.onceq/idempotency-key")
    if name == "find_payment" and up == "lookup":
        found = [e for e in st["effects"] if e["reference"] == args.get("reference")]
        sc = {"id": found[0]["id"] if found else None}
        return {"content": [{"type": "text", "text": json.dumps(sc)}], "structuredContent": sc,
                "isError": False}, False
    if name != "pay":
        return {"content": [{"type": "text", "text": "no such tool"}], "isError": True}, False
    st["pay_requests"] += 1
    amount = args.get("amount")
    if not isinstance(amount, int) or amount < 1:
        return {"content": [{"type": "text", "text": "amount must be >= 1"}], "isError": True}, False
    key = params.get("idempotencyKey")
    if up == "keys" and key in st["by_key"]:
        return st["by_key"][key], False
    pid = "pay_%d" % (len(st["effects"]) + 1)
    st["effects"].append({"id": pid, "amount": amount, "reference": ref, "key": key})
    sc = {"id": pid, "amount": amount}
    res = {"content": [{"type": "text", "text": json.dumps(sc)}], "structuredContent": sc,
           "isError": False}
    if up == "keys":
        st["by_key"][key] = res
    drop = bool(args.get("drop")) and ref not in st["dropped"]
    if drop:
        st["dropped"].add(ref)
    return res, drop


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, status, body=b"", ctype="application/json", extra=None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        up = self.path.rsplit("/", 1)[-1]
        if self.path.startswith("/ledger/") and up in STATE:
            with LOCK:
                st = STATE[up]
                by_ref = {}
                for e in st["effects"]:
                    by_ref[e["reference"]] = by_ref.get(e["reference"], 0) + 1
                out = {"effects": st["effects"], "pay_requests": st["pay_requests"],
                       "by_ref": by_ref}
            return self.send(200, json.dumps(out).encode())
        self.send(404 if self.path != "/" else 200)

    def do_DELETE(self):
        with LOCK:
            SESSIONS.discard(self.headers.get("Mcp-Session-Id"))
        self.send(200)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/admin/forget-sessions":
            with LOCK:
                SESSIONS.clear()
            return self.send(200)
        parts = self.path.strip("/").split("/")
        if len(parts) != 2 or parts[0] not in STATE or parts[1] != "mcp":
            return self.send(404)
        up = parts[0]
        acc = self.headers.get("Accept", "")
        if "application/json" not in acc or "text/event-stream" not in acc:
            return self.send(406, b'{"error":"Accept must list both"}')
        m = json.loads(body)
        sid = self.headers.get("Mcp-Session-Id")
        extra = {}
        if m.get("method") == "initialize":
            sid = uuid.uuid4().hex
            with LOCK:
                SESSIONS.add(sid)
            extra["Mcp-Session-Id"] = sid
            res = {"protocolVersion": m["params"]["protocolVersion"],
                   "capabilities": {"tools": {}}, "serverInfo": {"name": "up-" + up, "version": "0"}}
        else:
            if not sid:
                return self.send(400, b'{"error":"Mcp-Session-Id required"}')
            with LOCK:
                known = sid in SESSIONS
            if not known:
                return self.send(404, b'{"error":"unknown session"}')
            if "id" not in m:
                return self.send(202)
            if m["method"] == "tools/list":
                res = {"tools": tools(up)}
            elif m["method"] == "tools/call":
                with LOCK:
                    res, drop = call(up, m.get("params") or {})
                if drop:  # the effect is committed; the answer is lost
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.close()
                    return
            else:
                res = None
            if res is None:
                msg = {"jsonrpc": "2.0", "id": m["id"],
                       "error": {"code": -32601, "message": "method not found"}}
        msg = locals().get("msg") or {"jsonrpc": "2.0", "id": m["id"], "result": res}
        data = json.dumps(msg).encode()
        if up == "keys":
            note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                               "params": {"level": "info", "data": "working"}})
            self.send(200, ("event: message\ndata: %s\n\nevent: message\ndata: %s\n\n"
                            % (note, data.decode())).encode(), "text/event-stream", extra)
        else:
            self.send(200, data, "application/json", extra)


class S(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


if __name__ == "__main__":
    S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
