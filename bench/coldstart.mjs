// Size and cold start. (1) The wasm's size raw and gzip, and how long V8 (the engine
// workerd embeds) takes to compile it, median of 10. (2) End to end: a fresh Miniflare
// process per trial, time until it is ready and the latency of the very first request,
// contenders alternating within each trial:
//   postguard   the proxied GET (module instantiation, the worker's first run, the
//               configuration, the KV key lookup, the key's object starting, the origin);
//   postguard, own work only   a fresh process whose first request is answered 401 before
//               any KV or object call (instantiation, configuration, the worker's own code);
//   reference   bench/passthrough.mjs's minimal gateway (its object starting, one SQL write);
//   Rust floor  the same minimal gateway in Rust with the plain `worker` crate
//               (bench/minimal-rust, ADR 0023): what any Rust/wasm gateway costs here;
//   Rust floor, no credentials   its first request answered 401 before KV and its object
//               (the wasm's first run and the `worker` crate's own code, as "own work only");
//   bare        the JS pass-through (the floor for any first request on this runtime);
//   before      with BEFORE_ROOT=<checkout with its own build>, that build's proxied GET.
// Extra .wasm files given as arguments (e.g. a wasm-opt output) are sized and compiled too.
// The Rust floor's wasm is sized as built (names kept, for the profiles) and with its name
// and producers sections dropped, the form postguard ships (scripts/wasm-post.sh).
// REFERENCE_RUST=0 leaves the Rust floor out.
// Usage: [BEFORE_ROOT=<dir>] node bench/coldstart.mjs [trials] [extra.wasm ...]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { performance } from 'node:perf_hooks';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ROOT } from '../tests/support/gateway.mjs';
import { commitOf, median, spread, writeSection } from './results.mjs';
import { PASS_THROUGH, REFERENCE, RUST_REFERENCE, buildRust, startBaseline, withRust } from './passthrough.mjs';
import { readLeb } from '../scripts/wasm-binary.mjs';

const TRIALS = Number(process.argv[2] ?? 5);
const extra = process.argv.slice(3);
const BEFORE_ROOT = process.env.BEFORE_ROOT;

const wasmFiles = [path.join(ROOT, 'build', 'index_bg.wasm')];
if (BEFORE_ROOT) wasmFiles.push(path.join(BEFORE_ROOT, 'build', 'index_bg.wasm'));
const label = (file) => {
  if (file.startsWith(ROOT)) return path.relative(ROOT, file);
  if (BEFORE_ROOT && file.startsWith(BEFORE_ROOT)) return `before: ${path.relative(BEFORE_ROOT, file)}`;
  return file;
};
/** `buf` without its `name` and `producers` custom sections (what wasm-opt --strip-debug --strip-producers drops). */
function stripNames(buf) {
  const kept = [buf.subarray(0, 8)];
  for (let pos = 8; pos < buf.length; ) {
    const start = pos;
    const id = buf[pos++];
    let size;
    [size, pos] = readLeb(buf, pos);
    const end = pos + size;
    const [len, p] = id === 0 ? readLeb(buf, pos) : [0, pos];
    const name = id === 0 ? buf.subarray(p, p + len).toString() : '';
    if (name !== 'name' && name !== 'producers') kept.push(buf.subarray(start, end));
    pos = end;
  }
  return Buffer.concat(kept);
}

const inputs = [...wasmFiles, ...extra].map((file) => ({ file: label(file), bytes: fs.readFileSync(file) }));
if (withRust()) {
  buildRust();
  const floor = fs.readFileSync(path.join(ROOT, 'bench', 'minimal-rust', 'build', RUST_REFERENCE.rust, 'index_bg.wasm'));
  inputs.push({ file: 'Rust floor (bench/minimal-rust gateway), as built', bytes: floor });
  inputs.push({ file: 'Rust floor, name and producers sections dropped', bytes: stripNames(floor) });
}
const sizes = [];
for (const { file, bytes } of inputs) {
  const compile = [];
  for (let i = 0; i < 10; i++) {
    const t = performance.now();
    await WebAssembly.compile(bytes);
    compile.push(performance.now() - t);
  }
  const names = WebAssembly.Module.customSections(new WebAssembly.Module(bytes), 'name').reduce((n, s) => n + s.byteLength, 0);
  sizes.push({ file, raw: bytes.length, gzip: zlib.gzipSync(bytes, { level: 9 }).length, names, compile });
}

const origin = await startOrigin();
const series = () => ({ ready: [], first: [], second: [] });
const trials = { postguard: series(), own: series(), reference: series(), rust: series(), rustOwn: series(), bare: series(), before: series() };
// The key (KV), the audit schema (D1) and the object's state persist in one directory per
// build, so every trial's first request is a proxied one on a freshly started process.
const vars = { POSTGUARD_CONFIG: cfg({ plans: { bench: { requests_per_window: 1000 } } }) };
const dirs = [];

/** A persisted state directory with one key, made by the build at `root`. */
async function prepare(root) {
  const persistDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-coldstart-'));
  dirs.push(persistDir);
  const gw = await withRoot(root, () => startGateway({ originUrl: origin.url, persistDir, vars }));
  const { key } = await gw.createKey({ project: 'bench', plan: 'bench' });
  await gw.dispose();
  return { root, persistDir, key };
}

/** Runs `fn` with the test harness reading the build (and wrangler.toml) from `root`. */
async function withRoot(root, fn) {
  const saved = process.env.POSTGUARD_ROOT;
  process.env.POSTGUARD_ROOT = root;
  try {
    return await fn();
  } finally {
    if (saved === undefined) delete process.env.POSTGUARD_ROOT;
    else process.env.POSTGUARD_ROOT = saved;
  }
}

