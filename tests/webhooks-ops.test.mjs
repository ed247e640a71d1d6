// Operating webhooks (docs/operating-webhooks.md, ADR 0014) end to end: the real built worker under Miniflare
// with its real queues and D1, delivering to real local receivers (tests/support/receiver.mjs),
// whose requests are verified with the published Standard Webhooks and Svix libraries.
// Pause/resume, automatic disabling (a second gateway with a short webhooks.disable_after_s),
// 410, PATCH, the test ping, bulk recover, the per-subscription throttle, the event feed, the
// inspector, trace and project isolation.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, cfg, ORIGIN_TOKEN, ADMIN_TOKEN } from './support/gateway.mjs';

const BASE = {
  webhooks: { schedule_s: [1, 1, 1, 1], timeout_ms: 1000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 1000000 } },
};
// Failing for 2 s (uninterrupted) disables; attempts every second until then.
const SHORT = { ...BASE, webhooks: { ...BASE.webhooks, schedule_s: [1, 1, 1, 1, 1, 1, 1, 1], disable_after_s: 2 } };

let origin;
let gw;
let gwShort;
const receivers = [];

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(BASE) } });
  gwShort = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(SHORT) } });
});
after(async () => {
  for (const r of receivers) await r.close();
  await gw?.dispose();
  await gwShort?.dispose();
  await origin?.kill();
});

const uniq = (p) => `${p}-${crypto.randomBytes(4).toString('hex')}`;
const show = (res) => `${res.status} ${res.text?.slice(0, 400)}`;

async function receiver(behaviour) {
  const r = await startReceiver({ behaviour });
  receivers.push(r);
  return r;
}

/** A fresh project with an API key on `g`, and helpers bound to it. */
async function project(g, tag) {
  const name = uniq(`ops-${tag}`);
  const { key } = await g.createKey({ project: name, plan: 'big' });
  const api = (method, p, body) => g.admin(method, p, body, { token: key });
  const ok = async (method, p, body, status = 200) => {
    const res = await api(method, p, body);
    assert.equal(res.status, status, `${method} ${p} ${JSON.stringify(body ?? '')} → ${show(res)}`);
    return res.json;
  };
  const subscribe = async (url, events = ['*'], extra = {}, rcv) => {
    const sub = await ok('POST', '/_postguard/v1/webhooks', { url, events, ...extra }, 201);
    rcv?.addSecret(sub.secret);
    return sub;
  };
  const publish = async (type, data = {}) => {
    const res = await g.admin('POST', '/_postguard/v1/events', { project: name, type, data }, { token: ORIGIN_TOKEN });
    assert.equal(res.status, 202, show(res));
    return { id: res.json.id, requestId: res.headers['x-request-id'] };
  };
  const deliveries = async (q = '') => (await ok('GET', `/_postguard/v1/deliveries?limit=200${q}`)).data;
  return { name, key, api, ok, subscribe, publish, deliveries };
}

/** Publish `n` events, `width` at a time, in order of creation within each wave; returns their ids. */
async function publishMany(p, n, type = 'ops.bulk', width = 10) {
  const ids = [];
  for (let i = 0; i < n; i += width) {
    const wave = await Promise.all(Array.from({ length: Math.min(width, n - i) }, (_, j) => p.publish(type, { i: i + j })));
    ids.push(...wave.map((e) => e.id));
  }
  return ids;
}

const problemCode = (res) => res.json?.code;

