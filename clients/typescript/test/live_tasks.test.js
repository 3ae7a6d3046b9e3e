// SPDX-License-Identifier: Apache-2.0
// Tasks against a live pipeline (tests/integration/test_clients.sh starts it and sets
// ONCEQ_TEST_URL; ONCEQ_TEST_KEYS_OUT: every step's and compensation's derived key and call id
// are appended, so the script checks one call per key and one effect per succeeded call).
// Skipped without ONCEQ_TEST_URL.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { appendFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import * as onceq from '../src/index.js';

const URL_ = process.env.ONCEQ_TEST_URL;
const RUN = randomBytes(4).toString('hex');
const skip = URL_ ? false : 'needs ONCEQ_TEST_URL (a running pipeline)';

/** Each call of the task: KEY/STEP and KEY/STEP/compensate with their call ids. */
function record(task) {
  const out = process.env.ONCEQ_TEST_KEYS_OUT;
  if (!out) return;
  for (const s of task.steps) {
    if (s.call_id) appendFileSync(out, `${task.idem_key}/${s.name} ${s.call_id}\n`);
    if (s.compensation?.call_id) appendFileSync(out, `${task.idem_key}/${s.name}/compensate ${s.compensation.call_id}\n`);
  }
}

const CHAIN = [
  { name: 'charge', tool: 'charge', args: { amount: 12 },
    compensate: { tool: 'charge', args: { amount: 1, currency: '{steps.charge.result.charge_id}' } } },
  { name: 'again', tool: 'charge', args: { amount: '{steps.charge.result.charged}' } },
];

test('task succeeds, a step cites an earlier result, reads back, replays', { skip }, async () => {
  const c = new onceq.Client(URL_);
  const key = `js-task-ok-${RUN}`;
  const t = await c.runTask(CHAIN, { key, timeout: 90 });
  record(t);
  assert.equal(t.status, 'succeeded');
  assert.equal(t.idem_key, key);
  assert.ok(t.terminal && t.task_id.startsWith('t_'));
  assert.deepEqual(t.steps.map((s) => s.status), ['succeeded', 'succeeded']);
  assert.equal(t.steps[1].result.charged, 12); // the reference kept its JSON type
  assert.equal((await c.getTask(t.task_id)).status, 'succeeded');
  assert.equal((await c.getTaskByKey(key)).task_id, t.task_id);
  const again = await c.submitTask(CHAIN, { key });
  assert.equal(again.task_id, t.task_id);
  assert.equal(again.replayed, true);
  await assert.rejects(c.submitTask(CHAIN.slice(0, 1), { key }), onceq.IdempotencyConflict);
  await assert.rejects(
    c.submitTask([{ name: 'a', tool: 'charge', args: { x: '{steps.b.result}' } }], { key: `js-task-bad-${RUN}` }),
    (e) => e instanceof onceq.BadRequest && e.code === 'bad_reference');
  await assert.rejects(c.getTask(`t_${'0'.repeat(32)}`), onceq.NotFound);
});

test('a failed step compensates the one before', { skip }, async () => {
  const t = await new onceq.Client(URL_).runTask(
    [CHAIN[0], { name: 'boom', tool: 'fail', args: {} }], { key: `js-task-comp-${RUN}`, timeout: 90 });
  record(t);
  assert.equal(t.status, 'compensated');
  assert.deepEqual(t.steps.map((s) => s.status), ['compensated', 'failed']);
  assert.equal(t.steps[0].compensation.status, 'succeeded');
});

test('approval resolved over HTTP: stale fence refused, approve runs the step', { skip }, async () => {
  const c = new onceq.Client(URL_);
  const steps = [CHAIN[0], { name: 'ship', tool: 'charge', args: { amount: 4 }, approval: true, irreversible: true }];
  let t = await c.submitTask(steps, { key: `js-task-appr-${RUN}` });
  t = await c.waitTask(t.task_id, { timeout: 90, until: ['awaiting_approval', ...onceq.TASK_TERMINAL] });
  assert.equal(t.status, 'awaiting_approval');
  assert.equal(t.steps[1].call_id, null);
  await assert.rejects(c.resolveTask(t.task_id, 'approve', { fence: t.fence + 1, note: 'stale', by: 'js' }),
    (e) => e instanceof onceq.ReviewConflict && e.code === 'review_moved');
  const r = await c.resolveTask(t.task_id, 'approve', { fence: t.fence, note: 'checked', by: 'js' });
  assert.equal(r.status, 'running');
  const done = await c.waitTask(t.task_id, { timeout: 90 });
  record(done);
  assert.equal(done.status, 'succeeded');
  await assert.rejects(c.resolveTask(t.task_id, 'approve', { fence: t.fence, note: 'again', by: 'js' }),
    (e) => e instanceof onceq.ReviewConflict && e.code === 'not_awaiting_approval');
});

test('waitTask times out with the last task seen', { skip }, async () => {
  const c = new onceq.Client(URL_);
  const t = await c.submitTask([{ name: 's', tool: 'charge', args: { amount: 2, delay_ms: 3000 } }], { key: `js-task-slow-${RUN}` });
  await assert.rejects(c.waitTask(t.task_id, { timeout: 0.5 }),
    (e) => e instanceof onceq.WaitTimeout && e.call.task_id === t.task_id);
  record(await c.waitTask(t.task_id, { timeout: 90 }));
});
