// scripts/dev.sh as a newcomer runs it (issue 35): in a fresh clone of this repository, the real
// script — its setup, build, migrations, demo origin and receiver, and wrangler dev — on free ports,
// until it prints its closing block. The portal link is among the last 15 lines and signs in; the
// test tooling was not built; the worker was built once; the migrations took one line. Then the
// whole process group is stopped (wrangler's workerd included) and nothing of it is left.
//
// Affordable in CI: the clone reuses this checkout's cargo target directory (CARGO_TARGET_DIR:
// the dependencies are compiled already; the clone's two crates build beside this checkout's,
// under their own names) and its Node 22 (so setup.sh installs no Node); npm installs the
// clone's packages from the local cache.
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { ROOT, freePort, poll } from './support/gateway.mjs';

/** The script's whole run on a loaded 2-core machine: a generous bound, not a timing claim. */
const READY_TIMEOUT_MS = 15 * 60_000;

let clone;
let child;
let output = '';
const ports = {};

function lines() {
  return output.replace(/\r/g, '').split('\n').filter((l, i, all) => i < all.length - 1 || l !== '');
}

/** Whether anything still listens on `port`. */
function listening(port) {
  return new Promise((resolve) => {
    const s = net.connect({ port, host: '127.0.0.1' });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

/** Processes whose command line names the clone (its node, wrangler, workerd…). */
function processesOfClone() {
  const out = [];
  for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
      const cwd = fs.readlinkSync(`/proc/${pid}/cwd`);
      if (cmd.includes(clone) || cwd.startsWith(clone)) out.push(`${pid}: ${cmd.slice(0, 120)}`);
    } catch {
      // gone, or not ours to read
    }
  }
  return out;
}

before(async () => {
  clone = fs.mkdtempSync(path.join(os.tmpdir(), 'pg-fresh-clone-'));
  execFileSync('git', ['clone', '--quiet', ROOT, clone]);
  for (const name of ['DEV_PORT', 'ORIGIN_PORT', 'RECEIVER_PORT']) ports[name] = String(await freePort());
  const node22 = path.dirname(process.execPath);
  child = spawn('bash', ['scripts/dev.sh'], {
    cwd: clone,
    detached: true, // its own process group: the test stops all of it
    stdio: ['ignore', 'pipe', 'pipe'],
    env: {
      ...process.env,
      ...ports,
      PATH: `${node22}:${process.env.PATH}`,
      CARGO_TARGET_DIR: process.env.CARGO_TARGET_DIR ?? path.join(ROOT, 'target'),
    },
  });
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
});

after(async () => {
  if (child && child.exitCode === null) {
    try {
      process.kill(-child.pid, 'SIGTERM');
    } catch {
      // already gone
    }
    const exited = await Promise.race([new Promise((r) => child.once('exit', () => r(true))), new Promise((r) => setTimeout(() => r(false), 15000))]);
    if (!exited) {
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }
  if (clone) fs.rmSync(clone, { recursive: true, force: true });
});

describe('scripts/dev.sh in a fresh clone', () => {
  it('ends with a block whose portal link is among the last 15 lines and signs in', async () => {
    const end = /^─{40,}$/;
    try {
      await poll(() => {
        if (child.exitCode !== null) throw new Error(`dev.sh exited (${child.exitCode})`);
        // The block's two rules: the second one closes it.
        return lines().filter((l) => end.test(l)).length >= 2;
      }, { timeout: READY_TIMEOUT_MS, interval: 500, message: 'the closing block' });
    } catch (e) {
      throw new Error(`${e.message}\n--- the script's output ---\n${output.slice(-6000)}`);
    }
    // What wrangler logs after the block (a request's line) may follow it: a moment for that.
    await new Promise((r) => setTimeout(r, 2000));
    const all = lines();
    const last = all.slice(-15);
    const link = last.map((l) => /(http:\/\/127\.0\.0\.1:\d+\/_postguard\/dashboard\/#portal=(pgl_[A-Za-z0-9_.-]+))/.exec(l)).find(Boolean);
    assert.ok(link, `a portal link among the last 15 lines:\n${last.join('\n')}`);
    const gw = `http://127.0.0.1:${ports.DEV_PORT}`;
    assert.ok(link[1].startsWith(`${gw}/`), `the link names the port: ${link[1]}`);
    const block = last.join('\n');
    for (const part of [`${gw}/_postguard/dashboard/`, 'ADMIN=dev-admin-', 'ORIGIN=dev-origin-', `curl -s -X POST ${gw}/_postguard/v1/keys`]) {
      assert.ok(block.includes(part), `the block has ${part}:\n${block}`);
    }
    // The link signs in: the project "demo" has a live key for its session.
    const res = await fetch(`${gw}/_postguard/v1/portal-sessions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ token: link[2] }),
    });
    const session = await res.text();
    assert.equal(res.status, 201, session);
    assert.equal(JSON.parse(session).project, 'demo');
    // The first curl of the block works as printed.
    const admin = /ADMIN=(dev-admin-[0-9a-f]+)/.exec(block)[1];
    const key = await fetch(`${gw}/_postguard/v1/keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${admin}`, 'content-type': 'application/json' },
      body: JSON.stringify({ project: 'demo', plan: 'trial' }),
    });
    const created = await key.text();
    assert.equal(key.status, 201, created);
    // The demo origin answers behind the gateway, on its own port.
    const pay = await fetch(`${gw}/payments`, {
      method: 'POST',
      headers: { authorization: `Bearer ${JSON.parse(created).key}`, 'content-type': 'application/json', 'idempotency-key': 'order-1' },
      body: '{"amount":100}',
    });
    assert.ok(pay.status < 300, `POST /payments → ${pay.status}`);
    console.log(`# dev.sh: ${all.length} lines of output; the portal link on line ${all.indexOf(all.find((l) => l.includes(link[2]))) + 1}`);
  });

  it('built no test tooling, the worker once, and took one line for the migrations', () => {
    for (const p of ['.tools/st', '.tools/py-sdk', 'clients/typescript/node_modules', 'clients/typescript/dist', 'target/sdk-typescript']) {
      assert.equal(fs.existsSync(path.join(clone, p)), false, `${p} was not made`);
    }
    assert.ok(!output.includes('Migrations to be applied'), 'the migration tables stay in the log');
    assert.equal(output.match(/==> D1 migrations/g)?.length, 1);
    assert.equal(output.match(/\[custom build\] build\.sh: built a moment ago by scripts\/dev\.sh/g)?.length, 1, 'wrangler’s build step found the worker built');
    assert.equal((output.match(/Duplicate key/g) ?? []).length, 0, 'no build output on the screen (it is in target/dev/build.log)');
    assert.ok(fs.existsSync(path.join(clone, 'target', 'dev', 'build.log')));
    assert.ok(lines().length < 150, `${lines().length} lines`);
  });

  it('stops with its process group, wrangler’s workerd included', async () => {
    assert.equal(await listening(Number(ports.DEV_PORT)), true);
    process.kill(-child.pid, 'SIGTERM');
    await new Promise((r) => (child.exitCode !== null ? r() : child.once('exit', r)));
    await poll(async () => !(await listening(Number(ports.DEV_PORT))) && !(await listening(Number(ports.ORIGIN_PORT))) && !(await listening(Number(ports.RECEIVER_PORT))),
      { timeout: 30000, interval: 250, message: 'every port closed' });
    await poll(() => processesOfClone().length === 0, { timeout: 30000, interval: 250, message: 'no process of the clone left' });
  });
});
