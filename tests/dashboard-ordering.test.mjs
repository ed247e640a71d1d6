// Delivery pace and order in the dashboard, in a real browser (Debian's Chromium driven by
// playwright-core) against the real built worker under Miniflare and real webhook receivers:
//   - Webhooks: a subscription whose receiver answered `RateLimit: "default";r=0;t=3600` shows
//     the limit the gateway paces it to (its receiver_limit: 0 left, the reset); one whose
//     receiver advertised nothing shows none;
//   - Deliveries and Events: events published with ordering_key "K" to a receiver that answers the
//     first of them 500 (its next attempt an hour away), two more with "K" and one with "L": every
//     row shows its key, K's successors show the delivery they wait for (blocked_by: the one before
//     each) as a button that opens it — in the list, or alone below it when not listed — while L's
//     is delivered (ADR 0043).
// Conditions are waited for with generous bounds (a shared machine); nothing depends on timing.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { launchChromium, newPage, assertNothingRan, axe, view, shown } from './support/browser.mjs';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, cfg, ROOT, ORIGIN_TOKEN } from './support/gateway.mjs';
import { uniq, show } from './support/util.mjs';

const SHOTS = path.join(ROOT, 'target', 'screenshots');
const CONFIG = {
  plans: { big: { requests_per_window: 100000 } },
  // One retry, an hour after a failure: a failing head of a lane stays unsettled for the whole test.
  webhooks: { schedule_s: [3600], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
};
const UTC = '\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\dZ';

let origin;
let gw;
let browser;
const receivers = [];
/** axe findings (of any impact; none may be serious or critical) per view, printed at the end. */
const axeFindings = {};

async function shot(page, name) {
  fs.mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SHOTS, `${name}.png`), fullPage: true });
}

/** A project with a key and a publish helper; `receiver(behaviour)` starts one, closed at the end. */
async function project(tag) {
  const name = uniq(tag);
  const { key } = await gw.createKey({ project: name, plan: 'big' });
  const api = (method, p, body) => gw.admin(method, p, body, { token: key });
  const subscribe = async (rcv, description) => {
    const res = await api('POST', '/_postguard/v1/webhooks', { url: `${rcv.url}/hooks`, events: ['*'], description });
    assert.equal(res.status, 201, show(res));
    rcv.addSecret(res.json.secret);
    return res.json;
  };
  const publish = async (type, data, extra = {}) => {
    const res = await gw.admin('POST', '/_postguard/v1/events', { project: name, type, data, ...extra }, { token: ORIGIN_TOKEN });
    assert.equal(res.status, 202, show(res));
    return res.json.id;
  };
  /** A page signed in with a portal link of this project, at 1280 px. */
  const open = async () => {
    const link = await gw.admin('POST', '/_postguard/v1/portal-links', { project: name, ttl_s: 3600 });
    assert.equal(link.status, 201, show(link));
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await newPage(context);
    await page.goto(link.json.url);
    await page.getByRole('heading', { level: 1, name: 'Statistics' }).waitFor();
    return { context, page };
  };
  return { name, api, subscribe, publish, open };
}

async function receiver(behaviour) {
  const r = await startReceiver({ behaviour });
  receivers.push(r);
  return r;
}

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  browser = await launchChromium();
});

after(async () => {
  console.log(`# axe findings per view (none may be serious or critical): ${JSON.stringify(axeFindings)}`);
  await browser?.close();
  await Promise.all(receivers.map((r) => r.close()));
  await gw?.dispose();
  await origin?.kill();
});

