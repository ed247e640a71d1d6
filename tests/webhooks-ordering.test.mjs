// Ordering keys (§17, docs/webhooks.md "Ordering keys", ADR 0043), end to end: the real built
// worker under Miniflare with its real D1, Durable Objects (the project's object, the shards) and
// queue, and a real local receiver.
//   - a failing first event of key K holds K's next two, in order, while key L's passes; the
//     waiting deliveries show blocked_by = the delivery before them; none of K's later events is
//     sent before K's first is delivered;
//   - the same when K's events fall in different shards (two-second buckets, a boundary between);
//   - pause, publish K1..K3, resume: received in publish order;
//   - a dead-lettered head settles its lane: the next goes.
// Orders and "never before" are asserted strictly; how long anything takes only with generous bounds.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';
import { show, subscribedProject } from './support/util.mjs';

const BUCKET_MS = 2_000;
const CONFIG = {
  webhooks: { schedule_s: [2, 2], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'], shard_bucket_ms: BUCKET_MS },
  plans: { big: { requests_per_window: 100000 } },
};
const WITHIN_MS = 120_000;

let origin;
let gw;
let rcv;
/** Event id → answers given so far: an event published with data {fail: n} gets n 500s first. */
const answered = new Map();

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  rcv = await startReceiver({
    behaviour: (r) => {
      const id = r.json?.id;
      const n = (answered.get(id) ?? 0) + 1;
      answered.set(id, n);
      return n <= (r.json?.data?.fail ?? 0) ? { status: 500, body: 'not yet' } : { status: 200, body: 'ok' };
    },
  });
});
after(async () => {
  await rcv?.close();
  await gw?.dispose();
  await origin?.kill();
});

async function project(tag) {
  const { name, api, sub } = await subscribedProject(gw, rcv, tag);
  const publish = async (ordering_key, fail = 0) => {
    const res = await gw.admin('POST', '/_postguard/v1/events', { project: name, type: 'order.changed', data: { fail }, ordering_key }, { token: ORIGIN_TOKEN });
    assert.equal(res.status, 202, show(res));
    fails.set(res.json.id, fail);
    return res.json.id;
  };
  const deliveries = async () => {
    const res = await api('GET', '/_postguard/v1/deliveries?limit=100');
    assert.equal(res.status, 200, show(res));
    return res.json.data;
  };
  const of = async (eventId) => (await deliveries()).find((d) => d.event_id === eventId);
  return { name, api, publish, deliveries, of, sub };
}

/** When each event was first received (ms), by event id. */
const firstAt = (id) => rcv.forEvent(id)[0]?.at;
/** Event id → the 500s it asked for. */
const fails = new Map();
/** When the attempt that succeeds (the first past its failures) arrived. */
const okAt = (id) => rcv.forEvent(id).find((r) => r.attempt > (fails.get(id) ?? 0))?.at;

