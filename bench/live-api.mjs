// Benchmark (issue 34): what the live-API features cost. (1) a proxied GET and a fresh POST
// with 10 origin routes configured ÷ with none — two gateways side by side, runs alternating,
// every request routed past all ten rules to `default` (the worst case); (2) an import of
// 1,000 keys in one call: its time, and the KV entries and object calls it made per key;
// (3) 1,000 requests (16 at once) with a key the gateway does not know, verified against the
// origin: origin calls for that key.
// Usage: node bench/live-api.mjs [rounds] [seconds]
import crypto from 'node:crypto';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ROOT, ADMIN_TOKEN } from '../tests/support/gateway.mjs';
import { commitOf, load as cannon, median, spread, writeSection, loadUrl } from './results.mjs';

const ROUNDS = Number(process.argv[2] ?? 5);
const SECONDS = Number(process.argv[3] ?? 4);
const CONNECTIONS = 16;
const PLANS = { bench: { requests_per_window: 10_000_000, window_s: 3600 } };
const ROUTES = Array.from({ length: 10 }, (_, i) => ({ path: `/svc${i}/*`, origin: 'other', strip_prefix: `/svc${i}` }));

const load = (url, opts = {}) => loadUrl(url, { ...opts, connections: CONNECTIONS, seconds: SECONDS });

const origin = await startOrigin();
const other = await startOrigin();
const routed = await startGateway({
  originUrl: origin.url,
  vars: { POSTGUARD_CONFIG: cfg({ plans: PLANS, origins: { other: { url: other.url } }, origin: { routes: ROUTES } }) },
});
const plain = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ plans: PLANS }) } });
const lines = [];
try {
  const gws = { none: plain, routes: routed };
  const keys = {};
  for (const [name, g] of Object.entries(gws)) keys[name] = (await g.createKey({ project: 'bench', plan: 'bench' })).key;
  const auth = (name) => ({ authorization: `Bearer ${keys[name]}`, 'content-type': 'application/json' });
  const scenarios = {
    'proxied GET': (name) => load(`${gws[name].url}/bench/items`, { headers: auth(name) }),
    'fresh POST': (name) => load(`${gws[name].url}/bench/pay`, { method: 'POST', headers: auth(name), body: '{"amount":100}', fresh: true }),
  };
  const rows = [];
  for (const [scenario, run] of Object.entries(scenarios)) {
    const ratios = [];
    const rate = { none: [], routes: [] };
    for (let round = 0; round < ROUNDS; round++) {
      const order = round % 2 ? ['routes', 'none'] : ['none', 'routes'];
      const got = {};
      for (const name of order) {
        const res = await run(name);
        if (res['2xx'] < res.requests.total * 0.99) throw new Error(`${scenario} ${name}: ${res['2xx']} of ${res.requests.total} 2xx`);
        got[name] = res.requests.average;
      }
      rate.none.push(got.none);
      rate.routes.push(got.routes);
      ratios.push(got.routes / got.none);
      console.log(`${scenario} round ${round + 1}: none ${got.none.toFixed(0)} req/s, 10 routes ${got.routes.toFixed(0)} req/s, ratio ${(got.routes / got.none).toFixed(3)}`);
    }
    rows.push(`| ${scenario} | ${median(rate.none).toFixed(0)} | ${median(rate.routes).toFixed(0)} | ${median(ratios).toFixed(2)} (${spread(ratios)}) |`);
  }
  lines.push('| scenario | no routes, req/s | 10 routes, req/s | ratio (median, range) |', '|---|---|---|---|', ...rows, '');

  // (2) Import: 1,000 keys, three times (fresh keys each time), one call each.
  const kv = await plain.mf.getKVNamespace('API_KEYS');
  const count = async () => {
    let n = 0;
    let cursor;
    do {
      const page = await kv.list({ cursor });
      n += page.keys.length;
      cursor = page.list_complete ? undefined : page.cursor;
    } while (cursor);
    return n;
  };
  const times = [];
  let entriesPerKey = 0;
  for (let run = 0; run < 3; run++) {
    const project = `imp-${run}-${crypto.randomBytes(3).toString('hex')}`;
    const keysIn = Array.from({ length: 1000 }, () => ({ key: `sk_live_${crypto.randomBytes(16).toString('hex')}`, project, plan: 'bench' }));
    const before = await count();
    const t0 = performance.now();
    const res = await plain.admin('POST', '/_postguard/v1/keys/import', { keys: keysIn }, { token: ADMIN_TOKEN });
    times.push(performance.now() - t0);
    if (res.status !== 200 || res.json.data.filter((d) => d.status === 'created').length !== 1000) throw new Error(`import: ${res.status} ${res.text.slice(0, 200)}`);
    entriesPerKey = ((await count()) - before) / 1000;
  }
  lines.push(
    '| import of 1,000 keys, one call | median | range | KV entries written per key | object calls per call | KV reads per key |',
    '|---|---|---|---|---|---|',
    `| wall time, ms | ${median(times).toFixed(0)} | ${spread(times, 0)} | ${entriesPerKey} | 10 (chunks of 100) | 1 |`,
    '',
  );

  // (3) A key not imported yet, verified against the origin: 1,000 requests, 16 at once.
  const verifying = await startGateway({
    originUrl: origin.url,
    vars: { POSTGUARD_CONFIG: cfg({ plans: PLANS, auth: { verify_unknown_keys: { path: '/internal/keys/verify' } } }) },
  });
  try {
    const legacy = `sk_live_${crypto.randomBytes(16).toString('hex')}`;
    await fetch(`${origin.url}/__demo/legacy-keys`, { method: 'POST', body: JSON.stringify({ key: legacy, project: 'legacy', plan: 'bench', delay_ms: 50 }) });
    const res = await cannon({ url: `${verifying.url}/bench/items`, headers: { authorization: `Bearer ${legacy}` }, connections: CONNECTIONS, amount: 1000 });
    const calls = origin.stats.verifyCalls[legacy] ?? 0;
    lines.push(
      '| requests with a key verified lazily | 2xx | origin verification calls for the key |',
      '|---|---|---|',
      `| 1,000, 16 at once | ${res['2xx']} | ${calls} |`,
      '',
    );
  } finally {
    await verifying.dispose();
  }
} finally {
  await routed.dispose();
  await plain.dispose();
  await origin.kill();
  await other.kill();
}
writeSection('live-api', `## Live API: routes, import, verification (\`node bench/live-api.mjs ${ROUNDS} ${SECONDS}\`, commit ${commitOf(ROOT)})\n\n${lines.join('\n')}\n`);
