// Webhook records in per-project shards (issue 24, ADR 0035), end to end: the real built worker
// under Miniflare with its real D1, Durable Objects and queues, publishing to real local
// receivers.
//   - deliveries of the deployment before the shards (legacy D1 rows, and their queue messages
//     without a project) keep their ids and are delivered, retried and listed after the switch;
//   - two projects publishing at once never see each other's rows;
//   - 10,000 deliveries over at least 3 shards page through the log and the feed (both orders)
//     without a gap or a repeat;
//   - one project's full shard refuses only that project's publishes;
//   - throttled deliveries never exceed the rate within any one-second span (§11);
//   - retention drops whole shards and their directory rows.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { receiverPool } from './support/receiver.mjs';
import { startGateway, problem, poll, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';
import { directory, dump, importRecords, projectRecords } from './support/webhook-shards.mjs';
import { uniq, show } from './support/util.mjs';

const DAY_MS = 86_400_000;
const BASE = {
  webhooks: { schedule_s: [1, 1], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'], requeue_after_s: 1 },
  plans: { big: { requests_per_window: 1_000_000 } },
};

let origin;
let gw;
const receiver = receiverPool();

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(BASE) } });
});
after(async () => {
  await receiver.closeAll();
  await gw?.dispose();
  await origin?.kill();
});

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
/** `prefix` + a ULID of time `t`, as the gateway before the shards minted its ids. */
function ulid(prefix, t) {
  let time = '';
  for (let i = 0, x = t; i < 10; i++, x = Math.floor(x / 32)) time = CROCKFORD[x % 32] + time;
  const rnd = Array.from(crypto.randomBytes(16), (b) => CROCKFORD[b % 32]).join('');
  return prefix + time + rnd;
}

async function project(g, tag, rcv, subs = 1, extra = {}) {
  const name = uniq(tag);
  const { key } = await g.createKey({ project: name, plan: 'big' });
  const api = (method, p, body) => g.admin(method, p, body, { token: key });
  const ids = [];
  for (let i = 0; i < subs; i++) {
    const res = await api('POST', '/_postguard/v1/webhooks', { url: `${rcv.url}/${name}/${i}`, events: ['*'], ...extra });
    assert.equal(res.status, 201, show(res));
    rcv.addSecret(res.json.secret);
    ids.push(res.json.id);
  }
  const publish = async (type, data = {}, id) => {
    const res = await g.admin('POST', '/_postguard/v1/events', { project: name, type, data, ...(id ? { id } : {}) }, { token: ORIGIN_TOKEN });
    assert.equal(res.status, 202, show(res));
    return res.json.id;
  };
  return { name, key, api, subs: ids, publish };
}

/** Every page of a list endpoint, following next_cursor. */
async function pages(api, path) {
  const rows = [];
  let cursor;
  let n = 0;
  for (;;) {
    const sep = path.includes('?') ? '&' : '?';
    const res = await api('GET', `${path}${cursor ? `${sep}cursor=${encodeURIComponent(cursor)}` : ''}`);
    assert.equal(res.status, 200, show(res));
    rows.push(...res.json.data);
    n += 1;
    if (!res.json.next_cursor) return { rows, pages: n };
    cursor = res.json.next_cursor;
  }
}

