// A real local demo origin for postguard (plain node:http).
//
// Module:  const o = await startOrigin({ port: 0, secret });  o.url, o.stats, await o.close()
// CLI:     node tests/support/origin.mjs --port 8788   (secret from ORIGIN_SIGNING_SECRET, default the tests' one)
//
// Every request (except the /__demo/ control API) is an "execution": it is counted in total and
// per Idempotency-Key header value, its X-Postguard-Signature is verified, and it is recorded.
// The reply is JSON {execution, method, path, query, headers, body_sha256, signature_ok, at},
// 201 for POST and 200 otherwise, with X-Origin-Execution, Set-Cookie and Location headers.
//
// Test controls (request headers, forwarded by postguard):
//   x-demo-delay-ms: N     wait N ms before answering
//   x-demo-status: N       answer with status N
//   x-demo-body-bytes: N   answer with a text/plain body of N bytes ('a' repeated)
//   x-demo-chunked-json-bytes: N   answer with a JSON object of N bytes, chunked (no Content-Length)
//   x-demo-hang: 1         never answer
// Control API:
//   POST /__demo/script {key, statuses: [500, 200]}  successive executions for that key answer these
//   GET  /__demo/stats    {total, byKey, requests: [last 500 records]}
//   POST /__demo/reset
//   POST /__demo/legacy-keys {key, project, plan, name?, status?, delay_ms?, hang?}
//        a key this API issued before postguard: POST /internal/keys/verify {"key"} answers
//        200 {project, plan, name} for it (or `status`, after `delay_ms`, or never with
//        `hang`), 404 for any other; each call is an execution, counted in verifyCalls[key].
import http from 'node:http';
import crypto from 'node:crypto';
import { pathToFileURL } from 'node:url';

/** The signing secret of the tests (tests/support/gateway.mjs sets it as ORIGIN_SIGNING_SECRET). */
export const TEST_SIGNING_SECRET = 'test-origin-signing-secret-5f3c9a1e7b2d4c60';
const MAX_RECORDS = 500;
/** How old a signature's `t` may be (s): older ones are refused as replays. */
export const MAX_SIGNATURE_AGE_S = 300;

/**
 * The string postguard signs: `v2` and each field on its own line (ADR 0015, docs/security.md).
 * `identity` holds the forwarded header values (absent ones sign as '').
 */
export function canonicalString({ t, requestId, method, target, bodySha256, identity = {}, version = 'v2' }) {
  const lines = [
    version,
    t,
    requestId ?? '',
    method,
    target,
    bodySha256,
    identity.project ?? '',
    identity.keyPrefix ?? '',
    identity.plan ?? '',
    identity.idempotencyKey ?? '',
    identity.contentType ?? '',
    identity.clientIp ?? '',
  ];
  // v3 also covers the key's metadata (X-Postguard-Key-Meta).
  if (version === 'v3') lines.push(identity.keyMeta ?? '');
  return lines.join('\n');
}

/** The identity fields of a forwarded request, from its (lower-cased) headers. */
export function identityOf(headers) {
  return {
    project: headers['x-postguard-project'],
    keyPrefix: headers['x-postguard-key-prefix'],
    plan: headers['x-postguard-plan'],
    idempotencyKey: headers['idempotency-key'],
    contentType: headers['content-type'],
    clientIp: headers['x-postguard-client-ip'],
    keyMeta: headers['x-postguard-key-meta'],
  };
}

/**
 * Verify `t=<unix s>,v2=<base64 HMAC-SHA256(ORIGIN_SIGNING_SECRET, canonicalString)>[,v3=…]`: the
 * secret, a fresh `t` (within MAX_SIGNATURE_AGE_S), and every signed field as received — a replay
 * with a changed project, plan, key prefix, Idempotency-Key, content type or client IP fails; when
 * `v3` is there (every gateway since keys carry metadata), it must verify too, and it also covers
 * X-Postguard-Key-Meta.
 */
