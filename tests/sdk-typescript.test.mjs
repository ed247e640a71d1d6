// The TypeScript SDK (clients/typescript, built by scripts/setup-clients-ts.sh) against the real
// gateway under Miniflare, the real demo origin and real webhook receivers — in process.
// Figures (operations, cuts, executions; proactive timings) are printed as `# sdk-ts …` lines.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { pathToFileURL } from 'node:url';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startFaultProxy } from './support/fault-proxy.mjs';
import { startGateway, cfg, poll, ROOT, ORIGIN_TOKEN, ADMIN_TOKEN, REQUEST_ID_RE } from './support/gateway.mjs';
import { uniq } from './support/util.mjs';

const PORTAL_TOKEN_RE = /#portal=([^&]+)$/;

const SDK_DIR = path.join(ROOT, 'clients', 'typescript');
const SDK_DIST = path.join(SDK_DIR, 'dist', 'index.js');
if (!fs.existsSync(SDK_DIST)) throw new Error('clients/typescript is not built — run `bash scripts/setup-clients-ts.sh`');
const sdk = await import(pathToFileURL(SDK_DIST).href);
const {
  Postguard, ApiError, ApiKeyExpiredError, IdempotencyKeyReuseError, RateLimitError, WebhookVerificationError, WebhookReceiver,
  verifyWebhook, VERSION, Operation, OperationFailedError,
} = sdk;

const CONFIG = {
  plans: {
    // Its gateway policy too: the tests poll the audit log and the delivery log.
    big: { requests_per_window: 100000, window_s: 60, gateway: { requests: 100000, window_s: 60 } },
    small: { requests_per_window: 10, window_s: 5 },
    // Issue 25 item 7's plan: 5 per 5 s, where a fixed reserve of 5 allowed one call per window.
    tiny: { requests_per_window: 5, window_s: 5 },
    // Issue 25: several named policies and a concurrency quota.
    tiered: { policies: [{ name: 'burst', requests: 20, window_s: 1 }, { name: 'minute', requests: 200, window_s: 60 }], concurrency: 2 },
    single: { requests_per_window: 1000, window_s: 60, concurrency: 1 },
  },
  webhooks: { schedule_s: [1, 1], timeout_ms: 2000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  // Issue 26: asynchronous operations on /reports/* (request(…, { async: true })).
  async: { routes: [{ method: 'POST', path: '/reports/*' }], timeout_ms: 10000, requeue_after_s: 2 },
  // Issue 34: a POST without an Idempotency-Key is forwarded (and counted by /stats) until then.
  idempotency: { required_from: '2099-01-01T00:00:00Z' },
};

let origin;
let gw;
const closers = [];
const figure = (name, obj) => console.log(`# sdk-ts ${name} ${JSON.stringify(obj)}`);

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  for (const c of closers.reverse()) await c();
  await gw?.dispose();
  await origin?.kill();
});

async function keyFor(plan, tag = plan) {
  return (await gw.createKey({ project: uniq(`sdk-ts-${tag}`), plan })).key;
}

/** Observes what the SDK really sends (the real fetch underneath; nothing is answered here). */
function recordingFetch() {
  const sent = [];
  const f = (input, init) => {
    sent.push({ url: String(input), method: init?.method, headers: new Headers(init?.headers) });
    return fetch(input, init);
  };
  f.sent = sent;
  return f;
}

/** 8 concurrent tasks share one client and make 40 calls between them. */
async function run(throttle) {
  let n429 = 0;
  let minRemaining = Infinity;
  const pg = new Postguard({
    baseUrl: gw.url,
    apiKey: await keyFor('small', 'throttle'),
    throttle,
    onResponse: (r) => {
      if (r.status === 429) n429 += 1;
      else minRemaining = Math.min(minRemaining, Number(r.headers.get('x-ratelimit-remaining')));
    },
  });
  let next = 0;
  const results = [];
  const started = Date.now();
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (next < 40) {
        next += 1;
        results.push(await pg.request('POST', '/orders', { body: { n: next } }));
      }
    }),
  );
  const elapsedMs = Date.now() - started;
  assert.equal(results.length, 40);
  assert.ok(results.every((r) => r.status === 201), 'every call succeeded');
  return { n429, elapsedMs, minRemaining, retries: results.reduce((a, r) => a + r.attempts - 1, 0) };
}

// Timed alone: the elapsed-time figure is not disturbed by the other tests. It is printed, not
// asserted against an upper bound: how long 40 calls take on a loaded machine measures the
// machine (issue 28); what the SDK promises is that it uses the whole budget without a 429.
describe('proactive throttling, threshold 0 (plan: 10 requests per 5 s; 8 tasks, 40 calls)', () => {
  it('threshold 0: the whole budget (an answer leaves 0), no 429; the time against the ideal 15 s is printed', async () => {
    const r = await run({ threshold: 0 });
    figure('proactive-threshold-0', { ...r, ideal_ms: 15000, deviation: Number((r.elapsedMs / 15000 - 1).toFixed(3)) });
    assert.equal(r.n429, 0, 'no 429 received');
    assert.equal(r.minRemaining, 0, 'the whole budget was used: some answer reported 0 remaining');
    assert.ok(r.elapsedMs >= 15000, `four windows are needed (${r.elapsedMs} ms)`);
  });
});

