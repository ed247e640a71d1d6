// A TCP fault proxy for the SDK tests: it sits between a client and the gateway and, on a
// chosen share of connections, cuts the connection once the gateway has started to answer —
// the request was forwarded and executed, the response is lost. That is the failure an
// Idempotency-Key exists for.
//
// Module:  const p = await startFaultProxy({ target: gw.url, cutRate: 0.3, seed: 7 });
//          p.url, p.stats() → {connections, cuts}, p.setCutRate(x), p.cutNext(n), await p.close()
// Control: p.controlUrl — GET /stats → {connections, cuts, cut_rate, cut_next}; POST /cut-rate?value=0.5;
//          POST /cut-next?count=1; POST /reset (counters and cut-next to 0). For test drivers in
//          other languages.
//
// cutNext(n) cuts the next n responses whatever the rate, then lets answers through again: a
// test that must see one particular call lose its answer (and be retried) does not depend on
// the draw.
//
// Cutting happens per connection, at the first byte the gateway sends back: nothing of that
// response reaches the client, so it sees a reset. A client that reuses a kept-alive
// connection gets the same treatment on the next response, because the decision is redrawn
// for every response on the connection.
import net from 'node:net';
import http from 'node:http';

/** A small deterministic PRNG (mulberry32) so a failing run can be repeated with its seed. */
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function listen(server, host) {
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return server.address().port;
}

export async function startFaultProxy({ target, cutRate = 0, seed = Date.now(), host = '127.0.0.1' } = {}) {
  const upstream = new URL(target);
  const random = prng(seed);
  const counters = { connections: 0, cuts: 0 };
  let rate = cutRate;
  let forced = 0; // responses still to cut whatever the rate
  const sockets = new Set();

  const track = (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  };

  const server = net.createServer((client) => {
    counters.connections += 1;
    track(client);
    const up = net.connect(Number(upstream.port), upstream.hostname);
    track(up);
    // A response starts after a request was sent; the decision is drawn when its first
    // byte arrives. `armed` turns true when the client sends bytes again (next request).
    let armed = true;
    client.on('data', (chunk) => {
      armed = true;
      up.write(chunk);
    });
    up.on('data', (chunk) => {
      if (armed) {
        armed = false;
        const cut = forced > 0 || random() < rate;
        if (forced > 0) forced -= 1;
        if (cut) {
          counters.cuts += 1;
          client.destroy();
          up.destroy();
          return;
        }
      }
      client.write(chunk);
    });
    const end = () => {
      client.destroy();
      up.destroy();
    };
    client.on('end', () => up.end());
    up.on('end', () => client.end());
    client.on('error', end);
    up.on('error', end);
    client.on('close', () => up.destroy());
    up.on('close', () => client.destroy());
  });
  const port = await listen(server, host);

  const control = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://control.invalid');
    const reply = (status, obj) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(obj));
    };
    if (req.method === 'GET' && url.pathname === '/stats') return reply(200, { ...counters, cut_rate: rate, cut_next: forced });
    if (req.method === 'POST' && url.pathname === '/cut-next') {
      const n = Number(url.searchParams.get('count') ?? 1);
      if (!(Number.isInteger(n) && n >= 0)) return reply(400, { error: 'count must be a whole number' });
      forced = n;
      return reply(200, { cut_next: forced });
    }
    if (req.method === 'POST' && url.pathname === '/cut-rate') {
      const v = Number(url.searchParams.get('value'));
      if (!(v >= 0 && v <= 1)) return reply(400, { error: 'value must be within 0..1' });
      rate = v;
      return reply(200, { cut_rate: rate });
    }
    if (req.method === 'POST' && url.pathname === '/reset') {
      counters.connections = 0;
      counters.cuts = 0;
      forced = 0;
      return reply(200, { ok: true });
    }
    return reply(404, { error: 'unknown control endpoint' });
  });
  const controlPort = await listen(control, host);

  return {
    url: `http://${host}:${port}`,
    controlUrl: `http://${host}:${controlPort}`,
    seed,
    stats: () => ({ ...counters, cut_rate: rate, cut_next: forced }),
    setCutRate(v) {
      rate = v;
    },
    cutNext(n = 1) {
      forced = n;
    },
    async close() {
      for (const s of sockets) s.destroy();
      await Promise.all([
        new Promise((r) => server.close(() => r())),
        new Promise((r) => {
          control.closeAllConnections?.();
          control.close(() => r());
        }),
      ]);
    },
  };
}
