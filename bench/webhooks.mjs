// Webhook throughput, publish and delivery. Events are published through
// POST /_postguard/v1/events by 16 concurrent publishers, each delivered through the queue
// consumer to a local receiver answering 200; every delivery is counted once by
// (subscription, webhook-id), and every 25th is verified with standardwebhooks.
//   - delivery: one subscription; deliveries/s from the first publish to the last delivery
//     received, at the consumer's max_batch_size from wrangler.toml and at 1;
//   - publish: five subscriptions per event; events/s from the first publish to the last 202
//     (the deliveries drain before the next round).
// Contenders alternate, `rounds` times. BEFORE_ROOT=<checkout with its own build> adds that
// build (its own wrangler.toml) as one more contender in the same rounds. BATCHES=100,10,1
// replaces the batch sizes of this build (BATCH_TIMEOUT=s the batch timeout) to explore.
// The receiver's own capacity (autocannon POSTing the same body straight to it) is the ceiling.
// The publish floor (bench/publish-floor.mjs: the thinnest JS worker doing the I/O §7 asks of a
// publish) is one more contender; PUBLISH_FLOOR=full,d1,none adds its variants with less I/O
// (those deliver nothing, so only their publish rate is measured), PUBLISH_FLOOR=0 leaves it out.
// Usage: [BEFORE_ROOT=…] [PUBLISH_FLOOR=full|0|full,d1,none] node bench/webhooks.mjs [events per round] [rounds]
import fs from 'node:fs';
import http from 'node:http';
import { Webhook } from 'standardwebhooks';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN, loadWranglerToml, ROOT } from '../tests/support/gateway.mjs';
import { commitOf, load, median, spread, writeSection } from './results.mjs';
import { startPublishFloor } from './publish-floor.mjs';

const EVENTS = Number(process.argv[2] ?? 1000);
const ROUNDS = Number(process.argv[3] ?? 3);
const PUBLISHERS = 16;
const FANOUT = 5;
const BEFORE_ROOT = process.env.BEFORE_ROOT;
const CONFIG = {
  webhooks: { allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 10_000_000 } },
};
// The daily publish quotas (ADR 0017) raised out of the way: a run publishes far more than a
// project's default day. A build from before them (c3c9f48) would refuse the settings as
// unknown, so they are added only for builds whose core knows them.
const QUOTAS = { events_per_project_per_day: 100_000_000, deliveries_per_project_per_day: 1_000_000_000, bytes_per_project_per_day: 8_000_000_000 };
const knowsQuotas = (root) => {
  // The webhooks section was in config.rs until issue 33 moved it to webhooks/config.rs.
  const src = `${root ?? ROOT}/crates/postguard-core/src`;
  return ['config.rs', 'webhooks/config.rs'].some((f) => {
    try {
      return fs.readFileSync(`${src}/${f}`, 'utf8').includes('events_per_project_per_day');
    } catch {
      return false;
    }
  });
};
const configOf = (root) => (knowsQuotas(root) ? { ...CONFIG, webhooks: { ...CONFIG.webhooks, ...QUOTAS } } : CONFIG);
const consumerOf = (root) => loadWranglerToml(root && `${root}/wrangler.toml`).queues.consumers[0];
const mainQueue = consumerOf();
const BATCH = mainQueue.max_batch_size ?? 10;
const TIMEOUT = process.env.BATCH_TIMEOUT === undefined ? undefined : Number(process.env.BATCH_TIMEOUT);
const BATCHES = process.env.BATCHES ? process.env.BATCHES.split(',').map(Number) : [BATCH, 1];

// The receiver: answers 200 at once, records the first arrival of each (path, webhook-id).
let secret = null;
let seen = new Map();
let verified = 0;
let failedVerification = 0;
let duplicates = 0;
const receiver = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const id = req.headers['webhook-id'];
    const key = `${req.url} ${id}`;
    if (id && seen.has(key)) duplicates += 1;
    else if (id) {
      seen.set(key, performance.now());
      if (secret && req.url === '/hook/0' && seen.size % 25 === 0) {
        try {
          new Webhook(secret).verify(Buffer.concat(chunks).toString('utf8'), req.headers);
          verified += 1;
        } catch {
          failedVerification += 1;
        }
      }
    }
    res.writeHead(200, { 'content-type': 'text/plain' }).end('ok');
  });
});
await new Promise((r) => receiver.listen(0, '127.0.0.1', r));
const receiverUrl = `http://127.0.0.1:${receiver.address().port}`;

