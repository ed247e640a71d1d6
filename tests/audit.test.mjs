// Audit log and statistics (docs/audit-log.md, docs/api-reference.md) on the real worker with a real D1 database.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import {
  startGateway, problem, poll, bearer, cfg, ADMIN_TOKEN, ORIGIN_TOKEN, REQUEST_ID_RE,
} from './support/gateway.mjs';
import { directory, shardRows, shardStats, projectRows, ingest, enter } from './support/audit-shards.mjs';

const CONFIG = {
  origin: { timeout_ms: 1000 },
  idempotency: { lease_s: 3 },
  plans: {
    big: { requests_per_window: 100000, window_s: 60, idempotency_ttl_s: 86400 },
    tiny: { requests_per_window: 2, window_s: 3600, idempotency_ttl_s: 86400 },
  },
  retention: { audit_days: 90 },
};
const DAY = 86_400_000;

let origin;
let gw;
let db;
let keyA; // project audit-a
let keyB; // project audit-b

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  db = await gw.mf.getD1Database('DB');
  keyA = await gw.createKey({ project: 'audit-a', plan: 'big' });
  keyB = await gw.createKey({ project: 'audit-b', plan: 'big' });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

const audit = (query, token) => gw.fetch(`/_postguard/v1/audit${query}`, { headers: bearer(token) });

/** The audit row of a request, once its (after-the-response) write has landed. */
async function rowOf(requestId) {
  return poll(async () => {
    const r = await audit(`?request_id=${requestId}`, ADMIN_TOKEN);
    assert.equal(r.status, 200, r.text);
    return r.json.data[0];
  }, { timeout: 5000, message: `the audit row of ${requestId}` });
}

/** Rows of a project stored in its audit shards (read straight from the objects). */
const countRows = async (project) => (await projectRows(gw, project)).length;
const countLegacy = async () => (await db.prepare('SELECT COUNT(*) AS n FROM audit_log').first()).n;

