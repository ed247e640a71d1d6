// Keys and limits (docs/limits.md): a key's lifecycle (expiry, meta, overrides, reroll), several named
// policies charged all-or-none, a concurrency quota held under simultaneous slow requests and freed
// after a crashed isolate's lease, the idempotency lookup in each state, and the gateway's own
// policy. Everything against the real built worker under Miniflare and a real local origin.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startOrigin } from './support/origin.mjs';
import {
  startGateway, burst, problem, poll, sleep, bearer, cfg, ADMIN_TOKEN,
} from './support/gateway.mjs';

const QUOTA_EXCEEDED = 'https://iana.org/assignments/http-problem-types#quota-exceeded';
const HOUR = 3600;
const LEASE_S = 20;
const CONFIG = {
  origin: { timeout_ms: 8000 },
  idempotency: { lease_s: LEASE_S },
  plans: {
    roomy: { requests_per_window: 1000, window_s: 60 },
    seven: { requests_per_window: 7, window_s: 60 },
    // The same two policies, once with each binding: a burst must admit exactly the tighter one.
    first_binds: { policies: [{ name: 'a', requests: 25, window_s: HOUR }, { name: 'b', requests: 40, window_s: HOUR }] },
    second_binds: { policies: [{ name: 'a', requests: 40, window_s: HOUR }, { name: 'b', requests: 25, window_s: HOUR }] },
    layered: { policies: [{ name: 'burst', requests: 3, window_s: 5 }, { name: 'minute', requests: 5, window_s: 60 }] },
    three: { requests_per_window: 1000, window_s: 60, concurrency: 3 },
    one: { requests_per_window: 1000, window_s: 60, concurrency: 1 },
    spent: { requests_per_window: 3, window_s: HOUR },
    brief: { requests_per_window: 1000, window_s: 60, idempotency_ttl_s: 10 },
  },
};

let origin;
let gw;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

const get = (key, p, headers = {}) => gw.fetch(p, { headers: { ...bearer(key), ...headers } });
const post = (key, p, idem, headers = {}) =>
  gw.fetch(p, { method: 'POST', headers: { ...bearer(key), 'idempotency-key': idem, ...headers }, body: 'x' });
const createKey = async (body) => {
  const res = await gw.admin('POST', '/_postguard/v1/keys', { project: 'kl', ...body });
  assert.equal(res.status, 201, res.text);
  return res.json;
};
const patchKey = (id, body) => gw.admin('PATCH', `/_postguard/v1/keys/${id}`, body);
const lookup = (key, idem) => get(key, `/_postguard/v1/idempotency/${encodeURIComponent(idem)}`);
/** `"name";k=v;…` members of a structured-field list, in order. */
const members = (header = '') =>
  header.split(/,\s*/).filter(Boolean).map((m) => {
    const [name, ...params] = m.split(';');
    return { name: JSON.parse(name), ...Object.fromEntries(params.map((p) => p.split('='))) };
  });
const seenBy = (prefix) => origin.stats.find((r) => r.headers['x-postguard-key-prefix'] === prefix);

