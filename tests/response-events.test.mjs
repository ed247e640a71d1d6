// Events from responses (docs/async-operations.md, ADR 0037): a stored response that an
// `events_from_responses` rule matches publishes its event once per (API key, Idempotency-Key) —
// for 20 client retries of one key, for 3 × 20 simultaneous requests, for an asynchronous
// operation retried while it runs — with an id derived from both and the request's request_id;
// nothing for a status the rule does not name, a request without a key, a body that is not JSON
// or a pointer that does not resolve (logged); and nothing is lost when publishing fails after
// the store, even across a gateway restart. Real worker under Miniflare, real origin, real
// webhook receiver; the publish failure is injected under the key's object
// (tests/support/injected-faults.mjs).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { prepareFaultyRoot } from './support/injected-faults.mjs';
import { startGateway, burst, poll, bearer, cfg, E2E_LOG_DIR } from './support/gateway.mjs';

const CONFIG = {
  origin: { timeout_ms: 8000 },
  idempotency: { lease_s: 20, methods: { POST: 'required', PUT: 'optional' } },
  async: { routes: [{ method: 'POST', path: '/orders' }], timeout_ms: 10000, requeue_after_s: 2 },
  events_from_responses: [
    { method: 'POST', path: '/orders', status: '2xx', type: 'order.created', data: 'body' },
    { method: 'POST', path: '/orders/*/refunds', status: '201', type: 'refund.created', data: '/headers' },
    { method: 'POST', path: '/pointer', status: '2xx', type: 'pointer.missing', data: '/nope' },
    { method: 'POST', path: '/text', status: '2xx', type: 'text.body', data: 'body' },
    { method: 'PUT', path: '/things/*', status: '2xx', type: 'thing.put', data: 'body' },
  ],
  webhooks: { schedule_s: [1, 1], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { roomy: { requests_per_window: 100000, window_s: 60 } },
};

/** The event id of (API key id, Idempotency-Key): `evt_` + a ULID of a SHA-256 over both (ADR 0037). */
function eventId(keyId, idem) {
  const h = crypto.createHash('sha256')
    .update('postguard response event v1\0')
    .update(keyId)
    .update(Buffer.from([0]))
    .update(idem)
    .digest();
  let n = BigInt(`0x${h.subarray(0, 16).toString('hex')}`);
  const alphabet = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
  let out = '';
  for (let i = 0; i < 26; i++) {
    out = alphabet[Number(n & 31n)] + out;
    n >>= 5n;
  }
  return `evt_${out}`;
}

/** The worker's log lines this process has kept (tests/support/gateway.mjs). */
function logLines() {
  const file = path.join(E2E_LOG_DIR, `worker-${process.pid}.ndjson`);
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).flatMap((l) => {
    try {
      return [JSON.parse(JSON.parse(l).message)];
    } catch {
      return [];
    }
  });
}

async function subscribe(gw, key, url, events = ['*']) {
  const res = await gw.fetch('/_postguard/v1/webhooks', {
    method: 'POST',
    headers: { ...bearer(key), 'content-type': 'application/json' },
    body: JSON.stringify({ url, events }),
  });
  assert.equal(res.status, 201, res.text);
  return res.json;
}

/** Every event of the project's feed (all pages). */
async function feed(gw, key, type) {
  const out = [];
  let cursor = null;
  do {
    const q = new URLSearchParams({ limit: '200', ...(type ? { type } : {}), ...(cursor ? { cursor } : {}) });
    const page = await gw.fetch(`/_postguard/v1/events?${q}`, { headers: bearer(key) });
    assert.equal(page.status, 200, page.text);
    out.push(...page.json.data);
    cursor = page.json.next_cursor;
  } while (cursor);
  return out;
}

/** Waits until event `id` is in the feed with all its deliveries delivered; returns it. */
async function deliveredOnce(gw, key, id, timeout = 30000) {
  return poll(async () => {
    const ev = (await feed(gw, key)).find((e) => e.id === id);
    return ev && ev.deliveries.total >= 1 && ev.deliveries.delivered === ev.deliveries.total && ev;
  }, { timeout, interval: 200, message: `event ${id} delivered` });
}

