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
asks again, pausing (0.1 s growing to 1 s) only when an answer came much sooner than asked.

Tasks (POST /v1/tasks, a run of steps under one Idempotency-Key): submit_task is retried like a
submit (same key, same body bytes: the same task); wait_task polls GET /v1/tasks/{id} with
backoff (0.1 s doubling to task_poll_max, 2 s), as the producer has no long poll for tasks;
resolve_task (an operator's decision) is sent once, never retried: a decision whose answer was
lost may have been committed, and sending it again would be refused (409) or act twice."""
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
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from .errors import ApiError, RateLimited, TransportError, Unavailable, WaitTimeout, error_for

TERMINAL = ("succeeded", "failed", "needs_review")
#: A task's final statuses (awaiting_approval is not one: an operator decides, then it runs on).
TASK_TERMINAL = ("succeeded", "compensated", "failed", "needs_review")
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


@dataclass(frozen=True)
class TaskStep:
    """One step of a task: its call's progress and its compensation (None without one)."""
    name: str
    status: str
    tool: str = ""
    call_id: Optional[str] = None
    result: Any = None
    object_id: Optional[str] = None
    error: Optional[Dict[str, Any]] = None
    irreversible: bool = False
    approval: bool = False
    compensation: Optional[Dict[str, Any]] = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "TaskStep":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in obj.items() if k in names})