export function verifySignature({ secret, header, requestId, method, target, bodySha256, identity, nowS = Date.now() / 1000 }) {
  if (typeof header !== 'string' || header.length === 0) return { ok: false, reason: 'missing' };
  const parts = {};
  for (const piece of header.split(',')) {
    const i = piece.indexOf('=');
    if (i < 0) return { ok: false, reason: 'malformed' };
    const name = piece.slice(0, i).trim();
    if (name in parts) return { ok: false, reason: `duplicate ${name}` };
    parts[name] = piece.slice(i + 1).trim();
  }
  if (!/^\d+$/.test(parts.t ?? '') || !parts.v2) return { ok: false, reason: 'malformed' };
  const t = Number(parts.t);
  if (Math.abs(nowS - t) > MAX_SIGNATURE_AGE_S) return { ok: false, reason: 'stale timestamp', t };
  const matches = (version, given) => {
    const msg = canonicalString({ t: parts.t, requestId, method, target, bodySha256, identity, version });
    const expected = crypto.createHmac('sha256', secret).update(msg).digest();
    const got = Buffer.from(given, 'base64');
    return got.length === expected.length && crypto.timingSafeEqual(got, expected);
  };
  if (!matches('v2', parts.v2)) return { ok: false, reason: 'mismatch', t };
  if (parts.v3 !== undefined && !matches('v3', parts.v3)) return { ok: false, reason: 'v3 mismatch', t };
  return { ok: true, reason: null, t, v3: parts.v3 !== undefined };
}

