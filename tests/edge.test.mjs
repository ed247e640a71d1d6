// Admission at the edge (limits.edge, ADR 0040, docs/limits.md): requests of one key arriving at
// several locations (Miniflare's `cf.colo`, set per request by the MF-CF-Blob header) are admitted
// by the key's edge object of each location from blocks leased by the key's own object, and never
// more than the quota in all; `r` never promises more than can be admitted, `Retry-After` is never
// early, and a concurrency quota leased to edges is never exceeded. Round trips are counted around
// the unmodified build (tests/support/counting.mjs) to show which answers the edges gave alone.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import {
  startGateway, burst, problem, bearer, cfg, rateHeaders, assertRateHeaders, sleep,
} from './support/gateway.mjs';
import { prepareCountingRoot } from './support/counting.mjs';

const COLOS = ['AMS', 'CDG', 'FRA', 'LHR'];
const at = (colo) => ({ 'mf-cf-blob': JSON.stringify({ colo }) });
const QUOTA = 50;
const HOUR = 3600;
const PLANS = {
  fifty: { requests_per_window: QUOTA, window_s: HOUR },
  quick: { requests_per_window: 40, window_s: 4 },
  wide: { requests_per_window: 100000, window_s: HOUR, concurrency: 40 },
  watched: { requests_per_window: 40, window_s: HOUR, enforce: false },
};
// The defaults, and small blocks that make every location lease and run dry many times.
const SETTINGS = {
  defaults: { enabled: true },
  'small blocks': { enabled: true, min_block: 2, max_block: 8 },
};

let origin;
const gateways = {};

before(async () => {
  process.env.POSTGUARD_ROOT = prepareCountingRoot(); // this file's process only
  origin = await startOrigin();
  for (const [name, edge] of Object.entries(SETTINGS)) {
    gateways[name] = await startGateway({
      originUrl: origin.url,
      vars: { POSTGUARD_CONFIG: cfg({ plans: PLANS, limits: { unauthenticated_per_minute: 1000000, edge } }) },
    });
  }
});
after(async () => {
  for (const gw of Object.values(gateways)) await gw?.dispose();
  await origin?.kill();
});

const seenBy = (prefix) => origin.stats.find((r) => r.headers['x-postguard-key-prefix'] === prefix);
const counters = async (gw) => (await gw.fetch('/__counters')).json;
const homeCalls = (c) => c['object round trip /lease'] ?? 0;

