// Security hardening (issue 15, ADR 0015) end to end on the real built worker under Miniflare:
// bounded reads of receivers' answers, fan-out and re-queue past the queue's 100-message batch,
// revocation that no cache outlives, the origin signature over identity, bounded audit filters,
// the negative key cache, and the secrets' configuration rules.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import http from 'node:http';
import { startOrigin, verifySignature, identityOf } from './support/origin.mjs';
import { rewriteDeliveries } from './support/webhook-shards.mjs';
import {
  startGateway, problem, poll, cfg, bearer, ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET,
} from './support/gateway.mjs';
import { uniq } from './support/util.mjs';

const CONFIG = {
  webhooks: { schedule_s: [1, 1], timeout_ms: 20000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 100000 }, small: { requests_per_window: 20, gateway: { requests: 20, window_s: 3600 } } },
  rate_limit: { stats_cost: 5 },
};

let origin;
let gw;
const servers = [];

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  for (const s of servers) s.closeAllConnections?.(), s.close();
  await gw?.dispose();
  await origin?.kill();
});

const api = (method, p, token, body) => gw.admin(method, p, body, { token });

/** A plain receiver: `answer(req, res)` writes the reply; every request is recorded. */
async function receiver(answer = (req, res) => res.end('ok')) {
  const seen = [];
  const srv = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      seen.push({ path: req.url, headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
      answer(req, res);
    });
  });
  srv.keepAliveTimeout = 60000;
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  servers.push(srv);
  return { url: `http://127.0.0.1:${srv.address().port}`, seen };
}

async function project(tag, plan = 'big') {
  const name = uniq(tag);
  const k = await gw.createKey({ project: name, plan });
  return { name, key: k.key, id: k.id };
}

async function subscribe(key, url) {
  const res = await api('POST', '/_postguard/v1/webhooks', key, { url, events: ['*'] });
  assert.equal(res.status, 201, res.text);
  return res.json;
}

async function publish(projectName, type = 'thing.happened') {
  const res = await api('POST', '/_postguard/v1/events', ORIGIN_TOKEN, { project: projectName, type, data: { n: 1 } });
  assert.equal(res.status, 202, res.text);
  return res.json.id;
}

async function deliveries(key, query = '') {
  const res = await api('GET', `/_postguard/v1/deliveries?limit=200${query}`, key);
  assert.equal(res.status, 200, res.text);
  return res.json.data;
}

describe('a receiver cannot exhaust the consumer (issue 15.1)', () => {
  it('an 800 MB answer is read only as far as the excerpt; the batch\'s other deliveries are delivered', async (t) => {
    const TOTAL = 800 * 1024 * 1024;
    const chunk = Buffer.alloc(64 * 1024, 'a');
    const huge = { sent: 0, finished: false, closed: false };
    // Streams lazily with backpressure: nothing near 800 MB is ever allocated here.
    const big = await receiver((req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': TOTAL });
      res.on('close', () => (huge.closed = true));
      const pump = () => {
        while (huge.sent < TOTAL) {
          huge.sent += chunk.length;
          if (!res.write(chunk)) return res.once('drain', pump);
        }
        huge.finished = true;
        res.end();
      };
      pump();
    });
    const small = await receiver();
    const p = await project('huge');
    const bigSub = await subscribe(p.key, `${big.url}/huge`);
    await subscribe(p.key, `${small.url}/a`);
    await subscribe(p.key, `${small.url}/b`);
    await publish(p.name);
    const done = await poll(async () => {
      const d = await deliveries(p.key);
      return d.length === 3 && d.every((x) => x.status !== 'pending') && d;
    }, { timeout: 60000, message: 'all three deliveries settled' });
    for (const d of done) assert.equal(d.status, 'delivered', JSON.stringify(d));
    const bigDelivery = done.find((d) => d.subscription_id === bigSub.id);
    const detail = await api('GET', `/_postguard/v1/deliveries/${bigDelivery.id}`, p.key);
    const attempt = detail.json.attempts[0];
    assert.equal(attempt.status_code, 200);
    assert.ok(attempt.response_excerpt.startsWith('aaaa'), attempt.response_excerpt?.slice(0, 40));
    assert.ok(attempt.response_excerpt.length <= 600, `excerpt is short: ${attempt.response_excerpt.length}`);
    await poll(() => huge.closed, { timeout: 30000, message: 'the gateway to drop the huge body' });
    assert.equal(huge.finished, false, `the gateway cancelled the body (${huge.sent} of ${TOTAL} bytes written)`);
    t.diagnostic(`the receiver wrote ${huge.sent} of ${TOTAL} bytes before the gateway dropped the body`);
    assert.equal(small.seen.length, 2);
    assert.equal((await deliveries(p.key, '&status=dead_letter')).length, 0, 'nothing dead-lettered');
  });
});

