#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""oq_openapi_check: check docs/openapi.yaml against running onceq producers.

    oq_openapi_check.py --spec docs/openapi.yaml --main URL --auth URL --fault URL
                        --fault-db calls.db --api-token T --metrics-token M
                        [--non-loopback ADDR]

--main: a producer in a pipeline (--brokers, a relay and a consumer), default settings.
--auth: a producer with --token-file (T is the token of tenant "shop"), --metrics-access
        token (M), --max-message-bytes 1000.
--fault: a producer without brokers on --fault-db, whose calls table this script renames
        for a moment (every read and every commit then fails) and then restores; it runs
        with --tools (a file declaring the tool "pay", see test_openapi.sh), for GET
        /v1/tools and the catalogue's refusals (unknown_tool, bad_args).
--non-loopback: a local address that is not loopback, to be the source of requests to
        /stats and /metrics (403 forbidden); without it those two statuses are reported as
        not produced and the run fails.

The spec is checked first (OpenAPI 3.1, every $ref resolves, every schema is a valid JSON
Schema 2020-12). Then requests are made that produce every documented (operation, status,
error code), plus the responses any request can get (x-onceq-any-request). Each response is
checked: its status is documented for the operation, its Content-Type is one documented, its
body validates against the schema, and every required header is there and matches its schema.
Every undocumented method of every documented path must be 405 with an Allow header naming
exactly the documented ones. Exit 0 when all holds and nothing documented was left unproduced
(except responses marked x-onceq-not-produced, which are listed), else 1 with the reasons.

