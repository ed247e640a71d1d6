import { Miniflare, convertV4MiniflareOptions, Log, LogLevel } from 'miniflare';

// The publish floor: the thinnest JS worker doing the I/O that the contract's §7 asks of
// one POST /_postguard/v1/events, on the same Miniflare/workerd. postguard's publishing is
// measured against it in bench/webhooks.mjs, in the same rounds.
//
// Per publish, before its 202 (the event is durable and its first attempts queued):
// - the bearer token compared with the origin token;
// - the JSON body parsed (project, type, data, optional id);
// - ONE D1 batch of reads: is the id known, the project's subscriptions, today's usage;
// - ONE D1 batch of writes, one transaction: the event, one delivery row per subscription,
//   one outbox row per delivery, today's usage counters;
// - ONE `sendBatch` with one job per delivery.
// Its consumer signs each delivery (Standard Webhooks: HMAC-SHA256 of id.timestamp.body)
// and POSTs it, then records the outcome of the batch in one D1 batch.
//
// MODE (startPublishFloor's `mode`) takes I/O away to show which of it bounds the rate:
// 'full' (the above), 'd1' (no sendBatch: nothing is delivered), 'none' (the body parsed and
// answered 202 with no I/O: the runtime's ceiling for a JSON POST).
//
// It omits what postguard does on top: the group commit of concurrent publishes (it makes
// FEWER D1 calls per publish than this floor under concurrency), the outbox's enqueued mark,
// the request's audit row (§6), the quota decision's checks beyond reading the counters, the
// subscription's operational state (pause/disable/throttle), validation errors as problem+json,
// retries, the delivery log's attempt rows, and the event_requests row.
const SCHEMA = [
  'CREATE TABLE IF NOT EXISTS subs (project TEXT, id TEXT, url TEXT, secret TEXT, PRIMARY KEY (project, id))',
  'CREATE TABLE IF NOT EXISTS events (project TEXT, id TEXT, type TEXT, payload TEXT, created_at INTEGER, PRIMARY KEY (project, id))',
  'CREATE TABLE IF NOT EXISTS deliveries (id TEXT PRIMARY KEY, project TEXT, event_id TEXT, sub_id TEXT, url TEXT, status TEXT, attempts INTEGER, updated_at INTEGER)',
  'CREATE TABLE IF NOT EXISTS outbox (delivery_id TEXT PRIMARY KEY, project TEXT, event_id TEXT, created_at INTEGER)',
  'CREATE TABLE IF NOT EXISTS usage (project TEXT, day TEXT, events INTEGER, deliveries INTEGER, bytes INTEGER, PRIMARY KEY (project, day))',
];

