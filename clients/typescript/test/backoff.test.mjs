// The retry delay rule with a fake clock and a fixed random source: jitter bounds, the 60 s cap,
// Retry-After as a floor (also above the cap), and the client applying it between attempts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { backoffDelay, parseRetryAfter, Postguard, RetriesExhaustedError, DEFAULT_BACKOFF } from '../dist/index.js';
import { fakeClock, fixedRandom } from './fake-clock.mjs';

test('no Retry-After: base · 2^attempt, jitter within [0, 30 %)', () => {
  for (let attempt = 0; attempt < 6; attempt++) {
    const ideal = DEFAULT_BACKOFF.baseDelayMs * 2 ** attempt;
    assert.equal(backoffDelay(attempt, undefined, () => 0), ideal, `attempt ${attempt}, jitter 0`);
    const top = backoffDelay(attempt, undefined, () => 0.999999);
    assert.ok(top < ideal * 1.3 && top > ideal * 1.29, `attempt ${attempt}: top of the jitter ${top} vs ${ideal}`);
  }
});

test('jitter stays within bounds for many random draws, and spreads', () => {
  const seen = new Set();
  for (let i = 0; i < 1000; i++) {
    const d = backoffDelay(2, 1000, Math.random);
    assert.ok(d >= 4000 && d < 5200, `delay ${d} outside [4000, 5200)`);
    seen.add(Math.floor((d - 4000) / 100));
  }
  assert.ok(seen.size >= 10, 'jitter actually varies');
  // A broken random source cannot widen the range.
  assert.equal(backoffDelay(0, undefined, () => -5), 500);
  assert.ok(backoffDelay(0, undefined, () => 7) < 650);
  assert.equal(backoffDelay(0, undefined, () => Number.NaN), 500);
});

test('capped at 60 s', () => {
  assert.equal(backoffDelay(20, undefined, () => 0.5), 60_000);
  assert.equal(backoffDelay(7, 1000, () => 0), 60_000); // 1 s · 128 = 128 s → 60 s
  assert.equal(backoffDelay(3, undefined, () => 0, { maxDelayMs: 2000 }), 2000);
});

test('Retry-After is a floor, never shortened — not even by the cap', () => {
  assert.equal(backoffDelay(0, 3000, () => 0), 3000);
  assert.equal(backoffDelay(1, 3000, () => 0), 6000, 'the exponent applies to Retry-After');
  assert.ok(backoffDelay(0, 3000, () => 0.5) >= 3000);
  assert.equal(backoffDelay(0, 120_000, () => 0.9), 120_000, 'Retry-After 120 s beats the 60 s cap');
  assert.equal(backoffDelay(0, 100, () => 0), 500, 'a Retry-After below the base waits the base');
});

test('parseRetryAfter: delta-seconds and HTTP dates; garbage ignored', () => {
  const now = Date.parse('2026-12-01T08:00:00Z');
  assert.equal(parseRetryAfter('3', now), 3000);
  assert.equal(parseRetryAfter(' 0 ', now), 0);
  assert.equal(parseRetryAfter('Tue, 01 Dec 2026 08:00:10 GMT', now), 10_000);
  assert.equal(parseRetryAfter('Tue, 01 Dec 2026 07:00:00 GMT', now), 0);
  assert.equal(parseRetryAfter('-1', now), undefined);
  assert.equal(parseRetryAfter('1.5', now), undefined);
  assert.equal(parseRetryAfter('soon', now), undefined);
  assert.equal(parseRetryAfter(null, now), undefined);
});

/** A fetch answering from a list of [status, headers] (or an Error to throw), recording each request. */
function scriptedFetch(script) {
  const calls = [];
  const fn = async (url, init) => {
    calls.push({ url, headers: new Headers(init.headers), method: init.method });
    const step = script[Math.min(calls.length - 1, script.length - 1)];
    if (step instanceof Error) throw step;
    const [status, headers = {}, body = { ok: true }] = step;
    return new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });
  };
  fn.calls = calls;
  return fn;
}

test('the client waits Retry-After (as a floor, times 2^attempt, plus jitter) and keeps the key', async () => {
  const clock = fakeClock();
  const fetch = scriptedFetch([
    [429, { 'retry-after': '2' }, { code: 'RATE_LIMIT_EXCEEDED' }],
    [503, {}, { code: 'X' }],
    [409, { 'retry-after': '1' }, { code: 'IDEMPOTENCY_KEY_IN_PROGRESS' }],
    [201, { 'idempotent-replayed': 'true' }, { id: 1 }],
  ]);
  const pg = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch, clock, random: fixedRandom(0.5), throttle: false });
  const res = await pg.request('POST', '/payments', { body: { amount: 1 } });
  assert.equal(res.status, 201);
  assert.equal(res.replayed, true);
  assert.equal(res.attempts, 4);
  assert.deepEqual(clock.sleeps, [2000 * 1.15, 500 * 2 * 1.15, 1000 * 4 * 1.15]);
  const keys = fetch.calls.map((c) => c.headers.get('idempotency-key'));
  assert.match(keys[0], /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.ok(keys.every((k) => k === keys[0]), `one key for every attempt: ${keys}`);
  assert.match(fetch.calls[0].headers.get('user-agent'), /^postguard-client-typescript\/\d+\.\d+\.\d+/);
});

