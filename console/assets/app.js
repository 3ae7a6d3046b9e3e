// SPDX-License-Identifier: Apache-2.0
// onceq console: one page, its views (#/calls, #/call/ID, #/tasks, #/task/ID, #/review, #/dlq,
// #/charts). Data
// comes from the console's /api routes (the same library functions as the CLI); the DOM is
// built with textContent only, never from HTML strings. No library, no build step.
'use strict';

let me = null;
const page = () => document.getElementById('page');

function h(tag, attrs, ...kids) {
  const ns = ['svg', 'path', 'line', 'text', 'polyline', 'g', 'rect'].includes(tag);
  const el = ns ? document.createElementNS('http://www.w3.org/2000/svg', tag)
                : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else el.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    el.appendChild(typeof kid === 'string' || typeof kid === 'number'
                   ? document.createTextNode(String(kid)) : kid);
  }
  return el;
}

function say(text, kind) {
  const m = document.getElementById('msg');
  m.textContent = text || '';
  m.className = kind || '';
}

async function api(path, opts) {
  const r = await fetch('/api/' + path, Object.assign({credentials: 'same-origin'}, opts || {}));
  if (r.status === 401) { location.href = '/login.html'; throw new Error('log in'); }
  const ct = r.headers.get('content-type') || '';
  const body = ct.startsWith('application/json') ? await r.json() : await r.text();
  if (!r.ok) {
    const e = new Error(body && body.message ? body.message : ('HTTP ' + r.status));
    e.code = body && body.error; e.status = r.status;
    throw e;
  }
  return body;
}

// An action: a JSON POST with the session's CSRF token (the server refuses one without it).
function post(path, body) {
  return api(path, {method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': me.csrf},
                    body: JSON.stringify(body)});
}

function fmtTime(v) {
  if (v === null || v === undefined) return '';
  if (typeof v === 'number') return new Date(v).toISOString().replace('T', ' ').replace('Z', '');
  return String(v).replace('T', ' ').replace('Z', '');
}

function status(s) { return h('span', {class: 'status ' + s, text: s}); }

// --- calls ---------------------------------------------------------------------------------

async function viewCalls(params) {
  const f = Object.fromEntries(params);
  const input = (name, attrs) => h('input', Object.assign({name: name, id: 'f-' + name,
                                                           value: f[name] || ''}, attrs));
  const sel = h('select', {name: 'status', id: 'f-status'},
                ['', 'pending', 'running', 'succeeded', 'failed', 'needs_review'].map(
                    s => h('option', {value: s, selected: (f.status || '') === s, text: s || 'any'})));
  const toLocal = ms => ms ? new Date(+ms - new Date().getTimezoneOffset() * 60000)
                                 .toISOString().slice(0, 16) : '';
  const form = h('form', {class: 'filters', id: 'filters'},
    h('label', {}, 'search (key or call id)', input('q', {placeholder: 'c_... or key', size: 28})),
    h('label', {}, 'status', sel),
    h('label', {}, 'tool', input('tool', {size: 14})),
    me.admin ? h('label', {}, 'tenant', input('tenant', {size: 12})) : null,
    h('label', {}, 'since', h('input', {type: 'datetime-local', name: 'since', id: 'f-since',
                                        value: toLocal(f.since)})),
    h('label', {}, 'until', h('input', {type: 'datetime-local', name: 'until', id: 'f-until',
                                        value: toLocal(f.until)})),
    h('button', {type: 'submit', id: 'apply'}, 'Apply'),
    h('button', {type: 'button', class: 'secondary', onclick: () => { location.hash = '#/calls'; }},
      'Clear'));
  form.addEventListener('submit', ev => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const el of form.querySelectorAll('input, select')) {
      if (!el.value) continue;
      p.set(el.name, el.type === 'datetime-local' ? String(new Date(el.value).getTime()) : el.value.trim());
    }
    location.hash = '#/calls?' + p.toString();
  });
  const tbody = h('tbody');
  const table = h('table', {id: 'calls'},
    h('thead', {}, h('tr', {}, ['created', 'call', 'tenant', 'key', 'tool', 'status', 'attempt',
                                'effect'].map(t => h('th', {text: t})))), tbody);
  const pager = h('div', {class: 'pager'});
  page().replaceChildren(h('h1', {text: 'Calls'}), form, table, pager);
  const q = new URLSearchParams(f);
  const t0 = performance.now();
  const res = await api('calls?' + q.toString());
  for (const c of res.calls) {
    tbody.appendChild(h('tr', {'data-call-id': c.call_id},
      h('td', {class: 'mono', text: fmtTime(c.created_at)}),
      h('td', {class: 'mono'}, h('a', {href: '#/call/' + c.call_id, class: 'call-link', text: c.call_id})),
      h('td', {text: c.tenant}), h('td', {class: 'mono', text: c.idem_key}),
      h('td', {text: c.tool}), h('td', {}, status(c.status)), h('td', {text: c.attempt}),
      h('td', {class: 'mono', text: c.effect_id || ''})));
  }
  if (!res.calls.length) tbody.appendChild(h('tr', {}, h('td', {colspan: 8, class: 'muted',
      text: res.next ? 'none in this window of rows: older ones next' : 'no calls'})));
  pager.appendChild(h('span', {class: 'muted', id: 'timing',
                               text: res.calls.length + ' shown, ' + Math.round(performance.now() - t0) + ' ms'}));
  if (f.before) pager.appendChild(h('a', {href: '#/calls?' + new URLSearchParams(
      Object.fromEntries(Object.entries(f).filter(([k]) => k !== 'before'))).toString(), text: 'newest'}));
  if (res.next) {
    const n = new URLSearchParams(f); n.set('before', res.next);
    pager.appendChild(h('a', {href: '#/calls?' + n.toString(), id: 'older', text: 'older →'}));
  }
}