describe('what is recorded', () => {
  it('a proxied request: every field, path without its query', async () => {
    const res = await gw.fetch('/orders/7?secret_q=hunter2', {
      method: 'POST',
      headers: { ...bearer(keyA.key), 'idempotency-key': 'audit-1', 'user-agent': 'audit-test/1', 'cf-connecting-ip': '203.0.113.9' },
      body: '{"card":"4242424242424242"}',
    });
    assert.equal(res.status, 201);
    const row = await rowOf(res.headers['x-request-id']);
    assert.equal(row.request_id, res.headers['x-request-id']);
    assert.ok(row.time >= res.sentAt - 1000 && row.time <= Date.now(), 'time is epoch ms of the request');
    assert.equal(row.method, 'POST');
    assert.equal(row.path, '/orders/7');
    assert.equal(row.status, 201);
    assert.equal(row.response_bytes, res.body.length);
    assert.ok(Number.isInteger(row.response_time_ms) && row.response_time_ms <= res.at - res.sentAt, `the gateway's time (${row.response_time_ms} ms) within what the client waited (${res.at - res.sentAt} ms)`);
    assert.ok(row.time + row.response_time_ms <= Date.now(), 'the response time ends before now');
    assert.equal(row.client_ip, '203.0.113.9');
    assert.equal(row.user_agent, 'audit-test/1');
    assert.equal(row.key_prefix, keyA.prefix);
    assert.equal(row.project, 'audit-a');
    assert.equal(row.idempotency_key, 'audit-1');
    assert.equal(row.replayed, false);
    assert.equal(row.rate_limit_remaining, Number(res.headers['x-ratelimit-remaining']));
  });

  it('a replay and its original are found together by idempotency_key', async () => {
    const k = `audit-replay-${crypto.randomBytes(4).toString('hex')}`;
    const send = () => gw.fetch('/pay', { method: 'POST', headers: { ...bearer(keyA.key), 'idempotency-key': k }, body: 'x' });
    const first = await send();
    const second = await send();
    assert.equal(second.headers['idempotent-replayed'], 'true');
    await rowOf(second.headers['x-request-id']);
    await rowOf(first.headers['x-request-id']);
    const r = await audit(`?idempotency_key=${k}`, keyA.key);
    assert.equal(r.status, 200);
    assert.deepEqual(r.json.data.map((x) => [x.request_id, x.replayed]), [
      [second.headers['x-request-id'], true],
      [first.headers['x-request-id'], false],
    ]);
  });

  it('rejected requests are recorded: 429 with its key, 401 without a project', async () => {
    const tiny = await gw.createKey({ project: 'audit-tiny', plan: 'tiny' });
    let limited;
    for (let i = 0; i < 3; i++) limited = await gw.fetch('/t', { headers: bearer(tiny.key) });
    assert.equal(limited.status, 429);
    const row429 = await rowOf(limited.headers['x-request-id']);
    assert.equal(row429.status, 429);
    assert.equal(row429.project, 'audit-tiny');
    assert.equal(row429.rate_limit_remaining, 0);

    const unauth = await gw.fetch('/t', { headers: bearer('pgk_' + 'Z'.repeat(43)) });
    assert.equal(unauth.status, 401);
    const row401 = await rowOf(unauth.headers['x-request-id']);
    assert.equal(row401.status, 401);
    assert.equal(row401.project, null);
    assert.equal(row401.key_prefix, null, 'an unknown key is not recorded, not even its prefix');
    // Requests without a valid key belong to no project: a key never sees them.
    const asKey = await audit(`?request_id=${unauth.headers['x-request-id']}`, keyA.key);
    assert.deepEqual(asKey.json.data, []);
  });

  it('no secret, query string, Authorization or full key in any stored column', async () => {
    const secrets = [keyA.key, keyB.key, ADMIN_TOKEN, ORIGIN_TOKEN, 'hunter2', '4242424242424242'];
    // Requests carrying every kind of secret, on every kind of endpoint.
    await gw.fetch('/s?token=hunter2', { headers: bearer(keyB.key) });
    await gw.fetch('/_postguard/v1/keys?project=audit-a&x=hunter2', { headers: bearer(ADMIN_TOKEN) });
    await gw.fetch('/_postguard/v1/me', { headers: bearer(keyA.key) });
    await gw.fetch('/x', { headers: bearer(ORIGIN_TOKEN) });
    const last = await gw.fetch('/s2', { method: 'PUT', headers: { ...bearer(keyB.key), authorization: `Bearer ${keyB.key}` }, body: 'hunter2' });
    await rowOf(last.headers['x-request-id']);
    // Every stored row and roll-up of every shard, read from the objects themselves.
    const results = [];
    for (const shard of await directory(gw)) {
      results.push(...(await shardRows(gw, shard)));
      const r = await shardStats(gw, shard);
      results.push(...r.paths.map((p) => ({ request_id: `${shard.project} roll-up`, ...p })));
    }
    assert.ok(results.length >= 5);
    for (const row of results) {
      for (const [col, value] of Object.entries(row)) {
        for (const s of secrets) {
          assert.ok(!String(value ?? '').includes(s), `column ${col} of ${row.request_id} holds a secret`);
        }
        assert.ok(!String(value ?? '').includes('?'), `column ${col} of ${row.request_id} holds a query string`);
      }
    }
  });
});

