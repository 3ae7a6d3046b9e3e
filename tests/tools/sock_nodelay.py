#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Reads TCP_NODELAY on the connections another process accepted from us
(tests/integration/test_broker_nodelay.sh).

    sock_nodelay.py --pid PID --ports P1,P2,...

Connects once to each 127.0.0.1 port, then copies every socket of process PID into this one
with pidfd_getfd(2) (Linux 5.6; needs ptrace rights over PID: root, or its parent) and, for each
whose peer is one of our connections, reads TCP_NODELAY. Prints one JSON line:

    {"connected": N, "accepted": N, "nodelay": N}

("accepted": our connections found in PID; "nodelay": those with TCP_NODELAY set). Exit 77
(skip) when the kernel or the permissions do not allow the copy, 1 on other errors.
--serve: instead, listen on a free port, accept without TCP_NODELAY, print the port and its own
pid and sleep: a process to check the checker against (it must report nodelay 0).
"""
import argparse
import ctypes
import errno
import json
import os
import socket
import sys
import time

SYS_PIDFD_GETFD = 438  # x86_64 and aarch64 (the generic table) alike


def serve():
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    print(json.dumps({"port": ls.getsockname()[1], "pid": os.getpid()}), flush=True)
    ls.settimeout(1.0)
    held = []
    end = time.monotonic() + 60  # bounded
    while time.monotonic() < end:
        try:
            c, _ = ls.accept()
            held.append(c)
        except socket.timeout:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int)
    ap.add_argument("--ports", default="")
    ap.add_argument("--serve", action="store_true")
    a = ap.parse_args()
    if a.serve:
        serve()
        return 0
    ours = {}
    for p in a.ports.split(","):
        s = socket.create_connection(("127.0.0.1", int(p)), timeout=5)
        ours[s.getsockname()] = s
    time.sleep(0.5)  # let the other side accept
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        pidfd = os.pidfd_open(a.pid)
    except OSError as e:
        print(f"pidfd_open({a.pid}): {e}", file=sys.stderr)
        return 77 if e.errno in (errno.ENOSYS, errno.EPERM) else 1
    accepted = nodelay = 0
    for name in os.listdir(f"/proc/{a.pid}/fd"):
        try:
            if not os.readlink(f"/proc/{a.pid}/fd/{name}").startswith("socket:"):
                continue
        except OSError:
            continue  # closed meanwhile
        fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(name), 0)
        if fd < 0:
            e = ctypes.get_errno()
            if e in (errno.ENOSYS, errno.EPERM):
                print(f"pidfd_getfd: {os.strerror(e)}", file=sys.stderr)
                return 77
            continue  # EBADF: closed meanwhile
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family == socket.AF_INET:
                try:
                    peer = s.getpeername()
                except OSError:
                    peer = None  # a listening socket
                if peer in ours:
                    accepted += 1
                    if s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY):
                        nodelay += 1
        finally:
            s.close()
    os.close(pidfd)
    print(json.dumps({"connected": len(ours), "accepted": accepted, "nodelay": nodelay}))
    for s in ours.values():
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
