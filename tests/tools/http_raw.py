#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Send one raw HTTP/1.1 request over a socket and print the status code and the body.

For bytes that curl will not put on the wire: a NUL inside a header value, %00 in a path.
Usage: http_raw.py PORT METHOD PATH [--header 'Name: value']... [--body TEXT]
Escapes in PATH, headers and body: \\0 is a NUL byte. Prints "CODE BODY" on one line.
"""
import argparse
import socket


def unescape(s):
    return s.encode("latin-1").replace(b"\\0", b"\x00")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("method")
    ap.add_argument("path")
    ap.add_argument("--header", action="append", default=[])
    ap.add_argument("--body", default=None)
    a = ap.parse_args()
    req = a.method.encode() + b" " + unescape(a.path) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    for h in a.header:
        req += unescape(h) + b"\r\n"
    body = unescape(a.body) if a.body is not None else b""
    if a.body is not None:
        req += b"Content-Length: %d\r\n" % len(body)
    req += b"Connection: close\r\n\r\n" + body
    s = socket.create_connection(("127.0.0.1", a.port), timeout=10)
    s.sendall(req)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    code = head.split(b" ")[1].decode() if head else "000"
    print(code, payload.decode("utf-8", "replace"))


if __name__ == "__main__":
    main()
