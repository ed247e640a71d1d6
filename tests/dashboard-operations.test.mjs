// The dashboard's Operations view (issue 26) in a real browser (Debian's Chromium driven by
// playwright-core) against the real built worker under Miniflare and the real demo origin: a
// project's asynchronous operations listed newest first with state, status, attempts and ids;
// filtered by state; another project's never shown; a hostile path rendered as text;
// an axe-core scan; and a 375 px wide viewport.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { launchChromium, newPage, assertNothingRan, axe } from './support/browser.mjs';
import { startOrigin } from './support/origin.mjs';
import { startGateway, poll, cfg, bearer, ROOT } from './support/gateway.mjs';

const SHOTS = path.join(ROOT, 'target', 'screenshots');
const DOC_SHOTS = path.join(ROOT, 'docs', 'screenshots');

const CONFIG = {
  plans: { big: { requests_per_window: 100000 } },
  webhooks: { schedule_s: [1] },
  // Long enough that the operation left running stays running while the page looks.
  async: { routes: [{ method: 'POST', path: '/reports/*' }], timeout_ms: 120000, requeue_after_s: 2 },
};
const HOSTILE = '/reports/<img src=x onerror="window.__pwned=1">';

let origin;
let gw;
let browser;
const project = `ops-${crypto.randomBytes(3).toString('hex')}`;
let key;
const ops = {};

async function startOperation(name, { path: p = `/reports/${name}`, headers = {} } = {}) {
  const res = await gw.fetch(p, {
    method: 'POST',
    headers: { ...bearer(key.key), prefer: 'respond-async', 'idempotency-key': `${name}-${crypto.randomUUID()}`, ...headers },
    body: '{}',
  });
  assert.equal(res.status, 202, res.text);
  return res.json;
}

async function state(id) {
  const r = await gw.fetch(`/_postguard/v1/operations/${id}`, { headers: bearer(key.key) });
  return r.json.state;
}

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  browser = await launchChromium();
  key = await gw.createKey({ project, plan: 'big' });
  const other = await gw.createKey({ project: `${project}-other`, plan: 'big' });
  // One that succeeds, one that fails (503 through the schedule), one with a hostile path,
  // another project's — then one that stays running while the page looks.
  ops.done = await startOperation('done');
  ops.failed = await startOperation('failed', { headers: { 'x-demo-status': '503' } });
  ops.hostile = await startOperation('hostile', { path: HOSTILE.replace('<', '%3C').replace('>', '%3E').replaceAll(' ', '%20').replaceAll('"', '%22') });
  const theirs = await gw.fetch('/reports/theirs', {
    method: 'POST', headers: { ...bearer(other.key), prefer: 'respond-async', 'idempotency-key': crypto.randomUUID() }, body: '{}',
  });
  ops.theirs = theirs.json;
  for (const o of [ops.done, ops.failed, ops.hostile]) {
    await poll(async () => ['succeeded', 'failed'].includes(await state(o.id)), { timeout: 30000, interval: 200, message: `${o.id} done` });
  }
  ops.running = await startOperation('running', { headers: { 'x-demo-hang': '1' } });
  await poll(async () => (await state(ops.running.id)) === 'running', { timeout: 20000, interval: 200, message: 'an operation running' });
});

after(async () => {
  await browser?.close();
  await gw?.dispose();
  await origin?.kill();
});

async function portalUrl() {
  const res = await gw.admin('POST', '/_postguard/v1/portal-links', { project, ttl_s: 3600 });
  assert.equal(res.status, 201, res.text);
  return res.json.url;
}



async function openOperations(page) {
  await page.goto(await portalUrl());
  await page.getByRole('heading', { level: 1, name: 'Statistics' }).waitFor();
  await page.getByRole('link', { name: 'Operations', exact: true }).click();
  await page.getByRole('heading', { level: 1, name: 'Operations' }).waitFor();
  await page.getByRole('table', { name: 'Asynchronous operations, newest first' }).waitFor();
}

/** The rows shown: {id, cells by column}. */
async function rows(page) {
  return page.locator('tr[data-operation-id]').evaluateAll((trs) =>
    trs.map((tr) => ({ id: tr.getAttribute('data-operation-id'), cells: [...tr.cells].map((c) => c.textContent) })),
  );
}

describe('the Operations view', () => {
  it('lists the project\'s operations newest first, with state, status, attempts and ids; another project\'s are not there', async () => {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await newPage(context);
    try {
      await openOperations(page);
      const shown = await rows(page);
      const ids = shown.map((r) => r.id);
      assert.deepEqual(ids, [ops.running.id, ops.hostile.id, ops.failed.id, ops.done.id], 'newest first, the project\'s only');
      assert.ok(!ids.includes(ops.theirs.id));
      const byId = Object.fromEntries(shown.map((r) => [r.id, r.cells]));
      // Created, Method, Path, State, Status, Attempts, Completed, ID, Request ID
      assert.deepEqual(byId[ops.done.id].slice(1, 6), ['POST', '/reports/done', 'succeeded', '201', '1']);
      assert.deepEqual(byId[ops.failed.id].slice(3, 6), ['failed', '503', '2'], 'one attempt and one per schedule delay');
      assert.deepEqual(byId[ops.running.id].slice(3, 5), ['running', '—']);
      assert.equal(byId[ops.done.id][8], ops.done.request_id);
      assert.match(byId[ops.hostile.id][2], /^\/reports\/%3Cimg/, 'the path as the gateway saw it, as text');
      assert.match(await page.locator('main .status').first().textContent(), /4 operations shown/);
      await axe(page, 'Operations');
      fs.mkdirSync(SHOTS, { recursive: true });
      await page.screenshot({ path: path.join(SHOTS, 'operations.png'), fullPage: true });
      if (process.env.UPDATE_SCREENSHOTS) {
        fs.mkdirSync(DOC_SHOTS, { recursive: true });
        fs.copyFileSync(path.join(SHOTS, 'operations.png'), path.join(DOC_SHOTS, 'operations.png'));
      }
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });

  it('filters by state', async () => {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await newPage(context);
    try {
      await openOperations(page);
      await page.getByLabel('State').selectOption('failed');
      await page.getByRole('button', { name: 'Filter' }).click();
      await poll(async () => {
        const r = await rows(page);
        return r.length === 1 && r[0].id === ops.failed.id;
      }, { timeout: 10000, message: 'only the failed operation' });
      await page.getByLabel('State').selectOption('queued');
      await page.getByRole('button', { name: 'Filter' }).click();
      await page.getByText('No operations match.').waitFor();
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });

  it('fits a 375 px wide viewport (the table scrolls in its own region)', async () => {
    const context = await browser.newContext({ viewport: { width: 375, height: 740 }, deviceScaleFactor: 1 });
    const page = await newPage(context);
    try {
      await openOperations(page);
      await page.waitForLoadState('networkidle');
      const width = await page.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(width <= 375, `Operations: page is ${width} px wide`);
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });
});
