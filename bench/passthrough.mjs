import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Miniflare, convertV4MiniflareOptions, Log, LogLevel } from 'miniflare';
import { ROOT } from '../tests/support/gateway.mjs';

// Baselines postguard is measured against, run on the same Miniflare/workerd.
//
// PASS_THROUGH: the ceiling for any proxy on this runtime, a few lines of JS forwarding
// every request to the origin.
//
// REFERENCE: the floor for any gateway that keeps the contract's central per-key state:
// a minimal JS worker doing the I/O the contract requires of postguard and nothing else.
// - The API key looked up by SHA-256 in KV, cached per isolate for 30 s (as src/auth.rs).
// - One call per request to the key's SQLite object: a fixed-window charge (kept in
//   memory, written through), and under an Idempotency-Key a lookup/claim keyed by the
//   key and a SHA-256 of the body; a replay answered from the object; a second call
//   storing the response after a fresh POST.
// - The origin request signed (HMAC-SHA256 over its fields and the body's SHA-256, the
//   shape of X-Postguard-Signature), without the client's Authorization.
// - The rate-limit headers and X-Request-Id on every answer.
// - An audit row per request, batched per isolate (20 ms) and written by one call per
//   flush to a SQLite audit object that inserts the rows in one transaction (the shape of
//   postguard's audit write after issue 16).
// What it omits is listed in bench/README.md.
// The object calls go through `fetch` (REFERENCE) or JS RPC (REFERENCE_RPC), the same
// code otherwise.
export const PASS_THROUGH = `export default {
  async fetch(req, env) {
    const u = new URL(req.url);
    return fetch(env.ORIGIN_URL + u.pathname + u.search, { method: req.method, headers: req.headers, body: req.body });
  },
};`;

