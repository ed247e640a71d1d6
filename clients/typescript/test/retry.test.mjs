// The retry rule (issue 23 item 1): a mutating call is retried after a lost answer only when it
// carries an Idempotency-Key; every mutating gateway call carries one, generated once per call
// and sent unchanged on every attempt; a publish carries its event id.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isRetryable, replaySafe, Postguard, NetworkError, RetriesExhaustedError } from '../dist/index.js';
import { fakeClock } from './fake-clock.mjs';

test('the rule: not executed → always; maybe executed → only when replay-safe; final answers → never', () => {
  for (const safe of [true, false]) {
    assert.equal(isRetryable({ status: 429 }, safe), true);
    assert.equal(isRetryable({ status: 409, code: 'IDEMPOTENCY_KEY_IN_PROGRESS' }, safe), true);
    for (const failure of [{}, { status: 502 }, { status: 503 }, { status: 504 }]) {
      assert.equal(isRetryable(failure, safe), safe, `${JSON.stringify(failure)} safe=${safe}`);
    }
    for (const status of [400, 401, 403, 404, 409, 413, 422, 500, 501]) {
      assert.equal(isRetryable({ status }, safe), false, `${status}`);
    }
  }
  assert.equal(replaySafe('POST', 'k'), true, 'a key makes a mutating call replay-safe');
  assert.equal(replaySafe('POST', undefined), false, 'no key, no retry of a mutating call');
  assert.equal(replaySafe('delete', undefined), false);
  assert.equal(replaySafe('GET', undefined), true);
  assert.equal(replaySafe('POST', 'k', false), false, 'retrySafe: false wins (a route with idempotency off)');
});

/** A fetch answering from a script of [status, body] steps or Errors, recording each request. */
function scriptedFetch(script) {
  const calls = [];
  const fn = async (url, init) => {
    calls.push({ url: String(url), method: init.method, headers: new Headers(init.headers), body: init.body });
    const step = script[Math.min(calls.length - 1, script.length - 1)];
    if (step instanceof Error) throw step;
    const [status, body = {}] = step;
    return new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json' } });
  };
  fn.calls = calls;
  return fn;
}

const lost = () => new TypeError('fetch failed: other side closed');
const client = (fetch) =>
  new Postguard({ baseUrl: 'http://gw.test', apiKey: 'pgk_k', adminToken: 'adm', originToken: 'org', fetch, clock: fakeClock(), random: () => 0, throttle: false });

test('a mutating call without a key (idempotencyKey: null) is not retried after a lost answer or a 503', async () => {
  const f = scriptedFetch([lost(), [201]]);
  const err = await client(f).request('PATCH', '/orders/1', { body: { a: 1 }, idempotencyKey: null }).catch((e) => e);
  assert.ok(err instanceof NetworkError, String(err));
  assert.equal(f.calls.length, 1, 'one attempt only');
  assert.equal(f.calls[0].headers.get('idempotency-key'), null, 'no key was sent');
  const f503 = scriptedFetch([[503, { code: 'ORIGIN_UNREACHABLE' }], [201]]);
  const e503 = await client(f503).request('DELETE', '/orders/1', { idempotencyKey: null }).catch((e) => e);
  assert.equal(e503.status, 503);
  assert.equal(f503.calls.length, 1);
  // The same calls with a key (the default) are retried, with that key.
  const again = scriptedFetch([lost(), [503, { code: 'ORIGIN_UNREACHABLE' }], [200]]);
  const res = await client(again).request('PATCH', '/orders/1', { body: { a: 1 } });
  assert.equal(res.attempts, 3);
  assert.equal(new Set(again.calls.map((c) => c.headers.get('idempotency-key'))).size, 1);
  // A 429 was not executed: retried even without a key.
  const limited = scriptedFetch([[429, { code: 'RATE_LIMIT_EXCEEDED' }], [200]]);
  assert.equal((await client(limited).request('DELETE', '/orders/1', { idempotencyKey: null })).attempts, 2);
});

