// Where postguard's CPU time goes: a V8 CPU profile of the worker isolate (through the
// inspector Miniflare exposes) while autocannon drives one scenario, aggregated by function
// self time. The wasm keeps its name section, so Rust functions appear by name.
// With scenario "all" it profiles each in turn and writes a summary into bench/RESULTS.md
// (section "profile", or $BENCH_SECTION; POSTGUARD_ROOT selects another build, as in proxy.mjs).
// Usage: node bench/profile.mjs [scenario: all|get|fresh|replay|limited] [seconds] [top]
// (INCLUSIVE=1 also lists the product's own functions by inclusive time.)
import { execFileSync } from 'node:child_process';
import { startOrigin } from '../tests/support/origin.mjs';
import { ORIGIN_TOKEN, ROOT } from '../tests/support/gateway.mjs';
import { benchGateway, load, writeSection } from './results.mjs';

const SCENARIO = process.argv[2] ?? 'all';
const SECONDS = Number(process.argv[3] ?? 4);
const TOP = Number(process.argv[4] ?? 30);
const INSPECTOR_PORT = 9239;

const origin = await startOrigin({ token: ORIGIN_TOKEN });
const { gw, tiny, auth, body } = await benchGateway(origin.url, { inspectorPort: INSPECTOR_PORT });

function cdp(wsUrl) {
  const ws = new WebSocket(wsUrl);
  let id = 0;
  const waiting = new Map();
  ws.addEventListener('message', (ev) => {
    const msg = JSON.parse(ev.data);
    if (msg.id && waiting.has(msg.id)) {
      const { resolve, reject } = waiting.get(msg.id);
      waiting.delete(msg.id);
      if (msg.error) reject(new Error(JSON.stringify(msg.error)));
      else resolve(msg.result);
    }
  });
  const open = new Promise((resolve, reject) => {
    ws.addEventListener('open', resolve);
    ws.addEventListener('error', reject);
  });
  return {
    open,
    send: (method, params = {}) => new Promise((resolve, reject) => {
      id += 1;
      waiting.set(id, { resolve, reject });
      ws.send(JSON.stringify({ id, method, params }));
    }),
    close: () => ws.close(),
  };
}

