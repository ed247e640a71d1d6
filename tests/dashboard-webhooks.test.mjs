// The dashboard's webhook views and the operator's reads (issue 35) in a real browser (Debian's
// Chromium driven by playwright-core) against the real built worker under Miniflare, the real demo
// origin and real webhook receivers: each subscription's 24 h health against the attempts its
// receiver answered, the delivery filters narrowing the list to what the test made, an attempt's
// request headers (the signature redacted) and response headers, the Events view (types seen, an
// event's deliveries), the operator's audit rows with their project and key and the gateway-call
// toggle, the operator reading a project's webhooks without a portal link, keys' last use — hostile
// header values shown as text — each view at 1280 px and 375 px with an axe-core scan.
// Screenshots go to target/screenshots/ (and to docs/screenshots/ with UPDATE_SCREENSHOTS=1).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { launchChromium, newPage, assertNothingRan, axe, view, shown } from './support/browser.mjs';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, cfg, bearer, ROOT, ADMIN_TOKEN, ORIGIN_TOKEN } from './support/gateway.mjs';

const SHOTS = path.join(ROOT, 'target', 'screenshots');
const DOC_SHOTS = path.join(ROOT, 'docs', 'screenshots');
const CONFIG = {
  plans: { big: { requests_per_window: 100000 } },
  webhooks: { schedule_s: [1], timeout_ms: 3000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
};
// A receiver's header value that would run if it ever became markup.
const HOSTILE = '<img src=x onerror="window.__pwned=9">';
const REDACTED_SIG = /^v1,[A-Za-z0-9+/=]{6}…$/;

let origin;
let gw;
let browser;
let okR;
let failR;
const project = `hooks-${crypto.randomBytes(3).toString('hex')}`;
const otherProject = `${project}-b`;
let key;
let otherKey;
const subs = {};
const ev = {};
/** axe findings (of any impact; none may be serious or critical) per view, printed at the end. */
const axeFindings = {};

async function shot(page, name) {
  fs.mkdirSync(SHOTS, { recursive: true });
  const file = path.join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  if (process.env.UPDATE_SCREENSHOTS) {
    fs.mkdirSync(DOC_SHOTS, { recursive: true });
    fs.copyFileSync(file, path.join(DOC_SHOTS, `${name}.png`));
  }
}

async function portalUrl() {
  const res = await gw.admin('POST', '/_postguard/v1/portal-links', { project, ttl_s: 3600 });
  assert.equal(res.status, 201, res.text);
  return res.json.url;
}

async function signInAsOperator(page) {
  await page.goto(`${gw.url}/_postguard/dashboard/`);
  await page.getByLabel('API key or operator token').fill(ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByText('Operator (every project)').waitFor();
}

const hooks = (r) => r.requests.filter((x) => x.path === '/hooks');
const pageWidth = (page) => page.evaluate(() => document.documentElement.scrollWidth);

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  okR = await startReceiver({ behaviour: () => ({ status: 200, headers: { 'x-receiver': 'ok' }, body: '{"ok":true}' }) });
  failR = await startReceiver({
    behaviour: () => ({ status: 500, headers: { 'set-cookie': 'sid=s3cr3t-cookie; HttpOnly', 'x-receiver': HOSTILE }, body: HOSTILE }),
  });
  browser = await launchChromium();
  key = await gw.createKey({ project, plan: 'big', name: 'shop' });
  otherKey = await gw.createKey({ project: otherProject, plan: 'big', name: 'other shop' });
  const sub = async (name, r, events) => {
    const res = await gw.admin('POST', '/_postguard/v1/webhooks', { url: `${r.url}/hooks`, events, description: name }, { token: key.key });
    assert.equal(res.status, 201, res.text);
    r.addSecret(res.json.secret);
    subs[name] = res.json;
  };
  await sub('ok', okR, ['*']);
  await sub('fail', failR, ['order.*']);
  for (const [name, type] of [['created', 'order.created'], ['paid', 'order.paid'], ['invoice', 'invoice.sent']]) {
    const res = await gw.admin('POST', '/_postguard/v1/events', { project, type, data: { name } }, { token: ORIGIN_TOKEN });
    assert.equal(res.status, 202, res.text);
    ev[name] = { id: res.json.id, type };
  }
  // Five deliveries (the ok subscription gets all three events, the failing one the two order.*),
  // all settled: delivered, or dead-lettered after the schedule's one retry.
  await poll(async () => {
    const r = await gw.admin('GET', '/_postguard/v1/deliveries?limit=20', undefined, { token: key.key });
    return r.json?.data?.length === 5 && r.json.data.every((d) => ['delivered', 'dead_letter'].includes(d.status));
  }, { timeout: 30000, interval: 250, message: 'five deliveries settled' });
  // Traffic of both projects' keys: proxied requests and a gateway call each.
  for (const k of [key, otherKey]) {
    for (let i = 0; i < 2; i++) assert.equal((await gw.fetch(`/orders/${i}`, { headers: bearer(k.key) })).status, 200);
    assert.equal((await gw.fetch('/_postguard/v1/me', { headers: bearer(k.key) })).status, 200);
  }
  await poll(async () => {
    const r = await gw.admin('GET', `/_postguard/v1/audit?project=${otherProject}`);
    return r.json?.data?.length === 3;
  }, { timeout: 15000, interval: 200, message: 'the other project’s three rows' });
});

