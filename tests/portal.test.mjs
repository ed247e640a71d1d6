// Portal links and sessions (docs/dashboard-and-portal.md, ADR 0010) over HTTP, on the real built worker under
// Miniflare: the link's shape and expiry, single use, what a session may and may not do, and that
// the token never reaches the audit log. Also the dashboard's static files and their headers.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { startGateway, problem, poll, ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET, bearer } from './support/gateway.mjs';

let origin;
let gw;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

const uniq = (p) => `${p}-${crypto.randomBytes(4).toString('hex')}`;
const LINK_RE = /^http:\/\/127\.0\.0\.1:\d+\/_postguard\/dashboard\/#portal=(pgl_[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43})$/;

/** Projects given a live API key: a session has that key's rights, so its project needs one. */
const keyed = new Set();

async function link(project, ttl_s) {
  if (!keyed.has(project)) {
    keyed.add(project);
    await gw.createKey({ project, plan: 'trial' });
  }
  const body = { project };
  if (ttl_s !== undefined) body.ttl_s = ttl_s;
  const res = await gw.admin('POST', '/_postguard/v1/portal-links', body);
  assert.equal(res.status, 201, res.text);
  const m = LINK_RE.exec(res.json.url);
  assert.ok(m, `url ${res.json.url}`);
  assert.ok(res.json.url.startsWith(gw.url), 'the link points at the gateway itself');
  return { ...res.json, token: m[1], sentAt: res.sentAt, at: res.at };
}

function exchange(token) {
  return gw.fetch('/_postguard/v1/portal-sessions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ token }),
  });
}

async function session(project, ttl_s) {
  const l = await link(project, ttl_s);
  const res = await exchange(l.token);
  assert.equal(res.status, 201, res.text);
  return { ...res.json, link: l };
}

const as = (token) => ({ headers: bearer(token) });

describe('POST /_postguard/v1/portal-links', () => {
  it('gives a signed dashboard URL with the token in the fragment, 1 h by default', async () => {
    const l = await link(uniq('p'));
    assert.deepEqual(Object.keys(l).sort(), ['at', 'expires_at', 'sentAt', 'token', 'url']);
    assert.ok(l.expires_at >= l.sentAt + 3_600_000 && l.expires_at <= l.at + 3_600_000, `expires_at ${l.expires_at}`);
    const day = await link(uniq('p'), 86_400);
    assert.ok(day.expires_at >= day.sentAt + 86_400_000 && day.expires_at <= day.at + 86_400_000);
    const a = await link('same');
    const b = await link('same');
    assert.notEqual(a.token, b.token, 'every link is distinct');
  });

  it('refuses bad bodies with 400 VALIDATION_ERROR', async () => {
    for (const body of [
      { project: 'acme', ttl_s: 86_401 },
      { project: 'acme', ttl_s: 4 },
      { project: 'acme', ttl_s: 0 },
      { project: 'acme', ttl_s: 1.5 },
      { project: 'acme', ttl_s: '60' },
      { project: 'bad project' },
      { project: '' },
      { ttl_s: 60 },
      { project: 'acme', extra: true },
      'not json',
      [],
    ]) {
      const res = await gw.admin('POST', '/_postguard/v1/portal-links', body);
      problem(res, { status: 400, code: 'VALIDATION_ERROR' });
    }
  });

  it('is for the operator only: 401 without or with a wrong token, 403 for other credentials', async () => {
    const key = await gw.createKey({ project: uniq('k'), plan: 'trial' });
    const s = await session(uniq('s'));
    const body = { project: 'acme' };
    problem(await gw.admin('POST', '/_postguard/v1/portal-links', body, { token: null }), { status: 401, code: 'UNAUTHORIZED' });
    problem(await gw.admin('POST', '/_postguard/v1/portal-links', body, { token: 'wrong' }), { status: 401, code: 'UNAUTHORIZED' });
    problem(await gw.admin('POST', '/_postguard/v1/portal-links', body, { token: key.key }), { status: 403, code: 'FORBIDDEN' });
    problem(await gw.admin('POST', '/_postguard/v1/portal-links', body, { token: ORIGIN_TOKEN }), { status: 403, code: 'FORBIDDEN' });
    problem(await gw.admin('POST', '/_postguard/v1/portal-links', body, { token: s.session }), { status: 403, code: 'FORBIDDEN' });
    const get = await gw.admin('GET', '/_postguard/v1/portal-links');
    problem(get, { status: 405, code: 'METHOD_NOT_ALLOWED' });
  });
});