const referenceScript = (rpc) => `import { DurableObject } from 'cloudflare:workers';
export class Ref extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    this.sql = ctx.storage.sql;
    this.sql.exec('CREATE TABLE IF NOT EXISTS w (k TEXT PRIMARY KEY, start INTEGER NOT NULL, n INTEGER NOT NULL)');
    this.sql.exec('CREATE TABLE IF NOT EXISTS r (k TEXT PRIMARY KEY, fp TEXT NOT NULL, status INTEGER NOT NULL, body BLOB)');
    this.window = this.sql.exec('SELECT start, n FROM w').toArray()[0] ?? { start: 0, n: 0 };
  }
  admit(limit, windowMs, k, fp) {
    const now = Date.now();
    const start = now - (now % windowMs);
    const used = this.window.start === start ? this.window.n : 0;
    const rl = { limit, window: windowMs / 1000, remaining: Math.max(0, limit - used - 1), reset: (start + windowMs) / 1000, resetIn: Math.ceil((start + windowMs - now) / 1000) };
    if (used >= limit) return { status: 429, rl: { ...rl, remaining: 0 } };
    this.window = { start, n: used + 1 };
    this.sql.exec('INSERT INTO w (k, start, n) VALUES (?, ?, ?) ON CONFLICT(k) DO UPDATE SET start = excluded.start, n = excluded.n', 'window', start, used + 1);
    if (!k) return { status: 0, rl };
    const row = this.sql.exec('SELECT fp, status, body FROM r WHERE k = ?', k).toArray()[0];
    if (row && row.fp !== fp) return { status: 422, rl };
    if (row && row.status) return { status: row.status, body: row.body, rl, replayed: true };
    if (row) return { status: 409, rl };
    this.sql.exec('INSERT INTO r (k, fp, status) VALUES (?, ?, 0)', k, fp);
    return { status: 0, rl };
  }
  complete(k, status, body) {
    this.sql.exec('UPDATE r SET status = ?, body = ? WHERE k = ?', status, body, k);
  }
  async fetch(req) {
    const u = new URL(req.url);
    const q = u.searchParams;
    if (u.pathname === '/complete') {
      this.complete(q.get('k'), Number(q.get('s')), await req.arrayBuffer());
      return new Response(null, { status: 204 });
    }
    const a = this.admit(Number(q.get('limit')), Number(q.get('window')), q.get('k'), q.get('fp'));
    return new Response(a.body ?? null, { headers: { 'x-answer': JSON.stringify({ ...a, body: undefined }) } });
  }
}
export class Audit extends DurableObject {
  constructor(ctx, env) {
    super(ctx, env);
    ctx.storage.sql.exec('CREATE TABLE IF NOT EXISTS audit (request_id TEXT PRIMARY KEY, time INTEGER, method TEXT, path TEXT, status INTEGER, response_bytes INTEGER, response_time_ms INTEGER, key_prefix TEXT, project TEXT, idempotency_key TEXT, replayed INTEGER, rate_limit_remaining INTEGER)');
  }
  write(rows) {
    const sql = this.ctx.storage.sql;
    this.ctx.storage.transactionSync(() => {
      for (const r of rows) sql.exec('INSERT OR IGNORE INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)', ...r);
    });
    return rows.length;
  }
  async fetch(req) {
    // GET: the rows written so far (a check that the benchmark's audit rows land).
    if (req.method === 'GET') return new Response(String(this.ctx.storage.sql.exec('SELECT COUNT(*) AS n FROM audit').one().n));
    return new Response(String(this.write(await req.json())));
  }
}
const RPC = ${rpc};
const enc = new TextEncoder();
const hex = (buf) => { let s = ''; for (const b of new Uint8Array(buf)) s += b.toString(16).padStart(2, '0'); return s; };
const sha256 = async (data) => hex(await crypto.subtle.digest('SHA-256', data));
const signingKey = crypto.subtle.importKey('raw', enc.encode('reference-signing-secret-0123456789'), { name: 'HMAC', hash: 'SHA-256' }, false, ['sign']);
/** X-Postguard-Signature's shape: HMAC-SHA256 over the request's fields and its body's SHA-256. */
async function sign(id, req, path, bodyHash, rec, k) {
  const t = Math.floor(Date.now() / 1000);
  const fields = ['v2', t, id, req.method, path, bodyHash, rec.project, rec.prefix, 'bench', k ?? '', req.headers.get('content-type') ?? '', req.headers.get('cf-connecting-ip') ?? ''];
  const mac = await crypto.subtle.sign('HMAC', await signingKey, enc.encode(fields.join('\\n')));
  return 't=' + t + ',v2=' + btoa(String.fromCharCode(...new Uint8Array(mac)));
}
const keys = new Map();
async function lookup(env, token) {
  const hash = await sha256(enc.encode(token));
  const now = Date.now();
  const hit = keys.get(hash);
  if (hit && now - hit.at < 30000) return hit.rec;
  const rec = await env.KEYS.get('h:' + hash, 'json');
  keys.set(hash, { rec, at: now });
  return rec;
}
async function admit(stub, limit, windowMs, k, fp) {
  if (RPC) return stub.admit(limit, windowMs, k, fp);
  const q = new URLSearchParams({ limit: String(limit), window: String(windowMs) });
  if (k) { q.set('k', k); q.set('fp', fp); }
  const res = await stub.fetch('https://ref/admit?' + q, { method: 'POST' });
  const a = JSON.parse(res.headers.get('x-answer'));
  if (a.replayed) a.body = await res.arrayBuffer();
  return a;
}
async function complete(stub, k, status, body) {
  if (RPC) return stub.complete(k, status, body);
  const q = new URLSearchParams({ k, s: String(status) });
  await stub.fetch('https://ref/complete?' + q, { method: 'POST', body });
}
let pending = [];
let flushing = null;
// The request that starts a flush keeps it alive (waitUntil); later rows join it. (A
// promise of one request awaited by another is cancelled when its request ends.)
function audit(env, ctx, row) {
  pending.push(row);
  if (flushing) return;
  flushing = (async () => {
    await new Promise((r) => setTimeout(r, 20));
    const rows = pending;
    pending = [];
    flushing = null;
    const stub = env.AUDIT.get(env.AUDIT.idFromName(rows[0][8] ?? '-'));
    if (RPC) await stub.write(rows);
    else await stub.fetch('https://audit/write', { method: 'POST', body: JSON.stringify(rows) });
  })();
  ctx.waitUntil(flushing);
}
function answer(status, headers, body, rl, id) {
  const h = new Headers(headers);
  h.set('X-RateLimit-Limit', String(rl.limit));
  h.set('X-RateLimit-Remaining', String(rl.remaining));
  h.set('X-RateLimit-Reset', String(rl.reset));
  h.set('RateLimit-Policy', '"default";q=' + rl.limit + ';w=' + rl.window);
  h.set('RateLimit', '"default";r=' + rl.remaining + ';t=' + rl.resetIn);
  h.set('X-Request-Id', id);
  return new Response(body, { status, headers: h });
}
async function handle(req, env, id, facts) {
  const token = (req.headers.get('authorization') ?? '').replace(/^Bearer /, '');
  const rec = token ? await lookup(env, token) : null;
  if (!rec) return new Response('{"code":"INVALID_API_KEY"}', { status: 401, headers: { 'content-type': 'application/problem+json', 'X-Request-Id': id } });
  facts.key = rec;
  const u = new URL(req.url);
  const k = req.method === 'GET' ? null : req.headers.get('idempotency-key');
  const body = req.method === 'GET' ? null : await req.arrayBuffer();
  const fp = await sha256(body ?? new Uint8Array(0));
  const stub = env.REF.get(env.REF.idFromName(rec.id));
  const a = await admit(stub, rec.limit, rec.window_ms, k, fp);
  facts.remaining = a.rl.remaining;
  if (a.replayed) { facts.replayed = true; return answer(a.status, { 'Idempotent-Replayed': 'true' }, a.body, a.rl, id); }
  if (a.status) return answer(a.status, { 'content-type': 'application/problem+json' }, '{"code":"' + a.status + '"}', a.rl, id);
  const headers = new Headers(req.headers);
  headers.delete('authorization');
  headers.set('X-Request-Id', id);
  headers.set('X-Postguard-Signature', await sign(id, req, u.pathname + u.search, fp, rec, k));
  const res = await fetch(env.ORIGIN_URL + u.pathname + u.search, { method: req.method, headers, body, redirect: 'manual' });
  if (!k) return answer(res.status, res.headers, res.body, a.rl, id);
  const out = await res.arrayBuffer();
  await complete(stub, k, res.status, out);
  return answer(res.status, res.headers, out, a.rl, id);
}
export default {
  async fetch(req, env, ctx) {
    const started = Date.now();
    const id = crypto.randomUUID();
    const facts = {};
    const res = await handle(req, env, id, facts);
    const u = new URL(req.url);
    audit(env, ctx, [id, started, req.method, u.pathname, res.status, Number(res.headers.get('content-length')) || null, Date.now() - started,
      facts.key?.prefix ?? null, facts.key?.project ?? null, req.headers.get('idempotency-key'), facts.replayed ? 1 : 0, facts.remaining ?? null]);
    return res;
  },
};`;
export const REFERENCE = referenceScript(false);
export const REFERENCE_RPC = referenceScript(true);

