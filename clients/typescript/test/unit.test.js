// SPDX-License-Identifier: Apache-2.0
// Tests that need no pipeline: webhook vectors, error mapping, retries and the wait loop
// against a scripted stub server on loopback.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import * as onceq from '../src/index.js';

const SECRET = 'whsec_test';
const BODY = Buffer.from('{"call_id":"c_1","status":"succeeded"}');
// HMAC-SHA256("whsec_test", "1700000000." + BODY), computed with
// printf '1700000000.%s' "$BODY" | openssl dgst -sha256 -hmac whsec_test
const VECTOR = 't=1700000000,v1=bbe9ca5a9906cc70ea96166155593457f6e8f2b1431cb2a255f0c46ce8461a23';

const callJson = (status = 'pending', id = 'c_0123456789abcdef') => ({
  call_id: id, status, tenant: 'default', idem_key: 'k', fingerprint: 'f', tool: 'charge', args: {},
  attempt: 1, result: null, error: null, effect_id: null, created_at: '', updated_at: '',
  expires_at: '', query_url: `/v1/tool-calls/${id}`,
});
const err = (code, message = 'm') => ({ error: { code, message } });
const now = () => performance.now() / 1000;

/** Answers each request with the next [status, headers, body, delayS]; the last one repeats. */
async function stub(script) {
  const seen = [];
  const srv = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      seen.push({ method: req.method, path: req.url, headers: req.headers, body: Buffer.concat(chunks).toString(), t: now() });
      const [status, headers, body, delay] = script.length > 1 ? script.shift() : script[0];
      setTimeout(() => {
        res.writeHead(status, { 'Content-Type': 'application/json', ...headers });
        res.end(JSON.stringify(body));
      }, (delay || 0) * 1000);
    });
  });
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${srv.address().port}`, seen, close: () => new Promise((r) => srv.close(r)) };
}

test('webhook: known vector verifies', () => {
  assert.equal(onceq.signWebhook(SECRET, BODY, 1700000000), VECTOR);
  assert.equal(onceq.verifyWebhook(SECRET, BODY, VECTOR, { now: 1700000100 }), 1700000000);
  assert.equal(onceq.verifyWebhook(Buffer.from(SECRET), BODY.toString(), VECTOR, { toleranceS: 0 }), 1700000000);
});

test('webhook: a tampered body fails', () => {
  const tampered = Buffer.from(BODY.toString().replace('succeeded', 'failed'));
  assert.throws(() => onceq.verifyWebhook(SECRET, tampered, VECTOR, { now: 1700000100 }), onceq.WebhookSignatureError);
});

test('webhook: wrong secret, old timestamp, malformed headers fail', () => {
  for (const [secret, header, nowS] of [
    ['other', VECTOR, 1700000100],
    [SECRET, VECTOR, 1700000000 + 301],
    [SECRET, 'v1=' + VECTOR.split('v1=')[1], 1700000000],
    [SECRET, 't=1700000000', 1700000000],
    [SECRET, '', 1700000000],
    [SECRET, 't=1700000000,v1=\u00e9', 1700000000],
  ])
    assert.throws(() => onceq.verifyWebhook(secret, BODY, header, { now: nowS }), onceq.WebhookSignatureError, header);
});

test('webhook: any v1 may match (secret rotation)', () => {
  const h = `t=1700000000,v1=${'0'.repeat(64)},${VECTOR.split(',')[1]}`;
  assert.equal(onceq.verifyWebhook(SECRET, BODY, h, { now: 1700000000 }), 1700000000);
});

test('503 with Retry-After: retried after >= 1 s with the same key and body', async (t) => {
  const s = await stub([[503, { 'Retry-After': '1' }, err('unavailable')], [202, {}, callJson()]]);
  t.after(s.close);
  const call = await new onceq.Client(s.url, { backoff: 0.01 }).submit('charge', { amount: 1 }, { key: 'k1' });
  assert.equal(call.status, 'pending');
  assert.equal(s.seen.length, 2);
  assert.ok(s.seen[1].t - s.seen[0].t >= 1.0);
  assert.equal(s.seen[0].headers['idempotency-key'], 'k1');
  assert.equal(s.seen[1].headers['idempotency-key'], 'k1');
  assert.equal(s.seen[0].body, s.seen[1].body);
});

test('429 and 500 retried until the deadline, then Unavailable', async (t) => {
  const s = await stub([[429, {}, err('rate_limited')], [500, {}, {}]]);
  t.after(s.close);
  const t0 = now();
  await assert.rejects(new onceq.Client(s.url, { backoff: 0.05, backoffMax: 0.2, retryDeadline: 1 }).submit('charge', {}, { key: 'k2' }),
    onceq.Unavailable);
  assert.ok(now() - t0 < 3);
  assert.ok(s.seen.length > 2);
});

test('422 is IdempotencyConflict with its code, not retried', async (t) => {
  const s = await stub([[422, {}, err('idempotency_conflict', 'another request')]]);
  t.after(s.close);
  await assert.rejects(new onceq.Client(s.url).submit('charge', {}, { key: 'k3' }),
    (e) => e instanceof onceq.IdempotencyConflict && e.code === 'idempotency_conflict' && e.status === 422);
  assert.equal(s.seen.length, 1);
});

test('typed errors by code', async () => {
  for (const [status, code, C] of [[400, 'bad_request', onceq.BadRequest], [401, 'unauthorized', onceq.Unauthorized],
    [403, 'tenant_mismatch', onceq.TenantMismatch], [404, 'not_found', onceq.NotFound],
    [413, 'payload_too_large', onceq.PayloadTooLarge]]) {
    const s = await stub([[status, {}, err(code)]]);
    try {
      await assert.rejects(new onceq.Client(s.url).get('c_x'), C);
    } finally {
      await s.close();
    }
  }
});

test('bearer token from the option or ONCEQ_TOKEN', async (t) => {
  const s = await stub([[200, {}, callJson('succeeded')]]);
  t.after(s.close);
  process.env.ONCEQ_TOKEN = 'tok-env';
  try {
    await new onceq.Client(s.url).get('c_x');
    await new onceq.Client(s.url, { token: 'tok-arg' }).get('c_x');
  } finally {
    delete process.env.ONCEQ_TOKEN;
  }
  assert.equal(s.seen[0].headers.authorization, 'Bearer tok-env');
  assert.equal(s.seen[1].headers.authorization, 'Bearer tok-arg');
});

test('connection refused is a TransportError after the deadline', async () => {
  const s = await stub([[200, {}, {}]]);
  await s.close();
  await assert.rejects(new onceq.Client(s.url, { retryDeadline: 0.5, backoff: 0.05 }).get('c_x'), onceq.TransportError);
});

test('wait: a server ignoring ?wait= is asked again, with pauses', async (t) => {
  const running = [200, {}, callJson('running')];
  const s = await stub([running, running, running, [200, {}, callJson('succeeded')]]);
  t.after(s.close);
  const call = await new onceq.Client(s.url).wait('c_0123456789abcdef', { timeout: 20 });
  assert.equal(call.status, 'succeeded');
  assert.equal(s.seen.length, 4);
  assert.match(s.seen[0].path, /\?wait=\d+s$/);
  assert.ok(s.seen[3].t - s.seen[0].t >= 0.1 + 0.2 + 0.4 - 0.05);
});

test('wait: a server holding the request is asked again at once', async (t) => {
  const s = await stub([[200, {}, callJson('running'), 1.2], [200, {}, callJson('failed')]]);
  t.after(s.close);
  const call = await new onceq.Client(s.url, { pollWait: 2 }).wait('c_0123456789abcdef');
  assert.equal(call.status, 'failed');
  assert.equal(s.seen.length, 2);
  assert.match(s.seen[0].path, /\?wait=2s$/);
  assert.ok(s.seen[1].t - s.seen[0].t < 1.2 + 0.09);
});

test('wait: WaitTimeout with the last state', async (t) => {
  const s = await stub([[200, {}, callJson('running')]]);
  t.after(s.close);
  await assert.rejects(new onceq.Client(s.url).wait('c_0123456789abcdef', { timeout: 1 }),
    (e) => e instanceof onceq.WaitTimeout && e.call.status === 'running');
});

test('call: submit (retried), then wait', async (t) => {
  const s = await stub([[503, { 'Retry-After': '1' }, err('unavailable')],
    [202, { 'Idempotent-Replayed': 'true' }, callJson('running')], [200, {}, callJson('succeeded')]]);
  t.after(s.close);
  const call = await new onceq.Client(s.url).call('charge', {}, { key: 'k4', timeout: 10 });
  assert.equal(call.status, 'succeeded');
  assert.deepEqual(s.seen.map((x) => x.method), ['POST', 'POST', 'GET']);
});
