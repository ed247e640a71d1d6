// A publish whose group commit fails (ADR 0027, docs/errors.md, docs/webhooks.md): the real built worker under
// Miniflare with its real D1, Durable Objects and queue, a real local receiver. The fault is
// real: the event insert inside the shard's transaction throws (tests/support/injected-faults.mjs
// hands the webhook shards a SQL handle that fails it; ADR 0035), so the shard's transaction
// rolls back as a whole. The publish answers 503 STORAGE_UNAVAILABLE with Retry-After (not 500),
// nothing of it is stored, and once the fault is gone the retry of the same event id is stored
// and delivered exactly once.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, problem, poll, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';
import { prepareFaultyRoot } from './support/injected-faults.mjs';
import { projectRecords } from './support/webhook-shards.mjs';

const CONFIG = {
  webhooks: { schedule_s: [1], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 100000 } },
};

let origin;
let gw;
let rcv;

before(async () => {
  process.env.POSTGUARD_ROOT = prepareFaultyRoot(); // this file's process only
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  rcv = await startReceiver({ behaviour: () => ({ status: 200, body: '{"ok":true}' }) });
});
after(async () => {
  await rcv?.close();
  await gw?.dispose();
  await origin?.kill();
});

const uniq = (p) => `${p}-${crypto.randomBytes(4).toString('hex')}`;
const show = (res) => `${res.status} ${res.text?.slice(0, 400)}`;
const records = (project) => projectRecords(gw, project);

describe('a publish whose group commit fails', () => {
  it('answers 503 STORAGE_UNAVAILABLE with Retry-After, stores nothing, and the retry of its id is delivered once', async () => {
    const project = uniq('commit');
    const { key } = await gw.createKey({ project, plan: 'big' });
    const sub = await gw.admin('POST', '/_postguard/v1/webhooks', { url: `${rcv.url}/${project}`, events: ['*'] }, { token: key });
    assert.equal(sub.status, 201, show(sub));
    await gw.fetch('/__sql/fail-publish?n=1');
    const publish = () => gw.admin('POST', '/_postguard/v1/events', { project, type: 'order.paid', data: { n: 1 }, id: 'evt_commit_1' }, { token: ORIGIN_TOKEN });

    const failed = await publish();
    const p = problem(failed, { status: 503, code: 'STORAGE_UNAVAILABLE' });
    assert.equal(failed.headers['retry-after'], '1', `Retry-After: ${failed.headers['retry-after']}`);
    assert.ok(!/injected|trigger|INSERT/i.test(p.detail), `the cause is logged, not shown: ${p.detail}`);
    // The transaction failed as a whole: no event, delivery, outbox row or counter of it.
    const none = await records(project);
    assert.equal(none.events.length, 0);
    assert.equal(none.deliveries.length, 0);
    assert.equal(none.deliveries.filter((d) => d.queued_at === null).length, 0);
    assert.equal(none.usage.length, 0);
    assert.equal(rcv.forEvent('evt_commit_1').length, 0);

    // The fault is gone (it failed one insert): the origin's retry of the same id is stored
    // once; a second retry is a no-op.
    const retried = await publish();
    assert.equal(retried.status, 202, show(retried));
    assert.equal(retried.json.id, 'evt_commit_1');
    const again = await publish();
    assert.equal(again.status, 202, show(again));
    await poll(async () => (await records(project)).deliveries.find((d) => d.event_id === 'evt_commit_1')?.status === 'delivered', { timeout: 30000, message: 'the retried event delivered' });
    const stored = await records(project);
    assert.equal(stored.events.length, 1);
    assert.equal(stored.deliveries.length, 1);
    assert.equal(stored.deliveries[0].attempts_made, 1);
    assert.equal(stored.usage.reduce((n, u) => n + u.events, 0), 1, 'counted once');
    const arrived = rcv.forEvent('evt_commit_1');
    assert.equal(arrived.length, 1, `one arrival: ${arrived.map((r) => r.attempt).join(', ')}`);
    assert.equal(arrived[0].attempt, 1);
    assert.equal(arrived[0].json.id, 'evt_commit_1');
  });
});
