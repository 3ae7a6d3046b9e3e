# SPDX-License-Identifier: Apache-2.0
"""Tests against a live pipeline (tests/integration/test_clients.sh starts it and sets
ONCEQ_TEST_URL; ONCEQ_TEST_PROXY: tests/tools/oq_chaos_proxy.py; ONCEQ_TEST_KEYS_OUT: a file
where every key and call id is appended, so the script can count calls and effects per key).
Skipped when ONCEQ_TEST_URL is not set."""
import asyncio
import os
import socket
import subprocess
import sys
import time
import unittest
import urllib.parse
import uuid

import onceq

URL = os.environ.get("ONCEQ_TEST_URL")
RUN = uuid.uuid4().hex[:8]


def record(call):
    out = os.environ.get("ONCEQ_TEST_KEYS_OUT")
    if out:
        with open(out, "a") as f:
            f.write("%s %s\n" % (call.idem_key, call.call_id))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipUnless(URL, "needs ONCEQ_TEST_URL (a running pipeline)")
class LiveTest(unittest.TestCase):
    def proxy(self, mode):
        """A chaos proxy that faults exactly the first request it gets; its URL."""
        port = free_port()
        up = urllib.parse.urlsplit(URL).port
        p = subprocess.Popen([sys.executable, os.environ["ONCEQ_TEST_PROXY"], "--listen",
                              str(port), "--upstream", str(up), "--modes", mode, "--rate", "1",
                              "--max-faults", "1", "--delay-ms", "2500"],
                             stdout=subprocess.PIPE, text=True)
        self.addCleanup(p.wait)
        self.addCleanup(p.terminate)
        line = p.stdout.readline()
        self.assertTrue(line.startswith("listening"), line)
        self.proxy_proc = p
        return "http://127.0.0.1:%d" % port

    def test_call_succeeds_and_reads_back(self):
        c = onceq.Client(URL)
        key = "py-ok-" + RUN
        call = c.call("charge", {"amount": 5}, key=key, timeout=60)
        record(call)
        self.assertEqual(call.status, "succeeded")
        self.assertEqual(call.fingerprint, onceq.fingerprint("default", "charge", {"amount": 5}))
        self.assertEqual(c.get(call.call_id).status, "succeeded")
        self.assertEqual(c.get_by_key(key).call_id, call.call_id)
        again = c.submit("charge", {"amount": 5}, key=key)
        self.assertEqual((again.call_id, again.replayed), (call.call_id, True))

    def test_failed_tool(self):
        call = onceq.Client(URL).call("fail", {}, key="py-fail-" + RUN, timeout=60)
        record(call)
        self.assertEqual(call.status, "failed")
        self.assertEqual(call.error["code"], "tool_failed")

    def test_conflict_422(self):
        c = onceq.Client(URL)
        key = "py-conflict-" + RUN
        record(c.submit("charge", {"amount": 1}, key=key))
        with self.assertRaises(onceq.IdempotencyConflict) as cm:
            c.submit("charge", {"amount": 2}, key=key)
        self.assertEqual((cm.exception.status, cm.exception.code), (422, "idempotency_conflict"))
        with self.assertRaises(onceq.NotFound):
            c.get("c_" + "0" * 32)

    def retried(self, mode, use_async):
        log = []
        url = self.proxy(mode)
        c = (onceq.AsyncClient if use_async else onceq.Client)(url, timeout=1.0, log=log.append)
        key = "py-%s-%s-%s" % (mode, "async" if use_async else "sync", RUN)
        args = {"amount": 7, "memo": "caf\u00e9 \U0001F602", "rate": 0.1}
        if use_async:
            call = asyncio.run(c.call("charge", args, key=key, timeout=60))
        else:
            call = c.call("charge", args, key=key, timeout=60)
        record(call)
        self.assertEqual((call.status, call.idem_key), ("succeeded", key))
        self.assertTrue(log and "attempt 1 failed" in log[0], log)
        if mode == "delay":
            self.assertIn("timeout", log[0])
        # the retry was answered with the call the dropped attempt created
        self.assertTrue(onceq.Client(URL).submit("charge", args, key=key).replayed)
        self.proxy_proc.terminate()
        out = self.proxy_proc.communicate(timeout=10)[0]
        self.assertIn("fault 1 mode=" + mode, out)

    def test_retry_after_dropped_response_sync(self):
        self.retried("drop-response", False)

    def test_retry_after_dropped_response_async(self):
        self.retried("drop-response", True)

    def test_retry_after_timeout_sync(self):
        self.retried("delay", False)

    def test_long_poll_wait(self):
        c = onceq.Client(URL, poll_wait=5)
        call = c.submit("charge", {"amount": 9}, key="py-wait-" + RUN)
        record(call)
        t0 = time.monotonic()
        done = c.wait(call.call_id, timeout=60)
        self.assertEqual(done.status, "succeeded")
        self.assertLess(time.monotonic() - t0, 60)


if __name__ == "__main__":
    unittest.main()
