// Forwarding to the origin (docs/request-path.md): URL, headers added/removed, signature, body, passthrough, 502/504.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin, verifySignature, identityOf } from './support/origin.mjs';
import {
  startGateway, rawRequest, problem, bearer, cfg, assertRateHeaders, REQUEST_ID_RE, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET,
} from './support/gateway.mjs';

const CONFIG = {
  // Generous: on a loaded 2-core machine a demo-origin answer must not become a 504.
  origin: { timeout_ms: 4000 },
  idempotency: { lease_s: 6 },
  plans: { big: { requests_per_window: 100000, window_s: 60, idempotency_ttl_s: 86400 } },
};

let origin;
let gw;
let key;
const ik = () => `fw-${crypto.randomBytes(6).toString('hex')}`;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  key = await gw.createKey({ project: 'fwd-project', plan: 'big' });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

describe('request to the origin', () => {
  it('same method, path and raw query; identity headers added; Authorization not forwarded', async () => {
    const res = await gw.fetch('/v1/widgets/42?expand=a%20b&x=1&x=2&empty=', {
      headers: { ...bearer(key.key), 'x-custom': 'kept', accept: 'application/json', 'user-agent': 'pg-test/1' },
    });
    assert.equal(res.status, 200, res.text);
    const seen = origin.stats.byRequestId(res.headers['x-request-id']);
    assert.ok(seen, 'the origin got the X-Request-Id the client got');
    assert.equal(seen.method, 'GET');
    assert.equal(seen.target, '/v1/widgets/42?expand=a%20b&x=1&x=2&empty=');
    const h = seen.headers;
    assert.match(h['x-request-id'], REQUEST_ID_RE);
    assert.equal(h['x-postguard-project'], 'fwd-project');
    assert.equal(h['x-postguard-key-prefix'], key.prefix);
    assert.equal(h['x-postguard-plan'], 'big');
    assert.equal(h.authorization, undefined, 'the client Authorization is not forwarded');
    assert.ok(!JSON.stringify(seen.rawHeaders).includes(key.key), 'the API key reaches the origin nowhere');
    assert.equal(h['x-custom'], 'kept');
    assert.equal(h['user-agent'], 'pg-test/1');
    assert.equal(seen.signature_ok, true, `signature: ${seen.signature_error} (${h['x-postguard-signature']})`);
  });

  it('X-Postguard-Signature: t=<unix s>,v2=<base64 HMAC-SHA256(ORIGIN_SIGNING_SECRET)> over the request and its identity', async () => {
    const body = crypto.randomBytes(70000);
    const res = await gw.fetch('/upload?kind=bin', {
      method: 'POST',
      headers: { ...bearer(key.key), 'content-type': 'application/octet-stream', 'idempotency-key': ik() },
      body,
    });
    assert.equal(res.status, 201, res.text);
    const seen = origin.stats.byRequestId(res.headers['x-request-id']);
    assert.equal(seen.body_sha256, crypto.createHash('sha256').update(body).digest('hex'), 'the body arrives byte-exact');
    assert.equal(seen.body_bytes, body.length);
    const sig = seen.headers['x-postguard-signature'];
    assert.match(sig, /^t=\d+,v2=[A-Za-z0-9+/]+=*,v3=[A-Za-z0-9+/]+=*$/);
    const t = Number(/^t=(\d+)/.exec(sig)[1]);
    assert.ok(Math.abs(t - Date.now() / 1000) < 30, 't is the current unix time in seconds');
    assert.equal(seen.signature_ok, true, seen.signature_error);
    // the signature really binds the request: another secret, body, path, id or identity does not verify
    const identity = identityOf(seen.headers);
    assert.equal(identity.contentType, 'application/octet-stream');
    assert.ok(identity.idempotencyKey);
    const base = { header: sig, requestId: seen.headers['x-request-id'], method: 'POST', target: '/upload?kind=bin', bodySha256: seen.body_sha256, identity, secret: ORIGIN_SIGNING_SECRET };
    assert.equal(verifySignature(base).ok, true);
    assert.equal(verifySignature({ ...base, secret: ORIGIN_TOKEN }).ok, false, 'the publishing token does not sign');
    assert.equal(verifySignature({ ...base, target: '/upload?kind=txt' }).ok, false);
    assert.equal(verifySignature({ ...base, method: 'PUT' }).ok, false);
    assert.equal(verifySignature({ ...base, requestId: 'req_x' }).ok, false);
    assert.equal(verifySignature({ ...base, bodySha256: crypto.createHash('sha256').update('').digest('hex') }).ok, false);
    assert.equal(verifySignature({ ...base, nowS: t + 301 }).reason, 'stale timestamp', 'an old t is refused');
  });

  it('signs every method, with and without body and query', async () => {
    const cases = [
      ['GET', '/s'], ['GET', '/s?q=1'], ['DELETE', '/s/1'], ['PUT', '/s/1', 'x'], ['PATCH', '/s/1?a=b', '{"a":1}'], ['POST', '/s', ''],
    ];
    for (const [method, p, body] of cases) {
      const headers = { ...bearer(key.key) };
      if (method === 'POST') headers['idempotency-key'] = ik();
      const res = await gw.fetch(p, { method, headers, body });
      assert.ok(res.status < 300, `${method} ${p}: ${res.status} ${res.text}`);
      const seen = origin.stats.byRequestId(res.headers['x-request-id']);
      assert.equal(seen.method, method);
      assert.equal(seen.signature_ok, true, `${method} ${p}: ${seen.signature_error}`);
    }
  });

  it('client-sent X-Postguard-* headers are stripped, not trusted', async () => {
    const res = await rawRequest(gw.url, {
      method: 'GET',
      path: '/spoof',
      headers: [
        ['Authorization', `Bearer ${key.key}`],
        ['X-Postguard-Project', 'evil'],
        ['X-Postguard-Key-Prefix', 'pgk_evil0000'],
        ['X-Postguard-Plan', 'unlimited'],
        ['X-Postguard-Signature', 't=1,v2=AAAA'],
        ['X-Postguard-Client-IP', '6.6.6.6'],
        ['X-Forwarded-For', '6.6.6.6'],
        ['True-Client-IP', '6.6.6.6'],
        ['Forwarded', 'for=6.6.6.6'],
        ['X-Real-IP', '6.6.6.6'],
        ['X-Postguard-Admin', 'yes'],
        ['x-postguard-project', 'evil2'],
      ],
    });
    assert.equal(res.status, 200, res.text);
    const seen = origin.stats.byRequestId(res.headers['x-request-id']);
    const h = seen.headers;
    assert.equal(h['x-postguard-project'], 'fwd-project');
    assert.equal(h['x-postguard-key-prefix'], key.prefix);
    assert.equal(h['x-postguard-plan'], 'big');
    assert.equal(h['x-postguard-admin'], undefined);
    assert.equal(seen.signature_ok, true);
    // Client-address claims are dropped; the edge's address (CF-Connecting-IP) is forwarded, signed.
    assert.notEqual(h['x-postguard-client-ip'], '6.6.6.6');
    assert.equal(h['true-client-ip'], undefined);
    assert.equal(h.forwarded, undefined);
    assert.equal(h['x-real-ip'], undefined);
    assert.ok(!String(h['x-forwarded-for'] ?? '').includes('6.6.6.6'), 'X-Forwarded-For is replaced, not appended to');
    const names = [];
    for (let i = 0; i < seen.rawHeaders.length; i += 2) names.push(seen.rawHeaders[i].toLowerCase());
    for (const n of ['x-postguard-project', 'x-postguard-key-prefix', 'x-postguard-plan', 'x-postguard-signature', 'x-request-id']) {
      assert.equal(names.filter((x) => x === n).length, 1, `exactly one ${n} header line`);
    }
  });

  it('a client X-Request-Id does not replace the gateway one', async () => {
    const res = await gw.fetch('/rid', { headers: { ...bearer(key.key), 'x-request-id': 'req_spoofed' } });
    assert.match(res.headers['x-request-id'], REQUEST_ID_RE);
    assert.notEqual(res.headers['x-request-id'], 'req_spoofed');
    const seen = origin.stats.byRequestId(res.headers['x-request-id']);
    assert.ok(seen, 'the origin sees the gateway request id');
  });

  it('hop-by-hop request headers are removed', async () => {
    const res = await rawRequest(gw.url, {
      method: 'GET',
      path: '/hop',
      headers: [
        ['Authorization', `Bearer ${key.key}`],
        ['Keep-Alive', 'timeout=5'],
        ['Proxy-Authorization', 'Basic c2VjcmV0'],
        ['TE', 'trailers'],
        ['X-Hop', 'drop-me'],
        ['Connection', 'close, X-Hop'],
      ],
    });
    assert.equal(res.status, 200, res.text);
    const h = origin.stats.byRequestId(res.headers['x-request-id']).headers;
    assert.equal(h['keep-alive'], undefined);
    assert.equal(h['proxy-authorization'], undefined);
    assert.equal(h.te, undefined);
    assert.equal(h['x-hop'], undefined, 'headers named in Connection are hop-by-hop too');
  });

  it('the normalised Idempotency-Key is forwarded on mutating requests', async () => {
    const k = ik();
    const res = await gw.fetch('/idem', { method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': `"${k}"` }, body: 'x' });
    assert.equal(res.status, 201);
    assert.equal(origin.stats.byRequestId(res.headers['x-request-id']).headers['idempotency-key'], k);
  });
});

describe('request headers the gateway refuses or passes as sent', () => {
  it('a header value with a control character → 400 VALIDATION_ERROR, not forwarded', async () => {
    const before = origin.stats.total;
    const res = await rawRequest(gw.url, { path: '/ctl', headers: [['Authorization', `Bearer ${key.key}`], ['X-Del', 'a\x7fb']] });
    const p = problem(res, { status: 400, code: 'VALIDATION_ERROR' });
    assert.match(p.detail, /X-Del/i);
    assertRateHeaders(res);
    assert.equal(origin.stats.total, before, 'not forwarded');
  });

  it('a refused request does not claim its Idempotency-Key', async () => {
    const k = ik();
    const bad = await rawRequest(gw.url, {
      method: 'POST', path: '/ctl-claim', body: 'x',
      headers: [['Authorization', `Bearer ${key.key}`], ['Idempotency-Key', k], ['X-Del', 'a\x01b']],
    });
    problem(bad, { status: 400, code: 'VALIDATION_ERROR' });
    const good = await gw.fetch('/ctl-claim', { method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': k }, body: 'x' });
    assert.equal(good.status, 201, good.text);
    assert.equal(origin.stats.count(k), 1);
  });

  it('Idempotency-Key on a GET (not enforced) reaches the origin as sent', async () => {
    const res = await gw.fetch('/things', { headers: { ...bearer(key.key), 'idempotency-key': '"as-sent"' } });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.headers['idempotent-replayed'], undefined);
    const seen = origin.stats.byRequestId(res.headers['x-request-id']);
    assert.equal(seen.headers['idempotency-key'], '"as-sent"');
  });
});

describe('response from the origin', () => {
  it('status, headers and body pass through; Set-Cookie included on a live response', async () => {
    const res = await gw.fetch('/things', { method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': ik() }, body: '{}' });
    assert.equal(res.status, 201);
    assert.equal(res.headers['set-cookie'], 'origin=1');
    assert.match(res.headers.location, /^\/things\/\d+$/);
    assert.match(res.headers['x-origin-execution'], /^\d+$/);
    assert.equal(res.json.method, 'POST');
    assert.equal(res.json.path, '/things');
    assert.match(res.headers['x-request-id'], REQUEST_ID_RE);
    assertRateHeaders(res);
  });

  for (const status of [200, 301, 302, 307, 400, 401, 403, 404, 418, 500, 503]) {
    it(`origin ${status} is passed through as is (no redirect following, no rewriting)`, async () => {
      const res = await gw.fetch(`/status/${status}`, { headers: { ...bearer(key.key), 'x-demo-status': String(status) } });
      assert.equal(res.status, status);
      assert.equal(res.headers['content-type'], 'application/json', 'the origin body, not a gateway problem');
      assert.equal(res.json.path, `/status/${status}`);
      if (status >= 300 && status < 400) assert.match(res.headers.location, /^\/things\/\d+$/);
      assertRateHeaders(res);
    });
  }

  it('large response bodies stream through intact (3 MiB)', async () => {
    const n = 3 * 1024 * 1024;
    const res = await gw.fetch('/big', { headers: { ...bearer(key.key), 'x-demo-body-bytes': String(n) } });
    assert.equal(res.status, 200);
    assert.equal(res.body.length, n);
    assert.ok(res.body.equals(Buffer.alloc(n, 'a')));
  });

  it('HEAD is forwarded as HEAD', async () => {
    const res = await gw.fetch('/head', { method: 'HEAD', headers: bearer(key.key) });
    assert.equal(res.status, 200);
    assert.equal(res.body.length, 0);
    assert.equal(origin.stats.byRequestId(res.headers['x-request-id']).method, 'HEAD');
  });
});

describe('origin failures', () => {
  it('origin slower than origin.timeout_ms → 504 ORIGIN_TIMEOUT (problem+json, rate headers)', async () => {
    const t0 = Date.now();
    const res = await gw.fetch('/slow', { headers: { ...bearer(key.key), 'x-demo-delay-ms': '10000' } });
    const took = Date.now() - t0;
    // The 504 itself shows the gateway did not wait for the origin's 200;
    // how soon after the timeout it answered is the benchmarks' business.
    problem(res, { status: 504, code: 'ORIGIN_TIMEOUT' });
    assertRateHeaders(res);
    assert.ok(took >= 3900, `not answered before the 4000 ms timeout, took ${took} ms`);
  });

  it('origin that never answers → 504 ORIGIN_TIMEOUT', async () => {
    const res = await gw.fetch('/hang', { headers: { ...bearer(key.key), 'x-demo-hang': '1' } });
    problem(res, { status: 504, code: 'ORIGIN_TIMEOUT' });
  });

  it('origin down → 502 ORIGIN_UNREACHABLE; back up → forwarded again', async () => {
    const port = origin.port;
    await origin.kill();
    const res = await gw.fetch('/down', { headers: bearer(key.key) });
    // 502, not a 504 at the timeout: a refused connection is reported as such.
    problem(res, { status: 502, code: 'ORIGIN_UNREACHABLE' });
    assertRateHeaders(res);
    origin = await startOrigin({ port });
    const ok = await gw.fetch('/up', { headers: bearer(key.key) });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(origin.stats.total, 1);
  });
});

describe('ORIGIN_URL with a base path', () => {
  let gw2;
  before(async () => {
    gw2 = await startGateway({ originUrl: `${origin.url}/api`, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  });
  after(async () => gw2?.dispose());

  it('forwards to ORIGIN_URL + path + query', async () => {
    const k = await gw2.createKey({ project: 'base', plan: 'big' });
    const res = await gw2.fetch('/v1/items?a=1', { headers: bearer(k.key) });
    assert.equal(res.status, 200, res.text);
    const seen = origin.stats.byRequestId(res.headers['x-request-id']);
    assert.equal(seen.target, '/api/v1/items?a=1');
    assert.equal(seen.signature_ok, true, `the signature covers the path the origin receives: ${seen.signature_error}`);
  });
});
