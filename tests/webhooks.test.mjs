// Webhook delivery (docs/webhooks.md, docs/api-reference.md) end to end: the real built worker under Miniflare with its real
// queues (from wrangler.toml) and D1, delivering to real local HTTP receivers. Every request a receiver
// gets is verified with both published libraries (standardwebhooks and svix).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { verifyBoth, expectedSignature, receiverPool } from './support/receiver.mjs';
import {
  startGateway, problem, poll, burst, cfg, ADMIN_TOKEN, ORIGIN_TOKEN, REQUEST_ID_RE,
} from './support/gateway.mjs';
import { uniq, show, stays } from './support/util.mjs';

const SCHEDULE = [1, 2, 3, 1];
// A receiver's answer must reach the gateway within this on a loaded machine, or it is recorded
// as a timeout and retried (at 1 s, a 503 beside a CPU hog came back as a timeout). Not much
// more: the local queue consumer runs one batch at a time, so the hanging receiver's attempt
// holds every other test's deliveries for this long (at 8 s their schedules slipped past the
// tests' deadlines).
const TIMEOUT_MS = 3000;
const CONFIG = {
  webhooks: { schedule_s: SCHEDULE, timeout_ms: TIMEOUT_MS, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 100000 } },
  origin: { timeout_ms: 1000 },
  idempotency: { lease_s: 3 },
};
const MAX_ATTEMPTS = SCHEDULE.length + 1;
// Timer slack: Miniflare honours queue delays to ~10 ms; allow rounding to whole seconds.
const EARLY_MS = 150;

const SUB_ID_RE = /^sub_[A-Za-z0-9]+$/;
const DLV_ID_RE = /^dlv_[A-Za-z0-9]+$/;
const EVT_ID_RE = /^evt_[A-Za-z0-9]+$/;
const SECRET_RE = /^whsec_[A-Za-z0-9+/]+={0,2}$/;
const RFC3339_RE = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;
const SIG_RE = /^v1,[A-Za-z0-9+/]+={0,2}$/;
const FINAL = new Set(['delivered', 'dead_letter']);

let origin;
let gw;
const receiver = receiverPool();

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await receiver.closeAll();
  await gw?.dispose();
  await origin?.kill();
});

// ---------------------------------------------------------------------------------------------
// Helpers

const api = (method, p, token, body, headers) => gw.admin(method, p, body, { token, headers });

/** A fresh project with an API key on the big plan. */
async function project(tag) {
  const name = uniq(`wh-${tag}`);
  const k = await gw.createKey({ project: name, plan: 'big' });
  return { name, key: k.key };
}

/** Create a subscription (201 asserted); the receiver verifies later requests with its secret. */
async function subscribe(p, url, events = ['*'], { description, rcv } = {}) {
  const body = { url, events };
  if (description !== undefined) body.description = description;
  const res = await api('POST', '/_postguard/v1/webhooks', p.key, body);
  assert.equal(res.status, 201, `subscribe ${JSON.stringify(body)} → ${show(res)}`);
  rcv?.addSecret(res.json.secret);
  return res.json;
}

/** Publish as the origin; 202 asserted; returns the event id. */
async function publish(projectName, type, data = {}, id) {
  const body = { project: projectName, type, data };
  if (id !== undefined) body.id = id;
  const res = await api('POST', '/_postguard/v1/events', ORIGIN_TOKEN, body);
  assert.equal(res.status, 202, `publish ${type} → ${show(res)}`);
  assert.equal(typeof res.json?.id, 'string', `202 body has the event id: ${res.text}`);
  return res.json.id;
}

async function listDeliveries(p, query = '') {
  const res = await api('GET', `/_postguard/v1/deliveries${query}`, p.key);
  assert.equal(res.status, 200, `GET deliveries${query} → ${show(res)}`);
  return res.json;
}

/** Every delivery of the project matching `query`, following next_cursor. */
async function allDeliveries(p, query = '') {
  const out = [];
  let cursor = null;
  for (let page = 0; page < 100; page++) {
    const sep = query ? '&' : '?';
    const q = `${query}${sep}limit=200${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`;
    const { data, next_cursor: next } = await listDeliveries(p, q);
    out.push(...data);
    cursor = next;
    if (!cursor) return out;
  }
  throw new Error('more than 100 pages of deliveries');
}

async function getDelivery(p, id) {
  const res = await api('GET', `/_postguard/v1/deliveries/${id}`, p.key);
  assert.equal(res.status, 200, `GET delivery ${id} → ${show(res)}`);
  return res.json;
}

/** The delivery (list row) of `eventId` [to `subId`], once it exists. */
function deliveryOf(p, eventId, subId, { timeout = 5000 } = {}) {
  return poll(async () => (await allDeliveries(p)).find((d) => d.event_id === eventId && (subId === undefined || d.subscription_id === subId)), {
    timeout,
    message: `the delivery of ${eventId}${subId ? ` to ${subId}` : ''} in the log`,
  });
}

/** Poll GET /deliveries/{id} until `pred(delivery)` holds. */
function waitDelivery(p, id, pred, { timeout = 20000, message } = {}) {
  let last;
  return poll(async () => {
    last = await getDelivery(p, id);
    return pred(last) ? last : false;
  }, { timeout, interval: 100, message: message ?? `delivery ${id}` }).catch((e) => {
    throw new Error(`${e.message}; last state: ${JSON.stringify(last)}`);
  });
}

const settled = (p, id, opts) => waitDelivery(p, id, (d) => FINAL.has(d.status), { message: `delivery ${id} delivered or dead_letter`, ...opts });

/** One received delivery request: every §7 header present and consistent; signature verified by both libraries. */
function assertDeliveryRequest(r, { eventId, type, attempt, data }) {
  const h = r.headers;
  const where = `request ${r.n} ${JSON.stringify(h)}`;
  assert.equal(r.method, 'POST', where);
  assert.match(h['content-type'] ?? '', /^application\/json/, where);
  assert.equal(h['webhook-id'], eventId, `webhook-id is the event id: ${where}`);
  assert.equal(h['x-event-id'], eventId, `X-Event-Id: ${where}`);
  assert.equal(h['x-event-type'], type, `X-Event-Type: ${where}`);
  if (attempt !== undefined) assert.equal(h['x-delivery-attempt'], String(attempt), `X-Delivery-Attempt: ${where}`);
  assert.match(h['x-request-id'] ?? '', REQUEST_ID_RE, where);
  assert.match(h['webhook-timestamp'] ?? '', /^\d+$/, where);
  const ts = Number(h['webhook-timestamp']);
  assert.ok(Math.abs(ts - r.at / 1000) <= 2, `webhook-timestamp (${ts}) is the unix time of this attempt (${Math.floor(r.at / 1000)})`);
  for (const sig of (h['webhook-signature'] ?? '').split(' ')) assert.match(sig, SIG_RE, where);
  assert.ok(r.verified, `signature verifies with standardwebhooks and svix: ${JSON.stringify(r.verification)}`);
  const body = r.json;
  assert.ok(body && typeof body === 'object', `JSON body: ${r.body.slice(0, 200)}`);
  assert.deepEqual(Object.keys(body).sort(), ['data', 'id', 'timestamp', 'type'], `body fields: ${r.body.slice(0, 300)}`);
  assert.equal(body.id, eventId);
  assert.equal(body.type, type);
  assert.match(body.timestamp, RFC3339_RE);
  assert.ok(!Number.isNaN(Date.parse(body.timestamp)));
  if (data !== undefined) assert.deepEqual(body.data, data);
}

/** Delivery list row shape (§10): the required fields (more may be added, docs/operating-webhooks.md). */
function assertDeliveryRow(d) {
  for (const f of ['attempts_made', 'created_at', 'event_id', 'event_type', 'id', 'next_attempt_at', 'status', 'subscription_id', 'url']) {
    assert.ok(f in d, `delivery lacks "${f}": ${JSON.stringify(d)}`);
  }
  assert.match(d.id, DLV_ID_RE);
  assert.ok(['pending', 'delivered', 'failed', 'dead_letter', 'paused'].includes(d.status), d.status);
  assert.ok(Number.isInteger(d.attempts_made));
  assert.ok(Number.isInteger(d.created_at) && d.created_at > 1.6e12, `created_at is epoch ms: ${d.created_at}`);
  assert.ok(d.next_attempt_at === null || (Number.isInteger(d.next_attempt_at) && d.next_attempt_at > 1.6e12), `next_attempt_at: ${d.next_attempt_at}`);
}

