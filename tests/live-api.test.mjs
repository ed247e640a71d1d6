// In front of an API that already has customers (docs/live-api.md): several origins and routes,
// where the API key is read, keys the API already issued (import, and verification of keys not
// imported yet), report-only limits, Idempotency-Key required from a date, subscriptions that keep
// their secret. The real worker under Miniflare, two real origins, a real receiver.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { receiverPool, verifyBoth } from './support/receiver.mjs';
import { startGateway, problem, poll, cfg, bearer, ORIGIN_TOKEN } from './support/gateway.mjs';
import { uniq, show, stays } from './support/util.mjs';

const VERIFY_PATH = '/internal/keys/verify';
const NEGATIVE_S = 3;
// Ahead of the whole file's run, then moved near by a second gateway (below).
const REQUIRED_FROM = '2099-01-01T00:00:00Z';
const CONFIG = {
  origin: {
    timeout_ms: 4000,
    routes: [
      { path: '/billing/*', origin: 'billing', strip_prefix: '/billing' },
      { method: 'GET', path: '/reports/*', origin: 'billing' },
    ],
  },
  idempotency: { lease_s: 6, required_from: REQUIRED_FROM },
  auth: {
    api_key_from: ['header:X-Api-Key', 'basic', 'bearer'],
    verify_unknown_keys: { path: VERIFY_PATH, negative_cache_s: NEGATIVE_S },
  },
  limits: { unauthenticated_per_minute: 8 },
  plans: {
    big: { requests_per_window: 100000, window_s: 60 },
    watch: { requests_per_window: 2, window_s: 60, enforce: false },
    strict: { requests_per_window: 2, window_s: 60 },
  },
  webhooks: { schedule_s: [1, 1], timeout_ms: 3000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
};

let origin;
let billing;
let gw;
const receiver = receiverPool();
const legacyKey = () => `sk_live_${crypto.randomBytes(12).toString('hex')}`;
const sha256 = (s) => crypto.createHash('sha256').update(s).digest('hex');
const ip = () => `198.51.100.${1 + crypto.randomInt(250)}`;

before(async () => {
  origin = await startOrigin();
  billing = await startOrigin();
  const config = { ...CONFIG, origins: { billing: { url: `${billing.url}/v2`, timeout_ms: 3000 } } };
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(config) } });
});
after(async () => {
  await receiver.closeAll();
  await gw?.dispose();
  await origin?.kill();
  await billing?.kill();
});

const importKeys = (keys, headers) => gw.admin('POST', '/_postguard/v1/keys/import', { keys }, { headers });

describe('several origins', () => {
  it('a route sends its requests to its origin (prefix stripped, base path kept, signed); the rest go to default', async () => {
    const { key } = await gw.createKey({ project: uniq('routes'), plan: 'big' });
    const res = await gw.fetch('/billing/invoices/7?expand=lines', { headers: bearer(key) });
    assert.equal(res.status, 200, show(res));
    const seen = billing.stats.byRequestId(res.headers['x-request-id']);
    assert.ok(seen, 'the billing origin got it');
    assert.equal(seen.target, '/v2/invoices/7?expand=lines');
    assert.equal(seen.signature_ok, true, seen.signature_error);
    assert.equal(origin.stats.byRequestId(res.headers['x-request-id']), undefined, 'not the default origin');
    // A route with a method: GET only; a POST to the same path goes to default.
    const got = await gw.fetch('/reports/q1', { headers: bearer(key) });
    assert.equal(billing.stats.byRequestId(got.headers['x-request-id'])?.target, '/v2/reports/q1');
    const posted = await gw.fetch('/reports/q1', { method: 'POST', headers: { ...bearer(key), 'idempotency-key': uniq('r') } });
    assert.equal(posted.status, 201, show(posted));
    assert.equal(origin.stats.byRequestId(posted.headers['x-request-id'])?.target, '/reports/q1');
    // "/billingx" is not under "/billing/": default, unchanged.
    const near = await gw.fetch('/billingx/1', { headers: bearer(key) });
    assert.equal(origin.stats.byRequestId(near.headers['x-request-id'])?.target, '/billingx/1');
  });

  it('each origin has its own timeout and its own 502', async () => {
    const { key } = await gw.createKey({ project: uniq('routes'), plan: 'big' });
    const slow = await gw.fetch('/billing/slow', { headers: { ...bearer(key), 'x-demo-delay-ms': '3600' } });
    problem(slow, { status: 504, code: 'ORIGIN_TIMEOUT' });
    assert.match(slow.json.detail, /3000 ms/, 'the billing origin timeout, not the default one');
    const fine = await gw.fetch('/slow', { headers: { ...bearer(key), 'x-demo-delay-ms': '3600' } });
    assert.equal(fine.status, 200, 'the default origin waits 4000 ms');
  });
});

