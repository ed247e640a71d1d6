// Reading and seeding the audit shards (AuditShard objects, ADR 0016) straight through
// Miniflare's Durable Object API and the D1 directory, as tests and bench/ need it.

/** The directory rows of a project (every project when omitted), newest first. */
export async function directory(gw, project) {
  const db = await gw.mf.getD1Database('DB');
  const q = project === undefined
    ? db.prepare('SELECT project, start_ms, end_ms FROM audit_shards ORDER BY start_ms DESC')
    : db.prepare('SELECT project, start_ms, end_ms FROM audit_shards WHERE project = ? ORDER BY start_ms DESC').bind(project);
  return (await q.all()).results;
}

async function call(gw, shard, op, body) {
  const ns = await gw.mf.getDurableObjectNamespace('AUDIT');
  const stub = ns.get(ns.idFromName(`${shard.project}/${shard.start_ms}`));
  const res = await stub.fetch(`https://audit-shard/${op}`, { method: 'POST', body: JSON.stringify(body) });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`audit shard ${op}: ${res.status} ${text}`);
  return JSON.parse(text);
}

/** Every row stored in one shard, newest first. */
export const shardRows = (gw, shard) => call(gw, shard, 'query', { q: { limit: 50 }, take: 1e9 });

/** The roll-ups of one shard (every hour, every key). */
export const shardStats = (gw, shard) => call(gw, shard, 'stats', { since_ms: 0, key_prefix: null });

/** Stores rows in a shard (and its roll-ups); returns how many were new. */
export const ingest = async (gw, shard, rows) => (await call(gw, shard, 'ingest', rows)).inserted;

/** The object's SQLite database size (bytes). */
export const shardSize = async (gw, shard) => (await call(gw, shard, 'size', {})).bytes;

/** Enters shards in the D1 directory, as the writer does. */
export async function enter(gw, shards) {
  const db = await gw.mf.getD1Database('DB');
  const stmts = shards.map((s) => db.prepare('INSERT OR IGNORE INTO audit_shards (project, start_ms, end_ms, created_at) VALUES (?, ?, ?, ?)').bind(s.project, s.start_ms, s.end_ms, Date.now()));
  for (let i = 0; i < stmts.length; i += 50) await db.batch(stmts.slice(i, i + 50));
}

/** Every stored row of a project (all its shards). */
export async function projectRows(gw, project) {
  const out = [];
  for (const s of await directory(gw, project)) out.push(...(await shardRows(gw, s)));
  return out;
}