describe('GET /_postguard/v1/audit', () => {
  it('filters: status exact and class, path wildcard, method, key_prefix, since/until', async () => {
    const tag = crypto.randomBytes(3).toString('hex');
    const reqs = [
      ['GET', `/wild/${tag}/a`, {}],
      ['GET', `/wild/${tag}/b/c`, { 'x-demo-status': '404' }],
      ['DELETE', `/wild/${tag}/d`, { 'x-demo-status': '503' }],
      ['GET', `/tame/${tag}`, {}],
    ];
    const t0 = Date.now();
    const ids = [];
    for (const [method, p, h] of reqs) {
      const r = await gw.fetch(p, { method, headers: { ...bearer(keyA.key), ...h } });
      ids.push(r.headers['x-request-id']);
    }
    for (const id of ids) await rowOf(id);
    const q = async (query) => {
      const r = await audit(query, keyA.key);
      assert.equal(r.status, 200, r.text);
      return r.json.data.map((x) => x.path).sort();
    };
    assert.deepEqual(await q(`?path=/wild/${tag}/*`), [`/wild/${tag}/a`, `/wild/${tag}/b/c`, `/wild/${tag}/d`]);
    assert.deepEqual(await q(`?path=/wild/${tag}/*&status=4xx`), [`/wild/${tag}/b/c`]);
    assert.deepEqual(await q(`?path=/wild/${tag}/*&status=5xx`), [`/wild/${tag}/d`]);
    assert.deepEqual(await q(`?path=/wild/${tag}/*&status=200`), [`/wild/${tag}/a`]);
    assert.deepEqual(await q(`?path=/wild/${tag}/*&method=delete`), [`/wild/${tag}/d`]);
    assert.deepEqual(await q(`?path=/*/${tag}&key_prefix=${keyA.prefix}`), [`/tame/${tag}`], '* spans one or more characters, across /');
    assert.deepEqual(await q(`?path=/*/${tag}&key_prefix=${keyB.prefix}`), []);
    assert.deepEqual(await q(`?path=/wild/${tag}`), [], 'without * the path matches exactly');
    assert.deepEqual(await q(`?path=/tame/${tag}&since=${t0}&until=${Date.now() + 1000}`), [`/tame/${tag}`]);
    assert.deepEqual(await q(`?path=/tame/${tag}&until=${new Date(t0 - 60000).toISOString()}`), []);
  });

  it('pagination over 260 rows: exact page sizes, newest first, no gaps or repeats', async () => {
    const key = await gw.createKey({ project: 'audit-pages', plan: 'big' });
    const sent = new Set();
    for (let i = 0; i < 260; i++) {
      const r = await gw.fetch(`/page/${i}`, { headers: bearer(key.key) });
      sent.add(r.headers['x-request-id']);
    }
    await poll(async () => (await countRows('audit-pages')) === 260, { timeout: 10000, message: '260 audit rows' });
    const seen = [];
    let cursor = null;
    let pages = 0;
    do {
      const r = await audit(`?limit=100${cursor ? `&cursor=${cursor}` : ''}`, key.key);
      assert.equal(r.status, 200, r.text);
      pages++;
      assert.equal(r.json.data.length, pages < 3 ? 100 : 60, 'limit honoured exactly');
      seen.push(...r.json.data);
      cursor = r.json.next_cursor;
    } while (cursor && pages < 10);
    assert.equal(pages, 3);
    assert.equal(cursor, null);
    const ids = seen.map((x) => x.request_id);
    assert.equal(new Set(ids).size, 260, 'no repeats');
    assert.deepEqual(new Set(ids), sent, 'no gaps');
    for (let i = 1; i < seen.length; i++) {
      const a = seen[i - 1];
      const b = seen[i];
      assert.ok(a.time > b.time || (a.time === b.time && a.request_id > b.request_id), 'newest first');
    }
  });

  it('without ?limit a page holds 50 rows', async () => {
    const key = await gw.createKey({ project: 'audit-default-page', plan: 'big' });
    for (let i = 0; i < 51; i++) await gw.fetch(`/default-page/${i}`, { headers: bearer(key.key) });
    await poll(async () => (await countRows('audit-default-page')) === 51, { timeout: 10000, message: '51 audit rows' });
    // Read as the operator: its own requests belong to no project and do not add rows here.
    const first = await audit('?project=audit-default-page', ADMIN_TOKEN);
    assert.equal(first.status, 200, first.text);
    assert.equal(first.json.data.length, 50);
    assert.equal(typeof first.json.next_cursor, 'string');
    const rest = await audit(`?project=audit-default-page&cursor=${first.json.next_cursor}`, ADMIN_TOKEN);
    assert.equal(rest.json.data.length, 1);
    assert.equal(rest.json.next_cursor, null);
  });

  it('project isolation: a key sees its own project only; the operator sees both and filters', async () => {
    const a = await gw.fetch('/iso', { headers: bearer(keyA.key) });
    const b = await gw.fetch('/iso', { headers: bearer(keyB.key) });
    await rowOf(a.headers['x-request-id']);
    await rowOf(b.headers['x-request-id']);
    const projects = async (query, token) => new Set((await audit(query, token)).json.data.map((x) => x.project));
    assert.deepEqual(await projects('?path=/iso&limit=200', keyA.key), new Set(['audit-a']));
    assert.deepEqual(await projects('?path=/iso&limit=200', keyB.key), new Set(['audit-b']));
    assert.deepEqual(await projects('?path=/iso&limit=200', ADMIN_TOKEN), new Set(['audit-a', 'audit-b']));
    assert.deepEqual(await projects('?path=/iso&project=audit-b', ADMIN_TOKEN), new Set(['audit-b']));
    problem(await audit('?project=audit-b', keyA.key), { status: 400, code: 'VALIDATION_ERROR' });
    const byId = await audit(`?request_id=${b.headers['x-request-id']}`, keyA.key);
    assert.deepEqual(byId.json.data, [], 'key A cannot read key B\'s row even by request_id');
  });

  it('malformed filters → 400 VALIDATION_ERROR; bad credentials → 401/403', async () => {
    for (const q of ['?status=abc', '?status=6xx', '?since=yesterday', '?limit=500', '?limit=0', '?cursor=garbage', '?path=noslash', '?colour=red']) {
      problem(await audit(q, keyA.key), { status: 400, code: 'VALIDATION_ERROR' });
    }
    problem(await audit('', 'wrong'), { status: 401, code: 'INVALID_API_KEY' });
    problem(await gw.fetch('/_postguard/v1/audit'), { status: 401 });
    problem(await audit('', ORIGIN_TOKEN), { status: 403, code: 'FORBIDDEN' });
  });
});

