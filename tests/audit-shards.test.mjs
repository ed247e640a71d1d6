// Audit shards (ADR 0016) on the real worker: one AuditShard object per (project, time
// bucket), with a 2 s bucket so a test crosses several shards. Rows across shard
// boundaries, paging over them, /stats against the raw rows, the operator's
// cross-project view and its fan-out bound.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { startGateway, problem, poll, bearer, cfg, ADMIN_TOKEN } from './support/gateway.mjs';
import { directory, projectRows, enter, shardStats, shardRows, ingest } from './support/audit-shards.mjs';

const BUCKET = 2000;
const CONFIG = {
  plans: { big: { requests_per_window: 100000, window_s: 60, idempotency_ttl_s: 86400 } },
  audit: { bucket_ms: BUCKET },
};

let origin;
let gw;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

const audit = (query, token) => gw.fetch(`/_postguard/v1/audit${query}`, { headers: bearer(token) });

/**
 * Sends requests (varied paths and statuses) until they span `buckets` buckets; their ids.
 * Paced (one per 25 ms at most): on an idle machine an unpaced loop sent so many rows that
 * walking them 7 a page spent the key's gateway budget (120 calls per minute) — a 429 that
 * says nothing about the shards.
 */
async function sendAcross(key, buckets, { paths = ['/r/a', '/r/b', '/r/c'] } = {}) {
  const first = Math.floor(Date.now() / BUCKET);
  const ids = [];
  for (let i = 0; Math.floor(Date.now() / BUCKET) < first + buckets; i++) {
    const status = ['200', '201', '404', '503'][i % 4];
    const pace = new Promise((r) => setTimeout(r, 25));
    const r = await gw.fetch(paths[i % paths.length], { headers: { ...bearer(key), 'x-demo-status': status } });
    ids.push(r.headers['x-request-id']);
    await pace;
  }
  return ids;
}

/** Every row of a listing, page by page (`limit` per page), checking each page's order. */
async function walk(query, token, limit, between = async () => {}) {
  const out = [];
  let cursor = null;
  for (let pages = 0; pages < 10_000; pages++) {
    const r = await audit(`?${query}&limit=${limit}${cursor ? `&cursor=${cursor}` : ''}`, token);
    assert.equal(r.status, 200, r.text);
    assert.ok(r.json.data.length <= limit);
    out.push(...r.json.data);
    cursor = r.json.next_cursor;
    if (!cursor) return out;
    assert.equal(r.json.data.length, limit, 'a page before the last is full');
    await between(pages);
  }
  throw new Error('endless paging');
}

function assertNewestFirst(rows) {
  for (let i = 1; i < rows.length; i++) {
    const a = rows[i - 1];
    const b = rows[i];
    assert.ok(a.time > b.time || (a.time === b.time && a.request_id > b.request_id), `newest first at ${i}`);
  }
}

