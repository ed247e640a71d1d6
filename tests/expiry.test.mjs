// Expired Idempotency-Key records are deleted from the key's Durable Object by its alarm
// (docs/idempotency.md: "after the TTL the same key starts a new operation"; storage does not grow).
// The object's SQLite file is read straight from Miniflare's persistence directory.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { startOrigin } from './support/origin.mjs';
import { startGateway, poll, bearer, cfg, ORIGIN_TOKEN } from './support/gateway.mjs';

const CONFIG = {
  origin: { timeout_ms: 1000 },
  idempotency: { lease_s: 2, max_stored_body_bytes: 1048576, lookup_grace_s: 0 },
  plans: { short: { requests_per_window: 1000, window_s: 60, idempotency_ttl_s: 2 } },
};

let origin;
let gw;
let persistDir;

before(async () => {
  persistDir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-expiry-'));
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, persistDir, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
  fs.rmSync(persistDir, { recursive: true, force: true });
});

/** Every SQLite file Miniflare keeps for Durable Objects (one per object). */
function objectDatabases() {
  const out = [];
  const walk = (dir) => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.sqlite') && p.includes(`${path.sep}do${path.sep}`)) out.push(p);
    }
  };
  walk(persistDir);
  return out;
}

/** Rows of the idempotency tables across all objects (read-only snapshot). */
function idempotencyRows() {
  let records = 0;
  let chunks = 0;
  for (const file of objectDatabases()) {
    const db = new DatabaseSync(file, { readOnly: true });
    try {
      const tables = new Set(db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all().map((r) => r.name));
      if (tables.has('idem')) records += db.prepare('SELECT COUNT(*) AS n FROM idem').get().n;
      if (tables.has('idem_body')) chunks += db.prepare('SELECT COUNT(*) AS n FROM idem_body').get().n;
    } finally {
      db.close();
    }
  }
  return { records, chunks };
}

describe('alarm expiry', () => {
  it('completed records and their bodies are deleted after the TTL', async () => {
    const key = await gw.createKey({ project: 'exp', plan: 'short' });
    const post = (k, headers = {}) => gw.fetch('/expiring', {
      method: 'POST', headers: { ...bearer(key.key), 'idempotency-key': k, ...headers }, body: 'x',
    });
    // Two stored responses (one with a 600 KiB body: two chunks) …
    const a = crypto.randomUUID();
    const b = crypto.randomUUID();
    assert.equal((await post(a)).status, 201);
    assert.equal((await post(b, { 'x-demo-body-bytes': String(600 * 1024) })).status, 201);
    const stored = idempotencyRows();
    assert.equal(stored.records, 2, 'both responses are stored');
    assert.ok(stored.chunks >= 3, `bodies are stored in chunks (${stored.chunks})`);
    assert.equal((await post(a)).headers['idempotent-replayed'], 'true');

    // … are gone once the TTL has passed, without any further request.
    await poll(() => idempotencyRows().records === 0, { timeout: 10000, interval: 200, message: 'the alarm to delete expired records' });
    assert.equal(idempotencyRows().chunks, 0, 'their bodies too');
    assert.equal(origin.stats.count(a), 1);

    // After expiry the same key starts a new operation.
    const again = await post(a);
    assert.equal(again.status, 201);
    assert.equal(again.headers['idempotent-replayed'], undefined);
    assert.equal(origin.stats.count(a), 2);
  });
});
