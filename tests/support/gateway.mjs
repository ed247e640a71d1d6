// Starts the real built postguard worker under Miniflare, with bindings derived from wrangler.toml.
// Also: burst() (truly simultaneous raw-socket requests), rawRequest(), problem(), poll().
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { Miniflare, convertV4MiniflareOptions, Log, LogLevel } from 'miniflare';
import { parse as parseToml } from 'smol-toml';
import { TEST_SIGNING_SECRET } from './origin.mjs';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const ADMIN_TOKEN = 'test-admin-token-0123456789abcdef';
export const ORIGIN_TOKEN = 'test-origin-token-fedcba9876543210';
/** Signs requests to the origin; tests/support/origin.mjs verifies with the same value. */
export { TEST_SIGNING_SECRET as ORIGIN_SIGNING_SECRET } from './origin.mjs';
export const REQUEST_ID_RE = /^req_([0-9A-HJKMNP-TV-Z]{26}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$/;
export const KEY_ID_RE = /^key_[0-9A-HJKMNP-TV-Z]{26}$/;
export const API_KEY_RE = /^pgk_[A-Za-z0-9_-]{43}$/;

export function loadWranglerToml(file = path.join(process.env.POSTGUARD_ROOT ?? ROOT, 'wrangler.toml')) {
  return parseToml(fs.readFileSync(file, 'utf8'));
}

/**
 * Module list for the build: `main` (as wrangler.toml says) first, then every module it imports,
 * followed through relative import specifiers (.js/.mjs → ESModule, .wasm → CompiledWasm).
 */
function buildModules(toml, root = process.env.POSTGUARD_ROOT ?? ROOT) {
  const main = path.resolve(root, toml.main ?? 'build/index.js');
  const rel = path.relative(root, main);
  if (!fs.existsSync(main)) {
    throw new Error(`postguard build missing: ${rel} does not exist — run \`bash scripts/build.sh\` first`);
  }
  const modules = [];
  const seen = new Set();
  const visit = (file) => {
    if (seen.has(file)) return;
    seen.add(file);
    if (!fs.existsSync(file)) {
      throw new Error(`postguard build incomplete: ${path.relative(root, file)} (imported by the build) is missing — run \`bash scripts/build.sh\``);
    }
    if (file.endsWith('.wasm')) {
      modules.push({ type: 'CompiledWasm', path: file });
      return;
    }
    modules.push({ type: 'ESModule', path: file });
    const src = fs.readFileSync(file, 'utf8');
    const re = /(?:\bfrom|\bimport)\s*\(?\s*["'](\.{1,2}\/[^"'?]+)(?:\?[^"']*)?["']/g;
    for (const m of src.matchAll(re)) visit(path.resolve(path.dirname(file), m[1]));
  };
  visit(main);
  if (!modules.some((m) => m.type === 'CompiledWasm')) {
    throw new Error(`postguard build incomplete: ${rel} imports no .wasm — run \`bash scripts/build.sh\``);
  }
  // modulesRoot: the common ancestor directory of every module, so relative specifiers resolve.
  let modulesRoot = path.dirname(main);
  while (!modules.every((m) => m.path.startsWith(modulesRoot + path.sep))) modulesRoot = path.dirname(modulesRoot);
  return { modules, modulesRoot };
}

/** Miniflare (v4-shaped) options derived from wrangler.toml; nothing hand-copied. */
export function miniflareOptionsFromToml(toml, { vars = {}, secrets = {}, persistDir, modules, modulesRoot } = {}) {
  const bindings = {};
  for (const [k, v] of Object.entries({ ...(toml.vars ?? {}), ...vars, ...secrets })) {
    if (v !== undefined && v !== null) bindings[k] = v;
  }
  const sqlite = new Set();
  const plain = new Set();
  for (const m of toml.migrations ?? []) {
    for (const c of m.new_sqlite_classes ?? []) sqlite.add(c);
    for (const c of m.new_classes ?? []) plain.add(c);
    for (const c of m.deleted_classes ?? []) {
      sqlite.delete(c);
      plain.delete(c);
    }
  }
  const durableObjects = {};
  for (const b of toml.durable_objects?.bindings ?? []) {
    durableObjects[b.name] = { className: b.class_name, useSQLite: sqlite.has(b.class_name) };
    if (b.script_name) durableObjects[b.name].scriptName = b.script_name;
  }
  const kvNamespaces = {};
  for (const kv of toml.kv_namespaces ?? []) kvNamespaces[kv.binding] = kv.id ?? kv.binding;
  const r2Buckets = {};
  for (const b of toml.r2_buckets ?? []) r2Buckets[b.binding] = b.bucket_name ?? b.binding;
  const analyticsEngineDatasets = {};
  for (const a of toml.analytics_engine_datasets ?? []) analyticsEngineDatasets[a.binding] = { dataset: a.dataset ?? a.binding };
  const d1Databases = {};
  for (const db of toml.d1_databases ?? []) d1Databases[db.binding] = db.database_id ?? db.binding;
  // Queues: [[queues.producers]] → queueProducers {BINDING: {queueName, deliveryDelay}};
  // [[queues.consumers]] → queueConsumers {queueName: {maxBatchSize, maxBatchTimeout, maxRetries,
  // deadLetterQueue, retryDelay}} (the v4 names convertV4MiniflareOptions maps to queue triggers).
  const queueProducers = {};
  for (const p of toml.queues?.producers ?? []) {
    queueProducers[p.binding] = { queueName: p.queue };
    if (p.delivery_delay !== undefined) queueProducers[p.binding].deliveryDelay = p.delivery_delay;
  }
  const queueConsumers = {};
  for (const c of toml.queues?.consumers ?? []) {
    if (c.type !== undefined && c.type !== 'worker') continue; // http_pull consumers have no worker
    const o = {};
    if (c.max_batch_size !== undefined) o.maxBatchSize = c.max_batch_size;
    if (c.max_batch_timeout !== undefined) o.maxBatchTimeout = c.max_batch_timeout;
    if (c.max_retries !== undefined) o.maxRetries = c.max_retries;
    if (c.dead_letter_queue !== undefined) o.deadLetterQueue = c.dead_letter_queue;
    if (c.retry_delay !== undefined) o.retryDelay = c.retry_delay;
    queueConsumers[c.queue] = o;
  }
  const opts = {
    name: toml.name,
    host: '127.0.0.1',
    port: 0,
    modules,
    modulesRoot,
    compatibilityDate: toml.compatibility_date,
    compatibilityFlags: toml.compatibility_flags ?? [],
    bindings,
    durableObjects,
    kvNamespaces,
    cf: false,
  };
  if (Object.keys(d1Databases).length) opts.d1Databases = d1Databases;
  if (Object.keys(analyticsEngineDatasets).length) opts.analyticsEngineDatasets = analyticsEngineDatasets;
  if (Object.keys(r2Buckets).length) opts.r2Buckets = r2Buckets;
  if (Object.keys(queueProducers).length) opts.queueProducers = queueProducers;
  if (Object.keys(queueConsumers).length) opts.queueConsumers = queueConsumers;
  if (persistDir) opts.resourcePersistencePath = persistDir;
  // [assets] → Miniflare serves the same files before the worker, and reads their
  // `_headers` file itself, as Cloudflare does.
  if (toml.assets?.directory) {
    const root = process.env.POSTGUARD_ROOT ?? ROOT;
    opts.assets = {
      directory: path.resolve(root, toml.assets.directory),
      routerConfig: { has_user_worker: true },
      assetConfig: {},
    };
    if (toml.assets.binding) opts.assets.binding = toml.assets.binding;
    if (toml.assets.run_worker_first !== undefined) opts.assets.run_worker_first = toml.assets.run_worker_first;
    for (const k of ['html_handling', 'not_found_handling']) {
      if (toml.assets[k] !== undefined) opts.assets.assetConfig[k] = toml.assets[k];
    }
  }
  return opts;
}

/**
 * Where the e2e suite keeps what the workers logged and the secrets the gateway handed out
 * (per test process), for scripts/scan-logs.mjs: after the suite it checks that no log line
 * holds any of them (docs/security.md: logs never hold a secret).
 */
export const E2E_LOG_DIR = path.join(ROOT, 'target', 'e2e-logs');
const SECRET_PATTERNS = [
  /pgk_[A-Za-z0-9_-]{43}/g, // API keys
  /pg[ls]_[A-Za-z0-9_.-]{20,}/g, // portal links and sessions
  /whsec_[A-Za-z0-9+/=]{16,}/g, // subscription secrets
  /\/_postguard\/inspect\/[A-Za-z0-9_-]{16,}/g, // capture URLs (their token)
];
const seenSecrets = new Set();
function recordSecrets(text) {
  const found = [];
  for (const re of SECRET_PATTERNS) {
    for (const m of text.matchAll(re)) {
      if (!seenSecrets.has(m[0])) {
        seenSecrets.add(m[0]);
        found.push(m[0]);
      }
    }
  }
  if (found.length) {
    fs.mkdirSync(E2E_LOG_DIR, { recursive: true });
    fs.appendFileSync(path.join(E2E_LOG_DIR, `secrets-${process.pid}.txt`), found.map((s) => `${s}\n`).join(''));
  }
}

async function normalise(res) {
  const body = Buffer.from(await res.arrayBuffer());
  if (body.length < 1 << 20) recordSecrets(body.toString('utf8'));
  const headers = {};
  res.headers.forEach((v, k) => {
    headers[k] = v;
  });
  return wrapResponse(res.status, headers, body);
}

function wrapResponse(status, headers, body, extra = {}) {
  const text = body.toString('utf8');
  let json;
  try {
    json = text.length ? JSON.parse(text) : undefined;
  } catch {
    json = undefined;
  }
  return { status, headers, body, text, json, ...extra };
}

/**
 * Applies every D1 database's migrations (`migrations_dir` in wrangler.toml), in file
 * order, the way `wrangler d1 migrations apply --local` does. Migration files are
 * idempotent (IF NOT EXISTS), so a restart on persisted state can apply them again.
 */
export async function applyD1Migrations(mf, toml, root = process.env.POSTGUARD_ROOT ?? ROOT) {
  for (const dbConf of toml.d1_databases ?? []) {
    const dir = path.resolve(root, dbConf.migrations_dir ?? 'migrations');
    if (!fs.existsSync(dir)) continue;
    const db = await mf.getD1Database(dbConf.binding);
    for (const file of fs.readdirSync(dir).filter((f) => f.endsWith('.sql')).sort()) {
      const sql = fs.readFileSync(path.join(dir, file), 'utf8').replace(/^\s*--.*$/gm, '');
      const statements = sql.split(/;\s*(?:\n|$)/).map((x) => x.trim()).filter(Boolean);
      await db.batch(statements.map((x) => db.prepare(x)));
    }
  }
}

/** A TCP port free on 127.0.0.1 right now (the gateway's, known before it starts). */
export async function freePort() {
  const srv = net.createServer();
  await new Promise((resolve, reject) => srv.listen(0, '127.0.0.1', resolve).on('error', reject));
  const { port } = srv.address();
  await new Promise((resolve) => srv.close(resolve));
  return port;
}

/**
 * What a test deployment is configured with unless the test says otherwise: `public_url`
 * is the gateway's own address (as an operator sets it to the deployment's URL), the
 * limit on requests without a valid credential is out of the way of tests that are about
 * something else (tests/security-round3.test.mjs sets its own), and with POSTGUARD_TEST_EDGES=1
 * `limits.edge.enabled` is on. A POSTGUARD_CONFIG that is
 * not a JSON object (a config test's bad value) is left exactly as given. A build from
 * before those settings (a benchmark's BEFORE_ROOT) would refuse them as unknown: they are
 * added only for builds whose core knows them.
 */
function knowsSetting(name, root = process.env.POSTGUARD_ROOT ?? ROOT) {
  const src = path.join(root, 'crates/postguard-core/src');
  try {
    // config.rs until issue 33 split it into config/ (its webhooks section in webhooks/config.rs).
    const files = fs.existsSync(path.join(src, 'config.rs'))
      ? ['config.rs']
      : [...fs.readdirSync(path.join(src, 'config')).map((f) => `config/${f}`), 'webhooks/config.rs'];
    return files.some((f) => fs.readFileSync(path.join(src, f), 'utf8').includes(name));
  } catch {
    return true;
  }
}

function withHarnessDefaults(config, publicUrl) {
  let parsed;
  try {
    parsed = JSON.parse(config ?? '{}');
  } catch {
    return config;
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) return config;
  if (knowsSetting('public_url')) parsed.public_url ??= publicUrl;
  if (knowsSetting('unauthenticated_per_minute')) parsed.limits ??= { unauthenticated_per_minute: 1000000 };
  // POSTGUARD_TEST_EDGES=1: every deployment of the run admits at the edge (limits.edge, ADR
  // 0040), so a test file runs both ways unchanged; what a test set in limits.edge is kept.
  if (process.env.POSTGUARD_TEST_EDGES === '1' && knowsSetting('EdgeLimits')) {
    parsed.limits = { ...(parsed.limits ?? {}) };
    parsed.limits.edge = { enabled: true, ...(parsed.limits.edge ?? {}) };
  }
  return JSON.stringify(parsed);
}

/** Whether starting failed only because the chosen port was taken meanwhile. */
function isAddressInUse(e) {
  const text = `${e?.code ?? ''} ${e?.message ?? ''} ${e?.cause?.code ?? ''}`;
  return /ADDRESS_IN_USE|EADDRINUSE|address already in use/i.test(text);
}

export async function startGateway({
  vars = {},
  secrets = { ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET: TEST_SIGNING_SECRET },
  originUrl,
  persistDir,
  migrate = true,
  verbose = !!process.env.POSTGUARD_TEST_VERBOSE,
  inspectorPort,
  patchOptions,
  harnessDefaults = true,
} = {}) {
  const toml = loadWranglerToml();
  const { modules, modulesRoot } = buildModules(toml);
  const v = { ...vars };
  if (originUrl !== undefined) v.ORIGIN_URL = originUrl;
  // The port is chosen before Miniflare binds it (public_url must name it), so another
  // process on this shared machine can take it in between: then start again on another.
  let mf;
  let readyUrl;
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const vp = { ...v };
    if (harnessDefaults) {
      vp.POSTGUARD_CONFIG = withHarnessDefaults(vp.POSTGUARD_CONFIG ?? toml.vars?.POSTGUARD_CONFIG, `http://127.0.0.1:${port}`);
    }
    const v4 = miniflareOptionsFromToml(toml, { vars: vp, secrets, persistDir, modules, modulesRoot });
    v4.port = port;
    v4.log = new Log(verbose ? LogLevel.DEBUG : LogLevel.WARN);
    // The worker's console goes to a file scripts/scan-logs.mjs reads (and to the
    // terminal with POSTGUARD_TEST_VERBOSE).
    fs.mkdirSync(E2E_LOG_DIR, { recursive: true });
    const logFile = path.join(E2E_LOG_DIR, `worker-${process.pid}.ndjson`);
    v4.handleStructuredLogs = ({ level, message }) => {
      fs.appendFileSync(logFile, `${JSON.stringify({ level, message })}\n`);
      if (verbose) console.log(`[worker ${level}] ${message}`);
    };
    if (inspectorPort !== undefined) v4.inspectorPort = inspectorPort; // bench/profile.mjs
    patchOptions?.(v4); // benchmarks vary one setting, e.g. the queue consumer's batch size
    mf = new Miniflare(convertV4MiniflareOptions(v4));
    try {
      readyUrl = await mf.ready;
      break;
    } catch (e) {
      await mf.dispose().catch(() => {});
      if (attempt >= 5 || !isAddressInUse(e)) throw e;
    }
  }
  if (migrate) await applyD1Migrations(mf, toml);
  const url = new URL(readyUrl).origin;

  async function gwFetch(p, init = {}) {
    const sentAt = Date.now();
    const res = await fetch(new URL(p, url), { redirect: 'manual', ...init });
    const out = await normalise(res);
    out.sentAt = sentAt;
    out.at = Date.now();
    return out;
  }

  async function admin(method, p, body, { token = ADMIN_TOKEN, headers = {} } = {}) {
    const h = { ...headers };
    if (token !== null) h.authorization = `Bearer ${token}`;
    let payload;
    if (body !== undefined) {
      payload = typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body);
      h['content-type'] ??= 'application/json';
    }
    return gwFetch(p, { method, headers: h, body: payload });
  }

  async function createKey({ project = 'acme', plan, name } = {}) {
    const body = { project, plan };
    if (name !== undefined) body.name = name;
    const res = await admin('POST', '/_postguard/v1/keys', body);
    assert.equal(res.status, 201, `createKey(${JSON.stringify(body)}) → ${res.status} ${res.text}`);
    return res.json;
  }

  let disposed = false;
  return {
    url,
    mf,
    fetch: gwFetch,
    admin,
    createKey,
    async dispose() {
      if (disposed) return;
      disposed = true;
      await mf.dispose();
    },
  };
}