describe('deliveries from before the shards', () => {
  it('legacy D1 rows keep their ids: a scheduled one is delivered, a dead letter is retried, a lost one is re-queued, all listed', async () => {
    const rcv = await receiver(() => ({ status: 200, body: 'ok' }));
    const p = await project(gw, 'legacy', rcv);
    const db = await gw.mf.getD1Database('DB');
    const now = Date.now();
    const t0 = now - 60_000;
    // What the deployment before the shards left in D1: three events, each with one delivery
    // (pending with its message on the way, dead-lettered, and pending whose message was lost).
    const rows = [
      { ev: 'evt_legacy_scheduled', dlv: ulid('dlv_', t0), status: 'pending', next: now, attempts: 0 },
      { ev: 'evt_legacy_dead', dlv: ulid('dlv_', t0 + 1), status: 'dead_letter', next: null, attempts: 3 },
      { ev: 'evt_legacy_lost', dlv: ulid('dlv_', t0 + 2), status: 'failed', next: now - 3_600_000, attempts: 1 },
    ];
    const stmts = [];
    for (const [i, r] of rows.entries()) {
      const t = t0 + i;
      const payload = JSON.stringify({ id: r.ev, type: 'legacy.test', timestamp: new Date(t).toISOString(), data: { i } });
      stmts.push(
        db.prepare('INSERT INTO events (project, id, type, payload, created_at) VALUES (?, ?, ?, ?, ?)').bind(p.name, r.ev, 'legacy.test', payload, t),
        db.prepare('INSERT INTO event_requests (project, event_id, request_id) VALUES (?, ?, ?)').bind(p.name, r.ev, `req_legacy_${i}`),
        db.prepare('INSERT INTO deliveries (id, project, event_id, event_type, subscription_id, url, status, attempts_made, next_attempt_at, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)')
          .bind(r.dlv, p.name, r.ev, 'legacy.test', p.subs[0], `${rcv.url}/${p.name}/0`, r.status, r.attempts, r.next, t, t),
        db.prepare('INSERT INTO outbox (delivery_id, project, event_id, created_at, enqueued_at) VALUES (?, ?, ?, ?, ?)').bind(r.dlv, p.name, r.ev, t, t),
      );
    }
    await db.batch(stmts);
    // The log lists them before anything moved (D1 read as the oldest source).
    const listed = await p.api('GET', '/_postguard/v1/deliveries');
    assert.deepEqual(listed.json.data.map((d) => d.id).sort(), rows.map((r) => r.dlv).sort());
    assert.equal(listed.json.data.find((d) => d.id === rows[0].dlv).request_id, 'req_legacy_0');
    const feed = await p.api('GET', '/_postguard/v1/events');
    assert.deepEqual(feed.json.data.map((e) => e.id).sort(), rows.map((r) => r.ev).sort());

    // (1) The scheduled one: its message, as the previous deployment wrote it (no project).
    const worker = await gw.mf.getWorker();
    await worker.queue('postguard-deliveries', [{ id: crypto.randomUUID(), timestamp: new Date(), attempts: 1, body: { delivery_id: rows[0].dlv, not_before: now } }]);
    await rcv.waitFor((rs) => rs.some((r) => r.json?.id === rows[0].ev), { timeout: 30000, message: 'the scheduled legacy delivery' });
    const d0 = await poll(async () => {
      const r = (await p.api('GET', `/_postguard/v1/deliveries/${rows[0].dlv}`)).json;
      return r?.status === 'delivered' && r;
    }, { timeout: 30000, message: 'delivered under its own id' });
    assert.equal(d0.id, rows[0].dlv);
    assert.equal(d0.request_id, 'req_legacy_0', 'the trace moved with it');
    assert.equal(d0.attempts.at(-1).attempt, 1);

    // (2) The dead letter: a manual retry through the API, attempt 4.
    const retried = await p.api('POST', `/_postguard/v1/deliveries/${rows[1].dlv}/retry`);
    assert.equal(retried.status, 202, show(retried));
    const d1 = await poll(async () => {
      const r = (await p.api('GET', `/_postguard/v1/deliveries/${rows[1].dlv}`)).json;
      return r?.status === 'delivered' && r;
    }, { timeout: 30000, message: 'the dead letter delivered by its retry' });
    assert.equal(d1.attempts_made, 4);

    // (3) The lost one: the daily job moves it into its shard and re-queues it.
    await worker.scheduled({ cron: '17 3 * * *' });
    await rcv.waitFor((rs) => rs.some((r) => r.json?.id === rows[2].ev), { timeout: 30000, message: 'the lost legacy delivery re-queued' });
    await poll(async () => (await p.api('GET', `/_postguard/v1/deliveries/${rows[2].dlv}`)).json?.status === 'delivered', { timeout: 30000, message: 'delivered' });

    // Everything now lives in the shards, under the same ids, and D1 holds none of it.
    const recs = await projectRecords(gw, p.name);
    assert.deepEqual(recs.deliveries.map((d) => d.id).sort(), rows.map((r) => r.dlv).sort());
    const left = await db.prepare('SELECT COUNT(*) AS n FROM deliveries WHERE project = ?').bind(p.name).first();
    assert.equal(left.n, 0);
    const all = await pages(p.api, '/_postguard/v1/deliveries?limit=2');
    assert.deepEqual(all.rows.map((d) => d.id).sort(), rows.map((r) => r.dlv).sort());
    assert.ok(all.rows.every((d) => d.status === 'delivered'));
  });
});