test('every mutating gateway call carries one key for all its attempts and is retried after a lost answer', async () => {
  const calls = {
    'keys.create': (pg) => pg.keys.create({ project: 'p', plan: 'trial' }),
    'keys.revoke': (pg) => pg.keys.revoke('key_1'),
    'keys.update': (pg) => pg.keys.update('key_1', { plan: 'pro' }),
    'keys.reroll': (pg) => pg.keys.reroll('key_1', { grace_s: 60 }),
    'portalLinks.create': (pg) => pg.portalLinks.create({ project: 'p' }),
    'webhooks.create': (pg) => pg.webhooks.create({ url: 'https://r.example/h', events: ['*'] }),
    'webhooks.update': (pg) => pg.webhooks.update('sub_1', { description: 'd' }),
    'webhooks.delete': (pg) => pg.webhooks.delete('sub_1'),
    'webhooks.rotateSecret': (pg) => pg.webhooks.rotateSecret('sub_1'),
    'webhooks.pause': (pg) => pg.webhooks.pause('sub_1'),
    'webhooks.resume': (pg) => pg.webhooks.resume('sub_1'),
    'webhooks.test': (pg) => pg.webhooks.test('sub_1'),
    'webhooks.recover': (pg) => pg.webhooks.recover('sub_1', { since: 0 }),
    'deliveries.retry': (pg) => pg.deliveries.retry('dlv_1'),
    'deliveries.redirect': (pg) => pg.deliveries.redirect('dlv_1', 'https://r.example/x'),
    'inspectors.create': (pg) => pg.inspectors.create(),
  };
  for (const [name, call] of Object.entries(calls)) {
    const f = scriptedFetch([lost(), [502, { code: 'ORIGIN_UNREACHABLE' }], [201, { id: 'x' }]]);
    await call(client(f));
    assert.equal(f.calls.length, 3, `${name}: retried after a lost answer and a 502`);
    const keys = f.calls.map((c) => c.headers.get('idempotency-key'));
    assert.match(keys[0], /^[0-9a-f-]{36}$/, `${name} sends a key`);
    assert.ok(keys.every((k) => k === keys[0]), `${name}: one key for every attempt (${keys})`);
    assert.equal(new Set(f.calls.map((c) => c.body)).size, 1, `${name}: the same body on every attempt`);
  }
  // Two calls, two keys; the caller's own key is kept.
  const f = scriptedFetch([[201, {}]]);
  const pg = client(f);
  await pg.keys.create({ project: 'p' });
  await pg.keys.create({ project: 'p' });
  await pg.keys.create({ project: 'p' }, { idempotencyKey: 'onboarding-p-key' });
  const [a, b, c] = f.calls.map((x) => x.headers.get('idempotency-key'));
  assert.notEqual(a, b);
  assert.equal(c, 'onboarding-p-key');
});

test('a key given as a header is the call\'s key: sent once per attempt, never beside a generated one', async () => {
  const f = scriptedFetch([lost(), [201]]);
  const res = await client(f).request('POST', '/orders', { body: {}, headers: { 'Idempotency-Key': 'order-42' } });
  assert.equal(res.idempotencyKey, 'order-42');
  assert.deepEqual(f.calls.map((c) => c.headers.get('idempotency-key')), ['order-42', 'order-42']);
});

test('publish gives the event an id once, so every attempt is the same event', async () => {
  const f = scriptedFetch([lost(), [202, { id: 'evt_x' }]]);
  await client(f).events.publish({ project: 'p', type: 't', data: { n: 1 } });
  const ids = f.calls.map((c) => JSON.parse(c.body).id);
  assert.equal(ids.length, 2);
  assert.match(ids[0], /^evt_[0-9a-f]{32}$/);
  assert.equal(ids[1], ids[0]);
  assert.equal(f.calls[0].headers.get('authorization'), 'Bearer org');
});

test('publish passes deliver_at through unchanged', async () => {
  const f = scriptedFetch([[202, { id: 'evt_x' }], [202, { id: 'evt_y' }]]);
  await client(f).events.publish({ project: 'p', type: 't', data: {}, deliver_at: 1800000000000 });
  await client(f).events.publish({ project: 'p', type: 't', data: {}, deliver_at: '2027-01-15T08:00:00Z' });
  assert.deepEqual(f.calls.map((c) => JSON.parse(c.body).deliver_at), [1800000000000, '2027-01-15T08:00:00Z']);
});

test('publish sends ordering_key in the body, and none when not given', async () => {
  const f = scriptedFetch([[202, { id: 'evt_x' }], [202, { id: 'evt_y' }]]);
  await client(f).events.publish({ project: 'p', type: 't', data: {}, ordering_key: 'order-42' });
  await client(f).events.publish({ project: 'p', type: 't', data: {} });
  const bodies = f.calls.map((c) => JSON.parse(c.body));
  assert.equal(bodies[0].ordering_key, 'order-42');
  assert.equal('ordering_key' in bodies[1], false);
});

test('a lost answer exhausts the attempts as RetriesExhaustedError with the key', async () => {
  const f = scriptedFetch([lost()]);
  const pg = new Postguard({ baseUrl: 'http://gw.test', adminToken: 'adm', fetch: f, clock: fakeClock(), random: () => 0, throttle: false, maxAttempts: 3 });
  const err = await pg.keys.create({ project: 'p' }).catch((e) => e);
  assert.ok(err instanceof RetriesExhaustedError, String(err));
  assert.equal(err.attempts, 3);
  assert.equal(err.idempotencyKey, f.calls[0].headers.get('idempotency-key'));
});
