// Issue 34 on the client side (moving an API that already has customers): keys.import, usage()
// and a subscription's given secret — what each sends and what it returns. Fake fetch and clock.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Postguard, ConfigurationError } from '../dist/index.js';
import { fakeClock } from './fake-clock.mjs';

/** A fetch answering from a script of [status, body] steps (0: no answer), recording each request. */
function scriptedFetch(script) {
  const calls = [];
  const fn = async (url, init) => {
    calls.push({ url: new URL(String(url)), method: init.method, headers: new Headers(init.headers), body: init.body });
    const [status, body = {}] = script[Math.min(calls.length - 1, script.length - 1)];
    if (status === 0) throw new TypeError('fetch failed: socket hang up');
    const type = status >= 400 ? 'application/problem+json' : 'application/json';
    return new Response(JSON.stringify(body), { status, headers: { 'content-type': type } });
  };
  fn.calls = calls;
  return fn;
}

const client = (fetch, extra = {}) =>
  new Postguard({ baseUrl: 'http://gw.test', apiKey: 'pgk_k', adminToken: 'adm', fetch, clock: fakeClock(), random: () => 0, ...extra });

const HASH = 'a'.repeat(64);
const IMPORTED = { data: [{ id: 'key_1', prefix: 'sk_live_4eC3', status: 'created' }, { id: 'key_2', prefix: 'sk_live_9f', status: 'exists' }] };

test('keys.import: POST /keys/import {keys} as the operator, the entries as given, the answer\'s data in order', async () => {
  const f = scriptedFetch([[200, IMPORTED]]);
  const entries = [
    { key: 'sk_live_4eC39HqLyjWDarjtT1zdp7dc', project: 'acme', plan: 'business', name: 'acme production', meta: { customer: 'cus_1' } },
    { sha256: HASH, prefix: 'sk_live_9f', project: 'acme', plan: 'trial', expires_at: '2030-01-01T00:00:00Z', overrides: { enforce: false } },
  ];
  const got = await client(f).keys.import(entries);
  assert.deepEqual(got, IMPORTED.data);
  const [c] = f.calls;
  assert.equal(c.method, 'POST');
  assert.equal(c.url.pathname, '/_postguard/v1/keys/import');
  assert.equal(c.headers.get('authorization'), 'Bearer adm');
  assert.equal(c.headers.get('content-type'), 'application/json');
  assert.deepEqual(JSON.parse(c.body), { keys: entries });
  assert.match(c.headers.get('idempotency-key'), /^[0-9a-f-]{36}$/);
});

test('keys.import after a lost answer and a 502: retried with the same Idempotency-Key (the gateway replays the import)', async () => {
  const f = scriptedFetch([[0], [502, { code: 'ORIGIN_UNREACHABLE' }], [200, IMPORTED]]);
  const got = await client(f).keys.import([{ key: 'sk_live_4eC39HqLyjWDarjtT1zdp7dc', project: 'acme', plan: 'trial' }]);
  assert.equal(got.length, 2);
  assert.equal(f.calls.length, 3);
  const keys = f.calls.map((c) => c.headers.get('idempotency-key'));
  assert.ok(keys[0] && keys.every((k) => k === keys[0]), `one key for every attempt: ${keys}`);
  // The caller's own key, e.g. one per export batch, survives a restart of the importing job.
  const g = scriptedFetch([[200, IMPORTED]]);
  await client(g).keys.import([{ sha256: HASH, prefix: 'p', project: 'a', plan: 'trial' }], { idempotencyKey: 'import-batch-7' });
  assert.equal(g.calls[0].headers.get('idempotency-key'), 'import-batch-7');
});

test('keys.import needs the operator token: nothing is sent without it', async () => {
  const f = scriptedFetch([[200, IMPORTED]]);
  const pg = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'pgk_k', fetch: f });
  await assert.rejects(pg.keys.import([{ key: 'sk_live_4eC39HqLyjWDarjtT1zdp7dc', project: 'a', plan: 'trial' }]), (e) => e instanceof ConfigurationError && /adminToken/.test(e.message));
  assert.equal(f.calls.length, 0);
});

test('usage(): GET /usage with its filters; the API key by default, the operator when a project is named or asked', async () => {
  const rows = [{ key_prefix: 'pgk_a', project: 'acme', period_start: 1796083200000, requests: 7, admitted: 5, billable: 3, replays: 1, refused: 0 }];
  const f = scriptedFetch([[200, { data: rows }]]);
  const pg = client(f);
  assert.deepEqual(await pg.usage(), rows);
  assert.deepEqual(await pg.usage({ since: '2026-11-01T00:00:00Z', until: 1796169600000, granularity: 'hour', project: 'acme' }), rows);
  await pg.usage({ granularity: 'day' }, { auth: 'admin' });
  const [own, named, all] = f.calls;
  for (const c of f.calls) {
    assert.equal(c.method, 'GET');
    assert.equal(c.url.pathname, '/_postguard/v1/usage');
    assert.equal(c.headers.get('idempotency-key'), null, 'a read carries no key');
  }
  assert.equal(own.url.search, '');
  assert.equal(own.headers.get('authorization'), 'Bearer pgk_k');
  assert.deepEqual(Object.fromEntries(named.url.searchParams), { since: '2026-11-01T00:00:00Z', until: '1796169600000', granularity: 'hour', project: 'acme' });
  assert.equal(named.headers.get('authorization'), 'Bearer adm', 'only the operator may name a project');
  assert.deepEqual(Object.fromEntries(all.url.searchParams), { granularity: 'day' });
  assert.equal(all.headers.get('authorization'), 'Bearer adm');
});

test('webhooks.create sends a given secret (a subscription moved from another system); without one, none', async () => {
  const secret = `whsec_${Buffer.alloc(32, 7).toString('base64')}`;
  const f = scriptedFetch([[201, { id: 'sub_1', secret }], [201, { id: 'sub_2', secret: 'whsec_new' }]]);
  const pg = client(f);
  const moved = await pg.webhooks.create({ url: 'https://r.example/h', events: ['*'], secret });
  assert.equal(moved.secret, secret);
  await pg.webhooks.create({ url: 'https://r.example/h', events: ['*'] });
  assert.deepEqual(JSON.parse(f.calls[0].body), { url: 'https://r.example/h', events: ['*'], secret });
  assert.equal('secret' in JSON.parse(f.calls[1].body), false);
});
