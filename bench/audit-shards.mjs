// Benchmark: audit reads against a big project and a small one (ADR 0016). One gateway;
// project "big" holds 1,000,000 rows and project "small" 10,000, both spread over the
// last 30 days (one shard per UTC day, as by default). The rows are seeded straight into
// the AuditShard objects through Miniflare's Durable Object API, in big batches, with
// their directory rows — seeding through a million requests would take hours.
// Then `/audit?request_id=` (a random existing row) and `/stats?days=30` are timed as
// each project's key, alternating big and small, and reported as big ÷ small.
// Also: the objects' SQLite size per row as the runtime reports it.
// Usage: node bench/audit-shards.mjs [big rows] [samples]
import crypto from 'node:crypto';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, bearer } from '../tests/support/gateway.mjs';
import { ingest, enter, shardSize, shardStats } from '../tests/support/audit-shards.mjs';
import { median, spread, writeSection, commitOf } from './results.mjs';
import { ROOT } from '../tests/support/gateway.mjs';

const BIG = Number(process.argv[2] ?? 1_000_000);
const SMALL = 10_000;
const SAMPLES = Number(process.argv[3] ?? 40);
const DAY = 86_400_000;
const DAYS = 30;
const BATCH = 4_000; // rows per object call (~1.4 MB of JSON, under SQLite-in-DO's 2 MB value limit)
const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';

/** `req_` + a ULID of time `ms`, as the gateway makes them. */
function requestId(ms) {
  let t = ms;
  let head = '';
  for (let i = 0; i < 10; i++) {
    head = CROCKFORD[t % 32] + head;
    t = Math.floor(t / 32);
  }
  const r = crypto.randomBytes(16);
  let tail = '';
  for (let i = 0; i < 16; i++) tail += CROCKFORD[r[i] % 32];
  return `req_${head}${tail}`;
}

const PATHS = [...Array.from({ length: 500 }, (_, i) => `/v1/orders/${i}`), '/v1/orders', '/v1/customers', '/v1/payments/intents'];
const AGENTS = ['Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36', 'python-requests/2.32.3', 'okhttp/4.12.0'];
const STATUSES = [200, 200, 200, 200, 201, 201, 404, 429, 500];

function row(project, prefix, time) {
  const post = Math.random() < 0.4;
  return {
    request_id: requestId(time),
    time,
    method: post ? 'POST' : 'GET',
    path: PATHS[Math.floor(Math.random() * PATHS.length)],
    status: STATUSES[Math.floor(Math.random() * STATUSES.length)],
    response_bytes: 80 + Math.floor(Math.random() * 4000),
    response_time_ms: Math.floor(Math.exp(3.5 + 0.8 * (Math.random() + Math.random() + Math.random() - 1.5))),
    client_ip: `203.0.${Math.floor(Math.random() * 256)}.${Math.floor(Math.random() * 256)}`,
    user_agent: AGENTS[Math.floor(Math.random() * AGENTS.length)],
    key_prefix: prefix,
    project,
    idempotency_key: post ? crypto.randomBytes(16).toString('hex') : null,
    replayed: false,
    rate_limit_remaining: Math.floor(Math.random() * 2000),
  };
}

/** Seeds `n` rows over the last 30 days (today included, up to now); returns sample ids and shards. */
async function seed(gw, project, prefix, n) {
  const now = Date.now();
  const first = Math.floor(now / DAY) * DAY - (DAYS - 1) * DAY;
  const span = now - 1000 - first;
  const shards = Array.from({ length: DAYS }, (_, d) => ({ project, start_ms: first + d * DAY, end_ms: first + (d + 1) * DAY }));
  await enter(gw, shards);
  const samples = [];
  const perShard = Math.ceil(n / DAYS);
  let stored = 0;
  const t0 = Date.now();
  for (let d = 0; d < DAYS; d++) {
    const s = shards[d];
    const hi = Math.min(s.end_ms, first + span);
    let left = Math.min(perShard, n - d * perShard);
    const calls = [];
    while (left > 0) {
      const k = Math.min(BATCH, left);
      left -= k;
      const rows = Array.from({ length: k }, () => row(project, prefix, s.start_ms + Math.floor(Math.random() * (hi - s.start_ms))));
      samples.push(rows[0].request_id);
      calls.push(rows);
    }
    for (const rows of calls) stored += await ingest(gw, s, rows);
    if (d % 5 === 4) console.error(`# ${project}: ${stored} rows seeded (${((Date.now() - t0) / 1000).toFixed(0)} s)`);
  }
  return { samples, shards, stored };
}

