# SPDX-License-Identifier: Apache-2.0
"""Client and AsyncClient for onceq's HTTP API (standard library only).

Retries: a submit (and a read) that gets no answer (connection refused or lost, timeout), a
429 or a 5xx is sent again with the SAME Idempotency-Key and the SAME body bytes: the producer
then answers with the original call, so a retry never makes a second call. The pause before
retry n is a uniform random time in [0, min(backoff_max, backoff * 2**(n-1))] ("full
jitter"), at least the server's Retry-After, and retries stop at the deadline
(retry_deadline seconds after the first attempt): then the last error is raised.

Wait: GET /v1/tool-calls/{id}?wait=Ns (long poll: the producer answers when the call is
terminal or after N s). A producer that does not know `wait` answers at once: the loop then
asks again, pausing (0.1 s growing to 1 s) only when an answer came much sooner than asked."""
import asyncio
import email.utils
import http.client
import json
import os
import random
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from .errors import ApiError, RateLimited, TransportError, Unavailable, WaitTimeout, error_for

TERMINAL = ("succeeded", "failed", "needs_review")
DEFAULT_URL = "http://127.0.0.1:8081"


@dataclass(frozen=True)
class Call:
    """A tool call as the producer returns it (raw: the whole JSON object)."""
    call_id: str
    status: str
    tenant: str = "default"
    idem_key: str = ""
    fingerprint: str = ""
    tool: str = ""
    args: Dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    result: Any = None
    error: Optional[Dict[str, Any]] = None
    effect_id: Optional[str] = None
    created_at: str = ""
    updated_at: str = ""
    expires_at: str = ""
    callback_url: Optional[str] = None
    query_url: str = ""
    replayed: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], replayed: bool = False) -> "Call":
        names = cls.__dataclass_fields__
        kw = {k: v for k, v in obj.items() if k in names and k not in ("replayed", "raw")}
        return cls(replayed=replayed, raw=dict(obj), **kw)


