// Where postguard's CPU time goes: a V8 CPU profile of the worker isolate (through the
// inspector Miniflare exposes) while autocannon drives one scenario, aggregated by function
// self time. Rust functions appear by name (see below).
//
// Each scenario is profiled `rounds` times; the busy time of the isolate per request is
// reported as median (spread). With BEFORE_ROOT=<checkout with its own build>, that build
// runs as a second gateway and is profiled in alternation with this one (before/after,
// side by side). With scenario "all" the summary is written into bench/RESULTS.md.
// The deployed wasm has no name section (scripts/wasm-post.sh strips it); the profile
// loads the copy with names that the build keeps in target/wasm-names/ (same code).
// Usage: node bench/profile.mjs [all|get|fresh|replay|limited] [seconds] [rounds] [top]
// (INCLUSIVE=1 also prints the product's own functions by inclusive time.)
// VARIANTS=label=dir,label=dir adds frozen builds (each a directory with wrangler.toml,
// build/, migrations/) profiled in the same rounds, e.g. temporary variant builds for a
// differential attribution. Every run also records the workerd process's own CPU time
// (bench/proccpu.mjs: the process, and its busiest thread, which runs the isolates) per
// request, an independent check of the profile's busy time; CPU_ONLY=1 measures that CPU
// without the profiler attached. REFERENCE_RPC=0 leaves out the two RPC references.
import { startOrigin } from '../tests/support/origin.mjs';
import { ORIGIN_TOKEN, ROOT } from '../tests/support/gateway.mjs';
import { cdp, withNames } from './inspector.mjs';
import { cpuDelta, cpuOf, pidOfPort } from './proccpu.mjs';
import { benchGateway, commitOf, load, median, spread, writeSection } from './results.mjs';
import { REFERENCE, REFERENCE_RPC, RUST_REFERENCE, RUST_REFERENCE_RPC, startBaseline, withRust } from './passthrough.mjs';

const SCENARIO = process.argv[2] ?? 'all';
const SECONDS = Number(process.argv[3] ?? 4);
const ROUNDS = Number(process.argv[4] ?? 3);
const TOP = Number(process.argv[5] ?? 12);
const BEFORE_ROOT = process.env.BEFORE_ROOT;
const VARIANTS = (process.env.VARIANTS ?? '').split(',').filter(Boolean).map((v) => v.split('='));
const CPU_ONLY = Boolean(process.env.CPU_ONLY);
const INTERVAL_US = 200;

/** The load of each scenario against one gateway. */
function scenariosFor({ gw, auth, tiny, body }) {
  let n = 0;
  const stamp = `${Date.now()}-${Math.random().toString(36).slice(2)}`;
  return {
    get: { url: `${gw.url}/bench/items`, headers: auth },
    fresh: {
      url: `${gw.url}/bench/pay`, method: 'POST', headers: auth, body,
      requests: [{ setupRequest: (r) => ({ ...r, headers: { ...r.headers, 'idempotency-key': `prof-${stamp}-${n++}` } }) }],
    },
    replay: { url: `${gw.url}/bench/pay`, method: 'POST', headers: { ...auth, 'idempotency-key': 'bench-replay' }, body },
    limited: { url: `${gw.url}/bench/items`, headers: { authorization: `Bearer ${tiny}` } },
  };
}

/** Profiles one run of `opts` on the gateway whose inspector listens on `port`; `pid` is its workerd process. */
async function profiled(port, pid, opts) {
  const targets = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
  // postguard's worker by name; the reference's is the unnamed user worker.
  const target = targets.find((t) => /postguard/.test(t.title ?? t.id ?? '')) ?? targets.find((t) => t.id === 'core:user:') ?? targets[0];
  const c = CPU_ONLY ? null : cdp(target.webSocketDebuggerUrl);
  if (c) {
    await c.open;
    await c.send('Profiler.enable');
    await c.send('Profiler.setSamplingInterval', { interval: INTERVAL_US });
    await c.send('Profiler.start');
  }
  const before = cpuOf(pid);
  const res = await load({ ...opts, connections: Number(process.env.CONNECTIONS ?? 16), duration: SECONDS });
  const cpu = cpuDelta(before, cpuOf(pid));
  const requests = res.requests.total;
  const proc = { cpuProcess: cpu.process / requests, cpuThread: cpu.thread / requests };
  if (!c) return { res, ...proc, busy: NaN, worker: NaN, object: NaN, runtime: NaN, program: NaN, programSamples: NaN, self: [], inclusive: [] };
  const { profile } = await c.send('Profiler.stop');
  c.close();
  return { res, ...proc, ...analyse(profile, requests) };
}

