// Webhooks that scale out with their tenants (issue 24, ADR 0035): what the per-project shards
// change on the publish path, side by side with the build before them (BEFORE_ROOT, its own
// wrangler.toml and build) in the same alternating rounds.
//   - isolation: the same 16 concurrent publishers on one project, then spread over 8 projects
//     (2 each); aggregate events/s ÷ one project's (no shared serialisation point: ≥ 1);
//   - stored: one project's events/s with 1,000,000 deliveries already stored for it (seeded
//     straight into its current shard, or into D1's tables for the build before) ÷ a fresh
//     project's (≥ 0.9).
// One subscription per project; every round's deliveries drain before the next round.
// Usage: [BEFORE_ROOT=…] [STORED=1000000] node bench/webhook-shards.mjs [events per round] [rounds]
import http from 'node:http';
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg, ORIGIN_TOKEN, ROOT } from '../tests/support/gateway.mjs';
import { commitOf, median, spread, writeSection } from './results.mjs';

const EVENTS = Number(process.argv[2] ?? 800);
const ROUNDS = Number(process.argv[3] ?? 3);
const STORED = Number(process.env.STORED ?? 1_000_000);
const PUBLISHERS = 16;
const PROJECTS = 8;
const DAY_MS = 86_400_000;
const BEFORE_ROOT = process.env.BEFORE_ROOT;
const CONFIG = {
  webhooks: {
    allow_insecure_urls: true, allow_hosts: ['127.0.0.1'],
    events_per_project_per_day: 100_000_000, deliveries_per_project_per_day: 1_000_000_000, bytes_per_project_per_day: 8_000_000_000,
  },
  plans: { big: { requests_per_window: 10_000_000 } },
};

let seen = 0;
const receiver = http.createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    seen += 1;
    res.writeHead(200).end('ok');
  });
});
await new Promise((r) => receiver.listen(0, '127.0.0.1', r));
const hook = `http://127.0.0.1:${receiver.address().port}/hook`;
const origin = await startOrigin();

const contenders = [];
async function contender(label, root) {
  if (root) process.env.POSTGUARD_ROOT = root;
  const gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  delete process.env.POSTGUARD_ROOT;
  contenders.push({ label, sharded: !root, gw, one: [], many: [], fresh: [], stored: [] });
}
await contender(`after (${commitOf(ROOT)})`);
if (BEFORE_ROOT) await contender(`before (${commitOf(BEFORE_ROOT)})`, BEFORE_ROOT);

async function project(c, name) {
  const { key } = await c.gw.createKey({ project: name, plan: 'big' });
  const sub = await c.gw.admin('POST', '/_postguard/v1/webhooks', { url: hook, events: ['*'] }, { token: key });
  if (sub.status !== 201) throw new Error(`subscription: ${sub.status} ${sub.text}`);
  return name;
}

