// Every error the SDK throws carries a `code` (issue 35: an unset API key used to fail with
// `code` undefined): the problem's own, or the class's — the codes the Python SDK uses.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ApiError, ConfigurationError, NetworkError, Postguard, PostguardError, RetriesExhaustedError, verifyWebhook } from '../dist/index.js';
import { fakeClock } from './fake-clock.mjs';

const answer = (status, body, type = 'application/json') => async () =>
  new Response(typeof body === 'string' ? body : JSON.stringify(body), { status, headers: { 'content-type': type } });

test('a call without the API key it needs: ConfigurationError, code CLIENT_CONFIGURATION, nothing sent', async () => {
  let sent = 0;
  const fetch = async () => {
    sent += 1;
    return new Response('{}');
  };
  for (const apiKey of [undefined, '']) {
    const pg = new Postguard({ baseUrl: 'http://gw.test', apiKey, fetch, clock: fakeClock(), throttle: false });
    const err = await pg.request('POST', '/payments', { body: { amount: 100 } }).catch((e) => e);
    assert.ok(err instanceof ConfigurationError && err instanceof PostguardError, String(err));
    assert.equal(err.code, 'CLIENT_CONFIGURATION');
    assert.match(err.message, /needs the client option apiKey/);
  }
  assert.equal(sent, 0);
  assert.throws(() => new Postguard({}), (e) => e instanceof ConfigurationError && e.code === 'CLIENT_CONFIGURATION');
  assert.throws(() => verifyWebhook('{}', {}, []), (e) => e.code === 'CLIENT_CONFIGURATION');
});

test('an error answer that is not problem+json: ApiError, code HTTP_ERROR; a problem keeps its own', async () => {
  const text = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch: answer(404, 'no such thing', 'text/plain'), clock: fakeClock(), throttle: false });
  const e1 = await text.request('GET', '/missing').catch((e) => e);
  assert.ok(e1 instanceof ApiError);
  assert.deepEqual([e1.status, e1.code], [404, 'HTTP_ERROR']);
  const problem = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch: answer(404, { code: 'NOT_FOUND', detail: 'x' }), clock: fakeClock(), throttle: false });
  const e2 = await problem.request('GET', '/missing').catch((e) => e);
  assert.deepEqual([e2.status, e2.code], [404, 'NOT_FOUND']);
});

test('no answer: NetworkError NETWORK_ERROR, and the exhausted retries keep it', async () => {
  const down = async () => {
    throw new TypeError('fetch failed');
  };
  const pg = new Postguard({ baseUrl: 'http://gw.test', apiKey: 'k', fetch: down, clock: fakeClock(), random: () => 0, throttle: false, maxAttempts: 2 });
  const err = await pg.request('GET', '/x').catch((e) => e);
  assert.ok(err instanceof RetriesExhaustedError);
  assert.equal(err.code, 'NETWORK_ERROR');
  assert.ok(err.cause instanceof NetworkError);
  assert.equal(err.cause.code, 'NETWORK_ERROR');
});
