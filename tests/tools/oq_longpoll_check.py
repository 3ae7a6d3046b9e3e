#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GET /v1/tool-calls/{id}?wait= (long poll) against a running producer whose results ingest
reads the embedded broker; results are injected with kcat. Run by
tests/integration/test_producer_wait.sh, one step per invocation:

  latency   a waiting client is answered once the result is applied, not before; measured
            against a concurrent poller (no wait, every 5 ms) that sees the committed state
  deadline  at the deadline the answer is 200 with the call still pending (by id and by key);
            bad waits are 400 bad_request; a call terminal already is answered at once
  many      N concurrent waiting clients (asyncio, one connection each; one in ten by key) are
            all answered with the terminal call; the producer's thread count does not grow with them
  shutdown  clients waiting when the producer gets SIGTERM are all answered (200, pending)
  call      `onceq call` (--client onceq) or an example client (--client py|js,
            clients/python, clients/typescript) waits by long poll: a call that takes seconds costs it one or
            two status requests, not one per poll interval
  submitwait  POST /v1/tool-calls?wait= answers once the call is terminal, not before (200 with
            the result); a replay of a settled call at once; at the deadline 202 pending; a bad
            wait 400 bad_request with nothing written

Stdlib only. Prints figures as "figure NAME VALUE" lines; exits 1 with a message on failure.
"""
import argparse
import asyncio
import datetime
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def figure(name, value):
    print("figure %s %s" % (name, value), flush=True)


class Api:
    def __init__(self, url, brokers):
        self.url = url.rstrip("/")
        self.brokers = brokers

    def req(self, method, path, body=None, headers=None, timeout=90):
        data = json.dumps(body).encode() if body is not None else None
        r = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if data is not None:
            r.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(r, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def submit(self, key):
        st, c = self.req("POST", "/v1/tool-calls", {"tool": "charge", "args": {"k": key}},
                         {"Idempotency-Key": key})
        if st not in (200, 202):
            fail("submit %s: %s %s" % (key, st, c))
        return c

    def get(self, call_id, wait=None, timeout=90):
        q = "?wait=" + wait if wait is not None else ""
        return self.req("GET", "/v1/tool-calls/" + call_id + q, timeout=timeout)

    def metric(self, name):
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        pat = re.escape(name) if "{" in name else re.escape(name) + r"(?:\{[^}]*\})?"
        m = re.search(r"^%s ([0-9.e+-]+)$" % pat, text, re.M)
        return float(m.group(1)) if m else None

    def inject(self, calls, status="succeeded"):
        """One tool_result per call, keyed by call id, in one kcat run."""
        lines = []
        for c in calls:
            env = {"v": 1, "kind": "tool_result", "message_id": str(uuid.uuid4()),
                   "call_id": c["call_id"], "tenant": c["tenant"], "idem_key": c["idem_key"],
                   "fingerprint": c["fingerprint"], "tool": c["tool"], "attempt": c["attempt"],
                   "created_at": int(time.time() * 1000), "status": status,
                   "result": {"ok": True} if status == "succeeded" else None, "error": None,
                   "effect_id": "e-" + c["call_id"]}
            lines.append(c["call_id"] + "|" + json.dumps(env, separators=(",", ":")))
        p = subprocess.run(["kcat", "-P", "-b", self.brokers, "-t", "onceq.tool-results", "-K",
                            "|"], input="\n".join(lines) + "\n", text=True, timeout=60)
        if p.returncode != 0:
            fail("kcat produce failed")


def wait_metric(api, name, want, seconds):
    end = time.monotonic() + seconds
    v = None
    while time.monotonic() < end:
        v = api.metric(name)
        if v is not None and v >= want:
            return v
        time.sleep(0.05)
    return v


def threads_of(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    fail("no Threads: line for pid %d" % pid)


# --- steps -----------------------------------------------------------------------------------

def step_latency(api, args):
    c = api.submit("lp-latency")
    cid = c["call_id"]
    out = {}

    def waiter():
        t0 = time.monotonic()
        st, body = api.get(cid, "30s", timeout=60)
        out["waiter_wall"] = time.time()
        out["waiter"] = (time.monotonic(), st, body, time.monotonic() - t0)

    def poller():
        while time.monotonic() < stop_at:
            st, body = api.get(cid)
            if st == 200 and body["status"] == "succeeded":
                out["poller"] = time.monotonic()
                return
            time.sleep(0.005)

    stop_at = time.monotonic() + 60
    tw = threading.Thread(target=waiter)
    tw.start()
    time.sleep(1.0)
    if "waiter" in out:
        _, st, body, el = out["waiter"]
        fail("?wait=30s answered after %.3f s, before any result: %s %s" % (el, st, body))
    tp = threading.Thread(target=poller)
    tp.start()
    t_inject = time.monotonic()
    api.inject([c])
    tw.join(60)
    tp.join(60)
    if "waiter" not in out:
        fail("the waiting client got no answer")
    t_ans, st, body, _ = out["waiter"]
    if st != 200 or body.get("status") != "succeeded":
        fail("waiting client: expected 200 succeeded, got %s %s" % (st, body))
    if "poller" not in out:
        fail("the poller never saw succeeded")
    lag = t_ans - out["poller"]
    figure("latency_after_poller_ms", "%.1f" % (lag * 1000))
    figure("latency_after_inject_ms", "%.1f" % ((t_ans - t_inject) * 1000))
    # upper bound from the state change itself: updated_at is taken when the writer's batch
    # begins, before its commit (wall clock, ms)
    upd = datetime.datetime.strptime(body["updated_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    figure("latency_after_updated_at_ms", "%.1f" % ((out["waiter_wall"] - upd) * 1000))
    # the poller sees the commit at most 5 ms + one GET after it; the waiter should be as quick
    if lag > args.bound:
        fail("the waiting client was answered %.0f ms after a poller saw the terminal state "
             "(bound %.0f ms)" % (lag * 1000, args.bound * 1000))


def step_deadline(api, args):
    c = api.submit("lp-deadline")
    cid = c["call_id"]
    for path, wait, secs in (("/v1/tool-calls/" + cid, "2s", 2.0),
                             ("/v1/tool-calls/by-key/lp-deadline", "1500ms", 1.5),
                             ("/v1/tool-calls/" + cid, "1", 1.0)):
        t0 = time.monotonic()
        st, body = api.req("GET", path + "?wait=" + wait, timeout=60)
        el = time.monotonic() - t0
        figure("deadline_%s_s" % wait, "%.3f" % el)
        if st != 200 or body.get("status") != "pending":
            fail("%s?wait=%s: expected 200 pending, got %s %s" % (path, wait, st, body))
        if el < secs - 0.05 or el > secs + 5:
            fail("%s?wait=%s answered after %.3f s" % (path, wait, el))
    for bad in ("abc", "61s", "2m", "-1", "1.5s", "1h", ""):
        st, body = api.get(cid, bad)
        if st != 400 or body["error"]["code"] != "bad_request":
            fail("?wait=%s: expected 400 bad_request, got %s %s" % (bad, st, body))
    t0 = time.monotonic()
    st, body = api.get(cid, "0")
    if st != 200 or time.monotonic() - t0 > 1:
        fail("?wait=0: expected 200 at once, got %s after %.3f s" % (st, time.monotonic() - t0))
    st, body = api.req("GET", "/v1/tool-calls/by-key/no-such-key?wait=5s")
    if st != 404:
        fail("by-key of an unknown key with wait: expected 404 at once, got %s" % st)
    # terminal already: answered at once
    api.inject([c], "failed")
    end = time.monotonic() + 30
    while api.get(cid)[1]["status"] != "failed":
        if time.monotonic() > end:
            fail("the failed result was not applied")
        time.sleep(0.05)
    t0 = time.monotonic()
    st, body = api.get(cid, "30s")
    el = time.monotonic() - t0
    figure("terminal_already_ms", "%.1f" % (el * 1000))
    if st != 200 or body["status"] != "failed" or el > 1:
        fail("a terminal call with ?wait=30s: %s %s after %.3f s" % (st, body, el))


async def raw_get(host, port, path, timeout):
    """One GET on its own connection; returns (status, body, monotonic time of the answer)."""
    r, w = await asyncio.open_connection(host, port)
    w.write(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n" %
             (path, host, port)).encode())
    await w.drain()
    data = await asyncio.wait_for(r.read(), timeout)
    t = time.monotonic()
    w.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    try:
        return status, json.loads(body), t
    except ValueError:
        return status, None, t


def host_port(url):
    m = re.match(r"^http://([^:/]+):(\d+)", url)
    return m.group(1), int(m.group(2))


def step_many(api, args):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.clients + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.clients + 256), hard))
    ncalls = 50
    calls = [api.submit("lp-many-%d" % i) for i in range(ncalls)]
    host, port = host_port(api.url)
    threads_before = threads_of(args.pid)
    figure("producer_threads_before", threads_before)

    async def run():
        def path(i):  # one client in ten waits by key
            c = calls[i % ncalls]
            if i % 10 == 0:
                return "/v1/tool-calls/by-key/%s?wait=60s" % c["idem_key"]
            return "/v1/tool-calls/%s?wait=60s" % c["call_id"]
        tasks = [asyncio.create_task(raw_get(host, port, path(i), 90))
                 for i in range(args.clients)]
        await asyncio.sleep(1.0)
        done_early = [t for t in tasks if t.done()]
        if done_early:
            st, body, _ = done_early[0].result()
            fail("%d of %d clients answered before any result, e.g. %s %s" %
                 (len(done_early), args.clients, st, body))
        loop = asyncio.get_running_loop()
        got = await loop.run_in_executor(None, wait_metric, api, "onceq_http_waiting_requests",
                                         args.clients, 60)
        done_early = [t for t in tasks if t.done()]
        if done_early:
            st, body, _ = done_early[0].result()
            fail("%d of %d clients answered before any result, e.g. %s %s" %
                 (len(done_early), args.clients, st, body))
        if got is None or got < args.clients:
            fail("onceq_http_waiting_requests reached %s, not %d" % (got, args.clients))
        threads_waiting = threads_of(args.pid)
        figure("producer_threads_with_%d_waiting" % args.clients, threads_waiting)
        if threads_waiting > threads_before + 2:
            fail("producer threads grew from %d to %d with %d waiting clients" %
                 (threads_before, threads_waiting, args.clients))
        t_inject = time.monotonic()
        await loop.run_in_executor(None, api.inject, calls)
        res = await asyncio.gather(*tasks)
        return t_inject, res

    t_inject, res = asyncio.run(run())
    bad = [(st, b) for st, b, _ in res if st != 200 or not b or b.get("status") != "succeeded"]
    if bad:
        fail("%d of %d waiting clients did not get the succeeded call, e.g. %s" %
             (len(bad), len(res), bad[0]))
    last = max(t for _, _, t in res)
    figure("many_all_answered_after_inject_s", "%.3f" % (last - t_inject))
    if api.metric("onceq_http_waiting_requests") != 0:
        fail("onceq_http_waiting_requests is not back to 0")


def step_shutdown(api, args):
    c = api.submit("lp-shutdown")
    host, port = host_port(api.url)
    n = args.clients

    async def run():
        tasks = [asyncio.create_task(raw_get(host, port, "/v1/tool-calls/%s?wait=60s" %
                                             c["call_id"], 90)) for _ in range(n)]
        loop = asyncio.get_running_loop()
        got = await loop.run_in_executor(None, wait_metric, api, "onceq_http_waiting_requests",
                                         n, 60)
        if any(t.done() for t in tasks):
            fail("clients answered before the shutdown")
        if got is None or got < n:
            fail("onceq_http_waiting_requests reached %s, not %d" % (got, n))
        t_kill = time.monotonic()
        os.kill(args.pid, signal.SIGTERM)
        res = await asyncio.gather(*tasks)
        return t_kill, res

    t_kill, res = asyncio.run(run())
    bad = [(st, b) for st, b, _ in res if st != 200 or not b or b.get("status") != "pending"]
    if bad:
        fail("%d of %d clients waiting at shutdown not answered 200 pending, e.g. %s" %
             (len(bad), n, bad[0]))
    last = max(t for _, _, t in res)
    figure("shutdown_all_answered_s", "%.3f" % (last - t_kill))
    if last - t_kill > 10:
        fail("answers at shutdown took %.1f s" % (last - t_kill))


def step_call(api, args):
    key = "lp-call-" + args.client
    common = ["--url", api.url, "--key", key, "--tool", "charge", "--args", json.dumps({"k": key})]
    clients = os.path.join(args.src, "clients")
    js = ("import {Client} from %s; const [u, k, t, a] = process.argv.slice(1); "
          "const c = await new Client(u).call(t, JSON.parse(a), {key: k, timeout: 60}); "
          "console.log(JSON.stringify(c.raw ?? c));"
          % json.dumps("file://" + os.path.join(clients, "typescript", "src", "index.js")))
    cmd = {"onceq": [args.onceq, "call"] + common + ["--poll-interval", "50ms", "--timeout", "60s"],
           "py": [sys.executable, "-m", "onceq", "call"] + common,
           "js": ["node", "--input-type=module", "-e", js, api.url, key, "charge",
                  json.dumps({"k": key})]}[args.client]
    env = dict(os.environ, PYTHONPATH=os.path.join(clients, "python", "src"))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        end = time.monotonic() + 20
        while True:
            st, c = api.req("GET", "/v1/tool-calls/by-key/" + key)
            if st == 200:
                break
            if time.monotonic() > end or p.poll() is not None:
                fail("onceq call did not submit: %s %s" % (st, c))
            time.sleep(0.05)
        m0 = api.metric("onceq_http_responses_total{class=\"2xx\"}")
        time.sleep(2.0)
        api.inject([c])
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    m1 = api.metric("onceq_http_responses_total{class=\"2xx\"}")
    if p.returncode != 0 or json.loads(out).get("status") != "succeeded":
        fail("%s: exit %s, stdout %s, stderr %s" % (args.client, p.returncode, out, err))
    gets = int(m1 - m0 - 1)  # less the scrape that read m0
    figure("%s_status_requests" % args.client, gets)
    if gets > 3:
        fail("%s made %d status requests for a call that took ~3 s: it polls" %
             (args.client, gets))


def step_submitwait(api, args):
    """POST /v1/tool-calls?wait=: the submit's answer waits for the call to settle."""
    key = "lp-submitwait-" + uuid.uuid4().hex[:8]
    body = {"tool": "charge", "args": {"k": key}}
    out = {}

    def poster():
        t0 = time.monotonic()
        st, b = api.req("POST", "/v1/tool-calls?wait=30s", body, {"Idempotency-Key": key},
                        timeout=60)
        out["r"] = (st, b, time.monotonic() - t0)

    t = threading.Thread(target=poster)
    t.start()
    c, end = None, time.monotonic() + 30
    while c is None and time.monotonic() < end:  # committed: readable by key
        st, b = api.req("GET", "/v1/tool-calls/by-key/" + key)
        if st == 200:
            c = b
        else:
            time.sleep(0.05)
    if c is None:
        fail("POST ?wait=: the call never became readable")
    time.sleep(1.0)
    if "r" in out:
        fail("POST ?wait= answered before any result: %s" % (out["r"],))
    api.inject([c])
    t.join(60)
    if "r" not in out:
        fail("POST ?wait= not answered within 60 s of the result")
    st, b, dt = out["r"]
    if st != 200 or b.get("status") != "succeeded" or b.get("call_id") != c["call_id"]:
        fail("POST ?wait= after the result: %s %s" % (st, b))
    figure("submitwait_s", "%.3f" % dt)
    # a replay of the settled call with ?wait= is answered at once, 200
    st, b = api.req("POST", "/v1/tool-calls?wait=30s", body, {"Idempotency-Key": key}, timeout=10)
    if st != 200 or b.get("status") != "succeeded":
        fail("replay with ?wait=: %s %s" % (st, b))
    # the deadline: a call nobody answers comes back 202 pending after ~1 s
    k2 = key + "-deadline"
    t0 = time.monotonic()
    st, b = api.req("POST", "/v1/tool-calls?wait=1s", {"tool": "charge", "args": {"k": k2}},
                    {"Idempotency-Key": k2}, timeout=30)
    dt = time.monotonic() - t0
    if st != 202 or b.get("status") != "pending" or dt < 0.9:
        fail("POST ?wait=1s on a call nobody answers: %s %s after %.2f s" % (st, b, dt))
    # a malformed or too long wait is refused and writes nothing
    for bad in ("soon", "61s", "-1s"):
        k3 = key + "-bad"
        st, b = api.req("POST", "/v1/tool-calls?wait=" + bad, {"tool": "charge", "args": {}},
                        {"Idempotency-Key": k3}, timeout=10)
        if st != 400 or b["error"]["code"] != "bad_request":
            fail("POST ?wait=%s: %s %s" % (bad, st, b))
        st, b = api.req("GET", "/v1/tool-calls/by-key/" + k3)
        if st != 404:
            fail("POST ?wait=%s wrote a call: %s %s" % (bad, st, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=["latency", "deadline", "many", "shutdown", "call",
                                     "submitwait"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--brokers", default="")
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--bound", type=float, default=0.5, help="latency bound, seconds")
    ap.add_argument("--onceq", default="onceq", help="the onceq binary (step call)")
    ap.add_argument("--client", default="onceq", choices=["onceq", "py", "js"])
    ap.add_argument("--src", default=".", help="the source tree (step call, py and js)")
    args = ap.parse_args()
    api = Api(args.url, args.brokers)
    {"latency": step_latency, "deadline": step_deadline, "many": step_many,
     "shutdown": step_shutdown, "call": step_call, "submitwait": step_submitwait}[args.step](
        api, args)
    print("ok " + args.step)


if __name__ == "__main__":
    main()
