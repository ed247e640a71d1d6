// Audit log: search by request_id, filters, newest first, pages by cursor; a
// row expands to every field. The gateway's own calls are left out unless
// "Include gateway calls" is ticked; the operator's rows say whose they are
// (project and key).

import * as api from '../api';
import { button, field, fields, fromUtcInput, gatewayToggle, h, ident, input, replace, scroller, select, status, table, td, when } from '../dom';

const METHODS: Array<[string, string]> = [['', 'any'], ...['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'].map((m): [string, string] => [m, m])];
const CLASSES: Array<[string, string]> = [['', 'any'], ['2xx', '2xx'], ['3xx', '3xx'], ['4xx', '4xx'], ['5xx', '5xx']];

function row(r: api.AuditRow, operator: boolean): HTMLTableRowElement[] {
  const detail = h('tr', { class: 'detail', hidden: true }, h('td', { colspan: operator ? 9 : 7 }, fields(r as unknown as Record<string, unknown>)));
  const toggle = button('Details', () => {
    const open = toggle.getAttribute('aria-expanded') === 'true';
    toggle.setAttribute('aria-expanded', String(!open));
    detail.hidden = open;
  }, { 'aria-expanded': 'false', 'aria-label': `Details of ${r.request_id}` });
  const cls = `s${Math.floor(r.status / 100)}xx`;
  return [
    h(
      'tr',
      { 'data-request-id': r.request_id },
      td(when(r.time)),
      operator ? h('td', { class: 'project' }, r.project ?? '—') : null,
      operator ? h('td', { class: 'key' }, r.key_prefix ? h('code', { class: 'nowrap' }, `${r.key_prefix}…`) : '—') : null,
      td(r.method),
      td(h('code', null, r.path)),
      td(h('span', { class: `badge ${cls}` }, r.status)),
      h('td', { class: 'nowrap' }, `${r.response_time_ms} ms`),
      td(ident(r.request_id)),
      td(toggle),
    ),
    detail,
  ];
}

export async function audit(main: HTMLElement): Promise<void> {
  const operator = api.credential()?.kind === 'operator';
  const requestId = input('request_id', { placeholder: 'req_…' });
  const method = select('method', METHODS);
  const statusClass = select('status', CLASSES);
  const path = input('path', { placeholder: '/payments/*' });
  const idem = input('idempotency_key');
  const since = input('since', { type: 'datetime-local', step: 1 });
  const until = input('until', { type: 'datetime-local', step: 1 });
  const project = operator ? input('project', { placeholder: 'every project' }) : null;
  const form = h(
    'form',
    { class: 'filters', role: 'search', 'aria-label': 'Search the audit log' },
    field('Request ID', requestId),
    field('Method', method),
    field('Status', statusClass),
    field('Path', path, '* matches any characters'),
    field('Idempotency-Key', idem),
    field('Since (UTC)', since),
    field('Until (UTC)', until),
    project ? field('Project', project) : null,
    h('button', { type: 'submit' }, 'Search'),
  );
  const msg = h('p', { class: 'status' });
  const results = h('div', { class: 'results' });
  const pager = h('div', { class: 'row pager' });
  const cursors: string[] = [];
  const gateway = gatewayToggle(() => {
    cursors.length = 0;
    load().catch((e) => status(msg, api.describe(e), 'error'));
  });
  form.insertBefore(gateway.box, form.lastElementChild);

  const query = (): Record<string, string | number | undefined> => ({
    request_id: requestId.value.trim() || undefined,
    method: method.value || undefined,
    status: statusClass.value || undefined,
    path: path.value.trim() || undefined,
    idempotency_key: idem.value || undefined,
    since: fromUtcInput(since.value),
    until: fromUtcInput(until.value),
    project: project?.value.trim() || undefined,
    include_gateway: String(gateway.include()),
    limit: 25,
  });

  const load = async (cursor?: string): Promise<void> => {
    status(msg, 'Searching…');
    const page = await api.call<api.Page<api.AuditRow>>('GET', '/audit', { query: { ...query(), cursor } });
    const rows = page.data.flatMap((r) => row(r, operator));
    const headers = ['Time (UTC)', ...(operator ? ['Project', 'Key'] : []), 'Method', 'Path', 'Status', 'Duration', 'Request ID', 'Details'];
    replace(
      results,
      page.data.length
        ? scroller('Audit log entries', table('Audit log entries, newest first', headers, rows))
        : h('p', null, gateway.include() ? 'No requests match.' : 'No requests match. The gateway’s own calls are left out: tick “Include gateway calls” to see them.'),
    );
    replace(pager);
    if (cursors.length) {
      pager.append(button('Newer', () => {
        cursors.pop();
        load(cursors[cursors.length - 1]).catch((e) => status(msg, api.describe(e), 'error'));
      }));
    }
    if (page.next_cursor) {
      const next = page.next_cursor;
      pager.append(button('Older', () => {
        cursors.push(next);
        load(next).catch((e) => status(msg, api.describe(e), 'error'));
      }));
    }
    status(msg, `${page.data.length} ${page.data.length === 1 ? 'entry' : 'entries'}${page.next_cursor ? ' (more on the next page)' : ''}`);
  };

  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    cursors.length = 0;
    load().catch((e) => status(msg, api.describe(e), 'error'));
  });
  main.append(form, msg, results, pager);
  await load();
}