for (const [name, gwName] of Object.entries({ defaults: 'defaults', 'small blocks': 'small blocks' })) {
  describe(`exact over four locations (${name})`, () => {
    it(`300 simultaneous requests over 4 edges, quota ${QUOTA} → exactly ${QUOTA} admitted; r and Retry-After honest`, async (t) => {
      const gw = gateways[gwName];
      const k = await gw.createKey({ project: 'edge', plan: 'fifty' });
      const reqs = Array.from({ length: 300 }, (_, i) => ({
        path: `/edge/burst?i=${i}`,
        headers: { ...bearer(k.key), ...at(COLOS[i % COLOS.length]) },
      }));
      await gw.fetch('/__counters/reset');
      const sent = Date.now();
      const res = await burst(gw.url, reqs, { timeout: 120000 });
      const counts = await counters(gw);
      const ok = res.filter((r) => r.status === 200);
      const limited = res.filter((r) => r.status === 429);
      assert.deepEqual(
        { ok: ok.length, limited: limited.length, other: res.length - ok.length - limited.length },
        { ok: QUOTA, limited: 300 - QUOTA, other: 0 },
        `statuses: ${JSON.stringify(res.map((r) => r.status))}`,
      );
      assert.equal(seenBy(k.prefix).length, QUOTA, 'the origin saw exactly the quota');
      assert.equal(counts['object round trip /edge/admit'], 300, 'every request asked its location\'s edge');

      // r never promises more than can still be admitted: once a response says r = v, at most
      // QUOTA - v requests in all (itself included) were admitted up to then, so at most
      // QUOTA - v responses can say v or more.
      const rs = ok.map((r) => assertRateHeaders(r, { limit: QUOTA, window: HOUR }).remaining);
      for (let v = 0; v <= QUOTA; v++) {
        const claimed = rs.filter((r) => r >= v).length;
        assert.ok(claimed <= QUOTA - v, `${claimed} answers said r ≥ ${v}: ${JSON.stringify(rs)}`);
      }
      // Retry-After is never before the window's end: the window opened after the burst was sent.
      for (const r of limited) {
        problem(r, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
        const h = rateHeaders(r);
        assert.equal(h.remaining, 0);
        assert.ok(h.retryAfter >= h.t && h.retryAfter >= 1, `Retry-After ${h.retryAfter}, t ${h.t}`);
        assert.ok(r.at + h.retryAfter * 1000 >= sent + HOUR * 1000, `Retry-After ${h.retryAfter} s is early`);
      }
      // With small blocks the edges answer part of the burst without the key's object. (With the
      // defaults a quota of 50 over four locations is never leased: half a fair share stays under
      // min_block, so the key's object admits it alone and its headers stay exact.)
      const home = homeCalls(counts);
      t.diagnostic(`${home} calls to the key's object for 300 requests`);
      if (name === 'small blocks') assert.ok(home < 250, `${home} calls to the key's object for 300 requests`);
      else assert.deepEqual([...rs].sort((a, b) => a - b), Array.from({ length: QUOTA }, (_, i) => i), 'exact: each sees its own r');

      // The spent key stays refused everywhere, a new location included, and nothing more went through.
      for (const colo of ['LHR', 'SYD']) {
        problem(await gw.fetch('/edge/after', { headers: { ...bearer(k.key), ...at(colo) } }), { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
      }
      assert.equal(seenBy(k.prefix).length, QUOTA);
    });
  });
}

describe('an edge\'s refusal', () => {
  it('is answered at the edge, and its Retry-After is never early: admitted again right after it', async () => {
    const gw = gateways['small blocks'];
    const k = await gw.createKey({ project: 'edge', plan: 'quick' });
    const get = (i) => gw.fetch(`/edge/quick?i=${i}`, { headers: { ...bearer(k.key), ...at('LHR') } });
    let refused;
    for (let i = 0; i < 200 && !refused; i++) {
      await gw.fetch('/__counters/reset');
      const r = await get(i);
      if (r.status === 429) refused = { r, counts: await counters(gw) };
      else assert.equal(r.status, 200, r.text);
    }
    assert.ok(refused, 'the window was spent');
    // Refusals made locally once the edge knows the home has nothing left: keep asking until one is.
    for (let i = 0; i < 20 && homeCalls(refused.counts) > 0; i++) {
      await gw.fetch('/__counters/reset');
      const r = await get(`again-${i}`);
      if (r.status !== 429) break; // the 4 s window ended meanwhile on a slow machine
      refused = { r, counts: await counters(gw) };
    }
    const h = rateHeaders(refused.r);
    problem(refused.r, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
    assert.ok(h.retryAfter >= 1 && h.retryAfter <= 4 && h.retryAfter >= h.t, `Retry-After ${h.retryAfter}, t ${h.t}`);
    await sleep(Math.max(0, refused.r.at + h.retryAfter * 1000 - Date.now()));
    const next = await get('next');
    assert.equal(next.status, 200, `after Retry-After=${h.retryAfter}s the edge must admit: ${next.status} ${next.text}`);
    assert.equal(homeCalls(refused.counts), 0, 'the last refusal was the edge\'s own');
  });
});

describe('a concurrency quota leased to edges', () => {
  it('is never exceeded: 2 × 50 simultaneous slow requests at two edges, quota 40 in flight', async () => {
    const gw = gateways['small blocks'];
    const k = await gw.createKey({ project: 'edge', plan: 'wide' });
    // Warm both edges up so that they hold slots.
    for (let i = 0; i < 10; i++) {
      for (const colo of ['AMS', 'LHR']) {
        assert.equal((await gw.fetch(`/edge/warm?i=${i}`, { headers: { ...bearer(k.key), ...at(colo) } })).status, 200);
      }
    }
    await gw.fetch('/__counters/reset');
    const reqs = Array.from({ length: 100 }, (_, i) => ({
      path: `/edge/slow?i=${i}`,
      headers: { ...bearer(k.key), ...at(i % 2 ? 'AMS' : 'LHR'), 'x-demo-delay-ms': '1500' },
    }));
    const res = await burst(gw.url, reqs, { timeout: 120000 });
    const counts = await counters(gw);
    const ok = res.filter((r) => r.status === 200);
    for (const r of res.filter((x) => x.status !== 200)) {
      problem(r, { status: 429, code: 'CONCURRENCY_LIMIT_EXCEEDED' });
      assert.equal(r.headers['retry-after'], '1');
    }
    assert.ok(ok.length >= 1, 'some were admitted');
    const spans = seenBy(k.prefix).filter((x) => x.path === '/edge/slow').map((x) => [x.at, x.ended_at]);
    assert.equal(spans.length, ok.length);
    const peak = Math.max(...spans.map(([start]) => spans.filter(([s, e]) => s <= start && start < e).length));
    assert.ok(peak <= 40, `${peak} in flight at once`);
    assert.ok((counts['object round trip /edge/end'] ?? 0) >= 1, `some ran on a slot leased to an edge: ${JSON.stringify(counts)}`);
  });
});

describe('report-only limits at the edge', () => {
  it('admits what the leases would refuse, with the headers as enforced', async () => {
    const gw = gateways['small blocks'];
    const k = await gw.createKey({ project: 'edge', plan: 'watched' });
    const res = [];
    for (let i = 0; i < 60; i++) res.push(await gw.fetch(`/edge/watched?i=${i}`, { headers: { ...bearer(k.key), ...at('FRA') } }));
    assert.deepEqual([...new Set(res.map((r) => r.status))], [200], 'nothing refused');
    assert.equal(seenBy(k.prefix).length, 60);
    const over = res.filter((r) => Number(r.headers['x-ratelimit-remaining']) === 0).length;
    assert.ok(over >= 20, `${over} answers said nothing remains`);
  });
});