describe('fan-out past the queue\'s 100-message batch (issue 15.2)', () => {
  it('150 subscriptions: one publish delivers 150 times; 150 overdue deliveries are re-queued by the cron', async () => {
    const rcv = await receiver();
    const p = await project('fanout');
    for (let i = 0; i < 150; i++) await subscribe(p.key, `${rcv.url}/s${i}`);
    const evt = await publish(p.name);
    await poll(() => rcv.seen.length >= 150, { timeout: 120000, message: '150 deliveries' });
    assert.equal(new Set(rcv.seen.map((r) => r.path)).size, 150, 'one delivery per subscription');
    assert.ok(rcv.seen.every((r) => r.headers['webhook-id'] === evt));
    await poll(async () => (await deliveries(p.key, '&status=delivered')).length === 150, { timeout: 60000, message: '150 delivered' });

    // Make all 150 overdue (a lost enqueue), then run the cron: it must re-queue every one.
    // The rows live in the project's shard (ADR 0035): rewritten through its restore.
    const old = Date.now() - 3_600_000;
    const changes = await rewriteDeliveries(gw, p.name, (d) => ({ ...d, status: 'pending', next_attempt_at: old }));
    assert.equal(changes, 150);
    await (await gw.mf.getWorker()).scheduled({ cron: '17 3 * * *' });
    await poll(() => rcv.seen.length >= 300, { timeout: 120000, message: '150 re-queued deliveries' });
    await poll(async () => (await deliveries(p.key, '&status=delivered')).length === 150, { timeout: 60000, message: 'delivered again' });
  });

  it('subscriptions per project are capped by webhooks.max_subscriptions_per_project', async () => {
    const g = await startGateway({
      originUrl: origin.url,
      vars: { POSTGUARD_CONFIG: cfg({ ...CONFIG, webhooks: { ...CONFIG.webhooks, max_subscriptions_per_project: 2 } }) },
    });
    try {
      const k = await g.createKey({ project: uniq('cap'), plan: 'big' });
      const sub = (n) => g.admin('POST', '/_postguard/v1/webhooks', { url: `http://127.0.0.1:9/${n}`, events: ['*'] }, { token: k.key });
      assert.equal((await sub(1)).status, 201);
      assert.equal((await sub(2)).status, 201);
      const p = problem(await sub(3), { code: 'VALIDATION_ERROR' });
      assert.match(p.detail, /max_subscriptions_per_project/);
    } finally {
      await g.dispose();
    }
  });
});

/** Flags the key's Durable Object revoked directly: KV and every isolate cache still say live. */
async function revokeInObjectOnly(keyId) {
  const ns = await gw.mf.getDurableObjectNamespace('KEY_GUARD');
  const header = Buffer.from('{}');
  const len = Buffer.alloc(4);
  len.writeUInt32BE(header.length);
  const res = await ns.get(ns.idFromName(keyId)).fetch('https://key-guard/revoke', { method: 'POST', body: Buffer.concat([len, header]) });
  assert.equal(res.status, 200, await res.text());
}