// --- one call ------------------------------------------------------------------------------

async function viewCall(id) {
  const d = await api('calls/' + encodeURIComponent(id));
  const c = d.call, x = d.consumer && d.consumer.execution, e = d.consumer && d.consumer.effect;
  const kv = h('div', {class: 'kv', id: 'call'});
  const row = (k, v) => { kv.appendChild(h('div', {text: k})); kv.appendChild(h('div', {class: 'mono'}, v)); };
  row('call', c.call_id); row('tenant', c.tenant); row('key', c.idem_key); row('tool', c.tool);
  row('args', JSON.stringify(c.args)); row('status', status(c.status)); row('attempt', String(c.attempt));
  if (c.effect_id) row('effect', c.effect_id);
  if (c.result !== null) row('result', JSON.stringify(c.result));
  if (c.error !== null) row('error', JSON.stringify(c.error));
  if (x) row('consumer', x.state + ' (attempt ' + x.attempt + ', tries ' + x.tries + ', fence ' + x.fence + ')');
  if (e && typeof e === 'object') {
    row('downstream id', h('span', {id: 'downstream-id', text: e.downstream_id || '-'}));
    if (e.worker) row('effect by', e.worker);
  }
  row('created', fmtTime(c.created_at));
  // The key's retention counts from settling: a call not settled yet never expires.
  row('key kept until', c.status === 'succeeded' || c.status === 'failed'
    ? fmtTime(c.expires_at) : 'never (not settled)');
  const tbody = h('tbody');
  for (const r of d.timeline)
    tbody.appendChild(h('tr', {},
      h('td', {class: 'mono', text: fmtTime(r.ts)}),
      h('td', {class: 'from-' + r.from, text: r.from}),
      h('td', {class: 'event', text: r.event}),
      h('td', {class: 'mono', text: r.detail || ''}),
      h('td', {class: 'mono', text: r.worker ? r.worker + ' attempt=' + r.attempt + ' fence=' + r.fence : ''})));
  const hooks = h('tbody');
  for (const w of d.webhooks || [])
    hooks.appendChild(h('tr', {'data-delivery-id': w.delivery_id},
      h('td', {class: 'mono', text: w.delivery_id}), h('td', {text: String(w.attempt)}),
      h('td', {class: 'wh-state', text: w.state}), h('td', {text: String(w.tries)}),
      h('td', {text: w.last_status === null ? '-' : String(w.last_status)}),
      h('td', {class: 'mono', text: w.last_error || ''}), h('td', {class: 'mono', text: w.url})));
  const extra = c.status === 'needs_review' ? h('p', {}, 'In review: ',
      h('a', {href: '#/review', text: 'decide it on the review page'})) : null;
  page().replaceChildren(h('h1', {text: 'Call ' + c.call_id}), kv, extra, h('h2', {text: 'Timeline'}),
    h('table', {id: 'timeline'}, h('thead', {}, h('tr', {}, ['time', 'from', 'event', 'detail',
                                                            'worker'].map(t => h('th', {text: t})))), tbody),
    (d.webhooks || []).length ? h('h2', {text: 'Webhook deliveries'}) : null,
    (d.webhooks || []).length ? h('table', {id: 'webhooks'}, h('thead', {}, h('tr', {}, ['delivery', 'attempt',
      'state', 'tries', 'last status', 'last error', 'url'].map(t => h('th', {text: t})))), hooks) : null);
}

