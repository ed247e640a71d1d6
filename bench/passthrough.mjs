import { Miniflare, convertV4MiniflareOptions, Log, LogLevel } from 'miniflare';

// Baselines postguard is measured against, run on the same Miniflare/workerd.
//
// PASS_THROUGH: the ceiling for any proxy on this runtime, a few lines of JS forwarding
// every request to the origin.
//
// REFERENCE: the floor for any gateway that keeps the contract's central per-key state:
// a minimal JS worker making the same Durable Object round trips as postguard, with the
// same kind of SQLite writes, and nothing else (no auth, validation, headers, signing,
// fingerprints, audit or error handling). One object call and a counter write per request;
// under an Idempotency-Key a lookup/claim first and a second call storing the response;
// a replay answered from the object; `/limited/…` answered 429 by the object.
export const PASS_THROUGH = `export default {
  async fetch(req, env) {
    const u = new URL(req.url);
    return fetch(env.ORIGIN_URL + u.pathname + u.search, { method: req.method, headers: req.headers, body: req.body });
  },
};`;

export const REFERENCE = `import { DurableObject } from 'cloudflare:workers';
export class Ref extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    ctx.storage.sql.exec('CREATE TABLE IF NOT EXISTS w (k TEXT PRIMARY KEY, n INTEGER NOT NULL)');
    ctx.storage.sql.exec('CREATE TABLE IF NOT EXISTS r (k TEXT PRIMARY KEY, status INTEGER NOT NULL, body BLOB)');
  }
  async fetch(req) {
    const u = new URL(req.url);
    const k = u.searchParams.get('k');
    const sql = this.ctx.storage.sql;
    if (u.pathname === '/complete') {
      const body = await req.arrayBuffer();
      sql.exec('UPDATE r SET status = ?, body = ? WHERE k = ?', Number(u.searchParams.get('s')), body, k);
      return new Response(null, { status: 204 });
    }
    if (u.searchParams.has('limited')) return new Response('limited', { status: 429 });
    sql.exec('INSERT INTO w (k, n) VALUES (?, 1) ON CONFLICT(k) DO UPDATE SET n = n + 1', 'window');
    if (!k) return new Response(null, { status: 204 });
    const row = sql.exec('SELECT status, body FROM r WHERE k = ?', k).toArray()[0];
    if (row && row.status) return new Response(row.body, { status: row.status, headers: { 'x-replayed': 'true' } });
    if (row) return new Response('in progress', { status: 409 });
    sql.exec('INSERT INTO r (k, status) VALUES (?, 0)', k);
    return new Response(null, { status: 204 });
  }
}
export default {
  async fetch(req, env) {
    const u = new URL(req.url);
    const stub = env.REF.get(env.REF.idFromName('one-key'));
    const k = req.method === 'GET' ? null : req.headers.get('idempotency-key');
    const q = new URLSearchParams();
    if (k) q.set('k', k);
    if (u.pathname.startsWith('/limited/')) q.set('limited', '1');
    const admit = await stub.fetch('https://ref/admit?' + q, { method: 'POST' });
    if (admit.status !== 204) return admit;
    const res = await fetch(env.ORIGIN_URL + u.pathname + u.search, { method: req.method, headers: req.headers, body: req.body });
    if (!k) return res;
    const body = await res.arrayBuffer();
    q.set('s', String(res.status));
    await stub.fetch('https://ref/complete?' + q, { method: 'POST', body });
    return new Response(body, res);
  },
};`;

/**
 * Starts one baseline script (PASS_THROUGH or REFERENCE) in front of `originUrl`.
 * Resolves with `{ url, dispose }`.
 */
export async function startBaseline(script, originUrl) {
  const mf = new Miniflare(convertV4MiniflareOptions({
    host: '127.0.0.1', port: 0, modules: true, script,
    compatibilityDate: '2026-11-01', bindings: { ORIGIN_URL: originUrl }, log: new Log(LogLevel.WARN),
    durableObjects: script === REFERENCE ? { REF: { className: 'Ref', useSQLite: true } } : {},
  }));
  return { url: new URL(await mf.ready).origin, dispose: () => mf.dispose() };
}