describe('revocation is immediate everywhere (issue 15.3)', () => {
  it('a key revoked in its object is refused by every endpoint on the next request, whatever KV and the cache say', async () => {
    const p = await project('revoke');
    const sub = await subscribe(p.key, 'http://127.0.0.1:9/x');
    const calls = [
      ['GET', '/_postguard/v1/me'],
      ['GET', '/_postguard/v1/audit'],
      ['GET', '/_postguard/v1/stats'],
      ['GET', '/_postguard/v1/webhooks'],
      ['GET', `/_postguard/v1/webhooks/${sub.id}`],
      ['POST', '/_postguard/v1/webhooks', { url: 'http://127.0.0.1:9/y', events: ['*'] }],
      ['GET', '/_postguard/v1/deliveries'],
      ['GET', '/anything'],
    ];
    // Warm this isolate's cache with every endpoint first.
    for (const [m, path, body] of calls) {
      const res = await api(m, path, p.key, body);
      assert.ok(res.status < 300, `${m} ${path} before revocation: ${res.status} ${res.text}`);
    }
    await revokeInObjectOnly(p.id);
    const kv = await gw.mf.getKVNamespace('API_KEYS');
    const rec = await kv.get(`h:${crypto.createHash('sha256').update(p.key).digest('hex')}`, 'json');
    assert.equal(rec.revoked_at, null, 'KV still holds the key as live');
    for (const [m, path, body] of calls) {
      problem(await api(m, path, p.key, body), { status: 401, code: 'INVALID_API_KEY' });
    }
  });

  it('revoking a key pauses the subscriptions it created and says so; they receive nothing more', async () => {
    const rcv = await receiver();
    const name = uniq('revsubs');
    const doomed = await gw.createKey({ project: name, plan: 'big' });
    const kept = await gw.createKey({ project: name, plan: 'big' });
    const s1 = await subscribe(doomed.key, `${rcv.url}/doomed1`);
    await subscribe(doomed.key, `${rcv.url}/doomed2`);
    await subscribe(kept.key, `${rcv.url}/kept`);
    const res = await api('DELETE', `/_postguard/v1/keys/${doomed.id}`, ADMIN_TOKEN);
    assert.equal(res.status, 204, res.text);
    assert.equal(res.headers['x-postguard-subscriptions-paused'], '2');
    const again = await api('DELETE', `/_postguard/v1/keys/${doomed.id}`, ADMIN_TOKEN);
    assert.equal(again.headers['x-postguard-subscriptions-paused'], '0', 'revoking twice pauses nothing more');
    const db = await gw.mf.getD1Database('DB');
    const owner = await db.prepare('SELECT key_id, key_revoked_at FROM subscription_owners WHERE subscription_id = ?').bind(s1.id).first();
    assert.equal(owner.key_id, doomed.id);
    assert.ok(owner.key_revoked_at > 0, 'the subscription is paused');
    await publish(name);
    await poll(() => rcv.seen.some((r) => r.path === '/kept'), { timeout: 30000, message: 'the live key\'s subscription delivered' });
    const d = await deliveries(kept.key);
    assert.deepEqual(d.map((x) => new URL(x.url).pathname), ['/kept'], 'no delivery for the revoked key\'s subscriptions');
    assert.ok(!rcv.seen.some((r) => r.path.startsWith('/doomed')));
  });

  it('with webhooks.on_key_revoked = "delete" the subscriptions are deleted', async () => {
    const g = await startGateway({
      originUrl: origin.url,
      vars: { POSTGUARD_CONFIG: cfg({ ...CONFIG, webhooks: { ...CONFIG.webhooks, on_key_revoked: 'delete' } }) },
    });
    try {
      const name = uniq('revdel');
      const doomed = await g.createKey({ project: name, plan: 'big' });
      const kept = await g.createKey({ project: name, plan: 'big' });
      await g.admin('POST', '/_postguard/v1/webhooks', { url: 'http://127.0.0.1:9/d', events: ['*'] }, { token: doomed.key });
      await g.admin('POST', '/_postguard/v1/webhooks', { url: 'http://127.0.0.1:9/k', events: ['*'] }, { token: kept.key });
      const res = await g.admin('DELETE', `/_postguard/v1/keys/${doomed.id}`);
      assert.equal(res.status, 204);
      assert.equal(res.headers['x-postguard-subscriptions-deleted'], '1');
      const list = await g.admin('GET', '/_postguard/v1/webhooks', undefined, { token: kept.key });
      assert.deepEqual(list.json.data.map((s) => new URL(s.url).pathname), ['/k']);
    } finally {
      await g.dispose();
    }
  });
});