/** Busy time per request, split by side, and self / inclusive time per function. */
function analyse(profile, requests) {
  const byNode = new Map();
  profile.samples.forEach((nodeId, i) => byNode.set(nodeId, (byNode.get(nodeId) ?? 0) + (profile.timeDeltas[i] ?? 0)));
  const byId = new Map(profile.nodes.map((nd) => [nd.id, nd]));
  const parent = new Map();
  for (const node of profile.nodes) for (const ch of node.children ?? []) parent.set(ch, node.id);
  // Which side of the Durable Object boundary a sample belongs to: any frame of the
  // KeyGuard object on its stack → the object (in production another machine and
  // thread); otherwise the stateless worker. Samples without a JS stack ((program), GC)
  // are the runtime's own.
  const sideOf = new Map();
  const side = (id) => {
    if (!sideOf.has(id)) {
      const fn = byId.get(id).callFrame.functionName;
      sideOf.set(id, /key_guard|keyguard_|minimal_rust::gateway::Ref\b|^ref_(fetch|new)$/i.test(fn) ? 'object' : parent.has(id) ? side(parent.get(id)) : 'worker');
    }
    return sideOf.get(id);
  };
  const self = new Map();
  const sides = { object: 0, worker: 0, runtime: 0 };
  for (const node of profile.nodes) {
    const us = byNode.get(node.id) ?? 0;
    const f = node.callFrame;
    if (f.functionName === '(idle)') continue;
    const name = `${f.functionName || '(anonymous)'} ${f.url ? f.url.split('/').pop() : ''}`.trim();
    self.set(name, (self.get(name) ?? 0) + us);
    if (/^\((program|garbage collector|root)\)$/.test(f.functionName)) sides.runtime += us;
    else sides[side(node.id)] += us;
  }
  // Inclusive time of the product's own functions (a function counted once per stack).
  const inclusive = new Map();
  const walk = (id, onStack) => {
    const nd = byId.get(id);
    const fn = nd.callFrame.functionName;
    const mine = /^<?(postguard|worker::)/.test(fn) ? fn.replace(/::h[0-9a-f]{16}$/, '') : null;
    const counted = mine && !onStack.has(mine);
    const stack = counted ? new Set([...onStack, mine]) : onStack;
    let sum = byNode.get(id) ?? 0;
    for (const ch of nd.children ?? []) sum += walk(ch, stack);
    if (counted) inclusive.set(mine, (inclusive.get(mine) ?? 0) + sum);
    return sum;
  };
  walk(profile.nodes[0].id, new Set());
  const per = (us) => us / requests;
  const busy = sides.object + sides.worker + sides.runtime;
  // (program) by sample count × the sampling interval, beside its time: a sample's time is
  // the gap since the previous sample, so a gap in sampling (the thread in another isolate,
  // or off the CPU) is charged to whatever is sampled next.
  const programIds = new Set(profile.nodes.filter((nd) => nd.callFrame.functionName === '(program)').map((nd) => nd.id));
  const programSamples = profile.samples.filter((id) => programIds.has(id)).length;
  return {
    busy: per(busy),
    worker: per(sides.worker),
    object: per(sides.object),
    runtime: per(sides.runtime),
    program: per(self.get('(program)') ?? 0),
    programSamples: per(programSamples * INTERVAL_US),
    self: [...self.entries()].sort((a, b) => b[1] - a[1]).map(([k, us]) => [k, per(us)]),
    inclusive: [...inclusive.entries()].sort((a, b) => b[1] - a[1]).map(([k, us]) => [k, per(us)]),
  };
}

