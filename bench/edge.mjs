// Benchmark (issue 37, ADR 0040): what admission at the edge costs a proxied GET in one location.
// Two gateways of the same build side by side, `limits.edge` off (every request admitted by the
// key's object, as before) and on (admitted by the key's edge object for the request's location,
// from blocks the key's object leases to it), loaded in alternation: req/s with edges on ÷ off.
// Every request of the run comes from one location (Miniflare's default `cf.colo`), so it measures
// the edge's own cost, not the WAN round trips it saves (bench/edge-sim.mjs models those). The
// machine is shared and noisy: only ratios side by side mean anything. Goal: ≥ 0.95.
// Usage: node bench/edge.mjs [rounds] [seconds]
import { startOrigin } from '../tests/support/origin.mjs';
import { ROOT } from '../tests/support/gateway.mjs';
import { benchGateway, commitOf, load as cannon, median, spread, writeSection } from './results.mjs';

const ROUNDS = Number(process.argv[2] ?? 5);
const SECONDS = Number(process.argv[3] ?? 4);
const CONNECTIONS = 16;

const load = (url, headers, duration = SECONDS) => cannon({ url, headers, connections: CONNECTIONS, duration });

const origin = await startOrigin();
const gateways = {
  off: await benchGateway(origin.url),
  on: await benchGateway(origin.url, { config: { limits: { unauthenticated_per_minute: 1000000, edge: { enabled: true } } } }),
};
try {
  // Warm both: the edge leases its first blocks, both isolates compile their paths.
  for (const g of Object.values(gateways)) await load(`${g.gw.url}/bench/items`, g.auth, 1);
  const rate = { off: [], on: [] };
  const ratios = [];
  for (let round = 0; round < ROUNDS; round++) {
    // Alternate which goes first, so a drift in the machine's load favours neither.
    const order = round % 2 ? ['on', 'off'] : ['off', 'on'];
    const got = {};
    for (const name of order) {
      const g = gateways[name];
      const res = await load(`${g.gw.url}/bench/items`, g.auth);
      if (res['2xx'] < res.requests.total * 0.99) throw new Error(`edges ${name}: ${res['2xx']} of ${res.requests.total} answered 2xx (non2xx ${res.non2xx})`);
      got[name] = res.requests.average;
    }
    rate.off.push(got.off);
    rate.on.push(got.on);
    ratios.push(got.on / got.off);
    console.log(`round ${round + 1}: off ${got.off.toFixed(0)} req/s, on ${got.on.toFixed(0)} req/s, on ÷ off ${(got.on / got.off).toFixed(3)}`);
  }
  const when = new Date().toISOString().slice(0, 16).replace('T', ' ');
  writeSection('edge', [
    `## Admission at the edge (issue 37): a proxied GET, edges on ÷ off, one location, build ${commitOf(ROOT)}, ${when} UTC`,
    '',
    `\`node bench/edge.mjs ${ROUNDS} ${SECONDS}\`: ${CONNECTIONS} connections, ${SECONDS} s per run, ${ROUNDS} alternating rounds after a 1 s warm-up of each; two gateways of one build, \`limits.edge\` off and on (defaults), a key with no practical limit, every request from one location. Goal: ≥ 0.95.`,
    '',
    '| scenario | edges off, req/s (median) | edges on, req/s (median) | on ÷ off, median (spread) |',
    '|---|---|---|---|',
    `| GET (no idempotency) | ${median(rate.off).toFixed(0)} | ${median(rate.on).toFixed(0)} | ${median(ratios).toFixed(2)} (${spread(ratios)}) |`,
    '',
  ].join('\n'));
} finally {
  for (const g of Object.values(gateways)) await g.gw.dispose();
  await origin.kill();
}
