// Usage: per key, the proxied requests that retries cannot double-count (GET /usage,
// docs/live-api.md) — all, forwarded, billable, replays and 429s — for a chosen period:
// totals per key, then each day's or hour's figures. The operator sees every project's keys
// (or one project's); a project, signed in with a key or a portal link, its own.

import * as api from '../api';
import { field, h, input, scroller, select, status, table } from '../dom';

const PERIODS: Array<[string, string]> = [['1', 'Last 24 hours'], ['7', 'Last 7 days'], ['30', 'Last 30 days']];
const GRANULARITIES: Array<[string, string]> = [['day', 'Per day'], ['hour', 'Per hour']];
const COUNTS = ['requests', 'admitted', 'billable', 'replays', 'refused'] as const;
const COUNT_HEADERS = ['Requests', 'Admitted', 'Billable', 'Replays', 'Refused'];
type Counts = Pick<api.Usage, (typeof COUNTS)[number]>;

const zero = (): Counts => ({ requests: 0, admitted: 0, billable: 0, replays: 0, refused: 0 });
const add = (a: Counts, b: Counts): void => COUNTS.forEach((c) => (a[c] += b[c]));
const cells = (u: Counts): HTMLTableCellElement[] => COUNTS.map((c) => h('td', { class: c }, u[c]));
const keyCell = (prefix: string): HTMLTableCellElement => h('td', { class: 'key' }, h('code', { class: 'nowrap' }, `${prefix}…`));

/** A period's first millisecond as its day, or its hour (UTC). */
function periodText(ms: number, granularity: string): string {
  const iso = new Date(ms).toISOString();
  return granularity === 'day' ? iso.slice(0, 10) : `${iso.slice(0, 10)} ${iso.slice(11, 16)}Z`;
}

/** One row per key (and project) with its totals over the period, most requests first. */
function perKey(rows: api.Usage[], operator: boolean): HTMLElement {
  const byKey = new Map<string, { key_prefix: string; project: string; sum: Counts }>();
  const all = zero();
  for (const u of rows) {
    const id = `${u.project}\n${u.key_prefix}`;
    const entry = byKey.get(id) ?? { key_prefix: u.key_prefix, project: u.project, sum: zero() };
    add(entry.sum, u);
    add(all, u);
    byKey.set(id, entry);
  }
  const keys = [...byKey.values()].sort((a, b) => b.sum.requests - a.sum.requests || a.key_prefix.localeCompare(b.key_prefix));
  const t = table(
    'Usage per key over the period',
    ['Key', ...(operator ? ['Project'] : []), ...COUNT_HEADERS],
    keys.map((k) =>
      h('tr', { 'data-key-prefix': k.key_prefix, 'data-project': k.project }, keyCell(k.key_prefix), operator ? h('td', { class: 'project' }, k.project) : null, ...cells(k.sum)),
    ),
  );
  t.append(h('tfoot', null, h('tr', null, h('th', { scope: 'row', colspan: operator ? 2 : 1 }, 'All keys'), ...cells(all))));
  return scroller('Usage per key', t);
}

function perPeriod(rows: api.Usage[], operator: boolean, granularity: string): HTMLElement {
  const newest = [...rows].sort((a, b) => b.period_start - a.period_start || a.key_prefix.localeCompare(b.key_prefix));
  const t = table(
    `Usage per key and ${granularity}, newest first`,
    [granularity === 'day' ? 'Day (UTC)' : 'Hour (UTC)', 'Key', ...(operator ? ['Project'] : []), ...COUNT_HEADERS],
    newest.map((u) =>
      h(
        'tr',
        { 'data-key-prefix': u.key_prefix, 'data-period-start': u.period_start },
        h('td', { class: 'nowrap' }, periodText(u.period_start, granularity)),
        keyCell(u.key_prefix),
        operator ? h('td', { class: 'project' }, u.project) : null,
        ...cells(u),
      ),
    ),
  );
  return scroller(`Usage per ${granularity}`, t);
}

export async function usage(main: HTMLElement): Promise<void> {
  const operator = api.credential()?.kind === 'operator';
  const period = select('period', PERIODS, '7');
  const granularity = select('granularity', GRANULARITIES, 'day');
  const project = operator ? input('project', { placeholder: 'every project', pattern: '[A-Za-z0-9._\\-]{1,64}' }) : null;
  const form = h(
    'form',
    { class: 'filters', 'aria-label': 'Usage filters' },
    field('Period', period),
    field('Granularity', granularity),
    project ? field('Project', project, 'Empty: every project.') : null,
    h('button', { type: 'submit' }, 'Show usage'),
  );
  const msg = h('p', { class: 'status' });
  const results = h('div');

  const load = async (): Promise<void> => {
    status(msg, 'Loading…');
    const g = granularity.value;
    const since = Date.now() - Number(period.value) * 86_400_000;
    const res = await api.call<{ data: api.Usage[] }>('GET', '/usage', {
      query: { since, granularity: g, project: project?.value.trim() || undefined },
    });
    const rows = res.data;
    if (!rows.length) {
      results.replaceChildren(h('p', null, 'No requests through the gateway in this period.'));
    } else {
      results.replaceChildren(
        h('section', null, h('h2', null, 'Per key'), perKey(rows, operator)),
        h('section', null, h('h2', null, g === 'day' ? 'Per day' : 'Per hour'), perPeriod(rows, operator, g)),
      );
    }
    const keys = new Set(rows.map((u) => `${u.project}\n${u.key_prefix}`)).size;
    status(msg, `${keys} ${keys === 1 ? 'key' : 'keys'}; ${rows.length} ${rows.length === 1 ? 'row' : 'rows'}, one per key and ${g}`);
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    load().catch((e) => status(msg, api.describe(e), 'error'));
  });
  main.append(
    form,
    h(
      'p',
      { class: 'hint' },
      'Requests proxied to the origin. Billable: each operation once — never its replays, 409s or retries after a 5xx. Refused: answered 429.',
    ),
    msg,
    results,
  );
  await load();
}
