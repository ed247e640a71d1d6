// Security and reliability round 4 (issue 32; docs/security.md) end to end on the real built worker
// under Miniflare (and, for bodies, under `wrangler dev`), against a real origin and real receivers.
// One `describe` per item of the issue; each test failed on the gateway before this round:
//  1. a rerolled-away secret stays dead;            2. a large answer on an event route runs once;
//  3. operations end, they never loop;              4. a revoked key's operation stops;
//  5. a valid key is never refused by the limit on requests without one, which counts every
//     anonymous refusal, IPv6 per /64, and leaves no object behind;
//  6. no object is made for an id the caller names, and GET /operations reads only keys that hold
//     operations;                                   7. every number field is bounded;
//  8. one send per delivery attempt;                9. portal sessions need a live key;
// 12. a 256 MiB body to any endpoint gets its 413 under wrangler dev.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { stringify as tomlStringify } from 'smol-toml';
import { startOrigin } from './support/origin.mjs';
import { receiverPool } from './support/receiver.mjs';
import {
  startGateway, problem, poll, cfg, bearer, loadWranglerToml, freePort, ROOT, ADMIN_TOKEN, ORIGIN_TOKEN,
  ORIGIN_SIGNING_SECRET,
} from './support/gateway.mjs';
import { uniq, stays } from './support/util.mjs';

const MiB = 1 << 20;
const CONFIG = {
  origin: { timeout_ms: 20000 },
  idempotency: { lease_s: 30, methods: { POST: 'required', PUT: 'optional' } },
  async: { routes: [{ method: 'POST', path: '/reports/*' }], timeout_ms: 20000, requeue_after_s: 2 },
  events_from_responses: [{ method: 'POST', path: '/big/*', status: '2xx', type: 'big.made', data: 'body' }],
  webhooks: { schedule_s: [2, 2, 2, 2], timeout_ms: 5000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  plans: { big: { requests_per_window: 100000 }, spent: { requests_per_window: 1, window_s: 3600 } },
  limits: { unauthenticated_per_minute: 10 },
};

let origin;
let gw;
let persistDir;
const receiver = receiverPool();
const delay = (ms) => new Promise((r) => setTimeout(r, ms));
const api = (method, p, token, body, headers = {}) => gw.admin(method, p, body, { token, headers });
const sha256 = (s) => crypto.createHash('sha256').update(s).digest('hex');

before(async () => {
  persistDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-round4-'));
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, persistDir, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await receiver.closeAll();
  await gw?.dispose();
  await origin?.kill();
  fs.rmSync(persistDir, { recursive: true, force: true });
});

async function project(tag, plan = 'big', extra = {}) {
  const name = uniq(tag);
  const res = await api('POST', '/_postguard/v1/keys', ADMIN_TOKEN, { project: name, plan, ...extra });
  assert.equal(res.status, 201, res.text);
  return { name, key: res.json.key, id: res.json.id, prefix: res.json.prefix };
}

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
/** A ULID of `ms` with random bits: what the gateway's ids carry. */
function ulid(ms = Date.now()) {
  let t = '';
  for (let i = 0, v = ms; i < 10; i++, v = Math.floor(v / 32)) t = CROCKFORD[v % 32] + t;
  let r = '';
  for (const b of crypto.randomBytes(16)) r += CROCKFORD[b % 32];
  return t + r;
}

const executions = (idem) => origin.stats.requests.filter((r) => r.idempotency_key === idem).length;

/** Every SQLite file Miniflare keeps for one Durable Object class (one file per object). */
function objectFiles(className) {
  const out = [];
  const walk = (dir) => {
    if (!fs.existsSync(dir)) return;
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.sqlite') && p.includes(`${path.sep}do${path.sep}`) && p.includes(className)) out.push(p);
    }
  };
  walk(persistDir);
  return out;
}

/** The tables of an object's database that hold rows. */
function tablesWithRows(file) {
  const db = new DatabaseSync(file, { readOnly: true });
  try {
    const names = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '\\_%' ESCAPE '\\' AND name NOT LIKE 'sqlite_%'").all().map((r) => r.name);
    return names.filter((n) => db.prepare(`SELECT COUNT(*) AS n FROM "${n}"`).get().n > 0);
  } finally {
    db.close();
  }
}