describe('events from responses', () => {
  let origin;
  let receiver;
  let gw;
  let k;

  before(async () => {
    origin = await startOrigin();
    receiver = await startReceiver();
    gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
    k = await gw.createKey({ project: 'resp', plan: 'roomy' });
    await subscribe(gw, k.key, `${receiver.url}/hooks`, ['*']);
  });
  after(async () => {
    await gw?.dispose();
    await receiver?.close();
    await origin?.kill();
  });

  const post = (p, idem, { key = k.key, headers = {}, body = '{"sku":"a1"}' } = {}) => gw.fetch(p, {
    method: 'POST',
    headers: { ...bearer(key), 'content-type': 'application/json', ...(idem ? { 'idempotency-key': idem } : {}), ...headers },
    body,
  });

  it('publishes once for 20 sequential client retries of one key, with the id of (key, Idempotency-Key) and the request_id of the request that ran', async () => {
    const idem = `seq-${crypto.randomUUID()}`;
    const answers = [];
    for (let i = 0; i < 20; i++) answers.push(await post('/orders', idem));
    assert.equal(answers[0].status, 201);
    assert.ok(answers.slice(1).every((r) => r.status === 201 && r.headers['idempotent-replayed'] === 'true'), 'replays');
    assert.equal(origin.stats.count(idem), 1);
    const id = eventId(k.id, idem);
    const ev = await deliveredOnce(gw, k.key, id);
    assert.equal(ev.type, 'order.created');
    assert.equal(ev.request_id, answers[0].headers['x-request-id'], 'the request that was stored');
    assert.deepEqual(ev.data, JSON.parse(answers[0].text), 'the response body');
    assert.equal(ev.deliveries.total, 1);
    const got = receiver.forEvent(id);
    assert.equal(got.length, 1, 'delivered once');
    assert.deepEqual(got[0].json.data, JSON.parse(answers[0].text));
    assert.equal((await feed(gw, k.key, 'order.created')).filter((e) => e.id === id).length, 1, 'one event');
  });

  it('publishes once per key for 3 × 20 simultaneous requests', async () => {
    const idems = [0, 1, 2].map((i) => `burst-${i}-${crypto.randomUUID()}`);
    const reqs = idems.flatMap((idem) => Array.from({ length: 20 }, () => ({
      method: 'POST',
      path: '/orders',
      headers: { ...bearer(k.key), 'content-type': 'application/json', 'idempotency-key': idem },
      body: '{"sku":"b2"}',
    })));
    const res = await burst(gw.url, reqs);
    for (const idem of idems) assert.equal(origin.stats.count(idem), 1, `${idem}: one execution`);
    assert.ok(res.every((r) => [201, 409].includes(r.status)), `statuses: ${[...new Set(res.map((r) => r.status))]}`);
    for (const idem of idems) {
      const id = eventId(k.id, idem);
      const ev = await deliveredOnce(gw, k.key, id);
      assert.equal(ev.deliveries.total, 1);
      const ran = res.find((r) => r.status === 201 && r.headers['idempotent-replayed'] === undefined && r.json?.headers?.['idempotency-key'] === idem);
      assert.equal(ev.request_id, ran.headers['x-request-id']);
      assert.equal(receiver.forEvent(id).length, 1, `${idem}: delivered once`);
    }
  });

  it('publishes nothing for a status the rule does not name, a request without a key, or a body that gives no event (logged)', async () => {
    const notFound = `404-${crypto.randomUUID()}`;
    const failed = `503-${crypto.randomUUID()}`;
    const pointer = `ptr-${crypto.randomUUID()}`;
    const text = `txt-${crypto.randomUUID()}`;
    assert.equal((await post('/orders', notFound, { headers: { 'x-demo-status': '404' } })).status, 404);
    assert.equal((await post('/orders', failed, { headers: { 'x-demo-status': '503' } })).status, 503);
    const p = await post('/pointer', pointer);
    const t = await post('/text', text, { headers: { 'x-demo-body-bytes': '16' } });
    assert.equal((await gw.fetch('/things/1', { method: 'PUT', headers: bearer(k.key), body: '{}' })).status, 200, 'no key: nothing stored');
    // A later event of the same key's object, published after them: the barrier.
    const thing = `put-${crypto.randomUUID()}`;
    assert.equal((await gw.fetch('/things/2', { method: 'PUT', headers: { ...bearer(k.key), 'idempotency-key': thing }, body: '{}' })).status, 200);
    const barrier = await deliveredOnce(gw, k.key, eventId(k.id, thing));
    assert.equal(barrier.type, 'thing.put');
    const ids = new Set((await feed(gw, k.key)).map((e) => e.id));
    for (const idem of [notFound, failed, pointer, text]) assert.ok(!ids.has(eventId(k.id, idem)), `no event for ${idem}`);
    assert.ok(!(await feed(gw, k.key)).some((e) => ['pointer.missing', 'text.body'].includes(e.type)));
    const lines = logLines().filter((l) => l.msg === 'no event for the stored response');
    const why = (rid) => lines.find((l) => l.request_id === rid)?.reason;
    assert.match(why(p.headers['x-request-id']) ?? '', /JSON Pointer \/nope does not resolve/);
    assert.match(why(t.headers['x-request-id']) ?? '', /not JSON/);
  });

  it('takes data from a JSON Pointer into the body', async () => {
    const idem = `refund-${crypto.randomUUID()}`;
    const res = await post('/orders/o1/refunds', idem);
    assert.equal(res.status, 201);
    const ev = await deliveredOnce(gw, k.key, eventId(k.id, idem));
    assert.equal(ev.type, 'refund.created');
    assert.deepEqual(ev.data, JSON.parse(res.text).headers);
  });

  it('an asynchronous operation publishes its response event once, with the operation\'s request_id', async () => {
    const idem = `async-${crypto.randomUUID()}`;
    const ask = () => post('/orders', idem, { headers: { prefer: 'respond-async', 'x-demo-delay-ms': '1000' } });
    const first = await ask();
    assert.equal(first.status, 202, first.text);
    for (let i = 0; i < 5; i++) assert.equal((await ask()).json.id, first.json.id);
    const id = eventId(k.id, idem);
    const ev = await deliveredOnce(gw, k.key, id);
    assert.equal(ev.type, 'order.created');
    assert.equal(ev.request_id, first.json.request_id);
    assert.equal(ev.data.execution, 1);
    assert.equal(origin.stats.count(idem), 1);
    assert.equal(receiver.forEvent(id).length, 1);
  });
});