after(async () => {
  console.log(`# axe findings per view (none may be serious or critical): ${JSON.stringify(axeFindings)}`);
  await browser?.close();
  await okR?.close();
  await failR?.close();
  await gw?.dispose();
  await origin?.kill();
});

describe('a project’s webhook views (portal link, 1280 px)', () => {
  let context;
  let page;
  before(async () => {
    context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    page = await newPage(context);
    await page.goto(await portalUrl());
    await page.getByRole('heading', { level: 1, name: 'Statistics' }).waitFor();
  });
  after(async () => context?.close());

  it('Webhooks: each endpoint’s 24 h health matches the attempts its receiver answered', async () => {
    await view(page, 'Webhooks');
    const okRow = page.locator(`tr[data-subscription-id="${subs.ok.id}"]`);
    const failRow = page.locator(`tr[data-subscription-id="${subs.fail.id}"]`);
    await shown(page, okRow);
    // What the receivers answered: every attempt to the ok one 200, every one to the other 500.
    const okN = hooks(okR).length;
    const failN = hooks(failR).length;
    assert.ok(okN >= 3, `at least one request per event to the ok receiver: ${okN}`);
    assert.ok(failN >= 4, `the schedule's two attempts for each order.* event: ${failN}`);
    assert.equal(await okRow.locator('td.health').textContent(), 'healthy');
    assert.equal(await okRow.locator('td.success').textContent(), `100 % of ${okN}`);
    assert.equal(await failRow.locator('td.health').textContent(), 'failing');
    assert.equal(await failRow.locator('td.success').textContent(), `0 % of ${failN}`);
    assert.match(await failRow.locator('td.last-attempt').textContent(), /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ HTTP 500$/);
    const lastAt = Math.max(...hooks(failR).map((r) => r.at));
    const shownAt = Date.parse((await failRow.locator('td.last-attempt .nowrap').first().textContent()).replace(' ', 'T'));
    // Shown to the second (rounded down) from when the attempt started; received within its 3000 ms timeout.
    assert.ok(shownAt <= lastAt && lastAt - shownAt < 4000, `last attempt shown ${shownAt}, received ${lastAt}`);
    await shot(page, 'webhooks-health');
    axeFindings.webhooks = await axe(page, 'Webhooks with health');
    await assertNothingRan(page);
  });

  it('Deliveries: each filter narrows the list to what the test made', async () => {
    await view(page, 'Deliveries');
    const rows = page.locator('tr[data-delivery-id]');
    await poll(async () => (await rows.count()) === 5, { message: 'five deliveries listed' });
    const ids = async () => rows.evaluateAll((trs) => trs.map((tr) => ({ sub: tr.dataset.subscriptionId, event: tr.dataset.eventId })));
    const filter = async () => {
      await page.getByRole('button', { name: 'Filter' }).click();
      await page.waitForLoadState('networkidle');
    };
    // By subscription.
    await page.getByLabel('Subscription').selectOption(subs.fail.id);
    await filter();
    await poll(async () => (await rows.count()) === 2, { message: 'the failing subscription’s two' });
    assert.deepEqual((await ids()).map((r) => r.sub), [subs.fail.id, subs.fail.id]);
    assert.deepEqual((await ids()).map((r) => r.event).sort(), [ev.created.id, ev.paid.id].sort());
    // By event id (both subscriptions).
    await page.getByLabel('Subscription').selectOption('');
    await page.getByLabel('Event ID').fill(ev.paid.id);
    await filter();
    await poll(async () => (await rows.count()) === 2 && (await ids()).every((r) => r.event === ev.paid.id), { message: 'order.paid’s two' });
    assert.deepEqual((await ids()).map((r) => r.sub).sort(), [subs.ok.id, subs.fail.id].sort());
    // By event type.
    await page.getByLabel('Event ID').fill('');
    await page.getByLabel('Event type').fill('invoice.sent');
    await filter();
    await poll(async () => (await rows.count()) === 1, { message: 'the one invoice.sent delivery' });
    assert.deepEqual(await ids(), [{ sub: subs.ok.id, event: ev.invoice.id }]);
    // By status.
    await page.getByLabel('Event type').fill('');
    await page.getByLabel('Status').selectOption('dead_letter');
    await filter();
    await poll(async () => (await rows.count()) === 2 && (await ids()).every((r) => r.sub === subs.fail.id), { message: 'the two dead letters' });
    // By time: nothing after the test's events.
    await page.getByLabel('Status').selectOption('');
    await page.getByLabel('Since (UTC)').fill('2099-01-01T00:00:00');
    await filter();
    await shown(page, page.getByText('No deliveries match.'));
    await page.getByLabel('Since (UTC)').fill('');
    await filter();
    await poll(async () => (await rows.count()) === 5, { message: 'all five again' });
    // The Webhooks view links each subscription to its deliveries.
    await view(page, 'Webhooks');
    await page.getByRole('link', { name: `Deliveries to ${subs.ok.url}` }).click();
    await page.getByRole('heading', { level: 1, name: 'Deliveries' }).waitFor();
    await poll(async () => (await rows.count()) === 3 && (await ids()).every((r) => r.sub === subs.ok.id), { message: 'the ok subscription’s three, from the link' });
    assert.equal(await page.getByLabel('Subscription').inputValue(), subs.ok.id);
    await assertNothingRan(page);
  });

  it('an attempt shows its request headers (signature redacted) and its response status, headers and excerpt, as text', async () => {
    await view(page, 'Deliveries');
    await page.getByLabel('Subscription').selectOption(subs.fail.id);
    await page.getByLabel('Event ID').fill(ev.created.id);
    await page.getByRole('button', { name: 'Filter' }).click();
    const row = page.locator(`tr[data-event-id="${ev.created.id}"][data-subscription-id="${subs.fail.id}"]`);
    await shown(page, row);
    const deliveryId = await row.getAttribute('data-delivery-id');
    await page.getByRole('button', { name: `Details of delivery ${deliveryId}` }).click();
    const first = page.locator('details.headers[data-attempt="1"]');
    await shown(page, first);
    await first.locator('summary').click();
    const req = first.getByLabel('Request headers of attempt 1');
    const pairs = await req.evaluate((dl) => {
      const out = {};
      const dts = [...dl.querySelectorAll('dt')];
      for (const dt of dts) out[dt.textContent] = dt.nextElementSibling.textContent;
      return out;
    });
    const got = failR.forEvent(ev.created.id).find((r) => r.headers['x-delivery-attempt'] === '1');
    assert.ok(got, 'the receiver got attempt 1');
    assert.match(pairs['webhook-signature'], REDACTED_SIG);
    assert.ok(got.headers['webhook-signature'].startsWith(pairs['webhook-signature'].slice(0, -1)));
    for (const h of ['webhook-id', 'webhook-timestamp', 'x-event-type', 'x-request-id', 'x-delivery-attempt']) assert.equal(pairs[h], got.headers[h], h);
    assert.ok(!(await page.content()).includes(got.headers['webhook-signature'].slice(3)), 'the signature is never on the page whole');
    assert.equal(await first.getByRole('heading', { level: 4, name: 'Response: HTTP 500' }).count(), 1);
    const res = first.getByLabel('Response headers of attempt 1');
    await res.getByText(HOSTILE, { exact: true }).waitFor();
    await res.getByText('(redacted)', { exact: true }).waitFor();
    assert.ok(!(await page.content()).includes('s3cr3t-cookie'), 'no cookie value');
    assert.equal(await first.getByLabel('Response excerpt of attempt 1').textContent(), HOSTILE);
    assert.equal(await page.locator('details.headers img, main img').count(), 0, 'no element was made from a header');
    await shot(page, 'deliveries-headers');
    axeFindings.deliveries = await axe(page, 'Deliveries with an attempt’s headers');
    await assertNothingRan(page);
  });

  it('Events: the types seen, one type’s events, and an event’s deliveries', async () => {
    await view(page, 'Events');
    const types = page.locator('ul.types li');
    await poll(async () => (await types.count()) === 3, { message: 'three types seen' });
    assert.deepEqual((await types.evaluateAll((lis) => lis.map((li) => li.dataset.type))).sort(), ['invoice.sent', 'order.created', 'order.paid']);
    await poll(async () => (await page.locator('tr[data-event-id]').count()) === 3, { message: 'the three events listed' });
    await page.getByRole('button', { name: /^Only order\.paid events/ }).click();
    await poll(async () => (await page.locator('tr[data-event-id]').count()) === 1, { message: 'one order.paid event' });
    const row = page.locator(`tr[data-event-id="${ev.paid.id}"]`);
    assert.equal(await row.locator('td.summary').textContent(), '2: 1 delivered, 1 dead_letter');
    await page.getByRole('button', { name: `Deliveries of event ${ev.paid.id}` }).click();
    const nested = page.getByRole('table', { name: `Deliveries of event ${ev.paid.id}` });
    await shown(page, nested);
    const statuses = await nested.locator('tbody tr .badge').allTextContents();
    assert.deepEqual(statuses.sort(), ['dead_letter', 'delivered']);
    assert.equal(await page.getByRole('button', { name: /^Only order\.paid events/ }).getAttribute('aria-pressed'), 'true');
    await shot(page, 'events');
    axeFindings.events = await axe(page, 'Events');
    // The event's deliveries, with their attempts, in the Deliveries view.
    await page.getByRole('link', { name: `Open the deliveries of ${ev.paid.id} with their attempts` }).click();
    await page.getByRole('heading', { level: 1, name: 'Deliveries' }).waitFor();
    await poll(async () => (await page.locator(`tr[data-delivery-id][data-event-id="${ev.paid.id}"]`).count()) === 2
      && (await page.locator('tr[data-delivery-id]').count()) === 2, { message: 'the event’s two deliveries' });
    await assertNothingRan(page);
  });
});