// The Rust contenders (bench/minimal-rust, ADR 0023): the same minimal gateway and the same
// pass-through written in Rust with the plain `worker` crate, built by its build.sh into
// bench/minimal-rust/build/<dir>. Rust ÷ JS is the runtime's price of a Rust gateway.
export const RUST_PASS_THROUGH = { rust: 'pass' };
export const RUST_REFERENCE = { rust: 'gateway' };
/** The Rust reference calling its objects by JS RPC (bench/minimal-rust/rpc-entry.mjs), as REFERENCE_RPC. */
export const RUST_REFERENCE_RPC = { rust: 'gateway-rpc' };
/** Whether the benchmarks run the Rust contenders (REFERENCE_RUST=0 leaves them out). */
export const withRust = () => process.env.REFERENCE_RUST !== '0';
const RUST_DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), 'minimal-rust');
let rustBuilt = false;
/** Builds the Rust contenders when missing or stale (seconds when up to date). */
export function buildRust() {
  if (!rustBuilt) execFileSync('bash', [path.join(RUST_DIR, 'build.sh')], { stdio: ['ignore', 'inherit', 'inherit'] });
  rustBuilt = true;
}
/**
 * The Hono peer (bench/hono-peer, issue 29): Hono + bearerAuth (one uncached KV read), the
 * rate-limiting binding, hono-idempotency 0.9.1 on its Durable Object store. Built into
 * target/hono-peer/ by its build.sh, which needs HONO_IDEMPOTENCY_SRC (a clone of the library's
 * repository) the first time.
 */
export const HONO_PEER = { hono: true };
const HONO_DIR = path.join(ROOT, 'target', 'hono-peer', 'build');
let honoBuilt = false;
export function buildHono() {
  if (!honoBuilt) execFileSync('bash', [path.join(path.dirname(fileURLToPath(import.meta.url)), 'hono-peer', 'build.sh')], { stdio: ['ignore', 'inherit', 'inherit'] });
  honoBuilt = true;
}
function scriptOptions(script) {
  if (typeof script === 'string') return { modules: true, script };
  if (script.hono) {
    buildHono();
    return { modules: [{ type: 'ESModule', path: path.join(HONO_DIR, 'index.js') }], modulesRoot: HONO_DIR };
  }
  buildRust();
  const dir = path.join(RUST_DIR, 'build', script.rust);
  const js = script.rust === 'gateway-rpc' ? ['index.js', 'gateway.js'] : ['index.js'];
  return {
    modules: [...js.map((f) => ({ type: 'ESModule', path: path.join(dir, f) })), { type: 'CompiledWasm', path: path.join(dir, 'index_bg.wasm') }],
    modulesRoot: dir,
  };
}

