// SPDX-License-Identifier: Apache-2.0
// Tests against a live pipeline (tests/integration/test_clients.sh starts it and sets
// ONCEQ_TEST_URL; ONCEQ_TEST_PROXY: tests/tools/oq_chaos_proxy.py, ONCEQ_TEST_PYTHON: the
// python3 to run it with; ONCEQ_TEST_KEYS_OUT: a file where every key and call id is appended,
// so the script can count calls and effects per key). Skipped without ONCEQ_TEST_URL.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { appendFileSync } from 'node:fs';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import * as onceq from '../src/index.js';

const URL_ = process.env.ONCEQ_TEST_URL;
const RUN = randomBytes(4).toString('hex');
const skip = URL_ ? false : 'needs ONCEQ_TEST_URL (a running pipeline)';

function record(call) {
  if (process.env.ONCEQ_TEST_KEYS_OUT) appendFileSync(process.env.ONCEQ_TEST_KEYS_OUT, `${call.idem_key} ${call.call_id}\n`);
}

const freePort = () => new Promise((resolve, reject) => {
  const s = net.createServer();
  s.on('error', reject);
  s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
});

/** A chaos proxy that faults exactly the first request it gets. */
async function proxy(t, mode) {
  const port = await freePort();
  const p = spawn(process.env.ONCEQ_TEST_PYTHON || 'python3', [process.env.ONCEQ_TEST_PROXY, '--listen', String(port),
    '--upstream', new URL(URL_).port, '--modes', mode, '--rate', '1', '--max-faults', '1', '--delay-ms', '2500'],
  { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  const exited = new Promise((r) => p.on('exit', r));
  t.after(() => { p.kill(); return exited; });
  await new Promise((resolve, reject) => {
    p.stdout.on('data', (c) => { out += c; if (out.includes('listening')) resolve(); });
    p.on('exit', () => reject(new Error(`proxy exited: ${out}`)));
  });
  return { url: `http://127.0.0.1:${port}`, output: () => out };
}

test('call succeeds, reads back by id and key, replays', { skip }, async () => {
  const c = new onceq.Client(URL_);
  const key = `js-ok-${RUN}`;
  const call = await c.call('charge', { amount: 5 }, { key, timeout: 60 });
  record(call);
  assert.equal(call.status, 'succeeded');
  assert.equal(call.fingerprint, onceq.fingerprint('default', 'charge', { amount: 5 }));
  assert.equal((await c.get(call.call_id)).status, 'succeeded');
  assert.equal((await c.getByKey(key)).call_id, call.call_id);
  const again = await c.submit('charge', { amount: 5 }, { key });
  assert.deepEqual([again.call_id, again.replayed], [call.call_id, true]);
});

test('a failing tool ends failed', { skip }, async () => {
  const call = await new onceq.Client(URL_).call('fail', {}, { key: `js-fail-${RUN}`, timeout: 60 });
  record(call);
  assert.equal(call.status, 'failed');
  assert.equal(call.error.code, 'tool_failed');
});

test('422 idempotency_conflict; 404 not_found', { skip }, async () => {
  const c = new onceq.Client(URL_);
  const key = `js-conflict-${RUN}`;
  record(await c.submit('charge', { amount: 1 }, { key }));
  await assert.rejects(c.submit('charge', { amount: 2 }, { key }),
    (e) => e instanceof onceq.IdempotencyConflict && e.status === 422 && e.code === 'idempotency_conflict');
  await assert.rejects(c.get('c_' + '0'.repeat(32)), onceq.NotFound);
});

for (const mode of ['drop-response', 'delay']) {
  test(`retried with the same key after ${mode}`, { skip }, async (t) => {
    const p = await proxy(t, mode);
    const log = [];
    const c = new onceq.Client(p.url, { timeout: 1, log: (m) => log.push(m) });
    const key = `js-${mode}-${RUN}`;
    const args = { amount: 7, memo: 'caf\u00e9 \u{1F602}', rate: 0.1 };
    const call = await c.call('charge', args, { key, timeout: 60 });
    record(call);
    assert.deepEqual([call.status, call.idem_key], ['succeeded', key]);
    assert.ok(log.length && log[0].includes('attempt 1 failed'), log.join('\n'));
    if (mode === 'delay') assert.match(log[0], /timeout/);
    assert.equal((await new onceq.Client(URL_).submit('charge', args, { key })).replayed, true);
    assert.ok(p.output().includes(`fault 1 mode=${mode}`), p.output());
  });
}

test('long poll wait to terminal', { skip }, async () => {
  const c = new onceq.Client(URL_, { pollWait: 5 });
  const call = await c.submit('charge', { amount: 9 }, { key: `js-wait-${RUN}` });
  record(call);
  assert.equal((await c.wait(call.call_id, { timeout: 60 })).status, 'succeeded');
});
