// GET /_postguard/v1/openapi.json against the real built worker under Miniflare: the document
// is a static asset (scripts/openapi-asset.mjs) that the worker reads through the ASSETS
// binding and answers itself (ADR 0030), so the answer is the source document minified, with
// the worker's headers and an audit row, never the assets layer's own answer.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startOrigin } from './support/origin.mjs';
import { startGateway, poll, problem, bearer, ROOT, ADMIN_TOKEN, REQUEST_ID_RE } from './support/gateway.mjs';

const DOC_PATH = '/_postguard/v1/openapi.json';
const SOURCE = JSON.parse(fs.readFileSync(path.join(ROOT, 'openapi', 'openapi.json'), 'utf8'));

let origin;
let gw;

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url });
});
after(async () => {
  await gw?.dispose();
  await origin?.kill();
});

async function rowOf(requestId) {
  return poll(async () => {
    const r = await gw.fetch(`/_postguard/v1/audit?request_id=${requestId}`, { headers: bearer(ADMIN_TOKEN) });
    assert.equal(r.status, 200, r.text);
    return r.json.data[0];
  }, { timeout: 5000, message: `the audit row of ${requestId}` });
}

describe('GET /_postguard/v1/openapi.json', () => {
  it('answers the source document, minified, with the worker\'s headers', async () => {
    const res = await gw.fetch(DOC_PATH);
    assert.equal(res.status, 200);
    assert.deepEqual(res.json, SOURCE);
    assert.equal(res.text, JSON.stringify(SOURCE), 'minified, in the source\'s key order');
    assert.equal(res.headers['content-type'], 'application/json');
    assert.equal(res.headers['cache-control'], 'public, max-age=300');
    assert.match(res.headers['x-request-id'], REQUEST_ID_RE, 'answered by the worker, not the assets layer');
    assert.equal(res.headers['content-security-policy'], undefined, 'no dashboard asset headers');
  });

  it('writes one audit row, without a project', async () => {
    const res = await gw.fetch(DOC_PATH);
    const row = await rowOf(res.headers['x-request-id']);
    assert.equal(row.method, 'GET');
    assert.equal(row.path, DOC_PATH);
    assert.equal(row.status, 200);
    assert.equal(row.response_bytes, res.body.length);
    assert.equal(row.project, null);
  });

  it('a deployment without the asset answers 500 problem+json from the worker', async () => {
    const empty = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-no-assets-'));
    const broken = await startGateway({ originUrl: origin.url, patchOptions: (o) => { o.assets.directory = empty; } });
    try {
      const res = await broken.fetch(DOC_PATH);
      problem(res, { status: 500, code: 'INTERNAL_ERROR' });
      assert.match(res.headers['x-request-id'], REQUEST_ID_RE);
    } finally {
      await broken.dispose();
      fs.rmSync(empty, { recursive: true, force: true });
    }
  });
});
