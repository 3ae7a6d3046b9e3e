// SPDX-License-Identifier: Apache-2.0
// onceq: a client for onceq's HTTP API (Node 18+, no dependencies). Types: index.d.ts.
//
// Retries: a submit (and a read) that gets no answer (connection refused or lost, timeout), a
// 429 or a 5xx is sent again with the SAME Idempotency-Key and the SAME body bytes: the
// producer then answers with the original call, so a retry never makes a second call. The
// pause before retry n is uniform in [0, min(backoffMax, backoff * 2^(n-1))] ("full jitter"),
// at least the server's Retry-After; retries stop at the deadline (retryDeadline seconds after
// the first attempt) and the last error is thrown.
//
// Wait: GET /v1/tool-calls/{id}?wait=Ns (long poll). A producer that does not know `wait`
// answers at once: the loop asks again, pausing (0.1 s growing to 1 s) only when an answer
// came much sooner than asked.
//
// Tasks (POST /v1/tasks, a run of steps under one Idempotency-Key): submitTask is retried like a
// submit (same key, same body bytes: the same task); waitTask polls GET /v1/tasks/{id} with
// backoff (0.1 s doubling to taskPollMax, 2 s), as the producer has no long poll for tasks;
// resolveTask (an operator's decision) is sent once, never retried: a decision whose answer was
// lost may have been committed, and sending it again would be refused (409) or act twice.
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';

const MAX_SAFE = 2 ** 53;
export const TERMINAL = Object.freeze(['succeeded', 'failed', 'needs_review']);
/** A task's final statuses (awaiting_approval is not one: an operator decides, then it runs). */
export const TASK_TERMINAL = Object.freeze(['succeeded', 'compensated', 'failed', 'needs_review']);
export const DEFAULT_URL = 'http://127.0.0.1:8081';
export const SIGNATURE_HEADER = 'Onceq-Signature';

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

// --- errors ------------------------------------------------------------------------------------

/** Base of every error this package throws. */
export class OnceqError extends Error {
  get name() {
    return this.constructor.name;
  }
}

