// The Rust SDK (clients/rust) against the real stack: this driver starts the demo origin, the
// built worker under Miniflare, two TCP fault proxies (one for the seeded 30 % run, one for the
// gateway calls whose first answer is cut: the tests run in parallel) and a webhook receiver
// (with a capture endpoint listing what it got), then runs the crate's tests — unit tests and the `#[ignore]`d
// integration tests in clients/rust/tests/ — with their URLs and credentials in the
// environment, and asserts that cargo passed and no test was left out. It also packages the
// crate (`cargo package --no-verify`) so CI proves it packages as published.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import http from 'node:http';
import path from 'node:path';
import { startOrigin } from './support/origin.mjs';
import { startReceiver } from './support/receiver.mjs';
import { startFaultProxy } from './support/fault-proxy.mjs';
import { startGateway, cfg, ROOT, ADMIN_TOKEN, ORIGIN_TOKEN } from './support/gateway.mjs';

const MANIFEST = path.join(ROOT, 'clients', 'rust', 'Cargo.toml');
const PROJECT = 'rust-sdk';
const FAULT_SEED = 20261202;
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
  // Issue 26: asynchronous operations on /reports/* (Client::request_async).
  async: { routes: [{ method: 'POST', path: '/reports/*' }], timeout_ms: 10000, requeue_after_s: 2 },
  // Issue 34: a POST without an Idempotency-Key is forwarded (and counted by /stats) until then.
  idempotency: { required_from: REQUIRED_FROM },
};

let origin;
let gw;
let proxy;
let cutProxy;
let receiver;
let captures;

/** Run a command; resolve with {code, out} (stdout+stderr interleaved). */
function run(cmd, args, { env = {} } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (c) => { out += c; });
    child.stderr.on('data', (c) => { out += c; });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, out }));
  });
}

/** GET / → every request the receiver got: [{path, headers, body}] (body as received). */
async function startCaptures(rcv) {
  const server = http.createServer((req, res) => {
    const body = JSON.stringify(rcv.requests.map((r) => ({ path: r.path, headers: r.headers, body: r.body })));
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((r) => server.close(r)) };
}

before(async () => {
  origin = await startOrigin();
  gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg(CONFIG) } });
  proxy = await startFaultProxy({ target: gw.url, cutRate: 0, seed: FAULT_SEED });
  cutProxy = await startFaultProxy({ target: gw.url, cutRate: 0 });
  // /reject/… answers 400 (a delivery dead-lettered after one attempt, for manual retries).
  receiver = await startReceiver({ behaviour: (r) => ({ status: r.path.startsWith('/reject/') ? 400 : 200 }) });
  captures = await startCaptures(receiver);
});

after(async () => {
  await captures?.close();
  await receiver?.close();
  await proxy?.close();
  await cutProxy?.close();
  await gw?.dispose();
  await origin?.kill();
});

describe('Rust SDK (clients/rust)', () => {
  it('passes its unit and integration tests against the real gateway', { timeout: 15 * 60_000 }, async () => {
    const env = {
      POSTGUARD_GATEWAY_URL: gw.url,
      POSTGUARD_PROXY_URL: proxy.url,
      POSTGUARD_PROXY_CONTROL_URL: proxy.controlUrl,
      POSTGUARD_CUT_PROXY_URL: cutProxy.url,
      POSTGUARD_CUT_PROXY_CONTROL_URL: cutProxy.controlUrl,
      POSTGUARD_ORIGIN_URL: origin.url,
      POSTGUARD_RECEIVER_URL: receiver.url,
      POSTGUARD_CAPTURE_URL: captures.url,
      POSTGUARD_ADMIN_TOKEN: ADMIN_TOKEN,
      POSTGUARD_ORIGIN_TOKEN: ORIGIN_TOKEN,
      POSTGUARD_PROJECT: PROJECT,
      POSTGUARD_REQUIRED_FROM: REQUIRED_FROM,
    };
    // The integration tests mostly wait (on windows, retries, deliveries): run them all at once.
    const r = await run('cargo', ['test', '--locked', '--manifest-path', MANIFEST, '--', '--include-ignored', '--nocapture', '--test-threads=8'], { env });
    const figures = r.out.split('\n').filter((l) => l.startsWith('FIGURE'));
    console.log(r.out.split('\n').filter((l) => /^(test |running |test result|FIGURE)/.test(l)).join('\n'));
    assert.equal(r.code, 0, `cargo test failed:\n${r.out}`);
    // Nothing ignored, filtered out or failed in any test binary; the integration tests ran.
    const results = [...r.out.matchAll(/test result: ok\. (\d+) passed; (\d+) failed; (\d+) ignored; \d+ measured; (\d+) filtered out/g)];
    assert.ok(results.length >= 2, `no test results in:\n${r.out}`);
    for (const [line, , failed, ignored, filtered] of results) {
      assert.deepEqual([failed, ignored, filtered], ['0', '0', '0'], line);
    }
    assert.match(r.out, /fault_proxy_every_operation_succeeds_and_runs_once \.\.\. ok/);
    assert.match(r.out, /gateway_calls_whose_first_answer_is_cut_take_effect_once \.\.\. ok/);
    assert.ok(figures.some((l) => l.startsWith('FIGURE fault-proxy')), 'the fault-proxy figures were printed');
    // The proxy really cut answers during the run.
    assert.ok(proxy.stats().cuts > 0, `fault proxy stats ${JSON.stringify(proxy.stats())}`);
  });

  it('is formatted (cargo fmt --check)', async () => {
    const r = await run('cargo', ['fmt', '--manifest-path', MANIFEST, '--', '--check']);
    assert.equal(r.code, 0, `cargo fmt --check failed:\n${r.out}`);
  });

  it('packages as published (cargo package --no-verify)', { timeout: 5 * 60_000 }, async () => {
    const r = await run('cargo', ['package', '--no-verify', '--allow-dirty', '--manifest-path', MANIFEST]);
    assert.equal(r.code, 0, `cargo package failed:\n${r.out}`);
    assert.match(r.out, /Packaged \d+ files/);
  });
});
