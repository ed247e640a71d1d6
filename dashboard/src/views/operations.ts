// The project's asynchronous operations (docs/async-operations.md): requests sent with
// `Prefer: respond-async`, newest first, filtered by state, with their status,
// attempts and request id (to look them up in the audit log).

import * as api from '../api';
import { button, field, h, replace, scroller, select, show, status, table, td, time } from '../dom';

/** `GET /_postguard/v1/operations` items. */
interface Operation {
  id: string;
  state: 'queued' | 'running' | 'succeeded' | 'failed';
  status?: number;
  request_id: string;
  created_at: number;
  completed_at?: number;
  method: string;
  path: string;
  attempts: number;
}

const STATES: Array<[string, string]> = [
  ['', 'any'],
  ['queued', 'queued'],
  ['running', 'running'],
  ['succeeded', 'succeeded'],
  ['failed', 'failed'],
];

/** The deliveries' badge colours: done well, done badly, under way. */
const BADGE: Record<Operation['state'], string> = {
  succeeded: 'd-delivered',
  failed: 'd-dead_letter',
  queued: 'd-pending',
  running: 'd-pending',
};

function row(o: Operation): HTMLTableRowElement {
  return h(
    'tr',
    { 'data-operation-id': o.id },
    td(time(o.created_at)),
    td(o.method),
    td(h('code', null, o.path)),
    td(h('span', { class: `badge ${BADGE[o.state] ?? ''}` }, o.state)),
    td(show(o.status)),
    td(o.attempts),
    td(time(o.completed_at)),
    td(h('code', null, o.id)),
    td(h('code', null, o.request_id)),
  );
}

export async function operations(main: HTMLElement): Promise<void> {
  const stateFilter = select('state', STATES);
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter operations' }, field('State', stateFilter), h('button', { type: 'submit' }, 'Filter'));
  const msg = h('p', { class: 'status' });
  const list = h('div');
  const pager = h('div', { class: 'row pager' });
  const onError = (e: unknown): void => status(msg, api.describe(e), 'error');
  const headers = ['Created (UTC)', 'Method', 'Path', 'State', 'Status', 'Attempts', 'Completed (UTC)', 'ID', 'Request ID'];

  const load = async (cursor?: string): Promise<void> => {
    const page = await api.call<api.Page<Operation>>('GET', '/operations', {
      query: { state: stateFilter.value || undefined, limit: 25, cursor },
    });
    replace(
      list,
      page.data.length
        ? scroller('Operations', table('Asynchronous operations, newest first', headers, page.data.map(row)))
        : h('p', null, 'No operations match.'),
    );
    replace(pager);
    if (cursor) pager.append(button('Newest', () => load().catch(onError)));
    if (page.next_cursor) {
      const next = page.next_cursor;
      pager.append(button('Older', () => load(next).catch(onError)));
    }
    status(msg, `${page.data.length} ${page.data.length === 1 ? 'operation' : 'operations'} shown`);
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    load().catch(onError);
  });
  main.append(form, msg, list, pager);
  await load();
}
