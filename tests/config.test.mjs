// Configuration (docs/configuration.md, docs/api-reference.md): validated, CONFIG_INVALID names the field and answers every request.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import {
  startGateway, problem, bearer, cfg, assertRateHeaders, ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET,
} from './support/gateway.mjs';

let origin;
before(async () => {
  origin = await startOrigin();
});
after(async () => origin?.kill());

async function withGateway(opts, fn) {
  const gw = await startGateway({ originUrl: origin.url, ...opts });
  try {
    return await fn(gw);
  } finally {
    await gw.dispose();
  }
}

/** Every kind of request gets the same 500 CONFIG_INVALID naming `field`; nothing reaches the origin. */
async function assertConfigInvalid(gw, field) {
  const before = origin.stats.total;
  const fakeKey = `pgk_${'A'.repeat(43)}`;
  const requests = [
    ['anonymous GET', '/anything', {}],
    ['API-key POST', '/payments', { method: 'POST', headers: { ...bearer(fakeKey), 'idempotency-key': 'k' }, body: '{}' }],
    ['operator create', '/_postguard/v1/keys', { method: 'POST', headers: { ...bearer(ADMIN_TOKEN), 'content-type': 'application/json' }, body: '{"project":"a","plan":"trial"}' }],
    ['operator list', '/_postguard/v1/keys?project=a', { headers: bearer(ADMIN_TOKEN) }],
    ['/me', '/_postguard/v1/me', { headers: bearer(fakeKey) }],
    ['unknown gateway path', '/_postguard/v1/nope', {}],
  ];
  for (const [what, p, init] of requests) {
    const res = await gw.fetch(p, init);
    const pb = problem(res, { status: 500, code: 'CONFIG_INVALID' });
    const fields = Array.isArray(field) ? field : [field];
    assert.ok(fields.some((f) => pb.detail.includes(f)), `${what}: detail names ${fields.join(' or ')}: "${pb.detail}"`);
    assert.ok(!pb.detail.includes(ADMIN_TOKEN) && !pb.detail.includes(ORIGIN_TOKEN), 'detail never leaks secrets');
  }
  assert.equal(origin.stats.total, before, 'nothing is forwarded with an invalid configuration');
}

const plan = (o = {}) => ({ requests_per_window: 10, window_s: 60, idempotency_ttl_s: 86400, ...o });

describe('CONFIG_INVALID names the offending field', () => {
  const cases = [
    ['invalid JSON', '{"plans":', 'POSTGUARD_CONFIG'],
    ['not an object (array)', '[]', 'POSTGUARD_CONFIG'],
    ['not an object (string)', '"x"', 'POSTGUARD_CONFIG'],
    ['negative requests_per_window', cfg({ plans: { trial: plan({ requests_per_window: -1 }) } }), 'plans.trial.requests_per_window'],
    ['zero requests_per_window', cfg({ plans: { trial: plan({ requests_per_window: 0 }) } }), 'plans.trial.requests_per_window'],
    ['string requests_per_window', cfg({ plans: { trial: plan({ requests_per_window: '30' }) } }), 'plans.trial.requests_per_window'],
    ['fractional window_s', cfg({ plans: { gold: plan({ window_s: 1.5 }) } }), 'plans.gold.window_s'],
    ['zero idempotency_ttl_s', cfg({ plans: { gold: plan({ idempotency_ttl_s: 0 }) } }), 'plans.gold.idempotency_ttl_s'],
    ['unknown plan field', cfg({ plans: { gold: plan({ burst: 5 }) } }), 'plans.gold.burst'],
    ['unknown top-level field', cfg({ bogus: 1 }), 'bogus'],
    ['unknown nested field', cfg({ origin: { timeout: 5 } }), 'origin.timeout'],
    ['timeout_ms of the wrong type', cfg({ origin: { timeout_ms: 'fast' } }), 'origin.timeout_ms'],
    ['max_stored_body_bytes below 1 MiB', cfg({ idempotency: { max_stored_body_bytes: 1000 } }), 'idempotency.max_stored_body_bytes'],
    ['lease_s not above the origin timeout', cfg({ origin: { timeout_ms: 5000 }, idempotency: { lease_s: 3 } }), ['idempotency.lease_s', 'origin.timeout_ms']],
    ['bad method mode', cfg({ idempotency: { methods: { POST: 'sometimes' } } }), 'idempotency.methods.POST'],
    ['bad route mode', cfg({ idempotency: { routes: [{ method: 'POST', path: '/x', mode: 'maybe' }] } }), ['idempotency.routes[0].mode', 'idempotency.routes.0.mode']],
    ['route without path', cfg({ idempotency: { routes: [{ method: 'POST', mode: 'off' }] } }), ['idempotency.routes[0].path', 'idempotency.routes.0.path']],
    ['negative route cost', cfg({ rate_limit: { costs: [{ method: 'POST', path: '/b/*', cost: -2 }] } }), ['rate_limit.costs[0].cost', 'rate_limit.costs.0.cost']],
    ['negative max_body_bytes', cfg({ max_body_bytes: -1 }), 'max_body_bytes'],
  ];
  for (const [name, value, field] of cases) {
    it(`${name} → 500 CONFIG_INVALID naming ${[].concat(field).join(' / ')}`, async () => {
      await withGateway({ vars: { POSTGUARD_CONFIG: value } }, (gw) => assertConfigInvalid(gw, field));
    });
  }

  for (const [name, url] of [['not a URL', 'not a url'], ['ftp scheme', 'ftp://127.0.0.1/'], ['empty', '']]) {
    it(`ORIGIN_URL ${name} → CONFIG_INVALID naming ORIGIN_URL`, async () => {
      await withGateway({ originUrl: url, vars: { POSTGUARD_CONFIG: '{}' } }, (gw) => assertConfigInvalid(gw, 'ORIGIN_URL'));
    });
  }

  for (const secret of ['ADMIN_TOKEN', 'ORIGIN_TOKEN', 'ORIGIN_SIGNING_SECRET']) {
    it(`missing ${secret} → CONFIG_INVALID naming ${secret}`, async () => {
      const secrets = { ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET };
      delete secrets[secret];
      await withGateway({ secrets, vars: { POSTGUARD_CONFIG: '{}' } }, (gw) => assertConfigInvalid(gw, secret));
    });
    it(`empty ${secret} → CONFIG_INVALID naming ${secret}`, async () => {
      await withGateway({ secrets: { ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET, [secret]: '' }, vars: { POSTGUARD_CONFIG: '{}' } }, (gw) => assertConfigInvalid(gw, secret));
    });
  }
});

