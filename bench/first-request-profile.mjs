// Where a fresh process's first request spends its CPU (issue 14's first-request target,
// ADR 0030): a V8 CPU profile (50 µs sampling, through workerd's inspector) of the very first
// request of a fresh Miniflare process, for postguard (proxied GET, and a 401 before KV and
// object) and for bench/coldstart.mjs's baselines (the Rust floor proxied and 401, the JS
// reference), none warmed by a set-up request. The window includes the waitUntil work that
// follows (the audit flush) for 300 ms. Prints per contender the median wall time, busy
// time by kind (wasm, JS, (program): V8's own work, incl. lazy wasm compilation, GC), and the
// largest self-time entries of the median-ish trial. postguard runs its named wasm copy
// (bench/inspector.mjs withNames), so its functions are named.
// Usage: flock /work/wt/notes/bench.lock node bench/first-request-profile.mjs [trials]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ROOT } from '../tests/support/gateway.mjs';
import { RUST_REFERENCE, REFERENCE, startBaseline } from './passthrough.mjs';
import { cdp, withNames } from './inspector.mjs';

const TRIALS = Number(process.argv[2] ?? 3);
const PORT = Number(process.env.PROFILE_PORT ?? 9581);
const origin = await startOrigin();
const vars = { POSTGUARD_CONFIG: cfg({ plans: { bench: { requests_per_window: 1000 } } }) };
const persistDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-fp-'));
const g0 = await startGateway({ originUrl: origin.url, persistDir, vars });
const { key } = await g0.createKey({ project: 'bench', plan: 'bench' });
await g0.dispose();

async function profiled(port, fn, match) {
  const targets = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
  const target = targets.find((t) => match.test(t.title ?? t.id ?? '')) ?? targets.find((t) => t.id === 'core:user:') ?? targets[0];
  const c = cdp(target.webSocketDebuggerUrl);
  await c.open;
  await c.send('Profiler.enable');
  await c.send('Profiler.setSamplingInterval', { interval: 50 });
  await c.send('Profiler.start');
  const t = performance.now();
  await fn();
  const wall = performance.now() - t;
  await new Promise((r) => setTimeout(r, 300)); // the waitUntil audit flush
  const { profile } = await c.send('Profiler.stop');
  c.close();
  return { wall, ...analyse(profile) };
}
function analyse(profile) {
  const byNode = new Map();
  profile.samples.forEach((id, i) => byNode.set(id, (byNode.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)));
  const cat = {};
  const self = new Map();
  for (const n of profile.nodes) {
    const us = byNode.get(n.id) ?? 0;
    const f = n.callFrame;
    if (f.functionName === '(idle)' || !us) continue;
    const name = `${f.functionName || '(anon)'} ${f.url ? f.url.split('/').pop() : ''}`.replace(/::h[0-9a-f]{16}/, '').trim().slice(0, 90);
    self.set(name, (self.get(name) ?? 0) + us);
    const c = /^\((program|garbage collector)\)/.test(f.functionName) ? f.functionName : /wasm|\.wasm/.test(f.url) || /::|^<|wasm-function/.test(f.functionName) ? 'wasm' : 'js';
    cat[c] = (cat[c] ?? 0) + us;
  }
  return { cat, self: [...self.entries()].sort((a, b) => b[1] - a[1]).slice(0, 15) };
}
const out = { postguard: [], own: [], floor: [], floorOwn: [], ref: [] };
for (let i = 0; i < TRIALS; i++) {
  for (const [k, auth] of [['postguard', true], ['own', false]]) {
    const gw = await startGateway({ originUrl: origin.url, persistDir, migrate: false, vars, inspectorPort: PORT, patchOptions: withNames(ROOT) });
    out[k].push(await profiled(PORT, () => fetch(`${gw.url}/bench/items`, auth ? { headers: { authorization: `Bearer ${key}` } } : {}).then((r) => r.arrayBuffer()), /postguard/));
    await gw.dispose();
  }
  for (const [k, script, auth] of [['floor', RUST_REFERENCE, true], ['floorOwn', RUST_REFERENCE, false], ['ref', REFERENCE, true]]) {
    const b = await startBaseline(script, origin.url, { inspectorPort: PORT, useTiny: false });
    out[k].push(await profiled(PORT, () => fetch(`${b.url}/bench/items`, auth ? { headers: { authorization: `Bearer ${b.key}` } } : {}).then((r) => r.arrayBuffer()), /^$/));
    await b.dispose();
  }
}
await origin.kill();
fs.rmSync(persistDir, { recursive: true, force: true });
const med = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
for (const [k, runs] of Object.entries(out)) {
  const cats = [...new Set(runs.flatMap((r) => Object.keys(r.cat)))];
  console.log(`== ${k}: wall ${med(runs.map((r) => r.wall)).toFixed(1)} ms; busy ${(med(runs.map((r) => Object.values(r.cat).reduce((a, b) => a + b, 0))) / 1000).toFixed(1)} ms; ` + cats.map((c) => `${c} ${(med(runs.map((r) => r.cat[c] ?? 0)) / 1000).toFixed(1)}`).join(', '));
  for (const [n, us] of runs[Math.floor(runs.length / 2)].self.slice(0, 12)) console.log(`   ${(us / 1000).toFixed(2).padStart(7)}  ${n}`);
}
