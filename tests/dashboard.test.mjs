// The dashboard in a real browser (Debian's Chromium driven by playwright-core) against the real
// built worker under Miniflare, the real demo origin and real webhook receivers, with real data:
// portal-link sign-in, the 30-day chart against what the test sent, the audit log, Retry and
// Redirect of dead-lettered deliveries, a subscription's secret shown once, revoking a key as the
// operator, hostile strings rendered as text, an axe-core scan, and a 375 px wide viewport.
// Screenshots of every view go to target/screenshots/ (and to docs/screenshots/ with
// UPDATE_SCREENSHOTS=1).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, cfg, bearer, ROOT, ADMIN_TOKEN, ORIGIN_TOKEN } from './support/gateway.mjs';

const require = createRequire(import.meta.url);
const AXE = fs.readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const SHOTS = path.join(ROOT, 'target', 'screenshots');
const DOC_SHOTS = path.join(ROOT, 'docs', 'screenshots');

// Hostile strings: if any of them ran, window.__pwned would be set or a dialog would open.
const XSS_UA = '<img src=x onerror="window.__pwned=1;alert(1)"><script>window.__pwned=2</script>';
const XSS_DATA = { note: '<img src=x onerror="window.__pwned=3;alert(3)">', html: '<script>window.__pwned=4;alert(4)</script>' };

const CONFIG = {
  webhooks: { schedule_s: [1], timeout_ms: 2000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 100000 } },
};

let origin;
let gw;
let browser;
let receiverA;
let receiverB;
const project = `shop-${crypto.randomBytes(3).toString('hex')}`;
let key;
const sent = { requests: 0, errors: 0, server: 0 };
/** axe findings (of any impact; none may be serious or critical) per view, printed at the end. */
const axeFindings = {};
const ids = {};

/** A request of the project (its key, or the origin publishing for it): counted as sent. */
async function forProject(method, p, { token, body, headers = {} } = {}) {
  const res = await gw.admin(method, p, body, { token: token ?? key.key, headers });
  sent.requests += 1;
  if (res.status >= 400) sent.errors += 1;
  if (res.status >= 500) sent.server += 1;
  return res;
}

async function shot(page, name) {
  fs.mkdirSync(SHOTS, { recursive: true });
  const file = path.join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  if (process.env.UPDATE_SCREENSHOTS) {
    fs.mkdirSync(DOC_SHOTS, { recursive: true });
    fs.copyFileSync(file, path.join(DOC_SHOTS, `${name}.png`));
  }
}

async function portalUrl(ttl_s = 3600) {
  const res = await gw.admin('POST', '/_postguard/v1/portal-links', { project, ttl_s });
  assert.equal(res.status, 201, res.text);
  return res.json.url;
}

/** A page that records everything that must never happen: dialogs, CSP violations, page errors. */
async function newPage(context) {
  const page = await context.newPage();
  const trouble = [];
  page.on('dialog', (d) => {
    trouble.push(`dialog: ${d.message()}`);
    void d.dismiss();
  });
  page.on('pageerror', (e) => trouble.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') trouble.push(`console error: ${m.text()}`);
  });
  await page.addInitScript(() => {
    window.__violations = [];
    document.addEventListener('securitypolicyviolation', (e) => window.__violations.push(`${e.violatedDirective} ${e.blockedURI}`));
  });
  page.trouble = trouble;
  return page;
}

async function assertNothingRan(page) {
  assert.equal(await page.evaluate(() => window.__pwned), undefined, 'no injected script ran');
  assert.deepEqual(await page.evaluate(() => window.__violations), [], 'no CSP violation');
  assert.deepEqual(page.trouble, [], 'no dialog, page error or console error');
}

