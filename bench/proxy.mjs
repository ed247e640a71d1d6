// Benchmark: postguard against a bare pass-through worker (a few lines of JS forwarding
// to the same origin, on the same runtime) and against the origin hit directly.
// Everything runs locally under Miniflare (workerd); figures are ratios measured side by
// side in one run, each scenario repeated `rounds` times in alternation.
// Usage: node bench/proxy.mjs [rounds] [seconds]
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { execFileSync } from 'node:child_process';
import { Miniflare, convertV4MiniflareOptions, Log, LogLevel } from 'miniflare';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN, ROOT } from '../tests/support/gateway.mjs';
import { load as cannon, median, spread, writeSection } from './results.mjs';

const ROUNDS = Number(process.argv[2] ?? 3);
const SECONDS = Number(process.argv[3] ?? 4);
const CONNECTIONS = 16;
// Another build can be measured against the same pass-through (before/after a change):
// POSTGUARD_ROOT=<checkout with a build> BENCH_SECTION=proxy-before node bench/proxy.mjs
const BUILD_ROOT = process.env.POSTGUARD_ROOT ?? ROOT;
const SECTION = process.env.BENCH_SECTION ?? 'proxy';
let commit = '?';
try {
  commit = execFileSync('git', ['-C', BUILD_ROOT, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
} catch { /* not a checkout */ }

const PASS_THROUGH = `export default {
  async fetch(req, env) {
    const u = new URL(req.url);
    return fetch(env.ORIGIN_URL + u.pathname + u.search, { method: req.method, headers: req.headers, body: req.body });
  },
};`;

function load(url, { method = 'GET', headers = {}, body, fresh = false } = {}) {
  let n = 0;
  const stamp = Date.now();
  return cannon({
    url,
    method,
    headers,
    body,
    connections: CONNECTIONS,
    duration: SECONDS,
    // A fresh Idempotency-Key per request: every request is a new operation.
    requests: fresh ? [{ setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': `bench-${stamp}-${n++}` } }) }] : undefined,
  });
}

const origin = await startOrigin({ token: ORIGIN_TOKEN });
const bare = new Miniflare(convertV4MiniflareOptions({
  host: '127.0.0.1', port: 0, modules: true, script: PASS_THROUGH,
  compatibilityDate: '2026-11-01', bindings: { ORIGIN_URL: origin.url }, log: new Log(LogLevel.WARN),
}));
const bareUrl = new URL(await bare.ready).origin;
const gw = await startGateway({
  originUrl: origin.url,
  vars: { POSTGUARD_CONFIG: cfg({ plans: { bench: { requests_per_window: 10_000_000 }, tiny: { requests_per_window: 1, window_s: 86400 } } }) },
});
try {
  const key = (await gw.createKey({ project: 'bench', plan: 'bench' })).key;
  const tiny = (await gw.createKey({ project: 'bench', plan: 'tiny' })).key;
  const auth = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  const body = '{"amount":100}';
  await gw.fetch('/bench/pay', { method: 'POST', headers: { ...auth, 'idempotency-key': 'bench-replay' }, body });
  await gw.fetch('/bench/items', { headers: { authorization: `Bearer ${tiny}` } }); // uses the only admission
  const scenarios = {
    'GET (no idempotency)': {
      pg: () => load(`${gw.url}/bench/items`, { headers: auth }),
      bare: () => load(`${bareUrl}/bench/items`),
    },
    'fresh POST (auth + limit + claim + forward + store)': {
      pg: () => load(`${gw.url}/bench/pay`, { method: 'POST', headers: auth, body, fresh: true }),
      bare: () => load(`${bareUrl}/bench/pay`, { method: 'POST', headers: { 'content-type': 'application/json' }, body }),
    },
    'replayed POST': {
      pg: () => load(`${gw.url}/bench/pay`, { method: 'POST', headers: { ...auth, 'idempotency-key': 'bench-replay' }, body }),
      bare: () => load(`${bareUrl}/bench/pay`, { method: 'POST', headers: { 'content-type': 'application/json' }, body }),
    },
    '429 rejection': {
      pg: () => load(`${gw.url}/bench/items`, { headers: { authorization: `Bearer ${tiny}` } }),
      bare: () => load(`${bareUrl}/bench/items`),
    },
  };
  const origRuns = [];
  for (let i = 0; i < ROUNDS; i++) origRuns.push(await load(`${origin.url}/bench/items`));
  const rows = [];
  for (const [name, s] of Object.entries(scenarios)) {
    await s.pg(); // warm-up
    const r = { rps: [], p50: [], p99: [], pgRps: [], bareRps: [], pgP50: [], pgP99: [], status: new Set() };
    for (let i = 0; i < ROUNDS; i++) {
      const b = await s.bare();
      const p = await s.pg();
      for (const [code, count] of Object.entries(p.statusCodeStats ?? {})) if (count.count) r.status.add(code);
      r.rps.push(p.requests.average / b.requests.average);
      r.p50.push(p.latency.p50 / Math.max(b.latency.p50, 0.5));
      r.p99.push(p.latency.p99 / Math.max(b.latency.p99, 0.5));
      r.pgRps.push(p.requests.average);
      r.bareRps.push(b.requests.average);
      r.pgP50.push(p.latency.p50);
      r.pgP99.push(p.latency.p99);
    }
    rows.push({ name, ...r });
    console.log(name, JSON.stringify({ rps: r.rps, p50: r.p50, p99: r.p99, status: [...r.status] }));
  }
  const wasm = fs.readFileSync(path.join(BUILD_ROOT, 'build', 'index_bg.wasm'));
  const table = rows.map((r) => `| ${r.name} | ${median(r.rps).toFixed(2)} (${spread(r.rps)}) | ${median(r.p50).toFixed(2)} (${spread(r.p50)}) | ${median(r.p99).toFixed(2)} (${spread(r.p99)}) | ${median(r.pgRps).toFixed(0)} / ${median(r.bareRps).toFixed(0)} | ${median(r.pgP50)} / ${median(r.pgP99)} | ${[...r.status].join(', ')} |`).join('\n');
  const section = `## postguard vs a bare pass-through worker${SECTION === 'proxy' ? '' : ` (${SECTION})`}

\`${process.env.POSTGUARD_ROOT ? `POSTGUARD_ROOT=<checkout of ${commit}> BENCH_SECTION=${SECTION} ` : ''}node bench/proxy.mjs ${ROUNDS} ${SECONDS}\` — build ${commit}, ${new Date().toISOString().slice(0, 10)}; ${CONNECTIONS} connections, ${SECONDS} s per run,
${ROUNDS} alternating rounds per scenario, all on Miniflare (workerd) on this machine, same local origin.
Ratios are postguard ÷ pass-through (requests/s: higher is better; latency: lower is better).

| scenario | req/s ratio (spread) | p50 ratio | p99 ratio | postguard / bare req/s | postguard p50 / p99 ms | postguard statuses |
|---|---|---|---|---|---|---|
${table}

Origin hit directly (no worker): ${median(origRuns.map((r) => r.requests.average)).toFixed(0)} req/s, p50 ${median(origRuns.map((r) => r.latency.p50))} ms, p99 ${median(origRuns.map((r) => r.latency.p99))} ms.

wasm: ${wasm.length.toLocaleString('en')} B raw, ${zlib.gzipSync(wasm, { level: 9 }).length.toLocaleString('en')} B gzip (wasm-opt off).
`;
  writeSection(SECTION, section);
} finally {
  await gw.dispose();
  await bare.dispose();
  await origin.kill();
}
