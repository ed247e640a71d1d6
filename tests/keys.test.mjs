// Operator API (docs/operator-api.md, docs/api-reference.md): API keys, admin auth, /me, gateway routing errors.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import {
  startGateway, problem, bearer, cfg, assertRateHeaders,
  ADMIN_TOKEN, ORIGIN_TOKEN, KEY_ID_RE, API_KEY_RE, REQUEST_ID_RE,
} from './support/gateway.mjs';

const CONFIG = {
  plans: {
    trial: { requests_per_window: 30, window_s: 60, idempotency_ttl_s: 86400 },
    business: { requests_per_window: 2000, window_s: 60, idempotency_ttl_s: 86400 },
  },
};

let origin;
let gw;
const uniq = (p) => `${p}-${crypto.randomBytes(4).toString('hex')}`;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

describe('POST /_postguard/v1/keys', () => {
  it('creates a key: 201 with id, prefix, project, plan, name, created_at, revoked_at and the key once', async () => {
    const t0 = Date.now();
    const res = await gw.admin('POST', '/_postguard/v1/keys', { project: 'acme', plan: 'trial', name: 'ci key' });
    assert.equal(res.status, 201, res.text);
    assert.match(res.headers['content-type'], /^application\/json/);
    assert.match(res.headers['x-request-id'], REQUEST_ID_RE);
    const k = res.json;
    assert.match(k.id, KEY_ID_RE);
    assert.match(k.key, API_KEY_RE);
    assert.equal(k.key.length, 47);
    assert.equal(k.prefix, k.key.slice(0, 12));
    assert.equal(k.project, 'acme');
    assert.equal(k.plan, 'trial');
    assert.equal(k.name, 'ci key');
    assert.equal(k.revoked_at, null);
    assert.equal(typeof k.created_at, 'number');
    assert.ok(k.created_at >= t0 - 2000 && k.created_at <= Date.now() + 2000, `created_at is epoch ms: ${k.created_at}`);
  });

  it('name is optional; every key is unique', async () => {
    const a = await gw.createKey({ project: 'acme', plan: 'business' });
    const b = await gw.createKey({ project: 'acme', plan: 'business' });
    assert.ok(a.name === null || a.name === undefined || a.name === '', `name without a name: ${JSON.stringify(a.name)}`);
    assert.notEqual(a.key, b.key);
    assert.notEqual(a.id, b.id);
    assert.notEqual(a.prefix, b.prefix);
  });

  it('accepts project names of 1 and 64 chars of [A-Za-z0-9._-]', async () => {
    for (const project of ['a', 'A.b_c-9', 'x'.repeat(64)]) {
      const res = await gw.admin('POST', '/_postguard/v1/keys', { project, plan: 'trial' });
      assert.equal(res.status, 201, `${project}: ${res.text}`);
      assert.equal(res.json.project, project);
    }
  });

  const invalid = [
    ['bad JSON', '{"project": "acme",'],
    ['empty body', ''],
    ['JSON array', '[]'],
    ['JSON null', 'null'],
    ['missing project', { plan: 'trial' }],
    ['missing plan', { project: 'acme' }],
    ['unknown plan', { project: 'acme', plan: 'platinum' }],
    ['unknown field', { project: 'acme', plan: 'trial', colour: 'red' }],
    ['project not a string', { project: 42, plan: 'trial' }],
    ['plan not a string', { project: 'acme', plan: ['trial'] }],
    ['name not a string', { project: 'acme', plan: 'trial', name: 7 }],
    ['empty project', { project: '', plan: 'trial' }],
    ['project of 65 chars', { project: 'x'.repeat(65), plan: 'trial' }],
    ['project with a space', { project: 'ac me', plan: 'trial' }],
    ['project with a slash', { project: 'ac/me', plan: 'trial' }],
    ['project with UTF-8', { project: 'acmé', plan: 'trial' }],
    ['project with NUL', { project: 'acme\u0000', plan: 'trial' }],
  ];
  for (const [name, body] of invalid) {
    it(`400 VALIDATION_ERROR: ${name}`, async () => {
      const res = await gw.admin('POST', '/_postguard/v1/keys', body);
      problem(res, { status: 400, code: 'VALIDATION_ERROR' });
    });
  }
});