describe('GET /_postguard/v1/stats', () => {
  it('per-day requests and errors, top paths, error share, p50/p95 for the caller\'s project', async () => {
    const key = await gw.createKey({ project: 'audit-stats', plan: 'big' });
    const ids = [];
    for (let i = 0; i < 6; i++) ids.push((await gw.fetch('/hot', { headers: bearer(key.key) })).headers['x-request-id']);
    ids.push((await gw.fetch('/cold', { headers: { ...bearer(key.key), 'x-demo-status': '404' } })).headers['x-request-id']);
    ids.push((await gw.fetch('/cold', { headers: { ...bearer(key.key), 'x-demo-status': '500' } })).headers['x-request-id']);
    for (const id of ids) await rowOf(id);
    const r = await gw.fetch('/_postguard/v1/stats?days=7', { headers: bearer(key.key) });
    assert.equal(r.status, 200, r.text);
    const s = r.json;
    const today = new Date().toISOString().slice(0, 10);
    assert.deepEqual(s.days, [{ date: today, requests: 8, errors: 2, server_errors: 1, missing_idempotency_key: 0 }]);
    assert.deepEqual(s.top_paths, [{ path: '/hot', requests: 6 }, { path: '/cold', requests: 2 }]);
    assert.equal(s.error_share, 2 / 8);
    assert.ok(Number.isInteger(s.p50_ms) && Number.isInteger(s.p95_ms) && s.p50_ms <= s.p95_ms);
    problem(await gw.fetch('/_postguard/v1/stats?days=91', { headers: bearer(key.key) }), { status: 400, code: 'VALIDATION_ERROR' });
    const all = await gw.fetch('/_postguard/v1/stats?days=1', { headers: bearer(ADMIN_TOKEN) });
    assert.ok(all.json.days[0].requests > 8, 'the operator sees every project');
  });
});