// --- tasks ---------------------------------------------------------------------------------

const TASK_STATES = ['running', 'awaiting_approval', 'succeeded', 'compensating', 'compensated', 'failed', 'needs_review'];

// Tasks as `onceq tasks list` lists them, newest first, with the counts by status.
async function viewTasks(params) {
  const f = Object.fromEntries(params);
  const res = await api('tasks?' + new URLSearchParams(f).toString());
  const input = (name, attrs) => h('input', Object.assign({name: name, id: 't-' + name,
                                                           value: f[name] || ''}, attrs));
  const sel = h('select', {name: 'status', id: 't-status'}, ['', ...TASK_STATES].map(
      s => h('option', {value: s, selected: (f.status || '') === s, text: s || 'any'})));
  const form = h('form', {class: 'filters', id: 'task-filters'},
    h('label', {}, 'search (task id or key)', input('q', {placeholder: 't_... or key', size: 28})),
    h('label', {}, 'status', sel),
    me.admin ? h('label', {}, 'tenant', input('tenant', {size: 12})) : null,
    h('button', {type: 'submit'}, 'Apply'),
    h('button', {type: 'button', class: 'secondary', onclick: () => { location.hash = '#/tasks'; }}, 'Clear'));
  form.addEventListener('submit', ev => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const el of form.querySelectorAll('input, select')) if (el.value) p.set(el.name, el.value.trim());
    location.hash = '#/tasks?' + p.toString();
  });
  const counts = h('div', {class: 'counts', id: 'task-counts'}, TASK_STATES.map(s =>
    h('a', {href: '#/tasks?status=' + s, 'data-status': s}, status(s), ' ' + (res.counts[s] || 0))));
  const tbody = h('tbody');
  for (const t of res.tasks) {
    const done = t.steps.filter(s => s.status === 'succeeded').length;
    tbody.appendChild(h('tr', {'data-task-id': t.task_id},
      h('td', {class: 'mono', text: fmtTime(t.created_at)}),
      h('td', {class: 'mono'}, h('a', {href: '#/task/' + t.task_id, class: 'task-link', text: t.task_id})),
      h('td', {text: t.tenant}), h('td', {class: 'mono', text: t.idem_key}), h('td', {}, status(t.status)),
      h('td', {text: done + '/' + t.steps.length}), h('td', {text: t.reason || ''})));
  }
  if (!res.tasks.length) tbody.appendChild(h('tr', {}, h('td', {colspan: 7, class: 'muted', text: 'no tasks'})));
  const pager = h('div', {class: 'pager'}, h('span', {class: 'muted', text: res.tasks.length + ' shown'}));
  if (f.before) pager.appendChild(h('a', {href: '#/tasks?' + new URLSearchParams(
      Object.fromEntries(Object.entries(f).filter(([k]) => k !== 'before'))).toString(), text: 'newest'}));
  if (res.next) {
    const n = new URLSearchParams(f); n.set('before', res.next);
    pager.appendChild(h('a', {href: '#/tasks?' + n.toString(), id: 'tasks-older', text: 'older →'}));
  }
  page().replaceChildren(h('h1', {text: 'Tasks'}), counts, form,
    h('table', {id: 'tasks'}, h('thead', {}, h('tr', {}, ['created', 'task', 'tenant', 'key', 'status',
                                                         'steps done', 'reason'].map(t => h('th', {text: t})))), tbody),
    pager);
}