def retry_after_seconds(value: Optional[str]) -> Optional[float]:
    """Retry-After as seconds (delay-seconds or an HTTP-date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, IndexError):
        return None


_Response = Tuple[int, Dict[str, str], bytes]


class _Base:
    def __init__(self, url: Optional[str] = None, token: Optional[str] = None,
                 timeout: float = 10.0, retry_deadline: float = 60.0, backoff: float = 0.2,
                 backoff_max: float = 5.0, max_tries: Optional[int] = None,
                 poll_wait: float = 30.0,
                 log: Optional[Callable[[str], None]] = None) -> None:
        u = urllib.parse.urlsplit(url or os.environ.get("ONCEQ_URL") or DEFAULT_URL)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("url must be http://HOST:PORT or https://...")
        self._u = u
        self.token = token if token is not None else os.environ.get("ONCEQ_TOKEN") or None
        self.timeout = timeout
        self.retry_deadline = retry_deadline
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.max_tries = max_tries
        self.poll_wait = poll_wait
        self.log: Callable[[str], None] = log or (lambda msg: None)

    # --- one HTTP exchange, blocking ---------------------------------------------------------
    def _once(self, method: str, path: str, headers: Mapping[str, str], body: Optional[bytes],
              timeout: float) -> _Response:
        cls = (http.client.HTTPSConnection if self._u.scheme == "https"
               else http.client.HTTPConnection)
        conn = cls(self._u.hostname or "", self._u.port, timeout=timeout)
        h = {"Accept": "application/json", "Connection": "close"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        h.update(headers)
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
        except (socket.timeout, TimeoutError) as e:
            raise TransportError("%s %s: timeout after %.3g s (%s)"
                                 % (method, path, timeout, e)) from None
        except (OSError, http.client.HTTPException) as e:
            raise TransportError("%s %s: connection: %r" % (method, path, e)) from None
        finally:
            conn.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    @staticmethod
    def _check(resp: _Response) -> _Response:
        """Raise the typed error of an error answer."""
        status, h, data = resp
        if status < 400:
            return resp
        code, message = "", data[:200].decode("utf-8", "replace")
        try:
            e = json.loads(data)["error"]
            code, message = str(e["code"]), str(e.get("message", ""))
        except (ValueError, KeyError, TypeError):
            pass
        raise error_for(status, code, message, retry_after_seconds(h.get("retry-after")), data)

    @staticmethod
    def _retryable(e: Exception) -> bool:
        return isinstance(e, (TransportError, RateLimited, Unavailable)) or (
            isinstance(e, ApiError) and e.status >= 500)

    def _pause(self, attempt: int, e: Exception, started: float) -> Optional[float]:
        """Seconds to sleep before attempt+1, or None to give up (deadline, tries)."""
        if not self._retryable(e):
            return None
        if self.max_tries is not None and attempt >= self.max_tries:
            return None
        step = min(self.backoff_max, self.backoff * 2 ** (attempt - 1))
        wait = random.uniform(0, step)
        ra = getattr(e, "retry_after", None)
        if ra is not None:
            wait = max(wait, ra)
        if time.monotonic() + wait - started > self.retry_deadline:
            return None
        return wait

    @staticmethod
    def _submit_request(tool: str, args: Mapping[str, Any], key: str,
                        tenant: Optional[str],
                        callback_url: Optional[str] = None) -> Tuple[Dict[str, str], bytes]:
        if not isinstance(key, str) or not key:
            raise ValueError("key (the Idempotency-Key) must be a non-empty string")
        body: Dict[str, Any] = {"tool": tool, "args": dict(args)}
        if tenant is not None:
            body["tenant"] = tenant
        if callback_url is not None:
            body["callback_url"] = callback_url
        data = json.dumps(body, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")
        return {"Idempotency-Key": key, "Content-Type": "application/json"}, data

    @staticmethod
    def _call_of(resp: _Response) -> Call:
        status, h, data = resp
        return Call.from_json(json.loads(data), h.get("idempotent-replayed") == "true")

    @staticmethod
    def _get_path(call_id: str, wait: Optional[float] = None) -> str:
        p = "/v1/tool-calls/" + urllib.parse.quote(call_id, safe="")
        return p + ("?wait=%ds" % wait if wait else "")

    @staticmethod
    def _key_path(key: str, tenant: Optional[str]) -> str:
        p = "/v1/tool-calls/by-key/" + urllib.parse.quote(key, safe="")
        return p + ("?tenant=" + urllib.parse.quote(tenant, safe="") if tenant else "")


class Client(_Base):
    """Blocking client. Every method may raise an errors.OnceqError subclass."""

    def _request(self, method: str, path: str, headers: Optional[Mapping[str, str]] = None,
                 body: Optional[bytes] = None, timeout: Optional[float] = None) -> _Response:
        started = time.monotonic()
        attempt = 1
        while True:
            try:
                return self._check(self._once(method, path, headers or {}, body,
                                              timeout or self.timeout))
            except (TransportError, ApiError) as e:
                wait = self._pause(attempt, e, started)
                if wait is None:
                    raise
                self.log("%s %s: attempt %d failed (%s); retrying in %.2f s with the same key"
                         % (method, path, attempt, e, wait))
                time.sleep(wait)
                attempt += 1

    def submit(self, tool: str, args: Mapping[str, Any], *, key: str,
               tenant: Optional[str] = None, callback_url: Optional[str] = None) -> Call:
        """POST /v1/tool-calls under the Idempotency-Key `key`; the accepted (or replayed) call.

        callback_url: the producer POSTs the settled call there (a signed webhook, see
        verify_webhook); not part of the fingerprint."""
        headers, data = self._submit_request(tool, args, key, tenant, callback_url)
        return self._call_of(self._request("POST", "/v1/tool-calls", headers, data))

    def get(self, call_id: str) -> Call:
        return self._call_of(self._request("GET", self._get_path(call_id)))

    def get_by_key(self, key: str, tenant: Optional[str] = None) -> Call:
        return self._call_of(self._request("GET", self._key_path(key, tenant)))

    def wait(self, call_id: str, timeout: Optional[float] = 300.0) -> Call:
        """Long-poll until the call is terminal; WaitTimeout after `timeout` s (None: forever)."""
        end = None if timeout is None else time.monotonic() + timeout
        pause = 0.1
        last: Optional[Call] = None
        while True:
            left = self.poll_wait if end is None else end - time.monotonic()
            if left <= 0:
                raise WaitTimeout("%s not terminal after %g s" % (call_id, timeout or 0), last)
            w = max(1, round(min(self.poll_wait, left)))
            t0 = time.monotonic()
            last = self._call_of(self._request("GET", self._get_path(call_id, w),
                                               timeout=w + self.timeout))
            if last.terminal:
                return last
            if time.monotonic() - t0 < w / 2:  # the server did not hold the request
                time.sleep(pause if end is None else min(pause, max(0.0, end - time.monotonic())))
                pause = min(1.0, pause * 2)

    def call(self, tool: str, args: Mapping[str, Any], *, key: str,
             tenant: Optional[str] = None, timeout: Optional[float] = 300.0) -> Call:
        """Submit, then wait until terminal (succeeded, failed, needs_review)."""
        c = self.submit(tool, args, key=key, tenant=tenant)
        return c if c.terminal else self.wait(c.call_id, timeout)


class AsyncClient(_Base):
    """asyncio client: the same surface as Client, as coroutines. Each HTTP exchange runs in
    the loop's default executor; the pauses are asyncio.sleep."""

    async def _request(self, method: str, path: str,
                       headers: Optional[Mapping[str, str]] = None,
                       body: Optional[bytes] = None, timeout: Optional[float] = None) -> _Response:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        attempt = 1
        while True:
            try:
                resp = await loop.run_in_executor(None, self._once, method, path, headers or {},
                                                  body, timeout or self.timeout)
                return self._check(resp)
            except (TransportError, ApiError) as e:
                wait = self._pause(attempt, e, started)
                if wait is None:
                    raise
                self.log("%s %s: attempt %d failed (%s); retrying in %.2f s with the same key"
                         % (method, path, attempt, e, wait))
                await asyncio.sleep(wait)
                attempt += 1

    async def submit(self, tool: str, args: Mapping[str, Any], *, key: str,
                     tenant: Optional[str] = None, callback_url: Optional[str] = None) -> Call:
        headers, data = self._submit_request(tool, args, key, tenant, callback_url)
        return self._call_of(await self._request("POST", "/v1/tool-calls", headers, data))

    async def get(self, call_id: str) -> Call:
        return self._call_of(await self._request("GET", self._get_path(call_id)))

    async def get_by_key(self, key: str, tenant: Optional[str] = None) -> Call:
        return self._call_of(await self._request("GET", self._key_path(key, tenant)))

    async def wait(self, call_id: str, timeout: Optional[float] = 300.0) -> Call:
        end = None if timeout is None else time.monotonic() + timeout
        pause = 0.1
        last: Optional[Call] = None
        while True:
            left = self.poll_wait if end is None else end - time.monotonic()
            if left <= 0:
                raise WaitTimeout("%s not terminal after %g s" % (call_id, timeout or 0), last)
            w = max(1, round(min(self.poll_wait, left)))
            t0 = time.monotonic()
            last = self._call_of(await self._request("GET", self._get_path(call_id, w),
                                                     timeout=w + self.timeout))
            if last.terminal:
                return last
            if time.monotonic() - t0 < w / 2:
                await asyncio.sleep(pause if end is None
                                    else min(pause, max(0.0, end - time.monotonic())))
                pause = min(1.0, pause * 2)

    async def call(self, tool: str, args: Mapping[str, Any], *, key: str,
                   tenant: Optional[str] = None, timeout: Optional[float] = 300.0) -> Call:
        c = await self.submit(tool, args, key=key, tenant=tenant)
        return c if c.terminal else await self.wait(c.call_id, timeout)