describe('GET /_postguard/v1/keys (list)', () => {
  it('lists a project newest first, without the secret key', async () => {
    const project = uniq('list');
    const created = [];
    for (let i = 0; i < 3; i++) created.push(await gw.createKey({ project, plan: 'trial', name: `k${i}` }));
    await gw.createKey({ project: uniq('other'), plan: 'trial' });
    const res = await gw.admin('GET', `/_postguard/v1/keys?project=${project}`);
    assert.equal(res.status, 200, res.text);
    assert.deepEqual(Object.keys(res.json).sort(), ['data', 'next_cursor']);
    assert.equal(res.json.next_cursor, null);
    assert.deepEqual(res.json.data.map((k) => k.id), created.map((k) => k.id).reverse());
    for (const k of res.json.data) {
      assert.ok(!('key' in k), 'list items never contain the key');
      assert.equal(k.project, project);
      assert.equal(k.revoked_at, null);
      assert.match(k.prefix, /^pgk_[A-Za-z0-9_-]{8}$/);
      for (const f of ['created_at', 'id', 'name', 'plan', 'prefix', 'project', 'revoked_at']) assert.ok(f in k, `list item has ${f}`);
    }
  });

  it('paginates with limit and cursor, exactly, without duplicates', async () => {
    const project = uniq('page');
    const ids = [];
    for (let i = 0; i < 5; i++) ids.push((await gw.createKey({ project, plan: 'trial' })).id);
    const seen = [];
    let cursor = null;
    const pages = [];
    do {
      const q = `/_postguard/v1/keys?project=${project}&limit=2${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`;
      const res = await gw.admin('GET', q);
      assert.equal(res.status, 200, res.text);
      pages.push(res.json.data.length);
      seen.push(...res.json.data.map((k) => k.id));
      cursor = res.json.next_cursor;
      assert.ok(pages.length <= 5, 'pagination terminates');
    } while (cursor);
    assert.deepEqual(pages, [2, 2, 1]);
    assert.deepEqual(seen, [...ids].reverse());
  });

  it('limit defaults to 50 and accepts 200', async () => {
    const project = uniq('many');
    for (let i = 0; i < 51; i++) await gw.createKey({ project, plan: 'trial' });
    const def = await gw.admin('GET', `/_postguard/v1/keys?project=${project}`);
    assert.equal(def.status, 200, def.text);
    assert.equal(def.json.data.length, 50);
    assert.equal(typeof def.json.next_cursor, 'string');
    const rest = await gw.admin('GET', `/_postguard/v1/keys?project=${project}&cursor=${encodeURIComponent(def.json.next_cursor)}`);
    assert.equal(rest.json.data.length, 1);
    assert.equal(rest.json.next_cursor, null);
    const all = await gw.admin('GET', `/_postguard/v1/keys?project=${project}&limit=200`);
    assert.equal(all.status, 200, all.text);
    assert.equal(all.json.data.length, 51);
    assert.equal(all.json.next_cursor, null);
  });

  for (const limit of ['0', '201', '-1', 'abc', '1.5', '', '1e2']) {
    it(`limit=${JSON.stringify(limit)} → 400 VALIDATION_ERROR`, async () => {
      const res = await gw.admin('GET', `/_postguard/v1/keys?project=acme&limit=${limit}`);
      problem(res, { status: 400, code: 'VALIDATION_ERROR' });
    });
  }

  it('a garbage cursor is a 400 VALIDATION_ERROR, not a 500', async () => {
    const res = await gw.admin('GET', '/_postguard/v1/keys?project=acme&cursor=%25%25not-a-cursor%ff');
    problem(res, { status: 400, code: 'VALIDATION_ERROR' });
  });
});

