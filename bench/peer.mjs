// Benchmark (issue 29): postguard against the peer a team would assemble (bench/hono-peer: Hono +
// bearerAuth with one uncached KV read, the rate-limiting binding, hono-idempotency 0.9.1 on its
// Durable Object store), the minimal JS gateway (REFERENCE in bench/passthrough.mjs: postguard's
// I/O and nothing else) and the Rust floor (RUST_REFERENCE, bench/minimal-rust), every contender
// behind the same local static-assets router as the product (REFERENCE_ASSETS=1, ADR 0028).
// Four kinds: GET, fresh POST, replay, 429. Per run: requests/s, and busy CPU as the workerd
// process's busiest thread's CPU per request (bench/proccpu.mjs; no profiler attached). Rounds
// are interleaved, the contenders' order rotating each round; figures are medians (spread) of
// per-round ratios. BEFORE_ROOT=<checkout with its own build> adds that build in the same rounds.
// REFERENCE_RPC=1 adds the two floors calling their objects by JS RPC; AUDIT_OFF=1 the same build
// with its audit log off (the peer writes none).
// Usage: node bench/peer.mjs [rounds] [seconds]   (the issue's runs: 3 10)
import { startOrigin } from '../tests/support/origin.mjs';
import { ROOT } from '../tests/support/gateway.mjs';
import { HONO_PEER, REFERENCE, REFERENCE_RPC, RUST_REFERENCE, RUST_REFERENCE_RPC, startBaseline } from './passthrough.mjs';
import { cpuDelta, cpuOf, pidOfPort } from './proccpu.mjs';
import { benchGateway, commitOf, load as cannon, spread, writeSection } from './results.mjs';

/** The median, the mean of the middle two for an even count. */
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const h = Math.floor(s.length / 2);
  return s.length % 2 ? s[h] : (s[h - 1] + s[h]) / 2;
};
const ROUNDS = Number(process.argv[2] ?? 3);
const SECONDS = Number(process.argv[3] ?? 10);
const CONNECTIONS = Number(process.env.CONNECTIONS ?? 10);
const BEFORE_ROOT = process.env.BEFORE_ROOT;
process.env.REFERENCE_ASSETS = '1'; // every baseline behind the product's assets router

const origin = await startOrigin();
const body = '{"amount":100}';

/** A baseline as a contender: its URL, keys and how its requests are sent. */
async function baseline(label, script) {
  const r = await startBaseline(script, origin.url);
  const auth = { authorization: `Bearer ${r.key}`, 'content-type': 'application/json' };
  await fetch(`${r.url}/bench/pay`, { method: 'POST', headers: { ...auth, 'idempotency-key': 'bench-replay' }, body }).then((res) => res.arrayBuffer());
  return { label, url: r.url, auth, tiny: r.tiny, dispose: r.dispose };
}
async function postguard(label, root, config) {
  if (root) process.env.POSTGUARD_ROOT = root;
  try {
    const g = await benchGateway(origin.url, { config });
    return { label, url: g.gw.url, auth: g.auth, tiny: g.tiny, dispose: () => g.gw.dispose() };
  } finally {
    delete process.env.POSTGUARD_ROOT;
  }
}

const contenders = [await postguard(`postguard ${commitOf(ROOT)}`)];
if (BEFORE_ROOT) contenders.push(await postguard(`before ${commitOf(BEFORE_ROOT)}`, BEFORE_ROOT));
// AUDIT_OFF=1: the same build with `audit.enabled: false` (the peer writes no audit log).
if (process.env.AUDIT_OFF === '1') contenders.push(await postguard(`postguard ${commitOf(ROOT)}, audit off`, null, { audit: { enabled: false } }));
// PEERS=0: postguard (and BEFORE_ROOT's build) alone, for a quick before/after.
const PEERS = process.env.PEERS !== '0';
if (PEERS) {
  contenders.push(await baseline('Hono peer', HONO_PEER));
  contenders.push(await baseline('minimal JS gateway', REFERENCE));
  contenders.push(await baseline('Rust floor', RUST_REFERENCE));
}
if (PEERS && process.env.REFERENCE_RPC === '1') {
  contenders.push(await baseline('minimal JS gateway (RPC)', REFERENCE_RPC));
  contenders.push(await baseline('Rust floor (RPC)', RUST_REFERENCE_RPC));
}
for (const c of contenders) c.pid = pidOfPort(Number(new URL(c.url).port));

