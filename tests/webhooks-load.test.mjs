// Webhook delivery under load (docs/webhooks.md): 500 events (WEBHOOK_LOAD_EVENTS) to a receiver that fails ~50 % of requests
// at random with a 5xx. Every event must end delivered or dead_letter, none missing from the delivery
// log, every request signed (verified with standardwebhooks and svix), attempts accounted for.
// Prints the measured counts for the README / CHANGELOG.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';

const SCHEDULE = [1, 1, 1, 1];
const MAX_ATTEMPTS = SCHEDULE.length + 1;
const EVENTS = Number(process.env.WEBHOOK_LOAD_EVENTS ?? 500);
const FAIL_RATE = 0.5;
const CONFIG = {
  webhooks: { schedule_s: SCHEDULE, timeout_ms: 1000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 100000 } },
  origin: { timeout_ms: 1000 },
  idempotency: { lease_s: 3 },
};

let origin;
let gw;
let rcv;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await rcv?.close();
  await gw?.dispose();
  await origin?.kill();
});

const show = (res) => `${res.status} ${res.text?.slice(0, 500)}`;

describe('load', () => {
  it(`${EVENTS} events, receiver failing ~${FAIL_RATE * 100} % with 5xx → every event delivered or dead_letter, none missing`, { timeout: 120000 }, async () => {
    const project = `wh-load-${crypto.randomBytes(4).toString('hex')}`;
    const { key } = await gw.createKey({ project, plan: 'big' });
    const statuses = [500, 502, 503, 504];
    rcv = await startReceiver({
      behaviour: () => (Math.random() < FAIL_RATE ? { status: statuses[Math.floor(Math.random() * statuses.length)], body: 'flaky' } : { status: 200, body: 'ok' }),
    });
    const subRes = await gw.admin('POST', '/_postguard/v1/webhooks', { url: `${rcv.url}/load`, events: ['*'] }, { token: key });
    assert.equal(subRes.status, 201, show(subRes));
    rcv.setSecrets([subRes.json.secret]);

    const t0 = Date.now();
    const ids = [];
    const CHUNK = 20;
    for (let i = 0; i < EVENTS; i += CHUNK) {
      const batch = [];
      for (let j = i; j < Math.min(EVENTS, i + CHUNK); j++) {
        batch.push(gw.admin('POST', '/_postguard/v1/events', { project, type: `load.${j % 3 === 0 ? 'a' : 'b'}`, data: { id: `obj_${j}`, n: j } }, { token: ORIGIN_TOKEN }));
      }
      for (const res of await Promise.all(batch)) {
        assert.equal(res.status, 202, show(res));
        ids.push(res.json.id);
      }
    }
    const publishedMs = Date.now() - t0;
    assert.equal(new Set(ids).size, EVENTS, 'distinct event ids');

    const list = async (query) => {
      const out = [];
      let cursor = null;
      for (let page = 0; page < 50; page++) {
        const res = await gw.admin('GET', `/_postguard/v1/deliveries?limit=200${query}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`, undefined, { token: key });
        assert.equal(res.status, 200, show(res));
        out.push(...res.json.data);
        cursor = res.json.next_cursor;
        if (!cursor) return out;
      }
      throw new Error('too many pages');
    };

    let last = [];
    try {
      await poll(async () => {
        last = await list('');
        return last.length === EVENTS && last.every((d) => d.status === 'delivered' || d.status === 'dead_letter');
      }, { timeout: 90000, interval: 500, message: 'every delivery delivered or dead_letter' });
    } catch (e) {
      const by = {};
      for (const d of last) by[d.status] = (by[d.status] ?? 0) + 1;
      throw new Error(`${e.message}: ${last.length} deliveries, by status ${JSON.stringify(by)}`);
    }
    const seconds = (Date.now() - t0) / 1000;

    // Count by status through the API (filter + pagination), and cross-check with the unfiltered log.
    const byStatus = {};
    for (const s of ['pending', 'failed', 'delivered', 'dead_letter']) byStatus[s] = await list(`&status=${s}`);
    const all = await list('');
    assert.equal(all.length, EVENTS, 'one delivery per event in the log');
    assert.equal(new Set(all.map((d) => d.id)).size, EVENTS, 'pagination returns no duplicates');
    assert.deepEqual(new Set(all.map((d) => d.event_id)), new Set(ids), 'no event missing from the log');
    assert.equal(byStatus.pending.length, 0);
    assert.equal(byStatus.failed.length, 0);
    assert.equal(byStatus.delivered.length + byStatus.dead_letter.length, EVENTS, 'the status filters partition the log');
    const filtered = new Set([...byStatus.delivered, ...byStatus.dead_letter].map((d) => d.id));
    assert.equal(filtered.size, EVENTS);

    // Per event: receiver requests = attempts_made; attempts numbered 1..n; outcome consistent with answers.
    const reqsByEvent = new Map();
    for (const r of rcv.requests) {
      const id = r.headers['webhook-id'];
      if (!reqsByEvent.has(id)) reqsByEvent.set(id, []);
      reqsByEvent.get(id).push(r);
    }
    const unsigned = rcv.requests.filter((r) => !r.verified);
    assert.equal(unsigned.length, 0, `every request verifies with both libraries; first failure: ${JSON.stringify(unsigned[0]?.verification)}`);
    const problems = [];
    let attemptsLogged = 0;
    for (const d of all) {
      attemptsLogged += d.attempts_made;
      const reqs = (reqsByEvent.get(d.event_id) ?? []).sort((a, b) => a.attempt - b.attempt);
      const nums = reqs.map((r) => r.attempt);
      if (reqs.length !== d.attempts_made) problems.push(`${d.event_id}: ${reqs.length} requests received, attempts_made ${d.attempts_made}`);
      if (nums.join() !== nums.map((_, i) => i + 1).join()) problems.push(`${d.event_id}: X-Delivery-Attempt sequence ${nums.join()}`);
      const ok = reqs.filter((r) => r.answered >= 200 && r.answered < 300);
      if (d.status === 'delivered') {
        if (ok.length !== 1) problems.push(`${d.event_id}: delivered with ${ok.length} 2xx answers`);
        else if (reqs.at(-1) !== ok[0]) problems.push(`${d.event_id}: an attempt after the 2xx`);
      } else {
        if (ok.length !== 0) problems.push(`${d.event_id}: dead_letter although the receiver answered 2xx`);
        if (d.attempts_made !== MAX_ATTEMPTS) problems.push(`${d.event_id}: dead_letter after ${d.attempts_made} attempts (expected ${MAX_ATTEMPTS})`);
      }
      if (new Set(reqs.map((r) => r.body)).size > 1) problems.push(`${d.event_id}: body differs between attempts`);
    }
    const stray = [...reqsByEvent.keys()].filter((id) => !ids.includes(id));
    if (stray.length) problems.push(`requests for unknown event ids: ${stray.join(', ')}`);
    assert.deepEqual(problems.slice(0, 20), [], `${problems.length} inconsistencies`);
    assert.equal(rcv.requests.length, attemptsLogged, 'every request the receiver got is an attempt in the log');

    const deliveredBodies = rcv.requests.filter((r) => r.answered >= 200 && r.answered < 300);
    assert.equal(deliveredBodies.length, byStatus.delivered.length);
    for (const r of deliveredBodies) {
      assert.ok(r.verified, 'every delivered body verifies with standardwebhooks and svix');
      assert.match(r.json?.data?.id ?? '', /^obj_\d+$/, 'the delivered body carries its data');
    }

    const result = {
      events: EVENTS,
      delivered: byStatus.delivered.length,
      dead_letter: byStatus.dead_letter.length,
      attempts: rcv.requests.length,
      failed_answers: rcv.requests.filter((r) => r.answered >= 500).length,
      verified_both_libraries: rcv.requests.filter((r) => r.verified).length,
      publish_s: +(publishedMs / 1000).toFixed(2),
      seconds_until_all_settled: +seconds.toFixed(2),
    };
    console.log(`webhooks-load: ${JSON.stringify(result)}`);
  });
});