async function axe(page, label) {
  if (!(await page.evaluate(() => typeof window.axe === 'object'))) await page.evaluate(AXE);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }));
  const bad = result.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  assert.deepEqual(
    bad.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`),
    [],
    `axe on ${label}`,
  );
  return result.violations.map((v) => `${v.id} (${v.impact})`);
}

/** How many attempts a delivery has had: its first one may already have been retried (a timeout on a loaded machine). */
async function attemptsMade(id) {
  const res = await gw.admin('GET', `/_postguard/v1/deliveries/${id}`, undefined, { token: key.key });
  assert.equal(res.status, 200, res.text);
  return res.json.attempts.length;
}

/** Waits for `locator`; on failure says what the page showed instead. */
async function shown(page, locator) {
  try {
    await locator.waitFor({ timeout: 15000 });
  } catch (e) {
    throw new Error(`${e.message}\npage: ${await page.locator('main').textContent()}`);
  }
  return locator.textContent();
}

async function view(page, name) {
  await page.getByRole('link', { name, exact: true }).click();
  await page.getByRole('heading', { level: 1, name }).waitFor();
}

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  receiverA = await startReceiver({ behaviour: () => ({ status: 400, body: 'not yet' }) });
  receiverB = await startReceiver();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
  key = await gw.createKey({ project, plan: 'big', name: 'shop backend' });

  // Webhooks first: a subscription to a receiver that refuses (400 dead-letters at once) and two
  // events, one of them carrying hostile strings.
  const sub = await forProject('POST', '/_postguard/v1/webhooks', { body: { url: `${receiverA.url}/hooks`, events: ['*'], description: '<b>bold?</b>' } });
  assert.equal(sub.status, 201, sub.text);
  receiverA.addSecret(sub.json.secret);
  for (const [name, data] of [['retry', XSS_DATA], ['redirect', { id: 'ord_2' }]]) {
    const ev = await forProject('POST', '/_postguard/v1/events', { token: ORIGIN_TOKEN, body: { project, type: `order.${name}`, data } });
    assert.equal(ev.status, 202, ev.text);
    ids[`${name}Event`] = ev.json.id;
  }
  const dead = await poll(async () => {
    const r = await gw.admin('GET', '/_postguard/v1/deliveries?status=dead_letter', undefined, { token: key.key });
    sent.requests += 1;
    return r.json?.data?.length === 2 && r.json.data;
  }, { timeout: 20000, interval: 250, message: 'two dead-lettered deliveries' });
  ids.retryDelivery = dead.find((d) => d.event_id === ids.retryEvent).id;
  ids.redirectDelivery = dead.find((d) => d.event_id === ids.redirectEvent).id;

  // Traffic: successes, 5xx from the origin, a 4xx from the gateway, a hostile user agent.
  for (let i = 0; i < 4; i++) assert.equal((await forProject('GET', `/orders/${i}`)).status, 200);
  for (let i = 0; i < 2; i++) assert.equal((await forProject('GET', '/orders/fail', { headers: { 'x-demo-status': '503' } })).status, 503);
  assert.equal((await forProject('POST', '/orders', { body: {} })).status, 400);
  const hostile = await forProject('GET', '/orders/hostile', { headers: { 'user-agent': XSS_UA } });
  assert.equal(hostile.status, 200);
  ids.hostileRequest = hostile.headers['x-request-id'];

  // Everything written: the operator (who belongs to no project) sees exactly what was sent.
  await poll(async () => {
    const s = await gw.admin('GET', `/_postguard/v1/stats?days=1&project=${project}`);
    const today = s.json?.days?.[0];
    return today?.requests === sent.requests && today;
  }, { timeout: 15000, interval: 200, message: `${sent.requests} requests of ${project} in the audit log` });
});

after(async () => {
  console.log(`# axe findings per view (none may be serious or critical): ${JSON.stringify(axeFindings)}`);
  await browser?.close();
  await receiverA?.close();
  await receiverB?.close();
  await gw?.dispose();
  await origin?.kill();
});