describe('POST /_postguard/v1/portal-sessions', () => {
  it('exchanges a link once for a session that ends when the link would have', async () => {
    const project = uniq('once');
    const l = await link(project, 600);
    const res = await exchange(l.token);
    assert.equal(res.status, 201, res.text);
    assert.deepEqual(Object.keys(res.json).sort(), ['expires_at', 'id', 'project', 'session']);
    assert.match(res.json.session, /^pgs_[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}$/);
    assert.match(res.json.id, /^ses_[A-Za-z0-9_-]{22}$/, 'the id the operator ends it by');
    assert.equal(res.json.project, project);
    assert.equal(res.json.expires_at, l.expires_at);
    // Single use: the same link again, now or later, is refused.
    for (let i = 0; i < 2; i++) {
      const again = problem(await exchange(l.token), { status: 401, code: 'UNAUTHORIZED' });
      assert.match(again.detail, /already been used/);
    }
  });

  it('refuses forged, malformed and expired links with 401 UNAUTHORIZED', async () => {
    const l = await link(uniq('f'));
    const [body, tag] = l.token.split('.');
    const forgedClaims = Buffer.from(JSON.stringify({ project: 'victim', exp: Date.now() + 1e6, nonce: 'x' })).toString('base64url');
    for (const token of [
      `${body}.${tag.slice(0, -2)}AA`,
      `pgl_${forgedClaims}.${tag}`,
      l.token.replace('pgl_', 'pgs_'),
      'pgl_',
      'x'.repeat(600),
    ]) {
      const p = problem(await exchange(token), { status: 401, code: 'UNAUTHORIZED' });
      if (token.length > 24) assert.ok(!p.detail.includes(token.slice(4, 24)), 'the detail does not repeat the token');
    }
    // The signed link of another deployment (another ADMIN_TOKEN) is not valid here.
    const otherAdmin = 'another-admin-token-0123456789abcdef';
    const other = await startGateway({ secrets: { ADMIN_TOKEN: otherAdmin, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET } });
    try {
      const foreign = await other.admin('POST', '/_postguard/v1/portal-links', { project: 'x' }, { token: otherAdmin });
      assert.equal(foreign.status, 201);
      problem(await exchange(foreign.json.url.split('#portal=')[1]), { status: 401, code: 'UNAUTHORIZED' });
    } finally {
      await other.dispose();
    }
    // A session is not a link.
    const s = await session(uniq('s'));
    problem(await exchange(s.session), { status: 401, code: 'UNAUTHORIZED' });
    for (const bad of ['{}', '{"token": 5}', 'nope', '{"token":"a","x":1}']) {
      const res = await gw.fetch('/_postguard/v1/portal-sessions', { method: 'POST', body: bad });
      problem(res, { status: 400, code: 'VALIDATION_ERROR' });
    }
  });

  it('expires with its ttl: the unexchanged link and the session both stop working', async () => {
    const project = uniq('ttl');
    const unused = await link(project, 5);
    const s = await session(project, 5);
    assert.equal((await gw.fetch('/_postguard/v1/audit', as(s.session))).status, 200);
    await poll(async () => Date.now() > s.expires_at + 50, { timeout: 8000, message: 'the link to expire' });
    const p = problem(await exchange(unused.token), { status: 401, code: 'UNAUTHORIZED' });
    assert.match(p.detail, /expired/);
    const late = problem(await gw.fetch('/_postguard/v1/audit', as(s.session)), { status: 401, code: 'UNAUTHORIZED' });
    assert.match(late.detail, /expired/);
    problem(await gw.fetch('/_postguard/v1/me', as(s.session)), { status: 401, code: 'UNAUTHORIZED' });
  });
});

