// The Python SDK (clients/python) against the real stack: this driver starts the demo origin,
// the built worker under Miniflare, the TCP fault proxy and a webhook receiver, then runs the
// SDK's pytest suite (unit + integration) in .tools/py-sdk with their URLs and credentials in
// the environment, and asserts that it passed with nothing skipped. It also builds the package
// (`python -m build` → target/python-dist) so CI proves it builds as published.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startFaultProxy } from './support/fault-proxy.mjs';
import { startGateway, cfg, ROOT, ADMIN_TOKEN, ORIGIN_TOKEN } from './support/gateway.mjs';

const PY = path.join(ROOT, '.tools', 'py-sdk', 'bin', 'python');
const PKG = path.join(ROOT, 'clients', 'python');
const DIST = path.join(ROOT, 'target', 'python-dist');
const FAULT_SEED = 20261201;
const REQUIRED_FROM = '2099-01-01T00:00:00Z';
const CONFIG = {
  plans: {
    // Its gateway policy too: the tests poll the audit log and the delivery log.
    big: { requests_per_window: 100000, window_s: 60, gateway: { requests: 100000, window_s: 60 } },
    // The proactive-mode plan: 10 requests per 5 s.
    small: { requests_per_window: 10, window_s: 5 },
    // Issue 25 item 7's plan: 5 per 5 s, where a fixed reserve of 5 allowed one call per window.
    tiny: { requests_per_window: 5, window_s: 5 },
    // Issue 25: several named policies and a concurrency quota; one request in flight at a time.
    tiered: { policies: [{ name: 'burst', requests: 20, window_s: 1 }, { name: 'minute', requests: 200, window_s: 60 }], concurrency: 2 },
    single: { requests_per_window: 1000, window_s: 60, concurrency: 1 },
  },
  webhooks: { schedule_s: [1, 1, 1, 1], timeout_ms: 2000, allow_insecure_urls: true, allow_hosts: ['127.0.0.1'] },
  origin: { timeout_ms: 10000 },
  // Issue 26: asynchronous operations on /reports/* (request(..., async_=True)).
  async: { routes: [{ method: 'POST', path: '/reports/*' }], timeout_ms: 10000, requeue_after_s: 2 },
  // Issue 34: a POST without an Idempotency-Key is forwarded (and counted by /stats) until then.
  idempotency: { required_from: REQUIRED_FROM },
};

let origin;
let gw;
let proxy;
let receiver;
let captures;
let tmp;

/** Run a command; resolve with {code, out} (stdout+stderr interleaved). Never blocks the loop. */
function run(cmd, args, { env = {}, cwd = ROOT } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (c) => { out += c; });
    child.stderr.on('data', (c) => { out += c; });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, out }));
  });
}