const SCRIPT = `
const enc = new TextEncoder();
const b64 = (bytes) => btoa(String.fromCharCode(...new Uint8Array(bytes)));
const keys = new Map();
async function hmacKey(secret) {
  let k = keys.get(secret);
  if (!k) {
    const raw = Uint8Array.from(atob(secret.slice('whsec_'.length)), (c) => c.charCodeAt(0));
    k = await crypto.subtle.importKey('raw', raw, { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
    keys.set(secret, k);
  }
  return k;
}
const problem = (status, code) => new Response(JSON.stringify({ status, code }), { status, headers: { 'content-type': 'application/problem+json' } });
export default {
  async fetch(req, env) {
    if (req.method !== 'POST' || new URL(req.url).pathname !== '/_postguard/v1/events') return problem(404, 'NOT_FOUND');
    if (req.headers.get('authorization') !== 'Bearer ' + env.ORIGIN_TOKEN) return problem(401, 'UNAUTHORIZED');
    let ev;
    try { ev = await req.json(); } catch { return problem(400, 'INVALID_BODY'); }
    const id = ev.id ?? 'evt_' + crypto.randomUUID();
    if (env.MODE === 'none') return new Response(JSON.stringify({ id }), { status: 202, headers: { 'content-type': 'application/json' } });
    const now = Date.now();
    const day = new Date(now).toISOString().slice(0, 10);
    const [known, subs] = await env.DB.batch([
      env.DB.prepare('SELECT 1 FROM events WHERE project = ? AND id = ?').bind(ev.project, id),
      env.DB.prepare('SELECT id, url, secret FROM subs WHERE project = ?').bind(ev.project),
      env.DB.prepare('SELECT events, deliveries, bytes FROM usage WHERE project = ? AND day = ?').bind(ev.project, day),
    ]);
    if (known.results.length) return new Response(JSON.stringify({ id }), { status: 202 });
    const payload = JSON.stringify({ id, type: ev.type, created_at: now, data: ev.data });
    const jobs = subs.results.map((s) => ({ delivery: 'dlv_' + crypto.randomUUID(), sub: s.id, url: s.url, secret: s.secret, event: id, payload }));
    const rows = JSON.stringify(jobs.map((j) => [j.delivery, j.sub, j.url]));
    await env.DB.batch([
      env.DB.prepare('INSERT OR IGNORE INTO events (project, id, type, payload, created_at) VALUES (?, ?, ?, ?, ?)').bind(ev.project, id, ev.type, payload, now),
      env.DB.prepare("INSERT INTO deliveries (id, project, event_id, sub_id, url, status, attempts, updated_at) SELECT json_extract(value, '$[0]'), ?, ?, json_extract(value, '$[1]'), json_extract(value, '$[2]'), 'pending', 0, ? FROM json_each(?)").bind(ev.project, id, now, rows),
      env.DB.prepare("INSERT INTO outbox (delivery_id, project, event_id, created_at) SELECT json_extract(value, '$[0]'), ?, ?, ? FROM json_each(?)").bind(ev.project, id, now, rows),
      env.DB.prepare('INSERT INTO usage (project, day, events, deliveries, bytes) VALUES (?, ?, 1, ?, ?) ON CONFLICT (project, day) DO UPDATE SET events = events + 1, deliveries = deliveries + excluded.deliveries, bytes = bytes + excluded.bytes').bind(ev.project, day, jobs.length, payload.length),
    ]);
    if (jobs.length && env.MODE === 'full') await env.Q.sendBatch(jobs.map((body) => ({ body })));
    return new Response(JSON.stringify({ id }), { status: 202, headers: { 'content-type': 'application/json' } });
  },
  async queue(batch, env) {
    const done = [];
    await Promise.all(batch.messages.map(async (m) => {
      const j = m.body;
      const ts = Math.floor(Date.now() / 1000);
      const sig = await crypto.subtle.sign('HMAC', await hmacKey(j.secret), enc.encode(j.delivery + '.' + ts + '.' + j.payload));
      const res = await fetch(j.url, { method: 'POST', body: j.payload, headers: { 'content-type': 'application/json', 'webhook-id': j.delivery, 'webhook-timestamp': String(ts), 'webhook-signature': 'v1,' + b64(sig) } });
      await res.arrayBuffer();
      done.push([j.delivery, res.ok ? 'succeeded' : 'failed']);
      m.ack();
    }));
    await env.DB.prepare("UPDATE deliveries SET status = json_extract(j.value, '$[1]'), attempts = attempts + 1, updated_at = ? FROM json_each(?) j WHERE deliveries.id = json_extract(j.value, '$[0]')").bind(Date.now(), JSON.stringify(done)).run();
  },
};`;

/**
 * Starts the publish floor (`mode`: 'full', 'd1' or 'none', above) with a consumer batch of `batch` messages. Resolves with an object
 * shaped as much like tests/support/gateway.mjs's as webhooks.mjs needs: `admin(method, path,
 * body, { token })`, `subscribe(project, url)` (resolves with the subscription's secret) and
 * `dispose()`.
 */
export async function startPublishFloor({ token, batch, timeout = 1, mode = 'full' }) {
  const mf = new Miniflare(convertV4MiniflareOptions({
    host: '127.0.0.1', port: 0, modules: true, script: SCRIPT, compatibilityDate: '2026-11-01',
    bindings: { ORIGIN_TOKEN: token, MODE: mode }, log: new Log(LogLevel.WARN), cf: false,
    d1Databases: { DB: 'floor-db' },
    queueProducers: { Q: { queueName: 'floor-q' } },
    queueConsumers: { 'floor-q': { maxBatchSize: batch, maxBatchTimeout: timeout } },
  }));
  const url = new URL(await mf.ready).origin;
  const db = await mf.getD1Database('DB');
  for (const sql of SCHEMA) await db.prepare(sql).run();
  let subs = 0;
  return {
    url,
    async admin(method, p, body, { token: bearer }) {
      const res = await fetch(url + p, { method, body: JSON.stringify(body), headers: { authorization: `Bearer ${bearer}`, 'content-type': 'application/json' } });
      return { status: res.status, text: await res.text() };
    },
    async subscribe(project, hookUrl) {
      const secret = `whsec_${Buffer.from(crypto.getRandomValues(new Uint8Array(24))).toString('base64')}`;
      await db.prepare('INSERT INTO subs (project, id, url, secret) VALUES (?, ?, ?, ?)').bind(project, `sub_${++subs}`, hookUrl, secret).run();
      return secret;
    },
    dispose: () => mf.dispose(),
  };
}
