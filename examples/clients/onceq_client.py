#!/usr/bin/env python3
"""onceq_client.py: a small onceq HTTP client (Python 3.8+, standard library only).

    onceq_client.py submit --url http://127.0.0.1:8081 --key order-1001-charge --tool charge \\
                           --args '{"amount":1999,"currency":"EUR"}' [--tenant shop]
                           [--token TOKEN] [--timeout 10] [--tries 8] [--wait 60] [--no-wait]
    onceq_client.py fingerprint --tool charge [--tenant shop] < args.json
    onceq_client.py canon < any.json

submit: POST /v1/tool-calls with the Idempotency-Key. A timeout, a lost connection, a 429 or a
5xx is retried with the SAME key and the SAME body (that is what makes the retry safe: the
producer returns the original call), at most --tries times, with exponential backoff and full
jitter, waiting at least the server's Retry-After. Then wait for the call to be terminal
(succeeded, failed, needs_review), at most --wait seconds, by long poll: GET ?wait=, which the
producer answers as soon as the call is terminal. Prints the call JSON on stdout.
The fingerprint the server returns is checked against the one computed here.

fingerprint: SHA-256 (lowercase hex) of the RFC 8785 (JCS) form of
{"args":ARGS,"tenant":TENANT,"tool":TOOL}, exactly as `onceq fingerprint` computes it.
canon: the RFC 8785 form of any JSON text (as `onceq canon`).

Exit codes, as onceq's: 0 ok, 1 failure (retries exhausted, not terminal in time, fingerprint
mismatch), 2 bad usage or invalid input, 5 idempotency conflict (the key was used with another
request).

As a library: canonicalize(value), fingerprint(tenant, tool, args), Client(url).submit(...).
"""
import argparse
import email.utils
import hashlib
import http.client
import json
import math
import random
import socket
import sys
import time
import urllib.parse

MAX_SAFE_INT = 2**53
TERMINAL = ("succeeded", "failed", "needs_review")
EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_CONFLICT = 0, 1, 2, 5


# --- RFC 8785 -----------------------------------------------------------------------------------

def _number(x):
    """ECMAScript Number.prototype.toString of a double (RFC 8785 section 3.2.2.3), with
    onceq's limits: integers within +-2^53, and no integral double in (2^53, 1e21), which
    would print as an integer that no strict reader takes back."""
    if isinstance(x, int):
        if abs(x) > MAX_SAFE_INT:
            raise ValueError("integer %d is outside +-2^53 (RFC 8785 numbers are doubles)" % x)
        return str(x)
    if not math.isfinite(x):
        raise ValueError("%r is not a JSON number" % x)
    if x == 0:
        return "0"  # also -0
    if MAX_SAFE_INT < abs(x) < 1e21:
        raise ValueError("number %r is an integer outside +-2^53" % x)
    # repr() is the shortest string that round-trips (as ECMAScript's), in Python's layout:
    # take its digits and the position of the decimal point, then lay them out as ECMA-262 does
    mant, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mant.partition(".")
    every = whole + frac
    digits = every.lstrip("0")
    n = len(whole) + int(exp or 0) - (len(every) - len(digits))  # value = 0.DIGITS x 10^n
    digits = digits.rstrip("0")
    k = len(digits)
    sign = "-" if x < 0 else ""
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    frac = "." + digits[1:] if k > 1 else ""
    return sign + digits[0] + frac + "e" + ("+" if e >= 0 else "-") + str(abs(e))


def _string(s):
    s.encode("utf-8")  # a lone surrogate is not Unicode text: raises
    # json.dumps escapes exactly what RFC 8785 escapes: " \ and U+0000..U+001F (\b \f \n \r \t
    # short, the others as \u00xx in lowercase hex); ensure_ascii=False keeps the rest as is
    return json.dumps(s, ensure_ascii=False)


def canonicalize(v):
    """The RFC 8785 canonical JSON text of a value made of dict, list, str, int, float, bool,
    None."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (int, float)):
        return _number(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(canonicalize(x) for x in v) + "]"
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise ValueError("object keys must be strings")
        keys = sorted(v, key=lambda k: k.encode("utf-16-be", "strict"))  # UTF-16 code units
        return "{" + ",".join(_string(k) + ":" + canonicalize(v[k]) for k in keys) + "}"
    raise ValueError("not a JSON value: %r" % type(v))


def fingerprint(tenant, tool, args):
    """onceq's call fingerprint: SHA-256 hex of the RFC 8785 form of {args, tenant, tool}."""
    text = canonicalize({"args": args, "tenant": tenant, "tool": tool})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError("duplicate member %r" % k)
        d[k] = v
    return d


