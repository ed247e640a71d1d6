// Webhook delivery under concurrency and failure (issue 9, ADR 0009), end to end: the real built
// worker under Miniflare with its real queues and D1, real receivers (tests/support/receiver.mjs).
//
// Locally the queue consumer runs one batch at a time, which hides races; in production consumers
// run concurrently. So these tests dispatch batches concurrently themselves with
// `mf.getWorker().queue(...)`, carrying the jobs a scheduled attempt and a manual retry produce.
// Jobs that lose a race are re-sent through the real queue and consumed by the real consumer.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startOrigin } from './support/origin.mjs';
import { verifyBoth, receiverPool } from './support/receiver.mjs';
import { startGateway, poll, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';
import { rewriteDeliveries } from './support/webhook-shards.mjs';
import { uniq, show, stays } from './support/util.mjs';

const QUEUE = 'postguard-deliveries';
// A long schedule: the automatic follow-up of a failed attempt never fires within a test, so every
// attempt here is one the test dispatched (or a race loser re-sent by the consumer).
const CONFIG = {
  webhooks: { schedule_s: [60, 60], timeout_ms: 8000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'], secret_overlap_s: 3, requeue_after_s: 1 },
  plans: { big: { requests_per_window: 100000 } },
};

let origin;
let gw;
const receiver = receiverPool();

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await receiver.closeAll();
  await gw?.dispose();
  await origin?.kill();
});

/** A project with a key, a subscription to `rcv` and one published event; returns its delivery. */
async function setup(g, tag, rcv) {
  const name = uniq(`race-${tag}`);
  const { key } = await g.createKey({ project: name, plan: 'big' });
  const api = (method, p, body) => g.admin(method, p, body, { token: key });
  const sub = await api('POST', '/_postguard/v1/webhooks', { url: rcv.url, events: ['*'] });
  assert.equal(sub.status, 201, show(sub));
  rcv.addSecret(sub.json.secret);
  const pub = await g.admin('POST', '/_postguard/v1/events', { project: name, type: 'race.test', data: { tag } }, { token: ORIGIN_TOKEN });
  assert.equal(pub.status, 202, show(pub));
  const get = async (id) => {
    const res = await api('GET', `/_postguard/v1/deliveries/${id}`);
    assert.equal(res.status, 200, show(res));
    return res.json;
  };
  const row = await poll(async () => (await api('GET', '/_postguard/v1/deliveries')).json?.data?.[0], { message: `the delivery of ${tag}` });
  let last;
  const wait = (pred, message, timeout = 30000) =>
    poll(async () => {
      last = await get(row.id);
      return pred(last) && last;
    }, { timeout, interval: 100, message }).catch((e) => {
      throw new Error(`${e.message}; last: ${JSON.stringify(last)}`);
    });
  const job = { delivery_id: row.id, project: name, subscription_id: sub.json.id };
  return { name, key, api, sub: sub.json, eventId: pub.json.id, id: row.id, job, get, wait };
}

/** Dispatch one batch per job, all at once, straight into the consumer. */
async function dispatchAtOnce(g, jobs) {
  const worker = await g.mf.getWorker();
  const batches = jobs.map((body) => [{ id: crypto.randomUUID(), timestamp: new Date(), attempts: 1, body }]);
  const out = await Promise.all(batches.map((msgs) => worker.queue(QUEUE, msgs)));
  for (const [i, o] of out.entries()) {
    assert.equal(o.outcome, 'ok', `batch ${i}: ${JSON.stringify(o)}`);
    assert.deepEqual(o.retryMessages ?? [], [], `batch ${i} asked for no queue retry: ${JSON.stringify(o)}`);
  }
  return out;
}

const wire = (rcv) => rcv.requests.map((r) => r.attempt);
const logged = (d) => d.attempts.map((a) => a.attempt).sort((a, b) => a - b);