describe('GET / DELETE /_postguard/v1/keys/{id}', () => {
  it('gets one key without the secret', async () => {
    const k = await gw.createKey({ project: 'acme', plan: 'trial', name: 'one' });
    const res = await gw.admin('GET', `/_postguard/v1/keys/${k.id}`);
    assert.equal(res.status, 200, res.text);
    const { key, ...rest } = k;
    const { policies, ...record } = res.json;
    assert.deepEqual(record, rest);
    assert.ok(!('key' in res.json));
    // And the state of its one policy, untouched.
    assert.deepEqual(policies.map(({ name, limit, remaining, window_s }) => ({ name, limit, remaining, window_s })), [
      { name: 'default', limit: 30, remaining: 30, window_s: 60 },
    ]);
  });

  it('unknown or malformed id → 404 NOT_FOUND', async () => {
    for (const id of ['key_01ARZ3NDEKTSV4RRFFQ69G5FAV', 'nope', '%ff']) {
      problem(await gw.admin('GET', `/_postguard/v1/keys/${id}`), { status: 404, code: 'NOT_FOUND' });
      problem(await gw.admin('DELETE', `/_postguard/v1/keys/${id}`), { status: 404, code: 'NOT_FOUND' });
    }
  });

  it('revokes: 204, revoked_at set, and the key is refused at once (proxy and /me)', async () => {
    const project = uniq('revoked');
    const k = await gw.createKey({ project, plan: 'trial' });
    const ok = await gw.fetch('/before', { headers: bearer(k.key) });
    assert.equal(ok.status, 200, ok.text);
    const t0 = Date.now();
    const del = await gw.admin('DELETE', `/_postguard/v1/keys/${k.id}`);
    assert.equal(del.status, 204, del.text);
    assert.equal(del.body.length, 0);
    const before = origin.stats.total;
    problem(await gw.fetch('/after', { headers: bearer(k.key) }), { status: 401, code: 'INVALID_API_KEY' });
    problem(await gw.fetch('/_postguard/v1/me', { headers: bearer(k.key) }), { status: 401, code: 'INVALID_API_KEY' });
    assert.equal(origin.stats.total, before, 'a revoked key is not forwarded');
    const got = await gw.admin('GET', `/_postguard/v1/keys/${k.id}`);
    assert.equal(got.status, 200);
    assert.equal(typeof got.json.revoked_at, 'number');
    assert.ok(got.json.revoked_at >= t0 - 2000 && got.json.revoked_at <= Date.now() + 2000);
    const list = await gw.admin('GET', `/_postguard/v1/keys?project=${project}`);
    assert.deepEqual(list.json.data.map((x) => x.id), [k.id], 'a revoked key stays listed');
    assert.equal(typeof list.json.data[0].revoked_at, 'number');
  });

  it('stores only a hash: the full key appears nowhere in KV', async () => {
    const k = await gw.createKey({ project: 'acme', plan: 'trial' });
    const kv = await gw.mf.getKVNamespace('API_KEYS');
    let cursor;
    let n = 0;
    do {
      const page = await kv.list({ cursor });
      for (const { name } of page.keys) {
        n++;
        assert.ok(!name.includes(k.key), 'KV key name contains the API key');
        const v = await kv.get(name);
        assert.ok(!(v ?? '').includes(k.key), 'KV value contains the API key');
        assert.ok(!(v ?? '').includes(k.key.slice(4)), 'KV value contains the API key body');
      }
      cursor = page.list_complete ? undefined : page.cursor;
    } while (cursor);
    assert.ok(n > 0, 'API keys live in the API_KEYS namespace');
  });
});

describe('operator authentication', () => {
  const endpoints = [
    ['POST', '/_postguard/v1/keys', { project: 'acme', plan: 'trial' }],
    ['GET', '/_postguard/v1/keys?project=acme'],
    ['GET', '/_postguard/v1/keys/key_01ARZ3NDEKTSV4RRFFQ69G5FAV'],
    ['DELETE', '/_postguard/v1/keys/key_01ARZ3NDEKTSV4RRFFQ69G5FAV'],
  ];
  for (const [method, p, body] of endpoints) {
    it(`${method} ${p}: missing / wrong / Basic admin token → 401 UNAUTHORIZED`, async () => {
      problem(await gw.admin(method, p, body, { token: null }), { status: 401, code: 'UNAUTHORIZED' });
      problem(await gw.admin(method, p, body, { token: `${ADMIN_TOKEN}x` }), { status: 401, code: 'UNAUTHORIZED' });
      problem(await gw.admin(method, p, body, { token: ADMIN_TOKEN.slice(0, -1) }), { status: 401, code: 'UNAUTHORIZED' });
      problem(await gw.admin(method, p, body, { token: null, headers: { authorization: `Basic ${Buffer.from(`admin:${ADMIN_TOKEN}`).toString('base64')}` } }), { status: 401, code: 'UNAUTHORIZED' });
      problem(await gw.admin(method, p, body, { token: null, headers: { authorization: ADMIN_TOKEN } }), { status: 401, code: 'UNAUTHORIZED' });
    });
  }

  it('an API key or the ORIGIN_TOKEN on an operator endpoint → 403 FORBIDDEN', async () => {
    const k = await gw.createKey({ project: 'acme', plan: 'trial' });
    for (const [method, p, body] of endpoints) {
      problem(await gw.admin(method, p, body, { token: k.key }), { status: 403, code: 'FORBIDDEN' });
      problem(await gw.admin(method, p, body, { token: ORIGIN_TOKEN }), { status: 403, code: 'FORBIDDEN' });
    }
    // and the forbidden call did nothing
    const list = await gw.admin('GET', `/_postguard/v1/keys/${k.id}`);
    assert.equal(list.json.revoked_at, null);
  });

  it('the admin token is not an API key: not forwarded to the origin', async () => {
    const before = origin.stats.total;
    const res = await gw.fetch('/things', { headers: bearer(ADMIN_TOKEN) });
    const p = problem(res);
    assert.ok([401, 403].includes(res.status), `status ${res.status} ${p.code}`);
    assert.equal(origin.stats.total, before);
  });
});

