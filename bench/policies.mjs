// Benchmark (issue 25): what several named policies cost on the proxy path. One gateway, two
// plans side by side: `one` (a single policy) and `three` (three policies, the second binding),
// each with a key that has room and a key that is spent. Scenarios: a fresh POST (charge +
// claim + forward + store) and a 429 (the refusal answered from the object's memory). The
// figure is req/s with three policies ÷ with one, measured in alternating runs in one process
// (the machine is shared and noisy: only ratios side by side mean anything).
// Usage: node bench/policies.mjs [rounds] [seconds]
import { startOrigin } from '../tests/support/origin.mjs';
import { startGateway, cfg } from '../tests/support/gateway.mjs';
import { keysPerPlan, sideBySide, writeRatioSection, loadUrl } from './results.mjs';

const ROUNDS = Number(process.argv[2] ?? 5);
const SECONDS = Number(process.argv[3] ?? 4);
const CONNECTIONS = 16;
const BIG = 10_000_000;
const PLANS = {
  one: { requests_per_window: BIG, window_s: 3600 },
  three: {
    policies: [
      { name: 'second', requests: BIG, window_s: 1 },
      { name: 'hour', requests: BIG - 1, window_s: 3600 },
      { name: 'day', requests: BIG, window_s: 86400 },
    ],
  },
  one_spent: { requests_per_window: 1, window_s: 86400 },
  three_spent: {
    policies: [
      { name: 'second', requests: 100, window_s: 1 },
      { name: 'hour', requests: 1, window_s: 3600 },
      { name: 'day', requests: 100, window_s: 86400 },
    ],
  },
};

const load = (url, opts = {}) => loadUrl(url, { ...opts, connections: CONNECTIONS, seconds: SECONDS });

const origin = await startOrigin();
const gw = await startGateway({ originUrl: origin.url, vars: { POSTGUARD_CONFIG: cfg({ plans: PLANS }) } });
try {
  // The spent plans' one admission used (notifying once, where notify_at is set).
  const auth = await keysPerPlan(gw, PLANS, ['one_spent', 'three_spent']);
  const body = '{"amount":100}';
  const scenarios = {
    'fresh POST': (plan) => load(`${gw.url}/bench/pay`, { method: 'POST', headers: auth(plan), body, fresh: true }),
    '429': (plan) => load(`${gw.url}/bench/items`, { headers: auth(`${plan}_spent`) }),
  };
  const rows = await sideBySide(scenarios, ['one', 'three'], ROUNDS);
  writeRatioSection('policies', {
    title: `Several policies per plan (issue 25): three ÷ one`,
    how: `\`node bench/policies.mjs ${ROUNDS} ${SECONDS}\`: ${CONNECTIONS} connections, ${SECONDS} s per run, ${ROUNDS} alternating rounds; one gateway, a key on a one-policy plan against a key on a three-policy plan (the second policy binding). Goal: ≥ 0.95.`,
    columns: ['scenario', 'one policy, req/s (median)', 'three policies, req/s (median)', 'three ÷ one, median (spread)'],
    rows,
  });
} finally {
  await gw.dispose();
  await origin.kill();
}