/** `n` events over `projects` (publishers split evenly), events/s first publish → last 202; then the drain. */
async function round(c, projects, n) {
  const before = seen;
  const per = PUBLISHERS / projects.length;
  let next = 0;
  const t0 = performance.now();
  const publisher = async (p) => {
    while (next < n) {
      next += 1;
      const res = await c.gw.admin('POST', '/_postguard/v1/events', { project: p, type: 'bench.tick', data: { n: next } }, { token: ORIGIN_TOKEN });
      if (res.status !== 202) throw new Error(`publish answered ${res.status}: ${res.text}`);
    }
  };
  await Promise.all(projects.flatMap((p) => Array.from({ length: per }, () => publisher(p))));
  const ms = performance.now() - t0;
  const deadline = Date.now() + 180_000;
  while (seen - before < n) {
    if (Date.now() > deadline) throw new Error(`only ${seen - before} of ${n} deliveries within 180 s`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return n / (ms / 1000);
}

/** `STORED` deliveries (5 per event, delivered) for `name`, written where the build keeps them. */
async function seed(c, name) {
  const t0 = performance.now();
  const now = Date.now();
  const events = STORED / 5;
  if (c.sharded) {
    const start = now - (now % DAY_MS);
    const db = await c.gw.mf.getD1Database('DB');
    await db.prepare('INSERT OR IGNORE INTO webhook_shards (project, start_ms, end_ms, created_at) VALUES (?, ?, ?, ?)').bind(name, start, start + DAY_MS, now).run();
    const ns = await c.gw.mf.getDurableObjectNamespace('WEBHOOKS');
    const stub = ns.get(ns.idFromName(`wh/${name}/${start}`));
    const CHUNK = 1000;
    for (let e0 = 0; e0 < events; e0 += CHUNK) {
      const batch = [];
      for (let e = e0; e < Math.min(events, e0 + CHUNK); e++) {
        const id = `evt_seed_${e}`;
        const t = start + 1 + (e % 3_600_000);
        batch.push({
          event: { id, event_type: 'bench.seed', payload: JSON.stringify({ id, type: 'bench.seed', timestamp: new Date(t).toISOString(), data: { n: e } }), created_at: t, request_id: `req_seed_${e}` },
          deliveries: Array.from({ length: 5 }, (_, s) => ({
            id: `dlv_seed_${e}_${s}`, event_id: id, event_type: 'bench.seed', subscription_id: `sub_seed_${s}`, url: hook,
            status: 'delivered', attempts_made: 1, next_attempt_at: null, created_at: t, updated_at: t, queued_at: t, manual: 0,
          })),
          attempts: [],
        });
      }
      const res = await stub.fetch('https://webhook-shard/import', { method: 'POST', body: JSON.stringify(batch) });
      if (res.status !== 200) throw new Error(`seed: ${res.status} ${await res.text()}`);
    }
  } else {
    const db = await c.gw.mf.getD1Database('DB');
    const series = (sql) => db.prepare(`WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ${events - 1}) ${sql}`);
    await db.batch([
      series("INSERT INTO events (project, id, type, payload, created_at) SELECT ?1, 'evt_seed_' || i, 'bench.seed', '{\"data\":{}}', ?2 - i FROM n").bind(name, now),
      series("INSERT INTO event_requests (project, event_id, request_id) SELECT ?1, 'evt_seed_' || i, 'req_seed_' || i FROM n").bind(name),
      series("INSERT INTO deliveries (id, project, event_id, event_type, subscription_id, url, status, attempts_made, next_attempt_at, created_at, updated_at) SELECT 'dlv_seed_' || i || '_' || s, ?1, 'evt_seed_' || i, 'bench.seed', 'sub_seed_' || s, ?3, 'delivered', 1, NULL, ?2 - i, ?2 - i FROM n, (SELECT 0 AS s UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4)").bind(name, now, hook),
      series("INSERT INTO outbox (delivery_id, project, event_id, created_at, enqueued_at) SELECT 'dlv_seed_' || i || '_' || s, ?1, 'evt_seed_' || i, ?2 - i, ?2 - i FROM n, (SELECT 0 AS s UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4)").bind(name, now),
    ]);
  }
  console.log(`${c.label}: seeded ${STORED} deliveries for ${name} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}

try {
  for (const [i, c] of contenders.entries()) {
    c.single = await project(c, `shards-${i}-one`);
    c.spread = [];
    for (let p = 0; p < PROJECTS; p++) c.spread.push(await project(c, `shards-${i}-p${p}`));
    c.freshProject = await project(c, `shards-${i}-fresh`);
    c.storedProject = await project(c, `shards-${i}-stored`);
    await seed(c, c.storedProject);
    for (const p of [c.single, ...c.spread, c.freshProject, c.storedProject]) await round(c, [p], 16); // warm-up
  }
  for (let r = 0; r < ROUNDS; r++) {
    for (const c of contenders) {
      c.one.push(await round(c, [c.single], EVENTS));
      c.many.push(await round(c, c.spread, EVENTS));
      c.fresh.push(await round(c, [c.freshProject], EVENTS));
      c.stored.push(await round(c, [c.storedProject], EVENTS));
      console.log(`${c.label} round ${r + 1}: one ${c.one.at(-1).toFixed(0)}, ${PROJECTS} projects ${c.many.at(-1).toFixed(0)}, fresh ${c.fresh.at(-1).toFixed(0)}, with ${STORED} stored ${c.stored.at(-1).toFixed(0)} events/s`);
    }
  }
  const ms = (xs) => `${median(xs).toFixed(0)} (${spread(xs, 0)})`;
  const ratio = (xs, ys) => {
    const rs = xs.map((x, i) => x / ys[i]);
    return `${median(rs).toFixed(2)} (${spread(rs)})`;
  };
  const row = (c) => `| ${c.label} | ${ms(c.one)} | ${ms(c.many)} | ${ratio(c.many, c.one)} | ${ms(c.fresh)} | ${ms(c.stored)} | ${ratio(c.stored, c.fresh)} |`;
  const base = contenders.at(-1);
  const vs = contenders.length > 1
    ? `\n${contenders[0].label} ÷ ${base.label}, same rounds: one project ${ratio(contenders[0].one, base.one)}, ${PROJECTS} projects ${ratio(contenders[0].many, base.many)}, with ${STORED.toLocaleString('en')} stored ${ratio(contenders[0].stored, base.stored)}.\n`
    : '';
  writeSection('webhook-shards', `## Webhooks per tenant: isolation and stored volume (issue 24)

\`${BEFORE_ROOT ? 'BEFORE_ROOT=<build before the shards> ' : ''}node bench/webhook-shards.mjs ${EVENTS} ${ROUNDS}\` — ${new Date().toISOString().slice(0, 10)}; ${EVENTS} events per
measurement, ${PUBLISHERS} concurrent publishers, one subscription per project, a local receiver answering 200; each
round's deliveries drain before the next; ${ROUNDS} rounds alternating the builds. "${PROJECTS} projects": the same ${PUBLISHERS}
publishers, ${PUBLISHERS / PROJECTS} per project. "stored": the project already has ${STORED.toLocaleString('en')} delivered deliveries
(its current shard, or D1's tables for the build before), against a fresh project's rate.

| build | one project, events/s | ${PROJECTS} projects at once, events/s | ÷ one project | fresh project, events/s | with ${STORED.toLocaleString('en')} stored | ÷ fresh |
|---|---|---|---|---|---|---|
${contenders.map(row).join('\n')}
${vs}`);
} finally {
  for (const c of contenders) await c.gw.dispose();
  await origin.kill();
  receiver.close();
}