const KINDS = {
  GET: (c) => ({ url: `${c.url}/bench/items`, headers: c.auth }),
  'fresh POST': (c) => {
    let n = 0;
    const stamp = `${Date.now()}-${Math.random().toString(36).slice(2)}`;
    return {
      url: `${c.url}/bench/pay`, method: 'POST', headers: c.auth, body,
      requests: [{ setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': `peer-${stamp}-${n++}` } }) }],
    };
  },
  replay: (c) => ({ url: `${c.url}/bench/pay`, method: 'POST', headers: { ...c.auth, 'idempotency-key': 'bench-replay' }, body }),
  429: (c) => ({ url: `${c.url}/bench/items`, headers: { authorization: `Bearer ${c.tiny}` } }),
};
// In this order (an object lists an integer-like key first).
const ORDER = ['GET', 'fresh POST', 'replay', '429'];

/** One run: req/s, the busiest thread's CPU µs per request, the statuses answered. */
async function run(c, kind, seconds = SECONDS) {
  const before = cpuOf(c.pid);
  const res = await cannon({ ...KINDS[kind](c), connections: CONNECTIONS, duration: seconds });
  const cpu = cpuDelta(before, cpuOf(c.pid));
  const statuses = Object.entries(res.statusCodeStats ?? {}).filter(([, s]) => s.count).map(([code]) => code);
  if (res.errors || res.timeouts) statuses.push(`${res.errors} errors, ${res.timeouts} timeouts`);
  // A run of fewer than 50 requests was starved by the machine's other load (seconds with no
  // request at all happen here): its CPU per request is below /proc's 10 ms resolution.
  return { rps: res.requests.average, cpu: cpu.thread / Math.max(res.requests.total, 1), statuses, starved: res.requests.total < 50 };
}

const started = new Date();
const results = {};
try {
  for (const kind of ORDER) {
    for (const c of contenders) await run(c, kind, 2); // warm-up
    const runs = contenders.map(() => []);
    for (let r = 0; r < ROUNDS; r++) {
      for (let j = 0; j < contenders.length; j++) {
        const i = (j + r) % contenders.length; // the order rotates each round
        const out = await run(contenders[i], kind);
        runs[i][r] = out;
        console.log(`${kind} round ${r + 1} [${contenders[i].label}]: ${out.rps.toFixed(0)} req/s, ${out.cpu.toFixed(0)} µs CPU/request, ${out.statuses.join(',')}`);
      }
    }
    results[kind] = runs;
  }
} finally {
  for (const c of contenders) await c.dispose();
  await origin.kill();
}

// Starved runs (and the ratios of their round) are left out of the medians.
const m = (xs, d = 2) => (xs.length ? `${median(xs).toFixed(d)} (${spread(xs, d)})` : '—');
const per = (kind, i, k) => results[kind][i].filter((o) => !o.starved).map((o) => o[k]);
const ratio = (kind, a, b, k) => results[kind][a].flatMap((o, r) => {
  const other = results[kind][b][r];
  return o.starved || other.starved ? [] : [o[k] / other[k]];
});
const starved = ORDER.map((k) => `${k} ${results[k].flat().filter((o) => o.starved).length}`).join(', ');
const idx = (label) => contenders.findIndex((c) => c.label === label);
const [hono, js, rust] = ['Hono peer', 'minimal JS gateway', 'Rust floor'].map(idx);
const absolute = contenders.map((c, i) => `| ${c.label} | ${ORDER.map((k) => `${m(per(k, i, 'rps'), 0)} / ${m(per(k, i, 'cpu'), 0)}`).join(' | ')} | ${ORDER.map((k) => [...new Set(results[k][i].flatMap((o) => o.statuses))].join(',')).join(' · ')} |`).join('\n');
const ratios = !PEERS ? '| (PEERS=0: no peers) | | | | |' : contenders.filter((c) => !['Hono peer', 'minimal JS gateway', 'Rust floor'].includes(c.label)).map((c) => {
  const i = idx(c.label);
  const row = (k, what) => `${m(ratio(k, i, hono, what))} / ${m(ratio(k, i, js, what))} / ${m(ratio(k, i, rust, what))}`;
  return [
    `| ${c.label}, req/s | ${ORDER.map((k) => row(k, 'rps')).join(' | ')} |`,
    `| ${c.label}, CPU/request | ${ORDER.map((k) => row(k, 'cpu')).join(' | ')} |`,
  ].join('\n');
}).join('\n');
const before = BEFORE_ROOT ? `

After ÷ before, per round (req/s; CPU/request): ${ORDER.map((k) => `${k} ${m(ratio(k, 0, 1, 'rps'))}; ${m(ratio(k, 0, 1, 'cpu'))}`).join(' · ')}.` : '';
writeSection('peer', `## The proxy path against the Hono peer, the minimal JS gateway and the Rust floor (issue 29)

\`${BEFORE_ROOT ? 'BEFORE_ROOT=<checkout> ' : ''}node bench/peer.mjs ${ROUNDS} ${SECONDS}\` — ${started.toISOString().slice(0, 16).replace('T', ' ')} UTC, load average ${(await import('node:os')).loadavg().map((l) => l.toFixed(1)).join(' / ')} at the end;
${CONNECTIONS} connections, ${SECONDS} s per run, ${ROUNDS} interleaved rounds (order rotating), every contender behind the same
local static-assets router (\`REFERENCE_ASSETS=1\`, ADR 0028). CPU: the workerd process's busiest thread (it runs the
isolates and the router), µs per request, from /proc. Medians (spread over the rounds). Runs starved by the machine's other
load (fewer than 50 requests) are left out, with their round's ratios: ${starved} of ${ROUNDS * contenders.length} runs per kind.

| contender | GET req/s / CPU µs | fresh POST | replay | 429 | statuses (GET · fresh · replay · 429) |
|---|---|---|---|---|---|
${absolute}

Ratios per round, each cell ÷ Hono peer / ÷ minimal JS gateway / ÷ Rust floor (req/s: higher is better; CPU: lower is better):

| | GET | fresh POST | replay | 429 |
|---|---|---|---|---|
${ratios}${before}
`);
