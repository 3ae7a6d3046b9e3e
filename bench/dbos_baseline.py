#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The durable-execution baseline of `make bench` (bench/dbos_baseline.sh runs it).

The same payment two ways, closed loop, same downstream, same client threads, same run:
  onceq: POST /v1/tool-calls?wait=30s {"tool":"pay"} to a running `onceq up` (its tools file
         points at `onceq-downstream`): the submit's answer waits for the call to settle, as an
         agent calling tools one after another would ask; GET /v1/tool-calls/ID?wait=30s while
         it is not terminal (a build without the submit's wait answers at once);
  dbos:  a DBOS workflow on its SQLite system database with one step that POSTs the payment
         to the same `onceq-downstream`, the workflow id as the Idempotency-Key.
Each thread keeps one keep-alive connection per server. Prints one line per (system, threads)
with payments/s and the per-payment latency p50/p99 (ms), then the ratios.

  dbos_baseline.py --onceq HOST:PORT --downstream HOST:PORT --dir DIR [--threads 1,32]
                   [--calls-1 1000] [--calls-n 2000]
"""
import argparse
import http.client
import json
import os
import sys
import threading
import time
import uuid


def pct(v, q):
    if not v:
        return 0.0
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


class Conn:
    """One keep-alive HTTP/1.1 connection, reopened after an error."""

    def __init__(self, hostport):
        self.host, self.port = hostport.rsplit(":", 1)
        self.c = None

    def req(self, method, path, body=None, headers=None):
        for attempt in range(3):
            try:
                if self.c is None:
                    self.c = http.client.HTTPConnection(self.host, int(self.port), timeout=60)
                self.c.request(method, path, body=body, headers=headers or {})
                r = self.c.getresponse()
                data = r.read()
                return r.status, data
            except (OSError, http.client.HTTPException):
                if self.c:
                    self.c.close()
                self.c = None
                if attempt == 2:
                    raise
        return 0, b""


def run_loop(threads, calls, one):
    """Closed loop: `threads` threads run `one(i, state)` until `calls` payments are done."""
    lat, errors, lock = [], [0], threading.Lock()
    nxt = [0]

    def worker():
        state = {}
        while True:
            with lock:
                i = nxt[0]
                if i >= calls:
                    return
                nxt[0] += 1
            t0 = time.perf_counter()
            ok = False
            try:
                ok = one(i, state)
            except Exception as e:  # counted, reported
                print(f"error: {e}", file=sys.stderr)
            dt = (time.perf_counter() - t0) * 1000.0
            with lock:
                if ok:
                    lat.append(dt)
                else:
                    errors[0] += 1

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    span = time.perf_counter() - t0
    return {"n": len(lat), "errors": errors[0], "rate": len(lat) / span if span > 0 else 0,
            "p50": pct(lat, 0.5), "p99": pct(lat, 0.99)}


def onceq_one(args, run):
    def one(i, st):
        c = st.setdefault("c", Conn(args.onceq))
        body = json.dumps({"tool": "pay", "args": {"amount": 1 + i % 1000}})
        s, d = c.req("POST", "/v1/tool-calls?wait=30s", body,
                     {"Content-Type": "application/json",
                      "Idempotency-Key": f"{run}-{i}"})
        if s not in (200, 201, 202):
            raise RuntimeError(f"onceq submit: HTTP {s} {d[:200]!r}")
        call = json.loads(d)
        while call.get("status") not in ("succeeded", "failed", "needs_review"):
            s, d = c.req("GET", f"/v1/tool-calls/{call['call_id']}?wait=30s")
            if s != 200:
                raise RuntimeError(f"onceq wait: HTTP {s} {d[:200]!r}")
            call = json.loads(d)
        return call["status"] == "succeeded"
    return one


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--onceq", required=True)
    ap.add_argument("--downstream", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--threads", default="1,32")
    ap.add_argument("--calls-1", type=int, default=1000)
    ap.add_argument("--calls-n", type=int, default=2000)
    a = ap.parse_args()

    from dbos import DBOS, SetWorkflowID

    DBOS(config={"name": "onceq-baseline",
                 "system_database_url": "sqlite:///" + os.path.join(a.dir, "dbos.sqlite"),
                 "log_level": "WARNING"})
    local = threading.local()

    @DBOS.step()
    def pay_step(wfid, amount):
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = Conn(a.downstream)
        s, d = c.req("POST", "/v1/payments",
                     json.dumps({"amount": amount, "reference": wfid}),
                     {"Content-Type": "application/json", "Idempotency-Key": wfid})
        if s not in (200, 201):
            raise RuntimeError(f"downstream: HTTP {s} {d[:200]!r}")
        return json.loads(d).get("id")

    @DBOS.workflow()
    def payment(amount):
        return pay_step(DBOS.workflow_id, amount)

    DBOS.launch()
    run = uuid.uuid4().hex[:8]

    def dbos_one(i, st):
        with SetWorkflowID(f"wf-{run}-{i}"):
            return payment(1 + i % 1000) is not None

    res = {}
    for th in [int(x) for x in a.threads.split(",")]:
        calls = a.calls_1 if th == 1 else a.calls_n
        warm = min(50, calls)
        # warm-up of each side (connections, caches), then the measured runs, side by side
        run_loop(th, warm, onceq_one(a, f"warm-{run}-{th}"))
        run_loop(th, warm, lambda i, st: dbos_one(10_000_000 * th + i, st))
        o = run_loop(th, calls, onceq_one(a, f"m-{run}-{th}"))
        d = run_loop(th, calls, lambda i, st: dbos_one(20_000_000 * th + i, st))
        res[th] = (o, d)
        for name, r in (("onceq", o), ("dbos", d)):
            print(f"  {name:6s} threads={th:<3d} payments={r['n']:<6d} errors={r['errors']:<3d} "
                  f"{r['rate']:8.0f} payments/s  p50 {r['p50']:7.1f} ms  p99 {r['p99']:7.1f} ms")
        ratio = lambda x, y: x / y if y > 0 else float("nan")
        print(f"  ratio onceq/dbos threads={th}: payments/s {ratio(o['rate'], d['rate']):.2f}x, "
              f"p50 {ratio(o['p50'], d['p50']):.2f}, p99 {ratio(o['p99'], d['p99']):.2f}")
        sys.stdout.flush()
    DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