describe('1. a rerolled-away secret stays dead', () => {
  for (const grace of [0, 3]) {
    it(`three rerolls with grace ${grace} s: every earlier secret is refused from its end on, the newest works`, async () => {
      const k = await project(`reroll-${grace}`);
      const secrets = [k.key];
      const ends = [];
      for (let i = 0; i < 3; i++) {
        const res = await api('POST', `/_postguard/v1/keys/${k.id}/reroll`, ADMIN_TOKEN, { grace_s: grace });
        assert.equal(res.status, 201, res.text);
        secrets.push(res.json.key);
        ends.push(res.json.previous_expires_at);
      }
      // Each refusal counts against the sender's address (item 5): a fresh one per request here.
      let n = 0;
      const at = () => ({ 'cf-connecting-ip': `198.18.${grace}.${++n}` });
      const me = (key) => gw.fetch('/_postguard/v1/me', { headers: { ...bearer(key), ...at() } });
      // Wait until every earlier secret's grace is over.
      await delay(Math.max(0, ends[2] - Date.now()) + 100);
      // Before this round the first secret came back after the second reroll.
      for (let round = 0; round < 3; round++) {
        for (const [i, s] of secrets.slice(0, 3).entries()) {
          const r = await me(s);
          assert.equal(r.status, 401, `secret ${i} (round ${round}): ${r.text}`);
          assert.match(r.json.code, /^(API_KEY_EXPIRED|INVALID_API_KEY)$/);
        }
        assert.equal((await me(secrets[3])).status, 200, 'the newest secret works');
        assert.equal((await gw.fetch('/orders', { method: 'POST', headers: { ...bearer(secrets[0]), ...at(), 'idempotency-key': uniq('i') } })).status, 401);
      }
      // Their KV records go: each expires in KV an hour after its end (at least a minute away).
      const kv = await gw.mf.getKVNamespace('API_KEYS');
      for (const s of secrets.slice(0, 3)) {
        const { keys } = await kv.list({ prefix: `h:${sha256(s)}` });
        assert.equal(keys.length, 1);
        assert.ok(Number.isInteger(keys[0].expiration), `an ended secret's record expires: ${JSON.stringify(keys[0])}`);
        assert.ok(keys[0].expiration * 1000 <= Math.max(...ends) + 3_600_000 + 2000, 'within an hour of its end');
      }
      const { keys: live } = await kv.list({ prefix: `h:${sha256(secrets[3])}` });
      assert.equal(live[0].expiration, undefined, 'the live secret never expires');
    });
  }
});