describe('webhook operations', { concurrency: true }, () => {
  it('pause holds new deliveries as paused; resume sends them all once, in creation order', async () => {
    const p = await project(gw, 'pause');
    const r = await receiver();
    const sub = await p.subscribe(r.url, ['*'], {}, r);
    assert.equal(sub.state, 'active');
    const paused = await p.ok('POST', `/_postguard/v1/webhooks/${sub.id}/pause`);
    assert.equal(paused.state, 'paused');
    assert.equal((await p.ok('GET', `/_postguard/v1/webhooks/${sub.id}`)).state, 'paused');
    const ids = [];
    for (let i = 0; i < 6; i++) ids.push((await p.publish('ops.pause', { i })).id);
    const held = await p.deliveries('&status=paused');
    assert.equal(held.length, 6, JSON.stringify(held));
    assert.ok(held.every((d) => d.next_attempt_at === null));
    assert.equal(r.requests.length, 0, 'nothing is attempted while paused');
    const resumed = await p.ok('POST', `/_postguard/v1/webhooks/${sub.id}/resume`);
    assert.equal(resumed.state, 'active');
    await r.waitFor((rs) => rs.length >= 6, { message: 'the six held deliveries' });
    await poll(async () => (await p.deliveries('&status=delivered')).length === 6, { timeout: 15000, message: 'all delivered' });
    assert.deepEqual(r.requests.map((x) => x.headers['webhook-id']), ids, 'sent in creation order, each once');
    assert.ok(r.requests.every((x) => x.verified));
  });

  it('failing past disable_after_s disables; the operational event reaches another subscription; resume sends the held deliveries', async () => {
    const p = await project(gwShort, 'disable');
    const failing = await receiver(() => ({ status: 500 }));
    const watcher = await receiver();
    const sub = await p.subscribe(failing.url, ['ops.*'], {}, failing);
    const watch = await p.subscribe(watcher.url, ['postguard.subscription.disabled'], {}, watcher);
    const first = await p.publish('ops.fail');
    const disabled = await poll(async () => {
      const s = await p.ok('GET', `/_postguard/v1/webhooks/${sub.id}`);
      return s.state === 'disabled' && s;
    }, { timeout: 20000, message: 'the subscription disabled' });
    assert.equal(disabled.disabled_reason, 'failing');
    assert.ok(Number.isInteger(disabled.disabled_at) && disabled.disabled_at > 1.6e12);
    const ops = await watcher.waitFor((rs) => rs.find((x) => x.json?.type === 'postguard.subscription.disabled'), { message: 'the operational event' });
    assert.ok(ops.verified, 'signed with the watcher subscription secret');
    assert.equal(ops.json.data.id, sub.id);
    assert.equal(new URL(ops.json.data.url).href, new URL(sub.url).href);
    assert.equal(ops.json.data.reason, 'failing');
    assert.ok(!Number.isNaN(Date.parse(ops.json.data.since)));
    assert.equal(failing.forEvent(ops.json.id).length, 0, 'not sent to the disabled subscription');
    // New events are held; the first event's next attempt is held too.
    const second = await p.publish('ops.fail');
    await poll(async () => (await p.deliveries(`&status=paused`)).filter((d) => d.subscription_id === sub.id).length === 2, {
      timeout: 15000, message: 'both deliveries held',
    });
    await failing.setBehaviour(() => ({ status: 200 }));
    const before = failing.requests.length;
    const resumed = await p.ok('POST', `/_postguard/v1/webhooks/${sub.id}/resume`);
    assert.equal(resumed.state, 'active');
    assert.equal(resumed.disabled_reason, undefined);
    await failing.waitFor((rs) => [first.id, second.id].every((id) => rs.slice(before).some((x) => x.headers['webhook-id'] === id)), {
      message: 'both held deliveries sent after resume',
    });
    await poll(async () => (await p.deliveries('&status=delivered')).filter((d) => d.subscription_id === sub.id).length === 2, {
      message: 'both delivered',
    });
    assert.equal(watch.state, 'active');
  });

  it('410 Gone disables at once', async () => {
    const p = await project(gw, 'gone');
    const r = await receiver(() => ({ status: 410 }));
    const sub = await p.subscribe(r.url, ['*'], {}, r);
    await p.publish('ops.gone');
    const s = await poll(async () => {
      const x = await p.ok('GET', `/_postguard/v1/webhooks/${sub.id}`);
      return x.state === 'disabled' && x;
    }, { timeout: 15000, message: 'disabled after 410' });
    assert.equal(s.disabled_reason, 'endpoint_gone');
    assert.equal(r.requests.length, 1, 'one attempt, no retry');
  });

  it('PATCH changes url, events and description and keeps the secret', async () => {
    const p = await project(gw, 'patch');
    const r1 = await receiver();
    const r2 = await receiver();
    const sub = await p.subscribe(r1.url, ['a.*'], { description: 'old' });
    const patched = await p.ok('PATCH', `/_postguard/v1/webhooks/${sub.id}`, { url: r2.url, events: ['b.x'], description: 'new', rate_limit_per_s: 50 });
    assert.equal(patched.url, new URL(r2.url).href);
    assert.deepEqual(patched.events, ['b.x']);
    assert.equal(patched.description, 'new');
    assert.equal(patched.rate_limit_per_s, 50);
    assert.equal(patched.secret, undefined, 'the secret is not shown again');
    r2.setSecrets([sub.secret]);
    const e = await p.publish('b.x');
    const got = await r2.waitFor((rs) => rs.find((x) => x.headers['webhook-id'] === e.id), { message: 'delivery to the new URL' });
    assert.ok(got.verified, 'verifies with the original secret');
    assert.equal(r1.requests.length, 0);
    for (const [body, code] of [
      [{ url: 'http://10.0.0.1/x' }, 'VALIDATION_ERROR'],
      [{ events: [] }, 'VALIDATION_ERROR'],
      [{ secret: 'x' }, 'VALIDATION_ERROR'],
      [{ rate_limit_per_s: 0 }, 'VALIDATION_ERROR'],
    ]) {
      const res = await p.api('PATCH', `/_postguard/v1/webhooks/${sub.id}`, body);
      assert.equal(res.status, 400, `${JSON.stringify(body)} → ${show(res)}`);
      assert.equal(problemCode(res), code);
      assert.match(res.headers['content-type'], /application\/problem\+json/);
    }
  });

  it('test ping: 200, 500 and a dead port', async () => {
    const p = await project(gw, 'ping');
    const ok = await receiver();
    const bad = await receiver(() => ({ status: 500, body: 'boom' }));
    const dead = await receiver('down');
    const subOk = await p.subscribe(ok.url, ['x.y'], {}, ok);
    const subBad = await p.subscribe(bad.url, ['x.y']);
    const subDead = await p.subscribe(dead.url, ['x.y']);
    const a = await p.ok('POST', `/_postguard/v1/webhooks/${subOk.id}/test`);
    assert.equal(a.status_code, 200);
    assert.equal(a.error, null);
    assert.equal(a.response_excerpt, 'ok');
    assert.ok(Number.isInteger(a.duration_ms) && a.duration_ms >= 0);
    assert.equal(ok.requests.length, 1);
    assert.equal(ok.requests[0].json.type, 'postguard.ping');
    assert.ok(ok.requests[0].verified, 'the ping is signed with the subscription secret');
    const b = await p.ok('POST', `/_postguard/v1/webhooks/${subBad.id}/test`);
    assert.equal(b.status_code, 500);
    assert.equal(b.response_excerpt, 'boom');
    const c = await p.ok('POST', `/_postguard/v1/webhooks/${subDead.id}/test`);
    assert.equal(c.status_code, null);
    assert.equal(typeof c.error, 'string');
    assert.ok(c.error.length > 0);
  });

  it('recover re-sends 300 dead letters once each; the task counts them', async () => {
    const p = await project(gw, 'recover');
    const r = await receiver(() => ({ status: 400 }));
    const sub = await p.subscribe(r.url, ['*'], {}, r);
    const since = Date.now() - 1000;
    const ids = await publishMany(p, 300, 'ops.recover', 20);
    await poll(async () => {
      let n = 0;
      let cursor = '';
      for (;;) {
        const page = await p.ok('GET', `/_postguard/v1/deliveries?status=dead_letter&limit=200${cursor}`);
        n += page.data.length;
        if (!page.next_cursor) break;
        cursor = `&cursor=${encodeURIComponent(page.next_cursor)}`;
      }
      return n === 300;
    }, { timeout: 60000, interval: 250, message: '300 dead letters' });
    await r.setBehaviour(() => ({ status: 200 }));
    const bad = await p.api('POST', `/_postguard/v1/webhooks/${sub.id}/recover`, { until: 5 });
    assert.equal(bad.status, 400, show(bad));
    const started = await p.ok('POST', `/_postguard/v1/webhooks/${sub.id}/recover`, { since: new Date(since).toISOString() }, 202);
    assert.match(started.id, /^task_/);
    const task = await poll(async () => {
      const t = await p.ok('GET', `/_postguard/v1/tasks/${started.id}`);
      return t.state === 'done' && t;
    }, { timeout: 30000, message: 'the task done' });
    assert.equal(task.kind, 'recover');
    assert.equal(task.total, 300);
    assert.equal(task.done, 300);
    assert.equal(task.failed, 0);
    await r.waitFor((rs) => new Set(rs.filter((x) => x.answered === 200).map((x) => x.headers['webhook-id'])).size === 300, {
      timeout: 60000, message: '300 recovered deliveries',
    });
    const okArrivals = r.requests.filter((x) => x.answered === 200);
    assert.equal(okArrivals.length, 300, 'each delivered once');
    assert.deepEqual(new Set(okArrivals.map((x) => x.headers['webhook-id'])), new Set(ids));
    assert.ok(okArrivals.every((x) => x.verified && x.attempt === 2), 'a new attempt each, the count continuing');
  });

  it('rate_limit_per_s 5 spreads 50 deliveries over at least 9 s, none dropped', async () => {
    const p = await project(gw, 'throttle');
    const r = await receiver();
    const sub = await p.subscribe(r.url, ['*'], { rate_limit_per_s: 5 }, r);
    assert.equal(sub.rate_limit_per_s, 5);
    const ids = await publishMany(p, 50, 'ops.throttle', 25);
    // Another project's delivery does not queue behind the throttled receiver.
    const other = await project(gw, 'unthrottled');
    const r2 = await receiver();
    await other.subscribe(r2.url, ['*'], {}, r2);
    const e = await other.publish('ops.other');
    await r2.waitFor((rs) => rs.some((x) => x.headers['webhook-id'] === e.id), { message: "the other project's delivery" });
    assert.ok(r.requests.length < 50, `delivered while the throttled subscription still waits (${r.requests.length} of 50 sent)`);
    await r.waitFor((rs) => rs.length >= 50, { timeout: 60000, message: '50 throttled deliveries' });
    const at = r.requests.map((x) => x.at).sort((a, b) => a - b);
    assert.ok(at[49] - at[0] >= 9000, `spread ${at[49] - at[0]} ms`);
    assert.deepEqual(new Set(r.requests.map((x) => x.headers['webhook-id'])), new Set(ids));
    assert.equal(r.requests.length, 50, 'each once');
  });

  it('the event feed pages without gaps, filters by type, and carries delivery summaries and the request id', async () => {
    const p = await project(gw, 'feed');
    const r = await receiver();
    await p.subscribe(r.url, ['feed.a'], {}, r);
    const published = [];
    for (let i = 0; i < 7; i++) published.push(await p.publish(i % 2 ? 'feed.b' : 'feed.a', { i }));
    await r.waitFor((rs) => rs.length >= 4, { message: 'feed.a deliveries' });
    for (const order of ['asc', 'desc']) {
      const seen = [];
      let cursor = '';
      for (let page = 0; page < 10; page++) {
        const res = await p.ok('GET', `/_postguard/v1/events?order=${order}&limit=3${cursor}`);
        assert.ok(res.data.length <= 3);
        seen.push(...res.data);
        if (!res.next_cursor) break;
        cursor = `&cursor=${encodeURIComponent(res.next_cursor)}`;
      }
      const expected = published.map((e) => e.id);
      assert.deepEqual(seen.map((e) => e.id), order === 'asc' ? expected : [...expected].reverse(), `${order}: every event once, in order`);
    }
    const a = await p.ok('GET', '/_postguard/v1/events?type=feed.a&order=asc');
    assert.equal(a.data.length, 4);
    const first = a.data[0];
    assert.equal(first.type, 'feed.a');
    assert.deepEqual(first.data, { i: 0 });
    assert.ok(!Number.isNaN(Date.parse(first.timestamp)));
    assert.equal(first.request_id, published[0].requestId);
    await poll(async () => (await p.ok('GET', '/_postguard/v1/events?type=feed.a')).data.every((e) => e.deliveries.delivered === 1), { message: 'summaries delivered' });
    const b = await p.ok('GET', '/_postguard/v1/events?type=feed.b');
    assert.deepEqual(b.data[0].deliveries, { total: 0, delivered: 0, failed: 0, dead_letter: 0, pending: 0, paused: 0 });
    for (const q of ['order=up', 'limit=0', 'cursor=zz', 'since=yesterday', 'nope=1']) {
      const res = await p.api('GET', `/_postguard/v1/events?${q}`);
      assert.equal(res.status, 400, `${q} → ${show(res)}`);
      assert.equal(problemCode(res), 'VALIDATION_ERROR');
    }
  });

  it('trace: deliveries and attempts carry the publish request id, which the audit log finds', async () => {
    const p = await project(gw, 'trace');
    const r = await receiver();
    await p.subscribe(r.url, ['*'], {}, r);
    const e = await p.publish('trace.x');
    assert.ok(e.requestId);
    await r.waitFor((rs) => rs.length >= 1, { message: 'the delivery' });
    const [row] = await p.deliveries();
    assert.equal(row.request_id, e.requestId);
    const full = await poll(async () => {
      const d = await p.ok('GET', `/_postguard/v1/deliveries/${row.id}`);
      return d.attempts.length > 0 && d;
    }, { message: 'the attempt recorded' });
    assert.equal(full.request_id, e.requestId);
    assert.ok(full.attempts.every((a) => a.publish_request_id === e.requestId));
    const audit = await poll(async () => {
      const res = await gw.admin('GET', `/_postguard/v1/audit?request_id=${e.requestId}`, undefined, { token: ADMIN_TOKEN });
      return res.status === 200 && res.json.data.length === 1 && res.json.data[0];
    }, { message: 'the publish in the audit log' });
    assert.equal(audit.path, '/_postguard/v1/events');
    assert.equal(audit.status, 202);
  });

  it('an inspector captures a redirected delivery whose signature verifies', async () => {
    const p = await project(gw, 'inspect');
    const r = await receiver(() => ({ status: 400 }));
    await p.subscribe(r.url, ['*'], {}, r);
    const insp = await p.ok('POST', '/_postguard/v1/inspectors', undefined, 201);
    assert.match(insp.url, /\/_postguard\/inspect\/[0-9a-f]{48}$/);
    assert.ok(insp.expires_at - Date.now() > 23 * 3600e3);
    const e = await p.publish('inspect.me', { hello: 'world' });
    const dl = await poll(async () => (await p.deliveries('&status=dead_letter')).find((d) => d.event_id === e.id), { timeout: 15000, message: 'dead letter' });
    await p.ok('POST', `/_postguard/v1/deliveries/${dl.id}/redirect`, { url: insp.url }, 202);
    const caught = await poll(async () => {
      const res = await p.ok('GET', `/_postguard/v1/inspectors/${insp.id}/requests`);
      return res.data.length > 0 && res.data[0];
    }, { timeout: 15000, message: 'the capture' });
    assert.equal(caught.method, 'POST');
    assert.equal(caught.signature_valid, true);
    assert.equal(caught.headers['webhook-id'], e.id);
    assert.deepEqual(JSON.parse(caught.body).data, { hello: 'world' });
    // A request without a signature is captured as such; a wrong one does not verify.
    const u = new URL(insp.url);
    const plain = await gw.admin('POST', u.pathname, { x: 1 }, { token: 'none' });
    assert.equal(plain.status, 200, show(plain));
    const forged = await gw.admin('POST', u.pathname, { x: 2 }, {
      token: 'none', headers: { 'webhook-id': 'evt_x', 'webhook-timestamp': String(Math.floor(Date.now() / 1000)), 'webhook-signature': 'v1,AAAA' },
    });
    assert.equal(forged.status, 200);
    const all = (await p.ok('GET', `/_postguard/v1/inspectors/${insp.id}/requests`)).data;
    assert.deepEqual(all.map((x) => x.signature_valid), [true, null, false]);
    const gone = await gw.admin('POST', '/_postguard/inspect/0000', {}, { token: 'none' });
    assert.equal(gone.status, 404);
    // The capture token is a credential: the audit log records the path without it.
    const row = await poll(async () => {
      const res = await gw.admin('GET', `/_postguard/v1/audit?request_id=${plain.headers['x-request-id']}`, undefined, { token: ADMIN_TOKEN });
      return res.json?.data?.[0];
    }, { message: 'the capture in the audit log' });
    assert.equal(row.path, '/_postguard/inspect/{token}');
  });

  it('project isolation on every new endpoint', async () => {
    const a = await project(gw, 'iso-a');
    const b = await project(gw, 'iso-b');
    const r = await receiver();
    const sub = await a.subscribe(r.url, ['*'], {}, r);
    await a.publish('iso.x');
    const task = await a.ok('POST', `/_postguard/v1/webhooks/${sub.id}/recover`, { since: 0 }, 202);
    const insp = await a.ok('POST', '/_postguard/v1/inspectors', undefined, 201);
    for (const [method, path, body] of [
      ['PATCH', `/_postguard/v1/webhooks/${sub.id}`, { description: 'x' }],
      ['POST', `/_postguard/v1/webhooks/${sub.id}/pause`],
      ['POST', `/_postguard/v1/webhooks/${sub.id}/resume`],
      ['POST', `/_postguard/v1/webhooks/${sub.id}/test`],
      ['POST', `/_postguard/v1/webhooks/${sub.id}/recover`, { since: 0 }],
      ['GET', `/_postguard/v1/tasks/${task.id}`],
      ['GET', `/_postguard/v1/inspectors/${insp.id}/requests`],
    ]) {
      const res = await b.api(method, path, body);
      assert.equal(res.status, 404, `${method} ${path} as another project → ${show(res)}`);
      assert.equal(problemCode(res), 'NOT_FOUND');
    }
    assert.equal((await a.ok('GET', `/_postguard/v1/webhooks/${sub.id}`)).state, 'active', 'B paused nothing');
    assert.equal(r.requests.filter((x) => x.json?.type === 'postguard.ping').length, 0, 'B pinged nothing');
    assert.equal((await b.ok('GET', '/_postguard/v1/events')).data.length, 0, "B's feed is empty");
    assert.equal((await a.ok('GET', '/_postguard/v1/events')).data.length, 1);
    for (const path of ['/_postguard/v1/events', '/_postguard/v1/inspectors']) {
      const res = await gw.admin(path.endsWith('events') ? 'GET' : 'POST', path, undefined, { token: 'pg_bad' });
      assert.equal(res.status, 401, `${path} without a valid key → ${show(res)}`);
    }
  });
});
