// Idempotency-Key (docs/idempotency.md, docs/api-reference.md): atomic claim, replay, scoping, what is stored, TTL, lease after a crash.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startOrigin } from './support/origin.mjs';
import {
  startGateway, burst, rawRequest, problem, poll, bearer, cfg, assertRateHeaders, ORIGIN_TOKEN,
} from './support/gateway.mjs';

const LEASE_S = 3;
const CONFIG = {
  // Well above the origin delays used below (≤ 700 ms), so that a loaded machine does not
  // turn a slow answer into a timeout; below the lease, as the configuration requires.
  origin: { timeout_ms: 2500 },
  idempotency: {
    lease_s: LEASE_S,
    routes: [
      { method: 'POST', path: '/search', mode: 'off' },
      { method: 'PATCH', path: '/strict/*', mode: 'required' },
    ],
  },
  plans: {
    big: { requests_per_window: 100000, window_s: 60, idempotency_ttl_s: 86400 },
    short: { requests_per_window: 100000, window_s: 60, idempotency_ttl_s: 2 },
  },
};

let origin;
let gw;
let key; // big plan
const ik = (name) => `${name}-${crypto.randomBytes(6).toString('hex')}`;

// Headers that legitimately differ between the original response and its replay.
const PER_RESPONSE = new Set([
  'x-request-id', 'date', 'set-cookie', 'idempotent-replayed', 'connection', 'keep-alive', 'transfer-encoding',
  'content-length', 'content-encoding', 'vary',
  'x-ratelimit-limit', 'x-ratelimit-remaining', 'x-ratelimit-reset', 'ratelimit', 'ratelimit-policy', 'retry-after',
]);
const stored = (res) => Object.fromEntries(Object.entries(res.headers).filter(([k]) => !PER_RESPONSE.has(k)).sort());

function assertReplayOf(replay, original, what = 'replay') {
  assert.equal(replay.headers['idempotent-replayed'], 'true', `${what}: Idempotent-Replayed: true (got ${replay.status} ${replay.text.slice(0, 200)})`);
  assert.equal(replay.status, original.status, `${what}: same status`);
  assert.ok(replay.body.equals(original.body), `${what}: byte-identical body\n  original: ${original.text.slice(0, 200)}\n  replay:   ${replay.text.slice(0, 200)}`);
  assert.deepEqual(stored(replay), stored(original), `${what}: same stored headers`);
  assert.notEqual(replay.headers['x-request-id'], original.headers['x-request-id'], `${what}: new X-Request-Id`);
  assert.match(replay.headers['x-request-id'], /^req_/);
  assert.equal(replay.headers['set-cookie'], undefined, `${what}: Set-Cookie is not stored`);
}

function post(p, { idem, body = '{"amount":100}', headers = {}, apiKey = key.key, method = 'POST' } = {}) {
  const h = { ...bearer(apiKey), 'content-type': 'application/json', ...headers };
  if (idem !== undefined) h['idempotency-key'] = idem;
  return gw.fetch(p, { method, headers: h, body });
}

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  key = await gw.createKey({ project: 'idem', plan: 'big' });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

