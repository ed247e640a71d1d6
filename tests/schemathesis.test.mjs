// The API document against the real gateway: schemathesis (PyPI, installed into .tools/st by
// scripts/setup.sh) loads the document the gateway serves at /_postguard/v1/openapi.json and runs
// generated requests — valid and invalid — against the real built worker under Miniflare (real
// KV, D1, Durable Objects, Queues) and the real demo origin, once per credential: the operator's
// token, the origin's token and a project's API key. Each run must show no 5xx, and every response
// must conform to the document: status code, content type, headers and body schema. Bad input must
// be a documented 4xx problem+json. Seeded data (a delivered and a dead-lettered delivery, audit
// rows) makes the list and detail answers non-trivial.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startGateway, poll, cfg, ROOT, ADMIN_TOKEN, ORIGIN_TOKEN } from './support/gateway.mjs';
import { directory, shardRows } from './support/audit-shards.mjs';

const ST = path.join(ROOT, '.tools', 'st', 'bin', 'st');
const DOC_PATH = '/_postguard/v1/openapi.json';
const OUT = path.join(ROOT, 'target', 'schemathesis');
// Bounded: a few minutes in all on two shared cores. ST_MAX_EXAMPLES raises it for a deeper local run.
const MAX_EXAMPLES = Number(process.env.ST_MAX_EXAMPLES ?? 100);
const SEED = process.env.ST_SEED ?? '20261201';
const CHECKS = [
  'not_a_server_error',
  'status_code_conformance',
  'content_type_conformance',
  'response_headers_conformance',
  'response_schema_conformance',
  'negative_data_rejection',
  'missing_required_header',
  'unsupported_method',
  'allow_header_conformance',
  'ignored_auth',
  'use_after_free',
  'ensure_resource_availability',
];

