// A publish whose group commit fails (ADR 0027, CONTRACT §1 and §7): the real built worker under
// Miniflare with its real D1 and queue, a real local receiver. The fault is real: a SQLite trigger
// aborts every insert of the project's events, so the group's D1 transaction fails as a whole.
// The publish answers 503 STORAGE_UNAVAILABLE with Retry-After (not 500), nothing of it is stored,
// and once the fault is gone the retry of the same event id is stored and delivered exactly once.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, problem, poll, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';

const CONFIG = {
  webhooks: { schedule_s: [1], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 100000 } },
};

let origin;
let gw;
let db;
let rcv;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  db = await gw.mf.getD1Database('DB');
  rcv = await startReceiver({ behaviour: () => ({ status: 200, body: '{"ok":true}' }) });
});
after(async () => {
  await rcv?.close();
  await gw?.dispose();
  await origin?.kill();
});

const uniq = (p) => `${p}-${crypto.randomBytes(4).toString('hex')}`;
const show = (res) => `${res.status} ${res.text?.slice(0, 400)}`;
const count = async (sql, ...args) => (await db.prepare(sql).bind(...args).first()).n;

describe('a publish whose group commit fails', () => {
  it('answers 503 STORAGE_UNAVAILABLE with Retry-After, stores nothing, and the retry of its id is delivered once', async () => {
    const project = uniq('commit');
    const { key } = await gw.createKey({ project, plan: 'big' });
    const sub = await gw.admin('POST', '/_postguard/v1/webhooks', { url: `${rcv.url}/${project}`, events: ['*'] }, { token: key });
    assert.equal(sub.status, 201, show(sub));
    const trigger = `fail_${project.replace(/-/g, '_')}`;
    await db.exec(`CREATE TRIGGER ${trigger} BEFORE INSERT ON events WHEN NEW.project = '${project}' BEGIN SELECT RAISE(ABORT, 'injected fault'); END`);
    const publish = () => gw.admin('POST', '/_postguard/v1/events', { project, type: 'order.paid', data: { n: 1 }, id: 'evt_commit_1' }, { token: ORIGIN_TOKEN });

    const failed = await publish();
    const p = problem(failed, { status: 503, code: 'STORAGE_UNAVAILABLE' });
    assert.equal(failed.headers['retry-after'], '1', `Retry-After: ${failed.headers['retry-after']}`);
    assert.ok(!/injected|trigger|INSERT/i.test(p.detail), `the cause is logged, not shown: ${p.detail}`);
    // The transaction failed as a whole: no event, delivery, outbox row or counter of it.
    assert.equal(await count('SELECT COUNT(*) AS n FROM events WHERE project = ?', project), 0);
    assert.equal(await count('SELECT COUNT(*) AS n FROM deliveries WHERE project = ?', project), 0);
    assert.equal(await count('SELECT COUNT(*) AS n FROM outbox WHERE project = ?', project), 0);
    assert.equal(await count('SELECT COUNT(*) AS n FROM webhook_usage WHERE project = ?', project), 0);
    assert.equal(rcv.forEvent('evt_commit_1').length, 0);

    // The fault is gone: the origin's retry of the same id is stored once; a second retry is a no-op.
    await db.exec(`DROP TRIGGER ${trigger}`);
    const retried = await publish();
    assert.equal(retried.status, 202, show(retried));
    assert.equal(retried.json.id, 'evt_commit_1');
    const again = await publish();
    assert.equal(again.status, 202, show(again));
    await poll(async () => (await db.prepare("SELECT status FROM deliveries WHERE project = ? AND event_id = 'evt_commit_1'").bind(project).first())?.status === 'delivered', { timeout: 30000, message: 'the retried event delivered' });
    assert.equal(await count('SELECT COUNT(*) AS n FROM events WHERE project = ?', project), 1);
    assert.equal(await count('SELECT COUNT(*) AS n FROM deliveries WHERE project = ?', project), 1);
    assert.equal(await count("SELECT attempts_made AS n FROM deliveries WHERE project = ? AND event_id = 'evt_commit_1'", project), 1);
    assert.equal(await count('SELECT events AS n FROM webhook_usage WHERE project = ?', project), 1, 'counted once');
    const arrived = rcv.forEvent('evt_commit_1');
    assert.equal(arrived.length, 1, `one arrival: ${arrived.map((r) => r.attempt).join(', ')}`);
    assert.equal(arrived[0].attempt, 1);
    assert.equal(arrived[0].json.id, 'evt_commit_1');
  });
});
