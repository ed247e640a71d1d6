// Benchmark: what the audit write costs a request. Two gateways built from the same
// worker and wrangler.toml, identical but for `audit.enabled`, are loaded in turn
// (A, B, A, B, …) with autocannon against the same local origin; the figures are
// ratios measured side by side in one run. Usage: node bench/audit.mjs [rounds] [seconds]
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN } from '../tests/support/gateway.mjs';
import { load, median, spread, writeSection } from './results.mjs';

const ROUNDS = Number(process.argv[2] ?? 3);
const SECONDS = Number(process.argv[3] ?? 5);
const CONNECTIONS = 16;
const plans = { bench: { requests_per_window: 10_000_000, window_s: 60, idempotency_ttl_s: 86400 } };

const run = (url, key) => load({
  url: `${url}/bench/items?x=1`,
  connections: CONNECTIONS,
  duration: SECONDS,
  headers: { authorization: `Bearer ${key}` },
});

const origin = await startOrigin();
const on = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ plans, audit: { enabled: true } }) } });
const off = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ plans, audit: { enabled: false } }) } });
try {
  const keyOn = (await on.createKey({ project: 'bench', plan: 'bench' })).key;
  const keyOff = (await off.createKey({ project: 'bench', plan: 'bench' })).key;
  let sentOn = (await run(on.url, keyOn)).requests.total; // warm-up, both
  await run(off.url, keyOff);
  const ratios = { rps: [], p50: [], p99: [] };
  const raw = [];
  for (let i = 0; i < ROUNDS; i++) {
    const b = await run(off.url, keyOff);
    const a = await run(on.url, keyOn);
    if (a.non2xx || b.non2xx || a.errors || b.errors) throw new Error(`non-2xx or errors: on ${a.non2xx}/${a.errors}, off ${b.non2xx}/${b.errors}`);
    sentOn += a.requests.total;
    ratios.rps.push(a.requests.average / b.requests.average);
    ratios.p50.push(a.latency.p50 / b.latency.p50);
    ratios.p99.push(a.latency.p99 / b.latency.p99);
    raw.push({ round: i + 1, on: [a.requests.average, a.latency.p50, a.latency.p99], off: [b.requests.average, b.latency.p50, b.latency.p99] });
  }
  // Every request must have its row: wait for the last batches, then count.
  const db = await on.mf.getD1Database('DB');
  const count = async () => (await db.prepare("SELECT COUNT(*) AS n FROM audit_log WHERE path = '/bench/items'").first()).n;
  const deadline = Date.now() + 10_000;
  let written = await count();
  while (written < sentOn && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    written = await count();
  }
  const rows = raw.map((r) => `| ${r.round} | ${r.off[0].toFixed(0)} | ${r.on[0].toFixed(0)} | ${r.off[1]} / ${r.off[2]} | ${r.on[1]} / ${r.on[2]} |`).join('\n');
  const section = `## Audit write cost (audit on ÷ audit off)

\`node bench/audit.mjs ${ROUNDS} ${SECONDS}\` — ${new Date().toISOString().slice(0, 10)}; GET through postguard to the
local demo origin, ${CONNECTIONS} connections, ${SECONDS} s per run, ${ROUNDS} alternating rounds, Miniflare (workerd) on this machine.

| ratio (on ÷ off) | median | spread |
|---|---|---|
| requests/s | ${median(ratios.rps).toFixed(2)} | ${spread(ratios.rps)} |
| p50 latency | ${median(ratios.p50).toFixed(2)} | ${spread(ratios.p50)} |
| p99 latency | ${median(ratios.p99).toFixed(2)} | ${spread(ratios.p99)} |

Audit rows written: ${written}; requests autocannon counted: ${sentOn} (it leaves out those still in flight when a run ends, which complete and are recorded too).

| round | off req/s | on req/s | off p50/p99 ms | on p50/p99 ms |
|---|---|---|---|---|
${rows}
`;
  writeSection('audit', section);
} finally {
  await on.dispose();
  await off.dispose();
  await origin.kill();
}