// The rest runs side by side (own keys, projects, proxies and receivers): the driver takes the
// time of its longest test (the default-threshold run, ~36 s), not the sum.
describe('side by side', { concurrency: true }, () => {
  describe('retry-safe by construction', () => {
    it('50 operations through a proxy that cuts answers after forwarding: each succeeds, executed once, replayed after a cut', async () => {
      const proxy = await startFaultProxy({ target: gw.url, cutRate: 0.3, seed: 20261201 });
      closers.push(() => proxy.close());
      const f = recordingFetch();
      const retries = [];
      const pg = new Postguard({
        baseUrl: proxy.url,
        apiKey: await keyFor('big', 'faults'),
        fetch: f,
        maxAttempts: 10, // 0.3^10: a run of ten cuts is not expected
        backoff: { baseDelayMs: 50 }, // the rule is unchanged; the test need not wait half seconds
        onRetry: (r) => retries.push(r),
      });
      const results = [];
      for (let i = 0; i < 50; i++) {
        const res = await pg.request('POST', '/payments', { body: { amount: i } });
        results.push(res);
      }
      const { cuts, connections } = proxy.stats();
      let executions = 0;
      for (const [i, res] of results.entries()) {
        assert.equal(res.status, 201, `operation ${i}`);
        const key = res.idempotencyKey;
        assert.equal(origin.stats.count(key), 1, `operation ${i} (key ${key}) executed exactly once`);
        executions += origin.stats.count(key);
        assert.equal(res.data.execution, 1, 'the body is the first execution’s');
        const sentKeys = f.sent.filter((s) => s.headers.get('idempotency-key') === key);
        assert.equal(sentKeys.length, res.attempts, `every attempt of operation ${i} carried the same key`);
        // Every lost answer was executed (the cut comes after forwarding): a retry is a replay.
        assert.equal(res.replayed, res.attempts > 1, `operation ${i}: attempts ${res.attempts}, replayed ${res.replayed}`);
      }
      assert.equal(new Set(results.map((r) => r.idempotencyKey)).size, 50, 'one key per logical operation');
      const replayed = results.filter((r) => r.replayed).length;
      assert.ok(cuts >= 5, `the proxy really cut answers (${cuts})`);
      assert.equal(retries.length, cuts, 'one retry per lost answer');
      figure('fault-proxy', { operations: 50, cuts, connections, retries: retries.length, replayed, executions });
    });

    it('gateway calls through a proxy that cuts their first answer: create_key, create_webhook, rotate_secret, retry, redirect, portal_link each take effect once (issue 23 item 1)', async () => {
      const proxy = await startFaultProxy({ target: gw.url });
      closers.push(() => proxy.close());
      // /reject/… answers 400: the delivery is dead-lettered after one attempt, so a manual
      // retry sends it again; /redirected/… receives the redirect.
      const rcv = await startReceiver({ behaviour: (r) => ({ status: r.path.startsWith('/reject/') ? 400 : 200 }) });
      closers.push(() => rcv.close());
      const answers = new Map(); // Idempotency-Key → the answers its attempts got
      const settings = {
        baseUrl: proxy.url,
        maxAttempts: 8,
        backoff: { baseDelayMs: 50 },
        onResponse: (r) => answers.set(r.idempotencyKey, [...(answers.get(r.idempotencyKey) ?? []), r]),
      };
      const figures = {};
      /** One logical call whose first answer the proxy cuts; it must end in a replay of the first execution. */
      async function cutOnce(name, call) {
        const key = uniq(name);
        proxy.cutNext(1);
        const cutsBefore = proxy.stats().cuts;
        const out = await call({ idempotencyKey: key });
        assert.equal(proxy.stats().cuts, cutsBefore + 1, `${name}: its first answer was cut`);
        const seen = answers.get(key) ?? [];
        const last = seen.at(-1);
        assert.ok(last && last.attempt >= 2, `${name}: answered after a retry (${seen.map((a) => a.status)})`);
        assert.equal(last.replayed, true, `${name}: the retry got the stored answer (Idempotent-Replayed), not a second execution`);
        figures[name] = { attempts: last.attempt, statuses: seen.map((a) => a.status) };
        return out;
      }
      const project = uniq('sdk-ts-gwcalls');
      const operator = new Postguard({ ...settings, adminToken: ADMIN_TOKEN });
      const direct = new Postguard({ baseUrl: gw.url, adminToken: ADMIN_TOKEN, originToken: ORIGIN_TOKEN });

      // create_key: one live key for the project.
      const created = await cutOnce('create_key', (o) => operator.keys.create({ project, plan: 'big' }, o));
      const keys = (await direct.keys.list({ project })).data;
      assert.deepEqual(keys.map((k) => k.id), [created.id], 'one key per call');
      const pg = new Postguard({ ...settings, apiKey: created.key });
      assert.equal((await pg.me()).project, project, 'the key that came back works');

      // create_webhook: one subscription.
      const sub = await cutOnce('create_webhook', (o) => pg.webhooks.create({ url: `${rcv.url}/reject/${project}`, events: ['*'] }, o));
      const subs = (await pg.webhooks.list()).data;
      assert.deepEqual(subs.map((x) => x.id), [sub.id], 'one subscription per call');

      // A delivery the receiver refuses: dead-lettered after its first attempt.
      const e1 = await direct.events.publish({ project, type: 'sdk.cut', data: { n: 1 } });
      const dead = await poll(async () => {
        const d = (await pg.deliveries.list({ status: 'dead_letter' })).data.find((x) => x.event_id === e1.id);
        return d?.attempts_made === 1 && d;
      }, { timeout: 20000, message: 'the delivery dead-lettered' });

      // rotate_secret: one rotation, so the original secret still signs during the overlap.
      const { secret: fresh } = await cutOnce('rotate_secret', (o) => pg.webhooks.rotateSecret(sub.id, o));
      const e2 = await direct.events.publish({ project, type: 'sdk.cut', data: { n: 2 } });
      const d2 = await rcv.waitFor((rs) => rs.find((r) => r.headers['webhook-id'] === e2.id), { timeout: 20000, message: 'the delivery after the rotation' });
      assert.equal(d2.headers['webhook-signature'].split(' ').length, 2, 'two secrets sign: the original and one new one');
      assert.equal(verifyWebhook(d2.body, d2.headers, sub.secret).id, e2.id, 'the predecessor still verifies');
      assert.equal(verifyWebhook(d2.body, d2.headers, fresh).id, e2.id, 'the secret returned verifies');

      // retry and redirect: one more attempt each, as the delivery's own log counts them. A last,
      // uncut retry goes after them through the same queue, so the log is complete once it shows.
      await cutOnce('retry', (o) => pg.deliveries.retry(dead.id, o));
      await cutOnce('redirect', (o) => pg.deliveries.redirect(dead.id, `${rcv.url}/redirected/${project}`, o));
      await direct.request('POST', `/_postguard/v1/deliveries/${dead.id}/retry`, { token: created.key });
      const count = (d, prefix) => d.attempts.filter((a) => new URL(a.url).pathname.startsWith(prefix)).length;
      const detail = await poll(async () => {
        const d = await pg.deliveries.get(dead.id);
        return count(d, '/reject/') >= 3 && count(d, '/redirected/') >= 1 && d;
      }, { timeout: 20000, message: 'the retry, the redirect and the last retry in the delivery log' });
      assert.equal(count(detail, '/reject/'), 3, 'the first attempt, then one per retry call');
      assert.equal(count(detail, '/redirected/'), 1, 'one redirect per call');
      const redirected = rcv.forEvent(e1.id).filter((r) => r.path.startsWith('/redirected/'));
      assert.equal(redirected.length, 1, 'the redirect target received the event once');

      // portal_link: the replayed link is a working one.
      const link = await cutOnce('portal_link', (o) => operator.portalLinks.create({ project }, o));
      const token = PORTAL_TOKEN_RE.exec(link.url)?.[1];
      assert.ok(token, link.url);
      const session = await direct.request('POST', '/_postguard/v1/portal-sessions', { auth: 'none', body: { token } });
      assert.equal(session.status, 201);
      assert.equal(session.data.project, project);
      figure('gateway-calls-cut-once', figures);
    });

    it('origin 503 twice then 201: one call, three executions, only the third stored', async () => {
      const key = uniq('k503');
      await fetch(`${origin.url}/__demo/script`, { method: 'POST', body: JSON.stringify({ key, statuses: [503, 503] }) });
      const seen = [];
      const client = new Postguard({ baseUrl: gw.url, apiKey: await keyFor('big', '503'), onResponse: (r) => seen.push(r.status) });
      const res = await client.request('POST', '/charges', { body: { amount: 5 }, idempotencyKey: key });
      assert.equal(res.status, 201);
      assert.equal(res.attempts, 3);
      assert.deepEqual(seen, [503, 503, 201]);
      assert.equal(origin.stats.count(key), 3, 'the origin ran three times');
      assert.equal(res.data.execution, 3);
      assert.equal(res.replayed, false);
      const again = await client.request('POST', '/charges', { body: { amount: 5 }, idempotencyKey: key });
      assert.equal(again.replayed, true, 'the 201 was stored');
      assert.equal(again.data.execution, 3, 'the stored answer is the third execution, not a failed one');
      assert.equal(origin.stats.count(key), 3);
    });

    it('409 in progress: a second call with the same key waits and returns the first result', async () => {
      const seen = [];
      const pg = new Postguard({ baseUrl: gw.url, apiKey: await keyFor('big', '409'), onResponse: (r) => seen.push([r.idempotencyKey, r.status]) });
      await pg.request('GET', '/warm-up'); // the limiter learns the budget, so calls need not wait for a first answer
      const key = uniq('k409');
      const body = { amount: 9 };
      const first = pg.request('POST', '/slow', { body, idempotencyKey: key, headers: { 'x-demo-delay-ms': '1500' } });
      await poll(() => origin.stats.count(key) === 1, { message: 'the first call reached the origin' });
      const second = await pg.request('POST', '/slow', { body, idempotencyKey: key });
      const firstRes = await first;
      assert.equal(firstRes.status, 201);
      assert.equal(second.status, 201);
      assert.ok(second.attempts >= 2, `the second call was answered 409 first (attempts ${second.attempts})`);
      assert.ok(seen.some(([k, s]) => k === key && s === 409), `a 409 was seen: ${JSON.stringify(seen)}`);
      assert.equal(second.replayed, true);
      assert.equal(second.data.execution, firstRes.data.execution);
      assert.equal(origin.stats.count(key), 1, 'executed once');
    });

    it('errors are typed and carry code, detail and request_id; 4xx are not retried', async () => {
      const bad = new Postguard({ baseUrl: gw.url, apiKey: 'pgk_not-a-key' });
      const e401 = await bad.me().catch((e) => e);
      assert.ok(e401 instanceof ApiError, String(e401));
      assert.equal(e401.status, 401);
      assert.equal(e401.code, 'INVALID_API_KEY');
      assert.equal(e401.attempts, 1);
      assert.match(e401.requestId, REQUEST_ID_RE);
      assert.equal(typeof e401.detail, 'string');

      const pg = new Postguard({ baseUrl: gw.url, apiKey: await keyFor('big', 'errors') });
      const key = uniq('reuse');
      await pg.request('POST', '/things', { body: { a: 1 }, idempotencyKey: key });
      const e422 = await pg.request('POST', '/things', { body: { a: 2 }, idempotencyKey: key }).catch((e) => e);
      assert.ok(e422 instanceof IdempotencyKeyReuseError, String(e422));
      assert.equal(e422.code, 'IDEMPOTENCY_KEY_REUSE_CONFLICT');
      assert.equal(e422.attempts, 1);
      const e404 = await pg.deliveries.get('dlv_doesnotexist').catch((e) => e);
      assert.ok(e404 instanceof ApiError && e404.status === 404 && e404.code === 'NOT_FOUND' && e404.attempts === 1, String(e404));
    });
  });

  describe('typed gateway methods', () => {
    it('me, audit pages by async iterator (user agent recorded), stats, operator keys', async () => {
      const admin = new Postguard({ baseUrl: gw.url, adminToken: ADMIN_TOKEN });
      const project = uniq('sdk-ts-typed');
      const created = await admin.keys.create({ project, plan: 'big', name: 'typed' });
      const pg = new Postguard({ baseUrl: gw.url, apiKey: created.key });
      const me = await pg.me();
      assert.equal(me.project, project);
      assert.equal(me.plan, 'big');
      for (let i = 0; i < 5; i++) await pg.request('GET', `/items/${i}`);
      const rows = await poll(async () => {
        const out = [];
        for await (const row of pg.audit.iterate({ limit: 2, path: '/items/*' })) out.push(row);
        return out.length >= 5 && out;
      }, { message: 'five audit rows' });
      assert.equal(rows.length, 5, 'five rows over three pages');
      assert.ok(rows.every((r) => r.user_agent === `postguard-client-typescript/${VERSION}`), `user agent: ${rows[0].user_agent}`);
      let pages = 0;
      for await (const page of pg.audit.pages({ limit: 2, path: '/items/*' })) pages += page.data.length > 0 ? 1 : 0;
      assert.equal(pages, 3);
      const stats = await pg.stats({ days: 1 });
      assert.ok(Array.isArray(stats.days) && stats.days.length >= 1);
      const listed = await admin.keys.list({ project });
      assert.deepEqual(listed.data.map((k) => k.id), [created.id]);
      await admin.keys.revoke(created.id);
      await poll(async () => (await pg.me().catch((e) => e)) instanceof ApiError, { message: 'the revoked key refused' });
      const wrongKind = await pg.keys.list().catch((e) => e);
      assert.match(wrongKind.message, /adminToken/, 'a missing credential is named, nothing sent');
    });
  });

  describe('asynchronous operations (issue 26)', () => {
    it('request(…, { async: true }): a 202 handle, the same operation for a resend, wait() polling after Retry-After; synchronous routes and failures', async () => {
      const polls = [];
      const pg = new Postguard({
        baseUrl: gw.url,
        apiKey: await keyFor('big', 'ops'),
        onResponse: (r) => {
          if (/^\/_postguard\/v1\/operations\/op_[^/]+$/.test(r.path)) polls.push({ at: Date.now(), retryAfter: r.headers.get('retry-after') });
        },
      });
      const key = uniq('ts-op');
      const op = await pg.request('POST', '/reports/q1', { body: { q: 1 }, idempotencyKey: key, headers: { 'x-demo-delay-ms': '2500' }, async: true });
      assert.ok(op instanceof Operation);
      assert.match(op.id, /^op_[0-9A-Z]{52}$/);
      assert.equal(op.location, `/_postguard/v1/operations/${op.id}`);
      assert.equal(op.state, 'queued');
      const again = await pg.request('POST', '/reports/q1', { body: { q: 1 }, idempotencyKey: key, async: true });
      assert.equal(again.id, op.id, 'the same operation');
      const res = await op.wait({ timeoutMs: 60000 });
      assert.equal(res.status, 201);
      assert.equal(res.data.execution, 1);
      assert.equal(op.state, 'succeeded');
      assert.equal(origin.stats.count(key), 1, 'executed once');
      assert.ok(polls.length >= 1);
      for (let i = 1; i < polls.length; i++) {
        const asked = Number(polls[i - 1].retryAfter ?? 1) * 1000;
        assert.ok(polls[i].at - polls[i - 1].at >= asked - 50, `poll ${i} came after the Retry-After (${JSON.stringify(polls)})`);
      }
      // Typed reads and a handle rebuilt from the id.
      assert.equal((await pg.operations.get(op.id)).state, 'succeeded');
      assert.ok((await pg.operations.list({ limit: 50 })).data.some((o) => o.id === op.id));
      assert.deepEqual((await (await pg.operation(op.id)).result()).data, res.data);
      // A route the gateway runs synchronously: a done handle.
      const sync = await pg.request('POST', '/orders', { body: { n: 1 }, async: true });
      assert.equal(sync.id, undefined);
      assert.equal(sync.done, true);
      assert.equal((await sync.wait()).status, 201);
      // A failed operation: its last answer, as a typed error.
      const failing = uniq('ts-op-fail');
      origin.stats.script(failing, [503, 503, 503]);
      const bad = await pg.request('POST', '/reports/bad', { body: { q: 2 }, idempotencyKey: failing, async: true });
      await assert.rejects(bad.wait({ timeoutMs: 60000 }), (e) => e instanceof OperationFailedError && e.status === 503);
      assert.equal(bad.state, 'failed');
      await assert.rejects(pg.request('POST', '/reports/x', { async: true, idempotencyKey: null }), /needs an Idempotency-Key/);
    });
  });

  describe('keys & limits (issue 25)', () => {
    const admin = () => new Postguard({ baseUrl: gw.url, adminToken: ADMIN_TOKEN });

    it('status(): unknown, in progress while the origin runs, then completed with the answer\'s status and request_id; a resend replays it', async () => {
      const pg = new Postguard({ baseUrl: gw.url, apiKey: await keyFor('big', 'status') });
      const key = uniq('status/key'); // a `/` in the key: percent-encoded into the path
      assert.deepEqual(await pg.status(key), { state: 'unknown' });
      const sent = pg.request('POST', '/orders', { body: { n: 1 }, idempotencyKey: key, headers: { 'x-demo-delay-ms': '3000' } });
      const running = await poll(async () => {
        const s = await pg.status(key);
        return s.state === 'in_progress' && s;
      }, { timeout: 15000, message: 'the lookup to say in_progress while the origin runs' });
      assert.equal(typeof running.created_at, 'number');
      assert.ok(running.expires_at > running.created_at, 'in progress until its lease ends');
      const res = await sent;
      assert.equal(res.status, 201);
      const done = await poll(async () => {
        const s = await pg.status(key);
        return s.state !== 'in_progress' && s;
      }, { message: 'the record to be written' });
      assert.equal(done.state, 'completed');
      assert.equal(done.status, 201);
      assert.equal(done.request_id, res.requestId, 'the request_id of the answer the caller got');
      assert.ok(done.expires_at > Date.now(), 'replayed until its TTL ends');
      // The recipe: completed → resend with the same key, the stored answer comes back.
      const again = await pg.request('POST', '/orders', { body: { n: 1 }, idempotencyKey: key });
      assert.equal(again.replayed, true);
      assert.deepEqual(again.data, res.data);
      assert.equal(origin.stats.count(key), 1, 'executed once');
      // The lookup is free: /me still shows the budget the two calls left.
      assert.equal((await pg.me()).remaining, 100000 - 2);
      const dots = await pg.status('..');
      assert.equal(dots.state, 'unknown', 'a `..` key is looked up, not resolved away');
    });

    it('keys.update changes the plan: the next request\'s RateLimit-Policy shows its policies and concurrency quota', async () => {
      const op = admin();
      const created = await op.keys.create({ project: uniq('sdk-ts-update'), plan: 'big', meta: { tier: 'gold' } });
      const pg = new Postguard({ baseUrl: gw.url, apiKey: created.key });
      const before = await pg.request('GET', '/plan-before');
      assert.equal(before.headers.get('ratelimit-policy'), '"default";q=100000;w=60');
      const updated = await op.keys.update(created.id, { plan: 'tiered' });
      assert.equal(updated.plan, 'tiered');
      assert.equal(updated.id, created.id);
      const after = await pg.request('GET', '/plan-after');
      assert.equal(after.headers.get('ratelimit-policy'), '"burst";q=20;w=1, "minute";q=200;w=60, "inflight";q=2;qu="concurrent-requests"');
      const me = await pg.me();
      assert.equal(me.plan, 'tiered');
      assert.deepEqual(me.policies.map((p) => [p.name, p.limit, p.window_s]), [['burst', 20, 1], ['minute', 200, 60]]);
      assert.deepEqual([me.inflight.limit, me.inflight.in_use], [2, 0], 'the concurrency quota, nothing in flight');
      const detail = await op.keys.get(created.id);
      assert.deepEqual(detail.meta, { tier: 'gold' }, 'meta kept by a PATCH that did not name it');
      assert.equal(detail.policies.length, 2);
    });

    it('keys.reroll: a new secret for the same id and prefix; the old and the new one both work during the grace', async () => {
      const op = admin();
      const project = uniq('sdk-ts-reroll');
      const created = await op.keys.create({ project, plan: 'big' });
      const t0 = Date.now();
      const rolled = await op.keys.reroll(created.id, { grace_s: 600 });
      assert.equal(rolled.id, created.id);
      assert.equal(rolled.prefix, created.prefix);
      assert.notEqual(rolled.key, created.key);
      assert.ok(rolled.previous_expires_at >= t0 + 600_000 - 2000 && rolled.previous_expires_at <= Date.now() + 600_000 + 2000, `${rolled.previous_expires_at}`);
      for (const key of [created.key, rolled.key]) {
        const pg = new Postguard({ baseUrl: gw.url, apiKey: key });
        const res = await pg.request('POST', '/rerolled', { body: {} });
        assert.equal(res.status, 201);
        assert.equal((await pg.me()).prefix, created.prefix, 'the same key, whichever secret');
      }
      assert.deepEqual((await op.keys.list({ project })).data.map((k) => k.id), [created.id], 'still one key');
    });

    it('an expiring key: works, then (polled) every call fails with ApiKeyExpiredError, not retried', async () => {
      const op = admin();
      // Ten seconds ahead: on a loaded machine creating the key and the first call can take
      // several seconds, and the first call must land before the expiry.
      const created = await op.keys.create({ project: uniq('sdk-ts-expiry'), plan: 'big', expires_at: Date.now() + 10_000 });
      assert.equal(typeof created.expires_at, 'number');
      const pg = new Postguard({ baseUrl: gw.url, apiKey: created.key });
      assert.equal((await pg.request('GET', '/still-alive')).status, 200);
      const err = await poll(async () => pg.request('GET', '/still-alive').then(() => false, (e) => e), { timeout: 40000, interval: 200, message: 'the key refused after expires_at' });
      assert.ok(err instanceof ApiKeyExpiredError, String(err));
      assert.equal(err.status, 401);
      assert.equal(err.code, 'API_KEY_EXPIRED');
      assert.equal(err.attempts, 1, 'not retried');
      assert.ok(Date.now() >= created.expires_at, 'not before expires_at');
      assert.ok((await pg.me().catch((e) => e)) instanceof ApiKeyExpiredError, 'the gateway endpoints too');
    });

    it('concurrency 1: a second call while the first runs is refused CONCURRENCY_LIMIT_EXCEEDED and retried after Retry-After', async () => {
      const retries = [];
      const pg = new Postguard({ baseUrl: gw.url, apiKey: await keyFor('single', 'inflight'), onRetry: (r) => retries.push(r) });
      await pg.request('GET', '/warm-up'); // the limiter learns the budget: both calls go at once
      const slow = { 'x-demo-delay-ms': '3000' };
      const [a, b] = await Promise.all([0, 1].map((n) => pg.request('POST', '/one-at-a-time', { body: { n }, headers: slow })));
      assert.equal(a.status, 201);
      assert.equal(b.status, 201);
      const refusals = retries.filter((r) => r.status === 429);
      assert.ok(refusals.length >= 1, `one call met the other in flight: ${retries.map((r) => r.status)}`);
      assert.equal(refusals.length, retries.length, 'nothing else was retried');
      for (const r of refusals) {
        assert.ok(r.error instanceof RateLimitError, String(r.error));
        assert.equal(r.error.code, 'CONCURRENCY_LIMIT_EXCEEDED');
        assert.deepEqual(r.error.violatedPolicies, ['inflight']);
        assert.equal(r.error.policy, 'inflight');
        assert.equal(r.error.retryAfterMs, 1000);
        assert.ok(r.delayMs >= 1000, `not before Retry-After (${r.delayMs} ms)`);
      }
      assert.equal(a.attempts + b.attempts, 2 + refusals.length);
      figure('concurrency-1', { attempts: [a.attempts, b.attempts], refusals: refusals.length });
    });
  });

  it('six calls on a 5-per-5 s plan: the default reserve (1) sends four per window; the old one (5) sent one (issue 25 item 7)', async () => {
    async function six(throttle) {
      const remaining = [];
      let n429 = 0;
      const pg = new Postguard({
        baseUrl: gw.url,
        apiKey: await keyFor('tiny', 'six'),
        throttle,
        onResponse: (r) => {
          if (r.status === 429) n429 += 1;
          else remaining.push(Number(r.headers.get('x-ratelimit-remaining')));
        },
      });
      const started = Date.now();
      for (let i = 0; i < 6; i++) await pg.request('POST', '/six', { body: { i } });
      return { elapsedMs: Date.now() - started, n429, remaining };
    }
    // Before and after in one run, side by side (two keys, two windows of their own).
    const [after, before] = await Promise.all([six(undefined), six({ threshold: 5 })]);
    figure('six-calls-5-per-5s', { before_threshold_5: before, after_default: after });
    assert.equal(after.n429 + before.n429, 0, 'no 429 either way');
    assert.deepEqual(before.remaining, [4, 4, 4, 4, 4, 4], 'the old reserve: every call alone in its window');
    assert.ok(after.remaining.some((r) => r <= 3), `several calls in one window: ${after.remaining}`);
    assert.ok(after.remaining.every((r) => r >= 1), `one unit always kept: ${after.remaining}`);
  });

  describe('proactive throttling, default threshold and off (plan: 10 requests per 5 s; 8 tasks, 40 calls)', () => {
    it('default reserve (a tenth: 1 of 10) and proactive off, side by side: no 429 / 429s absorbed, every call succeeds', async () => {
      const [def, off] = await Promise.all([run(undefined), run(false)]);
      figure('proactive-default', def);
      figure('proactive-off', off);
      assert.equal(def.n429, 0, 'no 429 with the default reserve');
      assert.ok(def.minRemaining >= 1, `the default keeps one of ten in reserve (lowest remaining ${def.minRemaining})`);
      assert.ok(off.n429 > 0, 'without throttling the plan really answers 429');
      assert.equal(off.retries, off.n429, 'each 429 absorbed by one retry after Retry-After');
    });
  });

  /** The first request the receiver got for this event. */
  const deliveryOf = (rcv, id) => rcv.waitFor((rs) => rs.find((r) => r.headers['webhook-id'] === id), { message: `delivery of ${id}` });

  it('pacing: calls spread window / limit (500 ms) apart, no 429', async () => {
    const f = recordingFetch();
    const at = [];
    let n429 = 0;
    const pg = new Postguard({
      baseUrl: gw.url,
      apiKey: await keyFor('small', 'pacing'),
      throttle: { threshold: 0, pacing: true },
      fetch: (input, init) => {
        at.push(Date.now());
        return f(input, init);
      },
      onResponse: (r) => {
        if (r.status === 429) n429 += 1;
      },
    });
    let next = 0;
    await Promise.all(Array.from({ length: 4 }, async () => {
      while (next < 10) {
        next += 1;
        await pg.request('POST', '/paced', { body: { n: next } });
      }
    }));
    assert.equal(n429, 0);
    // Every gap, the probe's included: while the probe is unanswered paced calls go one per
    // second, then window / limit apart — a slow answer never releases a burst (issue 28 saw
    // 'gaps 1,20,500,…' when the probe wait let three calls go at once). The SDK spaces its
    // decisions 500 ms apart; 450 leaves room for the process being descheduled between a
    // decision and this fetch wrapper reading the clock on a loaded machine, while a burst
    // shows gaps of a few ms.
    const gaps = at.slice(1).map((t, i) => t - at[i]);
    assert.equal(gaps.length, 9);
    assert.ok(gaps.every((g) => g >= 450), `gaps ${gaps}`);
    figure('pacing', { calls: at.length, min_gap_ms: Math.min(...gaps), max_gap_ms: Math.max(...gaps) });
  });

  describe('webhooks', () => {
    it('a delivery from the gateway verifies; tampered, stale and wrong-secret ones are refused; rotated secrets; dedupe', async () => {
      const rcv = await startReceiver();
      closers.push(() => rcv.close());
      const key = await keyFor('big', 'webhooks');
      const pg = new Postguard({ baseUrl: gw.url, apiKey: key });
      const publisher = new Postguard({ baseUrl: gw.url, originToken: ORIGIN_TOKEN });
      const me = await pg.me();
      const sub = await pg.webhooks.create({ url: rcv.url, events: ['*'] });
      const e1 = await publisher.events.publish({ project: me.project, type: 'payment.succeeded', data: { amount: 42 } });
      assert.match(e1.id, /^evt_[A-Za-z0-9]+$/);
      const d1 = await deliveryOf(rcv, e1.id);

      const event = verifyWebhook(d1.body, d1.headers, sub.secret);
      assert.equal(event.id, e1.id);
      assert.equal(event.type, 'payment.succeeded');
      assert.deepEqual(event.data, { amount: 42 });
      assert.equal(verifyWebhook(new TextEncoder().encode(d1.body), new Headers(d1.headers), [sub.secret]).id, e1.id, 'bytes and Headers too');

      const refused = (body, headers, secrets, opts) => {
        try {
          verifyWebhook(body, headers, secrets, opts);
        } catch (e) {
          assert.ok(e instanceof WebhookVerificationError, String(e));
          return e.code;
        }
        return 'accepted';
      };
      assert.equal(refused(d1.body.replace('42', '43'), d1.headers, sub.secret), 'WEBHOOK_SIGNATURE_INVALID');
      assert.equal(refused(d1.body, { ...d1.headers, 'webhook-id': 'evt_other' }, sub.secret), 'WEBHOOK_SIGNATURE_INVALID');
      const other = `whsec_${crypto.randomBytes(24).toString('base64')}`;
      assert.equal(refused(d1.body, d1.headers, other), 'WEBHOOK_SIGNATURE_INVALID');
      const later = (Number(d1.headers['webhook-timestamp']) + 600) * 1000;
      assert.equal(refused(d1.body, d1.headers, sub.secret, { now: () => later }), 'WEBHOOK_TIMESTAMP_OUT_OF_TOLERANCE');
      const soon = (Number(d1.headers['webhook-timestamp']) + 20) * 1000;
      assert.equal(refused(d1.body, d1.headers, sub.secret, { now: () => soon, toleranceS: 10 }), 'WEBHOOK_TIMESTAMP_OUT_OF_TOLERANCE');
      const { 'webhook-signature': _, ...unsigned } = d1.headers;
      assert.equal(refused(d1.body, unsigned, sub.secret), 'WEBHOOK_HEADERS_MISSING');

      // Rotation: the gateway signs with the old and the new secret; either verifies alone.
      const { secret: fresh } = await pg.webhooks.rotateSecret(sub.id);
      assert.notEqual(fresh, sub.secret);
      const e2 = await publisher.events.publish({ project: me.project, type: 'payment.refunded', data: { amount: 7 } });
      const d2 = await deliveryOf(rcv, e2.id);
      assert.equal(d2.headers['webhook-signature'].split(' ').length, 2, 'two signatures during the rotation');
      assert.equal(verifyWebhook(d2.body, d2.headers, fresh).id, e2.id);
      assert.equal(verifyWebhook(d2.body, d2.headers, sub.secret).id, e2.id);
      assert.equal(verifyWebhook(d2.body, d2.headers, [other, fresh]).id, e2.id);
      assert.equal(refused(d2.body, d2.headers, [other]), 'WEBHOOK_SIGNATURE_INVALID');

      // Dedupe by event id: a redelivery is reported as a duplicate and not handled again;
      // a handler failure releases the id so that the retry is handled.
      const handled = [];
      const receiver = new WebhookReceiver({ secrets: [fresh, sub.secret] });
      assert.equal((await receiver.receive(d2.body, d2.headers, (e) => handled.push(e.id))).duplicate, false);
      assert.equal((await receiver.receive(d2.body, d2.headers, (e) => handled.push(e.id))).duplicate, true);
      await assert.rejects(receiver.receive(d1.body, d1.headers, () => { throw new Error('db down'); }), /db down/);
      assert.equal((await receiver.receive(d1.body, d1.headers, (e) => handled.push(e.id))).duplicate, false);
      assert.deepEqual(handled, [e2.id, e1.id]);
      // A republished id is a no-op at the gateway: no second delivery.
      assert.deepEqual(await publisher.events.publish({ project: me.project, type: 'payment.succeeded', data: { amount: 42 }, id: e1.id }), { id: e1.id });
    });

    // Needs the server side of ordering keys: the delivery log must show ordering_key.
    it('ordering keys: two events published with the same ordering_key; their deliveries show the key and blocked_by', async () => {
      const rcv = await startReceiver();
      closers.push(() => rcv.close());
      const pg = new Postguard({ baseUrl: gw.url, apiKey: await keyFor('big', 'ordering') });
      const publisher = new Postguard({ baseUrl: gw.url, originToken: ORIGIN_TOKEN });
      const project = (await pg.me()).project;
      await pg.webhooks.create({ url: rcv.url, events: ['order.*'] });
      const key = uniq('order');
      const e1 = await publisher.events.publish({ project, type: 'order.created', data: { n: 1 }, ordering_key: key });
      const e2 = await publisher.events.publish({ project, type: 'order.paid', data: { n: 2 }, ordering_key: key });
      assert.match(e1.id, /^evt_/);
      assert.match(e2.id, /^evt_/);
      assert.notEqual(e1.id, e2.id);
      // The deliveries are stored before the 202: listed at once, one per event (one subscription).
      for (const e of [e1, e2]) {
        const { data } = await pg.deliveries.list({ event_id: e.id });
        assert.equal(data.length, 1, `one delivery of ${e.id}: ${JSON.stringify(data)}`);
        const [d] = data;
        assert.equal(d.ordering_key, key, `the delivery of ${e.id} shows its ordering_key: ${JSON.stringify(d)}`);
        assert.ok(d.blocked_by === null || (typeof d.blocked_by === 'string' && /^dlv_/.test(d.blocked_by)), `blocked_by: ${JSON.stringify(d)}`);
      }
    });
  });

  describe('moving an existing API (issue 34)', () => {
    it('keys.import: a key and a hash, one used through the gateway, a re-run says exists; usage() counts each operation once; /stats names the key without Idempotency-Keys', async () => {
      const admin = new Postguard({ baseUrl: gw.url, adminToken: ADMIN_TOKEN });
      const project = uniq('sdk-ts-import');
      const legacy = `sk_live_${crypto.randomBytes(12).toString('hex')}`;
      const hashed = `sk_live_${crypto.randomBytes(12).toString('hex')}`;
      const entries = [
        { key: legacy, project, plan: 'big', name: 'legacy', meta: { customer: 'cus_42' } },
        { sha256: crypto.createHash('sha256').update(hashed).digest('hex'), prefix: hashed.slice(0, 10), project, plan: 'big' },
      ];
      const first = await admin.keys.import(entries);
      assert.deepEqual(first.map((k) => [k.prefix, k.status]), [[legacy.slice(0, 12), 'created'], [hashed.slice(0, 10), 'created']]);
      assert.ok(first.every((k) => /^key_[0-9A-Z]{26}$/.test(k.id)), JSON.stringify(first));

      // The integrator keeps its key: it works through the gateway from the answer on.
      const pg = new Postguard({ baseUrl: gw.url, apiKey: legacy });
      const me = await pg.me();
      assert.deepEqual([me.project, me.prefix, me.plan], [project, legacy.slice(0, 12), 'big']);
      const ik = uniq('sdk-ts-order');
      const made = await pg.request('POST', '/orders', { body: { n: 1 }, idempotencyKey: ik });
      const again = await pg.request('POST', '/orders', { body: { n: 1 }, idempotencyKey: ik });
      assert.deepEqual([made.status, made.replayed, again.status, again.replayed], [201, false, 201, true]);
      assert.equal((await pg.request('GET', '/items/1')).status, 200);
      // An old client that sends no key: forwarded until idempotency.required_from, and told so.
      const keyless = await pg.request('POST', '/orders', { body: { n: 2 }, idempotencyKey: null });
      assert.equal(keyless.status, 201);
      assert.equal(keyless.headers.get('postguard-idempotency-key-required-from'), '2099-01-01T00:00:00Z');
      assert.equal((await new Postguard({ baseUrl: gw.url, apiKey: hashed }).request('GET', '/items/2')).status, 200, 'the key imported by its hash works too');

      // The export re-run (after a timeout, say): nothing changes, the same ids.
      const rerun = await admin.keys.import(entries);
      assert.deepEqual(rerun.map((k) => k.status), ['exists', 'exists']);
      assert.deepEqual(rerun.map((k) => k.id), first.map((k) => k.id));

      // POST 201, its replay, GET 200, keyless POST 201: 4 requests, 3 forwarded, 3 billable, 1 replay.
      // The audit rows are written after each answer: poll.
      const sum = (rows, f) => rows.reduce((n, u) => n + u[f], 0);
      const mine = await poll(async () => {
        const rows = (await pg.usage({ granularity: 'hour' })).filter((u) => u.key_prefix === me.prefix);
        return sum(rows, 'requests') === 4 && rows;
      }, { timeout: 20000, message: 'the usage of four requests' });
      assert.deepEqual(['requests', 'admitted', 'billable', 'replays', 'refused'].map((f) => sum(mine, f)), [4, 3, 3, 1, 0]);
      assert.ok(mine.every((u) => u.project === project && u.period_start % 3_600_000 === 0), JSON.stringify(mine));
      // The operator: the project's keys by day, both imported keys.
      const byDay = await poll(async () => {
        const rows = await admin.usage({ project, granularity: 'day' });
        return sum(rows, 'requests') === 5 && rows;
      }, { timeout: 20000, message: 'both keys in the operator\'s usage' });
      assert.deepEqual(new Set(byDay.map((u) => u.key_prefix)), new Set([me.prefix, hashed.slice(0, 10)]));
      assert.ok(byDay.every((u) => u.period_start % 86_400_000 === 0));
      const stats = await poll(async () => {
        const s = await pg.stats({ days: 1 });
        return s.keys_missing_idempotency.length > 0 && s;
      }, { timeout: 20000, message: 'keys_missing_idempotency' });
      assert.deepEqual(stats.keys_missing_idempotency, [{ key_prefix: me.prefix, requests: 1 }]);
      assert.equal(stats.days.reduce((n, d) => n + d.missing_idempotency_key, 0), 1);
      // The audit row says where the request went, and that no report-only limit would have refused it.
      const row = await poll(async () => (await pg.audit.list({ idempotency_key: ik, limit: 5 })).data.find((r) => !r.replayed), { message: 'the order\'s audit row' });
      assert.deepEqual([row.origin, row.would_refuse], ['default', null]);
    });

    it('webhooks.create with the secret of a subscription moved from another system: deliveries are signed with it', async () => {
      const rcv = await startReceiver();
      closers.push(() => rcv.close());
      const pg = new Postguard({ baseUrl: gw.url, apiKey: await keyFor('big', 'moved-secret') });
      const publisher = new Postguard({ baseUrl: gw.url, originToken: ORIGIN_TOKEN });
      const moved = `whsec_${crypto.randomBytes(32).toString('base64')}`;
      const sub = await pg.webhooks.create({ url: rcv.url, events: ['*'], secret: moved });
      assert.equal(sub.secret, moved, 'the answer shows the secret it was given');
      const { id } = await publisher.events.publish({ project: (await pg.me()).project, type: 'moved.ping', data: { n: 1 } });
      const d = await deliveryOf(rcv, id);
      assert.equal(verifyWebhook(d.body, d.headers, moved).id, id, 'the receiver keeps verifying with the secret it had');
      const stranger = `whsec_${crypto.randomBytes(32).toString('base64')}`;
      assert.throws(() => verifyWebhook(d.body, d.headers, stranger), WebhookVerificationError);
    });
  });

  describe('the package as published', () => {
    it('the npm pack tarball installs, resolves through its exports map and ships types', async () => {
      const version = JSON.parse(fs.readFileSync(path.join(SDK_DIR, 'package.json'), 'utf8')).version;
      assert.equal(VERSION, version, 'VERSION matches package.json');
      const tarball = path.join(ROOT, 'target', 'sdk-typescript', `postguard-client-${version}.tgz`);
      assert.ok(fs.existsSync(tarball), `${tarball} (made by scripts/setup-clients-ts.sh)`);
      const files = execFileSync('tar', ['tzf', tarball], { encoding: 'utf8' }).split('\n').filter(Boolean);
      for (const f of ['package/package.json', 'package/README.md', 'package/dist/index.js', 'package/dist/index.d.ts', 'package/dist/webhooks.d.ts']) {
        assert.ok(files.includes(f), `${f} is packed`);
      }
      assert.ok(!files.some((f) => f.includes('/test/') || f.includes('node_modules')), 'no tests or node_modules packed');

      const app = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-sdk-ts-'));
      closers.push(() => fs.rmSync(app, { recursive: true, force: true }));
      const pkgDir = path.join(app, 'node_modules', '@postguard', 'client');
      fs.mkdirSync(pkgDir, { recursive: true });
      execFileSync('tar', ['xzf', tarball, '-C', pkgDir, '--strip-components=1']);
      // The one runtime dependency, as npm would have installed it (linked, not downloaded).
      fs.symlinkSync(path.join(SDK_DIR, 'node_modules', 'standardwebhooks'), path.join(app, 'node_modules', 'standardwebhooks'));
      for (const dep of ['@stablelib', 'fast-sha256']) {
        fs.symlinkSync(path.join(SDK_DIR, 'node_modules', dep), path.join(app, 'node_modules', dep));
      }
      fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ type: 'module', dependencies: { '@postguard/client': version } }));
      fs.writeFileSync(
        path.join(app, 'main.mjs'),
        "import * as pg from '@postguard/client';\nconsole.log(JSON.stringify(Object.keys(pg).sort()));\n",
      );
      const out = JSON.parse(execFileSync(process.execPath, ['main.mjs'], { cwd: app, encoding: 'utf8' }));
      for (const name of ['Postguard', 'PostguardClient', 'verifyWebhook', 'WebhookReceiver', 'RetriesExhaustedError', 'IdempotencyKeyReuseError', 'backoffDelay']) {
        assert.ok(out.includes(name), `${name} exported (${out})`);
      }
      const manifest = JSON.parse(fs.readFileSync(path.join(pkgDir, 'package.json'), 'utf8'));
      assert.deepEqual(Object.keys(manifest.dependencies), ['standardwebhooks'], 'no runtime dependency besides standardwebhooks');
      assert.equal(manifest.exports['.'].types, './dist/index.d.ts');
    });

    it('bundled as a Worker (esbuild, as wrangler does) it runs under workerd: a call through the gateway, a webhook verified', async () => {
      const { build } = await import('esbuild');
      const entry = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'pg-sdk-ts-worker-')), 'worker.mjs');
      closers.push(() => fs.rmSync(path.dirname(entry), { recursive: true, force: true }));
      fs.writeFileSync(
        entry,
        `import { Postguard, verifyWebhook } from ${JSON.stringify(SDK_DIST)};
  export default {
    async fetch(request, env) {
      const hook = await request.json();
      const pg = new Postguard({ baseUrl: env.GW, apiKey: env.KEY });
      const res = await pg.request('POST', '/from-a-worker', { body: { n: 1 } });
      const me = await pg.me();
      const event = verifyWebhook(hook.body, hook.headers, env.SECRET);
      return Response.json({ status: res.status, key: res.idempotencyKey, project: me.project, event: event.id });
    },
  };
  `,
      );
      const out = await build({ entryPoints: [entry], bundle: true, format: 'esm', platform: 'neutral', mainFields: ['module', 'main'], conditions: ['workerd', 'worker', 'browser'], write: false, logLevel: 'silent' });
      const { Miniflare, convertV4MiniflareOptions } = await import('miniflare');
      const bundle = path.join(path.dirname(entry), 'bundle.mjs');
      fs.writeFileSync(bundle, out.outputFiles[0].text);
      const project = uniq('sdk-ts-worker');
      const key = (await gw.createKey({ project, plan: 'big' })).key;
      const secret = `whsec_${crypto.randomBytes(24).toString('base64')}`;
      const { Webhook } = await import('standardwebhooks');
      const body = JSON.stringify({ id: 'evt_worker1', type: 't', timestamp: new Date().toISOString(), data: {} });
      const headers = { 'webhook-id': 'evt_worker1', 'webhook-timestamp': String(Math.floor(Date.now() / 1000)) };
      headers['webhook-signature'] = new Webhook(secret).sign('evt_worker1', new Date(Number(headers['webhook-timestamp']) * 1000), body);
      const mf = new Miniflare(convertV4MiniflareOptions({
        modules: [{ type: 'ESModule', path: bundle }],
        modulesRoot: path.dirname(bundle),
        compatibilityDate: '2025-01-01',
        bindings: { GW: gw.url, KEY: key, SECRET: secret },
      }));
      closers.push(() => mf.dispose());
      const res = await mf.dispatchFetch('http://worker.test/', { method: 'POST', body: JSON.stringify({ body, headers }) });
      const text = await res.text();
      assert.equal(res.status, 200, text);
      const got = JSON.parse(text);
      assert.equal(got.status, 201);
      assert.equal(got.project, project);
      assert.equal(got.event, 'evt_worker1');
      assert.equal(origin.stats.count(got.key), 1, 'the Worker-made call reached the origin with its generated key');
    });

    it('the unit tests of clients/typescript (backoff, limiter; fake clock and random) pass', () => {
      const tests = fs.readdirSync(path.join(SDK_DIR, 'test')).filter((f) => f.endsWith('.test.mjs')).map((f) => path.join('test', f));
      // Without NODE_TEST_CONTEXT the child reports in TAP instead of to this runner.
      const { NODE_TEST_CONTEXT: _, ...env } = process.env;
      const out = execFileSync(process.execPath, ['--test', '--test-reporter=tap', ...tests], { cwd: SDK_DIR, encoding: 'utf8', env });
      const pass = Number(/# pass (\d+)/.exec(out)?.[1]);
      assert.ok(pass >= 10, `unit tests ran (${pass})`);
      assert.match(out, /# fail 0/);
    });
  });
});