describe('replay', () => {
  it('same key + same request → stored response replayed with Idempotent-Replayed, origin called once', async () => {
    const k = ik('basic');
    const first = await post('/payments?x=1', { idem: k });
    assert.equal(first.status, 201, first.text);
    assert.equal(first.json.execution, 1);
    assert.equal(first.headers['idempotent-replayed'], undefined, 'the original is not marked replayed');
    assert.equal(first.headers['set-cookie'], 'origin=1', 'the original passes Set-Cookie through');
    assertRateHeaders(first);
    const again = await post('/payments?x=1', { idem: k });
    assertReplayOf(again, first);
    assertRateHeaders(again);
    assert.equal(again.headers.location, '/things/1');
    assert.equal(again.headers['x-origin-execution'], '1');
    const third = await post('/payments?x=1', { idem: k, headers: { 'x-unrelated': 'headers are not in the fingerprint' } });
    assertReplayOf(third, first, 'third');
    assert.equal(origin.stats.count(k), 1);
  });

  it('100 simultaneous POSTs with one key → exactly one execution; the rest are 409 or byte-identical replays', async () => {
    const k = ik('burst');
    const body = JSON.stringify({ amount: 4200, currency: 'EUR' });
    const reqs = Array.from({ length: 100 }, () => ({
      method: 'POST',
      path: '/payments',
      headers: { ...bearer(key.key), 'content-type': 'application/json', 'idempotency-key': k, 'x-demo-delay-ms': '300' },
      body,
    }));
    const res = await burst(gw.url, reqs);
    assert.equal(origin.stats.count(k), 1, 'the origin executed exactly once');
    const originals = res.filter((r) => r.status === 201 && r.headers['idempotent-replayed'] === undefined);
    assert.equal(originals.length, 1, `exactly one original; statuses ${JSON.stringify(res.map((r) => r.status))}`);
    const original = originals[0];
    assert.equal(original.json.execution, 1);
    let conflicts = 0;
    for (const r of res) {
      assertRateHeaders(r);
      if (r === original) continue;
      if (r.status === 409) {
        problem(r, { status: 409, code: 'IDEMPOTENCY_KEY_IN_PROGRESS' });
        const ra = Number(r.headers['retry-after']);
        assert.ok(Number.isInteger(ra) && ra >= 1 && ra <= LEASE_S + 1, `409 Retry-After ${r.headers['retry-after']}`);
        conflicts++;
      } else {
        assertReplayOf(r, original, `burst response (${r.status})`);
      }
    }
    assert.ok(conflicts > 0, 'with a 300 ms origin, concurrent duplicates must see 409 IN_PROGRESS');
    const later = await rawRequest(gw.url, reqs[0]);
    assertReplayOf(later, original, 'replay after the burst');
    assert.equal(origin.stats.count(k), 1);
  });

  it('60 simultaneous POSTs with one key and two different bodies → one execution; 422 for the other body, 409 or replays for the winner\'s', async () => {
    const k = ik('two-bodies');
    const bodies = [JSON.stringify({ amount: 1 }), JSON.stringify({ amount: 2 })];
    const reqs = Array.from({ length: 60 }, (_, i) => ({
      method: 'POST',
      path: '/payments',
      headers: { ...bearer(key.key), 'content-type': 'application/json', 'idempotency-key': k, 'x-demo-delay-ms': '300' },
      body: bodies[i % 2],
    }));
    const res = await burst(gw.url, reqs);
    assert.equal(origin.stats.count(k), 1, 'the origin executed exactly once');
    const winners = res.map((r, i) => [r, i]).filter(([r]) => r.status === 201 && r.headers['idempotent-replayed'] === undefined);
    assert.equal(winners.length, 1, `exactly one original; statuses ${JSON.stringify(res.map((r) => r.status))}`);
    const [original, w] = winners[0];
    const sha = (b) => crypto.createHash('sha256').update(b).digest('hex');
    assert.equal(original.json.body_sha256, sha(bodies[w % 2]), 'the origin saw the winner\'s body');
    let conflicts = 0;
    for (const [i, r] of res.entries()) {
      assertRateHeaders(r);
      if (i === w) continue;
      if (i % 2 !== w % 2) {
        problem(r, { status: 422, code: 'IDEMPOTENCY_KEY_REUSE_CONFLICT' });
        conflicts++;
      } else if (r.status === 409) {
        problem(r, { status: 409, code: 'IDEMPOTENCY_KEY_IN_PROGRESS' });
      } else {
        assertReplayOf(r, original, `same-body response (${r.status})`);
      }
    }
    assert.equal(conflicts, 30, 'every request with the other body is refused');
    assertReplayOf(await rawRequest(gw.url, reqs[w]), original, 'the winner\'s body after the burst');
    problem(await rawRequest(gw.url, reqs[w + 1 - 2 * (w % 2)]), { status: 422, code: 'IDEMPOTENCY_KEY_REUSE_CONFLICT' });
    assert.equal(origin.stats.count(k), 1);
  });

  it('50 simultaneous POSTs with 50 different keys → 50 executions, no false conflicts', async () => {
    const keys = Array.from({ length: 50 }, () => ik('many'));
    const res = await burst(gw.url, keys.map((k) => ({
      method: 'POST',
      path: '/payments',
      headers: { ...bearer(key.key), 'content-type': 'application/json', 'idempotency-key': k, 'x-demo-delay-ms': '100' },
      body: '{"amount":1}',
    })));
    assert.deepEqual([...new Set(res.map((r) => r.status))], [201], `statuses ${JSON.stringify(res.map((r) => r.status))}`);
    for (const k of keys) assert.equal(origin.stats.count(k), 1, k);
  });

  it('409 IDEMPOTENCY_KEY_IN_PROGRESS with Retry-After while the first request runs', async () => {
    const k = ik('inflight');
    const firstP = post('/slow', { idem: k, headers: { 'x-demo-delay-ms': '700' } });
    await poll(() => origin.stats.count(k) === 1, { message: 'origin to receive the first request' });
    const dup = await post('/slow', { idem: k });
    problem(dup, { status: 409, code: 'IDEMPOTENCY_KEY_IN_PROGRESS' });
    const ra = Number(dup.headers['retry-after']);
    assert.ok(Number.isInteger(ra) && ra >= 1 && ra <= LEASE_S + 1, `Retry-After ${dup.headers['retry-after']}`);
    assertRateHeaders(dup);
    const first = await firstP;
    assert.equal(first.status, 201);
    assertReplayOf(await post('/slow', { idem: k }), first);
    assert.equal(origin.stats.count(k), 1);
  });

  it('quoted ("abc") and bare (abc) forms are the same key; the origin gets it unquoted', async () => {
    const k = ik('quoted');
    const first = await post('/q', { idem: `"${k}"` });
    assert.equal(first.status, 201, first.text);
    assert.equal(first.json.headers['idempotency-key'], k, 'forwarded normalised, unquoted');
    assertReplayOf(await post('/q', { idem: k }), first, 'bare after quoted');
    assertReplayOf(await post('/q', { idem: `"${k}"` }), first, 'quoted again');
    const k2 = ik('bare');
    const f2 = await post('/q', { idem: k2 });
    assertReplayOf(await post('/q', { idem: `"${k2}"` }), f2, 'quoted after bare');
    assert.equal(origin.stats.count(k), 1);
    assert.equal(origin.stats.count(k2), 1);
  });

  it('a 255-char key works (and replays); the limit is on the unquoted key', async () => {
    const k = 'k'.repeat(243) + crypto.randomBytes(6).toString('hex'); // 243 + 12 = 255 characters
    const first = await post('/long', { idem: k });
    assert.equal(first.status, 201, first.text);
    assertReplayOf(await post('/long', { idem: `"${k}"` }), first);
    problem(await post('/long', { idem: `${k}x` }), { status: 400, code: 'IDEMPOTENCY_KEY_INVALID' });
    problem(await post('/long', { idem: `"${k}x"` }), { status: 400, code: 'IDEMPOTENCY_KEY_INVALID' });
  });
});