describe('the dashboard, signed in with a portal link', () => {
  let context;
  let page;

  before(async () => {
    context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    page = await newPage(context);
  });
  after(async () => context?.close());

  it('exchanges the link, removes it from the address bar and keeps the session in sessionStorage', async () => {
    const url = await portalUrl();
    const token = url.split('#portal=')[1];
    const files = new Map();
    page.on('response', async (r) => {
      if (new URL(r.url()).pathname.startsWith('/_postguard/dashboard/')) files.set(r.url(), await r.body().catch(() => Buffer.alloc(0)));
    });
    await page.goto(url);
    await page.getByRole('heading', { level: 1, name: 'Statistics' }).waitFor();
    assert.ok(!page.url().includes('portal='), `the fragment is gone: ${page.url()}`);
    // A new page's about:blank, then the dashboard; the exchange replaced its entry, adding none.
    assert.equal(await page.evaluate(() => history.length), 2, 'no history entry holds the link');
    const stored = JSON.parse(await page.evaluate(() => sessionStorage.getItem('postguard.credential')));
    assert.equal(stored.kind, 'session');
    assert.equal(stored.project, project);
    assert.match(stored.token, /^pgs_/);
    assert.equal(await page.evaluate(() => localStorage.length), 0, 'nothing in localStorage');
    assert.deepEqual(await context.cookies(), [], 'no cookies');
    for (const name of ['Statistics', 'Audit log', 'Webhooks', 'Deliveries']) {
      assert.equal(await page.getByRole('link', { name, exact: true }).count(), 1, `a link named ${name}`);
    }
    assert.equal(await page.getByRole('link', { name: 'Keys', exact: true }).count(), 0, 'Keys is the operator’s');
    // The link was single use: opening it again fails visibly.
    const again = await newPage(context);
    await again.goto(url);
    await again.getByText(/already been used/).waitFor();
    await again.close();
    assert.ok(token.length > 40);
    // What the page loads, gzipped (as a CDN would send it).
    const gz = [...files.values()].reduce((n, b) => n + zlib.gzipSync(b).length, 0);
    const raw = [...files.values()].reduce((n, b) => n + b.length, 0);
    console.log(`# dashboard transfer: ${files.size} files, ${raw} bytes, ${gz} bytes gzip: ${[...files.keys()].map((u) => new URL(u).pathname).join(' ')}`);
    assert.ok(files.size >= 3, 'page, script and stylesheet loaded');
  });

  // The page's first call in the project is GET /stats (the exchange belongs to no project),
  // and a request's own audit row is written after it is answered: the counts are exact.
  it('shows the 30-day chart with today’s counts matching what the test sent', async () => {
    await page.locator('.chart canvas').first().waitFor();
    assert.equal(await page.locator('.chart .u-legend').count(), 1);
    const today = new Date().toISOString().slice(0, 10);
    assert.equal(await page.locator('details.days tbody tr').count(), 30, 'one row per day, 30 days');
    const cells = await page.locator(`tr[data-date="${today}"] td`).allTextContents();
    assert.deepEqual(cells.map(Number), [sent.requests, sent.errors, sent.server], `today: ${cells}`);
    const summary = await page.locator('dl.fields').first().textContent();
    assert.match(summary, new RegExp(`requests${sent.requests}`));
    assert.match(summary, new RegExp(`error share${((sent.errors / sent.requests) * 100).toFixed(1)} %`));
    assert.match(summary, /p50 latency\d+ ms/);
    const top = await page.getByRole('table', { name: 'Top endpoints' }).textContent();
    assert.match(top, /\/orders\/fail2/);
    await page.locator('details.days summary').click();
    await shot(page, 'statistics');
    axeFindings.statistics = await axe(page, 'Statistics');
  });

  it('finds a request by request_id; its hostile user agent is shown as text', async () => {
    await view(page, 'Audit log');
    await page.getByLabel('Request ID').fill(ids.hostileRequest);
    await page.getByRole('button', { name: 'Search' }).click();
    await page.getByText('1 entry', { exact: true }).waitFor();
    const row = page.locator(`tr[data-request-id="${ids.hostileRequest}"]`);
    await row.waitFor();
    assert.equal(await page.locator('tr[data-request-id]').count(), 1);
    await page.getByRole('button', { name: `Details of ${ids.hostileRequest}` }).click();
    const detail = page.locator('tr.detail:not([hidden])');
    await detail.getByText(XSS_UA, { exact: true }).waitFor();
    assert.equal(await page.locator('tr.detail img, tr.detail script').count(), 0, 'no element was made from the string');
    const text = await detail.textContent();
    for (const f of ['request_id', 'time', 'method', 'path', 'status', 'response_bytes', 'response_time_ms', 'client_ip', 'user_agent', 'key_prefix', 'project', 'idempotency_key', 'replayed', 'rate_limit_remaining']) {
      assert.ok(text.includes(f), `the expanded row shows ${f}`);
    }
    await shot(page, 'audit-log');
    axeFindings.audit = await axe(page, 'Audit log');
    await assertNothingRan(page);
  });

  it('filters the audit log by 5xx', async () => {
    await page.getByLabel('Request ID').fill('');
    await page.getByLabel('Status').selectOption('5xx');
    await page.getByRole('button', { name: 'Search' }).click();
    await poll(async () => (await page.locator('tr[data-request-id]').count()) === sent.server, { message: `${sent.server} rows of 5xx` });
    const statuses = await page.locator('tr[data-request-id] .badge').allTextContents();
    assert.deepEqual(statuses, Array(sent.server).fill('503'));
  });

  it('filters by path with * and by time range, newest first', async () => {
    await page.getByLabel('Status').selectOption('');
    await page.getByLabel('Path').fill('/orders/*');
    await page.getByRole('button', { name: 'Search' }).click();
    await page.getByText('7 entries', { exact: true }).waitFor();
    const paths = await page.locator('tr[data-request-id] td:nth-child(3)').allTextContents();
    assert.ok(paths.every((p) => p.startsWith('/orders/')), paths.join(' '));
    const times = await page.locator('tr[data-request-id] td:nth-child(1)').allTextContents();
    assert.deepEqual(times, [...times].sort().reverse(), 'newest first');
    await page.getByLabel('Since (UTC)').fill('2099-01-01T00:00:00');
    await page.getByRole('button', { name: 'Search' }).click();
    await page.getByText('No requests match.').waitFor();
    await page.getByLabel('Since (UTC)').fill('');
    await page.getByLabel('Path').fill('');
  });

  it('opens a dead-lettered delivery, shows its payload as text, and Retry delivers it', async () => {
    await view(page, 'Deliveries');
    // The unfiltered list first, its row marked: the filtered list replaces it, and a row
    // opened before that would be thrown away with it.
    const unfiltered = page.locator(`tr[data-delivery-id="${ids.retryDelivery}"]`);
    await unfiltered.waitFor();
    await unfiltered.evaluate((tr) => (tr.dataset.stale = '1'));
    await page.getByLabel('Status').selectOption('dead_letter');
    await page.getByRole('button', { name: 'Filter' }).click();
    const row = page.locator(`tr[data-delivery-id="${ids.retryDelivery}"]:not([data-stale])`);
    await row.waitFor();
    await page.getByRole('button', { name: `Details of delivery ${ids.retryDelivery}` }).click();
    const payload = page.getByLabel('Payload');
    await payload.waitFor();
    const shown = JSON.parse(await payload.textContent());
    assert.deepEqual(shown.data, XSS_DATA, 'the payload, exactly, as text');
    assert.equal(shown.id, ids.retryEvent);
    const attempts = page.getByRole('region', { name: 'Attempts' });
    assert.match(await attempts.textContent(), /400/);
    const made = await attemptsMade(ids.retryDelivery);
    await receiverA.setBehaviour(() => ({ status: 200 }));
    await page.getByRole('button', { name: `Retry delivery ${ids.retryDelivery}` }).click();
    await row.locator('.badge').getByText('delivered', { exact: true }).waitFor({ timeout: 30000 });
    await page.getByText(`Retry: attempt ${made + 1} answered HTTP 200; the delivery is delivered.`).waitFor();
    const got = receiverA.forEvent(ids.retryEvent).filter((r) => r.answered === 200);
    assert.equal(got.length, 1, 'the receiver got it once more');
    assert.ok(got[0].verified, 'signed');
    await shot(page, 'deliveries');
    axeFindings.deliveries = await axe(page, 'Deliveries');
    await assertNothingRan(page);
  });

  it('redirects a delivery to a second receiver', async () => {
    await page.getByRole('button', { name: `Details of delivery ${ids.retryDelivery}` }).click(); // close the first
    const row = page.locator(`tr[data-delivery-id="${ids.redirectDelivery}"]`);
    await page.getByRole('button', { name: `Details of delivery ${ids.redirectDelivery}` }).click();
    const form = page.getByRole('form', { name: `Redirect delivery ${ids.redirectDelivery}` });
    await form.getByLabel('Send once to URL').fill(`${receiverB.url}/elsewhere`);
    const made = await attemptsMade(ids.redirectDelivery);
    await form.getByRole('button', { name: 'Redirect' }).click();
    await page.getByText(new RegExp(`Redirect: attempt ${made + 1} answered HTTP 200`)).waitFor({ timeout: 30000 });
    const got = await receiverB.waitFor((rs) => rs.find((r) => r.headers['webhook-id'] === ids.redirectEvent), { message: 'the redirected delivery' });
    assert.equal(got.path, '/elsewhere');
    assert.equal(await row.locator('.badge').textContent(), 'dead_letter', 'the original delivery keeps its status');
  });

  it('creates a subscription and shows its secret once, with a copy button', async () => {
    await view(page, 'Webhooks');
    await page.getByText('<b>bold?</b>', { exact: true }).waitFor(); // a description is text
    await page.getByLabel('Endpoint URL').fill(`${receiverB.url}/new`);
    await page.getByLabel('Events').fill('order.*, refund.created');
    await page.getByLabel('Description').fill('created in the browser');
    await page.getByRole('button', { name: 'Create subscription' }).click();
    const secret = page.locator('.secret-value');
    await secret.waitFor();
    const value = await secret.textContent();
    assert.match(value, /^whsec_[A-Za-z0-9+/]+={0,2}$/);
    assert.equal(await page.getByRole('button', { name: /^Copy signing secret/ }).count(), 1);
    const list = await gw.admin('GET', '/_postguard/v1/webhooks', undefined, { token: key.key });
    const created = list.json.data.find((s) => s.url === `${receiverB.url}/new`);
    assert.deepEqual(created?.events, ['order.*', 'refund.created']);
    assert.equal(created.secret, undefined);
    await page.locator(`tr[data-subscription-id="${created.id}"]`).waitFor();
    await shot(page, 'webhooks');
    axeFindings.webhooks = await axe(page, 'Webhooks');
    // Shown once: the next visit of the view has no secret.
    await view(page, 'Statistics');
    await view(page, 'Webhooks');
    await page.locator(`tr[data-subscription-id="${created.id}"]`).waitFor();
    assert.equal(await page.locator('.secret-value').count(), 0);
    assert.ok(!(await page.content()).includes(value), 'the secret is nowhere on the page any more');
    await assertNothingRan(page);
  });

  it('pauses and resumes a subscription, sends a test ping and recovers failed deliveries (CONTRACT §11)', async () => {
    await view(page, 'Webhooks');
    const url = `${receiverB.url}/new`;
    const list = await gw.admin('GET', '/_postguard/v1/webhooks', undefined, { token: key.key });
    const subB = list.json.data.find((s) => s.url === url);
    const subA = list.json.data.find((s) => s.url === `${receiverA.url}/hooks`);
    const row = page.locator(`tr[data-subscription-id="${subB.id}"]`);
    await page.getByRole('button', { name: `Send test ping to ${url}` }).click();
    await page.getByText(new RegExp(`Test ping to ${url}: HTTP 200 in \\d+ ms`)).waitFor();
    assert.ok(receiverB.requests.some((r) => r.json?.type === 'postguard.ping' && r.path === '/new'));
    await page.getByRole('button', { name: `Pause the subscription to ${url}` }).click();
    await row.getByRole('cell', { name: 'paused', exact: true }).waitFor();
    const paused = await gw.admin('GET', `/_postguard/v1/webhooks/${subB.id}`, undefined, { token: key.key });
    assert.equal(paused.json.state, 'paused');
    await page.getByRole('button', { name: `Resume the subscription to ${url}` }).click();
    await row.getByRole('cell', { name: 'active', exact: true }).waitFor();
    const failed = await gw.admin('GET', '/_postguard/v1/deliveries?status=dead_letter', undefined, { token: key.key });
    const n = failed.json.data.filter((d) => d.subscription_id === subA.id).length;
    await page.getByRole('button', { name: `Recover failed deliveries of the last 14 days to ${receiverA.url}/hooks` }).click();
    await page.getByText(`Recover for ${receiverA.url}/hooks done: ${n} of ${n} re-sent, 0 failed.`).waitFor({ timeout: 30000 });
    await assertNothingRan(page);
  });
});