describe('retention', () => {
  it('the cron job deletes only rows older than retention.audit_days', async () => {
    const now = Date.now();
    const insert = (id, time) => db.prepare(
      'INSERT INTO audit_log (request_id, time, method, path, status, response_time_ms, project, replayed) VALUES (?, ?, ?, ?, ?, ?, ?, 0)',
    ).bind(id, time, 'GET', '/old', 200, 1, 'audit-retention').run();
    await insert('req_retention_old_1', now - 91 * DAY);
    await insert('req_retention_old_2', now - 365 * DAY);
    await insert('req_retention_edge', now - 89 * DAY);
    await insert('req_retention_new', now - 1000);
    const before = await countLegacy();
    // Shards: a bucket that ended 91 days ago goes whole; one of 89 days ago stays.
    const start = (t) => Math.floor(t / DAY) * DAY;
    const old = { project: 'audit-retention', start_ms: start(now - 92 * DAY), end_ms: start(now - 92 * DAY) + DAY };
    const kept = { project: 'audit-retention', start_ms: start(now - 89 * DAY), end_ms: start(now - 89 * DAY) + DAY };
    const shardRow = (id, time) => ({
      request_id: id, time, method: 'GET', path: '/old', status: 200, response_bytes: null, response_time_ms: 1,
      client_ip: null, user_agent: null, key_prefix: null, project: 'audit-retention', idempotency_key: null, replayed: false, rate_limit_remaining: null,
    });
    await enter(gw, [old, kept]);
    assert.equal(await ingest(gw, old, [shardRow('req_shard_old_1', old.start_ms + 5), shardRow('req_shard_old_2', old.start_ms + 6)]), 2);
    assert.equal(await ingest(gw, kept, [shardRow('req_shard_kept', kept.start_ms + 5)]), 1);
    const shardsBefore = (await directory(gw)).length;
    const worker = await gw.mf.getWorker();
    await worker.scheduled({ cron: '17 3 * * *' });
    const left = (await db.prepare("SELECT request_id FROM audit_log WHERE project = 'audit-retention' ORDER BY request_id").all()).results.map((r) => r.request_id);
    assert.deepEqual(left, ['req_retention_edge', 'req_retention_new']);
    assert.equal(await countLegacy(), before - 2, 'nothing else was deleted');
    assert.deepEqual((await directory(gw, 'audit-retention')).map((s) => s.start_ms), [kept.start_ms], 'the old bucket left the directory');
    assert.equal((await directory(gw)).length, shardsBefore - 1, 'no other bucket was dropped');
    assert.deepEqual(await shardRows(gw, old), [], 'the old bucket\'s object holds nothing');
    assert.deepEqual((await shardStats(gw, old)).hours, [], 'nor any roll-up');
    assert.deepEqual((await shardRows(gw, kept)).map((r) => r.request_id), ['req_shard_kept']);
    // Legacy rows are still read through the API until retention empties them.
    const legacy = await audit('?project=audit-retention&limit=200', ADMIN_TOKEN);
    assert.deepEqual(legacy.json.data.map((r) => r.request_id), ['req_retention_new', 'req_retention_edge', 'req_shard_kept'], 'newest first across the legacy table and a shard of the same day');
  });
});

describe('the audit write never fails the request', () => {
  it('every gateway answer has its row, including errors of gateway endpoints', async () => {
    const r = await gw.fetch('/_postguard/v1/nope', { headers: bearer(keyA.key) });
    assert.equal(r.status, 404);
    assert.match(r.headers['x-request-id'], REQUEST_ID_RE);
    const row = await rowOf(r.headers['x-request-id']);
    assert.equal(row.status, 404);
    assert.equal(row.path, '/_postguard/v1/nope');
  });

  it('with D1 failing (no schema), requests are answered normally', async () => {
    const broken = await startGateway({ originUrl: origin.url, migrate: false, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
    try {
      const k = await broken.createKey({ project: 'audit-broken', plan: 'big' });
      for (let i = 0; i < 5; i++) {
        const r = await broken.fetch('/ok', { method: 'POST', headers: { ...bearer(k.key), 'idempotency-key': `b${i}` }, body: 'x' });
        assert.equal(r.status, 201, r.text);
      }
      const brokenDb = await broken.mf.getD1Database('DB');
      await assert.rejects(brokenDb.prepare('SELECT COUNT(*) FROM audit_log').first(), /no such table/, 'D1 really fails here');
      const q = await broken.fetch('/_postguard/v1/audit', { headers: bearer(k.key) });
      assert.ok(q.status >= 500 && q.status < 600, 'reading the log fails loudly, as problem+json');
      problem(q);
    } finally {
      await broken.dispose();
    }
  });
});
