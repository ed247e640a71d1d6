// Where a publish's CPU time goes: a V8 CPU profile of the worker isolate (Miniflare's
// inspector) while 16 concurrent publishers POST /_postguard/v1/events to a project with five
// subscriptions. The queue consumer is left out (no consumer is registered), so the profile
// holds the publish path only: parse, group commit, D1, sendBatch, the audit row.
// Reported per publish: busy µs (all samples but idle), wasm µs (samples whose own frame is
// a wasm function), the largest self-time entries and postguard's functions by inclusive
// time. The wasm is served from the copy with names (target/wasm-names, as bench/profile.mjs).
// BEFORE_ROOT=<checkout with its own build> profiles that build too, in alternating rounds.
// Usage: [BEFORE_ROOT=…] node bench/publish-profile.mjs [events] [rounds] [top]   (PROFILE_PORT, default 9249; FOCUS, CALLERS below)
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN, ROOT } from '../tests/support/gateway.mjs';
import { commitOf, median, spread } from './results.mjs';
import { cdp, withNames } from './inspector.mjs';

const EVENTS = Number(process.argv[2] ?? 1000);
const ROUNDS = Number(process.argv[3] ?? 3);
const TOP = Number(process.argv[4] ?? 25);
const PORT = Number(process.env.PROFILE_PORT ?? 9249);
const PUBLISHERS = 16;
// Where a publish's busy time goes, by the nearest frame that names a category (first match
// in this order at each frame, leaf first).
const CATEGORIES = [
  ['D1 binding, JS (request, response parse)', /cloudflare-internal:d1-api/],
  ['D1 rows and meta decoded into Rust', /worker::d1::D1Result|serde_wasm_bindgen::de/],
  ['D1 statements built (prepare, bind, batch)', /worker::d1::|worker_sys::types::d1/],
  ['queue sendBatch', /Queue::send_batch|sendBatch/],
  ['audit row (docs/audit-log.md)', /postguard::audit|audit_shard|AuditShard|transactionSync|postguard_core::audit/],
  ['publish handler: parse, group commit, plan', /postguard::webhooks|postguard_core::webhooks/],
  ['request and response (auth, headers, body)', /postguard::http|postguard::request|postguard::auth|postguard::handle|postguard::admin|postguard::runtime|worker::response|worker::request|worker::headers|worker::env/],
  ['futures and closures (wasm-bindgen scheduling)', /js_sys::futures|wasm_bindgen::closure|wasm_bindgen::convert::closures|queueMicrotask|cb_unref|js_sys::Promise/],
  ['runtime (no JS stack, GC)', /^\((program|garbage collector)\)/],
];
const CALLERS = process.env.CALLERS ? new RegExp(process.env.CALLERS) : null;
const FOCUS = process.env.FOCUS ? new RegExp(process.env.FOCUS) : null;
const FANOUT = 5;
const QUOTAS = { events_per_project_per_day: 100_000_000, deliveries_per_project_per_day: 1_000_000_000, bytes_per_project_per_day: 8_000_000_000 };

