// The dashboard in a real browser (Debian's Chromium driven by playwright-core) against the real
// built worker under Miniflare, the real demo origin and real webhook receivers, with real data:
// portal-link sign-in, the 30-day chart against what the test sent, the audit log, Retry and
// Redirect of dead-lettered deliveries, a subscription's secret shown once, revoking a key as the
// operator, a key's detail (metadata, policies), editing and rerolling it from the page (docs/operator-api.md,
// docs/dashboard-and-portal.md), an API key's own expiry and policies, hostile strings rendered as text, an axe-core scan,
// and a 375 px wide viewport.
// Screenshots of every view go to target/screenshots/ (and to docs/screenshots/ with
// UPDATE_SCREENSHOTS=1).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { launchChromium, newPage, assertNothingRan, axe, view } from './support/browser.mjs';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, cfg, bearer, ROOT, ADMIN_TOKEN, ORIGIN_TOKEN } from './support/gateway.mjs';

const SHOTS = path.join(ROOT, 'target', 'screenshots');
const DOC_SHOTS = path.join(ROOT, 'docs', 'screenshots');

// Hostile strings: if any of them ran, window.__pwned would be set or a dialog would open.
const XSS_UA = '<img src=x onerror="window.__pwned=1;alert(1)"><script>window.__pwned=2</script>';
const XSS_DATA = { note: '<img src=x onerror="window.__pwned=3;alert(3)">', html: '<script>window.__pwned=4;alert(4)</script>' };

