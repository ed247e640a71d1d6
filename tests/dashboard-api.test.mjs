// The API the dashboard's views read (issue 35), against the real built worker under Miniflare,
// the real demo origin and real webhook receivers: the gateway's own calls left out of /audit and
// /stats on request (and a gateway path counted under its route pattern), deliveries filtered by
// subscription and event, the operator reading a project's webhooks, deliveries and events with
// ?project=, an attempt's request headers (signature redacted) and response headers, a
// subscription's 24 h health against the attempts its receivers saw, each key's last use from
// the audit shards, a new key's updated_at — and a shard made before the attempts' header columns
// existed, read and written after a restart.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, problem, cfg, bearer, ORIGIN_TOKEN } from './support/gateway.mjs';

const CONFIG = {
  plans: { big: { requests_per_window: 100000 } },
  webhooks: { schedule_s: [1], timeout_ms: 3000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
};
/** A redacted signature as the log keeps it: version, 6 characters, an ellipsis. */
const REDACTED_SIG = /^v1,[A-Za-z0-9+/=]{6}…$/;

let origin;
let gw;
let okReceiver;
let failReceiver;
const project = `dash-${crypto.randomBytes(3).toString('hex')}`;
let key;
let other;
const subs = {};
const events = {};

const asKey = (method, p, body, token = key.key) => gw.admin(method, p, body, { token });
const asOperator = (method, p, body) => gw.admin(method, p, body);

async function publish(type, data) {
  const res = await gw.admin('POST', '/_postguard/v1/events', { project, type, data }, { token: ORIGIN_TOKEN });
  assert.equal(res.status, 202, res.text);
  return res.json.id;
}

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  okReceiver = await startReceiver({ behaviour: () => ({ status: 200, headers: { 'x-receiver': 'ok' }, body: '{"ok":true}' }) });
  failReceiver = await startReceiver({
    behaviour: () => ({ status: 500, headers: { 'set-cookie': 'session=s3cr3t; HttpOnly', 'x-receiver': 'failing' }, body: 'down' }),
  });
  key = await gw.createKey({ project, plan: 'big', name: 'dashboard api' });
  other = await gw.createKey({ project: `${project}-other`, plan: 'big' });
  for (const [name, r] of [['ok', okReceiver], ['fail', failReceiver]]) {
    const res = await asKey('POST', '/_postguard/v1/webhooks', { url: `${r.url}/hooks`, events: ['*'] });
    assert.equal(res.status, 201, res.text);
    subs[name] = res.json;
    r.addSecret(res.json.secret);
  }
  events.paid = await publish('payment.succeeded', { id: 'pay_1' });
  events.refund = await publish('refund.created', { id: 're_1' });
  // Every delivery settled: the ok ones delivered, the failing ones dead-lettered (schedule [1]).
  await poll(async () => {
    const r = await asKey('GET', '/_postguard/v1/deliveries?limit=10');
    return r.json?.data?.length === 4 && r.json.data.every((d) => d.status === 'delivered' || d.status === 'dead_letter');
  }, { timeout: 30000, interval: 250, message: 'four deliveries settled' });
});

after(async () => {
  await okReceiver?.close();
  await failReceiver?.close();
  await gw?.dispose();
  await origin?.kill();
});