const origin = await startOrigin();
const contenders = [];
async function contender(label, root, batch, timeout) {
  if (root) process.env.POSTGUARD_ROOT = root; // the harness reads the build from here
  const q = consumerOf(root);
  const gw = await startGateway({
    originUrl: origin.url,
    vars: { POSTGUARD_CONFIG: cfg(configOf(root)) },
    patchOptions: (o) => {
      o.queueConsumers[q.queue].maxBatchSize = batch;
      if (timeout !== undefined) o.queueConsumers[q.queue].maxBatchTimeout = timeout;
    },
  });
  delete process.env.POSTGUARD_ROOT;
  contenders.push({ label, batch, timeout: timeout ?? q.max_batch_timeout, gw, delivery: [], publish: [] });
}
for (const batch of BATCHES) await contender(`after (${commitOf(ROOT)})`, undefined, batch, TIMEOUT);
// 'full' last: without BEFORE_ROOT it is the last row, the one the ratios divide by.
const FLOORS = (process.env.PUBLISH_FLOOR ?? 'full').split(',').filter((m) => m && m !== '0').sort((a, b) => (a === 'full') - (b === 'full'));
for (const mode of FLOORS) {
  const gw = await startPublishFloor({ token: ORIGIN_TOKEN, batch: BATCH, timeout: mainQueue.max_batch_timeout, mode });
  const label = mode === 'full' ? 'publish floor (bench/publish-floor.mjs)' : `publish floor, ${mode === 'd1' ? 'D1 only, no sendBatch' : 'no I/O'}`;
  contenders.push({ label, floor: mode, batch: BATCH, timeout: mainQueue.max_batch_timeout, gw, delivery: [], publish: [] });
}
if (BEFORE_ROOT) {
  const q = consumerOf(BEFORE_ROOT);
  await contender(`before (${commitOf(BEFORE_ROOT)})`, BEFORE_ROOT, q.max_batch_size ?? 10, undefined);
}

/** Publishes `n` events to `project` (16 at a time); waits for `n × subs` deliveries. */
async function round(c, project, n, subs) {
  seen = new Map();
  duplicates = 0;
  secret = c.secrets[project];
  const t0 = performance.now();
  let next = 0;
  const publisher = async () => {
    while (next < n) {
      const i = next++;
      const res = await c.gw.admin('POST', '/_postguard/v1/events', { project, type: 'bench.tick', data: { n: i } }, { token: ORIGIN_TOKEN });
      if (res.status !== 202) throw new Error(`publish answered ${res.status}: ${res.text}`);
    }
  };
  await Promise.all(Array.from({ length: PUBLISHERS }, publisher));
  const published = performance.now() - t0;
  if (c.floor && c.floor !== 'full') return { drainPerSecond: NaN, published, publishPerSecond: n / (published / 1000), total: NaN, perSecond: NaN, duplicates };
  const backlog = n * subs - seen.size; // left for the consumer alone
  const deadline = Date.now() + 180_000;
  while (seen.size < n * subs) {
    if (Date.now() > deadline) throw new Error(`only ${seen.size} of ${n * subs} deliveries arrived within 180 s`);
    await new Promise((r) => setTimeout(r, 20));
  }
  const last = Math.max(...seen.values());
  const drained = last - t0 - published;
  return {
    drainPerSecond: backlog > 0 && drained > 0 ? backlog / (drained / 1000) : NaN,
    published,
    publishPerSecond: n / (published / 1000),
    total: last - t0,
    perSecond: (n * subs) / ((last - t0) / 1000),
    duplicates,
  };
}