Debian's python3 with python3-yaml and python3-jsonschema; the rest is the standard library.
"""
import argparse
import http.client
import json
import re
import sqlite3
import sys
import time
import urllib.parse

import jsonschema
import yaml

METHODS = ("get", "put", "post", "delete", "patch")


class Checker:
    def __init__(self, spec_path):
        with open(spec_path, encoding="utf-8") as f:
            self.doc = yaml.safe_load(f)
        self.resolver = jsonschema.RefResolver.from_schema(self.doc)
        self.failures = []
        self.produced = set()
        self.count = 0
        self.check_spec()
        # paths served by another process (x-onceq-server: the consumers' review API) are
        # checked as a spec above, not against the producers
        self.doc["paths"] = {p: i for p, i in self.doc["paths"].items()
                             if "x-onceq-server" not in i}
        self.documented, self.exempt = self.documented_keys()

    # --- the spec itself ---------------------------------------------------------------------
    def fail(self, msg):
        self.failures.append(msg)
        print("FAIL: " + msg, file=sys.stderr)

    def resolve(self, node):
        while isinstance(node, dict) and "$ref" in node and len(node) == 1:
            _, node = self.resolver.resolve(node["$ref"])
        return node

    def check_spec(self):
        d = self.doc
        if not str(d.get("openapi", "")).startswith("3.1."):
            self.fail("openapi is not 3.1.x: %r" % d.get("openapi"))
        for k in ("info", "paths", "components"):
            if k not in d:
                self.fail("spec has no %s" % k)

        def walk(node, where):
            if isinstance(node, dict):
                if "$ref" in node:
                    try:
                        self.resolver.resolve(node["$ref"])
                    except jsonschema.RefResolutionError as e:
                        self.fail("%s: $ref %s does not resolve: %s" % (where, node["$ref"], e))
                for k, v in node.items():
                    if k == "schema":
                        try:
                            jsonschema.Draft202012Validator.check_schema(v)
                        except jsonschema.SchemaError as e:
                            self.fail("%s: not a valid JSON Schema: %s" % (where, e.message))
                    walk(v, where + "/" + str(k))
            elif isinstance(node, list):
                for i, v in enumerate(node):
                    walk(v, "%s/%d" % (where, i))

        walk(d, "#")
        for name, s in d.get("components", {}).get("schemas", {}).items():
            try:
                jsonschema.Draft202012Validator.check_schema(s)
            except jsonschema.SchemaError as e:
                self.fail("schema %s is not valid JSON Schema: %s" % (name, e.message))
        for path, item in d["paths"].items():
            for m in METHODS:
                op = item.get(m)
                if op is not None and not op.get("responses"):
                    self.fail("%s %s has no responses" % (m.upper(), path))

    @staticmethod
    def codes_of(schema):
        """The error codes an error response's schema admits (allOf [Error, {code enum}])."""
        for part in (schema or {}).get("allOf", []):
            try:
                return list(part["properties"]["error"]["properties"]["code"]["enum"])
            except (KeyError, TypeError):
                continue
        return None

    def response_keys(self, opkey, status, resp):
        resp = self.resolve(resp)
        keys = []
        for ctype, media in resp.get("content", {}).items():
            codes = self.codes_of(media.get("schema"))
            for c in codes or ["-"]:
                keys.append((opkey, status, c))
        return keys or [(opkey, status, "-")]

    def documented_keys(self):
        keys, exempt = set(), {}
        for path, item in self.doc["paths"].items():
            for m in METHODS:
                op = item.get(m)
                if op is None:
                    continue
                for status, resp in op["responses"].items():
                    for k in self.response_keys("%s %s" % (m.upper(), path), status, resp):
                        keys.add(k)
                        note = self.resolve(resp).get("x-onceq-not-produced")
                        if note:
                            exempt[k] = note
        for status, resp in self.doc["x-onceq-any-request"]["responses"].items():
            keys.update(self.response_keys("*", status, resp))
        all_codes = set(self.doc["components"]["schemas"]["ErrorCode"]["enum"])
        used = {k[2] for k in keys} - {"-"}
        if all_codes != used:
            self.fail("ErrorCode enum %s differs from the codes the responses use %s"
                      % (sorted(all_codes), sorted(used)))
        return keys, exempt

    # --- matching a request to the spec ----------------------------------------------------
    def match_path(self, path):
        """The spec path template matching a concrete path (the longest), or None."""
        best = None
        for tmpl in self.doc["paths"]:
            rx = re.escape(tmpl)
            rx = rx.replace(re.escape("{idem_key}"), ".+")  # the key is the rest of the path
            rx = re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", rx)
            if re.fullmatch(rx, path) and (best is None or len(tmpl) > len(best)):
                best = tmpl
        return best

    def validate(self, schema, value, what):
        v = jsonschema.Draft202012Validator(schema, resolver=self.resolver)
        errs = sorted(v.iter_errors(value), key=lambda e: list(e.path))
        for e in errs[:3]:
            self.fail("%s: %s (at %s)" % (what, e.message, "/".join(map(str, e.path)) or "."))
        return not errs

    def check_response(self, method, path, status, headers, body):
        """Validate one response; return its coverage key."""
        m = "get" if method == "HEAD" else method.lower()
        tmpl = self.match_path(path.split("?", 1)[0])
        op = self.doc["paths"].get(tmpl, {}).get(m) if tmpl else None
        st = str(status)
        what = "%s %s -> %s" % (method, path[:80], status)
        if op is not None and st in op["responses"]:
            opkey, resp = "%s %s" % (m.upper(), tmpl), op["responses"][st]
        elif st in self.doc["x-onceq-any-request"]["responses"]:
            opkey, resp = "*", self.doc["x-onceq-any-request"]["responses"][st]
        else:
            self.fail("%s: status not documented for this operation" % what)
            return None
        resp = self.resolve(resp)
        for name, h in resp.get("headers", {}).items():
            h = self.resolve(h)
            val = headers.get(name.lower())
            if val is None:
                if h.get("required"):
                    self.fail("%s: required header %s missing" % (what, name))
                continue
            self.validate(h["schema"], val, "%s: header %s=%r" % (what, name, val))
        ctype = headers.get("content-type", "")
        content = resp.get("content", {})
        code = "-"
        if content:
            if ctype not in content:
                self.fail("%s: Content-Type %r not documented (%s)" % (what, ctype, list(content)))
                return None
            schema = content[ctype].get("schema", {})
            if method == "HEAD":
                pass  # no body
            elif ctype.startswith("application/json"):
                try:
                    value = json.loads(body)
                except ValueError as e:
                    self.fail("%s: body is not JSON: %s" % (what, e))
                    return None
                if not self.validate(schema, value, what + " body"):
                    return None
                if self.codes_of(schema) is not None:
                    code = value["error"]["code"]
            else:
                self.validate(schema, body.decode("utf-8"), what + " body")
        return (opkey, st, code)

    # --- requests ---------------------------------------------------------------------------
    def request(self, base, method, path, headers=None, body=None, expect=None, code=None,
                source=None, host=True, hosts=None, send_body=True, timeout=10,
                ctype="application/json"):
        """One request on its own connection; checks and records the response, returns
        (status, headers dict (lower-case names), body bytes, parsed JSON or None)."""
        u = urllib.parse.urlsplit(base)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout,
                                          source_address=(source, 0) if source else None)
        data = body.encode("utf-8") if isinstance(body, str) else body
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for hv in ([u.netloc] if host else []) + (hosts or []):
                conn.putheader("Host", hv)
            hdrs = list((headers or {}).items()) if isinstance(headers, dict) else list(headers or [])
            if data is not None:
                if ctype:
                    hdrs.append(("Content-Type", ctype))
                hdrs.append(("Content-Length", str(len(data))))
            for k, v in hdrs:
                conn.putheader(k, v)
            conn.endheaders()
            if data is not None and send_body:
                try:
                    conn.send(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused before the body was read: the answer is already there
            r = conn.getresponse()
            raw = r.read()
            rh = {}
            for k, v in r.getheaders():
                rh[k.lower()] = v if k.lower() not in rh else rh[k.lower()] + ", " + v
            status = r.status
        finally:
            conn.close()
        self.count += 1
        key = self.check_response(method, path, status, rh, raw)
        if key:
            self.produced.add(key)
        parsed = None
        if rh.get("content-type", "").startswith("application/json"):
            try:
                parsed = json.loads(raw)
            except ValueError:
                pass
        label = "%s %s" % (method, path[:60])
        if expect is not None and status not in (expect if isinstance(expect, tuple) else (expect,)):
            self.fail("%s: expected HTTP %s, got %s: %s" % (label, expect, status, raw[:200]))
        if code is not None and (not parsed or parsed.get("error", {}).get("code") != code):
            self.fail("%s: expected error code %s: %s" % (label, code, raw[:200]))
        if 200 <= status < 300 and method == "POST" and path.startswith("/v1/tool-calls"):
            self.check_request(headers, body)
        return status, rh, raw, parsed

    def check_request(self, headers, body):
        """An accepted submit must be one the contract describes."""
        op = self.doc["paths"]["/v1/tool-calls"]["post"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        self.validate(schema, json.loads(body), "accepted request body")
        hd = dict(headers) if not isinstance(headers, dict) else headers
        key = hd.get("Idempotency-Key")
        kp = self.resolve(op["parameters"][0])["schema"]
        self.validate(kp, key, "accepted Idempotency-Key %r" % key)

    def submit(self, base, key, body, expect=(202,), code=None, extra=None, **kw):
        h = [("Idempotency-Key", key)] if key is not None else []
        h += extra or []
        return self.request(base, "POST", "/v1/tool-calls", h,
                            body if isinstance(body, (str, bytes)) else json.dumps(body),
                            expect, code, **kw)

    def poll(self, base, call_id, limit_s=60):
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            st, _, _, c = self.request(base, "GET", "/v1/tool-calls/" + call_id, expect=200)
            if c and c.get("status") in ("succeeded", "failed", "needs_review"):
                return c
            time.sleep(0.2)
        self.fail("call %s did not reach a terminal state in %d s" % (call_id, limit_s))
        return None

    def wrong_methods(self, base, samples):
        """Every undocumented method of every documented path: 405 + Allow = documented."""
        for tmpl, item in self.doc["paths"].items():
            path = samples[tmpl]
            served = [m.upper() for m in METHODS if m in item]
            allow = set(served) | ({"HEAD"} if "GET" in served else set())
            for m in METHODS:
                if m in item:
                    continue
                st, h, _, _ = self.request(base, m.upper(), path,
                                           body="{}" if m in ("post", "put", "patch") else None,
                                           expect=405, code="method_not_allowed")
                got = {x.strip() for x in h.get("allow", "").split(",") if x.strip()}
                if st == 405 and got != allow:
                    self.fail("%s %s: Allow %s, expected %s" % (m.upper(), path, sorted(got),
                                                                sorted(allow)))

    def report(self):
        missing = sorted(self.documented - self.produced - set(self.exempt))
        extra = sorted(self.produced - self.documented)
        for k in missing:
            self.fail("documented but never produced: %s %s %s" % k)
        for k in extra:
            self.fail("produced but not documented: %s %s %s" % k)
        for k, note in sorted(self.exempt.items()):
            print("not produced (x-onceq-not-produced): %s %s %s: %s" % (k + (note.strip(),)))
        print("requests=%d documented=%d produced=%d exempt=%d failures=%d"
              % (self.count, len(self.documented), len(self.produced & self.documented),
                 len(self.exempt), len(self.failures)))
        return 0 if not self.failures else 1


def scenario_main(ck, M, src):
    charge = {"tool": "charge", "args": {"amount": 1999, "currency": "EUR"}, "tenant": "shop"}
    st, h, _, c = ck.submit(M, "oa-1", charge, expect=202)
    if not c:
        return
    cid = c["call_id"]
    if h.get("location") != c["query_url"] or "idempotent-replayed" in h:
        ck.fail("new call: Location %r, query_url %r, headers %s" % (h.get("location"),
                                                                     c["query_url"], h))
    # the same request, keys reordered and 1999.0 for 1999: the same call
    st, h, _, c2 = ck.submit(M, "oa-1", '{"tenant":"shop","args":{"currency":"EUR","amount":1999.0},'
                             '"tool":"charge"}', expect=(200, 202))
    if not c2 or c2["call_id"] != cid or h.get("idempotent-replayed") != "true":
        ck.fail("replay: %s %s" % (h, c2))
    # a replay while in flight (202): a sleeping call stays running for 3 s
    st, _, _, cs = ck.submit(M, "oa-sleep", {"tool": "sleep", "args": {"ms": 3000}}, expect=202)
    st, h, _, cs2 = ck.submit(M, "oa-sleep", {"tool": "sleep", "args": {"ms": 3000}}, expect=202)
    if h.get("idempotent-replayed") != "true" or not cs2 or cs2["call_id"] != cs["call_id"]:
        ck.fail("in-flight replay: %s %s" % (h, cs2))
    done = ck.poll(M, cid)
    if done and done["status"] != "succeeded":
        ck.fail("charge ended %s" % done["status"])
    st, h, _, c3 = ck.submit(M, "oa-1", charge, expect=200)
    if h.get("idempotent-replayed") != "true" or (c3 and c3["call_id"] != cid):
        ck.fail("terminal replay: %s %s" % (h, c3))
    ck.submit(M, "oa-1", dict(charge, args={"amount": 1}), expect=422, code="idempotency_conflict")
    st, _, _, f = ck.submit(M, "oa-fail", {"tool": "fail", "args": {}}, expect=202)
    if f:
        fd = ck.poll(M, f["call_id"])
        if fd and (fd["status"] != "failed" or not fd["error"]):
            ck.fail("fail tool ended %s" % fd)
    ck.poll(M, cs["call_id"]) if cs else None
    # reads
    ck.request(M, "GET", "/v1/tool-calls/by-key/oa-1?tenant=shop", expect=200)
    ck.request(M, "HEAD", "/v1/tool-calls/" + cid, expect=200)
    ck.request(M, "GET", "/v1/tool-calls/by-key/oa-1", expect=404, code="not_found")
    ck.request(M, "GET", "/v1/tool-calls/by-key/" + "k" * 256, expect=400,
               code="invalid_idempotency_key")
    ck.request(M, "GET", "/v1/tool-calls/by-key/oa-1?tenant=", expect=400, code="bad_request")
    ck.request(M, "GET", "/v1/tool-calls/c_00000000000000000000000000000000", expect=404,
               code="not_found")
    ck.request(M, "GET", "/v1/tool-calls/not-an-id", expect=404, code="not_found")
    # long poll: a terminal call answers at once; a bad wait is 400
    ck.request(M, "GET", "/v1/tool-calls/" + cid + "?wait=30s", expect=200)
    ck.request(M, "GET", "/v1/tool-calls/by-key/oa-1?tenant=shop&wait=500ms", expect=200)
    ck.request(M, "GET", "/v1/tool-calls/" + cid + "?wait=61s", expect=400, code="bad_request")
    ck.request(M, "GET", "/v1/tool-calls/by-key/oa-1?tenant=shop&wait=x", expect=400,
               code="bad_request")
    ck.request(M, "GET", "/v1/tools", expect=404, code="not_found")  # no --tools
    # refused submits
    body = json.dumps({"tool": "charge", "args": {"amount": 1}})
    ck.submit(M, None, body, expect=400, code="missing_idempotency_key")
    ck.request(M, "POST", "/v1/tool-calls", [("Idempotency-Key", "a"), ("Idempotency-Key", "b")],
               body, expect=400, code="invalid_idempotency_key")
    ck.submit(M, "x" * 256, body, expect=400, code="invalid_idempotency_key")
    ck.submit(M, '" quoted"', body, expect=400, code="invalid_idempotency_key")
    for bad in ('{"tool":"charge","args":{', '{"tool":"charge","args":{"a":1,"a":2}}',
                '{"tool":"charge","args":{},"bogus":1}', '{"tool":"charge"}',
                '{"tool":"no spaces","args":{}}', '{"tool":"charge","args":{"r":1e-400}}',
                '{"tool":"charge","tenant":"","args":{}}'):
        ck.submit(M, "oa-bad", bad, expect=400, code="bad_request")
    ck.request(M, "POST", "/v1/tool-calls", [("Idempotency-Key", "oa-nohost")], body,
               expect=400, code="bad_request", host=False)
    # 413 at the Content-Length, before the body is read (the connection is closed)
    ck.request(M, "POST", "/v1/tool-calls", [("Idempotency-Key", "oa-big")],
               b"{" + b" " * (1024 * 1024 + 10) + b"}", expect=413, code="payload_too_large",
               send_body=False)
    # operations
    ck.request(M, "GET", "/healthz", expect=200)
    ck.request(M, "GET", "/readyz", expect=200)
    st, _, _, s = ck.request(M, "GET", "/stats", expect=200)
    if s is not None and "results" not in s:
        ck.fail("/stats of a producer with --brokers has no results: %s" % s)
    ck.request(M, "GET", "/metrics", expect=200)
    tid = scenario_tasks(ck, M)
    # any request
    ck.request(M, "GET", "/nope", expect=404, code="not_found")
    ck.request(M, "GET", "/healthz", expect=400, code="bad_request", host=False)
    ck.request(M, "GET", "/healthz", expect=400, code="bad_request", host=False, hosts=["a", "b"])
    ck.wrong_methods(M, {"/v1/tool-calls": "/v1/tool-calls",
                         "/v1/tool-calls/{call_id}": "/v1/tool-calls/" + cid,
                         "/v1/tool-calls/by-key/{idem_key}": "/v1/tool-calls/by-key/oa-1",
                         "/v1/tools": "/v1/tools",
                         "/v1/tasks": "/v1/tasks", "/v1/tasks/{task_id}": "/v1/tasks/" + tid,
                         "/v1/tasks/by-key/{idem_key}": "/v1/tasks/by-key/oa-t1",
                         "/v1/tasks/{task_id}/resolve": "/v1/tasks/%s/resolve" % tid,
                         "/healthz": "/healthz", "/readyz": "/readyz", "/stats": "/stats",
                         "/metrics": "/metrics"})
    if src:
        ck.request(M, "GET", "/stats", expect=403, code="forbidden", source=src)
        ck.request(M, "GET", "/metrics", expect=403, code="forbidden", source=src)


def scenario_tasks(ck, M):
    """POST /v1/tasks and its reads on the pipeline producer; returns the task id."""
    def post(key, body, **kw):
        h = [("Idempotency-Key", key)] if key is not None else []
        return ck.request(M, "POST", "/v1/tasks", h,
                          body if isinstance(body, str) else json.dumps(body), **kw)
    task = {"steps": [{"name": "a", "tool": "charge", "args": {"amount": 5}},
                      {"name": "b", "tool": "charge",
                       "args": {"amount": "{steps.a.result.charged}"}}]}
    st, h, _, t = post("oa-t1", task, expect=202)
    tid = t["task_id"] if t else "t_00000000000000000000000000000000"
    if h.get("location") != "/v1/tasks/" + tid or "idempotent-replayed" in h:
        ck.fail("new task: headers %s" % h)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st, _, _, t = ck.request(M, "GET", "/v1/tasks/" + tid, expect=200)
        if t and t.get("status") not in ("running", "compensating"):
            break
        time.sleep(0.2)
    st, h, _, t2 = post("oa-t1", task, expect=200)
    if h.get("idempotent-replayed") != "true" or not t2 or t2["task_id"] != tid:
        ck.fail("terminal task replay: %s %s" % (h, t2))
    st, h, _, t3 = post("oa-t2", {"steps": [{"name": "s", "tool": "sleep",
                                             "args": {"ms": 3000}}]}, expect=202)
    st, h, _, t4 = post("oa-t2", {"steps": [{"name": "s", "tool": "sleep",
                                             "args": {"ms": 3000}}]}, expect=202)
    if h.get("idempotent-replayed") != "true":
        ck.fail("in-flight task replay: %s" % h)
    post("oa-t1", {"steps": [{"name": "x", "tool": "charge", "args": {}}]}, expect=422,
         code="idempotency_conflict")
    post(None, task, expect=400, code="missing_idempotency_key")
    post("x" * 256, task, expect=400, code="invalid_idempotency_key")
    post("oa-tb", '{"steps":', expect=400, code="bad_request")
    post("oa-tb", {"steps": [{"name": "a", "tool": "t", "args": {}},
                             {"name": "a", "tool": "t", "args": {}}]}, expect=400,
         code="bad_task")
    post("oa-tb", {"steps": [{"name": "a", "tool": "t", "args": {"x": "{steps.b.result}"}}]},
         expect=400, code="bad_reference")
    ck.request(M, "GET", "/v1/tasks/by-key/oa-t1", expect=200)
    ck.request(M, "GET", "/v1/tasks/by-key/" + "k" * 256, expect=400,
               code="invalid_idempotency_key")
    ck.request(M, "GET", "/v1/tasks/by-key/oa-none", expect=404, code="not_found")
    ck.request(M, "GET", "/v1/tasks/t_00000000000000000000000000000000", expect=404,
               code="not_found")
    scenario_task_resolve(ck, M, post)
    return tid


def scenario_task_resolve(ck, M, post):
    """POST /v1/tasks/{id}/resolve on the pipeline producer (no token file: by required)."""

    def resolve(tid, body, **kw):
        return ck.request(M, "POST", "/v1/tasks/%s/resolve" % tid, [],
                          body if isinstance(body, str) else json.dumps(body), **kw)
    # a first step with "approval": true waits at once, nothing written for it
    st, _, _, t = post("oa-ap", {"steps": [{"name": "a", "tool": "charge", "args": {"amount": 1},
                                            "approval": True}]}, expect=202)
    tid = t["task_id"] if t else "t_00000000000000000000000000000000"
    if t and t["status"] != "awaiting_approval":
        ck.fail("approval task: %s" % t)
    f = t["fence"] if t else 0
    ok = {"as": "approve", "fence": f, "note": "checked", "by": "ada"}
    resolve(tid, dict(ok, fence=f + 1), expect=409, code="review_moved")
    resolve(tid, dict(ok, **{"as": "compensated"}), expect=409, code="not_in_review")
    resolve(tid, '{"as":', expect=400, code="bad_request")
    resolve(tid, {"as": "approve", "fence": f, "note": "checked"}, expect=400, code="bad_request")
    resolve(tid, dict(ok, ref="x"), expect=400, code="bad_request")
    resolve(tid, ok, expect=415, code="unsupported_media_type", ctype="text/plain")
    resolve("t_00000000000000000000000000000000", ok, expect=404, code="not_found")
    st, _, _, t = resolve(tid, ok, expect=200)
    if t and t["status"] != "running":
        ck.fail("approved task: %s" % t)
    resolve(tid, ok, expect=409, code="not_awaiting_approval")
    # a step whose derived key another call holds: the task needs review at once, with no
    # compensation that failed (so none to retry)
    ck.submit(M, "oa-nr/a", {"tool": "charge", "args": {"amount": 1}}, expect=202)
    st, _, _, t = post("oa-nr", {"steps": [{"name": "a", "tool": "charge",
                                            "args": {"amount": 2}}]}, expect=202)
    if t and t["status"] != "needs_review":
        ck.fail("key-conflict task: %s" % t)
    if t:
        resolve(t["task_id"], {"as": "retry-compensation", "fence": t["fence"], "note": "x",
                               "by": "ada"}, expect=409, code="not_retryable")
        resolve(t["task_id"], {"as": "compensated", "fence": t["fence"], "note": "nothing ran",
                               "by": "ada"}, expect=200)


def scenario_auth(ck, A, tok, mtok):
    bearer = [("Authorization", "Bearer " + tok)]
    body = {"tool": "charge", "args": {"amount": 3}}
    ck.submit(A, "oa-a1", body, expect=401, code="unauthorized")
    ck.request(A, "POST", "/v1/tasks", [("Idempotency-Key", "oa-at")],
               json.dumps({"steps": [{"name": "a", "tool": "t", "args": {}}]}), expect=401,
               code="unauthorized")
    resolve = "/v1/tasks/t_00000000000000000000000000000000/resolve"
    decision = json.dumps({"as": "approve", "fence": 1, "note": "x"})
    ck.request(A, "POST", resolve, [], decision, expect=401, code="unauthorized")
    ck.request(A, "POST", resolve, bearer, decision, expect=403, code="forbidden")
    st, h, _, _ = ck.submit(A, "oa-a1", body, expect=401, code="unauthorized",
                            extra=[("Authorization", "Bearer not-a-known-token-000")])
    if 'error="invalid_token"' not in h.get("www-authenticate", ""):
        ck.fail("unknown token: WWW-Authenticate %r" % h.get("www-authenticate"))
    st, _, _, c = ck.submit(A, "oa-a1", body, expect=202, extra=bearer)
    cid = c["call_id"] if c else "c_00000000000000000000000000000000"
    if c and c["tenant"] != "shop":
        ck.fail("token tenant not applied: %s" % c)
    ck.request(A, "GET", "/v1/tool-calls/" + cid, expect=401, code="unauthorized")
    ck.request(A, "GET", "/v1/tool-calls/" + cid, bearer, expect=200)
    ck.request(A, "GET", "/v1/tool-calls/by-key/oa-a1", expect=401, code="unauthorized")
    ck.request(A, "GET", "/v1/tool-calls/by-key/oa-a1", bearer, expect=200)
    ck.request(A, "GET", "/v1/tools", expect=401, code="unauthorized")
    ck.request(A, "GET", "/v1/tool-calls/by-key/oa-a1?tenant=other", bearer, expect=403,
               code="tenant_mismatch")
    ck.submit(A, "oa-a2", dict(body, tenant="other"), expect=403, code="tenant_mismatch",
              extra=bearer)
    # under --max-body but its Kafka message over --max-message-bytes (1000)
    ck.submit(A, "oa-a3", {"tool": "charge", "args": {"memo": "m" * 2000}}, expect=413,
              code="payload_too_large", extra=bearer)
    for p in ("/stats", "/metrics"):
        ck.request(A, "GET", p, expect=401, code="unauthorized")
        ck.request(A, "GET", p, bearer, expect=401, code="unauthorized")  # an API token is not one
        ck.request(A, "GET", p, [("Authorization", "Bearer " + mtok)], expect=200)
    ck.request(A, "GET", "/healthz", expect=200)
    ck.request(A, "GET", "/readyz", expect=200)


def scenario_tools(ck, F):
    """The catalogue of a producer with --tools: the list, and refusals that write nothing."""
    st, _, _, t = ck.request(F, "GET", "/v1/tools", expect=200)
    names = [x["name"] for x in (t or {}).get("tools", [])]
    if names[:2] != ["pay", "charge"]:
        ck.fail("GET /v1/tools: %s" % names)
    ck.submit(F, "oa-t1", {"tool": "refund", "args": {}}, expect=400, code="unknown_tool")
    st, _, _, e = ck.submit(F, "oa-t2", {"tool": "pay", "args": {"amount": 0}}, expect=400,
                            code="bad_args")
    if e and e["error"].get("pointer") != "/amount":
        ck.fail("bad_args pointer: %s" % e)
    ck.submit(F, "oa-t2", {"tool": "pay", "args": {"amount": 5}}, expect=202)
    # webhooks: a callback_url that is not an http(s) URL; one this producer (no webhook
    # secret) cannot sign
    ck.submit(F, "oa-w1", {"tool": "pay", "args": {"amount": 5}, "callback_url": "ftp://x/y"},
              expect=400, code="invalid_callback_url")
    ck.submit(F, "oa-w2", {"tool": "pay", "args": {"amount": 5},
                           "callback_url": "https://hooks.example.com/onceq"},
              expect=400, code="webhook_secret_missing")


def scenario_fault(ck, F, db):
    body = {"tool": "charge", "args": {"amount": 4}}
    st, _, _, c = ck.submit(F, "oa-f1", body, expect=202)
    cid = c["call_id"] if c else "c_00000000000000000000000000000000"
    con = sqlite3.connect(db, timeout=10)
    con.execute("ALTER TABLE calls RENAME TO calls_away")
    con.commit()
    try:
        for _ in range(3):  # a submit whose commit failed: 503, and /readyz turns 503
            st, h, _, _ = ck.submit(F, "oa-f2", body, expect=(503,), code="unavailable")
        ck.request(F, "GET", "/v1/tool-calls/" + cid, expect=503, code="unavailable")
        ck.request(F, "GET", "/v1/tool-calls/by-key/oa-f1", expect=503, code="unavailable")
        ck.request(F, "GET", "/stats", expect=503, code="unavailable")
        st, _, _, r = ck.request(F, "GET", "/readyz", expect=503)
        if r and "commit failed" not in r.get("database", ""):
            ck.fail("/readyz after a failed commit: %s" % r)
    finally:
        con.execute("ALTER TABLE calls_away RENAME TO calls")
        con.commit()
        con.close()
    ck.request(F, "GET", "/v1/tool-calls/" + cid, expect=200)
    ck.submit(F, "oa-f2", body, expect=202)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--main", required=True)
    ap.add_argument("--auth", required=True)
    ap.add_argument("--fault", required=True)
    ap.add_argument("--fault-db", required=True)
    ap.add_argument("--api-token", required=True)
    ap.add_argument("--metrics-token", required=True)
    ap.add_argument("--non-loopback", default="")
    a = ap.parse_args()
    ck = Checker(a.spec)
    if ck.failures:
        return 1
    for name, fn in (("main", lambda: scenario_main(ck, a.main, a.non_loopback)),
                     ("auth", lambda: scenario_auth(ck, a.auth, a.api_token, a.metrics_token)),
                     ("tools", lambda: scenario_tools(ck, a.fault)),
                     ("fault", lambda: scenario_fault(ck, a.fault, a.fault_db))):
        try:
            fn()
        except (OSError, http.client.HTTPException, sqlite3.Error) as e:
            ck.fail("scenario %s stopped: %r" % (name, e))
        print("scenario %s done: %d requests so far, %d failures" % (name, ck.count,
                                                                     len(ck.failures)))
    return ck.report()


if __name__ == "__main__":
    sys.exit(main())