/** GET / → every request the receiver got: [{path, headers, body}] (body as received, UTF-8). */
async function startCaptures(rcv) {
  const server = http.createServer((req, res) => {
    const list = rcv.requests.map((r) => ({ path: r.path, headers: r.headers, body: r.body }));
    const body = JSON.stringify(list);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${server.address().port}/`, close: () => new Promise((r) => server.close(r)) };
}

before(async () => {
  const setup = await run('bash', [path.join(ROOT, 'scripts', 'setup-clients-py.sh')]);
  assert.equal(setup.code, 0, `setup-clients-py.sh failed:\n${setup.out}`);
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-sdk-py-'));
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  proxy = await startFaultProxy({ target: gw.url, cutRate: 0, seed: FAULT_SEED });
  // /reject/… answers 400 (a delivery dead-lettered after one attempt, for manual retries).
  receiver = await startReceiver({ behaviour: (r) => ({ status: r.path.startsWith('/reject/') ? 400 : 200 }) });
  captures = await startCaptures(receiver);
});

after(async () => {
  await captures?.close();
  await receiver?.close();
  await proxy?.close();
  await gw?.dispose();
  await origin?.kill();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

describe('Python SDK (clients/python)', () => {
  it('builds as published: python -m build → sdist and a typed wheel', async () => {
    fs.rmSync(DIST, { recursive: true, force: true });
    // --no-isolation: the pinned hatchling of the venv, no registry round trip per run.
    const r = await run(PY, ['-m', 'build', '--no-isolation', '--outdir', DIST, PKG]);
    assert.equal(r.code, 0, r.out);
    const files = fs.readdirSync(DIST);
    const wheel = files.find((f) => /^postguard-[\d.]+-py3-none-any\.whl$/.test(f));
    assert.ok(wheel, `a wheel in ${files}`);
    assert.ok(files.some((f) => /^postguard-[\d.]+\.tar\.gz$/.test(f)), `an sdist in ${files}`);
    const listing = await run(PY, ['-c', 'import sys, zipfile; print("\\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))', path.join(DIST, wheel)]);
    assert.equal(listing.code, 0, listing.out);
    for (const f of ['postguard/__init__.py', 'postguard/py.typed', 'postguard/webhooks.py']) {
      assert.ok(listing.out.split('\n').includes(f), `${f} in the wheel:\n${listing.out}`);
    }
  });

  it('is typed and lint-clean: mypy --strict, ruff check and ruff format --check', async () => {
    const dirs = ['src', 'tests', 'examples'];
    const mypy = await run(PY, ['-m', 'mypy', '--strict', '--cache-dir', path.join(ROOT, 'target', 'mypy-py-sdk'), ...dirs], { cwd: PKG });
    assert.equal(mypy.code, 0, mypy.out);
    const env = { RUFF_CACHE_DIR: path.join(ROOT, 'target', 'ruff-py-sdk') };
    const lint = await run(PY, ['-m', 'ruff', 'check', ...dirs], { cwd: PKG, env });
    assert.equal(lint.code, 0, lint.out);
    const format = await run(PY, ['-m', 'ruff', 'format', '--check', ...dirs], { cwd: PKG, env });
    assert.equal(format.code, 0, format.out);
  });

  it('pytest: unit tests and integration tests against the real gateway pass, none skipped', async () => {
    const junit = path.join(tmp, 'junit.xml');
    const reportFile = path.join(tmp, 'figures.jsonl');
    const r = await run(PY, ['-m', 'pytest', '-p', 'no:cacheprovider', '-q', '-rfEs', '--durations=8', `--junitxml=${junit}`, 'tests'], {
      cwd: PKG,
      env: {
        PG_REQUIRE_INTEGRATION: '1',
        PG_GATEWAY_URL: gw.url,
        PG_ORIGIN_URL: origin.url,
        PG_PROXY_URL: proxy.url,
        PG_PROXY_CONTROL_URL: proxy.controlUrl,
        PG_ADMIN_TOKEN: ADMIN_TOKEN,
        PG_ORIGIN_TOKEN: ORIGIN_TOKEN,
        PG_PLAN_BIG: 'big',
        PG_PLAN_SMALL: 'small',
        PG_PLAN_TINY: 'tiny',
        PG_PLAN_TIERED: 'tiered',
        PG_PLAN_SINGLE: 'single',
        PG_REQUIRED_FROM: REQUIRED_FROM,
        PG_RECEIVER_URL: receiver.url,
        PG_CAPTURES_URL: captures.url,
        PG_REPORT: reportFile,
      },
    });
    console.log(r.out);
    if (fs.existsSync(reportFile)) {
      console.log(`# Python SDK figures (fault proxy seed ${FAULT_SEED}):\n${fs.readFileSync(reportFile, 'utf8')}`);
    }
    assert.equal(r.code, 0, 'pytest exited non-zero (output above)');
    const xml = fs.readFileSync(junit, 'utf8');
    const attr = (name) => Number(new RegExp(`<testsuite [^>]*\\b${name}="(\\d+)"`).exec(xml)?.[1]);
    assert.equal(attr('failures'), 0);
    assert.equal(attr('errors'), 0);
    assert.equal(attr('skipped'), 0, 'no test skipped: the integration tests ran');
    assert.ok(attr('tests') >= 80, `tests run: ${attr('tests')}`);
  });
});
