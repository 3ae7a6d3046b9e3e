#!/usr/bin/env node
// onceq_client.mjs: a small onceq HTTP client (Node 18+, no dependencies).
//
//   node onceq_client.mjs submit --url http://127.0.0.1:8081 --key order-1001-charge \
//        --tool charge --args '{"amount":1999,"currency":"EUR"}' [--tenant shop]
//        [--token TOKEN] [--timeout 10] [--tries 8] [--wait 60] [--no-wait]
//   node onceq_client.mjs fingerprint --tool charge [--tenant shop] < args.json
//   node onceq_client.mjs canon < any.json
//
// submit: POST /v1/tool-calls with the Idempotency-Key. A timeout, a lost connection, a 429 or
// a 5xx is retried with the SAME key and the SAME body (the producer then returns the original
// call), at most --tries times, with exponential backoff and full jitter, waiting at least the
// server's Retry-After. Then wait for the call to be terminal (succeeded, failed,
// needs_review), at most --wait seconds, by long poll: GET ?wait=, which the producer answers
// as soon as the call is terminal. Prints the call JSON on stdout. The fingerprint the
// server returns is checked against the one computed here.
//
// fingerprint: SHA-256 (lowercase hex) of the RFC 8785 (JCS) form of
// {"args":ARGS,"tenant":TENANT,"tool":TOOL}, exactly as `onceq fingerprint` computes it.
// canon: the RFC 8785 form of a JSON text (as `onceq canon`). JSON.parse keeps the last of
// duplicate members and rounds integers beyond 2^53, where onceq refuses the text: this client
// canonicalizes the values it sends, so what it sends and what it fingerprints agree.
//
// Exit codes, as onceq's: 0 ok, 1 failure (retries exhausted, not terminal in time,
// fingerprint mismatch), 2 bad usage or invalid input, 5 idempotency conflict.
//
// As a module: canonicalize(value), fingerprint(tenant, tool, args), new Client(url).submit(...).
import { createHash } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';
import { parseArgs } from 'node:util';
import { pathToFileURL } from 'node:url';

const MAX_SAFE = 2 ** 53;
export const TERMINAL = ['succeeded', 'failed', 'needs_review'];
const EXIT = { ok: 0, fail: 1, usage: 2, conflict: 5 };

// --- RFC 8785 ----------------------------------------------------------------------------------

function wellFormed(s) {
  if (typeof s.isWellFormed === 'function') return s.isWellFormed();
  return !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);
}

function str(s) {
  if (!wellFormed(s)) throw new RangeError('string has a lone surrogate: not Unicode text');
  return JSON.stringify(s); // escapes exactly what RFC 8785 escapes
}

/** The RFC 8785 canonical JSON text of a JSON value. */
export function canonicalize(v) {
  if (v === null) return 'null';
  switch (typeof v) {
    case 'boolean':
      return v ? 'true' : 'false';
    case 'number':
      if (!Number.isFinite(v)) throw new RangeError(`${v} is not a JSON number`);
      // onceq's limit: an integral double in (2^53, 1e21) prints as an integer that a strict
      // reader refuses (integers are kept within +-2^53)
      if (Math.abs(v) > MAX_SAFE && Math.abs(v) < 1e21)
        throw new RangeError(`number ${v} is an integer outside +-2^53`);
      return JSON.stringify(v); // ECMAScript Number::toString, which RFC 8785 specifies; -0 -> 0
    case 'string':
      return str(v);
    case 'object':
      if (Array.isArray(v)) return '[' + v.map(canonicalize).join(',') + ']';
      // sort() without a comparator orders by UTF-16 code units, as RFC 8785 asks
      return (
        '{' +
        Object.keys(v)
          .sort()
          .map((k) => {
            if (v[k] === undefined) throw new TypeError(`member ${k} is undefined`);
            return str(k) + ':' + canonicalize(v[k]);
          })
          .join(',') +
        '}'
      );
    default:
      throw new TypeError(`not a JSON value: ${typeof v}`);
  }
}

/** onceq's call fingerprint: SHA-256 hex of the RFC 8785 form of {args, tenant, tool}. */
export function fingerprint(tenant, tool, args) {
  return createHash('sha256')
    .update(canonicalize({ args, tenant, tool }), 'utf8')
    .digest('hex');
}

// --- HTTP --------------------------------------------------------------------------------------

/** A failure worth retrying with the same key (retryAfter: seconds or null). */
export class Transient extends Error {
  constructor(msg, retryAfter = null) {
    super(msg);
    this.retryAfter = retryAfter;
  }
}

