// The log scan that runs after the e2e suite (scripts/scan-logs.mjs) finds a secret in a
// worker log line, and passes clean logs: checked on logs written here, in a temp dir.
import { it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ROOT, ADMIN_TOKEN } from './support/gateway.mjs';

const KEY = `pgk_${'A'.repeat(43)}`;

function scan(lines) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-scan-'));
  try {
    fs.writeFileSync(path.join(dir, 'secrets-1.txt'), `${KEY}\n`);
    fs.writeFileSync(path.join(dir, 'worker-1.ndjson'), lines.map((message) => `${JSON.stringify({ level: 'error', message })}\n`).join(''));
    return spawnSync(process.execPath, [path.join(ROOT, 'scripts', 'scan-logs.mjs'), '--dir', dir], { encoding: 'utf8' });
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

it('fails on an API key or a fixed token in a log line, naming neither in full', () => {
  for (const leak of [KEY, ADMIN_TOKEN]) {
    const r = scan([JSON.stringify({ level: 'error', msg: 'x', request_id: 'req_1' }), JSON.stringify({ level: 'error', msg: 'oops', error: `Bearer ${leak}` })]);
    assert.equal(r.status, 1, r.stdout + r.stderr);
    assert.match(r.stderr, /1 secrets found/);
    assert.ok(!r.stderr.includes(leak), 'the report does not print the secret');
  }
});

it('passes logs without a secret', () => {
  const r = scan([JSON.stringify({ level: 'warn', msg: 'origin unreachable', request_id: 'req_1', key_prefix: KEY.slice(0, 12) })]);
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /1 postguard JSON lines/);
});
