// Benchmark: what the audit write costs a request. Two gateways built from the same
// worker and wrangler.toml, identical but for `audit.enabled`, are loaded in turn
// (A, B, A, B, …) with autocannon against the same local origin; the figures are
// ratios measured side by side in one run. With BEFORE_ROOT=<checkout with its own build>,
// that build's pair joins the same alternating rounds, and the table compares the two
// builds' audit cost. Usage: [BEFORE_ROOT=…] node bench/audit.mjs [rounds] [seconds]
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ROOT } from '../tests/support/gateway.mjs';
import { load, median, spread, writeSection, commitOf } from './results.mjs';
import { projectRows } from '../tests/support/audit-shards.mjs';

const ROUNDS = Number(process.argv[2] ?? 3);
const SECONDS = Number(process.argv[3] ?? 5);
const CONNECTIONS = 16;
const BEFORE_ROOT = process.env.BEFORE_ROOT;
const plans = { bench: { requests_per_window: 10_000_000, window_s: 60, idempotency_ttl_s: 86400 } };

const run = (url, key) => load({
  url: `${url}/bench/items?x=1`,
  connections: CONNECTIONS,
  duration: SECONDS,
  headers: { authorization: `Bearer ${key}` },
});

const origin = await startOrigin();
/** A build's pair of gateways (audit on, audit off) and its keys. */
async function pair(label, root) {
  if (root) process.env.POSTGUARD_ROOT = root; // the harness reads the build from here
  try {
    const on = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ plans, audit: { enabled: true } }) } });
    const off = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ plans, audit: { enabled: false } }) } });
    const keyOn = (await on.createKey({ project: 'bench', plan: 'bench' })).key;
    const keyOff = (await off.createKey({ project: 'bench', plan: 'bench' })).key;
    return { label, root: root ?? ROOT, on, off, keyOn, keyOff, sent: 0, ratios: { rps: [], p50: [], p99: [] }, raw: [], legacy: !!root };
  } finally {
    delete process.env.POSTGUARD_ROOT;
  }
}
const builds = [await pair('this build')];
if (BEFORE_ROOT) builds.push(await pair('before', BEFORE_ROOT));
/** Rows written for the benchmark's path: the shards (this build) or D1's audit_log (before). */
async function written(b) {
  if (b.legacy) {
    const db = await b.on.mf.getD1Database('DB');
    return (await db.prepare("SELECT COUNT(*) AS n FROM audit_log WHERE path = '/bench/items'").first()).n;
  }
  return (await projectRows(b.on, 'bench')).filter((r) => r.path === '/bench/items').length;
}
try {
  for (const b of builds) { // warm-up, every gateway
    b.sent += (await run(b.on.url, b.keyOn)).requests.total;
    await run(b.off.url, b.keyOff);
  }
  for (let i = 0; i < ROUNDS; i++) {
    for (const b of builds) {
      const off = await run(b.off.url, b.keyOff);
      const on = await run(b.on.url, b.keyOn);
      if (on.non2xx || off.non2xx || on.errors || off.errors) throw new Error(`non-2xx or errors: on ${on.non2xx}/${on.errors}, off ${off.non2xx}/${off.errors}`);
      b.sent += on.requests.total;
      b.ratios.rps.push(on.requests.average / off.requests.average);
      b.ratios.p50.push(on.latency.p50 / off.latency.p50);
      b.ratios.p99.push(on.latency.p99 / off.latency.p99);
      b.raw.push({ round: i + 1, on: [on.requests.average, on.latency.p50, on.latency.p99], off: [off.requests.average, off.latency.p50, off.latency.p99] });
    }
  }
  // Every request must have its row: wait for the last batches, then count.
  for (const b of builds) {
    const deadline = Date.now() + 15_000;
    b.written = await written(b);
    while (b.written < b.sent && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 200));
      b.written = await written(b);
    }
  }
  const ratioRows = builds.map((b) => `| ${b.label} (${commitOf(b.root)}) | ${median(b.ratios.rps).toFixed(2)} (${spread(b.ratios.rps)}) | ${median(b.ratios.p50).toFixed(2)} (${spread(b.ratios.p50)}) | ${median(b.ratios.p99).toFixed(2)} (${spread(b.ratios.p99)}) | ${b.written} / ${b.sent} |`).join('\n');
  let compare = '';
  if (builds.length === 2) {
    // Cost per request = 1/rps(on) − 1/rps(off); before ÷ after, per round.
    const cost = (b, i) => 1 / b.raw[i].on[0] - 1 / b.raw[i].off[0];
    const r = builds[0].raw.map((_, i) => cost(builds[1], i) / cost(builds[0], i));
    const rps = builds[0].raw.map((_, i) => builds[0].ratios.rps[i] / builds[1].ratios.rps[i]);
    compare = `
Before ÷ after: the on÷off requests/s ratio of this build divided by that of the build before is
**${median(rps).toFixed(2)}** (${spread(rps)}; 1.00 = the same relative cost). The audit's extra time per request
(1/rps on − 1/rps off), before ÷ after: ${median(r).toFixed(2)} (${spread(r)}) — a difference of two noisy
figures, so only its sign and order of magnitude mean anything.
`;
  }
  const rows = builds.flatMap((b) => b.raw.map((r) => `| ${b.label} | ${r.round} | ${r.off[0].toFixed(0)} | ${r.on[0].toFixed(0)} | ${r.off[1]} / ${r.off[2]} | ${r.on[1]} / ${r.on[2]} |`)).join('\n');
  const section = `## Audit write cost (audit on ÷ audit off)

\`${BEFORE_ROOT ? 'BEFORE_ROOT=<build before> ' : ''}node bench/audit.mjs ${ROUNDS} ${SECONDS}\` — ${new Date().toISOString().slice(0, 10)}; GET through postguard to the
local demo origin, ${CONNECTIONS} connections, ${SECONDS} s per run, ${ROUNDS} alternating rounds, Miniflare (workerd) on this machine.
This build writes audit rows to AuditShard objects (ADR 0016)${BEFORE_ROOT ? '; the build before wrote them to D1' : ''}.

| build | requests/s on ÷ off | p50 on ÷ off | p99 on ÷ off | rows written / requests counted |
|---|---|---|---|---|
${ratioRows}
${compare}
(autocannon leaves out requests still in flight when a run ends; they complete and are recorded too.)

| build | round | off req/s | on req/s | off p50/p99 ms | on p50/p99 ms |
|---|---|---|---|---|---|
${rows}
`;
  writeSection('audit', section);
} finally {
  for (const b of builds) {
    await b.on.dispose();
    await b.off.dispose();
  }
  await origin.kill();
}