describe('ordering keys', () => {
  it('a failing first event of key K holds K\'s next two, in order, while key L\'s passes', async () => {
    const p = await project('lane');
    const k1 = await p.publish('K', 2); // attempts 1 and 2 fail, 3 succeeds (2 s apart)
    const k2 = await p.publish('K');
    const k3 = await p.publish('K');
    const l1 = await p.publish('L');

    // L goes while K's head is failing.
    await rcv.waitFor(() => okAt(l1) !== undefined, { timeout: WITHIN_MS, message: 'L1 received' });
    // K2 and K3 wait for the delivery before them, and say so.
    const [d1, d2, d3] = await Promise.all([k1, k2, k3].map((id) => p.of(id)));
    assert.equal(d1.ordering_key, 'K', show(d1));
    assert.equal(d2.ordering_key, 'K');
    if (okAt(k1) === undefined) {
      assert.equal(d2.blocked_by, d1.id, `K2 waits for K1: ${show(d2)}`);
      assert.equal(d3.blocked_by, d2.id, `K3 waits for K2: ${show(d3)}`);
      assert.equal(d2.attempts_made, 0, 'no attempt used while blocked');
    }
    await rcv.waitFor(() => okAt(k3) !== undefined, { timeout: WITHIN_MS, message: 'K3 received' });
    const t1 = okAt(k1);
    assert.ok(t1 !== undefined, 'K1 delivered');
    assert.ok(firstAt(k2) >= t1, `K2 first sent ${t1 - firstAt(k2)} ms before K1 was delivered`);
    assert.ok(firstAt(k3) >= okAt(k2), 'K3 only after K2 was delivered');
    assert.ok(firstAt(l1) < t1, 'L1 was not held by K');
    assert.equal(rcv.forEvent(k1).length, 3, 'K1: two failures and the success');
    const done = await poll(async () => {
      const ds = await Promise.all([k1, k2, k3].map((id) => p.of(id)));
      return ds.every((d) => d?.status === 'delivered' && d.blocked_by === null) && ds;
    }, { timeout: 30_000, message: 'all of K delivered, none blocked' });
    assert.equal(done.length, 3);
    // The feed shows the key too.
    const feed = await p.api('GET', '/_postguard/v1/events');
    assert.equal(feed.status, 200, show(feed));
    assert.equal(feed.json.data.find((e) => e.id === k2)?.ordering_key, 'K');
  });

  it('across a shard\'s boundary: K\'s next event in the next bucket waits for the one before', async () => {
    const p = await project('bucket');
    const k1 = await p.publish('K', 2);
    // The next bucket starts at the next multiple of BUCKET_MS: publish just after it.
    const start = Math.floor(Date.now() / BUCKET_MS) * BUCKET_MS;
    await new Promise((r) => setTimeout(r, start + BUCKET_MS + 300 - Date.now()));
    const k2 = await p.publish('K');
    const [d1, d2] = await Promise.all([k1, k2].map((id) => p.of(id)));
    assert.notEqual(d1.id.slice(0, 14), d2.id.slice(0, 14), 'different shards (ids name their bucket)');
    await rcv.waitFor(() => okAt(k2) !== undefined, { timeout: WITHIN_MS, message: 'K2 received' });
    assert.ok(okAt(k1) !== undefined && firstAt(k2) >= okAt(k1), 'K2 only after K1 was delivered');
    assert.equal(rcv.forEvent(k1).length, 3);
  });

  it('pause, publish K1..K3, resume: received in publish order', async () => {
    const p = await project('pause');
    const paused = await p.api('POST', `/_postguard/v1/webhooks/${p.sub.id}/pause`);
    assert.equal(paused.status, 200, show(paused));
    const ids = [];
    for (let i = 0; i < 3; i++) ids.push(await p.publish('K'));
    const held = await poll(async () => {
      const ds = await Promise.all(ids.map((id) => p.of(id)));
      return ds.every((d) => d?.status === 'paused') && ds;
    }, { message: 'all held' });
    assert.equal(held[1].blocked_by, held[0].id);
    const resumed = await p.api('POST', `/_postguard/v1/webhooks/${p.sub.id}/resume`);
    assert.equal(resumed.status, 200, show(resumed));
    await rcv.waitFor(() => ids.every((id) => okAt(id) !== undefined), { timeout: WITHIN_MS, message: 'all three received' });
    const order = ids.map(firstAt);
    assert.deepEqual([...order].sort((a, b) => a - b), order, `received in publish order: ${order}`);
  });

  it('a dead-lettered head settles its lane: the next event goes', async () => {
    const p = await project('dead');
    const k1 = await p.publish('K', 100); // never succeeds: three attempts, then dead_letter
    const k2 = await p.publish('K');
    await rcv.waitFor(() => okAt(k2) !== undefined, { timeout: WITHIN_MS, message: 'K2 received after K1 gave up' });
    const d1 = await p.of(k1);
    assert.equal(d1.status, 'dead_letter', show(d1));
    assert.ok(firstAt(k2) >= rcv.forEvent(k1).at(-1).at, 'K2 only after K1\'s last attempt');
  });
});