/** Self time per function, wasm time, inclusive time of postguard's functions (µs, totals). */
function analyse(profile) {
  const byNode = new Map();
  profile.samples.forEach((n, i) => byNode.set(n, (byNode.get(n) ?? 0) + (profile.timeDeltas[i] ?? 0)));
  const byId = new Map(profile.nodes.map((nd) => [nd.id, nd]));
  const self = new Map();
  let busy = 0;
  let wasm = 0;
  for (const nd of profile.nodes) {
    const us = byNode.get(nd.id) ?? 0;
    const f = nd.callFrame;
    if (f.functionName === '(idle)') continue;
    busy += us;
    if (/wasm:\/\/|\.wasm/.test(f.url) || /^(postguard|worker|core|alloc|serde|<)/.test(f.functionName)) wasm += us;
    const name = `${f.functionName || '(anonymous)'} ${f.url ? f.url.split('/').pop() : ''}`.trim();
    self.set(name, (self.get(name) ?? 0) + us);
  }
  // FOCUS=<regex>: every function's inclusive time, counting only the stacks under a frame
  // that matches it (what a function such as group::submit spends its time on).
  const inclusive = new Map();
  const walk = (id, onStack, under) => {
    const nd = byId.get(id);
    const fn = nd.callFrame.functionName.replace(/::h[0-9a-f]{16}.*$/, '') || `(anonymous) ${nd.callFrame.url.split('/').pop()}`;
    const inFocus = under || (FOCUS && FOCUS.test(fn));
    const mine = FOCUS ? (inFocus ? fn : null) : /^<?(postguard|worker::|serde_json|js_sys|wasm_bindgen)/.test(fn) ? fn : null;
    const counted = mine && !onStack.has(mine);
    const stack = counted ? new Set([...onStack, mine]) : onStack;
    let sum = byNode.get(id) ?? 0;
    if (nd.callFrame.functionName === '(idle)') sum = 0;
    for (const ch of nd.children ?? []) sum += walk(ch, stack, inFocus);
    if (counted) inclusive.set(mine, (inclusive.get(mine) ?? 0) + sum);
    return sum;
  };
  walk(profile.nodes[0].id, new Set(), false);
  // CALLERS=<regex>: for the functions matching it, their self time by the nearest named
  // Rust (or worker glue) frame above them: who pays for a runtime builtin such as `text`.
  const callers = new Map();
  if (CALLERS) {
    const parent = new Map();
    for (const nd of profile.nodes) for (const ch of nd.children ?? []) parent.set(ch, nd.id);
    for (const nd of profile.nodes) {
      const us = byNode.get(nd.id) ?? 0;
      if (!us || !CALLERS.test(nd.callFrame.functionName)) continue;
      let up = parent.get(nd.id);
      const chain = [];
      while (up !== undefined && chain.length < 3) {
        const fn = byId.get(up).callFrame.functionName.replace(/::h[0-9a-f]{16}.*$/, '');
        if (/^<?(postguard|worker|js_sys|serde)/.test(fn) && !/closures::|futures::queue|future_to_promise|AssertUnwindSafe/.test(fn)) chain.push(fn.slice(0, 70));
        up = parent.get(up);
      }
      const key = `${nd.callFrame.functionName} <- ${chain.join(' <- ') || '(no Rust frame)'}`;
      callers.set(key, (callers.get(key) ?? 0) + us);
    }
  }
  // Each sample goes to the category of the nearest frame (leaf first) that names one.
  const parentOf = new Map();
  for (const nd of profile.nodes) for (const ch of nd.children ?? []) parentOf.set(ch, nd.id);
  const categories = new Map();
  const categoryOf = (id) => {
    for (let at = id; at !== undefined; at = parentOf.get(at)) {
      const f = byId.get(at).callFrame;
      const hit = CATEGORIES.find(([, re]) => re.test(`${f.functionName} ${f.url}`));
      if (hit) return hit[0];
    }
    return 'other';
  };
  for (const nd of profile.nodes) {
    const us = byNode.get(nd.id) ?? 0;
    if (!us || nd.callFrame.functionName === '(idle)') continue;
    const c = categoryOf(nd.id);
    categories.set(c, (categories.get(c) ?? 0) + us);
  }
  const sorted = (m) => [...m.entries()].sort((a, b) => b[1] - a[1]);
  return { busy, wasm, self: sorted(self), inclusive: sorted(inclusive), callers: sorted(callers), categories: sorted(categories) };
}

const origin = await startOrigin();
const BEFORE_ROOT = process.env.BEFORE_ROOT;

/** One build's gateway (inspector on `port`) with a project of five subscriptions. */
async function build(label, root, port) {
  if (root) process.env.POSTGUARD_ROOT = root; // the harness reads the build from here
  const gw = await startGateway({
    originUrl: origin.url,
    inspectorPort: port,
    vars: { POSTGUARD_CONFIG: cfg({ webhooks: { allow_insecure_urls: true, allow_hosts: ['127.0.0.1'], ...QUOTAS }, plans: { big: { requests_per_window: 10_000_000 } } }) },
    patchOptions: (o) => {
      const named = withNames(root ?? ROOT);
      if (!named) throw new Error(`${root ?? ROOT}: target/wasm-names is not this build: run scripts/build.sh`);
      named(o);
      o.queueConsumers = {}; // publishing only: the jobs stay queued
    },
  });
  delete process.env.POSTGUARD_ROOT;
  const project = `prof-${port}`;
  const { key } = await gw.createKey({ project, plan: 'big' });
  for (let s = 0; s < FANOUT; s++) {
    const sub = await gw.admin('POST', '/_postguard/v1/webhooks', { url: `http://127.0.0.1:9/hook/${s}`, events: ['*'] }, { token: key });
    if (sub.status !== 201) throw new Error(`subscription: ${sub.status} ${sub.text}`);
  }
  const targets = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
  const target = targets.find((t) => /postguard/.test(t.title ?? t.id ?? '')) ?? targets[0];
  return { label, commit: commitOf(root ?? ROOT), gw, project, target, runs: [] };
}

