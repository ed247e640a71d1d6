// The error table (docs/errors.md) and malformed input: every error is problem+json with the right
// status and code, carries a request id, and bad client input never yields a 500.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import {
  startGateway, rawRequest, problem, poll, bearer, cfg, assertRateHeaders, ADMIN_TOKEN, ORIGIN_TOKEN, REQUEST_ID_RE,
} from './support/gateway.mjs';

const MAX_BODY = 4096;
const CONFIG = {
  max_body_bytes: MAX_BODY,
  origin: { timeout_ms: 1000 },
  idempotency: { lease_s: 3 },
  plans: {
    big: { requests_per_window: 100000, window_s: 60, idempotency_ttl_s: 86400 },
    one: { requests_per_window: 1, window_s: 60, idempotency_ttl_s: 86400 },
  },
};

let origin;
let gw;
let key;
const ik = () => `err-${crypto.randomBytes(6).toString('hex')}`;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  key = await gw.createKey({ project: 'errors', plan: 'big' });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

/** Run `fn`, assert the origin was not called meanwhile, return fn's result. */
async function notForwarded(fn) {
  const before = origin.stats.total;
  const r = await fn();
  assert.equal(origin.stats.total, before, 'the origin must not be called');
  return r;
}

const post = (headers, body = '{"x":1}', p = '/pay') => ({ method: 'POST', path: p, headers, body });

describe('INVALID_API_KEY (401)', () => {
  const wellFormedUnknown = `pgk_${crypto.randomBytes(32).toString('base64url')}`;
  const cases = [
    ['no Authorization header', []],
    ['Basic scheme', [['Authorization', `Basic ${Buffer.from('user:pass').toString('base64')}`]]],
    ['Bearer without a token', [['Authorization', 'Bearer']]],
    ['Bearer with a blank token', [['Authorization', 'Bearer  ']]],
    ['a raw key without scheme', [['Authorization', wellFormedUnknown]]],
    ['Token scheme', [['Authorization', `Token ${wellFormedUnknown}`]]],
    ['malformed: too short', [['Authorization', 'Bearer pgk_short']]],
    ['malformed: wrong prefix', [['Authorization', `Bearer sk_${'A'.repeat(44)}`]]],
    ['malformed: bad character', [['Authorization', `Bearer pgk_${'A'.repeat(42)}!`]]],
    ['malformed: too long', [['Authorization', `Bearer ${wellFormedUnknown}A`]]],
    ['well-formed but unknown', [['Authorization', `Bearer ${wellFormedUnknown}`]]],
    ['UTF-8 in the token', [['Authorization', `Bearer pgk_${'é'.repeat(43)}`]]],
    ['non-UTF-8 byte in the token', [['Authorization', Buffer.concat([Buffer.from('Bearer pgk_'), Buffer.alloc(43, 0xe9)])]]],
    ['tab and DEL in the token', [['Authorization', `Bearer pgk_\t${'A'.repeat(41)}\x7f`]]],
    ['64 KiB Authorization', [['Authorization', `Bearer pgk_${'A'.repeat(65536)}`]]],
  ];
  for (const [name, headers] of cases) {
    it(name, async () => {
      const res = await notForwarded(() => rawRequest(gw.url, { path: '/orders', headers }));
      problem(res, { status: 401, code: 'INVALID_API_KEY' });
    });
  }

  it('two Authorization header lines (even with a valid key) are refused', async () => {
    const res = await notForwarded(() => rawRequest(gw.url, {
      path: '/orders',
      headers: [['Authorization', `Bearer ${key.key}`], ['Authorization', `Bearer ${wellFormedUnknown}`]],
    }));
    problem(res, { status: 401, code: 'INVALID_API_KEY' });
  });

  it('a revoked key', async () => {
    const k = await gw.createKey({ project: 'errors', plan: 'big' });
    assert.equal((await gw.fetch('/ok', { headers: bearer(k.key) })).status, 200);
    assert.equal((await gw.admin('DELETE', `/_postguard/v1/keys/${k.id}`)).status, 204);
    const res = await notForwarded(() => gw.fetch('/orders', { headers: bearer(k.key) }));
    problem(res, { status: 401, code: 'INVALID_API_KEY' });
  });

  it('on POST too, before idempotency checks', async () => {
    const res = await notForwarded(() => rawRequest(gw.url, post([['Idempotency-Key', 'a b']])));
    problem(res, { status: 401, code: 'INVALID_API_KEY' });
  });
});

