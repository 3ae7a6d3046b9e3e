# SPDX-License-Identifier: Apache-2.0
"""A downstream whose answers are legal but awkward for a canonical JSON writer.

usage: odd_downstream.py PORT LOG

POST /big64   201 {"id":"p_big64","seq":9007199254740993}   (an integer past 2^53)
POST /big128  201 {"id":"p_big128","seq":1234...890}        (past what a 64-bit int holds)
POST /plain   200 "paid" as text/plain                      (not JSON)
POST /decline 402 {"error":{"message":"a" + 150 euro signs}} (a byte limit cuts a character)
POST /large   201 {"id":"p_large","pad":"xxx..."}, 100,000 bytes (over what a result keeps)
POST /latin1  201 {"id":"p_latin1","name":"caf\xe9"} (a Latin-1 byte: not UTF-8)
GET /healthz  200. Each POST appends "PATH STATUS IDEMPOTENCY-KEY" to LOG (one line, flushed),
so the test counts the effects per key. Loopback only. The bodies are written byte for byte
(not through json.dumps), as the test compares them with what onceq kept.
"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG = int(sys.argv[1]), sys.argv[2]
EURO = "\u20ac"
ANSWERS = {
    "/big64": (201, "application/json", '{"id":"p_big64","seq":9007199254740993}'),
    "/big128": (201, "application/json",
                '{"id":"p_big128","seq":123456789012345678901234567890}'),
    "/plain": (200, "text/plain", "paid"),
    "/decline": (402, "application/json",
                 '{"error":{"message":"a' + EURO * 150 + '"}}'),
    "/large": (201, "application/json",
               '{"id":"p_large","pad":"' + "x" * (100000 - 25) + '"}'),
    "/latin1": (201, "application/json", b'{"id":"p_latin1","name":"caf\xe9"}'),
}


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, status, ctype, text):
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(200, "application/json", '{"status":"ok"}')

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        status, ctype, text = ANSWERS.get(self.path, (404, "application/json", "{}"))
        with open(LOG, "a") as f:
            f.write(f"{self.path} {status} {self.headers.get('Idempotency-Key') or '-'}\n")
        self.reply(status, ctype, text)


ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
