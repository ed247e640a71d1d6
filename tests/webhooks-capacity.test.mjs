// The webhook records' D1 bound (issue 16, ADR 0017) end to end: the real built worker under
// Miniflare with its real D1 and queues, publishing to real local receivers. A test configuration
// with tiny quotas: the daily event / delivery quota (429 EVENT_QUOTA_EXCEEDED with Retry-After at
// the next UTC day), per-project isolation, the counter keyed by UTC day and swept by retention,
// the size guard (503 STORAGE_FULL at the high-water mark, publishing again once space is freed),
// and the manual-attempt bound (409 RETRY_LIMIT_REACHED, also under racing requests).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, problem, poll, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';
import { projectRecords, usage as shardUsage, rewriteUsage, invalidateCopy } from './support/webhook-shards.mjs';
import { uniq, show } from './support/util.mjs';

const DAY_MS = 86_400_000;
const HIGH_WATER = 2 << 20; // 2 MiB: a fresh database is far below it
const CONFIG = {
  webhooks: {
    schedule_s: [1], timeout_ms: 1000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'],
    events_per_project_per_day: 3,
    deliveries_per_project_per_day: 4,
    manual_attempts_per_delivery: 2,
    d1_high_water_bytes: HIGH_WATER,
    // The bytes quota this file was written for (the default rose with issue 24, ADR 0035).
    bytes_per_project_per_day: 64 * 2 ** 20,
  },
  plans: { big: { requests_per_window: 100000 } },
  origin: { timeout_ms: 1000 },
  idempotency: { lease_s: 3 },
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

const api = (method, p, token, body) => gw.admin(method, p, body, { token });

async function project(tag, subscriptions = 1) {
  const name = uniq(`cap-${tag}`);
  const { key } = await gw.createKey({ project: name, plan: 'big' });
  for (let i = 0; i < subscriptions; i++) {
    const res = await api('POST', '/_postguard/v1/webhooks', key, { url: `${rcv.url}/${name}/${i}`, events: ['*'] });
    assert.equal(res.status, 201, show(res));
  }
  return { name, key };
}

const publishRaw = (name, id, data = { n: 1 }) => api('POST', '/_postguard/v1/events', ORIGIN_TOKEN, { project: name, type: 'order.paid', data, id });

async function publish(name, id) {
  const res = await publishRaw(name, id);
  assert.equal(res.status, 202, `publish ${id} → ${show(res)}`);
  return res.json.id;
}

/**
 * A project's day counters: what its shards counted (ADR 0035) with what D1 charged the same
 * day outside them (inspectors and captures), per UTC day; days with nothing left are omitted.
 */
async function usage(name) {
  const byDay = new Map((await shardUsage(gw, name)).map((u) => [u.day, u]));
  const d1 = (await db.prepare('SELECT day, events, deliveries, bytes FROM webhook_usage WHERE project = ? ORDER BY day').bind(name).all()).results;
  for (const u of d1) {
    const t = byDay.get(u.day) ?? { day: u.day, events: 0, deliveries: 0, bytes: 0 };
    t.events += u.events; t.deliveries += u.deliveries; t.bytes += u.bytes;
    byDay.set(u.day, t);
  }
  return [...byDay.values()].filter((u) => u.events || u.deliveries || u.bytes).sort((a, b) => a.day - b.day);
}

/** The stored events of a project, all its shards (ADR 0035). */
const storedEvents = async (name) => (await projectRecords(gw, name)).events;

/** Retry-After of a refusal: whole seconds to `at` (epoch ms), within the request's own duration. */
function assertRetryAfter(res, at) {
  const ra = Number(res.headers['retry-after']);
  assert.ok(Number.isInteger(ra) && ra >= 1, `Retry-After is whole seconds: ${res.headers['retry-after']}`);
  const lo = Math.floor((at - res.at) / 1000);
  const hi = Math.ceil((at - res.sentAt) / 1000) + 1;
  assert.ok(ra >= lo && ra <= hi, `Retry-After ${ra} s points at ${new Date(at).toISOString()} (expected ${lo}..${hi})`);
}

const nextUtcDay = (t) => (Math.floor(t / DAY_MS) + 1) * DAY_MS;
function nextSweep(t) {
  const today = Math.floor(t / DAY_MS) * DAY_MS + (3 * 60 + 17) * 60_000;
  return today > t ? today : today + DAY_MS;
}

describe('the daily quota per project', () => {
  it('the event past the quota → 429 EVENT_QUOTA_EXCEEDED with Retry-After at the next UTC day; a duplicate id is not counted', async () => {
    const a = await project('events');
    await publish(a.name, 'evt_q1');
    await publish(a.name, 'evt_q1'); // the same id again: a no-op, not a new event
    await publish(a.name, 'evt_q2');
    await publish(a.name, 'evt_q3');
    const res = await publishRaw(a.name, 'evt_q4');
    const p = problem(res, { status: 429, code: 'EVENT_QUOTA_EXCEEDED' });
    assert.match(p.detail, /3 events/);
    assertRetryAfter(res, nextUtcDay(res.sentAt));
    const [row] = await usage(a.name);
    assert.equal(row.day, Math.floor(res.sentAt / DAY_MS), 'the counter is keyed by the UTC day');
    assert.equal(row.events, 3);
    assert.equal(row.deliveries, 3, 'one delivery per event (one subscription)');
    // Charged (webhooks::capacity::event_bytes): payload + 787 B per event, and per delivery
    // 727 B + every automatic attempt (schedule_s [1]: 2) at the largest attempt row, 755 B,
    // and the most its kept headers take, 360 B.
    const payloads = (await storedEvents(a.name)).reduce((n, e) => n + Buffer.byteLength(e.payload), 0);
    assert.equal(row.bytes, payloads + 3 * 787 + 3 * (727 + 2 * (755 + 360)), 'bytes charged: the payloads, the rows, the attempts at their largest');
    // Nothing of the refused event was stored.
    assert.equal((await storedEvents(a.name)).filter((e) => e.id === 'evt_q4').length, 0);
    // The already stored ids still answer 202 (a retry of a publish is never refused).
    await publish(a.name, 'evt_q2');
  });

  it('another project still publishes while one is over its quota', async () => {
    const a = await project('full');
    const b = await project('other');
    for (const id of ['evt_1', 'evt_2', 'evt_3']) await publish(a.name, id);
    problem(await publishRaw(a.name, 'evt_4'), { status: 429, code: 'EVENT_QUOTA_EXCEEDED' });
    const id = await publish(b.name, 'evt_1');
    await poll(() => rcv.requests.some((r) => r.path === `/${b.name}/0` && r.json?.id === id), { message: 'b\'s event delivered' });
  });

  it('the deliveries quota counts the fan-out', async () => {
    const c = await project('fanout', 2);
    await publish(c.name, 'evt_f1');
    await publish(c.name, 'evt_f2');
    const p = problem(await publishRaw(c.name, 'evt_f3'), { status: 429, code: 'EVENT_QUOTA_EXCEEDED' });
    assert.match(p.detail, /4 deliveries/);
    const [row] = await usage(c.name);
    assert.deepEqual([row.events, row.deliveries], [2, 4]);
  });

  it('yesterday\'s counter does not count today; the daily job drops counters past the retention', async () => {
    const a = await project('reset');
    for (const id of ['evt_1', 'evt_2', 'evt_3']) await publish(a.name, id);
    problem(await publishRaw(a.name, 'evt_4'), { status: 429, code: 'EVENT_QUOTA_EXCEEDED' });
    // The same counts, one UTC day earlier: today starts from zero.
    await rewriteUsage(gw, a.name, (u) => ({ ...u, day: u.day - 1 }));
    await publish(a.name, 'evt_4');
    const rows = await usage(a.name);
    assert.deepEqual(rows.map((r) => r.events), [3, 1], 'yesterday kept, today counted anew');
    // Retention (14 days): a counter 15 days old goes, yesterday's stays.
    await rewriteUsage(gw, a.name, (u) => (u.events === 3 ? { ...u, day: u.day - 14 } : u));
    await (await gw.mf.getWorker()).scheduled({ cron: '17 3 * * *' });
    assert.deepEqual((await usage(a.name)).map((r) => r.events), [1]);
  });
});

describe('the bytes quota', () => {
  it('an inspector is charged, its captures are not (they have a budget of their own); at the bytes quota publish and inspectors → 429', async () => {
    const a = await project('bytes');
    await publish(a.name, 'evt_b1');
    const before = (await usage(a.name))[0].bytes;
    const created = await api('POST', '/_postguard/v1/inspectors', a.key);
    assert.equal(created.status, 201, show(created));
    assert.equal((await usage(a.name))[0].bytes, before + 250, 'an inspector is charged 250 B');
    const body = JSON.stringify({ hello: 'x'.repeat(1000) });
    const captured = await gw.fetch(new URL(created.json.url).pathname, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    assert.equal(captured.status, 200, show(captured));
    assert.equal((await usage(a.name))[0].bytes, before + 250, 'a capture costs the project nothing (issue 23: a sender cannot spend its quota)');
    // The project's bytes quota used up (64 MiB by default): what the project stores is refused,
    // and a sender may still post to its capture URL (within the URL's own budget).
    await db.prepare('UPDATE webhook_usage SET bytes = ? WHERE project = ?').bind(64 * 2 ** 20, a.name).run();
    await invalidateCopy(gw, a.name); // written behind the gateway's back: its copy is told, as by its own writes
    const p = problem(await publishRaw(a.name, 'evt_b2'), { status: 429, code: 'EVENT_QUOTA_EXCEEDED' });
    assert.match(p.detail, /67108864 bytes/);
    problem(await api('POST', '/_postguard/v1/inspectors', a.key), { status: 429, code: 'EVENT_QUOTA_EXCEEDED' });
    assert.equal((await gw.fetch(new URL(created.json.url).pathname, { method: 'POST', body: '{}' })).status, 200);
  });

  it('an inspector is not refused for the events quota alone', async () => {
    const a = await project('insp-events');
    for (const id of ['evt_1', 'evt_2', 'evt_3']) await publish(a.name, id);
    problem(await publishRaw(a.name, 'evt_4'), { status: 429, code: 'EVENT_QUOTA_EXCEEDED' });
    assert.equal((await api('POST', '/_postguard/v1/inspectors', a.key)).status, 201);
  });
});

describe('manual attempts per delivery', () => {
  async function deliveredOnce(tag) {
    const p = await project(tag);
    const evt = await publish(p.name, uniq('evt'));
    const row = await poll(async () => {
      const res = await api('GET', '/_postguard/v1/deliveries', p.key);
      const d = res.json?.data?.find((x) => x.event_id === evt);
      return d && d.status === 'delivered' ? d : false;
    }, { message: 'delivered' });
    return { p, row };
  }

  it('retries and redirects up to the bound → 202; the next one → 409 RETRY_LIMIT_REACHED, nothing queued', async () => {
    const { p, row } = await deliveredOnce('manual');
    assert.equal((await api('POST', `/_postguard/v1/deliveries/${row.id}/redirect`, p.key, { url: `${rcv.url}/elsewhere` })).status, 202);
    assert.equal((await api('POST', `/_postguard/v1/deliveries/${row.id}/retry`, p.key)).status, 202);
    const res = await api('POST', `/_postguard/v1/deliveries/${row.id}/retry`, p.key);
    const pb = problem(res, { status: 409, code: 'RETRY_LIMIT_REACHED' });
    assert.match(pb.detail, /2 manual attempts/);
    problem(await api('POST', `/_postguard/v1/deliveries/${row.id}/redirect`, p.key, { url: `${rcv.url}/elsewhere` }), { status: 409, code: 'RETRY_LIMIT_REACHED' });
    // The redirect ran (a delivered delivery's retry sends nothing); attempts stay bounded.
    const d = await poll(async () => {
      const r = await api('GET', `/_postguard/v1/deliveries/${row.id}`, p.key);
      return r.json?.attempts?.length === 2 ? r.json : false;
    }, { message: 'the redirect recorded' });
    assert.equal(d.attempts_made, 2);
  });

  it('recover re-sends are manual attempts too: past the bound a delivery is skipped and counted failed', async () => {
    const bad = await startReceiver({ behaviour: () => ({ status: 400, body: 'no' }) });
    try {
      const p = await project('recover', 0);
      const sub = await api('POST', '/_postguard/v1/webhooks', p.key, { url: `${bad.url}/in`, events: ['*'] });
      assert.equal(sub.status, 201, show(sub));
      const since = Date.now() - 1000;
      const evt = await publish(p.name, uniq('evt'));
      const deliveryOf = async () => (await api('GET', '/_postguard/v1/deliveries', p.key)).json?.data?.find((x) => x.event_id === evt);
      const row = await poll(async () => ((await deliveryOf())?.status === 'dead_letter' ? deliveryOf() : false), { message: 'dead letter (400)' });
      const recover = async () => {
        const started = await api('POST', `/_postguard/v1/webhooks/${sub.json.id}/recover`, p.key, { since: new Date(since).toISOString() });
        assert.equal(started.status, 202, show(started));
        return poll(async () => {
          const t = (await api('GET', `/_postguard/v1/tasks/${started.json.id}`, p.key)).json;
          return t?.state === 'done' ? t : false;
        }, { message: 'the task done' });
      };
      const attempts = (n) => poll(async () => {
        const d = (await api('GET', `/_postguard/v1/deliveries/${row.id}`, p.key)).json;
        return d?.attempts?.length === n ? d : false;
      }, { message: `${n} attempts` });
      for (const n of [2, 3]) {
        const t = await recover();
        assert.deepEqual([t.total, t.done, t.failed], [1, 1, 0], JSON.stringify(t));
        await attempts(n);
      }
      const t = await recover();
      assert.deepEqual([t.total, t.done, t.failed], [1, 0, 1], `past the bound: skipped, counted failed ${JSON.stringify(t)}`);
      problem(await api('POST', `/_postguard/v1/deliveries/${row.id}/retry`, p.key), { status: 409, code: 'RETRY_LIMIT_REACHED' });
      assert.equal((await attempts(3)).attempts_made, 3);
    } finally {
      await bad.close();
    }
  });

  it('racing manual retries cannot pass the bound together', async () => {
    const { p, row } = await deliveredOnce('race');
    const results = await Promise.all(Array.from({ length: 6 }, () => api('POST', `/_postguard/v1/deliveries/${row.id}/retry`, p.key)));
    const statuses = results.map((r) => r.status).sort();
    assert.deepEqual(statuses, [202, 202, 409, 409, 409, 409], statuses.join(','));
    const claimed = (await projectRecords(gw, p.name)).deliveries.find((d) => d.id === row.id);
    assert.equal(claimed.manual, 2);
  });
});

describe('the size guard', () => {
  it('at the high-water mark publish → 503 STORAGE_FULL with Retry-After at the next sweep; publishing resumes once space is freed', async () => {
    const a = await project('size');
    await publish(a.name, 'evt_before');
    const size = async () => (await db.prepare('SELECT 1').run()).meta.size_after;
    assert.ok((await size()) < HIGH_WATER, `the test database starts below the mark (${await size()} bytes)`);
    await db.exec('CREATE TABLE IF NOT EXISTS test_filler (b BLOB)');
    await db.prepare('INSERT INTO test_filler VALUES (?)').bind(new Uint8Array(HIGH_WATER)).run();
    assert.ok((await size()) >= HIGH_WATER, 'the filler takes the database past the mark');
    await invalidateCopy(gw, a.name); // D1 grew behind the gateway's back: what its own writes do
    const res = await publishRaw(a.name, 'evt_full');
    const p = problem(res, { status: 503, code: 'STORAGE_FULL' });
    assert.match(p.detail, /full/);
    assertRetryAfter(res, nextSweep(res.sentAt));
    assert.equal((await storedEvents(a.name)).filter((e) => e.id === 'evt_full').length, 0, 'nothing stored');
    // Another project is refused alike (the guard is global), and the delivery log still reads.
    const b = await project('size-b');
    problem(await publishRaw(b.name, 'evt_x'), { status: 503, code: 'STORAGE_FULL' });
    assert.equal((await api('GET', '/_postguard/v1/deliveries', a.key)).status, 200);
    // Freed space (what the retention sweep does): the next publish is accepted.
    await db.exec('DROP TABLE test_filler');
    assert.ok((await size()) < HIGH_WATER, `space freed (${await size()} bytes)`);
    await publish(a.name, 'evt_full');
  });
});

describe('retention', () => {
  it('the daily job deletes every delivery-path row past the retention, in chunks, and keeps the young ones', async () => {
    const name = uniq('cap-retention');
    const old = Date.now() - 20 * DAY_MS;
    const young = Date.now() - 1000;
    const N = 2_500; // more than one sweep round (1,000 deliveries)
    const series = (sql) => db.prepare(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${N}) ${sql}`);
    await db.batch([
      series("INSERT INTO events (project, id, type, payload, created_at) SELECT ?1, 'evt_old_' || i, 't', '{}', ?2 FROM n").bind(name, old),
      series("INSERT INTO event_requests (project, event_id, request_id) SELECT ?1, 'evt_old_' || i, 'req_old_' || i FROM n").bind(name),
      series("INSERT INTO deliveries (id, project, event_id, event_type, subscription_id, url, status, attempts_made, next_attempt_at, created_at, updated_at) SELECT ?1 || '_dlv_old_' || i, ?1, 'evt_old_' || i, 't', 'sub_x', 'https://x.test/', 'delivered', 2, NULL, ?2, ?2 FROM n").bind(name, old),
      series("INSERT INTO attempts (delivery_id, request_id, attempt, url, status_code, duration_ms, at) SELECT ?1 || '_dlv_old_' || i, 'req_a' || k || '_' || i, k, 'https://x.test/', 200, 1, ?2 FROM n, (SELECT 1 AS k UNION ALL SELECT 2)").bind(name, old),
      series("INSERT INTO outbox (delivery_id, project, event_id, created_at, enqueued_at) SELECT ?1 || '_dlv_old_' || i, ?1, 'evt_old_' || i, ?2, ?2 FROM n").bind(name, old),
      series("INSERT INTO manual_attempts (delivery_id, queued, created_at) SELECT ?1 || '_dlv_old_' || i, 1, ?2 FROM n").bind(name, old),
      // An outbox row whose delivery an earlier sweep already deleted.
      db.prepare("INSERT INTO outbox (delivery_id, project, event_id, created_at) VALUES (?1 || '_orphan', ?1, 'evt_gone', ?2)").bind(name, old),
      // The young: an event with its delivery, attempt and outbox row.
      db.prepare("INSERT INTO events (project, id, type, payload, created_at) VALUES (?1, 'evt_young', 't', '{}', ?2)").bind(name, young),
      db.prepare("INSERT INTO event_requests (project, event_id, request_id) VALUES (?1, 'evt_young', 'req_young')").bind(name),
      db.prepare("INSERT INTO deliveries (id, project, event_id, event_type, subscription_id, url, status, attempts_made, created_at, updated_at) VALUES (?1 || '_dlv_young', ?1, 'evt_young', 't', 'sub_x', 'https://x.test/', 'delivered', 1, ?2, ?2)").bind(name, young),
      db.prepare("INSERT INTO attempts (delivery_id, request_id, attempt, url, status_code, duration_ms, at) VALUES (?1 || '_dlv_young', 'req_y', 1, 'https://x.test/', 200, 1, ?2)").bind(name, young),
      db.prepare("INSERT INTO outbox (delivery_id, project, event_id, created_at, enqueued_at) VALUES (?1 || '_dlv_young', ?1, 'evt_young', ?2, ?2)").bind(name, young),
    ]);
    const count = async (table, col) => (await db.prepare(`SELECT COUNT(*) AS n FROM ${table} WHERE ${col} LIKE ?`).bind(`${name}%`).first()).n;
    const counts = async () => ({
      events: (await db.prepare('SELECT COUNT(*) AS n FROM events WHERE project = ?').bind(name).first()).n,
      event_requests: (await db.prepare('SELECT COUNT(*) AS n FROM event_requests WHERE project = ?').bind(name).first()).n,
      deliveries: await count('deliveries', 'id'),
      attempts: await count('attempts', 'delivery_id'),
      outbox: await count('outbox', 'delivery_id'),
      manual_attempts: await count('manual_attempts', 'delivery_id'),
    });
    assert.deepEqual(await counts(), { events: N + 1, event_requests: N + 1, deliveries: N + 1, attempts: 2 * N + 1, outbox: N + 2, manual_attempts: N });
    await (await gw.mf.getWorker()).scheduled({ cron: '17 3 * * *' });
    assert.deepEqual(await counts(), { events: 1, event_requests: 1, deliveries: 1, attempts: 1, outbox: 1, manual_attempts: 0 });
    const left = await db.prepare('SELECT id FROM deliveries WHERE project = ?').bind(name).first();
    assert.equal(left.id, `${name}_dlv_young`);
  });
});
