// Issue 25 on the client side: the idempotency lookup (`status`), the key lifecycle calls, the
// new error classes, and the throttle reading several policies without taking the concurrency
// quota — or the gateway's own budget — for the API's window budget. Fake fetch and clock.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  Postguard, ApiError, ApiKeyExpiredError, RateLimitError, RetriesExhaustedError, RateLimiter,
  readRateLimit, bindingPolicy, idempotencyKeySegment,
} from '../dist/index.js';
import { fakeClock } from './fake-clock.mjs';

/** A fetch answering from a script of [status, body, headers] steps, recording each request. */
function scriptedFetch(script) {
  const calls = [];
  const fn = async (url, init) => {
    calls.push({ url: String(url), method: init.method, headers: new Headers(init.headers), body: init.body });
    const [status, body = {}, headers = {}] = script[Math.min(calls.length - 1, script.length - 1)];
    const type = status >= 400 ? 'application/problem+json' : 'application/json';
    return new Response(JSON.stringify(body), { status, headers: { 'content-type': type, ...headers } });
  };
  fn.calls = calls;
  return fn;
}

const client = (fetch, extra = {}) =>
  new Postguard({ baseUrl: 'http://gw.test', apiKey: 'pgk_k', adminToken: 'adm', fetch, clock: fakeClock(), random: () => 0, ...extra });

test('the lookup path: the key percent-encoded, a dot segment sent quoted so no URL parser drops it', () => {
  assert.equal(idempotencyKeySegment('order-42'), 'order-42');
  assert.equal(idempotencyKeySegment('a/b?c#d%e'), 'a%2Fb%3Fc%23d%25e');
  assert.equal(idempotencyKeySegment('"quoted"'), '%22quoted%22');
  for (const dots of ['.', '..']) {
    const seg = idempotencyKeySegment(dots);
    assert.equal(seg, `%22${dots}%22`);
    const url = new URL(`http://gw.test/_postguard/v1/idempotency/${seg}`);
    assert.equal(url.pathname, `/_postguard/v1/idempotency/${seg}`, 'the segment survives URL parsing');
  }
  assert.throws(() => idempotencyKeySegment(''), /empty/);
});

test('status(key): GET /idempotency/{key} with the API key, no Idempotency-Key, the typed answer', async () => {
  const answer = { state: 'completed', status: 201, request_id: 'req_01', created_at: 1, expires_at: 2 };
  const f = scriptedFetch([[200, answer]]);
  const got = await client(f).status('order/42');
  assert.deepEqual(got, answer);
  assert.equal(f.calls.length, 1);
  assert.equal(f.calls[0].method, 'GET');
  assert.equal(new URL(f.calls[0].url).pathname, '/_postguard/v1/idempotency/order%2F42');
  assert.equal(f.calls[0].headers.get('authorization'), 'Bearer pgk_k');
  assert.equal(f.calls[0].headers.get('idempotency-key'), null, 'a lookup is a GET: it carries no key of its own');
  for (const state of ['in_progress', 'expired', 'unknown']) {
    assert.equal((await client(scriptedFetch([[200, { state }]])).status('k')).state, state);
  }
});

