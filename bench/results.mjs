// Shared by the benchmarks: statistics over repeated runs, an autocannon wrapper, and
// writing a generated section into bench/RESULTS.md between that benchmark's markers
// (notes outside the markers are kept).
import fs from 'node:fs';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import autocannon from 'autocannon';
import { ROOT, startGateway, cfg } from '../tests/support/gateway.mjs';

/** The short commit of the checkout at `dir` ('?' outside a checkout). */
export function commitOf(dir) {
  try {
    return execFileSync('git', ['-C', dir, 'rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
  } catch {
    return '?';
  }
}

export const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
export const spread = (xs, digits = 2) => `${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)}`;

/** One autocannon run; resolves with its result object. */
export function load(opts) {
  return new Promise((resolve, reject) => autocannon(opts, (err, res) => (err ? reject(err) : resolve(res))));
}

export function writeSection(name, section) {
  const file = path.join(ROOT, 'bench', 'RESULTS.md');
  const [BEGIN, END] = [`<!-- bench/${name}.mjs:begin -->`, `<!-- bench/${name}.mjs:end -->`];
  const old = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '# Benchmark results\n\n';
  const block = `${BEGIN}\n${section}${END}`;
  const next = old.includes(BEGIN) && old.includes(END)
    ? old.slice(0, old.indexOf(BEGIN)) + block + old.slice(old.indexOf(END) + END.length)
    : `${old.trimEnd()}\n\n${block}\n`;
  fs.writeFileSync(file, next);
  console.log(section);
}

/**
 * The gateway the request-path benchmarks load: plan "bench" (no practical limit) and plan
 * "tiny" (one request a day). Returns the gateway, a bench key's headers, a tiny key whose
 * only admission is used up, and the POST body, with one response stored under
 * Idempotency-Key "bench-replay". `config` adds to the configuration (POSTGUARD_CONFIG).
 */
export async function benchGateway(originUrl, { config = {}, ...options } = {}) {
  const gw = await startGateway({
    originUrl,
    ...options,
    vars: { POSTGUARD_CONFIG: cfg({ ...config, plans: { bench: { requests_per_window: 10_000_000 }, tiny: { requests_per_window: 1, window_s: 86400 } } }) },
  });
  const key = (await gw.createKey({ project: 'bench', plan: 'bench' })).key;
  const tiny = (await gw.createKey({ project: 'bench', plan: 'tiny' })).key;
  const auth = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  const body = '{"amount":100}';
  await gw.fetch('/bench/pay', { method: 'POST', headers: { ...auth, 'idempotency-key': 'bench-replay' }, body });
  await gw.fetch('/bench/items', { headers: { authorization: `Bearer ${tiny}` } }); // uses the only admission
  return { gw, key, tiny, auth, body };
}

/**
 * One key per plan of `plans` in the project 'bench'; `auth(plan)` is the headers of a JSON
 * request with that plan's key, and each plan named in `spend` has its one admission used.
 */
export async function keysPerPlan(gw, plans, spend = []) {
  const keys = {};
  for (const plan of Object.keys(plans)) keys[plan] = (await gw.createKey({ project: 'bench', plan })).key;
  const auth = (plan) => ({ authorization: `Bearer ${keys[plan]}`, 'content-type': 'application/json' });
  for (const plan of spend) await gw.fetch('/bench/items', { headers: auth(plan) });
  return auth;
}

/**
 * Runs each measure `rounds` times for two variants side by side, alternating which goes
 * first (a drift in the machine's load favours neither). `measure(variant)` resolves to a
 * rate. Returns the table rows `| name | a (median) | b (median) | b ÷ a (spread) |`.
 */
export async function sideBySideRates(measures, [a, b], rounds, unit = 'req/s') {
  const rows = [];
  for (const [name, measure] of Object.entries(measures)) {
    const ratios = [];
    const rate = { [a]: [], [b]: [] };
    for (let round = 0; round < rounds; round++) {
      const got = {};
      for (const variant of round % 2 ? [b, a] : [a, b]) got[variant] = await measure(variant);
      rate[a].push(got[a]);
      rate[b].push(got[b]);
      ratios.push(got[b] / got[a]);
      console.log(`${name} round ${round + 1}: ${a} ${got[a].toFixed(0)} ${unit}, ${b} ${got[b].toFixed(0)} ${unit}, ratio ${(got[b] / got[a]).toFixed(3)}`);
    }
    rows.push(`| ${name} | ${median(rate[a]).toFixed(0)} | ${median(rate[b]).toFixed(0)} | ${median(ratios).toFixed(2)} (${spread(ratios)}) |`);
  }
  return rows;
}

/**
 * [sideBySideRates] over autocannon runs: `run(variant)` is one run, checked to have answered
 * as expected (4xx for a scenario named '429', else 2xx, at least 99 %); its rate is req/s.
 */
export function sideBySide(scenarios, variants, rounds) {
  const measures = Object.fromEntries(Object.entries(scenarios).map(([name, run]) => [name, async (variant) => {
    const res = await run(variant);
    const expected = name === '429' ? res['4xx'] : res['2xx'];
    if (expected < res.requests.total * 0.99) throw new Error(`${name} ${variant}: ${expected} of ${res.requests.total} as expected (non2xx ${res.non2xx})`);
    return res.requests.average;
  }]));
  return sideBySideRates(measures, variants, rounds);
}

/**
 * Writes a ratio benchmark's section: its title (with the build and the time), how it was run,
 * and the table of [sideBySideRates] rows under `columns` (a, b, b ÷ a).
 */
export function writeRatioSection(name, { title, how, columns, rows }) {
  const when = new Date().toISOString().slice(0, 16).replace('T', ' ');
  writeSection(name, [
    `## ${title}, build ${commitOf(ROOT)}, ${when} UTC`,
    '',
    how,
    '',
    `| ${columns.join(' | ')} |`,
    `|${columns.map(() => '---').join('|')}|`,
    ...rows,
    '',
  ].join('\n'));
}

/**
 * One autocannon run against `url` for `seconds` over `connections`; `fresh` gives every
 * request its own Idempotency-Key, so each is a new operation.
 */
export function loadUrl(url, { method = 'GET', headers = {}, body, fresh = false, connections, seconds }) {
  let n = 0;
  const stamp = `${Date.now()}-${Math.random().toString(36).slice(2)}`;
  return load({
    url,
    method,
    headers,
    body,
    connections,
    duration: seconds,
    requests: fresh ? [{ setupRequest: (req) => ({ ...req, headers: { ...req.headers, 'idempotency-key': `bench-${stamp}-${n++}` } }) }] : undefined,
  });
}