describe('delivery races (batches dispatched concurrently)', { concurrency: true }, () => {
  // (a) Round k: the first request the receiver gets after attempt 1 is slow and fails, the next succeeds.
  for (const round of [1, 2, 3]) {
    it(`a slow failing attempt and a succeeding one of the same delivery → delivered, stays so, nothing more sent (round ${round})`, async () => {
      let s;
      const rcv = await receiver(async (req, n) => {
        if (n === 1) return { status: 500 }; // attempt 1, by the real consumer: failed, next in 60 s
        if (n === 2) {
          // Slow: its failure answers only once the success has been recorded, so it lands after.
          await s.wait((d) => d.status === 'delivered', 'the success recorded before the slow failure answers');
          return { status: 503 };
        }
        return { status: 200 };
      });
      s = await setup(gw, `slow-${round}`, rcv);
      const failed = await s.wait((d) => d.status === 'failed' && d.attempts.length === 1, 'attempt 1 failed');
      assert.ok(Number.isInteger(failed.next_attempt_at), JSON.stringify(failed));
      // Its next attempt falls due now (rather than in 60 s): the job the queue then hands to a
      // consumer, next to a manual retry's job.
      // The delivery lives in its project's shard (ADR 0035): rewritten through its restore.
      const due = Date.now();
      assert.equal(await rewriteDeliveries(gw, s.name, (x) => ({ ...x, next_attempt_at: due })), 1);
      // The jobs as the gateway writes them: the delivery with its project and subscription.
      const scheduled = { ...s.job, not_before: due };
      const manual = { ...s.job, manual: true };
      await dispatchAtOnce(gw, round === 2 ? [manual, scheduled] : [scheduled, manual]);

      const d = await s.wait((x) => x.status === 'delivered' && x.attempts.length === 3, 'delivered, and the slow attempt recorded');
      assert.deepEqual(logged(d), [1, 2, 3], `distinct attempt numbers in the log: ${JSON.stringify(d.attempts)}`);
      assert.deepEqual([...wire(rcv)].sort(), [1, 2, 3], `distinct X-Delivery-Attempt on the wire: ${JSON.stringify(wire(rcv))}`);
      assert.ok(rcv.requests.every((r) => r.verified), 'every request signed');
      const slow = d.attempts.find((a) => a.status_code === 503);
      const ok = d.attempts.find((a) => a.status_code === 200);
      assert.ok(slow && ok, JSON.stringify(d.attempts));
      assert.ok(slow.at + slow.duration_ms > ok.at + ok.duration_ms, 'the failure landed after the success');
      assert.equal(d.next_attempt_at, null, 'nothing scheduled after delivery');
      assert.equal(slow.next_retry_at, null, 'the late failure schedules nothing (its record was settled again)');
      // Late jobs for a delivered delivery (a duplicate scheduled job, another manual retry) send nothing.
      await dispatchAtOnce(gw, [scheduled, manual]);
      await stays(async () => {
        const now = await s.get(s.id);
        return now.status === 'delivered' && now.attempts_made === 3 && rcv.requests.length === 3;
      }, 3000, 'delivered stays delivered and nothing more is sent');
    });
  }

  // (b)
  it('several manual retries at once → distinct attempt numbers in the log and on the wire', async () => {
    const rcv = await receiver((req, n) => (n === 1 ? { status: 401 } : { status: 503 }));
    const s = await setup(gw, 'manual', rcv);
    await s.wait((d) => d.status === 'dead_letter' && d.attempts.length === 1, 'attempt 1 dead-lettered (401)');
    const k = 4;
    await dispatchAtOnce(gw, Array.from({ length: k }, () => ({ ...s.job, manual: true })));
    const d = await s.wait((x) => x.attempts.length === k + 1, `${k} manual retries recorded`);
    const expected = Array.from({ length: k + 1 }, (_, i) => i + 1);
    assert.deepEqual(logged(d), expected, `attempt numbers in the log: ${JSON.stringify(d.attempts)}`);
    assert.deepEqual([...wire(rcv)].sort((a, b) => a - b), expected, `X-Delivery-Attempt on the wire: ${JSON.stringify(wire(rcv))}`);
    assert.equal(new Set(d.attempts.map((a) => a.request_id)).size, k + 1, 'a new request id per attempt');
    assert.equal(d.attempts_made, k + 1);
    assert.equal(d.status, 'dead_letter', 'failed manual retries leave a dead letter as it was');
    await stays(() => rcv.requests.length === k + 1, 2000, 'one request per manual retry');
  });

  it('a manual retry of a delivered delivery → 202, nothing is sent again', async () => {
    const rcv = await receiver();
    const s = await setup(gw, 'again', rcv);
    await s.wait((d) => d.status === 'delivered', 'delivered');
    const res = await s.api('POST', `/_postguard/v1/deliveries/${s.id}/retry`);
    assert.equal(res.status, 202, show(res));
    await stays(async () => rcv.requests.length === 1 && (await s.get(s.id)).attempts.length === 1, 2500, 'a delivered delivery is never sent again');
  });
});