describe('scoping and fingerprint', () => {
  it('two API keys with the same Idempotency-Key never see each other\'s response', async () => {
    const other = await gw.createKey({ project: 'idem-other', plan: 'big' });
    const k = ik('shared');
    const a = await post('/orders', { idem: k });
    const b = await post('/orders', { idem: k, apiKey: other.key });
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.equal(b.headers['idempotent-replayed'], undefined, 'the second API key is not served the first one\'s response');
    assert.equal(origin.stats.count(k), 2, 'the origin executed once per API key');
    assert.notDeepEqual(a.json, b.json);
    assert.equal(a.json.headers['x-postguard-key-prefix'], key.prefix);
    assert.equal(b.json.headers['x-postguard-key-prefix'], other.prefix);
    assertReplayOf(await post('/orders', { idem: k }), a, 'A replays A');
    assertReplayOf(await post('/orders', { idem: k, apiKey: other.key }), b, 'B replays B');
  });

  it('same key, different body / path / query / method → 422 REUSE_CONFLICT, origin not called', async () => {
    const k = ik('conflict');
    const first = await post('/things?a=1', { idem: k, body: '{"n":1}' });
    assert.equal(first.status, 201);
    const variants = [
      ['body', () => post('/things?a=1', { idem: k, body: '{"n":2}' })],
      ['empty body', () => post('/things?a=1', { idem: k, body: '' })],
      ['path', () => post('/things2?a=1', { idem: k, body: '{"n":1}' })],
      ['query', () => post('/things?a=2', { idem: k, body: '{"n":1}' })],
      ['no query', () => post('/things', { idem: k, body: '{"n":1}' })],
      ['method', () => post('/things?a=1', { idem: k, body: '{"n":1}', method: 'PUT' })],
    ];
    for (const [what, send] of variants) {
      const res = await send();
      problem(res, { status: 422, code: 'IDEMPOTENCY_KEY_REUSE_CONFLICT' });
      assertRateHeaders(res);
      assert.equal(origin.stats.count(k), 1, `different ${what}: origin not called`);
    }
    assertReplayOf(await post('/things?a=1', { idem: k, body: '{"n":1}' }), first, 'the original still replays');
  });
});

