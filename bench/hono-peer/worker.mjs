// The peer issue 29 measures postguard against: what a team would assemble from off-the-shelf
// parts for the same three jobs, written the way each part's README shows it.
// - Hono with `bearerAuth`: the token's SHA-256 (WebCrypto) looked up in KV on every request,
//   uncached (one KV read per request).
// - Cloudflare's rate-limiting binding (as Miniflare simulates it), one binding per plan,
//   keyed by the API key's id.
// - hono-idempotency 0.9.1 on its Durable Object store: one object per API key (the
//   middleware's `cacheKeyPrefix` is the key's id, which names the object), its store methods
//   called by JS RPC from the worker (the library's README: "expose store methods via HTTP —
//   or use RPC").
// - The origin fetched with the client's headers minus Authorization, streamed back.
// No audit row, no rate-limit headers, no request id, no signature: postguard does all four.
// Built by bench/hono-peer/build.sh (Hono from npm; hono-idempotency from its repository's
// v0.9.1 tag, which the npm registry does not serve) into target/hono-peer/build/.
import { DurableObject, env } from 'cloudflare:workers';
import { Hono } from 'hono';
import { bearerAuth } from 'hono/bearer-auth';
import { idempotency } from 'hono-idempotency';
import { durableObjectStore } from 'hono-idempotency/stores/durable-objects';

/** The library's Durable Object store, its methods exposed by RPC. */
export class IdempotencyObject extends DurableObject {
  constructor(ctx, e) {
    super(ctx, e);
    this.store = durableObjectStore({ storage: ctx.storage });
  }
  get(key) { return this.store.get(key); }
  lock(key, record) { return this.store.lock(key, record); }
  complete(key, response) { return this.store.complete(key, response); }
  delete(key) { return this.store.delete(key); }
  purge() { return this.store.purge(); }
}

// The worker's side of the store: each call goes to the object named by the store key's prefix
// (the API key's id, percent-encoded by the middleware).
const stubOf = (storeKey) => env.IDEMPOTENCY.getByName(storeKey.slice(0, storeKey.indexOf(':')));
const store = {
  get: (k) => stubOf(k).get(k),
  lock: (k, record) => stubOf(k).lock(k, record),
  complete: (k, response) => stubOf(k).complete(k, response),
  delete: (k) => stubOf(k).delete(k),
  purge: async () => 0,
};

const enc = new TextEncoder();
const hex = (buf) => [...new Uint8Array(buf)].map((b) => b.toString(16).padStart(2, '0')).join('');

const app = new Hono();
app.use('*', bearerAuth({
  verifyToken: async (token, c) => {
    const hash = hex(await crypto.subtle.digest('SHA-256', enc.encode(token)));
    const key = await c.env.KEYS.get(`h:${hash}`, 'json');
    if (!key) return false;
    c.set('apiKey', key);
    return true;
  },
}));
app.use('*', async (c, next) => {
  const key = c.get('apiKey');
  const limiter = key.plan === 'tiny' ? c.env.LIMIT_TINY : c.env.LIMIT_BENCH;
  const { success } = await limiter.limit({ key: key.id });
  if (!success) return c.json({ error: 'rate limit exceeded' }, 429, { 'Retry-After': '60' });
  await next();
});
app.use('*', idempotency({
  store,
  methods: ['POST', 'PATCH', 'PUT', 'DELETE'],
  cacheKeyPrefix: (c) => c.get('apiKey').id,
}));
app.all('*', async (c) => {
  const u = new URL(c.req.url);
  const headers = new Headers(c.req.raw.headers);
  headers.delete('authorization');
  const body = ['GET', 'HEAD'].includes(c.req.method) ? undefined : await c.req.arrayBuffer();
  return fetch(c.env.ORIGIN_URL + u.pathname + u.search, { method: c.req.method, headers, body, redirect: 'manual' });
});

export default app;