function createStats() {
  const stats = {
    total: 0,
    byKey: {},
    requests: [],
    scripts: new Map(),
    /** keys the API issued before postguard (POST /__demo/legacy-keys) */
    legacyKeys: new Map(),
    /** calls of POST /internal/keys/verify, by the key asked about */
    verifyCalls: {},
    /** executions seen for an Idempotency-Key (0 if none) */
    count(key) {
      return stats.byKey[key] ?? 0;
    },
    /** records matching a predicate (only the last 500 are kept) */
    find(pred) {
      return stats.requests.filter(pred);
    },
    /** the record of the request postguard forwarded with this X-Request-Id */
    byRequestId(id) {
      return stats.requests.find((r) => r.headers['x-request-id'] === id);
    },
    script(key, statuses) {
      stats.scripts.set(key, [...statuses]);
    },
    reset() {
      stats.total = 0;
      stats.byKey = {};
      stats.requests.length = 0;
      stats.scripts.clear();
      stats.legacyKeys.clear();
      stats.verifyCalls = {};
    },
    toJSON() {
      return { total: stats.total, byKey: stats.byKey, requests: stats.requests };
    },
  };
  return stats;
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

function sendJson(res, status, obj, extraHeaders = {}) {
  const body = Buffer.from(JSON.stringify(obj));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': body.length, ...extraHeaders });
  res.end(body);
}

export async function startOrigin({ port = 0, host = '127.0.0.1', secret = TEST_SIGNING_SECRET, log = false } = {}) {
  const stats = createStats();
  const sockets = new Set();
  const timers = new Set();

  async function handleControl(req, res, url, body) {
    const route = `${req.method} ${url.pathname}`;
    if (route === 'GET /__demo/stats') return sendJson(res, 200, stats.toJSON());
    if (route === 'POST /__demo/reset') {
      stats.reset();
      return sendJson(res, 200, { ok: true });
    }
    if (route === 'POST /__demo/legacy-keys') {
      let parsed;
      try {
        parsed = JSON.parse(body.toString('utf8'));
      } catch {
        return sendJson(res, 400, { error: 'bad json' });
      }
      if (typeof parsed?.key !== 'string') return sendJson(res, 400, { error: 'expected {key, project, plan}' });
      stats.legacyKeys.set(parsed.key, parsed);
      return sendJson(res, 200, { ok: true });
    }
    if (route === 'POST /__demo/script') {
      let parsed;
      try {
        parsed = JSON.parse(body.toString('utf8'));
      } catch {
        return sendJson(res, 400, { error: 'bad json' });
      }
      if (typeof parsed?.key !== 'string' || !Array.isArray(parsed.statuses) || !parsed.statuses.every(Number.isInteger)) {
        return sendJson(res, 400, { error: 'expected {key: string, statuses: int[]}' });
      }
      stats.script(parsed.key, parsed.statuses);
      return sendJson(res, 200, { ok: true });
    }
    return sendJson(res, 404, { error: 'unknown control endpoint' });
  }

  /** The API's own key check, as postguard's auth.verify_unknown_keys calls it. */
  async function verifyKey(res, record, body) {
    let asked;
    try {
      asked = JSON.parse(body.toString('utf8')).key;
    } catch {
      return sendJson(res, 400, { error: 'bad json' });
    }
    stats.verifyCalls[asked] = (stats.verifyCalls[asked] ?? 0) + 1;
    const known = stats.legacyKeys.get(asked);
    if (known?.hang) return;
    if (known?.delay_ms) await new Promise((r) => setTimeout(r, known.delay_ms));
    if (res.destroyed) return;
    record.answered = true;
    if (!known) return sendJson(res, 404, { error: 'no such key' });
    if (known.status) return sendJson(res, known.status, { error: 'scripted' });
    const { project, plan, name } = known;
    return sendJson(res, 200, { project, plan, ...(name ? { name } : {}) });
  }

  // Lenient parsing: record whatever postguard forwards (e.g. DEL in a header value) instead of dropping the connection.
  const server = http.createServer({ insecureHTTPParser: true }, async (req, res) => {
    let body;
    try {
      body = await readBody(req);
    } catch {
      return;
    }
    const url = new URL(req.url, 'http://origin.invalid');
    if (url.pathname.startsWith('/__demo/')) return handleControl(req, res, url, body);

    const target = req.url; // raw request-target: path + query exactly as received
    const bodySha256 = crypto.createHash('sha256').update(body).digest('hex');
    const idemKey = req.headers['idempotency-key'];
    stats.total += 1;
    let execution = stats.total;
    if (idemKey !== undefined) {
      stats.byKey[idemKey] = (stats.byKey[idemKey] ?? 0) + 1;
      execution = stats.byKey[idemKey];
    }
    const sig = verifySignature({
      secret,
      identity: identityOf(req.headers),
      header: req.headers['x-postguard-signature'],
      requestId: req.headers['x-request-id'],
      method: req.method,
      target,
      bodySha256,
    });
    const record = {
      at: Date.now(),
      execution,
      method: req.method,
      target,
      path: url.pathname,
      query: url.search.slice(1),
      headers: { ...req.headers },
      rawHeaders: [...req.rawHeaders],
      body_bytes: body.length,
      body_sha256: bodySha256,
      signature_ok: sig.ok,
      signature_error: sig.reason,
      idempotency_key: idemKey ?? null,
      answered: false,
      closed_early: false,
    };
    stats.requests.push(record);
    if (stats.requests.length > MAX_RECORDS) stats.requests.splice(0, stats.requests.length - MAX_RECORDS);
    if (log) console.log(`[origin] ${req.method} ${target} key=${idemKey ?? '-'} exec=${execution} sig=${sig.ok}`);
    res.on('close', () => {
      record.ended_at = Date.now(); // with `at`: how long the request was in flight here
      if (!res.writableFinished) record.closed_early = true;
    });

    if (req.headers['x-demo-hang'] === '1') return; // never answer
    if (req.method === 'POST' && url.pathname === '/internal/keys/verify') return verifyKey(res, record, body);

    let status = req.method === 'POST' ? 201 : 200;
    const scripted = idemKey !== undefined ? stats.scripts.get(idemKey) : undefined;
    if (scripted && scripted.length > 0) status = scripted.shift();
    else if (req.headers['x-demo-status']) status = Number(req.headers['x-demo-status']);

    const delay = Number(req.headers['x-demo-delay-ms'] ?? 0);
    if (delay > 0) {
      await new Promise((r) => {
        const t = setTimeout(() => {
          timers.delete(t);
          r();
        }, delay);
        timers.add(t);
      });
    }
    if (res.destroyed) return;

    const headers = {
      'x-origin-execution': String(execution),
      'set-cookie': 'origin=1',
      location: `/things/${execution}`,
    };
    record.answered = true;
    record.status = status;
    if (req.headers['x-demo-chunked-json-bytes'] !== undefined) {
      // A JSON object of exactly n bytes, sent chunked (no Content-Length), 1 MiB a write.
      const n = Number(req.headers['x-demo-chunked-json-bytes']);
      res.writeHead(status, { ...headers, 'content-type': 'application/json' });
      const head = Buffer.from('{"pad":"');
      const tail = Buffer.from('"}');
      let left = n - head.length - tail.length;
      res.write(head);
      const chunk = Buffer.alloc(1 << 20, 'a');
      while (left > 0) {
        const take = Math.min(left, chunk.length);
        if (!res.write(take === chunk.length ? chunk : chunk.subarray(0, take))) {
          await new Promise((r) => res.once('drain', r));
        }
        left -= take;
      }
      return res.end(tail);
    }
    if (req.headers['x-demo-body-bytes'] !== undefined) {
      const n = Number(req.headers['x-demo-body-bytes']);
      const out = Buffer.alloc(n, 'a');
      res.writeHead(status, { ...headers, 'content-type': 'text/plain', 'content-length': n });
      return res.end(req.method === 'HEAD' ? undefined : out);
    }
    const reply = {
      execution,
      method: req.method,
      path: url.pathname,
      query: url.search.slice(1),
      headers: req.headers,
      body_sha256: bodySha256,
      signature_ok: sig.ok,
      at: Date.now(),
    };
    if (req.method === 'HEAD' || status === 204 || status === 304) {
      res.writeHead(status, status === 204 || status === 304 ? headers : { ...headers, 'content-type': 'application/json' });
      return res.end();
    }
    sendJson(res, status, reply, headers);
  });
  server.keepAliveTimeout = 5000;
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.on('clientError', (err, socket) => socket.destroy());

  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const realPort = server.address().port;
  let closed = false;

  /** Origin down: destroy every open socket (hanging requests included) and stop listening. */
  async function kill() {
    if (closed) return;
    closed = true;
    for (const t of timers) clearTimeout(t);
    timers.clear();
    const done = new Promise((r) => server.close(() => r()));
    for (const s of sockets) s.destroy();
    server.closeAllConnections?.();
    await done;
  }

  return {
    url: `http://${host}:${realPort}`,
    port: realPort,
    stats,
    secret,
    close: kill,
    kill,
  };
}

// CLI
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const args = process.argv.slice(2);
  let port = 8788;
  let host = '127.0.0.1';
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--port') port = Number(args[++i]);
    else if (args[i].startsWith('--port=')) port = Number(args[i].slice(7));
    else if (args[i] === '--host') host = args[++i];
    else if (args[i].startsWith('--host=')) host = args[i].slice(7);
    else if (args[i] === '--help' || args[i] === '-h') {
      console.log('usage: node tests/support/origin.mjs [--port 8788] [--host 127.0.0.1]   (ORIGIN_SIGNING_SECRET env = HMAC key)');
      process.exit(0);
    }
  }
  const secret = process.env.ORIGIN_SIGNING_SECRET || TEST_SIGNING_SECRET;
  const origin = await startOrigin({ port, host, secret, log: true });
  console.log(`demo origin listening on ${origin.url} (signature key from ORIGIN_SIGNING_SECRET${process.env.ORIGIN_SIGNING_SECRET ? '' : ', default'})`);
  const stop = async () => {
    await origin.kill();
    process.exit(0);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}
