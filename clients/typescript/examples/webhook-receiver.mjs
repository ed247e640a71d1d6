// A webhook receiver: verify the Standard Webhooks signature (any of the current secrets, so a
// rotation needs no downtime), drop duplicates by event id, then handle the event.
//   WEBHOOK_SECRETS=whsec_new,whsec_old node examples/webhook-receiver.mjs   (listens on :8789)
import http from 'node:http';
import { WebhookReceiver, WebhookVerificationError } from '@postguard/client';

const receiver = new WebhookReceiver({
  secrets: (process.env.WEBHOOK_SECRETS ?? '').split(',').filter(Boolean),
  toleranceS: 300,
  // dedupe: a store of your own ({ claim(id), release(id) }) when you run more than one process.
});

/** @param {import('@postguard/client').WebhookEvent} event */
async function handle(event) {
  console.log(`${event.type} ${event.id}`, JSON.stringify(event.data));
}

http
  .createServer((req, res) => {
    const chunks = /** @type {Buffer[]} */ ([]);
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      try {
        // The raw body, exactly as received: re-serialised JSON would not verify.
        const { duplicate } = await receiver.receive(Buffer.concat(chunks), req.headers, handle);
        res.writeHead(duplicate ? 200 : 204).end();
      } catch (e) {
        if (e instanceof WebhookVerificationError) res.writeHead(400).end(e.code);
        else res.writeHead(500).end(); // the gateway retries later; the id was released
      }
    });
  })
  .listen(Number(process.env.PORT ?? 8789), () => console.log('receiving webhooks'));
