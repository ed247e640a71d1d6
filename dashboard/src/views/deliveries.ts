// Deliveries of the last 14 days, filtered by status; a row expands to the
// payload and every attempt, with Retry and Redirect buttons that call the API
// and show what happened.

import * as api from '../api';
import { button, field, h, input, replace, scroller, select, show, status, table, td, time } from '../dom';

const DAY_MS = 86_400_000;
const STATUSES: Array<[string, string]> = [
  ['', 'any'],
  ['pending', 'pending'],
  ['delivered', 'delivered'],
  ['failed', 'failed'],
  ['dead_letter', 'dead_letter'],
];
/** How long the page watches a delivery after Retry or Redirect. */
const WATCH_MS = 60_000;

function attempts(list: api.DeliveryAttempt[]): HTMLElement {
  if (!list.length) return h('p', null, 'No attempts yet.');
  const rows = list.map((a) =>
    h(
      'tr',
      null,
      td(a.attempt),
      td(h('code', null, a.url)),
      td(show(a.status_code)),
      td(show(a.error)),
      td(h('pre', { class: 'excerpt' }, show(a.response_excerpt))),
      td(`${a.duration_ms} ms`),
      td(h('code', null, a.request_id)),
      td(time(a.at)),
      td(time(a.next_retry_at)),
    ),
  );
  return scroller(
    'Attempts',
    table('Attempts', ['#', 'URL', 'Status code', 'Error', 'Response excerpt', 'Duration', 'Request ID', 'At (UTC)', 'Next retry (UTC)'], rows),
  );
}

/** Shows a delivery's current status (text and colour) in its list row. */
function showStatus(cell: HTMLElement, status: string): void {
  cell.textContent = status;
  cell.className = `badge d-${status}`;
}

function detailView(d: api.DeliveryDetail, statusCell: HTMLElement, refresh: () => Promise<api.DeliveryDetail>): HTMLElement {
  const msg = h('p', { class: 'status' });
  const attemptsBox = h('div', null, attempts(d.attempts));
  const target = input('redirect_url', { type: 'url', placeholder: 'https://…' });
  /** Polls until the attempt count passes `after` (or the watch ends), showing the outcome. */
  const watch = async (after: number, what: string): Promise<void> => {
    const deadline = Date.now() + WATCH_MS;
    while (Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 1000));
      const now = await refresh();
      replace(attemptsBox, attempts(now.attempts));
      showStatus(statusCell, now.status);
      const last = now.attempts[now.attempts.length - 1];
      if (now.attempts.length > after && last) {
        const outcome = last.status_code !== null ? `HTTP ${last.status_code}` : (last.error ?? 'no answer');
        status(msg, `${what}: attempt ${last.attempt} answered ${outcome}; the delivery is ${now.status}.`, last.status_code !== null && last.status_code < 300 ? 'ok' : 'error');
        return;
      }
    }
    status(msg, `${what}: queued; no attempt recorded yet.`);
  };
  const retry = button('Retry', () => {
    const before = d.attempts.length;
    status(msg, 'Retrying…');
    api
      .call<{ attempt: number }>('POST', `/deliveries/${encodeURIComponent(d.id)}/retry`)
      .then((q) => {
        status(msg, `Retry queued as attempt ${q.attempt}…`);
        return watch(before, 'Retry');
      })
      .catch((e) => status(msg, api.describe(e), 'error'));
  }, { 'aria-label': `Retry delivery ${d.id}` });
  const redirectForm = h('form', { class: 'row', 'aria-label': `Redirect delivery ${d.id}`, novalidate: true }, field('Send once to URL', target), h('button', { type: 'submit' }, 'Redirect'));
  redirectForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const before = d.attempts.length;
    status(msg, 'Redirecting…');
    api
      .call<{ attempt: number }>('POST', `/deliveries/${encodeURIComponent(d.id)}/redirect`, { body: { url: target.value.trim() } })
      .then((q) => {
        status(msg, `Redirect queued as attempt ${q.attempt}…`);
        return watch(before, 'Redirect');
      })
      .catch((e) => status(msg, api.describe(e), 'error'));
  });
  return h(
    'div',
    { class: 'delivery-detail' },
    h('h3', null, 'Payload'),
    h('pre', { class: 'payload', tabindex: 0, 'aria-label': 'Payload' }, d.payload === undefined ? '—' : JSON.stringify(d.payload, null, 2)),
    h('h3', null, 'Attempts'),
    attemptsBox,
    h('div', { class: 'row' }, retry),
    redirectForm,
    msg,
  );
}

function row(d: api.Delivery, onError: (e: unknown) => void): HTMLTableRowElement[] {
  const detail = h('tr', { class: 'detail', hidden: true });
  const cell = h('td', { colspan: 7 });
  detail.append(cell);
  const statusCell = h('span', { class: `badge d-${d.status}` }, d.status);
  const fetchOne = (): Promise<api.DeliveryDetail> => api.call<api.DeliveryDetail>('GET', `/deliveries/${encodeURIComponent(d.id)}`);
  const toggle = button('Details', () => {
    const open = toggle.getAttribute('aria-expanded') === 'true';
    toggle.setAttribute('aria-expanded', String(!open));
    detail.hidden = open;
    if (!open) {
      replace(cell, 'Loading…');
      fetchOne()
        .then((full) => {
          showStatus(statusCell, full.status);
          replace(cell, detailView(full, statusCell, fetchOne));
        })
        .catch(onError);
    }
  }, { 'aria-expanded': 'false', 'aria-label': `Details of delivery ${d.id}` });
  return [
    h(
      'tr',
      { 'data-delivery-id': d.id },
      td(time(d.created_at)),
      td(d.event_type),
      td(h('code', null, d.url)),
      td(statusCell),
      td(d.attempts_made),
      td(h('code', null, d.id)),
      td(toggle),
    ),
    detail,
  ];
}

export async function deliveries(main: HTMLElement): Promise<void> {
  const statusFilter = select('status', STATUSES);
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter deliveries' }, field('Status', statusFilter), h('button', { type: 'submit' }, 'Filter'));
  const msg = h('p', { class: 'status' });
  const list = h('div');
  const pager = h('div', { class: 'row pager' });
  const onError = (e: unknown): void => status(msg, api.describe(e), 'error');

  const load = async (cursor?: string): Promise<void> => {
    const page = await api.call<api.Page<api.Delivery>>('GET', '/deliveries', {
      query: { status: statusFilter.value || undefined, since: Date.now() - 14 * DAY_MS, limit: 25, cursor },
    });
    replace(
      list,
      page.data.length
        ? scroller('Deliveries', table('Deliveries of the last 14 days, newest first', ['Created (UTC)', 'Event', 'URL', 'Status', 'Attempts', 'ID', 'Details'], page.data.flatMap((d) => row(d, onError))))
        : h('p', null, 'No deliveries match.'),
    );
    replace(pager);
    if (cursor) pager.append(button('Newest', () => load().catch(onError)));
    if (page.next_cursor) {
      const next = page.next_cursor;
      pager.append(button('Older', () => load(next).catch(onError)));
    }
    status(msg, `${page.data.length} ${page.data.length === 1 ? 'delivery' : 'deliveries'} in the last 14 days`);
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    load().catch(onError);
  });
  main.append(form, msg, h('h2', null, 'Last 14 days'), list, pager);
  await load();
}
