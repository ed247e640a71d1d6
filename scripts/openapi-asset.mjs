// Writes the API document (openapi/openapi.json, the one source of truth) minified into the
// static assets, where the worker reads it through the ASSETS binding to answer
// GET /_postguard/v1/openapi.json itself (ADR 0030). Parsing it here makes an invalid
// document a build failure rather than a broken endpoint (as build.rs did, ADR 0011).
// JSON.parse keeps the document's key order, except that integer-like keys (status codes)
// come out ascending: the document already lists them so.
// Runs after scripts/build-dashboard.mjs, which empties dashboard/dist/.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const source = path.join(root, 'openapi', 'openapi.json');
// The same public path the worker answers; wrangler.toml's run_worker_first sends it to the
// worker first, so the assets layer never serves this file on its own.
const out = path.join(root, 'dashboard', 'dist', '_postguard', 'v1', 'openapi.json');
let doc;
try {
  doc = JSON.parse(fs.readFileSync(source, 'utf8'));
} catch (e) {
  console.error(`openapi/openapi.json: ${e.message}`);
  process.exit(1);
}
const text = JSON.stringify(doc);
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, text);
console.log(`openapi: ${text.length} bytes → ${path.relative(root, out)}`);