/** The producer answered with {"error":{"code","message"}}: status, code (stable), retryAfter. */
export class ApiError extends OnceqError {
  constructor(status, code, message, retryAfter = null, body = '') {
    super(`HTTP ${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.detail = message;
    this.retryAfter = retryAfter;
    this.body = body;
  }
}
export class BadRequest extends ApiError {}
export class Unauthorized extends ApiError {}
export class Forbidden extends ApiError {}
export class TenantMismatch extends Forbidden {}
export class NotFound extends ApiError {}
export class MethodNotAllowed extends ApiError {}
export class PayloadTooLarge extends ApiError {}
export class IdempotencyConflict extends ApiError {}
/** 409 from resolveTask: not_awaiting_approval, not_in_review, not_retryable, review_moved. */
export class ReviewConflict extends ApiError {}
export class RateLimited extends ApiError {}
export class Unavailable extends ApiError {}

/** No HTTP answer: connection refused or lost, or a timeout. */
export class TransportError extends OnceqError {}

/** The call was not terminal before the deadline; .call is the last state seen. */
export class WaitTimeout extends OnceqError {
  constructor(message, call = null) {
    super(message);
    this.call = call;
  }
}

/** The webhook signature header is missing, malformed, too old, or matches no v1 signature. */
export class WebhookSignatureError extends OnceqError {}

const BY_CODE = {
  bad_request: BadRequest,
  missing_idempotency_key: BadRequest,
  invalid_idempotency_key: BadRequest,
  unauthorized: Unauthorized,
  tenant_mismatch: TenantMismatch,
  forbidden: Forbidden,
  not_found: NotFound,
  method_not_allowed: MethodNotAllowed,
  payload_too_large: PayloadTooLarge,
  idempotency_conflict: IdempotencyConflict,
  bad_task: BadRequest,
  bad_reference: BadRequest,
  review_moved: ReviewConflict,
  unavailable: Unavailable,
};
const BY_STATUS = {
  400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotAllowed,
  409: ReviewConflict, 413: PayloadTooLarge, 422: IdempotencyConflict, 429: RateLimited,
};

/** The error for an error answer: by its code, else by its status. */
export function errorFor(status, code, message, retryAfter = null, body = '') {
  const C = (Object.hasOwn(BY_CODE, code) && BY_CODE[code]) || BY_STATUS[status] ||
    (status >= 500 ? Unavailable : ApiError);
  return new C(status, code, message, retryAfter, body);
}

/** Retry-After in seconds (delay-seconds or HTTP-date), or null. */
export function retryAfterSeconds(value) {
  if (!value) return null;
  const v = String(value).trim();
  if (/^\d+$/.test(v)) return Number(v);
  const t = Date.parse(v);
  return Number.isNaN(t) ? null : Math.max(0, (t - Date.now()) / 1000);
}

const sleep = (s) => new Promise((r) => setTimeout(r, Math.max(0, s) * 1000));
const now = () => performance.now() / 1000;
const retryable = (e) =>
  e instanceof TransportError || e instanceof RateLimited || e instanceof Unavailable ||
  (e instanceof ApiError && e.status >= 500);

// --- client ------------------------------------------------------------------------------------

function toCall(obj, replayed) {
  return { ...obj, replayed, terminal: TERMINAL.includes(obj.status) };
}

function toTask(obj, replayed) {
  return { ...obj, replayed, terminal: TASK_TERMINAL.includes(obj.status) };
}

const taskPath = (taskId, suffix = '') => `/v1/tasks/${encodeURIComponent(taskId)}${suffix}`;

export class Client {
  /**
   * @param {string} [url] default ONCEQ_URL or http://127.0.0.1:8081
   * @param {object} [opts] token (default ONCEQ_TOKEN), timeout (s per request), retryDeadline,
   *   backoff, backoffMax, maxTries, pollWait (s), log
   */
  constructor(url, opts = {}) {
    this.url = new URL(url || process.env.ONCEQ_URL || DEFAULT_URL);
    if (!['http:', 'https:'].includes(this.url.protocol)) throw new TypeError('url must be http(s)://');
    this.token = opts.token ?? (process.env.ONCEQ_TOKEN || null);
    this.timeout = opts.timeout ?? 10;
    this.retryDeadline = opts.retryDeadline ?? 60;
    this.backoff = opts.backoff ?? 0.2;
    this.backoffMax = opts.backoffMax ?? 5;
    this.maxTries = opts.maxTries ?? null;
    this.pollWait = opts.pollWait ?? 30;
    this.taskPollMax = opts.taskPollMax ?? 2;
    this.log = opts.log || (() => {});
  }

  /** One HTTP exchange: resolves [status, headers, body string], rejects with TransportError. */
  once(method, path, headers, body, timeout) {
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
          res.on('error', (e) => reject(new TransportError(`${method} ${path}: connection: ${e.message}`)));
          res.on('aborted', () => reject(new TransportError(`${method} ${path}: connection lost`)));
          res.on('end', () => resolve([res.statusCode, res.headers, Buffer.concat(chunks).toString('utf8')]));
        },
      );
      req.setTimeout(timeout * 1000, () =>
        req.destroy(new TransportError(`${method} ${path}: timeout after ${timeout} s`)));
      req.on('error', (e) =>
        reject(e instanceof TransportError ? e : new TransportError(`${method} ${path}: connection: ${e.message}`)));
      if (body !== undefined) req.write(body);
      req.end();
    });
  }

  static check([status, headers, body]) {
    if (status < 400) return [status, headers, body];
    let code = '', message = body.slice(0, 200);
    try {
      const e = JSON.parse(body).error;
      code = String(e.code);
      message = String(e.message ?? '');
    } catch {
      /* not an error body: keep the status */
    }
    throw errorFor(status, code, message, retryAfterSeconds(headers['retry-after']), body);
  }

  pause(attempt, e, started) {
    if (!retryable(e)) return null;
    if (this.maxTries !== null && attempt >= this.maxTries) return null;
    const step = Math.min(this.backoffMax, this.backoff * 2 ** (attempt - 1));
    let wait = Math.random() * step;
    if (e.retryAfter != null) wait = Math.max(wait, e.retryAfter);
    if (now() + wait - started > this.retryDeadline) return null;
    return wait;
  }

  async request(method, path, headers = {}, body = undefined, timeout = undefined) {
    const started = now();
    for (let attempt = 1; ; attempt++) {
      try {
        return Client.check(await this.once(method, path, headers, body, timeout ?? this.timeout));
      } catch (e) {
        const wait = this.pause(attempt, e, started);
        if (wait === null) throw e;
        this.log(`${method} ${path}: attempt ${attempt} failed (${e.message}); retrying in ${wait.toFixed(2)} s with the same key`);
        await sleep(wait);
      }
    }
  }

  static callOf([, headers, body]) {
    return toCall(JSON.parse(body), headers['idempotent-replayed'] === 'true');
  }

  /** POST /v1/tool-calls under the Idempotency-Key: the accepted (or replayed) call. */
  async submit(tool, args, { key, tenant, callbackUrl } = {}) {
    if (typeof key !== 'string' || key === '') throw new TypeError('key (the Idempotency-Key) must be a non-empty string');
    const req = { tool, args };
    if (tenant != null) req.tenant = tenant;
    if (callbackUrl != null) req.callback_url = callbackUrl; // a signed webhook of the settled call
    canonicalize(req); // refuses what onceq would refuse (NaN, lone surrogates, big integers)
    const body = JSON.stringify(req);
    return Client.callOf(await this.request('POST', '/v1/tool-calls',
      { 'Idempotency-Key': key, 'Content-Type': 'application/json' }, body));
  }

  async get(callId) {
    return Client.callOf(await this.request('GET', `/v1/tool-calls/${encodeURIComponent(callId)}`));
  }

  async getByKey(key, { tenant } = {}) {
    const q = tenant ? `?tenant=${encodeURIComponent(tenant)}` : '';
    return Client.callOf(await this.request('GET', `/v1/tool-calls/by-key/${encodeURIComponent(key)}${q}`));
  }

  /** Long-poll until terminal; WaitTimeout after `timeout` s (default 300; null: forever). */
  async wait(callId, { timeout = 300 } = {}) {
    const end = timeout == null ? null : now() + timeout;
    let pause = 0.1, last = null;
    for (;;) {
      const left = end === null ? this.pollWait : end - now();
      if (left <= 0) throw new WaitTimeout(`${callId} not terminal after ${timeout} s`, last);
      const w = Math.max(1, Math.round(Math.min(this.pollWait, left)));
      const t0 = now();
      last = Client.callOf(await this.request('GET',
        `/v1/tool-calls/${encodeURIComponent(callId)}?wait=${w}s`, {}, undefined, w + this.timeout));
      if (last.terminal) return last;
      if (now() - t0 < w / 2) { // the server did not hold the request
        await sleep(end === null ? pause : Math.min(pause, end - now()));
        pause = Math.min(1, pause * 2);
      }
    }
  }

  /** Submit, then wait until terminal (succeeded, failed, needs_review). */
  async call(tool, args, { key, tenant, callbackUrl, timeout = 300 } = {}) {
    const c = await this.submit(tool, args, { key, tenant, callbackUrl });
    return c.terminal ? c : this.wait(c.call_id, { timeout });
  }

  // --- tasks -----------------------------------------------------------------------------------

  static taskOf([, headers, body]) {
    return toTask(JSON.parse(body), headers['idempotent-replayed'] === 'true');
  }

  /**
   * POST /v1/tasks under the Idempotency-Key: the new (or replayed) task. Each step is {name,
   * tool, args, compensate?: {tool, args}, irreversible?, approval?}; args may cite earlier
   * results as "{steps.NAME.result.PATH}".
   */
  async submitTask(steps, { key, tenant } = {}) {
    if (typeof key !== 'string' || key === '') throw new TypeError('key (the Idempotency-Key) must be a non-empty string');
    const req = { steps };
    if (tenant != null) req.tenant = tenant;
    canonicalize(req); // refuses what onceq would refuse
    return Client.taskOf(await this.request('POST', '/v1/tasks',
      { 'Idempotency-Key': key, 'Content-Type': 'application/json' }, JSON.stringify(req)));
  }

  async getTask(taskId) {
    return Client.taskOf(await this.request('GET', taskPath(taskId)));
  }

  async getTaskByKey(key, { tenant } = {}) {
    const q = tenant ? `?tenant=${encodeURIComponent(tenant)}` : '';
    return Client.taskOf(await this.request('GET', `/v1/tasks/by-key/${encodeURIComponent(key)}${q}`));
  }

  /**
   * Poll (0.1 s doubling to taskPollMax) until the task's status is in `until` (default
   * TASK_TERMINAL); WaitTimeout (.call: the last task seen) after `timeout` s (null: forever).
   */
  async waitTask(taskId, { timeout = 300, until = TASK_TERMINAL } = {}) {
    const end = timeout == null ? null : now() + timeout;
    let pause = 0.1;
    for (;;) {
      const last = await this.getTask(taskId);
      if (until.includes(last.status)) return last;
      const left = end === null ? null : end - now();
      if (left !== null && left <= 0) throw new WaitTimeout(`${taskId} is ${last.status} after ${timeout} s`, last);
      await sleep(left === null ? pause : Math.min(pause, left));
      pause = Math.min(this.taskPollMax, pause * 2);
    }
  }

  /** Submit a task, then wait until it is final (one awaiting approval is waited for). */
  async runTask(steps, { key, tenant, timeout = 300 } = {}) {
    const t = await this.submitTask(steps, { key, tenant });
    return t.terminal ? t : this.waitTask(t.task_id, { timeout });
  }

  /**
   * An operator's decision (POST /v1/tasks/{id}/resolve): approve | reject a step awaiting
   * approval, compensated | succeeded | retry-compensation a task in needs_review, made on the
   * review episode `fence` (task.fence). Needs an operator token when the producer has a token
   * file; `by` is required without one. Sent once (never retried).
   */
  async resolveTask(taskId, decision, { fence, note, by } = {}) {
    const req = { as: decision, fence, note };
    if (by != null) req.by = by;
    return Client.taskOf(Client.check(await this.once('POST', taskPath(taskId, '/resolve'),
      { 'Content-Type': 'application/json' }, JSON.stringify(req), this.timeout)));
  }
}

// --- webhooks ----------------------------------------------------------------------------------

const keyOf = (secret) => (typeof secret === 'string' ? Buffer.from(secret, 'utf8') : Buffer.from(secret));
const bodyOf = (body) => (typeof body === 'string' ? Buffer.from(body, 'utf8') : Buffer.from(body));

/** The header value a sender puts on `body`: t=TIMESTAMP,v1=HEX. */
export function signWebhook(secret, body, timestamp = Math.floor(Date.now() / 1000)) {
  const t = Math.trunc(timestamp);
  const mac = createHmac('sha256', keyOf(secret)).update(`${t}.`).update(bodyOf(body)).digest('hex');
  return `t=${t},v1=${mac}`;
}

/**
 * Check a delivery: returns its timestamp or throws WebhookSignatureError. `body` must be the
 * raw body as received (a Buffer; a string is taken as UTF-8). toleranceS <= 0 skips the age
 * check.
 */
export function verifyWebhook(secret, body, header, { toleranceS = 300, now: nowS } = {}) {
  if (!header) throw new WebhookSignatureError('no signature header');
  let t = null;
  const sigs = [];
  for (const part of String(header).split(',')) {
    const i = part.indexOf('=');
    if (i < 0) continue;
    const k = part.slice(0, i).trim(), v = part.slice(i + 1).trim();
    if (k === 't' && /^\d+$/.test(v)) t = Number(v);
    else if (k === 'v1') sigs.push(v.toLowerCase());
  }
  if (t === null) throw new WebhookSignatureError('no timestamp (t=) in the signature header');
  if (sigs.length === 0) throw new WebhookSignatureError('no v1 signature in the signature header');
  if (toleranceS > 0) {
    const age = (nowS ?? Date.now() / 1000) - t;
    if (Math.abs(age) > toleranceS) throw new WebhookSignatureError(`timestamp ${t} is outside the tolerance (${toleranceS} s)`);
  }
  const want = Buffer.from(createHmac('sha256', keyOf(secret)).update(`${t}.`).update(bodyOf(body)).digest('hex'));
  let ok = false;
  for (const s of sigs) {
    const got = Buffer.from(s, 'utf8');
    if (got.length === want.length && timingSafeEqual(got, want)) ok = true;
  }
  if (!ok) throw new WebhookSignatureError('no v1 signature matches the body');
  return t;
}
