// Per-key rate limits (docs/request-path.md, docs/limits.md, docs/api-reference.md): exact under real concurrency, headers, Retry-After.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import {
  startGateway, burst, problem, bearer, cfg, rateHeaders, assertRateHeaders, sleep, ORIGIN_TOKEN,
} from './support/gateway.mjs';

const N = 20;
const CONFIG = {
  plans: {
    tiny: { requests_per_window: N, window_s: 60, idempotency_ttl_s: 86400 },
    micro: { requests_per_window: 3, window_s: 60, idempotency_ttl_s: 86400 },
    quick: { requests_per_window: 3, window_s: 2, idempotency_ttl_s: 86400 },
    costed: { requests_per_window: 7, window_s: 60, idempotency_ttl_s: 86400 },
  },
  // (the worker refuses a route cost above the smallest plan quota, so cost ≤ 3 here)
  rate_limit: { costs: [{ method: 'POST', path: '/bulk/*', cost: 3 }] },
};

let origin;
let gw;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

const forwardedFor = (prefix) => origin.stats.find((r) => r.headers['x-postguard-key-prefix'] === prefix).length;

describe('exact limit under a simultaneous burst', () => {
  it(`limit ${N}, ${5 * N} simultaneous requests → exactly ${N} admitted, ${4 * N} × 429`, async () => {
    const k = await gw.createKey({ project: 'rl', plan: 'tiny' });
    const reqs = Array.from({ length: 5 * N }, (_, i) => ({ path: `/rl/burst?i=${i}`, headers: bearer(k.key) }));
    const res = await burst(gw.url, reqs);
    const ok = res.filter((r) => r.status === 200);
    const limited = res.filter((r) => r.status === 429);
    assert.deepEqual(
      { ok: ok.length, limited: limited.length, other: res.length - ok.length - limited.length },
      { ok: N, limited: 4 * N, other: 0 },
      `statuses: ${JSON.stringify(res.map((r) => r.status))}`,
    );
    assert.equal(forwardedFor(k.prefix), N, 'the origin saw exactly N requests');

    const remaining = ok.map((r) => assertRateHeaders(r, { limit: N, window: 60 }).remaining).sort((a, b) => a - b);
    assert.deepEqual(remaining, Array.from({ length: N }, (_, i) => i), 'each admitted request sees its own Remaining, N-1..0 once each');

    const resets = [];
    for (const r of res) {
      const h = assertRateHeaders(r, { limit: N, window: 60 });
      resets.push(h.reset);
      assert.match(r.headers['x-request-id'] ?? '', /^req_/);
    }
    assert.ok(Math.max(...resets) - Math.min(...resets) <= 1, `one window, one reset: ${Math.min(...resets)}..${Math.max(...resets)}`);

    for (const r of limited) {
      problem(r, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
      const h = rateHeaders(r);
      assert.equal(h.remaining, 0);
      assert.ok(Number.isInteger(h.retryAfter) && h.retryAfter >= 1 && h.retryAfter <= 60, `Retry-After ${r.headers['retry-after']}`);
      assert.ok(h.retryAfter >= h.t, `Retry-After (${h.retryAfter}) is not earlier than the window end (t=${h.t})`);
      assert.ok(h.retryAfter <= h.t + 1, `Retry-After (${h.retryAfter}) ≈ window end (t=${h.t})`);
    }
    for (const r of ok) assert.equal(r.headers['retry-after'], undefined, 'admitted responses carry no Retry-After');

    // the exhausted key is still refused, /me reports it without spending, another key is untouched
    problem(await gw.fetch('/rl/after', { headers: bearer(k.key) }), { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
    const me = await gw.fetch('/_postguard/v1/me', { headers: bearer(k.key) });
    assert.equal(me.status, 200, me.text);
    assert.equal(me.json.remaining, 0);
    const other = await gw.createKey({ project: 'rl', plan: 'tiny' });
    const o = await gw.fetch('/rl/other', { headers: bearer(other.key) });
    assert.equal(o.status, 200);
    assert.equal(assertRateHeaders(o, { limit: N }).remaining, N - 1);
    assert.equal(forwardedFor(k.prefix), N, 'still exactly N forwarded');
  });

  it('two keys bursting at once are limited independently', async () => {
    const a = await gw.createKey({ project: 'rl', plan: 'tiny' });
    const b = await gw.createKey({ project: 'rl', plan: 'tiny' });
    const reqs = [];
    for (let i = 0; i < 2 * N; i++) {
      reqs.push({ path: `/rl/two?i=${i}`, headers: bearer(a.key) });
      reqs.push({ path: `/rl/two?i=${i}`, headers: bearer(b.key) });
    }
    const res = await burst(gw.url, reqs);
    const okA = res.filter((r, i) => i % 2 === 0 && r.status === 200).length;
    const okB = res.filter((r, i) => i % 2 === 1 && r.status === 200).length;
    assert.deepEqual([okA, okB], [N, N]);
    assert.equal(res.filter((r) => r.status === 429).length, 2 * N);
    assert.equal(forwardedFor(a.prefix), N);
    assert.equal(forwardedFor(b.prefix), N);
  });
});

describe('window', () => {
  it('is anchored at the first request; after Retry-After the key is admitted again', async () => {
    const k = await gw.createKey({ project: 'rl', plan: 'quick' });
    const r1 = await gw.fetch('/rl/w1', { headers: bearer(k.key) });
    assert.equal(r1.status, 200);
    const h1 = assertRateHeaders(r1, { limit: 3, window: 2 });
    assert.equal(h1.remaining, 2);
    assert.ok(h1.t === 2 || h1.t === 1, `the first request opens a full window: t=${h1.t}`);
    for (const [i, left] of [[2, 1], [3, 0]]) {
      const r = await gw.fetch(`/rl/w${i}`, { headers: bearer(k.key) });
      assert.equal(r.status, 200);
      assert.equal(assertRateHeaders(r).remaining, left);
    }
    const r3 = await gw.fetch('/rl/w4', { headers: bearer(k.key) });
    problem(r3, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
    const h3 = assertRateHeaders(r3, { limit: 3, window: 2 });
    assert.ok(h3.retryAfter >= 1 && h3.retryAfter <= 2, `Retry-After ${h3.retryAfter}`);
    const at3 = Date.now();
    // Retry-After promises admission after that many seconds: honour it exactly, then expect a 200.
    await sleep(Math.max(0, at3 + h3.retryAfter * 1000 - Date.now()));
    const r4 = await gw.fetch('/rl/w5', { headers: bearer(k.key) });
    assert.equal(r4.status, 200, `after Retry-After=${h3.retryAfter}s the request must be admitted: ${r4.status} ${r4.text}`);
    const h4 = assertRateHeaders(r4, { limit: 3, window: 2 });
    assert.equal(h4.remaining, 2, 'a new window started');
    assert.equal(forwardedFor(k.prefix), 4);
  });
});

describe('what counts', () => {
  it('400s and replays consume budget, and a replay can be answered 429', async () => {
    const k = await gw.createKey({ project: 'rl', plan: 'micro' });
    const h = { ...bearer(k.key), 'content-type': 'application/json' };
    const first = await gw.fetch('/rl/pay', { method: 'POST', headers: { ...h, 'idempotency-key': 'rl-replay-1' }, body: '{"a":1}' });
    assert.equal(first.status, 201, first.text);
    assert.equal(assertRateHeaders(first, { limit: 3 }).remaining, 2);
    const replay = await gw.fetch('/rl/pay', { method: 'POST', headers: { ...h, 'idempotency-key': 'rl-replay-1' }, body: '{"a":1}' });
    assert.equal(replay.status, 201);
    assert.equal(replay.headers['idempotent-replayed'], 'true');
    assert.equal(assertRateHeaders(replay, { limit: 3 }).remaining, 1, 'a replay costs 1');
    const missing = await gw.fetch('/rl/pay', { method: 'POST', headers: h, body: '{"a":1}' });
    problem(missing, { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
    assert.equal(assertRateHeaders(missing, { limit: 3 }).remaining, 0, 'a 400 after auth costs 1');
    const limited = await gw.fetch('/rl/pay', { method: 'POST', headers: { ...h, 'idempotency-key': 'rl-replay-1' }, body: '{"a":1}' });
    problem(limited, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
    assert.notEqual(limited.headers['idempotent-replayed'], 'true');
    assert.ok(Number(limited.headers['retry-after']) >= 1);
    assert.equal(origin.stats.count('rl-replay-1'), 1);
    assert.equal(forwardedFor(k.prefix), 1);
  });

  it('a 422 reuse conflict consumes budget and carries the headers', async () => {
    const k = await gw.createKey({ project: 'rl', plan: 'micro' });
    const h = { ...bearer(k.key), 'idempotency-key': 'rl-422' };
    assert.equal((await gw.fetch('/rl/c', { method: 'POST', headers: h, body: 'one' })).status, 201);
    const conflict = await gw.fetch('/rl/c', { method: 'POST', headers: h, body: 'two' });
    problem(conflict, { status: 422, code: 'IDEMPOTENCY_KEY_REUSE_CONFLICT' });
    assert.equal(assertRateHeaders(conflict, { limit: 3 }).remaining, 1);
  });

  it('route costs from configuration: POST /bulk/* costs 3', async () => {
    const k = await gw.createKey({ project: 'rl', plan: 'costed' });
    const post = (p, key) => gw.fetch(p, { method: 'POST', headers: { ...bearer(k.key), 'idempotency-key': key }, body: '[1,2,3]' });
    const b1 = await post('/bulk/items', 'bulk-1');
    assert.equal(b1.status, 201, b1.text);
    assert.equal(assertRateHeaders(b1, { limit: 7 }).remaining, 4);
    for (const left of [3, 2]) {
      const g = await gw.fetch('/bulk/items', { headers: bearer(k.key) });
      assert.equal(g.status, 200);
      assert.equal(assertRateHeaders(g).remaining, left, 'GET is not covered by the POST cost rule');
    }
    const b2 = await post('/bulk/a/b', 'bulk-2');
    problem(b2, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
    assert.ok(Number(b2.headers['retry-after']) >= 1, 'a request costing more than what remains is refused with Retry-After');
    assert.equal(assertRateHeaders(b2).remaining, 2, 'a refused request spends nothing');
    const one = await post('/single', 'single-1');
    assert.equal(one.status, 201, 'a cost-1 request still fits');
    assert.equal(assertRateHeaders(one).remaining, 1);
    assert.equal(origin.stats.count('bulk-2'), 0);
  });

  it('requests without a valid key are charged to no key and carry no key\'s budget', async () => {
    const k = await gw.createKey({ project: 'rl', plan: 'micro' });
    const before = (await gw.fetch('/_postguard/v1/me', { headers: bearer(k.key) })).json.remaining;
    // No key, a malformed one, and one that is the real key's prefix with another secret.
    const forged = k.key.slice(0, 12) + 'A'.repeat(35);
    for (const headers of [{}, { authorization: 'Bearer nope' }, bearer(forged)]) {
      const res = await gw.fetch('/rl/anon', { headers });
      problem(res, { status: 401, code: 'INVALID_API_KEY' });
      for (const h of ['x-ratelimit-limit', 'x-ratelimit-remaining', 'ratelimit', 'ratelimit-policy']) {
        assert.equal(res.headers[h], undefined, `a 401 carries no ${h}`);
      }
    }
    const after = (await gw.fetch('/_postguard/v1/me', { headers: bearer(k.key) })).json.remaining;
    assert.equal(after, before, 'the key whose prefix was used is not charged');
    assert.equal(forwardedFor(k.prefix), 0, 'nothing reached the origin');
  });
});
