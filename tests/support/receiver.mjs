// Real local webhook receivers for the webhook-delivery tests (docs/webhooks.md).
//
// startReceiver({ behaviour, secrets }) listens on 127.0.0.1 (port 0) and records every request it
// receives: headers, raw body (string), arrival time, attempt (X-Delivery-Attempt) and the result of
// verifying the signature with BOTH published libraries — `standardwebhooks` and `svix` — against
// every secret the test gave (the subscription's secret(s)). The signature check itself is never
// re-implemented here.
//
// behaviour: `(req, n) => ({status, headers, body})` (n = 1-based count of requests received; it may
//   return a Promise, e.g. to answer slowly), or
//   'down'  — the server is closed: connections are refused;
//   'hang'  — the request is read and never answered (the gateway's timeout must fire).
// setBehaviour() switches at any time ('down' closes the listener, anything else re-opens it on the
// same port).
// keepAliveTimeout (default 60 s): with a short one (e.g. 1 s) equal to a 1 s retry delay, the gateway
// can reuse a pooled connection the receiver is closing at that instant, and that attempt fails with
// "Network connection lost." — real, but it makes attempt counts nondeterministic in tests.
import http from 'node:http';
import { Webhook as StdWebhook } from 'standardwebhooks';
import { Webhook as SvixWebhook } from 'svix';

/** Verify `body` + `headers` with both libraries for one secret. */
export function verifyBoth(secret, body, headers) {
  const out = { standardwebhooks: null, svix: null };
  const h = {
    'webhook-id': headers['webhook-id'],
    'webhook-timestamp': headers['webhook-timestamp'],
    'webhook-signature': headers['webhook-signature'],
  };
  try {
    new StdWebhook(secret).verify(body, h);
    out.standardwebhooks = true;
  } catch (e) {
    out.standardwebhooks = `${e.name}: ${e.message}`;
  }
  try {
    new SvixWebhook(secret).verify(body, h);
    out.svix = true;
  } catch (e) {
    out.svix = `${e.name}: ${e.message}`;
  }
  out.ok = out.standardwebhooks === true && out.svix === true;
  return out;
}

/** The `v1,` signature the library computes for one secret (to tell which secret signed which entry). */
export function expectedSignature(secret, headers, body) {
  const ts = new Date(Number(headers['webhook-timestamp']) * 1000);
  return new StdWebhook(secret).sign(headers['webhook-id'], ts, body);
}

export async function startReceiver({ behaviour = () => ({ status: 200 }), secrets = [], host = '127.0.0.1', keepAliveTimeout = 60000 } = {}) {
  let current = behaviour;
  let secretList = [...secrets];
  const requests = [];
  const sockets = new Set();
  const waiters = new Set();
  let server;
  let port = 0;
  let listening = false;

  function record(req, body) {
    const headers = { ...req.headers };
    const verification = {};
    for (const s of secretList) verification[s] = verifyBoth(s, body, headers);
    let json;
    try {
      json = JSON.parse(body);
    } catch {
      json = undefined;
    }
    const r = {
      n: requests.length + 1,
      at: Date.now(),
      method: req.method,
      path: req.url,
      headers,
      body,
      json,
      attempt: headers['x-delivery-attempt'] === undefined ? undefined : Number(headers['x-delivery-attempt']),
      verification,
      /** true when every given secret verified with both libraries (false if no secret was given) */
      verified: secretList.length > 0 && Object.values(verification).every((v) => v.ok),
    };
    requests.push(r);
    for (const w of waiters) w();
    return r;
  }

  function makeServer() {
    const srv = http.createServer((req, res) => {
      const chunks = [];
      req.on('data', (c) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        const r = record(req, body);
        const b = current;
        if (b === 'hang') return; // read, never answered
        if (b === 'down') {
          res.socket?.destroy();
          return;
        }
        const answer = (reply) => {
          const out = reply.body === undefined ? 'ok' : typeof reply.body === 'string' ? reply.body : JSON.stringify(reply.body);
          r.answered = reply.status ?? 200;
          if (res.destroyed) return; // the gateway gave up (its timeout) while this reply waited
          res.writeHead(reply.status ?? 200, { 'content-type': 'text/plain', ...(reply.headers ?? {}) });
          res.end(out);
        };
        new Promise((resolve) => resolve(typeof b === 'function' ? b(r, r.n) : undefined))
          .then((reply) => reply ?? { status: 200 }, (e) => ({ status: 500, body: String(e) }))
          .then(answer);
      });
    });
    // Long keep-alive: a server closing an idle pooled connection just as the gateway reuses it
    // (a 1 s keep-alive vs a 1 s retry delay) turns an attempt into a network error.
    srv.keepAliveTimeout = keepAliveTimeout;
    srv.on('connection', (s) => {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
    });
    srv.on('clientError', (err, socket) => socket.destroy());
    return srv;
  }

  async function listen() {
    if (listening) return;
    server = makeServer();
    await new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    port = server.address().port;
    listening = true;
  }

  async function stop() {
    if (!listening) return;
    listening = false;
    const done = new Promise((r) => server.close(() => r()));
    for (const s of sockets) s.destroy();
    server.closeAllConnections?.();
    await done;
  }

  await listen();
  if (current === 'down') await stop();

  return {
    url: `http://${host}:${port}`,
    port,
    requests,
    get listening() {
      return listening;
    },
    /** Replace the secrets later requests are verified with (e.g. after creating the subscription). */
    setSecrets(list) {
      secretList = [...list];
    },
    addSecret(s) {
      if (!secretList.includes(s)) secretList.push(s);
    },
    async setBehaviour(b) {
      current = b;
      if (b === 'down') await stop();
      else await listen();
    },
    /** Requests whose webhook-id is `id`. */
    forEvent(id) {
      return requests.filter((r) => r.headers['webhook-id'] === id);
    },
    /** Wait until `pred(requests)` holds (resolves on each new request; fails after `timeout` ms). */
    waitFor(pred, { timeout = 15000, message = 'receiver condition' } = {}) {
      return new Promise((resolve, reject) => {
        const check = () => {
          let v;
          try {
            v = pred(requests);
          } catch (e) {
            cleanup();
            reject(e);
            return;
          }
          if (v) {
            cleanup();
            resolve(v);
          }
        };
        const timer = setTimeout(() => {
          cleanup();
          reject(new Error(`timed out after ${timeout} ms waiting for ${message} (received ${requests.length}: ${JSON.stringify(requests.map((r) => [r.headers['webhook-id'], r.attempt, r.answered]))})`));
        }, timeout);
        function cleanup() {
          clearTimeout(timer);
          waiters.delete(check);
        }
        waiters.add(check);
        check();
      });
    },
    async close() {
      current = 'down';
      await stop();
      for (const w of waiters) w();
    },
  };
}
