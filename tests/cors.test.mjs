// Browsers can call an API through postguard (issue 10 §7), the real built worker under Miniflare:
// a CORS preflight is not authenticated, not charged to a key and not attributed to one; it is
// forwarded to the origin by default, or answered from the `cors` configuration; the gateway's
// headers are allowed/exposed on every cross-origin answer, its own errors included. The browser
// part runs real Chromium (/usr/bin/chromium through playwright-core) on a page served from
// another local port.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import fs from 'node:fs';
import { chromium } from 'playwright-core';
import { startOrigin } from './support/origin.mjs';
import { startGateway, cfg, bearer, poll, ORIGIN_TOKEN } from './support/gateway.mjs';
import { projectRows } from './support/audit-shards.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const PLAN = { plans: { web: { requests_per_window: 50 } } };

let origin;
let page;
const gateways = [];

function startPage() {
  const server = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/html' });
    res.end('<!doctype html><title>cors</title><p>client page</p>');
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((r) => server.close(r)),
  })));
}

before(async () => {
  origin = await startOrigin({ token: ORIGIN_TOKEN });
  page = await startPage();
});
after(async () => {
  for (const g of gateways) await g.dispose();
  await page?.close();
  await origin?.kill();
});

async function gateway(extra = {}) {
  const g = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ ...PLAN, ...extra }) } });
  gateways.push(g);
  return g;
}

const preflightHeaders = (o, method = 'POST', headers = 'authorization, content-type, idempotency-key') => ({
  origin: o, 'access-control-request-method': method, 'access-control-request-headers': headers,
});

describe('preflights by default: forwarded to the origin', () => {
  it('is not authenticated, not charged, reaches the origin without key headers; Idempotency-Key is added to what the origin allows', async () => {
    const gw = await gateway();
    const { key } = await gw.createKey({ project: 'web', plan: 'web' });
    const before = (await gw.fetch('/items', { headers: bearer(key) })).headers['x-ratelimit-remaining'];
    const res = await gw.fetch('/items?x=1', { method: 'OPTIONS', headers: preflightHeaders(page.url) });
    assert.notEqual(res.status, 401, res.text);
    const seen = origin.stats.byRequestId(res.headers['x-request-id']);
    assert.ok(seen, 'the origin got the preflight');
    assert.equal(seen.method, 'OPTIONS');
    assert.equal(seen.headers['x-postguard-key-prefix'], undefined, 'no key attributed');
    assert.equal(seen.headers.origin, page.url);
    const after = (await gw.fetch('/items', { headers: bearer(key) })).headers['x-ratelimit-remaining'];
    assert.equal(Number(after), Number(before) - 1, 'the preflight cost nothing');
  });

  it("the gateway's own endpoints answer their preflights themselves", async () => {
    const gw = await gateway();
    const res = await gw.fetch('/_postguard/v1/webhooks', { method: 'OPTIONS', headers: preflightHeaders(page.url) });
    assert.equal(res.status, 204);
    assert.equal(res.headers['access-control-allow-origin'], page.url);
    assert.match(res.headers['access-control-allow-headers'], /Idempotency-Key/);
  });

  it('an error the gateway produces exposes its headers to the calling origin', async () => {
    const gw = await gateway();
    const res = await gw.fetch('/items', { headers: { origin: page.url, authorization: 'Bearer pgk_nope' } });
    assert.equal(res.status, 401);
    assert.equal(res.headers['access-control-allow-origin'], page.url);
    for (const h of ['X-Request-Id', 'X-RateLimit-Remaining', 'RateLimit', 'Retry-After', 'Idempotent-Replayed']) {
      assert.match(res.headers['access-control-expose-headers'], new RegExp(h));
    }
  });
});

describe('from real Chromium, on a page of another origin', () => {
  it('preflight then cross-origin POST: reads X-RateLimit-Remaining, and an error code', async () => {
    assert.ok(fs.existsSync(CHROMIUM), `Chromium at ${CHROMIUM}`);
    const gw = await gateway({ cors: { allowed_origins: [page.url], max_age_s: 0 } });
    const { key } = await gw.createKey({ project: 'web', plan: 'web' });
    const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox', '--disable-gpu'] });
    try {
      const tab = await browser.newPage();
      await tab.goto(page.url);
      const out = await tab.evaluate(async ({ gwUrl, apiKey }) => {
        const h = { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' };
        const ok = await fetch(`${gwUrl}/orders`, { method: 'POST', headers: { ...h, 'idempotency-key': `web-${Date.now()}` }, body: '{"n":1}' });
        const bad = await fetch(`${gwUrl}/orders`, { method: 'POST', headers: h, body: '{"n":1}' });
        const badBody = await bad.json();
        const anon = await fetch(`${gwUrl}/orders`, { method: 'GET', headers: { authorization: 'Bearer pgk_wrong' } });
        return {
          status: ok.status,
          remaining: ok.headers.get('X-RateLimit-Remaining'),
          requestId: ok.headers.get('X-Request-Id'),
          badStatus: bad.status,
          badCode: badBody.code,
          badRemaining: bad.headers.get('X-RateLimit-Remaining'),
          anonStatus: anon.status,
          anonCode: (await anon.json()).code,
        };
      }, { gwUrl: gw.url, apiKey: key });
      assert.equal(out.status, 201);
      assert.equal(out.remaining, '49', 'X-RateLimit-Remaining readable from JavaScript; the preflight cost nothing');
      assert.match(out.requestId ?? '', /^req_/);
      assert.equal(out.badStatus, 400);
      assert.equal(out.badCode, 'IDEMPOTENCY_KEY_REQUIRED', "a gateway error's code readable from JavaScript");
      assert.equal(out.badRemaining, '48');
      assert.equal(out.anonStatus, 401);
      assert.equal(out.anonCode, 'INVALID_API_KEY');
    } finally {
      await browser.close();
    }
    // Chromium's preflights reached the gateway (their audit rows), none attributed to the key.
    // Rows without a key live in the audit shards of no project (ADR 0016).
    const rows = await poll(async () => {
      const r = (await projectRows(gw, '~none')).filter((x) => x.method === 'OPTIONS');
      return r.length >= 2 ? r : undefined;
    }, { message: 'the preflights audited' });
    assert.ok(rows.every((r) => r.key_prefix === null && r.status === 204), JSON.stringify(rows));
  });

  it('an origin outside the configured list gets no CORS allowance', async () => {
    const gw = await gateway({ cors: { allowed_origins: ['http://elsewhere.example'] } });
    const res = await gw.fetch('/orders', { method: 'OPTIONS', headers: preflightHeaders(page.url) });
    assert.equal(res.status, 204);
    assert.equal(res.headers['access-control-allow-origin'], undefined);
  });
});
