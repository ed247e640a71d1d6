// Receivers that say how fast (§17, docs/webhooks.md "Receivers that say how fast"), end to
// end: the real built worker under Miniflare with its real D1, Durable Objects and queue, and
// real local receivers.
//   - a receiver answering 200 with `RateLimit: "default";r=0;t=3` is not called again until
//     its advertised reset (~3 s): the next delivery waits (re-queued), no attempt of it fails,
//     and GET /webhooks/{id} shows receiver_limit {remaining: 0, reset_at};
//   - X-RateLimit-Remaining + X-RateLimit-Reset are read too;
//   - a malformed header is ignored (receiver_limit null, nothing waits).
// Only lower bounds of time are asserted strictly; upper bounds are generous (a shared machine).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';
import { show, subscribedProject } from './support/util.mjs';

const CONFIG = {
  webhooks: { schedule_s: [1], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 100000 } },
};

let origin;
let gw;
const receivers = [];

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await Promise.all(receivers.map((r) => r.close()));
  await gw?.dispose();
  await origin?.kill();
});

/** A project with one subscription to a receiver answering 200 with `headers`. */
async function setup(tag, headers) {
  const rcv = await startReceiver({ behaviour: () => ({ status: 200, body: 'ok', headers }) });
  receivers.push(rcv);
  const { name, api, sub } = await subscribedProject(gw, rcv, tag);
  const publish = async (n) => {
    const res = await gw.admin('POST', '/_postguard/v1/events', { project: name, type: 'paced.test', data: { n } }, { token: ORIGIN_TOKEN });
    assert.equal(res.status, 202, show(res));
    return res.json.id;
  };
  const subscription = async () => {
    const res = await api('GET', `/_postguard/v1/webhooks/${sub.id}`);
    assert.equal(res.status, 200, show(res));
    return res.json;
  };
  return { rcv, api, publish, subscription };
}

async function deliveryOf(api, eventId) {
  const list = await api('GET', '/_postguard/v1/deliveries');
  const row = list.json.data.find((d) => d.event_id === eventId);
  if (!row) return undefined;
  const res = await api('GET', `/_postguard/v1/deliveries/${row.id}`);
  assert.equal(res.status, 200, show(res));
  return res.json;
}

describe('receivers that say how fast', () => {
  it('RateLimit r=0;t=3: the next delivery waits for the reset, no attempt failed, receiver_limit shown', async (t) => {
    const p = await setup('paced', { RateLimit: '"default";r=0;t=3' });
    const first = await p.publish(1);
    await p.rcv.waitFor(() => p.rcv.forEvent(first).length === 1, { timeout: 60_000, message: 'the first event' });
    const firstAt = p.rcv.forEvent(first)[0].at;
    // The answer is stored with the subscription: 0 left until ~3 s after it.
    const sub = await poll(async () => {
      const s = await p.subscription();
      return s.receiver_limit && s;
    }, { timeout: 30_000, message: 'receiver_limit shown' });
    assert.equal(sub.receiver_limit.remaining, 0, show({ json: sub }));
    assert.ok(sub.receiver_limit.reset_at >= firstAt + 2_900, `reset_at ${sub.receiver_limit.reset_at - firstAt} ms after the answer`);
    assert.ok(sub.receiver_limit.reset_at <= firstAt + 60_000);
    const resetAt = sub.receiver_limit.reset_at;

    const second = await p.publish(2);
    await p.rcv.waitFor(() => p.rcv.forEvent(second).length > 0, { timeout: 120_000, message: 'the second event' });
    const got = p.rcv.forEvent(second);
    t.diagnostic(`second received ${got[0].at - firstAt} ms after the first (reset ${resetAt - firstAt} ms after it)`);
    assert.ok(got[0].at >= resetAt - 1_000, `called ${resetAt - got[0].at} ms before the advertised reset`);
    assert.ok(got[0].at >= firstAt + 2_000, `called again ${got[0].at - firstAt} ms after an answer of r=0;t=3`);
    assert.equal(got[0].attempt, 1, 'the wait used no attempt number');
    const d = await poll(async () => {
      const x = await deliveryOf(p.api, second);
      return x?.status === 'delivered' && x;
    }, { timeout: 30_000, message: 'the second delivered' });
    assert.equal(d.attempts_made, 1);
    assert.equal(d.attempts.length, 1, show({ json: d }));
    assert.equal(d.attempts[0].status_code, 200);
    assert.equal(d.attempts[0].error ?? null, null);
  });

  it('X-RateLimit-Remaining + X-RateLimit-Reset are read', async () => {
    const p = await setup('paced-x', { 'X-RateLimit-Remaining': '7', 'X-RateLimit-Reset': '60' });
    const first = await p.publish(1);
    await p.rcv.waitFor(() => p.rcv.forEvent(first).length === 1, { timeout: 60_000, message: 'the event' });
    const sub = await poll(async () => {
      const s = await p.subscription();
      return s.receiver_limit && s;
    }, { timeout: 30_000, message: 'receiver_limit shown' });
    assert.equal(sub.receiver_limit.remaining, 7);
  });

  it('a malformed header is ignored: receiver_limit stays null and deliveries go on', async () => {
    const p = await setup('paced-bad', { RateLimit: '"default";r=x;t=3' });
    const ids = [await p.publish(1)];
    await p.rcv.waitFor(() => p.rcv.forEvent(ids[0]).length === 1, { timeout: 60_000, message: 'the first event' });
    ids.push(await p.publish(2));
    await p.rcv.waitFor(() => p.rcv.forEvent(ids[1]).length === 1, { timeout: 60_000, message: 'the second event' });
    const d = await poll(async () => {
      const x = await deliveryOf(p.api, ids[1]);
      return x?.status === 'delivered' && x;
    }, { timeout: 30_000, message: 'delivered' });
    assert.equal(d.attempts.length, 1);
    const sub = await p.subscription();
    assert.ok('receiver_limit' in sub, 'receiver_limit is always shown');
    assert.equal(sub.receiver_limit, null);
  });
});