function assertAttemptShape(a) {
  for (const f of ['attempt', 'url', 'status_code', 'error', 'response_excerpt', 'duration_ms', 'request_id', 'at', 'next_retry_at']) {
    assert.ok(f in a, `attempt lacks "${f}": ${JSON.stringify(a)}`);
  }
  assert.ok(Number.isInteger(a.attempt) && a.attempt >= 1);
  assert.match(a.request_id, REQUEST_ID_RE);
  assert.ok(Number.isInteger(a.at) && a.at > 1.6e12, `at is epoch ms: ${a.at}`);
  assert.ok(Number.isInteger(a.duration_ms) && a.duration_ms >= 0);
  assert.ok(a.next_retry_at === null || (Number.isInteger(a.next_retry_at) && a.next_retry_at > 1.6e12));
  if (a.status_code === null) assert.ok(typeof a.error === 'string' && a.error.length > 0, `an attempt without status has an error: ${JSON.stringify(a)}`);
}

// ---------------------------------------------------------------------------------------------
// Every describe block runs concurrently with the others (each test has its own project and
// receivers), except where a block's tests depend on one another.

describe('webhooks', { concurrency: true }, () => {
  describe('subscriptions', { concurrency: true }, () => {
    it('create → 201 with the secret once; list/get without it; delete → 204', async () => {
      const p = await project('crud');
      const rcv = await receiver();
      const t0 = Date.now();
      const res = await api('POST', '/_postguard/v1/webhooks', p.key, { url: `${rcv.url}/hooks`, events: ['payment.succeeded', 'invoice.*'], description: 'billing' });
      assert.equal(res.status, 201, show(res));
      const s = res.json;
      for (const f of ['created_at', 'description', 'events', 'id', 'secret', 'url']) assert.ok(f in s, `subscription lacks "${f}": ${res.text}`);
      assert.match(s.id, SUB_ID_RE);
      assert.equal(s.url, `${rcv.url}/hooks`);
      assert.deepEqual(s.events, ['payment.succeeded', 'invoice.*']);
      assert.equal(s.description, 'billing');
      assert.ok(Number.isInteger(s.created_at) && s.created_at >= t0 - 2000 && s.created_at <= Date.now() + 2000, `created_at epoch ms: ${s.created_at}`);
      assert.match(s.secret, SECRET_RE);
      assert.ok(Buffer.from(s.secret.slice(6), 'base64').length >= 24, 'the secret carries at least 24 random bytes');

      const one = await api('GET', `/_postguard/v1/webhooks/${s.id}`, p.key);
      assert.equal(one.status, 200, show(one));
      const { secret, ...rest } = s;
      // GET adds the endpoint's health (docs/webhooks.md): no attempt yet.
      const idle = { window_s: 86400, attempts: 0, succeeded: 0, failed: 0, success_rate: null, last_attempt_at: null, last_status_code: null, last_error: null, state: 'idle' };
      assert.deepEqual(one.json, { ...rest, health: idle }, 'GET shows the subscription without its secret');
      assert.ok(!one.text.includes(secret.slice(6)));

      const list = await api('GET', '/_postguard/v1/webhooks', p.key);
      assert.equal(list.status, 200, show(list));
      assert.deepEqual(Object.keys(list.json).sort(), ['data', 'next_cursor']);
      assert.deepEqual(list.json.data, [{ ...rest, health: idle }]);
      assert.equal(list.json.next_cursor, null);
      assert.ok(!list.text.includes(secret.slice(6)));

      const del = await api('DELETE', `/_postguard/v1/webhooks/${s.id}`, p.key);
      assert.equal(del.status, 204, show(del));
      assert.equal(del.body.length, 0);
      problem(await api('GET', `/_postguard/v1/webhooks/${s.id}`, p.key), { status: 404, code: 'NOT_FOUND' });
      problem(await api('DELETE', `/_postguard/v1/webhooks/${s.id}`, p.key), { status: 404, code: 'NOT_FOUND' });
      assert.deepEqual((await api('GET', '/_postguard/v1/webhooks', p.key)).json.data, []);

      // A deleted subscription gets nothing.
      const evt = await publish(p.name, 'payment.succeeded', { id: 'pay_deleted' });
      await stays(async () => rcv.requests.length === 0 && (await allDeliveries(p)).length === 0, 2000, `no delivery for ${evt} to a deleted subscription`);
    });

    it('description is optional; list pages newest first with limit and cursor', async () => {
      const p = await project('page');
      const created = [];
      for (let i = 0; i < 3; i++) created.push(await subscribe(p, `https://hooks.example.com/${i}`, ['*']));
      const desc = created[0].description;
      assert.equal(desc, null, 'a subscription created without a description has null');
      const seen = [];
      let cursor = null;
      let pages = 0;
      do {
        const res = await api('GET', `/_postguard/v1/webhooks?limit=2${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`, p.key);
        assert.equal(res.status, 200, show(res));
        assert.ok(res.json.data.length <= 2);
        seen.push(...res.json.data.map((x) => x.id));
        cursor = res.json.next_cursor;
        pages++;
      } while (cursor && pages < 5);
      assert.equal(pages, 2);
      assert.deepEqual(seen, created.map((x) => x.id).reverse(), 'newest first, no duplicates');
      for (const q of ['?limit=0', '?limit=500', '?cursor=garbage']) {
        problem(await api('GET', `/_postguard/v1/webhooks${q}`, p.key), { status: 400, code: 'VALIDATION_ERROR' });
      }
    });

    const badBodies = [
      ['bad JSON', '{"url": '],
      ['missing url', { events: ['*'] }],
      ['missing events', { url: 'https://hooks.example.com/x' }],
      ['url not a string', { url: 7, events: ['*'] }],
      ['events not an array', { url: 'https://hooks.example.com/x', events: '*' }],
      ['events of non-strings', { url: 'https://hooks.example.com/x', events: [1] }],
      ['description not a string', { url: 'https://hooks.example.com/x', events: ['*'], description: 5 }],
    ];
    for (const [name, body] of badBodies) {
      it(`400 VALIDATION_ERROR: ${name}`, async () => {
        const p = await project('bad');
        problem(await api('POST', '/_postguard/v1/webhooks', p.key, body), { status: 400, code: 'VALIDATION_ERROR' });
        assert.deepEqual((await api('GET', '/_postguard/v1/webhooks', p.key)).json.data, [], 'nothing created');
      });
    }

    it('API key auth: missing or unknown key → 401 INVALID_API_KEY', async () => {
      problem(await gw.fetch('/_postguard/v1/webhooks'), { status: 401, code: 'INVALID_API_KEY' });
      problem(await api('GET', '/_postguard/v1/webhooks', `pgk_${'Q'.repeat(43)}`), { status: 401, code: 'INVALID_API_KEY' });
      problem(await gw.fetch('/_postguard/v1/deliveries'), { status: 401, code: 'INVALID_API_KEY' });
      problem(await api('POST', '/_postguard/v1/webhooks', null, { url: 'https://hooks.example.com/x', events: ['*'] }), { status: 401, code: 'INVALID_API_KEY' });
    });
  });

  describe('URL rules (SSRF guard)', { concurrency: true }, () => {
    const rejected = [
      'https://10.0.0.1/x',
      'ftp://hooks.example.com/x',
      'http://localhost/',
      'https://localhost./',
      'https://LOCALHOST/x',
      'https://user:pw@example.com/',
      'https://user@example.com/',
      'https://192.168.1.10/',
      'https://172.16.0.1/',
      'https://169.254.169.254/latest/meta-data',
      'https://100.64.0.1/',
      'https://127.0.0.2/',
      'https://0.0.0.0/',
      'https://0.1.2.3/',
      'https://224.0.0.1/',
      'https://255.255.255.255/',
      'https://[::1]/',
      'https://[::]/',
      'https://[fe80::1]/',
      'https://[fc00::1]/',
      'https://[::ffff:10.0.0.1]/',
      'https://[::ffff:169.254.169.254]/',
      'https://167772161/',
      'https://0x0a.0.0.1/',
      'https://%31%30.0.0.1/',
      'https://example.com:99999/',
      'javascript:alert(1)',
      'file:///etc/passwd',
      'not a url',
      '',
    ];
    for (const url of rejected) {
      it(`rejects ${JSON.stringify(url)} → 400 VALIDATION_ERROR`, async () => {
        const p = await project('ssrf');
        problem(await api('POST', '/_postguard/v1/webhooks', p.key, { url, events: ['*'] }), { status: 400, code: 'VALIDATION_ERROR' });
      });
    }

    it('a Unicode host is refused with the Punycode hint; its xn-- form is accepted (no IDNA in the build, ADR 0019)', async () => {
      const p = await project('ssrf-idn');
      for (const url of ['https://bücher.example/hook', 'https://ｌｏｃａｌｈｏｓｔ/']) {
        const err = problem(await api('POST', '/_postguard/v1/webhooks', p.key, { url, events: ['*'] }), { status: 400, code: 'VALIDATION_ERROR' });
        assert.match(err.detail, /must be ASCII.*xn--/, url);
      }
      const sub = await subscribe(p, 'https://XN--bcher-kva.example/hook', ['*']);
      const got = await api('GET', `/_postguard/v1/webhooks/${sub.id}`, p.key);
      assert.equal(got.json.url, 'https://xn--bcher-kva.example/hook', 'stored lower-cased, as given otherwise');
    });

    it('accepts a public https URL, and the allow-listed 127.0.0.1 over http (test config)', async () => {
      const p = await project('ssrf-ok');
      await subscribe(p, 'https://hooks.example.com/stripe?x=1', ['*']);
      await subscribe(p, 'http://127.0.0.1:9/hook', ['*']);
    });

    describe('under the default webhook config (no insecure URLs, no allow_hosts)', () => {
      let strict;
      before(async () => {
        strict = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ plans: { big: { requests_per_window: 100000 } } }) } });
      });
      after(async () => strict?.dispose());

      it('plain http and 127.0.0.1 are rejected; https to a public host is accepted', async () => {
        const k = await strict.createKey({ project: uniq('wh-strict'), plan: 'big' });
        const post = (url) => strict.admin('POST', '/_postguard/v1/webhooks', { url, events: ['*'] }, { token: k.key });
        problem(await post('http://hooks.example.com/x'), { status: 400, code: 'VALIDATION_ERROR' });
        problem(await post('https://127.0.0.1/x'), { status: 400, code: 'VALIDATION_ERROR' });
        problem(await post('http://127.0.0.1:8080/x'), { status: 400, code: 'VALIDATION_ERROR' });
        const ok = await post('https://hooks.example.com/x');
        assert.equal(ok.status, 201, show(ok));
      });
    });
  });

  describe('publishing events', { concurrency: true }, () => {
    it('202 {id}: a generated evt_ id, or the given id as-is', async () => {
      const p = await project('pub');
      const gen = await api('POST', '/_postguard/v1/events', ORIGIN_TOKEN, { project: p.name, type: 'payment.succeeded', data: { id: 'pay_1' } });
      assert.equal(gen.status, 202, show(gen));
      assert.match(gen.json.id, EVT_ID_RE);
      const given = await api('POST', '/_postguard/v1/events', ORIGIN_TOKEN, { project: p.name, type: 'payment.succeeded', data: { id: 'pay_2' }, id: 'order-42-paid' });
      assert.equal(given.status, 202, show(given));
      assert.equal(given.json.id, 'order-42-paid');
    });

    it('the same id twice → 202 with that id, no second fan-out', async () => {
      const p = await project('dup');
      const rcv = await receiver();
      const sub = await subscribe(p, `${rcv.url}/dup`, ['*'], { rcv });
      const id = uniq('evt-dup');
      assert.equal(await publish(p.name, 'order.created', { id: 'ord_1' }, id), id);
      assert.equal(await publish(p.name, 'order.created', { id: 'ord_1' }, id), id);
      const d = await deliveryOf(p, id, sub.id);
      await settled(p, d.id);
      assertDeliveryRequest(rcv.requests[0], { eventId: id, type: 'order.created', attempt: 1, data: { id: 'ord_1' } });
      await stays(async () => rcv.requests.length === 1 && (await allDeliveries(p)).length === 1, 2500, 'exactly one delivery and one request for a re-published id');
    });

    it('the same id published 8 times at once → 202 with that id every time, one delivery per subscription', async () => {
      const p = await project('dup-burst');
      const rcv = await receiver();
      const sub = await subscribe(p, rcv.url, ['*'], { rcv });
      const id = uniq('evt-burst');
      const body = JSON.stringify({ project: p.name, type: 'order.created', data: { id: 'ord_b' }, id });
      const req = { method: 'POST', path: '/_postguard/v1/events', headers: { authorization: `Bearer ${ORIGIN_TOKEN}`, 'content-type': 'application/json' }, body };
      const out = await burst(gw.url, Array.from({ length: 8 }, () => req));
      const answers = out.map((r) => `${r.status} ${r.text.slice(0, 200)}`);
      assert.deepEqual(out.map((r) => r.status), Array(8).fill(202), `every concurrent publish of one id is a 202: ${JSON.stringify(answers)}`);
      for (const r of out) assert.equal(r.json?.id, id);
      const d = await deliveryOf(p, id, sub.id);
      await settled(p, d.id);
      await stays(async () => rcv.requests.length === 1 && (await allDeliveries(p)).length === 1, 2000, 'one delivery, one request');
    });

    it('auth: missing/wrong token → 401 UNAUTHORIZED; API key or ADMIN_TOKEN → 403 FORBIDDEN', async () => {
      const p = await project('pubauth');
      const body = { project: p.name, type: 'x.y', data: {} };
      for (const token of [null, 'wrong-token', `${ORIGIN_TOKEN}x`, ORIGIN_TOKEN.slice(0, -1)]) {
        const pr = problem(await api('POST', '/_postguard/v1/events', token, body), { status: 401, code: 'UNAUTHORIZED' });
        assert.match(pr.request_id, REQUEST_ID_RE);
      }
      problem(await api('POST', '/_postguard/v1/events', p.key, body), { status: 403, code: 'FORBIDDEN' });
      problem(await api('POST', '/_postguard/v1/events', ADMIN_TOKEN, body), { status: 403, code: 'FORBIDDEN' });
      // The origin token is a credential of the wrong kind on the subscription/delivery endpoints.
      problem(await api('GET', '/_postguard/v1/webhooks', ORIGIN_TOKEN), { status: 403, code: 'FORBIDDEN' });
      problem(await api('GET', '/_postguard/v1/deliveries', ORIGIN_TOKEN), { status: 403, code: 'FORBIDDEN' });
    });

    const badEvents = [
      ['bad JSON', '{"project":'],
      ['empty body', ''],
      ['JSON array', '[]'],
      ['missing project', { type: 'x.y', data: {} }],
      ['missing type', { project: 'wh-bad', data: {} }],
      ['type not a string', { project: 'wh-bad', type: 5, data: {} }],
      ['empty type', { project: 'wh-bad', type: '', data: {} }],
      ['project not a string', { project: ['a'], type: 'x.y', data: {} }],
      ['data not an object', { project: 'wh-bad', type: 'x.y', data: 'hello' }],
      ['id not a string', { project: 'wh-bad', type: 'x.y', data: {}, id: 42 }],
      ['empty id', { project: 'wh-bad', type: 'x.y', data: {}, id: '' }],
    ];
    for (const [name, body] of badEvents) {
      it(`400 VALIDATION_ERROR: ${name}`, async () => {
        problem(await api('POST', '/_postguard/v1/events', ORIGIN_TOKEN, body), { status: 400, code: 'VALIDATION_ERROR' });
      });
    }
  });

  describe('delivery', { concurrency: true }, () => {
    it('delivered the first time: every header, the exact body, both libraries verify; the log shows it', async () => {
      const p = await project('first');
      const rcv = await receiver(() => ({ status: 200, body: 'thanks' }));
      const sub = await subscribe(p, `${rcv.url}/in?src=pg`, ['*'], { rcv });
      const data = { id: 'pay_123', amount: 4200, currency: 'eur', nested: { ok: true, list: [1, 'two', null] }, unicode: 'żółw ✓' };
      const t0 = Date.now();
      const evt = await publish(p.name, 'payment.succeeded', data);
      assert.match(evt, EVT_ID_RE);

      const [r] = await rcv.waitFor((rs) => rs.length >= 1 && rs, { message: 'the first delivery' });
      assert.equal(r.path, '/in?src=pg', 'the subscription URL with its query');
      assertDeliveryRequest(r, { eventId: evt, type: 'payment.succeeded', attempt: 1, data });
      const ts = Date.parse(r.json.timestamp);
      assert.ok(ts >= t0 && ts <= r.at, `timestamp is the event's time, between the publish (${t0}) and the delivery (${r.at}): ${r.json.timestamp}`);
      assert.equal(r.headers['webhook-signature'].split(' ').length, 1, 'one signature for one active secret');
      // The libraries really check: a tampered body or a wrong secret fails with both.
      const tampered = verifyBoth(sub.secret, r.body.replace('4200', '4201'), r.headers);
      assert.notEqual(tampered.standardwebhooks, true);
      assert.notEqual(tampered.svix, true);
      const wrong = verifyBoth(`whsec_${crypto.randomBytes(32).toString('base64')}`, r.body, r.headers);
      assert.notEqual(wrong.standardwebhooks, true);
      assert.notEqual(wrong.svix, true);

      const row = await deliveryOf(p, evt, sub.id);
      const d = await waitDelivery(p, row.id, (x) => x.status === 'delivered', { message: 'status delivered' });
      assertDeliveryRow(d);
      assert.deepEqual(d.payload, r.json, 'GET /deliveries/{id} shows the body the receiver got');
      assert.equal(d.event_id, evt);
      assert.equal(d.event_type, 'payment.succeeded');
      assert.equal(d.subscription_id, sub.id);
      assert.equal(d.url, sub.url);
      assert.equal(d.attempts_made, 1);
      assert.equal(d.next_attempt_at, null, 'nothing scheduled after delivery');
      assert.ok(d.created_at >= t0 - 2000 && d.created_at <= r.at + 2000);
      assert.equal(d.attempts.length, 1);
      const [a] = d.attempts;
      assertAttemptShape(a);
      assert.equal(a.attempt, 1);
      assert.equal(a.status_code, 200);
      assert.equal(a.url, sub.url);
      assert.equal(a.request_id, r.headers['x-request-id'], 'the attempt records the X-Request-Id it sent');
      assert.equal(a.error, null, 'no error on success');
      assert.equal(a.next_retry_at, null);
      assert.ok((a.response_excerpt ?? '').includes('thanks'), `response excerpt: ${a.response_excerpt}`);
      assert.ok(a.at <= r.at && r.at <= a.at + a.duration_ms, `the receiver got it (${r.at}) within the attempt (${a.at} + ${a.duration_ms} ms)`);
      await stays(() => rcv.requests.length === 1, 1500, 'a delivered event is not sent again');
    });

    it('503, 503, 200 → delivered at attempt 3 on the schedule; the log has all three attempts', async () => {
      const p = await project('retry');
      const rcv = await receiver((req, n) => (n <= 2 ? { status: 503, body: `busy-${n}` } : { status: 204 }));
      const sub = await subscribe(p, `${rcv.url}/h`, ['payment.*'], { rcv });
      const evt = await publish(p.name, 'payment.failed', { id: 'pay_9' });
      const row = await deliveryOf(p, evt, sub.id);

      await rcv.waitFor((rs) => rs.length >= 1, { message: 'attempt 1' });
      const mid = await getDelivery(p, row.id);
      assert.ok(['pending', 'failed'].includes(mid.status), `between attempts the delivery is pending or failed, got ${mid.status}`);

      const reqs = await rcv.waitFor((rs) => rs.length >= 3 && rs, { timeout: 20000, message: 'three attempts' });
      const log = JSON.stringify(await getDelivery(p, row.id));
      assert.deepEqual(reqs.map((r) => r.attempt), [1, 2, 3], `X-Delivery-Attempt of the received requests; delivery log: ${log}`);
      reqs.forEach((r, i) => assertDeliveryRequest(r, { eventId: evt, type: 'payment.failed', attempt: i + 1, data: { id: 'pay_9' } }));
      assert.equal(new Set(reqs.map((r) => r.headers['x-request-id'])).size, 3, 'a new X-Request-Id per attempt');
      assert.equal(new Set(reqs.map((r) => r.body)).size, 1, 'the same body on every attempt');
      assert.ok(reqs[1].at - reqs[0].at >= SCHEDULE[0] * 1000 - EARLY_MS, `attempt 2 ${reqs[1].at - reqs[0].at} ms after 1 (schedule ${SCHEDULE[0]} s)`);
      assert.ok(reqs[2].at - reqs[1].at >= SCHEDULE[1] * 1000 - EARLY_MS, `attempt 3 ${reqs[2].at - reqs[1].at} ms after 2 (schedule ${SCHEDULE[1]} s)`);

      const d = await waitDelivery(p, row.id, (x) => x.status === 'delivered', { message: 'delivered' });
      assert.equal(d.attempts_made, 3);
      assert.equal(d.next_attempt_at, null);
      const attempts = [...d.attempts].sort((x, y) => x.attempt - y.attempt);
      assert.deepEqual(attempts.map((a) => a.attempt), [1, 2, 3]);
      assert.deepEqual(attempts.map((a) => a.status_code), [503, 503, 204]);
      attempts.forEach(assertAttemptShape);
      attempts.forEach((a, i) => assert.equal(a.request_id, reqs[i].headers['x-request-id'], `attempt ${i + 1} request_id`));
      assert.ok(attempts[0].response_excerpt?.includes('busy-1'), `excerpt of attempt 1: ${attempts[0].response_excerpt}`);
      for (const [i, a] of attempts.slice(0, 2).entries()) {
        assert.ok(Number.isInteger(a.next_retry_at), `failed attempt ${i + 1} has next_retry_at`);
        assert.ok(a.next_retry_at - a.at >= SCHEDULE[i] * 1000 - 1000, `next_retry_at - at = ${a.next_retry_at - a.at} ms (schedule ${SCHEDULE[i]} s)`);
      }
      assert.equal(attempts[2].next_retry_at, null);
      await stays(() => rcv.requests.length === 3, 1500, 'no attempt after success');
    });

    it('429 with Retry-After: 3 → the next attempt ≥ 3 s later, not on the 1 s schedule', async () => {
      const p = await project('429');
      const rcv = await receiver((req, n) => (n === 1 ? { status: 429, headers: { 'retry-after': '3' }, body: 'slow down' } : { status: 200 }));
      const sub = await subscribe(p, rcv.url, ['*'], { rcv });
      const evt = await publish(p.name, 'invoice.paid', { id: 'in_1' });
      const reqs = await rcv.waitFor((rs) => rs.length >= 2 && rs, { timeout: 15000, message: 'the attempt after 429' });
      const gap = reqs[1].at - reqs[0].at;
      assert.ok(gap >= 3000 - EARLY_MS, `attempt 2 came ${gap} ms after the 429 with Retry-After: 3`);
      assertDeliveryRequest(reqs[1], { eventId: evt, type: 'invoice.paid', attempt: 2 });
      const row = await deliveryOf(p, evt, sub.id);
      const d = await waitDelivery(p, row.id, (x) => x.status === 'delivered');
      const [a1, a2] = [...d.attempts].sort((x, y) => x.attempt - y.attempt);
      assert.equal(a1.status_code, 429);
      assert.ok(a1.next_retry_at - a1.at >= 3000 - 1000, `next_retry_at (${a1.next_retry_at}) - at (${a1.at}) honours Retry-After: 3`);
      assert.ok(a2.at - a1.at >= 3000 - EARLY_MS - 1000, `attempt 2 at - attempt 1 at = ${a2.at - a1.at}`);
      assert.ok(a2.at >= a1.next_retry_at - 1000, `attempt 2 (${a2.at}) not before next_retry_at (${a1.next_retry_at})`);
      assert.equal(a2.status_code, 200);
    });

    it('429 with a huge Retry-After is bounded to max(schedule)', async () => {
      const p = await project('429big');
      const rcv = await receiver((req, n) => (n === 1 ? { status: 429, headers: { 'retry-after': '100000' } } : { status: 200 }));
      const sub = await subscribe(p, rcv.url, ['*'], { rcv });
      const evt = await publish(p.name, 'invoice.paid', { id: 'in_2' });
      const max = Math.max(...SCHEDULE);
      // Bounded as planned (the recorded next retry), not as timed: the wait itself is generous.
      await rcv.waitFor((rs) => rs.length >= 2 && rs, { timeout: 60000, message: `the attempt after 429 (Retry-After bounded to ${max} s)` });
      const row = await deliveryOf(p, evt, sub.id);
      const d = await waitDelivery(p, row.id, (x) => x.status === 'delivered');
      const [a1] = [...d.attempts].sort((x, y) => x.attempt - y.attempt);
      assert.equal(a1.status_code, 429);
      // Planned from the end of the attempt; the margin is for a loaded machine's delay between the
      // answer and the decision, and is nothing next to the 100,000 s asked for.
      const planned = a1.next_retry_at - (a1.at + a1.duration_ms);
      assert.ok(planned <= max * 1000 + 5000, `next retry planned ${planned} ms after the attempt, bounded to max(schedule) = ${max} s, not 100000 s`);
    });

    it('429 with an HTTP-date Retry-After is honoured too', async () => {
      const p = await project('429date');
      const rcv = await receiver((req, n) => (n === 1 ? { status: 429, headers: { 'retry-after': new Date(Date.now() + 4000).toUTCString() } } : { status: 200 }));
      const sub = await subscribe(p, rcv.url, ['*'], { rcv });
      const evt = await publish(p.name, 'invoice.paid', { id: 'in_3' });
      const reqs = await rcv.waitFor((rs) => rs.length >= 2 && rs, { timeout: 15000, message: 'the attempt after 429' });
      const gap = reqs[1].at - reqs[0].at;
      assert.ok(gap >= 1900, `attempt 2 came ${gap} ms after a 429 asking for 3–4 s (the schedule would say ${SCHEDULE[0]} s)`);
      const row = await deliveryOf(p, evt, sub.id);
      await waitDelivery(p, row.id, (x) => x.status === 'delivered');
    });

    it('a 3xx is a failure to retry, never followed (the Location is not called)', async () => {
      const p = await project('3xx');
      const elsewhere = await receiver();
      const rcv = await receiver((req, n) => (n === 1 ? { status: 302, headers: { location: `${elsewhere.url}/stolen` } } : { status: 200 }));
      const sub = await subscribe(p, rcv.url, ['*'], { rcv });
      const evt = await publish(p.name, 'invoice.paid', { id: 'in_4' });
      const row = await deliveryOf(p, evt, sub.id);
      const d = await waitDelivery(p, row.id, (x) => x.status === 'delivered', { timeout: 15000 });
      assert.deepEqual([...d.attempts].sort((x, y) => x.attempt - y.attempt).map((a) => a.status_code), [302, 200]);
      assert.equal(elsewhere.requests.length, 0, 'the redirect target got nothing');
    });

    it('a subscription deleted while retries are pending: no more attempts, the delivery ends dead_letter', async () => {
      const p = await project('del-pending');
      const rcv = await receiver(() => ({ status: 500 }));
      const sub = await subscribe(p, rcv.url, ['*'], { rcv });
      const evt = await publish(p.name, 'invoice.paid', { id: 'in_5' });
      const row = await deliveryOf(p, evt, sub.id);
      await waitDelivery(p, row.id, (x) => x.attempts_made >= 1, { message: 'attempt 1' });
      assert.equal((await api('DELETE', `/_postguard/v1/webhooks/${sub.id}`, p.key)).status, 204);
      const n = rcv.requests.length;
      const d = await waitDelivery(p, row.id, (x) => x.status === 'dead_letter', { timeout: 15000, message: 'dead_letter after the subscription is gone' });
      assert.ok(rcv.requests.length <= n + 1, 'at most an attempt already under way');
      await stays(() => rcv.requests.length <= n + 1, 2500, 'no attempts to a deleted subscription');
      const last = [...d.attempts].sort((x, y) => x.attempt - y.attempt).at(-1);
      assert.ok(typeof last.error === 'string' && last.error.length > 0, `the reason is recorded: ${JSON.stringify(last)}`);
    });

    it('401 and 410 → dead_letter after exactly one attempt, no retry', async () => {
      const p = await project('4xx');
      const r401 = await receiver(() => ({ status: 401, body: 'who are you' }));
      const r410 = await receiver(() => ({ status: 410, body: 'gone' }));
      const s401 = await subscribe(p, r401.url, ['*'], { rcv: r401 });
      const s410 = await subscribe(p, r410.url, ['*'], { rcv: r410 });
      const evt = await publish(p.name, 'customer.deleted', { id: 'cus_1' });
      for (const [sub, rcv, code] of [[s401, r401, 401], [s410, r410, 410]]) {
        const row = await deliveryOf(p, evt, sub.id);
        const d = await waitDelivery(p, row.id, (x) => x.status === 'dead_letter', { timeout: 10000, message: `${code} → dead_letter` });
        assert.equal(d.attempts_made, 1);
        assert.equal(d.attempts.length, 1);
        assert.equal(d.attempts[0].status_code, code);
        assert.equal(d.attempts[0].next_retry_at, null);
        assert.equal(d.next_attempt_at, null);
        assertDeliveryRequest(rcv.requests[0], { eventId: evt, type: 'customer.deleted', attempt: 1 });
      }
      // Past the first retry delay (and then some): nothing else arrives, nothing changes. (The
      // 410 also disables its subscription, and the operational event postguard.subscription.disabled
      // goes to the other, "*" subscription: docs/operating-webhooks.md, tests/webhooks-ops.test.mjs.)
      await stays(async () => {
        if (r401.forEvent(evt).length !== 1 || r410.forEvent(evt).length !== 1) return false;
        const ds = (await allDeliveries(p)).filter((x) => x.event_id === evt);
        return ds.length === 2 && ds.every((x) => x.status === 'dead_letter' && x.attempts_made === 1);
      }, 3000, 'a 401/410 is never retried');
    });

    it('a receiver that hangs → timeout recorded as an error, then retried and delivered', async () => {
      const p = await project('hang');
      const rcv = await receiver('hang');
      const sub = await subscribe(p, rcv.url, ['*'], { rcv });
      const evt = await publish(p.name, 'report.ready', { id: 'rep_1' });
      await rcv.waitFor((rs) => rs.length >= 1, { message: 'attempt 1' });
      await rcv.setBehaviour(() => ({ status: 200 }));
      const reqs = await rcv.waitFor((rs) => rs.length >= 2 && rs, { timeout: TIMEOUT_MS + 20000, message: 'attempt 2' });
      assertDeliveryRequest(reqs[1], { eventId: evt, type: 'report.ready', attempt: 2 });
      const row = await deliveryOf(p, evt, sub.id);
      const d = await waitDelivery(p, row.id, (x) => x.status === 'delivered');
      const [a1] = [...d.attempts].sort((x, y) => x.attempt - y.attempt);
      assert.equal(a1.status_code, null);
      assert.ok(typeof a1.error === 'string' && a1.error.length > 0, `timeout error: ${JSON.stringify(a1)}`);
      assert.ok(a1.error.includes(`${TIMEOUT_MS} ms`), `the configured timeout ended it: ${a1.error}`);
      assert.ok(a1.duration_ms >= TIMEOUT_MS - 100, `the attempt lasted the ${TIMEOUT_MS} ms timeout: ${a1.duration_ms} ms`);
    });

    it('fan-out: one delivery per matching subscription (*, payment.*, invoice.paid)', async () => {
      const p = await project('fan');
      const all = await receiver();
      const pay = await receiver();
      const inv = await receiver();
      const sAll = await subscribe(p, all.url, ['*'], { rcv: all });
      const sPay = await subscribe(p, pay.url, ['payment.*'], { rcv: pay });
      const sInv = await subscribe(p, inv.url, ['invoice.paid'], { rcv: inv });
      const expect = {
        'payment.succeeded': [sAll, sPay],
        'payment.refund.created': [sAll, sPay],
        'invoice.paid': [sAll, sInv],
        'invoice.voided': [sAll],
        'customer.created': [sAll],
        'paymentx.succeeded': [sAll],
      };
      const events = {};
      for (const type of Object.keys(expect)) events[type] = await publish(p.name, type, { id: `obj_${type}` });
      const total = Object.values(expect).reduce((n, l) => n + l.length, 0);
      const ds = await poll(async () => {
        const x = await allDeliveries(p);
        return x.length >= total && x.every((d) => FINAL.has(d.status)) && x;
      }, { timeout: 15000, message: `${total} deliveries settled` });
      for (const [type, subs] of Object.entries(expect)) {
        const got = ds.filter((d) => d.event_id === events[type]).map((d) => d.subscription_id).sort();
        assert.deepEqual(got, subs.map((s) => s.id).sort(), `deliveries of ${type}`);
        for (const d of ds.filter((x) => x.event_id === events[type])) assert.equal(d.event_type, type);
      }
      assert.equal(ds.length, total, 'no extra deliveries');
      assert.ok(ds.every((d) => d.status === 'delivered'));
      const rcvOf = new Map([[sAll.id, all], [sPay.id, pay], [sInv.id, inv]]);
      for (const [sid, rcv] of rcvOf) {
        const types = Object.keys(expect).filter((t) => expect[t].some((s) => s.id === sid));
        assert.deepEqual(rcv.requests.map((r) => r.headers['x-event-type']).sort(), [...types].sort(), `requests to ${sid}`);
        for (const r of rcv.requests) assertDeliveryRequest(r, { eventId: events[r.headers['x-event-type']], type: r.headers['x-event-type'], attempt: 1 });
      }
      // Newest first.
      for (let i = 1; i < ds.length; i++) assert.ok(ds[i - 1].created_at >= ds[i].created_at, 'deliveries newest first');
    });

    it('an event over 64 KiB is delivered with data exactly {id, truncated: true}; a smaller one intact', async () => {
      const p = await project('big');
      const rcv = await receiver();
      await subscribe(p, rcv.url, ['*'], { rcv });
      const bigData = { id: 'obj_big_1', blob: 'x'.repeat(100 * 1024), more: { a: 1 } };
      const smallData = { id: 'obj_small_1', blob: 'y'.repeat(32 * 1024) };
      const big = await publish(p.name, 'file.uploaded', bigData);
      const small = await publish(p.name, 'file.uploaded', smallData);
      await rcv.waitFor((rs) => rs.length >= 2, { timeout: 15000, message: 'both events' });
      const rb = rcv.forEvent(big)[0];
      const rs = rcv.forEvent(small)[0];
      assertDeliveryRequest(rb, { eventId: big, type: 'file.uploaded' });
      assert.deepEqual(rb.json.data, { id: 'obj_big_1', truncated: true });
      assert.deepEqual(Object.keys(rb.json.data), ['id', 'truncated']);
      assert.ok(rb.body.length < 1024, `the truncated body is small: ${rb.body.length} bytes`);
      assertDeliveryRequest(rs, { eventId: small, type: 'file.uploaded', data: smallData });
    });
  });

  describe('dead letter and manual retry', { concurrency: false }, () => {
    let p;
    let rcv;
    let sub;
    let evt;
    let dlv;

    it(`a receiver down for the whole schedule → dead_letter after ${MAX_ATTEMPTS} attempts, each with an error`, async () => {
      p = await project('down');
      rcv = await receiver('down');
      sub = await subscribe(p, `${rcv.url}/down`, ['*'], { rcv });
      evt = await publish(p.name, 'payout.paid', { id: 'po_1' });
      dlv = (await deliveryOf(p, evt, sub.id)).id;
      const total = SCHEDULE.reduce((a, b) => a + b, 0);
      const d = await waitDelivery(p, dlv, (x) => x.status === 'dead_letter', { timeout: (total + 15) * 1000, message: 'dead_letter' });
      assert.equal(d.attempts_made, MAX_ATTEMPTS);
      assert.equal(d.next_attempt_at, null);
      const attempts = [...d.attempts].sort((x, y) => x.attempt - y.attempt);
      assert.deepEqual(attempts.map((a) => a.attempt), [1, 2, 3, 4, 5].slice(0, MAX_ATTEMPTS));
      for (const a of attempts) {
        assertAttemptShape(a);
        assert.equal(a.status_code, null);
        assert.ok(typeof a.error === 'string' && a.error.trim().length > 0, `attempt ${a.attempt} error: ${JSON.stringify(a.error)}`);
        assert.equal(a.url, sub.url);
      }
      assert.equal(new Set(attempts.map((a) => a.request_id)).size, MAX_ATTEMPTS, 'a new request id per attempt');
      for (let i = 1; i < attempts.length; i++) {
        const gap = attempts[i].at - attempts[i - 1].at;
        assert.ok(gap >= SCHEDULE[i - 1] * 1000 - EARLY_MS - 1000, `attempt ${i + 1} ${gap} ms after attempt ${i} (schedule ${SCHEDULE[i - 1]} s)`);
        // While it was retrying, each failed attempt named when the next was due: the
        // schedule's step after it, and the next attempt came no earlier.
        const planned = attempts[i - 1].next_retry_at;
        assert.ok(Number.isInteger(planned), `attempt ${i} planned a retry: ${planned}`);
        assert.ok(Math.abs(planned - attempts[i - 1].at - SCHEDULE[i - 1] * 1000) <= 1000, `attempt ${i} planned its retry ${planned - attempts[i - 1].at} ms later (schedule ${SCHEDULE[i - 1]} s)`);
        assert.ok(attempts[i].at >= planned - EARLY_MS, `attempt ${i + 1} at ${attempts[i].at}, planned ${planned}`);
      }
      assert.equal(attempts.at(-1).next_retry_at, null, 'no retry after the last attempt');
      const listed = await listDeliveries(p, '?status=dead_letter');
      assert.deepEqual(listed.data.map((x) => x.id), [dlv]);
      await stays(async () => (await getDelivery(p, dlv)).attempts_made === MAX_ATTEMPTS, 2000, 'nothing is retried after dead_letter');
    });

    it(`receiver back, POST retry → 202, attempt ${MAX_ATTEMPTS + 1} with a new request id, delivered`, async () => {
      assert.ok(dlv, 'needs the dead-lettered delivery of the previous test');
      await rcv.setBehaviour(() => ({ status: 200 }));
      const res = await api('POST', `/_postguard/v1/deliveries/${dlv}/retry`, p.key);
      assert.equal(res.status, 202, show(res));
      const [r] = await rcv.waitFor((rs) => rs.length >= 1 && rs, { timeout: 10000, message: 'the manual retry' });
      assertDeliveryRequest(r, { eventId: evt, type: 'payout.paid', attempt: MAX_ATTEMPTS + 1, data: { id: 'po_1' } });
      const d = await waitDelivery(p, dlv, (x) => x.status === 'delivered', { message: 'delivered after the manual retry' });
      assert.equal(d.attempts_made, MAX_ATTEMPTS + 1);
      const attempts = [...d.attempts].sort((x, y) => x.attempt - y.attempt);
      const last = attempts.at(-1);
      assert.equal(last.attempt, MAX_ATTEMPTS + 1);
      assert.equal(last.status_code, 200);
      assert.equal(last.request_id, r.headers['x-request-id']);
      assert.ok(!attempts.slice(0, -1).some((a) => a.request_id === last.request_id), 'the retry has a new request id');
      assert.equal(d.url, sub.url);
      await stays(() => rcv.requests.length === 1, 1500, 'one request per manual retry');
    });

    it('a manual retry that fails while an automatic retry is pending does not cancel the schedule', async () => {
      const q = await project('retry-pending');
      // 1: 429 (Retry-After 3 → automatic attempt in 3 s); 2: the manual retry, 503; then 200.
      const r = await receiver((req, n) => (n === 1 ? { status: 429, headers: { 'retry-after': '3' } } : n === 2 ? { status: 503 } : { status: 200 }));
      const s = await subscribe(q, r.url, ['*'], { rcv: r });
      const e = await publish(q.name, 'payout.failed', { id: 'po_p' });
      const row = await deliveryOf(q, e, s.id);
      await waitDelivery(q, row.id, (x) => x.attempts_made === 1, { message: 'attempt 1 recorded' });
      const res = await api('POST', `/_postguard/v1/deliveries/${row.id}/retry`, q.key);
      assert.equal(res.status, 202, show(res));
      await r.waitFor((rs) => rs.length >= 2, { message: 'the manual retry' });
      assert.equal(r.requests[1].attempt, 2, 'the manual retry is attempt 2');
      const mid = await waitDelivery(q, row.id, (x) => x.attempts_made === 2, { message: 'the manual retry recorded' });
      let reqs;
      try {
        reqs = await r.waitFor((rs) => rs.length >= 3 && rs, { timeout: 12000, message: 'the automatic retries to go on after the failed manual retry' });
      } catch (err) {
        throw new Error(`${err.message}; delivery now: ${JSON.stringify(await getDelivery(q, row.id))}`);
      }
      assert.ok(!(mid.status === 'failed' && mid.next_attempt_at === null), `a failed delivery always has a next attempt: ${JSON.stringify(mid)}`);
      assert.equal(reqs[2].attempt, 3);
      await waitDelivery(q, row.id, (x) => x.status === 'delivered', { message: 'delivered on the schedule' });
    });

    it('attempt numbers stay unique: a redirect and then a manual retry', async () => {
      const q = await project('redir-retry');
      const r = await receiver(() => ({ status: 401 }));
      const s = await subscribe(q, r.url, ['*'], { rcv: r });
      const e = await publish(q.name, 'payout.failed', { id: 'po_rr' });
      const row = await deliveryOf(q, e, s.id);
      await waitDelivery(q, row.id, (x) => x.status === 'dead_letter', { timeout: 10000 });
      const inspector = await receiver();
      inspector.setSecrets([s.secret]);
      assert.equal((await api('POST', `/_postguard/v1/deliveries/${row.id}/redirect`, q.key, { url: inspector.url })).status, 202);
      await inspector.waitFor((rs) => rs.length >= 1, { message: 'the redirect' });
      await r.setBehaviour(() => ({ status: 200 }));
      // The redirect is recorded asynchronously; let it land before retrying.
      await poll(async () => (await getDelivery(q, row.id)).attempts.length >= 2, { message: 'the redirect recorded' });
      assert.equal((await api('POST', `/_postguard/v1/deliveries/${row.id}/retry`, q.key)).status, 202);
      const [, retried] = await r.waitFor((rs) => rs.length >= 2 && rs, { message: 'the manual retry' });
      const d = await waitDelivery(q, row.id, (x) => x.status === 'delivered');
      const nums = d.attempts.map((a) => a.attempt);
      assert.equal(new Set(nums).size, nums.length, `attempt numbers are unique in the log: ${JSON.stringify(d.attempts.map((a) => [a.attempt, a.url, a.status_code]))}`);
      assert.ok(retried.attempt > Math.max(1, inspector.requests[0].attempt ?? 0), `the manual retry (X-Delivery-Attempt ${retried.attempt}) continues after every earlier attempt (redirect was ${inspector.requests[0].attempt})`);
    });

    it('retry/redirect of an unknown delivery → 404 NOT_FOUND', async () => {
      const q = await project('unknown');
      problem(await api('GET', '/_postguard/v1/deliveries/dlv_doesnotexist', q.key), { status: 404, code: 'NOT_FOUND' });
      problem(await api('POST', '/_postguard/v1/deliveries/dlv_doesnotexist/retry', q.key), { status: 404, code: 'NOT_FOUND' });
      problem(await api('POST', '/_postguard/v1/deliveries/dlv_doesnotexist/redirect', q.key, { url: 'https://hooks.example.com/x' }), { status: 404, code: 'NOT_FOUND' });
    });
  });

  describe('redirect', { concurrency: true }, () => {
    it('sends once, signed, with the same webhook-id, to another URL; the original delivery is unchanged', async () => {
      const p = await project('redir');
      const rcv = await receiver();
      const sub = await subscribe(p, `${rcv.url}/orig`, ['*'], { rcv });
      const evt = await publish(p.name, 'payment.succeeded', { id: 'pay_r' });
      const row = await deliveryOf(p, evt, sub.id);
      const prior = await waitDelivery(p, row.id, (x) => x.status === 'delivered');
      const original = rcv.requests[0];

      const inspector = await receiver(() => ({ status: 200, body: 'inspected' }));
      inspector.setSecrets(Object.keys(original.verification)); // the subscription's secret signs the redirect
      const res = await api('POST', `/_postguard/v1/deliveries/${row.id}/redirect`, p.key, { url: `${inspector.url}/inspect` });
      assert.equal(res.status, 202, show(res));
      const [r] = await inspector.waitFor((rs) => rs.length >= 1 && rs, { message: 'the redirected request' });
      assert.equal(r.path, '/inspect');
      assertDeliveryRequest(r, { eventId: evt, type: 'payment.succeeded', data: { id: 'pay_r' } });
      assert.equal(r.headers['webhook-id'], original.headers['webhook-id'], 'same webhook-id');
      assert.notEqual(r.headers['x-request-id'], original.headers['x-request-id'], 'a new request id');

      const now = await getDelivery(p, row.id);
      assert.equal(now.url, prior.url);
      assert.equal(now.status, 'delivered');
      assert.equal(now.subscription_id, sub.id);
      const subNow = await api('GET', `/_postguard/v1/webhooks/${sub.id}`, p.key);
      assert.equal(subNow.json.url, sub.url, 'the subscription URL is unchanged');
      await stays(() => inspector.requests.length === 1 && rcv.requests.length === 1, 1500, 'one redirected request, nothing to the original receiver');
    });

    it('a failing redirect target is not retried', async () => {
      const p = await project('redir-fail');
      const rcv = await receiver(() => ({ status: 401 }));
      const sub = await subscribe(p, rcv.url, ['*'], { rcv });
      const evt = await publish(p.name, 'payment.succeeded', { id: 'pay_rf' });
      const row = await deliveryOf(p, evt, sub.id);
      await waitDelivery(p, row.id, (x) => x.status === 'dead_letter', { timeout: 10000 });
      const target = await receiver(() => ({ status: 503 }));
      target.setSecrets(Object.keys(rcv.requests[0].verification));
      const res = await api('POST', `/_postguard/v1/deliveries/${row.id}/redirect`, p.key, { url: target.url });
      assert.equal(res.status, 202, show(res));
      await target.waitFor((rs) => rs.length >= 1, { message: 'the redirected request' });
      assertDeliveryRequest(target.requests[0], { eventId: evt, type: 'payment.succeeded' });
      await stays(async () => target.requests.length === 1 && rcv.requests.length === 1 && (await getDelivery(p, row.id)).status === 'dead_letter', 3000, 'a redirect is sent once (no retries even on 503) and leaves the status alone');
    });

    it('URL rules apply to the redirect target → 400 VALIDATION_ERROR', async () => {
      const p = await project('redir-bad');
      const rcv = await receiver();
      const sub = await subscribe(p, rcv.url, ['*'], { rcv });
      const evt = await publish(p.name, 'x.y', {});
      const row = await deliveryOf(p, evt, sub.id);
      for (const body of [{ url: 'http://localhost/' }, { url: 'https://10.0.0.1/x' }, { url: 'ftp://example.com/' }, { url: 'https://u:p@example.com/' }, {}, { url: 5 }, '{"url":']) {
        problem(await api('POST', `/_postguard/v1/deliveries/${row.id}/redirect`, p.key, body), { status: 400, code: 'VALIDATION_ERROR' });
      }
    });
  });

  describe('secret rotation', { concurrency: true }, () => {
    it('after rotate-secret, deliveries carry two signatures; old and new secrets both verify with both libraries', async () => {
      const p = await project('rotate');
      const rcv = await receiver();
      const sub = await subscribe(p, rcv.url, ['*']);
      const oldSecret = sub.secret;
      rcv.setSecrets([oldSecret]);
      const e1 = await publish(p.name, 'a.before', { id: 'o1' });
      await rcv.waitFor((rs) => rs.length >= 1, { message: 'the pre-rotation delivery' });
      assertDeliveryRequest(rcv.requests[0], { eventId: e1, type: 'a.before' });
      assert.equal(rcv.requests[0].headers['webhook-signature'].split(' ').length, 1);

      const rot = await api('POST', `/_postguard/v1/webhooks/${sub.id}/rotate-secret`, p.key);
      assert.equal(rot.status, 200, show(rot));
      assert.ok('secret' in rot.json, `rotate-secret answers the new secret: ${rot.text}`);
      const newSecret = rot.json.secret;
      assert.match(newSecret, SECRET_RE);
      assert.notEqual(newSecret, oldSecret);
      const shown = await api('GET', `/_postguard/v1/webhooks/${sub.id}`, p.key);
      assert.ok(!('secret' in shown.json) && !shown.text.includes(newSecret.slice(6)), 'GET still hides the secret');

      rcv.setSecrets([oldSecret, newSecret]);
      const e2 = await publish(p.name, 'a.after', { id: 'o2' });
      await rcv.waitFor((rs) => rs.length >= 2, { message: 'the post-rotation delivery' });
      const r = rcv.forEvent(e2)[0];
      assertDeliveryRequest(r, { eventId: e2, type: 'a.after' });
      const sigs = r.headers['webhook-signature'].split(' ');
      assert.equal(sigs.length, 2, `two space-separated signatures: ${r.headers['webhook-signature']}`);
      assert.equal(r.verification[oldSecret].standardwebhooks, true, 'old secret, standardwebhooks');
      assert.equal(r.verification[oldSecret].svix, true, 'old secret, svix');
      assert.equal(r.verification[newSecret].standardwebhooks, true, 'new secret, standardwebhooks');
      assert.equal(r.verification[newSecret].svix, true, 'new secret, svix');
      const expected = [expectedSignature(newSecret, r.headers, r.body), expectedSignature(oldSecret, r.headers, r.body)];
      assert.deepEqual([...sigs].sort(), [...expected].sort(), 'one signature per active secret');
      assert.equal(sigs[0], expected[0], 'the new secret signs first');
    });
  });

  describe('project isolation', { concurrency: true }, () => {
    it("project B sees none of A's subscriptions or deliveries, and cannot act on them", async () => {
      const a = await project('iso-a');
      const b = await project('iso-b');
      const rcv = await receiver();
      const sub = await subscribe(a, rcv.url, ['*'], { rcv });
      const evt = await publish(a.name, 'payment.succeeded', { id: 'pay_iso' });
      const row = await deliveryOf(a, evt, sub.id);
      await waitDelivery(a, row.id, (x) => x.status === 'delivered');

      assert.deepEqual((await api('GET', '/_postguard/v1/webhooks', b.key)).json.data, []);
      assert.deepEqual((await allDeliveries(b)), []);
      problem(await api('GET', `/_postguard/v1/webhooks/${sub.id}`, b.key), { status: 404, code: 'NOT_FOUND' });
      problem(await api('DELETE', `/_postguard/v1/webhooks/${sub.id}`, b.key), { status: 404, code: 'NOT_FOUND' });
      problem(await api('POST', `/_postguard/v1/webhooks/${sub.id}/rotate-secret`, b.key), { status: 404, code: 'NOT_FOUND' });
      problem(await api('GET', `/_postguard/v1/deliveries/${row.id}`, b.key), { status: 404, code: 'NOT_FOUND' });
      problem(await api('POST', `/_postguard/v1/deliveries/${row.id}/retry`, b.key), { status: 404, code: 'NOT_FOUND' });
      const other = await receiver();
      problem(await api('POST', `/_postguard/v1/deliveries/${row.id}/redirect`, b.key, { url: other.url }), { status: 404, code: 'NOT_FOUND' });
      // Still A's, untouched.
      assert.equal((await api('GET', `/_postguard/v1/webhooks/${sub.id}`, a.key)).status, 200);
      // An event of project B never reaches A's subscription.
      const evtB = await publish(b.name, 'payment.succeeded', { id: 'pay_b' });
      await stays(async () => rcv.forEvent(evtB).length === 0 && other.requests.length === 0 && (await allDeliveries(a)).length === 1, 2000, "B's event is not delivered to A");
    });
  });

  describe('delivery log filters and pagination', { concurrency: true }, () => {
    it('status, event_type, since (epoch ms and RFC 3339), limit and cursor', async () => {
      const p = await project('log');
      const ok = await receiver();
      const no = await receiver(() => ({ status: 401 }));
      const sOk = await subscribe(p, ok.url, ['*'], { rcv: ok });
      const sNo = await subscribe(p, no.url, ['b.*'], { rcv: no });
      const e1 = await publish(p.name, 'a.one', { id: '1' });
      const d1 = await deliveryOf(p, e1);
      // `since` between the two: after e1's delivery was created, before e2 is published.
      const t1 = d1.created_at + 1;
      await poll(() => Date.now() > t1, { interval: 1, message: 'the clock past e1' });
      const e2 = await publish(p.name, 'b.two', { id: '2' });
      const ds = await poll(async () => {
        const x = await allDeliveries(p);
        return x.length === 3 && x.every((d) => FINAL.has(d.status)) && x;
      }, { timeout: 15000, message: 'three settled deliveries' });
      ds.forEach(assertDeliveryRow);
      const ids = (list) => list.map((d) => d.id).sort();
      const byStatus = async (s) => ids((await listDeliveries(p, `?status=${s}`)).data);
      assert.deepEqual(await byStatus('delivered'), ids(ds.filter((d) => d.subscription_id === sOk.id)));
      assert.deepEqual(await byStatus('dead_letter'), ids(ds.filter((d) => d.subscription_id === sNo.id && d.event_id === e2)));
      assert.deepEqual(await byStatus('pending'), []);
      assert.deepEqual(await byStatus('failed'), []);
      assert.deepEqual(ids((await listDeliveries(p, '?event_type=b.two')).data), ids(ds.filter((d) => d.event_id === e2)));
      assert.deepEqual(ids((await listDeliveries(p, '?event_type=a.one')).data), ids(ds.filter((d) => d.event_id === e1)));
      assert.deepEqual(ids((await listDeliveries(p, `?since=${t1}`)).data), ids(ds.filter((d) => d.event_id === e2)));
      assert.deepEqual(ids((await listDeliveries(p, `?since=${encodeURIComponent(new Date(t1).toISOString())}`)).data), ids(ds.filter((d) => d.event_id === e2)));
      assert.deepEqual(ids((await listDeliveries(p, `?status=delivered&event_type=b.two`)).data), ids(ds.filter((d) => d.event_id === e2 && d.subscription_id === sOk.id)));

      const seen = [];
      let cursor = null;
      let pages = 0;
      do {
        const page = await listDeliveries(p, `?limit=1${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
        assert.equal(page.data.length, 1);
        seen.push(page.data[0].id);
        cursor = page.next_cursor;
        pages++;
      } while (cursor && pages < 10);
      assert.equal(pages, 3);
      assert.deepEqual(seen, ds.map((d) => d.id), 'limit=1 pages give the same newest-first order, no duplicates');

      for (const q of ['?status=bogus', '?limit=0', '?limit=500', '?limit=abc', '?cursor=garbage', '?since=yesterday']) {
        problem(await api('GET', `/_postguard/v1/deliveries${q}`, p.key), { status: 400, code: 'VALIDATION_ERROR' });
      }
    });
  });
});