/**
 * REFERENCE_ASSETS=1: every baseline behind the same static-assets router as postguard
 * (wrangler.toml's [assets], the dashboard). Miniflare runs that router as JS workers on
 * the gateway's own thread before the worker, about 0.9 ms of CPU per request here
 * (ADR 0028); on Cloudflare the asset check runs before the Worker and is not billed.
 */
function referenceAssets() {
  if (process.env.REFERENCE_ASSETS !== '1') return {};
  return { assets: { directory: path.join(ROOT, 'dashboard', 'dist'), routerConfig: { has_user_worker: true }, assetConfig: {} } };
}

/** SHA-256 hex, as the reference stores its keys. */
const sha256hex = async (s) => Buffer.from(await crypto.subtle.digest('SHA-256', new TextEncoder().encode(s))).toString('hex');

/**
 * Starts one baseline (PASS_THROUGH, REFERENCE, REFERENCE_RPC, RUST_PASS_THROUGH, RUST_REFERENCE, RUST_REFERENCE_RPC or HONO_PEER) in front of
 * `originUrl` (with a V8 inspector on `inspectorPort` if given). Resolves with `{ url, dispose }`, and for a reference `key` (a key with
 * no practical limit) and `tiny` (a key whose one request a day is used up, by a request made here unless `useTiny` is false).
 */
export async function startBaseline(script, originUrl, { inspectorPort, useTiny = true } = {}) {
  const ref = script !== PASS_THROUGH && script !== RUST_PASS_THROUGH;
  const objects = script === HONO_PEER
    ? { IDEMPOTENCY: { className: 'IdempotencyObject', useSQLite: true } }
    : { REF: { className: 'Ref', useSQLite: true }, AUDIT: { className: 'Audit', useSQLite: true } };
  const mf = new Miniflare(convertV4MiniflareOptions({
    host: '127.0.0.1', port: 0, ...scriptOptions(script), ...referenceAssets(),
    compatibilityDate: '2026-11-01', bindings: { ORIGIN_URL: originUrl }, log: new Log(LogLevel.WARN), cf: false, inspectorPort,
    kvNamespaces: ref ? { KEYS: 'ref-keys' } : {},
    durableObjects: ref ? objects : {},
    // The Hono peer's rate limits, one binding per plan (the binding's period is 10 or 60 s).
    ratelimits: script === HONO_PEER ? {
      LIMIT_BENCH: { namespace_id: '1001', simple: { limit: 10_000_000, period: 60 } },
      LIMIT_TINY: { namespace_id: '1002', simple: { limit: 1, period: 60 } },
    } : undefined,
  }));
  const url = new URL(await mf.ready).origin;
  const out = { url, dispose: () => mf.dispose() };
  if (!ref) return out;
  const kv = await mf.getKVNamespace('KEYS');
  const seed = async (id, limit, windowMs) => {
    const key = `ref_${id}_${Math.random().toString(36).slice(2)}`;
    const plan = limit === 1 ? 'tiny' : 'bench'; // the Hono peer's limiter is chosen by plan
    await kv.put(`h:${await sha256hex(key)}`, JSON.stringify({ id, prefix: key.slice(0, 12), project: 'bench', plan, limit, window_ms: windowMs }));
    return key;
  };
  out.auditRows = async () => {
    const ns = await mf.getDurableObjectNamespace('AUDIT');
    return Number(await (await ns.get(ns.idFromName('bench')).fetch('https://audit/count')).text());
  };
  // As benchGateway's plans: "bench" (no practical limit), "tiny" (one request a day).
  out.key = await seed('key-bench', 10_000_000, 60_000);
  out.tiny = await seed('key-tiny', 1, 86_400_000);
  // uses the only admission; useTiny: false leaves it (bench/coldstart.mjs: the process's first request is the measured one)
  if (useTiny) await fetch(`${url}/bench/items`, { headers: { authorization: `Bearer ${out.tiny}` } }).then((r) => r.arrayBuffer());
  return out;
}
