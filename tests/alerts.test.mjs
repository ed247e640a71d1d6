// Operational alerts (issue 27 item 5, ADR 0038), end to end on the real built worker under
// Miniflare (D1, Durable Objects, queue) with real local receivers, driven by the
// every-minute trigger:
//   - postguard.queue.lagging when the oldest due delivery is older than alerts.queue_lag_s,
//     to the operator's project (alerts.project) only;
//   - postguard.storage.high_water when a webhook shard reaches alerts.storage_percent of its
//     mark, to that project's subscriptions and the operator's;
//   - each published once per condition and alerts.period_s, however often the check runs.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, cfg } from './support/gateway.mjs';
import { importRecords, projectRecords, call } from './support/webhook-shards.mjs';

const DAY_MS = 86_400_000;
const MINUTE = { cron: '* * * * *' };
const OPS = `ops-${crypto.randomBytes(4).toString('hex')}`;
const TYPES = ['postguard.queue.lagging', 'postguard.storage.high_water'];
const CONFIG = {
  plans: { big: { requests_per_window: 1_000_000 } },
  webhooks: { allow_insecure_urls: true, allow_hosts: ['127.0.0.1'], shard_high_water_bytes: 50_000_000 },
  // A shard alerts at 1% of its 50 MB mark: 500 KB.
  alerts: { project: OPS, queue_lag_s: 5, storage_percent: 1, period_s: 3600 },
};

let origin;
let gw;
let rcv;

before(async () => {
  origin = await startOrigin();
  rcv = await startReceiver({ behaviour: () => ({ status: 200, body: 'ok' }) });
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await rcv?.close();
  await gw?.dispose();
  await origin?.kill();
});

const show = (res) => `${res.status} ${res.text?.slice(0, 400)}`;

/** A project with one subscription to the alert types on the receiver; its key. */
async function subscribed(project) {
  const { key } = await gw.createKey({ project, plan: 'big' });
  const res = await gw.admin('POST', '/_postguard/v1/webhooks', { url: `${rcv.url}/${project}`, events: TYPES }, { token: key });
  assert.equal(res.status, 201, show(res));
  return res.json.id;
}

const alertsOf = async (project, type) => (await projectRecords(gw, project)).events.filter((e) => e.event_type === type);
const received = (project, type) => rcv.requests.filter((r) => r.path?.startsWith(`/${project}`) && r.json?.type === type);

describe('operational alerts', () => {
  it('a lagging queue and a shard over its share of the mark are each published once, to the right subscriptions', async () => {
    const lagging = `lag-${crypto.randomBytes(4).toString('hex')}`;
    const full = `full-${crypto.randomBytes(4).toString('hex')}`;
    await subscribed(OPS);
    await subscribed(lagging);
    await subscribed(full);
    const now = Date.now();
    const today = Math.floor(now / DAY_MS) * DAY_MS;
    // A delivery due a minute ago that no queue message will run.
    const due = now - 60_000;
    await importRecords(gw, { project: lagging, start_ms: today }, [{
      event: { id: 'evt_lag', event_type: 'order.paid', payload: '{}', created_at: due - 1000, request_id: 'req_lag' },
      deliveries: [{ id: 'dlv_lag', event_id: 'evt_lag', event_type: 'order.paid', subscription_id: 'sub_gone', url: 'https://hooks.example/x', status: 'pending', attempts_made: 0, next_attempt_at: due, created_at: due - 1000, updated_at: due - 1000, queued_at: due - 1000, manual: 0 }],
      attempts: [],
    }]);
    // A shard past 500 KB.
    const big = 'x'.repeat(10_000);
    const batch = Array.from({ length: 80 }, (_, i) => ({
      event: { id: `evt_full_${i}`, event_type: 'bulk', payload: JSON.stringify({ big }), created_at: now - 1000 + i, request_id: `req_full_${i}` },
      deliveries: [], attempts: [],
    }));
    await importRecords(gw, { project: full, start_ms: today }, batch);
    const size = (await call(gw, { project: full, start_ms: today }, 'size')).bytes;
    assert.ok(size >= 500_000, `the shard holds ${size} bytes`);

    const worker = await gw.mf.getWorker();
    await worker.scheduled(MINUTE);
    await worker.scheduled(MINUTE);
    await worker.scheduled(MINUTE);

    // Stored once each, whatever the number of runs.
    const lag = await alertsOf(OPS, 'postguard.queue.lagging');
    assert.equal(lag.length, 1, 'one queue.lagging for the operator');
    const data = JSON.parse(lag[0].payload).data ?? JSON.parse(lag[0].payload);
    assert.equal(data.project, lagging);
    assert.equal(data.delivery_id, 'dlv_lag');
    assert.equal(data.threshold_s, 5);
    assert.ok(data.lag_s >= 60);
    assert.equal((await alertsOf(lagging, 'postguard.queue.lagging')).length, 0, "the queue is the operator's, not the project's");
    const hw = await alertsOf(full, 'postguard.storage.high_water');
    assert.equal(hw.length, 1, "one storage.high_water for the shard's project");
    const opsHw = await alertsOf(OPS, 'postguard.storage.high_water');
    assert.equal(opsHw.length, 1, 'and one copy for the operator');
    const hwData = JSON.parse(hw[0].payload).data ?? JSON.parse(hw[0].payload);
    assert.equal(hwData.store, 'webhook_shard');
    assert.equal(hwData.project, full);
    assert.ok(hwData.bytes >= 500_000);
    assert.equal(hwData.alert_bytes, 500_000);
    assert.equal(hwData.high_water_bytes, 50_000_000);

    // Delivered, signed, to the subscriptions of each audience.
    await rcv.waitFor(() => received(OPS, 'postguard.queue.lagging').length >= 1 && received(OPS, 'postguard.storage.high_water').length >= 1 && received(full, 'postguard.storage.high_water').length >= 1, { timeout: 30000, message: 'the alerts are delivered' });
    for (const r of [...received(OPS, 'postguard.queue.lagging'), ...received(full, 'postguard.storage.high_water')]) {
      assert.match(r.headers['webhook-signature'], /^v1,/, 'signed like every delivery');
    }
    assert.equal(received(lagging, 'postguard.queue.lagging').length, 0);
  });
});
