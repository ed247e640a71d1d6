// Deliveries, newest first, filtered by status, event type, subscription, event id
// and time (the last 14 days unless a time is given), each with its ordering key and,
// while it waits for the delivery before it in its lane, that one (a button opens it:
// in the list, or below it when on another page); a row expands to the payload
// and every attempt — its response status, excerpt, and its request and response
// headers (the signature redacted by the gateway) — with Retry and Redirect
// buttons that call the API and show what happened. The operator picks a project
// and reads it (Retry and Redirect stay the project's).

import * as api from '../api';
import { showOrdering } from '../ordering';
import {
  button,
  field,
  fromUtcInput,
  hashParams,
  h,
  headerList,
  ident,
  input,
  projectField,
  replace,
  scroller,
  select,
  show,
  status,
  table,
  td,
  toUtcInput,
  when,
} from '../dom';

const DAY_MS = 86_400_000;
const STATUSES: Array<[string, string]> = [
  ['', 'any'],
  ['pending', 'pending'],
  ['delivered', 'delivered'],
  ['failed', 'failed'],
  ['dead_letter', 'dead_letter'],
  ['paused', 'paused'],
];
/** How long the page watches a delivery after Retry or Redirect. */
const WATCH_MS = 60_000;
const HEADERS = ['Created (UTC)', 'Event', 'Event ID', 'URL', 'Status', 'Ordering key', 'Attempts', 'ID', 'Details'];

/** What a list row needs from its view. */
interface RowContext {
  project: string | undefined;
  onError: (e: unknown) => void;
  /** Opens a delivery's details (the one a delivery waits for). */
  open: (id: string) => void;
  /** The Details button of each row shown, by delivery id. */
  shown: Map<string, HTMLButtonElement>;
}

function attemptHeaders(a: api.DeliveryAttempt): HTMLElement {
  const answer = a.status_code !== null ? `HTTP ${a.status_code}` : `no answer (${a.error ?? 'unknown'})`;
  return h(
    'details',
    { class: 'headers', 'data-attempt': a.attempt },
    h('summary', null, `Attempt ${a.attempt}: request and response headers`),
    h('h4', null, 'Request headers'),
    headerList(`Request headers of attempt ${a.attempt}`, a.request_headers),
    h('h4', null, `Response: ${answer}`),
    a.status_code !== null ? headerList(`Response headers of attempt ${a.attempt}`, a.response_headers) : null,
    a.response_excerpt ? h('pre', { class: 'payload', tabindex: 0, 'aria-label': `Response excerpt of attempt ${a.attempt}` }, a.response_excerpt) : null,
  );
}

function attempts(list: api.DeliveryAttempt[]): HTMLElement {
  if (!list.length) return h('p', null, 'No attempts yet.');
  const rows = list.map((a) =>
    h(
      'tr',
      { 'data-attempt': a.attempt },
      td(a.attempt),
      h('td', { class: 'url' }, h('code', null, a.url)),
      td(show(a.status_code)),
      td(show(a.error)),
      td(h('pre', { class: 'excerpt' }, show(a.response_excerpt))),
      h('td', { class: 'nowrap' }, `${a.duration_ms} ms`),
      td(ident(a.request_id)),
      td(when(a.at)),
      td(when(a.next_retry_at)),
    ),
  );
  return h(
    'div',
    null,
    scroller(
      'Attempts',
      table('Attempts', ['#', 'URL', 'Status code', 'Error', 'Response excerpt', 'Duration', 'Request ID', 'At (UTC)', 'Next retry (UTC)'], rows),
    ),
    ...list.map(attemptHeaders),
  );
}

/** Shows a delivery's current status (text and colour) in its list row. */
function showStatus(cell: HTMLElement, status: string): void {
  cell.textContent = status;
  cell.className = `badge d-${status}`;
}

/** Refreshes a list row from a delivery read again: its status, and its wait (ended or not). */
type Shown = (d: api.DeliveryDetail) => void;

function detailView(d: api.DeliveryDetail, showRow: Shown, refresh: () => Promise<api.DeliveryDetail>, readOnly: boolean): HTMLElement {
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
      showRow(now);
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
    readOnly ? null : h('div', { class: 'row' }, retry),
    readOnly ? null : redirectForm,
    msg,
  );
}

function row(d: api.Delivery, cx: RowContext): HTMLTableRowElement[] {
  const project = cx.project;
  const detail = h('tr', { class: 'detail', hidden: true });
  const cell = h('td', { colspan: HEADERS.length });
  detail.append(cell);
  const statusCell = h('span', { class: `badge d-${d.status}` }, d.status);
  const orderingCell = h('td', { class: 'ordering' });
  showOrdering(orderingCell, d, cx.open);
  const showRow: Shown = (now) => {
    showStatus(statusCell, now.status);
    showOrdering(orderingCell, now, cx.open);
  };
  const fetchOne = (): Promise<api.DeliveryDetail> =>
    api.call<api.DeliveryDetail>('GET', `/deliveries/${encodeURIComponent(d.id)}`, { query: { project } });
  const toggle = button('Details', () => {
    const open = toggle.getAttribute('aria-expanded') === 'true';
    toggle.setAttribute('aria-expanded', String(!open));
    detail.hidden = open;
    if (!open) {
      replace(cell, 'Loading…');
      fetchOne()
        .then((full) => {
          showRow(full);
          replace(cell, detailView(full, showRow, fetchOne, project !== undefined));
        })
        .catch(cx.onError);
    }
  }, { 'aria-expanded': 'false', 'aria-label': `Details of delivery ${d.id}` });
  cx.shown.set(d.id, toggle);
  return [
    h(
      'tr',
      { 'data-delivery-id': d.id, 'data-subscription-id': d.subscription_id, 'data-event-id': d.event_id },
      td(when(d.created_at)),
      td(d.event_type),
      td(ident(d.event_id)),
      h('td', { class: 'url' }, h('code', null, d.url)),
      td(statusCell),
      orderingCell,
      td(d.attempts_made),
      td(ident(d.id)),
      td(toggle),
    ),
    detail,
  ];
}

