// What happened to my requests? Every 5xx of the last day, page after page.
//   POSTGUARD_URL=... POSTGUARD_API_KEY=... node examples/audit-search.mjs
import { Postguard } from '@postguard/client';

const pg = new Postguard({ baseUrl: process.env.POSTGUARD_URL ?? 'http://127.0.0.1:8787', apiKey: process.env.POSTGUARD_API_KEY ?? '' });

for await (const row of pg.audit.iterate({ status: '5xx', since: Date.now() - 86_400_000, limit: 100 })) {
  console.log(new Date(row.time).toISOString(), row.method, row.path, row.status, row.request_id, row.idempotency_key ?? '');
}
const stats = await pg.stats({ days: 7 });
console.log(`error share over 7 days: ${(stats.error_share * 100).toFixed(2)} %`);