describe('shard rollover', () => {
  it('rows across bucket boundaries are found, paged with no gap or repeat, cursors stable while rows arrive', async () => {
    const key = await gw.createKey({ project: 'roll', plan: 'big' });
    const sent = await sendAcross(key.key, 3);
    await poll(async () => (await projectRows(gw, 'roll')).length === sent.length, { timeout: 15000, message: `${sent.length} rows in the shards` });
    const shards = await directory(gw, 'roll');
    assert.ok(shards.length >= 3, `the rows span ${shards.length} shards`);
    for (const s of shards) assert.equal(s.end_ms - s.start_ms, BUCKET);
    // Small pages cross every boundary; new rows arriving mid-walk are newer than any cursor.
    const late = [];
    const seen = await walk('path=/r/*', key.key, 7, async (page) => {
      if (page < 3) late.push((await gw.fetch('/r/a', { headers: bearer(key.key) })).headers['x-request-id']);
    });
    const ids = seen.map((r) => r.request_id);
    assert.equal(new Set(ids).size, ids.length, 'no repeats');
    assert.deepEqual(new Set(ids), new Set(sent), 'no gaps, and none of the rows that arrived after the first page');
    assertNewestFirst(seen);
    const buckets = new Set(seen.map((r) => Math.floor(r.time / BUCKET)));
    assert.ok(buckets.size >= 3, 'the listing spans the buckets');
    // Each row is found by request_id (it maps to its one bucket), the late ones too.
    for (const id of [sent[0], sent[sent.length - 1], ...late]) {
      const one = await poll(async () => (await audit(`?request_id=${id}`, key.key)).json.data, { message: id });
      assert.equal(one.length, 1);
      assert.equal(one[0].request_id, id);
      assert.equal(one[0].project, 'roll');
    }
  });

  it('/stats equals a count over the raw rows listed through /audit, per key too', async () => {
    const key = await gw.createKey({ project: 'roll-stats', plan: 'big' });
    const other = await gw.createKey({ project: 'roll-stats', plan: 'big' });
    const sent = await sendAcross(key.key, 2, { paths: ['/s/a', '/s/b', '/s/b', '/s/c', '/s/c', '/s/c'] });
    sent.push(...(await sendAcross(other.key, 1, { paths: ['/s/z'] })));
    await poll(async () => (await projectRows(gw, 'roll-stats')).length === sent.length, { timeout: 15000, message: 'every row stored' });
    const rows = await walk('project=roll-stats', ADMIN_TOKEN, 200);
    assert.equal(rows.length, sent.length);
    const expect = (rs) => {
      const days = new Map();
      const paths = new Map();
      for (const r of rs) {
        const date = new Date(r.time).toISOString().slice(0, 10);
        // Every request here is a GET: none lacks a required Idempotency-Key.
        const d = days.get(date) ?? { date, requests: 0, errors: 0, server_errors: 0, missing_idempotency_key: 0 };
        d.requests++;
        d.errors += r.status >= 400 ? 1 : 0;
        d.server_errors += r.status >= 500 ? 1 : 0;
        days.set(date, d);
        paths.set(r.path, (paths.get(r.path) ?? 0) + 1);
      }
      const ms = rs.map((r) => r.response_time_ms).sort((a, b) => a - b);
      const at = (q) => ms[Math.min(Math.max(Math.ceil(q * ms.length), 1), ms.length) - 1];
      return {
        days: [...days.values()].sort((a, b) => a.date.localeCompare(b.date)),
        top_paths: [...paths].map(([path, requests]) => ({ path, requests }))
          .sort((a, b) => b.requests - a.requests || (a.path < b.path ? -1 : 1)).slice(0, 10),
        error_share: rs.filter((r) => r.status >= 400).length / rs.length,
        p50_ms: at(0.5),
        p95_ms: at(0.95),
        keys_missing_idempotency: [],
      };
    };
    const asKey = await gw.fetch('/_postguard/v1/stats?days=2', { headers: bearer(key.key) });
    assert.equal(asKey.status, 200, asKey.text);
    // The key's own reads (/stats) are requests of the project too: compare with the rows as listed.
    const now = await walk('project=roll-stats', ADMIN_TOKEN, 200);
    const statsRows = now.filter((r) => r.request_id !== asKey.headers['x-request-id']);
    assert.deepEqual(asKey.json, expect(statsRows));
    const perKey = await gw.admin('GET', `/_postguard/v1/stats?days=2&project=roll-stats&key_prefix=${other.prefix}`);
    assert.equal(perKey.status, 200, perKey.text);
    assert.deepEqual(perKey.json, expect(now.filter((r) => r.key_prefix === other.prefix)));
  });
});

describe('the object', () => {
  it('a retried batch inserts nothing and counts nothing twice; a batch with old and new rows counts the new', async () => {
    const shard = { project: 'retry', start_ms: 500 * BUCKET, end_ms: 501 * BUCKET };
    const r = (id, status) => ({
      request_id: id, time: shard.start_ms + 1, method: 'GET', path: '/retry', status, response_bytes: 2, response_time_ms: 7,
      client_ip: null, user_agent: null, key_prefix: 'pgk_retry000', project: 'retry', idempotency_key: null, replayed: true, rate_limit_remaining: 3,
    });
    assert.equal(await ingest(gw, shard, [r('req_r1', 200), r('req_r2', 500)]), 2);
    assert.equal(await ingest(gw, shard, [r('req_r1', 200), r('req_r2', 500)]), 0, 'the retry');
    assert.equal(await ingest(gw, shard, [r('req_r2', 500), r('req_r3', 404), r('req_r3', 404)]), 1, 'one new row, given twice');
    const st = await shardStats(gw, shard);
    assert.deepEqual(st.hours.map((h) => [h.requests, h.errors, h.server_errors]), [[3, 2, 1]]);
    assert.deepEqual(st.paths, [{ path: '/retry', requests: 3 }]);
    assert.deepEqual(st.latency, [[7, 3]]);
    const rows = await shardRows(gw, shard);
    assert.deepEqual(rows.map((x) => x.request_id), ['req_r3', 'req_r2', 'req_r1']);
    assert.equal(rows[0].replayed, true);
    assert.equal(rows[0].rate_limit_remaining, 3);
    assert.equal(rows[0].project, null, 'the shard stores no project: the reader fills it from the directory');
  });
});

