// The compliance archive and exports (issue 27 item 3, ADR 0038), end to end:
// the real built worker under Miniflare with its real D1, Durable Objects, queue and R2.
//   - with retention.*_days = 0, the daily job writes a past day's audit rows and delivery
//     records (with their attempts) to archive/<project>/<kind>/<date>.ndjson.gz before it
//     drops their shards; the manifest's row count, size and SHA-256 match the object, and
//     every line is the row that was written;
//   - a re-run writes nothing new;
//   - an export of the range (POST /exports → 202 {id}, GET → done with a signed URL) is
//     downloaded through the worker and holds every row, archived and live alike;
//   - a tampered, expired or missing signature is refused; the download is audited without it.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import zlib from 'node:zlib';
import { startOrigin } from './support/origin.mjs';
import { startGateway, problem, poll, bearer, cfg, ADMIN_TOKEN } from './support/gateway.mjs';
import { enter, ingest, directory as auditDirectory, projectRows } from './support/audit-shards.mjs';
import { importRecords, directory as webhookDirectory } from './support/webhook-shards.mjs';

const DAY_MS = 86_400_000;
const CONFIG = {
  plans: { big: { requests_per_window: 1_000_000, window_s: 60, idempotency_ttl_s: 86400 } },
  retention: { audit_days: 0, deliveries_days: 0 },
  webhooks: { allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
};
const CRON = { cron: '17 3 * * *' };

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

const uniq = (p) => `${p}-${crypto.randomBytes(4).toString('hex')}`;
const show = (res) => `${res.status} ${res.text?.slice(0, 400)}`;
const dayStart = (t) => Math.floor(t / DAY_MS) * DAY_MS;
const isoDate = (t) => new Date(t).toISOString().slice(0, 10);
const sha256 = (buf) => crypto.createHash('sha256').update(buf).digest('hex');
const lines = (gz) => zlib.gunzipSync(gz).toString('utf8').split('\n').filter((l) => l !== '').map((l) => JSON.parse(l));
const byId = (key) => (a, b) => (a[key] < b[key] ? -1 : a[key] > b[key] ? 1 : 0);

async function archiveBucket() {
  return gw.mf.getR2Bucket('ARCHIVE');
}

/** The stored bytes of an R2 object, `null` when absent. */
async function objectBytes(key) {
  const o = await (await archiveBucket()).get(key);
  return o ? Buffer.from(await o.arrayBuffer()) : null;
}

/** Every archive object of a project: {key, etag, size}, by key. */
async function listed(project) {
  const out = [];
  let cursor;
  do {
    const page = await (await archiveBucket()).list({ prefix: `archive/${project}/`, cursor });
    out.push(...page.objects.map((o) => ({ key: o.key, etag: o.etag, size: o.size, uploaded: +o.uploaded })));
    cursor = page.truncated ? page.cursor : undefined;
  } while (cursor);
  return out.sort(byId('key'));
}

function auditRow(project, i, time) {
  return {
    request_id: `req_arch_${String(i).padStart(5, '0')}_${crypto.randomBytes(3).toString('hex')}`,
    time,
    method: ['GET', 'POST'][i % 2],
    path: `/archived/${i}`,
    status: [200, 201, 404, 503][i % 4],
    response_bytes: i % 3 === 0 ? null : 100 + i,
    response_time_ms: i % 50,
    client_ip: '203.0.113.7',
    user_agent: 'archive-test',
    key_prefix: 'pgk_abcd1234',
    project,
    idempotency_key: i % 2 ? `idem-${i}` : null,
    replayed: i % 5 === 0,
    rate_limit_remaining: i % 7 === 0 ? null : 5000 - i,
    origin: i % 3 ? 'default' : null,
    would_refuse: i % 11 === 0 ? 'minute' : null,
  };
}

/** Delivery records (each with two attempts) created at `t0 + i`: the import batch and the lines expected. */
function deliveryRecords(project, t0, n, tag) {
  const batch = [];
  const expected = [];
  for (let i = 0; i < n; i++) {
    const at = t0 + i * 7;
    const ev = `evt_${tag}_${String(i).padStart(5, '0')}`;
    const dlv = `dlv_${tag}_${String(i).padStart(5, '0')}`;
    const url = `https://hooks.example/${tag}`;
    const attempts = [1, 2].map((a) => ({
      delivery_id: dlv, request_id: `req_${tag}_${i}_${a}`, attempt: a, url,
      status_code: a === 1 ? 503 : 200, error: a === 1 ? 'origin said 503' : null,
      response_excerpt: a === 1 ? 'busy' : 'ok', duration_ms: 10 + a, at: at + a, next_retry_at: a === 1 ? at + 2 : null,
    }));
    const delivery = {
      id: dlv, event_id: ev, event_type: 'order.paid', subscription_id: 'sub_archive', url, status: 'delivered',
      attempts_made: 2, next_attempt_at: null, created_at: at, updated_at: at + 2, queued_at: at, manual: 0,
    };
    batch.push({ event: { id: ev, event_type: 'order.paid', payload: '{}', created_at: at, request_id: `req_pub_${tag}_${i}` }, deliveries: [delivery], attempts });
    expected.push({
      id: dlv, project, event_id: ev, event_type: 'order.paid', subscription_id: 'sub_archive', url, status: 'delivered',
      attempts_made: 2, next_attempt_at: null, created_at: at, updated_at: at + 2, request_id: `req_pub_${tag}_${i}`,
      attempts: attempts.map(({ delivery_id, ...a }) => a),
    });
  }
  return { batch, expected };
}

async function importAll(shard, batch) {
  for (let i = 0; i < batch.length; i += 100) await importRecords(gw, shard, batch.slice(i, i + 100));
}

/** POST /exports, then GET until done; the final answer. */
async function exportRange(body) {
  const created = await gw.admin('POST', '/_postguard/v1/exports', body, { headers: { 'idempotency-key': crypto.randomUUID() } });
  assert.equal(created.status, 202, show(created));
  assert.match(created.json.id, /^exp_[0-9A-Z]{26}$/);
  let last;
  await poll(async () => {
    last = await gw.admin('GET', `/_postguard/v1/exports/${created.json.id}`);
    assert.equal(last.status, 200, show(last));
    assert.notEqual(last.json.state, 'failed', show(last));
    return last.json.state === 'done';
  }, { timeout: 60000, interval: 100, message: 'the export is done' });
  assert.equal(last.json.id, created.json.id);
  return last.json;
}

async function download(url) {
  const res = await fetch(new URL(url, gw.url));
  return { status: res.status, type: res.headers.get('content-type'), body: Buffer.from(await res.arrayBuffer()) };
}

/** A URL signed as the worker signs it (the key derived from ADMIN_TOKEN), for any expiry. */
function signedUrl(id, expires) {
  const key = crypto.createHmac('sha256', 'postguard export url v1').update(ADMIN_TOKEN).digest();
  const sig = crypto.createHmac('sha256', key).update(`${id}\0${expires}`).digest('base64url');
  return `/_postguard/v1/exports/${id}/download?expires=${expires}&sig=${sig}`;
}

describe('the archive before retention, and exports', () => {
  it('archives a past day, drops only what it verified, exports it with the live rows and serves every row back', async (t) => {
    const project = uniq('arch');
    const now = Date.now();
    const day = dayStart(now) - 3 * DAY_MS;
    const date = isoDate(day);

    // A past day: 1,200 audit rows in its bucket, 700 delivery records with their attempts in its shard.
    const shard = { project, start_ms: day, end_ms: day + DAY_MS };
    const written = Array.from({ length: 1200 }, (_, i) => auditRow(project, i, day + 1000 + i * 11));
    await enter(gw, [shard]);
    for (let i = 0; i < written.length; i += 200) await ingest(gw, shard, written.slice(i, i + 200));
    const past = deliveryRecords(project, day + 5000, 700, `a${crypto.randomBytes(2).toString('hex')}`);
    await importAll({ project, start_ms: day }, past.batch);
    // Today (live, kept by retention 0): delivery records in the current shard.
    const live = deliveryRecords(project, dayStart(now) + 10, 40, `l${crypto.randomBytes(2).toString('hex')}`);
    await importAll({ project, start_ms: dayStart(now) }, live.batch);

    const started = performance.now();
    await (await gw.mf.getWorker()).scheduled(CRON);
    const archivedMs = performance.now() - started;

    // Retention dropped the past day's shards, and only those.
    assert.deepEqual((await auditDirectory(gw, project)).map((s) => s.start_ms), [], 'the audit bucket was dropped');
    assert.deepEqual((await webhookDirectory(gw, project)).map((s) => s.start_ms), [dayStart(now)], 'only the current shard is left');

    // The objects, their manifests, and every line.
    const objects = await listed(project);
    assert.deepEqual(objects.map((o) => o.key), [
      `archive/${project}/audit/${date}.manifest.json`,
      `archive/${project}/audit/${date}.ndjson.gz`,
      `archive/${project}/deliveries/${date}.manifest.json`,
      `archive/${project}/deliveries/${date}.ndjson.gz`,
    ]);
    let archivedBytes = 0;
    for (const [kind, expected] of [['audit', written], ['deliveries', past.expected]]) {
      const gz = await objectBytes(`archive/${project}/${kind}/${date}.ndjson.gz`);
      const manifest = JSON.parse((await objectBytes(`archive/${project}/${kind}/${date}.manifest.json`)).toString('utf8'));
      assert.equal(manifest.format, 1);
      assert.equal(manifest.project, project);
      assert.equal(manifest.kind, kind);
      assert.equal(manifest.date, date);
      assert.equal(manifest.object, `archive/${project}/${kind}/${date}.ndjson.gz`);
      assert.equal(manifest.rows, expected.length, `${kind}: the manifest counts every row`);
      assert.equal(manifest.bytes, gz.length, `${kind}: the manifest's size is the object's`);
      assert.equal(manifest.sha256, sha256(gz), `${kind}: the manifest's SHA-256 is the object's`);
      assert.deepEqual(manifest.sources, [{ source: `shard/${day}`, rows: expected.length }]);
      const got = lines(gz);
      assert.equal(got.length, expected.length);
      const key = kind === 'audit' ? 'request_id' : 'id';
      assert.deepEqual([...got].sort(byId(key)), [...expected].sort(byId(key)), `${kind}: every line is the row written`);
      assert.ok(!zlib.gunzipSync(gz).toString('utf8').includes('whsec_'), 'no subscription secret');
      archivedBytes += gz.length;
    }

    // A re-run writes nothing new.
    await (await gw.mf.getWorker()).scheduled(CRON);
    assert.deepEqual(await listed(project), objects, 'the same objects, not rewritten');

    // An export of the archived day and today: archived and live rows alike, each once.
    const t0 = performance.now();
    const done = await exportRange({ project, kind: 'deliveries', since: new Date(day).toISOString(), until: now + 60_000 });
    const got = await download(done.url);
    const roundTripMs = performance.now() - t0;
    assert.equal(got.status, 200);
    assert.equal(got.type, 'application/gzip');
    assert.equal(done.bytes, got.body.length, 'bytes is the gzip size');
    const exported = lines(got.body);
    const all = [...past.expected, ...live.expected];
    assert.equal(done.rows, all.length);
    assert.deepEqual(exported.sort(byId('id')), all.sort(byId('id')), 'every delivery record, archived or live');

    const audit = await exportRange({ project, kind: 'audit', since: day, until: day + DAY_MS });
    const auditRows = lines((await download(audit.url)).body);
    assert.equal(audit.rows, written.length);
    assert.deepEqual(auditRows.sort(byId('request_id')), [...written].sort(byId('request_id')), 'every audit row');

    // since inclusive, until exclusive.
    const edge = written[10].time;
    const part = await exportRange({ project, kind: 'audit', since: edge, until: written[20].time });
    const partRows = lines((await download(part.url)).body).map((r) => r.request_id).sort();
    assert.deepEqual(partRows, written.slice(10, 20).map((r) => r.request_id).sort());

    const rows = written.length + past.expected.length;
    t.diagnostic(`figure: archive round trip: ${rows} rows (${written.length} audit rows, ${past.expected.length} delivery records with 2 attempts each), ${archivedBytes} bytes gzip archived in ${Math.round(archivedMs)} ms (write, read back, verify, drop)`);
    t.diagnostic(`figure: export round trip: ${done.rows} delivery records (${past.expected.length} archived + ${live.expected.length} live), ${done.bytes} bytes gzip, POST → done → signed download in ${Math.round(roundTripMs)} ms`);

    // The signature: tampered, expired, missing — refused; the download is audited without it.
    const url = new URL(done.url, gw.url);
    const sig = url.searchParams.get('sig');
    const tampered = new URL(url);
    tampered.searchParams.set('sig', (sig[0] === 'A' ? 'B' : 'A') + sig.slice(1));
    problem(await gw.fetch(tampered.pathname + tampered.search), { status: 403, code: 'FORBIDDEN' });
    const later = new URL(url);
    later.searchParams.set('expires', String(Number(url.searchParams.get('expires')) + 1));
    problem(await gw.fetch(later.pathname + later.search), { status: 403, code: 'FORBIDDEN' });
    const otherId = await gw.fetch(url.pathname.replace(done.id, audit.id) + url.search);
    problem(otherId, { status: 403, code: 'FORBIDDEN' });
    const expired = await gw.fetch(signedUrl(done.id, Date.now() - 1000));
    problem(expired, { status: 403, code: 'FORBIDDEN' });
    assert.match(expired.json.detail, /expired/, 'a valid signature past its expiry');
    assert.equal((await download(signedUrl(done.id, Date.now() + 60_000))).status, 200, 'the derivation the test uses is the worker\'s');
    problem(await gw.fetch(url.pathname), { status: 403, code: 'FORBIDDEN' });
    assert.ok(Number(url.searchParams.get('expires')) - Date.now() <= 15 * 60_000, 'valid 15 minutes');

    const audited = await poll(async () => {
      const r = (await projectRows(gw, '~none')).filter((x) => x.path === `/_postguard/v1/exports/${done.id}/download`);
      return r.length >= 5 && r;
    }, { timeout: 20000, message: 'the downloads are audited' });
    assert.ok(audited.some((r) => r.status === 200) && audited.some((r) => r.status === 403));
    for (const r of audited) assert.ok(!JSON.stringify(r).includes(sig), 'no signature in the audit log');
  });

  it('a day whose object does not match its manifest is not deleted', async () => {
    const project = uniq('arch-bad');
    const day = dayStart(Date.now()) - 5 * DAY_MS;
    const shard = { project, start_ms: day, end_ms: day + DAY_MS };
    await enter(gw, [shard]);
    await ingest(gw, shard, [auditRow(project, 1, day + 5)]);
    const date = isoDate(day);
    const bucket = await archiveBucket();
    // A manifest listing the bucket, over an object that is not the one it describes.
    await bucket.put(`archive/${project}/audit/${date}.ndjson.gz`, zlib.gzipSync('{"x":1}\n'));
    await bucket.put(`archive/${project}/audit/${date}.manifest.json`, JSON.stringify({
      format: 1, project, kind: 'audit', date, object: `archive/${project}/audit/${date}.ndjson.gz`, rows: 1, bytes: 1,
      sha256: '0'.repeat(64), sources: [{ source: `shard/${day}`, rows: 1 }], updated_at: 0,
    }));
    await (await gw.mf.getWorker()).scheduled(CRON);
    assert.deepEqual((await auditDirectory(gw, project)).map((s) => s.start_ms), [day], 'the bucket is kept');
  });

  it('an export of a live range reads the live shards the same way', async () => {
    const project = uniq('arch-live');
    const { key } = await gw.createKey({ project, plan: 'big' });
    const since = Date.now();
    const ids = [];
    for (let i = 0; i < 12; i++) {
      const r = await gw.fetch(`/live/${i}`, { headers: bearer(key) });
      ids.push(r.headers['x-request-id']);
    }
    await poll(async () => (await projectRows(gw, project)).length >= ids.length, { timeout: 20000, message: 'the audit rows are written' });
    const done = await exportRange({ project, kind: 'audit', since, until: Date.now() + 60_000 });
    const rows = lines((await download(done.url)).body);
    assert.deepEqual(rows.map((r) => r.request_id).sort(), [...ids].sort());
    assert.ok(rows.every((r) => r.project === project && r.path.startsWith('/live/')));
  });

  it('bad export requests are 400 problems; an unknown export is 404; only the operator may export', async () => {
    const bad = [
      [], 'nope', { project: 'p', kind: 'audit', since: 10 }, { project: 'p', kind: 'logs', since: 0, until: 1 },
      { project: 'p', kind: 'audit', since: 5, until: 5 }, { project: 'a b', kind: 'audit', since: 0, until: 1 },
      { project: 'p', kind: 'audit', since: 0, until: 1, extra: 1 }, { project: 'p', kind: 'audit', since: 0, until: 401 * DAY_MS },
    ];
    for (const body of bad) {
      const res = await gw.admin('POST', '/_postguard/v1/exports', body, { headers: { 'idempotency-key': crypto.randomUUID() } });
      problem(res, { status: 400, code: 'VALIDATION_ERROR' });
    }
    problem(await gw.admin('GET', '/_postguard/v1/exports/exp_00000000000000000000000000'), { status: 404, code: 'NOT_FOUND' });
    problem(await gw.admin('GET', '/_postguard/v1/exports/nope'), { status: 404, code: 'NOT_FOUND' });
    const { key } = await gw.createKey({ project: uniq('arch-key'), plan: 'big' });
    const res = await gw.admin('POST', '/_postguard/v1/exports', { project: 'p', kind: 'audit', since: 0, until: 1 }, { token: key });
    assert.equal(res.status, 403, show(res));
  });
});
