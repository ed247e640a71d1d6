// Metrics (docs/observability.md, issue 27 item 1): one Analytics Engine data point per request and
// per delivery attempt,
// written through the real METRICS binding's interface by the real built worker under
// Miniflare. Miniflare keeps no local dataset to query, so the points are read back from a
// recorder standing in for the binding (tests/support/metrics-recorder.mjs); the columns
// asserted here are the ones the queries of docs/observability.md read.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, bearer, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';
import { prepareRecordingRoot, recordedPoints } from './support/metrics-recorder.mjs';

const CONFIG = {
  origin: { timeout_ms: 1500 },
  idempotency: { lease_s: 5, routes: [{ method: 'POST', path: '/orders/*', mode: 'required' }] },
  plans: {
    metered: { policies: [{ name: 'burst', requests: 100, window_s: 60 }, { name: 'minute', requests: 12, window_s: 60 }] },
    roomy: { requests_per_window: 1000, window_s: 60 },
  },
  webhooks: { schedule_s: [1], timeout_ms: 10000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
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
    // The origin takes at least 50 ms: the point's origin time must say so.
    sent.push(['admitted', await post('/orders/1', 'm-1', { 'x-demo-delay-ms': '50' })]);
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
    assert.ok(admitted.origin_ms >= 50 && admitted.origin_ms <= admitted.latency_ms, `origin ${admitted.origin_ms} ms: the origin's 50 ms at least, within latency ${admitted.latency_ms} ms`);

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

describe('a data point per delivery attempt', () => {
  it('a failed attempt then a delivered one: outcome, status, attempt number, lag and latency', async () => {
    // Each answer takes at least 40 ms: the attempt's latency must say so.
    const slow = (status) => new Promise((r) => setTimeout(() => r({ status }), 40));
    const rcv = await startReceiver({ behaviour: (req, n) => slow(n === 1 ? 503 : 204) });
    try {
      const owner = await gw.createKey({ project: 'metrics-hooks', plan: 'roomy' });
      const sub = await gw.fetch('/_postguard/v1/webhooks', {
        method: 'POST',
        headers: { ...bearer(owner.key), 'content-type': 'application/json', 'idempotency-key': 'm-sub' },
        body: JSON.stringify({ url: `${rcv.url}/hook`, events: ['order.*'] }),
      });
      assert.equal(sub.status, 201, sub.text);
      const publishedAt = Date.now();
      const evt = await gw.admin('POST', '/_postguard/v1/events', { project: 'metrics-hooks', type: 'order.paid', data: { id: 1 } }, { token: ORIGIN_TOKEN });
      assert.equal(evt.status, 202, evt.text);
      const attempts = await poll(async () => {
        const all = (await recordedPoints(gw)).filter((p) => p.blobs[0] === 'delivery' && p.blobs[3] === sub.json.id);
        return all.length >= 2 && all;
      }, { timeout: 30000, message: 'two attempt points' });
      const cols = attempts.map((p) => ({
        index: p.index, outcome: p.blobs[1], project: p.blobs[2], type: p.blobs[4], status: p.doubles[0], attempt: p.doubles[2],
      }));
      assert.deepEqual(cols, [
        { index: 'metrics-hooks', outcome: 'failed', project: 'metrics-hooks', type: 'order.paid', status: 503, attempt: 1 },
        { index: 'metrics-hooks', outcome: 'delivered', project: 'metrics-hooks', type: 'order.paid', status: 204, attempt: 2 },
      ]);
      for (const [i, p] of attempts.entries()) {
        assert.ok(p.doubles[1] >= 40, `latency ${p.doubles[1]}: the receiver's 40 ms at least`);
        // Due no earlier than the publish, sent before the receiver got it.
        const bound = rcv.requests[i].at - publishedAt;
        assert.ok(p.doubles[3] >= 0 && p.doubles[3] <= bound, `lag ${p.doubles[3]} ms within ${bound} ms`);
      }
      const [first, second] = attempts.map((p, i) => rcv.requests[i]?.at);
      assert.ok(second - first >= 900, 'the retry came on the 1 s schedule');
    } finally {
      await rcv.close();
    }
  });
});
