// Eight workers sharing one client: its limiter reads the rate-limit headers of every answer
// and holds calls back before the budget runs out, so in normal operation no 429 happens.
//   POSTGUARD_URL=... POSTGUARD_API_KEY=... node examples/concurrent-workers.mjs
import { Postguard } from '@postguard/client';

let rejected = 0;
const pg = new Postguard({
  baseUrl: process.env.POSTGUARD_URL ?? 'http://127.0.0.1:8787',
  apiKey: process.env.POSTGUARD_API_KEY ?? '',
  throttle: { threshold: 0 }, // use the whole budget (the default keeps a tenth in reserve); add pacing: true to spread calls
  onResponse: (r) => {
    if (r.status === 429) rejected += 1;
  },
});

const jobs = Array.from({ length: 40 }, (_, i) => ({ sku: `sku-${i}` }));
const started = Date.now();
/** @param {number} id */
async function worker(id) {
  for (let job = jobs.shift(); job; job = jobs.shift()) {
    const res = await pg.request('POST', '/orders', { body: job });
    console.log(`worker ${id}: ${job.sku} → ${res.status}`);
  }
}
await Promise.all(Array.from({ length: 8 }, (_, i) => worker(i)));
console.log(`40 orders in ${((Date.now() - started) / 1000).toFixed(1)} s, 429s seen: ${rejected}`);
