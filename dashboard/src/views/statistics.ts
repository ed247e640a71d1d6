// Statistics: requests and errors per day over 30 days (uPlot), top endpoints,
// error share, p50/p95 latency, and the key's limit state when signed in with one
// (its expiry, each policy's remaining, its in-flight slots). The gateway's own
// calls (the dashboard's reads among them) are left out unless "Include gateway
// calls" is ticked; the chart's legend shows the latest day until a day is hovered.

import uPlot from 'uplot';
import * as api from '../api';
import { expiry, field, fields, gatewayToggle, h, input, scroller, status, table, td } from '../dom';
import { inflightLine, policyTable } from '../limits';

const DAY_MS = 86_400_000;
const DAYS = 30;

/** The last `DAYS` UTC dates, oldest first, with the API's counts (0 where none). */
export function fillDays(stats: api.Stats, now = Date.now()): api.Stats['days'] {
  const byDate = new Map(stats.days.map((d) => [d.date, d]));
  const today = Math.floor(now / DAY_MS) * DAY_MS;
  const out: api.Stats['days'] = [];
  for (let i = DAYS - 1; i >= 0; i--) {
    const date = new Date(today - i * DAY_MS).toISOString().slice(0, 10);
    out.push(byDate.get(date) ?? { date, requests: 0, errors: 0, server_errors: 0, missing_idempotency_key: 0 });
  }
  return out;
}

function chart(container: HTMLElement, days: api.Stats['days']): void {
  // An empty day either side, so the first and last bars are drawn whole.
  const day = 86_400;
  const xs = days.map((d) => Date.parse(`${d.date}T00:00:00Z`) / 1000);
  xs.unshift(xs[0] - day);
  xs.push(xs[xs.length - 1] + day);
  const pad = (v: number[]): Array<number | null> => [null, ...v, null];
  const width = Math.max(280, Math.min(container.clientWidth || 600, 960));
  const opts: uPlot.Options = {
    width,
    height: 240,
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), 'Etc/UTC'),
    scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, Math.max(1, max)] } },
    axes: [{}, { label: 'requests per day' }],
    series: [
      { label: 'Day (UTC)', value: (_u, v) => (v === null ? '—' : new Date(v * 1000).toISOString().slice(0, 10)) },
      {
        label: 'Requests',
        stroke: '#1f5f99',
        fill: 'rgba(31,95,153,0.25)',
        paths: uPlot.paths.bars?.({ size: [0.6, 40] }),
        points: { show: false },
      },
      { label: 'Errors', stroke: '#b3261e', width: 2, points: { show: true, size: 5 } },
      { label: '5xx', stroke: '#6b3fa0', width: 1, dash: [4, 3], points: { show: false } },
    ],
  };
  // The legend shows the latest day (today) until a day is hovered, and again
  // when the pointer leaves the chart (uPlot would show "--").
  const latest = days.length;
  opts.hooks = {
    setLegend: [
      (u) => {
        if (u.legend.idx === null || u.legend.idx === undefined) u.setLegend({ idx: latest }, false);
      },
    ],
  };
  const plot = new uPlot(
    opts,
    [xs, pad(days.map((d) => d.requests)), pad(days.map((d) => d.errors)), pad(days.map((d) => d.server_errors))],
    container,
  );
  plot.setLegend({ idx: latest }, false);
  const resize = (): void => {
    if (!container.isConnected) {
      window.removeEventListener('resize', resize);
      plot.destroy();
      return;
    }
    plot.setSize({ width: Math.max(280, Math.min(container.clientWidth, 960)), height: 240 });
  };
  window.addEventListener('resize', resize);
}

function dayTable(days: api.Stats['days']): HTMLElement {
  const rows = [...days].reverse().map((d) =>
    h('tr', { 'data-date': d.date }, h('th', { scope: 'row' }, d.date), td(d.requests), td(d.errors), td(d.server_errors)),
  );
  const t = table('Requests and errors per day', ['Day (UTC)', 'Requests', 'Errors', '5xx'], rows);
  t.querySelector('thead th')?.setAttribute('scope', 'col');
  return h('details', { class: 'days' }, h('summary', null, 'Numbers per day'), scroller('Numbers per day', t));
}

/**
 * Whom to tell before `idempotency.required_from`: the keys that sent requests needing an
 * Idempotency-Key without one in the period, most first (nothing when there are none).
 */