describe('the origin signature covers identity (issue 15.4, 15.5)', () => {
  it('signs project, key prefix, plan, Idempotency-Key, content type and client IP; a replay with a changed identity header fails', async () => {
    const p = await project('sig');
    const res = await gw.fetch('/orders?x=1', {
      method: 'POST',
      headers: {
        ...bearer(p.key), 'content-type': 'application/json', 'idempotency-key': uniq('ik'),
        'cf-connecting-ip': '203.0.113.5', 'x-forwarded-for': '6.6.6.6', 'true-client-ip': '6.6.6.6', forwarded: 'for=6.6.6.6',
      },
      body: '{"a":1}',
    });
    assert.equal(res.status, 201, res.text);
    const seen = origin.stats.byRequestId(res.headers['x-request-id']);
    assert.equal(seen.signature_ok, true, seen.signature_error);
    const h = seen.headers;
    assert.equal(h['x-postguard-client-ip'], '203.0.113.5', 'the edge\'s client address, signed');
    assert.equal(h['x-forwarded-for'], '203.0.113.5', 'X-Forwarded-For replaced by the real address');
    assert.equal(h['true-client-ip'], undefined);
    assert.equal(h.forwarded, undefined);

    // Replay the captured request straight to the origin, once as captured and once with a changed
    // identity header: only the untouched one verifies (dedupe on X-Request-Id catches that one).
    const replay = async (changes) => {
      const headers = { ...h, ...changes };
      delete headers.host;
      delete headers['content-length'];
      delete headers.connection;
      const r = await fetch(`${origin.url}/orders?x=1`, { method: 'POST', headers, body: '{"a":1}' });
      return JSON.parse(await r.text());
    };
    assert.equal((await replay({})).signature_ok, true);
    for (const changes of [
      { 'x-postguard-project': 'beta' },
      { 'x-postguard-plan': 'enterprise' },
      { 'x-postguard-key-prefix': 'pgk_otherkey1' },
      { 'idempotency-key': 'another' },
      { 'content-type': 'text/plain' },
      { 'x-postguard-client-ip': '198.51.100.1' },
    ]) {
      assert.equal((await replay(changes)).signature_ok, false, JSON.stringify(changes));
    }
    const base = {
      header: h['x-postguard-signature'], requestId: h['x-request-id'], method: 'POST', target: '/orders?x=1',
      bodySha256: seen.body_sha256, identity: identityOf(h),
    };
    assert.equal(verifySignature({ ...base, secret: ORIGIN_SIGNING_SECRET }).ok, true);
    assert.equal(verifySignature({ ...base, secret: ORIGIN_TOKEN }).ok, false, 'not signed with the publishing token');
  });
});