async function time(gw, p, key) {
  const t = performance.now();
  const r = await gw.fetch(p, { headers: bearer(key) });
  const ms = performance.now() - t;
  if (r.status !== 200) throw new Error(`${p}: ${r.status} ${r.text}`);
  return { ms, json: r.json };
}

const origin = await startOrigin();
const gw = await startGateway({
  originUrl: origin.url,
  vars: { POSTGUARD_CONFIG: cfg({ plans: { bench: { requests_per_window: 10_000_000 } }, audit: { enabled: false } }) },
});
try {
  const big = await gw.createKey({ project: 'big', plan: 'bench' });
  const small = await gw.createKey({ project: 'small', plan: 'bench' });
  const seededAt = Date.now();
  const b = await seed(gw, 'big', big.prefix, BIG);
  const s = await seed(gw, 'small', small.prefix, SMALL);
  const seedS = (Date.now() - seededAt) / 1000;
  const bytes = (await Promise.all(b.shards.map((x) => shardSize(gw, x)))).reduce((a, x) => a + x, 0);
  const times = { big: { id: [], stats: [] }, small: { id: [], stats: [] } };
  const sides = [['big', big, b], ['small', small, s]];
  let checked = 0;
  for (let i = 0; i < SAMPLES + 3; i++) {
    for (const [name, key, seeded] of sides) {
      const id = seeded.samples[Math.floor(Math.random() * seeded.samples.length)];
      const one = await time(gw, `/_postguard/v1/audit?request_id=${id}`, key.key);
      if (one.json.data.length !== 1 || one.json.data[0].request_id !== id) throw new Error(`row ${id} not found`);
      const st = await time(gw, '/_postguard/v1/stats?days=30', key.key);
      const total = st.json.days.reduce((a, d) => a + d.requests, 0);
      if (total !== seeded.stored) throw new Error(`${name}: /stats counts ${total}, ${seeded.stored} seeded`);
      checked++;
      if (i >= 3) { // the first rounds warm the objects up
        times[name].id.push(one.ms);
        times[name].stats.push(st.ms);
      }
    }
  }
  // One object's part of /stats (called straight through the DO API): in Miniflare all 30
  // objects share this machine's cores, on Cloudflare they run side by side.
  for (const [name, , seeded] of sides) {
    const shard = seeded.shards[DAYS - 2];
    for (let i = 0; i < SAMPLES / 2 + 3; i++) {
      const t = performance.now();
      await shardStats(gw, shard);
      if (i >= 3) (times[name].one ??= []).push(performance.now() - t);
    }
  }
  const ratio = (k) => times.big[k].map((x, i) => x / times.small[k][i]);
  // /stats reads its 30 shards at once: on this machine they share its cores.
  const line = (label, k) => `| ${label} | ${median(times.big[k]).toFixed(1)} (${spread(times.big[k], 1)}) | ${median(times.small[k]).toFixed(1)} (${spread(times.small[k], 1)}) | ${(median(times.big[k]) / median(times.small[k])).toFixed(2)} (per-pair ${spread(ratio(k))}) |`;
  const section = `## Audit reads: 1 M rows against 10 k rows in one project (AuditShard, ADR 0016)

\`node bench/audit-shards.mjs ${BIG} ${SAMPLES}\` — build ${commitOf(ROOT)}, ${new Date().toISOString().slice(0, 10)}; Miniflare (workerd) on this machine.
Project "big": ${b.stored.toLocaleString('en')} rows, project "small": ${s.stored.toLocaleString('en')} rows, each over the last ${DAYS} days in ${DAYS} one-day shards
(seeded through the objects in batches of ${BATCH.toLocaleString('en')}, ${seedS.toFixed(0)} s). ${SAMPLES} timed samples of each, alternating, after 3 warm-up rounds;
each answer checked (the row found; /stats' day counts sum to the rows seeded).

| request (as the project's key) | big: median ms (spread) | small: median ms (spread) | big ÷ small |
|---|---|---|---|
${line('`/audit?request_id=<random row>`', 'id')}
${line('`/stats?days=30`', 'stats')}
| one shard's roll-up read (a day; the object alone, ${SAMPLES / 2} samples) | ${median(times.big.one).toFixed(1)} (${spread(times.big.one, 1)}) | ${median(times.small.one).toFixed(1)} (${spread(times.small.one, 1)}) | ${(median(times.big.one) / median(times.small.one)).toFixed(2)} |

The big project's objects hold ${(bytes / 1e6).toFixed(0)} MB of SQLite (rows, indexes, roll-ups, as \`databaseSize\` reports it, not VACUUMed): ${(bytes / b.stored).toFixed(0)} bytes per row.
`;
  writeSection('audit-shards', section);
  console.error(`# ${checked} answers checked`);
} finally {
  await gw.dispose();
  await origin.kill();
}
