// How cost grows. (1) Stored Idempotency-Key records in one key's object: three keys whose
// objects hold 1, 1,000 and 100,000 completed records (written through the gateway itself,
// fresh POSTs), then fresh POSTs and replays against each, alternating, 3 rounds; ratios to
// the 1-record key. (2) Active keys: GETs and fresh POSTs spread round-robin over 100 keys
// against the same load on 1 key, alternating, 3 rounds. The audit log is off here so that
// only the objects' state differs (bench/audit.mjs measures the audit write).
// Usage: node bench/scaling.mjs [rounds] [seconds] [largest record count]
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN } from '../tests/support/gateway.mjs';
import { load, median, spread, writeSection } from './results.mjs';

const ROUNDS = Number(process.argv[2] ?? 3);
const SECONDS = Number(process.argv[3] ?? 4);
const LARGEST = Number(process.argv[4] ?? 100_000);
const SIZES = [1, 1_000, LARGEST];
const KEYS = 100;
const CONNECTIONS = 16;
const body = '{"amount":100}';

const origin = await startOrigin();
const gw = await startGateway({
  originUrl: origin.url,
  vars: { POSTGUARD_CONFIG: cfg({ audit: { enabled: false }, plans: { bench: { requests_per_window: 10_000_000, window_s: 86400 } } }) },
});

const auth = (key) => ({ authorization: `Bearer ${key}`, 'content-type': 'application/json' });
let stampN = 0;
/** autocannon: POSTs with a fresh Idempotency-Key each, or a fixed one; keys round-robin. */
function run({ keys, method = 'POST', fresh = true, idem = 'replay-me', amount, duration = SECONDS }) {
  const stamp = `${Date.now()}-${stampN++}`;
  let n = 0;
  return load({
    url: `${gw.url}/bench/${method === 'GET' ? 'items' : 'pay'}`,
    method,
    body: method === 'GET' ? undefined : body,
    connections: CONNECTIONS,
    ...(amount ? { amount } : { duration }),
    requests: [{
      setupRequest: (req) => {
        const i = n++;
        const headers = { ...req.headers, ...auth(keys[i % keys.length]) };
        if (method !== 'GET') headers['idempotency-key'] = fresh ? `s-${stamp}-${i}` : idem;
        return { ...req, headers };
      },
    }],
  });
}
const ok = (res, expect) => {
  const bad = Object.entries(res.statusCodeStats ?? {}).filter(([code, c]) => c.count && !expect.includes(Number(code)));
  if (bad.length || res.errors || res.timeouts) throw new Error(`unexpected answers: ${JSON.stringify({ bad, errors: res.errors, timeouts: res.timeouts })}`);
  return res;
};

try {
  // (1) records per object. Measuring fresh POSTs adds records, so the smaller sizes get a
  // newly seeded key every round; the largest is seeded once and grows by what the rounds add.
  async function seed(size) {
    const { key } = await gw.createKey({ project: 'bench', plan: 'bench' });
    if (size > 1) ok(await run({ keys: [key], amount: size - 1 }), [201]);
    const first = await gw.fetch('/bench/pay', { method: 'POST', headers: { ...auth(key), 'idempotency-key': 'replay-me' }, body });
    if (first.status !== 201) throw new Error(`seed: ${first.status} ${first.text}`);
    return key;
  }
  const byRecords = {};
  for (const size of SIZES) byRecords[size] = { fresh: [], replay: [], freshP50: [], replayP50: [], added: 0 };
  const t = Date.now();
  byRecords[LARGEST].key = await seed(LARGEST);
  console.log(`key with ${LARGEST} records ready in ${Date.now() - t} ms`);
  await run({ keys: [byRecords[LARGEST].key], duration: 1 }); // warm-up
  for (let r = 0; r < ROUNDS; r++) {
    for (const size of SIZES) {
      const b = byRecords[size];
      if (size !== LARGEST) b.key = await seed(size);
      const f = ok(await run({ keys: [b.key] }), [201]);
      const p = ok(await run({ keys: [b.key], fresh: false }), [201]);
      if (size === LARGEST) b.added += f.requests.total;
      b.fresh.push(f.requests.average);
      b.replay.push(p.requests.average);
      b.freshP50.push(f.latency.p50);
      b.replayP50.push(p.latency.p50);
      console.log(`records ${size}: fresh ${f.requests.average} req/s, replay ${p.requests.average} req/s`);
    }
  }
  // (2) active keys
  const many = [];
  for (let i = 0; i < KEYS; i++) many.push((await gw.createKey({ project: 'bench', plan: 'bench' })).key);
  const one = [many[0]];
  const keys = { 1: { get: [], fresh: [] }, [KEYS]: { get: [], fresh: [] } };
  await run({ keys: many, method: 'GET', duration: 1 }); // warm-up: every key's object started
  await run({ keys: many, duration: 1 });
  for (let r = 0; r < ROUNDS; r++) {
    for (const [count, ks] of [[1, one], [KEYS, many]]) {
      keys[count].get.push(ok(await run({ keys: ks, method: 'GET' }), [200]).requests.average);
      keys[count].fresh.push(ok(await run({ keys: ks }), [201]).requests.average);
    }
    console.log(`keys round ${r + 1}: ${JSON.stringify(keys)}`);
  }

  const ratio = (xs, base) => xs.map((x, i) => x / base[i]);
  const cell = (xs, base) => `${median(xs).toFixed(0)} | ${median(ratio(xs, base)).toFixed(2)} (${spread(ratio(xs, base))})`;
  const base = byRecords[1];
  const recordRows = SIZES.map((size) => {
    const b = byRecords[size];
    return `| ${size.toLocaleString('en')} | ${cell(b.fresh, base.fresh)} | ${cell(b.replay, base.replay)} | ${median(b.freshP50)} / ${median(b.replayP50)} |`;
  }).join('\n');
  const k1 = keys[1];
  const kN = keys[KEYS];
  writeSection('scaling', `## How cost grows

\`node bench/scaling.mjs ${ROUNDS} ${SECONDS} ${LARGEST}\` — ${new Date().toISOString().slice(0, 10)}; ${CONNECTIONS} connections, ${SECONDS} s per run,
${ROUNDS} alternating rounds, audit log off (only the objects' state differs). Ratios to the first row, per round; medians (spread).

Stored Idempotency-Key records in the key's object, written through the gateway before measuring. The smaller
sizes are a newly seeded key each round; the largest is one key that also keeps what the fresh-POST runs add
(${byRecords[LARGEST].added.toLocaleString('en')} records over the rounds).

| records in the object | fresh POST req/s | ÷ 1 record | replay req/s | ÷ 1 record | p50 ms fresh / replay |
|---|---|---|---|---|---|
${recordRows}

Active API keys (requests round-robin over the keys, one object each):

| active keys | GET req/s | ÷ 1 key | fresh POST req/s | ÷ 1 key |
|---|---|---|---|---|
| 1 | ${cell(k1.get, k1.get)} | ${cell(k1.fresh, k1.fresh)} |
| ${KEYS} | ${cell(kN.get, k1.get)} | ${cell(kN.fresh, k1.fresh)} |
`);
} finally {
  await gw.dispose();
  await origin.kill();
}