@dataclass(frozen=True)
class Task:
    """A task as the producer returns it (raw: the whole JSON object). fence: the review
    episode an operator's decision is made on (resolve_task)."""
    task_id: str
    status: str
    tenant: str = "default"
    idem_key: str = ""
    reason: Optional[str] = None
    fence: int = 0
    created_at: str = ""
    updated_at: str = ""
    steps: Tuple[TaskStep, ...] = ()
    replayed: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def terminal(self) -> bool:
        return self.status in TASK_TERMINAL

    def step(self, name: str) -> TaskStep:
        """The step called `name` (KeyError when there is none)."""
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], replayed: bool = False) -> "Task":
        names = cls.__dataclass_fields__
        kw = {k: v for k, v in obj.items()
              if k in names and k not in ("replayed", "raw", "steps")}
        steps = tuple(TaskStep.from_json(x) for x in obj.get("steps") or ())
        return cls(steps=steps, replayed=replayed, raw=dict(obj), **kw)


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
                 log: Optional[Callable[[str], None]] = None,
                 task_poll_max: float = 2.0) -> None:
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
        self.task_poll_max = task_poll_max
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
    def _key_path(key: str, tenant: Optional[str], base: str = "/v1/tool-calls") -> str:
        p = base + "/by-key/" + urllib.parse.quote(key, safe="")
        return p + ("?tenant=" + urllib.parse.quote(tenant, safe="") if tenant else "")

    # --- tasks ---------------------------------------------------------------------------------
    @staticmethod
    def _task_request(steps: Sequence[Mapping[str, Any]], key: str,
                      tenant: Optional[str]) -> Tuple[Dict[str, str], bytes]:
        if not isinstance(key, str) or not key:
            raise ValueError("key (the Idempotency-Key) must be a non-empty string")
        body: Dict[str, Any] = {"steps": [dict(s) for s in steps]}
        if tenant is not None:
            body["tenant"] = tenant
        data = json.dumps(body, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")
        return {"Idempotency-Key": key, "Content-Type": "application/json"}, data

    @staticmethod
    def _resolve_request(decision: str, fence: int, note: str,
                         by: Optional[str]) -> Tuple[Dict[str, str], bytes]:
        body: Dict[str, Any] = {"as": decision, "fence": fence, "note": note}
        if by is not None:
            body["by"] = by
        return {"Content-Type": "application/json"}, json.dumps(body).encode("utf-8")

    @staticmethod
    def _task_of(resp: _Response) -> Task:
        status, h, data = resp
        return Task.from_json(json.loads(data), h.get("idempotent-replayed") == "true")

    @staticmethod
    def _task_path(task_id: str, suffix: str = "") -> str:
        return "/v1/tasks/" + urllib.parse.quote(task_id, safe="") + suffix


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

    # --- tasks ---------------------------------------------------------------------------------
    def submit_task(self, steps: Sequence[Mapping[str, Any]], *, key: str,
                    tenant: Optional[str] = None) -> Task:
        """POST /v1/tasks under the Idempotency-Key `key`: the new (or replayed) task. Each step
        is {"name", "tool", "args", "compensate"?: {"tool", "args"}, "irreversible"?,
        "approval"?}; args may cite earlier results as "{steps.NAME.result.PATH}"."""
        headers, data = self._task_request(steps, key, tenant)
        return self._task_of(self._request("POST", "/v1/tasks", headers, data))

    def get_task(self, task_id: str) -> Task:
        return self._task_of(self._request("GET", self._task_path(task_id)))

    def get_task_by_key(self, key: str, tenant: Optional[str] = None) -> Task:
        return self._task_of(self._request("GET", self._key_path(key, tenant, "/v1/tasks")))

    def wait_task(self, task_id: str, timeout: Optional[float] = 300.0, *,
                  until: Iterable[str] = TASK_TERMINAL) -> Task:
        """Poll (0.1 s doubling to task_poll_max) until the task's status is in `until` (by
        default a final one); WaitTimeout (with .call = the last Task seen) after `timeout`."""
        want = tuple(until)
        end = None if timeout is None else time.monotonic() + timeout
        pause = 0.1
        while True:
            last = self.get_task(task_id)
            if last.status in want:
                return last
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout("%s is %s after %g s" % (task_id, last.status, timeout or 0),
                                  last)
            time.sleep(pause if left is None else min(pause, left))
            pause = min(self.task_poll_max, pause * 2)

    def run_task(self, steps: Sequence[Mapping[str, Any]], *, key: str,
                 tenant: Optional[str] = None, timeout: Optional[float] = 300.0) -> Task:
        """Submit a task, then wait until it is final (succeeded, compensated, failed,
        needs_review); a task awaiting approval is waited for, as `onceq call --task` does."""
        t = self.submit_task(steps, key=key, tenant=tenant)
        return t if t.terminal else self.wait_task(t.task_id, timeout)

    def resolve_task(self, task_id: str, decision: str, *, fence: int, note: str,
                     by: Optional[str] = None) -> Task:
        """An operator's decision (POST /v1/tasks/{id}/resolve): approve | reject a step awaiting
        approval, compensated | succeeded | retry-compensation a task in needs_review, made on
        review episode `fence` (Task.fence). Needs an operator token when the producer has a
        token file; `by` is required without one. Sent once (never retried)."""
        headers, data = self._resolve_request(decision, fence, note, by)
        return self._task_of(self._check(self._once(
            "POST", self._task_path(task_id, "/resolve"), headers, data, self.timeout)))


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

    # --- tasks ---------------------------------------------------------------------------------
    async def submit_task(self, steps: Sequence[Mapping[str, Any]], *, key: str,
                          tenant: Optional[str] = None) -> Task:
        headers, data = self._task_request(steps, key, tenant)
        return self._task_of(await self._request("POST", "/v1/tasks", headers, data))

    async def get_task(self, task_id: str) -> Task:
        return self._task_of(await self._request("GET", self._task_path(task_id)))

    async def get_task_by_key(self, key: str, tenant: Optional[str] = None) -> Task:
        return self._task_of(await self._request("GET",
                                                 self._key_path(key, tenant, "/v1/tasks")))

    async def wait_task(self, task_id: str, timeout: Optional[float] = 300.0, *,
                        until: Iterable[str] = TASK_TERMINAL) -> Task:
        want = tuple(until)
        end = None if timeout is None else time.monotonic() + timeout
        pause = 0.1
        while True:
            last = await self.get_task(task_id)
            if last.status in want:
                return last
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout("%s is %s after %g s" % (task_id, last.status, timeout or 0),
                                  last)
            await asyncio.sleep(pause if left is None else min(pause, left))
            pause = min(self.task_poll_max, pause * 2)

    async def run_task(self, steps: Sequence[Mapping[str, Any]], *, key: str,
                       tenant: Optional[str] = None, timeout: Optional[float] = 300.0) -> Task:
        t = await self.submit_task(steps, key=key, tenant=tenant)
        return t if t.terminal else await self.wait_task(t.task_id, timeout)

    async def resolve_task(self, task_id: str, decision: str, *, fence: int, note: str,
                           by: Optional[str] = None) -> Task:
        headers, data = self._resolve_request(decision, fence, note, by)
        loop = asyncio.get_running_loop()
        resp = await loop.run_in_executor(None, self._once, "POST",
                                          self._task_path(task_id, "/resolve"), headers, data,
                                          self.timeout)
        return self._task_of(self._check(resp))
