#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Connection flood for the producer's HTTP limits (tests/integration/test_producer_http_flood.sh).

Opens COUNT TCP connections to HOST:PORT from SOURCE (a loopback address, so a test can flood
from 127.0.0.1 and probe from 127.0.0.2), each sending half a request line and nothing more,
as a slow or hostile client would. One second after the last connect (with --settle: once the
number of open connections has held still for a second, at most six) it writes READY_FILE:

    {"opened": N, "open": N, "closed": N, "connect_failed": N}

("closed": the server closed it or reset it at once: refused by a connection limit). Then it
holds the connections for HOLD seconds, or until STOP_FILE exists, and writes DONE_FILE with
"closed_later": how many of the connections still open at READY were closed by the server
meanwhile (the idle timeout), and "seconds" until the last of those closed. Bounded: it exits
after HOLD seconds whatever happens.

--sources A,B,... spreads COUNT over several source addresses (127.0.0.2..6 are loopback on
Linux), COUNT/len(sources) each. --trickle N makes each connection a slow client that keeps
the idle timeout at bay: it sends a whole request line and Host, then one more header line
every N seconds, never the blank line that would end the headers.
"""
import argparse
import errno
import json
import os
import resource
import select
import socket
import time


def closed_by_peer(s):
    """True when the server closed or reset the connection (non-blocking check)."""
    try:
        r, _, _ = select.select([s], [], [], 0)
        if not r:
            return False
        return s.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--source", default="127.0.0.1")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--hold", type=float, default=30.0)
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--done-file", required=True)
    ap.add_argument("--stop-file", default="")
    ap.add_argument("--sources", default="")
    ap.add_argument("--trickle", type=float, default=0.0)
    ap.add_argument("--settle", action="store_true")
    a = ap.parse_args()
    sources = a.sources.split(",") if a.sources else [a.source]

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.count + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))

    start = time.monotonic()
    socks, failed = [], 0
    for i in range(a.count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2.0)
        try:
            s.bind((sources[i % len(sources)], 0))
            s.connect((a.host, a.port))
            if a.trickle > 0:  # a request line and Host; more header lines follow slowly
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            else:
                s.sendall(b"GET /healthz HTT")  # half a request line, never finished
        except OSError as e:
            if e.errno not in (errno.ECONNRESET, errno.EPIPE):
                failed += 1
            s.close()
            continue
        s.setblocking(False)
        socks.append(s)
    # The server refuses over-limit connections by accepting and closing them, and on a loaded
    # machine some still sit in the accept queue a second after the last connect. --settle:
    # count until the number of open connections has held still for a second (at most 6 s), so
    # a refusal that is merely late is not read as a connection held open. (Not with a short
    # idle timeout, which would close the held ones meanwhile.)
    time.sleep(1.0)
    open_socks = [s for s in socks if not closed_by_peer(s)]
    settle_end = time.monotonic() + (5.0 if a.settle else 0.0)
    while time.monotonic() < settle_end:
        time.sleep(1.0)
        still = [s for s in open_socks if not closed_by_peer(s)]
        if len(still) == len(open_socks):
            break
        open_socks = still
    ready = {"opened": len(socks), "open": len(open_socks),
             "closed": len(socks) - len(open_socks), "connect_failed": failed}
    with open(a.ready_file + ".tmp", "w") as f:
        json.dump(ready, f)
    os.rename(a.ready_file + ".tmp", a.ready_file)

    t_ready = time.monotonic()
    closed_at = {}
    next_line, n_line = t_ready, 0
    while time.monotonic() - start < a.hold:
        if a.stop_file and os.path.exists(a.stop_file):
            break
        for i, s in enumerate(open_socks):
            if i not in closed_at and closed_by_peer(s):
                closed_at[i] = time.monotonic() - t_ready
        if a.trickle > 0 and time.monotonic() >= next_line:
            n_line += 1
            for i, s in enumerate(open_socks):
                if i in closed_at:
                    continue
                try:
                    s.send(b"X-Slow-%d: a\r\n" % n_line)
                except OSError:
                    closed_at[i] = time.monotonic() - t_ready
            next_line += a.trickle
        if len(closed_at) == len(open_socks):
            break
        time.sleep(0.2)
    done = dict(ready)
    done["closed_later"] = len(closed_at)
    done["seconds"] = round(max(closed_at.values()), 2) if closed_at else None
    with open(a.done_file + ".tmp", "w") as f:
        json.dump(done, f)
    os.rename(a.done_file + ".tmp", a.done_file)
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
