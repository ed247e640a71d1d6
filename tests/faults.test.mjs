// Fault tests (docs/request-path.md, docs/idempotency.md, docs/webhooks.md): repeated simultaneous bursts against one Idempotency-Key and one
// rate-limit window, the origin killed mid-request and restarted on the same port, and 1,000 webhook
// events to one flaky receiver and one that is down throughout. They assert outcomes, never timings.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import {
  startGateway, burst, problem, poll, bearer, cfg, sleep, ORIGIN_TOKEN,
} from './support/gateway.mjs';

const LEASE_S = 5;
const RL_N = 10;
const RL_WINDOW_S = 3600;
const SCHEDULE = [1, 1, 1, 1];
const MAX_ATTEMPTS = SCHEDULE.length + 1;
const CONFIG = {
  // Generous: on a loaded 2-core machine a 200 ms origin answer must not become a 504 (which
  // releases the claim by contract and lets a later request execute again).
  origin: { timeout_ms: 4000 },
  idempotency: { lease_s: LEASE_S },
  plans: {
    big: { requests_per_window: 10000000, window_s: 3600, idempotency_ttl_s: 86400 },
    rl10: { requests_per_window: RL_N, window_s: RL_WINDOW_S, idempotency_ttl_s: 86400 },
  },
  // timeout_ms: generous, so a loaded machine does not turn a receiver's answer into a timeout.
  webhooks: { schedule_s: SCHEDULE, timeout_ms: 10000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
};

let origin;
let gw;
const receivers = [];

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  for (const r of receivers) await r.close();
  await gw?.dispose();
  await origin?.kill();
});

const ik = (name) => `${name}-${crypto.randomBytes(8).toString('hex')}`;
const show = (res) => `${res.status} ${JSON.stringify(res.headers)} ${res.text?.slice(0, 300)}`;

/** Start an origin on a fixed port; retries briefly if the port is not free yet (EADDRINUSE). */
async function restartOriginOn(port) {
  for (let i = 0; ; i++) {
    try {
      return await startOrigin({ port });
    } catch (e) {
      if (e.code !== 'EADDRINUSE' || i >= 50) throw e;
      await sleep(100);
    }
  }
}

describe('idempotency under simultaneous duplicates', () => {
  const TRIALS = 20;
  const PER_TRIAL = 200;

  it(`${TRIALS} trials × ${PER_TRIAL} simultaneous same-key POSTs → the origin executes each key exactly once`, { timeout: 120000 }, async () => {
    const apiKey = (await gw.createKey({ project: 'faults-idem', plan: 'big' })).key;
    const counts = [];
    const problems = [];
    const tally = { originals: 0, replays: 0, conflicts: 0 };
    for (let t = 0; t < TRIALS; t++) {
      const k = ik(`burst${t}`);
      const body = JSON.stringify({ amount: 1000 + t, currency: 'EUR', trial: t });
      const reqs = Array.from({ length: PER_TRIAL }, () => ({
        method: 'POST',
        path: '/faults/payments',
        headers: { ...bearer(apiKey), 'content-type': 'application/json', 'idempotency-key': k, 'x-demo-delay-ms': '200' },
        body,
      }));
      const res = await burst(gw.url, reqs);
      counts.push(origin.stats.count(k));
      const originals = res.filter((r) => r.status === 201 && r.headers['idempotent-replayed'] === undefined);
      if (originals.length !== 1) {
        problems.push(`trial ${t}: ${originals.length} non-replayed 201s (statuses ${JSON.stringify(res.map((r) => r.status))})`);
        continue;
      }
      const original = originals[0];
      tally.originals++;
      if (original.json?.execution !== 1) problems.push(`trial ${t}: original reports execution ${original.json?.execution}`);
      for (const r of res) {
        if (r === original) continue;
        if (r.status === 201) {
          if (r.headers['idempotent-replayed'] !== 'true') problems.push(`trial ${t}: a second original: ${show(r)}`);
          else if (!r.body.equals(original.body)) problems.push(`trial ${t}: replay body differs:\n  ${original.text.slice(0, 200)}\n  ${r.text.slice(0, 200)}`);
          else if (r.headers['x-origin-execution'] !== original.headers['x-origin-execution']) problems.push(`trial ${t}: replay X-Origin-Execution ${r.headers['x-origin-execution']}`);
          else tally.replays++;
        } else if (r.status === 409) {
          try {
            problem(r, { status: 409, code: 'IDEMPOTENCY_KEY_IN_PROGRESS' });
            const ra = Number(r.headers['retry-after']);
            assert.ok(Number.isInteger(ra) && ra >= 1 && ra <= LEASE_S + 1, `Retry-After ${r.headers['retry-after']}`);
            tally.conflicts++;
          } catch (e) {
            problems.push(`trial ${t}: bad 409: ${e.message}`);
          }
        } else {
          problems.push(`trial ${t}: unexpected ${show(r)}`);
        }
      }
    }
    assert.deepEqual(counts, Array(TRIALS).fill(1), `origin executions per trial: ${JSON.stringify(counts)}`);
    assert.deepEqual(problems.slice(0, 10), [], `${problems.length} problems; executions per trial: ${JSON.stringify(counts)}`);
    assert.equal(tally.originals + tally.replays + tally.conflicts, TRIALS * PER_TRIAL, JSON.stringify(tally));
    console.log(`# faults-idempotency: ${JSON.stringify({ trials: TRIALS, per_trial: PER_TRIAL, executions: counts, ...tally })}`);
  });
});