describe('valid configuration', () => {
  it('"{}" gives the documented defaults: trial 30/60 s, business 2000/60 s', async () => {
    await withGateway({ vars: { POSTGUARD_CONFIG: '{}' } }, async (gw) => {
      for (const [plan, limit] of [['trial', 30], ['business', 2000]]) {
        const k = await gw.createKey({ project: 'defaults', plan });
        const res = await gw.fetch('/d', { headers: bearer(k.key) });
        assert.equal(res.status, 200, res.text);
        const h = assertRateHeaders(res, { limit, window: 60 });
        assert.equal(h.remaining, limit - 1);
        assert.equal(res.headers['ratelimit-policy'], `"default";q=${limit};w=60`);
      }
      // POST requires a key by default
      const k = await gw.createKey({ project: 'defaults', plan: 'trial' });
      problem(await gw.fetch('/d', { method: 'POST', headers: bearer(k.key), body: 'x' }), { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
    });
  });

  it('wrangler.toml [vars] are used as they are (POSTGUARD_CONFIG "{}")', async () => {
    await withGateway({}, async (gw) => {
      const k = await gw.createKey({ project: 'toml', plan: 'trial' });
      const res = await gw.fetch('/t', { headers: bearer(k.key) });
      assert.equal(res.status, 200, res.text);
      assertRateHeaders(res, { limit: 30, window: 60 });
    });
  });

  it('a given plans object replaces the default plans as a whole', async () => {
    await withGateway({ vars: { POSTGUARD_CONFIG: cfg({ plans: { gold: plan({ requests_per_window: 7 }) } }) } }, async (gw) => {
      const gold = await gw.createKey({ project: 'plans', plan: 'gold' });
      const res = await gw.fetch('/g', { headers: bearer(gold.key) });
      assert.equal(res.status, 200);
      assertRateHeaders(res, { limit: 7, window: 60 });
      for (const gone of ['trial', 'business']) {
        const r = await gw.admin('POST', '/_postguard/v1/keys', { project: 'plans', plan: gone });
        problem(r, { status: 400, code: 'VALIDATION_ERROR' });
      }
    });
  });

  it('methods configuration: POST optional, DELETE required', async () => {
    const c = cfg({ idempotency: { methods: { POST: 'optional', PATCH: 'optional', PUT: 'optional', DELETE: 'required' } } });
    await withGateway({ vars: { POSTGUARD_CONFIG: c } }, async (gw) => {
      const k = await gw.createKey({ project: 'modes', plan: 'business' });
      const post = await gw.fetch('/m', { method: 'POST', headers: bearer(k.key), body: 'x' });
      assert.equal(post.status, 201, post.text);
      problem(await gw.fetch('/m/1', { method: 'DELETE', headers: bearer(k.key) }), { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
    });
  });
});