describe('1. key lifecycle', () => {
  it('expires at the second: admitted before expires_at, 401 API_KEY_EXPIRED from it on', async () => {
    const expiresAt = Date.now() + 3000;
    const k = await createKey({ plan: 'roomy', expires_at: expiresAt });
    assert.equal(k.expires_at, expiresAt);
    const me = await get(k.key, '/_postguard/v1/me');
    assert.equal(me.json.expires_at, expiresAt);
    const answers = [];
    await poll(async () => {
      const r = await get(k.key, `/kl/expiring?n=${answers.length}`);
      answers.push(r);
      return r.status !== 200;
    }, { timeout: 30000, interval: 100, message: 'the key to expire' });
    const refused = answers.at(-1);
    problem(refused, { status: 401, code: 'API_KEY_EXPIRED' });
    assert.ok(refused.at >= expiresAt, `refused at ${refused.at}, before expires_at ${expiresAt}`);
    for (const r of answers.slice(0, -1)) {
      assert.ok(r.sentAt < expiresAt, `a request sent at ${r.sentAt} was admitted after expires_at ${expiresAt}`);
    }
    assert.ok(answers.length >= 2, 'admitted before it expired');
    // It stays refused, /me included, and nothing more reached the origin.
    const forwarded = seenBy(k.prefix).length;
    problem(await get(k.key, '/kl/expiring'), { status: 401, code: 'API_KEY_EXPIRED' });
    problem(await get(k.key, '/_postguard/v1/me'), { status: 401, code: 'API_KEY_EXPIRED' });
    assert.equal(seenBy(k.prefix).length, forwarded);
  });

  it('RFC 3339 expires_at is accepted; one in the past or malformed is a 400', async () => {
    const at = new Date(Date.now() + 3_600_000);
    at.setMilliseconds(0);
    const k = await createKey({ plan: 'roomy', expires_at: at.toISOString() });
    assert.equal(k.expires_at, at.getTime());
    for (const expires_at of [Date.now() - 1000, 'tomorrow', -5]) {
      const res = await gw.admin('POST', '/_postguard/v1/keys', { project: 'kl', plan: 'roomy', expires_at });
      problem(res, { status: 400, code: 'VALIDATION_ERROR' });
    }
  });

  it('PATCH applies from the next request: expiry, plan, overrides, meta (signed to the origin)', async () => {
    const k = await createKey({ plan: 'roomy', meta: { tenant: 't1', tier: 3 } });
    const first = await get(k.key, '/kl/meta');
    assert.equal(first.status, 200);
    const seen1 = seenBy(k.prefix).at(-1);
    assert.equal(seen1.signature_ok, true, seen1.signature_error);
    assert.deepEqual(JSON.parse(Buffer.from(seen1.headers['x-postguard-key-meta'], 'base64url')), { tenant: 't1', tier: 3 });
    assert.equal(first.headers['x-ratelimit-limit'], '1000');

    const patched = await patchKey(k.id, { meta: { tenant: 't2' }, plan: 'seven', name: 'renamed' });
    assert.equal(patched.status, 200, patched.text);
    assert.deepEqual([patched.json.plan, patched.json.name, patched.json.meta], ['seven', 'renamed', { tenant: 't2' }]);
    assert.equal(patched.json.key, undefined, 'the secret is never shown again');
    const second = await get(k.key, '/kl/meta');
    assert.equal(second.headers['x-ratelimit-limit'], '7');
    assert.equal(second.headers['ratelimit-policy'], '"default";q=7;w=60');
    const seen2 = seenBy(k.prefix).at(-1);
    assert.equal(seen2.signature_ok, true, seen2.signature_error);
    assert.deepEqual(JSON.parse(Buffer.from(seen2.headers['x-postguard-key-meta'], 'base64url')), { tenant: 't2' });

    // Overrides replace the plan's numbers for this key only; null removes them (and the meta).
    assert.equal((await patchKey(k.id, { overrides: { requests_per_window: 4 }, meta: null })).status, 200);
    const third = await get(k.key, '/kl/meta');
    assert.equal(third.headers['x-ratelimit-limit'], '4');
    assert.equal(seenBy(k.prefix).at(-1).headers['x-postguard-key-meta'], undefined);
    assert.equal((await patchKey(k.id, { overrides: null })).status, 200);
    assert.equal((await get(k.key, '/kl/meta')).headers['x-ratelimit-limit'], '7');
    // Back to a roomy plan for what follows (the windows, one per policy name, carry on).
    assert.equal((await patchKey(k.id, { plan: 'roomy' })).status, 200);

    // Expiry set in the past refuses the next request; lifting it lets the key in again.
    assert.equal((await patchKey(k.id, { expires_at: Date.now() + 500 })).status, 200);
    await poll(async () => (await get(k.key, '/kl/meta')).status === 401, { timeout: 15000, interval: 100, message: 'the patched expiry' });
    assert.equal((await patchKey(k.id, { expires_at: null })).status, 200);
    assert.equal((await get(k.key, '/kl/meta')).status, 200);

    const got = await gw.admin('GET', `/_postguard/v1/keys/${k.id}`);
    assert.equal(got.json.expires_at, null);
    assert.equal(got.json.plan, 'roomy');
    assert.equal(got.json.name, 'renamed');
  });

  it('bad PATCH bodies are 400s; an unknown key is a 404; meta over 1 KiB is refused', async () => {
    const k = await createKey({ plan: 'roomy' });
    for (const body of [{ plan: 'nope' }, { meta: [1] }, { meta: { big: 'x'.repeat(1100) } }, { overrides: { requests_per_window: 0 } }, { colour: 'red' }]) {
      problem(await patchKey(k.id, body), { status: 400, code: 'VALIDATION_ERROR' });
    }
    problem(await gw.admin('POST', '/_postguard/v1/keys', { project: 'kl', plan: 'roomy', meta: { big: 'x'.repeat(1100) } }), { status: 400, code: 'VALIDATION_ERROR' });
    problem(await patchKey('key_01ARZ3NDEKTSV4RRFFQ69G5FAV', { name: 'x' }), { status: 404, code: 'NOT_FOUND' });
  });

  it('reroll: a new secret for the same id, prefix and counters; the old one works until previous_expires_at', async () => {
    const k = await createKey({ plan: 'seven' });
    assert.equal((await get(k.key, '/kl/reroll')).headers['x-ratelimit-remaining'], '6');
    const asked = Date.now();
    const res = await gw.admin('POST', `/_postguard/v1/keys/${k.id}/reroll`, { grace_s: 3 });
    assert.equal(res.status, 201, res.text);
    const r = res.json;
    assert.equal(r.id, k.id);
    assert.equal(r.prefix, k.prefix, 'the public prefix is kept');
    assert.notEqual(r.key, k.key);
    assert.equal(r.key.slice(0, 12), k.prefix);
    assert.ok(r.previous_expires_at >= asked + 3000 && r.previous_expires_at <= res.at + 3000, `previous_expires_at ${r.previous_expires_at}: 3 s after the reroll`);

    // Both work during the grace, on one budget.
    assert.equal((await get(r.key, '/kl/reroll')).headers['x-ratelimit-remaining'], '5');
    assert.equal((await get(k.key, '/kl/reroll')).headers['x-ratelimit-remaining'], '4');
    // Then the old one is refused and the new one goes on.
    await poll(async () => (await get(k.key, '/_postguard/v1/me')).status === 401, { timeout: 20000, interval: 200, message: 'the old secret to expire' });
    problem(await get(k.key, '/kl/reroll'), { status: 401, code: 'API_KEY_EXPIRED' });
    const after = await get(r.key, '/kl/reroll');
    assert.equal(after.status, 200);
    assert.equal(after.headers['x-ratelimit-remaining'], '3');
    assert.ok(Date.now() >= r.previous_expires_at);
    // A grace over 7 days is refused; revocation ends both secrets at once.
    problem(await gw.admin('POST', `/_postguard/v1/keys/${k.id}/reroll`, { grace_s: 7 * 86400 + 1 }), { status: 400, code: 'VALIDATION_ERROR' });
    const rerolledAt = Date.now();
    const againRes = await gw.admin('POST', `/_postguard/v1/keys/${k.id}/reroll`, {});
    const again = againRes.json;
    assert.ok(again.previous_expires_at >= rerolledAt + 86_400_000 && again.previous_expires_at <= againRes.at + 86_400_000, 'the default grace is 24 h');
    assert.equal((await gw.admin('DELETE', `/_postguard/v1/keys/${k.id}`)).status, 204);
    problem(await get(again.key, '/kl/reroll'), { status: 401 });
    problem(await get(r.key, '/kl/reroll'), { status: 401 });
  });

  it('every change is in the audit log as the operator\'s request, with no secret', async () => {
    const k = await createKey({ plan: 'roomy' });
    assert.equal((await patchKey(k.id, { name: 'audited' })).status, 200);
    const rr = await gw.admin('POST', `/_postguard/v1/keys/${k.id}/reroll`, {});
    assert.equal(rr.status, 201);
    const rows = await poll(async () => {
      const res = await gw.admin('GET', '/_postguard/v1/audit?limit=200');
      const mine = (res.json?.data ?? []).filter((x) => x.path.startsWith(`/_postguard/v1/keys/${k.id}`));
      return mine.length >= 2 && mine;
    }, { timeout: 15000, interval: 200, message: 'the PATCH and the reroll in the audit log' });
    assert.deepEqual(rows.map((x) => `${x.method} ${x.path} ${x.status}`).sort(), [
      `PATCH /_postguard/v1/keys/${k.id} 200`,
      `POST /_postguard/v1/keys/${k.id}/reroll 201`,
    ]);
    const text = JSON.stringify(rows);
    assert.ok(!text.includes(rr.json.key) && !text.includes(k.key) && !text.includes(ADMIN_TOKEN), 'no secret in a row');
  });
});