describe('what is stored', () => {
  for (const s of [500, 503, 408, 409, 425, 429]) {
    it(`origin ${s} is not stored: the claim is released and a retry runs again`, async () => {
      const k = ik(`ns${s}`);
      origin.stats.script(k, [s, 200]);
      const r1 = await post('/flaky', { idem: k });
      assert.equal(r1.status, s, r1.text);
      assert.equal(r1.headers['idempotent-replayed'], undefined);
      assertRateHeaders(r1);
      const r2 = await post('/flaky', { idem: k });
      assert.equal(r2.status, 200, `retry after ${s} runs again: ${r2.status} ${r2.text}`);
      assert.equal(r2.headers['idempotent-replayed'], undefined);
      assert.equal(r2.json.execution, 2);
      assertReplayOf(await post('/flaky', { idem: k }), r2, 'third call replays the 200');
      assert.equal(origin.stats.count(k), 2);
    });
  }

  for (const s of [200, 202, 204, 302, 400, 404, 410, 422]) {
    it(`origin ${s} is stored and replayed`, async () => {
      const k = ik(`st${s}`);
      origin.stats.script(k, [s, 201]);
      const r1 = await post('/stored', { idem: k });
      assert.equal(r1.status, s);
      const r2 = await post('/stored', { idem: k });
      assertReplayOf(r2, r1);
      if (s === 302) assert.equal(r2.headers.location, r1.headers.location, 'redirects are replayed, not followed');
      assert.equal(origin.stats.count(k), 1);
    });
  }

  it('origin timeout → 504 ORIGIN_TIMEOUT, not stored; a retry runs again', async () => {
    const k = ik('timeout');
    // The origin would answer 201 after 5 s: the 504 shows the gateway gave up at its timeout.
    const r1 = await post('/slow', { idem: k, headers: { 'x-demo-delay-ms': '5000' } });
    problem(r1, { status: 504, code: 'ORIGIN_TIMEOUT' });
    assertRateHeaders(r1);
    const r2 = await post('/slow', { idem: k });
    assert.equal(r2.status, 201, `retry after a timeout runs again (no 409): ${r2.status} ${r2.text}`);
    assert.equal(r2.headers['idempotent-replayed'], undefined);
    assert.equal(origin.stats.count(k), 2);
    assertReplayOf(await post('/slow', { idem: k }), r2);
  });

  it('a body over max_stored_body_bytes is delivered once and replayed whole from R2 (tests/r2.test.mjs: sizes, expiry, R2 failure)', async () => {
    const k = ik('big');
    const size = 1048576 + 1;
    const first = await post('/export', { idem: k, headers: { 'x-demo-body-bytes': String(size) } });
    assert.equal(first.status, 201);
    assert.equal(first.body.length, size, 'the first response is delivered whole');
    assert.ok(first.body.equals(Buffer.alloc(size, 'a')));
    // The record completes once R2 has the body (until then a retry is told "in progress").
    const replay = await poll(async () => {
      const r = await post('/export', { idem: k });
      return r.status === 409 ? undefined : r;
    }, { message: 'the large response recorded' });
    assert.equal(replay.status, 201);
    assert.equal(replay.headers['idempotent-replayed'], 'true');
    assert.equal(replay.headers['idempotent-body-omitted'], undefined, 'no body is omitted any more');
    assert.ok(replay.body.equals(first.body), 'byte-identical replay');
    assert.equal(replay.headers['x-origin-execution'], first.headers['x-origin-execution']);
    assert.equal(replay.headers['content-type'], 'text/plain');
    assert.equal(origin.stats.count(k), 1, 'the origin is not called again');
  });

  it('a body of exactly max_stored_body_bytes is stored and replayed whole', async () => {
    const k = ik('edge');
    const first = await post('/export', { idem: k, headers: { 'x-demo-body-bytes': String(1048576) } });
    assert.equal(first.body.length, 1048576);
    const replay = await post('/export', { idem: k });
    assertReplayOf(replay, first);
    assert.equal(replay.headers['idempotent-body-omitted'], undefined);
    assert.equal(origin.stats.count(k), 1);
  });
});