test('key lifecycle: create with expires_at/meta/overrides, update keeps null (clears) and drops what is left out, reroll', async () => {
  const f = scriptedFetch([[201, { id: 'key_1', key: 'pgk_x' }], [200, { id: 'key_1' }], [201, { id: 'key_1', key: 'pgk_y', previous_expires_at: 5 }], [200, { id: 'key_1', policies: [] }]]);
  const pg = client(f);
  await pg.keys.create({ project: 'p', plan: 'trial', expires_at: '2030-01-01T00:00:00Z', meta: { tier: 'gold' }, overrides: { concurrency: 2 } });
  await pg.keys.update('key_1', { plan: 'pro', expires_at: null, name: undefined });
  const rolled = await pg.keys.reroll('key_1', { grace_s: 60 });
  await pg.keys.get('key_1');
  const [create, update, reroll, get] = f.calls;
  assert.deepEqual(JSON.parse(create.body), { project: 'p', plan: 'trial', expires_at: '2030-01-01T00:00:00Z', meta: { tier: 'gold' }, overrides: { concurrency: 2 } });
  assert.equal(update.method, 'PATCH');
  assert.equal(new URL(update.url).pathname, '/_postguard/v1/keys/key_1');
  assert.equal(update.body, '{"plan":"pro","expires_at":null}', 'null is sent (it clears), undefined is not');
  assert.equal(reroll.method, 'POST');
  assert.equal(new URL(reroll.url).pathname, '/_postguard/v1/keys/key_1/reroll');
  assert.deepEqual(JSON.parse(reroll.body), { grace_s: 60 });
  assert.deepEqual(rolled, { id: 'key_1', key: 'pgk_y', previous_expires_at: 5 });
  for (const c of [create, update, reroll, get]) assert.equal(c.headers.get('authorization'), 'Bearer adm');
  for (const c of [create, update, reroll]) assert.match(c.headers.get('idempotency-key'), /^[0-9a-f-]{36}$/);
  assert.equal(get.headers.get('idempotency-key'), null);
});

test('401 API_KEY_EXPIRED is its own class and is not retried', async () => {
  const f = scriptedFetch([[401, { code: 'API_KEY_EXPIRED', detail: 'expired', request_id: 'req_e' }]]);
  const err = await client(f).request('POST', '/orders', { body: {} }).catch((e) => e);
  assert.ok(err instanceof ApiKeyExpiredError && err instanceof ApiError, String(err));
  assert.equal(err.code, 'API_KEY_EXPIRED');
  assert.equal(err.status, 401);
  assert.equal(err.requestId, 'req_e');
  assert.equal(f.calls.length, 1);
  const invalid = await client(scriptedFetch([[401, { code: 'INVALID_API_KEY' }]])).me().catch((e) => e);
  assert.ok(invalid instanceof ApiError && !(invalid instanceof ApiKeyExpiredError));
});

const QUOTA = 'https://iana.org/assignments/http-problem-types#quota-exceeded';

test('429 CONCURRENCY_LIMIT_EXCEEDED is a rate-limit error retried after its Retry-After: 1, with the same key', async () => {
  const clock = fakeClock();
  const retries = [];
  const f = scriptedFetch([
    [429, { type: QUOTA, code: 'CONCURRENCY_LIMIT_EXCEEDED', 'violated-policies': ['inflight'] },
      { 'retry-after': '1', ratelimit: '"inflight";r=0, "minute";r=30;t=60', 'ratelimit-policy': '"minute";q=30;w=60, "inflight";q=2;qu="concurrent-requests"' }],
    [201, { ok: true }, { ratelimit: '"minute";r=29;t=59, "inflight";r=1', 'ratelimit-policy': '"minute";q=30;w=60, "inflight";q=2;qu="concurrent-requests"' }],
  ]);
  const pg = client(f, { clock, onRetry: (r) => retries.push(r) });
  const res = await pg.request('POST', '/slow', { body: { n: 1 } });
  assert.equal(res.status, 201);
  assert.equal(res.attempts, 2);
  assert.equal(retries.length, 1);
  assert.ok(retries[0].delayMs >= 1000, `not before Retry-After: ${retries[0].delayMs}`);
  assert.ok(retries[0].error instanceof RateLimitError);
  assert.equal(retries[0].error.code, 'CONCURRENCY_LIMIT_EXCEEDED');
  assert.deepEqual(retries[0].error.violatedPolicies, ['inflight']);
  assert.equal(retries[0].error.policy, 'inflight');
  assert.equal(retries[0].error.retryAfterMs, 1000);
  assert.equal(f.calls[0].headers.get('idempotency-key'), f.calls[1].headers.get('idempotency-key'));
});

