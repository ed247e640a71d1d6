// The dashboard's Usage view and Statistics' "keys without an Idempotency-Key" (issue 34) in a
// real browser (Debian's Chromium driven by playwright-core) against the real built worker under
// Miniflare and the real demo origin: a project's keys — one imported with a prefix that would be
// markup if it were ever parsed, one on a plan small enough to refuse — make known requests
// through the gateway; the view's figures per key and per day and hour are what they made
// (billable once per operation, replays and 429s apart), for the project's portal session and for
// the operator (every project, then one); Statistics names the key that sent a POST without an
// Idempotency-Key. Each at 1280 px and 375 px, with axe-core; nothing from outside runs.
// Screenshots go to target/screenshots/ (and to docs/screenshots/ with UPDATE_SCREENSHOTS=1).
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { launchChromium, newPage, assertNothingRan, axe, view, shown } from './support/browser.mjs';
import { startOrigin } from './support/origin.mjs';
import { startGateway, poll, cfg, bearer, ROOT, ADMIN_TOKEN } from './support/gateway.mjs';
import { show } from './support/util.mjs';

const SHOTS = path.join(ROOT, 'target', 'screenshots');
const DOC_SHOTS = path.join(ROOT, 'docs', 'screenshots');
const CONFIG = {
  plans: {
    big: { requests_per_window: 100000 },
    // Two requests a minute: the third of the test's three is refused (429).
    strict: { requests_per_window: 2, window_s: 60 },
  },
  // A POST without an Idempotency-Key is forwarded (and counted by /stats) until then.
  idempotency: { required_from: '2099-01-01T00:00:00Z' },
};
// An imported key's prefix (any visible ASCII): shown as text, never as markup.
const HOSTILE_PREFIX = '<b>pwn</b>';

let origin;
let gw;
let browser;
const project = `use-${crypto.randomBytes(3).toString('hex')}`;
const otherProject = `${project}-b`;
/** The test's keys: {key, prefix} and what each sent, as the view must show it. */
const keys = {};
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

const send = (key, method, p, headers = {}) =>
  gw.fetch(p, { method, headers: { ...bearer(key), ...(method === 'POST' ? { 'content-type': 'application/json' } : {}), ...headers }, body: method === 'POST' ? '{}' : undefined });

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  browser = await launchChromium();
  // The strict key first: a portal session takes the plan of the project's newest live key.
  const strict = await gw.createKey({ project, plan: 'strict', name: 'batch job' });
  const legacy = `${HOSTILE_PREFIX}${crypto.randomBytes(12).toString('hex')}`;
  const imported = await gw.admin('POST', '/_postguard/v1/keys/import', {
    keys: [{ key: legacy, prefix: HOSTILE_PREFIX, project, plan: 'big', name: 'moved from the old system' }],
  });
  assert.equal(imported.status, 200, show(imported));
  assert.deepEqual(imported.json.data.map((k) => [k.prefix, k.status]), [[HOSTILE_PREFIX, 'created']]);
  const other = await gw.createKey({ project: otherProject, plan: 'big' });

  // The imported key: a POST, its replay, a GET, a POST without a key → 4 requests, 3
  // forwarded, 3 billable, 1 replay, and one request missing its Idempotency-Key.
  const ik = `order-${crypto.randomUUID()}`;
  assert.equal((await send(legacy, 'POST', '/orders', { 'idempotency-key': ik })).status, 201);
  const replay = await send(legacy, 'POST', '/orders', { 'idempotency-key': ik });
  assert.equal(replay.headers['idempotent-replayed'], 'true');
  assert.equal((await send(legacy, 'GET', '/items/1')).status, 200);
  const keyless = await send(legacy, 'POST', '/orders');
  assert.equal(keyless.status, 201, show(keyless));
  keys.legacy = { key: legacy, prefix: HOSTILE_PREFIX, project, want: [4, 3, 3, 1, 0] };
  // The strict key: three GETs on two a minute → 3 requests, 2 forwarded and billable, 1 refused.
  const statuses = [];
  for (let i = 0; i < 3; i++) statuses.push((await send(strict.key, 'GET', `/items/${i}`)).status);
  assert.deepEqual(statuses, [200, 200, 429]);
  keys.strict = { key: strict.key, prefix: strict.prefix, project, want: [3, 2, 2, 0, 1] };
  assert.equal((await send(other.key, 'GET', '/items/9')).status, 200);
  keys.other = { key: other.key, prefix: other.prefix, project: otherProject, want: [1, 1, 1, 0, 0] };
  // The rows are written after each answer: wait until /usage has every one of them.
  await poll(async () => {
    const r = await gw.admin('GET', '/_postguard/v1/usage?granularity=day');
    const total = (k) => r.json?.data?.filter((u) => u.key_prefix === k.prefix).reduce((n, u) => n + u.requests, 0);
    return Object.values(keys).every((k) => total(k) === k.want[0]);
  }, { timeout: 30000, interval: 250, message: 'every request in /usage' });
});

after(async () => {
  console.log(`# axe findings per view (none may be serious or critical): ${JSON.stringify(axeFindings)}`);
  await browser?.close();
  await gw?.dispose();
  await origin?.kill();
});

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

/** The rows of a table named `name`: each row's cells as text, and its data-key-prefix. */
function rows(page, name, part = 'tbody') {
  return page.getByRole('table', { name }).locator(`${part} tr`).evaluateAll((trs) =>
    trs.map((tr) => ({ prefix: tr.dataset.keyPrefix, cells: [...tr.cells].map((c) => c.textContent) })),
  );
}

