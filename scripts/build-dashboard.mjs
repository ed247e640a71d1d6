// Builds the dashboard (dashboard/) into the Workers static-assets directory
// (dashboard/dist/, `[assets]` in wrangler.toml): a type check, one bundled and
// minified script and stylesheet, the page, and the `_headers` file that gives
// every dashboard response its security headers (ADR 0010).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const src = path.join(root, 'dashboard');
const dist = path.join(src, 'dist');
const out = path.join(dist, '_postguard', 'dashboard');

// No inline script or style, no eval, nothing from elsewhere; Trusted Types
// make any HTML-string sink (innerHTML…) throw, so data can only be text.
const CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self'",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
  "require-trusted-types-for 'script'",
  "trusted-types 'none'",
].join('; ');

const HEADERS = {
  'Content-Security-Policy': CSP,
  'X-Content-Type-Options': 'nosniff',
  'Referrer-Policy': 'no-referrer',
  'X-Frame-Options': 'DENY',
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Resource-Policy': 'same-origin',
  'Permissions-Policy': 'camera=(), microphone=(), geolocation=(), payment=()',
};

execFileSync(path.join(root, 'node_modules', '.bin', 'tsc'), ['-p', path.join(src, 'tsconfig.json')], { stdio: 'inherit' });

fs.rmSync(dist, { recursive: true, force: true });
fs.mkdirSync(out, { recursive: true });
await esbuild.build({
  entryPoints: { app: path.join(src, 'src', 'main.ts'), 'app-style': path.join(src, 'src', 'app.css') },
  outdir: out,
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['es2022'],
  legalComments: 'none',
  logLevel: 'warning',
});
fs.renameSync(path.join(out, 'app-style.css'), path.join(out, 'app.css'));
// The page shows the release it belongs to: the version of the root package.json, which
// the crate, the SDKs and the API document carry too (tests/docs.test.mjs).
const { version } = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
const page = fs.readFileSync(path.join(src, 'index.html'), 'utf8').replaceAll('{{version}}', version);
fs.writeFileSync(path.join(out, 'index.html'), page);
fs.copyFileSync(path.join(src, 'favicon.svg'), path.join(out, 'favicon.svg'));

const rules = Object.entries(HEADERS).map(([k, v]) => `  ${k}: ${v}`).join('\n');
fs.writeFileSync(path.join(dist, '_headers'), `/_postguard/dashboard/*\n${rules}\n`);

let raw = 0;
let gz = 0;
for (const f of fs.readdirSync(out)) {
  const b = fs.readFileSync(path.join(out, f));
  raw += b.length;
  gz += zlib.gzipSync(b, { level: 9 }).length;
}
console.log(`dashboard: ${fs.readdirSync(out).length} files, ${raw} bytes, ${gz} bytes gzip → ${path.relative(root, dist)}`);
