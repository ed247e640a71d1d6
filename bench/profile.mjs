// Where postguard's CPU time goes: a V8 CPU profile of the worker isolate (through the
// inspector Miniflare exposes) while autocannon drives one scenario, aggregated by function
// self time. The wasm keeps its name section, so Rust functions appear by name.
// Usage: node bench/profile.mjs [scenario: get|fresh|replay|limited] [seconds] [top]
import autocannon from 'autocannon';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN } from '../tests/support/gateway.mjs';

const SCENARIO = process.argv[2] ?? 'fresh';
const SECONDS = Number(process.argv[3] ?? 4);
const TOP = Number(process.argv[4] ?? 30);
const INSPECTOR_PORT = 9239;

const origin = await startOrigin({ token: ORIGIN_TOKEN });
const gw = await startGateway({
  originUrl: origin.url,
  inspectorPort: INSPECTOR_PORT,
  vars: { POSTGUARD_CONFIG: cfg({ plans: { bench: { requests_per_window: 10_000_000 }, tiny: { requests_per_window: 1, window_s: 86400 } } }) },
});

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
  const key = (await gw.createKey({ project: 'bench', plan: 'bench' })).key;
  const tiny = (await gw.createKey({ project: 'bench', plan: 'tiny' })).key;
  const auth = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  const body = '{"amount":100}';
  await gw.fetch('/bench/pay', { method: 'POST', headers: { ...auth, 'idempotency-key': 'bench-replay' }, body });
  await gw.fetch('/bench/items', { headers: { authorization: `Bearer ${tiny}` } });
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
  const opts = scenarios[SCENARIO];
  if (!opts) throw new Error(`unknown scenario ${SCENARIO}; one of ${Object.keys(scenarios).join(', ')}`);
  const run = () => new Promise((resolve, reject) => autocannon({ ...opts, connections: 16, duration: SECONDS }, (e, r) => (e ? reject(e) : resolve(r))));
  await run(); // warm-up

  const targets = await (await fetch(`http://127.0.0.1:${INSPECTOR_PORT}/json/list`)).json();
  const target = targets.find((t) => /postguard/.test(t.title ?? t.id ?? '')) ?? targets[0];
  console.log('inspector targets:', targets.map((t) => t.title ?? t.id).join(', '), '→ profiling', target.title);
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
  console.log(`${SCENARIO}: ${res.requests.average} req/s, p50 ${res.latency.p50} ms; profiled ${(total / 1e6).toFixed(2)} s, busy ${(busy / 1e6).toFixed(2)} s (${(busy / res.requests.total).toFixed(0)} µs per request)`);
  console.log(`per request: worker ${(sides.worker / res.requests.total).toFixed(0)} µs, object ${(sides.object / res.requests.total).toFixed(0)} µs, runtime (no JS stack: program, GC) ${(sides.runtime / res.requests.total).toFixed(0)} µs`);
  const rows = [...self.entries()].filter(([k]) => k !== '(idle)').sort((a, b) => b[1] - a[1]).slice(0, TOP);
  for (const [name, us] of rows) console.log(`${((100 * us) / busy).toFixed(1).padStart(5)}%  ${(us / res.requests.total).toFixed(1).padStart(6)} µs/req  ${name.slice(0, 110)}`);
} finally {
  await gw.dispose();
  await origin.kill();
}