describe('failures', { concurrency: true }, () => {
  // (d)
  it('a consumer that keeps failing on a message → the dead-letter queue → dead_letter, with the reason', async () => {
    const rcv = await receiver();
    const name = uniq('race-dlq');
    const { key } = await gw.createKey({ project: name, plan: 'big' });
    const sub = await gw.admin('POST', '/_postguard/v1/webhooks', { url: rcv.url, events: ['*'] }, { token: key });
    assert.equal(sub.status, 201, show(sub));
    // A secret the consumer cannot sign with: every run of the job fails inside the gateway.
    const db = await gw.mf.getD1Database('DB');
    await db.prepare("UPDATE subscriptions SET secret = 'whsec_%%%' WHERE id = ?").bind(sub.json.id).run();
    const pub = await gw.admin('POST', '/_postguard/v1/events', { project: name, type: 'dlq.test', data: {} }, { token: ORIGIN_TOKEN });
    assert.equal(pub.status, 202, show(pub));
    const row = await poll(async () => (await gw.admin('GET', '/_postguard/v1/deliveries', undefined, { token: key })).json?.data?.[0], { message: 'the delivery' });
    let last;
    const d = await poll(async () => {
      last = (await gw.admin('GET', `/_postguard/v1/deliveries/${row.id}`, undefined, { token: key })).json;
      return last?.status === 'dead_letter' && last;
    }, { timeout: 60000, interval: 200, message: 'dead_letter through the dead-letter queue' }).catch((e) => {
      throw new Error(`${e.message}; last: ${JSON.stringify(last)}`);
    });
    assert.equal(rcv.requests.length, 0, 'nothing could be signed, nothing was sent');
    assert.equal(d.attempts.length, 1, JSON.stringify(d.attempts));
    assert.match(d.attempts[0].error, /dead-letter queue/);
    assert.equal(d.attempts[0].status_code, null);
    assert.equal(d.next_attempt_at, null);
    assert.ok(!JSON.stringify(d).includes('whsec_'), 'no secret in the log');
  });

  // (e)
  it('after rotate-secret the old secret signs for the configured overlap (3 s), then stops', async () => {
    const rcv = await receiver();
    const name = uniq('race-rotate');
    const { key } = await gw.createKey({ project: name, plan: 'big' });
    const sub = await gw.admin('POST', '/_postguard/v1/webhooks', { url: rcv.url, events: ['*'] }, { token: key });
    assert.equal(sub.status, 201, show(sub));
    const oldSecret = sub.json.secret;
    const rotatedFrom = Date.now();
    const rot = await gw.admin('POST', `/_postguard/v1/webhooks/${sub.json.id}/rotate-secret`, undefined, { token: key });
    assert.equal(rot.status, 200, show(rot));
    const newSecret = rot.json.secret;
    rcv.setSecrets([newSecret]);
    const publishOne = async (i) => {
      const pub = await gw.admin('POST', '/_postguard/v1/events', { project: name, type: 'rot.test', data: { i } }, { token: ORIGIN_TOKEN });
      assert.equal(pub.status, 202, show(pub));
      return rcv.waitFor(() => rcv.forEvent(pub.json.id)[0], { message: `event ${i}` });
    };
    const first = await publishOne(0);
    const sigs = (r) => r.headers['webhook-signature'].split(' ');
    assert.equal(sigs(first).length, 2, 'within the overlap: signed by the new and the old secret');
    assert.ok(first.verified, 'the new secret verifies');
    // Publish until a delivery is signed by the new secret alone (the condition, not a fixed wait).
    let i = 1;
    const after = await poll(async () => {
      const r = await publishOne(i++);
      return sigs(r).length === 1 && r;
    }, { timeout: 30000, interval: 200, message: 'a delivery signed only with the new secret' });
    assert.ok(after.verified, 'the new secret verifies alone');
    const ts = Number(after.headers['webhook-timestamp']) * 1000;
    assert.ok(ts >= rotatedFrom + 3000 - 1000, `the old secret stopped no earlier than the overlap (${ts - rotatedFrom} ms after rotation)`);
    assert.equal(verifyBoth(oldSecret, first.body, first.headers).ok, true, 'within the overlap the old secret verified');
    assert.notEqual(verifyBoth(oldSecret, after.body, after.headers).standardwebhooks, true, 'the old secret no longer verifies');
  });
});