describe('the operator (1280 px)', () => {
  let context;
  let page;
  before(async () => {
    context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    page = await newPage(context);
    await signInAsOperator(page);
  });
  after(async () => context?.close());

  it('Audit log: each row’s project and key; the gateway’s own calls only when asked', async () => {
    await view(page, 'Audit log');
    const rows = page.locator('tr[data-request-id]');
    await shown(page, rows.first());
    const headers = await page.locator('table thead th').allTextContents();
    assert.deepEqual(headers.slice(0, 3), ['Time (UTC)', 'Project', 'Key']);
    // Default: no gateway call, every row says whose it is.
    const seen = await rows.evaluateAll((trs) => trs.map((tr) => ({
      project: tr.querySelector('td.project').textContent,
      key: tr.querySelector('td.key').textContent,
      path: tr.querySelectorAll('td')[4].textContent,
    })));
    assert.ok(seen.length > 0);
    assert.ok(seen.every((r) => !r.path.startsWith('/_postguard/')), seen.map((r) => r.path).join(' '));
    const mine = seen.filter((r) => r.project === project);
    const theirs = seen.filter((r) => r.project === otherProject);
    assert.deepEqual(mine.map((r) => r.key), [`${key.prefix}…`, `${key.prefix}…`]);
    assert.deepEqual(theirs.map((r) => r.key), [`${otherKey.prefix}…`, `${otherKey.prefix}…`]);
    // Ticked: the gateway's own calls too — here the two keys' GET /me, each with its project and key.
    await page.getByLabel('Include gateway calls').check();
    await page.getByLabel('Path').fill('/_postguard/v1/me');
    await page.getByRole('button', { name: 'Search' }).click();
    await poll(async () => (await rows.count()) === 2 && (await rows.evaluateAll((trs) => trs.every((tr) => tr.querySelectorAll('td')[4].textContent === '/_postguard/v1/me'))), { message: 'the two GET /me rows' });
    const whose = await rows.evaluateAll((trs) => trs.map((tr) => `${tr.querySelector('td.project').textContent} ${tr.querySelector('td.key').textContent}`));
    assert.deepEqual(whose.sort(), [`${project} ${key.prefix}…`, `${otherProject} ${otherKey.prefix}…`].sort());
    // Unticked, the same search finds none of them.
    await page.getByLabel('Include gateway calls').uncheck();
    await shown(page, page.getByText('No requests match.'));
    await page.getByLabel('Include gateway calls').check();
    await page.getByLabel('Path').fill('');
    // Filtered by project: only that project's rows (its two proxied requests and its GET /me).
    await page.getByLabel('Project', { exact: true }).fill(otherProject);
    await page.getByRole('button', { name: 'Search' }).click();
    await poll(async () => (await rows.count()) === 3 && (await page.locator('td.project').allTextContents()).every((p) => p === otherProject), { message: `${otherProject}’s three rows` });
    // Request ids stay on one line, whole when focused.
    const id = page.locator('tr[data-request-id] code.id').first();
    const oneLine = await id.evaluate((el) => getComputedStyle(el).whiteSpace);
    assert.equal(oneLine, 'nowrap');
    await id.focus();
    assert.equal(await id.evaluate((el) => el.scrollWidth <= el.clientWidth + 1), true, 'whole on focus');
    await page.getByLabel('Include gateway calls').uncheck();
    await shot(page, 'audit-operator');
    axeFindings.auditOperator = await axe(page, 'Audit log (operator)');
    await assertNothingRan(page);
  });

  it('reads a project’s Webhooks, Deliveries and Events without a portal link', async () => {
    await view(page, 'Webhooks');
    await page.getByLabel('Project', { exact: true }).fill(project);
    await page.getByRole('button', { name: 'Show webhooks' }).click();
    const okRow = page.locator(`tr[data-subscription-id="${subs.ok.id}"]`);
    await shown(page, okRow);
    assert.equal(await okRow.locator('td.health').textContent(), 'healthy');
    assert.equal(await page.locator(`tr[data-subscription-id="${subs.fail.id}"] td.health`).textContent(), 'failing');
    assert.equal(await page.getByRole('button', { name: /^Pause|^Delete/ }).count(), 0, 'read only: the project changes its webhooks');
    assert.equal(await page.getByRole('form', { name: 'New subscription' }).count(), 0);
    await shot(page, 'webhooks-operator');
    axeFindings.webhooksOperator = await axe(page, 'Webhooks (operator)');
    await view(page, 'Deliveries');
    assert.equal(await page.getByLabel('Project', { exact: true }).inputValue(), project, 'the project chosen stays');
    await poll(async () => (await page.locator('tr[data-delivery-id]').count()) === 5, { message: 'the project’s five deliveries' });
    const d = await page.locator('tr[data-delivery-id]').first().getAttribute('data-delivery-id');
    await page.getByRole('button', { name: `Details of delivery ${d}` }).click();
    await shown(page, page.locator('details.headers').first());
    assert.equal(await page.getByRole('button', { name: `Retry delivery ${d}` }).count(), 0, 'no retry for the operator');
    await view(page, 'Events');
    await poll(async () => (await page.locator('tr[data-event-id]').count()) === 3, { message: 'the project’s three events' });
    // Another project's records are its own.
    await page.getByLabel('Project', { exact: true }).fill(otherProject);
    await page.getByRole('button', { name: 'Filter' }).click();
    await shown(page, page.getByText('No events match.'));
    await assertNothingRan(page);
  });

  it('Keys: each key’s last use, from the audit log', async () => {
    await view(page, 'Keys');
    const cell = page.locator(`tr[data-key-id="${key.id}"] td.last-used`);
    await poll(async () => (await cell.getAttribute('data-last-used-at')) !== null, { message: 'the key’s last use' });
    const activity = (await gw.admin('GET', `/_postguard/v1/keys/activity?project=${project}`)).json.data;
    const mine = activity.find((a) => a.key_prefix === key.prefix);
    const newest = (await gw.admin('GET', `/_postguard/v1/audit?project=${project}&key_prefix=${key.prefix}&limit=1`)).json.data[0];
    // The key's last request (its GET /me in the set-up): the time of its newest audit row.
    const at = Number(await cell.getAttribute('data-last-used-at'));
    assert.equal(at, newest.time);
    assert.equal(mine.last_used_at, newest.time);
    assert.match(await cell.textContent(), /ago \d+ requests$/);
    await shot(page, 'keys-last-used');
    axeFindings.keys = await axe(page, 'Keys with last use');
    await assertNothingRan(page);
  });
});