const CONFIG = {
  plans: { trial: { requests_per_window: 30, window_s: 60 }, business: { requests_per_window: 2000, window_s: 60 }, big: { requests_per_window: 1000000, window_s: 60, gateway: { requests: 1000000, window_s: 60 } } },
  webhooks: { schedule_s: [60], timeout_ms: 2000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  origin: { timeout_ms: 2000 },
  // An asynchronous operation for getOperation and getOperationResult (seedOperation).
  async: { routes: [{ method: 'POST', path: '/reports/*' }] },
};

let origin;
let gw;
let doc;
let apiKey;
let session; // a portal session for the seeded project, once this build has portal links
const receivers = [];
const operations = []; // {operationId, method, path, security: [scheme names]}

before(async () => {
  assert.ok(fs.existsSync(ST), `schemathesis is missing at ${ST}: run bash scripts/setup.sh`);
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  const res = await gw.fetch(DOC_PATH);
  assert.equal(res.status, 200, res.text.slice(0, 300));
  doc = res.json;
  for (const [p, item] of Object.entries(doc.paths)) {
    for (const method of ['get', 'put', 'post', 'delete', 'patch']) {
      const op = item[method];
      if (!op) continue;
      const security = (op.security ?? doc.security ?? []).flatMap((req) => Object.keys(req));
      operations.push({ operationId: op.operationId, method: method.toUpperCase(), path: p, security });
    }
  }
  await seed();
});

after(async () => {
  for (const r of receivers) await r.close();
  await gw?.dispose();
  await origin?.kill();
});

/** A project with an API key, a delivered and a dead-lettered delivery, and audit rows. */
async function seed() {
  const ok = await startReceiver({ behaviour: () => ({ status: 200, body: 'ok' }) });
  const gone = await startReceiver({ behaviour: () => ({ status: 410, body: 'gone' }) });
  receivers.push(ok, gone);
  apiKey = (await gw.createKey({ project: 'st-acme', plan: 'big', name: 'schemathesis' })).key;
  for (const [url, events] of [[`${ok.url}/in`, ['payment.*']], [`${gone.url}/in`, ['order.*']]]) {
    const res = await gw.admin('POST', '/_postguard/v1/webhooks', { url, events, description: 'seed' }, { token: apiKey });
    assert.equal(res.status, 201, res.text);
  }
  for (const type of ['payment.succeeded', 'order.created']) {
    const res = await gw.admin('POST', '/_postguard/v1/events', { project: 'st-acme', type, data: { id: 'obj_1' } }, { token: ORIGIN_TOKEN });
    assert.equal(res.status, 202, res.text);
  }
  session = await portalSession('st-acme');
  await poll(async () => {
    const res = await gw.admin('GET', '/_postguard/v1/deliveries', undefined, { token: apiKey });
    const statuses = (res.json?.data ?? []).map((d) => d.status).sort();
    return statuses.join() === 'dead_letter,delivered';
  }, { timeout: 30000, message: 'the seeded deliveries to settle' });
  await seedTask();
  await seedOperation();
}

/**
 * A recover task of the seeded project, and schemathesis's configuration (target/schemathesis/
 * schemathesis.toml, read from its working directory) naming it for `GET /tasks/{id}`. Its
 * generated Idempotency-Keys repeat ("0", "!"…), so most of its recovers are answered 422 (the
 * key reused with another request) and the few that start a task rarely feed the stateful
 * phase's link to getTask: without a known id, that operation's success would go unchecked.
 */
async function seedTask() {
  const subs = await gw.admin('GET', '/_postguard/v1/webhooks', undefined, { token: apiKey });
  const res = await gw.admin('POST', `/_postguard/v1/webhooks/${subs.json.data[0].id}/recover`, { since: 0 }, { token: apiKey });
  assert.equal(res.status, 202, res.text);
  const exp = await seedExport();
  fs.mkdirSync(OUT, { recursive: true });
  fs.writeFileSync(path.join(OUT, 'schemathesis.toml'), [
    '[[operations]]',
    'include-operation-id = "getTask"',
    `parameters = { "path.id" = "${res.json.id}" }`,
    '',
    '[[operations]]',
    'include-operation-id = "getExport"',
    `parameters = { "path.id" = "${exp.id}" }`,
    '',
    '[[operations]]',
    'include-operation-id = "downloadExport"',
    `parameters = { "path.id" = "${exp.id}", "query.expires" = "${exp.expires}", "query.sig" = "${exp.sig}" }`,
    '',
  ].join('\n'));
}

/**
 * A succeeded asynchronous operation of the seeded project, named in schemathesis's
 * configuration for `GET /operations/{id}` and `…/{id}/result`: their ids are created only by
 * the proxy (`Prefer: respond-async`), which no run of the document sends, so without one
 * those operations' successes would go unchecked.
 */
async function seedOperation() {
  const res = await gw.fetch('/reports/st', {
    method: 'POST',
    headers: { authorization: `Bearer ${apiKey}`, prefer: 'respond-async', 'idempotency-key': 'st-operation', 'content-type': 'application/json' },
    body: '{"report": 1}',
  });
  assert.equal(res.status, 202, res.text);
  const id = res.json.id;
  await poll(async () => {
    const r = await gw.admin('GET', `/_postguard/v1/operations/${id}`, undefined, { token: apiKey });
    return r.json?.state === 'succeeded';
  }, { timeout: 30000, message: 'the seeded operation to succeed' });
  fs.appendFileSync(path.join(OUT, 'schemathesis.toml'), ['getOperation', 'getOperationResult'].map((op) => [
    '[[operations]]',
    `include-operation-id = "${op}"`,
    `parameters = { "path.id" = "${id}" }`,
    '',
  ].join('\n')).join('\n'));
}

/**
 * A finished export of the seeded project's audit rows, and a download signature for it valid
 * two hours (signed as the gateway signs, with the key it derives from ADMIN_TOKEN: the URL
 * `getExport` answers lasts 15 minutes, which a loaded run could outlast).
 */
async function seedExport() {
  const res = await gw.admin('POST', '/_postguard/v1/exports', { project: 'st-acme', kind: 'audit', since: Date.now() - 86_400_000, until: Date.now() + 60_000 });
  assert.equal(res.status, 202, res.text);
  await poll(async () => (await gw.admin('GET', `/_postguard/v1/exports/${res.json.id}`)).json?.state === 'done', { timeout: 30000, message: 'the seeded export' });
  const expires = Date.now() + 2 * 3600_000;
  const key = crypto.createHmac('sha256', 'postguard export url v1').update(ADMIN_TOKEN).digest();
  const sig = crypto.createHmac('sha256', key).update(`${res.json.id}\0${expires}`).digest('base64url');
  return { id: res.json.id, expires, sig };
}

/** A portal session for `project` (link → exchange). */
async function portalSession(project) {
  const link = await gw.admin('POST', '/_postguard/v1/portal-links', { project });
  assert.equal(link.status, 201, link.text);
  const token = new URLSearchParams(new URL(link.json.url).hash.slice(1)).get('portal');
  assert.ok(token, `no portal token in ${link.json.url}`);
  const res = await gw.admin('POST', '/_postguard/v1/portal-sessions', { token }, { token: null });
  assert.equal(res.status, 201, res.text);
  return res.json.session;
}

/** Runs `st run` on the served document for the given operations with one credential. */
function runSchemathesis(name, operationIds, token, skipChecks = []) {
  fs.mkdirSync(OUT, { recursive: true });
  const args = [
    'run', `${gw.url}${DOC_PATH}`,
    '--url', gw.url,
    '--checks', CHECKS.filter((c) => !skipChecks.includes(c)).join(','),
    '--phases', 'examples,coverage,fuzzing,stateful',
    '--max-examples', String(MAX_EXAMPLES),
    '--seed', SEED,
    '--request-timeout', '30',
    '--workers', '2',
    '--generation-database', 'none',
    '--no-color',
    '--report', 'junit',
    '--report-junit-path', path.join(OUT, `${name}.xml`),
  ];
  for (const id of operationIds) args.push('--include-operation-id', id);
  if (token) args.push('--header', `Authorization: Bearer ${token}`);
  return new Promise((resolve, reject) => {
    const child = spawn(ST, args, { cwd: OUT, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NO_COLOR: '1' } });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { out += d; });
    child.on('error', reject);
    child.on('close', (code) => {
      fs.writeFileSync(path.join(OUT, `${name}.log`), out);
      resolve({ code, out });
    });
  });
}

