// Events: the project's events as published (`GET /events`), newest first, with the
// event types seen among the latest ones (each a filter), each event's ordering key and
// delivery counts, and its deliveries (with the one each waits for) one click away (`GET /deliveries?event_id=`), linked to the
// Deliveries view. The operator picks a project.

import * as api from '../api';
import { orderingKey } from '../ordering';
import {
  button,
  field,
  fromUtcInput,
  hashParams,
  h,
  ident,
  input,
  projectField,
  replace,
  scroller,
  status,
  table,
  td,
  when,
} from '../dom';

/** `GET /events` items (the SDK's `EventRow`). */
type EventRow = api.EventRow;

/** Events read to list the types seen. */
const TYPES_SAMPLE = 200;
const HEADERS = ['Published (UTC)', 'Type', 'Event ID', 'Ordering key', 'Deliveries', 'Request ID', 'Details'];

/** "2 delivered, 1 dead_letter" — the non-zero counts. */
export function summaryText(d: EventRow['deliveries']): string {
  if (!d.total) return 'no deliveries';
  const parts = (['delivered', 'failed', 'dead_letter', 'pending', 'paused'] as const).filter((k) => d[k] > 0).map((k) => `${d[k]} ${k}`);
  return `${d.total}: ${parts.join(', ')}`;
}

function timestampOf(e: EventRow): number | null {
  const t = typeof e.timestamp === 'number' ? e.timestamp : Date.parse(e.timestamp);
  return Number.isNaN(t) ? null : t;
}

async function deliveriesOf(e: EventRow, project: string | undefined): Promise<HTMLElement> {
  const page = await api.call<api.Page<api.Delivery>>('GET', '/deliveries', { query: { project, event_id: e.id, limit: 100 } });
  if (!page.data.length) return h('p', null, 'No deliveries: no subscription matched this event.');
  const link = new URLSearchParams({ event_id: e.id });
  if (project) link.set('project', project);
  const rows = page.data.map((d) =>
    h(
      'tr',
      { 'data-delivery-id': d.id },
      h('td', { class: 'url' }, h('code', null, d.url)),
      td(h('span', { class: `badge d-${d.status}` }, d.status)),
      td(d.attempts_made),
      td(ident(d.id)),
      h('td', { class: 'waiting' }, ident(d.blocked_by)),
    ),
  );
  return h(
    'div',
    null,
    scroller(`Deliveries of event ${e.id}`, table(`Deliveries of event ${e.id}`, ['URL', 'Status', 'Attempts', 'Delivery ID', 'Waiting for'], rows)),
    h('p', null, h('a', { href: `#deliveries?${link}` }, `Open the deliveries of ${e.id} with their attempts`)),
  );
}

function row(e: EventRow, project: string | undefined, onError: (err: unknown) => void): HTMLTableRowElement[] {
  const detail = h('tr', { class: 'detail', hidden: true });
  const cell = h('td', { colspan: HEADERS.length });
  detail.append(cell);
  const toggle = button('Deliveries', () => {
    const open = toggle.getAttribute('aria-expanded') === 'true';
    toggle.setAttribute('aria-expanded', String(!open));
    detail.hidden = open;
    if (!open) {
      replace(cell, 'Loading…');
      deliveriesOf(e, project)
        .then((box) => replace(cell, box))
        .catch(onError);
    }
  }, { 'aria-expanded': 'false', 'aria-label': `Deliveries of event ${e.id}` });
  return [
    h(
      'tr',
      { 'data-event-id': e.id },
      td(when(timestampOf(e))),
      td(h('code', null, e.type)),
      td(ident(e.id)),
      h('td', { class: 'ordering' }, orderingKey(e.ordering_key)),
      h('td', { class: 'summary' }, summaryText(e.deliveries)),
      td(ident(e.request_id)),
      td(toggle),
    ),
    detail,
  ];
}

export async function events(main: HTMLElement): Promise<void> {
  const operator = api.credential()?.kind === 'operator';
  const params = hashParams();
  const project = operator ? projectField() : null;
  const type = input('type', { value: params.get('type') ?? '', placeholder: 'payment.succeeded' });
  const since = input('since', { type: 'datetime-local', step: 1 });
  const until = input('until', { type: 'datetime-local', step: 1 });
  const form = h(
    'form',
    { class: 'filters', role: 'search', 'aria-label': 'Filter events' },
    project ? field('Project', project) : null,
    field('Event type', type, 'Exact type, or pick one seen below'),
    field('Since (UTC)', since),
    field('Until (UTC)', until),
    h('button', { type: 'submit' }, 'Filter'),
  );
  const msg = h('p', { class: 'status' });
  const types = h('div', { class: 'types-seen' });
  const list = h('div');
  const pager = h('div', { class: 'row pager' });
  const onError = (e: unknown): void => status(msg, api.describe(e), 'error');
  const projectNow = (): string | undefined => project?.value.trim() || undefined;

  /** The event types among the latest events, each a button that filters by it. */
  const loadTypes = async (): Promise<void> => {
    const page = await api.call<api.Page<EventRow>>('GET', '/events', { query: { project: projectNow(), limit: TYPES_SAMPLE } });
    const counts = new Map<string, number>();
    for (const e of page.data) counts.set(e.type, (counts.get(e.type) ?? 0) + 1);
    const sorted = [...counts.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
    const title = h('h2', { id: 'types-title' }, 'Event types seen');
    if (!sorted.length) {
      replace(types, title, h('p', null, 'No events yet.'));
      return;
    }
    const ul = h('ul', { class: 'types', 'aria-labelledby': 'types-title' });
    for (const [t, n] of sorted) {
      const pressed = type.value.trim() === t;
      ul.append(
        h(
          'li',
          { 'data-type': t },
          button(`${t} (${n})`, () => {
            type.value = type.value.trim() === t ? '' : t;
            loadTypes()
              .then(() => load())
              .catch(onError);
          }, { 'aria-pressed': String(pressed), 'aria-label': `Only ${t} events (${n} of the latest ${page.data.length})` }),
        ),
      );
    }
    replace(types, title, h('p', { class: 'hint' }, `Among the latest ${page.data.length} events.`), ul);
  };

  const load = async (cursor?: string): Promise<void> => {
    const page = await api.call<api.Page<EventRow>>('GET', '/events', {
      query: {
        project: projectNow(),
        type: type.value.trim() || undefined,
        since: fromUtcInput(since.value),
        until: fromUtcInput(until.value),
        limit: 25,
        cursor,
      },
    });
    replace(
      list,
      page.data.length
        ? scroller('Events', table('Events, newest first', HEADERS, page.data.flatMap((e) => row(e, projectNow(), onError))))
        : h('p', null, 'No events match.'),
    );
    replace(pager);
    if (cursor) pager.append(button('Newest', () => load().catch(onError)));
    if (page.next_cursor) {
      const next = page.next_cursor;
      pager.append(button('Older', () => load(next).catch(onError)));
    }
    status(msg, `${page.data.length} ${page.data.length === 1 ? 'event' : 'events'}${page.next_cursor ? ' (more on the next page)' : ''}`);
  };
  const refresh = async (): Promise<void> => {
    if (operator && !projectNow()) {
      status(msg, 'Enter a project to see its events.');
      return;
    }
    await loadTypes();
    await load();
  };
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    refresh().catch(onError);
  });
  main.append(form, msg, types, h('h2', null, 'Events'), list, pager);
  await refresh();
}