describe('2. several policies, charged all or none', () => {
  for (const plan of ['first_binds', 'second_binds']) {
    it(`${plan}: 3 × 25 simultaneous requests admit exactly 25; the refused ones charge no policy`, async () => {
      const k = await createKey({ plan });
      const reqs = Array.from({ length: 75 }, (_, i) => ({ path: `/kl/${plan}?i=${i}`, headers: bearer(k.key) }));
      const res = await burst(gw.url, reqs);
      const ok = res.filter((r) => r.status === 200);
      assert.deepEqual([ok.length, res.filter((r) => r.status === 429).length], [25, 50], JSON.stringify(res.map((r) => r.status)));
      assert.equal(seenBy(k.prefix).length, 25, 'the origin saw exactly 25');
      const binding = plan === 'first_binds' ? 'a' : 'b';
      const other = binding === 'a' ? 'b' : 'a';
      for (const r of ok) {
        assert.equal(r.headers['ratelimit-policy'], plan === 'first_binds' ? '"a";q=25;w=3600, "b";q=40;w=3600' : '"a";q=40;w=3600, "b";q=25;w=3600');
        const [first, second] = members(r.headers.ratelimit);
        assert.equal(first.name, binding, `the fewest remaining first: ${r.headers.ratelimit}`);
        assert.equal(second.name, other);
        assert.equal(Number(second.r) - Number(first.r), 15, 'one charge to each policy');
        assert.equal(r.headers['x-ratelimit-remaining'], first.r, 'X-RateLimit-* follow the first member');
        assert.equal(r.headers['x-ratelimit-limit'], '25');
      }
      assert.deepEqual(ok.map((r) => Number(members(r.headers.ratelimit)[0].r)).sort((a, b) => a - b), Array.from({ length: 25 }, (_, i) => i));
      for (const r of res.filter((x) => x.status === 429)) {
        const p = problem(r, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
        assert.equal(p.type, QUOTA_EXCEEDED);
        assert.deepEqual(p['violated-policies'], [binding]);
        assert.equal(members(r.headers.ratelimit)[0].name, binding, 'the refusing policy first');
        assert.ok(Number(r.headers['retry-after']) >= 1);
      }
      // The 50 refusals charged nothing: the other policy has exactly 25 used.
      const me = (await get(k.key, '/_postguard/v1/me')).json;
      const byName = Object.fromEntries(me.policies.map((p) => [p.name, p]));
      assert.equal(byName[binding].remaining, 0);
      assert.equal(byName[other].remaining, 15);
    });
  }

  it('a short and a long window: each refuses in turn, naming itself; the short one recovers', async () => {
    const k = await createKey({ plan: 'layered' });
    const res = await burst(gw.url, Array.from({ length: 4 }, (_, i) => ({ path: `/kl/layered?i=${i}`, headers: bearer(k.key) })));
    assert.deepEqual(res.map((r) => r.status).sort(), [200, 200, 200, 429]);
    const refused = res.find((r) => r.status === 429);
    const p = problem(refused, { code: 'RATE_LIMIT_EXCEEDED' });
    assert.deepEqual(p['violated-policies'], ['burst']);
    assert.ok(Number(refused.headers['retry-after']) <= 5, `Retry-After ${refused.headers['retry-after']} is the burst window's`);
    assert.equal(refused.headers['x-ratelimit-limit'], '3');
    // After the burst window, two more fit the minute; the third is the minute's refusal.
    await sleep(Number(refused.headers['retry-after']) * 1000);
    const more = [];
    for (let i = 0; i < 3; i++) more.push(await get(k.key, `/kl/layered/more?i=${i}`));
    assert.deepEqual(more.map((r) => r.status), [200, 200, 429]);
    const p2 = problem(more[2]);
    assert.deepEqual(p2['violated-policies'], ['minute']);
    assert.equal(members(more[2].headers.ratelimit)[0].name, 'minute');
    assert.ok(Number(more[2].headers['retry-after']) > 5, 'the minute window\'s Retry-After');
  });

  it('gateway endpoints have their own policy: a key that spent its API budget still reads its audit log', async () => {
    const k = await createKey({ plan: 'spent', project: 'kl-spent' });
    for (let i = 0; i < 3; i++) assert.equal((await get(k.key, `/kl/spend/${i}`)).status, 200);
    problem(await get(k.key, '/kl/spend/3'), { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
    const rows = await poll(async () => {
      const r = await get(k.key, '/_postguard/v1/audit?path=/kl/spend/*');
      assert.equal(r.status, 200, r.text);
      return r.json.data.length >= 4 && r;
    }, { timeout: 15000, interval: 300, message: 'the audit rows, read by the spent key' });
    assert.deepEqual(members(rows.headers['ratelimit-policy'])[0].name, 'gateway');
    assert.equal((await get(k.key, '/_postguard/v1/me')).json.remaining, 0, '/me still reports the API budget');
  });
});

describe('3. the concurrency quota', () => {
  it('3 in flight at most under 3 × 13 simultaneous slow requests; the rest 429 CONCURRENCY_LIMIT_EXCEEDED', async () => {
    const k = await createKey({ plan: 'three' });
    const reqs = Array.from({ length: 39 }, (_, i) => ({ path: `/kl/slow?i=${i}`, headers: { ...bearer(k.key), 'x-demo-delay-ms': '3000' } }));
    const res = await burst(gw.url, reqs, { timeout: 60000 });
    const ok = res.filter((r) => r.status === 200);
    const refused = res.filter((r) => r.status !== 200);
    assert.ok(ok.length >= 3, `at least the quota admitted (${ok.length})`);
    for (const r of refused) {
      problem(r, { status: 429, code: 'CONCURRENCY_LIMIT_EXCEEDED' });
      assert.equal(r.headers['retry-after'], '1');
    }
    for (const r of res) {
      assert.match(r.headers['ratelimit-policy'], /"inflight";q=3;qu="concurrent-requests"/);
    }
    // Never more than 3 at the origin at once (each request's time there, as the origin saw it).
    const spans = seenBy(k.prefix).map((x) => [x.at, x.ended_at]);
    assert.equal(spans.length, ok.length);
    const peak = Math.max(...spans.map(([start]) => spans.filter(([s, e]) => s <= start && start < e).length));
    assert.ok(peak <= 3, `${peak} in flight at once`);
    // The slots are free again: three at once are admitted.
    const next = await burst(gw.url, Array.from({ length: 3 }, (_, i) => ({ path: `/kl/after?i=${i}`, headers: bearer(k.key) })));
    assert.deepEqual(next.map((r) => r.status), [200, 200, 200]);
    const me = (await get(k.key, '/_postguard/v1/me')).json;
    assert.deepEqual([me.inflight.limit, me.inflight.in_use], [3, 0]);
  });

  it('requests refused on their concurrency are charged to no window', async () => {
    const k = await createKey({ plan: 'one' });
    const res = await burst(gw.url, Array.from({ length: 6 }, (_, i) => ({ path: `/kl/one?i=${i}`, headers: { ...bearer(k.key), 'x-demo-delay-ms': '2000' } })), { timeout: 60000 });
    const admitted = res.filter((r) => r.status === 200).length;
    const me = (await get(k.key, '/_postguard/v1/me')).json;
    assert.equal(me.remaining, 1000 - admitted, `${admitted} admitted, ${res.length - admitted} refused`);
  });
});

describe('3b. a crashed isolate\'s slot', () => {
  let persistDir;
  let crashOrigin;
  before(async () => {
    persistDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-slot-'));
    crashOrigin = await startOrigin();
  });
  after(async () => {
    await crashOrigin?.kill();
    fs.rmSync(persistDir, { recursive: true, force: true });
  });

  it('is freed by its lease: held while the lease runs, then the key is admitted again', async () => {
    const vars = { POSTGUARD_CONFIG: cfg(CONFIG) };
    const a = await startGateway({ originUrl: crashOrigin.url, persistDir, vars });
    let k;
    let heldFrom;
    try {
      const res = await a.admin('POST', '/_postguard/v1/keys', { project: 'kl', plan: 'one' });
      k = res.json;
      const slow = a.fetch('/kl/crash', { headers: { ...bearer(k.key), 'x-demo-hang': '1' } }).catch(() => null);
      await poll(() => crashOrigin.stats.find((r) => r.path === '/kl/crash').length === 1, { timeout: 15000, message: 'the request at the origin' });
      heldFrom = Date.now();
      // The isolate dies with the request in flight: no record, no release, no finish.
      await a.dispose();
      await slow;
    } finally {
      await a.dispose();
    }
    const b = await startGateway({ originUrl: crashOrigin.url, persistDir, vars });
    try {
      const during = await b.fetch('/kl/after-crash', { headers: bearer(k.key) });
      if (Date.now() < heldFrom + LEASE_S * 1000) {
        problem(during, { status: 429, code: 'CONCURRENCY_LIMIT_EXCEEDED' });
      }
      const freed = await poll(async () => {
        const r = await b.fetch('/kl/after-crash', { headers: bearer(k.key) });
        return r.status === 200 && r;
      }, { timeout: (LEASE_S + 30) * 1000, interval: 500, message: 'the slot to be freed by its lease' });
      assert.ok(freed.at >= heldFrom, 'admitted again after the crash');
      assert.ok(freed.sentAt >= heldFrom + LEASE_S * 1000 - 15000, `freed ${(freed.sentAt - heldFrom) / 1000} s after the crash, the lease is ${LEASE_S} s`);
    } finally {
      await b.dispose();
    }
  });
});

describe('4. the idempotency lookup', () => {
  it('unknown, in_progress, completed and expired; scoped to the key; costs nothing', async () => {
    const k = await createKey({ plan: 'brief' });
    const other = await createKey({ plan: 'brief' });
    const idem = `order/42?x=1#%${crypto.randomUUID()}`; // visible ASCII that needs encoding in a path
    assert.deepEqual((await lookup(k.key, idem)).json, { state: 'unknown' });

    const slow = post(k.key, '/kl/lookup', idem, { 'x-demo-delay-ms': '3000' });
    const inProgress = await poll(async () => {
      const r = await lookup(k.key, idem);
      return r.json.state === 'in_progress' && r;
    }, { timeout: 10000, interval: 100, message: 'the lookup to see the request in flight' });
    assert.match(inProgress.json.request_id, /^req_/);
    assert.equal(typeof inProgress.json.created_at, 'number');
    const done = await slow;
    assert.equal(done.status, 201);

    const completed = (await lookup(k.key, idem)).json;
    assert.equal(completed.state, 'completed');
    assert.equal(completed.status, 201);
    assert.equal(completed.request_id, done.headers['x-request-id']);
    assert.equal(completed.request_id, inProgress.json.request_id);
    assert.ok(completed.expires_at - completed.created_at >= 10000, 'kept for the plan\'s TTL');
    assert.deepEqual((await lookup(other.key, idem)).json, { state: 'unknown' }, 'another key never sees it');

    // Lookups are free: the budget is where the one POST left it.
    for (let i = 0; i < 5; i++) await lookup(k.key, idem);
    const me = (await get(k.key, '/_postguard/v1/me')).json;
    assert.equal(me.remaining, 999);

    // Past its TTL (10 s) the record is reported expired, never replayed.
    await poll(async () => (await lookup(k.key, idem)).json.state === 'expired', { timeout: 30000, interval: 250, message: 'expired' });
    const again = await post(k.key, '/kl/lookup', idem);
    assert.equal(again.status, 201);
    assert.equal(again.headers['idempotent-replayed'], undefined);
  });

  it('a malformed key is a 400; without an API key a 401', async () => {
    const k = await createKey({ plan: 'roomy' });
    problem(await lookup(k.key, 'x'.repeat(300)), { status: 400, code: 'IDEMPOTENCY_KEY_INVALID' });
    problem(await lookup(k.key, 'two words'), { status: 400, code: 'IDEMPOTENCY_KEY_INVALID' });
    problem(await gw.fetch('/_postguard/v1/idempotency/abc'), { status: 401 });
    problem(await gw.fetch('/_postguard/v1/idempotency/abc', { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } }));
  });
});
