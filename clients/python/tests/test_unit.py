# SPDX-License-Identifier: Apache-2.0
"""Tests that need no pipeline: webhook vectors, error mapping, retries and the wait loop
against a scripted stub server on loopback."""
import asyncio
import http.server
import json
import threading
import time
import unittest

import onceq

SECRET = "whsec_test"
BODY = b'{"call_id":"c_1","status":"succeeded"}'
# HMAC-SHA256("whsec_test", "1700000000." + BODY), computed with
# printf '1700000000.%s' "$BODY" | openssl dgst -sha256 -hmac whsec_test
VECTOR = "t=1700000000,v1=bbe9ca5a9906cc70ea96166155593457f6e8f2b1431cb2a255f0c46ce8461a23"


def call_json(status="pending", cid="c_0123456789abcdef"):
    return {"call_id": cid, "status": status, "tenant": "default", "idem_key": "k",
            "fingerprint": "f", "tool": "charge", "args": {}, "attempt": 1, "result": None,
            "error": None, "effect_id": None, "created_at": "", "updated_at": "",
            "expires_at": "", "query_url": "/v1/tool-calls/" + cid, "extra_field": 1}


class Stub:
    """A server that answers each request with the next scripted (status, headers, body,
    delay_s); it records (method, path, headers, body, time) of every request."""

    def __init__(self, script):
        self.script = list(script)
        self.seen = []
        stub = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def handle_one(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                stub.seen.append((self.command, self.path, dict(self.headers), body,
                                  time.monotonic()))
                status, headers, out, delay = stub.script.pop(0) if len(stub.script) > 1 \
                    else stub.script[0]
                if delay:
                    time.sleep(delay)
                data = json.dumps(out).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = handle_one

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def err(code, msg="m"):
    return {"error": {"code": code, "message": msg}}


class WebhookTest(unittest.TestCase):
    def test_known_vector(self):
        self.assertEqual(onceq.sign_webhook(SECRET, BODY, 1700000000), VECTOR)
        self.assertEqual(onceq.verify_webhook(SECRET, BODY, VECTOR, now=1700000100), 1700000000)
        self.assertEqual(onceq.verify_webhook(SECRET.encode(), BODY, VECTOR, tolerance_s=0),
                         1700000000)

    def test_tampered_body_fails(self):
        with self.assertRaises(onceq.WebhookSignatureError):
            onceq.verify_webhook(SECRET, BODY.replace(b"succeeded", b"failed"), VECTOR,
                                 now=1700000100)

    def test_wrong_secret_old_timestamp_and_malformed_fail(self):
        for secret, header, now in ((b"other", VECTOR, 1700000100),
                                    (SECRET, VECTOR, 1700000000 + 301),
                                    (SECRET, "v1=" + VECTOR.split("v1=")[1], 1700000000),
                                    (SECRET, "t=1700000000", 1700000000),
                                    (SECRET, "", 1700000000),
                                    (SECRET, "t=1700000000,v1=\u00e9", 1700000000)):
            with self.assertRaises(onceq.WebhookSignatureError, msg=header):
                onceq.verify_webhook(secret, BODY, header, now=now)

    def test_rotation_any_v1_matches(self):
        h = "t=1700000000,v1=" + "0" * 64 + "," + VECTOR.split(",")[1]
        self.assertEqual(onceq.verify_webhook(SECRET, BODY, h, now=1700000000), 1700000000)


class RetryTest(unittest.TestCase):
    def test_503_retry_after_then_accepted_same_key_same_body(self):
        s = Stub([(503, {"Retry-After": "1"}, err("unavailable"), 0),
                  (202, {}, call_json(), 0)])
        self.addCleanup(s.close)
        c = onceq.Client(s.url, backoff=0.01)
        call = c.submit("charge", {"amount": 1}, key="k1")
        self.assertEqual(call.status, "pending")
        self.assertEqual(len(s.seen), 2)
        self.assertGreaterEqual(s.seen[1][4] - s.seen[0][4], 1.0)  # honoured Retry-After
        self.assertEqual(s.seen[0][2]["Idempotency-Key"], "k1")
        self.assertEqual(s.seen[1][2]["Idempotency-Key"], "k1")
        self.assertEqual(s.seen[0][3], s.seen[1][3])

    def test_429_and_500_retried_until_deadline(self):
        s = Stub([(429, {}, err("rate_limited"), 0), (500, {}, {}, 0)])
        self.addCleanup(s.close)
        c = onceq.Client(s.url, backoff=0.05, backoff_max=0.2, retry_deadline=1.0)
        t0 = time.monotonic()
        with self.assertRaises(onceq.Unavailable):
            c.submit("charge", {}, key="k2")
        self.assertLess(time.monotonic() - t0, 3.0)
        self.assertGreater(len(s.seen), 2)

    def test_conflict_is_typed_and_not_retried(self):
        s = Stub([(422, {}, err("idempotency_conflict", "another request"), 0)])
        self.addCleanup(s.close)
        with self.assertRaises(onceq.IdempotencyConflict) as cm:
            onceq.Client(s.url).submit("charge", {}, key="k3")
        self.assertEqual(cm.exception.code, "idempotency_conflict")
        self.assertEqual(cm.exception.status, 422)
        self.assertEqual(len(s.seen), 1)

    def test_typed_errors(self):
        for status, code, cls in ((400, "bad_request", onceq.BadRequest),
                                  (401, "unauthorized", onceq.Unauthorized),
                                  (403, "tenant_mismatch", onceq.TenantMismatch),
                                  (404, "not_found", onceq.NotFound),
                                  (413, "payload_too_large", onceq.PayloadTooLarge)):
            s = Stub([(status, {}, err(code), 0)])
            try:
                with self.assertRaises(cls):
                    onceq.Client(s.url).get("c_x")
            finally:
                s.close()

    def test_token_from_environment(self):
        import os
        s = Stub([(200, {}, call_json("succeeded"), 0)])
        self.addCleanup(s.close)
        os.environ["ONCEQ_TOKEN"] = "tok-env"
        try:
            onceq.Client(s.url).get("c_x")
            onceq.Client(s.url, token="tok-arg").get("c_x")
        finally:
            del os.environ["ONCEQ_TOKEN"]
        self.assertEqual(s.seen[0][2]["Authorization"], "Bearer tok-env")
        self.assertEqual(s.seen[1][2]["Authorization"], "Bearer tok-arg")

    def test_connection_refused_is_transport_error(self):
        s = Stub([(200, {}, {}, 0)])
        url = s.url
        s.close()
        with self.assertRaises(onceq.TransportError):
            onceq.Client(url, retry_deadline=0.5, backoff=0.05).get("c_x")


class WaitTest(unittest.TestCase):
    def test_server_ignoring_wait_is_asked_again_with_pauses(self):
        s = Stub([(200, {}, call_json("running"), 0)] * 3 + [(200, {}, call_json("succeeded"), 0)])
        self.addCleanup(s.close)
        call = onceq.Client(s.url).wait("c_0123456789abcdef", timeout=20)
        self.assertEqual(call.status, "succeeded")
        self.assertEqual(len(s.seen), 4)
        self.assertTrue(s.seen[0][1].endswith("?wait=20s"), s.seen[0][1])
        self.assertGreaterEqual(s.seen[3][4] - s.seen[0][4], 0.1 + 0.2 + 0.4 - 0.05)

    def test_server_holding_the_request_is_asked_again_at_once(self):
        s = Stub([(200, {}, call_json("running"), 1.2), (200, {}, call_json("failed"), 0)])
        self.addCleanup(s.close)
        c = onceq.Client(s.url, poll_wait=2)
        t0 = time.monotonic()
        self.assertEqual(c.wait("c_0123456789abcdef").status, "failed")
        self.assertEqual(len(s.seen), 2)
        self.assertTrue(s.seen[0][1].endswith("?wait=2s"), s.seen[0][1])
        self.assertLess(s.seen[1][4] - s.seen[0][4], 1.2 + 0.09)  # no pause after a held answer

    def test_wait_timeout(self):
        s = Stub([(200, {}, call_json("running"), 0)])
        self.addCleanup(s.close)
        with self.assertRaises(onceq.WaitTimeout) as cm:
            onceq.Client(s.url).wait("c_0123456789abcdef", timeout=1.0)
        self.assertEqual(cm.exception.call.status, "running")

    def test_async_call(self):
        s = Stub([(503, {"Retry-After": "1"}, err("unavailable"), 0),
                  (202, {"Idempotent-Replayed": "true"}, call_json("running"), 0),
                  (200, {}, call_json("succeeded"), 0)])
        self.addCleanup(s.close)
        call = asyncio.run(onceq.AsyncClient(s.url).call("charge", {}, key="k4", timeout=10))
        self.assertEqual(call.status, "succeeded")
        self.assertEqual([m for m, *_ in s.seen], ["POST", "POST", "GET"])
        self.assertGreaterEqual(s.seen[1][4] - s.seen[0][4], 1.0)


if __name__ == "__main__":
    unittest.main()