/** A definite answer that a retry would not change (4xx other than 429). */
export class Refused extends Error {
  constructor(status, body) {
    super(`HTTP ${status}: ${body}`);
    this.status = status;
    this.body = body;
  }
}

/** Retry-After in seconds (delay-seconds or HTTP-date), or null. */
export function retryAfterSeconds(value) {
  if (!value) return null;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v);
  const t = Date.parse(v);
  return Number.isNaN(t) ? null : Math.max(0, (t - Date.now()) / 1000);
}

const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));

export class Client {
  constructor(url, { token = null, timeout = 10, tries = 8, backoff = 0.2, backoffMax = 5, log } = {}) {
    this.url = new URL(url);
    if (!['http:', 'https:'].includes(this.url.protocol)) throw new TypeError('url must be http(s)://');
    Object.assign(this, { token, timeout, tries: Math.max(1, tries), backoff, backoffMax });
    this.log = log || (() => {});
  }

  once(method, path, headers, body, extraS = 0) {
    const mod = this.url.protocol === 'https:' ? https : http;
    const h = { Accept: 'application/json', Connection: 'close', ...headers };
    if (this.token) h.Authorization = `Bearer ${this.token}`;
    if (body !== undefined) h['Content-Length'] = Buffer.byteLength(body);
    return new Promise((resolve, reject) => {
      const req = mod.request(
        { hostname: this.url.hostname, port: this.url.port, path, method, headers: h, agent: false },
        (res) => {
          const chunks = [];
          res.on('data', (c) => chunks.push(c));
          res.on('error', (e) => reject(new Transient(`connection: ${e.message}`)));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            if (res.statusCode === 429 || res.statusCode >= 500)
              reject(new Transient(`HTTP ${res.statusCode}: ${text.slice(0, 200)}`,
                retryAfterSeconds(res.headers['retry-after'])));
            else resolve({ status: res.statusCode, headers: res.headers, text });
          });
        },
      );
      // one deadline for the whole exchange, as a client's timeout should be
      const timer = setTimeout(() => {
        req.destroy(new Transient(`timeout after ${this.timeout + extraS} s`));
      }, (this.timeout + extraS) * 1000);
      req.on('close', () => clearTimeout(timer));
      req.on('error', (e) => reject(e instanceof Transient ? e : new Transient(`connection: ${e.message}`)));
      if (body !== undefined) req.write(body);
      req.end();
    });
  }

  /** One request, retried on Transient failures (same headers, same body); extraS is added to
   *  the timeout (a long poll lasts that much longer). */
  async request(method, path, headers = {}, body = undefined, extraS = 0) {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.once(method, path, headers, body, extraS);
      } catch (e) {
        if (!(e instanceof Transient) || attempt >= this.tries) throw e;
        // full jitter: a random wait up to the exponential step, never under Retry-After
        const step = Math.min(this.backoffMax, this.backoff * 2 ** (attempt - 1));
        let wait = Math.random() * step;
        if (e.retryAfter !== null) wait = Math.max(wait, e.retryAfter);
        this.log(`${method} ${path}: attempt ${attempt} failed (${e.message}); retrying in ${wait.toFixed(2)} s with the same key`);
        await sleep(wait);
      }
    }
  }

  /** POST the call: {call, replayed}. Throws Refused on a 4xx. */
  async submit(key, tool, args, tenant = null) {
    const b = { tool, args };
    if (tenant !== null) b.tenant = tenant;
    canonicalize(b); // refuse what onceq would refuse before sending
    const r = await this.request('POST', '/v1/tool-calls',
      { 'Idempotency-Key': key, 'Content-Type': 'application/json' }, JSON.stringify(b));
    if (r.status !== 200 && r.status !== 202) throw new Refused(r.status, r.text);
    return { call: JSON.parse(r.text), replayed: r.headers['idempotent-replayed'] === 'true' };
  }

  /** The call; with waitS (up to 60), a long poll: the producer answers as soon as the call
   *  is terminal, or after waitS with the call as it stands. */
  async get(callId, waitS = 0) {
    let path = `/v1/tool-calls/${encodeURIComponent(callId)}`;
    if (waitS > 0) path += `?wait=${Math.floor(waitS * 1000)}ms`;
    const r = await this.request('GET', path, {}, undefined, waitS);
    if (r.status !== 200) throw new Refused(r.status, r.text);
    return JSON.parse(r.text);
  }

  /** Long-poll (30 s a request) until terminal; null when limitS passed. Two requests start
   *  at least 0.1 s apart: a server that does not wait is polled. */
  async wait(call, limitS = 60) {
    const deadline = Date.now() + limitS * 1000;
    while (!TERMINAL.includes(call.status)) {
      const left = (deadline - Date.now()) / 1000;
      if (left < 0.01) return null;
      const started = Date.now();
      call = await this.get(call.call_id, Math.min(30, left));
      if (!TERMINAL.includes(call.status))
        await sleep(Math.max(0, Math.min(0.1 - (Date.now() - started) / 1000, (deadline - Date.now()) / 1000)));
    }
    return call;
  }
}