describe('the gateway’s own calls in /audit and /stats', () => {
  it('include_gateway=false counts only the proxied requests; a gateway path is counted under its route pattern', async () => {
    const k = await gw.createKey({ project: `${project}-gw`, plan: 'big' });
    const p = k.project;
    for (let i = 0; i < 3; i++) assert.equal((await gw.fetch(`/orders/${i}`, { headers: bearer(k.key) })).status, 200);
    assert.equal((await gw.fetch('/orders/fail', { headers: { ...bearer(k.key), 'x-demo-status': '503' } })).status, 503);
    // Gateway calls: two idempotency lookups (two URLs, one endpoint) and /me.
    for (const id of [crypto.randomUUID(), crypto.randomUUID()]) {
      assert.equal((await gw.fetch(`/_postguard/v1/idempotency/${id}`, { headers: bearer(k.key) })).status, 200);
    }
    assert.equal((await gw.fetch('/_postguard/v1/me', { headers: bearer(k.key) })).status, 200);
    const all = await poll(async () => {
      const s = await asOperator('GET', `/_postguard/v1/stats?days=1&project=${p}`);
      return s.json?.days?.[0]?.requests === 7 && s.json;
    }, { timeout: 15000, interval: 200, message: '7 requests counted' });
    assert.deepEqual(all.top_paths.find((t) => t.path.startsWith('/_postguard/v1/idempotency')), { path: '/_postguard/v1/idempotency/{key}', requests: 2 });
    assert.ok(!all.top_paths.some((t) => /idempotency\/[0-9a-f]{8}-/.test(t.path)), 'no lookup is its own endpoint');
    const api = (await asOperator('GET', `/_postguard/v1/stats?days=1&project=${p}&include_gateway=false`)).json;
    assert.deepEqual(api.days.map((d) => [d.requests, d.errors, d.server_errors]), [[4, 1, 1]]);
    assert.deepEqual(api.top_paths.map((t) => t.path).sort(), ['/orders/0', '/orders/1', '/orders/2', '/orders/fail']);
    assert.equal(api.error_share, 0.25);
    const rows = (await asOperator('GET', `/_postguard/v1/audit?project=${p}&include_gateway=false`)).json.data;
    assert.equal(rows.length, 4);
    assert.ok(rows.every((r) => r.path.startsWith('/orders/')), rows.map((r) => r.path).join(' '));
    const everything = (await asOperator('GET', `/_postguard/v1/audit?project=${p}&include_gateway=true`)).json.data;
    assert.equal(everything.length, 7);
    // The key's own view (its scope is its project) takes the same filter.
    const own = await gw.fetch('/_postguard/v1/audit?include_gateway=false', { headers: bearer(k.key) });
    assert.equal(own.status, 200);
    assert.ok(own.json.data.every((r) => !r.path.startsWith('/_postguard/')));
    problem(await asOperator('GET', `/_postguard/v1/stats?project=${p}&include_gateway=no`), { status: 400, code: 'VALIDATION_ERROR' });
    problem(await asOperator('GET', `/_postguard/v1/audit?project=${p}&include_gateway=`), { status: 400, code: 'VALIDATION_ERROR' });
  });
});

describe('deliveries filtered by subscription and event', () => {
  it('subscription_id and event_id narrow the list to exactly those deliveries', async () => {
    const bySub = (await asKey('GET', `/_postguard/v1/deliveries?subscription_id=${subs.ok.id}`)).json.data;
    assert.deepEqual(bySub.map((d) => d.event_id).sort(), [events.paid, events.refund].sort());
    assert.ok(bySub.every((d) => d.subscription_id === subs.ok.id));
    const byEvent = (await asKey('GET', `/_postguard/v1/deliveries?event_id=${events.refund}`)).json.data;
    assert.deepEqual(byEvent.map((d) => d.subscription_id).sort(), [subs.ok.id, subs.fail.id].sort());
    const both = (await asKey('GET', `/_postguard/v1/deliveries?event_id=${events.refund}&subscription_id=${subs.fail.id}&status=dead_letter`)).json.data;
    assert.equal(both.length, 1);
    assert.deepEqual([both[0].event_id, both[0].subscription_id, both[0].status], [events.refund, subs.fail.id, 'dead_letter']);
    assert.deepEqual((await asKey('GET', '/_postguard/v1/deliveries?event_id=evt_none')).json.data, []);
    problem(await asKey('GET', '/_postguard/v1/deliveries?subscription_id='), { status: 400, code: 'VALIDATION_ERROR' });
  });
});