test('a 429 quota refusal names its violated policies and the binding one; spent attempts keep it as the cause', async () => {
  const headers = {
    'retry-after': '42',
    ratelimit: '"minute";r=0;t=42, "burst";r=3;t=1',
    'ratelimit-policy': '"burst";q=10;w=1, "minute";q=30;w=60',
  };
  const f = scriptedFetch([[429, { type: QUOTA, code: 'RATE_LIMIT_EXCEEDED', 'violated-policies': ['minute'] }, headers]]);
  const err = await client(f, { maxAttempts: 2, throttle: false }).request('GET', '/x').catch((e) => e);
  assert.ok(err instanceof RetriesExhaustedError, String(err));
  assert.equal(err.code, 'RATE_LIMIT_EXCEEDED');
  assert.ok(err.cause instanceof RateLimitError);
  assert.deepEqual(err.cause.violatedPolicies, ['minute']);
  assert.equal(err.cause.policy, 'minute');
  assert.equal(err.cause.retryAfterMs, 42_000);
  // Without a RateLimit field the first violated policy names the binding one.
  const bare = scriptedFetch([[429, { code: 'RATE_LIMIT_EXCEEDED', 'violated-policies': ['day', 'minute'] }]]);
  const e2 = await client(bare, { maxAttempts: 1, throttle: false }).request('GET', '/x').catch((e) => e);
  assert.equal(e2.cause.policy, 'day');
  assert.deepEqual(e2.cause.violatedPolicies, ['day', 'minute']);
});

test('the concurrency quota is never a window budget: not when it heads RateLimit, nor through X-RateLimit-*', () => {
  // The answer to a request refused for want of a slot: `X-RateLimit-*` follow the inflight quota.
  const refused = new Headers({
    ratelimit: '"inflight";r=0, "minute";r=30;t=60',
    'ratelimit-policy': '"minute";q=30;w=60, "inflight";q=5;qu="concurrent-requests"',
    'x-ratelimit-limit': '5', 'x-ratelimit-remaining': '0', 'x-ratelimit-reset': '1700000060',
  });
  assert.equal(bindingPolicy(refused), 'inflight');
  assert.deepEqual(readRateLimit(refused), { remaining: 30, limit: 30, resetInS: 60, resetEpochS: undefined, windowS: 60 });
  // Only the concurrency quota: no window budget is told.
  assert.equal(readRateLimit(new Headers({ ratelimit: '"inflight";r=0', 'x-ratelimit-remaining': '0' })), undefined);
  // A limiter fed that answer keeps sending: the window has 30 left.
  const clock = fakeClock();
  const limiter = new RateLimiter({}, clock);
  limiter.release(readRateLimit(refused), clock.now(), clock.now(), true);
  assert.equal(limiter.delayBeforeSend(clock.now()), 0);
});

test('gateway endpoints are not throttled by the API budget, and their answers do not feed it', async () => {
  const spent = { ratelimit: '"default";r=0;t=60', 'ratelimit-policy': '"default";q=10;w=60' };
  const gatewayBudget = { ratelimit: '"gateway";r=119;t=60', 'ratelimit-policy': '"gateway";q=120;w=60' };
  const f = scriptedFetch([[201, {}, spent], [200, { state: 'unknown' }, spent], [200, { data: [], next_cursor: null }, gatewayBudget], [201, {}, spent]]);
  const clock = fakeClock();
  const pg = client(f, { clock, throttle: { threshold: 0 } });
  await pg.request('POST', '/orders', { body: {} }); // the API budget is spent for 60 s
  const t0 = clock.now();
  assert.equal((await pg.status('k')).state, 'unknown', 'a lookup is answered at once');
  await pg.audit.list();
  assert.equal(clock.now(), t0, 'neither waited for the API window');
  // A proxied call still waits for the reset: the gateway policy's 119 did not refill it.
  await pg.request('POST', '/orders', { body: {} });
  assert.ok(clock.now() - t0 >= 59_000, `waited for the API window (${clock.now() - t0} ms)`);
});