describe('gateway routing', () => {
  it('unknown /_postguard/ paths → 404 NOT_FOUND, never forwarded', async () => {
    const before = origin.stats.total;
    for (const p of ['/_postguard/', '/_postguard/v1/nope', '/_postguard/v2/keys', '/_postguard/v1/keys/a/b']) {
      problem(await gw.admin('GET', p), { status: 404, code: 'NOT_FOUND' });
    }
    assert.equal(origin.stats.total, before);
  });

  it('known path, wrong method → 405 METHOD_NOT_ALLOWED with Allow', async () => {
    const r1 = await gw.admin('PUT', '/_postguard/v1/keys', { project: 'acme', plan: 'trial' });
    problem(r1, { status: 405, code: 'METHOD_NOT_ALLOWED' });
    const allow1 = (r1.headers.allow ?? '').split(',').map((s) => s.trim()).sort();
    assert.deepEqual(allow1, ['GET', 'POST']);
    const r2 = await gw.admin('PUT', '/_postguard/v1/keys/key_01ARZ3NDEKTSV4RRFFQ69G5FAV', {});
    problem(r2, { status: 405, code: 'METHOD_NOT_ALLOWED' });
    const allow2 = (r2.headers.allow ?? '').split(',').map((s) => s.trim()).sort();
    assert.deepEqual(allow2, ['DELETE', 'GET', 'PATCH']);
  });
});

describe('GET /_postguard/v1/me', () => {
  it('returns the key state with rate-limit headers and costs nothing', async () => {
    const k = await gw.createKey({ project: 'me-proj', plan: 'trial' });
    const m1 = await gw.fetch('/_postguard/v1/me', { headers: bearer(k.key) });
    assert.equal(m1.status, 200, m1.text);
    for (const f of ['limit', 'plan', 'prefix', 'project', 'remaining', 'reset', 'window_s']) assert.ok(f in m1.json, `/me has ${f}`);
    assert.equal(m1.json.prefix, k.prefix);
    assert.equal(m1.json.project, 'me-proj');
    assert.equal(m1.json.plan, 'trial');
    assert.equal(m1.json.limit, 30);
    assert.equal(m1.json.window_s, 60);
    assert.equal(m1.json.remaining, 30);
    assert.ok(!JSON.stringify(m1.json).includes(k.key), '/me never returns the key');
    const h1 = assertRateHeaders(m1, { limit: 30, window: 60 });
    assert.equal(h1.remaining, 30);
    for (let i = 0; i < 3; i++) {
      const m = await gw.fetch('/_postguard/v1/me', { headers: bearer(k.key) });
      assert.equal(m.json.remaining, 30, '/me does not consume budget');
    }
    const p = await gw.fetch('/spend', { headers: bearer(k.key) });
    assert.equal(p.status, 200);
    assert.equal(assertRateHeaders(p).remaining, 29);
    const m2 = await gw.fetch('/_postguard/v1/me', { headers: bearer(k.key) });
    assert.equal(m2.json.remaining, 29);
    assert.equal(assertRateHeaders(m2).remaining, 29);
    assert.ok(Math.abs(m2.json.reset - Number(p.headers['x-ratelimit-reset'])) <= 1, '/me reset equals the window reset');
    const nowS = Math.floor(Date.now() / 1000);
    assert.ok(m2.json.reset > nowS && m2.json.reset <= nowS + 61, `reset is epoch seconds: ${m2.json.reset}`);
  });

  it('without a valid API key → 401 INVALID_API_KEY', async () => {
    problem(await gw.fetch('/_postguard/v1/me'), { status: 401, code: 'INVALID_API_KEY' });
    problem(await gw.fetch('/_postguard/v1/me', { headers: bearer(`pgk_${'A'.repeat(43)}`) }), { status: 401, code: 'INVALID_API_KEY' });
  });

  it('the admin token on /me is refused (401/403), not a 500', async () => {
    const res = await gw.fetch('/_postguard/v1/me', { headers: bearer(ADMIN_TOKEN) });
    const p = problem(res);
    assert.ok([401, 403].includes(res.status), `${res.status} ${p.code}`);
  });
});
