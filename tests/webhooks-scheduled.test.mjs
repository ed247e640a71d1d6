// Scheduled events (§17, docs/webhooks.md "Scheduled events"), end to end: the real built worker
// under Miniflare with its real D1, Durable Objects and queue, and a real local receiver.
//   - an event published with deliver_at = now + 8 s is not received before deliver_at and is
//     received after it; its delivery shows next_attempt_at = deliver_at meanwhile;
//   - deliver_at may be RFC 3339;
//   - deliver_at more than 7 days ahead, or not a time, is a 400 VALIDATION_ERROR naming the field,
//     and nothing is stored.
// Only the lower bound is asserted strictly; the upper bound is minutes (a shared machine).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, problem, poll, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';
import { uniq, show, subscribedProject } from './support/util.mjs';

const CONFIG = {
  webhooks: { schedule_s: [1], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 100000 } },
};
const AHEAD_MS = 8_000;
const WITHIN_MS = 180_000;

let origin;
let gw;
let rcv;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  rcv = await startReceiver({ behaviour: () => ({ status: 200, body: 'ok' }) });
});
after(async () => {
  await rcv?.close();
  await gw?.dispose();
  await origin?.kill();
});

async function project(tag) {
  const { name, api } = await subscribedProject(gw, rcv, tag);
  const publish = (body) => gw.admin('POST', '/_postguard/v1/events', { project: name, type: 'invoice.due', data: {}, ...body }, { token: ORIGIN_TOKEN });
  return { name, api, publish };
}

async function deliveryOf(api, eventId) {
  const res = await api('GET', '/_postguard/v1/deliveries');
  assert.equal(res.status, 200, show(res));
  return res.json.data.find((d) => d.event_id === eventId);
}

describe('scheduled events (deliver_at)', () => {
  it('no attempt before deliver_at (epoch ms); next_attempt_at shows it; delivered after it', async (t) => {
    const p = await project('sched');
    const deliverAt = Date.now() + AHEAD_MS;
    const res = await p.publish({ deliver_at: deliverAt });
    assert.equal(res.status, 202, show(res));
    const id = res.json.id;

    const d = await poll(() => deliveryOf(p.api, id), { message: 'the delivery listed' });
    assert.equal(d.next_attempt_at, deliverAt, show(d));
    assert.equal(d.status, 'pending');
    assert.equal(d.attempts_made, 0);
    const detail = await p.api('GET', `/_postguard/v1/deliveries/${d.id}`);
    assert.equal(detail.status, 200, show(detail));
    assert.equal(detail.json.next_attempt_at, deliverAt);

    await rcv.waitFor(() => rcv.forEvent(id).length > 0, { timeout: WITHIN_MS, message: 'the scheduled event received' });
    const got = rcv.forEvent(id);
    // The consumer's tolerance is one second of the planned time; never earlier.
    assert.ok(got[0].at >= deliverAt - 1_000, `received ${deliverAt - got[0].at} ms before deliver_at`);
    assert.equal(got[0].attempt, 1);
    t.diagnostic(`received ${got[0].at - deliverAt} ms after deliver_at`);
    const done = await poll(async () => {
      const x = await deliveryOf(p.api, id);
      return x?.status === 'delivered' && x;
    }, { timeout: 30_000, message: 'delivered' });
    assert.equal(done.attempts_made, 1);
  });

  it('deliver_at as RFC 3339 is accepted and kept to the millisecond', async () => {
    const p = await project('sched-rfc');
    const deliverAt = Math.floor((Date.now() + 3_600_000) / 1000) * 1000 + 250;
    const res = await p.publish({ deliver_at: new Date(deliverAt).toISOString() });
    assert.equal(res.status, 202, show(res));
    const d = await poll(() => deliveryOf(p.api, res.json.id), { message: 'the delivery listed' });
    assert.equal(d.next_attempt_at, deliverAt, show(d));
    assert.equal(d.status, 'pending');
  });

  it('a deliver_at in the past is due at once', async () => {
    const p = await project('sched-past');
    const res = await p.publish({ deliver_at: Date.now() - 60_000 });
    assert.equal(res.status, 202, show(res));
    await rcv.waitFor(() => rcv.forEvent(res.json.id).length > 0, { timeout: 60_000, message: 'received' });
  });

  for (const [name, value] of [
    ['8 days ahead (epoch ms)', () => Date.now() + 8 * 86_400_000],
    ['8 days ahead (RFC 3339)', () => new Date(Date.now() + 8 * 86_400_000).toISOString()],
    ['not a time', () => 'tomorrow'],
    ['negative', () => -1],
  ]) {
    it(`400 VALIDATION_ERROR naming deliver_at: ${name}`, async () => {
      const p = await project('sched-bad');
      const res = await p.publish({ deliver_at: value(), id: `evt_${uniq('bad')}` });
      const pr = problem(res, { status: 400, code: 'VALIDATION_ERROR' });
      assert.match(pr.detail, /deliver_at/, pr.detail);
      const list = await p.api('GET', '/_postguard/v1/deliveries');
      assert.equal(list.json.data.length, 0, 'nothing stored');
    });
  }
});
