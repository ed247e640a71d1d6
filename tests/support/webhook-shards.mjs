// Reading and seeding the webhook shards (WebhookShard objects, ADR 0035) straight through
// Miniflare's Durable Object API and the D1 directory, as tests and bench/ need it: the
// records a test used to read from D1's webhook tables now live in the project's shards.

/** The directory rows of a project (every project when omitted), oldest first. */
export async function directory(gw, project) {
  const db = await gw.mf.getD1Database('DB');
  const q = project === undefined
    ? db.prepare('SELECT project, start_ms, end_ms FROM webhook_shards ORDER BY start_ms')
    : db.prepare('SELECT project, start_ms, end_ms FROM webhook_shards WHERE project = ? ORDER BY start_ms').bind(project);
  return (await q.all()).results;
}

/** Calls operation `op` of one shard ({project, start_ms}) with a JSON body. */
export async function call(gw, shard, op, body = {}) {
  const ns = await gw.mf.getDurableObjectNamespace('WEBHOOKS');
  const stub = ns.get(ns.idFromName(`wh/${shard.project}/${shard.start_ms}`));
  const res = await stub.fetch(`https://webhook-shard/${op}`, { method: 'POST', body: JSON.stringify(body) });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`webhook shard ${op}: ${res.status} ${text}`);
  return JSON.parse(text);
}

/** Everything one shard holds: {events, deliveries, attempts, usage, bytes}. */
export const dump = (gw, shard) => call(gw, shard, 'dump');

/**
 * Every record of a project, all its shards together: {events, deliveries, attempts,
 * usage, shards}. `deliveries[i].queued_at === null` is an outbox entry still unsent.
 */
export async function projectRecords(gw, project) {
  const out = { events: [], deliveries: [], attempts: [], usage: [], shards: [] };
  for (const s of await directory(gw, project)) {
    const d = await dump(gw, s);
    out.shards.push({ ...s, bytes: d.bytes, events: d.events.length, deliveries: d.deliveries.length });
    out.events.push(...d.events);
    out.deliveries.push(...d.deliveries);
    out.attempts.push(...d.attempts);
    out.usage.push(...d.usage);
  }
  return out;
}

/** The project's delivery rows of one event. */
export async function deliveriesOf(gw, project, eventId) {
  return (await projectRecords(gw, project)).deliveries.filter((d) => d.event_id === eventId);
}

/** The project's usage summed over its shards per UTC day: [{day, events, deliveries, bytes}]. */
export async function usage(gw, project) {
  const byDay = new Map();
  for (const u of (await projectRecords(gw, project)).usage) {
    const t = byDay.get(u.day) ?? { day: u.day, events: 0, deliveries: 0, bytes: 0 };
    t.events += u.events; t.deliveries += u.deliveries; t.bytes += u.bytes;
    byDay.set(u.day, t);
  }
  return [...byDay.values()].sort((a, b) => a.day - b.day);
}

/**
 * Moves records into a shard as the legacy import does (ids and states kept), entering the
 * shard in the directory first: [{event, deliveries, attempts}].
 */
export async function importRecords(gw, shard, batch, bucketMs = 86_400_000) {
  const db = await gw.mf.getD1Database('DB');
  await db.prepare('INSERT OR IGNORE INTO webhook_shards (project, start_ms, end_ms, created_at) VALUES (?, ?, ?, ?)')
    .bind(shard.project, shard.start_ms, shard.start_ms + bucketMs, Date.now()).run();
  return call(gw, shard, 'import', batch);
}

/** Writes rows back as given (the shard's restore of a dump): {deliveries?, usage?: [[day, {events, deliveries, bytes}]]}. */
export const restore = (gw, shard, rows) => call(gw, shard, 'restore', rows);

/** Rewrites every delivery of a project through `change(d)` (a copy); how many were written. */
export async function rewriteDeliveries(gw, project, change) {
  let n = 0;
  for (const s of await directory(gw, project)) {
    const d = await dump(gw, s);
    if (d.deliveries.length) n += await restore(gw, s, { deliveries: d.deliveries.map((x) => change({ ...x })) });
  }
  return n;
}

/**
 * Rewrites a project's day counters in its shards: `change(row)` returns the row to keep
 * (its `day` may differ: the old day's row is then zeroed), or null to zero it.
 */
export async function rewriteUsage(gw, project, change) {
  for (const s of await directory(gw, project)) {
    const d = await dump(gw, s);
    const rows = [];
    for (const u of d.usage) {
      const next = change({ ...u });
      rows.push([u.day, { events: 0, deliveries: 0, bytes: 0 }]);
      if (next) rows.push([next.day, { events: next.events, deliveries: next.deliveries, bytes: next.bytes }]);
    }
    if (rows.length) await restore(gw, s, { usage: rows });
  }
}

/**
 * Tells `project`'s object (ProjectHub, ADR 0046) that D1 changed behind the gateway's back: a
 * test that seeds D1 directly does what every gateway write to what a publish reads does.
 */
export async function invalidateCopy(gw, project) {
  const ns = await gw.mf.getDurableObjectNamespace('PROJECTS');
  const res = await ns.get(ns.idFromName(project)).fetch('https://project-hub/invalidate', { method: 'POST', body: '{}' });
  if (!res.ok) throw new Error(`invalidate ${project}: ${res.status} ${await res.text()}`);
}