function missingKeys(keys: api.Stats['keys_missing_idempotency']): HTMLElement | null {
  if (!keys.length) return null;
  return h(
    'section',
    { class: 'missing-idempotency' },
    h('h2', null, 'Keys sending required requests without an Idempotency-Key'),
    h('p', { class: 'hint' }, 'Forwarded until idempotency.required_from, refused from then on: tell their owners.'),
    h(
      'ul',
      null,
      ...keys.map((k) => h('li', { 'data-key-prefix': k.key_prefix }, h('code', null, `${k.key_prefix}…`), ` — ${k.requests} ${k.requests === 1 ? 'request' : 'requests'}`)),
    ),
  );
}

async function limitState(): Promise<HTMLElement> {
  const me = await api.call<api.Me>('GET', '/me');
  return h(
    'section',
    null,
    h('h2', { id: 'limit-title' }, 'This key’s limit'),
    fields({
      key: `${me.prefix}…`,
      plan: me.plan,
      limit: `${me.limit} requests per ${me.window_s} s`,
      remaining: me.remaining,
      resets: new Date(me.reset * 1000).toISOString(),
      expires: expiry(me.expires_at),
    }),
    h('h3', null, 'Policies'),
    policyTable(me.policies ?? [], 'this key'),
    inflightLine(me.inflight),
  );
}

export async function statistics(main: HTMLElement): Promise<void> {
  const c = api.credential();
  const box = h('div');
  const msg = h('p', { class: 'status' });
  let shown: { project?: string; keyPrefix?: string } = {};
  const gateway = gatewayToggle(() => {
    load(shown.project, shown.keyPrefix).catch((e) => status(msg, api.describe(e), 'error'));
  });
  const load = async (project?: string, keyPrefix?: string): Promise<void> => {
    shown = { project, keyPrefix };
    status(msg, 'Loading…');
    const stats = await api.call<api.Stats>('GET', '/stats', {
      query: { days: DAYS, project, key_prefix: keyPrefix, include_gateway: String(gateway.include()) },
    });
    const days = fillDays(stats);
    const total = days.reduce((n, d) => n + d.requests, 0);
    const plot = h('div', { class: 'chart', role: 'img', 'aria-label': `Requests and errors per day, last ${DAYS} days; ${total} requests in all` });
    const top = table(
      'Top endpoints',
      ['Path', 'Requests'],
      stats.top_paths.map((p) => h('tr', null, td(h('code', null, p.path)), td(p.requests))),
    );
    box.replaceChildren(
      h(
        'section',
        null,
        h('h2', { id: 'summary-title' }, `Last ${DAYS} days${project ? ` — project ${project}` : ''}${keyPrefix ? ` — key ${keyPrefix}…` : ''}`),
        h('p', { class: 'hint scope' }, gateway.include() ? 'Every request, the gateway’s own calls included.' : 'Requests proxied to the origin; the gateway’s own calls are left out.'),
        fields({
          requests: total,
          'error share': `${(stats.error_share * 100).toFixed(1)} %`,
          'p50 latency': stats.p50_ms === null ? '—' : `${stats.p50_ms} ms`,
          'p95 latency': stats.p95_ms === null ? '—' : `${stats.p95_ms} ms`,
        }),
        plot,
        dayTable(days),
      ),
      h('section', null, h('h2', { id: 'top-title' }, 'Top endpoints'), scroller('Top endpoints', top)),
    );
    const missing = missingKeys(stats.keys_missing_idempotency ?? []);
    if (missing) box.append(missing);
    chart(plot, days);
    if (c?.kind === 'key') box.append(await limitState());
    status(msg, '');
  };
  if (c?.kind === 'operator') {
    const project = input('project', { placeholder: 'every project' });
    const keyPrefix = input('key_prefix', { placeholder: 'every key' });
    const form = h(
      'form',
      { class: 'filters', 'aria-label': 'Statistics filters' },
      field('Project', project),
      field('Key prefix', keyPrefix),
      gateway.box,
      h('button', { type: 'submit' }, 'Show statistics'),
    );
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      load(project.value.trim() || undefined, keyPrefix.value.trim() || undefined).catch((e) => status(msg, api.describe(e), 'error'));
    });
    const params = new URLSearchParams(location.hash.split('?')[1] ?? '');
    keyPrefix.value = params.get('key_prefix') ?? '';
    main.append(form);
    main.append(msg, box);
    await load(undefined, keyPrefix.value || undefined);
    return;
  }
  main.append(h('div', { class: 'filters row' }, gateway.box), msg, box);
  await load();
}