describe('the dashboard, signed in as the operator', () => {
  it('signs in with ADMIN_TOKEN, creates a key (shown once) and revokes it', async () => {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await newPage(context);
    try {
      await page.goto(`${gw.url}/_postguard/dashboard/`);
      await page.getByRole('heading', { level: 1, name: 'Sign in' }).waitFor();
      axeFindings.signIn = await axe(page, 'Sign in');
      await shot(page, 'sign-in');
      await page.getByLabel('API key or operator token').fill(ADMIN_TOKEN);
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.getByText('Operator (every project)').waitFor();
      assert.ok(!page.url().includes(ADMIN_TOKEN), 'the token is not in the URL');
      await view(page, 'Keys');
      const form = page.getByRole('form', { name: 'New API key' });
      await form.getByLabel('Project').fill(project);
      await form.getByLabel('Plan').fill('big');
      await form.getByLabel('Name').fill('to revoke');
      await form.getByRole('button', { name: 'Create key' }).click();
      const newKey = await shown(page, page.locator('.secret-value'));
      assert.match(newKey, /^pgk_[A-Za-z0-9_-]{43}$/);
      assert.equal((await gw.fetch('/orders/1', { headers: bearer(newKey) })).status, 200, 'the new key works');
      const prefix = newKey.slice(0, 12);
      await page.getByRole('button', { name: `Revoke key ${prefix}` }).click();
      await page.getByText(`Key ${prefix}… revoked.`).waitFor();
      await page.locator('tr', { hasText: `${prefix}…` }).filter({ hasText: 'revoked' }).waitFor();
      assert.equal((await gw.fetch('/orders/1', { headers: bearer(newKey) })).status, 401, 'the revoked key is refused');
      // Per-key statistics from the list.
      await page.getByRole('link', { name: `Statistics of key ${key.prefix}` }).click();
      await page.getByRole('heading', { level: 2, name: new RegExp(`key ${key.prefix}`) }).waitFor();
      await page.getByRole('link', { name: 'Keys', exact: true }).click();
      await page.getByRole('heading', { level: 1, name: 'Keys' }).waitFor();
      await shot(page, 'keys');
      axeFindings.keys = await axe(page, 'Keys');
      // A portal link from the operator's view.
      const portal = page.getByRole('form', { name: 'Portal link' });
      await portal.getByLabel('Project').fill(project);
      await portal.getByRole('button', { name: 'Create portal link' }).click();
      assert.match(await page.locator('.secret-value').textContent(), /\/_postguard\/dashboard\/#portal=pgl_/);
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });
});

describe('the dashboard, signed in with an API key', () => {
  it('shows the key’s current limit state and ends the session on sign-out', async () => {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await newPage(context);
    try {
      await page.goto(`${gw.url}/_postguard/dashboard/`);
      await page.getByLabel('API key or operator token').fill(key.key);
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.getByText(`Project ${project} — API key ${key.prefix}…`).waitFor();
      const limit = page.locator('section', { has: page.getByRole('heading', { name: 'This key’s limit' }) });
      await limit.waitFor();
      const text = await limit.textContent();
      assert.match(text, new RegExp(`plan\\s*big`));
      assert.match(text, /limit\s*100000 requests per 60 s/);
      const remaining = Number(/remaining\s*(\d+)/.exec(text)?.[1]);
      assert.ok(remaining > 0 && remaining <= 100000, `remaining ${remaining}`);
      assert.equal(await page.getByRole('link', { name: 'Keys', exact: true }).count(), 0);
      await page.getByRole('button', { name: 'Sign out' }).click();
      await page.getByRole('heading', { level: 1, name: 'Sign in' }).waitFor();
      assert.equal(await page.evaluate(() => sessionStorage.length), 0, 'the credential is gone');
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });
});

describe('the dashboard at 375 px wide', () => {
  it('every view fits the viewport (wide tables scroll inside their own region)', async () => {
    const context = await browser.newContext({ viewport: { width: 375, height: 740 }, deviceScaleFactor: 1 });
    const page = await newPage(context);
    try {
      await page.goto(await portalUrl());
      for (const name of ['Statistics', 'Audit log', 'Webhooks', 'Deliveries']) {
        await view(page, name);
        await page.waitForLoadState('networkidle');
        const width = await page.evaluate(() => document.documentElement.scrollWidth);
        assert.ok(width <= 375, `${name}: page is ${width} px wide`);
        if (name === 'Statistics') await shot(page, 'statistics-375px');
      }
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });
});
