// Large responses replay byte for byte (issue 10 §2), the real built worker under Miniflare with
// its real R2 bucket (wrangler.toml [[r2_buckets]]): a body over max_stored_body_bytes streams to
// the client and to R2 at once, replays byte-identical (hash compared), and its object is deleted
// when the record expires. Without R2, or over max_replay_bytes, a retry gets 410
// IDEMPOTENT_REPLAY_UNAVAILABLE and the origin runs once.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { startOrigin } from './support/origin.mjs';
import { startGateway, problem, poll, bearer, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';

const MiB = 1 << 20;
// The record's lifetime: the replay and the bucket listing must both come before it ends. At 3 s
// a loaded machine took longer than that to stream 40 MiB twice, and the object was already gone
// (deleted with its expired record) when the test listed the bucket.
const TTL_S = 15;
const CONFIG = {
  plans: { big: { requests_per_window: 100000, idempotency_ttl_s: TTL_S } },
  idempotency: { lease_s: 30, max_replay_bytes: 64 * MiB, lookup_grace_s: 0 }, // swept at expiry: the test waits for it
  origin: { timeout_ms: 20000 },
};

const sha = (b) => crypto.createHash('sha256').update(b).digest('hex');
const ik = (t) => `${t}-${crypto.randomBytes(6).toString('hex')}`;

let origin;
const gateways = [];

before(async () => {
  origin = await startOrigin({ token: ORIGIN_TOKEN });
});
after(async () => {
  for (const g of gateways) await g.dispose();
  await origin?.kill();
});

async function gateway(opts = {}) {
  const g = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) }, ...opts });
  gateways.push(g);
  const { key } = await g.createKey({ project: 'r2', plan: 'big' });
  const post = (idem, bytes) => g.fetch('/export', {
    method: 'POST',
    headers: { ...bearer(key), 'content-type': 'application/json', 'idempotency-key': idem, 'x-demo-body-bytes': String(bytes) },
    body: '{"n":1}',
  });
  return { g, post };
}

/** The retry once the record is complete (a 409 "in progress" while R2 still receives the body). */
const settled = (post, idem, bytes) => poll(async () => {
  const r = await post(idem, bytes);
  return r.status === 409 ? undefined : r;
}, { timeout: 30000, message: 'the record completed' });

describe('with R2', () => {
  let gw;
  before(async () => {
    gw = await gateway();
  });

  for (const size of [5 * MiB, 40 * MiB]) {
    it(`a ${size / MiB} MiB response replays byte-identical from R2, and its object goes with the record`, async () => {
      const k = ik(`r2-${size}`);
      const first = await gw.post(k, size);
      assert.equal(first.status, 201);
      assert.equal(first.body.length, size);
      const replay = await settled(gw.post, k, size);
      assert.equal(replay.status, 201, replay.text.slice(0, 300));
      assert.equal(replay.headers['idempotent-replayed'], 'true');
      assert.equal(replay.body.length, size);
      assert.equal(sha(replay.body), sha(first.body), 'byte-identical');
      assert.equal(replay.headers['x-origin-execution'], first.headers['x-origin-execution']);
      assert.equal(origin.stats.count(k), 1, 'the origin ran once');
      const bucket = await gw.g.mf.getR2Bucket('REPLAYS');
      const digest = sha(Buffer.from(k));
      const listed = await bucket.list({ prefix: 'replays/' });
      const mine = listed.objects.filter((o) => o.key.includes(`/${digest}/`));
      assert.equal(mine.length, 1, 'one object, keyed by API key and Idempotency-Key');
      assert.equal(mine[0].size, size);
      // The record expires after TTL_S; the object's alarm deletes the body with it.
      await poll(async () => {
        const now = await bucket.list({ prefix: 'replays/' });
        return !now.objects.some((o) => o.key.includes(`/${digest}/`));
      }, { timeout: (TTL_S + 10) * 1000, message: 'the R2 object deleted after expiry' });
      const after = await gw.post(k, size);
      assert.equal(after.headers['idempotent-replayed'], undefined, 'after expiry the key runs afresh');
    });
  }

  it('a response over max_replay_bytes is delivered once; a retry gets 410 IDEMPOTENT_REPLAY_UNAVAILABLE, not a second execution', async () => {
    const k = ik('huge');
    const size = 65 * MiB;
    const first = await gw.post(k, size);
    assert.equal(first.status, 201);
    assert.equal(first.body.length, size);
    const retry = await settled(gw.post, k, size);
    problem(retry, { status: 410, code: 'IDEMPOTENT_REPLAY_UNAVAILABLE' });
    assert.ok(retry.headers['x-ratelimit-remaining'] !== undefined);
    assert.equal(origin.stats.count(k), 1);
  });
});

describe('R2 failing', () => {
  it('without the R2 binding a large response is delivered once, and its retry gets the documented 410', async () => {
    const gw = await gateway({ patchOptions: (o) => { delete o.r2Buckets; } });
    const k = ik('nor2');
    const size = 5 * MiB;
    const first = await gw.post(k, size);
    assert.equal(first.status, 201);
    assert.equal(first.body.length, size);
    const retry = await settled(gw.post, k, size);
    problem(retry, { status: 410, code: 'IDEMPOTENT_REPLAY_UNAVAILABLE' });
    assert.equal(origin.stats.count(k), 1, 'the origin ran once');
    const small = ik('small');
    const s1 = await gw.post(small, 1000);
    const s2 = await gw.post(small, 1000);
    assert.ok(s2.body.equals(s1.body), 'bodies the object keeps still replay without R2');
  });
});