describe('the operator reads a project’s webhooks, deliveries and events with ?project=', () => {
  it('answers what the project’s key sees; without project= it is a 400; a key may not name one; changing stays the project’s', async () => {
    const mine = (await asKey('GET', '/_postguard/v1/webhooks')).json.data.map((s) => s.id).sort();
    const op = await asOperator('GET', `/_postguard/v1/webhooks?project=${project}`);
    assert.equal(op.status, 200, op.text);
    assert.deepEqual(op.json.data.map((s) => s.id).sort(), mine);
    assert.ok(op.json.data.every((s) => s.secret === undefined), 'no secret');
    assert.equal((await asOperator('GET', `/_postguard/v1/webhooks/${subs.ok.id}?project=${project}`)).json.url, subs.ok.url);
    const dl = (await asOperator('GET', `/_postguard/v1/deliveries?project=${project}&event_id=${events.paid}`)).json.data;
    assert.equal(dl.length, 2);
    const one = await asOperator('GET', `/_postguard/v1/deliveries/${dl[0].id}?project=${project}`);
    assert.equal(one.status, 200, one.text);
    assert.equal(one.json.attempts.length > 0, true);
    const feed = (await asOperator('GET', `/_postguard/v1/events?project=${project}`)).json.data;
    assert.deepEqual(feed.map((e) => e.id).sort(), [events.paid, events.refund].sort());
    // Another project's records are not this one's.
    assert.deepEqual((await asOperator('GET', `/_postguard/v1/webhooks?project=${other.project}`)).json.data, []);
    assert.equal((await asOperator('GET', `/_postguard/v1/deliveries/${dl[0].id}?project=${other.project}`)).status, 404);
    // The operator must say which project.
    for (const p of ['/_postguard/v1/webhooks', '/_postguard/v1/deliveries', '/_postguard/v1/events', `/_postguard/v1/deliveries/${dl[0].id}`]) {
      const res = problem(await asOperator('GET', p), { status: 400, code: 'VALIDATION_ERROR' });
      assert.match(res.detail, /^project: required/, p);
    }
    // A key reads its own project and names none.
    problem(await asKey('GET', `/_postguard/v1/webhooks?project=${project}`), { status: 400, code: 'VALIDATION_ERROR' });
    problem(await asKey('GET', `/_postguard/v1/deliveries?project=${other.project}`), { status: 400, code: 'VALIDATION_ERROR' });
    // Changing a project's webhooks stays the project's.
    problem(await asOperator('POST', '/_postguard/v1/webhooks', { url: `${okReceiver.url}/x`, events: ['*'] }), { status: 403, code: 'FORBIDDEN' });
    problem(await asOperator('POST', `/_postguard/v1/webhooks/${subs.ok.id}/pause`), { status: 403, code: 'FORBIDDEN' });
    problem(await asOperator('POST', `/_postguard/v1/deliveries/${dl[0].id}/retry`), { status: 403, code: 'FORBIDDEN' });
    // The origin token still reads nothing.
    problem(await gw.admin('GET', `/_postguard/v1/webhooks?project=${project}`, undefined, { token: ORIGIN_TOKEN }), { status: 403, code: 'FORBIDDEN' });
  });
});

describe('an attempt’s headers', () => {
  it('shows the request headers it was sent with, the signature redacted, and the receiver’s response headers', async () => {
    const [d] = (await asKey('GET', `/_postguard/v1/deliveries?event_id=${events.paid}&subscription_id=${subs.fail.id}`)).json.data;
    const res = await asKey('GET', `/_postguard/v1/deliveries/${d.id}`);
    assert.equal(res.status, 200, res.text);
    const received = failReceiver.forEvent(events.paid);
    assert.equal(res.json.attempts.length, received.length, 'one attempt per request the receiver got');
    for (const a of res.json.attempts) {
      const got = received.find((r) => r.headers['x-request-id'] === a.request_id);
      assert.ok(got, `the receiver got attempt ${a.attempt}`);
      const h = a.request_headers;
      assert.match(h['webhook-signature'], REDACTED_SIG);
      assert.ok(got.headers['webhook-signature'].startsWith(h['webhook-signature'].slice(0, -1)), 'the first characters of what was sent');
      assert.ok(!res.text.includes(got.headers['webhook-signature'].slice(3)), 'never the whole signature');
      for (const name of ['webhook-id', 'webhook-timestamp', 'x-event-id', 'x-event-type', 'x-delivery-attempt', 'x-request-id', 'content-type', 'user-agent']) {
        assert.equal(h[name], got.headers[name], name);
      }
      assert.equal(a.status_code, 500);
      assert.equal(a.response_headers['x-receiver'], 'failing');
      assert.equal(a.response_headers['set-cookie'], '(redacted)');
      assert.match(a.response_headers['content-type'] ?? '', /./);
      assert.ok(!res.text.includes('s3cr3t'), 'no cookie value');
    }
  });
});

