// SPDX-License-Identifier: Apache-2.0
// Compiled by `tsc -p tsconfig.json` (when TypeScript is available): the declarations are
// consistent and usable. Not run.
import { Client, IdempotencyConflict, verifyWebhook, type Call, type StepStatus, type Task } from '../src/index.js';

async function example(): Promise<Call> {
  const c = new Client('http://127.0.0.1:8081', { token: null, retryDeadline: 30 });
  try {
    return await c.call('charge', { amount: 1999, currency: 'EUR' }, { key: 'order-1', tenant: 'shop' });
  } catch (e) {
    if (e instanceof IdempotencyConflict) console.log(e.code, e.status);
    throw e;
  }
}
async function tasks(c: Client): Promise<Task> {
  const t = await c.runTask([{ name: 'a', tool: 'charge', args: { amount: 1 } }], { key: 'order-2' });
  const s: StepStatus = t.steps[0].status;
  void s;
  return c.resolveTask(t.task_id, 'approve', { fence: t.fence, note: 'ok', by: 'ada' });
}
void tasks;
const t: number = verifyWebhook('secret', new Uint8Array(), 't=1,v1=00');
void example;
void t;