describe('isolation', () => {
  it('two projects publishing at once never see each other\'s rows', async () => {
    const rcv = await receiver(() => ({ status: 200, body: 'ok' }));
    const a = await project(gw, 'iso-a', rcv);
    const b = await project(gw, 'iso-b', rcv);
    const N = 60;
    const [ea, eb] = await Promise.all([a, b].map((p) => Promise.all(Array.from({ length: N }, (_, i) => p.publish('iso.tick', { i })))));
    await rcv.waitFor((rs) => rs.length >= 2 * N, { timeout: 60000, message: 'every delivery' });
    for (const [p, mine, theirs] of [[a, ea, eb], [b, eb, ea]]) {
      const log = (await pages(p.api, '/_postguard/v1/deliveries?limit=25')).rows;
      assert.deepEqual(new Set(log.map((d) => d.event_id)), new Set(mine));
      assert.ok(log.every((d) => p.subs.includes(d.subscription_id)));
      const feed = (await pages(p.api, '/_postguard/v1/events?limit=25')).rows;
      assert.deepEqual(new Set(feed.map((e) => e.id)), new Set(mine));
      assert.ok(!feed.some((e) => theirs.includes(e.id)));
      // Another project's delivery id is not found under this key.
      const other = (await projectRecords(gw, p === a ? b.name : a.name)).deliveries[0];
      const res = await p.api('GET', `/_postguard/v1/deliveries/${other.id}`);
      problem(res, { status: 404, code: 'NOT_FOUND' });
      // Each project's records are in its own shards.
      const recs = await projectRecords(gw, p.name);
      assert.deepEqual(new Set(recs.events.map((e) => e.id)), new Set(mine));
      assert.ok(recs.shards.every((s) => s.project === p.name));
    }
  });
});

describe('paging across shards', () => {
  it('10,000 deliveries over at least 3 shards page through the log and the feed without a gap or a repeat', async () => {
    // One-second shards: a publish burst of a few seconds spans several.
    const g = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ ...BASE, webhooks: { ...BASE.webhooks, shard_bucket_ms: 1000 } }) } });
    try {
      const rcv = await receiver(() => ({ status: 200, body: 'ok' }));
      const p = await project(g, 'pages', rcv, 5);
      const EVENTS = 2000;
      let next = 0;
      const ids = [];
      const publisher = async () => {
        while (next < EVENTS) {
          const i = next++;
          ids.push(await p.publish(i % 2 ? 'page.odd' : 'page.even', { i }));
        }
      };
      await Promise.all(Array.from({ length: 16 }, publisher));
      const shards = await directory(g, p.name);
      assert.ok(shards.length >= 3, `${shards.length} shards`);
      await rcv.waitFor((rs) => rs.length >= EVENTS * 5, { timeout: 120000, message: '10,000 deliveries' });

      const log = await pages(p.api, '/_postguard/v1/deliveries?limit=200');
      assert.equal(log.rows.length, EVENTS * 5, 'every delivery once');
      assert.equal(new Set(log.rows.map((d) => d.id)).size, EVENTS * 5, 'no repeat');
      for (let i = 1; i < log.rows.length; i++) {
        const [x, y] = [log.rows[i - 1], log.rows[i]];
        assert.ok(x.created_at > y.created_at || (x.created_at === y.created_at && x.id > y.id), `newest first at ${i}`);
      }
      assert.deepEqual(new Set(log.rows.map((d) => d.event_id)), new Set(ids));
      // A filter pages the same way.
      const odd = await pages(p.api, '/_postguard/v1/deliveries?limit=200&event_type=page.odd');
      assert.equal(odd.rows.length, EVENTS * 5 / 2);
      assert.ok(odd.rows.every((d) => d.event_type === 'page.odd'));

      for (const order of ['desc', 'asc']) {
        const feed = await pages(p.api, `/_postguard/v1/events?limit=200&order=${order}`);
        assert.equal(feed.rows.length, EVENTS, `${order}: every event once`);
        assert.equal(new Set(feed.rows.map((e) => e.id)).size, EVENTS, `${order}: no repeat`);
        assert.deepEqual(new Set(feed.rows.map((e) => e.id)), new Set(ids));
        assert.ok(feed.rows.every((e) => e.deliveries.total === 5));
      }
    } finally {
      await g.dispose();
    }
  });
});

