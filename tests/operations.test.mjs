// Asynchronous operations (docs/async-operations.md, ADR 0037): `Prefer: respond-async` on an async route is
// answered 202 with its operation, run from the queue against the real origin with
// async.timeout_ms, read back by id and by its result (byte for byte), retried on the webhook
// schedule, announced by `postguard.operation.completed`, scoped to its project, and completed
// once even when the gateway dies while it runs. The real built worker under Miniflare (its
// queues, Durable Objects and alarms), a real local origin and a real webhook receiver.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, problem, poll, bearer, cfg, REQUEST_ID_RE } from './support/gateway.mjs';

const OP_ID_RE = /^op_[0-9A-HJKMNP-TV-Z]{52}$/;
const CONFIG = {
  origin: { timeout_ms: 1500 },
  idempotency: { lease_s: 3, methods: { POST: 'required', PUT: 'optional' } },
  async: {
    routes: [{ method: 'POST', path: '/reports/*' }, { method: 'PUT', path: '/imports/*' }],
    timeout_ms: 10000,
    requeue_after_s: 2,
  },
  webhooks: { schedule_s: [1, 1], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { roomy: { requests_per_window: 100000, window_s: 60 } },
};

let origin;
let receiver;
let gw;
let acme;
let other;

before(async () => {
  origin = await startOrigin();
  receiver = await startReceiver();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  acme = await gw.createKey({ project: 'ops', plan: 'roomy' });
  other = await gw.createKey({ project: 'ops-other', plan: 'roomy' });
  const sub = await gw.fetch('/_postguard/v1/webhooks', {
    method: 'POST',
    headers: { ...bearer(acme.key), 'content-type': 'application/json' },
    body: JSON.stringify({ url: `${receiver.url}/ops`, events: ['postguard.operation.completed'] }),
  });
  assert.equal(sub.status, 201, sub.text);
});
after(async () => {
  await gw?.dispose();
  await receiver?.close();
  await origin?.kill();
});

const asyncPost = (key, p, idem, headers = {}, body = '{"report":"q3"}') => gw.fetch(p, {
  method: 'POST',
  headers: { ...bearer(key), 'content-type': 'application/json', prefer: 'respond-async', 'idempotency-key': idem, ...headers },
  body,
});
const get = (key, p) => gw.fetch(p, { headers: bearer(key) });
const operation = (key, id) => get(key, `/_postguard/v1/operations/${id}`);
const result = (key, id) => get(key, `/_postguard/v1/operations/${id}/result`);

async function done(key, id, timeout = 30000) {
  return poll(async () => {
    const r = await operation(key, id);
    assert.equal(r.status, 200, r.text);
    return ['succeeded', 'failed'].includes(r.json.state) && r.json;
  }, { timeout, interval: 200, message: `operation ${id} done` });
}

function assertAccepted(res) {
  assert.equal(res.status, 202, res.text);
  const op = res.json;
  assert.match(op.id, OP_ID_RE);
  assert.equal(res.headers.location, `/_postguard/v1/operations/${op.id}`, 'Location is a path');
  assert.match(res.headers['retry-after'], /^\d+$/);
  assert.match(op.request_id, REQUEST_ID_RE);
  assert.ok(res.headers['x-ratelimit-remaining'] !== undefined, 'charged as usual: rate-limit headers');
  return op;
}

describe('an operation', () => {
  it('runs an origin slower than origin.timeout_ms once, while the client retries the POST 5 times (same 202, same id)', async () => {
    const slow = { 'x-demo-delay-ms': '3000' };
    // Synchronously the same origin is a 504: it takes longer than origin.timeout_ms.
    const sync = await gw.fetch('/reports/q3', {
      method: 'POST', headers: { ...bearer(acme.key), 'idempotency-key': `sync-${crypto.randomUUID()}`, ...slow }, body: '{}',
    });
    problem(sync, { status: 504, code: 'ORIGIN_TIMEOUT' });

    const idem = `op-${crypto.randomUUID()}`;
    const first = await asyncPost(acme.key, '/reports/q3', idem, slow);
    const op = assertAccepted(first);
    assert.equal(first.headers['preference-applied'], 'respond-async');
    assert.equal(first.headers['idempotent-replayed'], undefined, 'the first answer is no replay');
    assert.equal(op.request_id, first.headers['x-request-id'], "the operation's request_id is the 202's");
    assert.deepEqual([op.state, op.method, op.path, op.attempts], ['queued', 'POST', '/reports/q3', 0]);
    assert.equal(op.status, undefined);

    // Before it is done: the result is 409 OPERATION_NOT_DONE with Retry-After.
    const early = problem(await result(acme.key, op.id), { status: 409, code: 'OPERATION_NOT_DONE' });
    assert.ok(early.detail.includes(op.id));
    for (let i = 0; i < 5; i++) {
      const again = await asyncPost(acme.key, '/reports/q3', idem, slow);
      const same = assertAccepted(again);
      assert.equal(same.id, op.id, `retry ${i + 1}: the same operation`);
      assert.equal(same.request_id, op.request_id);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.equal(again.headers['preference-applied'], 'respond-async');
      assert.notEqual(again.headers['x-request-id'], first.headers['x-request-id'], 'each answer has its own X-Request-Id');
    }
    const finished = await done(acme.key, op.id);
    assert.equal(finished.state, 'succeeded');
    assert.equal(finished.status, 201);
    assert.equal(finished.attempts, 1);
    assert.ok(finished.completed_at >= finished.created_at);
    assert.equal(origin.stats.count(idem), 1, 'one execution');

    const sent = origin.stats.find((r) => r.idempotency_key === idem);
    assert.equal(sent.length, 1);
    assert.equal(sent[0].headers['x-request-id'], op.request_id, 'the origin sees the operation\'s request id');
    assert.equal(sent[0].headers.prefer, undefined, 'the gateway applied respond-async: the origin is not asked to');
    assert.equal(sent[0].headers.authorization, undefined, 'the client\'s Authorization is never forwarded');
    assert.equal(sent[0].headers['x-postguard-project'], 'ops');
    assert.ok(sent[0].signature_ok, `signed as every forwarded request: ${sent[0].signature_error}`);

    const res = await result(acme.key, op.id);
    assert.equal(res.status, 201);
    assert.equal(res.json.execution, 1);
    assert.equal(res.json.signature_ok, true);
    assert.equal(res.headers['x-origin-execution'], '1');
    assert.equal(res.headers['set-cookie'], undefined, 'stored headers as a replay has them');

    // After it is done: still the same 202, never a second execution.
    const later = await asyncPost(acme.key, '/reports/q3', idem, slow);
    assert.equal(assertAccepted(later).state, 'succeeded');
    assert.equal(later.json.id, op.id);
    // A retry without the preference is told the operation too.
    const plain = await gw.fetch('/reports/q3', {
      method: 'POST', headers: { ...bearer(acme.key), 'content-type': 'application/json', 'idempotency-key': idem, ...slow }, body: '{"report":"q3"}',
    });
    assert.equal(assertAccepted(plain).id, op.id);
    assert.equal(plain.headers['preference-applied'], undefined);
    assert.equal(origin.stats.count(idem), 1);

    // Its completion event: delivered once, {id, state, status}, with the operation's request_id.
    const delivered = await receiver.waitFor((rs) => rs.find((r) => r.json?.data?.id === op.id), { message: 'the completion event' });
    assert.equal(delivered.json.type, 'postguard.operation.completed');
    assert.deepEqual(delivered.json.data, { id: op.id, state: 'succeeded', status: 201 });
    const feed = await get(acme.key, '/_postguard/v1/events?type=postguard.operation.completed');
    const ev = feed.json.data.find((e) => e.data.id === op.id);
    assert.equal(ev.request_id, op.request_id);
    assert.equal(receiver.forEvent(delivered.headers['webhook-id']).length, 1);
  });

  it('answers its result byte for byte, a large one through R2', async () => {
    for (const bytes of [1000, 3 * 1024 * 1024]) {
      const idem = `bytes-${bytes}-${crypto.randomUUID()}`;
      const op = assertAccepted(await asyncPost(acme.key, '/reports/big', idem, { 'x-demo-body-bytes': String(bytes) }));
      assert.equal((await done(acme.key, op.id)).state, 'succeeded');
      const res = await result(acme.key, op.id);
      assert.equal(res.status, 201);
      assert.equal(res.headers['content-type'], 'text/plain');
      assert.equal(res.body.length, bytes);
      assert.ok(res.body.equals(Buffer.alloc(bytes, 'a')), 'byte for byte');
      assert.equal(res.headers.location, `/things/${origin.stats.count(idem)}`);
      assert.equal(origin.stats.count(idem), 1);
    }
  });

  it('is retried on the webhook schedule and fails with the last answer kept', async () => {
    const idem = `fail-${crypto.randomUUID()}`;
    await fetch(`${origin.url}/__demo/script`, { method: 'POST', body: JSON.stringify({ key: idem, statuses: [503, 500, 502] }) });
    const op = assertAccepted(await asyncPost(acme.key, '/reports/flaky', idem));
    const finished = await done(acme.key, op.id);
    assert.deepEqual([finished.state, finished.status, finished.attempts], ['failed', 502, 3]);
    assert.equal(origin.stats.count(idem), 3, 'one attempt and one per schedule delay');
    const res = await result(acme.key, op.id);
    assert.equal(res.status, 502, 'the last answer');
    assert.equal(res.json.execution, 3);
    const delivered = await receiver.waitFor((rs) => rs.find((r) => r.json?.data?.id === op.id), { message: 'the completion event' });
    assert.deepEqual(delivered.json.data, { id: op.id, state: 'failed', status: 502 });

    // A 5xx then a final answer: succeeded on the second attempt.
    const idem2 = `recover-${crypto.randomUUID()}`;
    await fetch(`${origin.url}/__demo/script`, { method: 'POST', body: JSON.stringify({ key: idem2, statuses: [503] }) });
    const op2 = assertAccepted(await asyncPost(acme.key, '/reports/flaky', idem2));
    const fine = await done(acme.key, op2.id);
    assert.deepEqual([fine.state, fine.status, fine.attempts], ['succeeded', 201, 2]);
  });

  it('needs an Idempotency-Key, and only async routes honour the preference', async () => {
    const before = origin.stats.total;
    const res = await gw.fetch('/imports/one', { method: 'PUT', headers: { ...bearer(acme.key), prefer: 'respond-async' }, body: 'x' });
    const p = problem(res, { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
    assert.match(p.detail, /respond-async/);
    assert.ok(res.headers['x-ratelimit-remaining'] !== undefined, 'charged first, as every preflight problem');
    assert.equal(origin.stats.total, before, 'not forwarded');
    // The same route with a key: an operation.
    const op = assertAccepted(await gw.fetch('/imports/one', {
      method: 'PUT', headers: { ...bearer(acme.key), prefer: 'respond-async', 'idempotency-key': `put-${crypto.randomUUID()}` }, body: 'x',
    }));
    assert.equal(op.method, 'PUT');
    // Elsewhere the preference is not applied: an ordinary synchronous answer.
    const syncRes = await gw.fetch('/orders/1', {
      method: 'POST', headers: { ...bearer(acme.key), prefer: 'respond-async', 'idempotency-key': `nope-${crypto.randomUUID()}` }, body: 'x',
    });
    assert.equal(syncRes.status, 201);
    assert.equal(syncRes.headers['preference-applied'], undefined);
    await done(acme.key, op.id);
  });

  it('is its project\'s: found by any key of the project, by no other; listed newest first', async () => {
    const sibling = await gw.createKey({ project: 'ops', plan: 'roomy' });
    const ops = [];
    for (let i = 0; i < 3; i++) {
      const key = i === 1 ? sibling.key : acme.key;
      ops.push(assertAccepted(await asyncPost(key, '/reports/list', `list-${i}-${crypto.randomUUID()}`)));
    }
    for (const op of ops) await done(acme.key, op.id);
    assert.equal((await operation(sibling.key, ops[0].id)).status, 200, 'another key of the project');
    assert.equal((await result(sibling.key, ops[0].id)).status, 201);
    problem(await operation(other.key, ops[0].id), { status: 404, code: 'NOT_FOUND' });
    problem(await result(other.key, ops[0].id), { status: 404, code: 'NOT_FOUND' });
    problem(await operation(acme.key, 'op_nope'), { status: 404, code: 'NOT_FOUND' });
    problem(await operation(acme.key, ops[0].id.replace(/.$/, (c) => (c === 'A' ? 'B' : 'A'))), { status: 404, code: 'NOT_FOUND' });
    problem(await gw.fetch(`/_postguard/v1/operations/${ops[0].id}`), { status: 401, code: 'INVALID_API_KEY' });

    // The list: newest first across the project's keys, paged exactly.
    const seen = [];
    let cursor = null;
    do {
      const page = await get(acme.key, `/_postguard/v1/operations?limit=2${cursor ? `&cursor=${cursor}` : ''}`);
      assert.equal(page.status, 200, page.text);
      assert.ok(page.json.data.length <= 2);
      seen.push(...page.json.data);
      cursor = page.json.next_cursor;
    } while (cursor);
    const ids = seen.map((o) => o.id);
    assert.equal(new Set(ids).size, ids.length, 'no operation twice');
    for (const op of ops) assert.ok(ids.includes(op.id), `${op.id} listed`);
    const times = seen.map((o) => o.created_at);
    assert.deepEqual(times, [...times].sort((a, b) => b - a), 'newest first');
    const theirs = await get(other.key, '/_postguard/v1/operations');
    assert.ok(theirs.json.data.every((o) => !ids.includes(o.id)), 'another project sees none of them');
    const failed = await get(acme.key, '/_postguard/v1/operations?state=failed');
    assert.ok(failed.json.data.length >= 1 && failed.json.data.every((o) => o.state === 'failed'));
    problem(await get(acme.key, '/_postguard/v1/operations?state=done'), { status: 400, code: 'VALIDATION_ERROR' });
    problem(await get(acme.key, '/_postguard/v1/operations?sort=asc'), { status: 400, code: 'VALIDATION_ERROR' });
    problem(await get(acme.key, '/_postguard/v1/operations?cursor=zzz'), { status: 400, code: 'VALIDATION_ERROR' });
  });

  it('the idempotency lookup says in progress, then completed with the status', async () => {
    const idem = `lookup-${crypto.randomUUID()}`;
    const op = assertAccepted(await asyncPost(acme.key, '/reports/lookup', idem, { 'x-demo-delay-ms': '1500' }));
    const during = await get(acme.key, `/_postguard/v1/idempotency/${idem}`);
    assert.equal(during.json.state, 'in_progress');
    assert.equal(during.json.request_id, op.request_id);
    await done(acme.key, op.id);
    const afterwards = await get(acme.key, `/_postguard/v1/idempotency/${idem}`);
    assert.deepEqual([afterwards.json.state, afterwards.json.status], ['completed', 201]);
  });
});

describe('an operation whose gateway dies while it runs', () => {
  let persistDir;
  let crashOrigin;
  let crashReceiver;
  const CRASH = {
    ...CONFIG,
    idempotency: { lease_s: 2 },
    async: { routes: [{ method: 'POST', path: '/reports/*' }], timeout_ms: 6000, requeue_after_s: 2 },
  };
  before(async () => {
    persistDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-ops-crash-'));
    crashOrigin = await startOrigin();
    crashReceiver = await startReceiver();
  });
  after(async () => {
    await crashReceiver?.close();
    await crashOrigin?.kill();
    fs.rmSync(persistDir, { recursive: true, force: true });
  });

  it('completes once: the cut call runs once more after its lease, with the same Idempotency-Key', async () => {
    const vars = { POSTGUARD_CONFIG: cfg(CRASH) };
    const idem = `crash-${crypto.randomUUID()}`;
    const a = await startGateway({ originUrl: crashOrigin.url, persistDir, vars });
    let key;
    let op;
    try {
      key = (await a.createKey({ project: 'crash', plan: 'roomy' })).key;
      const sub = await a.fetch('/_postguard/v1/webhooks', {
        method: 'POST',
        headers: { ...bearer(key), 'content-type': 'application/json' },
        body: JSON.stringify({ url: `${crashReceiver.url}/ops`, events: ['postguard.operation.completed'] }),
      });
      assert.equal(sub.status, 201, sub.text);
      const res = await a.fetch('/reports/crash', {
        method: 'POST',
        headers: { ...bearer(key), prefer: 'respond-async', 'idempotency-key': idem, 'x-demo-delay-ms': '3000' },
        body: 'x',
      });
      op = assertAccepted(res);
      await poll(() => crashOrigin.stats.count(idem) === 1, { timeout: 20000, message: 'the operation at the origin' });
      const running = await a.fetch(`/_postguard/v1/operations/${op.id}`, { headers: bearer(key) });
      assert.equal(running.json.state, 'running');
    } finally {
      // The gateway dies with the call in flight: no answer is kept, no queue message survives.
      await a.dispose();
    }
    const b = await startGateway({ originUrl: crashOrigin.url, persistDir, vars, migrate: false });
    try {
      const finished = await poll(async () => {
        const r = await b.fetch(`/_postguard/v1/operations/${op.id}`, { headers: bearer(key) });
        assert.equal(r.status, 200, r.text);
        return r.json.state === 'succeeded' && r.json;
      }, { timeout: 60000, interval: 250, message: 'the operation to complete after the restart' });
      assert.equal(finished.attempts, 2, 'the cut attempt and one more');
      const sent = crashOrigin.stats.find((r) => r.idempotency_key === idem);
      assert.equal(sent.length, 2, 'the cut call ran once more, not more');
      assert.ok(sent.every((r) => r.headers['x-request-id'] === op.request_id), 'both with the operation\'s request id');
      assert.ok(sent[1].at >= sent[0].at + 2000, 'the second only after the first attempt\'s lease');
      const res = await b.fetch(`/_postguard/v1/operations/${op.id}/result`, { headers: bearer(key) });
      assert.equal(res.status, 201);
      assert.equal(res.json.execution, 2, 'the answer of the call that completed');
      // Completed once: one completion event, delivered once.
      const delivered = await crashReceiver.waitFor((rs) => rs.find((r) => r.json?.data?.id === op.id), { timeout: 30000, message: 'the completion event' });
      const feed = await b.fetch('/_postguard/v1/events?type=postguard.operation.completed', { headers: bearer(key) });
      assert.equal(feed.json.data.filter((e) => e.data.id === op.id).length, 1);
      await poll(async () => {
        const d = await b.fetch('/_postguard/v1/deliveries', { headers: bearer(key) });
        return d.json.data.length === 1 && d.json.data[0].status === 'delivered';
      }, { timeout: 15000, message: 'its one delivery delivered' });
      assert.equal(crashReceiver.forEvent(delivered.headers['webhook-id']).length, 1);
      // And a retry now: the same 202, no third execution.
      const again = await b.fetch('/reports/crash', {
        method: 'POST',
        headers: { ...bearer(key), prefer: 'respond-async', 'idempotency-key': idem, 'x-demo-delay-ms': '3000' },
        body: 'x',
      });
      assert.equal(assertAccepted(again).id, op.id);
      assert.equal(crashOrigin.stats.count(idem), 2);
    } finally {
      await b.dispose();
    }
  });
});