const callLink = id => id ? h('a', {href: '#/call/' + id, class: 'call-link', text: id}) : '-';
const objId = v => v === null || v === undefined ? '' : typeof v === 'string' ? v : JSON.stringify(v);

// An operator's decision on a task waiting for one (`onceq review resolve t_...`, the same
// function on the server): approve or reject a step awaiting approval; settle a task in review.
const TASK_DECISIONS = {awaiting_approval: ['approve', 'reject'],
                        needs_review: ['compensated', 'succeeded', 'retry-compensation']};

function taskDecision(t) {
  const choices = TASK_DECISIONS[t.status];
  if (!choices || !me.admin) return null;
  const form = h('form', {class: 'resolve', id: 'task-resolve'},
    h('select', {name: 'as'}, choices.map(a => h('option', {value: a, text: a}))),
    h('input', {name: 'note', placeholder: 'why (audited)', required: true, size: 28}),
    h('button', {type: 'submit', class: 'resolve-btn'}, 'Decide'));
  form.addEventListener('submit', async ev => {
    ev.preventDefault();
    const body = {as: form.elements.as.value, fence: t.fence, note: form.elements.note.value};
    try {
      await post('tasks/' + encodeURIComponent(t.task_id) + '/resolve', body);
      say('decided ' + t.task_id + ': ' + body.as, 'ok');
    } catch (e) {
      say(e.code === 'review_moved' ? 'review moved: ' + t.task_id + ' changed since this page ' +
          'was loaded; decide again (nothing written)' : 'refused: ' + e.message, 'error');
    }
    await viewTask(t.task_id);
  });
  return h('div', {class: 'decision'}, h('h2', {text: 'Decision (fence ' + t.fence + ')'}), form);
}

// One task as `onceq inspect t_...` shows it: its steps and compensations in order, the timeline.
async function viewTask(id) {
  const d = await api('tasks/' + encodeURIComponent(id));
  const t = d.task;
  const kv = h('div', {class: 'kv', id: 'task'});
  const row = (k, v) => { kv.appendChild(h('div', {text: k})); kv.appendChild(h('div', {class: 'mono'}, v)); };
  row('task', t.task_id); row('tenant', t.tenant); row('key', t.idem_key); row('status', status(t.status));
  if (t.reason) row('reason', t.reason);
  row('created', fmtTime(t.created_at)); row('updated', fmtTime(t.updated_at));
  const steps = h('tbody');
  t.steps.forEach((s, i) => {
    const c = s.compensation;
    steps.appendChild(h('tr', {'data-step': s.name, class: 'step'},
      h('td', {text: String(i + 1)}), h('td', {text: s.name}), h('td', {text: 'step'}), h('td', {text: s.tool}),
      h('td', {}, status(s.status)), h('td', {class: 'mono'}, callLink(s.call_id)),
      h('td', {class: 'mono', text: objId(s.object_id)}),
      h('td', {class: 'mono result', text: s.error !== null ? JSON.stringify(s.error)
                                    : s.result !== null ? JSON.stringify(s.result) : ''})));
    if (c) steps.appendChild(h('tr', {'data-step': s.name, class: 'compensation'},
      h('td', {}), h('td', {text: s.name}), h('td', {text: 'compensate (' + c.attempts + ' attempts)'}),
      h('td', {text: c.tool}), h('td', {}, status(c.status)), h('td', {class: 'mono'}, callLink(c.call_id)),
      h('td', {class: 'mono', text: objId(c.result && c.result.object_id)}),
      h('td', {class: 'mono result', text: c.error !== null ? JSON.stringify(c.error)
                                    : c.next_attempt_at ? 'next attempt ' + fmtTime(c.next_attempt_at) : ''})));
  });
  const tl = h('tbody');
  for (const r of d.timeline)
    tl.appendChild(h('tr', {},
      h('td', {class: 'mono', text: fmtTime(r.ts)}), h('td', {text: r.step}), h('td', {text: r.role}),
      h('td', {class: 'mono'}, callLink(r.call_id)), h('td', {class: 'from-' + r.from, text: r.from}),
      h('td', {class: 'event', text: r.event}), h('td', {class: 'mono', text: r.detail || ''})));
  page().replaceChildren(h('h1', {text: 'Task ' + t.task_id}), kv, taskDecision(t),
    h('h2', {text: 'Steps and compensations'}),
    h('table', {id: 'task-steps'}, h('thead', {}, h('tr', {}, ['#', 'step', 'role', 'tool', 'status', 'call',
      'object id', 'result / error'].map(x => h('th', {text: x})))), steps),
    h('h2', {text: 'Timeline'}),
    h('table', {id: 'task-timeline'}, h('thead', {}, h('tr', {}, ['time', 'step', 'role', 'call', 'from',
      'event', 'detail'].map(x => h('th', {text: x})))), tl));
}