describe('a portal session', () => {
  it('reads and manages its own project exactly where the project key may', async () => {
    const project = uniq('mine');
    const other = uniq('theirs');
    const key = await gw.createKey({ project, plan: 'trial' });
    const otherKey = await gw.createKey({ project: other, plan: 'trial' });
    const mine = await gw.fetch('/orders', { headers: { ...bearer(key.key), 'user-agent': 'mine-agent' } });
    const theirs = await gw.fetch('/orders', { headers: { ...bearer(otherKey.key), 'user-agent': 'theirs-agent' } });
    assert.equal(mine.status, 200);
    assert.equal(theirs.status, 200);
    const s = await session(project);

    const me = await gw.fetch('/_postguard/v1/me', as(s.session));
    assert.equal(me.status, 200, me.text);
    assert.deepEqual(me.json, { project, expires_at: s.expires_at });

    const own = await poll(async () => {
      const r = await gw.fetch(`/_postguard/v1/audit?request_id=${mine.headers['x-request-id']}`, as(s.session));
      return r.json?.data?.length === 1 && r;
    }, { message: 'the own row in the audit log' });
    assert.equal(own.json.data[0].project, project);
    const foreign = await gw.fetch(`/_postguard/v1/audit?request_id=${theirs.headers['x-request-id']}`, as(s.session));
    assert.equal(foreign.status, 200);
    assert.deepEqual(foreign.json.data, [], "another project's rows are not visible");
    // ?project= is the operator's: refused, never widened.
    problem(await gw.fetch(`/_postguard/v1/audit?project=${other}`, as(s.session)), { status: 400, code: 'VALIDATION_ERROR' });
    const stats = await gw.fetch(`/_postguard/v1/stats?days=1&project=${other}`, as(s.session));
    problem(stats, { status: 400, code: 'VALIDATION_ERROR' });
    const ownStats = await gw.fetch('/_postguard/v1/stats?days=1', as(s.session));
    assert.equal(ownStats.status, 200);
    assert.ok(ownStats.json.top_paths.some((p) => p.path === '/orders'));

    // Webhooks: a subscription made with the session is the project's, seen with its key.
    const sub = await gw.admin('POST', '/_postguard/v1/webhooks', { url: 'https://hooks.example.com/x', events: ['*'] }, { token: s.session });
    assert.equal(sub.status, 201, sub.text);
    const byKey = await gw.admin('GET', `/_postguard/v1/webhooks/${sub.json.id}`, undefined, { token: key.key });
    assert.equal(byKey.status, 200);
    problem(await gw.admin('GET', `/_postguard/v1/webhooks/${sub.json.id}`, undefined, { token: otherKey.key }), { status: 404, code: 'NOT_FOUND' });
    assert.equal((await gw.fetch('/_postguard/v1/deliveries', as(s.session))).status, 200);
    const rotated = await gw.admin('POST', `/_postguard/v1/webhooks/${sub.json.id}/rotate-secret`, undefined, { token: s.session });
    assert.equal(rotated.status, 200, rotated.text);
    assert.equal((await gw.admin('DELETE', `/_postguard/v1/webhooks/${sub.json.id}`, undefined, { token: s.session })).status, 204);
  });

  it('cannot use operator or origin endpoints (403) nor reach the origin (401 INVALID_API_KEY)', async () => {
    const s = await session(uniq('limits'));
    const before = origin.stats.total;
    problem(await gw.fetch('/_postguard/v1/keys', as(s.session)), { status: 403, code: 'FORBIDDEN' });
    problem(await gw.admin('POST', '/_postguard/v1/keys', { project: s.project, plan: 'trial' }, { token: s.session }), { status: 403, code: 'FORBIDDEN' });
    problem(await gw.admin('POST', '/_postguard/v1/portal-links', { project: 'other' }, { token: s.session }), { status: 403, code: 'FORBIDDEN' });
    problem(await gw.admin('POST', '/_postguard/v1/events', { project: s.project, type: 'x', data: {} }, { token: s.session }), { status: 403, code: 'FORBIDDEN' });
    for (const method of ['GET', 'POST']) {
      const res = await gw.fetch('/orders', { method, headers: { ...bearer(s.session), 'idempotency-key': 'k1' }, body: method === 'POST' ? '{}' : undefined });
      problem(res, { status: 401, code: 'INVALID_API_KEY' });
    }
    assert.equal(origin.stats.total, before, 'nothing was forwarded');
    // A forged session (claims of another project under a stolen signature) is refused.
    const [, tag] = s.session.split('.');
    const forged = `pgs_${Buffer.from(JSON.stringify({ project: 'victim', exp: Date.now() + 1e6, nonce: 'x' })).toString('base64url')}.${tag}`;
    problem(await gw.fetch('/_postguard/v1/audit', as(forged)), { status: 401, code: 'UNAUTHORIZED' });
    problem(await gw.fetch('/_postguard/v1/webhooks', as(forged)), { status: 401, code: 'UNAUTHORIZED' });
  });

  it('leaves no link token or session in the audit log', async () => {
    const project = uniq('secret');
    const l = await link(project);
    const res = await exchange(l.token);
    assert.equal(res.status, 201);
    const sess = res.json.session;
    const used = await gw.fetch('/_postguard/v1/audit', as(sess));
    assert.equal(used.status, 200);
    // Every row the operator can see, after the exchange's and the session's rows are written.
    const rows = await poll(async () => {
      const r = await gw.admin('GET', `/_postguard/v1/audit?request_id=${used.headers['x-request-id']}`);
      if (r.json?.data?.length !== 1) return false;
      const all = await gw.admin('GET', '/_postguard/v1/audit?limit=200'); // newest first: all of this test's rows
      return all.json.data;
    }, { message: 'the session request in the audit log' });
    const text = JSON.stringify(rows);
    for (const secret of [l.token, l.token.split('.')[1], sess, sess.split('.')[1]]) {
      assert.ok(!text.includes(secret), 'no token or signature in any audit row');
    }
    const exchangeRow = rows.find((r) => r.request_id === res.headers['x-request-id']);
    assert.ok(exchangeRow, 'the exchange itself is audited');
    assert.equal(exchangeRow.path, '/_postguard/v1/portal-sessions');
    const sessionRow = rows.find((r) => r.request_id === used.headers['x-request-id']);
    assert.equal(sessionRow.project, project, "a session's requests belong to its project");
    assert.equal(sessionRow.key_prefix, null, 'and to no key');
  });
});