const CONFIG = {
  webhooks: { schedule_s: [1], timeout_ms: 2000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: {
    big: { requests_per_window: 100000 },
    // Three policies with windows far longer than the tests, so what remains is exact.
    layered: {
      policies: [{ name: 'burst', requests: 10, window_s: 600 }, { name: 'hour', requests: 50, window_s: 3600 }, { name: 'day', requests: 500, window_s: 86400 }],
      concurrency: 2,
    },
  },
};
const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const DAY_MS = 86_400_000;
/** The dashboard's own rendering of a time (dom.ts `time`). */
const shownTime = (ms) => new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
/** A datetime-local value in UTC, to the second (dom.ts `toUtcInput`). */
const utcInput = (ms) => new Date(ms).toISOString().slice(0, 19);

let origin;
let gw;
let browser;
let receiverA;
let receiverB;
const project = `shop-${crypto.randomBytes(3).toString('hex')}`;
// The Keys tests' keys live in a project of their own: the portal sessions of `project` take
// the plan of its newest live key, which must stay `big`.
const opsProject = `ops-${crypto.randomBytes(3).toString('hex')}`;
let key;
const sent = { requests: 0, errors: 0, server: 0 };
/** The part of `sent` proxied to the origin: what the dashboard counts unless gateway calls are included. */
const proxied = { requests: 0, errors: 0, server: 0 };
/** axe findings (of any impact; none may be serious or critical) per view, printed at the end. */
const axeFindings = {};
const ids = {};

/** A request of the project (its key, or the origin publishing for it): counted as sent. */
async function forProject(method, p, { token, body, headers = {} } = {}) {
  const res = await gw.admin(method, p, body, { token: token ?? key.key, headers });
  for (const count of p.startsWith('/_postguard/') ? [sent] : [sent, proxied]) {
    count.requests += 1;
    if (res.status >= 400) count.errors += 1;
    if (res.status >= 500) count.server += 1;
  }
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

async function signInAsOperator(page) {
  await page.goto(`${gw.url}/_postguard/dashboard/`);
  await page.getByLabel('API key or operator token').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByText('Operator (every project)').waitFor();
}

/** A key of `opsProject`, created by the harness (with meta, expiry… as given). */
async function opsKey(body) {
  const res = await gw.admin('POST', '/_postguard/v1/keys', { project: opsProject, ...body });
  assert.equal(res.status, 201, res.text);
  return res.json;
}

const keyMeta = (prefix) => {
  const seen = origin.stats.find((r) => r.headers['x-postguard-key-prefix'] === prefix).at(-1);
  assert.ok(seen, `the origin saw key ${prefix}`);
  assert.equal(seen.signature_ok, true, seen.signature_error);
  const h = seen.headers['x-postguard-key-meta'];
  return h === undefined ? undefined : JSON.parse(Buffer.from(h, 'base64url'));
};

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  receiverA = await startReceiver({ behaviour: () => ({ status: 400, body: 'not yet' }) });
  receiverB = await startReceiver();
  browser = await launchChromium();
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
  it('shows the 30-day chart with today’s counts matching what the test sent; gateway calls only when asked', async () => {
    await page.locator('.chart canvas').first().waitFor();
    assert.equal(await page.locator('.chart .u-legend').count(), 1);
    const today = new Date().toISOString().slice(0, 10);
    assert.equal(await page.locator('details.days tbody tr').count(), 30, 'one row per day, 30 days');
    // By default the gateway's own calls (webhook setup, delivery polls, the page's own reads) are left out.
    const toggle = page.getByLabel('Include gateway calls');
    assert.equal(await toggle.isChecked(), false, 'unticked by default');
    assert.ok(proxied.requests > 0 && proxied.requests < sent.requests);
    let cells = await page.locator(`tr[data-date="${today}"] td`).allTextContents();
    assert.deepEqual(cells.map(Number), [proxied.requests, proxied.errors, proxied.server], `today, proxied only: ${cells}`);
    let summary = await page.locator('dl.fields').first().textContent();
    assert.match(summary, new RegExp(`requests${proxied.requests}`));
    assert.match(summary, new RegExp(`error share${((proxied.errors / proxied.requests) * 100).toFixed(1)} %`));
    assert.match(summary, /p50 latency\d+ ms/);
    let top = await page.getByRole('table', { name: 'Top endpoints' }).textContent();
    assert.match(top, /\/orders\/fail2/);
    assert.ok(!top.includes('/_postguard/'), `no gateway path: ${top}`);
    // The legend names the latest day before anything is hovered.
    const legend = await page.locator('.chart .u-legend').textContent();
    assert.ok(legend.includes(today) && !legend.includes('--'), `legend: ${legend}`);
    // Ticked: every request of the project, the gateway's own calls included — the test's and
    // the page's one call so far (its first GET /stats; its own row is written after it answers,
    // so the next one counts it once it is in the log).
    const withPage = sent.requests + 1;
    await poll(async () => (await gw.admin('GET', `/_postguard/v1/stats?days=1&project=${project}`)).json?.days?.[0]?.requests === withPage,
      { timeout: 15000, interval: 200, message: 'the page’s own GET /stats in the audit log' });
    await toggle.check();
    await page.getByText('Every request, the gateway’s own calls included.').waitFor();
    cells = await page.locator(`tr[data-date="${today}"] td`).allTextContents();
    assert.deepEqual(cells.map(Number), [withPage, sent.errors, sent.server], `today, everything: ${cells}`);
    summary = await page.locator('dl.fields').first().textContent();
    assert.match(summary, new RegExp(`requests${withPage}`));
    top = await page.getByRole('table', { name: 'Top endpoints' }).textContent();
    assert.match(top, /\/_postguard\/v1\/deliveries/);
    await toggle.uncheck();
    await page.getByText('Requests proxied to the origin; the gateway’s own calls are left out.').waitFor();
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

  it('pauses and resumes a subscription, sends a test ping and recovers failed deliveries (docs/operating-webhooks.md)', async () => {
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

describe('the Keys view: a key’s detail, edit and reroll (operator, docs/limits.md)', () => {
  let context;
  let page;
  /** Every PATCH and reroll the page sent: method, path, Idempotency-Key, body. */
  const mutations = [];

  before(async () => {
    context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    page = await newPage(context);
    page.on('request', (r) => {
      const p = new URL(r.url()).pathname;
      if (p.startsWith('/_postguard/v1/keys/') && r.method() !== 'GET') {
        mutations.push({ method: r.method(), path: p, idem: r.headers()['idempotency-key'], body: r.postData() });
      }
    });
    await signInAsOperator(page);
  });
  after(async () => context?.close());

  /** Opens the Keys view (afresh) and the detail of key `k`; the detail panel. */
  async function openKey(k) {
    await view(page, 'Statistics');
    await view(page, 'Keys');
    await page.getByRole('button', { name: `Details of key ${k.prefix}` }).click();
    const panel = page.getByRole('region', { name: `Key ${k.prefix}… of ${k.project}` });
    await shown(page, panel);
    return panel;
  }

  it('lists each key’s plan, expiry and whether it has metadata; the detail shows the metadata as text and each policy’s remaining', async () => {
    const expiresAt = Date.now() + 3 * DAY_MS;
    const meta = { tenant: 't1', ...XSS_DATA };
    const k = await opsKey({ plan: 'layered', name: 'three policies', meta, expires_at: expiresAt });
    const bare = await opsKey({ plan: 'big' });
    const soon = await opsKey({ plan: 'big', expires_at: Date.now() + 1500 });
    for (let i = 0; i < 3; i++) assert.equal((await gw.fetch(`/orders/${i}`, { headers: bearer(k.key) })).status, 200);
    await poll(async () => (await gw.fetch('/orders/1', { headers: bearer(soon.key) })).status === 401, { timeout: 15000, interval: 200, message: 'the short-lived key to expire' });

    await view(page, 'Keys');
    const row = page.locator(`tr[data-key-id="${k.id}"]`);
    await row.locator('td.meta', { hasText: 'yes' }).waitFor();
    await page.locator(`tr[data-key-id="${bare.id}"] td.meta`, { hasText: 'no' }).waitFor();
    assert.equal(await row.locator('td.expires').textContent(), `${shownTime(expiresAt)} (in 3 days)`);
    assert.equal(await row.locator('td').nth(2).textContent(), 'layered');
    assert.equal(await page.locator(`tr[data-key-id="${bare.id}"] td.expires`).textContent(), 'never');
    const soonRow = page.locator(`tr[data-key-id="${soon.id}"]`);
    assert.match(await soonRow.locator('td.expires').textContent(), /^expired \(/);
    assert.equal(await soonRow.locator('td').nth(7).textContent(), 'expired');

    // The answer the page itself reads: the detail must show exactly it.
    const pageRead = page.waitForResponse((r) => new URL(r.url()).pathname === `/_postguard/v1/keys/${k.id}`);
    await page.getByRole('button', { name: `Details of key ${k.prefix}` }).click();
    const seenByPage = await (await pageRead).json();
    const panel = page.getByRole('region', { name: `Key ${k.prefix}… of ${opsProject}` });
    await shown(page, panel);
    assert.equal(await page.evaluate(() => document.activeElement?.tagName), 'H2', 'focus moves to the detail');
    assert.equal(await page.getByRole('button', { name: `Details of key ${k.prefix}` }).getAttribute('aria-expanded'), 'true');
    // The gateway's answer, as the page got it (its JSON has the members sorted).
    const gwKey = (await gw.admin('GET', `/_postguard/v1/keys/${k.id}`)).json;
    const metaText = await panel.getByLabel(`Metadata of key ${k.prefix}…`).textContent();
    assert.equal(metaText, JSON.stringify(gwKey.meta, null, 2), 'pretty-printed JSON, as text');
    assert.deepEqual(JSON.parse(metaText), meta);
    assert.equal(await panel.locator('img, script').count(), 0, 'no element was made from the metadata');
    assert.equal(await panel.getByLabel(`Overrides of key ${k.prefix}…`).textContent(), 'none');
    // Each policy as the gateway reports it: three requests charged each one.
    assert.deepEqual(gwKey.policies.map((p) => [p.name, p.limit, p.remaining]), [['burst', 10, 7], ['hour', 50, 47], ['day', 500, 497]]);
    for (const p of gwKey.policies) {
      const tr = panel.locator(`tr[data-policy="${p.name}"]`);
      const cells = await tr.locator('td').allTextContents();
      assert.deepEqual(cells.slice(0, 2).map((c) => c.trim()), [String(p.limit), String(p.remaining)], `${p.name}: ${cells}`);
      // The reset shown is the one the page was given, to the second.
      const [, at, left] = /^(\S+ \S+Z) \((in \d+ (?:minutes|hours?|days?))\)$/.exec(cells[2]) ?? [];
      const given = seenByPage.policies.find((q) => q.name === p.name).reset;
      assert.ok(at && Date.parse(at.replace(' ', 'T')) === given * 1000, `${p.name} resets: ${cells[2]}, the page was given ${given}`);
      assert.ok(left, cells[2]);
      assert.equal(cells[3], `${p.window_s} s`);
      const bar = tr.getByRole('meter', { name: `${p.name}: ${p.remaining} of ${p.limit} remaining` });
      assert.equal(await bar.getAttribute('value'), String(p.remaining));
    }
    assert.equal(await panel.locator('.inflight').textContent(), '0 of 2 in-flight slots in use ');
    const facts = await panel.locator('dl.fields').textContent();
    assert.ok(facts.includes(`expires${shownTime(expiresAt)} (in 3 days)`), facts);
    await shot(page, 'keys-detail');
    axeFindings.keyDetail = await axe(page, 'Keys, a key’s detail');
    await assertNothingRan(page);
  });

  it('edits name, plan, metadata and expiry from the page; the gateway then reflects it, and the origin gets the new meta', async () => {
    const k = await opsKey({ plan: 'big', name: 'before', meta: { tenant: 't1' } });
    assert.equal((await gw.fetch('/orders/1', { headers: bearer(k.key) })).status, 200);
    assert.deepEqual(keyMeta(k.prefix), { tenant: 't1' });
    const panel = await openKey(k);
    const form = panel.getByRole('form', { name: `Edit key ${k.prefix}…` });
    assert.equal(await form.getByLabel('Metadata (JSON)').inputValue(), JSON.stringify({ tenant: 't1' }, null, 2));
    assert.ok(await form.getByLabel('Never expires').isChecked());
    assert.ok(await form.getByLabel('Expires (UTC)').isDisabled());
    const expiresAt = Math.floor((Date.now() + 5 * DAY_MS) / 1000) * 1000;
    const meta = { tenant: 't2', tier: 'gold', seats: 12 };
    await form.getByLabel('Name').fill('edited in the browser');
    await form.getByLabel('Plan').fill('layered');
    await form.getByLabel('Metadata (JSON)').fill(JSON.stringify(meta, null, 2));
    await form.getByLabel('Never expires').uncheck();
    await form.getByLabel('Expires (UTC)').fill(utcInput(expiresAt));
    const before = mutations.length;
    await form.getByRole('button', { name: 'Save changes' }).click();
    await shown(page, panel.getByText(`Key ${k.prefix}… saved (name, plan, meta, expires_at); it applies from the key’s next request.`));

    const sent = mutations.slice(before);
    assert.equal(sent.length, 1, 'one PATCH');
    assert.equal(sent[0].method, 'PATCH');
    assert.equal(sent[0].path, `/_postguard/v1/keys/${k.id}`);
    assert.match(sent[0].idem ?? '', UUID_RE, 'with an Idempotency-Key');
    assert.deepEqual(JSON.parse(sent[0].body), { name: 'edited in the browser', plan: 'layered', meta, expires_at: expiresAt });
    const got = (await gw.admin('GET', `/_postguard/v1/keys/${k.id}`)).json;
    assert.deepEqual([got.name, got.plan, got.meta, got.expires_at], ['edited in the browser', 'layered', meta, expiresAt]);
    // From the key's next request: the new plan's policies and the new meta at the origin.
    const res = await gw.fetch('/orders/2', { headers: bearer(k.key) });
    assert.equal(res.status, 200);
    assert.match(res.headers['ratelimit-policy'], /^"burst";q=10;w=600, "hour";q=50;w=3600, "day";q=500;w=86400/);
    assert.deepEqual(keyMeta(k.prefix), meta);
    // The detail and the row show it too.
    assert.deepEqual(JSON.parse(await panel.getByLabel(`Metadata of key ${k.prefix}…`).textContent()), meta);
    const row = page.locator(`tr[data-key-id="${k.id}"]`);
    assert.equal(await row.locator('td').nth(2).textContent(), 'layered');
    assert.equal(await row.locator('td.expires').textContent(), `${shownTime(expiresAt)} (in 5 days)`);
    assert.equal(await panel.locator('tr[data-policy]').count(), 3);

    // "Never" clears the expiry; an unchanged form sends nothing.
    await form.getByLabel('Never expires').check();
    await form.getByRole('button', { name: 'Save changes' }).click();
    await shown(page, panel.getByText(`Key ${k.prefix}… saved (expires_at); it applies from the key’s next request.`));
    await form.getByRole('button', { name: 'Save changes' }).click();
    await shown(page, panel.getByText('Nothing changed.'));
    const more = mutations.slice(before + 1);
    assert.equal(more.length, 1);
    assert.deepEqual(JSON.parse(more[0].body), { expires_at: null });
    assert.match(more[0].idem ?? '', UUID_RE);
    assert.notEqual(more[0].idem, sent[0].idem, 'a new Idempotency-Key per submit');
    assert.equal((await gw.admin('GET', `/_postguard/v1/keys/${k.id}`)).json.expires_at, null);
    assert.equal(await row.locator('td.expires').textContent(), 'never');
    await assertNothingRan(page);
  });

  it('refuses invalid metadata in the page (sends nothing) and shows the gateway’s problem detail on a 4xx', async () => {
    const k = await opsKey({ plan: 'big', meta: { tenant: 't1' } });
    const panel = await openKey(k);
    const form = panel.getByRole('form', { name: `Edit key ${k.prefix}…` });
    const metaField = form.getByLabel('Metadata (JSON)');
    const save = form.getByRole('button', { name: 'Save changes' });
    const before = mutations.length;
    const cases = [
      ['{"tenant": ', /^Metadata is not valid JSON: .+ Nothing was sent\.$/],
      ['[1, 2]', /^Metadata must be a JSON object/],
      [JSON.stringify({ big: 'x'.repeat(1100) }), /^Metadata is 1110 bytes of JSON; at most 1024 \(1 KiB\)\. Nothing was sent\.$/],
    ];
    for (const [text, expected] of cases) {
      await metaField.fill(text);
      await save.click();
      await shown(page, panel.getByRole('alert').filter({ hasText: expected }));
      assert.equal(await metaField.getAttribute('aria-invalid'), 'true');
    }
    // A request the page does send, after those: the only PATCH recorded is this one.
    await metaField.fill(JSON.stringify({ tenant: 't1' }, null, 2));
    await form.getByLabel('Plan').fill('nope');
    await save.click();
    const alert = panel.getByRole('alert').filter({ hasText: /^400 VALIDATION_ERROR: plan: unknown plan 'nope' \(configured: [^)]*\) \(request req_/ });
    await shown(page, alert);
    assert.equal(await metaField.getAttribute('aria-invalid'), null);
    const sent = mutations.slice(before);
    assert.deepEqual(sent.map((m) => JSON.parse(m.body)), [{ plan: 'nope' }], 'nothing was sent for the invalid metadata');
    const got = (await gw.admin('GET', `/_postguard/v1/keys/${k.id}`)).json;
    assert.deepEqual([got.plan, got.meta], ['big', { tenant: 't1' }]);
    // Chromium logs the 400 it was meant to get as a console error: that one, and nothing else.
    const expected = /Failed to load resource: the server responded with a status of 400/;
    await poll(() => page.trouble.some((t) => expected.test(t)), { message: 'the console line of the 400' });
    page.trouble.splice(page.trouble.findIndex((t) => expected.test(t)), 1);
    await assertNothingRan(page);
  });

  it('rerolls after a confirm step with a grace choice: the new key is shown once, both secrets work, the old one’s end is shown', async () => {
    // Windows far longer than the test: the two secrets' remaining counts are consecutive.
    const k = await opsKey({ plan: 'layered' });
    assert.equal((await gw.fetch('/orders/1', { headers: bearer(k.key) })).status, 200);
    const panel = await openKey(k);
    // Cancel sends nothing.
    const before = mutations.length;
    await panel.getByRole('button', { name: `Reroll key ${k.prefix}…`, exact: true }).click();
    await panel.getByRole('button', { name: `Cancel rerolling key ${k.prefix}…`, exact: true }).click();
    await panel.getByRole('button', { name: `Reroll key ${k.prefix}…`, exact: true }).click();
    const confirmForm = panel.getByRole('form', { name: `Reroll key ${k.prefix}…`, exact: true });
    const grace = confirmForm.getByLabel('The current secret keeps working for');
    assert.equal(await grace.inputValue(), '86400', '24 h by default');
    assert.deepEqual(await grace.locator('option').allTextContents(), ['1 hour', '24 hours', '7 days']);
    await grace.selectOption('3600');
    const answer = page.waitForResponse((r) => r.url().endsWith(`/_postguard/v1/keys/${k.id}/reroll`));
    const clickedAt = Date.now();
    await confirmForm.getByRole('button', { name: `Confirm reroll of key ${k.prefix}…`, exact: true }).click();
    const rerolled = await (await answer).json();
    assert.equal((await answer).status(), 201);
    const newKey = await shown(page, panel.locator('.secret-value'));
    assert.equal(newKey, rerolled.key);
    assert.match(newKey, /^pgk_[A-Za-z0-9_-]{43}$/);
    assert.equal(newKey.slice(0, 12), k.prefix, 'the same public prefix');
    assert.notEqual(newKey, k.key);
    assert.equal(await panel.getByRole('button', { name: /^Copy new api key/ }).count(), 1);
    assert.ok(rerolled.previous_expires_at >= clickedAt + 3_600_000 && rerolled.previous_expires_at <= Date.now() + 3_600_000, `previous_expires_at ${rerolled.previous_expires_at}: 1 h`);
    assert.equal(await panel.locator('.previous-until').textContent(), `The previous secret works until ${shownTime(rerolled.previous_expires_at)} (in 1 hour).`);
    await panel.getByText(`Key ${k.prefix}… rerolled.`).waitFor();
    const sent = mutations.slice(before);
    assert.deepEqual(sent.map((m) => [m.method, m.path, JSON.parse(m.body)]), [['POST', `/_postguard/v1/keys/${k.id}/reroll`, { grace_s: 3600 }]]);
    assert.match(sent[0].idem ?? '', UUID_RE);
    // Both secrets work, on one budget.
    const viaNew = await gw.fetch('/orders/2', { headers: bearer(newKey) });
    const viaOld = await gw.fetch('/orders/3', { headers: bearer(k.key) });
    assert.deepEqual([viaNew.status, viaOld.status], [200, 200]);
    assert.equal(Number(viaOld.headers['x-ratelimit-remaining']), Number(viaNew.headers['x-ratelimit-remaining']) - 1);
    await shot(page, 'keys-reroll');
    // Shown once: the key's detail opened again has no secret, nor has the page.
    await openKey(k);
    assert.equal(await page.locator('.secret-value').count(), 0);
    assert.ok(!(await page.content()).includes(newKey), 'the new key is nowhere on the page any more');
    await assertNothingRan(page);
  });
});

describe('the dashboard, signed in with an API key of several policies', () => {
  it('shows the key’s expiry, every policy’s remaining and its in-flight slots', async () => {
    const expiresAt = Date.now() + 2 * DAY_MS;
    const k = await opsKey({ plan: 'layered', expires_at: expiresAt });
    for (let i = 0; i < 2; i++) assert.equal((await gw.fetch(`/orders/${i}`, { headers: bearer(k.key) })).status, 200);
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await newPage(context);
    try {
      await page.goto(`${gw.url}/_postguard/dashboard/`);
      await page.getByLabel('API key or operator token').fill(k.key);
      await page.getByRole('button', { name: 'Sign in' }).click();
      const limit = page.locator('section', { has: page.getByRole('heading', { name: 'This key’s limit' }) });
      await shown(page, limit);
      const text = await limit.textContent();
      assert.ok(text.includes(`expires${shownTime(expiresAt)} (in 2 days)`), text);
      const rows = await limit.locator('tr[data-policy]').evaluateAll((trs) =>
        trs.map((tr) => [tr.dataset.policy, ...[...tr.querySelectorAll('td')].slice(0, 2).map((td) => td.textContent.trim())]));
      assert.deepEqual(rows, [['burst', '10', '8'], ['hour', '50', '48'], ['day', '500', '498']]);
      assert.equal(await limit.getByRole('meter', { name: 'burst: 8 of 10 remaining' }).count(), 1);
      assert.equal(await limit.locator('.inflight').textContent(), '0 of 2 in-flight slots in use ');
      await shot(page, 'key-limit');
      axeFindings.keyLimit = await axe(page, 'Statistics with an API key');
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

  it('the operator’s Keys view fits too, a key’s detail open', async () => {
    const context = await browser.newContext({ viewport: { width: 375, height: 740 }, deviceScaleFactor: 1 });
    const page = await newPage(context);
    try {
      const k = await opsKey({ plan: 'layered', meta: { tenant: 'narrow' } });
      await signInAsOperator(page);
      await view(page, 'Keys');
      await page.getByRole('button', { name: `Details of key ${k.prefix}` }).click();
      await page.getByRole('form', { name: `Edit key ${k.prefix}…` }).waitFor();
      await page.waitForLoadState('networkidle');
      const width = await page.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(width <= 375, `Keys: page is ${width} px wide`);
      await shot(page, 'keys-375px');
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });
});
