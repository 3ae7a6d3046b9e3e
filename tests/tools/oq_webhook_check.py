#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Webhook test helper (tests/integration/test_webhooks*.sh).

  receiver --port P --out FILE [--status-file F] [--delay-ms N]
      An HTTP/1.1 receiver (ThreadingHTTPServer, loopback): every POST is appended to FILE as
      one JSON line {"key", "sig", "body"}; it answers the status written in --status-file
      (read per request; 200 when the file is absent).
  submit --url URL --n N --prefix P --callback CB [--tenant T] [--token TOK] [--threads 8]
      N submits with callback_url CB (keys P-0..P-N-1); prints the call ids, one a line.
  check --out FILE --calls IDS --secret S --src ONCEQ_SRC [--min-copies-checked N]
      Every call of IDS has a delivery (deduplicated by Idempotency-Key), every copy's
      signature verifies with clients/python's onceq.verify_webhook, copies of one key are
      byte-identical and name one call, each body is the settled call; a tampered body fails
      verification. Prints the figures as JSON; exit 1 on any failure.
"""
import argparse
import http.client
import http.server
import json
import os
import sys
import threading
import urllib.parse


def receiver(a):
    lock = threading.Lock()
    out = open(a.out, "a", buffering=1)

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n)
            status = 200
            if a.status_file and os.path.exists(a.status_file):
                try:
                    status = int(open(a.status_file).read().strip() or 200)
                except ValueError:
                    status = 200
            if a.delay_ms:
                threading.Event().wait(a.delay_ms / 1000.0)
            rec = {"key": self.headers.get("Idempotency-Key"),
                   "sig": self.headers.get("Onceq-Signature"),
                   "status": status,
                   "body": body.decode("utf-8", "replace")}
            with lock:
                out.write(json.dumps(rec) + "\n")
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    class S(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

    srv = S(("127.0.0.1", a.port), H)
    srv.serve_forever()


def submit(a):
    u = urllib.parse.urlparse(a.url)
    ids = [None] * a.n
    errors = []

    def run(k0):
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        for i in range(k0, a.n, a.threads):
            body = {"tool": "charge", "args": {"amount": i}, "callback_url": a.callback}
            if a.tenant:
                body["tenant"] = a.tenant
            h = {"Idempotency-Key": "%s-%d" % (a.prefix, i), "Content-Type": "application/json"}
            if a.token:
                h["Authorization"] = "Bearer " + a.token
            for _ in range(20):
                try:
                    c.request("POST", "/v1/tool-calls", json.dumps(body), h)
                    r = c.getresponse()
                    data = r.read()
                except (OSError, http.client.HTTPException):
                    c.close()
                    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
                    threading.Event().wait(0.5)
                    continue
                if r.status in (200, 202):
                    ids[i] = json.loads(data)["call_id"]
                    break
                if r.status == 503:
                    threading.Event().wait(0.5)
                    continue
                errors.append("%d: HTTP %d %s" % (i, r.status, data[:200]))
                break
        c.close()

    ts = [threading.Thread(target=run, args=(k,)) for k in range(a.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors or None in ids:
        print("submit failed: %s; unanswered %d" % (errors[:5], ids.count(None)), file=sys.stderr)
        return 1
    print("\n".join(ids))
    return 0


def check(a):
    sys.path.insert(0, os.path.join(a.src, "clients", "python", "src"))
    import onceq  # the client package's helper: the receivers' side of the scheme

    want = set(l.strip() for l in open(a.calls) if l.strip())
    recs = [json.loads(l) for l in open(a.out) if l.strip()]
    fail = []
    by_key = {}
    for r in recs:
        if not r["key"]:
            fail.append("a delivery without Idempotency-Key")
            continue
        try:
            onceq.verify_webhook(a.secret, r["body"].encode("utf-8"), r["sig"], tolerance_s=0)
        except onceq.WebhookSignatureError as e:
            fail.append("bad signature on %s: %s" % (r["key"], e))
        prev = by_key.setdefault(r["key"], r["body"])
        if prev != r["body"]:
            fail.append("two bodies under one key %s" % r["key"])
    delivered = {}
    for k, body in by_key.items():
        c = json.loads(body)
        if c.get("status") not in ("succeeded", "failed"):
            fail.append("delivery %s of a call not settled: %s" % (k, c.get("status")))
        if c["call_id"] in delivered:
            fail.append("call %s delivered under two keys" % c["call_id"])
        delivered[c["call_id"]] = k
    missing = want - set(delivered)
    extra = set(delivered) - want
    if missing:
        fail.append("%d calls have no delivery, e.g. %s" % (len(missing), sorted(missing)[:3]))
    if extra:
        fail.append("%d deliveries of calls not submitted here" % len(extra))
    # a tampered body must not verify (one byte changed, the same header)
    tampered_refused = None
    if recs:
        r = recs[0]
        b = bytearray(r["body"].encode("utf-8"))
        b[len(b) // 2] ^= 0x01
        try:
            onceq.verify_webhook(a.secret, bytes(b), r["sig"], tolerance_s=0)
            tampered_refused = False
            fail.append("a tampered body verified")
        except onceq.WebhookSignatureError:
            tampered_refused = True
        try:
            onceq.verify_webhook(a.secret + "x", r["body"].encode("utf-8"), r["sig"],
                                 tolerance_s=0)
            fail.append("a body verified with another secret")
        except onceq.WebhookSignatureError:
            pass
    print(json.dumps({"requests": len(recs), "distinct_keys": len(by_key),
                      "distinct_calls": len(delivered), "expected_calls": len(want),
                      "duplicates_absorbed": len(recs) - len(by_key),
                      "tampered_refused": tampered_refused, "failures": fail[:10]}))
    return 1 if fail else 0


def main():
    p = argparse.ArgumentParser()
    sp = p.add_subparsers(dest="cmd", required=True)
    r = sp.add_parser("receiver")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--status-file")
    r.add_argument("--delay-ms", type=int, default=0)
    s = sp.add_parser("submit")
    s.add_argument("--url", required=True)
    s.add_argument("--n", type=int, required=True)
    s.add_argument("--prefix", required=True)
    s.add_argument("--callback", required=True)
    s.add_argument("--tenant")
    s.add_argument("--token")
    s.add_argument("--threads", type=int, default=8)
    c = sp.add_parser("check")
    c.add_argument("--out", required=True)
    c.add_argument("--calls", required=True)
    c.add_argument("--secret", required=True)
    c.add_argument("--src", required=True)
    a = p.parse_args()
    return {"receiver": receiver, "submit": submit, "check": check}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