describe('the receiver’s limit on a subscription', () => {
  it('Webhooks: a subscription whose receiver answered RateLimit r=0 shows its limit; one whose receiver advertised none shows none', async () => {
    const p = await project('limit');
    const pacedR = await receiver(() => ({ status: 200, headers: { RateLimit: '"default";r=0;t=3600' }, body: 'ok' }));
    const plainR = await receiver(() => ({ status: 200, body: 'ok' }));
    const paced = await p.subscribe(pacedR, 'paced');
    const plain = await p.subscribe(plainR, 'plain');
    const ev = await p.publish('limit.test', { n: 1 });
    await pacedR.waitFor(() => pacedR.forEvent(ev).length === 1, { timeout: 60_000, message: 'the paced receiver got the event' });
    await plainR.waitFor(() => plainR.forEvent(ev).length === 1, { timeout: 60_000, message: 'the plain receiver got the event' });
    // What the API says, once the answers are stored: the limit for one, none for the other.
    const limit = await poll(async () => (await p.api('GET', `/_postguard/v1/webhooks/${paced.id}`)).json?.receiver_limit, {
      timeout: 60_000,
      interval: 250,
      message: 'the paced subscription’s receiver_limit',
    });
    assert.equal(limit.remaining, 0);
    await poll(async () => (await p.api('GET', `/_postguard/v1/deliveries?subscription_id=${plain.id}`)).json?.data?.[0]?.status === 'delivered', {
      timeout: 60_000,
      interval: 250,
      message: 'the plain subscription’s delivery delivered',
    });
    assert.equal((await p.api('GET', `/_postguard/v1/webhooks/${plain.id}`)).json.receiver_limit, null);

    const { context, page } = await p.open();
    try {
      await view(page, 'Webhooks');
      const pacedCell = page.locator(`tr[data-subscription-id="${paced.id}"] td.receiver-limit`);
      const plainCell = page.locator(`tr[data-subscription-id="${plain.id}"] td.receiver-limit`);
      await shown(page, pacedCell);
      assert.match(await pacedCell.textContent(), new RegExp(`^0 left, resets ${UTC} \\(deliveries wait until then\\)$`));
      // The reset shown is the one the receiver advertised (to the second, in UTC).
      const at = Date.parse((await pacedCell.locator('.nowrap').nth(1).textContent()).replace(' ', 'T'));
      assert.equal(at, Math.floor(limit.reset_at / 1000) * 1000);
      assert.equal(Number(await pacedCell.locator('[data-reset-at]').getAttribute('data-reset-at')), limit.reset_at);
      assert.equal(await plainCell.textContent(), 'none advertised');
      assert.ok((await page.locator('table thead th').allTextContents()).includes('Receiver limit (UTC)'));
      await shot(page, 'webhooks-receiver-limit');
      axeFindings.webhooks = await axe(page, 'Webhooks with a receiver’s limit');
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });
});

describe('ordering keys in Deliveries and Events', () => {
  let p;
  let orderR;
  /** Event id and delivery of each event, by name: k1 (fails), k2, k3 (key K), l1 (key L). */
  const ev = {};
  const del = {};

  before(async () => {
    p = await project('order');
    orderR = await receiver((r) => (r.json?.data?.fail ? { status: 500, body: 'not now' } : { status: 200, body: 'ok' }));
    await p.subscribe(orderR, 'ordered');
    // Published one after the other: publish order is the lanes' order.
    ev.k1 = await p.publish('order.updated', { n: 1, fail: true }, { ordering_key: 'K' });
    ev.k2 = await p.publish('order.updated', { n: 2 }, { ordering_key: 'K' });
    ev.k3 = await p.publish('order.updated', { n: 3 }, { ordering_key: 'K' });
    ev.l1 = await p.publish('order.updated', { n: 4 }, { ordering_key: 'L' });
    // (Received is what a receiver's waitFor can see; what it answered, the API says below.)
    await orderR.waitFor(() => orderR.forEvent(ev.k1).length > 0, { timeout: 60_000, message: 'K’s first event received (answered 500)' });
    await orderR.waitFor(() => orderR.forEvent(ev.l1).length > 0, { timeout: 60_000, message: 'L’s event received (another key passes)' });
    // The API's view first (the server's side of ordering keys): K's successors wait, each for
    // the one before it; the UI is then checked against a settled state, not a race.
    let rows = [];
    const list = await poll(async () => {
      rows = (await p.api('GET', '/_postguard/v1/deliveries?limit=20')).json?.data ?? [];
      for (const [n, id] of Object.entries(ev)) del[n] = rows.find((d) => d.event_id === id);
      const settled = del.k1?.status === 'failed' && del.l1?.status === 'delivered';
      const ok = rows.length === 4 && settled && del.k2?.blocked_by === del.k1?.id && del.k3?.blocked_by === del.k2?.id;
      return ok && rows;
    }, { timeout: 60_000, interval: 500, message: 'K’s successors blocked_by the delivery before them in GET /deliveries' }).catch((e) => {
      const seen = rows.map(({ id, event_id, status, ordering_key, blocked_by }) => ({ id, event_id, status, ordering_key, blocked_by }));
      throw new Error(`${e.message}; events ${JSON.stringify(ev)}; deliveries ${JSON.stringify(seen)}`);
    });
    assert.deepEqual(list.map((d) => d.ordering_key).sort(), ['K', 'K', 'K', 'L']);
    assert.equal(del.k1.blocked_by, null);
    assert.equal(del.l1.blocked_by, null);
    assert.equal(orderR.forEvent(ev.k2).length + orderR.forEvent(ev.k3).length, 0, 'K’s successors not sent while its first fails');
  });

  it('Deliveries: every delivery shows its ordering key, K’s successors wait for the delivery before them, and the wait opens it', async () => {
    const { context, page } = await p.open();
    try {
      await view(page, 'Deliveries');
      const rows = page.locator('tr[data-delivery-id]');
      await poll(async () => (await rows.count()) === 4, { timeout: 30_000, message: 'four deliveries listed' });
      assert.ok((await page.locator('table thead th').allTextContents()).includes('Ordering key'));
      const cell = (name) => page.locator(`tr[data-delivery-id="${del[name].id}"] td.ordering`);
      for (const [name, key] of [['k1', 'K'], ['k2', 'K'], ['k3', 'K'], ['l1', 'L']]) {
        assert.equal(await cell(name).locator('code.ordering-key').textContent(), key, `${name}’s key`);
      }
      // Only K's successors wait, each for the one before it.
      assert.equal(await cell('k1').getByRole('button').count(), 0, 'K’s first waits for nothing');
      assert.equal(await cell('l1').getByRole('button').count(), 0, 'L’s waits for nothing');
      assert.equal(await cell('k2').getByRole('button').textContent(), `waiting for ${del.k1.id}`);
      assert.equal(await cell('k3').getByRole('button').textContent(), `waiting for ${del.k2.id}`);
      assert.equal(await page.locator(`tr[data-delivery-id="${del.l1.id}"] .badge`).textContent(), 'delivered');
      // The wait opens the delivery waited for: k2's details, in the list, with the focus.
      await cell('k3').getByRole('button', { name: `waiting for ${del.k2.id}` }).click();
      const k2Details = page.getByRole('button', { name: `Details of delivery ${del.k2.id}` });
      await poll(async () => (await k2Details.getAttribute('aria-expanded')) === 'true', { timeout: 15_000, message: 'k2’s details opened' });
      await shown(page, page.locator(`tr[data-delivery-id="${del.k2.id}"] + tr.detail`).getByLabel('Payload'));
      assert.equal(await k2Details.evaluate((b) => b === document.activeElement), true, 'the focus on the delivery opened');
      await shot(page, 'deliveries-ordering');
      axeFindings.deliveries = await axe(page, 'Deliveries with ordering keys');

      // A delivery waited for that is not listed (filtered out) opens alone, below the list.
      await page.getByLabel('Event ID').fill(ev.k3);
      await page.getByRole('button', { name: 'Filter' }).click();
      await poll(async () => (await rows.count()) === 1 && (await rows.first().getAttribute('data-delivery-id')) === del.k3.id, { timeout: 15_000, message: 'only k3' });
      await page.getByRole('button', { name: `waiting for ${del.k2.id}` }).click();
      const k2Alone = page.getByRole('region', { name: `Delivery ${del.k2.id}` });
      await shown(page, k2Alone);
      await shown(page, k2Alone.getByLabel('Payload'));
      // …and its own wait leads on to K's first, which has the failed attempt.
      await k2Alone.getByRole('button', { name: `waiting for ${del.k1.id}` }).click();
      const k1Alone = page.getByRole('region', { name: `Delivery ${del.k1.id}` });
      await shown(page, k1Alone);
      await shown(page, k1Alone.getByRole('region', { name: 'Attempts' }).getByText('500', { exact: true }));
      assert.equal(await page.getByRole('region', { name: `Delivery ${del.k2.id}` }).count(), 0, 'one delivery below the list at a time');
      axeFindings.deliveriesWaited = await axe(page, 'Deliveries with a delivery waited for');
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });

  it('Events: every event shows its ordering key; an event’s deliveries show the one each waits for', async () => {
    const { context, page } = await p.open();
    try {
      await view(page, 'Events');
      const rows = page.locator('tr[data-event-id]');
      await poll(async () => (await rows.count()) === 4, { timeout: 30_000, message: 'four events listed' });
      for (const [name, key] of [['k1', 'K'], ['k2', 'K'], ['k3', 'K'], ['l1', 'L']]) {
        assert.equal(await page.locator(`tr[data-event-id="${ev[name]}"] td.ordering`).textContent(), key, `${name}’s key`);
      }
      await page.getByRole('button', { name: `Deliveries of event ${ev.k3}` }).click();
      const nested = page.getByRole('table', { name: `Deliveries of event ${ev.k3}` });
      await shown(page, nested);
      assert.equal(await nested.locator(`tr[data-delivery-id="${del.k3.id}"] td.waiting`).textContent(), del.k2.id);
      await shot(page, 'events-ordering');
      axeFindings.events = await axe(page, 'Events with ordering keys');
      await assertNothingRan(page);
    } finally {
      await context.close();
    }
  });
});