test('attempts are bounded, then RetriesExhaustedError with the last problem', async () => {
  const clock = fakeClock();
  const fetch = scriptedFetch([[503, { 'x-request-id': 'req_1' }, { code: 'ORIGIN_UNREACHABLE', detail: 'down', request_id: 'req_1' }]]);
  const pg = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch, clock, random: () => 0, throttle: false, maxAttempts: 4 });
  const err = await pg.request('PUT', '/x', { body: {} }).catch((e) => e);
  assert.ok(err instanceof RetriesExhaustedError, String(err));
  assert.equal(err.attempts, 4);
  assert.equal(err.code, 'ORIGIN_UNREACHABLE');
  assert.equal(err.detail, 'down');
  assert.equal(err.requestId, 'req_1');
  assert.equal(fetch.calls.length, 4);
  assert.deepEqual(clock.sleeps, [500, 1000, 2000]);
});

test('network errors are retried for calls with a key; GETs get no key', async () => {
  const clock = fakeClock();
  const fetch = scriptedFetch([new TypeError('fetch failed'), [200]]);
  const pg = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch, clock, random: () => 0, throttle: false });
  const res = await pg.request('GET', '/things');
  assert.equal(res.attempts, 2);
  assert.equal(fetch.calls[0].headers.get('idempotency-key'), null);
});

test('4xx are never retried; 422 reuse has its own type; 409 other than in-progress is final', async () => {
  const { ApiError, IdempotencyKeyReuseError } = await import('../dist/index.js');
  for (const [status, code, Type] of [
    [400, 'VALIDATION_ERROR', ApiError],
    [401, 'INVALID_API_KEY', ApiError],
    [403, 'FORBIDDEN', ApiError],
    [404, 'NOT_FOUND', ApiError],
    [409, 'SOMETHING_ELSE', ApiError],
    [422, 'IDEMPOTENCY_KEY_REUSE_CONFLICT', IdempotencyKeyReuseError],
  ]) {
    const fetch = scriptedFetch([[status, {}, { code, detail: 'd', request_id: 'req_x' }], [201]]);
    const pg = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch, clock: fakeClock(), throttle: false });
    const err = await pg.request('POST', '/x', { body: {} }).catch((e) => e);
    assert.ok(err instanceof Type, `${status}: ${err}`);
    assert.equal(err.code, code);
    assert.equal(err.requestId, 'req_x');
    assert.equal(fetch.calls.length, 1, `${status} is not retried`);
  }
});

test('retrySafe: false — a lost answer is not retried (NetworkError), a 429 still is', async () => {
  const { NetworkError } = await import('../dist/index.js');
  const lost = scriptedFetch([new TypeError('socket hang up'), [201]]);
  const pg = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch: lost, clock: fakeClock(), throttle: false });
  const err = await pg.request('POST', '/search', { body: {}, retrySafe: false }).catch((e) => e);
  assert.ok(err instanceof NetworkError, String(err));
  assert.equal(lost.calls.length, 1);
  const limited = scriptedFetch([[429, { 'retry-after': '1' }, { code: 'RATE_LIMIT_EXCEEDED' }], [201]]);
  const pg2 = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch: limited, clock: fakeClock(), throttle: false });
  assert.equal((await pg2.request('POST', '/search', { body: {}, retrySafe: false })).status, 201);
});

test('an aborted signal stops the wait between attempts', async () => {
  const ctl = new AbortController();
  const fetch = scriptedFetch([[503]]);
  const clock = fakeClock();
  const pg = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch, clock, throttle: false, onRetry: () => ctl.abort(new Error('cancelled')) });
  await assert.rejects(pg.request('PUT', '/x', { body: {}, signal: ctl.signal }), /cancelled/);
  assert.equal(fetch.calls.length, 1);
});

test('a response body over maxResponseBytes is refused, declared or streamed, and not retried', async () => {
  const { PostguardError } = await import('../dist/index.js');
  let calls = 0;
  const big = async () => {
    calls += 1;
    const stream = new ReadableStream({
      pull(c) {
        c.enqueue(new Uint8Array(1000));
      },
    });
    return new Response(stream, { status: 200 });
  };
  const pg = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch: big, clock: fakeClock(), throttle: false, maxResponseBytes: 10_000 });
  const err = await pg.request('GET', '/big').catch((e) => e);
  assert.ok(err instanceof PostguardError && err.code === 'RESPONSE_TOO_LARGE', String(err));
  assert.equal(calls, 1);
  const declared = async () => new Response('x'.repeat(20), { status: 200, headers: { 'content-length': '20' } });
  const pg2 = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch: declared, clock: fakeClock(), throttle: false, maxResponseBytes: 10 });
  assert.equal((await pg2.request('GET', '/x').catch((e) => e)).code, 'RESPONSE_TOO_LARGE');
  const pg3 = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch: declared, clock: fakeClock(), throttle: false, maxResponseBytes: 20 });
  assert.equal((await pg3.request('GET', '/x')).data, 'x'.repeat(20));
});