/** Publishes `n` events to the build's project, 16 at a time; events/s. */
async function publish(b, n) {
  let next = 0;
  const publisher = async () => {
    while (next < n) {
      const i = next++;
      const res = await b.gw.admin('POST', '/_postguard/v1/events', { project: b.project, type: 'bench.tick', data: { n: i } }, { token: ORIGIN_TOKEN });
      if (res.status !== 202) throw new Error(`publish answered ${res.status}: ${res.text}`);
    }
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: PUBLISHERS }, publisher));
  return n / ((performance.now() - t0) / 1000);
}

async function profiled(b) {
  const c = cdp(b.target.webSocketDebuggerUrl);
  await c.open;
  await c.send('Profiler.enable');
  await c.send('Profiler.setSamplingInterval', { interval: 100 });
  await c.send('Profiler.start');
  const rate = await publish(b, EVENTS);
  const { profile } = await c.send('Profiler.stop');
  c.close();
  return { rate, ...analyse(profile) };
}

const builds = [await build('this build', undefined, PORT)];
if (BEFORE_ROOT) builds.push(await build('before', BEFORE_ROOT, PORT + 1));
try {
  for (const b of builds) await publish(b, 200); // warm-up
  for (let r = 0; r < ROUNDS; r++) {
    for (const b of builds) {
      const a = await profiled(b);
      b.runs.push(a);
      console.log(`round ${r + 1} [${b.label} ${b.commit}]: ${a.rate.toFixed(0)} events/s while profiled, busy ${(a.busy / EVENTS).toFixed(0)} µs/publish, wasm self ${(a.wasm / EVENTS).toFixed(0)} µs/publish`);
    }
  }
  const per = (b, k) => b.runs.map((x) => (k === 'rate' ? x.rate : x[k] / EVENTS));
  const m = (xs) => `${median(xs).toFixed(0)} (${spread(xs, 0)})`;
  console.log(`\n${EVENTS} events × ${ROUNDS} rounds, ${FANOUT} subscriptions, ${PUBLISHERS} publishers, no consumer`);
  console.log('| build | events/s while profiled | busy µs/publish | wasm self µs/publish |');
  console.log('|---|---|---|---|');
  for (const b of builds) console.log(`| ${b.label} (${b.commit}) | ${m(per(b, 'rate'))} | ${m(per(b, 'busy'))} | ${m(per(b, 'wasm'))} |`);
  if (builds.length > 1) {
    const ratio = (k) => { const xs = builds[0].runs.map((x, i) => x[k] / builds[1].runs[i][k]); return `${median(xs).toFixed(2)} (${spread(xs)})`; };
    console.log(`this ÷ before, per round: busy ${ratio('busy')}, wasm self ${ratio('wasm')}`);
  }
  const names = [...new Set(builds.flatMap((b) => b.runs.flatMap((r) => r.categories.map(([k]) => k))))];
  console.log(`\n| busy µs per publish, by category (medians) | ${builds.map((b) => `${b.label} (${b.commit})`).join(' | ')} |`);
  console.log(`|---|${builds.map(() => '---').join('|')}|`);
  const catOf = (b, k) => median(b.runs.map((r) => (r.categories.find(([n]) => n === k)?.[1] ?? 0) / EVENTS));
  for (const k of names.sort((x, y) => catOf(builds[0], y) - catOf(builds[0], x))) console.log(`| ${k} | ${builds.map((b) => catOf(b, k).toFixed(0)).join(' | ')} |`);
  for (const b of builds) {
    const last = b.runs.at(-1);
    console.log(`\n[${b.label} ${b.commit}] last round, largest self time (µs/publish):`);
    for (const [fn, us] of last.self.slice(0, TOP)) console.log(`${(us / EVENTS).toFixed(1).padStart(8)}  ${fn.slice(0, 120)}`);
    console.log(`[${b.label}] last round, inclusive (µs/publish):`);
    for (const [fn, us] of last.inclusive.slice(0, TOP)) console.log(`${(us / EVENTS).toFixed(1).padStart(8)}  ${fn.slice(0, 140)}`);
    if (CALLERS) {
      console.log(`[${b.label}] last round, callers (µs/publish):`);
      for (const [fn, us] of last.callers.slice(0, TOP)) console.log(`${(us / EVENTS).toFixed(1).padStart(8)}  ${fn.slice(0, 240)}`);
    }
  }
} finally {
  for (const b of builds) await b.gw.dispose();
  await origin.kill();
}