describe('a full shard', () => {
  it('refuses only its own project\'s publishes (503 STORAGE_FULL with Retry-After); another project publishes on', async () => {
    const g = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ ...BASE, webhooks: { ...BASE.webhooks, shard_high_water_bytes: 400_000 } }) } });
    try {
      const rcv = await receiver(() => ({ status: 200, body: 'ok' }));
      const a = await project(g, 'full-a', rcv);
      const b = await project(g, 'full-b', rcv);
      const big = { blob: 'x'.repeat(30_000) };
      let refused;
      for (let i = 0; i < 40 && !refused; i++) {
        const res = await g.admin('POST', '/_postguard/v1/events', { project: a.name, type: 'full.big', data: big, id: `evt_big_${i}` }, { token: ORIGIN_TOKEN });
        if (res.status !== 202) refused = res;
      }
      assert.ok(refused, 'the shard filled up within 40 publishes of 30 KB');
      const pb = problem(refused, { status: 503, code: 'STORAGE_FULL' });
      assert.ok(Number(refused.headers['retry-after']) >= 1, `Retry-After: ${refused.headers['retry-after']}`);
      assert.match(pb.detail, new RegExp(a.name));
      // Another project: accepted and delivered.
      const id = await b.publish('full.small', { ok: true });
      await rcv.waitFor((rs) => rs.some((r) => r.json?.id === id), { message: "the other project's event delivered" });
      // The full project's stored events are still listed and delivered; its log reads.
      const shard = (await directory(g, a.name))[0];
      const stored = (await dump(g, shard)).events.length;
      assert.ok(stored >= 1);
      assert.equal((await a.api('GET', '/_postguard/v1/events?limit=200')).json.data.length, stored);
    } finally {
      await g.dispose();
    }
  });
});

describe('throttle', () => {
  it('rate_limit_per_s 5: no one-second span holds more than 5 deliveries', async () => {
    const rcv = await receiver(() => ({ status: 200, body: 'ok' }));
    const p = await project(gw, 'span', rcv, 1, { rate_limit_per_s: 5 });
    await Promise.all(Array.from({ length: 30 }, (_, i) => p.publish('span.tick', { i })));
    await rcv.waitFor((rs) => rs.length >= 30, { timeout: 60000, message: '30 throttled deliveries' });
    const at = rcv.requests.map((r) => r.at).sort((x, y) => x - y);
    for (let i = 5; i < at.length; i++) {
      assert.ok(at[i] - at[i - 5] > 1000, `deliveries ${i - 5}..${i} arrived within ${at[i] - at[i - 5]} ms`);
    }
  });
});

describe('retention', () => {
  it('drops whole shards past retention.deliveries_days, with their directory rows; the young ones stay', async () => {
    const rcv = await receiver(() => ({ status: 200, body: 'ok' }));
    const p = await project(gw, 'drop', rcv);
    const young = await p.publish('drop.young');
    const start = Math.floor((Date.now() - 20 * DAY_MS) / DAY_MS) * DAY_MS;
    const old = { project: p.name, start_ms: start };
    await importRecords(gw, old, [{
      event: { id: 'evt_old', event_type: 'drop.old', payload: '{}', created_at: start + 5, request_id: 'req_old' },
      deliveries: [{ id: 'dlv_old', event_id: 'evt_old', event_type: 'drop.old', subscription_id: p.subs[0], url: rcv.url, status: 'delivered', attempts_made: 1, next_attempt_at: null, created_at: start + 5, updated_at: start + 5, queued_at: start + 5, manual: 0 }],
      attempts: [],
    }]);
    assert.equal((await directory(gw, p.name)).length, 2);
    assert.equal((await p.api('GET', '/_postguard/v1/events')).json.data.length, 2);
    await (await gw.mf.getWorker()).scheduled({ cron: '17 3 * * *' });
    const left = await directory(gw, p.name);
    assert.equal(left.length, 1, 'the old shard left the directory');
    assert.ok(left[0].start_ms > start);
    assert.equal((await dump(gw, old)).events.length, 0, "the old shard's storage is gone");
    const feed = (await p.api('GET', '/_postguard/v1/events')).json.data;
    assert.deepEqual(feed.map((e) => e.id), [young]);
  });
});