describe('endpoint health', () => {
  it('each subscription’s 24 h figure matches the attempts its receiver answered', async () => {
    const list = (await asKey('GET', '/_postguard/v1/webhooks')).json.data;
    const ok = list.find((s) => s.id === subs.ok.id).health;
    const fail = list.find((s) => s.id === subs.fail.id).health;
    const okSeen = okReceiver.requests.filter((r) => r.path === '/hooks');
    const failSeen = failReceiver.requests.filter((r) => r.path === '/hooks');
    assert.deepEqual([ok.attempts, ok.succeeded, ok.failed, ok.success_rate, ok.state], [okSeen.length, okSeen.length, 0, 1, 'healthy']);
    assert.equal(ok.window_s, 86400);
    assert.equal(ok.last_status_code, 200);
    assert.deepEqual([fail.attempts, fail.succeeded, fail.failed, fail.success_rate, fail.state], [failSeen.length, 0, failSeen.length, 0, 'failing']);
    assert.equal(fail.last_status_code, 500);
    const last = Math.max(...failSeen.map((r) => r.at));
    // The attempt is timed when it starts; the receiver got it within the attempt's timeout (3000 ms).
    assert.ok(fail.last_attempt_at <= last && last - fail.last_attempt_at <= 3000, `last attempt ${fail.last_attempt_at} vs received ${last}`);
    // The same figure for one subscription, and for the operator.
    assert.deepEqual((await asKey('GET', `/_postguard/v1/webhooks/${subs.ok.id}`)).json.health, ok);
    assert.deepEqual((await asOperator('GET', `/_postguard/v1/webhooks/${subs.fail.id}?project=${project}`)).json.health, fail);
    // A new subscription has had no attempt.
    const idle = await asKey('POST', '/_postguard/v1/webhooks', { url: `${okReceiver.url}/idle`, events: ['never.*'] });
    const got = (await asKey('GET', `/_postguard/v1/webhooks/${idle.json.id}`)).json.health;
    assert.deepEqual([got.attempts, got.success_rate, got.last_attempt_at, got.state], [0, null, null, 'idle']);
  });
});

describe('keys: last use and updated_at', () => {
  it('GET /keys/activity gives each key’s requests and last use, from the audit log', async () => {
    const k = await gw.createKey({ project: `${project}-act`, plan: 'big' });
    const idle = await gw.createKey({ project: k.project, plan: 'big' });
    let lastSent = 0;
    for (let i = 0; i < 3; i++) {
      lastSent = Date.now();
      assert.equal((await gw.fetch(`/orders/${i}`, { headers: bearer(k.key) })).status, 200);
    }
    const activity = await poll(async () => {
      const r = await asOperator('GET', `/_postguard/v1/keys/activity?project=${k.project}`);
      assert.equal(r.status, 200, r.text);
      return r.json.data[0]?.requests === 3 && r.json.data;
    }, { timeout: 15000, interval: 200, message: 'three requests of the key' });
    assert.equal(activity.length, 1, 'a key without a request is absent');
    const [a] = activity;
    assert.equal(a.key_prefix, k.prefix);
    assert.equal(a.errors, 0);
    const rows = (await asOperator('GET', `/_postguard/v1/audit?project=${k.project}&key_prefix=${k.prefix}&limit=1`)).json.data;
    assert.equal(a.last_used_at, rows[0].time, 'the time of its newest audit row');
    assert.ok(a.last_used_at >= lastSent - 1000 && a.last_used_at <= Date.now(), `${a.last_used_at}`);
    assert.ok(!activity.some((x) => x.key_prefix === idle.prefix));
    problem(await asOperator('GET', '/_postguard/v1/keys/activity'), { status: 400, code: 'VALIDATION_ERROR' });
    problem(await asOperator('GET', `/_postguard/v1/keys/activity?project=${k.project}&days=0`), { status: 400, code: 'VALIDATION_ERROR' });
    problem(await gw.fetch(`/_postguard/v1/keys/activity?project=${k.project}`, { headers: bearer(k.key) }), { status: 403, code: 'FORBIDDEN' });
  });

  it('a new key’s updated_at is its created_at', async () => {
    const res = await asOperator('POST', '/_postguard/v1/keys', { project, plan: 'big' });
    assert.equal(res.status, 201, res.text);
    assert.ok(res.json.created_at > 0);
    assert.equal(res.json.updated_at, res.json.created_at);
  });
});

