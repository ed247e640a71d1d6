// The repository stands on its own: the README stays a front door, every link of the
// README and the user guide (docs/) resolves inside the repository, no file points at
// anything outside it, the API reference is the one generated from openapi/openapi.json,
// and the error chapter lists every code the document does.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { render } from '../scripts/api-reference.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));
const read = (p) => readFileSync(join(root, p), 'utf8');
const guide = readdirSync(join(root, 'docs')).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`);

/** Every tracked text file (git knows what belongs to the repository). */
function trackedFiles() {
  const out = execFileSync('git', ['ls-files', '-z'], { cwd: root, encoding: 'utf8' });
  return out.split('\0').filter((f) => /\.(rs|ts|mjs|js|py|md|sql|json|toml|sh|yaml|html|css)$/.test(f));
}

describe('the repository stands on its own', () => {
  it('README.md is a front door of at most 200 lines, with the two commands', () => {
    const readme = read('README.md');
    const lines = readme.split('\n').length;
    assert.ok(lines <= 200, `README.md has ${lines} lines`);
    assert.match(readme, /^bash scripts\/dev\.sh/m);
    assert.match(readme, /^bash scripts\/test\.sh/m);
  });

  it('every relative link of the README and the guide resolves to a file of the repository', () => {
    const broken = [];
    for (const file of ['README.md', ...guide]) {
      for (const [, target] of read(file).matchAll(/\]\(([^)\s]+)\)/g)) {
        if (/^[a-z]+:/i.test(target) || target.startsWith('#')) continue;
        const path = resolve(root, dirname(file), target.split('#')[0]);
        if (!path.startsWith(root) || !existsSync(path)) broken.push(`${file} → ${target}`);
      }
    }
    assert.deepEqual(broken, []);
  });

  it('no file refers to the team contract or anything outside the repository', () => {
    const outside = [];
    for (const f of trackedFiles()) {
      if (f.startsWith('docs/adr/') || f === 'CHANGELOG.md' || f === 'bench/RESULTS.md' || f === 'tests/docs.test.mjs') continue;
      const text = read(f);
      if (/CONTRACT(\.md| §)|\.\.\/shared\//.test(text)) outside.push(f);
    }
    assert.deepEqual(outside, []);
  });

  it('the API reference is the table openapi/openapi.json gives', () => {
    const doc = JSON.parse(read('openapi/openapi.json'));
    const now = read('docs/api-reference.md');
    assert.equal(render(now, doc), now, 'run node scripts/api-reference.mjs');
    const ops = Object.values(doc.paths).flatMap((item) => Object.keys(item).filter((m) => m !== 'parameters'));
    const rows = now.split('\n').filter((l) => /^\| (GET|POST|PUT|PATCH|DELETE) \|/.test(l));
    assert.equal(rows.length, ops.length);
  });

  it('docs/errors.md lists every error code of the API document', () => {
    const codes = JSON.parse(read('openapi/openapi.json')).components.schemas.ErrorCode.enum;
    const errors = read('docs/errors.md');
    const missing = codes.filter((c) => !errors.includes(`\`${c}\``));
    assert.ok(codes.length > 20);
    assert.deepEqual(missing, []);
  });

  it('the crate, the SDKs, the dashboard and the API document carry the release of CHANGELOG.md', () => {
    const { version } = JSON.parse(read('package.json'));
    const toml = (f) => read(f).match(/^version = "([^"]+)"/m)?.[1];
    const carried = {
      'Cargo.toml': toml('Cargo.toml'),
      'crates/postguard-core/Cargo.toml': toml('crates/postguard-core/Cargo.toml'),
      'clients/rust/Cargo.toml': toml('clients/rust/Cargo.toml'),
      'clients/typescript/package.json': JSON.parse(read('clients/typescript/package.json')).version,
      'clients/typescript/src/version.ts': read('clients/typescript/src/version.ts').match(/VERSION = '([^']+)'/)?.[1],
      'clients/python/src/postguard/_version.py': read('clients/python/src/postguard/_version.py').match(/"([^"]+)"/)?.[1],
      'openapi/openapi.json': JSON.parse(read('openapi/openapi.json')).info.version,
    };
    for (const [file, v] of Object.entries(carried)) assert.equal(v, version, file);
    assert.match(read('dashboard/index.html'), /\{\{version\}\}/, 'the page is stamped at build time');
    const released = read('CHANGELOG.md').match(/^## \[(\d+\.\d+\.\d+)\]/m)?.[1];
    assert.equal(released, version, 'the newest release in CHANGELOG.md');
  });

  it('docs/architecture.md names every source file of the shell and the core', () => {
    const layout = read('docs/architecture.md');
    const unnamed = trackedFiles()
      .filter((f) => /^(src|crates\/postguard-core\/src)\/.*\.(rs|mjs)$/.test(f) && !f.endsWith('/tests.rs'))
      .filter((f) => {
        const short = f.replace(/^src\//, '').replace(/^crates\/postguard-core\/src\//, '');
        return !new RegExp(`(^|\\s)${short.replaceAll('.', '\\.')}\\s`, 'm').test(layout);
      });
    assert.deepEqual(unnamed, []);
  });
});
