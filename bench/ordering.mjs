// Benchmark (issue 36 #1): what ordering keys cost. One gateway (this build), a local receiver
// answering 200 at once; every arrival counted once by (path, webhook-id). Two measures, each
// keyed ÷ unkeyed in alternating rounds in one process (the machine is shared and noisy: only
// ratios side by side mean anything):
//   - publish: EVENTS events by 16 concurrent publishers to one project with 5 subscriptions;
//     events/s from the first publish to the last 202, with `ordering_key` (100 keys, round robin)
//     and without (the deliveries drain before the next run);
//   - consumer: EVENTS events to one subscription; deliveries/s from the first publish to the last
//     delivery received, with 100 ordering keys (each lane serial: a delivery goes when the one
//     before it in its key is delivered) and without.
// Usage: node bench/ordering.mjs [events] [rounds]
import http from 'node:http';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN } from '../tests/support/gateway.mjs';
import { sideBySideRates, writeRatioSection } from './results.mjs';

const EVENTS = Number(process.argv[2] ?? 1000);
const ROUNDS = Number(process.argv[3] ?? 3);
const PUBLISHERS = 16;
const KEYS = 100;
const CONFIG = {
  webhooks: {
    allow_insecure_urls: true,
    allow_hosts: ['127.0.0.1'],
    events_per_project_per_day: 100_000_000,
    deliveries_per_project_per_day: 1_000_000_000,
    bytes_per_project_per_day: 8_000_000_000,
  },
  plans: { big: { requests_per_window: 10_000_000 } },
};

const seen = new Set();
let lastArrival = 0;
const receiver = http.createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    const k = `${req.url} ${req.headers['webhook-id']}`;
    if (!seen.has(k)) {
      seen.add(k);
      lastArrival = Date.now();
    }
    res.writeHead(200).end('ok');
  });
});
await new Promise((r) => receiver.listen(0, '127.0.0.1', r));
const rcvUrl = `http://127.0.0.1:${receiver.address().port}`;

const origin = await startOrigin();
const gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });

async function project(name, subscriptions) {
  const { key } = await gw.createKey({ project: name, plan: 'big' });
  for (let i = 0; i < subscriptions; i++) {
    const s = await gw.admin('POST', '/_postguard/v1/webhooks', { url: `${rcvUrl}/${name}/${i}`, events: ['*'] }, { token: key });
    if (s.status !== 201) throw new Error(`subscription: ${s.status} ${s.text}`);
  }
  return name;
}

/** Publishes `n` events (keyed: round robin over KEYS keys); [ms to the last 202, ms to the last arrival]. */
async function publishAll(name, n, keyed, deliveries) {
  const before = seen.size;
  const t0 = Date.now();
  let next = 0;
  const one = async () => {
    while (next < n) {
      const i = next++;
      const body = { project: name, type: 'bench.ordered', data: { i }, ...(keyed ? { ordering_key: `k${i % KEYS}` } : {}) };
      const res = await gw.admin('POST', '/_postguard/v1/events', body, { token: ORIGIN_TOKEN });
      if (res.status !== 202) throw new Error(`publish: ${res.status} ${res.text}`);
    }
  };
  await Promise.all(Array.from({ length: PUBLISHERS }, one));
  const published = Date.now() - t0;
  const deadline = Date.now() + 600_000;
  while (seen.size - before < deliveries) {
    if (Date.now() > deadline) throw new Error(`only ${seen.size - before} of ${deliveries} delivered`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return [published, lastArrival - t0];
}

try {
  // A new project per run: every run starts from empty shards and lanes. (One project taking
  // run after run stalled a shard call on its 8th run here, with the build before ordering keys
  // too: bench/RESULTS.md.)
  let n = 0;
  const measures = {
    'events published/s (5 subscriptions)': async (v) => EVENTS / ((await publishAll(await project(`bench-ord-pub-${n++}`, 5), EVENTS, v === 'keyed', EVENTS * 5))[0] / 1000),
    'deliveries/s through the consumer (1 subscription)': async (v) => EVENTS / ((await publishAll(await project(`bench-ord-con-${n++}`, 1), EVENTS, v === 'keyed', EVENTS))[1] / 1000),
  };
  const rows = await sideBySideRates(measures, ['plain', 'keyed'], ROUNDS, '/s');
  writeRatioSection('ordering', {
    title: `Ordering keys (issue 36 #1): ${KEYS} keys ÷ none`,
    how: `\`node bench/ordering.mjs ${EVENTS} ${ROUNDS}\`: ${EVENTS} events per run by ${PUBLISHERS} concurrent publishers, ${ROUNDS} alternating rounds; a local receiver answering 200 at once. Goals: publish ≥ 0.9, consumer ≥ 0.8.`,
    columns: ['measure', 'without a key (median)', `with ${KEYS} keys (median)`, 'with ÷ without, median (spread)'],
    rows,
  });
} finally {
  await gw.dispose();
  await origin.kill();
  receiver.close();
}