export async function deliveries(main: HTMLElement): Promise<void> {
  const operator = api.credential()?.kind === 'operator';
  const params = hashParams();
  const project = operator ? projectField() : null;
  const statusFilter = select('status', STATUSES, params.get('status') ?? '');
  const eventType = input('event_type', { value: params.get('event_type') ?? '', placeholder: 'payment.succeeded' });
  const subscription = select('subscription_id', [['', 'any']], '');
  const eventId = input('event_id', { value: params.get('event_id') ?? '', placeholder: 'evt_…' });
  const since = input('since', { type: 'datetime-local', step: 1 });
  const until = input('until', { type: 'datetime-local', step: 1 });
  if (params.get('since')) since.value = toUtcInput(Number(params.get('since')));
  const form = h(
    'form',
    { class: 'filters', role: 'search', 'aria-label': 'Filter deliveries' },
    project ? field('Project', project) : null,
    field('Status', statusFilter),
    field('Event type', eventType),
    field('Subscription', subscription),
    field('Event ID', eventId),
    field('Since (UTC)', since, 'Empty: the last 14 days'),
    field('Until (UTC)', until),
    h('button', { type: 'submit' }, 'Filter'),
  );
  const msg = h('p', { class: 'status' });
  const list = h('div');
  const pager = h('div', { class: 'row pager' });
  /** A delivery waited for that is not in the list (another page, or filtered out). */
  const waited = h('div', { class: 'waited' });
  const onError = (e: unknown): void => status(msg, api.describe(e), 'error');
  const projectNow = (): string | undefined => project?.value.trim() || undefined;
  const shown = new Map<string, HTMLButtonElement>();
  /** Expands a shown row's details (unless open) and moves the focus there; false when not shown. */
  const expand = (id: string): boolean => {
    const toggle = shown.get(id);
    if (!toggle?.isConnected) return false;
    if (toggle.getAttribute('aria-expanded') !== 'true') toggle.click();
    toggle.focus();
    return true;
  };
  /** Opens delivery `id`: its row's details when shown, else the delivery read alone, below the list. */
  const open = (id: string): void => {
    if (expand(id)) return;
    api
      .call<api.DeliveryDetail>('GET', `/deliveries/${encodeURIComponent(id)}`, { query: { project: projectNow() } })
      .then((d) => {
        const title = `Delivery ${id}`;
        const note = h('p', { class: 'hint' }, 'A delivery in the list waits for this one, which is not on this page.');
        replace(waited, h('h2', null, title), note, scroller(title, table(title, HEADERS, row(d, context()))));
        expand(id);
      })
      .catch(onError);
  };
  const context = (): RowContext => ({ project: projectNow(), onError, open, shown });

  /** The subscription filter's choices: the project's subscriptions by URL. */
  const loadSubscriptions = async (): Promise<void> => {
    if (operator && !projectNow()) return;
    const subs = await api.call<api.Page<api.Subscription>>('GET', '/webhooks', { query: { project: projectNow(), limit: 100 } });
    const wanted = subscription.value || params.get('subscription_id') || '';
    subscription.replaceChildren(h('option', { value: '' }, 'any'));
    for (const s of subs.data) subscription.append(h('option', { value: s.id }, `${s.url} (${s.id})`));
    subscription.value = subs.data.some((s) => s.id === wanted) ? wanted : '';
  };

  const load = async (cursor?: string): Promise<void> => {
    if (operator && !projectNow()) {
      status(msg, 'Enter a project to see its deliveries.');
      return;
    }
    const from = fromUtcInput(since.value) ?? Date.now() - 14 * DAY_MS;
    shown.clear();
    replace(waited);
    const page = await api.call<api.Page<api.Delivery>>('GET', '/deliveries', {
      query: {
        project: projectNow(),
        status: statusFilter.value || undefined,
        event_type: eventType.value.trim() || undefined,
        subscription_id: subscription.value || undefined,
        event_id: eventId.value.trim() || undefined,
        since: from,
        until: fromUtcInput(until.value),
        limit: 25,
        cursor,
      },
    });
    replace(
      list,
      page.data.length
        ? scroller(
            'Deliveries',
            table('Deliveries, newest first', HEADERS, page.data.flatMap((d) => row(d, context()))),
          )
        : h('p', null, 'No deliveries match.'),
    );
    replace(pager);
    if (cursor) pager.append(button('Newest', () => load().catch(onError)));
    if (page.next_cursor) {
      const next = page.next_cursor;
      pager.append(button('Older', () => load(next).catch(onError)));
    }
    status(msg, `${page.data.length} ${page.data.length === 1 ? 'delivery matches' : 'deliveries match'}${page.next_cursor ? ' (more on the next page)' : ''}`);
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    loadSubscriptions()
      .then(() => load())
      .catch(onError);
  });
  main.append(form, msg, h('h2', null, 'Deliveries'), list, pager, waited);
  await loadSubscriptions();
  await load();
}
