#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
// onceq-client fingerprint --tool T [--tenant X] < args.json | canon < any.json
import { parseArgs } from 'node:util';
import { canonicalize, fingerprint } from './index.js';

const { values: o, positionals } = parseArgs({
  allowPositionals: true,
  options: { tool: { type: 'string' }, tenant: { type: 'string', default: 'default' } },
});
const chunks = [];
for await (const c of process.stdin) chunks.push(c);
try {
  const v = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  if (positionals[0] === 'canon') process.stdout.write(canonicalize(v));
  else if (positionals[0] === 'fingerprint' && o.tool) {
    if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new TypeError('args must be a JSON object');
    console.log(fingerprint(o.tenant, o.tool, v));
  } else {
    console.error('usage: onceq-client fingerprint --tool T [--tenant X] < args.json | canon < any.json');
    process.exitCode = 2;
  }
} catch (e) {
  console.error(`onceq-client: invalid input: ${e.message}`);
  process.exitCode = 2;
}