// --- review --------------------------------------------------------------------------------

async function resolve(ev, r) {
  ev.preventDefault();
  const f = ev.target;
  const body = {as: f.elements.as.value, fence: r.fence, note: f.elements.note.value};
  if (f.elements.ref.value) body.ref = f.elements.ref.value;
  try {
    await post('review/' + encodeURIComponent(r.call_id) + '/resolve', body);
    say('resolved ' + r.call_id + ' as ' + body.as, 'ok');
  } catch (e) {
    say(e.code === 'review_moved' ? 'review moved: ' + r.call_id + ' left review and came back; ' +
        'reload and decide again (nothing written)' : 'refused: ' + e.message, 'error');
  }
  await viewReview(true);
}

async function viewReview(keepMsg) {
  const d = await api('review');
  const tbody = h('tbody');
  for (const r of d.review) {
    const form = h('form', {class: 'resolve'},
      h('select', {name: 'as'}, ['committed', 'failed', 'retry'].map(a => h('option', {value: a, text: a}))),
      h('input', {name: 'ref', placeholder: 'downstream id (committed)', size: 16}),
      h('input', {name: 'note', placeholder: 'why (audited)', required: true, size: 22}),
      me.admin ? h('button', {type: 'submit', class: 'resolve-btn'}, 'Resolve') : null);
    form.addEventListener('submit', ev => resolve(ev, r));
    tbody.appendChild(h('tr', {'data-call-id': r.call_id},
      h('td', {text: Math.round(r.age_s) + 's'}),
      h('td', {class: 'mono'}, h('a', {href: '#/call/' + r.call_id, text: r.call_id})),
      h('td', {text: r.tenant || ''}), h('td', {text: r.tool || ''}),
      h('td', {class: 'fence', text: r.fence}), h('td', {text: r.code || ''}), h('td', {text: r.why || ''}),
      h('td', {}, form)));
  }
  if (!d.review.length) tbody.appendChild(h('tr', {}, h('td', {colspan: 8, class: 'muted', text: 'nothing to review'})));
  document.getElementById('review-count').textContent = d.count || '';
  if (!keepMsg) say('');
  page().replaceChildren(h('h1', {text: 'Review queue'}),
    h('p', {class: 'muted', text: 'Outside calls whose answer was lost at a downstream that offers ' +
      'neither idempotency keys nor a lookup. Decide what the downstream did; the decision is ' +
      'fenced to this review episode and audited with your name.'}),
    h('table', {id: 'review'}, h('thead', {}, h('tr', {}, ['age', 'call', 'tenant', 'tool', 'fence', 'code',
                                                          'why', 'decision'].map(t => h('th', {text: t})))), tbody));
}

// --- dead letters --------------------------------------------------------------------------

async function redrive(ref) {
  try {
    const r = await post('dlq/redrive', {ref: ref});
    say(r.output || ('redriven ' + ref), 'ok');
  } catch (e) { say('redrive refused: ' + e.message, 'error'); }
  await viewDlq(true);
}

async function redriveWebhook(id) {
  try {
    await post('webhooks/redrive', {delivery_id: id});
    say('redriven webhook delivery ' + id + ': the producer sends it again (same id)', 'ok');
  } catch (e) { say('redrive refused: ' + e.message, 'error'); }
  await viewDlq(true);
}

