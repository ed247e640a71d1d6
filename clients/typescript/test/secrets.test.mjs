// Credentials never print (issue 23 item 9): the client keeps them in ECMAScript `#private`
// fields, which console.log, util.inspect (even with showHidden) and JSON.stringify never show.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Console } from 'node:console';
import { Writable } from 'node:stream';
import util from 'node:util';
import { Postguard, PostguardClient } from '../dist/index.js';
import { fakeClock } from './fake-clock.mjs';

// Real-looking credentials: an API key as the gateway mints them, operator and origin tokens.
const SECRETS = {
  apiKey: 'pgk_Zx81mQv0Lr5Tn2Wc7Ye4Ua9Ib3Od6Pf1Gh8Jk0Sl5M',
  adminToken: 'adm_live_4f9c2e7a1b8d3f6e0a5c9b2d7e1f4a8c',
  originToken: 'org_live_9b1e5d3c7f2a8e4b6d0c1f9a3e7b5d2c',
};

/** Everything console.log would write for `value`. */
function logged(value) {
  let out = '';
  const sink = new Writable({ write(chunk, _enc, done) { out += chunk; done(); } });
  new Console({ stdout: sink, stderr: sink }).log(value);
  return out;
}

function assertNoSecret(text, what) {
  for (const [name, secret] of Object.entries(SECRETS)) {
    assert.ok(!text.includes(secret), `${what} shows ${name}: ${text}`);
    assert.ok(!text.includes(secret.slice(4, 20)), `${what} shows part of ${name}`);
  }
}

test('console.log, util.inspect and JSON.stringify of a client show no credential', async () => {
  for (const client of [new Postguard({ baseUrl: 'https://api.example.com', ...SECRETS }), new PostguardClient({ baseUrl: 'https://api.example.com', ...SECRETS })]) {
    assertNoSecret(logged(client), 'console.log');
    assertNoSecret(util.inspect(client, { depth: Infinity, showHidden: true, getters: true }), 'util.inspect');
    assertNoSecret(JSON.stringify(client), 'JSON.stringify');
    assertNoSecret(String(client), 'String()');
    assertNoSecret(Object.keys(client).join(' ') + Object.getOwnPropertyNames(client).join(' '), 'own property names');
    assert.match(logged(client), /api\.example\.com/, 'the base URL is still shown');
  }
});

test('the credentials are still sent, and an error from a failed call prints none', async () => {
  const seen = [];
  const fetch = async (_url, init) => {
    seen.push(new Headers(init.headers).get('authorization'));
    return new Response(JSON.stringify({ code: 'INVALID_API_KEY', detail: 'unknown key', request_id: 'req_1' }), {
      status: 401, headers: { 'content-type': 'application/problem+json' },
    });
  };
  const pg = new Postguard({ baseUrl: 'https://api.example.com', ...SECRETS, fetch, clock: fakeClock(), throttle: false });
  const err = await pg.me().catch((e) => e);
  assert.equal(err.status, 401);
  assert.deepEqual(seen, [`Bearer ${SECRETS.apiKey}`]);
  assertNoSecret(util.inspect(err, { depth: Infinity, showHidden: true }), 'the error');
  assertNoSecret(logged(err), 'console.log of the error');
});