def _float(text):
    x = float(text)
    if math.isinf(x):
        raise ValueError("number %s is too large for a double" % text)
    if x == 0 and any(c in "123456789" for c in text.lower().split("e")[0]):
        raise ValueError("number %s is too small for a double and would read as 0" % text)
    return x


def _bad_constant(name):
    raise ValueError("%s is not JSON" % name)


def parse_strict(text):
    """json.loads with onceq's rules: no duplicate member, no NaN/Infinity, no number that a
    double cannot hold (over- or underflow), integers within +-2^53."""
    v = json.loads(text, object_pairs_hook=_no_duplicates, parse_float=_float,
                   parse_constant=_bad_constant)
    canonicalize(v)  # the integer range and the rest
    return v


# --- HTTP ---------------------------------------------------------------------------------------

class Transient(Exception):
    """A failure worth retrying with the same key; retry_after in seconds or None."""

    def __init__(self, msg, retry_after=None):
        super().__init__(msg)
        self.retry_after = retry_after


class Refused(Exception):
    """A definite answer that a retry would not change (4xx other than 429)."""

    def __init__(self, status, body):
        super().__init__("HTTP %d: %s" % (status, body))
        self.status = status
        self.body = body


def retry_after_seconds(value):
    """Retry-After as seconds: delay-seconds or an HTTP-date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class Client:
    def __init__(self, url, token=None, timeout=10.0, tries=8, backoff=0.2, backoff_max=5.0,
                 log=None):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("url must be http://HOST:PORT or https://...")
        self.u = u
        self.token = token
        self.timeout = timeout
        self.tries = max(1, tries)
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.log = log or (lambda msg: None)

    def _once(self, method, path, headers, body, extra_s=0.0):
        cls = http.client.HTTPSConnection if self.u.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.u.hostname, self.u.port, timeout=self.timeout + extra_s)
        h = {"Accept": "application/json", "Connection": "close"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        h.update(headers)
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
        except (socket.timeout, TimeoutError) as e:
            raise Transient("timeout after %.3g s (%s)" % (self.timeout, e)) from None
        except (OSError, http.client.HTTPException) as e:
            raise Transient("connection: %r" % e) from None
        finally:
            conn.close()
        if r.status == 429 or r.status >= 500:
            raise Transient("HTTP %d: %s" % (r.status, data[:200].decode("utf-8", "replace")),
                            retry_after_seconds(r.getheader("Retry-After")))
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def request(self, method, path, headers=None, body=None, extra_s=0.0):
        """One request, retried on Transient failures (same headers, same body); extra_s is
        added to the timeout (a long poll lasts that much longer)."""
        for attempt in range(1, self.tries + 1):
            try:
                return self._once(method, path, headers or {}, body, extra_s)
            except Transient as e:
                if attempt == self.tries:
                    raise
                # full jitter: a random wait up to the exponential step, never under Retry-After
                step = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
                wait = random.uniform(0, step)
                if e.retry_after is not None:
                    wait = max(wait, e.retry_after)
                self.log("%s %s: attempt %d failed (%s); retrying in %.2f s with the same key"
                         % (method, path, attempt, e, wait))
                time.sleep(wait)
        raise AssertionError("unreachable")

    def submit(self, key, tool, args, tenant=None):
        """POST the call; returns (call dict, replayed bool). Raises Refused on a 4xx."""
        body = {"tool": tool, "args": args}
        if tenant is not None:
            body["tenant"] = tenant
        data = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        status, h, resp = self.request("POST", "/v1/tool-calls",
                                       {"Idempotency-Key": key,
                                        "Content-Type": "application/json"}, data)
        if status not in (200, 202):
            raise Refused(status, resp.decode("utf-8", "replace"))
        return json.loads(resp), h.get("idempotent-replayed") == "true"

    def get(self, call_id, wait_s=0.0):
        """The call; with wait_s (up to 60), a long poll: the producer answers as soon as the
        call is terminal, or after wait_s with the call as it stands."""
        path = "/v1/tool-calls/" + urllib.parse.quote(call_id)
        if wait_s > 0:
            path += "?wait=%dms" % int(wait_s * 1000)
        status, _, resp = self.request("GET", path, extra_s=wait_s)
        if status != 200:
            raise Refused(status, resp.decode("utf-8", "replace"))
        return json.loads(resp)

    def wait(self, call, limit_s=60.0):
        """Long-poll (30 s a request) until the call is terminal; None when limit_s passed.
        Two requests start at least 0.1 s apart: a server that does not wait is polled."""
        deadline = time.monotonic() + limit_s
        while call["status"] not in TERMINAL:
            left = deadline - time.monotonic()
            if left < 0.01:
                return None
            started = time.monotonic()
            call = self.get(call["call_id"], min(30.0, left))
            if call["status"] not in TERMINAL:
                time.sleep(max(0.0, min(0.1 - (time.monotonic() - started),
                                        deadline - time.monotonic())))
        return call


# --- CLI ----------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(prog="onceq_client.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("submit", help="submit a call and wait for its end")
    s.add_argument("--url", default="http://127.0.0.1:8081")
    s.add_argument("--key", required=True, help="the Idempotency-Key (same on every retry)")
    s.add_argument("--tool", required=True)
    s.add_argument("--args", default=None, help="args as JSON (default: read from stdin)")
    s.add_argument("--tenant", default=None)
    s.add_argument("--token", default=None, help="bearer token (with --token-file on the server)")
    s.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    s.add_argument("--tries", type=int, default=8, help="requests at most per step")
    s.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the end")
    s.add_argument("--no-wait", action="store_true", help="print the accepted call, do not wait")
    s.add_argument("--quiet", action="store_true", help="no retry log on stderr")
    f = sub.add_parser("fingerprint", help="the fingerprint of the args JSON on stdin")
    f.add_argument("--tool", required=True)
    f.add_argument("--tenant", default="default")
    sub.add_parser("canon", help="the RFC 8785 form of the JSON on stdin")
    a = ap.parse_args(argv)

    try:
        if a.cmd == "canon":
            sys.stdout.write(canonicalize(parse_strict(sys.stdin.buffer.read().decode("utf-8"))))
            return EXIT_OK
        text = a.args if a.cmd == "submit" and a.args is not None else \
            sys.stdin.buffer.read().decode("utf-8")
        args = parse_strict(text)
        if not isinstance(args, dict):
            raise ValueError("args must be a JSON object")
        if a.cmd == "fingerprint":
            print(fingerprint(a.tenant, a.tool, args))
            return EXIT_OK
    except (ValueError, UnicodeDecodeError) as e:
        print("onceq_client: invalid input: %s" % e, file=sys.stderr)
        return EXIT_USAGE

    log = (lambda m: None) if a.quiet else (lambda m: print("onceq_client: " + m, file=sys.stderr))
    c = Client(a.url, a.token, a.timeout, a.tries, log=log)
    try:
        call, replayed = c.submit(a.key, a.tool, args, a.tenant)
        log("accepted %s (%s), status %s" % (call["call_id"], "replay" if replayed else "new",
                                            call["status"]))
        if (a.tenant or not a.token) and call["fingerprint"] != fingerprint(
                a.tenant or "default", a.tool, args):
            print("onceq_client: the server's fingerprint %s differs from ours" %
                  call["fingerprint"], file=sys.stderr)
            return EXIT_FAIL
        if not a.no_wait:
            done = c.wait(call, a.wait)
            if done is None:
                print("onceq_client: %s not terminal after %g s" % (call["call_id"], a.wait),
                      file=sys.stderr)
                return EXIT_FAIL
            call = done
    except Refused as e:
        print("onceq_client: %s" % e, file=sys.stderr)
        return EXIT_CONFLICT if e.status == 422 else EXIT_USAGE if e.status < 500 else EXIT_FAIL
    except Transient as e:
        print("onceq_client: giving up after %d tries: %s" % (a.tries, e), file=sys.stderr)
        return EXIT_FAIL
    print(json.dumps(call, ensure_ascii=False, separators=(",", ":")))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