// The producer's dead webhook deliveries (as onceq dlq list --webhooks-db shows them).
function webhooksSection(w) {
  const tb = h('tbody');
  for (const r of w.dead)
    tb.appendChild(h('tr', {'data-delivery-id': r.delivery_id},
      h('td', {class: 'mono'}, h('a', {href: '#/call/' + r.call_id, text: r.call_id})),
      h('td', {class: 'mono', text: r.url}), h('td', {text: String(r.tries)}),
      h('td', {text: r.last_status === null ? '-' : String(r.last_status)}),
      h('td', {class: 'mono', text: r.last_error || ''}),
      h('td', {text: Math.round((Date.now() - r.created_at) / 1000) + 's'}),
      h('td', {}, me.admin ? h('button', {class: 'wh-redrive-btn', onclick: () => redriveWebhook(r.delivery_id)},
                               'Redrive') : null)));
  if (!w.dead.length) tb.appendChild(h('tr', {}, h('td', {colspan: 7, class: 'muted', text: 'no dead webhook deliveries'})));
  return h('div', {}, h('h2', {text: 'Webhook deliveries'}),
    h('p', {class: 'muted', id: 'webhook-counts', text: (w.pending === null ? '' : w.pending + ' pending, ') +
      w.dead_count + ' dead. Deliveries that ran out of tries; fix the receiver, then redrive ' +
      '(onceq dlq redrive ID --webhooks-db): sent again with the same id and body.'}),
    h('table', {id: 'dlq-webhooks'}, h('thead', {}, h('tr', {}, ['call', 'url', 'tries', 'last status',
      'last error', 'age', ''].map(t => h('th', {text: t})))), tb));
}

async function viewDlq(keepMsg) {
  const w = await api('webhooks');
  if (!me.admin) { /* a tenant: its own webhook deliveries only */
    if (!keepMsg) say('');
    page().replaceChildren(h('h1', {text: 'Dead letters'}), webhooksSection(w));
    return;
  }
  const d = await api('dlq');
  if (!keepMsg) say('');
  const topic = h('tbody');
  if (Array.isArray(d.topic)) {
    for (const r of d.topic)
      topic.appendChild(h('tr', {'data-ref': r.ref}, h('td', {class: 'mono', text: r.ref}),
        h('td', {class: 'mono', text: fmtTime(r.timestamp)}), h('td', {text: r.reason || ''}),
        h('td', {class: 'mono', text: r.detail || ''}), h('td', {class: 'mono', text: r.key || ''}),
        h('td', {text: r.redrive ? 'redrive of ' + r.redrive : ''}),
        h('td', {}, me.admin ? h('button', {class: 'redrive-btn', onclick: () => redrive(r.ref)}, 'Redrive') : null)));
    if (!d.topic.length) topic.appendChild(h('tr', {}, h('td', {colspan: 7, class: 'muted', text: 'no dead letters'})));
  }
  const tbody = h('tbody');
  for (const r of d.outbox_dead)
    tbody.appendChild(h('tr', {}, h('td', {text: r.seq}), h('td', {class: 'mono', text: fmtTime(r.dead_at)}),
      h('td', {text: r.reason}), h('td', {class: 'mono', text: r.key}), h('td', {text: r.payload_bytes}),
      h('td', {text: r.handled_at === null ? 'no' : 'yes'})));
  if (!d.outbox_dead.length) tbody.appendChild(h('tr', {}, h('td', {colspan: 6, class: 'muted', text: 'no dead outbox rows'})));
  page().replaceChildren(h('h1', {text: 'Dead letters'}), webhooksSection(w),
    h('h2', {text: 'DLQ topic'}),
    d.topic === null ? h('p', {class: 'muted', text: 'The console was started without --brokers: the DLQ topic is not shown.'})
      : !Array.isArray(d.topic) ? h('p', {class: 'muted', text: 'onceq dlq list: ' + d.topic.error})
      : h('div', {}, h('p', {class: 'muted', text: 'Messages a consumer could not execute (as onceq dlq list shows them). ' +
          'Redrive puts one back on its origin topic with its message id (onceq dlq redrive): the inbox lets a valid copy through once.'}),
          h('table', {id: 'dlq-topic'}, h('thead', {}, h('tr', {}, ['ref', 'time', 'reason', 'detail', 'call',
                                                                 'redrive', ''].map(t => h('th', {text: t})))), topic)),
    h('h2', {text: 'Relay: dead outbox rows'}),
    h('p', {class: 'muted', text: 'Outbox rows Kafka refused for good (as onceq dlq --outbox-db lists them): ' +
      'the producer fails their calls (unpublishable), a client resubmits after the fix.'}),
    h('table', {id: 'dlq'}, h('thead', {}, h('tr', {}, ['seq', 'dead at', 'reason', 'call', 'bytes',
                                                       'handled'].map(t => h('th', {text: t})))), tbody));
}

