// Quota notices (docs/webhooks.md "Quota notices"): a plan's `notify_at` publishes
// `postguard.quota.threshold` {key_prefix, policy, limit, used, percent, resets_at} to the key's
// project once per (key, policy, window, threshold) — decided by the key's object in the admission
// that counts the request and published by its alarm through the one write path. Three rounds of 10
// simultaneous requests against a limit of 10 with notify_at [50, 100] give exactly one event at
// 50 % and one at 100 %; a key of a plan without notify_at gives none. With limits.edge on and
// small blocks, requests from four locations (Miniflare's `cf.colo`, set by the MF-CF-Blob header)
// admitted from blocks the key's object leases still give one event per threshold (decided where
// the key's object charges). Real worker under Miniflare, real origin, a real receiver verifying
// the signatures with both libraries.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, burst, poll, bearer, cfg } from './support/gateway.mjs';
import { stays } from './support/util.mjs';

const TYPE = 'postguard.quota.threshold';
const CONFIG = {
  origin: { timeout_ms: 8000 },
  webhooks: { schedule_s: [1, 1], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: {
    // A window of an hour: the three rounds stay in one window however slow the machine.
    noticed: { requests_per_window: 10, window_s: 3600, notify_at: [50, 100] },
    quiet: { requests_per_window: 10, window_s: 3600 },
  },
};

async function subscribe(gw, key, url) {
  const res = await gw.fetch('/_postguard/v1/webhooks', {
    method: 'POST',
    headers: { ...bearer(key), 'content-type': 'application/json' },
    body: JSON.stringify({ url, events: [TYPE] }),
  });
  assert.equal(res.status, 201, res.text);
  return res.json;
}

/** The project's events of the notices' type (all pages). */
async function feed(gw, key) {
  const out = [];
  let cursor = null;
  do {
    const q = new URLSearchParams({ limit: '200', type: TYPE, ...(cursor ? { cursor } : {}) });
    const page = await gw.fetch(`/_postguard/v1/events?${q}`, { headers: bearer(key) });
    assert.equal(page.status, 200, page.text);
    out.push(...page.json.data);
    cursor = page.json.next_cursor;
  } while (cursor);
  return out;
}

/** `rounds` rounds of `size` requests sent truly at once; every answer's status. */
async function rounds(gw, key, n, { size = 10, headers = () => ({}) } = {}) {
  const statuses = [];
  for (let r = 0; r < n; r++) {
    const reqs = Array.from({ length: size }, (_, i) => ({
      method: 'GET',
      path: `/things/${r}-${i}`,
      headers: { ...bearer(key), ...headers(i) },
    }));
    statuses.push(...(await burst(gw.url, reqs)).map((res) => res.status));
  }
  return statuses;
}

describe('quota notices', () => {
  let origin;
  let receiver;
  let gw;
  let noticed;
  let quiet;
  let sub;

  before(async () => {
    origin = await startOrigin();
    receiver = await startReceiver();
    gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
    noticed = await gw.createKey({ project: 'notices', plan: 'noticed' });
    quiet = await gw.createKey({ project: 'notices', plan: 'quiet' });
    sub = await subscribe(gw, noticed.key, `${receiver.url}/hooks`);
    receiver.setSecrets([sub.secret]);
  });
  after(async () => {
    await gw?.dispose();
    await receiver?.close();
    await origin?.kill();
  });

  it('3 rounds of 10 simultaneous requests: one signed event at 50 % and one at 100 % of the window', async () => {
    const started = Date.now();
    const statuses = await rounds(gw, noticed.key, 3);
    assert.equal(statuses.filter((s) => s === 200).length, 10, `statuses: ${statuses}`);
    assert.equal(statuses.filter((s) => s === 429).length, 20, `statuses: ${statuses}`);
    const got = await receiver.waitFor(
      (reqs) => reqs.filter((r) => r.json?.type === TYPE).length >= 2,
      { timeout: 60000, message: 'two quota notices delivered' },
    );
    assert.ok(got);
    // Any further delivery would come by now (the alarm publishes at once; retries are 1 s apart).
    await stays(
      async () => receiver.requests.filter((r) => r.json?.type === TYPE).length === 2,
      3000,
      'no third notice',
    );
    const delivered = receiver.requests.filter((r) => r.json?.type === TYPE);
    for (const r of delivered) {
      assert.ok(r.verified, `signature verifies with both libraries: ${JSON.stringify(r.verification)}`);
      assert.equal(r.headers['webhook-id'], r.json.id);
      assert.match(r.json.id, /^evt_q[0-9a-f]{24}$/);
    }
    const byPercent = Object.fromEntries(delivered.map((r) => [r.json.data.percent, r.json.data]));
    assert.deepEqual(Object.keys(byPercent).map(Number).sort((a, b) => a - b), [50, 100]);
    const resetsAt = byPercent[50].resets_at;
    assert.deepEqual(byPercent[50], { key_prefix: noticed.prefix, policy: 'default', limit: 10, used: 5, percent: 50, resets_at: resetsAt });
    assert.deepEqual(byPercent[100], { key_prefix: noticed.prefix, policy: 'default', limit: 10, used: 10, percent: 100, resets_at: resetsAt });
    // The window of an hour that began with the first round (generous bounds).
    const resets = Date.parse(resetsAt);
    assert.ok(resets >= started + 3_540_000 && resets <= Date.now() + 3_600_000, `resets_at ${resetsAt}`);
    // The feed holds each once, delivered.
    const events = await poll(async () => {
      const evs = await feed(gw, noticed.key);
      return evs.length === 2 && evs.every((e) => e.deliveries.delivered === e.deliveries.total && e.deliveries.total === 1) && evs;
    }, { timeout: 30000, interval: 200, message: 'two notices in the feed, delivered' });
    assert.deepEqual(events.map((e) => e.id).sort(), delivered.map((r) => r.json.id).sort());
  });

  it('a plan without notify_at publishes nothing', async () => {
    const statuses = await rounds(gw, quiet.key, 2);
    assert.equal(statuses.filter((s) => s === 200).length, 10, `statuses: ${statuses}`);
    await stays(
      async () => !receiver.requests.some((r) => r.json?.type === TYPE && r.json.data.key_prefix === quiet.prefix),
      3000,
      'no notice for the quiet key',
    );
    const evs = await feed(gw, quiet.key);
    assert.ok(evs.every((e) => e.data.key_prefix !== quiet.prefix), 'none in the feed');
  });
});

describe('quota notices with admission at the edge', () => {
  const COLOS = ['AMS', 'CDG', 'FRA', 'LHR'];
  let origin;
  let receiver;
  let gw;
  let k;

  before(async () => {
    origin = await startOrigin();
    receiver = await startReceiver();
    gw = await startGateway({
      originUrl: origin.url,
      vars: {
        POSTGUARD_CONFIG: cfg({
          ...CONFIG,
          plans: { edged: { requests_per_window: 100, window_s: 3600, notify_at: [25, 50, 100] } },
          limits: { unauthenticated_per_minute: 1000000, edge: { enabled: true, min_block: 2, max_block: 8 } },
        }),
      },
    });
    k = await gw.createKey({ project: 'edged', plan: 'edged' });
    const sub = await subscribe(gw, k.key, `${receiver.url}/hooks`);
    receiver.setSecrets([sub.secret]);
  });
  after(async () => {
    await gw?.dispose();
    await receiver?.close();
    await origin?.kill();
  });

  it('blocks leased to four locations: each threshold once, the window never over its quota', async () => {
    const at = (i) => ({ 'mf-cf-blob': JSON.stringify({ colo: COLOS[i % COLOS.length] }) });
    const statuses = await rounds(gw, k.key, 6, { size: 40, headers: at });
    const admitted = statuses.filter((s) => s === 200).length;
    assert.ok(admitted <= 100 && admitted >= 25, `admitted ${admitted} of 240 (statuses ${[...new Set(statuses)]})`);
    const notices = () => receiver.requests.filter((r) => r.json?.type === TYPE);
    await receiver.waitFor(() => notices().length >= 2, { timeout: 60000, message: 'the 25 % and 50 % notices delivered' });
    await stays(async () => new Set(notices().map((r) => r.json.id)).size === notices().length, 3000, 'no notice twice');
    const percents = notices().map((r) => r.json.data.percent).sort((a, b) => a - b);
    assert.deepEqual(percents.filter((p) => p !== 100), [25, 50], `percents ${percents}`);
    assert.ok(percents.filter((p) => p === 100).length <= 1, `percents ${percents}`);
    for (const r of notices()) {
      assert.ok(r.verified, `signature verifies: ${JSON.stringify(r.verification)}`);
      assert.equal(r.json.data.key_prefix, k.prefix);
      assert.ok(r.json.data.used >= Math.ceil(r.json.data.percent) && r.json.data.used <= 100, JSON.stringify(r.json.data));
    }
  });
});
