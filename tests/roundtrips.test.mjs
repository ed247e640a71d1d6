// What each kind of request costs in calls, counted around the unmodified build
// (tests/support/counting.mjs): Durable Object round trips, alarm calls, KV reads and origin
// fetches — the calls the design promises, not how the object stores (its SQL statements and
// transactions are the object's own business; bench/counters.mjs reports them). These are the
// design's invariants (ADR 0001, 0006):
// one object call before the origin, one after only when a response is stored or a claim
// released, the stored body riding in the admit reply, no object call for a bad key (and
// no KV read for one seen in the last 10 s), one cost-0 object call per gateway endpoint.
// Counts, not timings; bench/counters.mjs prints the same table for RESULTS.md.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';
import { prepareCountingRoot } from './support/counting.mjs';

const N = 10;
let origin;
let gw;
let key;
let tiny;

before(async () => {
  process.env.POSTGUARD_ROOT = prepareCountingRoot(); // this file's process only
  origin = await startOrigin();
  gw = await startGateway({
    originUrl: origin.url,
    vars: { POSTGUARD_CONFIG: cfg({ plans: { big: { requests_per_window: 100000 }, tiny: { requests_per_window: 1, window_s: 86400 } } }) },
  });
  key = (await gw.createKey({ project: 'rt', plan: 'big' })).key;
  tiny = (await gw.createKey({ project: 'rt', plan: 'tiny' })).key;
  const first = await gw.fetch('/rt/items', { headers: { authorization: `Bearer ${tiny}` } });
  assert.equal(first.status, 200, 'the tiny key\'s only admission');
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

const body = '{"amount":1}';
const post = (idem, extra = {}) => gw.fetch('/rt/pay', {
  method: 'POST',
  headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'idempotency-key': idem, ...extra },
  body,
});

/** Sends `send(i)` N times after one warm-up; returns the counts per request. */
async function perRequest(send, status) {
  assert.equal((await send(-1)).status, status, 'warm-up');
  await gw.fetch('/__counters/reset');
  for (let i = 0; i < N; i++) {
    const res = await send(i);
    assert.equal(res.status, status, res.text);
  }
  const counts = (await gw.fetch('/__counters')).json;
  return Object.fromEntries(Object.entries(counts).map(([k, v]) => [k, v / N]));
}

/** The calls the design counts: object round trips and alarm runs, KV reads, fetches. */
const CALL = /^(object round trip|object alarm run|KV\.|fetch )/;

/** Exactly these calls (no other call), per request. */
function expectCounts(got, want) {
  const calls = Object.fromEntries(Object.entries(got).filter(([k]) => CALL.test(k)));
  assert.deepEqual(calls, want, `per-request counts ${JSON.stringify(got)}`);
}

describe('calls per request', () => {
  it('GET: one object round trip, one origin fetch', async () => {
    expectCounts(await perRequest(() => gw.fetch('/rt/items', { headers: { authorization: `Bearer ${key}` } }), 200), {
      'object round trip /admit': 1, 'fetch (origin or receiver)': 1,
    });
  });

  it('fresh POST: admit before the origin, complete after', async () => {
    const stamp = Date.now();
    expectCounts(await perRequest((i) => post(`rt-fresh-${stamp}-${i}`), 201), {
      'object round trip /admit': 1, 'object round trip /complete': 1,
      'fetch (origin or receiver)': 1,
    });
  });

  it('replay: one round trip carrying the stored body, no origin fetch', async () => {
    expectCounts(await perRequest(() => post('rt-replay'), 201), {
      'object round trip /admit': 1,
    });
  });

  it('reused key with another body (422): one round trip, no origin fetch', async () => {
    await post('rt-conflict');
    expectCounts(await perRequest(() => gw.fetch('/rt/pay', {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'idempotency-key': 'rt-conflict' },
      body: '{"amount":2}',
    }), 422), {
      'object round trip /admit': 1,
    });
  });

  it('origin 5xx under a key: the claim is released in a second round trip', async () => {
    const stamp = Date.now();
    expectCounts(await perRequest((i) => post(`rt-5xx-${stamp}-${i}`, { 'x-demo-status': '503' }), 503), {
      'object round trip /admit': 1, 'object round trip /release': 1,
      'fetch (origin or receiver)': 1,
    });
  });

  it('429: one round trip, no origin fetch', async () => {
    expectCounts(await perRequest(() => gw.fetch('/rt/items', { headers: { authorization: `Bearer ${tiny}` } }), 429), {
      'object round trip /admit': 1,
    });
  });

  // A refused credential counts against its address (docs/limits.md): one round trip to the
  // address's object, the exact counter of requests without a valid credential (ADR 0031).
  it('unknown key (401): the address counted, no KV read while the negative cache remembers it (ADR 0015)', async () => {
    // The warm-up made the one KV read; the next requests within 10 s read nothing.
    expectCounts(await perRequest(() => gw.fetch('/rt/items', { headers: { authorization: `Bearer pgk_${'B'.repeat(43)}` } }), 401), {
      'object round trip /admit': 1,
    });
  });

  it('a new unknown key (401): one KV read, the address counted', async () => {
    const stamp = Date.now().toString(36);
    const fresh = (i) => `pgk_${`C${stamp}x${i + 1}`.padEnd(43, 'C')}`;
    expectCounts(await perRequest((i) => gw.fetch('/rt/items', { headers: { authorization: `Bearer ${fresh(i)}` } }), 401), {
      'KV.get': 1, 'object round trip /admit': 1,
    });
  });

  it('gateway endpoints ask the key\'s object (cost 0): /webhooks is one /admit round trip', async () => {
    const counts = await perRequest(() => gw.fetch('/_postguard/v1/webhooks', { headers: { authorization: `Bearer ${key}` } }), 200);
    assert.equal(counts['object round trip /admit'], 1, JSON.stringify(counts));
  });
});