// --- charts --------------------------------------------------------------------------------

const COLORS = ['#2f5bd3', '#1f8a4c', '#c2362f', '#8a3ffc', '#b7791f', '#0f8b8d'];
const hist = [];   // [{t, v: {series: value}}]
let chartTimer = null;

function parseProm(text, out) {
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || '').slice(1, -1).matchAll(/([a-zA-Z_]+)="([^"]*)"/g)) labels[l[1]] = l[2];
    (out[m[1]] = out[m[1]] || []).push({labels: labels, v: parseFloat(m[3])});
  }
}

function sum(ms, name, label, value) {
  return (ms[name] || []).filter(s => !label || s.labels[label] === value).reduce((a, s) => a + s.v, 0);
}

const CHARTS = [
  {id: 'chart-rate', title: 'calls/s by outcome', rate: true,
   series: [['succeeded', ms => sum(ms, 'onceq_producer_calls', 'status', 'succeeded')],
            ['failed', ms => sum(ms, 'onceq_producer_calls', 'status', 'failed')],
            ['needs_review', ms => sum(ms, 'onceq_producer_calls', 'status', 'needs_review')]]},
  {id: 'chart-unknown', title: 'UNKNOWN outcomes/s and review queue',
   series: [['unknown/s', ms => sum(ms, 'onceq_consumer_unknown_outcomes_total'), true],
            ['in review', ms => sum(ms, 'onceq_consumer_review_queue')]]},
  {id: 'chart-lag', title: 'relay and consumer lag',
   series: [['relay pending rows', ms => sum(ms, 'onceq_relay_pending_rows')],
            ['outbox pending', ms => sum(ms, 'onceq_producer_outbox_pending')],
            ['consumer lag', ms => sum(ms, 'onceq_consumer_lag')]]},
  {id: 'chart-webhooks', title: 'webhook deliveries: pending and dead',
   series: [['pending', ms => sum(ms, 'onceq_webhook_pending')],
            ['dead', ms => sum(ms, 'onceq_webhook_dead')]]},
  {id: 'chart-tasks', title: 'tasks by status',
   series: ['running', 'compensating', 'failed', 'needs_review'].map(
       st => [st, ms => sum(ms, 'onceq_producer_tasks', 'status', st)])},
  {id: 'chart-recovery', title: 'recovery time: UNKNOWN to decided (mean s over 2 s)',
   series: [['mean s', ms => [sum(ms, 'onceq_consumer_unknown_resolved_seconds_sum'),
                              sum(ms, 'onceq_consumer_unknown_resolved_seconds_count')], 'ratio']]},
];

async function sample() {
  const ms = {};
  for (let i = 0; i < me.metrics; i++) {
    try { parseProm(await api('metrics/' + i), ms); } catch (e) { /* a daemon down: a gap */ }
  }
  const v = {};
  for (const c of CHARTS) for (const s of c.series) v[c.id + s[0]] = s[1](ms);
  hist.push({t: Date.now(), v: v});
  while (hist.length > 150) hist.shift();
}