const shortName = (fn) => fn.replace(/ index\.js$/, '').replace(/^__wbg_(\w+?)_[0-9a-f]+$/, '$1 (glue)').replace(/::h[0-9a-f]{16}.*$/, '').slice(0, 40);

const origin = await startOrigin();
// Inspector ports PROFILE_PORT … +5 (default 9239; +3 … +5 for the Rust floor and the RPC references): another port base lets two profiles run on one machine.
const PORT = Number(process.env.PROFILE_PORT ?? 9239);
// POSTGUARD_ROOT=<frozen copy> profiles that copy as "this build" (the harness reads it too).
const THIS_ROOT = process.env.POSTGUARD_ROOT ?? ROOT;
const builds = [{ label: 'this build', commit: commitOf(THIS_ROOT), port: PORT, ctx: await benchGateway(origin.url, { inspectorPort: PORT, patchOptions: withNames(THIS_ROOT) }) }];
/** A gateway of the build in `dir` (the harness reads the build from POSTGUARD_ROOT). */
async function gatewayOf(dir, port) {
  process.env.POSTGUARD_ROOT = dir;
  try {
    return await benchGateway(origin.url, { inspectorPort: port, patchOptions: withNames(dir) });
  } finally {
    if (THIS_ROOT === ROOT) delete process.env.POSTGUARD_ROOT;
    else process.env.POSTGUARD_ROOT = THIS_ROOT;
  }
}
if (BEFORE_ROOT) builds.push({ label: 'before', commit: commitOf(BEFORE_ROOT), port: PORT + 1, ctx: await gatewayOf(BEFORE_ROOT, PORT + 1) });
// The minimal gateway of bench/passthrough.mjs (calling its objects by fetch), profiled in
// the same rounds: the CPU target is postguard's busy time ÷ its busy time. Then the same
// gateway in Rust (bench/minimal-rust, ADR 0023; REFERENCE_RUST=0 leaves it out), on port +3.
async function baseline(script, port) {
  const r = await startBaseline(script, origin.url, { inspectorPort: port });
  const auth = { authorization: `Bearer ${r.key}`, 'content-type': 'application/json' };
  const body = '{"amount":100}';
  await fetch(`${r.url}/bench/pay`, { method: 'POST', headers: { ...auth, 'idempotency-key': 'bench-replay' }, body }).then((res) => res.arrayBuffer()); // the stored response
  return { gw: { url: r.url, dispose: r.dispose }, auth, tiny: r.tiny, body };
}
builds.push({ label: 'reference', commit: 'JS', port: PORT + 2, reference: true, ctx: await baseline(REFERENCE, PORT + 2) });
if (withRust()) {
  builds.push({ label: 'Rust reference', commit: 'Rust', port: PORT + 3, rust: true, ctx: await baseline(RUST_REFERENCE, PORT + 3) });
}
if (withRust() && process.env.REFERENCE_RPC !== '0') {
  // Both references calling their objects by JS RPC, as postguard does (ports +4, +5).
  builds.push({ label: 'reference (RPC)', commit: 'JS', port: PORT + 4, rpc: true, ctx: await baseline(REFERENCE_RPC, PORT + 4) });
  builds.push({ label: 'Rust reference (RPC)', commit: 'Rust', port: PORT + 5, rustRpc: true, ctx: await baseline(RUST_REFERENCE_RPC, PORT + 5) });
}
// The variants (ports +6 …), listed after this build and BEFORE_ROOT.
const variants = [];
for (const [i, [label, dir]] of VARIANTS.entries()) variants.push({ label, commit: commitOf(dir), port: PORT + 6 + i, ctx: await gatewayOf(dir, PORT + 6 + i) });
builds.splice(BEFORE_ROOT ? 2 : 1, 0, ...variants);
for (const b of builds) b.pid = pidOfPort(Number(new URL(b.ctx.gw.url).port));
const refIndex = builds.findIndex((b) => b.reference);
const rustIndex = builds.findIndex((b) => b.rust);
const rpcIndex = builds.findIndex((b) => b.rpc);
const rustRpcIndex = builds.findIndex((b) => b.rustRpc);
try {
  const sets = builds.map((b) => scenariosFor(b.ctx));
  const names = SCENARIO === 'all' ? Object.keys(sets[0]) : [SCENARIO];
  for (const name of names) if (!sets[0][name]) throw new Error(`unknown scenario ${name}; one of all, ${Object.keys(sets[0]).join(', ')}`);
  const summary = [];
  for (const name of names) {
    for (const set of sets) await load({ ...set[name], connections: 16, duration: 2 }); // warm-up
    const runs = builds.map(() => []);
    for (let r = 0; r < ROUNDS; r++) {
      for (let b = 0; b < builds.length; b++) {
        const out = await profiled(builds[b].port, builds[b].pid, sets[b][name]);
        runs[b].push(out);
        console.log(`${name} [${builds[b].label} ${builds[b].commit}] round ${r + 1}: ${out.res.requests.average} req/s, busy ${out.busy.toFixed(0)} µs/request (worker ${out.worker.toFixed(0)}, object ${out.object.toFixed(0)}, runtime ${out.runtime.toFixed(0)}, (program) ${out.program.toFixed(0)}, by samples ${out.programSamples.toFixed(0)}); workerd CPU ${out.cpuProcess.toFixed(0)} µs/request, its busiest thread ${out.cpuThread.toFixed(0)}`);
      }
    }
    builds.forEach((b, i) => {
      const last = runs[i][ROUNDS - 1];
      console.log(`  ${name} [${b.label}], last round, largest self time:`);
      for (const [fn, us] of last.self.slice(0, TOP)) console.log(`  ${us.toFixed(1).padStart(7)} µs/req self  ${fn.slice(0, 110)}`);
      if (process.env.INCLUSIVE && i === 0) for (const [fn, us] of last.inclusive.slice(0, TOP)) console.log(`  ${us.toFixed(1).padStart(7)} µs/req incl  ${fn.slice(0, 130)}`);
    });
    const m1 = (xs, d = 0) => (xs.some(Number.isNaN) ? '—' : `${median(xs).toFixed(d)} (${spread(xs, d)})`); // — : CPU_ONLY, no profile
    console.log(`\n  ${name}: every contender, medians (spread) over ${ROUNDS} rounds; ratios to "${builds[0].label}" per round\n`);
    console.log('| build | req/s | busy µs/request | (program) µs | (program) by samples µs | workerd CPU µs/request | busiest thread µs/request | thread CPU ÷ first, per round |');
    console.log('|---|---|---|---|---|---|---|---|');
    builds.forEach((b, i) => {
      const rs = runs[i];
      const f = (k) => rs.map((o) => o[k]);
      console.log(`| ${b.label} (${b.commit}) | ${median(rs.map((o) => o.res.requests.average)).toFixed(0)} | ${m1(f('busy'))} | ${m1(f('program'))} | ${m1(f('programSamples'))} | ${m1(f('cpuProcess'))} | ${m1(f('cpuThread'))} | ${m1(rs.map((o, j) => o.cpuThread / runs[0][j].cpuThread), 2)} |`);
    });
    const topOf = (i, n = 6) => runs[i][ROUNDS - 1].self.slice(0, n).map(([fn, us]) => `${shortName(fn)} ${us.toFixed(0)}`).join(', ');
    summary.push({ name, runs, top: topOf(0), refTop: topOf(refIndex, 8), rustTop: rustIndex < 0 ? '' : topOf(rustIndex, 8) });
  }
  if (SCENARIO === 'all') {
    const m = (xs, d = 0) => `${median(xs).toFixed(d)} (${spread(xs, d)})`;
    const field = (runs, k) => runs.map((o) => o[k]);
    const main = summary.map((s) => {
      const [cur] = s.runs;
      const ref = s.runs[refIndex];
      const ratio = cur.map((o, i) => o.busy / ref[i].busy);
      return `| ${s.name} | ${median(cur.map((o) => o.res.requests.average)).toFixed(0)} | ${m(field(cur, 'busy'))} | ${median(field(cur, 'worker')).toFixed(0)} | ${median(field(cur, 'object')).toFixed(0)} | ${median(field(cur, 'runtime')).toFixed(0)} | ${m(field(ref, 'busy'))} | ${m(ratio, 2)} | ${s.top} |`;
    }).join('\n');
    const compare = !BEFORE_ROOT ? '' : `
Before and after, profiled in alternation in the same run (build ${builds[1].commit} from \`BEFORE_ROOT\`, build ${builds[0].commit}):

| scenario | busy µs/request before | after | after ÷ before, per round |
|---|---|---|---|
${summary.map((s) => {
    const [cur, old] = s.runs;
    const ratio = cur.map((o, i) => o.busy / old[i].busy);
    return `| ${s.name} | ${m(field(old, 'busy'))} | ${m(field(cur, 'busy'))} | ${m(ratio, 2)} |`;
  }).join('\n')}
`;
    const rust = rustIndex < 0 ? '' : `
### The Rust floor (ADR 0023)

The minimal gateway in Rust (\`bench/minimal-rust\`, plain \`worker\` crate, objects called by \`fetch\`, and by JS RPC beside
\`REFERENCE_RPC\`), profiled in the same rounds as postguard and the JS reference (its name section kept, so Rust functions are named; the JS glue is esbuild-minified).
Busy µs per request, medians (spread); ratios per round; self-time entries from the last round.

| scenario | Rust reference busy µs/request | JS reference busy µs/request | Rust ÷ JS reference, per round | postguard ÷ Rust reference, per round | both on RPC: Rust ÷ JS, per round | postguard ÷ Rust reference (RPC), per round | Rust reference: largest self-time entries (µs/request) | JS reference: largest self-time entries (µs/request) |
|---|---|---|---|---|---|---|---|---|
${summary.map((s) => {
    const [cur] = s.runs;
    const ref = s.runs[refIndex];
    const rs = s.runs[rustIndex];
    const [jr, rr] = [s.runs[rpcIndex], s.runs[rustRpcIndex]];
    return `| ${s.name} | ${m(field(rs, 'busy'))} | ${m(field(ref, 'busy'))} | ${m(rs.map((o, i) => o.busy / ref[i].busy), 2)} | ${m(cur.map((o, i) => o.busy / rs[i].busy), 2)} | ${m(rr.map((o, i) => o.busy / jr[i].busy), 2)} | ${m(cur.map((o, i) => o.busy / rr[i].busy), 2)} | ${s.rustTop} | ${s.refTop} |`;
  }).join('\n')}
`;
    writeSection('profile', `## Where the time goes: CPU per request

\`${BEFORE_ROOT ? 'BEFORE_ROOT=<checkout of an earlier build> ' : ''}node bench/profile.mjs all ${SECONDS} ${ROUNDS}\` — build ${builds[0].commit}, ${new Date().toISOString().slice(0, 10)}; a V8 CPU profile (200 µs sampling)
of the postguard isolate through Miniflare's inspector while autocannon drives 16 connections for ${SECONDS} s, ${ROUNDS} rounds.
Locally the key's Durable Object runs in the same isolate and thread as the worker, so the thread's busy time per
request is what limits throughput here. "object": samples with a KeyGuard frame on the stack (in production another
machine); "runtime": samples with no JS stack (workerd's own work, GC). "reference": the minimal JS gateway of
bench/passthrough.mjs (objects called by fetch), profiled the same way in the same rounds, its objects included in its
busy time. µs per request, medians (spread); the largest self-time entries are from the last round.

| scenario | req/s while profiled | busy µs/request | worker | object | runtime | reference busy µs/request | postguard ÷ reference, per round | largest self-time entries (µs/request) |
|---|---|---|---|---|---|---|---|---|
${main}
${compare}${rust}`);
  }
} finally {
  for (const b of builds) await b.ctx.gw.dispose();
  await origin.kill();
}