describe('the crash window between the stored response and its event', () => {
  let origin;
  let receiver;
  let persistDir;
  const root = process.env.POSTGUARD_ROOT;

  before(async () => {
    origin = await startOrigin();
    receiver = await startReceiver();
    persistDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-resp-crash-'));
  });
  after(async () => {
    if (root === undefined) delete process.env.POSTGUARD_ROOT;
    else process.env.POSTGUARD_ROOT = root;
    await receiver?.close();
    await origin?.kill();
    fs.rmSync(persistDir, { recursive: true, force: true });
  });

  /** Waits for the key's object to have tried (and failed) to publish `id`. */
  const failedOnce = (id) => poll(
    () => logLines().some((l) => l.msg === 'publishing an event failed; retried later' && l.event_id === id),
    { timeout: 20000, interval: 100, message: `a failed publish of ${id}` },
  );

  it('loses nothing: a publish that fails after the store is retried, also after the gateway restarts, and delivered once', async () => {
    const vars = { POSTGUARD_CONFIG: cfg(CONFIG) };
    process.env.POSTGUARD_ROOT = prepareFaultyRoot();
    const faulty = await startGateway({ originUrl: origin.url, persistDir, vars });
    let k;
    const retried = `retried-${crypto.randomUUID()}`;
    const crashed = `crashed-${crypto.randomUUID()}`;
    const post = (g, idem) => g.fetch('/orders', {
      method: 'POST', headers: { ...bearer(k.key), 'content-type': 'application/json', 'idempotency-key': idem }, body: '{"sku":"c3"}',
    });
    try {
      k = await faulty.createKey({ project: 'crash', plan: 'roomy' });
      await subscribe(faulty, k.key, `${receiver.url}/hooks`, ['order.created']);
      assert.equal((await faulty.fetch('/__publish/block?on=1')).status, 200);

      // 1. Publishing fails after the response was stored: retried until it goes through.
      assert.equal((await post(faulty, retried)).status, 201);
      await failedOnce(eventId(k.id, retried));
      assert.equal(receiver.forEvent(eventId(k.id, retried)).length, 0);
      assert.equal((await faulty.fetch('/__publish/block?on=0')).status, 200);
      await receiver.waitFor((rs) => rs.some((r) => r.headers['webhook-id'] === eventId(k.id, retried)), { timeout: 30000, message: 'the retried event' });

      // 2. Publishing fails, then the gateway dies: the event waits in the key's object.
      assert.equal((await faulty.fetch('/__publish/block?on=1')).status, 200);
      const stored = await post(faulty, crashed);
      assert.equal(stored.status, 201);
      await failedOnce(eventId(k.id, crashed));
      assert.equal((await post(faulty, crashed)).headers['idempotent-replayed'], 'true', 'the response was stored');
    } finally {
      await faulty.dispose();
    }
    // The same state, the unmodified build.
    if (root === undefined) delete process.env.POSTGUARD_ROOT;
    else process.env.POSTGUARD_ROOT = root;
    const gw = await startGateway({ originUrl: origin.url, persistDir, vars, migrate: false });
    try {
      const id = eventId(k.id, crashed);
      const ev = await deliveredOnce(gw, k.key, id, 60000);
      assert.equal(ev.deliveries.total, 1);
      assert.equal(receiver.forEvent(id).length, 1, 'delivered once');
      assert.equal(receiver.forEvent(eventId(k.id, retried)).length, 1, 'and the first one still once');
      assert.equal(origin.stats.count(crashed), 1);
      // Retrying after the restart replays, publishes nothing more.
      assert.equal((await post(gw, crashed)).headers['idempotent-replayed'], 'true');
      assert.equal((await feed(gw, k.key, 'order.created')).filter((e) => e.id === id).length, 1);
    } finally {
      await gw.dispose();
    }
  });
});
