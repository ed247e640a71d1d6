// Size and cold start. (1) The wasm's size raw and gzip, and how long V8 (the engine
// workerd embeds) takes to compile it, median of 10. (2) End to end: a fresh Miniflare
// process per trial, time until it is ready and the latency of the very first request
// (module instantiation, the worker's first run, for postguard also the key's object
// starting), postguard and a bare pass-through worker alternating, 5 trials each.
// Extra .wasm files given as arguments (e.g. a wasm-opt output) are sized and compiled too.
// Usage: node bench/coldstart.mjs [trials] [extra.wasm ...]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { performance } from 'node:perf_hooks';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN, ROOT } from '../tests/support/gateway.mjs';
import { median, spread, writeSection } from './results.mjs';
import { PASS_THROUGH, startBaseline } from './passthrough.mjs';

const TRIALS = Number(process.argv[2] ?? 5);
const extra = process.argv.slice(3);

const sizes = [];
for (const file of [path.join(ROOT, 'build', 'index_bg.wasm'), ...extra]) {
  const bytes = fs.readFileSync(file);
  const compile = [];
  for (let i = 0; i < 10; i++) {
    const t = performance.now();
    await WebAssembly.compile(bytes);
    compile.push(performance.now() - t);
  }
  const names = WebAssembly.Module.customSections(new WebAssembly.Module(bytes), 'name').reduce((n, s) => n + s.byteLength, 0);
  sizes.push({ file: file.startsWith(ROOT) ? path.relative(ROOT, file) : file, raw: bytes.length, gzip: zlib.gzipSync(bytes, { level: 9 }).length, names, compile });
}

const origin = await startOrigin();
const trials = { postguard: { ready: [], first: [], second: [] }, bare: { ready: [], first: [], second: [] } };
// The key (KV), the audit schema (D1) and the object's state persist in one directory, so
// every trial's first request is a proxied one on a freshly started process.
const state = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-coldstart-'));
const vars = { POSTGUARD_CONFIG: cfg({ plans: { bench: { requests_per_window: 1000 } } }) };
try {
  const setup = await startGateway({ originUrl: origin.url, persistDir: state, vars });
  const { key } = await setup.createKey({ project: 'bench', plan: 'bench' });
  await setup.dispose();
  const timed = async (url, init) => {
    const t = performance.now();
    const res = await fetch(url, init);
    await res.arrayBuffer();
    if (res.status !== 200) throw new Error(`${url} answered ${res.status}`);
    return performance.now() - t;
  };
  for (let i = 0; i < TRIALS; i++) {
    let t = performance.now();
    const gw = await startGateway({ originUrl: origin.url, persistDir: state, migrate: false, vars });
    trials.postguard.ready.push(performance.now() - t);
    const auth = { headers: { authorization: `Bearer ${key}` } };
    trials.postguard.first.push(await timed(`${gw.url}/bench/items`, auth));
    trials.postguard.second.push(await timed(`${gw.url}/bench/items`, auth));
    await gw.dispose();

    t = performance.now();
    const bare = await startBaseline(PASS_THROUGH, origin.url);
    const { url } = bare;
    trials.bare.ready.push(performance.now() - t);
    trials.bare.first.push(await timed(`${url}/bench/items`));
    trials.bare.second.push(await timed(`${url}/bench/items`));
    await bare.dispose();
  }
} finally {
  await origin.kill();
  fs.rmSync(state, { recursive: true, force: true });
}

const ms = (xs) => `${median(xs).toFixed(0)} (${spread(xs, 0)})`;
const ratio = (a, b) => a.map((x, i) => x / b[i]);
const sizeRows = sizes.map((s) => `| ${s.file} | ${s.raw.toLocaleString('en')} | ${s.gzip.toLocaleString('en')} | ${s.names.toLocaleString('en')} | ${median(s.compile).toFixed(1)} (${spread(s.compile, 1)}) |`).join('\n');
const P = trials.postguard;
const B = trials.bare;
writeSection('coldstart', `## Size and cold start

\`node bench/coldstart.mjs ${[TRIALS, ...extra].join(' ')}\` — ${new Date().toISOString().slice(0, 10)}.

| wasm | raw bytes | gzip -9 bytes | of which name section | V8 compile ms, median of 10 (spread) |
|---|---|---|---|---|
${sizeRows}

A fresh Miniflare (workerd) process per trial, ${TRIALS} trials, postguard and the bare pass-through alternating.
Both serve the same GET; postguard's state (the key, the audit schema, the key's object) was persisted by an
earlier process, so its first request pays for instantiating the wasm, parsing the configuration, the KV lookup
and starting the key's object (SQLite open, schema check, first window write). "Ready" includes Miniflare
starting postguard's local KV, D1, Queues and Durable Object services. V8 compiles wasm lazily (Liftoff, then
TurboFan for hot functions): the compile column is validation and set-up, the rest shows up in the first request.

| | postguard ms, median (spread) | bare ms, median (spread) | ratio postguard ÷ bare, median (spread) |
|---|---|---|---|
| process start → ready | ${ms(P.ready)} | ${ms(B.ready)} | ${median(ratio(P.ready, B.ready)).toFixed(2)} (${spread(ratio(P.ready, B.ready))}) |
| first request | ${ms(P.first)} | ${ms(B.first)} | ${median(ratio(P.first, B.first)).toFixed(2)} (${spread(ratio(P.first, B.first))}) |
| second request | ${ms(P.second)} | ${ms(B.second)} | ${median(ratio(P.second, B.second)).toFixed(2)} (${spread(ratio(P.second, B.second))}) |
`);