describe('TTL', () => {
  it('plan idempotency_ttl_s=2: replay before, new execution after', async () => {
    const short = await gw.createKey({ project: 'idem', plan: 'short' });
    const k = ik('ttl');
    const t0 = Date.now();
    const first = await post('/ttl', { idem: k, apiKey: short.key });
    assert.equal(first.status, 201);
    assertReplayOf(await post('/ttl', { idem: k, apiKey: short.key }), first);
    const fresh = await poll(async () => {
      const r = await post('/ttl', { idem: k, apiKey: short.key });
      if (r.headers['idempotent-replayed'] === 'true') {
        assertReplayOf(r, first, 'replay within the TTL');
        return null;
      }
      return r;
    }, { timeout: 8000, interval: 200, message: 'the idempotency record to expire' });
    const elapsed = Date.now() - t0;
    assert.ok(elapsed >= 1500, `expired only after the TTL (${elapsed} ms)`);
    assert.equal(fresh.status, 201);
    assert.equal(fresh.json.execution, 2);
    assert.equal(origin.stats.count(k), 2);
  });
});

describe('modes per method and route', () => {
  it('POST without a key → 400 IDEMPOTENCY_KEY_REQUIRED, not forwarded', async () => {
    const before = origin.stats.total;
    const res = await post('/payments');
    problem(res, { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
    assertRateHeaders(res);
    assert.equal(origin.stats.total, before);
  });

  for (const method of ['PATCH', 'PUT', 'DELETE']) {
    it(`${method} is optional: forwarded without a key every time, replayed with one`, async () => {
      const before = origin.stats.total;
      const a = await post('/opt', { method });
      const b = await post('/opt', { method });
      assert.equal(a.status, 200, a.text);
      assert.equal(b.status, 200);
      assert.equal(origin.stats.total, before + 2);
      assert.equal(a.json.headers['idempotency-key'], undefined);
      const k = ik(method);
      const c = await post('/opt', { method, idem: k });
      assertReplayOf(await post('/opt', { method, idem: k }), c);
      assert.equal(origin.stats.count(k), 1);
    });
  }

  it('GET ignores the key: every GET is executed', async () => {
    const k = ik('get');
    const p = `/items/${k}`;
    const a = await gw.fetch(p, { headers: { ...bearer(key.key), 'idempotency-key': k } });
    const b = await gw.fetch(p, { headers: { ...bearer(key.key), 'idempotency-key': k } });
    assert.equal(a.status, 200);
    assert.equal(b.status, 200);
    assert.equal(b.headers['idempotent-replayed'], undefined);
    assert.notDeepEqual(a.json, b.json);
    assert.equal(origin.stats.find((r) => r.path === p).length, 2);
  });

  it('GET ignores even a malformed key (not validated, not a 400)', async () => {
    const res = await rawRequest(gw.url, { path: '/items/malformed', headers: [['Authorization', `Bearer ${key.key}`], ['Idempotency-Key', 'a b']] });
    assert.equal(res.status, 200, `${res.status} ${res.text}`);
    assert.equal(res.json.path, '/items/malformed');
  });

  it('route mode off (POST /search): no key needed, the key is not used for replay', async () => {
    const before = origin.stats.total;
    const a = await post('/search');
    assert.equal(a.status, 201, a.text);
    const k = ik('search');
    await post('/search', { idem: k });
    const c = await post('/search', { idem: k });
    assert.equal(c.headers['idempotent-replayed'], undefined);
    assert.equal(origin.stats.total, before + 3);
    // a pattern without * matches exactly
    problem(await post('/search/more'), { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
    problem(await post('/searchx'), { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
  });

  it('route mode required (PATCH /strict/*): * spans segments', async () => {
    problem(await post('/strict/a', { method: 'PATCH' }), { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
    problem(await post('/strict/a/b/c', { method: 'PATCH' }), { status: 400, code: 'IDEMPOTENCY_KEY_REQUIRED' });
    const ok = await post('/strict', { method: 'PATCH' });
    assert.equal(ok.status, 200, '/strict itself does not match /strict/* (one or more characters)');
    const k = ik('strict');
    const r = await post('/strict/a', { method: 'PATCH', idem: k });
    assert.equal(r.status, 200);
  });
});

describe('origin unreachable', () => {
  it('502 ORIGIN_UNREACHABLE is not stored; the same key runs once the origin is back', async () => {
    const k = ik('down');
    const port = origin.port;
    await origin.kill();
    const r1 = await post('/pay', { idem: k });
    problem(r1, { status: 502, code: 'ORIGIN_UNREACHABLE' });
    assertRateHeaders(r1);
    const r2 = await post('/pay', { idem: k });
    problem(r2, { status: 502, code: 'ORIGIN_UNREACHABLE' });
    origin = await startOrigin({ port });
    const r3 = await post('/pay', { idem: k });
    assert.equal(r3.status, 201, `${r3.status} ${r3.text}`);
    assert.equal(r3.headers['idempotent-replayed'], undefined);
    assertReplayOf(await post('/pay', { idem: k }), r3);
    assert.equal(origin.stats.count(k), 1);
  });
});

describe('crash mid-request (persisted state)', () => {
  const CRASH_CONFIG = {
    origin: { timeout_ms: 2000 },
    idempotency: { lease_s: 4 },
    plans: { big: { requests_per_window: 100000, window_s: 60, idempotency_ttl_s: 86400 } },
  };
  let dir;
  let crashOrigin;
  let g;
  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'postguard-crash-'));
    crashOrigin = await startOrigin();
  });
  after(async () => {
    await g?.dispose();
    await crashOrigin?.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('an abandoned claim answers 409 after restart, then becomes usable after the lease; records survive', async () => {
    const start = () => startGateway({ originUrl: crashOrigin.url, vars: { POSTGUARD_CONFIG: cfg(CRASH_CONFIG) }, persistDir: dir });
    g = await start();
    const apiKey = (await g.createKey({ project: 'crash', plan: 'big' })).key;
    const send = (k, extra = {}) => g.fetch('/charge', {
      method: 'POST',
      headers: { ...bearer(apiKey), 'content-type': 'application/json', 'idempotency-key': k, ...extra },
      body: '{"amount":1}',
    });
    const done = ik('done');
    const completed = await send(done);
    assert.equal(completed.status, 201);

    const k = ik('abandoned');
    const hanging = send(k, { 'x-demo-hang': '1' }).then((r) => r, (e) => e);
    await poll(() => crashOrigin.stats.count(k) === 1, { message: 'origin to receive the hanging request' });
    const crashedAt = Date.now();
    await g.dispose(); // kills workerd mid-request
    await hanging;

    g = await start();
    const replay = await send(done);
    assertReplayOf(replay, completed, 'a completed record survives the restart');

    const busy = await send(k);
    problem(busy, { status: 409, code: 'IDEMPOTENCY_KEY_IN_PROGRESS' });
    const ra = Number(busy.headers['retry-after']);
    assert.ok(Number.isInteger(ra) && ra >= 1 && ra <= 5, `Retry-After ${busy.headers['retry-after']}`);
    assert.equal(crashOrigin.stats.count(k), 1, 'not executed again while the lease runs');

    const ran = await poll(async () => {
      const r = await send(k);
      if (r.status === 409) {
        problem(r, { code: 'IDEMPOTENCY_KEY_IN_PROGRESS' });
        return null;
      }
      return r;
    }, { timeout: 12000, interval: 250, message: 'the lease to expire' });
    assert.equal(ran.status, 201, `${ran.status} ${ran.text}`);
    assert.equal(ran.headers['idempotent-replayed'], undefined);
    assert.ok(Date.now() - crashedAt >= 2500, 'the claim was not released before the lease');
    assert.equal(crashOrigin.stats.count(k), 2, 'the origin executed it exactly once more');
    assertReplayOf(await send(k), ran, 'and from then on it replays');
    assert.equal(crashOrigin.stats.count(k), 2);
  });
});