try {
  let n = 0;
  const stamp = Date.now();
  const scenarios = {
    get: { url: `${gw.url}/bench/items`, headers: auth },
    fresh: {
      url: `${gw.url}/bench/pay`, method: 'POST', headers: auth, body,
      requests: [{ setupRequest: (r) => ({ ...r, headers: { ...r.headers, 'idempotency-key': `prof-${stamp}-${n++}` } }) }],
    },
    replay: { url: `${gw.url}/bench/pay`, method: 'POST', headers: { ...auth, 'idempotency-key': 'bench-replay' }, body },
    limited: { url: `${gw.url}/bench/items`, headers: { authorization: `Bearer ${tiny}` } },
  };
  const names = SCENARIO === 'all' ? Object.keys(scenarios) : [SCENARIO];
  for (const name of names) if (!scenarios[name]) throw new Error(`unknown scenario ${name}; one of all, ${Object.keys(scenarios).join(', ')}`);
  const summary = [];
  for (const name of names) {
  const opts = scenarios[name];
  const run = () => load({ ...opts, connections: 16, duration: SECONDS });
  await run(); // warm-up

  const targets = await (await fetch(`http://127.0.0.1:${INSPECTOR_PORT}/json/list`)).json();
  const target = targets.find((t) => /postguard/.test(t.title ?? t.id ?? '')) ?? targets[0];
  const c = cdp(target.webSocketDebuggerUrl);
  await c.open;
  await c.send('Profiler.enable');
  await c.send('Profiler.setSamplingInterval', { interval: 200 });
  await c.send('Profiler.start');
  const res = await run();
  const { profile } = await c.send('Profiler.stop');
  c.close();

  const dt = profile.timeDeltas;
  const byNode = new Map();
  profile.samples.forEach((nodeId, i) => byNode.set(nodeId, (byNode.get(nodeId) ?? 0) + (dt[i] ?? 0)));
  const self = new Map();
  let total = 0;
  for (const node of profile.nodes) {
    const us = byNode.get(node.id) ?? 0;
    total += us;
    const f = node.callFrame;
    const name = `${f.functionName || '(anonymous)'} ${f.url ? f.url.split('/').pop() : ''}`.trim();
    self.set(name, (self.get(name) ?? 0) + us);
  }
  // Which side of the Durable Object boundary a sample belongs to: any frame of the
  // KeyGuard object on its stack → the object (in production a different machine and
  // thread); otherwise the stateless worker. Runtime-internal samples ((program), GC)
  // have no stack and are counted apart.
  const parent = new Map();
  for (const node of profile.nodes) for (const ch of node.children ?? []) parent.set(ch, node.id);
  const byId = new Map(profile.nodes.map((nd) => [nd.id, nd]));
  const sideOf = new Map();
  const side = (id) => {
    if (sideOf.has(id)) return sideOf.get(id);
    const nd = byId.get(id);
    const fn = nd.callFrame.functionName;
    let s;
    if (/key_guard|keyguard_/i.test(fn)) s = 'object';
    else if (parent.has(id)) s = side(parent.get(id));
    else s = 'worker';
    sideOf.set(id, s);
    return s;
  };
  const sides = { object: 0, worker: 0, runtime: 0 };
  for (const node of profile.nodes) {
    const us = byNode.get(node.id) ?? 0;
    const fn = node.callFrame.functionName;
    if (fn === '(idle)') continue;
    if (/^\((program|garbage collector|root)\)$/.test(fn)) sides.runtime += us;
    else sides[side(node.id)] += us;
  }
  const idle = (self.get('(idle)') ?? 0);
  const busy = total - idle;
  console.log(`${name}: ${res.requests.average} req/s, p50 ${res.latency.p50} ms; profiled ${(total / 1e6).toFixed(2)} s, busy ${(busy / 1e6).toFixed(2)} s (${(busy / res.requests.total).toFixed(0)} µs per request)`);
  console.log(`per request: worker ${(sides.worker / res.requests.total).toFixed(0)} µs, object ${(sides.object / res.requests.total).toFixed(0)} µs, runtime (no JS stack: program, GC) ${(sides.runtime / res.requests.total).toFixed(0)} µs`);
  // Inclusive time of the product's own functions (a function counted once per stack).
  const inclusive = new Map();
  const walk = (id, onStack) => {
    const nd = byId.get(id);
    const name = nd.callFrame.functionName;
    const mine = /^(<)?postguard/.test(name) || /^<?worker::/.test(name) ? name.replace(/::h[0-9a-f]{16}$/, '') : null;
    const stack = mine && !onStack.has(mine) ? new Set([...onStack, mine]) : onStack;
    let sum = byNode.get(id) ?? 0;
    for (const ch of nd.children ?? []) sum += walk(ch, stack);
    if (mine && !onStack.has(mine)) inclusive.set(mine, (inclusive.get(mine) ?? 0) + sum);
    return sum;
  };
  walk(profile.nodes[0].id, new Set());
  if (process.env.INCLUSIVE) {
    console.log('inclusive (own functions):');
    for (const [name, us] of [...inclusive.entries()].sort((a, b) => b[1] - a[1]).slice(0, TOP)) console.log(`${(us / res.requests.total).toFixed(1).padStart(7)} µs/req  ${name.slice(0, 130)}`);
  }
  const rows = [...self.entries()].filter(([k]) => k !== '(idle)').sort((a, b) => b[1] - a[1]).slice(0, TOP);
  for (const [fn, us] of rows) console.log(`${((100 * us) / busy).toFixed(1).padStart(5)}%  ${(us / res.requests.total).toFixed(1).padStart(6)} µs/req  ${fn.slice(0, 110)}`);
  const per = (us) => Math.round(us / res.requests.total);
  summary.push({
    name, rps: res.requests.average, busy: per(busy), worker: per(sides.worker), object: per(sides.object), runtime: per(sides.runtime),
    top: rows.slice(0, 6).map(([fn, us]) => `${fn.replace(/ index\.js$/, '').replace(/^__wbg_(\w+?)_[0-9a-f]+$/, '$1 (glue)').replace(/::h[0-9a-f]{16}.*$/, '').slice(0, 40)} ${per(us)}`).join(', '),
  });
  }
  let commit = '?';
  try {
    commit = execFileSync('git', ['-C', process.env.POSTGUARD_ROOT ?? ROOT, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch { /* not a checkout */ }
  if (SCENARIO === 'all') {
    const section = process.env.BENCH_SECTION ?? 'profile';
    writeSection(section, `## Where the time goes: CPU per request${section === 'profile' ? '' : ` (${section})`}

\`${process.env.POSTGUARD_ROOT ? `POSTGUARD_ROOT=<checkout of ${commit}> BENCH_SECTION=${section} ` : ''}node bench/profile.mjs all ${SECONDS}\` — build ${commit}, ${new Date().toISOString().slice(0, 10)}; a V8 CPU profile (200 µs sampling) of
the postguard isolate through Miniflare's inspector while autocannon drives 16 connections for ${SECONDS} s. Locally the key's
Durable Object runs in the same isolate and thread as the worker, so the thread's busy time per request is what
limits throughput here. "object": samples with a KeyGuard frame on the stack (in production another machine);
"runtime": samples with no JS stack (workerd's own work, GC). µs per request.

| scenario | req/s while profiled | busy µs/request | worker | object | runtime | largest self-time entries (µs/request) |
|---|---|---|---|---|---|---|
${summary.map((r) => `| ${r.name} | ${r.rps.toFixed(0)} | ${r.busy} | ${r.worker} | ${r.object} | ${r.runtime} | ${r.top} |`).join('\n')}
`);
  }
} finally {
  await gw.dispose();
  await origin.kill();
}