/** A problem+json error: assert the shape and return the parsed body. */
export function problem(res, { status, code } = {}) {
  const ct = res.headers['content-type'] ?? '';
  assert.ok(ct.startsWith('application/problem+json'), `expected application/problem+json, got ${res.status} "${ct}": ${res.text?.slice(0, 300)}`);
  const p = JSON.parse(res.text);
  for (const f of ['type', 'title', 'status', 'detail', 'code', 'request_id']) {
    assert.ok(f in p, `problem body lacks "${f}": ${res.text}`);
  }
  assert.equal(p.status, res.status, 'problem.status equals the HTTP status');
  assert.match(p.request_id, REQUEST_ID_RE);
  if (res.headers['x-request-id']) assert.equal(p.request_id, res.headers['x-request-id'], 'problem.request_id equals X-Request-Id');
  if (status !== undefined) assert.equal(res.status, status, `status (code ${p.code}, detail ${p.detail})`);
  if (code !== undefined) assert.equal(p.code, code, `code (status ${res.status}, detail ${p.detail})`);
  return p;
}

/** Poll `fn` until it returns a truthy value; fail after `timeout` ms. */
export async function poll(fn, { timeout = 10000, interval = 50, message = 'condition' } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    last = await fn();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${message}`);
    await new Promise((r) => setTimeout(r, interval));
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------------------------
// Raw HTTP/1.1 over net sockets.

/**
 * Serialise one request. `headers` is an object or an array of [name, value] pairs (duplicates allowed);
 * values may be strings (sent as UTF-8) or Buffers (sent as-is). Adds Host, Connection: close and
 * Content-Length (unless the caller gave Content-Length or Transfer-Encoding, or `raw: true`).
 */
export function serialiseRequest(base, { method = 'GET', path: p = '/', headers = {}, body, raw = false } = {}) {
  const u = new URL(base);
  const list = Array.isArray(headers) ? [...headers] : Object.entries(headers);
  const bodyBuf = body === undefined ? Buffer.alloc(0) : Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
  const has = (n) => list.some(([k]) => k.toLowerCase() === n);
  if (!raw) {
    if (!has('host')) list.unshift(['Host', u.host]);
    if (!has('connection')) list.push(['Connection', 'close']);
    if (!has('content-length') && !has('transfer-encoding') && (bodyBuf.length > 0 || !['GET', 'HEAD'].includes(method))) {
      list.push(['Content-Length', String(bodyBuf.length)]);
    }
  }
  const parts = [Buffer.from(`${method} ${p} HTTP/1.1\r\n`, 'latin1')];
  for (const [k, val] of list) {
    parts.push(Buffer.from(`${k}: `, 'latin1'), Buffer.isBuffer(val) ? val : Buffer.from(String(val), 'utf8'), Buffer.from('\r\n'));
  }
  parts.push(Buffer.from('\r\n'), bodyBuf);
  return Buffer.concat(parts);
}

function decodeChunked(buf) {
  const out = [];
  let i = 0;
  for (;;) {
    const eol = buf.indexOf('\r\n', i);
    if (eol < 0) throw new Error('truncated chunked body');
    const size = parseInt(buf.subarray(i, eol).toString('latin1').split(';')[0].trim(), 16);
    if (Number.isNaN(size)) throw new Error('bad chunk size');
    i = eol + 2;
    if (size === 0) break;
    if (i + size + 2 > buf.length) throw new Error('truncated chunk');
    out.push(buf.subarray(i, i + size));
    i += size + 2;
  }
  return Buffer.concat(out);
}

/** Whether `buf` holds a whole response (so we need not wait for the server to close). */
function responseComplete(buf, isHead) {
  const headEnd = buf.indexOf('\r\n\r\n');
  if (headEnd < 0) return false;
  if (isHead) return true;
  const head = buf.subarray(0, headEnd).toString('latin1').toLowerCase();
  const status = Number(head.slice(9, 12));
  if (status === 204 || status === 304 || (status >= 100 && status < 200)) return true;
  const body = buf.subarray(headEnd + 4);
  if (/\r\ntransfer-encoding:[^\r]*chunked/.test(head)) {
    try {
      decodeChunked(body);
      return true;
    } catch {
      return false;
    }
  }
  const cl = /\r\ncontent-length:\s*(\d+)/.exec(head);
  if (cl) return body.length >= Number(cl[1]);
  return false; // read until close
}

/** Parse a complete HTTP/1.1 response. */
export function parseResponse(buf, { head = false } = {}) {
  const headEnd = buf.indexOf('\r\n\r\n');
  if (headEnd < 0) throw new Error(`incomplete response head: ${JSON.stringify(buf.subarray(0, 200).toString('latin1'))}`);
  const lines = buf.subarray(0, headEnd).toString('latin1').split('\r\n');
  const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0]);
  if (!m) throw new Error(`bad status line: ${lines[0]}`);
  const headers = {};
  const rawHeaders = [];
  for (const line of lines.slice(1)) {
    const i = line.indexOf(':');
    const k = line.slice(0, i).trim().toLowerCase();
    const val = line.slice(i + 1).trim();
    rawHeaders.push([k, val]);
    headers[k] = k in headers ? `${headers[k]}, ${val}` : val;
  }
  let body = buf.subarray(headEnd + 4);
  if (head) body = Buffer.alloc(0);
  else if ((headers['transfer-encoding'] ?? '').toLowerCase().includes('chunked')) body = decodeChunked(body);
  else if (headers['content-length'] !== undefined) body = body.subarray(0, Number(headers['content-length']));
  return wrapResponse(Number(m[1]), headers, Buffer.from(body), { rawHeaders });
}

/**
 * Send `requests` truly at once: one socket each, every request written except its last byte, and,
 * once all sockets have flushed, every last byte written in the same tick. Returns parsed responses
 * in request order (each with `.at` = ms when its response completed).
 */
export async function burst(base, requests, { timeout = 30000 } = {}) {
  const u = new URL(base);
  const port = Number(u.port || 80);
  const host = u.hostname;
  const bufs = requests.map((r) => (Buffer.isBuffer(r) ? r : serialiseRequest(base, r)));
  const sockets = [];
  let timer;
  const timeoutP = new Promise((_, reject) => {
    timer = setTimeout(() => {
      for (const s of sockets) s.destroy();
      reject(new Error(`burst timed out after ${timeout} ms`));
    }, timeout);
  });
  try {
    const conns = bufs.map(
      (buf) =>
        new Promise((resolveWritten, rejectWritten) => {
          const s = net.connect({ host, port });
          s.setNoDelay(true);
          sockets.push(s);
          const chunks = [];
          const isHead = buf.subarray(0, 5).toString('latin1') === 'HEAD ';
          const done = new Promise((resolve, reject) => {
            let settled = false;
            const finish = () => {
              if (settled) return;
              settled = true;
              try {
                resolve(Object.assign(parseResponse(Buffer.concat(chunks), { head: isHead }), { at: Date.now() }));
              } catch (e) {
                reject(e);
              }
              s.destroy();
            };
            s.on('data', (c) => {
              chunks.push(c);
              if (responseComplete(Buffer.concat(chunks), isHead)) finish();
            });
            s.on('end', finish);
            s.on('error', (e) => {
              if (!settled) {
                settled = true;
                reject(e);
              }
            });
          });
          done.catch(() => {});
          s.once('error', rejectWritten);
          s.once('connect', () => {
            s.write(buf.subarray(0, buf.length - 1), (err) => (err ? rejectWritten(err) : resolveWritten({ s, done, last: buf.subarray(buf.length - 1) })));
          });
        }),
    );
    const ready = await Promise.race([Promise.all(conns), timeoutP]);
    const sentAt = Date.now();
    for (const { s, last } of ready) s.write(last);
    const out = await Promise.race([Promise.all(ready.map((r) => r.done)), timeoutP]);
    for (const r of out) r.sentAt = sentAt;
    return out;
  } finally {
    clearTimeout(timer);
    for (const s of sockets) s.destroy();
  }
}

/** One raw request (for bytes fetch() refuses to send: tabs, DEL, UTF-8, duplicate header lines…). */
export async function rawRequest(base, request, opts) {
  const [res] = await burst(base, [request], opts);
  return res;
}

export function rateHeaders(res) {
  const h = res.headers;
  const rl = /^"default";r=(\d+);t=(\d+)$/.exec(h.ratelimit ?? '');
  const pol = /^"default";q=(\d+);w=(\d+)$/.exec(h['ratelimit-policy'] ?? '');
  return {
    limit: h['x-ratelimit-limit'] === undefined ? undefined : Number(h['x-ratelimit-limit']),
    remaining: h['x-ratelimit-remaining'] === undefined ? undefined : Number(h['x-ratelimit-remaining']),
    reset: h['x-ratelimit-reset'] === undefined ? undefined : Number(h['x-ratelimit-reset']),
    r: rl ? Number(rl[1]) : undefined,
    t: rl ? Number(rl[2]) : undefined,
    q: pol ? Number(pol[1]) : undefined,
    w: pol ? Number(pol[2]) : undefined,
    retryAfter: h['retry-after'] === undefined ? undefined : Number(h['retry-after']),
  };
}

/**
 * Assert the full §2 rate-limit header set and its internal consistency; returns the parsed values.
 * X-RateLimit-Reset must equal now + t for some "now" between sending the request and receiving the
 * answer (±1 s for rounding).
 */
export function assertRateHeaders(res, { limit, window } = {}) {
  const r = rateHeaders(res);
  const where = `${res.status} ${JSON.stringify(res.headers)}`;
  for (const k of ['limit', 'remaining', 'reset', 'r', 't', 'q', 'w']) {
    assert.ok(Number.isInteger(r[k]), `rate-limit header ${k} missing or malformed on ${where}`);
  }
  assert.equal(r.remaining, r.r, 'X-RateLimit-Remaining equals RateLimit r');
  assert.equal(r.limit, r.q, 'X-RateLimit-Limit equals RateLimit-Policy q');
  assert.ok(r.remaining >= 0 && r.remaining <= r.limit, `0 <= remaining <= limit on ${where}`);
  assert.ok(r.t >= 0 && r.t <= r.w, `0 <= t <= window on ${where}`);
  const fromS = Math.floor((res.sentAt ?? Date.now()) / 1000);
  const toS = Math.floor((res.at ?? Date.now()) / 1000);
  const nowS = r.reset - r.t;
  assert.ok(nowS >= fromS - 1 && nowS <= toS + 1, `X-RateLimit-Reset (${r.reset}) - t (${r.t}) = ${nowS} must be "now" (${fromS}..${toS}) ±1`);
  if (limit !== undefined) assert.equal(r.limit, limit, 'X-RateLimit-Limit');
  if (window !== undefined) assert.equal(r.w, window, 'RateLimit-Policy w');
  return r;
}

export function bearer(key) {
  return { authorization: `Bearer ${key}` };
}

export const cfg = (obj) => JSON.stringify(obj);