function drawChart(c) {
  const W = 600, H = 160, P = 28;
  const pts = c.series.map(s => {
    const key = c.id + s[0], rate = c.rate || s[2] === true, ratio = s[2] === 'ratio';
    const out = [];
    for (let i = rate || ratio ? 1 : 0; i < hist.length; i++) {
      const a = hist[i].v[key], b = i ? hist[i - 1].v[key] : null;
      let y;
      if (ratio) { const dn = a[1] - b[1]; if (dn <= 0) continue; y = Math.max(0, (a[0] - b[0]) / dn); }
      else if (rate) y = Math.max(0, (a - b) / ((hist[i].t - hist[i - 1].t) / 1000));
      else y = a;
      out.push([hist[i].t, y]);
    }
    return out;
  });
  const t1 = Date.now(), t0 = t1 - 5 * 60 * 1000;
  const ymax = Math.max(1, ...pts.flat().map(p => p[1]));
  const X = t => P + (W - P - 4) * (t - t0) / (t1 - t0), Y = y => H - 16 - (H - 26) * y / ymax;
  const svg = h('svg', {viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none', id: c.id + '-svg'},
    h('line', {x1: P, y1: H - 16, x2: W, y2: H - 16, stroke: '#c6cbd8'}),
    h('text', {x: 2, y: 12, 'font-size': 10, fill: '#6b7385'}, String(+ymax.toPrecision(3))),
    h('text', {x: 2, y: H - 18, 'font-size': 10, fill: '#6b7385'}, '0'),
    h('text', {x: W - 60, y: H - 2, 'font-size': 10, fill: '#6b7385'}, 'last 5 min'),
    pts.map((p, i) => h('polyline', {fill: 'none', stroke: COLORS[i], 'stroke-width': 2,
                                     points: p.filter(q => q[0] >= t0).map(q => X(q[0]).toFixed(1) + ',' + Y(q[1]).toFixed(1)).join(' ')})));
  const legend = h('div', {class: 'legend'}, c.series.map((s, i) => {
    const sw = h('i'); sw.style.background = COLORS[i];
    const last = pts[i].length ? pts[i][pts[i].length - 1][1] : null;
    return h('span', {}, sw, s[0] + (last === null ? '' : ': ' + (+last.toPrecision(3))));
  }));
  return h('div', {class: 'chart', id: c.id}, h('h2', {text: c.title}), svg, legend);
}

async function viewCharts() {
  const draw = () => {
    if (!location.hash.startsWith('#/charts')) { clearInterval(chartTimer); chartTimer = null; return; }
    page().replaceChildren(h('h1', {text: 'Charts'}),
      me.metrics ? h('p', {class: 'muted', text: 'Sampled every 2 s from ' + me.metrics +
                           ' daemon /metrics endpoint(s) through the console.'})
                 : h('p', {class: 'muted', text: 'No --metrics-url given: nothing to chart.'}),
      h('div', {class: 'charts'}, CHARTS.map(drawChart)));
  };
  await sample(); draw();
  if (!chartTimer) chartTimer = setInterval(async () => { await sample(); draw(); }, 2000);
}

// --- routing -------------------------------------------------------------------------------

async function route() {
  const hash = location.hash || '#/calls';
  const [path, query] = hash.slice(1).split('?');
  for (const a of document.querySelectorAll('header nav a'))
    a.classList.toggle('active', hash.startsWith(a.getAttribute('href')) ||
                       (a.id === 'nav-calls' && path.startsWith('/call/')) ||
                       (a.id === 'nav-tasks' && path.startsWith('/task/')));
  try {
    if (path.startsWith('/call/')) { say(''); await viewCall(decodeURIComponent(path.slice(6))); }
    else if (path.startsWith('/task/')) { say(''); await viewTask(decodeURIComponent(path.slice(6))); }
    else if (path === '/tasks') { say(''); await viewTasks(new URLSearchParams(query || '')); }
    else if (path === '/review') await viewReview(false);
    else if (path === '/dlq') await viewDlq(false);
    else if (path === '/charts') { say(''); await viewCharts(); }
    else { say(''); await viewCalls(new URLSearchParams(query || '')); }
  } catch (e) {
    say(e.message, 'error');
    if (e.status === 404) page().replaceChildren(h('h1', {id: 'not-found', text: 'Not found'}));
  }
  document.body.setAttribute('data-ready', hash);
}

(async function start() {
  me = await api('me');
  document.getElementById('who').textContent =
      (me.admin ? 'operator ' : 'tenant ') + me.name + (me.tokens ? '' : ' (loopback, no tokens)');
  if (!me.admin) for (const id of ['nav-charts']) document.getElementById(id).remove();
  window.addEventListener('hashchange', route);
  route();
  try { const r = await api('review'); document.getElementById('review-count').textContent = r.count || ''; } catch (e) {}
  try { // the tasks badge: those waiting for an operator
    const t = await api('tasks?limit=1');
    document.getElementById('tasks-count').textContent =
        (t.counts.needs_review || 0) + (t.counts.awaiting_approval || 0) || '';
  } catch (e) {}
})();
