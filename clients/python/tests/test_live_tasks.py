# SPDX-License-Identifier: Apache-2.0
"""Tasks against a live pipeline (tests/integration/test_clients.sh starts it and sets
ONCEQ_TEST_URL; ONCEQ_TEST_KEYS_OUT: every step's and compensation's derived key and call id
are appended, so the script checks one call per key and one effect per succeeded call).
Skipped when ONCEQ_TEST_URL is not set."""
import asyncio
import os
import unittest
import uuid

import onceq

URL = os.environ.get("ONCEQ_TEST_URL")
RUN = uuid.uuid4().hex[:8]


def record(task):
    """Each call of the task: KEY/STEP and KEY/STEP/compensate with their call ids."""
    out = os.environ.get("ONCEQ_TEST_KEYS_OUT")
    if not out:
        return
    with open(out, "a") as f:
        for s in task.steps:
            if s.call_id:
                f.write("%s/%s %s\n" % (task.idem_key, s.name, s.call_id))
            if s.compensation and s.compensation.get("call_id"):
                f.write("%s/%s/compensate %s\n" % (task.idem_key, s.name,
                                                   s.compensation["call_id"]))


CHAIN = [
    {"name": "charge", "tool": "charge", "args": {"amount": 11},
     "compensate": {"tool": "charge", "args": {"amount": 1,
                                               "currency": "{steps.charge.result.charge_id}"}}},
    {"name": "again", "tool": "charge", "args": {"amount": "{steps.charge.result.charged}"}},
]


@unittest.skipUnless(URL, "needs ONCEQ_TEST_URL (a running pipeline)")
class LiveTaskTest(unittest.TestCase):
    def test_task_succeeds_with_a_reference(self):
        c = onceq.Client(URL)
        key = "py-task-ok-" + RUN
        t = c.run_task(CHAIN, key=key, timeout=90)
        record(t)
        self.assertEqual((t.status, t.idem_key), ("succeeded", key))
        self.assertTrue(t.task_id.startswith("t_"))
        self.assertEqual([s.status for s in t.steps], ["succeeded", "succeeded"])
        # the second step's amount cited the first step's result, with its JSON type
        self.assertEqual(t.step("again").result["charged"], 11)
        self.assertEqual(c.get_task(t.task_id).status, "succeeded")
        self.assertEqual(c.get_task_by_key(key).task_id, t.task_id)
        again = c.submit_task(CHAIN, key=key)
        self.assertEqual((again.task_id, again.replayed), (t.task_id, True))
        with self.assertRaises(onceq.IdempotencyConflict):
            c.submit_task(CHAIN[:1], key=key)
        with self.assertRaises(onceq.BadRequest) as cm:
            c.submit_task([{"name": "a", "tool": "charge", "args": {"x": "{steps.b.result}"}}],
                          key="py-task-bad-" + RUN)
        self.assertEqual(cm.exception.code, "bad_reference")
        with self.assertRaises(onceq.NotFound):
            c.get_task("t_" + "0" * 32)

    def test_task_compensated_async(self):
        steps = CHAIN[:1] + [{"name": "boom", "tool": "fail", "args": {}}]
        key = "py-task-comp-" + RUN
        t = asyncio.run(onceq.AsyncClient(URL).run_task(steps, key=key, timeout=90))
        record(t)
        self.assertEqual(t.status, "compensated", t.raw)
        self.assertEqual([s.status for s in t.steps], ["compensated", "failed"])
        self.assertEqual(t.step("charge").compensation["status"], "succeeded")
        self.assertTrue(t.terminal)

    def test_approval_resolved_over_http(self):
        c = onceq.Client(URL)
        key = "py-task-appr-" + RUN
        steps = [dict(CHAIN[0]), {"name": "ship", "tool": "charge", "args": {"amount": 3},
                                  "approval": True, "irreversible": True}]
        t = c.submit_task(steps, key=key)
        t = c.wait_task(t.task_id, 90, until=("awaiting_approval",) + onceq.TASK_TERMINAL)
        self.assertEqual(t.status, "awaiting_approval", t.raw)
        self.assertIsNone(t.step("ship").call_id)
        with self.assertRaises(onceq.ReviewConflict) as cm:
            c.resolve_task(t.task_id, "approve", fence=t.fence + 1, note="stale", by="py")
        self.assertEqual(cm.exception.code, "review_moved")
        r = c.resolve_task(t.task_id, "approve", fence=t.fence, note="checked", by="py")
        self.assertEqual(r.status, "running")
        done = asyncio.run(onceq.AsyncClient(URL).wait_task(t.task_id, 90))
        record(done)
        self.assertEqual(done.status, "succeeded", done.raw)
        with self.assertRaises(onceq.ReviewConflict) as cm:
            c.resolve_task(t.task_id, "approve", fence=t.fence, note="again", by="py")
        self.assertEqual(cm.exception.code, "not_awaiting_approval")

    def test_wait_task_times_out(self):
        c = onceq.Client(URL)
        slow = {"name": "s", "tool": "charge", "args": {"amount": 2, "delay_ms": 3000}}
        t = c.submit_task([slow], key="py-task-slow-" + RUN)
        with self.assertRaises(onceq.WaitTimeout) as cm:
            c.wait_task(t.task_id, 0.5)
        self.assertEqual(cm.exception.call.task_id, t.task_id)
        record(c.wait_task(t.task_id, 90))


if __name__ == "__main__":
    unittest.main()
