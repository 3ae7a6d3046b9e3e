# SPDX-License-Identifier: Apache-2.0
"""A downstream that declines the first FAIL requests of each Idempotency-Key, then accepts.

usage: flaky_downstream.py PORT FAIL LOG

POST any path: 402 {"code":"declined"} for the first FAIL requests carrying a given
Idempotency-Key, then 201 {"id": "r_<n>", "idempotency_key": KEY} for every later one. Each
request is appended to LOG as "KEY STATUS" (one line, flushed), so a test counts the attempts
and the effects (the 201 lines) per key. GET /healthz answers 200. Loopback only.
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, FAIL, LOG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
seen = {}
lock = threading.Lock()


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(200, {"status": "ok"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        key = self.headers.get("Idempotency-Key") or "-"
        with lock:
            seen[key] = seen.get(key, 0) + 1
            k = seen[key]
            status = 402 if k <= FAIL else 201
            with open(LOG, "a") as f:
                f.write(f"{key} {status}\n")
        if status == 402:
            self.reply(402, {"code": "declined", "message": "injected decline %d" % k})
        else:
            self.reply(201, {"id": "r_%d" % k, "idempotency_key": key})


ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