async function timed(url, init, want = 200) {
  const t = performance.now();
  const res = await fetch(url, init);
  await res.arrayBuffer();
  if (res.status !== want) throw new Error(`${url} answered ${res.status}, expected ${want}`);
  return performance.now() - t;
}

/** One fresh process of `start()`, its ready time and its first two requests. */
async function trial(into, start, request) {
  const t = performance.now();
  const proc = await start();
  into.ready.push(performance.now() - t);
  into.first.push(await request(proc.url, proc));
  into.second.push(await request(proc.url, proc));
  await proc.dispose();
}

function postguardTrial(into, build, auth = true) {
  const start = () => withRoot(build.root, () => startGateway({ originUrl: origin.url, persistDir: build.persistDir, migrate: false, vars }));
  const init = auth ? { headers: { authorization: `Bearer ${build.key}` } } : {};
  return trial(into, start, (url) => timed(`${url}/bench/items`, init, auth ? 200 : 401));
}

try {
  const after = await prepare(ROOT);
  const before = BEFORE_ROOT ? await prepare(BEFORE_ROOT) : null;
  for (let i = 0; i < TRIALS; i++) {
    await postguardTrial(trials.postguard, after);
    await postguardTrial(trials.own, after, false);
    if (before) await postguardTrial(trials.before, before);
    // The reference looks its key up in KV as postguard does (its key is seeded at start).
    // useTiny: false: no set-up request, so the measured request is the process's first
    // (before p16size, startBaseline's request with the `tiny` key ran first and warmed the
    // module, so the reference's "first request" was its second).
    await trial(trials.reference, () => startBaseline(REFERENCE, origin.url, { useTiny: false }), (url, p) => timed(`${url}/bench/items`, { headers: { authorization: `Bearer ${p.key}` } }));
    if (withRust()) {
      await trial(trials.rust, () => startBaseline(RUST_REFERENCE, origin.url, { useTiny: false }), (url, p) => timed(`${url}/bench/items`, { headers: { authorization: `Bearer ${p.key}` } }));
      await trial(trials.rustOwn, () => startBaseline(RUST_REFERENCE, origin.url, { useTiny: false }), (url) => timed(`${url}/bench/items`, {}, 401));
    }
    await trial(trials.bare, () => startBaseline(PASS_THROUGH, origin.url), (url) => timed(`${url}/bench/items`));
  }
} finally {
  await origin.kill();
  for (const dir of dirs) fs.rmSync(dir, { recursive: true, force: true });
}

const ms = (xs) => `${median(xs).toFixed(1)} (${spread(xs, 1)})`;
const ratio = (a, b) => a.map((x, i) => x / b[i]);
const vsBare = (xs) => {
  const r = ratio(xs, trials.bare.first);
  return `${median(r).toFixed(2)} (${spread(r)})`;
};
const sizeRows = sizes.map((s) => `| ${s.file} | ${s.raw.toLocaleString('en')} | ${s.gzip.toLocaleString('en')} | ${s.names.toLocaleString('en')} | ${median(s.compile).toFixed(1)} (${spread(s.compile, 1)}) |`).join('\n');
const contenders = [
  ['postguard, proxied GET', trials.postguard],
  ['postguard, own work only (401 before KV and object)', trials.own],
  ...(BEFORE_ROOT ? [[`before (build ${commitOf(BEFORE_ROOT)}), proxied GET`, trials.before]] : []),
  ['reference (minimal gateway, its object)', trials.reference],
  ...(withRust() ? [['Rust floor (the minimal gateway in Rust, plain `worker`), proxied GET', trials.rust], ['Rust floor, no credentials (401 before KV and object)', trials.rustOwn]] : []),
  ['bare pass-through', trials.bare],
];
const rows = contenders.map(([name, t]) => `| ${name} | ${ms(t.ready)} | ${ms(t.first)} | ${vsBare(t.first)} | ${ms(t.second)} |`).join('\n');
writeSection('coldstart', `## Size and cold start

\`${BEFORE_ROOT ? 'BEFORE_ROOT=<checkout of an earlier build> ' : ''}node bench/coldstart.mjs ${[TRIALS, ...extra].join(' ')}\` — build ${commitOf(ROOT)}, ${new Date().toISOString().slice(0, 10)}.

| wasm | raw bytes | gzip -9 bytes | of which name section | V8 compile ms, median of 10 (spread) |
|---|---|---|---|---|
${sizeRows}

A fresh Miniflare (workerd) process per trial and contender, ${TRIALS} trials, the contenders alternating
within each trial. postguard's state (the key, the audit schema, the key's object) was persisted by an
earlier process, so its first proxied request pays for the wasm's first run, parsing the configuration,
the KV lookup, starting the key's object (SQLite open, schema check, first window write) and the origin
fetch. "Own work only" is a fresh process whose first request has no credentials: it is answered 401
before any KV or object call, so it is the wasm's first run, the configuration and postguard's own code.
The reference and the Rust floor get their key in KV before the process's first request, which is the
measured one (its own object starts then); "Rust floor, no credentials" is answered 401 before KV and
its object, as "own work only". "Ready" includes Miniflare starting the local KV, D1, Queues and Durable Object services.
V8 compiles wasm lazily (Liftoff, then TurboFan for hot functions): the compile column is validation
and set-up, the rest shows up in the first request. Milliseconds, median (spread).

| contender | process start → ready | first request | first request ÷ bare's | second request |
|---|---|---|---|---|
${rows}
`);