// --- CLI ---------------------------------------------------------------------------------------

async function readStdin() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  return new TextDecoder('utf-8', { fatal: true }).decode(Buffer.concat(chunks));
}

async function main(argv) {
  const cmd = argv[0];
  let o;
  try {
    ({ values: o } = parseArgs({
      args: argv.slice(1),
      options: {
        url: { type: 'string', default: 'http://127.0.0.1:8081' },
        key: { type: 'string' },
        tool: { type: 'string' },
        args: { type: 'string' },
        tenant: { type: 'string' },
        token: { type: 'string' },
        timeout: { type: 'string', default: '10' },
        tries: { type: 'string', default: '8' },
        wait: { type: 'string', default: '60' },
        'no-wait': { type: 'boolean', default: false },
        quiet: { type: 'boolean', default: false },
      },
    }));
  } catch (e) {
    console.error(`onceq_client: ${e.message}`);
    return EXIT.usage;
  }
  const usage = (m) => {
    console.error(`onceq_client: ${m}\nusage: onceq_client.mjs submit --key K --tool T [--args JSON] ...` +
      ' | fingerprint --tool T [--tenant X] < args.json | canon < any.json');
    return EXIT.usage;
  };
  let args;
  try {
    if (cmd === 'canon') {
      process.stdout.write(canonicalize(JSON.parse(await readStdin())));
      return EXIT.ok;
    }
    if (cmd !== 'submit' && cmd !== 'fingerprint') return usage('unknown command ' + (cmd ?? '(none)'));
    if (!o.tool) return usage('--tool is required');
    args = JSON.parse(cmd === 'submit' && o.args !== undefined ? o.args : await readStdin());
    if (args === null || typeof args !== 'object' || Array.isArray(args)) throw new TypeError('args must be a JSON object');
    if (cmd === 'fingerprint') {
      console.log(fingerprint(o.tenant ?? 'default', o.tool, args));
      return EXIT.ok;
    }
    canonicalize(args);
  } catch (e) {
    console.error(`onceq_client: invalid input: ${e.message}`);
    return EXIT.usage;
  }
  if (!o.key) return usage('--key is required');
  const tries = Number(o.tries), timeout = Number(o.timeout), waitS = Number(o.wait);
  if (!(tries >= 1 && timeout > 0 && waitS >= 0)) return usage('bad --tries, --timeout or --wait');
  const log = o.quiet ? () => {} : (m) => console.error(`onceq_client: ${m}`);
  const c = new Client(o.url, { token: o.token ?? null, timeout, tries, log });
  try {
    let { call, replayed } = await c.submit(o.key, o.tool, args, o.tenant ?? null);
    log(`accepted ${call.call_id} (${replayed ? 'replay' : 'new'}), status ${call.status}`);
    if ((o.tenant || !o.token) && call.fingerprint !== fingerprint(o.tenant ?? 'default', o.tool, args)) {
      console.error(`onceq_client: the server's fingerprint ${call.fingerprint} differs from ours`);
      return EXIT.fail;
    }
    if (!o['no-wait']) {
      const done = await c.wait(call, waitS);
      if (done === null) {
        console.error(`onceq_client: ${call.call_id} not terminal after ${waitS} s`);
        return EXIT.fail;
      }
      call = done;
    }
    console.log(JSON.stringify(call));
    return EXIT.ok;
  } catch (e) {
    if (e instanceof Refused) {
      console.error(`onceq_client: ${e.message}`);
      return e.status === 422 ? EXIT.conflict : e.status < 500 ? EXIT.usage : EXIT.fail;
    }
    if (e instanceof Transient) {
      console.error(`onceq_client: giving up after ${tries} tries: ${e.message}`);
      return EXIT.fail;
    }
    throw e;
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).then(
    (rc) => { process.exitCode = rc; },
    (e) => { console.error(`onceq_client: ${e.stack || e}`); process.exitCode = 1; },
  );
}
