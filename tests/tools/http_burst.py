#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A burst of requests that one libmicrohttpd pool thread sees at once
(tests/integration/test_http_burst.sh).

libmicrohttpd's epoll loop reads at most 128 events per epoll_wait; when it gets exactly 128 it
waits again, with the timeout it computed before (up to the idle timeout), before serving any
of them. This tool makes that happen if the server lets it, and says what the clients saw:

 1. open --conns keep-alive connections to 127.0.0.1:PORT, one after the other, and wait until
    the server (process --pid, Linux) has registered each of them in the epoll set of one of
    its threads: /proc/PID/fdinfo of its epoll descriptors lists the sockets each one watches,
    and /proc/net/tcp maps a socket to the client's port;
 2. take the largest such set (one pool thread's connections): --burst of its connections, or
    all of them when it holds fewer;
 3. stop the server (SIGSTOP, every thread stopped), send one request (GET --path) on each
    connection taken, continue it (SIGCONT): the thread finds them all ready at once;
 4. wait up to --timeout seconds for the answers.

It prints one JSON line: {"threads": [connections of each epoll set, largest first],
"burst": N, "answered": N, "closed": N (closed without an answer), "unanswered": N,
"max_s": the slowest answer}. Exit 0 when it could run the burst (whatever the answers),
2 when it could not (a connection refused, or not seen in any epoll set within 10 s).
"""
import argparse
import json
import os
import resource
import select
import signal
import socket
import sys
import time


def tcp_inodes():
    """inode -> (local port, remote port) of every TCP socket in this network namespace."""
    out = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    p = line.split()
                    out[p[9]] = (int(p[1].rsplit(":", 1)[1], 16), int(p[2].rsplit(":", 1)[1], 16))
        except FileNotFoundError:
            pass
    return out


def epoll_sets(pid, port):
    """Per epoll descriptor of PID: the client ports of the connections to PORT it watches."""
    inodes = tcp_inodes()
    fd_port = {}  # server-side fd -> client port
    epolls = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            lp = inodes.get(target[8:-1])
            if lp and lp[0] == port and lp[1] != 0:
                fd_port[fd] = lp[1]
        elif target == "anon_inode:[eventpoll]":
            epolls.append(fd)
    sets = []
    for ep in epolls:
        ports = []
        try:
            with open(f"/proc/{pid}/fdinfo/{ep}") as f:
                for line in f:
                    if line.startswith("tfd:"):
                        tfd = line.split()[1]
                        if tfd in fd_port:
                            ports.append(fd_port[tfd])
        except OSError:
            continue
        if ports:
            sets.append(ports)
    return sets


def all_stopped(pid):
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("T", "t"):
            return False
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--conns", type=int, default=256)
    ap.add_argument("--burst", type=int, default=128)
    ap.add_argument("--path", default="/healthz")
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < a.conns + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, a.conns + 64), hard))
    by_port = {}
    for _ in range(a.conns):
        s = socket.create_connection(("127.0.0.1", a.port), timeout=10)
        by_port[s.getsockname()[1]] = s

    deadline = time.monotonic() + 10
    while True:
        sets = epoll_sets(a.pid, a.port)
        seen = sum(len(s) for s in sets)
        if seen >= a.conns:
            break
        if time.monotonic() > deadline:
            print(json.dumps({"error": f"{seen} of {a.conns} connections seen in epoll sets"}))
            return 2
        time.sleep(0.05)
    sets.sort(key=len, reverse=True)
    chosen = [by_port[p] for p in sets[0][: a.burst] if p in by_port]
    r, _, _ = select.select(chosen, [], [], 0)
    if r:  # the server closed one meanwhile (or sent something unasked)
        print(json.dumps({"error": f"{len(r)} connections readable before the burst"}))
        return 2

    req = f"GET {a.path} HTTP/1.1\r\nHost: 127.0.0.1:{a.port}\r\n\r\n".encode()
    os.kill(a.pid, signal.SIGSTOP)
    try:
        stop_deadline = time.monotonic() + 10
        while not all_stopped(a.pid):
            if time.monotonic() > stop_deadline:
                print(json.dumps({"error": "the server did not stop"}))
                return 2
            time.sleep(0.001)
        for s in chosen:
            s.sendall(req)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    t0 = time.monotonic()

    answered = closed = 0
    slowest = 0.0
    pending = set(chosen)
    while pending and time.monotonic() - t0 < a.timeout:
        r, _, _ = select.select(list(pending), [], [], 0.5)
        for s in r:
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if data.startswith(b"HTTP/1."):
                answered += 1
                slowest = max(slowest, time.monotonic() - t0)
            else:
                closed += 1
            pending.discard(s)
    print(json.dumps({"threads": [len(s) for s in sets], "burst": len(chosen),
                      "answered": answered, "closed": closed, "unanswered": len(pending),
                      "max_s": round(slowest, 3)}))
    sys.stdout.flush()
    for s in by_port.values():
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