describe('endpoints whose cost a caller controls (issue 15.6)', () => {
  it('a 200-character path filter is a 400, not a D1 failure; long wildcard patterns and too many * are refused', async () => {
    const p = await project('pathcap');
    for (const path of [`/${'a'.repeat(199)}`, `/${'a'.repeat(198)}*`, `/${'a'.repeat(60)}*`, '/a*/b*/c*/d*/e*']) {
      const res = await api('GET', `/_postguard/v1/audit?path=${encodeURIComponent(path)}`, p.key);
      const pr = problem(res, { status: 400, code: 'VALIDATION_ERROR' });
      assert.match(pr.detail, /path/);
    }
    const ok = await api('GET', `/_postguard/v1/audit?path=${encodeURIComponent(`/${'a'.repeat(30)}*`)}`, p.key);
    assert.equal(ok.status, 200, ok.text);
  });

  it('a path filter without * matches exactly and case-sensitively; with * it is a case-sensitive GLOB', async () => {
    const p = await project('exact');
    const tag = crypto.randomBytes(3).toString('hex');
    for (const path of [`/Case/${tag}`, `/case/${tag}`, `/Case/${tag}/more`, `/Case_${tag}`]) {
      assert.equal((await gw.fetch(path, { headers: bearer(p.key) })).status, 200);
    }
    const paths = async (filter) => {
      const res = await api('GET', `/_postguard/v1/audit?path=${encodeURIComponent(filter)}`, p.key);
      assert.equal(res.status, 200, res.text);
      return res.json.data.map((r) => r.path).sort();
    };
    await poll(async () => (await paths('/*')).length >= 4, { message: 'audit rows written' });
    assert.deepEqual(await paths(`/Case/${tag}`), [`/Case/${tag}`]);
    assert.deepEqual(await paths(`/Case/${tag}*`), [`/Case/${tag}/more`], '* spans one or more characters');
    assert.deepEqual(await paths(`/case/*`), [`/case/${tag}`]);
    assert.deepEqual(await paths(`/Case?${tag}`), [], '? is literal');
  });

  it('/audit and /stats consume the key\'s gateway policy (audit_cost 1 by default, stats_cost 5 as configured), never its API budget; /me and the webhook endpoints cost nothing', async () => {
    const p = await project('budget', 'small');
    const remaining = (res) => Number(res.headers['x-ratelimit-remaining']);
    const me = await api('GET', '/_postguard/v1/me', p.key);
    assert.equal(me.json.remaining, 20, 'the API budget');
    const hooks = await api('GET', '/_postguard/v1/webhooks', p.key);
    assert.equal(hooks.status, 200);
    assert.equal(hooks.headers['ratelimit-policy'], '"gateway";q=20;w=3600', 'gateway endpoints answer with the gateway policy');
    const start = remaining(hooks);
    assert.equal(start, 20, 'listing webhooks cost nothing');
    const audit = await api('GET', '/_postguard/v1/audit', p.key);
    assert.equal(audit.status, 200, audit.text);
    assert.equal(remaining(audit), start - 1);
    const stats = await api('GET', '/_postguard/v1/stats', p.key);
    assert.equal(stats.status, 200, stats.text);
    assert.equal(remaining(stats), start - 6);
    for (let i = 0; i < 2; i++) assert.equal((await api('GET', '/_postguard/v1/stats', p.key)).status, 200);
    const refused = await api('GET', '/_postguard/v1/stats', p.key); // 4 left, costs 5
    problem(refused, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
    assert.ok(refused.headers['retry-after']);
    assert.equal((await api('GET', '/_postguard/v1/me', p.key)).json.remaining, 20, 'the API budget untouched');
  });

  it('an unknown API key is remembered briefly: a key appearing in KV is not looked up until the entry expires', async () => {
    const fake = `pgk_${crypto.randomBytes(32).toString('base64url').slice(0, 43)}`;
    problem(await api('GET', '/_postguard/v1/me', fake), { status: 401, code: 'INVALID_API_KEY' });
    const kv = await gw.mf.getKVNamespace('API_KEYS');
    const record = { id: `key_${'0'.repeat(20)}${crypto.randomBytes(3).toString('hex').toUpperCase()}`, prefix: fake.slice(0, 12), project: uniq('neg'), plan: 'big', name: null, created_at: Date.now(), revoked_at: null };
    await kv.put(`h:${crypto.createHash('sha256').update(fake).digest('hex')}`, JSON.stringify(record));
    problem(await api('GET', '/_postguard/v1/me', fake), { status: 401, code: 'INVALID_API_KEY' });
    const ok = await poll(async () => {
      const r = await api('GET', '/_postguard/v1/me', fake);
      return r.status === 200 && r;
    }, { timeout: 30000, interval: 500, message: 'the negative entry to expire' });
    assert.equal(ok.json.project, record.project);
    assert.ok(ok.at - ok.sentAt >= 0);
  });

  it('rows of unauthenticated requests keep short, truncated fields', async () => {
    const path = `/${'p'.repeat(600)}`;
    const res = await gw.fetch(path, { headers: { authorization: `Bearer pgk_${'Z'.repeat(43)}`, 'user-agent': 'u'.repeat(500) } });
    problem(res, { status: 401, code: 'INVALID_API_KEY' });
    const rid = res.headers['x-request-id'];
    const row = await poll(async () => {
      const r = await api('GET', `/_postguard/v1/audit?request_id=${rid}`, ADMIN_TOKEN);
      return r.json?.data?.[0];
    }, { message: 'the audit row' });
    assert.equal(row.path.length, 128);
    assert.equal(row.user_agent.length, 128);
  });
});

describe('secrets configuration (issue 15.7)', () => {
  const invalid = async (secrets, field) => {
    const g = await startGateway({ originUrl: origin.url, secrets, vars: { POSTGUARD_CONFIG: '{}' } });
    try {
      for (const res of [await g.fetch('/anything'), await g.admin('GET', '/_postguard/v1/keys')]) {
        const p = problem(res, { status: 500, code: 'CONFIG_INVALID' });
        assert.match(p.detail, new RegExp(field));
        for (const s of Object.values(secrets)) assert.ok(!p.detail.includes(s), 'no secret in the detail');
      }
    } finally {
      await g.dispose();
    }
  };

  it('ORIGIN_TOKEN equal to ADMIN_TOKEN → CONFIG_INVALID naming ORIGIN_TOKEN', async () => {
    await invalid({ ADMIN_TOKEN, ORIGIN_TOKEN: ADMIN_TOKEN, ORIGIN_SIGNING_SECRET }, 'ORIGIN_TOKEN');
  });

  it('a signing secret equal to another token → CONFIG_INVALID naming ORIGIN_SIGNING_SECRET', async () => {
    await invalid({ ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET: ORIGIN_TOKEN }, 'ORIGIN_SIGNING_SECRET');
  });

  it('a token shorter than 32 characters → CONFIG_INVALID naming it', async () => {
    await invalid({ ADMIN_TOKEN: 'short-admin-token', ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET }, 'ADMIN_TOKEN');
  });

  it('the test secrets satisfy the rules', () => {
    for (const s of [ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET]) assert.ok(s.length >= 32, s);
    assert.equal(new Set([ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET]).size, 3);
  });
});
