// Metrics (CONTRACT §15, issue 27 item 1): one Analytics Engine data point per request,
// written through the real METRICS binding's interface by the real built worker under
// Miniflare. Miniflare keeps no local dataset to query, so the points are read back from a
// recorder standing in for the binding (tests/support/metrics-recorder.mjs); the columns
// asserted here are the ones the README's queries read.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import { startGateway, poll, bearer, cfg } from './support/gateway.mjs';
import { prepareRecordingRoot, recordedPoints } from './support/metrics-recorder.mjs';

const CONFIG = {
  origin: { timeout_ms: 1500 },
  idempotency: { lease_s: 5, routes: [{ method: 'POST', path: '/orders/*', mode: 'required' }] },
  plans: {
    metered: { policies: [{ name: 'burst', requests: 100, window_s: 60 }, { name: 'minute', requests: 12, window_s: 60 }] },
  },
};

let origin;
let gw;
let key;

before(async () => {
  process.env.POSTGUARD_ROOT = prepareRecordingRoot(); // this file's process only
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  key = await gw.createKey({ project: 'metrics', plan: 'metered' });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

const COLUMNS = ['type', 'kind', 'outcome', 'policy', 'project', 'key_prefix', 'route', 'method', 'code'];
/** The request points of this file's key, as named columns. */
async function requestPoints() {
  return (await recordedPoints(gw))
    .filter((p) => p.blobs[0] === 'request')
    .map((p) => ({
      index: p.index,
      ...Object.fromEntries(COLUMNS.map((c, i) => [c, p.blobs[i]])),
      status: p.doubles[0],
      latency_ms: p.doubles[1],
      origin_ms: p.doubles[2],
      forwarded: p.doubles[3],
    }));
}

describe('a data point per request', () => {
  it('names each outcome, its policy, route and latencies; never a secret', async () => {
    const auth = bearer(key.key);
    const post = (path, idem, headers = {}) => gw.fetch(path, { method: 'POST', headers: { ...auth, 'idempotency-key': idem, ...headers }, body: 'x' });
    const sent = [];
    sent.push(['admitted', await post('/orders/1', 'm-1')]);
    sent.push(['replay', await post('/orders/1', 'm-1')]);
    sent.push(['conflict', await gw.fetch('/orders/1', { method: 'POST', headers: { ...auth, 'idempotency-key': 'm-1' }, body: 'other' })]);
    sent.push(['origin_5xx', await gw.fetch('/plain', { headers: { ...auth, 'x-demo-status': '503' } })]);
    sent.push(['timeout', await gw.fetch('/slow', { headers: { ...auth, 'x-demo-delay-ms': '4000' } })]);
    sent.push(['unauthenticated', await gw.fetch('/plain', { headers: bearer('pgk_not-a-real-key-0000000000000000000000000000') })]);
    sent.push(['admitted', await gw.fetch('/_postguard/v1/me', { headers: auth })]);
    // Spend the minute policy: the next request is refused by it.
    let refused;
    for (let i = 0; i < 20 && !refused; i++) {
      const r = await gw.fetch(`/plain?i=${i}`, { headers: auth });
      if (r.status === 429) refused = r;
    }
    assert.ok(refused, 'the minute policy refused');
    sent.push(['limited', refused]);
    const statuses = sent.map(([, r]) => r.status);
    assert.deepEqual(statuses, [201, 201, 422, 503, 504, 401, 200, 429], 'the requests answered as meant');

    // Each point is written before its answer leaves; the poll only bounds a slow isolate.
    const points = await poll(async () => {
      const all = await requestPoints();
      return all.some((p) => p.outcome === 'limited') && all;
    }, { timeout: 15000, message: 'the data points' });

    const find = (pred, what) => {
      const p = points.find(pred);
      assert.ok(p, `a point for ${what}: ${JSON.stringify(points.slice(-12))}`);
      return p;
    };
    const admitted = find((p) => p.route === '/orders/*' && p.outcome === 'admitted', 'the admitted POST');
    assert.deepEqual(
      [admitted.index, admitted.kind, admitted.project, admitted.key_prefix, admitted.method, admitted.status, admitted.code, admitted.forwarded],
      ['metrics', 'proxied', 'metrics', key.prefix, 'POST', 201, '', 1],
    );
    assert.ok(admitted.origin_ms >= 0 && admitted.origin_ms <= admitted.latency_ms, `origin ${admitted.origin_ms} ms within latency ${admitted.latency_ms} ms`);

    const replay = find((p) => p.route === '/orders/*' && p.outcome === 'replay', 'the replay');
    assert.deepEqual([replay.status, replay.forwarded], [201, 0], 'a replay never reaches the origin');
    find((p) => p.outcome === 'conflict' && p.status === 422 && p.code === 'IDEMPOTENCY_KEY_REUSE_CONFLICT', 'the 422');
    find((p) => p.outcome === 'origin_5xx' && p.status === 503 && p.route === '*', 'the origin 503');
    const timeout = find((p) => p.outcome === 'timeout' && p.status === 504, 'the timeout');
    assert.ok(timeout.origin_ms >= 1000, `the timeout waited for the origin (${timeout.origin_ms} ms)`);
    const anon = find((p) => p.outcome === 'unauthenticated', 'the 401');
    assert.deepEqual([anon.index, anon.project, anon.key_prefix, anon.code], ['-', '', '', 'INVALID_API_KEY']);
    const me = find((p) => p.kind === 'gateway' && p.route === '/_postguard/v1/me', '/me');
    assert.deepEqual([me.outcome, me.status, me.method, me.forwarded], ['admitted', 200, 'GET', 0]);
    const limited = find((p) => p.outcome === 'limited', 'the 429');
    assert.deepEqual([limited.policy, limited.status, limited.code, limited.key_prefix], ['minute', 429, 'RATE_LIMIT_EXCEEDED', key.prefix]);

    const everything = JSON.stringify(await recordedPoints(gw));
    assert.ok(!everything.includes(key.key), 'no API key in a data point');
  });
});
