// Small helpers the e2e test files share (one copy here rather than one per file).
import assert from 'node:assert/strict';
import crypto from 'node:crypto';

/** `prefix` and 8 random hex digits: a project, key or event name no other test run uses. */
export const uniq = (prefix) => `${prefix}-${crypto.randomBytes(4).toString('hex')}`;

/**
 * A response for an assertion message: its status and the start of its body (`max`
 * characters), with its headers when they are what the test is about.
 */
export const show = (res, { max = 500, headers = false } = {}) =>
  `${res.status}${headers ? ` ${JSON.stringify(res.headers)}` : ''} ${res.text?.slice(0, max)}`;

const pause = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * A bounded negative check: `fn` must keep returning true for `ms` (while the queue, the alarms
 * and the consumers have every chance to act), checked every `every` ms and once more at the end.
 */
export async function stays(fn, ms, message, every = 100) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    assert.ok(await fn(), message);
    await pause(every);
  }
  assert.ok(await fn(), message);
}

/**
 * A new project with a key on `plan` and one subscription of all its events to `rcv` (whose
 * signature checks learn its secret): `{name, key, api(method, path, body), sub}`.
 */
export async function subscribedProject(gw, rcv, tag, plan = 'big') {
  const name = uniq(tag);
  const { key } = await gw.createKey({ project: name, plan });
  const api = (method, p, body) => gw.admin(method, p, body, { token: key });
  const res = await api('POST', '/_postguard/v1/webhooks', { url: `${rcv.url}/${name}`, events: ['*'] });
  assert.equal(res.status, 201, show(res));
  rcv.addSecret(res.json.secret);
  return { name, key, api, sub: res.json };
}