// Issue 36 #0: nothing that every tenant shares sits on the publish path. A publish asks the
// project's object for its deliveries (its copy of the subscribers, ADR 0046) and stores them in
// its shard: no D1 statement at all once the copy is loaded (the warm-up loads it).
describe('calls per publish', () => {
  it('POST /events to 5 subscriptions: 0 D1 statements, one project-object and one shard round trip', async () => {
    const admin = (method, p, b) => gw.admin(method, p, b, { token: key });
    for (let i = 0; i < 5; i++) {
      const sub = await admin('POST', '/_postguard/v1/webhooks', { url: `https://receiver${i}.example/hook`, events: ['*'] });
      assert.equal(sub.status, 201, sub.text);
      // Paused: their deliveries are stored held, so no consumer runs during the count.
      assert.equal((await admin('POST', `/_postguard/v1/webhooks/${sub.json.id}/pause`)).status, 200);
    }
    const seen = (await gw.fetch('/__counters')).json;
    assert.ok(seen['D1.prepare'] > 0, `D1 statements are counted (creating subscriptions made some): ${JSON.stringify(seen)}`);
    const publish = () => gw.admin('POST', '/_postguard/v1/events', { project: 'rt', type: 'order.paid', data: { n: 1 } }, { token: ORIGIN_TOKEN });
    const counts = await perRequest(publish, 202);
    const d1 = Object.entries(counts).filter(([k]) => k.startsWith('D1.'));
    assert.deepEqual(d1, [], `no D1 statement per publish: ${JSON.stringify(counts)}`);
    assert.equal(counts['project object /prepare'], 1, JSON.stringify(counts));
    assert.equal(counts['webhook shard /publish'], 1, JSON.stringify(counts));
    const held = await admin('GET', '/_postguard/v1/deliveries?status=paused&limit=100');
    assert.ok(held.json.data.length >= 5 * N, 'each publish made its 5 deliveries');
  });
});

// With limits.edge on (ADR 0040) a request's admission goes to the key's edge object for its
// location (`cf.colo`), which admits from the blocks it holds: a warm edge answers a GET without
// calling the key's object at all (above, with edges off: one /admit each). A location that has not
// shown min_block requests yet, and every request with an Idempotency-Key (claims stay in the
// key's object), go through the edge to the key's object: one /lease each.
describe('calls per request, edges on', () => {
  let egw;
  let ekey;
  const colo = (c) => ({ 'mf-cf-blob': JSON.stringify({ colo: c }) });
  before(async () => {
    egw = await startGateway({
      originUrl: origin.url,
      vars: { POSTGUARD_CONFIG: cfg({ plans: { big: { requests_per_window: 100000 } }, limits: { unauthenticated_per_minute: 1000000, edge: { enabled: true } } }) },
    });
    ekey = (await egw.createKey({ project: 'rt', plan: 'big' })).key;
  });
  after(async () => egw?.dispose());

  const get = (c) => egw.fetch('/rt/items', { headers: { authorization: `Bearer ${ekey}`, ...colo(c) } });
  /** N requests from `send(i)` after the warm-up; the counts per request. */
  async function measured(send, status) {
    await egw.fetch('/__counters/reset');
    for (let i = 0; i < N; i++) {
      const res = await send(i);
      assert.equal(res.status, status, res.text);
    }
    const counts = (await egw.fetch('/__counters')).json;
    return Object.fromEntries(Object.entries(counts).map(([k, v]) => [k, v / N]));
  }

  it('GET at a warm edge: one edge round trip, none to the key\'s object, one origin fetch', async () => {
    // Warm: until an answer shows the edge holding more than before (a block just arrived) and
    // enough that the next N leave it above its prefetch threshold.
    let last = -1;
    for (let i = 0; ; i++) {
      assert.ok(i < 500, 'the edge never warmed up');
      const r = Number((await get('LHR')).headers['x-ratelimit-remaining']);
      if (r > last && last >= 0 && r >= 3 * N) break;
      last = r;
    }
    expectCounts(await measured(() => get('LHR'), 200), {
      'object round trip /edge/admit': 1, 'fetch (origin or receiver)': 1,
    });
  });

  it('GET at a cold location: through its edge to the key\'s object (one /lease)', async () => {
    const stamp = Date.now().toString(36).toUpperCase();
    expectCounts(await measured((i) => get(`C${stamp}${i}`), 200), {
      'object round trip /edge/admit': 1, 'object round trip /lease': 1,
      'fetch (origin or receiver)': 1,
    });
  });

  it('fresh POST at a warm edge: the claim is the key\'s object\'s (one /lease before, one /complete after)', async () => {
    const stamp = Date.now();
    expectCounts(await measured((i) => egw.fetch('/rt/pay', {
      method: 'POST',
      headers: { authorization: `Bearer ${ekey}`, 'content-type': 'application/json', 'idempotency-key': `rt-edge-${stamp}-${i}`, ...colo('LHR') },
      body,
    }), 201), {
      'object round trip /edge/admit': 1, 'object round trip /lease': 1, 'object round trip /complete': 1,
      'fetch (origin or receiver)': 1,
    });
  });
});