describe('GET /_postguard/dashboard/', () => {
  it('serves the page and its assets with the security headers', async () => {
    const page = await gw.fetch('/_postguard/dashboard/');
    assert.equal(page.status, 200);
    assert.match(page.headers['content-type'], /^text\/html/);
    assert.match(page.text, /<script src="app.js" defer><\/script>/);
    assert.ok(!/<script>|<script [^>]*>[^<]/.test(page.text), 'no inline script');
    assert.ok(!/\sstyle=|<style/.test(page.text), 'no inline style');
    for (const p of ['/_postguard/dashboard/', '/_postguard/dashboard/app.js', '/_postguard/dashboard/app.css', '/_postguard/dashboard/favicon.svg']) {
      const res = await gw.fetch(p);
      assert.equal(res.status, 200, p);
      const csp = res.headers['content-security-policy'] ?? '';
      for (const d of ["default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'", "require-trusted-types-for 'script'"]) {
        assert.ok(csp.split(/;\s*/).includes(d), `${p}: CSP has ${d}: ${csp}`);
      }
      assert.ok(!/unsafe-inline|unsafe-eval/.test(csp), `${p}: no unsafe-*`);
      assert.equal(res.headers['x-content-type-options'], 'nosniff', p);
      assert.equal(res.headers['referrer-policy'], 'no-referrer', p);
    }
    const js = await gw.fetch('/_postguard/dashboard/app.js');
    assert.match(js.headers['content-type'], /javascript/);
    assert.ok(!/\binnerHTML\b|\bouterHTML\b|insertAdjacentHTML|document\.write|\beval\(|new Function/.test(js.text), 'the bundle has no HTML-string sinks and no eval');
    const bare = await gw.fetch('/_postguard/dashboard');
    assert.equal(bare.status, 307);
    assert.equal(bare.headers.location, '/_postguard/dashboard/');
  });

  it('answers a missing dashboard file with 404 problem+json, without a key', async () => {
    const res = await gw.fetch('/_postguard/dashboard/missing.js');
    problem(res, { status: 404, code: 'NOT_FOUND' });
    assert.equal(res.headers['x-content-type-options'], 'nosniff');
  });
});