describe('the new views at 375 px wide', () => {
  it('Webhooks, Deliveries (an attempt’s headers open), Events and the operator’s Audit log fit the viewport', async () => {
    const context = await browser.newContext({ viewport: { width: 375, height: 740 }, deviceScaleFactor: 1 });
    const page = await newPage(context);
    try {
      await page.goto(await portalUrl());
      await page.getByRole('heading', { level: 1, name: 'Statistics' }).waitFor();
      await view(page, 'Webhooks');
      await shown(page, page.locator(`tr[data-subscription-id="${subs.ok.id}"]`));
      assert.ok((await pageWidth(page)) <= 375, `Webhooks: ${await pageWidth(page)} px`);
      await shot(page, 'webhooks-375px');
      axeFindings.webhooks375 = await axe(page, 'Webhooks at 375 px');
      await view(page, 'Deliveries');
      const row = page.locator('tr[data-delivery-id]').first();
      await shown(page, row);
      const d = await row.getAttribute('data-delivery-id');
      await page.getByRole('button', { name: `Details of delivery ${d}` }).click();
      const details = page.locator('details.headers').first();
      await shown(page, details);
      await details.locator('summary').click();
      await page.waitForLoadState('networkidle');
      assert.ok((await pageWidth(page)) <= 375, `Deliveries: ${await pageWidth(page)} px`);
      await shot(page, 'deliveries-375px');
      axeFindings.deliveries375 = await axe(page, 'Deliveries at 375 px');
      await view(page, 'Events');
      await shown(page, page.locator('tr[data-event-id]').first());
      assert.ok((await pageWidth(page)) <= 375, `Events: ${await pageWidth(page)} px`);
      await shot(page, 'events-375px');
      axeFindings.events375 = await axe(page, 'Events at 375 px');
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
    const opContext = await browser.newContext({ viewport: { width: 375, height: 740 }, deviceScaleFactor: 1 });
    const op = await newPage(opContext);
    try {
      await signInAsOperator(op);
      await view(op, 'Audit log');
      await shown(op, op.locator('tr[data-request-id]').first());
      assert.ok((await pageWidth(op)) <= 375, `Audit log: ${await pageWidth(op)} px`);
      await shot(op, 'audit-operator-375px');
      axeFindings.audit375 = await axe(op, 'Audit log (operator) at 375 px');
      await view(op, 'Keys');
      await shown(op, op.locator(`tr[data-key-id="${key.id}"] td.last-used[data-last-used-at]`));
      assert.ok((await pageWidth(op)) <= 375, `Keys: ${await pageWidth(op)} px`);
      await assertNothingRan(op);
    } finally {
      await opContext.close();
    }
  });
});