describe('rate limit under simultaneous bursts', () => {
  const TRIALS = 10;

  it(`${TRIALS} trials: a fresh key (limit ${RL_N}/${RL_WINDOW_S}s), ${10 * RL_N} simultaneous GETs → exactly ${RL_N} admitted, the rest 429`, { timeout: 120000 }, async () => {
    const admittedPerTrial = [];
    const problems = [];
    for (let t = 0; t < TRIALS; t++) {
      const k = await gw.createKey({ project: 'faults-rl', plan: 'rl10' });
      const reqs = Array.from({ length: 10 * RL_N }, (_, i) => ({ path: `/faults/rl?t=${t}&i=${i}`, headers: bearer(k.key) }));
      const res = await burst(gw.url, reqs);
      // Admitted = not refused: a request the origin was too slow for on a loaded machine
      // (504 ORIGIN_TIMEOUT) was admitted and forwarded all the same.
      const ok = res.filter((r) => (r.status >= 200 && r.status < 300) || (r.status === 504 && r.json?.code === 'ORIGIN_TIMEOUT'));
      const limited = res.filter((r) => r.status === 429);
      admittedPerTrial.push(ok.length);
      const other = res.filter((r) => !ok.includes(r) && !limited.includes(r));
      if (other.length) problems.push(`trial ${t}: unexpected ${other.map((r) => r.status).join(',')}: ${show(other[0])}`);
      for (const r of limited) {
        try {
          problem(r, { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
          const ra = Number(r.headers['retry-after']);
          assert.ok(Number.isInteger(ra) && ra >= 1 && ra <= RL_WINDOW_S, `Retry-After ${r.headers['retry-after']}`);
        } catch (e) {
          problems.push(`trial ${t}: bad 429: ${e.message}`);
          break;
        }
      }
      // The origin saw exactly the admitted requests (matched by X-Request-Id), nothing else of this key.
      const seen = origin.stats.find((x) => x.headers['x-postguard-key-prefix'] === k.prefix).map((x) => x.headers['x-request-id']).sort();
      const admittedIds = ok.map((r) => r.headers['x-request-id']).sort();
      if (JSON.stringify(seen) !== JSON.stringify(admittedIds)) {
        problems.push(`trial ${t}: origin saw ${seen.length} requests ${JSON.stringify(seen)}, admitted ${admittedIds.length} ${JSON.stringify(admittedIds)}`);
      }
    }
    assert.deepEqual(admittedPerTrial, Array(TRIALS).fill(RL_N), `exactly ${RL_N} admitted per trial: ${JSON.stringify(admittedPerTrial)}`);
    assert.deepEqual(problems.slice(0, 10), [], `${problems.length} problems`);
    console.log(`# faults-ratelimit: ${JSON.stringify({ trials: TRIALS, burst: 10 * RL_N, admitted: admittedPerTrial })}`);
  });
});

describe('origin killed mid-request, restarted on the same port', () => {
  it('the in-flight request fails 502/504, the key is not stuck, the new origin executes it exactly once, then it replays', { timeout: 60000 }, async () => {
    const apiKey = (await gw.createKey({ project: 'faults-kill', plan: 'big' })).key;
    const k = ik('killed');
    const body = '{"amount":4242}';
    const send = (extra = {}) => gw.fetch('/faults/charge', {
      method: 'POST',
      headers: { ...bearer(apiKey), 'content-type': 'application/json', 'idempotency-key': k, ...extra },
      body,
    });

    const old = origin;
    const port = old.port;
    const firstP = send({ 'x-demo-hang': '1' });
    await poll(() => old.stats.count(k) === 1, { timeout: 15000, message: 'the origin to receive the hanging request' });
    await old.kill();
    origin = await restartOriginOn(port);

    const first = await firstP;
    assert.ok([502, 504].includes(first.status), `the interrupted request fails with 502/504: ${show(first)}`);
    const p = problem(first);
    assert.ok(['ORIGIN_UNREACHABLE', 'ORIGIN_TIMEOUT'].includes(p.code), `problem code ${p.code}`);
    assert.equal(first.headers['idempotent-replayed'], undefined);

    const retry = await send();
    assert.equal(retry.status, 201, `a retry with the same key and body runs on the new origin (not stuck): ${show(retry)}`);
    assert.equal(retry.headers['idempotent-replayed'], undefined, 'the retry is an execution, not a replay');
    assert.equal(retry.json?.execution, 1, 'executed by the new origin (its first execution of the key)');

    const again = await send();
    assert.equal(again.status, 201, show(again));
    assert.equal(again.headers['idempotent-replayed'], 'true', `a further retry is a replay: ${show(again)}`);
    assert.ok(again.body.equals(retry.body), 'the replay is byte-identical');

    assert.equal(origin.stats.count(k), 1, 'the new origin executed it exactly once');
    assert.equal(old.stats.count(k), 1, 'the killed origin saw it exactly once');
  });
});

describe('webhooks: flaky receiver and a receiver down throughout', () => {
  const EVENTS = 1000;
  const BATCH = 50;

  // Bounded generously: ~7,000 attempts on a shared machine; speed is bench/webhooks.mjs's job.
  it(`${EVENTS} events × 2 subscriptions (A ~50 % 5xx, B down) → all ${2 * EVENTS} deliveries final, none missing, B all dead_letter`, { timeout: 300000 }, async () => {
    const project = `faults-wh-${crypto.randomBytes(4).toString('hex')}`;
    const { key } = await gw.createKey({ project, plan: 'big' });
    const statuses = [500, 502, 503, 504];
    const rcvA = await startReceiver({
      behaviour: () => (Math.random() < 0.5 ? { status: statuses[Math.floor(Math.random() * statuses.length)], body: 'flaky' } : { status: 200, body: 'ok' }),
    });
    receivers.push(rcvA);
    const rcvB = await startReceiver({ behaviour: 'down' });
    receivers.push(rcvB);
    assert.equal(rcvB.listening, false, 'B is down (closed port)');

    const subscribe = async (url) => {
      const res = await gw.admin('POST', '/_postguard/v1/webhooks', { url, events: ['*'] }, { token: key });
      assert.equal(res.status, 201, show(res));
      return res.json;
    };
    const subA = await subscribe(`${rcvA.url}/a`);
    const subB = await subscribe(`${rcvB.url}/b`);
    rcvA.setSecrets([subA.secret]);
    rcvB.setSecrets([subB.secret]);

    const t0 = Date.now();
    const ids = [];
    for (let i = 0; i < EVENTS; i += BATCH) {
      const batch = [];
      for (let j = i; j < Math.min(EVENTS, i + BATCH); j++) {
        batch.push(gw.admin('POST', '/_postguard/v1/events', { project, type: `fault.${j % 2 ? 'odd' : 'even'}`, data: { id: `obj_${j}`, n: j } }, { token: ORIGIN_TOKEN }));
      }
      for (const res of await Promise.all(batch)) {
        assert.equal(res.status, 202, show(res));
        ids.push(res.json.id);
      }
    }
    assert.equal(new Set(ids).size, EVENTS, 'distinct event ids');

    const list = async () => {
      const out = [];
      let cursor = null;
      for (let page = 0; page < 100; page++) {
        const res = await gw.admin('GET', `/_postguard/v1/deliveries?limit=200${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`, undefined, { token: key });
        assert.equal(res.status, 200, show(res));
        out.push(...res.json.data);
        cursor = res.json.next_cursor;
        if (!cursor) return out;
      }
      throw new Error('more than 100 pages of deliveries');
    };
    const isFinal = (d) => d.status === 'delivered' || d.status === 'dead_letter';

    let all = [];
    try {
      await poll(async () => {
        all = await list();
        return all.length >= 2 * EVENTS && all.every(isFinal);
      }, { timeout: 240000, interval: 1000, message: `all ${2 * EVENTS} deliveries delivered or dead_letter` });
    } catch (e) {
      const by = {};
      for (const d of all) by[d.status] = (by[d.status] ?? 0) + 1;
      throw new Error(`${e.message}: ${all.length} deliveries, by status ${JSON.stringify(by)}`);
    }
    const seconds = (Date.now() - t0) / 1000;

    // One delivery per (event, subscription); nothing missing, nothing extra.
    assert.equal(new Set(all.map((d) => d.id)).size, all.length, 'pagination returns no duplicates');
    const perSub = { [subA.id]: new Map(), [subB.id]: new Map() };
    const problems = [];
    for (const d of all) {
      const m = perSub[d.subscription_id];
      if (!m) {
        problems.push(`delivery ${d.id} to an unknown subscription ${d.subscription_id}`);
        continue;
      }
      if (m.has(d.event_id)) problems.push(`${d.event_id}: two deliveries to ${d.subscription_id}`);
      m.set(d.event_id, d);
    }
    const missing = [];
    for (const [name, sub] of [['A', subA], ['B', subB]]) {
      for (const id of ids) if (!perSub[sub.id].has(id)) missing.push(`${name}:${id}`);
    }
    assert.deepEqual(missing.slice(0, 20), [], `${missing.length} deliveries missing`);
    assert.equal(all.length, 2 * EVENTS, 'exactly one delivery per event per subscription');

    // B: down throughout → every delivery dead_letter after the whole schedule, B never reached.
    for (const d of perSub[subB.id].values()) {
      if (d.status !== 'dead_letter' || d.attempts_made !== MAX_ATTEMPTS) problems.push(`B ${d.event_id}: ${d.status} after ${d.attempts_made} attempts`);
    }
    assert.equal(rcvB.requests.length, 0, 'B is down: it received nothing');

    // A: every request verified with both libraries; outcomes consistent with its answers.
    const unverified = rcvA.requests.filter((r) => !r.verified);
    assert.equal(unverified.length, 0, `every request A received verifies with standardwebhooks and svix; first failure: ${JSON.stringify(unverified[0]?.verification)}`);
    const known = new Set(ids);
    const okAnswers = new Map();
    for (const r of rcvA.requests) {
      const id = r.headers['webhook-id'];
      if (!known.has(id)) problems.push(`A received an unknown event ${id}`);
      if (r.answered >= 200 && r.answered < 300) okAnswers.set(id, (okAnswers.get(id) ?? 0) + 1);
    }
    for (const d of perSub[subA.id].values()) {
      if (d.status === 'delivered' && !okAnswers.get(d.event_id)) problems.push(`A ${d.event_id}: delivered but A never answered 2xx`);
      if (d.status === 'dead_letter' && d.attempts_made !== MAX_ATTEMPTS) problems.push(`A ${d.event_id}: dead_letter after ${d.attempts_made} attempts`);
    }
    assert.deepEqual(problems.slice(0, 20), [], `${problems.length} inconsistencies`);

    const aList = [...perSub[subA.id].values()];
    const bList = [...perSub[subB.id].values()];
    const sum = (xs) => xs.reduce((n, d) => n + d.attempts_made, 0);
    const result = {
      events: EVENTS,
      deliveries: all.length,
      delivered: all.filter((d) => d.status === 'delivered').length,
      dead_letter: all.filter((d) => d.status === 'dead_letter').length,
      attempts: sum(all),
      a: {
        delivered: aList.filter((d) => d.status === 'delivered').length,
        dead_letter: aList.filter((d) => d.status === 'dead_letter').length,
        attempts: sum(aList),
        requests_received: rcvA.requests.length,
        verified_both_libraries: rcvA.requests.filter((r) => r.verified).length,
      },
      b: { dead_letter: bList.filter((d) => d.status === 'dead_letter').length, attempts: sum(bList), requests_received: rcvB.requests.length },
      seconds: +seconds.toFixed(2),
    };
    console.log(`# faults-webhooks: ${JSON.stringify(result)}`);
  });
});