// (c)
describe('restart', () => {
  // Miniflare keeps queue messages in memory (Cloudflare Queues persist them): the restart loses the
  // message, and the delivery row — durable in D1 before the 202 — is what brings it back, through the
  // cron's re-queueing of overdue deliveries (webhooks.requeue_after_s, 1 s here).
  it('an event published (202), then the gateway restarted on its persisted state → delivered exactly once', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'postguard-restart-'));
    const rcv = await receiver();
    // First life: the consumer waits 30 s to fill a batch, so the message is still queued when it stops.
    const slowBatches = (o) => {
      o.queueConsumers[QUEUE].maxBatchTimeout = 30;
    };
    const start = (patchOptions) => startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) }, persistDir: dir, patchOptions });
    let g = await start(slowBatches);
    let eventId;
    let key;
    try {
      const name = uniq('race-restart');
      ({ key } = await g.createKey({ project: name, plan: 'big' }));
      const sub = await g.admin('POST', '/_postguard/v1/webhooks', { url: rcv.url, events: ['*'] }, { token: key });
      assert.equal(sub.status, 201, show(sub));
      rcv.addSecret(sub.json.secret);
      const pub = await g.admin('POST', '/_postguard/v1/events', { project: name, type: 'restart.test', data: {} }, { token: ORIGIN_TOKEN });
      assert.equal(pub.status, 202, show(pub));
      eventId = pub.json.id;
    } finally {
      await g.dispose();
    }
    assert.equal(rcv.requests.length, 0, 'not delivered before the restart');
    g = await start();
    const cron = async () => (await g.mf.getWorker()).scheduled({ cron: '17 3 * * *' });
    try {
      // The condition: the receiver has it; each round runs the daily job once more.
      await poll(async () => rcv.requests.length >= 1 || (await cron(), false), { timeout: 30000, interval: 500, message: 'the delivery after the restart' });
      const row = await poll(async () => (await g.admin('GET', '/_postguard/v1/deliveries', undefined, { token: key })).json?.data?.[0], { message: 'the delivery' });
      const d = await poll(async () => {
        const x = (await g.admin('GET', `/_postguard/v1/deliveries/${row.id}`, undefined, { token: key })).json;
        return x?.status === 'delivered' && x;
      }, { message: 'delivered' });
      assert.equal(d.event_id, eventId);
      assert.equal(d.attempts.length, 1);
      assert.equal(rcv.requests[0].headers['webhook-id'], eventId);
      assert.ok(rcv.requests[0].verified);
      // Delivered: the daily job re-queues nothing more.
      await stays(async () => (await cron(), rcv.requests.length === 1), 2500, 'delivered exactly once');
    } finally {
      await g.dispose();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
