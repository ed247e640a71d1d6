// Benchmark (issue 36 item 5): what quota notices cost on the proxy path. One gateway, two plans
// side by side: `plain` (no notify_at) and `noticed` (notify_at [50, 80, 100]), each with a key
// that has room and a key that is spent. Scenarios: a fresh POST (charge + claim + forward +
// store: the admission with notify_at also computes the crossed thresholds in its transaction),
// a GET without an Idempotency-Key (the charge alone: a transaction only with notify_at) and a 429 (answered from the object's memory: it writes nothing, so it notifies nothing). The
// quota is large, so no threshold is crossed while measuring: the figure is the steady cost every
// admission pays for being able to notify. req/s with notify_at ÷ without, in alternating runs
// in one process (the machine is shared and noisy: only ratios side by side mean anything).
// Usage: node bench/quota-notices.mjs [rounds] [seconds]
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg } from '../tests/support/gateway.mjs';
import { keysPerPlan, sideBySide, writeRatioSection, loadUrl } from './results.mjs';

const ROUNDS = Number(process.argv[2] ?? 5);
const SECONDS = Number(process.argv[3] ?? 4);
const CONNECTIONS = 16;
const BIG = 10_000_000;
const NOTIFY_AT = [50, 80, 100];
const PLANS = {
  plain: { requests_per_window: BIG, window_s: 3600 },
  noticed: { requests_per_window: BIG, window_s: 3600, notify_at: NOTIFY_AT },
  plain_spent: { requests_per_window: 1, window_s: 86400 },
  noticed_spent: { requests_per_window: 1, window_s: 86400, notify_at: NOTIFY_AT },
};

const load = (url, opts = {}) => loadUrl(url, { ...opts, connections: CONNECTIONS, seconds: SECONDS });

const origin = await startOrigin();
const gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ plans: PLANS }) } });
try {
  // The spent plans' one admission used (notifying once, where notify_at is set).
  const auth = await keysPerPlan(gw, PLANS, ['plain_spent', 'noticed_spent']);
  const body = '{"amount":100}';
  const scenarios = {
    'fresh POST': (plan) => load(`${gw.url}/bench/pay`, { method: 'POST', headers: auth(plan), body, fresh: true }),
    // Without an Idempotency-Key or a concurrency quota the charge alone is one statement, run
    // without a transaction; with notify_at it may write a notice too, so it runs in one.
    'GET (charge only)': (plan) => load(`${gw.url}/bench/items`, { headers: auth(plan) }),
    '429': (plan) => load(`${gw.url}/bench/items`, { headers: auth(`${plan}_spent`) }),
  };
  const rows = await sideBySide(scenarios, ['plain', 'noticed'], ROUNDS);
  writeRatioSection('quota-notices', {
    title: `Quota notices (issue 36 item 5): notify_at ÷ none`,
    how: `\`node bench/quota-notices.mjs ${ROUNDS} ${SECONDS}\`: ${CONNECTIONS} connections, ${SECONDS} s per run, ${ROUNDS} alternating rounds; one gateway, a key on a plan without \`notify_at\` against a key on the same plan with \`notify_at: [${NOTIFY_AT.join(', ')}]\` (a quota of ${BIG.toLocaleString('en')}: no threshold is crossed while measuring). Goal: ≥ 0.95.`,
    columns: ['scenario', 'without notify_at, req/s (median)', 'with notify_at, req/s (median)', 'with ÷ without, median (spread)'],
    rows,
  });
} finally {
  await gw.dispose();
  await origin.kill();
}
