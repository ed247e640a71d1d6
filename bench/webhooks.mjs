// Webhook delivery throughput: events published through POST /_postguard/v1/events, each
// delivered once through the queue consumer to a local receiver answering 200; deliveries/s
// from the first publish to the last delivery received. Two gateways identical but for the
// consumer's max_batch_size (wrangler.toml's value, and 1) alternate, 3 rounds; the
// receiver's own capacity (autocannon POSTing the same body straight to it) is the ceiling.
// Every delivery is counted once by webhook-id; every 25th is verified with standardwebhooks.
// Usage: node bench/webhooks.mjs [events per round] [rounds]
import http from 'node:http';
import { Webhook } from 'standardwebhooks';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN, loadWranglerToml } from '../tests/support/gateway.mjs';
import { load, median, spread, writeSection } from './results.mjs';

const EVENTS = Number(process.argv[2] ?? 1000);
const ROUNDS = Number(process.argv[3] ?? 3);
const PUBLISHERS = 16;
const CONFIG = {
  webhooks: { allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 10_000_000 } },
};
const toml = loadWranglerToml();
const mainQueue = toml.queues.consumers[0];
const BATCH = mainQueue.max_batch_size ?? 10;

// The receiver: answers 200 at once, records the first arrival of each webhook-id.
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
    if (id && seen.has(id)) duplicates += 1;
    else if (id) {
      seen.set(id, performance.now());
      if (secret && seen.size % 25 === 0) {
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
const gateways = {};
for (const batch of [BATCH, 1]) {
  gateways[batch] = await startGateway({
    originUrl: origin.url,
    vars: { POSTGUARD_CONFIG: cfg(CONFIG) },
    patchOptions: (o) => { o.queueConsumers[mainQueue.queue].maxBatchSize = batch; },
  });
}

async function round(gw, project, n) {
  seen = new Map();
  duplicates = 0;
  const t0 = performance.now();
  let next = 0;
  const publisher = async () => {
    while (next < n) {
      const i = next++;
      const res = await gw.admin('POST', '/_postguard/v1/events', { project, type: 'bench.tick', data: { n: i } }, { token: ORIGIN_TOKEN });
      if (res.status !== 202) throw new Error(`publish answered ${res.status}: ${res.text}`);
    }
  };
  await Promise.all(Array.from({ length: PUBLISHERS }, publisher));
  const published = performance.now() - t0;
  const deadline = Date.now() + 120_000;
  while (seen.size < n) {
    if (Date.now() > deadline) throw new Error(`only ${seen.size} of ${n} deliveries arrived within 120 s`);
    await new Promise((r) => setTimeout(r, 20));
  }
  const last = Math.max(...seen.values());
  return { published, total: last - t0, perSecond: n / ((last - t0) / 1000), duplicates };
}

try {
  const projects = {};
  for (const [batch, gw] of Object.entries(gateways)) {
    projects[batch] = `bench-${batch}`;
    const { key } = await gw.createKey({ project: projects[batch], plan: 'big' });
    const sub = await gw.admin('POST', '/_postguard/v1/webhooks', { url: `${receiverUrl}/hook`, events: ['*'] }, { token: key });
    if (sub.status !== 201) throw new Error(`subscription: ${sub.status} ${sub.text}`);
    gateways[batch].secret = sub.json.secret;
    secret = sub.json.secret;
    await round(gw, projects[batch], 50); // warm-up
  }
  const results = { [BATCH]: [], 1: [] };
  const direct = [];
  const sample = JSON.stringify({ id: 'evt_x', type: 'bench.tick', created_at: 0, data: { n: 1 } });
  for (let i = 0; i < ROUNDS; i++) {
    for (const batch of [BATCH, 1]) {
      secret = gateways[batch].secret;
      const r = await round(gateways[batch], projects[batch], EVENTS);
      results[batch].push(r);
      console.log(`batch ${batch}: ${JSON.stringify(r)}`);
    }
    direct.push((await load({ url: `${receiverUrl}/hook`, method: 'POST', body: sample, connections: 16, duration: 4, headers: { 'content-type': 'application/json' } })).requests.average);
  }
  const rate = (rs) => rs.map((r) => r.perSecond);
  const ms = (xs) => `${median(xs).toFixed(0)} (${spread(xs, 0)})`;
  const row = (batch) => {
    const rs = results[batch];
    const ratio = rs.map((r, i) => r.perSecond / results[1][i].perSecond);
    return `| ${batch} | ${ms(rate(rs))} | ${median(ratio).toFixed(2)} (${spread(ratio)}) | ${ms(rs.map((r) => (EVENTS / r.published) * 1000))} | ${ms(rs.map((r) => r.total))} | ${ms(rs.map((r) => r.total - r.published))} | ${rs.reduce((a, r) => a + r.duplicates, 0)} |`;
  };
  writeSection('webhooks', `## Webhook delivery throughput

\`node bench/webhooks.mjs ${EVENTS} ${ROUNDS}\` — ${new Date().toISOString().slice(0, 10)}; ${EVENTS} events per round, one subscription, a local
receiver answering 200 at once, ${PUBLISHERS} concurrent publishers, ${ROUNDS} rounds alternating two gateways that differ only in the
queue consumer's max_batch_size (${BATCH} from wrangler.toml, and 1). Deliveries/s: first publish → last delivery received.
Publishing and delivery share the isolate, and delivery cannot outrun publishing: "last publish → last delivery" is
how far the consumer lags behind. A batch costs two D1 round trips whatever its size (one query loads its
deliveries, one \`batch()\` records its attempts); its POSTs run concurrently.

| max_batch_size | deliveries/s, median (spread) | ÷ batch size 1 | events published/s | first publish → last delivery, ms | last publish → last delivery, ms | duplicate arrivals |
|---|---|---|---|---|---|---|
${row(BATCH)}
${row(1)}

The receiver alone (autocannon POSTing the same body to it, 16 connections): ${ms(direct)} req/s, the ceiling;
postguard at batch size ${BATCH} reaches ${(median(rate(results[BATCH])) / median(direct)).toFixed(3)} of it. Signatures verified with standardwebhooks:
${verified} sampled, ${failedVerification} failed.
`);
  if (failedVerification) process.exitCode = 1;
} finally {
  for (const gw of Object.values(gateways)) await gw.dispose();
  await origin.kill();
  receiver.close();
}