/** "Test cases:" summary line → the number of generated cases. */
function casesRun(out) {
  const m = out.match(/Test cases:\s*\n?\s*(\d+) generated/);
  return m ? Number(m[1]) : undefined;
}

// The operator's run goes last: its stateful phase lists and revokes keys, the seeded one included.
const RUNS = [
  { name: 'api-key', scheme: 'apiKey', token: () => apiKey },
  { name: 'origin', scheme: 'originToken', token: () => ORIGIN_TOKEN },
  { name: 'portal-session', scheme: 'portalSession', token: () => session },
  // DELETE /keys/{id} revokes: the record stays readable with `revoked_at` set (documented), which
  // use_after_free would take for a deleted resource still served.
  { name: 'operator', scheme: 'operatorToken', token: () => ADMIN_TOKEN, unauthenticated: true, skipChecks: ['use_after_free'] },
];

describe('schemathesis against the served document', () => {
  let total = 0;
  for (const run of RUNS) {
    it(`${run.name}: no 5xx, every response conforms`, async () => {
      assert.ok(run.token(), `no ${run.scheme} credential`);
      const chosen = [];
      for (const op of operations) {
        const mine = op.security.includes(run.scheme) || (run.unauthenticated && op.security.length === 0);
        if (!mine) continue;
        chosen.push(op.operationId);
      }
      assert.ok(chosen.length > 0, `no operation uses ${run.scheme}`);
      const { code, out } = await runSchemathesis(run.name, chosen, run.token(), run.skipChecks);
      const n = casesRun(out);
      total += n ?? 0;
      console.log(`# ${run.name}: ${chosen.length} operations, ${n} test cases (log: target/schemathesis/${run.name}.log)`);
      assert.equal(code, 0, `schemathesis (${run.name}) failed:\n${out.slice(-12000)}`);
      assert.ok(n > 0, `no test case ran:\n${out.slice(-3000)}`);
      // A credential that never got past 401/403 would test only the error paths.
      assert.doesNotMatch(out, /Authentication failed/, `the ${run.name} credential was refused:\n${out.slice(-3000)}`);
    });
  }
  it('every documented operation was exercised, and answered 2xx at least once', async () => {
    const covered = new Set();
    for (const run of RUNS.filter((r) => r.token())) {
      for (const op of operations) {
        if (op.security.includes(run.scheme) || (run.unauthenticated && op.security.length === 0)) covered.add(op.operationId);
      }
    }
    const missed = operations.filter((op) => !covered.has(op.operationId)).map((op) => op.operationId);
    assert.deepEqual(missed, [], 'operations no run covers');
    // The audit log has every request schemathesis sent: count the answers per operation.
    // Every stored row of every audit shard (ADR 0016), each counted once.
    const stored = async () => (await Promise.all((await directory(gw)).map((s) => shardRows(gw, s)))).flat();
    const all = await poll(async () => {
      const rows = await stored();
      return rows.length >= total ? rows : undefined;
    }, { message: 'the audit rows of every case' });
    const results = all.map((r) => ({ method: r.method, path: r.path, status: r.status, n: 1 }));
    const table = [];
    const noSuccess = [];
    for (const op of operations) {
      const re = new RegExp(`^${op.path.replace(/[.]/g, '\\.').replace(/\{[^}]+\}/g, '[^/]+')}$`);
      const rows = results.filter((r) => r.method === op.method && re.test(r.path));
      const by = (lo, hi) => rows.filter((r) => r.status >= lo && r.status < hi).reduce((a, r) => a + r.n, 0);
      table.push(`${op.operationId}: 2xx ${by(200, 300)}, 4xx ${by(400, 500)}, 5xx ${by(500, 600)}`);
      if (by(200, 300) === 0) noSuccess.push(op.operationId);
    }
    console.log(`# schemathesis: ${total} test cases in all\n# ${table.join('\n# ')}`);
    assert.deepEqual(noSuccess, [], 'operations that never answered 2xx: their success responses went unchecked');
  });
});