describe('where the API key is read', () => {
  it('X-Api-Key, Basic user name or Bearer; the credential never reaches the origin', async () => {
    const { key } = await gw.createKey({ project: uniq('from'), plan: 'big' });
    const basic = `Basic ${Buffer.from(`${key}:`).toString('base64')}`;
    for (const headers of [{ 'x-api-key': key }, { authorization: basic }, bearer(key)]) {
      const res = await gw.fetch('/v1/things', { headers });
      assert.equal(res.status, 200, `${Object.keys(headers)[0]}: ${show(res)}`);
      const seen = origin.stats.byRequestId(res.headers['x-request-id']);
      assert.ok(!JSON.stringify(seen.rawHeaders).includes(key), 'the key reaches the origin nowhere');
      assert.equal(seen.headers['x-api-key'], undefined);
      assert.equal(seen.headers.authorization, undefined);
    }
    const missing = await gw.fetch('/v1/things');
    problem(missing, { status: 401, code: 'INVALID_API_KEY' });
    assert.match(missing.json.detail, /X-Api-Key/, 'the 401 says where a key is read');
  });
});

describe('keys the API already issued', () => {
  it('imports keys and hashes; each works at once, as an API key like any other', async () => {
    const project = uniq('imp');
    const [a, b] = [legacyKey(), legacyKey()];
    const res = await importKeys([
      { key: a, project, plan: 'big', name: 'legacy a', meta: { tier: 'gold' } },
      { sha256: sha256(b), prefix: 'sk_live_b', project, plan: 'strict' },
    ]);
    assert.equal(res.status, 200, show(res));
    assert.deepEqual(res.json.data.map((d) => [d.prefix, d.status]), [[a.slice(0, 12), 'created'], ['sk_live_b', 'created']]);
    for (const k of [a, b]) {
      const used = await gw.fetch('/v1/imported', { headers: bearer(k) });
      assert.equal(used.status, 200, show(used));
    }
    const seen = origin.stats.byRequestId((await gw.fetch('/v1/x', { headers: bearer(a) })).headers['x-request-id']);
    assert.equal(seen.headers['x-postguard-key-prefix'], a.slice(0, 12));
    assert.equal(seen.headers['x-postguard-project'], project);
    // Listed, limited by its plan, revocable.
    const listed = await gw.admin('GET', `/_postguard/v1/keys?project=${project}`);
    assert.deepEqual(new Set(listed.json.data.map((k) => k.id)), new Set(res.json.data.map((d) => d.id)));
    const strictId = res.json.data[1].id;
    assert.equal((await gw.fetch('/v1/x', { headers: bearer(b) })).status, 200, 'the second of 2');
    const third = await gw.fetch('/v1/x', { headers: bearer(b) });
    problem(third, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
    assert.equal((await gw.admin('DELETE', `/_postguard/v1/keys/${strictId}`)).status, 204);
    problem(await gw.fetch('/v1/x', { headers: bearer(b) }), { status: 401 });
    // A reroll issues postguard's own format; the legacy secret keeps its grace.
    const rr = await gw.admin('POST', `/_postguard/v1/keys/${res.json.data[0].id}/reroll`, { grace_s: 60 });
    assert.equal(rr.status, 201, show(rr));
    assert.match(rr.json.key, /^sk_live_.{4}/, 'the public prefix is kept');
    assert.equal((await gw.fetch('/v1/x', { headers: bearer(rr.json.key) })).status, 200);
    assert.equal((await gw.fetch('/v1/x', { headers: bearer(a) })).status, 200);
  });

  it('a re-run says exists with the same ids and changes nothing', async () => {
    const project = uniq('imp');
    const keys = [{ key: legacyKey(), project, plan: 'big', name: 'first' }];
    const first = await importKeys(keys);
    const again = await importKeys([{ ...keys[0], plan: 'strict', name: 'second' }]);
    assert.equal(again.status, 200, show(again));
    assert.equal(again.json.data[0].status, 'exists');
    assert.equal(again.json.data[0].id, first.json.data[0].id);
    const got = await gw.admin('GET', `/_postguard/v1/keys/${first.json.data[0].id}`);
    assert.deepEqual([got.json.plan, got.json.name], ['big', 'first'], 'unchanged');
  });

  it('one invalid entry refuses the whole call, naming it; nothing is imported', async () => {
    const project = uniq('imp');
    const good = legacyKey();
    const res = await importKeys([
      { key: good, project, plan: 'big' },
      { key: legacyKey(), project, plan: 'big' },
      { key: legacyKey(), project, plan: 'big' },
      { key: legacyKey(), project, plan: 'no-such-plan' },
    ]);
    const p = problem(res, { status: 400, code: 'VALIDATION_ERROR' });
    assert.match(p.detail, /^keys\[3\]\.plan/);
    problem(await gw.fetch('/v1/x', { headers: { ...bearer(good), 'cf-connecting-ip': ip() } }), { status: 401 });
    for (const [body, named] of [
      [{ keys: [] }, /^keys/],
      [{ keys: [{ key: 'short', project, plan: 'big' }] }, /^keys\[0\]\.key/],
      [{ keys: [{ sha256: sha256('x'.repeat(20)), project, plan: 'big' }] }, /^keys\[0\]\.prefix/],
      [{ keys: [{ key: good, project, plan: 'big' }, { key: good, project, plan: 'big' }] }, /keys\[1\]\.key: the same key as keys\[0\]/],
    ]) {
      const r = await gw.admin('POST', '/_postguard/v1/keys/import', body);
      assert.match(problem(r, { status: 400, code: 'VALIDATION_ERROR' }).detail, named);
      assert.ok(!r.text.includes(good), 'an error never repeats a key');
    }
  });

  it('honours Idempotency-Key: a retried import is replayed', async () => {
    const keys = [{ key: legacyKey(), project: uniq('imp'), plan: 'big' }];
    const ik = uniq('import');
    const first = await importKeys(keys, { 'idempotency-key': ik });
    const retry = await importKeys(keys, { 'idempotency-key': ik });
    assert.equal(retry.headers['idempotent-replayed'], 'true');
    assert.equal(retry.text, first.text);
    assert.equal(retry.json.data[0].status, 'created', 'the first answer, replayed');
  });

  it('1,000 keys in one call: every one answered in order, and usable', async () => {
    const project = uniq('imp-many');
    const keys = Array.from({ length: 1000 }, (_, i) => ({ key: `${legacyKey()}_${i}`, project, plan: 'big' }));
    const res = await importKeys(keys);
    assert.equal(res.status, 200, show(res));
    assert.equal(res.json.data.length, 1000);
    assert.ok(res.json.data.every((d, i) => d.status === 'created' && d.prefix === keys[i].key.slice(0, 12)));
    assert.equal(new Set(res.json.data.map((d) => d.id)).size, 1000, 'one id per key');
    for (const i of [0, 99, 100, 555, 999]) {
      const used = await gw.fetch('/v1/x', { headers: bearer(keys[i].key) });
      assert.equal(used.status, 200, `key ${i}: ${show(used)}`);
    }
    const tooMany = await gw.admin('POST', '/_postguard/v1/keys/import', { keys: [...keys, keys[0]] });
    assert.match(problem(tooMany, { status: 400 }).detail, /1 to 1000/);
  });
});

describe('keys not imported yet', () => {
  const register = (k, extra = {}) => fetch(`${origin.url}/__demo/legacy-keys`, { method: 'POST', body: JSON.stringify({ key: k, ...extra }) });

  it('20 simultaneous first requests with a key from one address: one verification call, all admitted, the key imported', async () => {
    const k = legacyKey();
    const project = uniq('verify');
    await register(k, { project, plan: 'big', name: 'from the API', delay_ms: 400 });
    const from = ip();
    const all = await Promise.all(
      Array.from({ length: 20 }, () => gw.fetch('/v1/first', { headers: { ...bearer(k), 'cf-connecting-ip': from } })),
    );
    assert.deepEqual(all.map((r) => r.status), Array(20).fill(200), all.map((r) => show(r)).join('\n'));
    assert.equal(origin.stats.verifyCalls[k], 1, 'one call to the verification endpoint');
    const call = origin.stats.find((r) => r.path === VERIFY_PATH && r.body_sha256 === sha256(JSON.stringify({ key: k })));
    assert.equal(call.length, 1);
    assert.equal(call[0].signature_ok, true, call[0].signature_error);
    assert.equal(call[0].headers['content-type'], 'application/json');
    const listed = await gw.admin('GET', `/_postguard/v1/keys?project=${project}`);
    assert.equal(listed.json.data.length, 1);
    assert.deepEqual([listed.json.data[0].prefix, listed.json.data[0].name], [k.slice(0, 12), 'from the API']);
    // From now on it is an imported key: no more calls.
    assert.equal((await gw.fetch('/v1/again', { headers: bearer(k) })).status, 200);
    assert.equal(origin.stats.verifyCalls[k], 1);
    // The import is audited once, as the operator's would be, and no row holds the key.
    const rows = await poll(async () => {
      const r = await gw.admin('GET', `/_postguard/v1/audit?project=${project}&limit=200`);
      return r.json.data.length >= 22 ? r.json.data : undefined;
    }, { timeout: 20000, message: 'the audit rows' });
    const imports = rows.filter((r) => r.path === '/_postguard/v1/keys/import');
    assert.equal(imports.length, 1, JSON.stringify(imports));
    assert.deepEqual([imports[0].method, imports[0].status, imports[0].key_prefix], ['POST', 201, k.slice(0, 12)]);
    assert.ok(!JSON.stringify(rows).includes(k), 'no audit row holds the key');
  });

  it('a key the API refuses is 401 and not asked about again until negative_cache_s has passed', async () => {
    const k = legacyKey();
    // From several addresses, so the limit on refused credentials stays out of the way.
    const ask = () => gw.fetch('/v1/x', { headers: { ...bearer(k), 'cf-connecting-ip': ip() } });
    problem(await ask(), { status: 401, code: 'INVALID_API_KEY' });
    problem(await ask(), { status: 401, code: 'INVALID_API_KEY' });
    assert.equal(origin.stats.verifyCalls[k], 1);
    await poll(async () => {
      problem(await ask(), { status: 401 });
      return origin.stats.verifyCalls[k] === 2;
    }, { timeout: (NEGATIVE_S + 20) * 1000, interval: 500, message: 'asked again after the negative cache' });
  });

  it('an origin that fails is 502, one that hangs 504; neither is remembered', async () => {
    const broken = legacyKey();
    await register(broken, { project: 'p', plan: 'big', status: 500 });
    const res = await gw.fetch('/v1/x', { headers: { ...bearer(broken), 'cf-connecting-ip': ip() } });
    const p = problem(res, { status: 502, code: 'ORIGIN_UNREACHABLE' });
    assert.ok(!p.detail.includes(broken));
    const bad = legacyKey();
    await register(bad, { project: 'p', plan: 'no-such-plan' });
    problem(await gw.fetch('/v1/x', { headers: { ...bearer(bad), 'cf-connecting-ip': ip() } }), { status: 502 });
    const hung = legacyKey();
    await register(hung, { hang: true });
    problem(await gw.fetch('/v1/x', { headers: { ...bearer(hung), 'cf-connecting-ip': ip() } }), { status: 504, code: 'ORIGIN_TIMEOUT' });
    await register(broken, { project: uniq('verify'), plan: 'big' });
    assert.equal((await gw.fetch('/v1/x', { headers: { ...bearer(broken), 'cf-connecting-ip': ip() } })).status, 200, 'asked again');
    assert.equal(origin.stats.verifyCalls[broken], 2);
  });

  it('a flood of made-up keys from one address reaches the origin at most unauthenticated_per_minute times', async () => {
    const from = ip();
    const made = Array.from({ length: 20 }, () => legacyKey());
    const statuses = [];
    for (const k of made) statuses.push((await gw.fetch('/v1/x', { headers: { ...bearer(k), 'cf-connecting-ip': from } })).status);
    const asked = made.filter((k) => origin.stats.verifyCalls[k]).length;
    assert.ok(asked <= 8, `${asked} verification calls for 20 made-up keys`);
    assert.ok(asked >= 1);
    assert.equal(statuses.filter((s) => s === 401).length, asked, statuses.join(','));
    assert.equal(statuses.filter((s) => s === 429).length, 20 - asked, statuses.join(','));
  });
});

describe('report-only limits', () => {
  it('counts and advertises as enforced, but forwards what it would refuse', async () => {
    const { key } = await gw.createKey({ project: uniq('watch'), plan: 'watch' });
    const strict = await gw.createKey({ project: uniq('strict'), plan: 'strict' });
    const seen = [];
    for (let i = 0; i < 4; i++) {
      const w = await gw.fetch('/v1/x', { headers: bearer(key) });
      const s = await gw.fetch('/v1/x', { headers: bearer(strict.key) });
      assert.equal(w.status, 200, `report-only request ${i + 1}: ${show(w)}`);
      assert.equal(s.status, i < 2 ? 200 : 429);
      for (const h of ['x-ratelimit-limit', 'x-ratelimit-remaining', 'ratelimit-policy']) {
        assert.equal(w.headers[h], s.headers[h], `${h} as when enforced (request ${i + 1})`);
      }
      seen.push(w);
    }
    assert.equal(seen[3].headers['x-ratelimit-remaining'], '0');
    const forwarded = seen.map((r) => origin.stats.byRequestId(r.headers['x-request-id'])).filter(Boolean);
    assert.equal(forwarded.length, 4, 'all four reached the origin');
  });
});

describe('Idempotency-Key required from a date', () => {
  it('until then a keyless POST is forwarded and told the date; a keyed one is not', async () => {
    const { key } = await gw.createKey({ project: uniq('req'), plan: 'big' });
    const res = await gw.fetch('/v1/orders', { method: 'POST', headers: bearer(key), body: '{}' });
    assert.equal(res.status, 201, show(res));
    assert.equal(res.headers['postguard-idempotency-key-required-from'], REQUIRED_FROM);
    assert.match(res.headers['access-control-expose-headers'] ?? 'Postguard-Idempotency-Key-Required-From', /Postguard-Idempotency-Key-Required-From/);
    const keyed = await gw.fetch('/v1/orders', { method: 'POST', headers: { ...bearer(key), 'idempotency-key': uniq('k') }, body: '{}' });
    assert.equal(keyed.headers['postguard-idempotency-key-required-from'], undefined);
  });

  it('from the date on, 400 IDEMPOTENCY_KEY_REQUIRED', async () => {
    const at = new Date(Date.now() + 6000).toISOString();
    const o = await startOrigin();
    const g = await startGateway({ originUrl: o.url, vars: { POSTGUARD_CONFIG: cfg({ idempotency: { required_from: at }, plans: { big: { requests_per_window: 1000 } } }) } });
    try {
      const { key } = await g.createKey({ project: 'p', plan: 'big' });
      const post = () => g.fetch('/v1/orders', { method: 'POST', headers: bearer(key), body: '{}' });
      const before = await post();
      if (Date.now() < Date.parse(at) - 500) {
        assert.equal(before.status, 201, show(before));
        assert.equal(before.headers['postguard-idempotency-key-required-from'], at);
      }
      await poll(async () => (await post()).status === 400, { timeout: 30000, interval: 500, message: 'enforced after the date' });
      problem(await post(), { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
    } finally {
      await g.dispose();
      await o.kill();
    }
  });
});

describe('subscriptions moved from another system', () => {
  it('keep their secret: deliveries verify with it', async () => {
    const project = uniq('moved');
    const { key } = await gw.createKey({ project, plan: 'big' });
    const secret = `whsec_${crypto.randomBytes(32).toString('base64')}`;
    const r = await receiver(() => ({ status: 200 }));
    r.addSecret(secret);
    const sub = await gw.admin('POST', '/_postguard/v1/webhooks', { url: r.url, events: ['*'], secret }, { token: key });
    assert.equal(sub.status, 201, show(sub));
    assert.equal(sub.json.secret, secret);
    const pub = await gw.admin('POST', '/_postguard/v1/events', { project, type: 'order.paid', data: { n: 1 } }, { token: ORIGIN_TOKEN });
    assert.equal(pub.status, 202, show(pub));
    const got = await poll(() => r.requests[0], { timeout: 20000, message: 'the delivery' });
    assert.equal(got.verified, true, JSON.stringify(got.verification));
    const v = verifyBoth(secret, got.body, got.headers);
    assert.deepEqual([v.standardwebhooks, v.svix], [true, true]);
    for (const bad of ['whsec_short', crypto.randomBytes(32).toString('base64')]) {
      const refused = await gw.admin('POST', '/_postguard/v1/webhooks', { url: r.url, events: ['*'], secret: bad }, { token: key });
      assert.match(problem(refused, { status: 400, code: 'VALIDATION_ERROR' }).detail, /^secret/);
      assert.ok(!refused.text.includes(bad));
    }
    await stays(() => r.requests.length === 1, 1500, 'one delivery');
  });
});

describe('what the audit log, /stats and /usage say', () => {
  const auditRow = async (requestId) => poll(async () => {
    const r = await gw.admin('GET', `/_postguard/v1/audit?request_id=${requestId}`);
    return r.json?.data?.[0];
  }, { timeout: 15000, message: `the audit row of ${requestId}` });

  it('a row names its origin, and what report-only limits would have refused', async () => {
    const { key } = await gw.createKey({ project: uniq('rows'), plan: 'watch' });
    const routed = await gw.fetch('/billing/x', { headers: bearer(key) });
    assert.equal((await auditRow(routed.headers['x-request-id'])).origin, 'billing');
    const plain = await gw.fetch('/v1/x', { headers: bearer(key) });
    const row = await auditRow(plain.headers['x-request-id']);
    assert.deepEqual([row.origin, row.would_refuse], ['default', null]);
    const over = await gw.fetch('/v1/x', { headers: bearer(key) });
    assert.equal(over.status, 200, 'forwarded all the same');
    assert.equal((await auditRow(over.headers['x-request-id'])).would_refuse, 'default');
  });

  it('usage counts each operation once: not its 5xx, its replays or its 409s', async () => {
    const project = uniq('usage');
    const { key, prefix } = await gw.createKey({ project, plan: 'big' });
    const post = (ik, headers = {}) => gw.fetch('/v1/orders', { method: 'POST', headers: { ...bearer(key), 'idempotency-key': ik, ...headers }, body: '{}' });
    const ik1 = uniq('u1');
    await fetch(`${origin.url}/__demo/script`, { method: 'POST', body: JSON.stringify({ key: ik1, statuses: [503, 201] }) });
    assert.equal((await post(ik1)).status, 503);
    assert.equal((await post(ik1)).status, 201, 'the retry after a 5xx runs');
    const replay = await post(ik1);
    assert.equal(replay.headers['idempotent-replayed'], 'true');
    const ik2 = uniq('u2');
    const slow = post(ik2, { 'x-demo-delay-ms': '3000' });
    // Gated on the origin holding the first: the second is then a 409 whatever the load.
    await poll(() => origin.stats.count(ik2) === 1, { timeout: 10000, message: 'the first at the origin' });
    const during = await post(ik2);
    assert.equal(during.status, 409, show(during));
    assert.equal((await slow).status, 201);
    assert.equal((await gw.fetch('/v1/list', { headers: bearer(key) })).status, 200);
    assert.equal((await gw.fetch('/v1/list', { headers: { ...bearer(key), 'x-demo-status': '500' } })).status, 500);
    // 503, 201, replay, 201 (ik2), 409, 200, 500: 7 requests, 5 forwarded, 3 billable, 1 replay.
    const want = { key_prefix: prefix, project, requests: 7, admitted: 5, billable: 3, replays: 1, refused: 0 };
    const got = await poll(async () => {
      const r = await gw.admin('GET', `/_postguard/v1/usage?project=${project}&granularity=hour`);
      assert.equal(r.status, 200, show(r));
      const rows = r.json.data.filter((u) => u.key_prefix === prefix);
      const sum = (f) => rows.reduce((a, u) => a + u[f], 0);
      return sum('requests') === 7 ? { rows, sum } : undefined;
    }, { timeout: 20000, message: 'usage of 7 requests' });
    for (const f of ['requests', 'admitted', 'billable', 'replays', 'refused']) assert.equal(got.sum(f), want[f], f);
    assert.ok(got.rows.every((u) => u.period_start % 3_600_000 === 0 && u.project === project));
    // The key reads its own project's usage, and nobody else's.
    const own = await gw.fetch('/_postguard/v1/usage', { headers: bearer(key) });
    assert.equal(own.status, 200, show(own));
    assert.ok(own.json.data.length > 0 && own.json.data.every((u) => u.project === project));
    problem(await gw.fetch('/_postguard/v1/usage?project=other', { headers: bearer(key) }), { status: 400 });
    problem(await gw.admin('GET', '/_postguard/v1/usage?granularity=week'), { status: 400, code: 'VALIDATION_ERROR' });
  });

  it('refusals count as refused, never billable; the operator sees every project', async () => {
    const project = uniq('usage-strict');
    const { key, prefix } = await gw.createKey({ project, plan: 'strict' });
    for (let i = 0; i < 3; i++) await gw.fetch('/v1/x', { headers: bearer(key) });
    const row = await poll(async () => {
      const r = await gw.admin('GET', '/_postguard/v1/usage?granularity=day');
      return r.json.data.find((u) => u.key_prefix === prefix && u.requests === 3);
    }, { timeout: 20000, message: 'the strict key in the operator\'s usage' });
    assert.deepEqual([row.project, row.admitted, row.billable, row.refused], [project, 2, 2, 1]);
    // Paged like every list: one entry a page, each once, in order.
    const seen = [];
    let cursor = null;
    for (let pages = 0; pages < 500; pages++) {
      const r = await gw.admin('GET', `/_postguard/v1/usage?granularity=day&limit=1${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
      assert.equal(r.status, 200, show(r));
      assert.ok(r.json.data.length <= 1);
      seen.push(...r.json.data.map((u) => `${u.period_start}/${u.project}/${u.key_prefix}`));
      cursor = r.json.next_cursor;
      if (!cursor) break;
    }
    assert.equal(cursor, null, 'the pages end');
    assert.equal(new Set(seen).size, seen.length, 'no entry twice');
    assert.ok(seen.includes(`${row.period_start}/${project}/${prefix}`));
    problem(await gw.admin('GET', '/_postguard/v1/usage?cursor=nonsense'), { status: 400 });
  });

  it('/stats names who still sends required requests without an Idempotency-Key', async () => {
    const project = uniq('missing');
    const late = await gw.createKey({ project, plan: 'big' });
    const good = await gw.createKey({ project, plan: 'big' });
    for (let i = 0; i < 3; i++) await gw.fetch('/v1/orders', { method: 'POST', headers: bearer(late.key), body: '{}' });
    await gw.fetch('/v1/orders', { method: 'POST', headers: { ...bearer(good.key), 'idempotency-key': uniq('g') }, body: '{}' });
    const stats = await poll(async () => {
      const r = await gw.admin('GET', `/_postguard/v1/stats?project=${project}&days=1`);
      return r.json?.keys_missing_idempotency?.length ? r.json : undefined;
    }, { timeout: 20000, message: 'keys_missing_idempotency' });
    assert.deepEqual(stats.keys_missing_idempotency, [{ key_prefix: late.prefix, requests: 3 }]);
    assert.equal(stats.days.at(-1).missing_idempotency_key, 3);
  });
});