describe('RATE_LIMIT_EXCEEDED (429)', () => {
  it('with Retry-After and the rate-limit headers', async () => {
    const k = await gw.createKey({ project: 'errors', plan: 'one' });
    assert.equal((await gw.fetch('/a', { headers: bearer(k.key) })).status, 200);
    const res = await notForwarded(() => gw.fetch('/a', { headers: bearer(k.key) }));
    problem(res, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
    assert.ok(Number(res.headers['retry-after']) >= 1);
    assert.equal(assertRateHeaders(res, { limit: 1 }).remaining, 0);
  });
});

describe('IDEMPOTENCY_KEY_REQUIRED / _INVALID (400)', () => {
  it('POST without the header → 400 IDEMPOTENCY_KEY_REQUIRED', async () => {
    const res = await notForwarded(() => gw.fetch('/pay', { method: 'POST', headers: bearer(key.key), body: '{}' }));
    problem(res, { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
    assertRateHeaders(res);
  });

  const invalid = [
    ['empty', [['Idempotency-Key', '']]],
    ['empty quoted string', [['Idempotency-Key', '""']]],
    ['256 chars', [['Idempotency-Key', 'k'.repeat(256)]]],
    ['256 chars quoted', [['Idempotency-Key', `"${'k'.repeat(256)}"`]]],
    ['a space', [['Idempotency-Key', 'order 1']]],
    ['a tab', [['Idempotency-Key', 'order\t1']]],
    ['DEL', [['Idempotency-Key', 'order\x7f1']]],
    ['UTF-8', [['Idempotency-Key', 'commandé-1']]],
    ['a non-UTF-8 byte', [['Idempotency-Key', Buffer.from([0x6f, 0x72, 0xe9, 0x31])]]],
    ['two header lines', [['Idempotency-Key', 'a'], ['Idempotency-Key', 'b']]],
    ['two identical header lines', [['Idempotency-Key', 'same'], ['Idempotency-Key', 'same']]],
    ['a list on one line (a, b)', [['Idempotency-Key', 'a, b']]],
    ['64 KiB', [['Idempotency-Key', 'k'.repeat(65536)]]],
  ];
  for (const [name, headers] of invalid) {
    it(`Idempotency-Key with ${name} → 400 IDEMPOTENCY_KEY_INVALID`, async () => {
      const res = await notForwarded(() => rawRequest(gw.url, post([['Authorization', `Bearer ${key.key}`], ...headers])));
      problem(res, { status: 400, code: 'IDEMPOTENCY_KEY_INVALID' });
      assertRateHeaders(res);
    });
  }

  it('an invalid key on an optional method (PATCH) is still refused', async () => {
    const res = await notForwarded(() => rawRequest(gw.url, { ...post([['Authorization', `Bearer ${key.key}`], ['Idempotency-Key', 'a b']]), method: 'PATCH' }));
    problem(res, { status: 400, code: 'IDEMPOTENCY_KEY_INVALID' });
  });

  it('255 visible ASCII characters (all of !..~) are accepted', async () => {
    let k = '';
    for (let c = 0x21; c <= 0x7e; c++) k += String.fromCharCode(c);
    k = (k + crypto.randomBytes(100).toString('hex')).slice(0, 255);
    const res = await rawRequest(gw.url, post([['Authorization', `Bearer ${key.key}`], ['Idempotency-Key', k]]));
    assert.equal(res.status, 201, `${res.status} ${res.text}`);
  });
});

describe('IDEMPOTENCY_KEY_IN_PROGRESS (409) / _REUSE_CONFLICT (422)', () => {
  it('409 with Retry-After while the first request runs', async () => {
    const k = ik();
    const first = gw.fetch('/slow', { method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': k, 'x-demo-delay-ms': '600' }, body: '{}' });
    await poll(() => origin.stats.count(k) === 1, { message: 'the first request to reach the origin' });
    const res = await gw.fetch('/slow', { method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': k }, body: '{}' });
    problem(res, { status: 409, code: 'IDEMPOTENCY_KEY_IN_PROGRESS' });
    assert.ok(Number(res.headers['retry-after']) >= 1);
    assert.equal((await first).status, 201);
    assert.equal(origin.stats.count(k), 1);
  });

  it('422 for a different body; origin not called', async () => {
    const k = ik();
    assert.equal((await gw.fetch('/c', { method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': k }, body: 'a' })).status, 201);
    const res = await notForwarded(() => gw.fetch('/c', { method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': k }, body: 'b' }));
    problem(res, { status: 422, code: 'IDEMPOTENCY_KEY_REUSE_CONFLICT' });
  });
});

describe('PAYLOAD_TOO_LARGE (413)', () => {
  it(`a body of ${MAX_BODY} bytes passes, ${MAX_BODY + 1} is refused (Content-Length)`, async () => {
    const ok = await gw.fetch('/upload', { method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': ik() }, body: Buffer.alloc(MAX_BODY, 'x') });
    assert.equal(ok.status, 201, ok.text);
    assert.equal(origin.stats.byRequestId(ok.headers['x-request-id']).body_bytes, MAX_BODY);
    const res = await notForwarded(() => gw.fetch('/upload', { method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': ik() }, body: Buffer.alloc(MAX_BODY + 1, 'x') }));
    problem(res, { status: 413, code: 'PAYLOAD_TOO_LARGE' });
  });

  it('a chunked body without Content-Length over the limit is refused', async () => {
    const chunk = (b) => Buffer.concat([Buffer.from(`${b.length.toString(16)}\r\n`), b, Buffer.from('\r\n')]);
    const body = Buffer.concat([chunk(Buffer.alloc(3000, 'y')), chunk(Buffer.alloc(3000, 'y')), Buffer.from('0\r\n\r\n')]);
    const res = await notForwarded(() => rawRequest(gw.url, {
      method: 'POST',
      path: '/upload',
      headers: [['Authorization', `Bearer ${key.key}`], ['Idempotency-Key', ik()], ['Transfer-Encoding', 'chunked']],
      body,
    }));
    problem(res, { status: 413, code: 'PAYLOAD_TOO_LARGE' });
  });

  it('applies to gateway endpoints too (operator API)', async () => {
    const res = await gw.admin('POST', '/_postguard/v1/keys', JSON.stringify({ project: 'big', plan: 'big', name: 'n'.repeat(MAX_BODY) }));
    problem(res, { status: 413, code: 'PAYLOAD_TOO_LARGE' });
    const list = await gw.admin('GET', '/_postguard/v1/keys?project=big');
    assert.equal(list.json.data.length, 0, 'nothing was created');
  });
});

describe('origin errors (502/504)', () => {
  it('504 ORIGIN_TIMEOUT', async () => {
    const res = await gw.fetch('/slow', { headers: { ...bearer(key.key), 'x-demo-delay-ms': '2000' } });
    problem(res, { status: 504, code: 'ORIGIN_TIMEOUT' });
    assertRateHeaders(res);
  });

  it('502 ORIGIN_UNREACHABLE', async () => {
    const port = origin.port;
    await origin.kill();
    try {
      const res = await gw.fetch('/down', { method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': ik() }, body: '{}' });
      problem(res, { status: 502, code: 'ORIGIN_UNREACHABLE' });
      assertRateHeaders(res);
    } finally {
      origin = await startOrigin({ port });
    }
  });
});

describe('operator API errors', () => {
  it('400 VALIDATION_ERROR: bad JSON, unknown plan, missing project', async () => {
    for (const body of ['{bad json', { project: 'a', plan: 'nope' }, { plan: 'big' }]) {
      problem(await gw.admin('POST', '/_postguard/v1/keys', body), { status: 400, code: 'VALIDATION_ERROR' });
    }
  });

  it('404 NOT_FOUND: unknown gateway path and unknown key id', async () => {
    problem(await gw.admin('GET', '/_postguard/v1/unknown'), { status: 404, code: 'NOT_FOUND' });
    problem(await gw.admin('GET', '/_postguard/v1/keys/key_00000000000000000000000000'), { status: 404, code: 'NOT_FOUND' });
  });

  it('401 UNAUTHORIZED and 403 FORBIDDEN', async () => {
    problem(await gw.admin('GET', '/_postguard/v1/keys', undefined, { token: 'wrong' }), { status: 401, code: 'UNAUTHORIZED' });
    problem(await gw.admin('GET', '/_postguard/v1/keys', undefined, { token: null }), { status: 401, code: 'UNAUTHORIZED' });
    problem(await gw.admin('GET', '/_postguard/v1/keys', undefined, { token: key.key }), { status: 403, code: 'FORBIDDEN' });
  });

  it('500 CONFIG_INVALID (the only 500 here, and it names the field)', async () => {
    const bad = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ plans: { trial: { requests_per_window: 'lots' } } }) } });
    try {
      const p = problem(await bad.fetch('/x'), { status: 500, code: 'CONFIG_INVALID' });
      assert.ok(p.detail.includes('plans.trial.requests_per_window'), p.detail);
    } finally {
      await bad.dispose();
    }
  });

  const malformed = [
    ['deeply nested JSON', `{"project":${'['.repeat(1500)}${']'.repeat(1500)},"plan":"big"}`],
    ['a huge number', '{"project":"a","plan":"big","name":1e999}'],
    ['a NUL escape in a string', '{"project":"a\\u0000","plan":"big"}'],
    ['a lone surrogate escape', '{"project":"a\\ud800","plan":"big"}'],
    ['non-UTF-8 bytes', Buffer.from([0x7b, 0x22, 0x70, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d])],
    ['trailing garbage', '{"project":"a","plan":"big"} x'],
    ['a JSON number', '42'],
  ];
  for (const [name, body] of malformed) {
    it(`operator body with ${name} → 400 VALIDATION_ERROR`, async () => {
      const res = await gw.admin('POST', '/_postguard/v1/keys', body);
      problem(res, { status: 400, code: 'VALIDATION_ERROR' });
    });
  }

  for (const q of ['limit=%ff', 'limit=99999999999999999999', 'limit=%00', 'project=%ff', 'cursor=' + 'A'.repeat(2000)]) {
    it(`GET keys?${q.slice(0, 40)} → 400 VALIDATION_ERROR, not a 500`, async () => {
      const res = await gw.admin('GET', `/_postguard/v1/keys?${q}`);
      problem(res, { status: 400, code: 'VALIDATION_ERROR' });
    });
  }

  it('strange key ids → 404, not a 500', async () => {
    for (const id of ['%ff%fe', '%2e%2e', 'key_%00', encodeURIComponent('key_é'), 'a'.repeat(5000)]) {
      problem(await gw.admin('GET', `/_postguard/v1/keys/${id}`), { status: 404, code: 'NOT_FOUND' });
    }
  });
});

describe('every response has a request id; bad input is never a 500', () => {
  it('a mixed bag of odd requests', async () => {
    const h = [['Authorization', `Bearer ${key.key}`]];
    const reqs = [
      { path: '/a%00b', headers: h },
      { path: '/%ff%fe?%ff=%fe', headers: h },
      { path: '/a/../../etc/passwd', headers: h },
      { path: '//double//slash', headers: h },
      { path: '/q?' + 'x'.repeat(8000), headers: h },
      { method: 'OPTIONS', path: '/opt', headers: h },
      { method: 'PROPFIND', path: '/dav', headers: h },
      { path: '/hdr', headers: [...h, ['X-Weird', Buffer.from([0xc3, 0x28, 0xa0, 0xa1])], ['X-Tab', 'a\tb'], ['X-Del', 'a\x7fb']] },
      { path: '/_postguard/v1/me', headers: [...h, ['X-Weird', Buffer.from([0xff])]] },
      { path: '/_postguard', headers: h },
      { path: '/_postguard/v1/keys', headers: [['Authorization', Buffer.from([0xff, 0xfe])]] },
      { method: 'POST', path: '/_postguard/v1/keys', headers: [['Authorization', `Bearer ${ADMIN_TOKEN}`], ['Content-Type', 'application/json']], body: Buffer.from([0xff]) },
    ];
    for (const r of reqs) {
      const res = await rawRequest(gw.url, r);
      const what = `${r.method ?? 'GET'} ${r.path.slice(0, 40)} → ${res.status} ${res.text.slice(0, 200)}`;
      assert.match(res.headers['x-request-id'] ?? '', REQUEST_ID_RE, `X-Request-Id on ${what}`);
      const fromOrigin = res.headers['x-origin-execution'] !== undefined;
      if (!fromOrigin && res.status >= 400) {
        assert.ok(res.status >= 400 && res.status < 500, `gateway answer is a 4xx: ${what}`);
        problem(res);
      }
    }
  });
});

describe('unknown query parameters (400), one rule for every gateway endpoint', () => {
  it('each endpoint refuses a parameter it does not list, naming it; listed ones pass', async () => {
    const asKey = bearer(key.key);
    const cases = [
      ['GET', '/_postguard/v1/me?verbose=1', asKey, 'verbose'],
      ['GET', '/_postguard/v1/webhooks?limit=5&sort=url', asKey, 'sort'],
      ['GET', '/_postguard/v1/deliveries/dlv_01ARZ3NDEKTSV4RRFFQ69G5FAV?expand=attempts', asKey, 'expand'],
      ['GET', '/_postguard/v1/idempotency/abc?x=1', asKey, 'x'],
      ['GET', '/_postguard/v1/keys?project=acme&plan=trial', { authorization: `Bearer ${ADMIN_TOKEN}` }, 'plan'],
      ['GET', '/_postguard/v1/audit?limit=1&colour=red', asKey, 'colour'],
    ];
    for (const [method, path, headers, name] of cases) {
      const p = problem(await gw.fetch(path, { method, headers }), { status: 400, code: 'VALIDATION_ERROR' });
      assert.match(p.detail, new RegExp(`^${name}: unknown parameter`), `${path}: ${p.detail}`);
    }
    assert.equal((await gw.fetch('/_postguard/v1/webhooks?limit=5', { headers: asKey })).status, 200);
    assert.equal((await gw.fetch('/_postguard/v1/me', { headers: asKey })).status, 200);
  });
});