describe('2. a large answer on an event route runs once and publishes nothing', () => {
  for (const [label, bytes] of [['1.5 MiB', 1.5 * MiB], ['2.5 MiB', 2.5 * MiB], ['40 MiB', 40 * MiB]]) {
    it(`a chunked ${label} answer: one execution, retries replay it byte for byte, no event`, async () => {
      const p = await project(`big-${label.replace(/\W/g, '')}`);
      const idem = uniq('big');
      const post = () => gw.fetch('/big/orders', {
        method: 'POST',
        headers: { ...bearer(p.key), 'idempotency-key': idem, 'content-type': 'application/json', 'x-demo-chunked-json-bytes': String(bytes) },
        body: '{"n":1}',
      });
      const first = await post();
      assert.equal(first.status, 201, first.text?.slice(0, 200));
      assert.equal(first.body.length, bytes);
      const firstSha = sha256(first.body);
      // Retries: 409 while R2 takes the rest, then the stored answer (never a second run).
      const replay = await poll(async () => {
        const r = await post();
        assert.ok([201, 409].includes(r.status), `${r.status} ${r.text?.slice(0, 200)}`);
        return r.status === 201 && r;
      }, { timeout: 60000, interval: 500, message: 'the answer replayed' });
      assert.equal(replay.headers['idempotent-replayed'], 'true');
      assert.equal(sha256(replay.body), firstSha, 'byte for byte');
      await delay(12000 - (Date.now() - first.at) > 0 ? 2000 : 0);
      assert.equal((await post()).status, 201);
      assert.equal(executions(idem), 1, 'one execution at the origin');
      await stays(async () => {
        const feed = await api('GET', '/_postguard/v1/events', p.key);
        return feed.status === 200 && feed.json.data.length === 0;
      }, 2500, 'an answer kept in R2 publishes no event');
    });
  }

  it('an answer kept inline still publishes its event, once (the rule works)', async () => {
    const p = await project('big-small');
    const idem = uniq('small');
    const post = () => gw.fetch('/big/orders', {
      method: 'POST',
      headers: { ...bearer(p.key), 'idempotency-key': idem, 'content-type': 'application/json', 'x-demo-chunked-json-bytes': String(4096) },
      body: '{"n":1}',
    });
    assert.equal((await post()).status, 201);
    assert.equal((await post()).headers['idempotent-replayed'], 'true');
    const feed = await poll(async () => {
      const f = await api('GET', '/_postguard/v1/events', p.key);
      return f.json.data.length > 0 && f;
    }, { message: 'the response event' });
    assert.equal(feed.json.data.length, 1);
    assert.equal(feed.json.data[0].type, 'big.made');
  });
});

