// Quick start: one logical payment, retried safely with one Idempotency-Key.
//   POSTGUARD_URL=http://127.0.0.1:8787 POSTGUARD_API_KEY=pgk_... node examples/quickstart.mjs
// (scripts/dev.sh in the repository starts a gateway and a demo origin and prints a key.)
import { Postguard, ApiError, RetriesExhaustedError } from '@postguard/client';

const pg = new Postguard({
  baseUrl: process.env.POSTGUARD_URL ?? 'http://127.0.0.1:8787',
  apiKey: process.env.POSTGUARD_API_KEY ?? '',
  timeoutMs: 10_000,
});

const me = await pg.me();
console.log(`key ${me.prefix}… project ${me.project}, plan ${me.plan}: ${me.remaining}/${me.limit} left`);

try {
  // The SDK generates the key once; a lost answer is retried with the same key and the
  // gateway replays the stored result instead of charging twice.
  const res = await pg.request('POST', '/payments', { body: { amount: 100, currency: 'EUR' } });
  console.log(res.status, res.replayed ? '(replayed)' : '(fresh)', 'key', res.idempotencyKey, 'request', res.requestId);

  // Your own key (e.g. your order id) makes the operation idempotent across processes too.
  const again = await pg.request('POST', '/payments', { body: { amount: 100, currency: 'EUR' }, idempotencyKey: 'order-1' });
  console.log('order-1 →', again.status, again.replayed ? 'replayed' : 'fresh');
} catch (e) {
  if (e instanceof RetriesExhaustedError) console.error(`gave up after ${e.attempts} attempts: ${e.code ?? e.message}`);
  else if (e instanceof ApiError) console.error(`${e.status} ${e.code}: ${e.detail} (request ${e.requestId})`);
  else throw e;
}
