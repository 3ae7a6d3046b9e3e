#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""oq_chaos_proxy: an HTTP fault proxy between a client and the onceq producer (chaos tests).

    oq_chaos_proxy.py --listen PORT --upstream PORT [--modes drop-response,duplicate-request,
                      delay,reset] [--rate 0.3] [--delay-ms 1500] [--seed S] [--max-faults N]

One request per client connection (the chaos clients send `Connection: close`). For each request
the proxy draws from a random generator seeded with --seed: with probability --rate it applies one
of --modes, chosen uniformly, else it forwards the request and the reply untouched (after
--max-faults faults every request is forwarded untouched; `--rate 1 --max-faults 1` faults
exactly the first request):

  drop-response      forward the request, read the whole reply, close the client connection
                     without a byte of it (the call may be committed; the client cannot know)
  duplicate-request  send the request twice upstream at once, return one of the replies
  delay              forward, then hold the reply --delay-ms before sending it (past the
                     client's timeout: the client gives up and retries while the first attempt
                     may be committed)
  reset              forward the head and half of the body, then reset both connections (RST):
                     the producer sees a truncated request and must write nothing

Every fault is logged on stdout as one line `fault N mode=M`; SIGTERM prints a summary line
`summary requests=R faults=F drop-response=.. duplicate-request=.. delay=.. reset=..` and exits.
Loopback only; standard library only.
"""
import argparse
import asyncio
import random
import signal
import socket
import struct
import sys

MODES = ("drop-response", "duplicate-request", "delay", "reset")


class Proxy:
    def __init__(self, args):
        self.up_port = args.upstream
        self.modes = args.modes
        self.rate = args.rate
        self.delay = args.delay_ms / 1000.0
        self.rng = random.Random(args.seed)
        self.max_faults = args.max_faults
        self.requests = 0
        self.counts = {m: 0 for m in MODES}

    async def read_request(self, reader):
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        body = await reader.readexactly(length) if length else b""
        return head, body

    async def upstream(self, data):
        r, w = await asyncio.open_connection("127.0.0.1", self.up_port)
        try:
            w.write(data)
            await w.drain()
            return await r.read()  # the producer closes after the reply (Connection: close)
        finally:
            w.close()

    @staticmethod
    def rst(writer):
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    async def handle(self, reader, writer):
        try:
            head, body = await self.read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            writer.close()
            return
        self.requests += 1
        mode = "pass"
        faults = sum(self.counts.values())
        if self.rng.random() < self.rate and (self.max_faults < 0 or faults < self.max_faults):
            mode = self.rng.choice(self.modes)
            self.counts[mode] += 1
            print(f"fault {self.requests} mode={mode}", flush=True)
        try:
            if mode == "reset":
                r, w = await asyncio.open_connection("127.0.0.1", self.up_port)
                w.write(head + body[: len(body) // 2])
                await w.drain()
                await asyncio.sleep(0.05)
                self.rst(w)
                self.rst(writer)
                return
            if mode == "duplicate-request":
                replies = await asyncio.gather(self.upstream(head + body),
                                               self.upstream(head + body))
                reply = replies[self.rng.randrange(2)]
            else:
                reply = await self.upstream(head + body)
            if mode == "drop-response":
                self.rst(writer)
                return
            if mode == "delay":
                await asyncio.sleep(self.delay)
            writer.write(reply)
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        writer.close()

    def summary(self):
        parts = " ".join(f"{m}={self.counts[m]}" for m in MODES)
        return f"summary requests={self.requests} faults={sum(self.counts.values())} {parts}"


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", type=int, required=True)
    ap.add_argument("--upstream", type=int, required=True)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rate", type=float, default=0.3)
    ap.add_argument("--delay-ms", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-faults", type=int, default=-1, help="fault at most N requests (-1: no limit)")
    args = ap.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r} (one of {', '.join(MODES)})")
    proxy = Proxy(args)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", args.listen, backlog=256)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"listening 127.0.0.1:{args.listen} -> 127.0.0.1:{args.upstream} modes={args.modes} "
          f"rate={args.rate} seed={args.seed}", flush=True)
    async with server:
        await stop.wait()
    print(proxy.summary(), flush=True)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(130)
