// Counts what each kind of request costs in calls: Durable Object round trips, SQL
// statements the object runs (by kind), alarm reads/writes, KV reads, D1 calls and origin
// fetches. The real build runs under Miniflare inside a thin wrapper module that hands it
// counting proxies of its bindings (tests/support/counting.mjs), so the numbers are those
// of the unmodified product code; nothing is added to the worker.
// Usage: node bench/counters.mjs [requests per kind]
import { startOrigin } from '../tests/support/origin.mjs';
import { ORIGIN_TOKEN } from '../tests/support/gateway.mjs';
import { prepareCountingRoot } from '../tests/support/counting.mjs';
import { benchGateway, writeSection } from './results.mjs';

const N = Number(process.argv[2] ?? 50);

process.env.POSTGUARD_ROOT = prepareCountingRoot();

const origin = await startOrigin();
const { gw, tiny, auth, body } = await benchGateway(origin.url);
try {
  const stamp = Date.now();
  // Each kind: what one request does, averaged over N sequential requests after a warm-up.
  const kinds = {
    'GET (no idempotency)': (i) => gw.fetch('/bench/items', { headers: auth }),
    'fresh POST': (i) => gw.fetch('/bench/pay', { method: 'POST', headers: { ...auth, 'idempotency-key': `c-${stamp}-${i}` }, body }),
    'replayed POST': (i) => gw.fetch('/bench/pay', { method: 'POST', headers: { ...auth, 'idempotency-key': 'bench-replay' }, body }),
    'reused key, other body (422)': (i) => gw.fetch('/bench/pay', { method: 'POST', headers: { ...auth, 'idempotency-key': 'bench-replay' }, body: '{"amount":1}' }),
    'origin 5xx under a key (claim released)': (i) => gw.fetch('/bench/pay', { method: 'POST', headers: { ...auth, 'x-demo-status': '503', 'idempotency-key': `c5-${stamp}-${i}` }, body }),
    '429 rejection': (i) => gw.fetch('/bench/items', { headers: { authorization: `Bearer ${tiny}` } }),
    'unknown key (401)': (i) => gw.fetch('/bench/items', { headers: { authorization: `Bearer pgk_${'A'.repeat(43)}` } }),
  };
  const audit = await gw.admin('GET', '/_postguard/v1/audit?limit=1');
  if (audit.status !== 200) throw new Error(`the wrapped gateway's audit log does not answer: ${audit.status} ${audit.text}`);
  const rows = [];
  const columns = new Set();
  for (const [name, send] of Object.entries(kinds)) {
    await send(-1);
    await new Promise((r) => setTimeout(r, 100)); // let the warm-up's audit write land
    await gw.fetch('/__counters/reset');
    const statuses = new Set();
    for (let i = 0; i < N; i++) {
      const res = await send(i);
      statuses.add(res.status);
      if (res.status === 500 && i === 0) console.log(res.text);
    }
    await new Promise((r) => setTimeout(r, 100)); // audit rows are written after the response
    const c = (await gw.fetch('/__counters')).json;
    for (const k of Object.keys(c)) columns.add(k);
    rows.push({ name, c, statuses: [...statuses] });
    console.log(name, [...statuses], JSON.stringify(Object.fromEntries(Object.entries(c).map(([k, v]) => [k, +(v / N).toFixed(2)]))));
  }
  const order = [...columns].filter((k) => !/^KEY_GUARD\.|^state\.|^storage\.sql$/.test(k)).sort();
  const fmt = (v) => (v ? (v / N).toFixed(2).replace(/\.00$/, '').replace(/(\.\d)0$/, '$1') : '0');
  const table = [
    `| request kind | status | ${order.join(' | ')} |`,
    `|---|---|${order.map(() => '---').join('|')}|`,
    ...rows.map((r) => `| ${r.name} | ${r.statuses.join(', ')} | ${order.map((k) => fmt(r.c[k])).join(' | ')} |`),
  ].join('\n');
  writeSection('counters', `## Calls per request, by kind

\`node bench/counters.mjs ${N}\` — ${new Date().toISOString().slice(0, 10)}; the real build, its bindings wrapped in
counting proxies (bench/counters.mjs), ${N} sequential requests per kind after a warm-up, per-request averages.
"object round trip /op" is a Durable Object call the object served; "SQL X" a statement it
ran; "storage.*" an alarm read or write (absent: none); "fetch" a request to the origin. Not
counted here: the audit row, written after the response in one D1 \`batch\` per group of rows
an isolate coalesced within 20 ms (bench/audit.mjs measures its cost).

${table}
`);
} finally {
  await gw.dispose();
  await origin.kill();
}