/** An operation's state as GET shows it. */
async function operation(key, id) {
  const r = await gw.fetch(`/_postguard/v1/operations/${id}`, { headers: bearer(key) });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

const asyncPost = (g, key, p, idem, headers = {}, body = '{"report":"q3"}') => g.fetch(p, {
  method: 'POST',
  headers: { ...bearer(key), 'content-type': 'application/json', prefer: 'respond-async', 'idempotency-key': idem, ...headers },
  body,
});

describe('3. operations end; they never loop', () => {
  let big;
  let bigOrigin;
  before(async () => {
    bigOrigin = await startOrigin();
    // The documented maximum of max_stored_body_bytes: answers up to 16 MiB kept in the object.
    const c = {
      ...CONFIG,
      idempotency: { ...CONFIG.idempotency, max_stored_body_bytes: 16 * MiB },
      async: { ...CONFIG.async, routes: [...CONFIG.async.routes, { method: 'POST', path: '/big/*' }] },
    };
    big = await startGateway({ originUrl: bigOrigin.url, vars: { POSTGUARD_CONFIG: cfg(c) } });
  });
  after(async () => {
    await big?.dispose();
    await bigOrigin?.kill();
  });

  for (const [label, route] of [['', '/reports/q3'], [' on an event route', '/big/q3']]) {
  it(`a 16 MiB answer${label} with max_stored_body_bytes at 16 MiB: the operation ends once, one execution`, async () => {
    const k = await big.createKey({ project: uniq('op16'), plan: 'big' });
    const idem = uniq('op16');
    const res = await asyncPost(big, k.key, route, idem, { 'x-demo-chunked-json-bytes': String(16 * MiB) });
    assert.equal(res.status, 202, res.text);
    const id = res.json.id;
    const get = async () => (await big.fetch(`/_postguard/v1/operations/${id}`, { headers: bearer(k.key) })).json;
    const done = await poll(async () => {
      const op = await get();
      return ['succeeded', 'failed'].includes(op.state) && op;
    }, { timeout: 90000, interval: 500, message: 'the operation ends' });
    if (done.state === 'failed') assert.equal(done.reason, 'not_kept', JSON.stringify(done));
    await stays(async () => {
      const op = await get();
      const runs = bigOrigin.stats.requests.filter((r) => r.idempotency_key === idem).length;
      return op.state === done.state && op.attempts === 1 && runs === 1;
    }, 6000, 'one attempt, one execution, and it stays done');
    const result = await big.fetch(`/_postguard/v1/operations/${id}/result`, { headers: bearer(k.key) });
    if (done.state === 'succeeded') {
      assert.equal(result.status, 201);
      assert.equal(result.body.length, 16 * MiB);
    } else {
      problem(result, { status: 410, code: 'OPERATION_ABANDONED' });
    }
    // An event from a 16 MiB answer would carry 16 MiB of data: none is published.
    const feed = await big.fetch('/_postguard/v1/events', { headers: bearer(k.key) });
    assert.deepEqual(feed.json.data.filter((e) => e.type === 'big.made'), []);
  });
  }

  it('a request body gone from R2 ends the operation failed (body_missing), with nothing sent again', async () => {
    const k = await project('op-missing');
    const idem = uniq('missing');
    await fetch(`${origin.url}/__demo/script`, { method: 'POST', body: JSON.stringify({ key: idem, statuses: [503, 503, 503, 503, 503] }) });
    // A body over max_stored_body_bytes (1 MiB): kept in R2.
    const body = JSON.stringify({ pad: 'x'.repeat(1.2 * MiB) });
    const res = await asyncPost(gw, k.key, '/reports/q4', idem, {}, body);
    assert.equal(res.status, 202, res.text);
    await poll(async () => (await operation(k.key, res.json.id)).attempts >= 1 && executions(idem) === 1, { timeout: 30000, message: 'attempt 1 ran' });
    const bucket = await gw.mf.getR2Bucket('REPLAYS');
    const listed = await bucket.list({ prefix: `operations/${k.id}/` });
    const request = listed.objects.filter((o) => o.key.endsWith('/request'));
    assert.equal(request.length, 1, JSON.stringify(listed.objects.map((o) => o.key)));
    await bucket.delete(request[0].key);
    const op = await poll(async () => {
      const o = await operation(k.key, res.json.id);
      return o.state === 'failed' && o;
    }, { timeout: 30000, message: 'the operation fails' });
    assert.equal(op.reason, 'body_missing');
    await stays(async () => executions(idem) === 1 && (await operation(k.key, res.json.id)).state === 'failed', 5000, 'nothing sent again');
  });
});

describe('4. a revoked key’s operation stops before its next origin call', () => {
  it('revoked after attempt 1 of an origin answering 503: failed (key_revoked), one origin call', async () => {
    const k = await project('op-revoked');
    const idem = uniq('revoked');
    await fetch(`${origin.url}/__demo/script`, { method: 'POST', body: JSON.stringify({ key: idem, statuses: [503, 503, 503, 503, 503] }) });
    const res = await asyncPost(gw, k.key, '/reports/q5', idem);
    assert.equal(res.status, 202, res.text);
    await poll(async () => executions(idem) === 1, { timeout: 30000, message: 'attempt 1' });
    assert.equal((await api('DELETE', `/_postguard/v1/keys/${k.id}`, ADMIN_TOKEN)).status, 204);
    // The project reads its operations with another key (the revoked one is refused).
    const other = await api('POST', '/_postguard/v1/keys', ADMIN_TOKEN, { project: k.name, plan: 'big' });
    const op = await poll(async () => {
      const o = await operation(other.json.key, res.json.id);
      return o.state === 'failed' && o;
    }, { timeout: 30000, message: 'the operation ends' });
    assert.equal(op.reason, 'key_revoked');
    await stays(async () => executions(idem) === 1, 5000, 'no more signed calls for the revoked key');
    problem(await gw.fetch(`/_postguard/v1/operations/${res.json.id}/result`, { headers: bearer(other.json.key) }), { status: 410, code: 'OPERATION_ABANDONED' });
  });
});

describe('5. the limit on requests without a credential', () => {
  let ip = 20;
  const newIp = () => `203.0.113.${ip++}`;
  const madeUp = () => `pgk_${crypto.randomBytes(32).toString('base64url')}`;
  const from = (addr, p, token, init = {}) => gw.fetch(p, { ...init, headers: { ...(token ? bearer(token) : {}), 'cf-connecting-ip': addr, ...(init.headers ?? {}) } });

  it('a key created after its address was blocked is never refused by it', async () => {
    const addr = newIp();
    const statuses = [];
    for (let i = 0; i < 12; i++) statuses.push((await from(addr, '/orders', madeUp())).status);
    assert.deepEqual(statuses, [...Array(10).fill(401), 429, 429]);
    const k = await project('blocked-addr');
    for (let i = 0; i < 3; i++) {
      const r = await from(addr, '/orders', k.key);
      assert.equal(r.status, 200, `a valid key from a blocked address: ${r.text}`);
    }
    assert.equal((await from(addr, '/orders', madeUp())).status, 429, 'strangers still are');
  });

  it('expired keys, anonymous 404s and bad export signatures count', async () => {
    const expired = await project('expired', 'big', { expires_at: Date.now() + 1500 });
    await delay(1600);
    const addr = newIp();
    const seen = [];
    for (let i = 0; i < 4; i++) seen.push((await from(addr, '/orders', expired.key)).status);
    for (let i = 0; i < 3; i++) seen.push((await from(addr, `/_postguard/v1/nothing-${i}`)).status);
    for (let i = 0; i < 3; i++) seen.push((await from(addr, `/_postguard/v1/exports/exp_${ulid()}/download?expires=1&sig=x`)).status);
    assert.deepEqual(seen.slice(0, 4), [401, 401, 401, 401]);
    assert.ok(seen.slice(4).every((s) => s === 404 || s === 403), `${seen}`);
    problem(await from(addr, '/orders', madeUp()), { status: 429, code: 'RATE_LIMIT_EXCEEDED' });
  });

  it('an IPv6 client is counted per /64', async () => {
    const net = `2001:db8:${crypto.randomBytes(2).toString('hex')}:7`;
    for (let i = 0; i < 10; i++) assert.equal((await from(`${net}::${(i + 1).toString(16)}`, '/orders', madeUp())).status, 401);
    assert.equal((await from(`${net}:ffff:1:2:3`, '/orders', madeUp())).status, 429, 'another address of the same /64');
    assert.equal((await from(`2001:db8:ffff:1::1`, '/orders', madeUp())).status, 401, 'another /64 has its own budget');
  });

  it('no object is left per address once its window is over', async () => {
    const addr = newIp();
    assert.equal((await from(addr, '/orders', madeUp())).status, 401);
    // The address's object, by its name (`ip:<address>`).
    const ns = await gw.mf.getDurableObjectNamespace('KEY_GUARD');
    const id = ns.idFromName(`ip:${addr}`).toString();
    const file = () => objectFiles('KeyGuard').find((f) => path.basename(f) === `${id}.sqlite`);
    assert.ok(file(), 'the address object exists');
    assert.ok(tablesWithRows(file()).includes('meta'), 'it holds its window');
    // The window is a minute; its object forgets everything at its end.
    await poll(async () => !file() || tablesWithRows(file()).length === 0,
      { timeout: 90000, interval: 2000, message: `the address object ${id} emptied after its window` });
  });
});

describe('6. no work per id the caller names', () => {
  it('made-up operation and delivery ids are 404 and create no object', async () => {
    const k = await project('madeup');
    const guards = objectFiles('KeyGuard').length;
    const shards = objectFiles('WebhookShard').length;
    for (let i = 0; i < 20; i++) {
      problem(await gw.fetch(`/_postguard/v1/operations/op_${ulid()}${ulid()}`, { headers: bearer(k.key) }), { status: 404, code: 'NOT_FOUND' });
      // A delivery id names its shard by its time: a day apart, twenty shards named.
      const at = Date.UTC(2026, 0, 1) + i * 86_400_000;
      problem(await gw.fetch(`/_postguard/v1/deliveries/dlv_${ulid(at)}`, { headers: bearer(k.key) }), { status: 404, code: 'NOT_FOUND' });
    }
    assert.equal(objectFiles('KeyGuard').length, guards + 1, 'only the caller’s own key object (its charge)');
    assert.equal(objectFiles('WebhookShard').length, shards, 'no webhook shard');
  });

  it('GET /operations reads only the keys that hold operations, at most 32 a page', async () => {
    const name = uniq('fanout');
    const keys = [];
    for (let i = 0; i < 12; i++) keys.push((await api('POST', '/_postguard/v1/keys', ADMIN_TOKEN, { project: name, plan: 'big' })).json);
    const ops = [];
    for (const k of keys.slice(0, 2)) {
      const r = await asyncPost(gw, k.key, '/reports/fan', uniq('fan'));
      assert.equal(r.status, 202, r.text);
      ops.push(r.json.id);
    }
    // The caller's own object exists (it is charged); then no other is made.
    assert.equal((await gw.fetch('/_postguard/v1/me', { headers: bearer(keys[5].key) })).status, 200);
    const before = objectFiles('KeyGuard').length;
    const list = await gw.fetch('/_postguard/v1/operations', { headers: bearer(keys[5].key) });
    assert.equal(list.status, 200, list.text);
    assert.deepEqual(list.json.data.map((o) => o.id).sort(), [...ops].sort());
    assert.equal(objectFiles('KeyGuard').length, before, 'no object made for the ten keys without operations');
    const one = await gw.fetch(`/_postguard/v1/operations?key=${keys[1].id}`, { headers: bearer(keys[5].key) });
    assert.deepEqual(one.json.data.map((o) => o.id), [ops[1]]);
    const foreign = await project('fanout-other');
    const none = await gw.fetch(`/_postguard/v1/operations?key=${keys[1].id}`, { headers: bearer(foreign.key) });
    assert.deepEqual(none.json.data, [], 'another project’s key lists nothing');
  });

  it('a project whose operations live in more than 32 keys is listed a key at a time', async () => {
    const name = uniq('fanout33');
    for (let i = 0; i < 33; i++) {
      const k = (await api('POST', '/_postguard/v1/keys', ADMIN_TOKEN, { project: name, plan: 'big' })).json;
      assert.equal((await asyncPost(gw, k.key, '/reports/many', uniq('many'))).status, 202);
      if (i === 32) {
        const p = problem(await gw.fetch('/_postguard/v1/operations', { headers: bearer(k.key) }), { status: 400, code: 'VALIDATION_ERROR' });
        assert.match(p.detail, /^key: /);
        const one = await gw.fetch(`/_postguard/v1/operations?key=${k.id}`, { headers: bearer(k.key) });
        assert.equal(one.json.data.length, 1);
      }
    }
  });
});

describe('7. every number field is bounded', () => {
  it('times past 9999 are a 400 naming the field, and nothing is written first', async () => {
    const name = uniq('bounded');
    for (const v of ['18446744073709551615', '9007199254740993', '1e300', '-1', '"10000-01-01T00:00:00Z"']) {
      const body = `{"project":"${name}","plan":"big","expires_at":${v}}`;
      const p = problem(await api('POST', '/_postguard/v1/keys', ADMIN_TOKEN, body), { status: 400, code: 'VALIDATION_ERROR' });
      assert.match(p.detail, /^expires_at: /, v);
    }
    const listed = await api('GET', `/_postguard/v1/keys?project=${name}`, ADMIN_TOKEN);
    assert.deepEqual(listed.json.data, [], 'no key written by a refused create');
    const k = await project('bounded-patch');
    problem(await api('PATCH', `/_postguard/v1/keys/${k.id}`, ADMIN_TOKEN, '{"expires_at":18446744073709551615}'), { status: 400, code: 'VALIDATION_ERROR' });
    problem(await api('POST', `/_postguard/v1/keys/${k.id}/reroll`, ADMIN_TOKEN, '{"grace_s":18446744073709551615}'), { status: 400, code: 'VALIDATION_ERROR' });
    problem(await api('POST', '/_postguard/v1/portal-links', ADMIN_TOKEN, `{"project":"${k.name}","ttl_s":18446744073709551615}`), { status: 400, code: 'VALIDATION_ERROR' });
    const e = problem(await api('POST', '/_postguard/v1/exports', ADMIN_TOKEN, `{"project":"${k.name}","kind":"audit","since":0,"until":18446744073709551615}`), { status: 400, code: 'VALIDATION_ERROR' });
    assert.match(e.detail, /^until: /);
    assert.equal((await gw.fetch('/_postguard/v1/me', { headers: bearer(k.key) })).status, 200, 'the key is as it was');
  });
});

describe('8. one send per delivery attempt', () => {
  it('the same scheduled job handed to the consumer twice at once sends attempt 1 once; the schedule goes on', async () => {
    let n = 0;
    const rcv = await receiver(async () => {
      n += 1;
      await delay(1500);
      return { status: n === 1 ? 500 : 200 };
    });
    const p = await project('dup-job');
    const sub = await api('POST', '/_postguard/v1/webhooks', p.key, { url: rcv.url, events: ['*'] });
    assert.equal(sub.status, 201, sub.text);
    rcv.addSecret(sub.json.secret);
    // Paused while the event is published: its delivery waits, and the test hands its job over.
    assert.equal((await api('POST', `/_postguard/v1/webhooks/${sub.json.id}/pause`, p.key)).status, 200);
    assert.equal((await api('POST', '/_postguard/v1/events', ORIGIN_TOKEN, { project: p.name, type: 'dup.test', data: { n: 1 } })).status, 202);
    const row = await poll(async () => (await api('GET', '/_postguard/v1/deliveries', p.key)).json.data[0], { message: 'the delivery' });
    assert.equal(row.status, 'paused');
    assert.equal((await api('POST', `/_postguard/v1/webhooks/${sub.json.id}/resume`, p.key)).status, 200);
    const pending = await poll(async () => {
      const d = (await api('GET', `/_postguard/v1/deliveries/${row.id}`, p.key)).json;
      return d.status === 'pending' && d;
    }, { message: 'released' });
    const job = { delivery_id: row.id, project: p.name, subscription_id: sub.json.id, not_before: pending.next_attempt_at };
    const worker = await gw.mf.getWorker();
    const copy = () => [{ id: crypto.randomUUID(), timestamp: new Date(), attempts: 1, body: job }];
    await Promise.all([worker.queue('postguard-deliveries', copy()), worker.queue('postguard-deliveries', copy())]);
    const d = await poll(async () => {
      const x = (await api('GET', `/_postguard/v1/deliveries/${row.id}`, p.key)).json;
      return x.status === 'delivered' && x;
    }, { timeout: 40000, message: 'delivered by attempt 2' });
    const numbers = d.attempts.map((a) => a.attempt).sort((a, b) => a - b);
    assert.deepEqual(numbers, [1, 2], `each attempt once in the log: ${JSON.stringify(d.attempts)}`);
    assert.deepEqual(rcv.requests.map((r) => r.attempt).sort(), [1, 2], 'each attempt sent once');
    const [a1, a2] = [...d.attempts].sort((a, b) => a.attempt - b.attempt);
    assert.ok(a2.at >= a1.at + a1.duration_ms + 2000 - 50, 'attempt 2 waited its scheduled delay (2 s)');
  });
});

describe('9. portal sessions need a live key', () => {
  const session = async (name) => {
    const link = await api('POST', '/_postguard/v1/portal-links', ADMIN_TOKEN, { project: name });
    assert.equal(link.status, 201, link.text);
    return api('POST', '/_postguard/v1/portal-sessions', null, { token: link.json.url.split('#portal=')[1] });
  };

  it('a project whose only key has expired opens no session', async () => {
    const k = await project('portal-expired', 'big', { expires_at: Date.now() + 1200 });
    await delay(1300);
    problem(await session(k.name), { status: 401, code: 'UNAUTHORIZED' });
  });

  it('a session ends when the project’s last live key does', async () => {
    const ends = Date.now() + 3000;
    const k = await project('portal-ends', 'big', { expires_at: ends });
    const s = await session(k.name);
    assert.equal(s.status, 201, s.text);
    assert.equal(s.json.expires_at, ends, 'the session ends with the key');
    assert.equal((await api('GET', '/_postguard/v1/audit?limit=1', s.json.session)).status, 200);
    await delay(Math.max(0, ends - Date.now()) + 200);
    problem(await api('GET', '/_postguard/v1/audit?limit=1', s.json.session), { status: 401, code: 'UNAUTHORIZED' });
  });
});

describe('12. a 256 MiB body to any endpoint is answered 413 under wrangler dev', () => {
  let proc;
  let port;
  let dir;
  before(async () => {
    // wrangler dev on the built worker: wrangler.toml without its [build] step (the suite built it).
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-wd-'));
    const toml = loadWranglerToml();
    delete toml.build;
    toml.main = path.join(ROOT, toml.main);
    toml.assets.directory = path.join(ROOT, toml.assets.directory);
    for (const db of toml.d1_databases ?? []) db.migrations_dir = path.join(ROOT, db.migrations_dir);
    fs.writeFileSync(path.join(dir, 'wrangler.toml'), tomlStringify(toml));
    fs.writeFileSync(path.join(dir, '.dev.vars'), [
      `ADMIN_TOKEN=${ADMIN_TOKEN}`, `ORIGIN_TOKEN=${ORIGIN_TOKEN}`, `ORIGIN_SIGNING_SECRET=${ORIGIN_SIGNING_SECRET}`,
      `ORIGIN_URL=${origin.url}`, '',
    ].join('\n'));
    port = await freePort();
    proc = spawn('wrangler', ['dev', '--local', '--ip', '127.0.0.1', '--port', String(port), '--config', path.join(dir, 'wrangler.toml'),
      '--env-file', path.join(dir, '.dev.vars'), '--persist-to', path.join(dir, 'state'), '--show-interactive-dev-session=false'],
    { cwd: dir, detached: true, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, WRANGLER_SEND_METRICS: 'false' } });
    let out = '';
    proc.stdout.on('data', (c) => { out += c; });
    proc.stderr.on('data', (c) => { out += c; });
    await poll(async () => /Ready on/.test(out), { timeout: 120000, interval: 250, message: `wrangler dev ready: ${out.slice(-2000)}` });
  });
  after(async () => {
    if (proc?.pid) {
      try { process.kill(-proc.pid, 'SIGKILL'); } catch { /* gone */ }
    }
    fs.rmSync(dir, { recursive: true, force: true });
  });

  /** Sends 256 MiB chunked to `p` and reads the answer (never a reset, never a 5xx). */
  function upload(p, token) {
    return new Promise((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port, path: p, method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'transfer-encoding': 'chunked' } }, (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, type: res.headers['content-type'], body: Buffer.concat(chunks).toString() }));
      });
      req.on('error', reject);
      // Bounded: a gateway that neither reads nor answers fails the test instead of hanging the suite.
      req.setTimeout(120000, () => req.destroy(new Error(`${p}: no answer within 120 s`)));
      // Paced (a MiB every 5 ms, over a second): the upload is still going when a gateway that
      // stopped reading at the limit answers, as a client on a real network would be.
      const chunk = Buffer.alloc(MiB, 0x61);
      let sent = 0;
      const pump = () => {
        if (sent >= 256) return req.end();
        sent++;
        if (req.write(chunk)) setTimeout(pump, 5);
        else req.once('drain', () => setTimeout(pump, 5));
      };
      pump();
    });
  }

  it('POST /events, /webhooks and /keys with 256 MiB chunked: 413 problem+json each time', async () => {
    const created = await fetch(`http://127.0.0.1:${port}/_postguard/v1/keys`, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_TOKEN}` }, body: JSON.stringify({ project: 'wd', plan: 'trial' }) });
    const key = (await created.json()).key;
    for (let round = 0; round < 3; round++) {
      for (const [p, token] of [['/_postguard/v1/events', ORIGIN_TOKEN], ['/_postguard/v1/webhooks', key], ['/_postguard/v1/keys', ADMIN_TOKEN]]) {
        const r = await upload(p, token);
        assert.equal(r.status, 413, `${p}: ${r.status} ${r.body.slice(0, 200)}`);
        assert.equal(r.type, 'application/problem+json');
        assert.equal(JSON.parse(r.body).code, 'PAYLOAD_TOO_LARGE');
      }
    }
  });
});