try {
  for (const [i, c] of contenders.entries()) {
    c.secrets = {};
    c.projects = { one: `bench-${i}-one`, fan: `bench-${i}-fan` };
    for (const [kind, project] of Object.entries(c.projects)) {
      if (c.floor) {
        for (let s = 0; s < (kind === 'one' ? 1 : FANOUT); s++) {
          const secret = await c.gw.subscribe(project, `${receiverUrl}/hook/${s}`);
          if (s === 0) c.secrets[project] = secret;
        }
        continue;
      }
      const { key } = await c.gw.createKey({ project, plan: 'big' });
      for (let s = 0; s < (kind === 'one' ? 1 : FANOUT); s++) {
        const sub = await c.gw.admin('POST', '/_postguard/v1/webhooks', { url: `${receiverUrl}/hook/${s}`, events: ['*'] }, { token: key });
        if (sub.status !== 201) throw new Error(`subscription: ${sub.status} ${sub.text}`);
        if (s === 0) c.secrets[project] = sub.json.secret;
      }
    }
    await round(c, c.projects.one, 50, 1); // warm-up
    await round(c, c.projects.fan, 50, FANOUT);
  }
  const direct = [];
  const sample = JSON.stringify({ id: 'evt_x', type: 'bench.tick', created_at: 0, data: { n: 1 } });
  for (let r = 0; r < ROUNDS; r++) {
    for (const c of contenders) {
      const d = await round(c, c.projects.one, EVENTS, 1);
      c.delivery.push(d);
      console.log(`${c.label} batch ${c.batch}, delivery: ${JSON.stringify(d)}`);
    }
    for (const c of contenders) {
      const p = await round(c, c.projects.fan, EVENTS, FANOUT);
      c.publish.push(p);
      console.log(`${c.label} batch ${c.batch}, publish ×${FANOUT}: ${JSON.stringify(p)}`);
    }
    direct.push((await load({ url: `${receiverUrl}/hook/0`, method: 'POST', body: sample, connections: 16, duration: 4, headers: { 'content-type': 'application/json' } })).requests.average);
  }
  // A floor variant without deliveries has no delivery figures: shown as a dash.
  const ms = (xs) => (xs.every(Number.isNaN) ? '—' : `${median(xs).toFixed(0)} (${spread(xs, 0)})`);
  const ratio = (xs, ys) => {
    const rs = xs.map((x, i) => x / ys[i]);
    return rs.every(Number.isNaN) ? '—' : `${median(rs).toFixed(2)} (${spread(rs)})`;
  };
  const base = contenders.at(-1);
  const perSecond = (rs) => rs.map((r) => r.perSecond);
  const publishRate = (rs) => rs.map((r) => r.publishPerSecond);
  const deliveryRow = (c) => {
    const rs = c.delivery;
    return `| ${c.label} | ${c.batch} | ${c.timeout} | ${ms(perSecond(rs))} | ${ratio(perSecond(rs), perSecond(base.delivery))} | ${ms(publishRate(rs))} | ${ms(rs.map((r) => r.total))} | ${ms(rs.map((r) => r.total - r.published))} | ${rs.reduce((a, r) => a + r.duplicates, 0)} |`;
  };
  const publishRow = (c) => {
    const rs = c.publish;
    const drain = rs.map((r) => r.drainPerSecond);
    return `| ${c.label} | ${c.batch} | ${ms(publishRate(rs))} | ${ratio(publishRate(rs), publishRate(base.publish))} | ${ms(perSecond(rs))} | ${ratio(perSecond(rs), perSecond(base.publish))} | ${ms(drain)} | ${ratio(drain, base.publish.map((r) => r.drainPerSecond))} | ${rs.reduce((a, r) => a + r.duplicates, 0)} |`;
  };
  const best = Math.max(...contenders.filter((c) => !c.floor).map((c) => median(perSecond(c.delivery))));
  const floor = contenders.find((c) => c.floor === 'full');
  const first = contenders[0];
  const floorLine = floor
    ? `\npostguard (${first.label}, batch ${first.batch}) ÷ the publish floor, same rounds: events published/s ${ratio(publishRate(first.publish), publishRate(floor.publish))} with ${FANOUT} subscriptions, ${ratio(publishRate(first.delivery), publishRate(floor.delivery))} with one; deliveries/s with one subscription ${ratio(perSecond(first.delivery), perSecond(floor.delivery))}. The floor (bench/publish-floor.mjs) makes one D1 read batch, one D1 write transaction and one \`sendBatch\` per publish, and omits the audit row, the group commit and the rest its header lists.\n`
    : '';
  writeSection('webhooks', `## Webhook throughput: publish and delivery

\`${BEFORE_ROOT ? 'BEFORE_ROOT=<build of the code before> ' : ''}node bench/webhooks.mjs ${EVENTS} ${ROUNDS}\` — ${new Date().toISOString().slice(0, 10)}; ${EVENTS} events per round, ${PUBLISHERS} concurrent
publishers, a local receiver answering 200 at once, ${ROUNDS} rounds alternating the contenders (ratios against the last row).
Publishing and delivery share the isolate, and delivery cannot outrun publishing: "last publish → last delivery" is
how far the consumer lags behind. Miniflare's queue hands the consumer one batch at a time (the next once the last
has returned), a batch of up to max_batch_size, sent when full or max_batch_timeout after its first message.

Delivery, one subscription (deliveries/s: first publish → last delivery received):

| build | max_batch_size | max_batch_timeout, s | deliveries/s, median (spread) | ÷ last row | events published/s | first publish → last delivery, ms | last publish → last delivery, ms | duplicate arrivals |
|---|---|---|---|---|---|---|---|---|
${contenders.map(deliveryRow).join('\n')}

Publish, ${FANOUT} subscriptions per event (events/s: first publish → last 202; deliveries/s: ${FANOUT} × events, first publish →
last delivery; drain: the consumer alone, the deliveries not yet received at the last 202 ÷ the time from it to the last delivery):

| build | max_batch_size | events published/s, median (spread) | ÷ last row | deliveries/s | ÷ last row | drain deliveries/s | ÷ last row | duplicate arrivals |
|---|---|---|---|---|---|---|---|---|
${contenders.map(publishRow).join('\n')}
${floorLine}
The receiver alone (autocannon POSTing the same body to it, 16 connections): ${ms(direct)} req/s, the ceiling;
the best contender's deliveries/s reach ${(best / median(direct)).toFixed(3)} of it. Signatures verified with standardwebhooks:
${verified} sampled, ${failedVerification} failed.
`);
  if (failedVerification) process.exitCode = 1;
} finally {
  for (const c of contenders) await c.gw.dispose();
  await origin.kill();
  receiver.close();
}