describe('a shard made before the attempts’ header columns', () => {
  it('reads its old attempts (headers null) and keeps the headers of new ones after a restart', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-old-shard-'));
    const receiver = await startReceiver({ behaviour: () => ({ status: 503, body: 'not yet' }) });
    const p = `old-${crypto.randomBytes(3).toString('hex')}`;
    let g = await startGateway({ originUrl: origin.url, persistDir: dir, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
    try {
      const k = await g.createKey({ project: p, plan: 'big' });
      const sub = await g.admin('POST', '/_postguard/v1/webhooks', { url: `${receiver.url}/hooks`, events: ['*'] }, { token: k.key });
      const ev = await g.admin('POST', '/_postguard/v1/events', { project: p, type: 'x.y', data: {} }, { token: ORIGIN_TOKEN });
      assert.equal(ev.status, 202, ev.text);
      const [d] = await poll(async () => {
        const r = await g.admin('GET', '/_postguard/v1/deliveries?status=dead_letter', undefined, { token: k.key });
        return r.json?.data?.length === 1 && r.json.data;
      }, { timeout: 30000, interval: 250, message: 'the delivery dead-lettered' });
      await g.dispose();
      // Make the shard what a 0.3 shard is: its attempts table without the two columns.
      const files = [];
      const walk = (d0) => {
        for (const e of fs.readdirSync(d0, { withFileTypes: true })) {
          const f = path.join(d0, e.name);
          if (e.isDirectory()) walk(f);
          else if (f.endsWith('.sqlite')) files.push(f);
        }
      };
      walk(dir);
      let altered = 0;
      for (const f of files) {
        const db = new DatabaseSync(f);
        const cols = db.prepare("SELECT name FROM pragma_table_info('attempts')").all().map((c) => c.name);
        if (cols.includes('signed')) {
          db.exec('ALTER TABLE attempts DROP COLUMN signed; ALTER TABLE attempts DROP COLUMN response_headers;');
          altered += 1;
        }
        db.close();
      }
      assert.equal(altered, 1, `one webhook shard among ${files.length} storage files`);
      g = await startGateway({ originUrl: origin.url, persistDir: dir, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
      const old = await g.admin('GET', `/_postguard/v1/deliveries/${d.id}`, undefined, { token: k.key });
      assert.equal(old.status, 200, old.text);
      assert.ok(old.json.attempts.length >= 1);
      assert.ok(old.json.attempts.every((a) => a.request_headers === null && a.response_headers === null), 'old attempts read null');
      // A new attempt in the same shard keeps its headers: the columns came back.
      await receiver.setBehaviour(() => ({ status: 200 }));
      assert.equal((await g.admin('POST', `/_postguard/v1/deliveries/${d.id}/retry`, undefined, { token: k.key })).status, 202);
      const after = await poll(async () => {
        const r = await g.admin('GET', `/_postguard/v1/deliveries/${d.id}`, undefined, { token: k.key });
        return r.json?.status === 'delivered' && r.json;
      }, { timeout: 30000, interval: 250, message: 'the retry delivered' });
      const last = after.attempts.at(-1);
      assert.match(last.request_headers['webhook-signature'], REDACTED_SIG);
      assert.equal(last.status_code, 200);
      const health = (await g.admin('GET', `/_postguard/v1/webhooks/${sub.json.id}`, undefined, { token: k.key })).json.health;
      assert.equal(health.attempts, after.attempts.length);
      assert.equal(health.succeeded, 1);
    } finally {
      await g.dispose();
      await receiver.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