describe("the operator's cross-project view", () => {
  it('merges every project of a bucket newest first, across buckets, with stable cursors', async () => {
    const tag = crypto.randomBytes(3).toString('hex');
    const a = await gw.createKey({ project: `ops-a-${tag}`, plan: 'big' });
    const b = await gw.createKey({ project: `ops-b-${tag}`, plan: 'big' });
    const first = Math.floor(Date.now() / BUCKET);
    const sent = [];
    for (let i = 0; Math.floor(Date.now() / BUCKET) < first + 2 || i < 10; i++) {
      // Paced (as sendAcross): on an idle machine the unpaced loop sent so many that
      // paging them 4 at a time below spent the key's gateway budget (120 a minute).
      const pace = new Promise((r) => setTimeout(r, 25));
      const k = i % 3 === 0 ? b : a;
      sent.push((await gw.fetch(`/ops/${tag}/${i}`, { headers: bearer(k.key) })).headers['x-request-id']);
      await pace;
    }
    await poll(async () => (await projectRows(gw, `ops-a-${tag}`)).length + (await projectRows(gw, `ops-b-${tag}`)).length === sent.length, { timeout: 15000, message: 'rows stored' });
    const seen = await walk(`path=/ops/${tag}/*`, ADMIN_TOKEN, 3);
    assert.deepEqual(seen.map((r) => r.request_id).sort(), [...sent].sort(), 'every row once');
    assertNewestFirst(seen);
    assert.deepEqual(new Set(seen.map((r) => r.project)), new Set([`ops-a-${tag}`, `ops-b-${tag}`]));
    // A key sees its project only, through the same shards.
    const own = await walk(`path=/ops/${tag}/*`, a.key, 4);
    assert.ok(own.length > 0 && own.every((r) => r.project === `ops-a-${tag}`));
  });

  it("/stats without project: each bucket's cross-project roll-ups equal the sum of every project's shards", async () => {
    // Every shard's roll-ups, read from the objects: the project (and no-project) shards
    // against the cross-project ones, then /stats against both.
    const sum = (parts) => parts.flatMap((p) => p.hours).reduce((a, h) => ({
      requests: a.requests + h.requests, errors: a.errors + h.errors, server_errors: a.server_errors + h.server_errors,
    }), { requests: 0, errors: 0, server_errors: 0 });
    const result = await poll(async () => {
      const dir = await directory(gw);
      const rows = sum(await Promise.all(dir.filter((d) => d.project !== '~all').map((d) => shardStats(gw, d))));
      const all = sum(await Promise.all(dir.filter((d) => d.project === '~all').map((d) => shardStats(gw, d))));
      const st = await gw.admin('GET', '/_postguard/v1/stats?days=2');
      assert.equal(st.status, 200, st.text);
      const days = st.json.days.reduce((a, d) => ({
        requests: a.requests + d.requests, errors: a.errors + d.errors, server_errors: a.server_errors + d.server_errors,
      }), { requests: 0, errors: 0, server_errors: 0 });
      // Equal once no row is in flight (the reads themselves are recorded after their answer).
      return JSON.stringify(rows) === JSON.stringify(all) && JSON.stringify(days) === JSON.stringify(all) ? { all, st: st.json } : undefined;
    }, { timeout: 15000, message: 'cross-project roll-ups equal to the sum of the shards' });
    assert.ok(result.all.requests > 100);
    assert.ok(result.st.top_paths.length === 10 && result.st.p50_ms !== null);
  });

  it('over more than 32 projects in one bucket: 400 AUDIT_PROJECT_REQUIRED, fine with project or a narrower range', async () => {
    // 33 projects with a shard in one old bucket (directory rows, as the writer enters them).
    const start = 1_000 * BUCKET;
    const wide = Array.from({ length: 33 }, (_, i) => ({ project: `wide-${i}`, start_ms: start, end_ms: start + BUCKET }));
    await enter(gw, wide);
    const p = problem(await audit(`?until=${start + 10}`, ADMIN_TOKEN), { status: 400, code: 'AUDIT_PROJECT_REQUIRED' });
    assert.match(p.detail, /project/);
    // Checked per bucket visited: the newest page, filled by recent buckets, is answered.
    const newest = await audit('', ADMIN_TOKEN);
    assert.equal(newest.status, 200, newest.text);
    assert.equal(newest.json.data.length, 50);
    problem(await audit('?path=/nowhere', ADMIN_TOKEN), { status: 400, code: 'AUDIT_PROJECT_REQUIRED' });
    const one = await audit(`?project=wide-7&until=${start + 10}`, ADMIN_TOKEN);
    assert.equal(one.status, 200, one.text);
    assert.deepEqual(one.json.data, []);
    const recent = await audit(`?since=${start + BUCKET}&limit=5`, ADMIN_TOKEN);
    assert.equal(recent.status, 200, recent.text);
    assert.equal(recent.json.data.length, 5);
  });
});