const PER_KEY = 'Usage per key over the period';
const counts = (k) => k.want.map(String);
const pageWidth = (page) => page.evaluate(() => document.documentElement.scrollWidth);

describe('the Usage view of a project (portal link)', () => {
  let context;
  let page;
  before(async () => {
    context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    page = await newPage(context);
    await page.goto(await portalUrl());
    await page.getByRole('heading', { level: 1, name: 'Statistics' }).waitFor();
  });
  after(async () => context?.close());

  it('per key over the last 7 days: what each key sent, billable once per operation, the prefix as text', async () => {
    await view(page, 'Usage');
    await shown(page, page.getByRole('table', { name: PER_KEY }));
    // Most requests first: the imported key (4), then the strict one (3); no other project's.
    assert.deepEqual(await rows(page, PER_KEY), [
      { prefix: HOSTILE_PREFIX, cells: [`${HOSTILE_PREFIX}…`, ...counts(keys.legacy)] },
      { prefix: keys.strict.prefix, cells: [`${keys.strict.prefix}…`, ...counts(keys.strict)] },
    ]);
    assert.deepEqual((await rows(page, PER_KEY, 'tfoot'))[0].cells, ['All keys', '7', '5', '5', '1', '1']);
    assert.equal(await page.locator('main table b').count(), 0, 'the prefix was not parsed as markup');
    for (const name of ['Period', 'Granularity']) assert.equal(await page.getByRole('combobox', { name }).count(), 1, `a control named ${name}`);
    assert.equal(await page.getByRole('button', { name: 'Show usage' }).count(), 1);
    assert.equal(await page.getByLabel('Project').count(), 0, 'a project reads its own usage');
    await shot(page, 'usage');
    axeFindings.usage = await axe(page, 'Usage');
    await assertNothingRan(page);
  });

  it('per hour: each row an hour of one key, adding up to the same figures', async () => {
    await page.getByLabel('Granularity').selectOption('hour');
    await page.getByRole('button', { name: 'Show usage' }).click();
    const name = 'Usage per key and hour, newest first';
    await shown(page, page.getByRole('table', { name }));
    const hourly = await rows(page, name);
    for (const k of [keys.legacy, keys.strict]) {
      const mine = hourly.filter((r) => r.prefix === k.prefix);
      assert.ok(mine.length >= 1 && mine.every((r) => /^\d{4}-\d\d-\d\d \d\d:00Z$/.test(r.cells[0])), JSON.stringify(mine));
      const sums = [2, 3, 4, 5, 6].map((i) => mine.reduce((n, r) => n + Number(r.cells[i]), 0));
      assert.deepEqual(sums, k.want, `${k.prefix} per hour`);
    }
    assert.ok(hourly.every((r) => r.prefix !== keys.other.prefix));
    await assertNothingRan(page);
  });

  it('Statistics names the key that sent a POST without an Idempotency-Key', async () => {
    await view(page, 'Statistics');
    const section = page.locator('section.missing-idempotency');
    await shown(page, section);
    assert.equal(await section.getByRole('heading', { level: 2 }).textContent(), 'Keys sending required requests without an Idempotency-Key');
    assert.deepEqual(await section.locator('li').allTextContents(), [`${HOSTILE_PREFIX}… — 1 request`]);
    assert.equal(await section.locator('b').count(), 0);
    await shot(page, 'statistics-missing-idempotency');
    axeFindings.statistics = await axe(page, 'Statistics with keys missing an Idempotency-Key');
    await assertNothingRan(page);
  });
});

describe('the Usage view of the operator', () => {
  it('every project\'s keys with their project, then one project by name', async () => {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await newPage(context);
    try {
      await signInAsOperator(page);
      await view(page, 'Usage');
      await shown(page, page.getByRole('table', { name: PER_KEY }));
      const all = await rows(page, PER_KEY);
      for (const k of Object.values(keys)) {
        const row = all.find((r) => r.prefix === k.prefix);
        assert.deepEqual(row?.cells, [`${k.prefix}…`, k.project, ...counts(k)], `${k.prefix} among every project's keys`);
      }
      await shot(page, 'usage-operator');
      axeFindings.usageOperator = await axe(page, 'Usage (operator)');
      await page.getByLabel('Project').fill(otherProject);
      await page.getByRole('button', { name: 'Show usage' }).click();
      await poll(async () => (await rows(page, PER_KEY)).length === 1, { timeout: 15000, message: 'one project\'s key' });
      assert.deepEqual(await rows(page, PER_KEY), [{ prefix: keys.other.prefix, cells: [`${keys.other.prefix}…`, otherProject, ...counts(keys.other)] }]);
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });
});

describe('the Usage view at 375 px wide', () => {
  it('fits (its tables scroll in their own regions), with axe', async () => {
    const context = await browser.newContext({ viewport: { width: 375, height: 740 }, deviceScaleFactor: 1 });
    const page = await newPage(context);
    try {
      await page.goto(await portalUrl());
      await page.getByRole('heading', { level: 1, name: 'Statistics' }).waitFor();
      await view(page, 'Usage');
      await shown(page, page.getByRole('table', { name: PER_KEY }));
      assert.equal((await rows(page, PER_KEY)).length, 2);
      assert.ok((await pageWidth(page)) <= 375, `Usage: ${await pageWidth(page)} px`);
      await shot(page, 'usage-375px');
      axeFindings.usage375 = await axe(page, 'Usage at 375 px');
      await view(page, 'Statistics');
      await shown(page, page.locator('section.missing-idempotency li'));
      assert.ok((await pageWidth(page)) <= 375, `Statistics: ${await pageWidth(page)} px`);
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });
});
