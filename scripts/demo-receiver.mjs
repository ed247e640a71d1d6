// A local webhook receiver for `scripts/dev.sh`: prints every delivery and checks its
// signature with the Standard Webhooks library when WEBHOOK_SECRET is set (or when a
// secret is posted to /secret). Answers 200, or the status given by ?fail=<status>
// in the subscription URL, to try retries and dead-letter by hand.
import http from 'node:http';
import { Webhook } from 'standardwebhooks';

const port = Number(process.argv[process.argv.indexOf('--port') + 1] || 8789);
let secret = process.env.WEBHOOK_SECRET || null;

http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks).toString('utf8');
    const url = new URL(req.url, 'http://localhost');
    if (url.pathname === '/secret' && req.method === 'POST') {
      secret = body.trim();
      res.end('ok\n');
      return;
    }
    let verdict = 'not checked (set WEBHOOK_SECRET or POST the secret to /secret)';
    if (secret) {
      try {
        new Webhook(secret).verify(body, req.headers);
        verdict = 'valid';
      } catch (e) {
        verdict = `INVALID (${e.message})`;
      }
    }
    const status = Number(url.searchParams.get('fail')) || 200;
    console.log(`[receiver] ${req.method} ${req.url} attempt=${req.headers['x-delivery-attempt']} `
      + `event=${req.headers['webhook-id']} type=${req.headers['x-event-type']} signature ${verdict} → ${status}\n           ${body.slice(0, 300)}`);
    res.writeHead(status, { 'content-type': 'text/plain' });
    res.end(status < 300 ? 'thanks\n' : 'failing on purpose\n');
  });
}).listen(port, '127.0.0.1', () => console.log(`[receiver] listening on http://127.0.0.1:${port}`));
